"""`vtc_predict`: VTC charging a predicted output at admission and settling at completion
(the VTC artifact's vtc_oracle / vtc_predict queues, with any estimator).

It keeps a virtual counter of its own (the MODEL.md counter c_k is still charged for the
tokens actually processed and reported as `counters`; this one is `policy_counters`),
orders by it (least counter first, ties smallest k) and lifts a returning client's counter
with MODEL.md's lift rule (Settings.lift_last_left applies). At admission it charges

    w_p * (prompt - cached) + w_q * e + beta * (e * prompt + e * (e - 1) / 2)

divided by the weight, e = the estimator's output prediction (Settings.estimator): the
request's whole cost as if its output were e tokens. It never charges per decode step. At
completion it settles the difference with the true output o (adds w_q * (o - e) +
beta * (o * prompt + o(o-1)/2 - e * prompt - e(e-1)/2), which may be negative), so each
finished request has cost exactly what it consumed.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from vtc_jax.core.rows import PROMPT
from vtc_jax.policies.base import Policy, argmin_choice, decode_cost, lift, onehot


def encode(settings, ctx) -> dict:
    return {"last_left": np.bool_(True if settings is None else settings.lift_last_left)}


def init(params, shape):
    return {"counter": shape.num.zeros((shape.num_clients,))}


def select(state, view, eligible, params):
    return argmin_choice(state["counter"], eligible, state, view.num)


def on_arrival(state, view, arrivals, params):
    counter = lift(state["counter"], view.backlogged, arrivals.newcomer, arrivals.first, view.last_left,
                   params["last_left"], view.num)
    return {"counter": counter}, view.counter


def on_admit(state, view, admission, params):
    k = view.counter.shape[0]
    charge = admission.prefill + decode_cost(view.costs, admission.row[PROMPT], admission.estimate)
    take = onehot(admission.client, k)
    return {"counter": view.num.add(state["counter"], take * charge * view.costs.counter_mult)}, admission.estimate


def settle(state, view, completion, params):
    k = view.counter.shape[0]
    delta = (decode_cost(view.costs, completion.prompt, completion.output)
             - decode_cost(view.costs, completion.prompt, completion.estimate))
    take = onehot(completion.client, k)
    return {"counter": view.num.add(state["counter"], take * delta * view.costs.counter_mult)}


def counters(state):
    return state["counter"]


class Reference:
    """Literal: an own counter, MODEL.md's lift on it, the estimated cost at admission,
    settled at completion."""

    def __init__(self, settings, sim):
        self.settings, self.sim = settings, sim
        self.v = [Fraction(0)] * sim.K

    def on_arrival(self, n):
        sim = self.sim
        k = sim.reqs[n].client
        if sim.fifo[k]:
            return
        backlogged = [i for i in range(sim.K) if sim.fifo[i]]
        if backlogged:
            self.v[k] = max(self.v[k], min(self.v[i] for i in backlogged))
        elif self.settings.lift_last_left and sim.last_left is not None:
            self.v[k] = max(self.v[k], self.v[sim.last_left])

    def select(self, eligible):
        best = None
        for k in eligible:
            if best is None or self.v[k] < self.v[best]:
                best = k
        return best

    def _decode(self, prompt, tokens):
        return self.sim.w_q * tokens + self.sim.beta * (tokens * prompt + tokens * (tokens - 1) // 2)

    def on_admit(self, n):
        sim, r = self.sim, self.sim.reqs[n]
        e = sim.estimate(n)
        self.v[r.client] += (sim.prefill_charge(n) + self._decode(r.prompt, e)) / sim.omega[r.client]
        return e

    def on_complete(self, n, e):
        sim, r = self.sim, self.sim.reqs[n]
        self.v[r.client] += (self._decode(r.prompt, r.output) - self._decode(r.prompt, e)) / sim.omega[r.client]

    def counters(self):
        return list(self.v)


VTC_PREDICT = Policy(name="vtc_predict", summary="VTC charging a predicted output at admission, settled at completion",
                     encode=encode, init=init, select=select, on_arrival=on_arrival, on_admit=on_admit,
                     on_complete=settle, reference=Reference, reads=("weights", "lift_last_left", "estimator", "prices"),
                     uses_estimator=True, counters=counters)
