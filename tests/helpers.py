"""Shared test helpers: random lanes and their reference runs."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np

from tests import reference as ref
from vtc_jax import Settings, Trace


def to_trace(requests: list[ref.Request]) -> Trace:
    return Trace.from_rows([(r.arrival, r.client, r.prompt, r.output, r.cached) for r in requests])


def random_settings(rng: random.Random, policy: str, num_clients: int, kv_budget: int) -> Settings:
    """Random exact settings: fractional costs, weights and beta some of the time."""
    weights = None
    if rng.random() < 0.5:
        weights = tuple(Fraction(rng.choice([1, 2, 3, 5, 7]), rng.choice([1, 2, 3, 4])) for _ in range(num_clients))
    return Settings(
        policy=policy, kv_budget=kv_budget,
        w_p=rng.choice([1, 1, Fraction(1, 2), Fraction(3, 2)]), w_q=rng.choice([2, 2, 1, Fraction(5, 4)]),
        beta=rng.choice([0, 0, Fraction(1, 4), Fraction(3, 10), 1]), weights=weights,
        rpm_limit=rng.randint(1, 3) if policy == "rpm" else None, rpm_window=rng.randint(1, 12))


def run_reference(requests, num_clients: int, settings: Settings, steps: int | None) -> ref.RefResult:
    return ref.simulate(requests, num_clients=num_clients, kv_budget=settings.kv_budget,
                        policy=settings.policy, w_p=settings.w_p, w_q=settings.w_q, beta=settings.beta,
                        weights=settings.weights, rpm_limit=settings.rpm_limit,
                        rpm_window=settings.rpm_window, steps=steps,
                        lift_last_left=settings.lift_last_left, kv_cap=settings.kv_cap,
                        charge_cached=settings.charge_cached)


def service_matrix(result: ref.RefResult) -> np.ndarray:
    """float64[T, K] service after every step."""
    return np.asarray([[float(x) for x in row] for row in result.service], dtype=np.float64)
