"""The worst case: a gradient-free adversarial search for traces that maximise the drift
between jointly backlogged clients, against the VTC paper's 2U bound.

Objective. For a trace and a `Settings`, the *backlogged drift* is the engine's exact
`LaneResults.backlogged_drift` (measure "pair_drift", `MeasureConfig.of(["pair_drift"])`):

    max over client pairs f < g, and over intervals [t1, t2] of [0, T) in which f and g
    are both backlogged at every step, of |D(t2) - D(t1 - 1)|,   D = W_f - W_g,

where W_k(t) is client k's service after step t (W(-1) = 0) and "backlogged at step t"
means its waiting FIFO is not empty after the arrivals of step t (phase 1), before
admission (MODEL.md). It is in weighted tokens, exact (an integer / Q, Q the lane's cost
scale; an integer for integer costs). The VTC paper (Sheng et al., OSDI '24, Thm 4.4)
bounds it by 2U, U = max(w_p * L_input, w_q * M), L_input the largest prompt of the
trace (`bound_u`).

Parametrisation. A candidate has exactly N requests per client (K clients), and each
request (k, j) three real genes z = (z_arrival, z_prompt, z_output), `genes`
float32[..., K, N, 3]. Each gene maps through a logistic squashing function onto its
integer range [lo, hi]:

    value = lo + min(floor(sigmoid(z) * (hi - lo + 1)), hi - lo)

(every integer of the range is the image of an interval of z of equal probability
under sigmoid(z) uniform; `to_genes` is the inverse, the centre of that interval), with
arrival in [0, T - 1], prompt in `Limits.prompt`, output in `Limits.output`. So every
candidate is a valid trace within the limits whatever its genes. Request (k, j) has trace
number n = k * N + j; a candidate's witness trace lists its requests sorted by (arrival,
n), which preserves every (arrival, number) tie-break of the engine (FCFS order, the
order in which same-step newcomers are lifted), so it replays to the same integers.

Evaluation. A population's genes are decoded and laid out in bulk (numpy, no per-
candidate `Trace`): every candidate has the same block sizes (N + pad rows per client),
so the whole population is one batched `Workload` [B, K * (N + pad), 5] (its arrival
timeline included), run to the horizon T in ONE vmapped engine call (`run.run_workloads`,
one static `EngineConfig` per (policy, K, M, limits): one compile per search).

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
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from fractions import Fraction
from typing import Callable

import numpy as np
import optax

from vtc_jax.core.errors import InputError
from vtc_jax.driver.run import check_exact_limits, engine_config, replay, run_workloads, running_slots
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.workload import (
    ARRIVAL,
    CACHED,
    INT32_MAX,
    NUM_FIELDS,
    ORDER,
    OUTPUT,
    PROMPT,
    TIMELINE_PAD,
    Trace,
    Workload,
    padding_rows,
)
from vtc_jax.measures.online import MeasureConfig

NUM_GENES = 3  # per request: arrival, prompt, output
MEASURES = MeasureConfig.of(["pair_drift"])
MAX_CLIENTS = 4
MAX_HORIZON = 1 << 20
EXTREME = 16.0  # +-16 maps to the ends of any range of up to 8.8M values (1 - sigmoid(16) = 1.1e-7)


@dataclasses.dataclass(frozen=True)
class Limits:
    """The space of candidate traces.

    Attributes:
      clients: K (2..4).
      requests: N, requests per client (every candidate has exactly N per client).
      horizon: T; arrivals lie in [0, T - 1] and the run executes steps 0..T-1.
      prompt: (lo, hi) prompt tokens, 1 <= lo <= hi (hi <= every searched M).
      output: (lo, hi) output tokens, 1 <= lo <= hi.
    """

    clients: int = 2
    requests: int = 16
    horizon: int = 256
    prompt: tuple[int, int] = (8, 256)
    output: tuple[int, int] = (1, 64)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        for name, lo, hi in (("clients", 2, MAX_CLIENTS), ("requests", 1, 4096), ("horizon", 1, MAX_HORIZON)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
                raise InputError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
            set_(name, int(value))
        for name in ("prompt", "output"):
            lo, hi = (int(x) for x in getattr(self, name))
            if not 1 <= lo <= hi <= INT32_MAX // 4:
                raise InputError(f"{name} range must be 1 <= low <= high, got {lo},{hi}")
            set_(name, (lo, hi))
        if self.horizon * self.clients * self.requests >= INT32_MAX:
            raise InputError("horizon x clients x requests must stay below 2^31")

    @property
    def shape(self) -> tuple[int, int, int]:
        """Genes of one candidate: (K, N, 3)."""
        return (self.clients, self.requests, NUM_GENES)

    @property
    def dimension(self) -> int:
        return self.clients * self.requests * NUM_GENES

    def ranges(self) -> np.ndarray:
        """int64[3, 2]: the (lo, hi) of arrival, prompt and output."""
        return np.asarray([(0, self.horizon - 1), self.prompt, self.output], np.int64)

    def check(self, settings: Settings) -> None:
        """Refuse settings a candidate could not run under exactly (InputError)."""
        if self.prompt[1] > settings.kv_budget:
            raise InputError(f"prompts up to {self.prompt[1]} tokens exceed the KV budget M={settings.kv_budget}; "
                             "they could never be admitted")
        if settings.rpm_limit is not None:
            raise InputError("the adversary does not search under an rpm limit")
        if min(settings.client_caps(self.clients)) < self.prompt[1] + self.output[1]:
            raise InputError(f"a request of up to {self.prompt[1] + self.output[1]} KV tokens (prompt + output) "
                             f"could never fit the KV cap {min(settings.client_caps(self.clients))}")
        check_exact_limits(settings, self.clients, min_prompt=self.prompt[0], max_prompt=self.prompt[1],
                           max_output=self.output[1], horizon=self.horizon,
                           max_requests=self.clients * self.requests)


# ---------------------------------------------------------------------------------
# parametrisation
# ---------------------------------------------------------------------------------

def squash(z: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """float[...] genes -> int64[...] in [lo, hi]: lo + min(floor(sigmoid(z) * n), n - 1),
    n = hi - lo + 1 (NaN maps to lo)."""
    n = hi - lo + 1
    s = 0.5 * (1.0 + np.tanh(0.5 * np.nan_to_num(np.asarray(z, np.float64), nan=-np.inf)))  # sigmoid, no overflow
    return lo + np.minimum(np.floor(s * n), n - 1).astype(np.int64)


def unsquash(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """int[...] in [lo, hi] -> float64 genes at the centre of each value's interval
    (`squash(unsquash(x)) == x`)."""
    n = hi - lo + 1
    u = (np.asarray(x, np.float64) - lo + 0.5) / n
    return np.log(u) - np.log1p(-u)


def decode(genes: np.ndarray, limits: Limits) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float[..., K, N, 3] genes -> (arrival, prompt, output) int64[..., K, N] within `limits`."""
    genes = np.asarray(genes)
    if genes.shape[-3:] != limits.shape:
        raise ValueError(f"genes of shape {genes.shape} do not end in {limits.shape}")
    r = limits.ranges()
    return tuple(squash(genes[..., i], int(r[i, 0]), int(r[i, 1])) for i in range(NUM_GENES))


