"""The engine against the slow literal reference, step by step, on random traces: every
trace under every registered policy (vtc_jax.testing.lanes.random_lanes)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vtc_jax import POLICIES, run_traces
from vtc_jax.testing.lanes import assert_lane_matches, random_lanes, run_reference, service_matrix

TRACES_PER_GROUP = 24


def _lanes(seed: int, num_clients: int, burst: bool):
    """TRACES_PER_GROUP random traces, each under every policy with random settings."""
    return random_lanes(random.Random(seed), TRACES_PER_GROUP, num_clients=num_clients, policies=POLICIES,
                        every_policy=True, num_requests=(1, 30), max_arrival=4 if burst else 40)


@pytest.mark.parametrize("num_clients", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("mode", ["drain", "fixed", "burst"])
def test_matches_reference_every_step(num_clients, mode):
    """Service after every step, final counters, counts, drift and horizon agree exactly.

    "burst" packs arrivals into 4 steps with an arrival width of 1, so a step's arrivals
    span several events; "fixed" cuts runs at a horizon shorter than some drains.
    """
    traces, settings, requests = _lanes(1000 * num_clients + len(mode), num_clients, mode == "burst")
    steps = 23 if mode == "fixed" else None
    result = run_traces(traces, settings, num_clients=num_clients, steps=steps, record_every=1,
                        arrival_width=1 if mode == "burst" else 4)
    assert result.finished.all()
    for lane, (reqs, s) in enumerate(zip(requests, settings)):
        expect = run_reference(reqs, num_clients, s, steps)
        assert_lane_matches(result, lane, expect, f"lane {lane}: {s}")


@pytest.mark.parametrize("num_clients", [2, 3])
def test_sparse_traces_jump_idle_stretches_exactly(num_clients):
    """A few requests spread over thousands of steps: the engine jumps over the idle
    stretches (its event count stays near the number of requests, not the steps) and still
    agrees with the reference, which steps through every one of them."""
    traces, settings, requests = random_lanes(random.Random(77 + num_clients), 8, num_clients=num_clients,
                                              policies=POLICIES, every_policy=True, num_requests=(1, 6),
                                              max_arrival=3000, max_output=6)
    result = run_traces(traces, settings, num_clients=num_clients, steps=3000, record_every=1)
    assert result.finished.all()
    assert result.events.max() < 200  # versus 3000 steps: idle steps cost no event
    for lane, (reqs, s) in enumerate(zip(requests, settings)):
        expect = run_reference(reqs, num_clients, s, 3000)
        context = f"lane {lane}: {s}"
        np.testing.assert_array_equal(result.checkpoints[lane][:3000], service_matrix(expect), err_msg=context)
        assert list(result.counters_exact[lane]) == expect.counters[-1], context
        assert list(result.completed[lane]) == expect.completed, context
