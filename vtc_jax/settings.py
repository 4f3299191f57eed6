"""Scheduler settings: the user-facing description and its exact integer encoding.

A `Settings` holds what a user types (policy name, KV budget, cost weights as exact
fractions). `encode_settings` turns a list of them into the traced `Params` pytree that the
engine steps with, one row per lane, plus the host-side `Scales` needed to turn the
engine's integers back into tokens.

Exactness. Every cost (w_p, w_q, beta) is an exact fraction (decimal text such as "0.1"
is read as 1/10). Per lane, all costs are multiplied by a common cost scale Q (the least
common multiple of their denominators), so every charge is an integer number of 1/Q
tokens. Counters are kept in units of 1/(Q*D), where D is the least common multiple of
the weights' numerators: a charge x to client k adds x*Q*(D/omega_k) to the counter, an
integer. Admission decisions therefore compare exact integers, and service W_k = (integer)
/ Q is reported with one correctly rounded float64 division.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

POLICIES = ("fcfs", "lcf", "vtc", "rpm")
DEFAULT_RPM_WINDOW = 2000
# Llama-2-7B in fp16: ~13.5 GB of weights read per decode step; KV per token
# 2 (K and V) x 32 layers x 4096 hidden x 2 bytes = 512 KiB.
LLAMA2_7B_WEIGHT_GB = 13.5
LLAMA2_7B_KV_GB_PER_TOKEN = 2 * 32 * 4096 * 2 / 1e9
INT32_MAX = int(np.iinfo(np.int32).max)


class InputError(ValueError):
    """Bad user input: the message names the problem; CLIs print it and exit 2."""


def to_fraction(value, name: str) -> Fraction:
    """Exact rational from an int, Fraction, decimal string or float (via its repr)."""
    if isinstance(value, bool):
        raise InputError(f"{name} must be a number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"{name} must be finite, got {value!r}")
        value = repr(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("nan", "inf", "+inf", "-inf", "infinity", "-infinity", "+infinity"):
            raise InputError(f"{name} must be finite, got {value!r}")
        try:
            return Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise InputError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, (int, Fraction, np.integer)):
        return Fraction(int(value)) if isinstance(value, np.integer) else Fraction(value)
    raise InputError(f"{name} must be a number, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Settings:
    """One lane's scheduler settings, as a user states them (host side, exact).

    Attributes:
      policy: "fcfs", "lcf", "vtc" or "rpm" (MODEL.md); weighted VTC is "vtc" + weights.
      kv_budget: M, KV tokens the running batch may reach at admission.
      w_p, w_q, beta: prefill, decode and per-context-token decode costs (exact).
      weights: per-client weights omega_k > 0, or None for all ones.
      rpm_limit: R for policy "rpm" (admissions per client per window); None otherwise.
      rpm_window: window length in steps for "rpm".
      lift_last_left: MODEL.md's `last_left` clause of the lift (False: the artifact's
        variant, which keeps a returning client's counter when nobody is backlogged).
      share_window: (start, end) steps of the window whose per-client service share is
        measured (W(end-1) - W(start-1)); (0, 0): none.
      kv_cap: per-client KV cap in tokens (one int for all clients, or one per client), or
        None. A client is eligible for admission only while the KV its running requests can
        reach (sum of prompt + output, reserved at admission) plus the candidate's stays
        within its cap, so the cap is never exceeded at any step. An extension beyond
        MODEL.md (issue 5); None is the contract.
      charge_cached: charge w_p for every *sent* prompt token, cached ones included (the
        VTC paper's accounting), instead of MODEL.md's computed tokens (prompt - cached).
      resource: (weight GB read per decode step, KV GB per context token) of the resource
        model used for the resource-service measures (default: Llama-2-7B fp16).
    """

    policy: str = "vtc"
    kv_budget: int = 8192
    w_p: Fraction = Fraction(1)
    w_q: Fraction = Fraction(2)
    beta: Fraction = Fraction(0)
    weights: tuple[Fraction, ...] | None = None
    rpm_limit: int | None = None
    rpm_window: int = DEFAULT_RPM_WINDOW
    lift_last_left: bool = True
    share_window: tuple[int, int] = (0, 0)
    kv_cap: int | tuple[int, ...] | None = None
    charge_cached: bool = False
    resource: tuple[float, float] = (LLAMA2_7B_WEIGHT_GB, LLAMA2_7B_KV_GB_PER_TOKEN)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        if self.policy not in POLICIES:
            raise InputError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        set_("kv_budget", _positive_int(self.kv_budget, "kv_budget (M)"))
        for name in ("w_p", "w_q", "beta"):
            frac = to_fraction(getattr(self, name), name)
            if frac < 0:
                raise InputError(f"{name} must be >= 0, got {frac}")
            set_(name, frac)
        if self.weights is not None:
            weights = tuple(to_fraction(w, f"weight {i}") for i, w in enumerate(self.weights))
            for i, w in enumerate(weights):
                if w <= 0:
                    raise InputError(f"weight {i} must be > 0, got {w}")
            set_("weights", weights)
        if self.policy == "rpm":
            if self.rpm_limit is None:
                raise InputError("policy rpm needs an rpm limit (--rpm R)")
            set_("rpm_limit", _positive_int(self.rpm_limit, "rpm limit"))
        elif self.rpm_limit is not None:
            raise InputError(f"an rpm limit was given but the policy is {self.policy!r}, not rpm")
        set_("rpm_window", _positive_int(self.rpm_window, "rpm window"))
        start, end = (int(x) for x in self.share_window)
        if not 0 <= start <= end or end > INT32_MAX // 2:
            raise InputError(f"share window must be 0 <= start <= end, got {self.share_window}")
        set_("share_window", (start, end))
        if self.kv_cap is not None:
            caps = self.kv_cap if isinstance(self.kv_cap, (tuple, list)) else (self.kv_cap,)
            set_("kv_cap", tuple(_positive_int(c, "kv cap") for c in caps) if isinstance(self.kv_cap, (tuple, list))
                 else _positive_int(self.kv_cap, "kv cap"))
        weight_gb, kv_gb = (float(x) for x in self.resource)
        if not (math.isfinite(weight_gb) and math.isfinite(kv_gb) and weight_gb >= 0 and kv_gb >= 0):
            raise InputError(f"resource model must be two finite non-negative numbers, got {self.resource}")
        set_("resource", (weight_gb, kv_gb))

    def client_caps(self, num_clients: int) -> tuple[int, ...]:
        if self.kv_cap is None:
            return (INT32_MAX,) * num_clients
        if isinstance(self.kv_cap, int):
            return (self.kv_cap,) * num_clients
        if len(self.kv_cap) != num_clients:
            raise InputError(f"{len(self.kv_cap)} kv caps given for {num_clients} clients")
        return self.kv_cap

    def client_weights(self, num_clients: int) -> tuple[Fraction, ...]:
        if self.weights is None:
            return (Fraction(1),) * num_clients
        if len(self.weights) != num_clients:
            raise InputError(f"{len(self.weights)} weights given for {num_clients} clients")
        return self.weights


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        frac = to_fraction(value, name)
        if frac.denominator != 1:
            raise InputError(f"{name} must be an integer, got {value!r}")
        value = int(frac)
    if value < 1:
        raise InputError(f"{name} must be >= 1, got {value}")
    if value > INT32_MAX // 2:
        raise InputError(f"{name} must be below {INT32_MAX // 2}, got {value}")
    return int(value)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    """Traced per-lane settings, all integers (see module docstring for the units).

    Shapes are for one lane; a batch adds a leading lane axis to every field.

    Attributes:
      kv_budget: int32[]  M.
      prefill_cost: int32[]  w_p * Q.
      decode_cost: int32[]  w_q * Q.
      context_cost: int32[]  beta * Q.
      counter_mult: int32[K]  D / omega_k: counter units per 1/Q token charged.
      by_counter: bool[]  candidate = least counter (lcf, vtc) instead of oldest (fcfs, rpm).
      lift: bool[]  apply the lift rule on arrival (vtc).
      lift_last_left: bool[]  include the `last_left` clause of the lift.
      rpm_limit: int32[]  admissions per client per window (INT32_MAX: unlimited).
      rpm_window: int32[]  window length in steps.
      share_window: int32[2]  (start, end) of the service-share window.
      kv_cap: int32[K]  per-client reserved-KV cap (INT32_MAX: none).
      charge_cached: bool[]  prefill charges sent (True) or computed (False) tokens.
      resource: float32[2]  (weight GB per decode step, KV GB per context token).
    """

    kv_budget: jax.Array
    prefill_cost: jax.Array
    decode_cost: jax.Array
    context_cost: jax.Array
    counter_mult: jax.Array
    by_counter: jax.Array
    lift: jax.Array
    lift_last_left: jax.Array
    rpm_limit: jax.Array
    rpm_window: jax.Array
    share_window: jax.Array
    kv_cap: jax.Array
    charge_cached: jax.Array
    resource: jax.Array


@dataclasses.dataclass(frozen=True)
class Scales:
    """Host-side unit of each lane: service integers / cost_scale = tokens;
    counter integers / (cost_scale * counter_scale) = counter in tokens / weight."""

    cost_scale: np.ndarray  # int64[B]
    counter_scale: np.ndarray  # int64[B]


def _lcm(values) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def encode_settings(settings: Sequence[Settings], num_clients: int) -> tuple[Params, Scales]:
    """Encode lanes' settings as a batched `Params` (leading axis B = len(settings))."""
    if len(settings) == 0:
        raise InputError("no settings given (need at least one lane)")
    rows, cost_scales, counter_scales = [], [], []
    for s in settings:
        costs = (s.w_p, s.w_q, s.beta)
        q = _lcm(c.denominator for c in costs)
        weights = s.client_weights(num_clients)
        d = _lcm(w.numerator for w in weights)
        mult = [d * w.denominator // w.numerator for w in weights]
        scaled = [int(c * q) for c in costs]
        for name, value in zip(("w_p", "w_q", "beta"), scaled):
            if value > INT32_MAX:
                raise InputError(f"{name} needs {value} integer units per token; limit {INT32_MAX}")
        if max(mult) > INT32_MAX:
            raise InputError(f"weights span too wide a range for exact int32 counters ({max(mult)} units)")
        rows.append((s.kv_budget, *scaled, mult, s.policy in ("lcf", "vtc"), s.policy == "vtc",
                     s.lift_last_left, s.rpm_limit if s.policy == "rpm" else INT32_MAX, s.rpm_window,
                     s.share_window, s.client_caps(num_clients), s.charge_cached, s.resource))
        cost_scales.append(q)
        counter_scales.append(d)
    cols = list(zip(*rows))
    i32 = lambda xs: jnp.asarray(np.asarray(xs, dtype=np.int64).astype(np.int32))  # noqa: E731
    params = Params(
        kv_budget=i32(cols[0]), prefill_cost=i32(cols[1]), decode_cost=i32(cols[2]),
        context_cost=i32(cols[3]), counter_mult=i32(cols[4]),
        by_counter=jnp.asarray(cols[5], dtype=bool), lift=jnp.asarray(cols[6], dtype=bool),
        lift_last_left=jnp.asarray(cols[7], dtype=bool), rpm_limit=i32(cols[8]),
        rpm_window=i32(cols[9]), share_window=i32(cols[10]), kv_cap=i32(cols[11]),
        charge_cached=jnp.asarray(cols[12], dtype=bool), resource=jnp.asarray(cols[13], dtype=jnp.float32))
    scales = Scales(cost_scale=np.asarray(cost_scales, dtype=object),
                    counter_scale=np.asarray(counter_scales, dtype=object))
    return params, scales
