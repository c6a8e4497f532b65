"""Signs that a run is not learning, read from its step metrics, each with the lever that helps.

A GRPO run can "learn nothing, with no error": every group gets the same reward, the model
never calls its tool, every reply is cut at `rollout.max_tokens`... `find_learning_signs(rows)`
is a pure function over the rows of `metrics.jsonl` (train split; other rows are ignored) that
names each such sign, the step it first held, the numbers that show it and what to change.
The training loop feeds `LearningSignsMonitor` step by step (one WARNING per sign, the first
time it holds; the active ones on the progress line); `ajet summary` and `ajet report`
recompute the same function from `metrics.jsonl`, so they agree with what the run warned.

The signs (k = `STEPS` steps that logged the metric, in a row, ending at the step reported):

| sign | holds at a step when | metrics |
|---|---|---|
| `no_reward_variance` | in each of k steps, every group's rewards were equal | `reward/zero_std_frac` = 1 |
| `clip_saturated` | in each of k steps, >= `CLIP_FRAC_HIGH` of the trained tokens were clipped | `actor/clip_frac` |
| `no_tool_calls` | in each of k steps, tools were offered but no episode attempted a call | `agent/tool_offer_rate` > 0, `agent/tool_call_rate` = 0 |
| `no_valid_answers` | in each of k steps, calls were attempted, <= `VALID_RATE_LOW` of them valid, and nothing succeeded | `agent/tool_call_rate` > 0, `agent/valid_tool_call_rate`, `success/rate` = 0 |
| `entropy_collapse` | the entropy fell to <= `ENTROPY_FRACTION` of its first logged value while success < `SOLVED_SUCCESS` (absent success counts as unsolved) | `actor/entropy`, `success/rate` |
| `kl_grows_reward_flat` | over the last k + 1 steps logging both: the mean KL of the later half >= `KL_GROWTH` x that of the earlier half and >= `KL_FLOOR`, while the mean reward rose by <= `REWARD_FLAT` | `actor/kl` (only with `algorithm.kl_coef` > 0), `reward/mean` |
| `all_truncated` | in each of k steps, >= `TRUNCATED_RATE_HIGH` of the episodes ended on a reply cut at its token limit | `rollout/truncated_rate` |
| `step_credit_idle` | in each of k steps with step credit on, no step shared its state with another step of its task | `credit/state_grouped_share` = 0 |
| `zero_call_episodes` | at one step, >= 1 episode made no LLM call (nothing of it is trained) | `rollout/zero_call_episodes` > 0 |

A sign whose metrics a run did not log (an older run, another backbone, no KL reference) is
not checked. `no_reward_variance` is about group baselines (grpo, rloo, ppo): with
`reinforce_pp` equal rewards within a task are a weaker sign (the task's samples never differ).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

STEPS = 3  # k: steps in a row a persistent sign must hold before it is reported
CLIP_FRAC_HIGH = 0.8  # clip fraction "near 1": most tokens' gradients are clipped away
VALID_RATE_LOW = 0.05  # at most 1 valid tool call in 20 attempted
ENTROPY_FRACTION = 0.1  # entropy at or below a tenth of the starting policy's
SOLVED_SUCCESS = 0.9  # a low entropy is convergence, not collapse, once this success rate is reached
KL_GROWTH = 2.0  # the later half's mean KL at least doubles the earlier half's ...
KL_FLOOR = 0.01  # ... and is at least this (nats per token, k3), so noise near 0 does not count
REWARD_FLAT = 0.01  # ... while the mean reward rose by at most this
TRUNCATED_RATE_HIGH = 0.9  # (nearly) every episode ended on a reply cut at its token limit

Row = Mapping[str, Any]


@dataclass(frozen=True)
class LearningSign:
    name: str
    step: int  # the first step at which it held
    last_step: int  # the last step at which it held
    evidence: str  # the numbers that show it, at `step`
    lever: str  # what to change

    def describe(self) -> str:
        steps = f"step {self.step}" if self.last_step == self.step else f"steps {self.step}-{self.last_step}"
        return f"{self.name} ({steps}): {self.evidence}. Try: {self.lever}"


def find_learning_signs(rows: Iterable[Row]) -> list[LearningSign]:
    """The signs found in a run's metric rows (`metrics.jsonl`: train rows, any order; a
    re-logged step keeps its last row), in the order of `SIGNS`."""
    train = _train_rows(rows)
    found = []
    for name, check, lever in SIGNS:
        held = [(i, evidence) for i in range(len(train)) if (evidence := check(train, i)) is not None]
        if held:
            first, evidence = held[0]
            found.append(LearningSign(name, _step(train[first]), _step(train[held[-1][0]]), evidence, lever))
    return found


class LearningSignsMonitor:
    """The online view: `observe(step, metrics)` after each train step; every sign is warned
    about once, the first time it holds. `active` names the signs that hold at the last step."""

    def __init__(self, earlier_rows: Iterable[Row] = ()) -> None:
        # A resumed run passes the rows it kept, so trends continue across the restart.
        self.rows: list[Row] = [r for r in earlier_rows if r.get("split", "train") == "train"]
        self.reported: set[str] = set()
        self.active: list[str] = []

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[LearningSign]:
        """Add a step's metrics; return (and warn about) the signs seen for the first time."""
        self.rows.append({**metrics, "step": step, "split": "train"})
        signs = find_learning_signs(self.rows)
        self.active = [s.name for s in signs if s.last_step == step]
        new = [s for s in signs if s.name not in self.reported]
        for sign in new:
            self.reported.add(sign.name)
            log.warning("step %d: the run may not be learning: %s", step, sign.describe())
        return new


