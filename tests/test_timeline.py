"""The arrival timeline's sort (inputs/workload.py): the packed one-array sort and the
two-array stable sort give numpy's stable argsort, and a batch takes the packed sort only
when every key of every lane packs."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from vtc_jax.core.rows import ARRIVAL, NUM_FIELDS, ORDER
from vtc_jax.inputs.workload import (INT32_MAX, Workload, add_timeline, block_of_rows, add_timelines, in_stable_order, pack_limit,
                                     packable, timeline_order)


def _keys(rng: np.random.Generator, r: int, high: int) -> np.ndarray:
    """int32[R] keys in [0, high) with ties, and padding keys (INT32_MAX) in places."""
    keys = rng.integers(0, high, r).astype(np.int32)
    keys[rng.random(r) < 0.2] = INT32_MAX
    return keys


@pytest.mark.parametrize("seed", range(6))
def test_both_sorts_are_numpys_stable_argsort(seed):
    rng = np.random.default_rng(seed)
    r = int(rng.integers(1, 400))
    keys = _keys(rng, r, int(rng.choice([2, 50, pack_limit(r)])))
    want = np.argsort(keys, kind="stable")
    assert bool(packable(keys))
    np.testing.assert_array_equal(np.asarray(timeline_order(keys, packed=True)), want)
    np.testing.assert_array_equal(np.asarray(timeline_order(keys, packed=False)), want)


def test_packable_bounds():
    r = 1000
    limit = pack_limit(r)
    # padding packs as key `limit`: its largest value fits, and one key more would not
    assert limit * r + r - 1 <= INT32_MAX < (limit + 1) * r + r - 1
    assert bool(packable(np.asarray([0, limit - 1, INT32_MAX] + [0] * (r - 3), np.int32)))
    assert not bool(packable(np.asarray([limit] + [0] * (r - 1), np.int32)))
    assert not bool(packable(np.asarray([-1] + [0] * (r - 1), np.int32)))


def _workload(keys: np.ndarray) -> Workload:
    """Lanes of rows whose ORDER column is `keys` int32[B, R], two blocks."""
    b, r = keys.shape
    requests = np.zeros((b, r, NUM_FIELDS), np.int32)
    requests[..., ORDER] = keys
    first = np.broadcast_to(np.asarray([0, r // 2], np.int32), (b, 2))
    return Workload(requests=requests, first=first, size=np.broadcast_to(np.asarray([r // 2, r - r // 2], np.int32),
                                                                         (b, 2)),
                    num_requests=np.zeros(b, np.int32), overflow=np.zeros(b, bool))


@pytest.mark.parametrize("big", [False, True])
def test_a_batch_sorts_packed_only_when_every_lane_packs(big):
    """One lane whose key passes pack_limit sends the whole batch to the stable sort; the
    timelines are the same either way."""
    rng = np.random.default_rng(7)
    keys = np.stack([_keys(rng, 300, 40) for _ in range(4)])
    if big:
        keys[2, 5] = pack_limit(300) + 3
    batch = _workload(keys)
    assert bool(packable(keys)) is not big
    got = jax.jit(lambda w: add_timelines(w, batched=True))(batch).timeline
    want = jax.vmap(add_timeline)(dataclasses.replace(batch)).timeline
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for lane in range(4):
        np.testing.assert_array_equal(np.asarray(got)[lane, :300, 0], np.argsort(keys[lane], kind="stable"))
    one = jax.jit(lambda w: add_timelines(w, batched=False))(jax.tree_util.tree_map(lambda x: x[2], batch))
    np.testing.assert_array_equal(np.asarray(one.timeline), np.asarray(got)[2])


def _blocks(rng: np.random.Generator, b: int, k: int, n: int, steps: int, clash: bool) -> Workload:
    """b lanes of k client-major blocks of n rows each, arrivals sorted per block in [0,
    steps) with ties, ORDER = arrival * big + client as generated traffic numbers them (big
    so that no key packs); the last rows of a block are padding. `clash`: lane 1 numbers
    its clients in reverse, so (arrival, row) order is not ORDER's."""
    big = pack_limit(k * n) + 1
    requests = np.zeros((b, k * n, NUM_FIELDS), np.int32)
    for lane in range(b):
        for c in range(k):
            arrival = np.sort(rng.integers(0, steps, n)).astype(np.int64)
            number = (k - 1 - c) if (clash and lane == 1) else c
            order = np.minimum(arrival * big + number, INT32_MAX - 1)
            pad = rng.integers(0, 3)
            if pad:
                arrival[-pad:], order[-pad:] = INT32_MAX, INT32_MAX
            requests[lane, c * n:(c + 1) * n, ARRIVAL] = arrival
            requests[lane, c * n:(c + 1) * n, ORDER] = order
    first = np.broadcast_to(np.arange(k, dtype=np.int32) * n, (b, k))
    return Workload(requests=requests, first=first, size=np.full((b, k), n, np.int32),
                    num_requests=np.zeros(b, np.int32), overflow=np.zeros(b, bool))


@pytest.mark.parametrize("clash", [False, True])
@pytest.mark.parametrize("k", [3, 20])
def test_unpackable_keys_sort_by_arrival_only_when_that_is_their_order(clash, k):
    """Keys that do not pack (generated traffic at many clients) but arrivals that do: the
    sort by arrival is kept only where it is ORDER's stable order (`in_stable_order`), and
    the timeline is numpy's stable argsort by ORDER either way, blocks included."""
    rng = np.random.default_rng(k)
    batch = _blocks(rng, 3, k, 40, 25, clash)
    keys, arrivals = batch.requests[..., ORDER], batch.requests[..., ARRIVAL]
    assert not bool(packable(keys)) and bool(packable(arrivals))
    by_arrival = jax.vmap(lambda a: timeline_order(a, packed=True))(arrivals)
    ok = np.asarray(jax.vmap(in_stable_order)(by_arrival, keys))
    assert ok.tolist() == [True, not clash, True]
    got = np.asarray(jax.jit(lambda w: add_timelines(w, batched=True))(batch).timeline)
    for lane in range(3):
        want = np.argsort(keys[lane], kind="stable")
        np.testing.assert_array_equal(got[lane, :k * 40, 0], want)
        np.testing.assert_array_equal(got[lane, :k * 40, 1], want // 40)
        assert (got[lane, k * 40:] == got[lane, k * 40 - 1]).all()


def test_in_stable_order_is_the_stable_argsort():
    rng = np.random.default_rng(3)
    for _ in range(50):
        r = int(rng.integers(2, 30))
        keys = _keys(rng, r, 4)
        want = np.argsort(keys, kind="stable")
        assert bool(in_stable_order(want.astype(np.int32), keys))
        swap = want.copy()
        i = int(rng.integers(0, r - 1))
        swap[i], swap[i + 1] = swap[i + 1], swap[i]
        assert not bool(in_stable_order(swap.astype(np.int32), keys))


def test_block_of_rows_is_a_binary_search_of_the_block_starts():
    """Empty blocks (repeated starts) and an empty last block (starting at R) included."""
    rng = np.random.default_rng(11)
    for _ in range(50):
        r, k = int(rng.integers(1, 60)), int(rng.integers(1, 30))
        first = np.sort(rng.integers(0, r + 1, k)).astype(np.int32)
        first[0] = 0
        want = np.searchsorted(first, np.arange(r), side="right") - 1
        np.testing.assert_array_equal(np.asarray(block_of_rows(first, r)), want)
