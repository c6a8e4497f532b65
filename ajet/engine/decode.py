"""The running batch of the local engine and its decode step (engine thread only).

`DecodeBatch` holds the sequences being decoded by one module (the engine keeps one per
module it serves, ajet/engine/served_models.py); row i of its KV cache (`BatchKV`,
ajet/engine/kv.py) is `active[i]`, and runs its request's LoRA adapter. A request's completions join it after their prefill
(ajet/engine/batch_prefill.py): `start` samples each completion's first token from the prefill
logits, `join` adds the rows. `step` forwards the last token of every active sequence at
once, samples the next tokens (grammar-constrained rows one by one, the rest batched), and
drops the sequences that finished, failed or were cancelled. Between two steps, rows whose
grammar forces a run of tokens leave (`forced_runs`, `take_rows`), forward the run in one go
(ajet/engine/batch_prefill.py:jump_forced_runs) and come back (`resume`, `join`).

A sequence ends on EOS ("stop", the EOS token is kept in `token_ids`), a stop string ("stop";
`token_ids` keep every sampled token up to and including the one that completed the stop
string, `text` ends before the stop string) or its budget, `max_tokens` / `max_model_len`
("length"). `text` is decoded with special tokens skipped. A finished completion's KV goes
into the prefix cache: the next turn of an agent extends exactly it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ajet.engine.base import Completion
from ajet.engine.fused_decode import LlamaDecodeStep
from ajet.engine.grammar import GrammarError
from ajet.engine.kv import BatchKV, RowKV, cache_kwarg
from ajet.engine.prefill import PrefixReuse
from ajet.engine.requests import Request, RunningSequence, deliver
from ajet.engine.sampling import (
    TokenChoice,
    choose_token,
    choose_tokens,
    find_stop,
    has_penalties,
    logprob_temperature,
    make_generator,
    penalised,
    with_alternatives,
)
from ajet.engine.served_models import row_adapters
from ajet.engine.weights import ServingWeights

log = logging.getLogger(__name__)

Joining = tuple[RunningSequence, RowKV]  # a sequence and its prompt's KV rows, ready to join

# A grammar's forced run of at least this many tokens is forwarded in one go (a jump) instead
# of one decode step per token: a jump copies the row's KV out of the batch and back in.
JUMP_MIN_TOKENS = 2


class DecodeBatch:
    """The sequences being decoded together, and their KV cache.

    weights: what the decode step forwards. reuse: the prefix cache finished completions go
    into. stats: the engine's counters ("generated_tokens", "decode_steps", "max_batch").
    fused: decode with the written-out step (ajet/engine/fused_decode.py) where it
    applies; False forwards every step through the HF model (to compare).
    """

    def __init__(self, weights: ServingWeights, tokenizer: Any, eos_token_ids: set[int],
                 max_model_len: int, reuse: PrefixReuse, stats: dict[str, int], fused: bool = True) -> None:
        self.weights = weights
        merged = weights.merged_groups if isinstance(weights, ServingWeights) else None  # not a frozen model
        self.fused = LlamaDecodeStep.build(weights.model, merged) if fused else None
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.reuse = reuse
        self.stats = stats
        self.active: list[RunningSequence] = []  # row i of self.kv is self.active[i]
        self.kv: BatchKV | None = None

    def __len__(self) -> int:
        return len(self.active)

    def start(self, request: Request, logits: Any, row_kv: RowKV, version: int) -> list[Joining]:
        """Sample the first token of each of the request's n completions from its prefill logits;
        the completions that go on, with the prompt's KV rows (for `join`)."""
        params = request.params
        request.policy_version = version
        prompt_len = len(request.prompt_ids)
        budget = min(params.max_tokens, self.max_model_len - prompt_len)
        joining = []
        for index in range(params.n):
            seq = RunningSequence(request, index, make_generator(params.seed, index), prompt_len, budget)
            seq.constraint = request.constraints[index] if request.constraints else None
            first = penalised(logits, params, [])  # logit_bias (no token generated yet)
            if seq.constraint is not None and seq.constraint.active:
                choice = seq.constraint.choose(first, params, seq.generator)
            else:
                choice = choose_token(first, params, seq.generator)
            self._accept(seq, with_alternatives(choice, first, params))
            if not seq.finished:
                joining.append((seq, row_kv))
        return joining

    def join(self, joining: list[Joining]) -> None:
        """Add prefilled sequences to the batch (their KV rows are copied into the cache)."""
        if not joining:
            return
        rows = [layers_kv for _, layers_kv in joining]
        if self.kv is None or not self.active:
            self.kv = BatchKV.from_rows(rows)
        else:
            self.kv.add_rows(rows)
        self.active.extend(seq for seq, _ in joining)

    def step(self, version: int) -> None:
        """One decode step over every active sequence, under weights of `version`."""
        kv = self.kv
        assert kv is not None and kv.rows == len(self.active)
        model = self.weights.model
        weight = model.get_input_embeddings().weight
        input_ids = torch.tensor([[seq.token_ids[-1]] for seq in self.active], dtype=torch.long, device=weight.device)
        position_ids = torch.tensor([[seq.position] for seq in self.active], dtype=torch.long, device=weight.device)
        mask = kv.prepare_step(weight.dtype)  # the additive mask must match the activations' dtype
        if self.fused is not None:  # a plain Llama or Qwen2: no adapters, so no row_adapters
            logits = self.fused(input_ids[:, 0], position_ids[:, 0], mask, kv)
        else:
            with row_adapters(model, [seq.request.target.adapter for seq in self.active]):
                out = model(
                    input_ids=input_ids,
                    position_ids=position_ids,
                    attention_mask=mask,
                    **{cache_kwarg(model): kv.cache},
                    use_cache=True,
                    logits_to_keep=1,
                )
            logits = out.logits[:, -1, :]
        kv.advance()
        self.stats["decode_steps"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], kv.rows)
        live = []
        for row, seq in enumerate(self.active):
            seq.position += 1
            if not (seq.request.done or seq.request.cancelled):
                live.append(row)
        seqs = [self.active[row] for row in live]
        choices = self._choose(logits[live] if len(live) < kv.rows else logits, seqs)
        for seq, choice in zip(seqs, choices, strict=True):
            if seq.request.done:  # a sibling completion failed earlier in this loop
                continue
            if isinstance(choice, Exception):
                log.warning("sampling failed: %s: %s", type(choice).__name__, choice)
                deliver(seq.request, error=choice)
                continue
            self._accept(seq, choice)
        self._retire(version)

    def forced_runs(self) -> dict[int, list[int]]:
        """Rows whose grammar forces the next `JUMP_MIN_TOKENS` or more tokens, each with its
        run (cut to the sequence's budget): `ajet.engine.batch_prefill.jump_forced_runs` forwards
        such a run in one go instead of one decode step per token."""
        runs = {}
        for row, seq in enumerate(self.active):
            constraint = seq.constraint
            if constraint is None or seq.finished or seq.request.done or seq.request.cancelled:
                continue
            run = constraint.forced_run()[: seq.budget - len(seq.token_ids)]
            if len(run) >= JUMP_MIN_TOKENS:
                runs[row] = run
        return runs

    def take_rows(self, rows: list[int]) -> list[tuple[RunningSequence, torch.Tensor]]:
        """Remove `rows` from the batch; each sequence with a copy of the KV it has so far
        (prompt and tokens but the last, which was never forwarded:
        `[layers, 2, kv_heads, n, head_dim]`, the prefix cache's layout)."""
        kv = self.kv
        assert kv is not None
        taken = [(self.active[row], kv.row_range(row, 0, self.active[row].position)) for row in rows]
        gone = set(rows)
        keep = [row for row in range(len(self.active)) if row not in gone]
        if keep:
            order = kv.keep_rows(keep, trim=False)  # the rows rejoin after their jump
            self.active = [self.active[row] for row in order]
        else:
            self.active, self.kv = [], None
        return taken

    def resume(self, seq: RunningSequence, run: list[int], logits: torch.Tensor) -> bool:
        """Continue a sequence taken out for a jump: `logits` ([len(run) + 1, vocab]) were
        computed over its last token and `run`. The run's tokens are appended as forced, with
        their logprobs under the unmasked model, then the next token is chosen from the last
        row. True when the sequence goes on (it then rejoins the batch)."""
        params = seq.request.params
        logprobs = torch.log_softmax(logits[:-1].double() / logprob_temperature(params), dim=-1)
        if not torch.isfinite(logprobs).all():  # as `Constraint.choose` refuses them token by token
            raise FloatingPointError("non-finite logits (the model produced NaN/inf)")
        for j, token in enumerate(run):
            self._accept(seq, with_alternatives(TokenChoice(token, float(logprobs[j, token]), forced=True),
                                                logits[j], params))
            if seq.finished or seq.request.done:
                return False
        self.stats["jumped_tokens"] += len(run)
        seq.position += 1 + len(run)  # the forward wrote the last token's KV and the run's
        last = penalised(logits[-1], params, seq.token_ids)
        self._accept(seq, with_alternatives(seq.constraint.choose(last, params, seq.generator), last, params))
        return not (seq.finished or seq.request.done)

    def fail(self, error: BaseException) -> None:
        """Fail every request with a sequence in the batch, and empty it."""
        for seq in self.active:
            deliver(seq.request, error=error)
        self.active = []
        self.kv = None

    @staticmethod
    def _choose(logits: Any, seqs: list[RunningSequence]) -> list[TokenChoice | Exception]:
        """The next token of each row: grammar-constrained rows one by one, the rest batched.
        Rows whose requests have penalties or a logit_bias sample from their adjusted logits."""
        adjusted = [row for row, seq in enumerate(seqs) if has_penalties(seq.request.params)]
        if adjusted:
            logits = logits.float().clone()
            for row in adjusted:
                logits[row] = penalised(logits[row], seqs[row].request.params, seqs[row].token_ids)
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
        for row, seq in enumerate(seqs):
            choice = out[row]
            if isinstance(choice, TokenChoice):
                with_alternatives(choice, logits[row], seq.request.params)
        return out

    def _accept(self, seq: RunningSequence, choice: TokenChoice) -> None:
        """Append a sampled token; finish the sequence on EOS, a stop string or its budget."""
        seq.token_ids.append(choice.token_id)
        seq.logprobs.append(choice.logprob)
        seq.forced.append(choice.forced)
        if choice.top is not None:
            seq.top_logprobs.append(choice.top)
        self.stats["generated_tokens"] += 1
        request = seq.request
        if seq.constraint is not None and not seq.constraint.active:
            seq.constraint.watch(self._decode(seq.token_ids))  # a trigger: free text until then
        elif seq.constraint is not None:
            try:
                seq.constraint.accept(choice.token_id)
            except GrammarError as exc:
                log.warning("grammar-constrained request failed: %s", exc)
                deliver(request, error=exc)
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
            top_logprobs=list(seq.top_logprobs),
        )
        if all(result is not None for result in request.results):
            deliver(request, result=list(request.results))

    def _retire(self, version: int) -> None:
        """Drop finished, failed and cancelled sequences from the batch."""
        keep = [
            row
            for row, seq in enumerate(self.active)
            if not (seq.finished or seq.request.done or seq.request.cancelled)
        ]
        if len(keep) == len(self.active):
            return
        if self.reuse.cache is not None and self.kv is not None:
            self._cache_finished(set(keep), version)
        if not keep or self.kv is None:
            self.active, self.kv = [self.active[row] for row in keep], None
            return
        order = self.kv.keep_rows(keep)
        self.active = [self.active[row] for row in order]

    def _cache_finished(self, keep: set[int], version: int) -> None:
        """Cache the KV of completions that finished (prompt + completion but its last token,
        which was never forwarded): the next turn of an agent extends exactly this."""
        kv = self.kv
        assert kv is not None
        for row, seq in enumerate(self.active):
            if row in keep or not seq.finished or seq.request.policy_version != version:
                continue  # failed, cancelled, or computed (in part) by older weights
            self.reuse.finished(seq.request.prompt_ids + seq.token_ids[:-1],
                                lambda a, b, r=row: kv.row_range(r, a, b), version, seq.request.target)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
