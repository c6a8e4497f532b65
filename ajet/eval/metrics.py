"""Evaluation metrics over finished episodes. Pure functions over `EpisodeResult`s.

- `reward/mean`, `success/rate`: over all episodes (a failed episode counts reward 0, no success).
- `pass@1`, `pass@k`: the unbiased estimator of Chen et al. (2021) per task, averaged.
- tool selection (`tool/precision`, `tool/recall`, `tool/f1`): the set of tools an episode
  used against `task.metadata["target_tools"]`, over episodes whose task names targets.
  Two empty sets score 1 (correctly no tool); an episode that did not finish scores 0.
- steps: `steps/calls_per_episode` (LLM calls); `steps/efficiency` = optimal_steps / calls,
  capped at 1, over episodes whose task gives `optimal_steps`.
- `e2e/success`: the episode finished, succeeded and (when the task names target tools)
  called every one of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ajet.files import write_json_atomic


@dataclass
class EpisodeResult:
    task_id: str
    episode_id: str
    status: str  # ok | failed | timeout
    reward: float
    success: bool
    calls: int
    tools_used: list[str] = field(default_factory=list)
    target_tools: list[str] | None = None
    optimal_steps: int | None = None
    reason: str = ""
    # What the model answered, call by call (content and tool_calls of each reply), so a
    # report can be read without re-running it.
    replies: list[dict[str, Any]] = field(default_factory=list)
    # The calls the gateway refused with a 400, by field (`gateway/refused/<field>`): a framework
    # sending what ajet cannot honour shows here, episode by episode.
    refused: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tools_from_calls(calls: Iterable[Any]) -> list[str]:
    """Tool names the model called, in order, from recorded `LLMCall.response_message`s."""
    names = []
    for call in calls:
        for tool_call in (getattr(call, "response_message", None) or {}).get("tool_calls") or []:
            function = tool_call.get("function", tool_call)
            if function.get("name"):
                names.append(str(function["name"]))
    return names


def episode_result(episode: Any, calls: Sequence[Any]) -> EpisodeResult:
    """An `Episode` (plus its recorded calls) as an `EpisodeResult`.

    Tools used: `output.metadata["tools_used"]` when the workflow reports them, else the
    tool calls recorded in the episode's LLM calls.
    """
    metadata = episode.task.metadata
    output_meta = episode.output.metadata if episode.output is not None else {}
    used = output_meta.get("tools_used")
    tools = [str(t) for t in used] if isinstance(used, list) else tools_from_calls(calls)
    target = metadata.get("target_tools")
    optimal = metadata.get("optimal_steps")
    ok = episode.status == "ok"
    return EpisodeResult(
        task_id=episode.task.task_id, episode_id=episode.episode_id, status=episode.status,
        reward=float(episode.reward) if ok else 0.0, success=ok and bool(episode.is_success),
        calls=int(episode.num_calls or len(calls)), tools_used=tools,
        target_tools=[str(t) for t in target] if isinstance(target, list) else None,
        optimal_steps=int(optimal) if isinstance(optimal, (int, float)) and optimal > 0 else None,
        reason=episode.reason,
        replies=[_reply(call) for call in calls],
        refused=dict(getattr(episode, "refused", None) or {}),
    )


def _reply(call: Any) -> dict[str, Any]:
    message = getattr(call, "response_message", None) or {}
    reply = {"content": message.get("content") or ""}
    if message.get("tool_calls"):
        reply["tool_calls"] = message["tool_calls"]
    return reply


def tool_scores(used: Iterable[str], target: Iterable[str]) -> tuple[float, float, float]:
    """(precision, recall, F1) of the set of tools used against the target set."""
    used_set, target_set = set(used), set(target)
    if not used_set and not target_set:
        return 1.0, 1.0, 1.0
    hits = len(used_set & target_set)
    precision = hits / len(used_set) if used_set else 0.0
    recall = hits / len(target_set) if target_set else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples (of n, c correct) is correct: 1 - C(n-c,k)/C(n,k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(results: Sequence[EpisodeResult], k: int) -> dict[str, float]:
    if not results:
        raise ValueError("no episodes to summarise")
    n = len(results)
    out: dict[str, float] = {
        "episodes": float(n),
        "tasks": float(len({r.task_id for r in results})),
        "failed": float(sum(r.status != "ok" for r in results)),
        "reward/mean": sum(r.reward for r in results) / n,
        "success/rate": sum(r.success for r in results) / n,
        "steps/calls_per_episode": sum(r.calls for r in results) / n,
    }
    by_task: dict[str, list[bool]] = {}
    for r in results:
        by_task.setdefault(r.task_id, []).append(r.success)
    for kk in sorted({1, k}):
        scores = [pass_at_k(len(v), sum(v), kk) for v in by_task.values() if len(v) >= kk]
        if scores:
            out[f"pass@{kk}"] = sum(scores) / len(scores)
    with_target = [r for r in results if r.target_tools is not None]
    if with_target:
        scores3 = [tool_scores(r.tools_used, r.target_tools or []) if r.status == "ok" else (0.0, 0.0, 0.0)
                   for r in with_target]
        for i, name in enumerate(("precision", "recall", "f1")):
            out[f"tool/{name}"] = sum(s[i] for s in scores3) / len(scores3)
    with_optimal = [(r.optimal_steps, r.calls) for r in results if r.optimal_steps]
    if with_optimal:
        out["steps/efficiency"] = sum(
            min(1.0, optimal / calls) if calls else 0.0 for optimal, calls in with_optimal
        ) / len(with_optimal)
    out["e2e/success"] = sum(
        r.success and (r.target_tools is None or set(r.target_tools) <= set(r.tools_used)) for r in results
    ) / n
    return out


def write_report(path: Any, *, name: str, model: str, split: str, n: int, temperature: float,
                 metrics: dict[str, float], results: Sequence[EpisodeResult]) -> None:
    """The eval JSON: what was evaluated (model path, split, sampling) and every episode."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "name": name, "model": model, "split": split, "n": n, "temperature": temperature,
        "metrics": metrics, "episodes": [r.as_dict() for r in results],
    }
    write_json_atomic(path, payload, indent=1)
