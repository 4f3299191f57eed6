"""Scheduler settings: what a user states, and its exact integer encoding.

A `Settings` holds one lane's choices: the ordering policy (a name in the registry,
`vtc_jax.policies`), the KV budget, the prices as exact fractions, weights, and the
orthogonal parts that compose with any policy: admission limits (an RPM limit that delays
as in MODEL.md or rejects at arrival as in the VTC artifact; a per-client KV cap), a cost
estimator (for policies that charge or order before the output is known) and priority
bands (strict priority between bands, the policy inside a band). `encode_settings` turns
a list of them into the traced `Params` pytree the engine steps with, one row per lane,
plus the host-side `Scales` that turn the engine's integers back into tokens.

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

from vtc_jax.core.errors import InputError
from vtc_jax.policies import base as policy_base
from vtc_jax.policies import estimators, registry
from vtc_jax.servers import registry as servers

DEFAULT_RPM_WINDOW = 2000
RPM_MODES = ("delay", "reject")
# Llama-2-7B in fp16: ~13.5 GB of weights read per decode step; KV per token
# 2 (K and V) x 32 layers x 4096 hidden x 2 bytes = 512 KiB.
LLAMA2_7B_WEIGHT_GB = 13.5
LLAMA2_7B_KV_GB_PER_TOKEN = 2 * 32 * 4096 * 2 / 1e9
INT32_MAX = int(np.iinfo(np.int32).max)
MAX_SETTING = INT32_MAX // 2

__all__ = ["InputError", "Settings", "Params", "Scales", "encode_settings", "to_fraction", "INT32_MAX"]


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
        if len(text) > 64:
            raise InputError(f"{name} is too long a number ({len(text)} characters)")
        try:
            return Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise InputError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, (int, Fraction, np.integer)):
        return Fraction(int(value)) if isinstance(value, np.integer) else Fraction(value)
    raise InputError(f"{name} must be a number, got {value!r}")


def positive_int(value, name: str, limit: int = MAX_SETTING) -> int:
    """An integer in [1, limit], from an int or exact integer text."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        frac = to_fraction(value, name)
        if frac.denominator != 1:
            raise InputError(f"{name} must be an integer, got {value!r}")
        value = int(frac)
    if value < 1:
        raise InputError(f"{name} must be >= 1, got {value}")
    if value > limit:
        raise InputError(f"{name} must be at most {limit}, got {value}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class Settings:
    """One lane's scheduler settings, as a user states them (host side, exact).

    Attributes:
      policy: a registered policy name (`vtc_jax.policies.names()`); "rpm" is FCFS with a
        required RPM limit (MODEL.md's rpm policy); weighted VTC is "vtc" + weights.
      kv_budget: M, KV tokens the running batch may reach at admission.
      w_p, w_q, beta: prefill, decode and per-context-token decode costs (exact).
      w_time: the cost of one us of GPU time (exact; --cost time): each step charges each
        client its share of the step's time (servers' Work.time: step_time.slot_shares) on a
        server that keeps them (the `time_shares` option of a timed vllm server).
      weights: per-client weights omega_k > 0, or None for all ones.
      rpm_limit: R admissions (delay) or accepted arrivals (reject) per client per window,
        with any policy; None: no limit.
      rpm_window: window length in steps.
      lift_last_left: MODEL.md's `last_left` clause of the lift (False: the artifact's
        variant, which keeps a returning client's counter when nobody is backlogged).
      share_window: (start, end) steps of the window whose per-client service share is
        measured (W(end-1) - W(start-1)); (0, 0): none.
      kv_cap: per-client KV cap in tokens (one int for all clients, or one per client), or
        None: a client is eligible only while the KV its running requests can reach (prompt
        + output, reserved at admission) plus its head's stays within its cap.
      charge_cached: charge w_p for every *sent* prompt token, cached ones included (the
        VTC paper's accounting), instead of MODEL.md's computed tokens (prompt - cached).
      resource: (weight GB read per decode step, KV GB per context token) of the resource
        model used for the resource-service measures (default: Llama-2-7B fp16).
      rpm_mode: "delay" (MODEL.md: over-limit requests wait, windows [j*W, (j+1)*W) of
        admissions) or "reject" (the VTC artifact: an arrival is rejected when its client
        had R requests accepted within the last W steps, inclusive; rejected requests never
        join and are counted).
      estimator, estimate_guess, estimate_error, estimate_seed: the cost estimator of
        policies that predict outputs (estimators.py): "exact", "fixed" (guess),
        "average", "noisy" (uniform relative error up to estimate_error, hashed from
        estimate_seed and the request's number).
      bands: a priority band per client (0 is served first: strict priority between bands,
        the policy inside the best band with an eligible client), or None.
      options: policy-specific options as ((name, value), ...), validated by the policy.
      server_options: the server's settings as ((name, value), ...) (for example vLLM's
        num_gpu_blocks), validated by the server the run uses (servers/registry.py).
    """

    policy: str = "vtc"
    kv_budget: int = 8192
    w_p: Fraction = Fraction(1)
    w_q: Fraction = Fraction(2)
    beta: Fraction = Fraction(0)
    w_time: Fraction = Fraction(0)
    weights: tuple[Fraction, ...] | None = None
    rpm_limit: int | None = None
    rpm_window: int = DEFAULT_RPM_WINDOW
    lift_last_left: bool = True
    share_window: tuple[int, int] = (0, 0)
    kv_cap: int | tuple[int, ...] | None = None
    charge_cached: bool = False
    resource: tuple[float, float] = (LLAMA2_7B_WEIGHT_GB, LLAMA2_7B_KV_GB_PER_TOKEN)
    rpm_mode: str = "delay"
    estimator: str = "exact"
    estimate_guess: int = 128
    estimate_error: Fraction = Fraction(0)
    estimate_seed: int = 0
    bands: tuple[int, ...] | None = None
    options: tuple = ()
    server_options: tuple = ()

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        policy = registry.get(self.policy)  # raises InputError naming the choices
        set_("kv_budget", positive_int(self.kv_budget, "kv_budget (M)"))
        for name in COST_NAMES:
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
        if policy.name == "rpm" and self.rpm_limit is None:
            raise InputError("policy rpm needs an rpm limit (--rpm R)")
        if self.rpm_limit is not None:
            set_("rpm_limit", positive_int(self.rpm_limit, "rpm limit"))
        set_("rpm_window", positive_int(self.rpm_window, "rpm window"))
        if self.rpm_mode not in RPM_MODES:
            raise InputError(f"rpm mode must be one of {', '.join(RPM_MODES)}, got {self.rpm_mode!r}")
        if self.rpm_mode == "reject" and self.rpm_limit is None:
            raise InputError("rpm mode 'reject' needs an rpm limit")
        start, end = (int(x) for x in self.share_window)
        if not 0 <= start <= end or end > MAX_SETTING:
            raise InputError(f"share window must be 0 <= start <= end, got {self.share_window}")
        set_("share_window", (start, end))
        if self.kv_cap is not None:
            if isinstance(self.kv_cap, (tuple, list)):
                set_("kv_cap", tuple(positive_int(c, "kv cap") for c in self.kv_cap))
            else:
                set_("kv_cap", positive_int(self.kv_cap, "kv cap"))
        weight_gb, kv_gb = (float(x) for x in self.resource)
        if not (math.isfinite(weight_gb) and math.isfinite(kv_gb) and weight_gb >= 0 and kv_gb >= 0):
            raise InputError(f"resource model must be two finite non-negative numbers, got {self.resource}")
        set_("resource", (weight_gb, kv_gb))
        if self.estimator not in estimators.ESTIMATORS:
            raise InputError(f"unknown estimator {self.estimator!r}; choose one of {', '.join(estimators.ESTIMATORS)}")
        set_("estimate_guess", positive_int(self.estimate_guess, "estimate guess", 1 << 22))
        error = to_fraction(self.estimate_error, "estimate error")
        if not 0 <= error < 1:
            raise InputError(f"estimate error must be in [0, 1), got {error}")
        set_("estimate_error", error)
        if isinstance(self.estimate_seed, bool) or not isinstance(self.estimate_seed, (int, np.integer)) \
                or not 0 <= self.estimate_seed <= 0xFFFFFFFF:
            raise InputError(f"estimate seed must be an integer in [0, 2^32), got {self.estimate_seed!r}")
        if self.bands is not None:
            bands = tuple(int(b) for b in self.bands)
            if any(b < 0 or b > 1 << 20 for b in bands):
                raise InputError(f"priority bands must be integers in [0, 2^20], got {self.bands}")
            set_("bands", bands)
        options = dict(self.options)
        unknown = sorted(set(options) - set(policy.options))
        if unknown:
            known = ", ".join(sorted(policy.options)) or "none"
            raise InputError(f"policy {policy.name} has no option {unknown[0]!r} (its options: {known})")
        set_("options", tuple(sorted(options.items())))
        set_("server_options", tuple(sorted(dict(self.server_options).items())))
        if policy.validate is not None:
            policy.validate(self)

    def option(self, name: str):
        """A policy option's value (its default when not given)."""
        return dict(self.options).get(name, registry.get(self.policy).options[name])

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

    def client_bands(self, num_clients: int) -> tuple[int, ...]:
        if self.bands is None:
            return (0,) * num_clients
        if len(self.bands) != num_clients:
            raise InputError(f"{len(self.bands)} priority bands given for {num_clients} clients")
        return self.bands

    @property
    def rpm_delays(self) -> bool:
        """An RPM limit that delays admissions (MODEL.md) is set."""
        return self.rpm_limit is not None and self.rpm_mode == "delay"

    @property
    def rpm_rejects(self) -> bool:
        """An RPM limit that rejects arrivals (the artifact's sliding window) is set."""
        return self.rpm_limit is not None and self.rpm_mode == "reject"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    """Traced per-lane settings (a batch adds a leading lane axis to every field).

    Attributes:
      kv_budget: int32[]  M.
      costs: policy_base.Costs  the exact prices (int32 units) and counter multipliers.
      policy_id: int32[]  index of the lane's policy in the engine config's policy tuple.
      policy: dict  {policy name: its params} for every policy in the batch.
      rpm_limit: int32[]  admissions per client per window (INT32_MAX: none; delay mode).
      rpm_window: int32[]  window length in steps.
      kv_cap: int32[K]  per-client reserved-KV cap (INT32_MAX: none).
      band: int32[K]  priority band per client (0 first).
      estimator: estimators.EstimatorParams.
      share_window: int32[2]  (start, end) of the service-share window.
      resource: float32[2]  (weight GB per decode step, KV GB per context token).
      server: dict  the server's traced settings (its `encode`; the ideal server: none).
    """

    kv_budget: jax.Array
    costs: policy_base.Costs
    policy_id: jax.Array
    policy: dict
    rpm_limit: jax.Array
    rpm_window: jax.Array
    kv_cap: jax.Array
    band: jax.Array
    estimator: estimators.EstimatorParams
    share_window: jax.Array
    resource: jax.Array
    server: dict


@dataclasses.dataclass(frozen=True)
class Scales:
    """Host-side unit of each lane: service integers / cost_scale = tokens;
    counter integers / (cost_scale * counter_scale) = counter in tokens / weight."""

    cost_scale: np.ndarray  # object[B] of ints
    counter_scale: np.ndarray  # object[B] of ints


def check_time_charges(settings: Settings, server: str) -> None:
    """InputError where a lane charges GPU time (w_time > 0: --cost time) on a server that
    keeps no time shares (a timed vllm server with the `time_shares` option)."""
    options = dict(settings.server_options)
    if settings.w_time and not (servers.takes_step_time(server) and servers.keeps_time(server, options)
                                and options.get("time_shares")):
        raise InputError(f"--cost time needs a timed vllm server keeping time shares (--server vllm with --preset, "
                         f"--step-time or --roofline), not --server {server}"
                         + (" without a step-time model" if servers.takes_step_time(server) else ""))


COST_NAMES = ("w_p", "w_q", "beta", "w_time")  # Settings' prices, in Costs' order


def lcm(values) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def lane_scales(s: Settings, num_clients: int) -> tuple[int, int, list[int], list[int]]:
    """(Q, D, counter_mult per client, [w_p, w_q, beta, w_time] in cost units) of one lane."""
    costs = tuple(getattr(s, name) for name in COST_NAMES)
    q = lcm(c.denominator for c in costs)
    weights = s.client_weights(num_clients)
    d = lcm(w.numerator for w in weights)
    mult = [d * w.denominator // w.numerator for w in weights]
    scaled = [int(c * q) for c in costs]
    for name, value in zip(COST_NAMES, scaled):
        if value > INT32_MAX:
            raise InputError(f"{name} needs {value} integer units per token; limit {INT32_MAX}")
    if max(mult) > INT32_MAX:
        raise InputError(f"weights span too wide a range for exact int32 counters ({max(mult)} units)")
    return q, d, mult, scaled


def policy_names(settings: Sequence[Settings]) -> tuple[str, ...]:
    """The policies present in a batch, in registry order (the engine's static set)."""
    present = {s.policy for s in settings}
    return tuple(n for n in registry.names() if n in present)


def limit_flags(settings: Sequence[Settings]) -> dict[str, bool]:
    """Which optional limits any lane of `settings` has: the EngineConfig flags `rpm`
    (an rpm delay), `kv_cap` and `bands` (a config traces each only when needed)."""
    return dict(rpm=any(s.rpm_delays for s in settings), kv_cap=any(s.kv_cap is not None for s in settings),
                bands=any(s.bands is not None for s in settings))


def encode_settings(settings: Sequence[Settings], num_clients: int,
                    policies: Sequence[str] | None = None, server: str = servers.DEFAULT_SERVER) -> tuple[Params, Scales]:
    """Encode lanes' settings as a batched `Params` (leading axis B = len(settings)).

    `policies` is the engine's static policy set (default: those present); every policy
    in it gets params in every lane (its defaults where the lane runs another policy).
    `server` names the server every lane runs, which encodes its `server_options`.
    """
    encode_server = servers.get(server).encode
    if len(settings) == 0:
        raise InputError("no settings given (need at least one lane)")
    policies = tuple(policies) if policies is not None else policy_names(settings)
    missing = {s.policy for s in settings} - set(policies)
    if missing:
        raise InputError(f"policy {sorted(missing)[0]} is not in the engine's policy set {policies}")
    # Sweeps repeat one setting over thousands of seeds: encode each distinct one once.
    distinct = list(dict.fromkeys(settings))
    where = {s: i for i, s in enumerate(distinct)}
    take = np.asarray([where[s] for s in settings], np.int64)
    rows, cost_scales, counter_scales = [], [], []
    for s in distinct:
        q, d, mult, scaled = lane_scales(s, num_clients)
        ctx = policy_base.EncodeContext(num_clients=num_clients, cost_scale=q, weights=s.client_weights(num_clients),
                                        counter_mult=tuple(mult), counter_scale=d)
        per_policy = {name: registry.get(name).encode(s if s.policy == name else None, ctx) for name in policies}
        rows.append(dict(
            kv_budget=np.int32(s.kv_budget),
            costs=policy_base.Costs(prefill=np.int32(scaled[0]), decode=np.int32(scaled[1]),
                                    context=np.int32(scaled[2]), time=np.int32(scaled[3]),
                                    counter_mult=policy_base.i32(mult),
                                    charge_cached=np.bool_(s.charge_cached)),
            policy_id=np.int32(policies.index(s.policy)), policy=per_policy,
            rpm_limit=np.int32(s.rpm_limit if s.rpm_delays else INT32_MAX), rpm_window=np.int32(s.rpm_window),
            kv_cap=policy_base.i32(s.client_caps(num_clients)), band=policy_base.i32(s.client_bands(num_clients)),
            estimator=estimators.EstimatorParams(**estimators.encode(s.estimator, s.estimate_guess,
                                                                     s.estimate_error, s.estimate_seed)),
            share_window=policy_base.i32(s.share_window), resource=np.asarray(s.resource, np.float32),
            server=encode_server(dict(s.server_options))))
        cost_scales.append(q)
        counter_scales.append(d)
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)[take]), *rows)
    params = Params(**stacked)
    scales = Scales(cost_scale=np.asarray(cost_scales, dtype=object)[take],
                    counter_scale=np.asarray(counter_scales, dtype=object)[take])
    return params, scales
