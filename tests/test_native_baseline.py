"""The native baseline (benchmarks/native/vtc_seed.c) is the same server as tests/sequential.py,
which tests/test_sequential.py holds equal to the engine: so the C binary's timings in
benchmarks/bench_native.py are of the same work."""

from __future__ import annotations

import random

import pytest

from benchmarks import bench_native
from tests.sequential import simulate_vtc
from vtc_jax.testing.lanes import random_trace


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    compiler = bench_native.find_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc, gcc, clang) on PATH")
    return bench_native.build(compiler, str(tmp_path_factory.mktemp("native")))


def _sequential(rows, k, m, steps):
    cols = [[int(r[f]) for r in rows] for f in range(5)]
    return simulate_vtc(*cols, num_clients=k, kv_budget=m, w_p=1, w_q=2, steps=steps)


def _random_lanes(count: int):
    """Small random lanes (K 1..5, M 4..64, shuffled rows, cached prefixes), plus the edge cases:
    no requests, no steps, a horizon that cuts requests off while they run."""
    lanes = []
    for seed in range(count):
        rng = random.Random(7000 + seed)
        reqs, k, m = random_trace(rng, max_arrival=rng.choice((5, 20, 40)), max_output=rng.choice((1, 4, 12)))
        rows = [(r.arrival, r.client, r.prompt, r.output, r.cached) for r in reqs]
        lanes.append((rows, k, m, rng.randint(1, 80)))
    lanes[0] = ([], 3, 16, 10)
    lanes[1] = (lanes[1][0], lanes[1][1], lanes[1][2], 0)
    lanes[2] = (lanes[2][0], lanes[2][1], lanes[2][2], 3)
    return lanes


def test_native_equals_sequential_on_random_lanes(binary, tmp_path):
    lanes = _random_lanes(32)
    path = str(tmp_path / "lanes.bin")
    assert bench_native.write_lanes(path, lanes) == 32
    got = bench_native.run_native(binary, path, repeats=2)
    assert len(got) == 32
    busy = 0
    for i, ((rows, k, m, steps), lane) in enumerate(zip(lanes, got)):
        service, counter, drift = _sequential(rows, k, m, steps)
        assert (lane.steps, list(lane.service), list(lane.counter), lane.max_drift) == (steps, service, counter, drift), i
        assert lane.ns >= 0
        busy += drift > 0
    assert busy >= 16  # most lanes are not trivial


def test_native_equals_sequential_on_the_benchmark_lanes(binary, tmp_path):
    """Two lanes of bench_native's own input (the engine's generator, seeds 0 and 1), 6000 steps."""
    lanes = list(bench_native.seed_lanes(2))
    path = str(tmp_path / "seed.bin")
    bench_native.write_lanes(path, lanes)
    got = bench_native.run_native(binary, path)
    for (rows, k, m, steps), lane in zip(lanes, got):
        service, counter, drift = _sequential(rows.tolist(), k, m, steps)
        assert (list(lane.service), list(lane.counter), lane.max_drift) == (service, counter, drift)
        assert drift > 0 and len(rows) > 6000


def test_mismatch_names_the_lane():
    lane = bench_native.NativeLane(steps=5, max_drift=4, ns=1, service=(3, 7), counter=(3, 7))
    engine = ([(3, 7), (3, 7)], [(3, 7), (3, 7)], [4, 4])
    assert bench_native.mismatch([lane, lane], engine) is None
    for changed in (([(3, 7), (3, 8)], engine[1], engine[2]), (engine[0], [(3, 7), (4, 7)], engine[2]),
                    (engine[0], engine[1], [4, 5])):
        assert bench_native.mismatch([lane, lane], changed).startswith("lane 1:")


def test_write_lanes_refuses_fields_beyond_int32(tmp_path):
    with pytest.raises(ValueError, match="int32"):
        bench_native.write_lanes(str(tmp_path / "x.bin"), [([(0, 0, 1 << 31, 1, 0)], 1, 8, 4)])
