"""`group_rank`: an LLM judge scores the episodes of a GRPO group together (like ART's RULER).

Where no hand-written reward exists, comparing attempts is easier than grading one alone, and
GRPO only needs scores that order a group's episodes. The judge sees every trajectory of one
task at once, its final answer and (`include_tool_calls`) its tool calls with their results,
each cut to `max_chars_per_trajectory`, and gives each a score in [0, 1] by the rubric
(`judge.group_rank`, `ajet.config.schema.GroupRankConfig`).

The reply it is asked for is one JSON object:
`{"scores": [{"trajectory": 1, "reason": "...", "score": 0.9}, ...]}`. Also read:
`{"scores": [0.9, 0.2, ...]}` (in trajectory order), `{"scores": {"1": 0.9, ...}}`, a ranking
`{"ranking": [2, 1, 3]}` (best first; mapped linearly to 1, 0.5, 0: `rank_scores`), and lines
"Trajectory 1: 0.9". Every trajectory must get exactly one score in [0, 1]; any other reply is
asked for once more (the reply and what was wrong shown), then the judge gives up with
`UnreadableScores`: the caller drops the group, it never scores it 0.

Not a per-episode judge: it has no `compute_reward`. `ajet.rollout.group_judging` calls
`ascore_group` once per group, after the group's episodes ended. Its calls go to the policy
through the rollout's service client (never recorded or trained) or to `base_url`; their cost
is counted in the `JudgeCost` the caller passes.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ajet.config.schema import GroupRankConfig
from ajet.judge.base import JudgeError
from ajet.judge.llm_judge import LOCAL_MODEL
from ajet.workflow import WorkflowTask

SYSTEM = (
    "You judge attempts by an AI agent at the same task. Below are {n} trajectories, each with "
    "the agent's final answer{tools}. Compare them with each other and give each a score from 0 "
    "to 1 by the rubric: a better trajectory gets a higher score, equally good ones the same.\n"
    "Rubric: {rubric}\n"
    "Reply with one JSON object and nothing else:\n"
    '{{"scores": [{{"trajectory": 1, "reason": "<one short sentence>", "score": <0 to 1>}}, ...]}}'
    " with one entry for each of the {n} trajectories."
)
RETRY = (
    "Your reply could not be read: {why}. Reply again with only the JSON object: "
    '{{"scores": [{{"trajectory": <1 to {n}>, "reason": "...", "score": <0 to 1>}}, ...]}}, '
    "one entry for each of the {n} trajectories."
)
TOOL_RESULT_CHARS = 4000  # a tool result is kept this long at most (the rest is never shown)
_NOTE_CHARS = 40  # room kept for "(N more tool calls not shown)", and the least a cut call gets
_INDEX_KEYS = ("trajectory", "id", "index")
_LINE = re.compile(r"trajectory\s*#?\s*(\d+)\b[^\d\n]*?(-?\d+(?:\.\d+)?)", re.IGNORECASE)


class UnreadableScores(ValueError):
    """The judge's reply does not give every trajectory one score in [0, 1] (control flow inside
    the group judge: the caller retries once, then drops the group)."""


@dataclass
class Trajectory:
    """What the judge sees of one episode (uncut; `render_trajectory` cuts it)."""

    answer: str
    # {"name", "arguments", "result"} per tool call, in the order the model made them.
    tool_calls: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def from_calls(cls, calls: Sequence[Any], answer: str) -> Trajectory:
        """From an episode's recorded `LLMCall`s; without an `answer` the last reply's text."""
        results: dict[str, str] = {}
        for call in calls:
            for message in getattr(call, "messages", None) or []:
                if message.get("role") == "tool" and message.get("tool_call_id"):
                    results[str(message["tool_call_id"])] = _text(message.get("content"))
        tool_calls, last_reply = [], ""
        for call in calls:
            reply = getattr(call, "response_message", None) or {}
            last_reply = _text(reply.get("content")) or last_reply
            for tool_call in reply.get("tool_calls") or []:
                function = tool_call.get("function", tool_call)
                arguments = function.get("arguments", "")
                tool_calls.append({
                    "name": str(function.get("name", "?")),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                    "result": results.get(str(tool_call.get("id", "")), "(no result)")[:TOOL_RESULT_CHARS],
                })
        return cls(answer=answer or last_reply, tool_calls=tool_calls)


@dataclass
class JudgeCost:
    """What the judge's calls cost, summed over the groups of a rollout."""

    calls: int = 0
    retries: int = 0  # replies that could not be read and were asked for again
    prompt_tokens: int = 0
    completion_tokens: int = 0