def _no_reward_variance(rows: Sequence[Row], i: int) -> str | None:
    window = _last(rows, i, ("reward/zero_std_frac",), STEPS)
    if window is None or any(_num(r, "reward/zero_std_frac") < 1.0 for r in window):
        return None
    if any((_num(r, "distill/tokens") or 0) > 0 for r in window):
        return None  # on-policy distillation: the teacher scores every token, whatever the rewards
    rewards = ", ".join(_fmt(_num(r, "reward/mean")) for r in window)
    return (f"every group's episodes got the same reward at steps {_span(window)} (reward/zero_std_frac 1.00; "
            f"reward/mean {rewards}): all advantages are 0")


def _clip_saturated(rows: Sequence[Row], i: int) -> str | None:
    window = _last(rows, i, ("actor/clip_frac",), STEPS)
    if window is None or any(_num(r, "actor/clip_frac") < CLIP_FRAC_HIGH for r in window):
        return None
    return (f"actor/clip_frac {_values(window, 'actor/clip_frac')} at steps {_span(window)} "
            f"(>= {CLIP_FRAC_HIGH}): most tokens' ratios left the clip range")


def _no_tool_calls(rows: Sequence[Row], i: int) -> str | None:
    window = _last(rows, i, ("agent/tool_offer_rate", "agent/tool_call_rate"), STEPS)
    if window is None or any(_num(r, "agent/tool_offer_rate") <= 0 or _num(r, "agent/tool_call_rate") > 0
                             for r in window):
        return None
    return (f"agent/tool_call_rate 0 at steps {_span(window)} while tools were offered "
            f"(agent/tool_offer_rate {_values(window, 'agent/tool_offer_rate')})")


def _no_valid_answers(rows: Sequence[Row], i: int) -> str | None:
    keys = ("agent/tool_call_rate", "agent/valid_tool_call_rate", "success/rate")
    window = _last(rows, i, keys, STEPS)
    if window is None or any(_num(r, "agent/tool_call_rate") <= 0 or _num(r, "success/rate") > 0
                             or _num(r, "agent/valid_tool_call_rate") > VALID_RATE_LOW for r in window):
        return None
    return (f"agent/valid_tool_call_rate {_values(window, 'agent/valid_tool_call_rate')} "
            f"(<= {VALID_RATE_LOW}) with agent/tool_call_rate {_values(window, 'agent/tool_call_rate')} "
            f"and success/rate 0 at steps {_span(window)}")


def _entropy_collapse(rows: Sequence[Row], i: int) -> str | None:
    if _num(rows[i], "actor/entropy") is None:
        return None
    first = next(r for r in rows if _num(r, "actor/entropy") is not None)
    start, now = _num(first, "actor/entropy"), _num(rows[i], "actor/entropy")
    success = _num(rows[i], "success/rate")
    if start <= 0 or now > ENTROPY_FRACTION * start or (success is not None and success >= SOLVED_SUCCESS):
        return None
    return (f"actor/entropy {_fmt(now)}, down from {_fmt(start)} at step {_step(first)} "
            f"(<= {ENTROPY_FRACTION:g}x), with success/rate {_fmt(success)} (< {SOLVED_SUCCESS})")


def _kl_grows_reward_flat(rows: Sequence[Row], i: int) -> str | None:
    window = _last(rows, i, ("actor/kl", "reward/mean"), STEPS + 1)
    if window is None:
        return None
    half = len(window) // 2
    early, late = window[:half], window[-half:]
    kl_early, kl_late = _mean(early, "actor/kl"), _mean(late, "actor/kl")
    gain = _mean(late, "reward/mean") - _mean(early, "reward/mean")
    if kl_late < KL_FLOOR or kl_late < KL_GROWTH * kl_early or gain > REWARD_FLAT:
        return None
    return (f"actor/kl {_values(window, 'actor/kl')} at steps {_span(window)} (later half's mean "
            f"{_fmt(kl_late)} vs {_fmt(kl_early)}) while reward/mean moved {gain:+.3f} "
            f"({_values(window, 'reward/mean')})")


def _all_truncated(rows: Sequence[Row], i: int) -> str | None:
    window = _last(rows, i, ("rollout/truncated_rate",), STEPS)
    if window is None or any(_num(r, "rollout/truncated_rate") < TRUNCATED_RATE_HIGH for r in window):
        return None
    return (f"rollout/truncated_rate {_values(window, 'rollout/truncated_rate')} at steps {_span(window)} "
            f"(>= {TRUNCATED_RATE_HIGH}): the episodes' last replies were cut at their token limit")