def to_genes(arrival, prompt, output, limits: Limits) -> np.ndarray:
    """The inverse of `decode`: int[..., K, N] values within `limits` -> float32[..., K, N, 3]."""
    r = limits.ranges()
    cols = []
    for i, x in enumerate((arrival, prompt, output)):
        x = np.asarray(x, np.int64)
        if (x < r[i, 0]).any() or (x > r[i, 1]).any():
            raise InputError(f"{('arrival', 'prompt', 'output')[i]} outside its range [{r[i, 0]}, {r[i, 1]}]")
        cols.append(unsquash(x, int(r[i, 0]), int(r[i, 1])))
    return np.stack(cols, axis=-1).astype(np.float32)


def random_genes(rng: np.random.Generator, count: int, limits: Limits, scale: float = 1.5) -> np.ndarray:
    """float32[count, K, N, 3] random genes, N(0, scale^2) (scale 1.5 spreads every range
    roughly uniformly, its ends included)."""
    return (rng.standard_normal((count,) + limits.shape) * scale).astype(np.float32)


def random_shapes(rng: np.random.Generator, size: tuple, scale: float) -> np.ndarray:
    """float64[*size, 3] genes of random request shapes: each gene at the low end of its
    range (-EXTREME), at the high end (+EXTREME) or N(0, scale^2), probability 1/3 each."""
    genes = rng.standard_normal(size + (NUM_GENES,)) * scale
    pick = rng.integers(0, 3, size + (NUM_GENES,))
    return np.where(pick == 0, -EXTREME, np.where(pick == 1, EXTREME, genes))


