"""`rr` (vtc_jax/policies/round_robin.py): llm-d's round-robin fairness policy.

* hand-worked traces through the engine and the literal reference (tests/test_hand_cases.py's
  `_check`: W after every step, final counters, the step each request was admitted);
* llm-d's own test cases, ported as assertions (not code) on our hooks and our reference:
  pkg/epp/framework/plugins/flowcontrol/fairness/roundrobin/roundrobin_test.go and, for
  `fcfs` as llm-d's global-strict policy, .../fairness/globalstrict/global_strict_test.go
  (llm-d/llm-d-router@ebab6879);
* the engine against the reference on many random small lanes (every limit, band and
  estimator lanes.random_settings draws), at a replica and at a gateway (random clusters
  against vtc_jax/testing/cluster_reference.py).
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_hand_cases import _check
from vtc_jax import Settings
from vtc_jax.core.rows import ORDER
from vtc_jax.engines.cluster_settings import gateway_problem
from vtc_jax.policies import registry
from vtc_jax.policies.base import Admission, Arrivals, Shape, View
from vtc_jax.policies.fcfs import FCFS
from vtc_jax.policies.round_robin import NAME, RR, Reference
from vtc_jax.testing import check_policy

# ---------------------------------------------------------------------------------------
# Hooks and reference driven as llm-d drives a fairness policy: every pick dispatches
# (llm-d checks saturation before Pick), so a pick is select then on_admit here.
# ---------------------------------------------------------------------------------------


def _view(backlogged) -> View:
    b = jnp.asarray(backlogged, bool)
    return View(*([None] * len(View._fields)))._replace(backlogged=b, counter=jnp.zeros(b.shape[0], jnp.int32))


class Hooks:
    """The JAX hooks of one lane."""

    def __init__(self, k: int):
        self.k, self.state = k, RR.init({}, Shape(k, 1))

    def pick(self, queued) -> int | None:
        view = _view(queued)
        choice = RR.select(self.state, view, view.backlogged, {})
        if not bool(choice.has):
            return None
        adm = Admission(client=choice.client, row=None, index=None, estimate=jnp.int32(0), prefill=None)
        self.state, _ = RR.on_admit(choice.state, view, adm, {})
        return int(choice.client)

    def arrive(self, queued_before, client: int) -> None:
        view = _view(queued_before)
        joins = jnp.asarray([True])
        arr = Arrivals(joins=joins, client=jnp.asarray([client], jnp.int32), index=jnp.zeros(1, jnp.int32), rows=None,
                       estimates=None, joining=jnp.zeros(self.k, jnp.int32), newcomer=~view.backlogged,
                       first=jnp.int32(client))
        self.state, _ = RR.on_arrival(self.state, view, arr, {})


class Literal:
    """The reference of one lane (its sim: K, the FIFOs, the requests)."""

    def __init__(self, k: int):
        self.sim = SimpleNamespace(K=k, fifo=[[] for _ in range(k)], reqs=[], estimate=lambda n: 0)
        self.ref = Reference(None, self.sim)

    def pick(self, queued) -> int | None:
        for c in range(self.sim.K):
            self.sim.fifo[c] = [0] if queued[c] else []
        client = self.ref.select([c for c in range(self.sim.K) if queued[c]])
        if client is not None:
            self.sim.reqs.append(SimpleNamespace(client=client))
            self.ref.on_admit(len(self.sim.reqs) - 1)
        return client

    def arrive(self, queued_before, client: int) -> None:
        for c in range(self.sim.K):
            self.sim.fifo[c] = [0] if queued_before[c] else []
        self.ref.on_arrival(None)


BOTH = pytest.mark.parametrize("impl", [Hooks, Literal], ids=["hooks", "reference"])


@BOTH
def test_llmd_pick_logic(impl):
    # roundrobin_test.go TestRoundRobin_Pick_Logic: three non-empty flows (given unsorted:
    # sorting is what makes the order flow1, flow2, flow3; our keys are client ids) are
    # picked in sorted order, and the second cycle wraps around in the same order.
    p = impl(3)
    assert [p.pick([True, True, True]) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


@BOTH
def test_llmd_skips_empty_queues(impl):
    # TestRoundRobin_Pick_SkipsEmptyQueues: flow1, an empty flow, flow3 -> flow1, flow3, flow1.
    p = impl(3)
    assert [p.pick([True, False, True]) for _ in range(3)] == [0, 2, 0]


@BOTH
def test_llmd_handles_dynamic_flows(impl):
    # TestRoundRobin_Pick_HandlesDynamicFlows: flows {1, 2} -> flow1; flow3 added -> flow2
    # (continues from the last index), then flow3; flow2 removed -> wraps to flow1. A flow
    # that is absent is a client with nothing queued here.
    p = impl(3)
    assert p.pick([True, True, False]) == 0
    assert p.pick([True, True, True]) == 1
    assert p.pick([True, True, True]) == 2
    assert p.pick([True, False, True]) == 0


@BOTH
def test_llmd_even_turns(impl):
    # TestRoundRobin_Pick_Concurrency: 300 picks over three non-empty flows, each flow at
    # least half of its 100 turns (llm-d's bound allows for goroutine interleaving); picks
    # are sequential here, so every flow gets exactly 100.
    p = impl(3)
    picks = [p.pick([True, True, True]) for _ in range(300)]
    assert [picks.count(c) for c in range(3)] == [100, 100, 100]


@BOTH
def test_llmd_empty_band_picks_nothing_and_clears_the_cursor(impl):
    # roundrobin.go Pick: no non-empty queue -> nil, and lastSelected = nil, so the next pick
    # starts from the first key. Here the cursor is cleared when a request joins while every
    # queue is empty (the pick that found the band empty came in between).
    p = impl(3)
    assert p.pick([True, True, True]) == 0
    assert p.pick([False, True, True]) == 1
    assert p.pick([False, False, False]) is None
    p.arrive([False, False, False], 2)
    assert p.pick([True, True, True]) == 0  # without the clear: 2 (the one after 1)
    # A join while some queue holds requests leaves the cursor alone.
    p.arrive([True, False, False], 1)
    assert p.pick([True, True, True]) == 1


def test_llmd_globalstrict_is_fcfs():
    # global_strict_test.go TestGlobalStrict_Pick (FCFS ordering policy: earliest enqueue
    # time first): BasicSelection_TwoQueues and IgnoresEmptyQueues pick flow1, whose head
    # was enqueued 10 s ago against flow2's 5 s; SingleNonEmptyQueue picks flow1;
    # AllQueuesEmpty picks nothing. `fcfs` on heads ordered by (arrival, request number).
    heads = jnp.zeros((3, 5), jnp.int32).at[:, ORDER].set(jnp.asarray([0, 7, 3]))  # client 1 empty
    view = _view([True, False, True])._replace(heads=heads)
    cases = {"BasicSelection": [True, False, True], "IgnoresEmptyQueues": [True, False, True],
             "SingleNonEmptyQueue": [True, False, False]}
    for name, eligible in cases.items():
        choice = FCFS.select((), view, jnp.asarray(eligible), {})
        assert (int(choice.client), bool(choice.has)) == (0, True), name
    assert not bool(FCFS.select((), view, jnp.zeros(3, bool), {}).has)  # AllQueuesEmpty
    # The earlier head wins whichever client holds it.
    later = view._replace(heads=heads.at[0, ORDER].set(9))
    assert int(FCFS.select((), later, jnp.asarray([True, False, True]), {}).client) == 2


# ---------------------------------------------------------------------------------------
# Hand-worked traces. M = 4, every request (prompt 4, output 1): admitted at t, charged
# 4 + 2 = 6 in step t, completes in step t; a second admission in the same step would
# need 4 + 4 > 4, so one admission per step. Rows: (arrival, client, prompt, output).
# ---------------------------------------------------------------------------------------

# Two clients with two requests each at t=0 (trace order 0, 0, 1, 1): turns alternate,
# 0, 1, 0, 1 (fcfs would take r0, r1, r2, r3).
def test_turns_alternate_where_fcfs_does_not():
    rows = [(0, 0, 4, 1)] * 2 + [(0, 1, 4, 1)] * 2
    _check(rows, Settings(NAME, 4), W=[[6, 0], [6, 6], [12, 6], [12, 12]], counters=[12, 12],
           admit_steps=[0, 2, 1, 3])
    _check(rows, Settings("fcfs", 4), W=[[6, 0], [12, 0], [12, 6], [12, 12]], counters=[12, 12],
           admit_steps=[0, 1, 2, 3])


# Three clients. r0 = (0, 1): client 1 served at t=0 and every queue is empty after it.
# At t=2 r1 (client 1) and r2 (client 2) arrive together: the cursor was cleared, so the
# pick starts from client 0: client 1 at t=2, client 2 at t=3 (with the cursor kept,
# client 2, the one after client 1, would go first).
def test_cursor_cleared_when_every_queue_empties():
    rows = [(0, 1, 4, 1), (2, 1, 4, 1), (2, 2, 4, 1)]
    _check(rows, Settings(NAME, 4), num_clients=3, W=[[0, 6, 0], [0, 6, 0], [0, 12, 0], [0, 12, 6]],
           counters=[0, 12, 6], admit_steps=[0, 2, 3])


# Three clients: r0, r1 of client 0 and r2 of client 1 at t=0; r3 of client 2 at t=2.
# t=0: client 0 (r0); t=1: client 1 (r2); t=2: r3 joins while client 0 still waits, so
# the cursor stays: client 2 (after client 1) at t=2, client 0 (r1) at t=3.
def test_cursor_kept_while_some_queue_holds_requests():
    rows = [(0, 0, 4, 1), (0, 0, 4, 1), (0, 1, 4, 1), (2, 2, 4, 1)]
    _check(rows, Settings(NAME, 4), num_clients=3, W=[[6, 0, 0], [6, 6, 0], [6, 6, 6], [12, 6, 6]],
           counters=[12, 6, 6], admit_steps=[0, 3, 1, 2])


# A candidate that does not fit changes nothing. M = 6; r0 = (0, 0, 4, 2), r1 = (0, 0, 4, 1),
# r2 = (0, 1, 4, 1). t=0: client 0 (r0, 4 <= 6); the next candidate, client 1 (r2), needs
# 4 + 4 > 6: blocked, admission stops (r0 holds 5). t=1: client 1 again, 5 + 4 > 6: blocked;
# r0 completes. t=2: client 1 (r2), then client 0's r1 is blocked (4 + 4 > 6); t=3: r1.
# (fcfs would take r1, the older head, at t=2.) Charges: 4 at admission, 2 per token.
def test_blocked_candidate_keeps_its_turn():
    rows = [(0, 0, 4, 2), (0, 0, 4, 1), (0, 1, 4, 1)]
    _check(rows, Settings(NAME, 6), W=[[6, 0], [8, 0], [8, 6], [14, 6]], counters=[14, 6],
           admit_steps=[0, 3, 2])
    _check(rows, Settings("fcfs", 6), W=[[6, 0], [8, 0], [14, 0], [14, 6]], counters=[14, 6],
           admit_steps=[0, 2, 3])


# ---------------------------------------------------------------------------------------
# The registry, and random lanes against the reference.
# ---------------------------------------------------------------------------------------

def test_registered_quiet_and_gateway_capable():
    assert registry.get(NAME) is RR and RR.quiet and RR.reads == () and RR.options == {}
    assert gateway_problem(NAME) is None  # no completion hook: a router can run it


@pytest.mark.parametrize("num_clients, mode", [(2, "drain"), (3, "fixed"), (5, "burst")])
def test_quiet_stretches_give_the_step_by_step_results(num_clients, mode):
    """rr is quiet (a step with no admission or completion whose arrivals all join
    backlogged clients changes nothing): the engine's quiet stretches (engines/quiet.py) give
    every result of one event per step, and some are taken (tests/test_quiet_steps.py's
    saturated lanes; "fixed" cuts the run with requests still arriving and has rpm limits
    and bands in some lanes, "burst" takes one arrival per event)."""
    from tests.test_quiet_steps import MEASURES, _assert_same_results
    from vtc_jax import run_traces
    from vtc_jax.testing.lanes import random_lanes

    adjust = None if mode == "fixed" else (lambda rng, s, reqs: dataclasses.replace(s, rpm_limit=None, rpm_mode="delay",
                                                                                        bands=None))
    lanes = random_lanes(random.Random(90 + num_clients), 24, num_clients=num_clients, policies=(NAME,),
                         num_requests=(8, 40), max_arrival=6 if mode == "burst" else 30, max_output=40, adjust=adjust)
    kwargs = dict(num_clients=num_clients, steps=17 if mode == "fixed" else None, measures=MEASURES,
                  arrival_width=1 if mode == "burst" else 4)
    each_step = run_traces(lanes.traces, lanes.settings, quiet_window=0, **kwargs)
    bulk = run_traces(lanes.traces, lanes.settings, quiet_window=16, **kwargs)
    assert bulk.finished.all()
    _assert_same_results(bulk, each_step, f"rr K={num_clients} {mode}")
    assert (bulk.events < each_step.events).sum() >= 3


@pytest.mark.parametrize("num_clients, lanes, steps", [(2, 150, 50), (3, 250, 50), (5, 120, None), (40, 24, 60)])
def test_engine_matches_reference_on_random_lanes(num_clients, lanes, steps):
    """Random lanes (random prices, weights, estimators, rpm limits in both modes, KV caps,
    bands) step by step against the reference; K = 40 takes the folded reductions of
    over_clients (K > 32)."""
    check_policy(NAME, lanes=lanes, seed=num_clients, num_clients=num_clients, steps=steps)


def test_random_clusters_with_rr_at_routers_and_replicas_match_reference():
    """rr at the routers (every counter mode, holdback, saturation rule, replica choice) and
    at the replicas, against the literal cluster reference, to the integer."""
    from tests import test_cluster as tc
    from vtc_jax.driver.cluster_run import simulate_traces
    from vtc_jax.testing import cluster_reference as cref

    rng = random.Random(51)
    lanes = []
    for i in range(48):
        k = rng.randint(2, 4)
        cs = tc.random_cluster(rng, k)
        if i % 3 != 2:  # 0: rr at both, 1: at the replicas only, 2: at the routers only
            cs = dataclasses.replace(cs, engine=dataclasses.replace(cs.engine, policy=NAME, options=()))
        if i % 3 != 1:
            cs = dataclasses.replace(cs, gateway_policy=NAME, gateway_options=())
        lanes.append((cs, k, tc.random_requests(rng, k, cs.engine.kv_budget)))
    res = simulate_traces([tc._trace(r) for _, _, r in lanes], [cs for cs, _, _ in lanes],
                          num_clients=[k for _, k, _ in lanes], steps=tc.STEPS, record=True)
    seen = set()
    for b, (cs, k, reqs) in enumerate(lanes):
        tc.compare(res, b, cref.simulate(reqs, k, cs, tc.STEPS), cs, reqs, k)
        seen.add((cs.counters, cs.gateway_policy == NAME, cs.engine.policy == NAME))
    assert {c for c, _, _ in seen} == {"per_router", "shared", "delayed"}
    assert {(g, e) for _, g, e in seen} == {(True, True), (True, False), (False, True)}
    assert int(np.asarray(res.dispatched).sum()) > 0
