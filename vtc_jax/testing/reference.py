"""Slow, literal, exact reference implementation of the serving model.

This module follows the project's model (docs/MODEL.md, the contract) phase by phase,
with plain Python lists and :class:`fractions.Fraction` for every cost and counter, so that
its results are exact. It exists to check the fast JAX engine step by step; clarity and
literalness beat speed. The scheduling policy comes from the registry
(`vtc_jax.policies`): each policy ships a literal `reference` class next to its JAX
hooks, and this simulator drives it, so every registered policy (a user's own included)
is checked against its own reference. The parts that compose with any policy (the rpm
limit in both modes, per-client KV caps, priority bands and the cost estimators) are
written out here. Random lanes and the lane-by-lane comparison with the engine live
beside it (lanes.py; `vtc_jax.testing.check_policy` runs both in one call).

A reference policy object is built per run as ``cls(settings, sim)`` and may define:

* ``on_arrival(n)``: request n (trace order) is about to join its FIFO (phase 1);
* ``select(eligible) -> client | None``: the candidate's client among `eligible`
  (ascending client ids); it must not change the policy's state;
* ``on_admit(n) -> value``: n was admitted (after the engine's charges); `value` is
  handed back at its completion (default: the estimator's prediction);
* ``on_step_end(elapsed)``: after phase 3 (decode) of a step; `elapsed` is 1, or the
  length of the idle stretch that starts with this step (the engine jumps over steps in
  which nothing runs or waits; hooks are not called inside such a stretch);
* ``on_complete(n, value)``: phase 4, for each completing request, last admitted first;
* ``counters() -> list | None``: the policy's own virtual counters, if any.

`sim` exposes: t, K, reqs, fifo (lists of request numbers), c (MODEL.md counters, which
a policy may lift), W, last_left, omega (weights), w_p, w_q, beta, running (request
numbers, admission order), generated, cost_unit (1 / Q tokens), prefill_units and
decode_units (w_p * Q and w_q * Q), estimate(n) and prefill_charge(n).

Choices where the model is silent are those of docs/MODEL.md: ``steps=None`` runs until
every (accepted) request has completed (T = last completion step + 1); a request with
``prompt > M`` is refused; ties go to the smallest client id.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from fractions import Fraction

from vtc_jax.engines.settings import Settings
from vtc_jax.policies import registry
from vtc_jax.policies.estimators import reference_estimate

POLICIES = registry.names()


@dataclass(frozen=True)
class Request:
    """One request of a trace (see the model, Objects)."""

    arrival: int
    client: int
    prompt: int
    output: int
    cached: int = 0


@dataclass
class RefResult:
    """Per-step record of a reference run.

    All per-step lists have length ``steps`` (= T); index ``t`` is "after step t"
    unless stated otherwise. Per-client inner lists have length ``num_clients``.
    """

    steps: int                       # horizon actually run (T)
    service: list[list[Fraction]]    # service[t][k] = W_k after step t
    counters: list[list[Fraction]]   # counters[t][k] = c_k after step t
    backlogged: list[list[bool]]     # FIFO of k non-empty at END of step t
    backlogged_after_arrivals: list[list[bool]]  # ... at end of phase 1 of step t
    occupancy: list[int]             # sum of (prompt + generated) over running, end of step t
    running_count: list[int]         # number of running requests, end of step t
    admit_step: list[int | None]     # per request (trace order): step admitted, or None
    finish_step: list[int | None]    # per request: step it completed (phase 4), or None
    admitted: list[int]              # per client: requests admitted by the end of the run
    completed: list[int]             # per client: requests completed by the end of the run
    decode_charge: list[list[Fraction]]   # decode charge of client k in step t
    prefill_charge: list[list[Fraction]]  # prefill (admission) charge of client k in step t
    held: list[list[int]] = None     # KV tokens held per client after the decode of step t
    rejected: list[int] = None       # per client: requests rejected at arrival (rpm reject)
    policy_counters: list | None = None  # the policy's own counters at the end, if any


def _int(x, name: str) -> int:
    """An exact integer (no bools, no floats)."""
    if isinstance(x, bool):
        raise ValueError(f"{name} must be an integer, got bool")
    try:
        return operator.index(x)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {x!r}") from None


def _validate_requests(requests, num_clients: int, kv_budget: int) -> list[Request]:
    out = []
    for n, r in enumerate(requests):
        arrival, client, prompt, output, cached = (_int(getattr(r, f), f"request {n}: {f}")
                                                   for f in ("arrival", "client", "prompt", "output", "cached"))
        if arrival < 0 or not 0 <= client < num_clients or prompt < 1 or output < 1 or not 0 <= cached < prompt:
            raise ValueError(f"request {n} is invalid: {r}")
        if prompt > kv_budget:
            raise ValueError(f"request {n}: prompt {prompt} > kv_budget {kv_budget}: it can never be admitted")
        out.append(Request(arrival, client, prompt, output, cached))
    return out


class _Sim:
    """The state a reference policy may read (see the module docstring)."""

    def __init__(self, reqs, settings: Settings, K: int):
        self.reqs, self.settings, self.K = reqs, settings, K
        self.t = 0
        self.fifo: list[list[int]] = [[] for _ in range(K)]
        self.running: list[int] = []
        self.generated: dict[int, int] = {}
        self.c = [Fraction(0)] * K
        self.W = [Fraction(0)] * K
        self.last_left: int | None = None
        self.omega = list(settings.client_weights(K))
        self.w_p, self.w_q, self.beta = settings.w_p, settings.w_q, settings.beta
        q = math.lcm(*(x.denominator for x in (self.w_p, self.w_q, self.beta)))
        self.cost_unit = Fraction(1, q)
        self.prefill_units, self.decode_units = int(self.w_p * q), int(self.w_q * q)
        order = sorted(range(len(reqs)), key=lambda n: (reqs[n].arrival, n))
        seen = [0] * K
        self.position = {}  # a request's position among its client's, (arrival, number) order
        for n in order:
            self.position[n] = seen[reqs[n].client]
            seen[reqs[n].client] += 1
        self.average = [0] * K  # the "average" estimator's per-client state
        self.seen = [False] * K

    def prefill_charge(self, n: int) -> Fraction:
        r = self.reqs[n]
        return self.w_p * (r.prompt if self.settings.charge_cached else r.prompt - r.cached)

    def estimate(self, n: int) -> int:
        s, r = self.settings, self.reqs[n]
        return reference_estimate(s.estimator, r.output, r.client, self.position[n], guess=s.estimate_guess,
                                  error=s.estimate_error, seed=s.estimate_seed, average=self.average[r.client])

    def observe(self, n: int) -> None:
        """The 'average' estimator learns a completed request's output."""
        r = self.reqs[n]
        k = r.client
        self.average[k] = (4 * self.average[k] + r.output + 2) // 5 if self.seen[k] else r.output
        self.seen[k] = True


