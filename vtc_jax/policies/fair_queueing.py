"""`wfq` and `sfq`: per-client virtual-time fair queueing (the classical forms; vLLM pull
request 31909 proposed a per-request variant).

Every request gets tags when it arrives, chained per client:

    S = max(V, F_tail[client]),   F = S + cost / weight_client,   F_tail[client] = F,

cost = the request's estimated cost (w_p * (prompt - cached) + w_q * e + beta * ..., at
least one unit; e = the estimator's output prediction at arrival). Several arrivals of a
client in one step chain in trace order. `sfq` (start-time fair queueing, Goyal et al.)
dispatches the eligible head with the smallest start tag S, `wfq` the one with the
smallest finish tag F; equal tags go to the head that arrived first, then to the smallest
client index (the PR's Request.__lt__ orders equal virtual finish times by arrival_time).
At a dispatch V = max(V, S) (the start tag of the request in service, as SFQ and the PR
do) and F_max = max(F_max, F). At the end of a step in which no client is left waiting
(the busy period ended: Goyal's rule), V = max(V, F_max), so no client carries history
across an uncontended period; a returning idle client starts at max(V, F_tail), which
removes banked credit as VTC's lift does. A candidate that does not fit M changes
nothing. Tags are exact integers (the run's number format, wide.py) in counter units
(1 / (Q * D) tokens).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import jax.numpy as jnp

from vtc_jax.core import over_clients
from vtc_jax.policies.base import Choice, Policy, estimated_cost, head_arrivals, no_params

I32 = jnp.int32


def init(params, shape):
    k, r, num = shape.num_clients, shape.num_rows, shape.num
    return {"v": num.zeros(), "f_max": num.zeros(), "f_tail": num.zeros((k,)), "start": num.zeros((r,)),
            "finish": num.zeros((r,)), "chosen_start": num.zeros(), "chosen_finish": num.zeros()}


def on_arrival(state, view, arrivals, params):
    joins, client = arrivals.joins, arrivals.client  # [W]
    k = state["f_tail"].shape[0]
    cost = estimated_cost(view.costs, arrivals.rows, arrivals.estimates) * view.costs.counter_mult[client]
    cost = jnp.where(joins, cost, 0)
    same = (client[:, None] == client[None, :]) & joins[None, :]  # [W, W]: entry j joins i's client
    upto = jnp.where(jnp.tril(same), cost[None, :], 0).sum(axis=1, dtype=cost.dtype)  # cost through entry i, its client's chain
    num = view.num
    base = num.maximum(num.broadcast(state["v"], client.shape), state["f_tail"][client])
    finish = num.add(base, upto)
    start = num.add(base, upto - cost)
    rows = state["start"].shape[0]
    index = jnp.where(joins, arrivals.index, rows)
    last = joins & ~jnp.triu(same, 1).any(axis=1)  # no later joining entry of the same client
    return dict(state,
                start=state["start"].at[index].set(start, mode="drop"),
                finish=state["finish"].at[index].set(finish, mode="drop"),
                f_tail=state["f_tail"].at[jnp.where(last, client, k)].set(finish, mode="drop")), view.counter


def first_by_tag_then_arrival(tags, arrival, eligible, num):
    """int32[]: the eligible client with the smallest tag (exact, [K] in the number format
    `num`), ties by the smallest head arrival (int32[K], int64 with a wide clock), then the
    smallest index."""
    lowest = num.min_of(tags, eligible)
    tied = eligible & ~num.less(lowest, tags)  # tags >= lowest: not above it means equal
    return over_clients.first_argmin(jnp.where(tied, arrival, jnp.iinfo(arrival.dtype).max))


def _select(tag: str):
    def select(state, view, eligible, params):
        start, finish = state["start"][view.head_index], state["finish"][view.head_index]
        client = first_by_tag_then_arrival(start if tag == "start" else finish, head_arrivals(view), eligible,
                                           view.num)
        return Choice(client, over_clients.any_of(eligible),
                      dict(state, chosen_start=start[client], chosen_finish=finish[client]))
    return select


def on_admit(state, view, admission, params):
    num = view.num
    return dict(state, v=num.maximum(state["v"], state["chosen_start"]),
                f_max=num.maximum(state["f_max"], state["chosen_finish"])), admission.estimate


def on_step(state, view, step_end, params):
    idle = ~over_clients.any_of(view.backlogged)
    num = view.num
    return dict(state, v=num.where(idle, num.maximum(state["v"], state["f_max"]), state["v"]))


class ReferenceSFQ:
    """Literal per-client start/finish tags (Fractions)."""

    by = "start"

    def __init__(self, settings, sim):
        self.settings, self.sim = settings, sim
        self.v = self.f_max = Fraction(0)
        self.f_tail = [Fraction(0)] * sim.K
        self.start, self.finish = {}, {}

    def on_arrival(self, n):
        sim, r = self.sim, self.sim.reqs[n]
        e = sim.estimate(n)
        cost = sim.prefill_charge(n) + sim.w_q * e + sim.beta * (e * r.prompt + e * (e - 1) // 2)
        cost = max(cost, sim.cost_unit)
        self.start[n] = max(self.v, self.f_tail[r.client])
        self.finish[n] = self.start[n] + cost / sim.omega[r.client]
        self.f_tail[r.client] = self.finish[n]

    def select(self, eligible):
        tags, sim = getattr(self, self.by), self.sim
        keys = [(tags[sim.fifo[k][0]], sim.reqs[sim.fifo[k][0]].arrival, k) for k in eligible]
        return min(keys)[2] if keys else None  # smallest tag, then earliest head, then client

    def on_admit(self, n):
        self.v = max(self.v, self.start[n])
        self.f_max = max(self.f_max, self.finish[n])
        return self.sim.estimate(n)

    def on_step_end(self, elapsed):
        if not any(self.sim.fifo):
            self.v = max(self.v, self.f_max)


class ReferenceWFQ(ReferenceSFQ):
    by = "finish"


SFQ = Policy(name="sfq", summary="start-time fair queueing: smallest per-client start tag (cost / weight chained)",
             encode=no_params, init=init, select=_select("start"), on_arrival=on_arrival, on_admit=on_admit,
             on_step=on_step, reference=ReferenceSFQ, reads=("weights", "estimator", "prices"), uses_estimator=True,
             arrival_rows=True)
WFQ = dataclasses.replace(SFQ, name="wfq", summary="weighted fair queueing: smallest per-client finish tag",
                          select=_select("finish"), reference=ReferenceWFQ)
