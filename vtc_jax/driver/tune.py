"""Gradient-free tuning of one scalar setting with evolution strategies and optax.

Simulated objectives are piecewise constant in a cost parameter (admission decisions are
discrete), so gradients are zero almost everywhere. `es_minimize` estimates a search
gradient from antithetic Gaussian perturbations with centered ranks (OpenAI-ES style) and
feeds it to any optax optimizer. The objective is called once per generation with the
whole population, so a simulator can evaluate every candidate x seed in one vmapped call
(the same seeds for every candidate: common random numbers make the ranking sharper).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class ESResult:
    """theta: final mean; path: float64[G+1] the mean before each generation and after the
    last; best_theta/best_value: the best population member seen (by its fitness)."""

    theta: float
    path: np.ndarray
    fitness_path: np.ndarray
    best_theta: float
    best_value: float


def centered_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5] (ties broken by position)."""
    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks / max(len(values) - 1, 1) - 0.5


def es_minimize(objective: Callable[[np.ndarray], np.ndarray], theta0: float, *, sigma: float = 0.3,
                pairs: int = 8, generations: int = 30, optimizer: optax.GradientTransformation | None = None,
                bounds: tuple[float, float] = (-np.inf, np.inf), seed: int = 0) -> ESResult:
    """Minimize a noisy scalar objective.

    Args:
      objective: float64[P] candidate thetas -> float64[P] values (lower is better).
      theta0: starting point.
      sigma: perturbation scale (in theta units).
      pairs: antithetic pairs per generation (population 2 * pairs).
      generations: number of updates.
      optimizer: optax transformation for the mean (default adam(0.1)).
      bounds: theta is clipped to this interval after each update.
      seed: perturbation noise seed.
    """
    optimizer = optimizer or optax.adam(0.1)
    rng = np.random.default_rng(seed)
    theta = jnp.asarray(float(theta0))
    state = optimizer.init(theta)
    path, fitness_path = [float(theta)], []
    best = (np.inf, float(theta))
    for _ in range(generations):
        eps = rng.standard_normal(pairs) * sigma
        population = np.clip(np.concatenate([float(theta) + eps, float(theta) - eps]), *bounds)
        values = np.asarray(objective(population), dtype=np.float64)
        if values.shape != population.shape:
            raise ValueError(f"objective returned shape {values.shape} for {population.shape} candidates")
        i = int(np.nanargmin(values))
        if values[i] < best[0]:
            best = (float(values[i]), float(population[i]))
        ranks = centered_ranks(values)
        grad = float(((ranks[:pairs] - ranks[pairs:]) * eps).sum() / (2 * pairs * sigma ** 2))
        updates, state = optimizer.update(jnp.asarray(grad), state, theta)
        theta = jnp.clip(optax.apply_updates(theta, updates), *bounds)
        path.append(float(theta))
        fitness_path.append(float(np.nanmean(values)))
    return ESResult(theta=float(theta), path=np.asarray(path), fitness_path=np.asarray(fitness_path),
                    best_theta=best[1], best_value=best[0])
