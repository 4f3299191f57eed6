"""Batching, jit and compile-count properties of the engine."""

from __future__ import annotations

import dataclasses
import random
from fractions import Fraction

import jax
import numpy as np
import pytest

from vtc_jax.testing import reference as ref
from vtc_jax.testing.lanes import random_lanes, random_settings, run_reference, service_matrix
from vtc_jax import InputError, Settings, Trace, registry, replay, replay_lanes, run_traces
from vtc_jax.engines import engine


def _random_lanes(seed: int, count: int, num_clients: int = 3):
    return random_lanes(random.Random(seed), count, num_clients=num_clients, policies=registry.names())


def test_jit_matches_no_jit():
    traces, settings, requests = _random_lanes(7, 4)
    kwargs = dict(num_clients=3, steps=20, record_every=1)  # eager: ~1 s of op-by-op dispatch per step
    jitted = run_traces(traces, settings, **kwargs)
    with jax.disable_jit():
        eager = run_traces(traces, settings, chunk=64, **kwargs)
    np.testing.assert_array_equal(jitted.checkpoints, eager.checkpoints)
    assert (jitted.counters_exact == eager.counters_exact).all()
    for lane, (reqs, s) in enumerate(zip(requests, settings)):
        np.testing.assert_array_equal(eager.checkpoints[lane], service_matrix(run_reference(reqs, 3, s, 20)))


def test_one_lane_equals_same_lane_in_batch_of_64():
    traces, settings, _ = _random_lanes(11, 64)
    batch = run_traces(traces, settings, num_clients=3, steps=40, record_every=1)
    for lane in (0, 17, 63):
        alone = run_traces([traces[lane]], [settings[lane]], num_clients=3, steps=40, record_every=1)
        np.testing.assert_array_equal(alone.checkpoints[0], batch.checkpoints[lane])
        assert list(alone.counters_exact[0]) == list(batch.counters_exact[lane])
        assert alone.max_drift_step[0] == batch.max_drift_step[lane]


def test_sweep_over_traced_settings_compiles_once(monkeypatch):
    """Every registered policy in one batch, and M, w_p, w_q, beta, weights, bands, rpm
    limit and window, estimator and policy options varying lane to lane and call to call:
    the engine's step is traced once."""
    calls = {"n": 0}
    original = engine.step_lane

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "step_lane", counting)
    jax.clear_caches()
    trace = Trace.from_rows([(0, 0, 5, 7), (0, 1, 9, 3, 2), (2, 2, 4, 5), (6, 0, 8, 2), (6, 1, 3, 9)])
    names = registry.names()
    rng = random.Random(3)
    results = []
    for call in range(3):
        lanes = []
        for i, policy in enumerate(names):
            s = random_settings(rng, policy, 3, rng.choice([16, 20, 30, 64]))
            if i == 0:  # every call holds an rpm delay, bands and a kv cap somewhere
                s = dataclasses.replace(s, rpm_limit=1 + call, rpm_mode="delay", bands=(0, call % 2, 1), kv_cap=40)
            if i == 1:  # and an rpm rejection (its lanes' workloads are per lane)
                s = dataclasses.replace(s, rpm_limit=2 + call, rpm_mode="reject")
            lanes.append(s)
        results.append(replay_lanes(trace, lanes, num_clients=3, steps=25, chunk=32, policies=names))
    assert calls["n"] == 1
    # the settings did change the runs (all lanes: which policies are registered, a user's
    # module loaded by an earlier test included, shifts the draws, so one lane may repeat)
    assert len({tuple(map(tuple, r.service)) for r in results}) == 3


def test_refuses_a_charge_past_the_exact_limit():
    trace = Trace.from_rows([(0, 0, 30000, 10), (0, 1, 3000, 10)])
    with pytest.raises(InputError, match="prefill charge.*exact int32 limit"):
        replay(trace, Settings("vtc", 32768, weights=("0.001", "1000")))


