"""The inference engine contract: token ids in, token ids + logprobs out.

The local engine (`ajet.engine.local`) and a vLLM-server client implement it;
the tuner and gateway only see this interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# `generate(..., model=INITIAL_MODEL)`: the frozen initial weights (LoRA: the base with no
# adapter; full fine-tuning: a frozen copy). Served by the local engine (ajet/engine/served_models.py).
INITIAL_MODEL = "initial"


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # stop strings (not included in the output)
    n: int = 1
    seed: int | None = None
    # Temperature of the returned logprobs: None = the sampling temperature (1.0 when greedy);
    # set 1.0 to get untempered logprobs. See ajet/engine/sampling.py.
    logprob_temperature: float | None = None
    # An `ajet.engine.grammar.Grammar` the completion must follow (engines with
    # `supports_grammar`); None = free text.
    grammar: Any = None
    # OpenAI's penalties and bias (engines with `supports_penalties`; ajet/engine/sampling.py):
    # each token's logit - frequency_penalty x its count in the completion so far
    # - presence_penalty (once it occurs) + logit_bias[token]. The recorded logprobs are those
    # of that adjusted distribution: the one sampled from.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    # OpenAI's top_logprobs: per completion token, this many most likely tokens of the
    # distribution its logprob is recorded in (engines with `supports_top_logprobs`); 0 = none.
    top_logprobs: int = 0


@dataclass
class Completion:
    token_ids: list[int]  # exactly the sampled tokens (including a final EOS, if sampled)
    logprobs: list[float]  # log p(token) under the sampling distribution's model, per token
    finish_reason: str  # "stop" (EOS or stop string) | "length"
    policy_version: int
    text: str = ""  # decoded token_ids (stop string and EOS removed)
    # Per token: True where a grammar allowed only that token (context, not trained);
    # empty when no token was forced.
    forced: list[bool] = field(default_factory=list)
    # Per token, with `SamplingParams.top_logprobs`: the most likely tokens of the distribution
    # its logprob is recorded in, as (token id, logprob), most likely first; else empty.
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


class EngineFeatures:
    """What an engine can do beyond `InferenceEngine`'s core, declared as class attributes: all
    False here, True where an engine (its class) says so. The gateway reads them to refuse, by
    name, a request's field that the engine would otherwise drop (ajet.tuner.session): every
    engine derives from this, so a missing declaration is False, never an unread flag."""

    supports_streaming: bool = False  # generate() takes on_token
    supports_grammar: bool = False  # SamplingParams.grammar (ajet/engine/grammar.py)
    supports_models: bool = False  # generate() takes model= (ajet/engine/served_models.py)
    supports_penalties: bool = False  # SamplingParams' penalties and logit_bias (ajet/engine/sampling.py)
    supports_top_logprobs: bool = False  # SamplingParams.top_logprobs: Completion.top_logprobs

    def check_model(self, model: str | None) -> None:
        """ValueError unless `generate(..., model=model)` is served (engines with `supports_models`
        say which models they serve; the others serve the policy alone)."""
        if model is not None:
            raise ValueError(f"{type(self).__name__} serves the policy alone, not model={model!r}")


class InferenceEngine(Protocol):
    """Many concurrent callers; the engine batches them at every decode step. What it supports
    beyond this is `EngineFeatures`'."""

    supports_streaming: bool
    supports_grammar: bool
    supports_models: bool
    supports_penalties: bool
    supports_top_logprobs: bool

    @property
    def policy_version(self) -> int:
        """The version of the weights the engine serves now."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """Return `params.n` completions of `prompt_ids`.

        An engine with `supports_models = True` (the local engine) also takes `model=`: None
        (the policy), a LoRA adapter's name, `INITIAL_MODEL` or a local checkpoint directory;
        callers pass it only when it is not None, so other engines keep this signature."""

    @property
    def adapters(self) -> tuple[str, ...]:
        """With `supports_models`: the policy's LoRA adapters by name (`generate(..., model=NAME)`);
        read only from such engines."""

    def check_model(self, model: str | None) -> None:
        """ValueError unless `model` is served (`EngineFeatures.check_model`)."""

    def bump_version(self) -> int:
        """The shared weights changed (in-process trainer): increment and return the version."""

    def load_state_dict(self, state_dict: dict) -> int:
        """Load new weights (out-of-process trainer), bump and return the version."""


class ChatRenderer(Protocol):
    """Renders OpenAI-style messages (+ tools) to prompt text with the model's chat template.

    Implemented by `ajet.engine.chat.ChatFormat`; the tracker depends only on this.
    """

    eos_token_ids: set[int]

    def render(
        self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True
    ) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...
