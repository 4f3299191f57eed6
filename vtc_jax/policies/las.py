"""`las`: llm-d's program-aware least attained service (the fairness plugin's LAS
strategy, pkg/epp/framework/plugins/flowcontrol/fairness/program-aware/strategy_las.go).

Rule, per client ("program"):
  * attained service X, charged when a request completes with w_p * prompt + w_q * output
    (llm-d: 1 * prompt + 2 * completion tokens, cached prompt tokens included), decayed
    exponentially with half-life H steps (option half_life; 0: no decay): at the end of
    every step X is multiplied by d = 2^(-1/H) (d^n over an idle jump of n steps, by
    repeated squaring). A completion at the end of step t is therefore read at step t' with
    weight d^(t' - 1 - t). Weights divide it (X / weight; llm-d has none).
  * a pick scores the eligible clients with
        score = w_s * (1 - norm(X / weight)) + w_w * norm(head wait)
    (options service_weight 0.8, wait_weight 0.2), head wait = t - the head's arrival,
    norm = min-max over the eligible clients (0.5 when max == min, as llm-d), and picks the
    highest (ties: smallest index; llm-d's are random map order).
  * forgetting, at a step's end, with TTL = option idle_ttl steps (llm-d: 3600 s):
      forget="llmd" (default, llm-d's evictIdle in plugin.go): a client with nothing
        running and no completion for more than TTL steps is reset to X = 0, even while
        its requests wait (arrivals do not touch the clock);
      forget="idle" (our former rule): only a client with nothing running or waiting and
        no arrival or completion for more than TTL steps is reset.
Float32 throughout, written so that no multiply is ever followed by an add in the same
expression (XLA fuses those into FMAs): the score is computed as (1 - nS) + nW / r with
r = w_s / w_w (the same order), and charges of a step's completions wait in `pending`
until the next step's end, where X <- (X + pending) * d. A numpy float32 reference with the
same operations agrees bit for bit.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients
from vtc_jax.core.errors import InputError
from vtc_jax.policies.base import Choice, Policy, flush_subnormal, head_arrivals, power, reference_power

F32, I32 = jnp.float32, jnp.int32
FORGET = ("llmd", "idle")
OPTIONS = {"half_life": 2000, "service_weight": 0.8, "wait_weight": 0.2, "idle_ttl": 120_000, "forget": "llmd"}


def validate(settings) -> None:
    h, ws, ww, ttl = (settings.option(n) for n in ("half_life", "service_weight", "wait_weight", "idle_ttl"))
    if settings.option("forget") not in FORGET:
        raise InputError(f"las option forget must be one of {', '.join(FORGET)}, got {settings.option('forget')!r}")
    if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= 1 << 30:
        raise InputError(f"las option half_life must be an integer number of steps >= 0, got {h!r}")
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= 1 << 30:
        raise InputError(f"las option idle_ttl must be an integer number of steps >= 1, got {ttl!r}")
    for name, w in (("service_weight", ws), ("wait_weight", ww)):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise InputError(f"las option {name} must be a finite number >= 0, got {w!r}")
    if ws <= 0:
        raise InputError("las option service_weight must be > 0")


def _option(settings, name):
    return OPTIONS[name] if settings is None else settings.option(name)


def encode(settings, ctx) -> dict:
    h = _option(settings, "half_life")
    ratio = _option(settings, "service_weight") / _option(settings, "wait_weight") \
        if _option(settings, "wait_weight") > 0 else math.inf
    return {"decay": np.float32(2.0 ** (-1.0 / h) if h else 1.0), "ratio": np.float32(ratio),
            "weight": np.asarray([float(w) for w in ctx.weights], np.float32),
            "ttl": np.int32(_option(settings, "idle_ttl")), "forget_idle": np.bool_(_option(settings, "forget") == "idle")}


def init(params, shape):
    """attained, pending: float32[K]; last_event: [K] of the clock's dtype (shape.clock) the
    last step that restarted a client's TTL clock (a completion; with forget="idle" also an
    arrival)."""
    k = shape.num_clients
    return {"attained": jnp.zeros(k, F32), "pending": jnp.zeros(k, F32), "last_event": jnp.zeros(k, shape.clock)}


def _normalize(x, eligible):
    lo = jnp.where(eligible, x, jnp.inf).min()
    hi = jnp.where(eligible, x, -jnp.inf).max()
    return jnp.where(hi > lo, (x - lo) / jnp.where(hi > lo, hi - lo, 1.0), 0.5)


def select(state, view, eligible, params) -> Choice:
    service = (state["attained"] + state["pending"]) / params["weight"]
    wait = (view.step - head_arrivals(view)).astype(F32)
    score = (1.0 - _normalize(service, eligible)) + _normalize(wait, eligible) / params["ratio"]
    client = jnp.argmax(jnp.where(eligible, score, -jnp.inf)).astype(I32)
    return Choice(client, over_clients.any_of(eligible), state)


def on_arrival(state, view, arrivals, params):
    joined = (arrivals.joining > 0) & params["forget_idle"]  # llm-d's clock counts completions only
    return dict(state, last_event=jnp.where(joined, view.step, state["last_event"])), view.counter


def on_step(state, view, step_end, params):
    decayed = (state["attained"] + state["pending"]) * power(params["decay"], step_end.elapsed)
    t = view.step + step_end.elapsed - 1  # the last step that ended
    quiet = (view.running == 0) & (~view.backlogged | ~params["forget_idle"])
    idle = quiet & (t - state["last_event"] > params["ttl"])
    return dict(state, attained=jnp.where(idle, 0.0, decayed), pending=jnp.zeros_like(state["pending"]))


def on_complete(state, view, completion, params):
    k = state["pending"].shape[0]
    charge = (view.costs.prefill * completion.prompt + view.costs.decode * completion.output).astype(F32)
    mine = jnp.arange(k) == completion.client
    return dict(state, pending=jnp.where(mine, state["pending"] + charge, state["pending"]),
                last_event=jnp.where(mine, view.step - 1, state["last_event"]))


class Reference:
    """Literal numpy-float32 LAS with the same operations in the same order."""

    def __init__(self, settings, sim):
        self.settings, self.sim = settings, sim
        p = encode(settings, type("Ctx", (), {"weights": sim.omega})())
        self.decay, self.ratio, self.weight, self.ttl = p["decay"], p["ratio"], p["weight"], int(p["ttl"])
        self.forget_idle = bool(p["forget_idle"])
        k = sim.K
        self.attained = [np.float32(0)] * k
        self.pending = [np.float32(0)] * k
        self.last_event = [0] * k

    @staticmethod
    def _normalize(values):
        lo, hi = min(values), max(values)
        if hi > lo:
            return [np.float32((v - lo) / np.float32(hi - lo)) for v in values]
        return [np.float32(0.5)] * len(values)

    def select(self, eligible):
        if not eligible:
            return None
        sim = self.sim
        service = [np.float32(np.float32(self.attained[k] + self.pending[k]) / self.weight[k]) for k in eligible]
        wait = [np.float32(sim.t - sim.reqs[sim.fifo[k][0]].arrival) for k in eligible]
        ns, nw = self._normalize(service), self._normalize(wait)
        scores = [np.float32(np.float32(1.0 - a) + np.float32(b / self.ratio)) for a, b in zip(ns, nw)]
        best = max(scores)
        return eligible[scores.index(best)]  # the first (smallest k) of the best

    def on_arrival(self, n):
        if self.forget_idle:
            self.last_event[self.sim.reqs[n].client] = self.sim.t

    def on_step_end(self, elapsed):
        sim, factor = self.sim, reference_power(self.decay, elapsed)
        last = sim.t + elapsed - 1
        for k in range(sim.K):
            decayed = flush_subnormal(np.float32(self.attained[k] + self.pending[k]) * factor)
            running = any(sim.reqs[n].client == k for n in sim.running)
            quiet = not running and (not sim.fifo[k] or not self.forget_idle)
            idle = quiet and last - self.last_event[k] > self.ttl
            self.attained[k] = np.float32(0) if idle else decayed
            self.pending[k] = np.float32(0)

    def on_complete(self, n, value):
        sim, r = self.sim, self.sim.reqs[n]
        charge = np.float32(sim.prefill_units * r.prompt + sim.decode_units * r.output)
        self.pending[r.client] = np.float32(self.pending[r.client] + charge)
        self.last_event[r.client] = sim.t


def fuzz_options(rng) -> dict:
    return {"half_life": rng.choice([0, 1, 3, 20, 2000]), "service_weight": rng.choice([0.8, 1.0, 0.5]),
            "wait_weight": rng.choice([0.2, 0.0, 1.5]), "idle_ttl": rng.choice([1, 5, 120_000]),
            "forget": rng.choice(FORGET)}


LAS = Policy(name="las", summary="least attained service (llm-d): decayed completed service and head wait, min-max scored",
             encode=encode, init=init, select=select, on_arrival=on_arrival, on_step=on_step, on_complete=on_complete,
             reference=Reference, reads=("weights", "options", "prices"), options=dict(OPTIONS), validate=validate,
             fuzz_options=fuzz_options)
