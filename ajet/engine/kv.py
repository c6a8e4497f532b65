"""The batch KV cache of the local engine: one padded tensor per layer, written in place.

Row r of every layer's buffer holds one active sequence; its valid keys/values sit in columns
`[starts[r], length)` (left padding, so every row's next token goes to column `length`). The
pad columns are zeros and are masked out with an additive mask, and each row brings its own
position ids, so a padded row computes what it would compute alone.

Buffers are preallocated with spare rows and columns: a decode step writes one column in
place (no `torch.cat` of the whole cache per step, as `DynamicCache` does); a sequence that
leaves is replaced by a row moved from the tail; buffers are reallocated only when they are
full, when a longer prompt joins, or to drop leading pad columns no row uses any more.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from transformers.cache_utils import DynamicLayer

if TYPE_CHECKING:  # pragma: no cover
    import torch

# A row's KV as the prefill produced it: per layer (keys, values), each [1, heads, len, dim].
RowKV = list[tuple["torch.Tensor", "torch.Tensor"]]


def cache_kwarg(model: Any) -> str:
    """The name the model's forward takes its KV cache under: `cache` from transformers 5.24
    on (where `past_key_values` warns, and is to go in 5.40), `past_key_values` before."""
    base: torch.nn.Module = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    model_class = type(base)
    if model_class not in _CACHE_KWARGS:  # read once per class: it is asked at every forward
        params = inspect.signature(model_class.forward).parameters
        _CACHE_KWARGS[model_class] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KWARGS[model_class]


_CACHE_KWARGS: dict[type[torch.nn.Module], str] = {}


_MIN_SPARE_COLS = 64
_TRIM_MIN_COLS = 64  # drop unused leading pad columns once there are at least this many


class _SlotLayer(DynamicLayer):
    """One layer of `BatchKV`, in the form the model's attention calls (`update`)."""

    def __init__(self, owner: BatchKV, layer: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer = layer
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.owner
        col, n, rows = kv.length, key_states.shape[-2], kv.rows
        keys, values = kv.keys[self.layer], kv.values[self.layer]
        keys[:rows, :, col : col + n] = key_states
        values[:rows, :, col : col + n] = value_states
        return keys[:rows, :, : col + n], values[:rows, :, : col + n]

    def get_seq_length(self) -> int:
        return self.owner.length


def _no_columns(t: torch.Tensor) -> tuple[int, ...]:
    return (*t.shape[:2], 0, *t.shape[3:])


class BatchKV:
    """Left-padded KV cache of the active batch; `cache` is what the model's forward takes."""

    def __init__(self, template: RowKV) -> None:
        from transformers import DynamicCache

        self.num_layers = len(template)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.starts: list[int] = []  # first valid column of each row
        self.rows = 0
        self.length = 0
        # Shapes, dtype, device: empty tensors of their own. A view of the template (`k[:, :, :0]`)
        # kept its storage alive: the first prefill group's whole KV buffer, for as long as the
        # batch lived (~225 MB in a `make demo` GRPO rollout).
        self._template = [(k.new_empty(_no_columns(k)), v.new_empty(_no_columns(v))) for k, v in template]
        self.cache = DynamicCache()
        self.cache.layers = [_SlotLayer(self, i) for i in range(self.num_layers)]

    @classmethod
    def from_rows(cls, rows: list[RowKV]) -> BatchKV:
        kv = cls(rows[0])
        kv.add_rows(rows)
        return kv

    @property
    def row_capacity(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def col_capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def add_rows(self, rows: list[RowKV]) -> None:
        """Append rows (each a prefilled sequence), right-aligned to the current length."""
        lengths = [row[0][0].shape[-2] for row in rows]
        needed_rows = self.rows + len(rows)
        if needed_rows > self.row_capacity or max(lengths) > self.length:
            self._realloc(needed_rows, max(lengths))
        for offset, (row, length) in enumerate(zip(rows, lengths, strict=True)):
            r = self.rows + offset
            start = self.length - length
            for layer, (k, v) in enumerate(row):
                self.keys[layer][r, :, :start] = 0
                self.values[layer][r, :, :start] = 0
                self.keys[layer][r, :, start : self.length] = k[0]
                self.values[layer][r, :, start : self.length] = v[0]
            self.starts.append(start)
        self.rows = needed_rows

    def keep_rows(self, keep: list[int], trim: bool = True) -> list[int]:
        """Keep only rows `keep` (ascending); return `order`: new row i is old row order[i].
        `trim`: drop leading pad columns no row uses any more (False when the rows that
        leave rejoin at once, e.g. after a jump: the reallocation would be undone)."""
        kept = len(keep)
        keep_set = set(keep)
        holes = [r for r in range(kept) if r not in keep_set]
        movers = [r for r in keep if r >= kept]
        order = list(range(kept))
        if holes:
            import torch

            dst = torch.tensor(holes, device=self.keys[0].device)
            src = torch.tensor(movers, device=self.keys[0].device)
            cols = self.length
            for layer in range(self.num_layers):
                for buf in (self.keys[layer], self.values[layer]):
                    buf[dst, :, :cols] = buf[src, :, :cols]
            for hole, mover in zip(holes, movers, strict=True):
                order[hole] = mover
                self.starts[hole] = self.starts[mover]
        self.starts = self.starts[:kept]
        self.rows = kept
        unused = min(self.starts) if self.starts else 0
        if trim and unused >= _TRIM_MIN_COLS and unused * 4 >= self.length:
            self._realloc(kept, 0)
        return order

    def prepare_step(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Make room for one more column; return the additive mask ([rows, 1, 1, length + 1]),
        or None when no row is padded (the model then needs no mask for one query token)."""
        import torch

        if self.length + 1 > self.col_capacity:
            self._realloc(self.rows, 0)
        if not any(self.starts):
            return None
        device = self.keys[0].device
        cols = torch.arange(self.length + 1, device=device)
        starts = torch.tensor(self.starts, device=device)
        valid = cols[None, :] >= starts[:, None]
        mask = torch.zeros(valid.shape, dtype=dtype, device=device)
        mask.masked_fill_(~valid, torch.finfo(dtype).min)
        return mask[:, None, None, :]

    def row_range(self, row: int, a: int, b: int) -> torch.Tensor:
        """A copy of row `row`'s KV for its tokens [a, b): [layers, 2, kv_heads, b - a, head_dim]
        (the prefix cache's layout)."""
        import torch

        start = self.starts[row]
        return torch.stack([
            torch.stack((k[row, :, start + a : start + b], v[row, :, start + a : start + b]))
            for k, v in zip(self.keys, self.values, strict=True)
        ])

    def advance(self) -> None:
        """The forward wrote one column for every row."""
        self.length += 1

    def _realloc(self, rows_needed: int, min_length: int) -> None:
        """New buffers: drop leading columns no row uses, fit `min_length`, add spare room."""
        import torch

        unused = min(self.starts) if self.rows else self.length
        live = self.length - unused
        length = max(live, min_length)
        shift = length - live  # existing rows move right by this much after dropping `unused`
        # Spare room: reallocations copy the whole cache, so they should be rare, but spare
        # rows and columns hold memory (bundled model: ~46 KB per row per column).
        row_cap = rows_needed + max(2, rows_needed // 4)
        col_cap = length + max(_MIN_SPARE_COLS, length // 4) + 1
        # One layer at a time: a layer's old buffers are freed as soon as its new ones hold
        # their rows, so the move holds the new cache and one old layer, not both caches whole
        # (32 two-call episodes of the bundled model: ~0.8 GB of KV growing to ~1 GB). A step
        # that fails midway fails its whole batch, which drops this KV anyway.
        # Uninitialised: nothing reads a buffer beyond [:rows, :, :length] (`_SlotLayer.update`,
        # the fused decode step), a decode step writes column `length` before it is read, and
        # `add_rows` zeroes a joining row's pad columns; only the kept rows' new pad columns are
        # zeroed here. The spare rows and columns are then never written until used, and a fresh
        # mapping's untouched pages hold no memory (zeros wrote every page of them).
        fresh = not self.keys
        for layer, (k0, v0) in enumerate(self._template):
            shape_k = (row_cap, k0.shape[1], col_cap, k0.shape[3])
            shape_v = (row_cap, v0.shape[1], col_cap, v0.shape[3])
            nk = torch.empty(shape_k, dtype=k0.dtype, device=k0.device)
            nv = torch.empty(shape_v, dtype=v0.dtype, device=v0.device)
            if self.rows:
                nk[: self.rows, :, :shift] = 0
                nv[: self.rows, :, :shift] = 0
            if self.rows and live:
                nk[: self.rows, :, shift:length] = self.keys[layer][
                    : self.rows, :, unused : self.length
                ]
                nv[: self.rows, :, shift:length] = self.values[layer][
                    : self.rows, :, unused : self.length
                ]
            if fresh:
                self.keys.append(nk)
                self.values.append(nv)
            else:
                self.keys[layer], self.values[layer] = nk, nv
        self.starts = [s - unused + shift for s in self.starts]
        self.length = length
