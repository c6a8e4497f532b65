"""The result of one episode.

An `Episode` is plain data: the manager aggregates episodes into metrics and the
backbone turns the timelines of the `ok` ones into training samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ajet.context.types import Timeline
from ajet.workflow import WorkflowOutput, WorkflowTask

EpisodeStatus = Literal["ok", "failed", "timeout", "pending"]

OK: Final = "ok"
FAILED: Final = "failed"
TIMEOUT: Final = "timeout"
# Ended, waiting for its group's judge (judge.type=group_rank; `ajet.rollout.group_judging`):
# never trained on unless that judge scores it, which makes it "ok".
PENDING: Final = "pending"


@dataclass
class Episode:
    """One run of the workflow on one task.

    `reason` is "" for ok episodes, else a short machine-readable cause that becomes a
    metric key (`rollout/failed/<reason>`): `workflow_error:<ExceptionType>`, `timeout`,
    `bad_output` (not a WorkflowOutput, a field of the wrong type, a NaN/inf reward, a per-role
    reward naming a role the episode never registered or missing a trained role), `no_reward`,
    `judge_error:<ExceptionType>` (also `:bad_return`, `:non_finite_reward`), `judge_timeout`,
    `infrastructure:<ExceptionType>` (retries exhausted), `session_error:<ExceptionType>`,
    `tracker_error:<ExceptionType>`, `group_judge:<unreadable|call_error|timeout>` (the group
    judge failed; its whole group is dropped). `error_message` holds the human-readable detail
    (the traceback for exceptions).
    """

    episode_id: str
    task: WorkflowTask
    group_id: str
    status: EpisodeStatus = OK
    reason: str = ""
    error_message: str = ""
    output: WorkflowOutput | None = None
    # A float for everything that needs one (metrics, dynamic sampling, validation, the GPU
    # backbones): the workflow's or judge's reward, or with per-role rewards their mean.
    reward: float = 0.0
    is_success: bool = False
    # Per-role rewards ({role: reward}) when the workflow or judge gave a dict; {} otherwise.
    # Advantages are then computed per (task, role) group (`ajet.rl.samples`).
    role_rewards: dict[str, float] = field(default_factory=dict)
    timelines: list[Timeline] = field(default_factory=list)
    tracker_stats: dict[str, Any] = field(default_factory=dict)
    num_calls: int = 0
    # Calls and completion tokens per role (`role/<name>/calls`, `role/<name>/tokens`).
    role_calls: dict[str, int] = field(default_factory=dict)
    role_tokens: dict[str, int] = field(default_factory=dict)
    # Tool calls the model attempted / made validly (`ajet.rollout.agent_metrics.count_tool_calls`).
    tool_calls: int = 0
    valid_tool_calls: int = 0
    # Whether any of its calls offered tools, and whether its last call was cut at its token
    # limit (finish_reason "length"): `agent/tool_offer_rate`, `rollout/truncated_rate`.
    offered_tools: bool = False
    truncated: bool = False
    # The calls its session refused with a 400, by the field to blame ("request" when none):
    # `gateway/refused/<field>` (`ajet.tuner.session.EpisodeSession.refusals`).
    refused: dict[str, int] = field(default_factory=dict)
    # The policy versions that produced the episode's completions (several when its calls
    # spanned a weight update; see `ajet.serve.broker`).
    policy_versions: list[int] = field(default_factory=list)
    duration_s: float = 0.0
    retries: int = 0
    # What a group judge sees of the episode (`ajet.judge.group_rank.Trajectory`); only set
    # while the episode is pending.
    trajectory: Any = None

    @property
    def ok(self) -> bool:
        return self.status == OK
