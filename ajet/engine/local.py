"""The local inference engine: continuous batching over a Hugging Face causal LM.

One engine thread owns the decode loop. Callers on any thread or event loop submit with
`await engine.generate(prompt_ids, params)`; the request waits in a queue, joins the running
batch between two decode steps, and its result is handed back on the caller's own loop
(`loop.call_soon_threadsafe`). Every decode step forwards all active sequences together.

How a request runs:
1. Prefill. With the prefix cache on (`prefix_cache_tokens`, ajet/engine/prefix_cache.py),
   a prompt's longest cached prefix is reused and only the rest is forwarded; prefixes that
   several requests admitted together share, and the cache lacks, are forwarded once first.
   Requests admitted together are prefilled in one forward (ajet/engine/prefill.py),
   left-padded, grouped by similar length (`prefill_groups`). The first token of each of
   its `n` completions is sampled from these logits, so the n completions share one
   prefill. The prompt's KV, and a finished completion's, go into the cache; the cache is
   emptied when `bump_version` says the weights changed.
2. Its KV rows join the batch cache (`BatchKV`, ajet/engine/kv.py): left-padded to the
   batch's length, the pad columns masked out with an additive mask, each row keeping its
   own position ids; the cache is preallocated and written in place.
3. Decode steps until EOS ("stop", the EOS token is kept in `token_ids`), a stop string
   ("stop"; `token_ids` keep every sampled token up to and including the one that completed
   the stop string, `text` ends before the stop string) or `max_tokens` / `max_model_len`
   ("length"). `text` is decoded with special tokens skipped.

Failures stay local: a request whose prefill or sampling raises gets the exception, the
others go on; a decode step that raises fails the sequences of that step; the engine thread
keeps serving. Throughput: scripts/bench_engine.py.

Logprobs follow the convention in `ajet.engine.sampling`. `Completion.policy_version` is the
version of the weights when the request was prefilled (the oldest weights that contributed,
if the trainer updated them in place mid-request).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ajet.engine.base import Completion, SamplingParams
from ajet.engine.requests import (  # noqa: F401 - the errors and prefill_groups are part of this module's API
    EngineClosedError,
    PromptTooLongError,
    Request,
    RunningSequence,
    default_eos,
    prefill_groups,
)
from ajet.engine.sampling import (
    TokenChoice,
    choose_token,
    choose_tokens,
    find_stop,
    make_generator,
    stop_strings,
    validate_params,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ajet.engine.kv import BatchKV

log = logging.getLogger(__name__)



class LocalEngine:
    """Continuous-batching engine over `model` (shared with an in-process trainer).

    max_batch_size: most sequences decoded together (a request with n completions takes n).
    max_model_len: longest prompt + completion; default `model.config.max_position_embeddings`.
    eos_token_ids: tokens that end a completion; default the tokenizer's and the model's
        generation config's EOS ids; an empty list never stops on EOS (benchmarks).
    prefix_cache_tokens: budget of the prefix KV cache (ajet/engine/prefix_cache.py), in
        tokens; 0 = off. A prompt that starts with cached tokens prefills only the rest.
    dtype: the weights decoding uses (ajet/engine/weights.py): "float32" = the shared model
        itself; "bfloat16" / "float16" = a lower-precision copy, refreshed from the shared
        model before the first forward under each new `policy_version`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        max_model_len: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        prefix_cache_tokens: int = 0,
        dtype: str = "float32",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size}: must be >= 1")
        self.model = model
        self.model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
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
        self.policy_version = 0
        from ajet.engine.prefill import PrefixReuse
        from ajet.engine.weights import ServingWeights

        self._weights = ServingWeights(model, dtype)  # what prefill and decode forward
        self._reuse = PrefixReuse(self._weights.model, prefix_cache_tokens)
        self._grammars: Any = None  # grammar.GrammarRuntime, built on the first grammar
        # Counters for metrics; "max_batch" is the most sequences one decode step has served.
        self.stats = {
            "requests": 0,
            "prefill_tokens": 0,
            "generated_tokens": 0,
            "decode_steps": 0,
            "max_batch": 0,
        }
        self._cv = threading.Condition()
        self._pending: deque[Request] = deque()
        self._active: list[RunningSequence] = []  # row i of the KV cache is self._active[i]
        self._kv: BatchKV | None = None
        self._pause_depth = 0
        self._is_paused = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ajet-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public API
    supports_streaming = True  # generate() takes on_token
    supports_grammar = True  # SamplingParams.grammar (ajet/engine/grammar.py)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       on_token: Callable[[int], None] | None = None) -> list[Completion]:
        """Return `params.n` completions of `prompt_ids` (waits while the engine is paused).

        `on_token` (n=1 only) is called on the caller's event loop with each token id as it is
        sampled, before the result is delivered.
        """
        validate_params(params)
        if on_token is not None and params.n != 1:
            raise ValueError(f"on_token streams one completion; n={params.n}")
        ids = self._check_prompt(prompt_ids)
        loop = asyncio.get_running_loop()
        request = Request(ids, params, stop_strings(params), loop, loop.create_future(), on_token=on_token)
        request.results = [None] * params.n
        if params.grammar is not None:  # compiled here: a bad grammar fails this call only
            request.constraints = await asyncio.to_thread(self._constraints, params)
        with self._cv:
            if self._closed:
                raise EngineClosedError("the engine is closed; create a new LocalEngine")
            self._pending.append(request)
            self._cv.notify_all()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True  # the engine drops its sequences at the next step
            raise

    def take_metrics(self) -> dict[str, float]:
        """Prefill counters since the last call (then reset), for the step metrics:
        prompt tokens of the requests prefilled, tokens actually forwarded in prefill (shared
        prefixes forwarded once included), and the share of prompt tokens served from the
        prefix cache."""
        return self._reuse.take_metrics()

    @property
    def dtype(self) -> str:
        """The precision of the weights decoding uses ("float32": the shared model's own)."""
        return self._weights.dtype

    def bump_version(self) -> int:
        """The shared weights changed in place: increment and return `policy_version`.
        The prefix cache is emptied, and a lower-precision copy of the weights refreshed,
        before the next forward.

        An in-process trainer updates weights as
        `with engine.paused(): optimizer.step(); engine.bump_version()`.
        """
        with self._cv:
            self.policy_version += 1
            return self.policy_version

    def drop_prefix_cache(self) -> None:
        """Free the prefix cache's KV now instead of at the next prefill. A trainer calls it as
        it starts a weight update: the cache is invalid after the update anyway, and its memory
        (up to `prefix_cache_tokens` x the KV of a token) is better spent on the update."""
        with self.paused():
            self._reuse.clear()

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> int:
        """Load weights with no decode step in flight, then bump and return the version."""
        with self.paused():
            self.model.load_state_dict(state_dict, strict=strict)
            return self.bump_version()  # before any request is prefilled with the new weights

    def pause(self) -> None:
        """Block until no decode step is in flight; requests wait until `resume()`."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("pause() called from the engine thread would deadlock")
        with self._cv:
            self._pause_depth += 1
            self._cv.notify_all()
            while not self._is_paused and not self._closed and self._thread.is_alive():
                self._cv.wait(timeout=1.0)

    def resume(self) -> None:
        """Undo one `pause()`. The model is put back in eval mode before decoding restarts."""
        with self._cv:
            if self._pause_depth == 0:
                raise RuntimeError("resume() without a matching pause()")
            self._pause_depth -= 1
            if self._pause_depth == 0:
                self.model.eval()
                self._cv.notify_all()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """`with engine.paused(): update weights` — no decode step runs inside the block."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine thread; waiting requests fail with `EngineClosedError`."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("engine thread did not stop within %.0f s", timeout)

    @property
    def num_active(self) -> int:
        """Sequences in the running batch."""
        return len(self._active)

    @property
    def num_pending(self) -> int:
        """Requests waiting to join the batch."""
        with self._cv:
            return len(self._pending)

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- checks
    def _constraints(self, params: SamplingParams) -> list[Any]:
        from ajet.engine.grammar import GrammarRuntime

        with self._cv:
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

    # ---------------------------------------------------------------- engine thread
    def _run(self) -> None:
        import torch

        with torch.inference_mode():
            while self._wait_for_work():
                try:
                    self._admit()
                    if self._active:
                        self._step()
                except Exception as exc:  # noqa: BLE001 - a failed step must not kill the engine
                    log.exception("engine step failed; failing its %d sequences", len(self._active))
                    self._fail_active(exc)
        self._fail_everything(EngineClosedError("the engine was closed"))

    def _wait_for_work(self) -> bool:
        with self._cv:
            while True:
                if self._closed:
                    return False
                if self._pause_depth > 0:
                    if not self._is_paused:
                        self._is_paused = True
                        self._cv.notify_all()
                    self._cv.wait()
                    continue
                self._is_paused = False
                if self._pending or self._active:
                    return True
                self._cv.wait()

    def _admit(self) -> None:
        """Prefill waiting requests while there is room, then join them to the batch."""
        taken: list[Request] = []
        with self._cv:
            room = self.max_batch_size - len(self._active)
            while self._pending:
                request = self._pending[0]
                if request.params.n > room and (self._active or taken):
                    break
                self._pending.popleft()
                if not request.cancelled:
                    taken.append(request)
                    room -= request.params.n
        if not taken:
            return
        self._sync_weights()
        try:
            matches = self._reuse.match([r.prompt_ids for r in taken], self.policy_version)
            for request, match in zip(taken, matches, strict=True):
                request.cached = match
            self._join(self._prefill_all(taken))
        finally:
            # The prefill copied the cached KV into the batch: the prefixes may be evicted again.
            for request in taken:
                if request.cached is not None:
                    request.cached.release()
                    request.cached = None

    def _prefill_all(self, taken: list[Request]) -> list[tuple[RunningSequence, list]]:
        news = [len(r.prompt_ids) - (r.cached.length if r.cached else 0) for r in taken]
        joining: list[tuple[RunningSequence, list]] = []
        for group in prefill_groups(news, totals=[len(r.prompt_ids) for r in taken]):
            requests = [taken[i] for i in group]
            try:
                prefilled = self._prefill(requests)
            except Exception as exc:  # noqa: BLE001 - isolate the failing request
                if len(requests) > 1:
                    log.warning("batched prefill failed (%s); prefilling one by one", exc)
                    prefilled = []
                    for request in requests:
                        try:
                            prefilled.extend(self._prefill([request]))
                        except Exception as one_exc:  # noqa: BLE001 - fail this request only
                            self._fail_prefill(request, one_exc)
                else:
                    self._fail_prefill(requests[0], exc)
                    continue
            joining.extend(prefilled)
        return joining

    def _fail_prefill(self, request: Request, error: BaseException) -> None:
        log.warning("request failed in prefill: %s: %s", type(error).__name__, error)
        self._deliver(request, error=error)

    def _prefill(self, requests: list[Request]) -> list[tuple[RunningSequence, list]]:
        """One forward over the prompts' uncached tokens; sample each first token."""
        from ajet.engine.prefill import PrefillGroup, PrefillRow

        rows = []
        for r in requests:
            cached = r.cached
            rows.append(PrefillRow(r.prompt_ids, cached.length, cached.segments) if cached else PrefillRow(r.prompt_ids))
        group = PrefillGroup(self._weights.model, rows)
        group.run()
        self._reuse.prefilled(group)
        joining = []
        for index, (request, row) in enumerate(zip(requests, rows, strict=True)):
            forwarded = len(row.ids) - row.past_len
            self.stats["requests"] += 1
            self.stats["prefill_tokens"] += forwarded
            try:
                joining.extend(self._start_sequences(request, group.logits[index], group.row_kv(index)))
            except Exception as exc:  # noqa: BLE001 - fail this request only
                self._fail_prefill(request, exc)
        return joining

    def _start_sequences(
        self, request: Request, logits: Any, row_kv: list
    ) -> list[tuple[RunningSequence, list]]:
        """Sample the first token of each of the request's n completions from the prefill logits."""
        params = request.params
        request.policy_version = self.policy_version
        prompt_len = len(request.prompt_ids)
        budget = min(params.max_tokens, self.max_model_len - prompt_len)
        joining = []
        for index in range(params.n):
            seq = RunningSequence(request, index, make_generator(params.seed, index), prompt_len, budget)
            seq.constraint = request.constraints[index] if request.constraints else None
            if seq.constraint is not None and seq.constraint.active:
                self._accept(seq, seq.constraint.choose(logits, params, seq.generator))
            else:
                self._accept(seq, choose_token(logits, params, seq.generator))
            if not seq.finished:
                joining.append((seq, row_kv))
        return joining

    def _join(self, joining: list[tuple[RunningSequence, list]]) -> None:
        from ajet.engine.kv import BatchKV

        if not joining:
            return
        rows = [layers_kv for _, layers_kv in joining]
        if self._kv is None or not self._active:
            self._kv = BatchKV.from_rows(rows)
        else:
            self._kv.add_rows(rows)
        self._active.extend(seq for seq, _ in joining)

    def _step(self) -> None:
        """One decode step over every active sequence."""
        import torch

        from ajet.engine.kv import cache_kwarg

        kv = self._kv
        assert kv is not None and kv.rows == len(self._active)
        self._sync_weights()
        tokens = [[seq.token_ids[-1]] for seq in self._active]
        positions = [[seq.position] for seq in self._active]
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
        position_ids = torch.tensor(positions, dtype=torch.long, device=self._device)
        mask = kv.prepare_step(self._dtype)
        out = self._weights.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            **{cache_kwarg(self._weights.model): kv.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        kv.advance()
        logits = out.logits[:, -1, :]
        self.stats["decode_steps"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], kv.rows)
        live = []
        for row, seq in enumerate(self._active):
            seq.position += 1
            if not (seq.request.done or seq.request.cancelled):
                live.append(row)
        seqs = [self._active[row] for row in live]
        choices = self._choose(logits[live] if len(live) < kv.rows else logits, seqs)
        for seq, choice in zip(seqs, choices, strict=True):
            if seq.request.done:  # a sibling completion failed earlier in this loop
                continue
            if isinstance(choice, Exception):
                log.warning("sampling failed: %s: %s", type(choice).__name__, choice)
                self._deliver(seq.request, error=choice)
                continue
            self._accept(seq, choice)
        self._retire()

    @staticmethod
    def _choose(logits: Any, seqs: list[RunningSequence]) -> list[TokenChoice | Exception]:
        """The next token of each row: grammar-constrained rows one by one, the rest batched."""
        free = [row for row, seq in enumerate(seqs) if seq.constraint is None or not seq.constraint.active]
        out: list[TokenChoice | Exception] = [ValueError("unset")] * len(seqs)
        if free:
            chosen = choose_tokens(logits[free] if len(free) < len(seqs) else logits,
                                   [seqs[row].request.params for row in free], [seqs[row].generator for row in free])
            for row, choice in zip(free, chosen, strict=True):
                out[row] = choice
        for row, seq in enumerate(seqs):
            if seq.constraint is not None and seq.constraint.active:
                try:
                    out[row] = seq.constraint.choose(logits[row], seq.request.params, seq.generator)
                except (FloatingPointError, ValueError, RuntimeError) as exc:  # as choose_tokens; GrammarError is a ValueError
                    out[row] = exc
        return out

    def _accept(self, seq: RunningSequence, choice: TokenChoice) -> None:
        """Append a sampled token; finish the sequence on EOS, a stop string or its budget."""
        seq.token_ids.append(choice.token_id)
        seq.logprobs.append(choice.logprob)
        seq.forced.append(choice.forced)
        self.stats["generated_tokens"] += 1
        request = seq.request
        if seq.constraint is not None and not seq.constraint.active:
            seq.constraint.watch(self._decode(seq.token_ids))  # a trigger: free text until then
        elif seq.constraint is not None:
            from ajet.engine.grammar import GrammarError

            try:
                seq.constraint.accept(choice.token_id)
            except GrammarError as exc:
                log.warning("grammar-constrained request failed: %s", exc)
                self._deliver(request, error=exc)
                return
        if request.on_token is not None:
            try:  # FIFO on the caller's loop: every token arrives before the result
                request.loop.call_soon_threadsafe(request.on_token, choice.token_id)
            except RuntimeError:  # the caller's event loop is closed: nobody is listening
                request.on_token = None
        if choice.token_id in self.eos_token_ids:
            self._finish(seq, "stop", self._decode(seq.token_ids[:-1]))
            return
        if request.stops:
            text = self._decode(seq.token_ids)
            at = find_stop(text, request.stops)
            if at >= 0:
                self._finish(seq, "stop", text[:at])
                return
        if len(seq.token_ids) >= seq.budget:
            self._finish(seq, "length", self._decode(seq.token_ids))

    def _finish(self, seq: RunningSequence, reason: str, text: str) -> None:
        seq.finished = True
        request = seq.request
        request.results[seq.index] = Completion(
            token_ids=list(seq.token_ids),
            logprobs=list(seq.logprobs),
            finish_reason=reason,
            policy_version=request.policy_version,
            text=text,
            forced=list(seq.forced) if any(seq.forced) else [],
        )
        if all(result is not None for result in request.results):
            self._deliver(request, result=list(request.results))

    def _retire(self) -> None:
        """Drop finished, failed and cancelled sequences from the batch."""
        keep = [
            row
            for row, seq in enumerate(self._active)
            if not (seq.finished or seq.request.done or seq.request.cancelled)
        ]
        if len(keep) == len(self._active):
            return
        if self._reuse.cache is not None and self._kv is not None:
            self._cache_finished(set(keep))
        if not keep or self._kv is None:
            self._active, self._kv = [self._active[row] for row in keep], None
            return
        order = self._kv.keep_rows(keep)
        self._active = [self._active[row] for row in order]

    def _cache_finished(self, keep: set[int]) -> None:
        """Cache the KV of completions that finished (prompt + completion but its last token,
        which was never forwarded): the next turn of an agent extends exactly this."""
        kv = self._kv
        assert kv is not None
        for row, seq in enumerate(self._active):
            if row in keep or not seq.finished or seq.request.policy_version != self.policy_version:
                continue  # failed, cancelled, or computed (in part) by older weights
            self._reuse.finished(seq.request.prompt_ids + seq.token_ids[:-1],
                                 lambda a, b, r=row: kv.row_range(r, a, b), self.policy_version)

    def _deliver(
        self, request: Request, result: Any = None, error: BaseException | None = None
    ) -> None:
        if request.done:
            return
        request.done = True
        future = request.future

        def settle() -> None:
            if future.done():  # the caller cancelled
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        try:
            request.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the caller's event loop is closed: nobody is waiting
            log.debug("dropping a result for a closed event loop")

    def _fail_active(self, error: BaseException) -> None:
        for seq in self._active:
            self._deliver(seq.request, error=error)
        self._active = []
        self._kv = None

    def _fail_everything(self, error: BaseException) -> None:
        self._fail_active(error)
        with self._cv:
            pending, self._pending = list(self._pending), deque()
        for request in pending:
            self._deliver(request, error=error)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _sync_weights(self) -> None:
        """Refresh the engine's copy of the weights if the trainer bumped the version (engine
        thread, no forward in flight): a request is never served by stale weights."""
        if self._weights.refresh(self.policy_version):
            log.debug("engine %s weights refreshed for policy version %d", self._weights.dtype,
                      self.policy_version)

    @property
    def _device(self) -> torch.device:
        return self._weights.model.get_input_embeddings().weight.device

    @property
    def _dtype(self) -> torch.dtype:
        """The activations' dtype (the additive masks must match it)."""
        return self._weights.model.get_input_embeddings().weight.dtype
