"""Admission limits and priority bands: parts that compose with any ordering policy.

  rpm (delay)  MODEL.md's rpm: a client is eligible only while it was admitted fewer than
               R requests in the current window [j*W, (j+1)*W), j = t // W (admissions
               earlier in the same step count); over-limit requests wait in their FIFO.
  rpm (reject) the VTC artifact's baseline: an arriving request is rejected (never joins,
               counted) when its client had R requests *accepted* within the last W steps,
               inclusive ([t - W, t]). Acceptance depends only on the client's own arrival
               times, so it is applied to the workload before the run (`reject_rpm`).
  kv cap       a client is eligible only while the KV its running requests can reach
               (prompt + output, reserved at admission) plus its head's stays within its
               cap, so the cap holds at every step.
  bands        strict priority: only clients of the best (lowest) band that has an
               eligible client are eligible; the policy chooses among them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vtc_jax.inputs.workload import ARRIVAL, INT32_MAX, OUTPUT, PROMPT, Workload, block_of_rows, padding_rows

I32 = jnp.int32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LimitState:
    """window_admits: int32[K] admissions in the current rpm window (None: no rpm delay);
    reserved: int32[K] prompt + output of each client's running requests (None: no cap)."""

    window_admits: jax.Array | None
    reserved: jax.Array | None


def init(num_clients: int, rpm: bool, kv_cap: bool) -> LimitState:
    zeros = jnp.zeros(num_clients, I32)
    return LimitState(window_admits=zeros if rpm else None, reserved=zeros if kv_cap else None)


def eligible(state: LimitState, heads: jax.Array, backlogged: jax.Array, params, bands: bool) -> jax.Array:
    """bool[K]: backlogged clients the limits let through (then the best band only)."""
    ok = backlogged
    if state.window_admits is not None:
        ok = ok & (state.window_admits < params.rpm_limit)
    if state.reserved is not None:
        ok = ok & (state.reserved <= params.kv_cap - heads[:, PROMPT] - heads[:, OUTPUT])
    if bands:
        best = jnp.where(ok, params.band, INT32_MAX).min()
        ok = ok & (params.band == best)
    return ok


def on_admit(state: LimitState, take: jax.Array, row: jax.Array) -> LimitState:
    """`take` (int32[K] one-hot or zeros) admitted a request `row`."""
    return LimitState(
        window_admits=None if state.window_admits is None else state.window_admits + take,
        reserved=None if state.reserved is None else state.reserved + take * (row[PROMPT] + row[OUTPUT]))


def on_complete(state: LimitState, take: jax.Array, prompt: jax.Array, output: jax.Array) -> LimitState:
    if state.reserved is None:
        return state
    return dataclasses.replace(state, reserved=state.reserved - take * (prompt + output))


def on_step(state: LimitState, step: jax.Array, next_step: jax.Array, mask: jax.Array, params) -> LimitState:
    """A new rpm window starts between `step` and `next_step`: its admissions restart at 0."""
    if state.window_admits is None:
        return state
    new_window = mask & ((next_step // params.rpm_window) != (step // params.rpm_window))
    return dataclasses.replace(state, window_admits=jnp.where(new_window, 0, state.window_admits))


def reject_rpm(workload: Workload, limit: jax.Array, window: jax.Array, horizon: jax.Array,
               active: jax.Array) -> tuple[Workload, jax.Array]:
    """The workload without the requests an rpm limit rejects at arrival (where `active`),
    and the rejected count per client (int32[K], arrivals before `horizon` only).

    A request arriving at t is accepted iff fewer than `limit` earlier requests of its
    client were accepted with arrival in [t - window, t]. One sequential pass over the
    rows (client-major, so each client's requests in arrival order); accepted rows are then
    packed to the front of their block, which keeps (arrival, number) order."""
    rows, first, size = workload.requests, workload.first, workload.size
    r, k = rows.shape[0], first.shape[0]
    block = block_of_rows(first, r)
    arrival = rows[:, ARRIVAL]
    real = arrival < horizon
    start = _search_blocks(arrival, first[block], first[block] + size[block], arrival - window)

    def body(prefix, i):  # prefix[i]: accepted rows before row i (all blocks)
        ok = real[i] & (~active | (prefix[i] - prefix[start[i]] < limit))
        return prefix.at[i + 1].set(prefix[i] + ok.astype(I32)), ok

    prefix, accepted = jax.lax.scan(body, jnp.zeros(r + 1, I32), jnp.arange(r, dtype=I32))
    keep = accepted | ~real  # rows past the horizon stay (they never arrive)
    before = jnp.cumsum(keep.astype(I32)) - keep.astype(I32)  # kept rows before each row
    rank = before - before[first[block]]
    dest = jnp.where(keep, first[block] + rank, r)
    packed = jnp.broadcast_to(jnp.asarray(padding_rows(1)[0]), rows.shape).at[dest].set(rows, mode="drop")
    rejected = jax.ops.segment_sum((real & ~accepted).astype(I32), block, num_segments=k)
    out = dataclasses.replace(workload, requests=packed, num_requests=workload.num_requests - rejected.sum())
    return out, rejected


def _search_blocks(values: jax.Array, lo: jax.Array, hi: jax.Array, query: jax.Array) -> jax.Array:
    """int32[R]: per row i, the first index j in [lo_i, hi_i) with values[j] >= query_i
    (hi_i if none); values are sorted inside every [lo_i, hi_i). Bisection, O(log R)."""
    steps = max(1, int(values.shape[0]).bit_length())
    for _ in range(steps):
        mid = (lo + hi) // 2
        go_right = (lo < hi) & (values[jnp.minimum(mid, values.shape[0] - 1)] < query)
        lo, hi = jnp.where(go_right, mid + 1, lo), jnp.where(go_right | (lo >= hi), hi, mid)
    return lo.astype(I32)
