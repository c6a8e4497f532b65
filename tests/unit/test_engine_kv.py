"""BatchKV: left-padded rows, in-place steps, row removal and trimming keep every row's data."""

from __future__ import annotations

import pytest
import torch

from ajet.engine.kv import BatchKV

LAYERS, HEADS, DIM = 2, 2, 4
_empty = torch.empty


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch):
    """New buffers come uninitialised (torch.empty): here full of NaN, so that a pad column the
    cache forgot to zero, or a spare one it reads, shows (fresh memory is zeros by chance)."""

    def nan_empty(*args, **kwargs):
        return _empty(*args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", nan_empty)


def row(length: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(1, HEADS, length, DIM, generator=gen),
            torch.randn(1, HEADS, length, DIM, generator=gen),
        )
        for _ in range(LAYERS)
    ]


def row_data(kv: BatchKV, r: int):
    """Row r's valid keys/values, per layer."""
    start = kv.starts[r]
    return [
        (kv.keys[i][r, :, start : kv.length], kv.values[i][r, :, start : kv.length])
        for i in range(LAYERS)
    ]


def assert_row(kv: BatchKV, r: int, expected):
    for (k, v), (ek, ev) in zip(row_data(kv, r), expected, strict=True):
        assert torch.equal(k, ek[0]) and torch.equal(v, ev[0])
    for i in range(LAYERS):  # the pad columns are zeros (finite, masked out)
        assert not kv.keys[i][r, :, : kv.starts[r]].any()
        assert not kv.values[i][r, :, : kv.starts[r]].any()


def step(kv: BatchKV, new_rows):
    """What one decode step does: prepare, every layer's attention writes a column, advance."""
    kv.prepare_step(torch.float32)
    for i, layer in enumerate(kv.cache.layers):
        keys, values = layer.update(new_rows[i][0], new_rows[i][1], i)
        assert keys.shape[2] == kv.length + 1
    kv.advance()


def test_rows_are_right_aligned_and_masked():
    rows = [row(3, 0), row(7, 1), row(5, 2)]
    kv = BatchKV.from_rows(rows)
    assert (kv.rows, kv.length, kv.starts) == (3, 7, [4, 0, 2])
    for r, data in enumerate(rows):
        assert_row(kv, r, data)
    mask = kv.prepare_step(torch.float32)
    assert mask.shape == (3, 1, 1, 8)
    masked = mask[:, 0, 0] < 0
    assert masked.sum(1).tolist() == [4, 0, 2]
    assert not masked[:, -1].any()  # the new token's column is visible to every row


def test_no_mask_when_no_row_is_padded():
    kv = BatchKV.from_rows([row(4, 0), row(4, 1)])
    assert kv.prepare_step(torch.float32) is None


def test_steps_grow_past_capacity_and_keep_data():
    first = row(3, 0)
    kv = BatchKV.from_rows([first])
    written = []
    for s in range(kv.col_capacity + 5):  # forces at least one reallocation
        new = row(1, 100 + s)
        written.append(new)
        step(kv, new)
    assert kv.length == 3 + len(written)
    for i in range(LAYERS):
        expected = torch.cat([first[i][0]] + [w[i][0] for w in written], dim=2)
        assert torch.equal(kv.keys[i][0, :, : kv.length], expected[0])


def test_keep_rows_moves_tail_rows_into_holes():
    rows = [row(3, 0), row(6, 1), row(5, 2), row(2, 3)]
    kv = BatchKV.from_rows(rows)
    order = kv.keep_rows([1, 3])
    assert order == [3, 1]
    assert kv.rows == 2
    assert_row(kv, 0, rows[3])
    assert_row(kv, 1, rows[1])


def test_longer_prompt_joining_shifts_existing_rows():
    short = row(3, 0)
    kv = BatchKV.from_rows([short])
    long = row(9, 1)
    kv.add_rows([long])
    assert (kv.length, kv.starts) == (9, [6, 0])
    assert_row(kv, 0, short)
    assert_row(kv, 1, long)


def test_leading_pad_columns_are_dropped_when_the_long_row_leaves():
    long, short = row(200, 0), row(3, 1)
    kv = BatchKV.from_rows([long, short])
    assert kv.length == 200
    kv.keep_rows([1])
    assert (kv.length, kv.starts) == (3, [0])
    assert_row(kv, 0, short)


def test_growing_frees_each_old_layer_before_allocating_the_next(monkeypatch):
    """A reallocation holds the new cache and at most one old layer, not both caches whole."""
    import weakref

    rows = [row(3, 0), row(5, 1)]
    kv = BatchKV.from_rows(rows)
    old = [weakref.ref(t) for t in kv.keys + kv.values]
    alive_at_each_allocation = []
    empty = torch.empty

    def counting_empty(*args, **kwargs):
        alive_at_each_allocation.append(sum(ref() is not None for ref in old))
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", counting_empty)
    kv.add_rows([row(kv.col_capacity + 4, 2)])  # longer than the buffers: a reallocation
    monkeypatch.undo()
    # Two allocations a layer (keys, values); before layer i's, only layers i.. are left.
    assert alive_at_each_allocation == [2 * (LAYERS - i) for i in range(LAYERS) for _ in (0, 1)]
    assert all(ref() is None for ref in old)
    assert kv.rows == 3
    for r, data in enumerate(rows):  # moved whole, right-aligned to the new length
        assert_row(kv, r, data)


def test_what_attention_reads_is_written_though_new_buffers_start_uninitialised():
    """Joins (a longer prompt moves the rows right), steps past the capacity and a trim each
    reallocate; the region attention reads, [:rows, :, :length + 1] after a step's write, holds
    no NaN of the poisoned buffers, and every row keeps its data."""

    def readable_is_finite(kv: BatchKV) -> bool:
        return all(torch.isfinite(buf[: kv.rows, :, : kv.length]).all() for buf in kv.keys + kv.values)

    kv = BatchKV.from_rows([row(3, 0)])
    kv.add_rows([row(kv.col_capacity + 10, 1)])  # longer than the buffers: the first row moves right
    assert kv.starts[0] > 0 and readable_is_finite(kv)
    capacity = kv.col_capacity
    while kv.col_capacity == capacity:  # decode past the columns' capacity: a reallocation
        step(kv, row(1, 2))
        assert readable_is_finite(kv)
    kv.keep_rows([1])  # the long row stays; then a short one joins, padded on the left
    kv.add_rows([row(2, 3)])
    step(kv, row(1, 4))
    assert readable_is_finite(kv)
    assert not kv.keys[0][1, :, : kv.starts[1]].any()


def test_the_batch_keeps_no_reference_to_the_prefill_buffer_its_rows_came_from():
    """Rows arrive as views of one prefill group's buffer (all rows, all layers); once they are
    copied in, the buffer must be freeable: the batch lives as long as its requests decode."""
    import gc
    import weakref

    buf = torch.randn(LAYERS, 2, 3, HEADS, 6, DIM)
    rows = [[(buf[layer, 0, i : i + 1], buf[layer, 1, i : i + 1]) for layer in range(LAYERS)] for i in range(3)]
    kv = BatchKV.from_rows(rows)
    freed = weakref.ref(buf)
    expected = [(k.clone(), v.clone()) for k, v in rows[1]]
    del buf, rows
    gc.collect()
    assert freed() is None
    assert all(torch.equal(a, b) for (k, v), (ek, ev) in zip(row_data(kv, 1), expected, strict=True)
               for a, b in ((k, ek[0]), (v, ev[0])))
