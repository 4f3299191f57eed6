"""The adversary's candidate space and objective: traces as real genes, decoded and laid
out in bulk, and their exact backlogged drift in one engine call per population (the
search over them: adversary.py).

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
one static `EngineConfig` per (policy, K, M, limits, server): one compile per search).
"""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction

import numpy as np

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
from vtc_jax.servers import registry as servers

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

    def check(self, settings: Settings, server: str = servers.DEFAULT_SERVER) -> None:
        """Refuse settings a candidate could not run under exactly on `server` (InputError),
        a candidate request the server could never serve included."""
        chosen = servers.get(server)
        options = dict(settings.server_options)
        chosen.validate(options)
        never = chosen.never_served(options, np.asarray([self.prompt[1]]), np.asarray([self.output[1]]),
                                    settings.kv_budget)
        if never is not None:
            raise InputError(f"server {server}, the largest candidate request (prompt {self.prompt[1]}, output "
                             f"{self.output[1]}): {never}")
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
    timeline int32[B, R + TIMELINE_PAD, 3].
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
    timeline = np.stack([order, order // (n + pad), np.take_along_axis(rows[:, :, ARRIVAL], order, axis=1)],
                        axis=-1).astype(np.int32)
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
    """Backlogged drift of candidates under one Settings and Limits on one server (a
    servers.registry name; its own settings are `settings.server_options`), one static
    engine config: every call with the same population size reuses one compiled program."""

    settings: Settings
    limits: Limits
    arrival_width: int = 4
    server: str = servers.DEFAULT_SERVER

    def __post_init__(self):
        self.limits.check(self.settings, self.server)

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
        # A server that preempts (vllm) admits on free blocks, and a request it has only
        # partly prefilled holds fewer than its prompt: M // prompt_lo does not bound its
        # running requests, the candidate's requests do.
        least = 1 if servers.get(self.server).preempts else lim.prompt[0]
        return engine_config([s], num_clients=k, num_rows=k * (lim.requests + self.pad), max_output=lim.output[1],
                             slots=running_slots([s], least, requests), wide_numbers=wide, record_every=0,
                             num_checkpoints=0, arrival_width=self.arrival_width, drain=False, measures=MEASURES,
                             server=self.server)

    def values(self, arrival, prompt, output) -> np.ndarray:
        """float64[B] backlogged drift of candidates given as int[B, K, N] values.
        Raises RuntimeError if a lane did not finish (it never should: the budget is
        the engine's proven bound)."""
        b = np.asarray(arrival).shape[0]
        lim = self.limits
        workload = layout_candidates(arrival, prompt, output, self.pad)
        requests = lim.clients * lim.requests
        per_step = servers.get(self.server).events_per_step  # 1 on ideal
        results = run_workloads(workload, [self.settings] * b, [lim.horizon] * b, config=self.config, shared=False,
                                event_budget=per_step * lim.horizon + 3 * requests + 1,
                                expected_events=per_step * lim.horizon + 2 * requests)
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


def replay_drift(trace: Trace, settings: Settings, horizon: int, num_clients: int | None = None,
                 server: str = servers.DEFAULT_SERVER) -> Fraction:
    """The exact backlogged drift of one trace on `server` through the public replay path
    (a fresh single-lane run, independent of the batched search)."""
    k = int(trace.client.max()) + 1 if num_clients is None else num_clients
    result = replay(trace, settings, num_clients=k, steps=horizon, measures=MEASURES, server=server)
    if not result.finished[0]:
        raise RuntimeError("the replay did not reach its horizon")
    return Fraction(result.backlogged_drift_exact[0])
