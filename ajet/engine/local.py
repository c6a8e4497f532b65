"""The local inference engine: continuous batching over a Hugging Face causal LM.

One engine thread owns the decode loop. Callers on any thread or event loop submit with
`await engine.generate(prompt_ids, params)`; the request waits in a queue, joins the running
batch between two decode steps, and its result is handed back on the caller's own loop
(`loop.call_soon_threadsafe`). Every decode step forwards all active sequences together.

`LocalEngine` is the public face and composes the parts: the scheduler (the queue, admission
while the batch has room, pause/resume, the engine thread: ajet/engine/scheduler.py), the
policy version and the weights decoding uses (ajet/engine/policy_version.py, weights.py), the
models it serves (served_models.py) and the prefix cache (prefill.py). How a request runs:
1. Prefill (ajet/engine/batch_prefill.py, prefill.py). With the prefix cache on (`prefix_cache_tokens`,
   ajet/engine/prefix_cache.py), a prompt's longest cached prefix is reused and only the rest
   is forwarded; prefixes that several requests admitted together share, and the cache lacks,
   are forwarded once first. Requests admitted together are prefilled in one forward,
   left-padded, grouped by similar length (`prefill_groups`). The first token of each of
   its `n` completions is sampled from these logits, so the n completions share one
   prefill. The prompt's KV, and a finished completion's, go into the cache; the cache is
   emptied when `bump_version` says the weights changed.
2. Its KV rows join the batch cache (`BatchKV`, ajet/engine/kv.py): left-padded to the
   batch's length, the pad columns masked out with an additive mask, each row keeping its
   own position ids; the cache is preallocated and written in place.
3. Decode steps (ajet/engine/decode.py) until EOS, a stop string, `max_tokens` or
   `max_model_len`. Where a grammar forces a run of tokens, the row forwards the run in one
   go between two steps (`jump_forced_runs`, ajet/engine/batch_prefill.py).

Which model serves a request (`generate(..., model=...)`: the policy, one of its LoRA
adapters, the frozen initial weights or a local checkpoint) is resolved by `ServedModels`
(ajet/engine/served_models.py). Requests of the policy's adapters share one batch (a mixed-adapter
forward); a frozen model has its own decode batch, stepped after the policy's.

Failures stay local: a request whose prefill or sampling raises gets the exception, the
others go on; a decode step that raises fails the sequences of that step; the engine thread
keeps serving. Throughput: scripts/bench/engine.py.

Logprobs follow the convention in `ajet.engine.sampling`. `Completion.policy_version` is the
version of the weights when the request was prefilled (the oldest weights that contributed,
if the trainer updated them in place mid-request).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ajet.engine.base import Completion, EngineFeatures, SamplingParams
from ajet.engine.decode import DecodeBatch
from ajet.engine.grammar import Constraint, GrammarRuntime
from ajet.engine.policy_version import PolicyVersion
from ajet.engine.prefill import PrefixReuse
from ajet.engine.requests import PromptTooLongError, Request, default_eos
from ajet.engine.sampling import stop_strings, validate_params
from ajet.engine.scheduler import Scheduler
from ajet.engine.served_models import ServedModels, frozen_namespace
from ajet.engine.weights import ServingWeights

log = logging.getLogger(__name__)


class LocalEngine(EngineFeatures):
    """Continuous-batching engine over `model` (shared with an in-process trainer).

    max_batch_size: most sequences decoded together (a request with n completions takes n).
    max_model_len: longest prompt + completion; default `model.config.max_position_embeddings`.
    eos_token_ids: tokens that end a completion; default the tokenizer's and the model's
        generation config's EOS ids; an empty list never stops on EOS (benchmarks).
    prefix_cache_tokens: budget of the prefix KV cache (ajet/engine/prefix_cache.py), in
        tokens; 0 = off. A prompt that starts with cached tokens prefills only the rest.
    dtype: the weights decoding uses (ajet/engine/weights.py): "float32" = the shared model
        itself; "bfloat16" / "float16" / "bfloat16_linear" = a lower-precision copy, refreshed
        from the shared model before the first forward under each new `policy_version`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        max_waiting: int = 0,
        max_model_len: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        prefix_cache_tokens: int = 0,
        dtype: str = "float32",
        fixed_weights: bool = False,
        jump_forward: bool = True,
        initial_model: str | None = None,
        fused_decode: bool = True,
    ) -> None:
        """`fixed_weights`: the weights never change (an evaluation), so the default model
        "initial" is the policy itself, served in its batches instead of a frozen copy.
        `jump_forward`: a run of tokens a grammar forces is forwarded in one go
        (`jump_forced_runs`), not one decode step per token; False only to compare.
        `initial_model`: a checkpoint directory that the default model "initial" names instead
        of this model's own initial weights (a pipeline stage after training: ajet.pipeline).
        `fused_decode`: decode steps of a plain Llama or Qwen2 model run the written-out step
        (ajet/engine/fused_decode.py) instead of the HF forward; False only to compare.
        `max_waiting`: requests waiting for a batch slot beyond which `generate` refuses with
        `EngineBusyError` (0: no cap)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size}: must be >= 1")
        self.model = model
        self.model.eval()
        self.tokenizer = tokenizer
        config = model.config
        self.max_model_len = int(
            max_model_len or getattr(config, "max_position_embeddings", 0) or 4096
        )
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            log.warning(
                "this model has sliding-window layers; the local engine attends to the whole "
                "context, which is exact only while sequences are shorter than the window"
            )
        if eos_token_ids is None:
            self.eos_token_ids = default_eos(model, tokenizer)
            if not self.eos_token_ids:
                raise ValueError("no EOS token id found; pass eos_token_ids=[...] to LocalEngine")
        else:
            self.eos_token_ids = set(eos_token_ids)  # empty: never stop on EOS (benchmarks)
        self._weights = ServingWeights(model, dtype)  # what prefill and decode forward
        self._version = PolicyVersion(self._weights, fixed=fixed_weights)
        # A frozen default model's KV survives weight updates (`frozen_namespace`); the policy's does not.
        self._reuse = PrefixReuse(prefix_cache_tokens, keep=frozen_namespace)
        # adapters, frozen default models
        self._served = ServedModels(self._weights, fixed=fixed_weights, initial=initial_model)
        self._grammars: GrammarRuntime | None = None  # built on the first grammar
        self._grammar_lock = threading.Lock()  # `_constraints` runs in worker threads
        # Counters for metrics; "max_batch" is the most sequences one decode step has served.
        self.stats = {
            "requests": 0,
            "prefill_tokens": 0,
            "generated_tokens": 0,
            "decode_steps": 0,
            "max_batch": 0,
            "jumped_tokens": 0,  # of generated_tokens: forced by a grammar, forwarded in a jump (not a decode step)
        }
        self.fused_decode = fused_decode
        self._batch = DecodeBatch(self._weights, tokenizer, self.eos_token_ids, self.max_model_len,
                                  self._reuse, self.stats, fused_decode)  # the policy's (all its adapters)
        self._scheduler = Scheduler(self._batch, self._frozen_batch, sync_weights=self._version.sync,
                                    on_resume=self.model.eval, max_batch_size=max_batch_size,
                                    max_waiting=max_waiting, jump_forward=jump_forward)

    # ---------------------------------------------------------------- public API
    supports_streaming = True  # generate() takes on_token
    supports_grammar = True  # SamplingParams.grammar (ajet/engine/grammar.py)
    supports_models = True  # generate() takes model= (ajet/engine/served_models.py)
    supports_penalties = True  # SamplingParams' penalties and logit_bias (ajet/engine/sampling.py)
    supports_top_logprobs = True  # SamplingParams.top_logprobs: Completion.top_logprobs

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       on_token: Callable[[int], None] | None = None,
                       model: str | None = None) -> list[Completion]:
        """Return `params.n` completions of `prompt_ids` (waits while the engine is paused).

        `on_token` (n=1 only) is called on the caller's event loop with each token id as it is
        sampled, before the result is delivered. `model`: None = the policy; a LoRA adapter's
        name (`adapters`); `INITIAL_MODEL` = the frozen initial weights; a local checkpoint
        directory = that model, loaded on first use (off the engine thread) and frozen.
        """
        validate_params(params)
        if on_token is not None and params.n != 1:
            raise ValueError(f"on_token streams one completion; n={params.n}")
        ids = self._check_prompt(prompt_ids)
        target = self._served.target(model)
        if self._served.needs_load(target, self.policy_version):
            await asyncio.to_thread(self._served.load, target)
        loop = asyncio.get_running_loop()
        request = Request(ids, params, stop_strings(params), loop, loop.create_future(), on_token=on_token,
                          target=target)
        request.results = [None] * params.n
        if params.grammar is not None:  # compiled here: a bad grammar fails this call only
            request.constraints = await asyncio.to_thread(self._constraints, params)
        self._scheduler.submit(request)
        try:
            results: list[Completion] = await request.future
            return results
        except asyncio.CancelledError:
            request.cancelled = True  # the engine drops its sequences at the next step
            raise

    @property
    def adapters(self) -> tuple[str, ...]:
        """The policy's LoRA adapters (with `model.lora.per_role`, one per trainable role)."""
        return self._served.adapters

    def check_model(self, model: str | None) -> None:
        """Raise ValueError (saying what would be served) if `generate(model=model)` could not
        be: an unknown adapter, a missing directory, a checkpoint of another vocabulary, a peft
        adapter of another base. Reads config files only; weights load on first use."""
        self._served.check(model)

    def take_metrics(self) -> dict[str, float]:
        """Prefill counters since the last call (then reset), for the step metrics:
        prompt tokens of the requests prefilled, tokens actually forwarded in prefill (shared
        prefixes forwarded once included), and the share of prompt tokens served from the
        prefix cache."""
        return self._reuse.take_metrics()

    def decoded_tokens(self) -> int:
        """Tokens decoded since the engine started, by every model it serves: sampled, or forced
        by a grammar. The trainer's tok/s is this count's growth over a step's window."""
        return self.stats["generated_tokens"]  # jumped_tokens are among them

    # ---------------------------------------------------------------- weights (ajet/engine/policy_version.py)
    @property
    def policy_version(self) -> int:
        """The version of the weights the engine serves; `Completion.policy_version` is the one a
        request was prefilled under."""
        return self._version.value

    @property
    def dtype(self) -> str:
        """The precision of the weights decoding uses ("float32": the shared model's own)."""
        return self._weights.dtype

    @property
    def decodes_a_copy(self) -> bool:
        """Whether the engine decodes with its own copy of the weights (engine_dtype != float32)."""
        return self._weights.is_copy

    def bump_version(self) -> int:
        """The shared weights changed in place: increment and return `policy_version`.
        The prefix cache is emptied, and a lower-precision copy of the weights refreshed,
        before the next forward.

        An in-process trainer updates weights as
        `with engine.paused(): optimizer.step(); engine.bump_version()`.
        """
        return self._version.bump()

    def publish_weights(self) -> int:
        """The trainer changed the weights while the engine kept decoding on its own copy of the
        previous ones (`rollout.max_staleness`): pause, bump the version and refresh the copy now,
        before the trainer can change the weights again. Returns the new version."""
        with self.paused():
            return self._version.publish()

    def drop_prefix_cache(self) -> None:
        """Free the prefix cache's KV now instead of at the next prefill. A trainer calls it as
        it starts a weight update: the cache is invalid after the update anyway, and its memory
        (up to `prefix_cache_tokens` x the KV of a token) is better spent on the update. The
        frozen default models' KV stays: no update changes it."""
        with self.paused():
            self._reuse.clear()

    def drop_weight_copy(self) -> int:
        """Free the engine's packed copy of the weights (engine_dtype float16, bfloat16_linear) until
        the next forward packs it again from the trainer's; the bytes freed (0 for other dtypes).
        For an in-process update that pauses the engine: the copy is stale after it anyway."""
        with self.paused():
            return self._weights.drop()

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> int:
        """Load weights with no decode step in flight, then bump and return the version."""
        with self.paused():
            self.model.load_state_dict(state_dict, strict=strict)
            return self.bump_version()  # before any request is prefilled with the new weights

    # ---------------------------------------------------------------- scheduling (ajet/engine/scheduler.py)
    def pause(self) -> None:
        """Block until no decode step is in flight; requests wait until `resume()`."""
        self._scheduler.pause()

    def resume(self) -> None:
        """Undo one `pause()`. The model is put back in eval mode before decoding restarts."""
        self._scheduler.resume()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """`with engine.paused(): update weights` — no decode step runs inside the block."""
        with self._scheduler.paused():
            yield

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine thread; waiting requests fail with `EngineClosedError`."""
        self._scheduler.close(timeout)

    @property
    def num_active(self) -> int:
        """Sequences in the running batches."""
        return self._scheduler.num_active

    @property
    def num_pending(self) -> int:
        """Requests waiting to join the batch."""
        return self._scheduler.num_pending

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- parts
    def _frozen_batch(self, unit: str, version: int) -> DecodeBatch:
        """The decode batch of a frozen model (engine thread, when it is first served)."""
        return DecodeBatch(self._served.unit(unit, version), self.tokenizer, self.eos_token_ids,
                           self.max_model_len, self._reuse, self.stats, self.fused_decode)

    def _constraints(self, params: SamplingParams) -> list[Constraint]:
        assert params.grammar is not None
        with self._grammar_lock:
            if self._grammars is None:
                self._grammars = GrammarRuntime(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return [self._grammars.start(params.grammar) for _ in range(params.n)]

    def _check_prompt(self, prompt_ids: list[int]) -> list[int]:
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids is empty; the engine needs at least one prompt token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})"
            )
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens but max_model_len is {self.max_model_len} "
                "(prompt + completion); shorten the conversation or raise max_model_len"
            )
        return ids
