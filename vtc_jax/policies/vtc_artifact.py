"""`vtc_artifact`: the VTC artifact's own counter queues (fair_bench's VTC, LCF, weighted
VTC, vtc_oracle and vtc_predict), with the artifact's float32 arithmetic, so the paper's
runs are reproduced on the `slora` server decision for decision.

It keeps a float32 counter per client (the MODEL.md counter c_k is still charged by the
engine; this one orders): least counter first (ties: smallest client, which the artifact's
runs number by first arrival), and, with option `lift` (default on), the artifact's lift:
a client that joins with an empty queue while others are backlogged is raised to their
least counter (no `last_left` clause). At admission it charges

    (w_p * input + w_q * p) / weight,   p = the prediction (option `predict`):

`none` (0: VTC, LCF), `exact` (the true output: vtc_oracle with r = 0), `average` (per
client, float32: 0 at first, then the first observed output, then 0.8 * old + 0.2 * actual
after each completion, in completion order: vtc_predict) or `estimator` (the lane's cost
estimator, Settings.estimator: e.g. `noisy` for an oracle with relative error up to r). The value it hands the server is
p's float32 bits. On `slora` (its Work.detail) the rest is the artifact's `update_counter`:
before every decode step each running request that generated more than p costs w_q /
weight, at a step where a request of the batch finishes each request of the batch past p
costs w_q / weight once more (slora's extra_finish_charge), and a finished request gets its
unused prediction w_q * (p - output) / weight back, added in the artifact's order (decode
charges, then extra less refunds). Bit for bit the artifact's for integer w_p and w_q a
power of two (the artifact's 1 and 2). On a server without that detail it charges every
step's decode cost (StepEnd.decode) and refunds w_q * p at completion, so a request costs
what it consumed.

The exact-integer equivalents: `lcf`; `vtc` with lift_last_left off; `vtc_predict` with the
exact estimator for vtc_oracle (tests/test_slora.py shows them identical on the paper's
unweighted traces, where every charge is an integer); they differ from this policy only
where float32 rounding decides a tie (weighted runs, non-integer predictions).
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients
from vtc_jax.core.errors import InputError
from vtc_jax.core.rows import OUTPUT
from vtc_jax.policies.base import Choice, Policy

F32, I32 = jnp.float32, jnp.int32
PREDICTORS = ("none", "exact", "average", "estimator")
OPTIONS = {"lift": True, "predict": "none"}


def validate(settings) -> None:
    if settings.option("predict") not in PREDICTORS:
        raise InputError(f"vtc_artifact option predict must be one of {', '.join(PREDICTORS)}, "
                         f"got {settings.option('predict')!r}")
    if type(settings.option("lift")) not in (bool, np.bool_):
        raise InputError(f"vtc_artifact option lift must be true or false, got {settings.option('lift')!r}")


def encode(settings, ctx) -> dict:
    option = (lambda name: OPTIONS[name]) if settings is None else settings.option
    w_q = 2.0 if settings is None else float(settings.w_q)
    return {"lift": np.bool_(option("lift")), "predict": np.int32(PREDICTORS.index(option("predict"))),
            "w_q": np.float32(w_q), "q": np.float32(ctx.cost_scale), "qd": np.float32(ctx.cost_scale * ctx.counter_scale),
            "weight": np.asarray([float(w) for w in ctx.weights], np.float32)}


def init(params, shape):
    k = shape.num_clients
    return {"counter": jnp.zeros(k, F32), "pred": jnp.zeros(k, F32), "settled": jnp.zeros((), bool),
            "units": shape.num.zeros((k,))}


def _with(state, params, num, **changes):
    """The state with `changes`, its reported counter (`units`: counter units, rounded;
    exact while the counter is a multiple of 1 / (Q * D) below 2^30 units) kept up to date."""
    out = dict(state, **changes)
    units = jnp.round(out["counter"] * params["qd"]).astype(I32)
    return dict(out, units=num.add(num.zeros(units.shape), units))


def counters(state):
    return state["units"]


def select(state, view, eligible, params) -> Choice:
    client = jnp.argmin(jnp.where(eligible, state["counter"], jnp.inf)).astype(I32)
    return Choice(client, over_clients.any_of(eligible), state)


def on_arrival(state, view, arrivals, params):
    """The artifact lifts arrivals one at a time; over one event that is: every newcomer to
    the least counter of the clients backlogged before it, or, when none was, to the first
    newcomer's counter (the first itself keeps its own)."""
    counter = state["counter"]
    floor = jnp.where(view.backlogged.any(), jnp.where(view.backlogged, counter, jnp.inf).min(),
                      counter[arrivals.first])
    lifted = jnp.where(arrivals.newcomer & params["lift"], jnp.maximum(counter, floor), counter)
    return _with(state, params, view.num, counter=lifted), view.counter


def _prediction(state, params, admission):
    return jnp.select([params["predict"] == 1, params["predict"] == 2, params["predict"] == 3],
                      [admission.row[OUTPUT].astype(F32), state["pred"][admission.client],
                       admission.estimate.astype(F32)], jnp.zeros((), F32))