class GroupRankJudge:
    # It shows the judge the reference answer when a task has one (see private_keys).
    private_metadata_keys = ("answer",)

    def __init__(self, cfg: GroupRankConfig, *, llm_client_factory: Callable[[], Any] | None = None,
                 client: Any = None) -> None:
        if client is None and not cfg.base_url and llm_client_factory is None:
            raise JudgeError("judge.type=group_rank needs judge.group_rank.base_url (an OpenAI-compatible "
                             "endpoint) or a backbone that serves the local model")
        if cfg.base_url and not cfg.model:
            raise JudgeError(f"judge.group_rank.model is required with judge.group_rank.base_url={cfg.base_url}")
        self.cfg = cfg
        self.model = cfg.model or LOCAL_MODEL
        self.success_threshold = cfg.success_threshold
        self._factory, self._client = llm_client_factory, client

    def messages(self, task: WorkflowTask, trajectories: Sequence[Trajectory]) -> list[dict[str, str]]:
        cfg, n = self.cfg, len(trajectories)
        tools = " and the tool calls it made" if cfg.include_tool_calls else ""
        system = SYSTEM.format(n=n, tools=tools, rubric=cfg.rubric)
        parts = [f"Task:\n{task.main_query or json.dumps(task.init_messages)[:2000]}"]
        if "answer" in task.metadata:
            parts.append(f"Reference answer:\n{task.metadata['answer']}")
        for i, trajectory in enumerate(trajectories, 1):
            body = render_trajectory(trajectory, cfg.max_chars_per_trajectory, cfg.include_tool_calls)
            parts.append(f"<trajectory {i}>\n{body}\n</trajectory {i}>")
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    async def ascore_group(self, task: WorkflowTask, trajectories: Sequence[Trajectory],
                           cost: JudgeCost) -> list[float]:
        """One score in [0, 1] per trajectory. An unreadable reply is asked for once more; a
        second one raises `UnreadableScores`; a failing endpoint raises `JudgeError`."""
        messages = self.messages(task, trajectories)
        reply = await self._complete(messages, cost)
        try:
            return parse_group_scores(reply, len(trajectories))
        except UnreadableScores as exc:
            cost.retries += 1
            retry = RETRY.format(why=exc, n=len(trajectories))
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": retry}]
        reply = await self._complete(messages, cost)
        try:
            return parse_group_scores(reply, len(trajectories))
        except UnreadableScores as exc:
            raise UnreadableScores(f"{exc}, twice; last reply {reply[:200]!r}") from None

    async def _complete(self, messages: list[dict[str, str]], cost: JudgeCost) -> str:
        client = self._get_client()
        cost.calls += 1
        try:
            response = await client.chat.completions.create(
                model=self.model, messages=messages,
                temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens,
            )
        except Exception as exc:  # the SDK's errors vary by client; re-raised with the endpoint
            where = self.cfg.base_url or "the local model"
            raise JudgeError(f"group_rank judge call to {where} (model {self.model}) failed: {exc}") from exc
        usage = getattr(response, "usage", None)
        cost.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
        cost.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)
        return response.choices[0].message.content or ""

    def _get_client(self) -> Any:
        if self._client is None:
            if self.cfg.base_url:
                import openai  # only for an external endpoint

                key = os.environ.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else ""
                self._client = openai.AsyncOpenAI(base_url=self.cfg.base_url, api_key=key or "EMPTY")
            else:
                assert self._factory is not None
                self._client = self._factory()  # at the first call: the backbone's gateway is up
        return self._client


# ---------------------------------------------------------------------- pure parts
def parse_group_scores(text: str, n: int) -> list[float]:
    """The scores of trajectories 1..n from the judge's reply; `UnreadableScores` says why not."""
    data = _json_of(text)
    if data is None:
        found = [(int(i), float(v)) for i, v in _LINE.findall(text)]
        if not found:
            raise UnreadableScores("no JSON object and no 'Trajectory <i>: <score>' lines")
        return _complete_scores(found, n)
    if isinstance(data, dict) and "ranking" in data and "scores" not in data:
        return rank_scores(data["ranking"], n)
    if isinstance(data, dict) and "scores" not in data and not all(_index(key) for key in data):
        raise UnreadableScores('no "scores" in the JSON object')
    scores = data.get("scores", data) if isinstance(data, dict) else data
    if isinstance(scores, dict):
        pairs = [(_index(key), value) for key, value in scores.items()]
    elif isinstance(scores, list) and scores and all(isinstance(s, dict) for s in scores):
        pairs = [(_index(next((s[k] for k in _INDEX_KEYS if k in s), None)), s.get("score")) for s in scores]
    elif isinstance(scores, list):
        if len(scores) != n:
            raise UnreadableScores(f"{len(scores)} scores for {n} trajectories")
        pairs = list(enumerate(scores, 1))
    else:
        raise UnreadableScores('no "scores" list')
    return _complete_scores([(i, _score(v)) for i, v in pairs], n)


