"""Measures accumulated in the scan carry (device side).

Everything a sweep reports is folded into `Measures` as the lane runs; time series exist
only at the checkpoint stride `record_every`. The engine calls three hooks:

  on_arrivals(m, ...)  requests joining their FIFO (demand per stride bucket);
  on_admit(m, ...)     one admission (latency histograms, raw tokens);
  on_finish(m, ...)    the end of a step (drift, pair drift, occupancy, checkpoints, windows).

Units: service-like quantities are in the lane's integer cost units (settings.py).
Latency histograms: bin b < 64 holds exactly b steps; above, 8 bins per octave, so a
percentile read from them is exact below 64 steps and within 1/8 octave (about 9%) above.
Service-like values and long sums (occupancy, latencies, raw tokens) are exact wide
integers (wide.py); demand per bucket, used only for the paper's windowed measure, is a
float32 sum.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vtc_jax import wide

I32 = jnp.int32
EXACT_BINS = 64
BINS_PER_OCTAVE = 8
LATENCY_BINS = EXACT_BINS + BINS_PER_OCTAVE * 25  # covers every int32 latency


@dataclasses.dataclass(frozen=True)
class MeasureConfig:
    """Static switches for the heavier measures.

    Attributes:
      pair_drift: track drift over jointly backlogged intervals for every client pair
        (O(K^2) state; sized for small K).
      latency: per-client waiting/completion-time histograms (O(K * LATENCY_BINS)).
      resource: per-client resource service (bytes moved), its drift and window share.
    """

    pair_drift: bool = True
    latency: bool = True
    resource: bool = True


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Measures:
    """One lane's accumulators. K clients, C checkpoint rows, Kp = K if pair drift else 1.
    A trailing axis of 2 marks an exact wide integer (wide.py).

    Attributes:
      max_drift: int32[2]  max over steps of max_k W_k - min_k W_k (negative before any step).
      max_drift_step: int32[]  first step reaching it.
      checkpoints: int32[C, K, 2]  W after steps (i+1)*record_every - 1.
      demand: float32[C, K]  full cost of requests arriving in bucket i (steps
        [i*record_every, (i+1)*record_every)).
      backlogged_in: bool[C, K]  client backlogged (after arrivals) at some step of bucket i.
      service_at_start: int32[K, 2]  W at the start of the current step.
      head_at_start: int32[K]  FIFO heads at the start of the current step.
      in_period: bool[Kp, Kp]  pair (f, g) jointly backlogged at the previous step.
      period_max, period_min: int32[Kp, Kp, 2]  extremes of W_f - W_g within the current
        jointly backlogged period (its value before the period included).
      pair_drift: int32[Kp, Kp, 2]  max over periods of (period_max - period_min).
      share_start, share_end: int32[K, 2]  W at the share window's edges.
      prompt_tokens: int32[K, 2]  prompt tokens of admitted requests (cached included).
      decoded_tokens: int32[K, 2]  tokens decoded.
      decoded_context: int32[K, 2]  sum over decoded tokens of their context (prompt +
        generated before the token): with the above, an independent ledger of every charge.
      occupancy_sum: int32[2]  sum of the KV tokens held at each decode phase.
      wait_hist, done_hist: int32[K, B]  latency histograms (B = LATENCY_BINS or 0).
      wait_sum, done_sum: int32[K, 2]  sums of waiting and completion times.
      cached_admitted: int32[K, 2]  cached prompt tokens of admitted requests.
      resource: float32[K, 2]  resource service R_k in GB (compensated sum: value, error).
      resource_max_drift: float32[]  max over steps of max_k R_k - min_k R_k.
      resource_share_start, resource_share_end: float32[K]  R at the share window's edges.
    """

    max_drift: jax.Array
    max_drift_step: jax.Array
    checkpoints: jax.Array
    demand: jax.Array
    backlogged_in: jax.Array
    service_at_start: jax.Array
    head_at_start: jax.Array
    in_period: jax.Array
    period_max: jax.Array
    period_min: jax.Array
    pair_drift: jax.Array
    share_start: jax.Array
    share_end: jax.Array
    prompt_tokens: jax.Array
    decoded_tokens: jax.Array
    decoded_context: jax.Array
    occupancy_sum: jax.Array
    wait_hist: jax.Array
    done_hist: jax.Array
    wait_sum: jax.Array
    done_sum: jax.Array
    cached_admitted: jax.Array
    resource: jax.Array
    resource_max_drift: jax.Array
    resource_share_start: jax.Array
    resource_share_end: jax.Array


def init_measures(num_clients: int, num_checkpoints: int, config: MeasureConfig) -> Measures:
    k, c = num_clients, num_checkpoints
    kp = k if config.pair_drift else 1
    bins = LATENCY_BINS if config.latency else 0
    wk = wide.zeros((k,))
    pair = wide.zeros((kp, kp))
    return Measures(
        max_drift=jnp.asarray([-1, 0], I32), max_drift_step=jnp.zeros((), I32),
        checkpoints=wide.zeros((c, k)), demand=jnp.zeros((c, k), jnp.float32),
        backlogged_in=jnp.zeros((c, k), bool), service_at_start=wk, head_at_start=jnp.zeros(k, I32),
        in_period=jnp.zeros((kp, kp), bool), period_max=pair, period_min=pair, pair_drift=pair,
        share_start=wk, share_end=wk, prompt_tokens=wk, decoded_tokens=wk, decoded_context=wk,
        occupancy_sum=wide.zeros(),
        wait_hist=jnp.zeros((k, bins), I32), done_hist=jnp.zeros((k, bins), I32),
        wait_sum=wk, done_sum=wk, cached_admitted=wk,
        resource=jnp.zeros((k if config.resource else 0, 2), jnp.float32),
        resource_max_drift=jnp.zeros((), jnp.float32), resource_share_start=jnp.zeros(k, jnp.float32),
        resource_share_end=jnp.zeros(k, jnp.float32))


def latency_bin(steps: jax.Array) -> jax.Array:
    """int32 latency (>= 0) -> histogram bin (see module docstring)."""
    x = jnp.maximum(steps, 0).astype(I32)
    octave = 31 - jax.lax.clz(jnp.maximum(x, 1))  # floor(log2 x)
    sub = (x >> jnp.maximum(octave - 3, 0)) & (BINS_PER_OCTAVE - 1)
    log_bin = EXACT_BINS + BINS_PER_OCTAVE * (octave - 6) + sub
    return jnp.where(x < EXACT_BINS, x, log_bin)


def request_cost(prompt, output, cached, prefill_cost, decode_cost, context_cost):
    """Full charge of a request in cost units, float32 (a demand estimate): prefill, every
    decode token and its context surcharge (sum over g < output of prompt + g)."""
    p, o, c = (x.astype(jnp.float32) for x in (prompt, output, cached))
    context_tokens = o * p + o * (o - 1) / 2
    return prefill_cost * (p - c) + decode_cost * o + context_cost * context_tokens


def on_arrivals(m: Measures, step, cost, joined, record_every: int) -> Measures:
    """`joined` (bool[K, W]) requests with full costs `cost` (int32[K, W]) arrive at `step`."""
    if m.demand.shape[0] == 0:
        return m
    bucket = step // record_every
    per_client = jnp.where(joined, cost, 0.0).sum(axis=1)
    inside = bucket < m.demand.shape[0]
    row = jnp.minimum(bucket, m.demand.shape[0] - 1)
    return dataclasses.replace(m, demand=m.demand.at[row].add(jnp.where(inside, per_client, 0)))


def on_admit(m: Measures, mask, client, step, arrival, prompt, output, cached, horizon) -> Measures:
    """An admission at `step` of a request (arrival, prompt, output, cached) of `client`."""
    take = jnp.where(mask, 1, 0).astype(I32)
    m = dataclasses.replace(
        m, prompt_tokens=m.prompt_tokens.at[client].set(wide.add(m.prompt_tokens[client], take * prompt)),
        cached_admitted=m.cached_admitted.at[client].set(wide.add(m.cached_admitted[client], take * cached)))
    if m.wait_hist.shape[1] == 0:
        return m
    wait = step - arrival
    done = step + output - 1 - arrival  # no preemption: its completion step is known now
    completes = mask & (step + output - 1 < horizon)
    return dataclasses.replace(
        m,
        wait_hist=m.wait_hist.at[client, latency_bin(wait)].add(take),
        done_hist=m.done_hist.at[client, latency_bin(done)].add(completes.astype(I32)),
        wait_sum=m.wait_sum.at[client].set(wide.add(m.wait_sum[client], take * wait)),
        done_sum=m.done_sum.at[client].set(wide.add(m.done_sum[client], completes.astype(I32) * done)))


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


def on_finish(m: Measures, mask, step, service, head, arrived, running, context,
              share_window, resource, record_every: int) -> Measures:
    """Step `step` ends where `mask`; `service` is W after it, `head`/`arrived` the FIFO
    pointers (arrivals of the step all in), `running` and `context` (int32[K]) the
    requests that decoded and the KV tokens they held at decode."""
    backlogged = m.head_at_start < arrived  # after the step's arrivals, before admission
    occupancy = context.sum()
    if m.resource.shape[0]:
        r = kahan_add(m.resource, jnp.where(mask, step_resource(running, context, resource), 0.0))
        r_drift = r[:, 0].max() - r[:, 0].min()
        resource_updates = dict(
            resource=r,
            resource_max_drift=jnp.where(mask, jnp.maximum(m.resource_max_drift, r_drift), m.resource_max_drift),
            resource_share_start=jnp.where(mask & (step + 1 == share_window[0]), r[:, 0], m.resource_share_start),
            resource_share_end=jnp.where(mask & (step + 1 == share_window[1]), r[:, 0], m.resource_share_end))
    else:
        resource_updates = {}
    drift = wide.sub(wide.max_of(service), wide.min_of(service))
    new_max = mask & wide.less(m.max_drift, drift)
    m32 = mask.astype(I32)
    updates = dict(
        max_drift=wide.where(new_max, drift, m.max_drift),
        max_drift_step=jnp.where(new_max, step, m.max_drift_step),
        decoded_tokens=wide.add(m.decoded_tokens, m32 * running),
        decoded_context=wide.add(m.decoded_context, m32 * context),
        occupancy_sum=wide.add(m.occupancy_sum, m32 * occupancy),
        service_at_start=wide.where(mask, service, m.service_at_start),
        head_at_start=jnp.where(mask, head, m.head_at_start),
        share_start=wide.where(mask & (step + 1 == share_window[0]), service, m.share_start),
        share_end=wide.where(mask & (step + 1 == share_window[1]), service, m.share_end),
        **resource_updates,
    )
    if m.checkpoints.shape[0]:
        slot = jnp.minimum(step // record_every, m.checkpoints.shape[0] - 1)
        due = mask & ((step + 1) % record_every == 0) & (step // record_every < m.checkpoints.shape[0])
        updates["checkpoints"] = m.checkpoints.at[slot].set(wide.where(due, service, m.checkpoints[slot]))
        inside = mask & (step // record_every < m.checkpoints.shape[0])
        updates["backlogged_in"] = m.backlogged_in.at[slot].set(m.backlogged_in[slot] | (backlogged & inside))
    if m.in_period.shape[0] > 1:
        updates.update(_pair_drift(m, mask, service, backlogged))
    return dataclasses.replace(m, **updates)


def _pair_drift(m: Measures, mask, service, backlogged) -> dict:
    """Max |(W_f - W_g)(t2) - (W_f - W_g)(t1)| over intervals in which f and g are both
    backlogged at every step: per jointly backlogged period, max minus min of the
    difference, taken from just before the period's first step to its last step."""
    joint = backlogged[:, None] & backlogged[None, :]
    diff = wide.sub(service[:, None], service[None, :])
    before = wide.sub(m.service_at_start[:, None], m.service_at_start[None, :])
    starting = joint & ~m.in_period
    minimum = lambda a, b: wide.where(wide.less(a, b), a, b)  # noqa: E731
    hi = wide.where(starting, wide.maximum(before, diff), wide.maximum(m.period_max, diff))
    lo = wide.where(starting, minimum(before, diff), minimum(m.period_min, diff))
    best = wide.where(joint, wide.maximum(m.pair_drift, wide.sub(hi, lo)), m.pair_drift)
    return dict(in_period=jnp.where(mask, joint, m.in_period),
                period_max=wide.where(mask & joint, hi, m.period_max),
                period_min=wide.where(mask & joint, lo, m.period_min),
                pair_drift=wide.where(mask, best, m.pair_drift))
