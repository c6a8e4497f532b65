"""The records that flow from the engine to the trainer (docs/concepts.md, "The vocabulary").

Plain dataclasses of Python lists: the tracker, merge, pack and the algorithms are
pure functions over these, testable without a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

# A JSON value, and one JSON object: an OpenAI chat message, a tool spec, a reply as the agent
# received it (this is the lowest layer that holds them).
JSONValue: TypeAlias = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
JSON: TypeAlias = dict[str, JSONValue]


@dataclass
class LLMCall:
    """One chat call as the engine saw it: token ids in, token ids + logprobs out."""

    role: str  # the agent role that made the call ("default" in simple mode)
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]  # one per completion token
    finish_reason: str  # "stop" | "length" | "tool_calls" | ...
    policy_version: int  # version of the weights that produced the completion
    messages: list[JSON] = field(default_factory=list)  # the request's messages
    tools: list[JSON] | None = None  # OpenAI-style tool specs of the request
    response_message: JSON = field(default_factory=dict)  # what the agent received
    trainable: bool = True  # False for roles outside trainable_targets
    call_index: int = 0  # order within the episode
    timeline_id: int = -1  # set by the tracker
    # Why this call could not extend an earlier timeline ("" when it did or is the first).
    fork_cause: str = ""
    # Tool calls in the reply that were accepted after a repair (no `arguments`, extra keys
    # dropped, an unclosed forced call closed...) and whether a tool call could not be parsed.
    # The completion tokens are recorded as sampled either way (see docs/outputs.md).
    repaired_tool_calls: int = 0
    malformed_tool_call: bool = False
    # Per completion token: True where a grammar forced it (ajet/engine/grammar.py); such
    # tokens are context, not trained. Empty when none was forced.
    completion_forced: list[bool] = field(default_factory=list)


@dataclass
class Timeline:
    """The tokens one call saw plus produced; `trainable[i]` marks tokens to train on."""

    timeline_id: int
    role: str
    token_ids: list[int]
    trainable: list[bool]  # completion tokens of trainable roles only
    logprobs: list[float]  # rollout logprob per token (0.0 where not a completion token)
    call_indices: list[int]  # the calls this timeline covers, in order
    # [start, end) spans of each call's completion tokens within token_ids
    completion_spans: list[tuple[int, int]] = field(default_factory=list)
    policy_version: int = 0
    # Why its first call did not extend an earlier one (`ajet.context.tracker.FORK_CAUSES`).
    fork_cause: str = ""


@dataclass
class Sample:
    """What a backbone trains on: one token sequence with per-token loss data."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 = trained token
    old_logprobs: list[float]  # rollout logprobs (0.0 where loss_mask == 0)
    advantage: list[float] = field(default_factory=list)  # per token; filled by the algorithm
    group_id: str = ""  # GRPO group: the task id
    episode_id: str = ""
    role: str = "default"
    reward: float = 0.0
    # [start, end) of each merged call's completion within input_ids (for the viewer).
    segments: list[tuple[int, int]] = field(default_factory=list)
    # Number of LLM calls merged into this sample (for seq_mean loss normalisation).
    num_calls: int = 1
    # Per token: the call_index (within the episode) of the call whose trained token it
    # is, -1 for untrained tokens. Lets loss normalisation count calls and episodes.
    token_call_ids: list[int] = field(default_factory=list)
    # Read-only for its consumers (the records, the step's break counts): each stage that adds
    # to it builds a new one (`ajet.context.budget`).
    metadata: Mapping[str, JSONValue] = field(default_factory=dict)
