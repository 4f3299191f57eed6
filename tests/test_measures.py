"""Every measure against a plain numpy computation over the reference's trajectories."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vtc_jax import POLICIES, run_traces
from vtc_jax.driver.results import latency_bin_edges
from vtc_jax.measures.online import latency_bin
from vtc_jax.testing import reference as ref
from vtc_jax.testing.lanes import random_lanes, run_reference, service_matrix

EVERY = 3
STEPS = 36


def _full_cost(r: ref.Request, s) -> float:
    o, p = r.output, r.prompt
    return float(s.w_p * (p - r.cached) + s.w_q * o + s.beta * (o * p + o * (o - 1) // 2))


def _pair_drift(service: np.ndarray, backlogged: np.ndarray) -> np.ndarray:
    """Brute force: max |D(t2) - D(t1 - 1)| over t1 <= t2 with both backlogged at every
    step of [t1, t2]; D = W_f - W_g, D(-1) = 0."""
    steps, k = service.shape
    padded = np.vstack([np.zeros((1, k)), service])  # row t + 1: after step t
    out = np.zeros((k, k))
    for f in range(k):
        for g in range(k):
            d = padded[:, f] - padded[:, g]
            joint = backlogged[:, f] & backlogged[:, g]
            for t1 in range(steps):
                for t2 in range(t1, steps):
                    if not joint[t2]:
                        break
                    out[f, g] = max(out[f, g], abs(d[t2 + 1] - d[t1]))
    return out


def _lanes(seed: int, k: int, count: int):
    """Random lanes cycling through the policies, each with a random share window."""
    def adjust(rng, s, reqs):
        start = rng.randint(0, 20)
        return type(s)(**{**s.__dict__, "share_window": (start, start + rng.randint(1, 15))})

    return random_lanes(random.Random(seed), count, num_clients=k, policies=POLICIES, num_requests=(5, 30),
                        adjust=adjust, max_arrival=30)


@pytest.mark.parametrize("k", [2, 3])
def test_measures_match_numpy_over_reference(k):
    traces, settings, requests = _lanes(40 + k, k, 32)
    res = run_traces(traces, settings, num_clients=k, steps=STEPS, record_every=EVERY)
    lo_edges, hi_edges = latency_bin_edges()
    for lane, (reqs, s) in enumerate(zip(requests, settings)):
        exp = run_reference(reqs, k, s, STEPS)
        w = service_matrix(exp)
        bl = np.asarray(exp.backlogged_after_arrivals, dtype=bool)
        msg = f"lane {lane} {s}"
        # drift, pair drift and drift / 2U
        drift = float(max(max(row) - min(row) for row in exp.service))
        assert res.max_drift[lane] == drift, msg
        np.testing.assert_allclose(res.pair_drift[lane], _pair_drift(w, bl), rtol=1e-12, atol=1e-9, err_msg=msg)
        arrived = [r for r in reqs if r.arrival < STEPS]
        l_input = max(r.prompt for r in arrived)
        u = max(float(s.w_p) * l_input, float(s.w_q) * s.kv_budget)
        assert res.bound_u[lane] == pytest.approx(u) and res.bound_2u[lane] == pytest.approx(2 * u)
        if len(set(s.weights or ())) <= 1:
            assert res.max_drift_over_2u[lane] == pytest.approx(drift / (2 * u)), msg
        else:  # unequal weights: VTC bounds W_k / w_k, not these raw drifts; no ratio is reported
            assert np.isnan(res.max_drift_over_2u[lane]) and np.isnan(res.backlogged_drift_over_2u[lane]), msg
        # throughput: weighted and raw; occupancy at decode
        assert res.throughput[lane] == pytest.approx(w[-1].sum() / STEPS)
        decoded = [min(r.output, STEPS - a) for r, a in zip(reqs, exp.admit_step) if a is not None]
        prompts = [r.prompt for r, a in zip(reqs, exp.admit_step) if a is not None]
        assert res.raw_throughput[lane] == pytest.approx((sum(decoded) + sum(prompts)) / STEPS), msg
        occupancy = np.zeros(STEPS)
        for r, a, f in zip(reqs, exp.admit_step, exp.finish_step):
            if a is not None:
                last = f if f is not None else STEPS - 1
                for t in range(a, last + 1):
                    occupancy[t] += r.prompt + (t - a)
        assert res.mean_occupancy[lane] == pytest.approx(occupancy.mean() / s.kv_budget), msg
        # share window
        start, end = s.share_window
        before = w[start - 1] if start > 0 else np.zeros(k)
        np.testing.assert_allclose(res.share_service[lane], w[end - 1] - before, rtol=1e-12, atol=1e-9, err_msg=msg)
        # waiting / running at the horizon
        n_arrived = np.bincount([r.client for r in arrived], minlength=k)  # rejected ones never wait
        assert list(res.waiting[lane]) == list(n_arrived - np.asarray(exp.admitted) - np.asarray(exp.rejected)), msg
        assert list(res.rejected[lane]) == list(exp.rejected), msg
        assert list(res.running[lane]) == list(np.asarray(exp.admitted) - np.asarray(exp.completed)), msg
        # latency: means exact, percentiles within their histogram bin
        for which, pairs in (("wait", [(r.client, a - r.arrival) for r, a in zip(reqs, exp.admit_step)
                                       if a is not None]),
                             ("done", [(r.client, f - r.arrival) for r, f in zip(reqs, exp.finish_step)
                                       if f is not None])):
            mean = getattr(res, f"{which}_mean")[lane]
            for c in range(k):
                vals = np.asarray([v for cc, v in pairs if cc == c])
                if len(vals) == 0:
                    assert np.isnan(mean[c])
                    continue
                assert mean[c] == pytest.approx(vals.mean()), msg
                for q in (0.5, 0.9, 0.99):
                    true = np.quantile(vals, q, method="inverted_cdf")
                    got = res.latency_percentile(which, q)[lane, c]
                    b = int(latency_bin(np.int32(true)))
                    assert lo_edges[b] <= got < max(hi_edges[b], lo_edges[b] + 1), (msg, which, q, true, got)
                    if true < 64:
                        assert got == true
        # windowed service difference and Jain's index, window 9 steps, stride 3
        y_all, d_all, b_all = res.windows(9, 3)
        starts = list(range(0, (STEPS // EVERY) * EVERY - 9 + 1, 3))
        padded = np.vstack([np.zeros((1, k)), w])
        for i, x in enumerate(starts):
            y = (padded[x + 9] - padded[x]) / 9
            d = np.zeros(k)
            for r in reqs:
                if x <= r.arrival < x + 9:
                    d[r.client] += _full_cost(r, s) / 9
            np.testing.assert_allclose(y_all[lane, i], y, rtol=1e-12, atol=1e-9)
            np.testing.assert_allclose(d_all[lane, i], d, rtol=1e-12, atol=1e-9)
            assert list(b_all[lane, i]) == list(bl[x:x + 9].any(axis=0))
        diffs = [np.minimum(y_all[lane, i].max() - y_all[lane, i], abs(d_all[lane, i] - y_all[lane, i])).sum()
                 for i in range(len(starts))]
        mx, mean = res.service_difference(9, 3)
        assert mx[lane] == pytest.approx(max(diffs)) and mean[lane] == pytest.approx(np.mean(diffs))


def test_latency_bins_are_contiguous_and_cover_int32():
    lo, hi = latency_bin_edges()
    assert lo[0] == 0 and (lo[1:] == hi[:-1]).all() and hi[-1] > 2**31 - 1
    xs = np.asarray([0, 1, 63, 64, 65, 71, 72, 1000, 123456, 2**31 - 1], dtype=np.int32)
    bins = np.asarray(latency_bin(xs))
    assert ((lo[bins] <= xs) & (xs < hi[bins])).all()
