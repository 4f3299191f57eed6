"""The engine against the slow literal reference at many clients (K = 17, 40, 87).

The exactness tests of test_engine_exact.py run K <= 5; here most of K clients are idle, a
few are heavy, arrivals come in bursts and the KV budget is small, so queues form across
many clients, and the per-client paths (bands, weights, rpm windows, estimator state,
policies' own counters) are indexed far from client 0. Every registered policy (random
settings, vtc_jax.testing.lanes.random_settings) runs on every trace, all lanes of one K in ONE
run_traces call (one compile per K). The K = 87 batch also carries the real tenants of
the shipped ServeGen sample (data/servegen/m-large: 87 clients), a 240-step slice with
lengths scaled down so that the reference stays fast.
"""

from __future__ import annotations

import functools
import math
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from vtc_jax.testing import reference as ref
from vtc_jax import POLICIES, Settings, run_traces
from vtc_jax.testing.lanes import Lanes, assert_lane_matches, policy_lanes, run_reference, service_matrix, to_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "servegen" / "m-large"
# K -> (traces, horizon: None runs each lane until it drains, last arrival)
GROUPS = {17: (6, 120, 110), 40: (5, None, 90), 87: (4, 240, 100)}
SERVEGEN_STEPS = 240
SERVEGEN_M = 48


