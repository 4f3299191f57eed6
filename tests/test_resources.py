"""Resource accounting, sent- versus computed-token prefill charges and per-client KV caps,
against the reference's trajectories."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from vtc_jax import POLICIES, run_traces
from vtc_jax.testing.lanes import random_lanes, run_reference, service_matrix

STEPS = 30


def _lanes(seed, k, count, **overrides):
    """Random lanes cycling through the policies, share window (5, 20), and each override
    `key=make(rng, kv_budget, requests)` drawn per lane."""
    def adjust(rng, s, reqs):
        extra = {key: make(rng, s.kv_budget, reqs) for key, make in overrides.items()}
        return dataclasses.replace(s, share_window=(5, 20), **extra)

    return random_lanes(random.Random(seed), count, num_clients=k, policies=POLICIES, num_requests=(5, 25),
                        adjust=adjust, max_arrival=25, cached_prob=0.6)


def test_resource_service_matches_numpy():
    """R_k = sum over steps of weight_gb * n_k / n + kv_gb * context_k at decode."""
    resource = (13.5, 2 * 32 * 4096 * 2 / 1e9)
    traces, settings, requests = _lanes(3, 3, 24, resource=lambda rng, m, reqs: resource)
    res = run_traces(traces, settings, num_clients=3, steps=STEPS, record_every=1)
    for lane, (reqs, s) in enumerate(zip(requests, settings)):
        exp = run_reference(reqs, 3, s, STEPS)
        n = np.zeros((STEPS, 3))
        ctx = np.zeros((STEPS, 3))
        for r, a, f in zip(reqs, exp.admit_step, exp.finish_step):
            if a is None:
                continue
            for t in range(a, (f if f is not None else STEPS - 1) + 1):
                n[t, r.client] += 1
                ctx[t, r.client] += r.prompt + (t - a)
        total = n.sum(axis=1, keepdims=True)
        per_step = np.where(total > 0, n / np.maximum(total, 1), 0) * resource[0] + ctx * resource[1]
        r_cum = np.cumsum(per_step, axis=0)
        np.testing.assert_allclose(res.resource[lane], r_cum[-1], rtol=1e-5, atol=1e-4)
        drift = (r_cum.max(axis=1) - r_cum.min(axis=1)).max()
        assert res.resource_max_drift[lane] == pytest.approx(drift, rel=1e-4, abs=1e-3)
        window = r_cum[19] - r_cum[4]
        np.testing.assert_allclose(res.resource_share_service[lane], window, rtol=1e-4, atol=1e-3)


def test_charging_sent_tokens_equals_the_trace_without_cache():
    """Charging every sent prompt token is MODEL.md on the same trace with cached = 0 (the
    cache changes only the charge); computed service subtracts the phantom prefill."""
    traces, settings, requests = _lanes(5, 2, 24, charge_cached=lambda rng, m, reqs: True)
    res = run_traces(traces, settings, num_clients=2, steps=STEPS, record_every=1)
    for lane, (reqs, s) in enumerate(zip(requests, settings)):
        uncached = [dataclasses.replace(r, cached=0) for r in reqs]
        exp = run_reference(uncached, 2, dataclasses.replace(s, charge_cached=False), STEPS)
        np.testing.assert_array_equal(res.checkpoints[lane][:STEPS], service_matrix(exp))
        phantom = np.zeros(2)
        for r, a in zip(reqs, exp.admit_step):
            if a is not None:
                phantom[r.client] += float(s.w_p) * r.cached
        np.testing.assert_allclose(res.computed_service[lane], res.service[lane] - phantom)
        assert (phantom > 0).any() or not any(r.cached for r in reqs)


def test_kv_cap_matches_reference_and_is_never_exceeded():
    def cap(rng, m, reqs):
        biggest = max(r.prompt + r.output for r in reqs)
        return tuple(rng.randint(biggest, biggest + m // 2) for _ in range(3))

    traces, settings, requests = _lanes(9, 3, 32, kv_cap=cap)
    res = run_traces(traces, settings, num_clients=3, steps=STEPS, record_every=1)
    tight = 0
    for lane, (reqs, s) in enumerate(zip(requests, settings)):
        exp = run_reference(reqs, 3, s, STEPS)
        np.testing.assert_array_equal(res.checkpoints[lane][:STEPS], service_matrix(exp), err_msg=str(s))
        held = np.asarray(exp.held)
        assert (held <= np.asarray(s.kv_cap)[None, :]).all()
        uncapped = run_reference(reqs, 3, dataclasses.replace(s, kv_cap=None), STEPS)
        tight += uncapped.admit_step != exp.admit_step
    assert tight >= 8  # the caps did bind in many lanes
