"""Per-lane workload statistics (driver.results.lane_workload_stats), compiled as one
program: the integers against a literal count per lane, every output bit for bit against
the same function run op by op (compiling changes no float sum)."""

from __future__ import annotations

import functools

import jax
import numpy as np

from vtc_jax.driver import results
from vtc_jax.inputs.workload import ARRIVAL, CACHED, OUTPUT, PROMPT


def _lanes(rng, lanes: int, k: int, rows: int):
    req = np.zeros((lanes, rows, 5), np.int32)
    req[..., ARRIVAL] = rng.integers(0, 1000, (lanes, rows))
    req[..., PROMPT] = rng.integers(1, 5000, (lanes, rows))
    req[..., OUTPUT] = rng.integers(1, 5000, (lanes, rows))
    req[..., CACHED] = rng.integers(0, 50, (lanes, rows))
    first = np.sort(rng.integers(0, rows, (lanes, k)), axis=1).astype(np.int32)
    first[:, 0] = 0
    if k > 1 and rng.random() < 0.3:
        first[:, -1] = rows  # an empty last block
    return req, first


def test_compiled_stats_equal_op_by_op_and_literal_counts():
    rng = np.random.default_rng(7)
    for _ in range(12):
        lanes, k, rows = 6, int(rng.integers(1, 6)), int(rng.integers(5, 300))
        req, first = _lanes(rng, lanes, k, rows)
        steps = rng.integers(0, 1100, lanes).astype(np.int32)
        prefill, decode, context = (rng.choice([0.0, 1.0, 2.5, 1 / 3], lanes).astype(np.float32) for _ in range(3))
        cached = rng.random(lanes) < 0.5
        buckets, every = int(rng.integers(0, 5)), int(rng.integers(0, 300))
        fn = functools.partial(results.workload_stats, num_clients=k, buckets=buckets, every=every)
        op_by_op = jax.vmap(fn)(req, first, steps, prefill, decode, context, cached)
        compiled = results._lanes_stats(req, first, steps, prefill, decode, context, cached, shared=False,
                                        num_clients=k, buckets=buckets, every=every)
        for a, b in zip(op_by_op, compiled):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        count, _, max_prompt, _, last = (np.asarray(x) for x in compiled)
        for lane in range(lanes):
            block = np.searchsorted(first[lane], np.arange(rows), side="right") - 1
            arrives = req[lane, :, ARRIVAL] < steps[lane]
            assert count[lane].tolist() == [int((arrives & (block == c)).sum()) for c in range(k)]
            assert max_prompt[lane] == (req[lane, arrives, PROMPT].max() if arrives.any() else 0)
            assert last[lane] == (req[lane, arrives, ARRIVAL].max() if arrives.any() else -1)


def test_shared_workload_stats_read_one_workload_for_every_lane():
    rng = np.random.default_rng(3)
    req, first = _lanes(rng, 1, 3, 50)
    steps = np.asarray([0, 500, 1000], np.int32)
    ones = np.ones(3, np.float32)
    shared = results._lanes_stats(req[0], first[0], steps, ones, ones, 0 * ones, np.ones(3, bool), shared=True,
                                  num_clients=3, buckets=0, every=0)
    for lane in range(3):
        alone = results._lanes_stats(req, first, steps[lane:lane + 1], ones[:1], ones[:1], 0 * ones[:1],
                                     np.ones(1, bool), shared=False, num_clients=3, buckets=0, every=0)
        for a, b in zip(shared, alone):
            np.testing.assert_array_equal(np.asarray(a)[lane], np.asarray(b)[0])