def bursty_trace(rng: random.Random, num_clients: int, kv_budget: int, last_arrival: int) -> list[ref.Request]:
    """A few dozen requests from a handful of K clients: one to three heavy ones send most,
    the rest of the active ones a request or two, and 80% of arrivals land within two steps
    of one of a few burst times. Client 0 and client K - 1 are active half of the time (the
    edges of every per-client array)."""
    K, M = num_clients, kv_budget
    active = rng.sample(range(K), rng.randint(3, min(K, 12)))
    for edge in (0, K - 1):
        if edge not in active and rng.random() < 0.5:
            active.append(edge)
    heavy = active[: rng.randint(1, 3)]
    bursts = [rng.randrange(last_arrival) for _ in range(rng.randint(2, 5))]
    reqs = []
    for _ in range(rng.randint(20, 60)):
        client = rng.choice(heavy) if rng.random() < 0.6 else rng.choice(active)
        if rng.random() < 0.8:
            arrival = min(last_arrival - 1, rng.choice(bursts) + rng.randint(0, 2))
        else:
            arrival = rng.randrange(last_arrival)
        prompt = rng.randint(1, max(1, M // 4)) if rng.random() < 0.6 else rng.randint(1, M)
        output = rng.randint(1, 10)
        cached = rng.randint(1, prompt - 1) if prompt >= 2 and rng.random() < 0.3 else 0
        reqs.append(ref.Request(arrival, client, prompt, output, cached))
    rng.shuffle(reqs)
    return reqs


@functools.lru_cache(maxsize=1)
def servegen_requests(steps: int = SERVEGEN_STEPS, kv_budget: int = SERVEGEN_M) -> tuple[ref.Request, ...]:
    """The shipped sample's 87 tenants, six hours mapped onto `steps` steps at a load that
    gives about 150 requests (one seed), prompts divided by 128 and outputs by 64 (rounded
    up; outputs capped at 1024 before): real tenant mix and arrival pattern, small lengths."""
    import jax

    from vtc_jax.inputs import servegen as sg
    from vtc_jax.inputs.workload import ARRIVAL, CACHED, INT32_MAX, OUTPUT, PROMPT

    data = sg.read_servegen(str(DATA))
    unit = sg.plan(data, load=1.0, kv_budget=4096, horizon=steps, max_output=1024, pad=6)
    p = sg.plan(data, load=150 / float(unit.expected_requests.sum()), kv_budget=4096, horizon=steps,
                max_output=1024, pad=6)
    rows, _ = jax.jit(sg.generate, static_argnames="layout")(jax.random.key(3), p.params, layout=p.layout)
    rows = np.asarray(rows).astype(np.int64)
    first, size = sg.block_layout(p)
    reqs = []
    for k in range(p.num_clients):
        for r in rows[first[k]:first[k] + size[k]]:
            if r[ARRIVAL] == INT32_MAX:
                continue
            prompt = min(kv_budget, math.ceil(r[PROMPT] / 128))
            reqs.append(ref.Request(int(r[ARRIVAL]), k, prompt, math.ceil(r[OUTPUT] / 64), int(r[CACHED])))
    return tuple(reqs)


def _lanes(num_clients: int):
    count, steps, last_arrival = GROUPS[num_clients]
    rng = random.Random(4242 + num_clients)
    cases = []  # (requests, kv_budget)
    for _ in range(count):
        m = rng.randint(8, 48)
        cases.append((bursty_trace(rng, num_clients, m, last_arrival), m))
    if num_clients == 87:
        cases.append((list(servegen_requests()), SERVEGEN_M))
    lanes = Lanes([], [], [])
    for reqs, m in cases:
        policy_lanes(rng, reqs, m, num_clients, POLICIES, lanes)
    return (*lanes, steps)


def test_servegen_slice_is_many_real_tenants():
    """The ServeGen lanes really are the real mix: many tenants, one or two heavy ones."""
    reqs = servegen_requests()
    per_client = np.bincount([r.client for r in reqs], minlength=87)
    assert len(per_client) == 87 and 100 <= len(reqs) <= 300
    assert (per_client > 0).sum() >= 15 and (per_client == 0).sum() >= 20
    assert per_client.max() >= 0.15 * len(reqs)
    assert max(r.arrival for r in reqs) < SERVEGEN_STEPS and max(r.prompt for r in reqs) <= SERVEGEN_M


@pytest.mark.parametrize("num_clients,wide", [(k, None) for k in sorted(GROUPS)] + [(40, True), (87, True)])
def test_many_clients_match_reference(num_clients, wide):
    """Every lane: its horizon, service after every step, final service and counters,
    admissions and completions per client, the drift and its step, the throughput and the
    conservation ledger agree exactly with the reference. Past 32 clients the engine's
    reductions over clients are folded (core/over_clients.py): checked in the planner's
    number format and in the WIDE one, whose argmin and max fold the (high, low) words."""
    traces, settings, requests, steps = _lanes(num_clients)
    result = run_traces(traces, settings, num_clients=num_clients, steps=steps, record_every=1, wide=wide)
    assert result.finished.all()
    queued = 0
    for lane, (reqs, s) in enumerate(zip(requests, settings)):
        expect = run_reference(reqs, num_clients, s, steps)
        assert_lane_matches(result, lane, expect, f"K={num_clients} lane {lane}: {s}")
        queued += sum(1 for row in expect.backlogged if sum(row) >= 2)
    assert queued > 0  # queues formed across clients: the cases test scheduling, not just arrival


def test_noisy_position_after_rejection():
    """Client 0's three arrivals at step 0 under rpm 1 per 4 steps (reject): two are
    rejected, so its request at step 65 is its 2nd accepted request: the noisy estimator
    numbers it 1 (rejected requests never reach the server), which decides WFQ's order
    here (numbering it 3 admits the other client first)."""
    R = ref.Request
    reqs = [R(65, 0, 7, 9), R(0, 0, 1, 1), R(0, 0, 1, 1), R(65, 2, 42, 1), R(0, 0, 1, 1)]
    s = Settings(policy="wfq", kv_budget=48, w_q=Fraction(5, 4), weights=(1, Fraction(7, 3), Fraction(7, 4)),
                 rpm_limit=1, rpm_window=4, rpm_mode="reject", estimator="noisy", estimate_error=Fraction(9, 10),
                 estimate_seed=2247428924)
    result = run_traces([to_trace(reqs)], [s], num_clients=3, steps=120, record_every=1)
    expect = run_reference(reqs, 3, s, 120)
    np.testing.assert_array_equal(result.checkpoints[0][:120], service_matrix(expect))
