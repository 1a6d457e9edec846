"""The batch's cache buffers: rows move with their history, and memory comes back."""

from __future__ import annotations

import numpy as np

from service.cache import BatchCache


def _cache() -> BatchCache:
    cache = BatchCache(layers=2, heads=2, head_dim=4, vocab=10, max_columns=256)
    cache.reserve(3, columns=5, src_width=6)
    cache.set_rows(3)
    for layer in range(2):
        for row in range(3):
            cache.self_keys[layer][row] = 10 * layer + row
            cache.self_values[layer][row] = -(10 * layer + row)
            cache.cross_keys[layer][row] = 100 + row
    cache.src_mask[:3, :4] = True
    cache.cross_last[:3] = np.arange(3)[:, None, None] + 1000
    return cache


def test_gather_moves_each_row_with_its_history() -> None:
    cache = _cache()
    cache.gather(np.array([2, 0]), columns=5, cross=True)
    assert cache.rows == 2
    for layer in range(2):
        assert (cache.self_keys[layer][0, :, :5] == 10 * layer + 2).all()
        assert (cache.self_values[layer][1, :, :5] == -(10 * layer)).all()
        assert (cache.cross_keys[layer][0] == 102).all()
    assert cache.cross_last[:2, 0, 0].tolist() == [1002, 1000]


def test_growing_keeps_the_rows_and_changes_the_version() -> None:
    cache = _cache()
    version = cache.version
    cache.reserve(40, columns=70, src_width=9)
    assert cache.version != version
    assert cache.capacity >= 40 and cache.columns >= 70 and cache.src_width == 9
    assert (cache.self_keys[1][2, :, :5] == 12).all()
    assert cache.src_mask[:3, :4].all() and not cache.src_mask[:3, 4:].any()
    assert cache.cross_last[:3, 0, 0].tolist() == [1000, 1001, 1002]


def test_a_batch_that_ran_long_gives_its_memory_back() -> None:
    cache = _cache()
    cache.reserve(200, columns=250, src_width=200)
    before = sum(b.nbytes for b in cache.self_keys + cache.cross_keys)
    cache.shrink(columns=5, src_width=6)
    after = sum(b.nbytes for b in cache.self_keys + cache.cross_keys)
    assert after * 20 < before
    assert (cache.self_keys[0][1, :, :5] == 1).all()
    assert (cache.cross_keys[1][2, :, :6] == 102).all()


def test_gather_handles_rows_that_swap_or_stay() -> None:
    cache = _cache()
    cache.gather(np.array([1, 0, 2]), columns=5, cross=True)
    assert [int(cache.self_keys[0][row, 0, 0, 0]) for row in range(3)] == [1, 0, 2]
    cache.gather(np.array([0, 0, 1]), columns=5, cross=False)  # beams: a parent twice
    assert [int(cache.self_keys[1][row, 0, 0, 0]) for row in range(3)] == [11, 11, 10]