def rank_scores(ranking: Any, n: int) -> list[float]:
    """A ranking (trajectory numbers, best first, each of 1..n once) as scores: the best 1,
    the worst 0, evenly spaced between (a lone trajectory scores 1)."""
    if not isinstance(ranking, list) or sorted(_index(r) for r in ranking) != list(range(1, n + 1)):
        raise UnreadableScores(f"the ranking {ranking!r:.80} is not each of 1..{n} once")
    scores = [0.0] * n
    for position, index in enumerate(ranking):
        scores[_index(index) - 1] = 1.0 if n == 1 else (n - 1 - position) / (n - 1)
    return scores


def render_trajectory(trajectory: Trajectory, max_chars: int, include_tool_calls: bool) -> str:
    """The trajectory as the judge reads it, at most `max_chars` characters (about: the
    section headers are not counted). The answer keeps at least half the budget; the tool
    calls get the rest, the earliest first; what is cut is marked."""
    answer = trajectory.answer.strip() or "(no final answer)"
    calls = trajectory.tool_calls if include_tool_calls else []
    lines = [f"{i}. {c['name']}({c['arguments']}) -> {c['result']}" for i, c in enumerate(calls, 1)]
    wanted = sum(len(line) + 1 for line in lines)
    answer = _cut(answer, max(max_chars - wanted, max_chars // 2))
    final = f"Final answer:\n{answer}"
    if not include_tool_calls:
        return final
    room = max_chars - len(answer)
    if wanted <= room:
        kept = lines
    else:  # the earliest calls while a readable one fits, then how many are left out
        room -= _NOTE_CHARS
        kept = []
        for line in lines:
            if room < _NOTE_CHARS:
                break
            kept.append(_cut(line, room - 1))
            room -= len(kept[-1]) + 1
        kept.append(f"({len(lines) - len(kept)} more tool calls not shown)")
    return f"Tool calls:\n{chr(10).join(kept) or '(none)'}\n{final}"


def _cut(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: its head and tail around a marker."""
    if len(text) <= limit:
        return text
    marker = f" …[{len(text) - limit} chars cut]… "
    if limit <= len(marker) + 2:
        return text[:limit]
    head = (limit - len(marker) + 1) // 2
    tail = limit - len(marker) - head
    return text[:head] + marker + text[len(text) - tail:]


def _json_of(text: str) -> Any:
    """The JSON value in the reply (also inside a ``` fence or prose), or None."""
    stripped = re.sub(r"```(?:json)?", "", text).strip()
    candidates = [stripped]
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = stripped.find(open_), stripped.rfind(close)
        if 0 <= start < end:
            candidates.append(stripped[start:end + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, (dict, list)):
            return value
    return None


def _index(value: Any) -> int:
    """A trajectory number: 3, "3", "trajectory 3", "#3"; 0 when it is none."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*(?:trajectory)?\s*#?\s*(\d+)\s*", str(value), re.IGNORECASE)
    return int(match.group(1)) if match else 0


def _score(value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise UnreadableScores(f"the score {value!r:.40} is not a number") from None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise UnreadableScores(f"the score {value!r:.40} is not a number")
    if not 0.0 <= value <= 1.0:
        raise UnreadableScores(f"the score {value} is outside [0, 1]")
    return float(value)


def _complete_scores(pairs: list[tuple[int, float]], n: int) -> list[float]:
    """The scores in trajectory order, when every one of 1..n has exactly one."""
    indices = [i for i, _ in pairs]
    if sorted(indices) != list(range(1, n + 1)):
        missing = sorted(set(range(1, n + 1)) - set(indices))
        extra = sorted({i for i in indices if not 1 <= i <= n or indices.count(i) > 1})
        raise UnreadableScores(f"trajectories 1..{n} need one score each (missing {missing}, "
                               f"unknown or repeated {extra})")
    scores = dict(pairs)
    return [_score(scores[i]) for i in range(1, n + 1)]


def _text(content: Any) -> str:
    if isinstance(content, list):  # content blocks (AgentScope's formatter, multimodal clients)
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return "" if content is None else str(content)
