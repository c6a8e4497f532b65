"""Prefills that feed a decode batch (engine thread only): the requests admitted together, and
the rows that jump over the tokens a grammar forces.

`prefill_requests`: requests admitted together are matched against the prefix cache
(`PrefixReuse`, which first prefills once what several of them share), grouped by similar
length (`prefill_groups`), prefilled one forward per group (`PrefillGroup`,
ajet/engine/prefill.py), and each of a request's n completions samples its first token from the
same logits (n completions, one prefill) before joining the decode batch (`DecodeBatch`,
ajet/engine/decode.py). The requests of one call share a module; each row runs its own LoRA
adapter and its cache entries live in its own namespace.

`jump_forced_runs`: between two decode steps, the rows whose grammar forces a run of tokens
forward it in one go and rejoin.

This module sits above both: prefill.py knows nothing of the batch, decode.py nothing of
how rows are prefilled.
"""

from __future__ import annotations

import logging

from ajet.engine.decode import DecodeBatch, Joining
from ajet.engine.prefill import PrefillGroup, PrefillRow
from ajet.engine.requests import Request, deliver, prefill_groups

log = logging.getLogger(__name__)


def prefill_requests(batch: DecodeBatch, requests: list[Request], version: int) -> None:
    """Start requests admitted together: find each prompt's cached prefix, prefill the rest in
    groups of similar length (`prefill_groups`), sample each completion's first token and join
    the batch. A request whose prefill or first token fails gets the error; the others go on."""
    reuse = batch.reuse
    try:
        matches = reuse.match(batch.weights.model, [r.prompt_ids for r in requests],
                              [r.target for r in requests], version)
        for request, match in zip(requests, matches, strict=True):
            request.cached = match
        batch.join(_prefill_groups(batch, requests, version))
    except BaseException as exc:
        for request in requests:  # none may wait forever; those delivered already are skipped
            deliver(request, error=exc)
        raise
    finally:
        # The prefill copied the cached KV into the batch: the prefixes may be evicted again.
        for request in requests:
            if request.cached is not None:
                request.cached.release()
                request.cached = None


def _prefill_groups(batch: DecodeBatch, requests: list[Request], version: int) -> list[Joining]:
    news = [len(r.prompt_ids) - (r.cached.length if r.cached else 0) for r in requests]
    joining: list[Joining] = []
    for group in prefill_groups(news, totals=[len(r.prompt_ids) for r in requests]):
        members = [requests[i] for i in group]
        try:
            prefilled = _prefill(batch, members, version)
        except Exception as exc:  # noqa: BLE001 - isolate the failing request
            if len(members) > 1:
                log.warning("batched prefill failed (%s); prefilling one by one", exc)
                prefilled = []
                for request in members:
                    try:
                        prefilled.extend(_prefill(batch, [request], version))
                    except Exception as one_exc:  # noqa: BLE001 - fail this request only
                        _fail(request, one_exc)
            else:
                _fail(members[0], exc)
                continue
        joining.extend(prefilled)
    return joining


def _prefill(batch: DecodeBatch, requests: list[Request], version: int) -> list[Joining]:
    """One forward over the prompts' uncached tokens; sample each first token."""
    rows = [PrefillRow(r.prompt_ids, r.cached.length, r.cached.segments, r.target) if r.cached
            else PrefillRow(r.prompt_ids, target=r.target) for r in requests]
    group = PrefillGroup(batch.weights.model, rows)
    logits = group.run()
    batch.reuse.prefilled(group)
    joining = []
    for index, (request, row) in enumerate(zip(requests, rows, strict=True)):
        batch.stats["requests"] += 1
        batch.stats["prefill_tokens"] += len(row.ids) - row.past_len
        try:
            joining.extend(batch.start(request, logits[index], group.row_kv(index), version))
        except Exception as exc:  # noqa: BLE001 - fail this request only
            _fail(request, exc)
    return joining


def jump_forced_runs(batch: DecodeBatch, version: int) -> None:
    """Forward in one go the tokens a grammar forces (the markup of a tool call, a JSON key):
    the rows with such a run (`DecodeBatch.forced_runs`) leave the batch, each forwards its
    last token and its run over its own KV (one prefill forward for all of them), takes the
    run as forced tokens, chooses its next token from the last logits, and rejoins. Decoded
    one step per token, a structured answer of a few chosen tokens costs ~30 steps of the
    whole batch (scripts/bench/engine.py, workload "choices"). A row whose jump fails fails
    its request; the others go on."""
    runs = batch.forced_runs()
    if not runs:
        return
    taken = batch.take_rows(list(runs))
    rows = [PrefillRow(seq.request.prompt_ids + seq.token_ids + run, seq.position, [kv], seq.request.target)
            for (seq, kv), run in zip(taken, runs.values(), strict=True)]
    group = PrefillGroup(batch.weights.model, rows, all_logits=True)
    try:
        logits = group.run()
    except Exception as exc:  # noqa: BLE001 - fail these requests only
        for seq, _ in taken:
            _fail(seq.request, exc, "in a jump over forced tokens")
        return
    joining: list[Joining] = []
    for i, ((seq, _), run) in enumerate(zip(taken, runs.values(), strict=True)):
        try:
            if batch.resume(seq, run, logits[i, -(len(run) + 1):]):
                joining.append((seq, group.row_kv(i)))
        except Exception as exc:  # noqa: BLE001 - as a failed decode step, this request only
            _fail(seq.request, exc, "in a jump over forced tokens")
    batch.join(joining)


def _fail(request: Request, error: BaseException, where: str = "in prefill") -> None:
    log.warning("request failed %s: %s: %s", where, type(error).__name__, error)
    deliver(request, error=error)