def structured_genes(rng: np.random.Generator, count: int, limits: Limits, scale: float = 1.5,
                     templates: int = 3) -> np.ndarray:
    """float32[count, K, N, 3] random *structured* candidates: per candidate and client,
    1..`templates` request shapes, each gene of a shape at the low end of its range, at
    the high end (+-EXTREME) or N(0, scale^2) with probability 1/3 each; every request of
    the client is a copy of one of its shapes. Worst cases are of this kind (same-step
    bursts of identical requests at the limits of the ranges), which unstructured
    sampling almost never draws, so half of every random draw of the search is this prior."""
    k, n, _ = limits.shape
    shapes = random_shapes(rng, (count, k, templates), scale)
    used = rng.integers(1, templates + 1, (count, k, 1))
    which = rng.integers(0, 1 << 30, (count, k, n)) % used  # each request: one of its client's shapes
    return np.take_along_axis(shapes, which[..., None], axis=2).astype(np.float32)


def initial_genes(rng: np.random.Generator, count: int, limits: Limits, scale: float = 1.5) -> np.ndarray:
    """float32[count, K, N, 3] the search's random draw: half `structured_genes`, half
    `random_genes` (interleaved)."""
    out = random_genes(rng, count, limits, scale)
    out[::2] = structured_genes(rng, len(out[::2]), limits, scale)
    return out


