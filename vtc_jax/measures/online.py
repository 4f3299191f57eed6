"""Measures accumulated in the scan carry (device side), switched on per run.

Everything a sweep reports is folded into `Measures` as the lane runs; time series exist
only at the checkpoint stride `record_every`. A `MeasureConfig` (static) says which
measures the carry holds: a part that is off is `None` in the pytree and costs nothing.
Drift (max over steps of max_k W_k - min_k W_k, and its step) and the load snapshot (W and
the requests waiting after the last step in which a request arrived) are always on. The engine
calls two hooks:

  on_admit(m, ...)     one admission (latency histograms, the token ledger);
  on_finish(m, ...)    the end of a step (drift, pair drift, occupancy, checkpoints, windows).

A step may end with a jump over idle steps (nothing running or waiting, engine.py): the
hooks get the first step after the jump, and every measure treats the skipped steps as
what they are (no service, no backlog, no occupancy).

Units: service-like quantities are in the lane's integer cost units (settings.py).
Latency histograms: bin b < 64 holds exactly b steps; above, 8 bins per octave, so a
percentile read from them is exact below 64 steps and within 1/8 octave (about 9%) above.
Service-like values and long sums are exact integers in the run's number format
(wide.py: WIDE pairs, or NARROW int32 when the planner proved every value fits).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients
from vtc_jax.core.wide import MAX_ADD

I32 = jnp.int32
EXACT_BINS = 64
BINS_PER_OCTAVE = 8
LATENCY_BINS = EXACT_BINS + BINS_PER_OCTAVE * 25  # covers every int32 latency
NAMES = ("pair_drift", "latency", "resource", "ledger", "occupancy", "demand", "share")
# pair drift keeps K x K intervals per lane and touches them every event: the commands
# measure it up to this many clients and say so above (4,000 clients took 9 minutes)
PAIR_DRIFT_MAX_CLIENTS = 256


@dataclasses.dataclass(frozen=True)
class MeasureConfig:
    """Static switches (each off costs nothing in the carry).

    Attributes:
      pair_drift: drift over jointly backlogged intervals for every client pair (O(K^2)).
      latency: per-client waiting/completion-time histograms and sums (O(K * 264)).
      resource: per-client resource service (bytes moved), its drift and window share.
      ledger: the token ledger (prompt, cached, decoded tokens and decoded context per
        client): raw throughput, computed service and the conservation check.
      occupancy: the sum over steps of KV tokens held (mean occupancy).
      demand: backlog per checkpoint bucket, for the paper's windowed measures beside the
        demand per bucket (computed from the workload after the run; needs record_every).
      share: service at the edges of Settings.share_window.
    """

    pair_drift: bool = False
    latency: bool = False
    resource: bool = False
    ledger: bool = False
    occupancy: bool = False
    demand: bool = False
    share: bool = False

    @classmethod
    def of(cls, names) -> "MeasureConfig":
        """From measure names ("all" for every one)."""
        names = set(names)
        if "all" in names:
            names = set(NAMES)
        unknown = names - set(NAMES)
        if unknown:
            raise ValueError(f"unknown measure {sorted(unknown)[0]!r}; choose from {', '.join(NAMES)} or all")
        return cls(**{n: n in names for n in NAMES})

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in NAMES if getattr(self, n))

    def union(self, other: "MeasureConfig") -> "MeasureConfig":
        return MeasureConfig.of(set(self.names()) | set(other.names()))


ALL = MeasureConfig.of(["all"])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Measures:
    """One lane's accumulators. K clients, C checkpoint rows. Exact integers are in the run's
    number format (wide.py; "(, 2)" below marks the wide format's trailing axis). Fields of
    a measure that is off are None.

    Attributes:
      max_drift: int32[(2)]  max over steps of max_k W_k - min_k W_k (negative before any step).
      max_drift_step: int32[]  first step reaching it (the clock's dtype: int64 for a wide clock).
      span_arrived: int32[]  requests arrived by the last step in which one arrived;
        span_service: int32[K(, 2)] W after that step; span_waiting: int32[] requests
        waiting after its admissions (the end of the arrival span: the load line compares
        offered and served work over the same span, MODEL.md).
      checkpoints: int32[C, K, 2]  W after steps (i+1)*record_every - 1 (high word -1:
        not written, the lane jumped over it; results.py fills it from the previous row).
      backlogged_in: bool[C, K]  client backlogged (after arrivals) at some step of bucket i.
      service_at_start: int32[K, 2]  W at the start of the current step (pair drift).
      head_at_start: int32[K]  FIFO heads at the start of the current step.
      in_period: bool[P]; period_max, period_min, pair_drift: int32[P(, 2)]  for each pair
        f < g (P = K(K-1)/2, `pairs`), its jointly backlogged periods and the extremes of
        W_f - W_g in them.
      share_start, share_end: int32[K, 2]  W at the share window's edges.
      prompt_tokens, cached_admitted, decoded_tokens, decoded_context: int32[K, 2]  the
        token ledger.
      occupancy_sum: int32[2]  sum of the KV tokens held at each decode phase.
      wait_hist, done_hist: int32[K, LATENCY_BINS]; wait_sum, done_sum: int32[K, 2].
      resource: float32[K, 2]  resource service R_k in GB (compensated sum: value, error);
      resource_max_drift: float32[]; resource_share_start, resource_share_end: float32[K].
    """

    max_drift: jax.Array
    max_drift_step: jax.Array
    span_arrived: jax.Array
    span_service: jax.Array
    span_waiting: jax.Array
    checkpoints: jax.Array | None = None
    backlogged_in: jax.Array | None = None
    service_at_start: jax.Array | None = None
    head_at_start: jax.Array | None = None
    in_period: jax.Array | None = None
    period_max: jax.Array | None = None
    period_min: jax.Array | None = None
    pair_drift: jax.Array | None = None
    share_start: jax.Array | None = None
    share_end: jax.Array | None = None
    prompt_tokens: jax.Array | None = None
    cached_admitted: jax.Array | None = None
    decoded_tokens: jax.Array | None = None
    decoded_context: jax.Array | None = None
    occupancy_sum: jax.Array | None = None
    wait_hist: jax.Array | None = None
    done_hist: jax.Array | None = None
    wait_sum: jax.Array | None = None
    done_sum: jax.Array | None = None
    resource: jax.Array | None = None
    resource_max_drift: jax.Array | None = None
    resource_share_start: jax.Array | None = None
    resource_share_end: jax.Array | None = None


def pairs(num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """(f, g) int32[P]: every client pair with f < g."""
    f, g = np.triu_indices(num_clients, k=1)
    return f.astype(np.int32), g.astype(np.int32)


def init_measures(num_clients: int, num_checkpoints: int, config: MeasureConfig, num, clock=I32) -> Measures:
    """Empty measures; `clock`: the lane's clock dtype (max_drift_step is a step)."""
    k, c = num_clients, num_checkpoints
    wk = lambda: num.zeros((k,))  # noqa: E731
    parts = dict(max_drift=num.constant((), -1), max_drift_step=jnp.zeros((), clock), span_arrived=jnp.zeros((), I32),
                 span_service=wk(), span_waiting=jnp.zeros((), I32))
    if c:
        parts["checkpoints"] = num.constant((c, k), -1)  # negative: not written (an idle jump)
    if config.demand and c:
        parts["backlogged_in"] = jnp.zeros((c, k), bool)
    if config.pair_drift or (config.demand and c):
        parts["head_at_start"] = jnp.zeros(k, I32)
    if config.pair_drift:
        p = len(pairs(k)[0])
        parts.update(service_at_start=wk(), in_period=jnp.zeros(p, bool), period_max=num.zeros((p,)),
                     period_min=num.zeros((p,)), pair_drift=num.zeros((p,)))
    if config.share:
        parts.update(share_start=wk(), share_end=wk())
    if config.ledger:
        parts.update(prompt_tokens=wk(), cached_admitted=wk(), decoded_tokens=wk(), decoded_context=wk())
    if config.occupancy:
        parts["occupancy_sum"] = num.zeros()
    if config.latency:
        parts.update(wait_hist=jnp.zeros((k, LATENCY_BINS), I32), done_hist=jnp.zeros((k, LATENCY_BINS), I32),
                     wait_sum=wk(), done_sum=wk())
    if config.resource:
        parts.update(resource=jnp.zeros((k, 2), jnp.float32), resource_max_drift=jnp.zeros((), jnp.float32))
        if config.share:
            parts.update(resource_share_start=jnp.zeros(k, jnp.float32), resource_share_end=jnp.zeros(k, jnp.float32))
    return Measures(**parts)


def latency_bin(steps: jax.Array) -> jax.Array:
    """int32 latency (>= 0) -> histogram bin (see module docstring)."""
    x = jnp.maximum(steps, 0).astype(I32)
    octave = 31 - jax.lax.clz(jnp.maximum(x, 1))  # floor(log2 x)
    sub = (x >> jnp.maximum(octave - 3, 0)) & (BINS_PER_OCTAVE - 1)
    log_bin = EXACT_BINS + BINS_PER_OCTAVE * (octave - 6) + sub
    return jnp.where(x < EXACT_BINS, x, log_bin)


def on_admit(m: Measures, mask, client, step, arrival, prompt, output, cached, horizon, num) -> Measures:
    """An admission at `step` of a request (arrival, prompt, output, cached) of `client`."""
    take = mask.astype(I32)
    updates = {}
    if m.prompt_tokens is not None:
        updates.update(
            prompt_tokens=m.prompt_tokens.at[client].set(num.add(m.prompt_tokens[client], take * prompt)),
            cached_admitted=m.cached_admitted.at[client].set(num.add(m.cached_admitted[client], take * cached)))
    if m.wait_hist is not None:
        wait = step - arrival
        done = step + output - 1 - arrival  # no preemption: its completion step is known now
        if wait.dtype != I32:  # a wide clock's: a latency past wide.MAX_ADD (35.8 minutes of us) is kept as that
            wait, done = (jnp.minimum(x, MAX_ADD).astype(I32) for x in (wait, done))
        completes = (mask & (step + output - 1 < horizon)).astype(I32)
        updates.update(
            wait_hist=m.wait_hist.at[client, latency_bin(wait)].add(take),
            done_hist=m.done_hist.at[client, latency_bin(done)].add(completes),
            wait_sum=m.wait_sum.at[client].set(num.add(m.wait_sum[client], take * wait)),
            done_sum=m.done_sum.at[client].set(num.add(m.done_sum[client], completes * done)))
    return dataclasses.replace(m, **updates) if updates else m


def kahan_add(acc: jax.Array, x: jax.Array) -> jax.Array:
    """Compensated float32 sum: acc[..., 0] value, acc[..., 1] running error."""
    y = x - acc[..., 1]
    total = acc[..., 0] + y
    return jnp.stack([total, (total - acc[..., 0]) - y], axis=-1)


def step_resource(running, context, resource) -> jax.Array:
    """float32[K] GB moved for each client by one decode step: its share of the weights
    (by sequences in the batch) plus its sequences' KV (context x GB per token)."""
    n = running.astype(jnp.float32)
    weights_share = jnp.where(n.sum() > 0, n / jnp.maximum(n.sum(), 1.0), 0.0) * resource[0]
    return weights_share + context.astype(jnp.float32) * resource[1]


def _crossed(edge, step, next_step):
    """The end of step `edge - 1` lies in [step, next_step): W then is W now."""
    return (step <= edge - 1) & (edge - 1 < next_step)


def on_finish(m: Measures, mask, step, next_step, service, head, arrived, running, context, decoded, attended,
              share_window, resource, record_every: int, num, *, quiet_steps=None, step_service=None,
              arrival_service=None) -> Measures:
    """Step `step` ends where `mask` and the lane moves on to `next_step` (> step + 1 after
    an idle jump); `service` is W after it, `head`/`arrived` the FIFO pointers (arrivals of
    the step all in), `running` and `context` (int32[K]) the requests running and the KV
    tokens they held, `decoded` and `attended` (int32[K]) the tokens the step decoded and
    the context those decodes read (the server's Work; on the ideal server every running
    request decodes, so they equal running and context).

    With `quiet_steps` (int32[] n, engine.py), the call ends step `step` and the n quiet
    steps after it: `step_service` is W after step `step`, `service` after the last quiet
    step and `arrival_service` after the last of them with an arrival (`step_service`
    where none). W is linear over them and the clients backlogged in them stay so (those
    after the step's admissions), so the drifts' extremes are at the two ends. `decoded`,
    `attended` are their sums."""
    drift, drift_step, jumped = _drift(service, num), step, next_step > step + 1
    if quiet_steps is not None:
        first = _drift(step_service, num)
        later = num.less(first, drift)  # strictly larger at the end: first reached there
        drift, drift_step = num.where(later, drift, first), jnp.where(later, step + quiet_steps, step)
        jumped = next_step > step + 1 + quiet_steps
    new_max = mask & num.less(m.max_drift, drift)
    m32 = mask.astype(I32)
    arrived_total = over_clients.total(arrived)
    arrivals = mask & (arrived_total > m.span_arrived)  # a request arrived in this step
    updates = dict(max_drift=num.where(new_max, drift, m.max_drift),
                   max_drift_step=jnp.where(new_max, drift_step, m.max_drift_step),
                   span_arrived=jnp.where(arrivals, arrived_total, m.span_arrived),
                   span_service=num.where(arrivals, service if arrival_service is None else arrival_service,
                                          m.span_service),
                   span_waiting=jnp.where(arrivals, over_clients.total(arrived - head), m.span_waiting))
    if m.head_at_start is not None:
        backlogged = m.head_at_start < arrived  # after the step's arrivals, before admission
        updates["head_at_start"] = jnp.where(mask, head, m.head_at_start)
    if m.decoded_tokens is not None:
        updates.update(decoded_tokens=num.add(m.decoded_tokens, m32 * decoded),
                       decoded_context=num.add(m.decoded_context, m32 * attended))
    if m.occupancy_sum is not None:
        updates["occupancy_sum"] = num.add(m.occupancy_sum, m32 * over_clients.total(context))
    if m.share_start is not None:
        updates.update(
            share_start=num.where(mask & _crossed(share_window[0], step, next_step), service, m.share_start),
            share_end=num.where(mask & _crossed(share_window[1], step, next_step), service, m.share_end))
    if m.resource is not None:
        r = kahan_add(m.resource, jnp.where(mask, step_resource(running, context, resource), 0.0))
        r_drift = r[:, 0].max() - r[:, 0].min()
        updates.update(resource=r, resource_max_drift=jnp.where(mask, jnp.maximum(m.resource_max_drift, r_drift),
                                                                m.resource_max_drift))
        if m.resource_share_start is not None:
            updates.update(
                resource_share_start=jnp.where(mask & _crossed(share_window[0], step, next_step), r[:, 0],
                                               m.resource_share_start),
                resource_share_end=jnp.where(mask & _crossed(share_window[1], step, next_step), r[:, 0],
                                             m.resource_share_end))
    if m.checkpoints is not None:
        rows = m.checkpoints.shape[0]
        slot = (step + record_every) // record_every - 1  # first checkpoint at or after `step`
        due = mask & ((slot + 1) * record_every <= next_step) & (slot < rows)
        row = jnp.minimum(slot, rows - 1)
        updates["checkpoints"] = m.checkpoints.at[row].set(num.where(due, service, m.checkpoints[row]))
        if m.backlogged_in is not None:
            inside = mask & (step // record_every < rows)
            bucket = jnp.minimum(step // record_every, rows - 1)
            updates["backlogged_in"] = m.backlogged_in.at[bucket].set(m.backlogged_in[bucket] | (backlogged & inside))
    if m.pair_drift is not None:
        if quiet_steps is None:
            updates.update(_pair_drift(m, mask, service, backlogged, jumped, num))
        else:  # step `step`, then the quiet steps as one more (their backlogged clients: after its admissions)
            first = dataclasses.replace(m, **_pair_drift(m, mask, step_service, backlogged, jumped, num))
            updates.update(_pair_drift(first, mask & (quiet_steps > 0), service, head < arrived, jnp.zeros((), bool), num))
    return dataclasses.replace(m, **updates)


def _drift(service, num):
    return num.sub(num.max_of(service), num.min_of(service))


def _pair_drift(m: Measures, mask, service, backlogged, jumped, num) -> dict:
    """Max |(W_f - W_g)(t2) - (W_f - W_g)(t1)| over intervals in which f and g are both
    backlogged at every step: per jointly backlogged period, max minus min of the
    difference, taken from just before the period's first step to its last step. An idle
    jump ends every period (nobody is backlogged in the skipped steps)."""
    f, g = pairs(backlogged.shape[0])
    joint = backlogged[f] & backlogged[g]
    diff = num.sub(service[f], service[g])
    before = num.sub(m.service_at_start[f], m.service_at_start[g])
    starting = joint & ~m.in_period
    hi = num.maximum(num.where(starting, before, m.period_max), diff)
    lo = num.minimum(num.where(starting, before, m.period_min), diff)
    best = num.where(joint, num.maximum(m.pair_drift, num.sub(hi, lo)), m.pair_drift)
    return dict(in_period=jnp.where(mask, joint & ~jumped, m.in_period),
                period_max=num.where(mask & joint, hi, m.period_max),
                period_min=num.where(mask & joint, lo, m.period_min),
                pair_drift=num.where(mask, best, m.pair_drift),
                service_at_start=num.where(mask, service, m.service_at_start))
