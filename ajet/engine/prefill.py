"""Prefill of the local engine: one forward over the new tokens of several prompts, each
continuing its own cached prefix (from `ajet.engine.prefix_cache`; none when it missed).

The group's KV lives in one buffer `[layers, 2, rows, kv_heads, T, head_dim]`. Row i is
right-aligned at T: `[zeros | cached past_i (p_i) | new tokens_i (s_i)]`, T = max(p_i + s_i).
The inputs are the new tokens, left-padded to W = max(s_i), so the last input column is
every row's last prompt token (`logits_to_keep=1`). The cache layer writes only the real new
tokens' keys/values to their row's columns (pad inputs are computed and dropped), and an
additive 4-D mask lets query t of row i see columns `[start_i, its own column]`. Each row
carries its own position ids, so a row computes what it would compute alone, and its KV ends
up contiguous: `[start_i, T)`, which is what `BatchKV` and the prefix cache take.

`PrefixReuse` is what the engine does with its prefix cache: find each prompt's cached prefix
(after prefilling once what several prompts admitted together share), store prompts and
finished completions, count. Each row of a group runs its own LoRA adapter (`row_adapters`,
ajet/engine/served_models.py) and its cache entries live in its target's namespace. What
feeds the decode batch from these forwards (admitted requests, jumps over forced tokens) is
ajet/engine/batch_prefill.py: this module knows nothing of the batch.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ajet.engine.kv import RowKV, cache_kwarg
from ajet.engine.prefix_cache import PrefixCache, shared_prefixes
from ajet.engine.requests import Target, prefill_groups
from ajet.engine.served_models import row_adapters

log = logging.getLogger(__name__)


@dataclass
class PrefillRow:
    ids: list[int]  # the whole prompt
    past_len: int = 0  # leading tokens whose KV is given in `past` (not forwarded)
    past: list[torch.Tensor] | None = None  # KV segments [layers, 2, kv_heads, n, head_dim]
    target: Target = Target()  # the adapter the row runs with, the cache namespace of its KV


class _GroupLayer(DynamicLayer):
    """One layer of the group buffer, in the form the model's attention calls (`update`)."""

    def __init__(self, owner: PrefillGroup, layer: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer = layer
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.owner
        assert o.buf is not None  # made by `run` before the forward
        keys, values = o.buf[self.layer, 0], o.buf[self.layer, 1]
        keys[o.dst_rows, :, o.dst_cols] = key_states[o.dst_rows, :, o.src_cols]
        values[o.dst_rows, :, o.dst_cols] = value_states[o.dst_rows, :, o.src_cols]
        return keys, values

    def get_seq_length(self) -> int:
        return self.owner.width - self.owner.inputs


class PrefillGroup:
    """The forward of one prefill group; after `run()`, `logits[i]` is row i's next-token
    logits and `row_kv(i)` / `kv_range(i, a, b)` give its prompt's KV."""

    def __init__(self, model: Any, rows: list[PrefillRow], all_logits: bool = False) -> None:
        """`all_logits`: keep every input column's logits (`logits[i]` is then
        `[W, vocab]`, row i's own inputs in its last columns), not only the last one's."""
        self.model = model
        self.rows = rows
        self.all_logits = all_logits
        self.news = [len(r.ids) - r.past_len for r in rows]
        if min(self.news) < 1:
            raise ValueError("every prefill row needs at least one token to forward")
        self.width = max(len(r.ids) for r in rows)  # T
        self.inputs = max(self.news)  # W
        self.starts = [self.width - len(r.ids) for r in rows]
        self.buf: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None

    def run(self) -> torch.Tensor:
        """The forward; returns (and keeps) `logits`."""
        model, rows, T, W = self.model, self.rows, self.width, self.inputs
        device = model.get_input_embeddings().weight.device
        dtype = model.get_input_embeddings().weight.dtype
        self.buf = self._buffer(device, dtype)
        ids: list[list[int]] = []
        positions: list[list[int]] = []
        dst_rows: list[int] = []
        dst_cols: list[int] = []
        src_cols: list[int] = []
        limits = torch.empty(len(rows), W, dtype=torch.long)
        for i, (row, new) in enumerate(zip(rows, self.news, strict=True)):
            pad = W - new
            ids.append([0] * pad + row.ids[row.past_len :])
            positions.append([0] * pad + list(range(row.past_len, len(row.ids))))
            dst_rows += [i] * new
            dst_cols += range(T - new, T)
            src_cols += range(pad, W)
            # Query column j sits at buffer column T - W + j; a pad query may see the whole row
            # (its output is dropped; an empty row would give NaN).
            limits[i, :pad] = T - 1
            limits[i, pad:] = torch.arange(T - new, T)
            at = self.starts[i]
            for segment in row.past or []:
                n = segment.shape[3]
                self.buf[:, :, i, :, at : at + n] = segment
                at += n
        self.dst_rows = torch.tensor(dst_rows, device=device)
        self.dst_cols = torch.tensor(dst_cols, device=device)
        self.src_cols = torch.tensor(src_cols, device=device)
        cols = torch.arange(T)
        starts = torch.tensor(self.starts)
        valid = (cols[None, None, :] >= starts[:, None, None]) & (cols[None, None, :] <= limits[:, :, None])
        mask = torch.zeros(valid.shape, dtype=dtype)
        mask.masked_fill_(~valid, torch.finfo(dtype).min)
        cache = DynamicCache()
        cache.layers = [_GroupLayer(self, i) for i in range(self.buf.shape[0])]
        with row_adapters(model, [row.target.adapter for row in rows]):
            out = model(
                input_ids=torch.tensor(ids, dtype=torch.long, device=device),
                position_ids=torch.tensor(positions, dtype=torch.long, device=device),
                attention_mask=mask[:, None].to(device),
                **{cache_kwarg(model): cache},
                use_cache=True,
                logits_to_keep=W if self.all_logits else 1,
            )
        self.logits = logits = out.logits if self.all_logits else out.logits[:, -1, :]
        return logits

    def _buffer(self, device: Any, dtype: Any) -> torch.Tensor:
        config = self.model.config
        layers = config.num_hidden_layers
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return torch.zeros((layers, 2, len(self.rows), heads, self.width, dim), dtype=dtype, device=device)

    def row_kv(self, i: int) -> RowKV:
        """Row i's prompt KV per layer, as `BatchKV.add_rows` takes it (views of the buffer)."""
        assert self.buf is not None
        kv = self.buf[:, :, i : i + 1, :, self.starts[i] :]
        return [(kv[layer, 0], kv[layer, 1]) for layer in range(kv.shape[0])]

    def kv_range(self, i: int, a: int, b: int) -> torch.Tensor:
        """A copy of row i's KV for prompt tokens [a, b): [layers, 2, kv_heads, b - a, head_dim]."""
        assert self.buf is not None
        start = self.starts[i]
        return self.buf[:, :, i, :, start + a : start + b].clone()


def warm_shared_prefixes(model: Any, cache: Any, prompts: list[list[int]], min_tokens: int,
                         target: Target = Target()) -> int:
    """Prefill, once each, the prefixes that several of `prompts` share and the prefix cache
    does not hold yet (shortest first, each reusing the last); return the tokens forwarded.
    Every prompt is `target`'s (its adapter forwards them, its namespace keeps them).

    Requests admitted together (the n episodes of a group, tasks under one system prompt)
    would otherwise each prefill the shared part, since none is in the cache before the
    group's forward.
    """
    forwarded = 0
    for layer in shared_prefixes(prompts, min_tokens):
        matches = [cache.match(ids, namespace=target.namespace) for ids in layer]
        try:
            todo = [(ids, m) for ids, m in zip(layer, matches, strict=True) if m.length < len(ids)]
            rows = [PrefillRow(ids, m.length, m.segments, target) for ids, m in todo]
            for group in prefill_groups([len(r.ids) - r.past_len for r in rows],
                                        totals=[len(r.ids) for r in rows]):
                prefill = PrefillGroup(model, [rows[i] for i in group])
                prefill.run()
                for row_index, i in enumerate(group):
                    row = rows[i]
                    cache.insert(row.ids, functools.partial(prefill.kv_range, row_index), target.namespace)
                    forwarded += len(row.ids) - row.past_len
        finally:
            for m in matches:
                m.release()
    return forwarded


class PrefixReuse:
    """What the engine does with its prefix cache: find each prompt's cached prefix (after
    prefilling once what several prompts admitted together share), store prompts and finished
    completions, and count prompt / prefilled / cached tokens for `take_metrics`. One for the
    engine: its modules and adapters keep their KV in namespaces of the one cache (one budget)."""

    def __init__(self, budget_tokens: int, min_shared: int = 16,
                 keep: Callable[[Hashable], bool] | None = None) -> None:
        # `keep`: the namespaces whose KV survives a weight update (frozen models, `frozen_namespace`).
        self.cache = PrefixCache(budget_tokens, keep) if budget_tokens > 0 else None
        self.min_shared = min_shared  # shorter shared prefixes are not worth a forward of their own
        self._lock = threading.Lock()  # counters are read by the trainer's thread
        self._counts = dict.fromkeys(("prompt", "prefilled", "cached"), 0)

    def match(self, model: Any, prompts: list[list[int]], targets: list[Target], version: int) -> list[Any]:
        """Each prompt's cached prefix (a locked `Match`, or None with the cache off) in its
        target's namespace; `model` prefills what several prompts of one target share."""
        cache = self.cache
        if cache is None:
            return [None] * len(prompts)
        cache.sync(version)  # weights changed: drop KV computed by the old ones
        by_target: dict[Target, list[list[int]]] = {}
        for ids, target in zip(prompts, targets, strict=True):
            by_target.setdefault(target, []).append(ids)
        for target, same in by_target.items():
            if len(same) < 2:
                continue
            try:
                self.count(prefilled=warm_shared_prefixes(model, cache, same, self.min_shared, target))
            except RuntimeError as exc:  # e.g. out of memory: the requests prefill in full
                log.warning("prefilling shared prefixes failed (%s); going on without them", exc)
        # Keep the last token to forward: its logits give the first completion token.
        return [cache.match(ids, len(ids) - 1, t.namespace) for ids, t in zip(prompts, targets, strict=True)]

    def clear(self) -> None:
        """Drop every cached prefix but the frozen models' now (the engine must not be prefilling)."""
        if self.cache is not None:
            self.cache.clear()

    def prefilled(self, group: PrefillGroup) -> None:
        """Count a prefill group's rows and cache their prompts."""
        for i, row in enumerate(group.rows):
            self.count(prompt=len(row.ids), prefilled=len(row.ids) - row.past_len, cached=row.past_len)
            if self.cache is not None:
                self.cache.insert(row.ids, functools.partial(group.kv_range, i), row.target.namespace)

    def finished(self, ids: list[int], kv_range: Any, version: int, target: Target = Target()) -> None:
        """Cache a finished sequence's KV (`ids` = prompt + completion but its last token) in
        its target's namespace, unless other weights than the cache's computed any of it."""
        if self.cache is not None and version == self.cache.version:
            self.cache.insert(ids, kv_range, target.namespace)

    def count(self, **amounts: int) -> None:
        with self._lock:
            for key, value in amounts.items():
                self._counts[key] += value

    def take_metrics(self) -> dict[str, float]:
        with self._lock:
            m, self._counts = self._counts, dict.fromkeys(self._counts, 0)
        return {
            "engine/prompt_tokens": float(m["prompt"]),
            "engine/prefilled_tokens": float(m["prefilled"]),
            "engine/cache_hit_rate": m["cached"] / m["prompt"] if m["prompt"] else 0.0,
        }