def blocked_decode(limits: Limits) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A hand-made candidate (arrival, prompt, output) int64[K, N], the search's seed:
    client 0 sends N - 1 requests of the smallest prompt and the longest output and one of
    the largest prompt and the shortest output at step 0; every other client sends N
    requests of the largest prompt and longest output at step 1 (step 0 if T = 1). Client
    0's short prompts run; the clients' large heads do not fit while they run, so
    admission stops (head-of-line) and client 0 is charged w_q per running request per
    step for an output's length while everyone waits: about w_q * (N - 1) * (longest
    output - 1) within a jointly backlogged interval when (N - 1) * prompt_lo + prompt_hi
    > M, whatever the ordering policy (e.g. 1,890 = 1.85 x 2U at the default limits)."""
    k, n = limits.clients, limits.requests
    (p_lo, p_hi), (o_lo, o_hi) = limits.prompt, limits.output
    arrival = np.full((k, n), min(1, limits.horizon - 1), np.int64)
    arrival[0] = 0
    prompt = np.full((k, n), p_hi, np.int64)
    output = np.full((k, n), o_hi, np.int64)
    prompt[0, : n - 1], output[0, n - 1] = p_lo, o_lo
    return arrival, prompt, output


# ---------------------------------------------------------------------------------
# candidates -> workloads and traces
# ---------------------------------------------------------------------------------

def _order_keys(arrival: np.ndarray) -> np.ndarray:
    """int64[..., K, N] (arrival, number) as one sortable key; number n = k * N + j."""
    k, n = arrival.shape[-2:]
    number = np.arange(k * n, dtype=np.int64).reshape(k, n)
    return np.asarray(arrival, np.int64) * (k * n) + number


def layout_candidates(arrival, prompt, output, pad: int) -> Workload:
    """A population as one batched Workload (numpy leaves, B lanes).

    Args:
      arrival, prompt, output: int[B, K, N] (values within a `Limits`; every arrival < T).
      pad: padding rows per block (the engine's arrival_width + 1).

    Returns a Workload with requests int32[B, R, 5], R = K * (N + pad) (client k's block
    holds its N requests sorted by (arrival, number), ORDER = the rank in (arrival, number)
    order over all clients, then `pad` rows that never arrive), first/size int32[B, K],
    num_requests int32[B] (= K * N: every request arrives before T), overflow bool[B] and
    timeline int32[B, R + TIMELINE_PAD, 2].
    """
    arrival, prompt, output = (np.asarray(x, np.int64) for x in (arrival, prompt, output))
    b, k, n = arrival.shape
    key = _order_keys(arrival)
    rank = np.argsort(np.argsort(key.reshape(b, k * n), axis=1, kind="stable"), axis=1, kind="stable").reshape(b, k, n)
    order = np.argsort(key, axis=2, kind="stable")  # within each client: (arrival, number)
    rows = np.zeros((b, k, n + pad, NUM_FIELDS), np.int32)
    rows[:, :, n:] = padding_rows(pad)
    for field, column in ((ARRIVAL, arrival), (ORDER, rank), (PROMPT, prompt), (OUTPUT, output)):
        rows[:, :, :n, field] = np.take_along_axis(column, order, axis=2)
    rows[:, :, :n, CACHED] = 0
    rows = rows.reshape(b, k * (n + pad), NUM_FIELDS)
    first = np.broadcast_to(np.arange(k, dtype=np.int32) * (n + pad), (b, k)).copy()
    # The arrival timeline (workload.timeline_host, vectorized): rows by ORDER, padding
    # rows last in row order, each with its block; built here so that the engine does not
    # build (and compile) it on every call.
    order = np.argsort(rows[:, :, ORDER], axis=1, kind="stable")
    timeline = np.stack([order, order // (n + pad)], axis=-1).astype(np.int32)
    timeline = np.concatenate([timeline, np.repeat(timeline[:, -1:], TIMELINE_PAD, axis=1)], axis=1)
    return Workload(requests=rows, first=first, size=np.full((b, k), n + pad, np.int32),
                    num_requests=np.full(b, k * n, np.int32), overflow=np.zeros(b, bool), timeline=timeline)


def candidate_trace(arrival, prompt, output) -> Trace:
    """One candidate (int[K, N] each) as a Trace, rows sorted by (arrival, number): the
    witness that replays to the same integers (see the module docstring)."""
    arrival, prompt, output = (np.asarray(x, np.int64) for x in (arrival, prompt, output))
    k, n = arrival.shape
    order = np.argsort(_order_keys(arrival).ravel(), kind="stable")
    client = np.repeat(np.arange(k), n)
    trace = Trace(arrival.ravel()[order], client[order], prompt.ravel()[order], output.ravel()[order],
                  np.zeros(k * n, np.int64))
    trace.validate(k)
    return trace


def write_witness_csv(path, trace: Trace) -> None:
    """The trace CSV (header arrival,client,prompt,output; arrivals in steps)."""
    lines = ["arrival,client,prompt,output"]
    lines += [f"{a},{c},{p},{o}" for a, c, p, o in zip(trace.arrival, trace.client, trace.prompt, trace.output)]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------
# the objective
# ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Objective:
    """Backlogged drift of candidates under one Settings and Limits (one static engine
    config: every call with the same population size reuses one compiled program)."""

    settings: Settings
    limits: Limits
    arrival_width: int = 4

    def __post_init__(self):
        self.limits.check(self.settings)

    @property
    def pad(self) -> int:
        return self.arrival_width + 1

    @functools.cached_property
    def config(self):
        """The static EngineConfig every call runs under."""
        lim, s = self.limits, self.settings
        k, requests = lim.clients, lim.clients * lim.requests
        wide = check_exact_limits(s, k, min_prompt=lim.prompt[0], max_prompt=lim.prompt[1], max_output=lim.output[1],
                                  horizon=lim.horizon, max_requests=requests, arrival_width=self.arrival_width)
        return engine_config([s], num_clients=k, num_rows=k * (lim.requests + self.pad), max_output=lim.output[1],
                             slots=running_slots([s], lim.prompt[0], requests), wide_numbers=wide, record_every=0,
                             num_checkpoints=0, arrival_width=self.arrival_width, drain=False, measures=MEASURES)

    def values(self, arrival, prompt, output) -> np.ndarray:
        """float64[B] backlogged drift of candidates given as int[B, K, N] values.
        Raises RuntimeError if a lane did not finish (it never should: the budget is
        the engine's proven bound)."""
        b = np.asarray(arrival).shape[0]
        lim = self.limits
        workload = layout_candidates(arrival, prompt, output, self.pad)
        requests = lim.clients * lim.requests
        results = run_workloads(workload, [self.settings] * b, [lim.horizon] * b, config=self.config, shared=False,
                                event_budget=lim.horizon + 3 * requests + 1,
                                expected_events=lim.horizon + 2 * requests)
        if not results.finished.all():
            raise RuntimeError(f"{int((~results.finished).sum())} candidate lanes did not finish (engine defect)")
        return np.asarray(results.backlogged_drift, np.float64)

    def __call__(self, genes: np.ndarray) -> np.ndarray:
        """float64[B] backlogged drift of genes float[B, K, N, 3]."""
        return self.values(*decode(genes, self.limits))


def bound_u(settings: Settings, max_prompt: int) -> Fraction:
    """U = max(w_p * L_input, w_q * M) (exact)."""
    return max(settings.w_p * int(max_prompt), settings.w_q * settings.kv_budget)


def lower_bound(settings: Settings) -> Fraction:
    """w_q * M: the gap some arrival pattern forces on any work-conserving,
    non-preemptive schedule (the paper's lower bound, up to its 'about')."""
    return settings.w_q * settings.kv_budget


def replay_drift(trace: Trace, settings: Settings, horizon: int, num_clients: int | None = None) -> Fraction:
    """The exact backlogged drift of one trace through the public replay path (a fresh
    single-lane run, independent of the batched search)."""
    k = int(trace.client.max()) + 1 if num_clients is None else num_clients
    result = replay(trace, settings, num_clients=k, steps=horizon, measures=MEASURES)
    if not result.finished[0]:
        raise RuntimeError("the replay did not reach its horizon")
    return Fraction(result.backlogged_drift_exact[0])


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
           "replay_drift",
           "centered_ranks", "MEASURES"]