def test_totals_past_2_31_stay_exact():
    """w_q = 3 x 10^6 pushes service and counters past 2^31 within a few thousand steps; the
    wide accumulators keep every step exact (against the Fraction reference)."""
    rows = [(0, 0, 50, 900), (5, 1, 40, 800, 10), (300, 0, 60, 700), (310, 1, 30, 1200)]
    trace = Trace.from_rows(rows)
    s = Settings("vtc", 128, w_q=3 * 10**6, beta="0.5", weights=(1, 3))
    result = replay(trace, s, record_every=1)
    expect = run_reference([ref.Request(*r) for r in rows], 2, s, None)
    assert max(expect.service[-1]) > 2**31
    assert list(result.service_exact[0]) == expect.service[-1]
    assert list(result.counters_exact[0]) == expect.counters[-1]
    assert result.max_drift_exact[0] == max(max(w) - min(w) for w in expect.service)
    np.testing.assert_array_equal(result.checkpoints[0], service_matrix(expect))


def test_fractional_settings_are_exact():
    """beta = 0.1 and weight 3: service is an exact rational, reported within 1e-9."""
    trace = Trace.from_rows([(0, 0, 7, 5), (1, 1, 3, 4), (2, 0, 2, 3)])
    result = replay(trace, Settings("vtc", 16, beta="0.1", w_p="0.3", weights=(1, 3)))
    expect = run_reference([ref.Request(0, 0, 7, 5), ref.Request(1, 1, 3, 4), ref.Request(2, 0, 2, 3)], 2,
                           Settings("vtc", 16, beta="0.1", w_p="0.3", weights=(1, 3)), None)
    assert list(result.service_exact[0]) == expect.service[-1]
    assert list(result.counters_exact[0]) == expect.counters[-1]
    assert expect.service[-1][0].denominator == 10
    np.testing.assert_allclose(result.service[0], [float(x) for x in expect.service[-1]], rtol=1e-12)
    assert result.counters_exact[0][1] == expect.counters[-1][1] and expect.counters[-1][1] != Fraction(
        int(expect.counters[-1][1]))


def test_wide_and_narrow_number_formats_agree():
    """Every registered policy, random lanes: the planner's NARROW int32 run and a forced
    WIDE run give the same integers (and the reference's, checked elsewhere)."""
    traces, settings, requests = _random_lanes(23, 3 * len(registry.names()))
    narrow = run_traces(traces, settings, num_clients=3, steps=40, record_every=1)
    wide = run_traces(traces, settings, num_clients=3, steps=40, record_every=1, wide=True)
    assert narrow.number_format == "narrow" and wide.number_format == "wide"
    np.testing.assert_array_equal(narrow.checkpoints, wide.checkpoints)
    assert (narrow.counters_exact == wide.counters_exact).all()
    np.testing.assert_array_equal(narrow.pair_drift, wide.pair_drift)
    np.testing.assert_array_equal(narrow.policy_counters, wide.policy_counters)
    for lane in (0, 5, len(settings) - 1):
        np.testing.assert_array_equal(wide.checkpoints[lane], service_matrix(
            run_reference(requests[lane], 3, settings[lane], 40)))


def test_context_sums_alone_decide_wide_numbers_at_large_budgets():
    """M = 32768 over 6000 steps: only the summed context (the ledger, the occupancy
    measure) can pass 2^30, so the planner keeps NARROW numbers unless one of those is kept
    (that both formats give the same integers is the test above)."""
    from vtc_jax.driver.run import check_exact_limits, traffic_config
    from vtc_jax.inputs.traffic import overload
    from vtc_jax.measures.online import MeasureConfig

    s = Settings("vtc", 32768)
    limits = dict(min_prompt=64, max_prompt=512, max_output=384, horizon=6000, max_requests=9000)
    assert not check_exact_limits(s, 2, **limits, context_totals=False)
    assert check_exact_limits(s, 2, **limits, context_totals=True)
    traffic = overload([1.0, 0.25], 6000)
    for kept, wide in ((["pair_drift", "latency"], False), (["ledger"], True), (["occupancy"], True)):
        assert traffic_config([traffic], [s], measures=MeasureConfig.of(kept)).wide == wide, kept
