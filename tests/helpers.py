"""Shared test helpers: random lanes and their reference runs."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from tests import reference as ref
from vtc_jax import Settings, Trace
from vtc_jax.policies import registry
from vtc_jax.policies.estimators import ESTIMATORS


def to_trace(requests: list[ref.Request]) -> Trace:
    return Trace.from_rows([(r.arrival, r.client, r.prompt, r.output, r.cached) for r in requests])


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


def run_reference(requests, num_clients: int, settings: Settings, steps: int | None) -> ref.RefResult:
    return ref.simulate(requests, num_clients=num_clients, settings=settings, steps=steps)


def service_matrix(result: ref.RefResult) -> np.ndarray:
    """float64[T, K] service after every step."""
    return np.asarray([[float(x) for x in row] for row in result.service], dtype=np.float64)


def assert_lane_matches(result, lane: int, expect: ref.RefResult, context: str) -> None:
    """Lane `lane` of an engine result agrees exactly with the reference run `expect`:
    horizon, service after every step, final service and counters, admissions and
    completions per client, the drift and its step, the throughput, conservation."""
    assert result.steps[lane] == expect.steps, context
    np.testing.assert_array_equal(result.checkpoints[lane][: expect.steps], service_matrix(expect),
                                  err_msg=context)
    assert list(result.service_exact[lane]) == expect.service[-1], context
    assert list(result.counters_exact[lane]) == expect.counters[-1], context
    assert list(result.admitted[lane]) == expect.admitted, context
    assert list(result.completed[lane]) == expect.completed, context
    drifts = [max(row) - min(row) for row in expect.service]
    assert result.max_drift_exact[lane] == max(drifts), context
    assert result.max_drift_step[lane] == drifts.index(max(drifts)), context
    assert result.throughput[lane] == pytest.approx(float(ref.throughput(expect)), rel=1e-12), context
    assert result.conservation[lane] == [], context
