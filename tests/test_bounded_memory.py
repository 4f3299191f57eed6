"""`ideal_reserve` (vtc_jax/servers/ideal.py): MODEL.md's server with the VTC theorem's
admission rule, prompt + output of every running request within M. A hand-worked case
where `ideal` admits and `ideal_reserve` waits, and a property over random small lanes:
the KV held never exceeds M and VTC's backlogged drift stays within 2U.

KV held is read from the service itself: with w_p = 0, w_q = 1 and beta = 1 a step
charges every running request 1 + its context before the step, i.e. the context it holds
after the step's decode, so the per-step increase of total service (checkpoints every
step) is the KV held at the end of that step."""

from __future__ import annotations

import numpy as np
import pytest

from vtc_jax import InputError, Settings, Trace, replay
from vtc_jax.driver import adversary as adv
from vtc_jax.driver.run import run_traces
from vtc_jax.servers import registry as servers

KV_PRICES = {"w_p": 0, "w_q": 1, "beta": 1}  # service per step = KV held after the step


def kv_held(result) -> np.ndarray:
    """int64[B, T]: KV tokens held after each step (results of KV_PRICES lanes, record_every=1)."""
    total = result.checkpoints.sum(axis=2)
    return np.diff(total, axis=1, prepend=0).astype(np.int64)


def test_ideal_reserve_is_registered_after_vllm():
    assert servers.names()[:3] == ("ideal", "vllm", "ideal_reserve")
    with pytest.raises(InputError, match="no settings of its own"):
        servers.get("ideal_reserve").validate({"num_gpu_blocks": 3})


def test_hand_worked_ideal_admits_and_ideal_reserve_waits():
    """M = 200; clients 0 and 1 each send one request (prompt 100, output 50) at step 0.

    ideal: prompts 100 + 100 = 200 <= M, both run steps 0-49 and leave at the end of step
    49; they hold 2 x (100 + t + 1) after step t, 300 > M after step 49. With w_p = 1,
    w_q = 2 each client is charged 100 + 50 x 2 = 200 by T = 50.
    ideal_reserve: the first reserves 100 + 50 = 150; the second needs 150 + 150 = 300 > M
    and waits until the first leaves at step 50, then runs steps 50-99. At T = 60 client 1
    has 100 + 10 x 2 = 120; the KV held peaks at 150 (after steps 49 and 99)."""
    trace = Trace.from_rows([(0, 0, 100, 50), (0, 1, 100, 50)])
    priced = Settings(policy="fcfs", kv_budget=200, w_p=1, w_q=2)
    free = replay(trace, priced, steps=60, server="ideal")
    held = replay(trace, priced, steps=60, server="ideal_reserve")
    assert free.completed.tolist() == [[1, 1]] and free.service.tolist() == [[200, 200]]
    assert held.completed.tolist() == [[1, 0]] and held.service.tolist() == [[200, 120]]
    kv = Settings(policy="fcfs", kv_budget=200, **KV_PRICES)
    free_kv = kv_held(replay(trace, kv, steps=110, server="ideal", record_every=1))[0]
    held_kv = kv_held(replay(trace, kv, steps=110, server="ideal_reserve", record_every=1))[0]
    assert free_kv[0] == 202 and free_kv[49] == 300 and free_kv.max() == 300
    assert held_kv[0] == 101 and held_kv[49] == 150 and held_kv[50] == 101 and held_kv[99] == 150
    assert held_kv.max() == 150


def _random_lanes(rng: np.random.Generator, lanes: int, m: int, horizon: int) -> list[Trace]:
    """Small K = 2 traces whose every request fits M alone (prompt + output <= M)."""
    traces = []
    for _ in range(lanes):
        n = int(rng.integers(2, 9))
        prompt = rng.integers(1, m // 2 + 1, n)
        output = np.asarray([rng.integers(1, m - p + 1) for p in prompt])
        rows = sorted(zip(rng.integers(0, horizon // 2, n).tolist(), rng.integers(0, 2, n).tolist(),
                          prompt.tolist(), output.tolist()))
        traces.append(Trace.from_rows([(a, c, p, o) for a, c, p, o in rows]))
    return traces


def test_ideal_reserve_holds_at_most_m_and_vtc_stays_within_2u():
    """Random lanes (fixed seed): on ideal_reserve the KV held after every step is <= M,
    and VTC's backlogged drift (w_p = 1, w_q = 2) is <= 2U on every lane; on ideal the
    same lanes pass M (the check has teeth)."""
    m, horizon, lanes = 64, 96, 24
    traces = _random_lanes(np.random.default_rng(7), lanes, m, horizon)
    kv = Settings(policy="vtc", kv_budget=m, **KV_PRICES)
    priced = Settings(policy="vtc", kv_budget=m, w_p=1, w_q=2)
    both = run_traces(traces + traces, [kv] * lanes + [priced] * lanes, num_clients=2, steps=horizon,
                      record_every=1, server="ideal_reserve")
    assert both.finished.all()
    held = kv_held(both)[:lanes]
    assert held.max() <= m, held.max(axis=1)
    drift, bound = both.backlogged_drift[lanes:], both.bound_2u[lanes:]
    assert (drift <= bound).all(), (drift, bound)
    assert (drift > 0).any()
    free = run_traces(traces, [kv] * lanes, num_clients=2, steps=horizon, record_every=1, server="ideal")
    assert kv_held(free).max() > m


def test_the_search_refuses_requests_a_bounded_server_never_serves():
    """The adversary's limits: on ideal_reserve a candidate's largest prompt + output must fit
    M; on vllm its peak blocks must fit the pool (vllm's never_served)."""
    limits = adv.Limits(clients=2, requests=4, horizon=32, prompt=(4, 48), output=(1, 32))
    adv.Objective(Settings("vtc", 64), limits)  # ideal: prompts within M are enough
    with pytest.raises(InputError, match="ideal_reserve.*80 tokens, more than M=64"):
        adv.Objective(Settings("vtc", 64), limits, server="ideal_reserve")
    pool = Settings("vtc", 64, server_options=(("num_gpu_blocks", 5), ("block_size", 16)))
    with pytest.raises(InputError, match="server vllm.*KV blocks"):
        adv.Objective(pool, limits, server="vllm")
    fits = adv.Limits(clients=2, requests=4, horizon=32, prompt=(4, 48), output=(1, 16))
    adv.Objective(Settings("vtc", 64), fits, server="ideal_reserve")
    adv.Objective(pool, fits, server="vllm")
