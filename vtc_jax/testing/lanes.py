"""Random small lanes, their literal reference runs, and the lane-by-lane comparison with the
JAX engine: what the exactness tests fuzz every registered policy with, and what
`check_policy` runs on one policy (a built-in or a user's own) in one call.

No pytest or hypothesis here (a user may have neither): a difference is an AssertionError
naming the lane, its settings and the first quantity that differs. The draw order of every
builder is fixed: the tests' seeds name their cases, so changing it changes what is tested.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from vtc_jax.driver.run import run_traces
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.workload import Trace
from vtc_jax.policies import registry
from vtc_jax.policies.estimators import ESTIMATORS
from vtc_jax.testing import reference as ref
from vtc_jax.testing.reference import Request


class RandomTrace(NamedTuple):
    requests: list[Request]
    num_clients: int
    kv_budget: int


class Lanes(NamedTuple):
    """A batch of lanes: lane i runs traces[i] under settings[i]; requests[i] is the same
    trace as reference Requests (unpack as ``traces, settings, requests = ...``)."""

    traces: list[Trace]
    settings: list[Settings]
    requests: list[list[Request]]


def to_trace(requests: Sequence[Request]) -> Trace:
    """The engine's Trace of reference Requests (same rows, same order)."""
    return Trace.from_rows([(r.arrival, r.client, r.prompt, r.output, r.cached) for r in requests])


