"""Generated traffic: rates, lengths, phases, determinism, overflow flags and bad settings."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from vtc_jax import InputError, Settings, simulate_traffic
from vtc_jax.driver.run import lane_keys
from vtc_jax.inputs import sources
from vtc_jax.inputs.traffic import generate, on_off, overload, phased, ramp, resample, silence_and_return, stream_capacity
from vtc_jax.inputs.workload import ARRIVAL, CACHED, OUTPUT, PROMPT, client_rows
from vtc_jax.measures.stats import summarize

SEEDS = 64


def _rows(traffic, seeds=range(SEEDS)):
    """int64[B, K, N, 5] rows that arrive before the horizon (others: arrival = -1)."""
    src = sources.TrafficSource(traffic)
    lay = sources.layout([src], 5)
    wl = sources.generate_lanes(lane_keys(list(seeds)), sources.stack([src] * len(seeds)), kind="traffic",
                                horizon=traffic.horizon, lay=lay, pad=5, num_clients=traffic.num_clients)
    assert not np.asarray(wl.overflow).any()
    rows = client_rows(wl)
    valid = rows[..., ARRIVAL] < traffic.horizon
    rows[~valid] = -1
    return rows, valid


def test_overload_rates_and_uniform_lengths():
    """Mean arrivals within 1% of rate x horizon (about 8 standard errors of the mean over 64
    seeds); per-step counts have Poisson variance within 5%; lengths cover their range with
    the uniform mean within 1%."""
    traffic = overload([1.0, 0.25], 6000, prompt=[(64, 512), (10, 20)], output=(32, 384))
    rows, valid = _rows(traffic)
    for k, rate in enumerate([1.0, 0.25]):
        counts = valid[:, k].sum(axis=1)
        assert counts.mean() == pytest.approx(rate * 6000, rel=0.01)
        per_step = np.stack([np.bincount(rows[b, k, valid[b, k], ARRIVAL], minlength=6000) for b in range(SEEDS)])
        assert per_step.var() == pytest.approx(rate, rel=0.05)
    for k, (lo, hi) in enumerate([(64, 512), (10, 20)]):
        prompts = rows[:, k][valid[:, k]][:, PROMPT]
        assert prompts.min() == lo and prompts.max() == hi
        assert prompts.mean() == pytest.approx((lo + hi) / 2, rel=0.01)
    outputs = rows[valid][:, OUTPUT]
    assert outputs.min() == 32 and outputs.max() == 384
    assert (rows[valid][:, CACHED] == 0).all()


def test_phases_silence_ramp_and_on_off():
    quiet = silence_and_return(6000, quiet_rate=0.02, quiet_until=2000, silent_until=4000, return_rate=1.0,
                               other_rates=[1.0])
    rows, valid = _rows(quiet)
    arr = rows[:, 0][valid[:, 0]][:, ARRIVAL]
    assert not ((arr >= 2000) & (arr < 4000)).any()
    assert (arr < 2000).sum() / SEEDS == pytest.approx(40, rel=0.1)
    assert (arr >= 4000).sum() / SEEDS == pytest.approx(2000, rel=0.02)

    up = ramp(4000, [0.0, 2.0], [2.0, 0.0])  # linear: 1/4 of a ramp's mass lies in its first half
    rows, valid = _rows(up)
    first_half = [((rows[:, k][valid[:, k]][:, ARRIVAL]) < 2000).sum() / SEEDS for k in range(2)]
    assert first_half[0] == pytest.approx(1000, rel=0.03) and first_half[1] == pytest.approx(3000, rel=0.03)

    onoff = on_off(4000, 500, [2.0, 3.0])
    rows, valid = _rows(onoff)
    arr = rows[:, 0][valid[:, 0]][:, ARRIVAL]
    assert not (((arr // 500) % 2) == 1).any()
    assert len(arr) / SEEDS == pytest.approx(2.0 * 2000, rel=0.02)


def test_cached_fraction_and_empirical_pool():
    traffic = overload([0.5, 0.5], 3000, prompt=(10, 100), cached_fraction=[0.5, 0.0])
    pool = np.array([[5, 7], [50, 70], [500, 700]])
    traffic = resample(traffic, pool, clients=[1])
    rows, valid = _rows(traffic)
    c0 = rows[:, 0][valid[:, 0]]
    assert (c0[:, CACHED] == c0[:, PROMPT] // 2).all()
    c1 = rows[:, 1][valid[:, 1]]
    pairs = {tuple(p) for p in c1[:, [PROMPT, OUTPUT]]}
    assert pairs == {(5, 7), (50, 70), (500, 700)}
    share = (c1[:, PROMPT] == 5).mean()
    assert share == pytest.approx(1 / 3, abs=0.02)
    assert (c1[:, CACHED] == 0).all()


def test_same_seed_same_trace_whatever_the_batch():
    traffic = overload([1.0, 0.25], 1000)
    batch, _ = _rows(traffic, seeds=range(64))
    alone, _ = _rows(traffic, seeds=[17])
    halves = np.concatenate([_rows(traffic, seeds=range(0, 32))[0], _rows(traffic, seeds=range(32, 64))[0]])
    np.testing.assert_array_equal(alone[0], batch[17])
    np.testing.assert_array_equal(halves, batch)
    assert not np.array_equal(batch[0], batch[1])


def test_stream_overflow_is_flagged_not_dropped():
    traffic = overload([1.0, 0.25], 1000)
    lay = sources.layout([sources.TrafficSource(traffic)], 5)
    capacity, first, size = lay.extra[0], lay.first, lay.size
    small = (100 + 5, 100 + 5)  # blocks with room for 100 requests each: client 0 sends ~1000
    wl = generate(jax.random.key(0), traffic.params(), horizon=1000, capacity=capacity, first=(0, small[0]),
                  size=small, pad=5)
    assert bool(wl.overflow)
    ok = generate(jax.random.key(0), traffic.params(), horizon=1000, capacity=capacity, first=first, size=size, pad=5)
    assert not bool(ok.overflow)
    assert capacity == stream_capacity(traffic)


def test_simulated_traffic_runs_and_is_reproducible():
    traffic = overload([1.0, 0.25], 1500)
    a = simulate_traffic([traffic] * 4, [Settings("vtc", 8192)] * 4, [3, 4, 5, 6])
    b = simulate_traffic([traffic] * 2, [Settings("vtc", 8192)] * 2, [5, 6])
    assert a.finished.all()
    np.testing.assert_array_equal(a.service[2:], b.service)


@pytest.mark.parametrize("make, message", [
    (lambda: overload([1.0, -0.5], 100), "rate"),
    (lambda: overload([1.0], 100, prompt=(10, 5)), "empty"),
    (lambda: overload([1.0], 100, output=(0, 5)), "output"),
    (lambda: phased([(0, 50, [1.0]), (40, 100, [1.0])]), "overlap"),
    (lambda: phased([(0, 50, [1.0]), (60, 100, [1.0])]), "gaps"),
    (lambda: phased([(0, 50, [1.0]), (50, 50, [1.0])]), "empty"),
    (lambda: overload([float("nan")], 100), "finite"),
    (lambda: overload([1.0], 100, cached_fraction=1.0), "cached"),
])
def test_invalid_traffic_is_refused(make, message):
    with pytest.raises(InputError, match=message):
        make()


@pytest.mark.parametrize("rate", [1e17, 1e306])
def test_huge_rate_refused_before_sizes_wrap(rate):
    """A finite but huge rate: its block size, checked as a float, is refused (it wrapped to a
    negative int64 that passed every row limit)."""
    traffic = overload([0.5, rate], 100)
    with pytest.raises(InputError, match=r"client 1's rates give about .* requests over 100 steps: over the limit"):
        sources.layout([sources.TrafficSource(traffic)], 5)


def test_confidence_interval_covers_the_mean_about_95_percent():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(2000):
        lo, hi = summarize(rng.normal(3.0, 2.0, size=8))["ci95"]
        hits += lo <= 3.0 <= hi
    assert 0.93 <= hits / 2000 <= 0.97


@pytest.mark.parametrize("pool", [[[10, 20]], [[10, 20], [300, 5], [64, 64]]], ids=["one_pair", "three_pairs"])
def test_lanes_draw_the_single_lane_generator_rows(pool):
    """A batch of lanes (its words drawn in a call of their own, a one-pair pool read
    without a gather) generates exactly what `generate` does for each lane's key alone."""
    traffic = resample(overload([0.5, 0.5, 0.2], 800), np.asarray(pool), clients=[0, 2])
    src = sources.TrafficSource(traffic)
    lay = sources.layout([src], 5)
    seeds = [0, 3, 11]
    keys = lane_keys(seeds)
    batch = sources.generate_lanes(keys, sources.stack([src] * len(seeds)), kind="traffic", horizon=800, lay=lay,
                                   pad=5, num_clients=3)
    for i in range(len(seeds)):
        alone = generate(keys[i], traffic.params(), horizon=800, capacity=lay.extra[0], first=lay.first,
                         size=lay.size, pad=5)
        np.testing.assert_array_equal(np.asarray(batch.requests[i]), np.asarray(alone.requests))
        assert int(batch.num_requests[i]) == int(alone.num_requests)
    drawn = {tuple(r) for r in np.asarray(batch.requests)[..., [PROMPT, OUTPUT]].reshape(-1, 2)}
    assert {tuple(p) for p in pool} & drawn  # the pool's pairs are drawn
