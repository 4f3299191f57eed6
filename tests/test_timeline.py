"""The arrival timeline's sort (inputs/workload.py): the packed one-array sort and the
two-array stable sort give numpy's stable argsort, and a batch takes the packed sort only
when every key of every lane packs."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from vtc_jax.core.rows import NUM_FIELDS, ORDER
from vtc_jax.inputs.workload import (INT32_MAX, Workload, add_timeline, add_timelines, pack_limit, packable,
                                     timeline_order)


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
