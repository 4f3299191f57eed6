"""Host-side results of a batch of lanes, and the measures derived from them.

`collect` turns the final device state into `LaneResults` (tokens as float64; exact
Fractions computed when read). Windowed measures (the VTC paper's service difference,
Jain's index) and latency percentiles are computed here from the stride-recorded time
series and histograms, vectorized over lanes in numpy. A measure the run did not keep
(measures.MeasureConfig) reads as None (arrays) or NaN (per-lane numbers).
"""

from __future__ import annotations

from typing import Any

import dataclasses
import functools
from fractions import Fraction
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import wide
from vtc_jax.engines.settings import Scales, Settings, encode_settings
from vtc_jax.inputs.workload import ARRIVAL, CACHED, OUTPUT, PROMPT, Workload, block_of_rows
from vtc_jax.servers import registry as servers
from vtc_jax.measures.online import BINS_PER_OCTAVE, EXACT_BINS, LATENCY_BINS, pairs


class ServedShares:
    """The shares every per-lane result reports, from its `service` and `offered` fields
    (float64[B, K]): one definition for the single server's and the cluster's results."""

    @property
    def served_share(self) -> np.ndarray:
        """float64[B, K]: each client's fraction of all service over the run."""
        return shares(self.service)

    @property
    def offered_share(self) -> np.ndarray:
        """float64[B, K]: each client's fraction of the offered demand."""
        return shares(self.offered)


