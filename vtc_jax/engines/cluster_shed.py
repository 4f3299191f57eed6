"""The gateway queue's drops under llm-d's flow control (ENGINE_FLEET.md section 3): the
TTL sweep sheds the requests still queued `ttl_us` after their enqueue, and an arrival
whose band already holds `capacity` queued requests is rejected. Sources:
llm-d/llm-d-router@ebab6879 pkg/epp/flowcontrol/controller/internal/processor.go (the
expiry sweep every ExpiryCleanupInterval, isExpired, hasCapacity); the rules themselves are
flow_control.shed_due and flow_control.over_capacity.

The gateway's queues are ranges [rhead, rarrived) of each (router, tenant) block of the
cluster workload (cluster_state.ClusterWorkload), which holds a tenant's requests in
enqueue (arrival) order. So:
- a TTL sweep sheds a prefix of each queue (the oldest first): it moves the head;
- a rejected arrival is the queue's newest row, but later arrivals of the tenant land
  behind it in the block. It stays inside the range, marked REJECTED in `status`, and
  counted in `held` (int32[G, K]: rejected rows inside a queue's range) so that the
  queue's length is rarrived - rhead - held (`waiting`); a head that reaches it steps
  over it (`drop_heads`, at the start of every event, before anything reads a head).

Same-time order (our choice, docs/FLEET.md): scrape, replica step ends, arrivals (each
enqueue: its capacity check, then its dispatch cycle), the tick's cycle, then the TTL
sweep. The sweep at time s runs at the start of the lane's first event after s (nothing
happens between the last event at s and it), shedding by `now - enqueue >= ttl` at s; the
clock stops at every sweep time while requests are queued (`next_sweep`), so no sweep is
skipped. A shed or rejected request is never dispatched: no replica, no first token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vtc_jax.core.rows import ARRIVAL
from vtc_jax.engines import flow_control

I32 = jnp.int32
INT_MAX = (1 << 31) - 1
SHED, REJECTED = 1, 2  # a cluster row's status (0: neither)


def init(num_rows: int, routers: int, num_clients: int, fp) -> dict:
    """The drops' state (merged into the fleet's dict): status int32[G * N] per cluster row
    (SHED, REJECTED, 0), held int32[G, K], shed and rejected int32[K] per tenant, sweep_at
    int32[] the next TTL sweep time (the first at sweep_us)."""
    zk = jnp.zeros(num_clients, I32)
    return {"status": jnp.zeros(num_rows, I32), "held": jnp.zeros((routers, num_clients), I32), "shed": zk,
            "rejected": zk, "sweep_at": jnp.asarray(fp.sweep_us, I32)}


def waiting(rhead, rarrived, fleet):
    """int32[G, K]: requests queued at the gateway (a queue's rejected rows left out)."""
    if fleet is None or "held" not in fleet:
        return rarrived - rhead
    return rarrived - rhead - fleet["held"]


def next_sweep(t, queued, fp):
    """int32[]: the next TTL sweep after t while requests are queued under flow control with
    a TTL (sweeps at multiples of sweep_us), else INT_MAX."""
    if fp.ttl_us is None:
        return jnp.asarray(INT_MAX, I32)
    return jnp.where(fp.flow & queued & (fp.ttl_us > 0), (t // fp.sweep_us + 1) * fp.sweep_us, INT_MAX)


def drop_heads(fleet: dict, rhead, rarrived, first, requests, now, live, fp):
    """(fleet, rhead) at the start of an event at `now`: the sweep due since the clock passed
    sweep_at (at the latest sweep time s < now: every queued request with s - enqueue >=
    ttl is shed, oldest first, counted per tenant and marked SHED), and every head moved past
    the rejected rows it reached. rhead, rarrived: int32[G, K]; first: int32[G, K] the
    blocks' first rows; requests: int32[G * N, fields] (ARRIVAL: the enqueue time); live:
    bool[] the lane has not finished (a finished lane sheds nothing more)."""
    every = fp.sweep_us
    due = live & fp.flow & (fp.ttl_us > 0) & (now > fleet["sweep_at"])
    at = fleet["sweep_at"] + jnp.maximum(now - 1 - fleet["sweep_at"], 0) // every * every
    rows = fleet["status"].shape[0]

    def heads(rh, status):
        row = jnp.clip(first + rh, 0, rows - 1)
        queued = rh < rarrived
        rejected = queued & (status[row] == REJECTED)
        expired = queued & due & flow_control.shed_due(requests[row, ARRIVAL], at, fp.ttl_us)
        return row, rejected, expired

    def cond(carry):
        _, rejected, expired = heads(carry[0], carry[1])
        return (rejected | expired).any()

    def body(carry):
        rh, status, held, shed = carry
        row, rejected, expired = heads(rh, status)
        newly = expired & ~rejected
        status = status.at[jnp.where(newly, row, rows)].set(SHED, mode="drop")
        return (rh + (rejected | expired).astype(I32), status, held - rejected.astype(I32),
                shed + newly.sum(axis=0, dtype=I32))

    rhead, status, held, shed = jax.lax.while_loop(cond, body, (rhead, fleet["status"], fleet["held"],
                                                                fleet["shed"]))
    sweep_at = jnp.where(now > fleet["sweep_at"], at + every, fleet["sweep_at"])
    return dict(fleet, status=status, held=held, shed=shed, sweep_at=sweep_at), rhead


def refused(queued_total, fp, one):
    """bool[]: the arrival an event takes now is rejected: flow control (`one`: one arrival
    per event) and the band already holds `capacity` queued requests (queued_total int32[])."""
    return one & flow_control.over_capacity(queued_total, fp.capacity)


def reject(fleet: dict, router, row, client, mask) -> dict:
    """The rejection of cluster row `row` (tenant `client`, at `router`) where `mask`: marked,
    held in its queue's range, counted."""
    m = mask.astype(I32)
    rows = fleet["status"].shape[0]
    return dict(fleet, status=fleet["status"].at[jnp.where(mask, row, rows)].set(REJECTED, mode="drop"),
                held=fleet["held"].at[router, client].add(m), rejected=fleet["rejected"].at[client].add(m))
