"""`composite`: a weighted sum of named components, plus penalties, with a logged breakdown.

    judge:
      type: composite
      params:
        components:
          answer:  {weight: 0.6, type: task_completion, judge: {type: math}}
          tools:   {weight: 0.2, type: tool_selection_f1}
          steps:   {weight: 0.1, type: step_efficiency}
          format:  {weight: 0.1, type: format_compliance, pattern: "<answer>.*</answer>"}
          fluency: {weight: 0.0, type: llm, params: {rubric: "..."}}   # any judge type
        penalties: {timeout: -0.5, format_error: -0.2}
        success_threshold: 0.8        # optional

Components (each scores in [0, 1]):
- `task_completion`: its `judge` ({type, params}) when given, else
  `output.metadata["task_completed"]`, else `output.is_success`.
- `tool_selection_f1`: F1 between the sets `output.metadata["tools_used"]` and
  `task.metadata["target_tools"]` (both empty: 1).
- `step_efficiency`: `min(1, optimal / steps)` with `task.metadata["optimal_steps"]` (or the
  component's `optimal_steps`) and `output.metadata["steps"]`; 0 steps scores 0.
- `format_compliance`: 1 when `pattern` (a regex) is found in the answer text, else the flag
  `output.metadata["format_ok"]`.
- any judge type (`math`, `llm`, `package.module:Class`...) with its `params`.
A penalty applies when `output.metadata[<its name>]` is truthy.

reward = sum(weight * score) + sum(applied penalties). success: `reward >= success_threshold`
when set; else every task_completion component succeeded (when there are any) and no penalty
applied; else every component scored 1 and no penalty applied. Each component's score goes to
`output.log_metrics["judge/<name>"]`, applied penalties to `judge/penalty/<name>` and the
total to `judge/total`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ajet.config.schema import JudgeConfig
from ajet.judge.base import JudgeError, answer_text, ascore, run_sync
from ajet.judge.build import build_judge
from ajet.workflow import WorkflowOutput, WorkflowTask

METRICS = ("task_completion", "tool_selection_f1", "step_efficiency", "format_compliance")
_SPEC_KEYS = {"weight", "type", "params", "judge", "pattern", "optimal_steps"}


@dataclass
class Component:
    name: str
    weight: float
    type: str
    judge: Any = None
    pattern: re.Pattern[str] | None = None
    optimal_steps: float | None = None


def tool_selection_f1(used: list[str], target: list[str]) -> float:
    used_set, target_set = set(used), set(target)
    if not used_set and not target_set:
        return 1.0
    hits = len(used_set & target_set)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(used_set), hits / len(target_set)
    return 2 * precision * recall / (precision + recall)


class CompositeJudge:
    def __init__(
        self,
        components: dict[str, dict],
        penalties: dict[str, float] | None = None,
        success_threshold: float | None = None,
        *,
        llm_client_factory: Callable[[], Any] | None = None,
    ) -> None:
        if not components:
            raise JudgeError("judge.params.components is empty; name at least one component")
        self.components = [
            _build_component(name, dict(spec), llm_client_factory) for name, spec in components.items()
        ]
        self.penalties = {name: float(value) for name, value in (penalties or {}).items()}
        self.success_threshold = success_threshold

    async def acompute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        scored = await asyncio.gather(*(_score(c, task, output) for c in self.components))
        total = 0.0
        for component, (score, _) in zip(self.components, scored, strict=True):
            output.log_metrics[f"judge/{component.name}"] = score
            total += component.weight * score
        applied = {n: v for n, v in self.penalties.items() if output.metadata.get(n)}
        for name in self.penalties:
            output.log_metrics[f"judge/penalty/{name}"] = applied.get(name, 0.0)
        total += sum(applied.values())
        output.log_metrics["judge/total"] = total
        return total, self._success(total, scored, bool(applied))

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]:
        return run_sync(self.acompute_reward(task, output), type(self).__name__)

    def _success(self, total: float, scored: list[tuple[float, bool | None]], penalised: bool) -> bool:
        if self.success_threshold is not None:
            return total >= self.success_threshold
        completion = [ok for c, (_, ok) in zip(self.components, scored, strict=True)
                      if c.type == "task_completion"]
        if completion:
            return all(completion) and not penalised
        return all(score >= 1.0 for score, _ in scored) and not penalised


def _build_component(name: str, spec: dict, factory: Callable[[], Any] | None) -> Component:
    where = f"judge.params.components.{name}"
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise JudgeError(f"{where}: unknown keys {sorted(unknown)}; valid: {sorted(_SPEC_KEYS)}")
    kind = spec.get("type")
    if not kind:
        raise JudgeError(f"{where}.type is required: one of {METRICS} or a judge type (e.g. math)")
    try:
        weight = float(spec.get("weight", 1.0))
    except (TypeError, ValueError):
        raise JudgeError(f"{where}.weight must be a number, got {spec.get('weight')!r}") from None
    component = Component(name=name, weight=weight, type=kind)
    if kind in METRICS:
        if "pattern" in spec:
            component.pattern = re.compile(spec["pattern"], re.DOTALL)
        component.optimal_steps = spec.get("optimal_steps")
        if "judge" in spec:
            if kind != "task_completion":
                raise JudgeError(f"{where}.judge is only for task_completion components")
            component.judge = _sub_judge(where, spec["judge"], factory)
    else:
        component.judge = _sub_judge(where, {"type": kind, "params": spec.get("params", {})}, factory)
    return component


def _sub_judge(where: str, spec: Any, factory: Callable[[], Any] | None) -> Any:
    if not isinstance(spec, dict) or "type" not in spec:
        raise JudgeError(f"{where}: a sub-judge is {{type: <judge type>, params: {{...}}}}, got {spec!r}")
    if spec["type"] == "group_rank":
        raise JudgeError(f"{where}: group_rank scores a whole group, not one episode; it cannot be "
                         "a component (use it as judge.type=group_rank, or type: llm here)")
    judge = build_judge(JudgeConfig(type=spec["type"], params=dict(spec.get("params") or {})),
                        llm_client_factory=factory)
    if judge is None:
        raise JudgeError(f"{where}: judge type 'none' cannot score a component")
    return judge


async def _score(c: Component, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool | None]:
    meta = output.metadata
    if c.judge is not None:
        return await ascore(c.judge, task, output)
    if c.type == "task_completion":
        done = meta["task_completed"] if "task_completed" in meta else output.is_success
        if done is None:
            raise JudgeError(
                f"component '{c.name}' (task_completion) has nothing to score: give it a judge "
                "({type: math}) or set output.metadata['task_completed'] / is_success in the workflow"
            )
        return (1.0 if done else 0.0), bool(done)
    if c.type == "tool_selection_f1":
        if "target_tools" not in task.metadata:
            raise JudgeError(f"component '{c.name}': task '{task.task_id}' has no metadata['target_tools']")
        return tool_selection_f1(list(meta.get("tools_used") or []), list(task.metadata["target_tools"])), None
    if c.type == "step_efficiency":
        optimal = task.metadata.get("optimal_steps", c.optimal_steps)
        if optimal is None or "steps" not in meta:
            raise JudgeError(
                f"component '{c.name}' (step_efficiency) needs task.metadata['optimal_steps'] (or "
                "the component's optimal_steps) and output.metadata['steps']"
            )
        steps = float(meta["steps"])
        return (min(1.0, float(optimal) / steps) if steps > 0 else 0.0), None
    # format_compliance
    if c.pattern is not None:
        ok = c.pattern.search(answer_text(output)) is not None
    elif "format_ok" in meta:
        ok = bool(meta["format_ok"])
    else:
        raise JudgeError(
            f"component '{c.name}' (format_compliance) needs a pattern (regex) or "
            "output.metadata['format_ok']"
        )
    return (1.0 if ok else 0.0), ok
