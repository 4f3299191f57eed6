"""The plain sequential baseline of the benchmarks agrees with the engine exactly."""

from __future__ import annotations

import random

import numpy as np

from tests.sequential import simulate_vtc
from vtc_jax import MeasureConfig, Settings
from vtc_jax.driver.run import _traffic_sources, generate_workloads, run_traces, simulate_traffic, traffic_config
from vtc_jax.inputs.traffic import overload
from vtc_jax.inputs.workload import ARRIVAL, CACHED, ORDER, OUTPUT, PROMPT, Trace, client_rows
from vtc_jax.testing import reference as ref
from vtc_jax.testing.lanes import random_trace


def _sequential(trace: Trace, k: int, m: int, steps: int):
    return simulate_vtc(list(trace.arrival), list(trace.client), list(trace.prompt), list(trace.output),
                        list(trace.cached), num_clients=k, kv_budget=m, w_p=1, w_q=2, steps=steps)


def test_matches_reference_on_random_traces():
    for seed in range(40):
        rng = random.Random(seed)
        reqs, k, m = random_trace(rng)
        steps = rng.randint(1, 80)
        trace = Trace.from_rows([(r.arrival, r.client, r.prompt, r.output, r.cached) for r in reqs])
        service, counter, drift = _sequential(trace, k, m, steps)
        want = ref.simulate(reqs, num_clients=k, kv_budget=m, steps=steps, w_p=1, w_q=2)
        assert service == [int(x) for x in want.service[-1]], seed
        assert counter == [int(x) for x in want.counters[-1]], seed
        assert drift == ref.drift(want), seed


def test_matches_engine_on_random_traces():
    traces, want = [], []
    for seed in range(24):
        rng = random.Random(100 + seed)
        reqs, _, m = random_trace(rng, num_clients=3, kv_budget=48)
        trace = Trace.from_rows([(r.arrival, r.client, r.prompt, r.output, r.cached) for r in reqs] or [(0, 0, 1, 1)])
        traces.append(trace)
        want.append(_sequential(trace, 3, 48, 60))
    got = run_traces(traces, [Settings("vtc", 48)] * len(traces), num_clients=3, steps=60)
    for i, (service, counter, drift) in enumerate(want):
        np.testing.assert_array_equal(got.service[i], service)
        assert list(got.counters_exact[i]) == counter, i  # the counters were computed, never checked
        assert got.max_drift[i] == drift


def test_matches_engine_on_the_benchmark_workload():
    """Generated two-client overload lanes (the benchmark's workload, shorter)."""
    steps, lanes = 800, 3
    traffic = overload([1.0, 0.25], steps)
    settings = [Settings("vtc", 8192)] * lanes
    got = simulate_traffic([traffic] * lanes, settings, range(lanes), measures=MeasureConfig.of([]))
    config = traffic_config([traffic] * lanes, settings, measures=MeasureConfig.of([]))
    rows = client_rows(generate_workloads(_traffic_sources([traffic] * lanes), range(lanes), config))
    for i in range(lanes):
        blocks = [np.column_stack([r, np.full(len(r), k)]) for k, r in enumerate(rows[i])]
        flat = np.concatenate(blocks)
        flat = flat[flat[:, ARRIVAL] < steps]
        flat = flat[np.argsort(flat[:, ORDER], kind="stable")]  # trace order
        service, _, drift = simulate_vtc(*(list(flat[:, f]) for f in (ARRIVAL, -1, PROMPT, OUTPUT, CACHED)),
                                         num_clients=2, kv_budget=8192, w_p=1, w_q=2, steps=steps)
        np.testing.assert_array_equal(got.service[i], service)
        assert got.max_drift[i] == drift
