"""`vtc_gateway`: VTC as production gateways run it (llm-d's VTC fairness plugin, pull
request 1222; the Gateway API Inference Extension's, pull request 2822): one counter per
client, charged ONCE at dispatch with an estimated cost, never per generated token and
never corrected by the real output (a gateway does not see it).

  * cost at dispatch: w_p * (prompt - cached) + w_q * e + beta * (e * prompt + e(e-1)/2),
    divided by the weight, e = the estimator's output prediction (llm-d: 1 * prompt +
    3 * 128, i.e. a fixed guess of 128 output tokens; use --estimator fixed).
  * lift (llm-d's rule): only a client *without a counter* is lifted, at a pick, to the
    minimum counter of the backlogged clients that have one (0 if none). A client loses
    its counter when it has had nothing waiting for `gc` steps (option; llm-d garbage-
    collects idle flows after about 5 minutes): a client that returns sooner keeps its old
    counter and may burst until it catches up (gc = 0: every return lifts, as VTC does).
  * pick: the eligible client with the smallest (lifted) counter, ties smallest index.
A candidate that does not fit M changes nothing (no lift, no charge). Counters are exact
integers (the run's number format, wide.py) in counter units.
"""

from __future__ import annotations

from fractions import Fraction

import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients
from vtc_jax.core.errors import InputError
from vtc_jax.policies.base import Choice, Policy, argmin_choice, estimated_cost, onehot

I32 = jnp.int32
OPTIONS = {"gc": 10_000}


def validate(settings) -> None:
    gc = settings.option("gc")
    if isinstance(gc, bool) or not isinstance(gc, int) or not 0 <= gc <= 1 << 30:
        raise InputError(f"vtc_gateway option gc must be an integer number of steps >= 0, got {gc!r}")


def encode(settings, ctx) -> dict:
    return {"gc": np.int32(OPTIONS["gc"] if settings is None else settings.option("gc"))}


def init(params, shape):
    k = shape.num_clients
    return {"counter": shape.num.zeros((k,)), "has": jnp.zeros(k, bool),
            "last_backlogged": jnp.zeros(k, shape.clock)}  # a step: the clock's dtype


def select(state, view, eligible, params) -> Choice:
    num, counter, has = view.num, state["counter"], state["has"]
    with_counter = view.backlogged & has
    floor = num.where(over_clients.any_of(with_counter), num.min_of(counter, with_counter), num.zeros())
    lifted = view.backlogged & ~has
    counter = num.where(lifted, num.broadcast(floor, has.shape), counter)
    # a client picked from is waiting now: its idle time starts no earlier (kept if it is admitted)
    last = jnp.where(view.backlogged, view.step, state["last_backlogged"])
    return argmin_choice(counter, eligible, dict(state, counter=counter, has=has | view.backlogged,
                                                 last_backlogged=last), num)


def on_admit(state, view, admission, params):
    k = view.backlogged.shape[0]
    charge = estimated_cost(view.costs, admission.row, admission.estimate) * view.costs.counter_mult
    add = onehot(admission.client, k) * charge
    return dict(state, counter=view.num.add(state["counter"], add)), admission.estimate


def on_step(state, view, step_end, params):
    last = jnp.where(view.backlogged, view.step, state["last_backlogged"])
    keep = view.backlogged | (view.step - last < params["gc"])
    return dict(state, has=state["has"] & keep, last_backlogged=last)


def counters(state):
    return state["counter"]


class Reference:
    """Literal llm-d gateway VTC (Fractions)."""

    def __init__(self, settings, sim):
        self.settings, self.sim = settings, sim
        self.gc = settings.option("gc")
        self.v = [Fraction(0)] * sim.K
        self.has = [False] * sim.K
        self.last_backlogged = [0] * sim.K

    def _lifted(self):
        sim = self.sim
        backlogged = [k for k in range(sim.K) if sim.fifo[k]]
        held = [self.v[k] for k in backlogged if self.has[k]]
        floor = min(held) if held else Fraction(0)
        return [floor if (sim.fifo[k] and not self.has[k]) else self.v[k] for k in range(sim.K)]

    def select(self, eligible):
        v = self._lifted()
        self._scanned = (v, [bool(f) for f in self.sim.fifo])  # committed by on_admit
        best = None
        for k in eligible:
            if best is None or v[k] < v[best]:
                best = k
        return best

    def on_admit(self, n):
        sim, r = self.sim, self.sim.reqs[n]
        self.v, backlogged = list(self._scanned[0]), self._scanned[1]
        self.has = [h or b for h, b in zip(self.has, backlogged)]
        self.last_backlogged = [sim.t if b else t for t, b in zip(self.last_backlogged, backlogged)]  # waiting now
        e = sim.estimate(n)
        cost = max(sim.prefill_charge(n) + sim.w_q * e + sim.beta * (e * r.prompt + e * (e - 1) // 2),
                   sim.cost_unit)
        self.v[r.client] += cost / sim.omega[r.client]
        return e

    def on_step_end(self, elapsed):
        sim = self.sim
        for k in range(sim.K):
            if sim.fifo[k]:
                self.last_backlogged[k] = sim.t
            if not (sim.fifo[k] or sim.t - self.last_backlogged[k] < self.gc):
                self.has[k] = False

    def counters(self):
        return list(self.v)


def fuzz_options(rng) -> dict:
    return {"gc": rng.choice([0, 1, 4, 10_000])}


VTC_GATEWAY = Policy(name="vtc_gateway", summary="VTC at a gateway: an estimated cost charged once at dispatch (llm-d)",
                     encode=encode, init=init, select=select, on_admit=on_admit, on_step=on_step,
                     reference=Reference, reads=("weights", "estimator", "options", "prices"), options=dict(OPTIONS),
                     uses_estimator=True, counters=counters, validate=validate, fuzz_options=fuzz_options)