def random_trace(rng: random.Random, *, num_clients: int | None = None,
                 kv_budget: int | None = None, num_requests: int | None = None,
                 max_arrival: int = 40, max_output: int = 12,
                 cached_prob: float = 0.3) -> RandomTrace:
    """A small random, valid trace; unpack as ``reqs, K, M = random_trace(rng)``.

    Args:
      rng: the source of randomness (``random.Random(seed)``), the only one used.
      num_clients: K; default drawn uniformly from 1..5.
      kv_budget: M; default drawn uniformly from 4..64.
      num_requests: number of rows; default drawn uniformly from 0..30.
      max_arrival: arrivals are drawn uniformly from [0, max_arrival).
      max_output: outputs are drawn uniformly from [1, max_output].
      cached_prob: probability that a request with prompt >= 2 gets a cached prefix,
        drawn uniformly from [1, prompt - 1].

    Prompts are drawn from [1, M] (half the time from [1, max(1, M // 4)] so that many
    requests run together). Clients are drawn with skewed probabilities so that some are
    heavy and some rare. The rows are shuffled, so they are deliberately not sorted by
    arrival; some arrivals coincide (same step, several clients).
    """
    K = num_clients if num_clients is not None else rng.randint(1, 5)
    M = kv_budget if kv_budget is not None else rng.randint(4, 64)
    n = num_requests if num_requests is not None else rng.randint(0, 30)
    client_w = [rng.choice((1, 1, 2, 5)) for _ in range(K)]
    reqs = []
    for _ in range(n):
        arrival = rng.randrange(max_arrival)
        client = rng.choices(range(K), weights=client_w)[0]
        if rng.random() < 0.5:
            prompt = rng.randint(1, max(1, M // 4))
        else:
            prompt = rng.randint(1, M)
        output = rng.randint(1, max_output)
        cached = 0
        if prompt >= 2 and rng.random() < cached_prob:
            cached = rng.randint(1, prompt - 1)
        reqs.append(Request(arrival, client, prompt, output, cached))
    rng.shuffle(reqs)
    return RandomTrace(reqs, K, M)


def random_settings(rng: random.Random, policy: str, num_clients: int, kv_budget: int) -> Settings:
    """Random exact settings for a registered policy: fractional costs, weights and beta
    some of the time, and the parts that compose with any policy (an rpm limit that delays
    or rejects, priority bands, a cost estimator, the policy's own options)."""
    weights = None
    if rng.random() < 0.5:
        weights = tuple(Fraction(rng.choice([1, 2, 3, 5, 7]), rng.choice([1, 2, 3, 4])) for _ in range(num_clients))
    spec = registry.get(policy)
    extra = {}
    if policy == "rpm" or rng.random() < 0.15:
        extra.update(rpm_limit=rng.randint(1, 3), rpm_mode=rng.choice(["delay", "delay", "reject"]))
    if rng.random() < 0.15:
        extra["bands"] = tuple(rng.choice([0, 0, 1, 2]) for _ in range(num_clients))
    if spec.uses_estimator:
        extra.update(estimator=rng.choice(ESTIMATORS), estimate_guess=rng.randint(1, 12),
                     estimate_error=rng.choice([0, Fraction(1, 2), Fraction(9, 10)]),
                     estimate_seed=rng.randrange(1 << 32))
    if spec.fuzz_options is not None:
        extra["options"] = tuple(spec.fuzz_options(rng).items())
    if "lift_last_left" in spec.reads:
        extra["lift_last_left"] = rng.random() < 0.8
    return Settings(
        policy=policy, kv_budget=kv_budget,
        w_p=rng.choice([1, 1, Fraction(1, 2), Fraction(3, 2)]), w_q=rng.choice([2, 2, 1, Fraction(5, 4)]),
        beta=rng.choice([0, 0, Fraction(1, 4), Fraction(3, 10), 1]), weights=weights,
        rpm_window=rng.randint(1, 12), **extra)


def policy_lanes(rng: random.Random, requests: list[Request], kv_budget: int, num_clients: int,
                 policies: Sequence[str], into: Lanes) -> Lanes:
    """One trace under each of `policies` in turn (random_settings each), appended to `into`."""
    trace = to_trace(requests)
    for policy in policies:
        into.traces.append(trace)
        into.settings.append(random_settings(rng, policy, num_clients, kv_budget))
        into.requests.append(requests)
    return into


def random_lanes(rng: random.Random, count: int, *, num_clients: int, policies: Sequence[str],
                 every_policy: bool = False, num_requests: tuple[int, int] = (1, 25),
                 adjust: Callable[[random.Random, Settings, list[Request]], Settings] | None = None,
                 **trace_options) -> Lanes:
    """`count` random traces of K = `num_clients` (random_trace with `trace_options`; the
    number of requests drawn first, uniformly from the closed range `num_requests`). Trace
    i runs under policies[i % len(policies)], or under every one of `policies` in turn
    (`every_policy`), with random_settings; `adjust(rng, settings, requests) -> settings`
    edits each lane's settings right after they are drawn."""
    lanes = Lanes([], [], [])
    for i in range(count):
        reqs, k, m = random_trace(rng, num_clients=num_clients, num_requests=rng.randint(*num_requests),
                                  **trace_options)
        names = tuple(policies) if every_policy else (policies[i % len(policies)],)
        first = len(lanes.settings)
        policy_lanes(rng, reqs, m, k, names, lanes)
        if adjust is not None:
            for j in range(first, len(lanes.settings)):
                lanes.settings[j] = adjust(rng, lanes.settings[j], reqs)
    return lanes


def run_reference(requests, num_clients: int, settings: Settings, steps: int | None) -> ref.RefResult:
    """The literal reference's run of one lane (steps=None: until it drains)."""
    return ref.simulate(requests, num_clients=num_clients, settings=settings, steps=steps)


def service_matrix(result: ref.RefResult) -> np.ndarray:
    """float64[T, K] service after every step."""
    return np.asarray([[float(x) for x in row] for row in result.service], dtype=np.float64)


def _differs(context: str, quantity: str, got, want):
    raise AssertionError(f"{context}: {quantity} differs: engine {got}, reference {want}")


def _same_list(context: str, quantity: str, got, want) -> None:
    got = list(got)
    if got == want:
        return
    if len(got) != len(want):
        _differs(context, f"{quantity} (length)", len(got), len(want))
    k = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    _differs(context, f"{quantity} of client {k}", got[k], want[k])


def _same_service(context: str, got, want: np.ndarray) -> None:
    """float[T, K] service after every step, NaNs equal where both are NaN."""
    got = np.asarray(got)
    if got.shape != want.shape:
        _differs(context, "service matrix shape [steps, clients]", got.shape, want.shape)
    wrong = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    if wrong.any():
        t, k = (int(i) for i in np.argwhere(wrong)[0])
        _differs(context, f"service W of client {k} after step {t}", got[t, k], want[t, k])


def assert_lane_matches(result, lane: int, expect: ref.RefResult, context: str) -> None:
    """Lane `lane` of an engine result (LaneResults, recorded every step) agrees exactly with
    the reference run `expect`: horizon, service after every step, final service and
    counters, admissions and completions per client, the drift and its step, the
    throughput, conservation. AssertionError (prefixed by `context`) naming the first
    quantity that differs."""
    if result.steps[lane] != expect.steps:
        _differs(context, "horizon (steps run)", result.steps[lane], expect.steps)
    _same_service(context, result.checkpoints[lane][: expect.steps], service_matrix(expect))
    _same_list(context, "final service W", result.service_exact[lane], expect.service[-1])
    _same_list(context, "final counter c", result.counters_exact[lane], expect.counters[-1])
    _same_list(context, "admitted requests", result.admitted[lane], expect.admitted)
    _same_list(context, "completed requests", result.completed[lane], expect.completed)
    drifts = [max(row) - min(row) for row in expect.service]
    if result.max_drift_exact[lane] != max(drifts):
        _differs(context, "max drift", result.max_drift_exact[lane], max(drifts))
    if result.max_drift_step[lane] != drifts.index(max(drifts)):
        _differs(context, "step of the max drift", result.max_drift_step[lane], drifts.index(max(drifts)))
    want = float(ref.throughput(expect))
    if not math.isclose(result.throughput[lane], want, rel_tol=1e-12, abs_tol=1e-12):
        _differs(context, "throughput", result.throughput[lane], want)
    if result.conservation[lane] != []:
        _differs(context, "conservation (violated laws)", result.conservation[lane], [])


def check_policy(name: str, *, lanes: int = 200, seed: int = 0, num_clients: int = 3, steps: int | None = 50,
                 **trace_options) -> None:
    """Check registered policy `name` (a built-in, or a user's own registered with
    `vtc_jax.driver.policy_modules.load_policy_module`) against its literal reference:
    `lanes` random small lanes (random_lanes: K = `num_clients`, random settings, seeded
    by `seed`) through the JAX engine, in one batch, and through the literal model, step
    by step (steps=None: each lane until it drains). Returns None; raises AssertionError
    naming the first lane, its settings and the quantity that differs."""
    registry.get(name)  # InputError naming the choices for an unknown name
    batch = random_lanes(random.Random(seed), lanes, num_clients=num_clients, policies=(name,), **trace_options)
    result = run_traces(batch.traces, batch.settings, num_clients=num_clients, steps=steps, record_every=1)
    for lane, (reqs, s) in enumerate(zip(batch.requests, batch.settings)):
        context = f"policy {name!r}, lane {lane} of {lanes} (seed {seed}), {s}"
        if not result.finished[lane]:
            raise AssertionError(f"{context}: the engine did not finish the lane (flagged, results partial)")
        assert_lane_matches(result, lane, run_reference(reqs, num_clients, s, steps), context)
