"""The task metadata keys a judge compares with: its reference, which agents must not see.

`ajet serve` hands tasks to clients it does not control; a reference answer in the ticket
would let a client score itself perfectly (and the policy learn to copy it). So the keys a
judge reads as its *reference* stay on the server (`serve.private_metadata_keys`, default:
these). Keys that state the problem stay visible: countdown's `numbers` and `target` are the
puzzle, not its solution.

- `math`, `exact_match`, `llm`: `answer`.
- `composite`: its sub-judges' keys, `target_tools` (tool_selection_f1) and `optimal_steps`
  (step_efficiency).
- `countdown`, and no judge at all (`none`: the client computes the reward and may need the
  reference to do so): nothing.
- A custom judge: its `private_metadata_keys` attribute when it declares one, else `answer`
  (the built-in judges' convention, `ajet.judge.base.ground_truths`).
"""

from __future__ import annotations

from typing import Any

from ajet.judge.composite import CompositeJudge
from ajet.judge.countdown import CountdownJudge
from ajet.judge.exact_match import ExactMatchJudge
from ajet.judge.llm_judge import LLMJudge
from ajet.judge.math_judge import MathJudge

_ANSWER = frozenset({"answer"})
_COMPONENT_KEYS = {"tool_selection_f1": "target_tools", "step_efficiency": "optimal_steps"}


def private_metadata_keys(judge: Any) -> frozenset[str]:
    """The keys of `task.metadata` that `judge` (a built judge, or None) compares with."""
    if judge is None or isinstance(judge, CountdownJudge):
        return frozenset()
    declared = getattr(judge, "private_metadata_keys", None)
    if declared is not None:
        return frozenset(declared)
    if isinstance(judge, (MathJudge, ExactMatchJudge, LLMJudge)):
        return _ANSWER
    if isinstance(judge, CompositeJudge):
        keys: set[str] = set()
        for component in judge.components:
            if component.judge is not None:
                keys |= private_metadata_keys(component.judge)
            if component.type in _COMPONENT_KEYS:
                keys.add(_COMPONENT_KEYS[component.type])
        return frozenset(keys)
    return _ANSWER
