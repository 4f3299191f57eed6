"""The worst case: a gradient-free adversarial search for traces that maximise the drift
between jointly backlogged clients, against the VTC paper's 2U bound.

The candidate space (traces as genes, their layout as one batched workload) and the
objective (their exact backlogged drift, against 2U): adversary_space.py, whose names
this module re-exports.

Search (`search`). Evolution strategies on R islands with random restarts and elitism;
each generation is one engine call over the whole population:
  * every island holds an ES mean in gene space: antithetic samples mean +- sigma * eps,
    a search gradient from tie-averaged centered ranks of their drift, and an optax
    optimiser (Adam) that moves the mean;
  * every island keeps an archive of its best distinct candidates; the rest of its
    share of the population are mutants of archive members (rank-biased): a Gaussian
    move of a random subset of genes (fraction log-uniform in [1/D, 1], scale
    log-uniform), a jump of a subset to the ends of their ranges, copies of one request
    over others, crossover with another member, or a fresh request shape over a subset;
  * an island whose best has not improved for `patience` generations restarts from a
    fresh random mean and an empty archive (a random restart);
  * random draws (generation 0, restarts) are half unstructured genes and half a
    structured prior (`structured_genes`: each client's requests copies of 1-3 random
    request shapes with genes at the ends of their ranges a third of the time), because
    worst cases are bursts of identical requests at the limits, which unstructured
    sampling almost never draws; generation 0 is the random baseline;
  * the best candidate ever seen is kept (elitism) and returned with its drift; the best
    per generation is recorded.

About the bound (what the search finds, see docs/results/adversary/README.md). The
paper's argument bounds the counter gap of backlogged clients by the charges a client can
receive after it was last the least-counter choice: one prefill (w_p * L_input) and the
decode of its running requests, which it bounds by w_q * M because a batch holds at most
M tokens. MODEL.md admits a request when its *prompt* fits M and lets running requests
grow past M (no preemption, no reservation of the output), so the decode still owed to a
client's running requests is up to (running requests) x (longest output) tokens, not M;
while the least-counter client's head does not fit, admission stops (head-of-line) and
the other client keeps being charged. The lift only touches a client whose FIFO is
empty, so it cannot act while both FIFOs stay non-empty; but the measure samples the
backlog once per step (after phase 1), and a FIFO emptied by admission in step t - 1 and
refilled in step t counts as backlogged at both steps although the lift acted in between.
Without MODEL.md's `last_left` clause (Settings.lift_last_left=False) a client returning
when nobody is backlogged keeps a stale counter, and the gap it then opens grows with the
time it was away, as under LCF.

On other servers (`Objective(server=...)`): `ideal_reserve` admits a request only when the
prompt + output of every running request and its own fit M, the theorem's assumption, and
the search finds nothing above 2U there; `vllm` bounds the KV it holds by preemption but,
like MODEL.md, reserves no output at admission, and the search finds 2.9 x 2U
(docs/results/adversary/README.md, "Where memory is bounded").
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np
import optax

from vtc_jax.core.errors import InputError
from vtc_jax.driver.adversary_space import (
    EXTREME,
    MAX_CLIENTS,
    MEASURES,
    NUM_GENES,
    Limits,
    Objective,
    blocked_decode,
    bound_u,
    candidate_trace,
    decode,
    initial_genes,
    layout_candidates,
    lower_bound,
    random_genes,
    random_shapes,
    replay_drift,
    squash,
    structured_genes,
    to_genes,
    unsquash,
    write_witness_csv,
)
from vtc_jax.inputs.workload import Trace


# ---------------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Optimiser settings.

    Attributes:
      population: candidates per generation, one engine call (rounded down to a multiple
        of `restarts`: each island takes an equal share).
      generations: engine calls.
      restarts: R islands, each restarted from random when it stalls.
      sigma: ES sample scale in gene space.
      learning_rate: Adam's step on each island's mean.
      elite_fraction: share of an island's candidates that are mutants of its archive.
      elite_sigma: (low, high) of the log-uniform scale of Gaussian mutation moves.
      patience: generations without improvement after which an island restarts.
      init_scale: standard deviation of random genes (generation 0, restarts).
      archive: distinct best candidates an island keeps as parents of its mutants.
      seed: numpy seed of every random draw.
    """

    population: int = 2048
    generations: int = 30
    restarts: int = 4
    sigma: float = 0.6
    learning_rate: float = 0.15
    elite_fraction: float = 0.5
    elite_sigma: tuple[float, float] = (0.05, 3.0)
    patience: int = 8
    init_scale: float = 1.5
    archive: int = 32
    seed: int = 0

    def __post_init__(self):
        if self.restarts < 1 or self.generations < 1:
            raise InputError("restarts and generations must be >= 1")
        if self.population < 3 * self.restarts:
            raise InputError(f"population must be at least 3 x restarts = {3 * self.restarts}, "
                             f"got {self.population}")
        if not 0 < self.elite_fraction < 1 or self.sigma <= 0 or self.learning_rate <= 0:
            raise InputError("elite_fraction must be in (0, 1); sigma and learning_rate > 0")

    def split(self) -> tuple[int, int]:
        """(antithetic pairs H, elite mutants E) per island: R * (2H + E) <= population."""
        size = self.population // self.restarts
        pairs = max(1, int(size * (1 - self.elite_fraction)) // 2)
        return pairs, max(1, size - 2 * pairs)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """best_drift: the worst drift found; best_genes float32[K, N, 3] and best_values
    (arrival, prompt, output) int64[K, N] its candidate; trace: its witness Trace;
    progress float64[G]: best ever after each generation; generation_best float64[G]:
    best of each generation; random_best: best of the random candidates of generation 0
    (all but the seed); initial_drift: the seed's drift (None without `initial`);
    candidates: evaluated; seconds: wall time; restarts: islands restarted on stagnation."""

    best_drift: float
    best_genes: np.ndarray
    best_values: tuple
    trace: Trace
    progress: np.ndarray
    generation_best: np.ndarray
    random_best: float
    initial_drift: float | None
    candidates: int
    seconds: float
    restarts: int


def centered_ranks(values: np.ndarray) -> np.ndarray:
    """float64[n] ranks scaled to [-0.5, 0.5], ties sharing their average rank (a plateau
    of equal drift gives no spurious direction)."""
    values = np.asarray(values, np.float64)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    average = upper - (counts + 1) / 2.0  # mean 0-based rank of each distinct value
    return average[inverse] / max(len(values) - 1, 1) - 0.5


def search(objective: Callable[[np.ndarray], np.ndarray] | Objective, limits: Limits, config: SearchConfig,
           *, initial: np.ndarray | None = None,
           log: Callable[[str], None] | None = None) -> SearchResult:
    """Maximise the objective (backlogged drift) over candidate genes.

    Args:
      objective: float[B, K, N, 3] genes -> float64[B] drift (an `Objective`).
      limits: the candidate space (its `shape` is the genes' trailing shape).
      config: population, generations, restarts, ... (SearchConfig).
      initial: optional float[K, N, 3] genes of a known candidate, evaluated in every
        island's share of generation 0 (so its archive, and the result, start from it),
        for example `to_genes(*blocked_decode(limits), limits)`.
      log: called with one line per generation.
    """
    rng = np.random.default_rng(config.seed)
    shape, dim = limits.shape, limits.dimension
    pairs, elites = config.split()
    size = 2 * pairs + elites  # one island's share of a generation
    optimizer = optax.adam(config.learning_rate)
    islands = [Island.fresh(rng, limits, config, optimizer) for _ in range(config.restarts)]
    best = Archive.empty(1, limits)
    progress, generation_best = [], []
    random_best, initial_drift, candidates, restarted = -np.inf, None, 0, 0
    started = time.perf_counter()
    for gen in range(config.generations):
        parts, noise = [], []
        for island in islands:
            eps = rng.standard_normal((pairs,) + shape)
            noise.append(eps)
            parts += [island.mean + config.sigma * eps, island.mean - config.sigma * eps]
            parts.append(initial_genes(rng, elites, limits, config.init_scale) if island.archive.size == 0
                         else _mutate(rng, island.archive, elites, config, dim))
        population = np.concatenate(parts).astype(np.float32)
        seeded = np.zeros(len(population), bool)
        if gen == 0 and initial is not None:  # the seed joins every island's first share
            seeded[2 * pairs:: size] = True
            population[seeded] = np.asarray(initial, np.float32).reshape(shape)
        values = np.asarray(objective(population), np.float64)
        candidates += len(population)
        if gen == 0:
            random_best = float(values[~seeded].max())  # the random baseline
            initial_drift = float(values[seeded][0]) if initial is not None else None
        best = best.merge(population, values, limits, capacity=1)
        generation_best.append(float(values.max()))
        progress.append(float(best.values[0]))
        for r, island in enumerate(islands):
            own = slice(r * size, (r + 1) * size)
            island = island.update(population[own], values[own], noise[r], config, optimizer, limits)
            if island.stale >= config.patience:  # a random restart of this island
                island = Island.fresh(rng, limits, config, optimizer)
                restarted += 1
            islands[r] = island
        if log is not None:
            log(f"generation {gen + 1}/{config.generations}: best {progress[-1]:,.6g} (this generation "
                f"{generation_best[-1]:,.6g}), {candidates:,} candidates, {time.perf_counter() - started:.1f} s")
    best_genes = best.genes[0]
    best_values = tuple(v[0] for v in decode(best_genes[None], limits))
    return SearchResult(best_drift=float(best.values[0]), best_genes=best_genes, best_values=best_values,
                        trace=candidate_trace(*best_values), progress=np.asarray(progress),
                        generation_best=np.asarray(generation_best), random_best=random_best,
                        initial_drift=initial_drift, candidates=candidates, seconds=time.perf_counter() - started,
                        restarts=restarted)


@dataclasses.dataclass(frozen=True)
class Island:
    """One restartable search: an ES mean float64[K, N, 3] with its optax state, an
    archive of its best distinct candidates, its best value and generations since it
    last improved."""

    mean: np.ndarray
    state: object
    archive: "Archive"
    best: float
    stale: int

    @classmethod
    def fresh(cls, rng, limits: Limits, config: SearchConfig, optimizer) -> "Island":
        """A random mean (structured or not, even odds) and an empty archive."""
        mean = initial_genes(rng, 2, limits, config.init_scale)[rng.integers(2)].astype(np.float64)
        return cls(mean, optimizer.init(mean), Archive.empty(config.archive, limits), -np.inf, 0)

    def update(self, genes, values, eps, config: SearchConfig, optimizer, limits: Limits) -> "Island":
        """After a generation: the ES step on the mean from its 2H antithetic samples
        (genes/values: the island's [2H + E] candidates, ES samples first; eps [H, K, N, 3]),
        the archive merged with all of them."""
        pairs = len(eps)
        ranks = centered_ranks(values[: 2 * pairs])
        grad = np.tensordot(ranks[:pairs] - ranks[pairs:], eps, axes=1) / (2 * pairs * config.sigma)
        updates, state = optimizer.update(-grad, self.state, self.mean)  # optax minimises
        mean = np.asarray(optax.apply_updates(self.mean, updates), np.float64)
        top = float(values.max())
        improved = top > self.best
        return Island(mean, state, self.archive.merge(genes, values, limits), max(top, self.best),
                      0 if improved else self.stale + 1)


@dataclasses.dataclass(frozen=True)
class Archive:
    """The elite: the best distinct candidates seen so far, best first.
    genes float32[A', K, N, 3], values float64[A'] (A' <= capacity), keys: their decoded
    values as bytes (two genes that decode to the same trace are one candidate)."""

    genes: np.ndarray
    values: np.ndarray
    keys: tuple
    capacity: int

    @classmethod
    def empty(cls, capacity: int, limits: Limits) -> "Archive":
        return cls(np.zeros((0,) + limits.shape, np.float32), np.zeros(0), (), capacity)

    @property
    def size(self) -> int:
        return len(self.values)

    def merge(self, genes: np.ndarray, values: np.ndarray, limits: Limits, capacity: int | None = None) -> "Archive":
        """The best `capacity` (default: the archive's) distinct candidates of the archive
        and a population (ties: the archive's first, so the best ever is never replaced
        by an equal newcomer)."""
        capacity = capacity or self.capacity
        order = np.argsort(-values, kind="stable")[: 4 * capacity]  # enough to fill it after duplicates
        decoded = np.stack(decode(genes[order], limits), axis=-1)
        all_genes = list(self.genes) + list(genes[order])
        all_values = list(self.values) + list(values[order])
        all_keys = list(self.keys) + [d.tobytes() for d in decoded]
        seen, keep = set(), []
        for i in sorted(range(len(all_values)), key=lambda i: (-all_values[i], i)):
            if all_keys[i] not in seen and np.isfinite(all_values[i]):
                seen.add(all_keys[i])
                keep.append(i)
            if len(keep) == capacity:
                break
        return Archive(np.asarray([all_genes[i] for i in keep], np.float32).reshape((-1,) + limits.shape),
                       np.asarray([all_values[i] for i in keep], np.float64), tuple(all_keys[i] for i in keep),
                       self.capacity)


def _mutate(rng: np.random.Generator, archive: Archive, count: int, config: SearchConfig, dim: int) -> np.ndarray:
    """float32[count, K, N, 3] mutants of archive members (parent drawn with probability
    decreasing in its rank: index floor(A' * u^2)), each by one move drawn uniformly:

      * perturb: a random subset of genes (fraction log-uniform in [1/dim, 1]) moves by
        N(0, scale^2), scale log-uniform in config.elite_sigma;
      * extreme: a random subset of genes jumps to either end of its range (+-EXTREME),
        because worst cases sit at the limits (same-step bursts, the largest prompt);
      * copy: one request's genes are copied onto a random subset of the requests
        (worst cases repeat one request shape many times);
      * crossover: a random subset of requests comes from a second archive member;
      * reshape: a random subset of requests becomes copies of a fresh random shape (as
        in `structured_genes`).

    The first mutant is the best candidate itself (re-evaluated: the elite stays in the
    population)."""
    a = archive.size
    shape = archive.genes.shape[1:]
    requests = shape[0] * shape[1]
    expand = lambda x: x.reshape((-1,) + (1,) * len(shape))  # noqa: E731
    parents = archive.genes[np.minimum((a * rng.random(count) ** 2).astype(np.int64), a - 1)]
    partners = archive.genes[rng.integers(0, a, count)]
    lo, hi = (math.log(x) for x in config.elite_sigma)
    scale = expand(np.exp(rng.uniform(lo, hi, count)))
    share = expand(np.exp(rng.uniform(math.log(1.0 / dim), 0.0, count)))
    gene_mask = rng.random((count,) + shape) < share
    row_mask = rng.random((count,) + shape[:2] + (1,)) < share
    kind = expand(rng.integers(0, 5, count))
    perturbed = parents + np.where(gene_mask, rng.standard_normal((count,) + shape) * scale, 0.0)
    extreme = np.where(gene_mask, np.where(rng.random((count,) + shape) < 0.5, -EXTREME, EXTREME), parents)
    flat = parents.reshape(count, requests, NUM_GENES)
    source = flat[np.arange(count), rng.integers(0, requests, count)]  # [count, 3]
    copied = np.where(row_mask, source[:, None, None, :], parents)
    crossed = np.where(row_mask, partners, parents)
    reshaped = np.where(row_mask, random_shapes(rng, (count,), config.init_scale)[:, None, None, :], parents)
    out = np.select([kind == 0, kind == 1, kind == 2, kind == 3], [perturbed, extreme, copied, crossed], reshaped)
    out[0] = archive.genes[0]
    return out.astype(np.float32)


def random_search(objective: Callable[[np.ndarray], np.ndarray], limits: Limits, candidates: int, *,
                  batch: int = 2048, seed: int = 0, scale: float = 1.5) -> float:
    """The best drift among `candidates` random candidates drawn as the search's
    generation 0 (`initial_genes`): the baseline."""
    rng = np.random.default_rng(seed)
    best = -np.inf
    for start in range(0, candidates, batch):
        best = max(best, float(np.max(objective(initial_genes(rng, min(batch, candidates - start), limits, scale)))))
    return best


__all__ = ["Limits", "Objective", "SearchConfig", "SearchResult", "Archive", "search", "random_search", "decode",
           "to_genes", "squash", "unsquash", "random_genes", "random_shapes", "structured_genes", "initial_genes",
           "blocked_decode", "layout_candidates", "candidate_trace", "write_witness_csv", "bound_u", "lower_bound",
           "replay_drift", "centered_ranks", "MEASURES", "MAX_CLIENTS"]