@dataclasses.dataclass(frozen=True)
class LaneResults(ServedShares):
    """Per-lane results. Shapes: B lanes, K clients, C checkpoint rows, H histogram bins.

    Service-like values are in weighted tokens (float64: integer / Q, one rounding).

    Attributes:
      steps: int64[B] horizon run (drain mode: last completion step + 1).
      finished: bool[B] reached the horizon (False: flagged, results partial).
      service, counters: float64[B, K] W_k and the MODEL.md counter c_k after the last step.
      policy_counters: float64[B, K] the policy's own virtual counter where it keeps one
        (vtc_predict, vtc_gateway), else NaN.
      arrived, admitted, completed, rejected: int64[B, K] request counts (rejected: by an
        rpm limit in reject mode).
      waiting, running: int64[B, K] requests waiting / running at the horizon.
      offered: float64[B, K] full cost (weighted tokens) of the requests that arrived
        (rejected ones included): the demand beside `service`.
      offered_steps: int64[B] the steps the offered rate is measured over: `steps`, or in
        drain mode the arrival span S (last arrival + 1).
      span_service: float64[B, K] W over the same span: in drain mode W after the last step
        in which a request arrived (the end of the span), else W at the horizon.
      span_waiting: int64[B] requests waiting at the end of that span (after its admissions).
      max_drift: float64[B] max over steps of max_k W_k - min_k W_k; max_drift_step: int64[B].
      pair_drift: float64[B, K, K] max over jointly backlogged intervals of
        |W_f(t1..t2) - W_g(t1..t2)| (None: not measured).
      backlogged_drift: float64[B] max of pair_drift over pairs (NaN: not measured).
      kv_budget: int64[B] M; max_prompt: int64[B] L_input, the largest arrived prompt.
      bound_u: float64[B] U = max(w_p * L_input, w_q * M); bound_2u: float64[B] 2U, VTC's
        bound on backlogged_drift (MODEL.md).
      backlogged_drift_over_2u: float64[B] backlogged_drift / 2U, the guarantee's ratio (NaN:
        pair drift not measured, or unequal weights: the drifts count raw service, which
        the weighted guarantee does not bound); max_drift_over_2u: float64[B] max_drift / 2U,
        NOT the guarantee (max_drift also grows with differences in demand; NaN with unequal
        weights too).
      throughput: float64[B] weighted tokens per step (sum_k W_k / steps).
      raw_throughput: float64[B] tokens per step (prompt tokens admitted + tokens decoded).
      mean_occupancy: float64[B] mean over steps of KV tokens held at decode, / M.
      share_service: float64[B, K] service in the share window (NaN if none was set).
      wait_hist, done_hist: int64[B, K, H] waiting (admission - arrival) and completion
        (finish - arrival) time histograms in steps; wait_mean, done_mean: float64[B, K].
      record_every: checkpoint stride in steps (0: none).
      checkpoint_steps: int64[C'] steps of `checkpoints` (stride rows plus the last step).
      checkpoints: float64[B, C', K] W after those steps.
      demand: float64[B, C, K] full cost of the requests arriving in stride bucket i.
      backlogged_in: bool[B, C, K] client backlogged at some step of bucket i.
      computed_service: float64[B, K] service counting only computed prefill tokens.
      resource: float64[B, K] resource service R_k in GB (weights share + KV read).
      resource_max_drift: float64[B] max over steps of max_k R_k - min_k R_k (GB).
      resource_share_service: float64[B, K] R in the share window (NaN if none).
      service_exact, counters_exact: object[B, K]; max_drift_exact: object[B] (Fractions,
        computed when read).
      conservation: list[list[str]] per lane: violated conservation laws (empty: all
        hold); None when the token ledger was not measured (check=False).
      events: int64[B] engine events the lane took (steps jumped over while idle cost none).
    """

    steps: np.ndarray
    finished: np.ndarray
    service: np.ndarray
    counters: np.ndarray
    policy_counters: np.ndarray
    arrived: np.ndarray
    admitted: np.ndarray
    completed: np.ndarray
    rejected: np.ndarray
    waiting: np.ndarray
    running: np.ndarray
    offered: np.ndarray
    offered_steps: np.ndarray
    span_service: np.ndarray
    span_waiting: np.ndarray
    max_drift: np.ndarray
    max_drift_step: np.ndarray
    pair_drift: np.ndarray | None
    backlogged_drift: np.ndarray
    kv_budget: np.ndarray
    max_prompt: np.ndarray
    bound_u: np.ndarray
    bound_2u: np.ndarray
    backlogged_drift_over_2u: np.ndarray
    max_drift_over_2u: np.ndarray
    throughput: np.ndarray
    raw_throughput: np.ndarray
    mean_occupancy: np.ndarray
    share_service: np.ndarray
    wait_hist: np.ndarray | None
    done_hist: np.ndarray | None
    wait_mean: np.ndarray
    done_mean: np.ndarray
    record_every: int
    checkpoint_steps: np.ndarray
    checkpoints: np.ndarray
    demand: np.ndarray | None
    backlogged_in: np.ndarray | None
    computed_service: np.ndarray
    resource: np.ndarray
    resource_max_drift: np.ndarray
    resource_share_service: np.ndarray
    conservation: list | None
    events: np.ndarray = None
    service_units: np.ndarray = dataclasses.field(repr=False, default=None)
    counter_units: np.ndarray = dataclasses.field(repr=False, default=None)
    drift_units: np.ndarray = dataclasses.field(repr=False, default=None)
    pair_units: np.ndarray | None = dataclasses.field(repr=False, default=None)
    cost_scale: np.ndarray = dataclasses.field(repr=False, default=None)
    counter_scale: np.ndarray = dataclasses.field(repr=False, default=None)
    number_format: str = dataclasses.field(repr=False, default="wide")
    server_state: Any = dataclasses.field(repr=False, default=None)

    _SHARED = ("record_every", "checkpoint_steps", "number_format")

    def head(self, lanes: int) -> "LaneResults":
        """The first `lanes` lanes."""
        if lanes == len(self.steps):
            return self
        per_lane = {f.name: (getattr(self, f.name)[:lanes] if getattr(self, f.name) is not None else None)
                    for f in dataclasses.fields(self) if f.name not in self._SHARED}
        return dataclasses.replace(self, **per_lane)

    @property
    def _num(self):
        return wide.numbers(self.number_format == "wide")

    @functools.cached_property
    def service_exact(self) -> np.ndarray:
        return _exact(self.service_units, self.cost_scale, self._num)

    @functools.cached_property
    def counters_exact(self) -> np.ndarray:
        scale = [int(a) * int(b) for a, b in zip(self.cost_scale, self.counter_scale)]
        return _exact(self.counter_units, scale, self._num)

    @functools.cached_property
    def max_drift_exact(self) -> np.ndarray:
        return _exact(self.drift_units, self.cost_scale, self._num)

    @functools.cached_property
    def backlogged_drift_exact(self) -> np.ndarray:
        """object[B]: the backlogged drift as exact Fractions (None where not measured)."""
        if self.pair_units is None:
            return np.full(len(self.steps), None, dtype=object)
        pairs_exact = _exact(self.pair_units, self.cost_scale, self._num)
        return np.asarray([max(row, default=Fraction(0)) for row in pairs_exact.reshape(len(self.steps), -1)],
                          dtype=object)

    @property
    def share(self) -> np.ndarray:
        """float64[B, K]: each client's fraction of the service in the share window."""
        return shares(self.share_service)

    def latency_percentile(self, which: str, q: float) -> np.ndarray:
        """float64[B, K]: the q-quantile (0 < q <= 1; the smallest latency x with at least
        a fraction q of requests <= x) of "wait" or "done" times, from the histograms: exact
        below 64 steps, the bin's midpoint above (within 1/8 octave). NaN with no requests
        or when latencies were not measured."""
        hist = {"wait": self.wait_hist, "done": self.done_hist}[which]
        if hist is None:
            return np.full(self.service.shape, np.nan)
        return histogram_quantile(hist, q)

    def windows(self, window: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Service rate y, demand rate d (tokens per step) and backlogged flags per sliding
        window [x, x + window), x = 0, stride, 2*stride, ... inside the recorded buckets.
        Shapes [B, n_windows, K]. `window` and `stride` must be multiples of record_every."""
        every = self.record_every
        if not every or window % every or stride % every or window <= 0 or stride <= 0:
            raise ValueError(f"window {window} and stride {stride} must be positive multiples of "
                             f"record_every {every}")
        if self.demand is None:
            raise ValueError("windows need the 'demand' measure")
        buckets = self.demand.shape[1]
        w, s = window // every, stride // every
        starts = np.arange(0, buckets - w + 1, s)
        if len(starts) == 0:
            raise ValueError(f"no window of {window} steps fits the {buckets * every} recorded steps")
        ckpt = self.checkpoints[:, : buckets]  # row i: W after step (i+1)*every - 1
        before = np.concatenate([np.zeros_like(ckpt[:, :1]), ckpt], axis=1)  # W before bucket i
        y = (before[:, starts + w] - before[:, starts]) / window
        demand_cum = np.concatenate([np.zeros_like(self.demand[:, :1]), np.cumsum(self.demand, axis=1)], axis=1)
        d = (demand_cum[:, starts + w] - demand_cum[:, starts]) / window
        back_cum = np.concatenate([np.zeros_like(self.backlogged_in[:, :1], dtype=np.int64),
                                   np.cumsum(self.backlogged_in, axis=1)], axis=1)
        backlogged = (back_cum[:, starts + w] - back_cum[:, starts]) > 0
        return y, d, backlogged

    def service_difference(self, window: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """The VTC paper's service difference per window,
        sum_j min(max_k y_k - y_j, |d_j - y_j|); returns (max, mean) over windows, [B] each."""
        y, d, _ = self.windows(window, stride)
        diff = service_difference(y, d, client_axis=2)
        return diff.max(axis=1), diff.mean(axis=1)

    def jain_index(self, window: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """Jain's index (sum y)^2 / (n sum y^2) of windowed service over the clients
        backlogged in the window; returns (mean, min) over windows with any service, [B]."""
        y, _, backlogged = self.windows(window, stride)
        yb = np.where(backlogged, y, 0.0)
        n = backlogged.sum(axis=2)
        sq = (yb ** 2).sum(axis=2)
        valid = (n > 0) & (sq > 0)
        jain = np.where(valid, yb.sum(axis=2) ** 2 / np.maximum(n * sq, 1e-300), np.nan)
        with np.errstate(all="ignore"):
            return np.nanmean(jain, axis=1), np.nanmin(jain, axis=1)


OVERLOAD = 1.05  # offered / served over the arrival span above this, with a queue left, is overload


def load_values(results: LaneResults) -> dict:
    """The load line per lane (float64[B] each), offered and served work measured over the
    same span (MODEL.md, "Load line"): offered_per_step and served_per_step over
    `offered_steps`, their ratio (NaN when nothing was served), waiting_at_span_end (the
    queue when the last request arrived) and waiting_at_end (at the horizon)."""
    span = np.maximum(results.offered_steps, 1).astype(np.float64)
    offered = results.offered.sum(axis=1) / span
    served = results.span_service.sum(axis=1) / span
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(served > 0, offered / np.where(served > 0, served, 1.0), np.nan)
    return {"offered_per_step": offered, "served_per_step": served, "offered_over_served": ratio,
            "waiting_at_span_end": results.span_waiting.astype(np.float64),
            "waiting_at_end": results.waiting.sum(axis=1).astype(np.float64)}


def bound_metrics(results: LaneResults) -> dict:
    """VTC's bound per lane (float64[B] each): bound_2u = 2U, backlogged_drift_over_2u (the
    guarantee's ratio; left out where pair drift was not measured) and max_drift_over_2u
    (not the guarantee: max drift grows with differences in demand)."""
    out = {"bound_2u": results.bound_2u, "max_drift_over_2u": results.max_drift_over_2u}
    if results.pair_drift is not None:  # by what was measured, never by the values: every chunk of a
        out["backlogged_drift_over_2u"] = results.backlogged_drift_over_2u  # sweep has the same keys
    return out


def overloaded(ratio, waiting_at_span_end) -> bool:
    """Overload: over the arrival span more work was offered than served (by over 5%) and a
    queue was left when the last request arrived; requests still running then (a drain
    tail) are not a queue."""
    return ratio is not None and bool(np.isfinite(ratio)) and ratio > OVERLOAD and waiting_at_span_end > 0


def shares(values: np.ndarray) -> np.ndarray:
    """Each entry's fraction of its row's sum over the last axis (NaN where the sum is 0)."""
    total = values.sum(axis=-1, keepdims=True)
    return np.divide(values, total, out=np.full(values.shape, np.nan), where=total > 0)


def histogram_quantile(hist: np.ndarray, q: float) -> np.ndarray:
    """The q-quantile of latency histograms int[..., H] (see LaneResults.latency_percentile)."""
    counts = hist.sum(axis=-1, keepdims=True)
    cdf = np.cumsum(hist, axis=-1)
    need = np.ceil(q * counts - 1e-9)
    bin_index = (cdf < np.maximum(need, 1)).sum(axis=-1)
    lo, hi = latency_bin_edges()
    mid = np.where(hi - lo > 1, (lo + hi - 1) / 2, lo)
    out = mid[np.minimum(bin_index, LATENCY_BINS - 1)]
    return np.where(counts[..., 0] > 0, out, np.nan)


def service_difference(rate: np.ndarray, demand: np.ndarray, present: np.ndarray | None = None, *,
                       client_axis: int) -> np.ndarray:
    """The VTC paper's service difference per window: sum over (present) clients j of
    min(max_k y_k - y_j, |d_j - y_j|), with y the service rate and d the demand rate.
    `present` (bool, clients only) restricts the clients; the client axis is summed out."""
    if present is None:
        present = np.ones(rate.shape[client_axis], bool)
    shape = [1] * rate.ndim
    shape[client_axis] = -1
    mask = np.asarray(present).reshape(shape)
    top = np.where(mask, rate, -np.inf).max(axis=client_axis, keepdims=True)
    terms = np.minimum(top - rate, np.abs(demand - rate))
    return np.where(mask, terms, 0.0).sum(axis=client_axis)


def latency_bin_edges() -> tuple[np.ndarray, np.ndarray]:
    """int64[H] lower (inclusive) and upper (exclusive) latency of every histogram bin."""
    b = np.arange(LATENCY_BINS + 1)
    octave = 6 + (b - EXACT_BINS) // BINS_PER_OCTAVE
    sub = (b - EXACT_BINS) % BINS_PER_OCTAVE
    log_lo = (BINS_PER_OCTAVE + sub).astype(np.int64) << np.maximum(octave - 3, 0)
    lo = np.where(b < EXACT_BINS, b, log_lo)
    return lo[:-1], lo[1:]


def _exact(units: np.ndarray, scale: Sequence[int], num) -> np.ndarray:
    """Exact integers (number format `num`) in lane units -> Fractions; `scale[b]` is lane
    b's unit."""
    ints = num.to_int(units)
    out = np.empty(ints.shape, dtype=object)
    for idx in np.ndindex(ints.shape):
        out[idx] = Fraction(ints[idx], int(scale[idx[0]]))
    return out


def _tokens(units: np.ndarray, scale: Sequence[int], num) -> np.ndarray:
    """Exact integers in lane units -> float64 tokens (exact integer / scale, one rounding,
    for totals below 2^53 units)."""
    values = num.to_float(units)
    per_lane = np.asarray([int(s) for s in scale], dtype=np.float64).reshape((-1,) + (1,) * (values.ndim - 1))
    return values / per_lane


def _nan(shape) -> np.ndarray:
    return np.full(shape, np.nan)


@functools.partial(jax.jit, static_argnames=("num_clients", "buckets", "every"))
def workload_stats(requests, first, steps, prefill, decode, context, charge_cached, *, num_clients: int,
                   buckets: int, every: int):
    """Per lane (vmapped by the caller): over the requests with arrival < steps, each
    client's count (int32[K]) and full cost in cost units (float32[K]), the largest prompt
    (int32[]), and the full cost arriving per checkpoint bucket of `every` steps
    (float32[buckets, K]; the paper's demand)."""
    r = requests.shape[0]
    block = block_of_rows(first, r)  # (a binary search per row cost a third of this function at K = 87)
    arrival = requests[:, ARRIVAL]
    arrives = arrival < steps
    p, o = requests[:, PROMPT].astype(jnp.float32), requests[:, OUTPUT].astype(jnp.float32)
    charged = jnp.where(charge_cached, p, p - requests[:, CACHED].astype(jnp.float32))
    cost = prefill * charged + decode * o + context * (o * p + o * (o - 1) / 2)
    count = jax.ops.segment_sum(arrives.astype(jnp.int32), block, num_segments=num_clients)
    offered = jax.ops.segment_sum(jnp.where(arrives, cost, 0.0), block, num_segments=num_clients)
    bucket = jnp.where(arrives, arrival // max(every, 1), buckets)
    demand = jnp.zeros((buckets + 1, num_clients), jnp.float32).at[jnp.minimum(bucket, buckets), block].add(
        jnp.where(arrives, cost, 0.0))[:buckets]
    return count, offered, jnp.where(arrives, requests[:, PROMPT], 0).max(), demand, jnp.where(arrives, arrival, -1).max()


def lane_workload_stats(workload: Workload, steps: np.ndarray, params, shared: bool, num_clients: int,
                        buckets: int = 0, every: int = 0):
    """numpy (arrived int64[B, K], offered cost units float64[B, K], max prompt int64[B],
    demand per bucket in cost units float64[B, buckets, K], last arrival step int64[B]
    (-1: none))."""
    clock = np.dtype(workload.requests.dtype)  # int64 rows: a wide clock's, whose steps are int64 too
    steps = jnp.asarray(np.minimum(steps, np.iinfo(clock).max).astype(clock))
    c = params.costs
    count, offered, max_prompt, demand, last = _lanes_stats(
        workload.requests, workload.first, steps, c.prefill, c.decode, c.context, c.charge_cached,
        shared=shared, num_clients=num_clients, buckets=buckets, every=every)
    return (np.asarray(count, np.int64), np.asarray(offered, np.float64), np.asarray(max_prompt, np.int64),
            np.asarray(demand, np.float64), np.asarray(last, np.int64))


@functools.partial(jax.jit, static_argnames=("shared", "num_clients", "buckets", "every"))
def _lanes_stats(requests, first, steps, prefill, decode, context, charge_cached, *, shared: bool,
                 num_clients: int, buckets: int, every: int):
    """`workload_stats` of every lane, compiled as one program (one pass over the rows, on
    the devices the lanes are sharded over)."""
    fn = functools.partial(workload_stats, num_clients=num_clients, buckets=buckets, every=every)
    axes = (None if shared else 0,) * 2 + (0,) * 5
    return jax.vmap(fn, in_axes=axes)(requests, first, steps, prefill, decode, context, charge_cached)


def collect(host, done: np.ndarray, config, settings: Sequence[Settings], scales: Scales, arrived_streams: np.ndarray,
            offered_units: np.ndarray, max_prompt: np.ndarray, rejected: np.ndarray,
            demand_units: np.ndarray, last_arrival: np.ndarray | None = None) -> LaneResults:
    """Host-side results from a final batched state (numpy leaves, B lanes).

    arrived_streams: int64[B, K] requests with arrival < steps counted from the streams
    (independently of the engine's pointers); offered_units: float64[B, K] their full cost
    in cost units (before any rpm rejection); rejected: int64[B, K]; demand_units:
    float64[B, C, K] the full cost arriving per checkpoint bucket (rejected requests too)."""
    from vtc_jax.policies import registry

    m = host.measures
    b = len(settings)
    num = wide.numbers(config.wide)
    q = [int(x) for x in scales.cost_scale]
    steps = np.asarray(host.step, dtype=np.int64)
    finished = np.asarray(done, bool) & ~np.asarray(host.overflow, bool)
    admitted = np.asarray(host.admitted, dtype=np.int64)
    completed = np.asarray(host.completed, dtype=np.int64)
    arrived = np.asarray(host.arrived, dtype=np.int64)
    if config.drain:
        finished &= (arrived_streams.sum(axis=1) == completed.sum(axis=1))
    service = _tokens(host.service, q, num)
    drift_units = np.asarray(m.max_drift)
    drift_units = np.where((num.to_float(drift_units) < 0).reshape((b,) + (1,) * (drift_units.ndim - 1)), 0,
                           drift_units)
    max_drift = _tokens(drift_units, q, num)
    kv_budget = np.asarray([s.kv_budget for s in settings], dtype=np.int64)
    w_p = np.asarray([float(s.w_p) for s in settings])
    w_q = np.asarray([float(s.w_q) for s in settings])
    bound_u = np.maximum(w_p * max_prompt, w_q * kv_budget)
    # GPU-time charges (--cost time) have no token bound: VTC's 2U is stated in tokens
    bound_u = np.where([bool(s.w_time) for s in settings], np.nan, bound_u)
    per_step = np.maximum(steps, 1)
    shape_bk = service.shape
    qd = [int(a) * int(c) for a, c in zip(scales.cost_scale, scales.counter_scale)]
    policy_counters = _nan(shape_bk)
    for name in config.policies:
        counters_fn = registry.get(name).counters
        if counters_fn is None:
            continue
        lanes = np.asarray([s.policy == name for s in settings])
        if lanes.any():
            units = np.asarray(jax.vmap(counters_fn)(jax.tree_util.tree_map(jnp.asarray, host.policy[name])))
            policy_counters[lanes] = _tokens(units, qd, num)[lanes]
    pair = None
    if m.pair_drift is not None:
        f, g = pairs(config.num_clients)
        pair = np.zeros((b, config.num_clients, config.num_clients))
        pair[:, f, g] = pair[:, g, f] = _tokens(m.pair_drift, q, num)
    backlogged_drift = pair.reshape(b, -1).max(axis=1) if pair is not None else _nan(b)
    has_window = np.asarray([s.share_window[1] > 0 for s in settings])
    share = (_tokens(m.share_end, q, num) - _tokens(m.share_start, q, num)) if m.share_start is not None else _nan(shape_bk)
    ckpt_steps, ckpt_units = _checkpoints(host, config, steps, num)
    ledger = m.prompt_tokens is not None
    with np.errstate(invalid="ignore", divide="ignore"):
        if m.wait_hist is not None:
            wait_mean = num.to_float(m.wait_sum) / admitted
            done_mean = num.to_float(m.done_sum) / np.asarray(m.done_hist).sum(axis=-1)
        else:
            wait_mean = done_mean = _nan(shape_bk)
    charge_cached = np.asarray([[float(s.w_p) * s.charge_cached] for s in settings])
    span_mode = bool(config.drain and last_arrival is not None)  # drain: the load is read over the arrival span
    # With unequal weights VTC bounds weighted service (W_k / w_k), not the raw drifts
    # measured here: their ratio to 2U would read as a broken guarantee.
    unweighted = np.asarray([len(set(s.weights or ())) <= 1 for s in settings])
    results = LaneResults(
        server_state=host.server, events=np.asarray(host.iterations, np.int64), steps=steps, finished=finished, service=service,
        counters=_tokens(host.counter, qd, num),
        policy_counters=policy_counters, arrived=arrived, admitted=admitted, completed=completed,
        rejected=rejected, waiting=arrived - admitted, running=admitted - completed,
        # demand is priced in tokens: under GPU-time charges (--cost time) it is unknown before the steps run
        offered=np.where(np.asarray([bool(s.w_time) for s in settings])[:, None], np.nan,
                         offered_units / np.asarray(q, np.float64)[:, None]),
        offered_steps=(np.minimum(np.asarray(last_arrival, np.int64) + 1, steps) if span_mode else steps),
        span_service=_tokens(m.span_service, q, num) if span_mode else service,
        span_waiting=(np.asarray(m.span_waiting, np.int64) if span_mode else (arrived - admitted).sum(axis=1)),
        max_drift=max_drift, max_drift_step=np.asarray(m.max_drift_step, dtype=np.int64),
        pair_drift=pair, backlogged_drift=backlogged_drift,
        kv_budget=kv_budget, max_prompt=max_prompt, bound_u=bound_u, bound_2u=2 * bound_u,
        backlogged_drift_over_2u=np.where(unweighted, backlogged_drift / (2 * bound_u), np.nan),
        max_drift_over_2u=np.where(unweighted, max_drift / (2 * bound_u), np.nan),
        throughput=np.where(steps > 0, service.sum(axis=1) / per_step, 0.0),
        raw_throughput=(np.where(steps > 0, (num.to_float(m.prompt_tokens) + num.to_float(m.decoded_tokens)).sum(
            axis=1) / per_step, 0.0) if ledger else _nan(b)),
        mean_occupancy=(np.where(steps > 0, num.to_float(m.occupancy_sum) / per_step / kv_budget, 0.0)
                        if m.occupancy_sum is not None else _nan(b)),
        share_service=np.where(has_window[:, None], share, np.nan),
        wait_hist=np.asarray(m.wait_hist, np.int64) if m.wait_hist is not None else None,
        done_hist=np.asarray(m.done_hist, np.int64) if m.done_hist is not None else None,
        wait_mean=wait_mean, done_mean=done_mean,
        record_every=config.record_every, checkpoint_steps=ckpt_steps, checkpoints=_tokens(ckpt_units, q, num),
        demand=(demand_units / np.asarray(q, np.float64)[:, None, None] if m.backlogged_in is not None else None),
        backlogged_in=np.asarray(m.backlogged_in, bool) if m.backlogged_in is not None else None,
        computed_service=(service - charge_cached * num.to_float(m.cached_admitted) if ledger else _nan(shape_bk)),
        resource=np.asarray(m.resource[..., 0], np.float64) if m.resource is not None else _nan(shape_bk),
        resource_max_drift=(np.asarray(m.resource_max_drift, np.float64) if m.resource is not None else _nan(b)),
        resource_share_service=(np.where(has_window[:, None], np.asarray(m.resource_share_end, np.float64)
                                         - np.asarray(m.resource_share_start, np.float64), np.nan)
                                if m.resource_share_start is not None else _nan(shape_bk)),
        conservation=check_conservation(host, settings, config, arrived_streams) if ledger else None,
        service_units=np.asarray(host.service), counter_units=np.asarray(host.counter), drift_units=drift_units,
        cost_scale=np.asarray(scales.cost_scale), counter_scale=np.asarray(scales.counter_scale),
        number_format=num.name, pair_units=np.asarray(m.pair_drift) if m.pair_drift is not None else None)
    return results


def check_conservation(host, settings: Sequence[Settings], config, arrived_streams: np.ndarray) -> list:
    """Per lane, the conservation laws that do not hold (an empty list: all hold).

    1. Requests: every arrived request (counted from the streams) is waiting, running
       (counted in the completion calendar) or completed, and the engine's own pointers and
       counts agree.
    2. Service: W_k equals, in exact integers, the charges of the tokens actually
       processed: w_p * (admitted prompt tokens - cached ones, unless sent tokens are
       charged) + w_q * decoded tokens + beta * their contexts, from a separate ledger.
    """
    params, _ = encode_settings(settings, config.num_clients, config.policies, config.server)
    m = host.measures
    num = wide.numbers(config.wide)
    service = num.to_int(host.service)
    prompt, cached = num.to_int(m.prompt_tokens), num.to_int(m.cached_admitted)
    decoded, context = num.to_int(m.decoded_tokens), num.to_int(m.decoded_context)
    arrived = np.asarray(host.arrived, np.int64)
    head = np.asarray(host.head, np.int64)
    admitted = np.asarray(host.admitted, np.int64)
    completed = np.asarray(host.completed, np.int64)
    server = servers.get(config.server)
    running = np.asarray(jax.vmap(server.load)(host.server).running, np.int64)  # per lane
    held = server.census(host.server, config.num_clients)  # counted in the server's own structure
    out = []
    for b, s in enumerate(settings):
        problems = []
        on_calendar = held[b]
        waiting = arrived[b] - head[b]
        if not (arrived_streams[b] == arrived[b]).all():
            problems.append(f"arrived {arrived[b].tolist()} != streams {arrived_streams[b].tolist()}")
        if not ((waiting >= 0).all() and (arrived[b] == waiting + on_calendar + completed[b]).all()):
            problems.append("arrived != waiting + running + completed")
        if not ((head[b] == admitted[b]).all() and (on_calendar == running[b]).all()):
            problems.append("queue pointers, admissions and the completion calendar disagree")
        a_p, a_q, c = (int(x[b]) for x in (params.costs.prefill, params.costs.decode, params.costs.context))
        for k in range(config.num_clients):
            charged_prompt = prompt[b, k] - (0 if s.charge_cached else cached[b, k])
            if service[b, k] != a_p * charged_prompt + a_q * decoded[b, k] + c * context[b, k]:
                problems.append(f"client {k}: service != charges of processed tokens")
        out.append(problems)
    return out


def _checkpoints(host, config, steps: np.ndarray, num):
    """Checkpoint rows at steps N-1, 2N-1, ... below the longest run, plus its last step;
    a lane that ran fewer steps repeats its final service; a row the lane jumped over
    (idle: W did not change) takes the row before it. Returns (steps, int64 units)."""
    final = np.asarray(host.service, dtype=np.int64)
    max_steps = int(steps.max()) if steps.size else 0
    if not config.record_every or max_steps == 0 or host.measures.checkpoints is None:
        return np.asarray([max(max_steps - 1, 0)], np.int64), final[:, None]
    every = config.record_every
    buf = np.asarray(host.measures.checkpoints, dtype=np.int64).copy()
    for i in range(buf.shape[1]):  # forward-fill rows skipped by idle jumps
        unwritten = num.to_float(buf[:, i]) < 0
        buf[:, i][unwritten] = buf[:, i - 1][unwritten] if i else 0
    ckpt_steps = list(range(every - 1, max_steps, every))
    if not ckpt_steps or ckpt_steps[-1] != max_steps - 1:
        ckpt_steps.append(max_steps - 1)
    rows = []
    for s in ckpt_steps:
        slot = (s + 1) // every - 1
        if (s + 1) % every == 0 and slot < buf.shape[1]:
            rows.append(np.where((s < steps - 1).reshape((-1,) + (1,) * (final.ndim - 1)), buf[:, slot], final))
        else:
            rows.append(final)
    return np.asarray(ckpt_steps, np.int64), np.stack(rows, axis=1)