def _call(obj, name, *args, default=None):
    fn = getattr(obj, name, None)
    return default if fn is None else fn(*args)


def simulate(requests: list[Request], *, num_clients: int, kv_budget: int | None = None, policy: str = "vtc",
             w_p=1, w_q=2, beta=0, weights=None, rpm_limit=None, rpm_window=2000, steps: int | None = None,
             lift_last_left: bool = True, kv_cap=None, charge_cached: bool = False,
             settings: Settings | None = None) -> RefResult:
    """Run the serving model literally and record every step.

    Either pass `settings` (any vtc_jax.Settings: every policy, limit, band and estimator)
    or the classic keywords (policy, kv_budget, w_p, w_q, beta, weights, rpm_limit,
    rpm_window, lift_last_left, kv_cap, charge_cached). `steps`: horizon T (runs
    t = 0..T-1), or None to run until every accepted request completed.
    """
    if settings is None:
        if policy == "rpm" or rpm_limit is not None and policy == "fcfs":
            policy = "rpm" if rpm_limit is not None else policy
        settings = Settings(policy=policy, kv_budget=kv_budget, w_p=w_p, w_q=w_q, beta=beta,
                            weights=None if weights is None else tuple(weights),
                            rpm_limit=rpm_limit if policy == "rpm" else None, rpm_window=rpm_window,
                            lift_last_left=lift_last_left,
                            kv_cap=tuple(kv_cap) if isinstance(kv_cap, list) else kv_cap, charge_cached=charge_cached)
    s = settings
    K = _int(num_clients, "num_clients")
    if K < 1:
        raise ValueError(f"num_clients must be >= 1, got {K}")
    M = s.kv_budget
    T_fixed = None if steps is None else _int(steps, "steps")
    reqs = _validate_requests(requests, K, M)
    N = len(reqs)
    sim = _Sim(reqs, s, K)
    pol = registry.get(s.policy).reference(s, sim)
    caps = list(s.client_caps(K))
    bands = list(s.client_bands(K))
    R, window = s.rpm_limit, s.rpm_window

    arrivals_at: dict[int, list[int]] = {}
    for n, r in enumerate(reqs):
        arrivals_at.setdefault(r.arrival, []).append(n)
    arrival_steps = sorted(arrivals_at)

    rpm_counts: dict[tuple[int, int], int] = {}   # delay mode: (window j, client) -> admissions
    # Reject mode: a request is rejected at arrival when its client had R requests accepted
    # within [arrival - window, arrival]; that depends only on the client's own arrivals, so
    # it is decided here, in arrival order (trace order within a step), once for the run.
    rejected_set = set()
    if s.rpm_rejects:
        accepted_times: list[list[int]] = [[] for _ in range(K)]
        for n in sorted(range(N), key=lambda n: (reqs[n].arrival, n)):
            r = reqs[n]
            if T_fixed is not None and r.arrival >= T_fixed:
                continue
            if sum(1 for a in accepted_times[r.client] if a >= r.arrival - window) >= R:
                rejected_set.add(n)
            else:
                accepted_times[r.client].append(r.arrival)
        # A rejected request never reaches the server: estimators number only accepted ones.
        seen = [0] * K
        for n in sorted(range(N), key=lambda n: (reqs[n].arrival, n)):
            if n not in rejected_set:
                sim.position[n] = seen[reqs[n].client]
                seen[reqs[n].client] += 1
    admit_step: list[int | None] = [None] * N
    finish_step: list[int | None] = [None] * N
    admitted, completed, rejected = [0] * K, [0] * K, [0] * K
    value: dict[int, object] = {}
    accepted_total = N - len(rejected_set)
    n_completed = 0
    skip_until = 0  # steps < skip_until are inside an idle stretch (no policy hooks)

    res = RefResult(steps=0, service=[], counters=[], backlogged=[], backlogged_after_arrivals=[], occupancy=[],
                    running_count=[], admit_step=admit_step, finish_step=finish_step, admitted=admitted,
                    completed=completed, decode_charge=[], prefill_charge=[], held=[], rejected=rejected)

    def charge(k: int, x: Fraction, bucket: list[Fraction]) -> None:
        sim.W[k] += x
        sim.c[k] += x / sim.omega[k]
        bucket[k] += x

    def under_cap(k: int) -> bool:
        reserved = sum(reqs[n].prompt + reqs[n].output for n in sim.running if reqs[n].client == k)
        head = reqs[sim.fifo[k][0]]
        return reserved + head.prompt + head.output <= caps[k]

    def eligible_clients(t: int) -> list[int]:
        ok = [k for k in range(K) if sim.fifo[k] and under_cap(k)]
        if s.rpm_delays:
            ok = [k for k in ok if rpm_counts.get((t // window, k), 0) < R]
        if ok and s.bands is not None:
            best = min(bands[k] for k in ok)
            ok = [k for k in ok if bands[k] == best]
        return ok

    def horizon() -> float:
        return T_fixed if T_fixed is not None else math.inf

    t = 0
    while True:
        if T_fixed is not None:
            if t >= T_fixed:
                break
        elif n_completed == accepted_total:
            break
        sim.t = t
        prefill_t = [Fraction(0)] * K
        decode_t = [Fraction(0)] * K

        # ---- phase 1: arrivals -----------------------------------------------------
        for n in arrivals_at.get(t, []):
            k = reqs[n].client
            if n in rejected_set:
                rejected[k] += 1
                continue
            _call(pol, "on_arrival", n)
            sim.fifo[k].append(n)
        res.backlogged_after_arrivals.append([bool(f) for f in sim.fifo])

        # ---- phase 2: admission ----------------------------------------------------
        occupancy = sum(reqs[n].prompt + sim.generated[n] for n in sim.running)
        while True:
            eligible = eligible_clients(t)
            k = pol.select(eligible) if eligible else None
            if k is None:
                break
            assert k in eligible, (k, eligible)
            n = sim.fifo[k][0]
            r = reqs[n]
            if occupancy + r.prompt > M:
                break  # head-of-line: no skipping to another client
            sim.fifo[k].pop(0)
            sim.running.append(n)
            sim.generated[n] = 0
            occupancy += r.prompt
            sim.last_left = k
            charge(k, sim.prefill_charge(n), prefill_t)
            admit_step[n] = t
            admitted[k] += 1
            if s.rpm_delays:
                rpm_counts[(t // window, k)] = rpm_counts.get((t // window, k), 0) + 1
            value[n] = _call(pol, "on_admit", n, default=sim.estimate(n))

        # ---- phase 3: decode -------------------------------------------------------
        ran = bool(sim.running)
        for n in sim.running:
            r = reqs[n]
            charge(r.client, sim.w_q + sim.beta * (r.prompt + sim.generated[n]), decode_t)
            sim.generated[n] += 1
        res.held.append([sum(reqs[n].prompt + sim.generated[n] for n in sim.running if reqs[n].client == k)
                         for k in range(K)])
        if t >= skip_until:
            elapsed = 1
            if not ran and not any(sim.fifo):  # idle: the engine jumps to the next arrival
                later = [a for a in arrival_steps if a > t]
                target = min(later[0] if later else math.inf, horizon())
                if target != math.inf:
                    elapsed = max(1, int(target) - t)
            skip_until = t + elapsed
            _call(pol, "on_step_end", elapsed)

        # ---- phase 4: completion ---------------------------------------------------
        # The step's completions leave together; their hooks (and the "average"
        # estimator) see them last admitted first.
        leaving = [n for n in sim.running if sim.generated[n] == reqs[n].output]
        sim.running = [n for n in sim.running if sim.generated[n] != reqs[n].output]
        for n in reversed(leaving):
            finish_step[n] = t
            completed[reqs[n].client] += 1
            n_completed += 1
            del sim.generated[n]
            _call(pol, "on_complete", n, value.pop(n))
            sim.observe(n)

        # ---- record ----------------------------------------------------------------
        res.service.append(list(sim.W))
        res.counters.append(list(sim.c))
        res.backlogged.append([bool(f) for f in sim.fifo])
        res.occupancy.append(sum(reqs[n].prompt + sim.generated[n] for n in sim.running))
        res.running_count.append(len(sim.running))
        res.decode_charge.append(decode_t)
        res.prefill_charge.append(prefill_t)
        t += 1

    res.steps = t
    res.policy_counters = _call(pol, "counters")
    return res


# ----------------------------------------------------------------------------------
# measures (MODEL.md, Horizon and measures)
# ----------------------------------------------------------------------------------

def throughput(res: RefResult) -> Fraction:
    """sum_k W_k(T-1) / T (0 for T = 0)."""
    if res.steps == 0:
        return Fraction(0)
    return sum(res.service[-1], Fraction(0)) / res.steps


def drift(res: RefResult) -> Fraction:
    """max over t of (max_k W_k(t) - min_k W_k(t)) (0 for T = 0)."""
    return max((max(w) - min(w) for w in res.service), default=Fraction(0))