def _step_credit_idle(rows: Sequence[Row], i: int) -> str | None:
    window = _last(rows, i, ("credit/state_grouped_share",), STEPS)
    if window is None or any(_num(r, "credit/state_grouped_share") > 0 for r in window):
        return None
    return (f"credit/state_grouped_share 0 at steps {_span(window)} (credit/state_marked_share "
            f"{_values(window, 'credit/state_marked_share')}): no marked state repeated within a task's "
            "rollouts, so step credit added nothing to the episode advantage")


def _zero_call_episodes(rows: Sequence[Row], i: int) -> str | None:
    # One step is enough: an episode without a call is never noise, and trains nothing.
    window = _last(rows, i, ("rollout/zero_call_episodes",), 1)
    if window is None or _num(window[0], "rollout/zero_call_episodes") <= 0:
        return None
    refused = sorted(k for k in window[0] if k.startswith("gateway/refused/") and (_num(window[0], k) or 0) > 0)
    return (f"rollout/zero_call_episodes {_fmt(_num(window[0], 'rollout/zero_call_episodes'))} at step "
            f"{_step(window[0])}: episodes that made no LLM call"
            + (f" (refused calls: {', '.join(f'{k} {_fmt(_num(window[0], k))}' for k in refused)})" if refused else ""))


Check = Callable[[Sequence[Row], int], "str | None"]

# (name, check, lever): the order in which they are reported.
SIGNS: tuple[tuple[str, Check, str], ...] = (
    ("no_reward_variance", _no_reward_variance,
     "make groups differ: rollout.dynamic_sampling.enabled=true (refill the batch with groups that "
     "differ), easy tasks first (task_reader.curriculum), an SFT warm-up on scripted demos "
     "(tutorial/example_sft_warmup), a higher rollout.temperature or a larger rollout.n"),
    ("clip_saturated", _clip_saturated,
     "a lower trainer.lr, wider algorithm.clip_ratio_low / algorithm.clip_ratio_high, "
     "or fewer trainer.ppo_epochs"),
    ("no_tool_calls", _no_tool_calls,
     "show the call format in the prompt (a worked example), force the first call "
     "(rollout.first_call_tool_choice=required, decoded under rollout.tool_call_grammar), "
     "or an SFT warm-up on scripted demos (tutorial/example_sft_warmup)"),
    ("no_valid_answers", _no_valid_answers,
     "decode every call under the tool's schema (rollout.tool_call_grammar=all), show the tool's "
     "arguments in the prompt, or an SFT warm-up on scripted demos; context/tool_calls/malformed "
     "counts the calls that did not parse"),
    ("entropy_collapse", _entropy_collapse,
     "an entropy bonus (algorithm.entropy_coef, e.g. 0.001), a higher rollout.temperature, a lower trainer.lr"),
    ("kl_grows_reward_flat", _kl_grows_reward_flat,
     "a higher algorithm.kl_coef or a lower trainer.lr"),
    ("step_credit_idle", _step_credit_idle,
     "mark states that repeat (WorkflowOutput.step_states: the situation, not the step number or "
     "the history), a larger rollout.n, or algorithm.step_credit=none"),
    ("zero_call_episodes", _zero_call_episodes,
     "turn off the agent framework's response cache, which answers a repeated prompt without a call (DSPy: "
     "dspy.LM(..., cache=False)); read the run's log and gateway/refused/<field> for calls the gateway refused "
     "(docs/gateway.md)"),
    ("all_truncated", _all_truncated,
     "a higher rollout.max_tokens (and context.max_call_tokens / context.max_model_len where the call "
     "budget caps it), or ask for shorter replies in the prompt"),
)


def _train_rows(rows: Iterable[Row]) -> list[Row]:
    latest: dict[int, Row] = {}
    for row in rows:
        if row.get("split", "train") == "train" and isinstance(row.get("step"), int):
            latest[row["step"]] = row
    return [latest[step] for step in sorted(latest)]


def _last(rows: Sequence[Row], i: int, keys: tuple[str, ...], n: int) -> list[Row] | None:
    """The last `n` rows up to `i` that log every key, when row `i` does; else None."""
    def logs(row: Row) -> bool:
        return all(_num(row, key) is not None for key in keys)

    if not logs(rows[i]):
        return None
    window: list[Row] = []
    for j in range(i, -1, -1):
        if logs(rows[j]):
            window.append(rows[j])
            if len(window) == n:
                return window[::-1]
    return None


def _num(row: Row, key: str) -> Any:
    """The metric as a float; None when absent, not a number, NaN or inf."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _mean(rows: Sequence[Row], key: str) -> float:
    return sum(_num(r, key) for r in rows) / len(rows)


def _step(row: Row) -> int:
    return int(row["step"])


def _span(window: Sequence[Row]) -> str:
    return f"{_step(window[0])}-{_step(window[-1])}"


def _values(window: Sequence[Row], key: str) -> str:
    return ", ".join(_fmt(_num(r, key)) for r in window)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