def on_admit(state, view, admission, params):
    c = admission.client
    pred = _prediction(state, params, admission)
    charge = (admission.prefill.astype(F32) / params["q"] + params["w_q"] * pred) / params["weight"][c]
    counter = state["counter"].at[c].add(charge)
    return _with(state, params, view.num, counter=counter), jax.lax.bitcast_convert_type(pred, I32)


def on_step(state, view, step_end, params):
    weight, w_q = params["weight"], params["w_q"]
    if step_end.detail is None:  # a server without the artifact's charges: the step's decode cost
        counter = state["counter"] + (step_end.decode.astype(F32) / params["q"]) / weight
        return _with(state, params, view.num, counter=counter)
    d = step_end.detail
    counter = (state["counter"] + (w_q * d["charge"]) / weight) + (w_q * d["settle"]) / weight
    return _with(state, params, view.num, counter=counter, settled=jnp.ones((), bool))


def on_complete(state, view, completion, params):
    c = completion.client
    pred = jax.lax.bitcast_convert_type(completion.estimate, F32)
    refund = jnp.where(state["settled"], 0.0, (params["w_q"] * pred) / params["weight"][c]).astype(F32)
    out = completion.output.astype(F32)
    p0 = state["pred"][c]
    new = jnp.where(p0 == 0, out, F32(0.8) * p0 + F32(0.2) * out)
    learn = params["predict"] == 2
    return _with(state, params, view.num, counter=state["counter"].at[c].add(-refund),
                 pred=state["pred"].at[c].set(jnp.where(learn, new, p0)))


class Reference:
    """Literal, in numpy float32: with the server's artifact charges when the simulation
    gives them (`sim.detail`, as a literal slora does), else the fallback, step by step."""

    def __init__(self, settings, sim):
        f = np.float32
        self.settings, self.sim = settings, sim
        self.lift, self.predict = settings.option("lift"), settings.option("predict")
        self.w_q, self.q = f(float(settings.w_q)), f(1 / sim.cost_unit)
        self.qd = int(1 / sim.cost_unit) * math.lcm(*(w.numerator for w in sim.omega))  # Q * D
        self.w = [f(float(x)) for x in sim.omega]
        self.c = [f(0)] * sim.K
        self.p = [f(0)] * sim.K
        self.settled = False

    def on_arrival(self, n):
        sim = self.sim
        k = sim.reqs[n].client
        if not self.lift or sim.fifo[k]:
            return
        others = [self.c[j] for j in range(sim.K) if j != k and sim.fifo[j]]
        if others:
            self.c[k] = max(self.c[k], min(others))

    def select(self, eligible):
        return min(eligible, key=lambda k: (self.c[k], k)) if eligible else None

    def on_admit(self, n):
        f, sim = np.float32, self.sim
        r = sim.reqs[n]
        pred = {"none": f(0), "exact": f(r.output), "average": self.p[r.client]}.get(self.predict)
        pred = f(sim.estimate(n)) if pred is None else pred
        prefill = f(f(int(sim.prefill_charge(n) / sim.cost_unit)) / self.q)
        self.c[r.client] = f(self.c[r.client] + f(f(prefill + f(self.w_q * pred)) / self.w[r.client]))
        return pred

    def on_step_end(self, elapsed):
        f, sim = np.float32, self.sim
        detail = getattr(sim, "detail", None)  # a literal slora gives the server's charges (tests/test_slora.py)
        if detail is not None:
            self.settled = True
            for k in range(sim.K):
                self.c[k] = f(f(self.c[k] + f(f(self.w_q * detail["charge"][k]) / self.w[k]))
                              + f(f(self.w_q * detail["settle"][k]) / self.w[k]))
            return
        units = [0] * sim.K
        for n in sim.running:  # decoded this step (generated already counts it)
            r = sim.reqs[n]
            units[r.client] += int((sim.w_q + sim.beta * (r.prompt + sim.generated[n] - 1)) / sim.cost_unit)
        for k in range(sim.K):
            self.c[k] = f(self.c[k] + f(f(f(units[k]) / self.q) / self.w[k]))

    def counters(self):
        return [Fraction(int(np.round(np.float32(c * self.qd)))) / self.qd for c in self.c]

    def on_complete(self, n, pred):
        f, r = np.float32, self.sim.reqs[n]
        k = r.client
        if not self.settled:
            self.c[k] = f(self.c[k] - f(f(self.w_q * pred) / self.w[k]))
        if self.predict == "average":
            p0 = self.p[k]
            self.p[k] = f(r.output) if p0 == 0 else f(f(f(0.8) * p0) + f(f(0.2) * f(r.output)))


def fuzz_options(rng) -> dict:
    return {"lift": rng.random() < 0.7, "predict": rng.choice(PREDICTORS)}


VTC_ARTIFACT = Policy(name="vtc_artifact", summary="the VTC artifact's float32 counter queues (VTC, LCF, weighted, "
                      "oracle, predict): options lift, predict", encode=encode, init=init, select=select,
                      on_arrival=on_arrival, on_admit=on_admit, on_step=on_step, on_complete=on_complete,
                      reference=Reference, reads=("weights", "options", "estimator", "prices"), options=dict(OPTIONS),
                      validate=validate, fuzz_options=fuzz_options, uses_estimator=True, counters=counters)
