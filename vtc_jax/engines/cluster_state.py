"""The cluster lane's data (docs/CLUSTER.md): the laid-out workload, one replica's state,
the lane's state, the runner's batch, and the small exact helpers the replica, router and
event functions share. Field layouts live here so every cluster module reads one schema."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from vtc_jax.core import wide as wide_mod
from vtc_jax.core.rows import NUM_FIELDS
from vtc_jax.engines.cluster_settings import ClusterParams

EST = NUM_FIELDS  # a request's output estimate (precomputed per request)
ROW_FIELDS = NUM_FIELDS + 1
# a waiting replica request: its router arrival, its cluster row, its request number (trace order)
ORIG, ROWID, NUMBER = ROW_FIELDS, ROW_FIELDS + 1, ROW_FIELDS + 2
POOL_FIELDS = ROW_FIELDS + 3
REC_DISPATCH, REC_REPLICA, REC_SEQ, REC_ADMIT = range(4)  # per-row records (ClusterConfig.record)
TIMELINE_PAD = 64  # entries past the end of a router's timeline: the widest arrival window


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterWorkload:
    """A lane's requests laid out in blocks per (router, tenant): block (j, k) holds
    tenant k's requests that reach router j, sorted by (arrival, number), at rows
    [first[j, k], first[j, k] + tenant block size), with a trailing EST field (the
    request's output estimate). requests: int32[G * N, 6]; first: int32[G, K]; timeline:
    int32[G, N + TIMELINE_PAD, 2] (row, tenant) of router j's rows in (arrival, ORDER)
    order, padding last: the order in which requests reach router j."""

    requests: jax.Array
    first: jax.Array
    timeline: jax.Array
    num_requests: jax.Array
    overflow: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Replica:
    """One replica (the cluster state holds these with a leading replica axis R).

    pool: int32[S, POOL_FIELDS] waiting requests (row fields with ARRIVAL = dispatch step
    and ORDER = dispatch sequence, then the router arrival, the cluster row and the request
    number: the server sees the request by its number, as on one server, and keys its
    record by the dispatch sequence); nxt:
    int32[S] next slot of the same tenant (FIFO lists); free: int32[S] stack of free slots
    (first `top`); fh, ft: int32[K] head and tail slot per tenant (-1: empty); nw: int32[K]
    waiting requests; waitp: int32[] their prompt tokens; counter, service, wsvc:
    int32[K, 2] the MODEL.md counter, W_k and W_k x counter_mult (wide); server: the
    replica's server state (servers/base.py: what runs, its memory, its completions);
    admitted, completed: int32[K]; last_left: int32[]; policy; limits: the replica's
    admission limits (engines/limits.py LimitState); overflow: bool[] (a waiting pool or the
    server was full: the lane is not finished). A server that preempts: stacks (the
    replica's requeue, engines/requeue.py: per tenant the preempted requests' dispatch
    sequences, served again before its FIFO, as on one server) and begun bool[] (the
    replica's step has run its BEGIN); None otherwise. `nw` and `waitp` count the stacked
    requests too (vLLM's waiting queue holds its preempted requests). Behind an endpoint
    picker (cluster_fleet.py): stats int32[2, 2] the (W, KV used) its previous step ended
    with and the ones its current step ends with, at stats_at int32[]; None otherwise."""

    pool: jax.Array
    nxt: jax.Array
    free: jax.Array
    top: jax.Array
    fh: jax.Array
    ft: jax.Array
    nw: jax.Array
    waitp: jax.Array
    counter: jax.Array
    service: jax.Array
    wsvc: jax.Array
    server: Any
    last_left: jax.Array
    admitted: jax.Array
    completed: jax.Array
    policy: dict
    limits: Any
    overflow: jax.Array
    stacks: Any = None
    begun: Any = None
    stats: Any = None
    stats_at: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterState:
    """One lane's state.

    step, done, iterations: as engine.State. Routers: rhead, rarrived: int32[G, K]
    pointers into the (j, k) blocks; rnext: int32[G] position in router j's timeline of the
    next request to arrive; rcounter: int32[G, K, 2] the router counter (charged
    the estimated cost / weight at dispatch; what vtc and lcf read); rlast: int32[G];
    rpolicy: {policy: state} (per-tenant leaves with a leading router axis G, used at
    index 0 in the shared mode; per-row tables without one); cursor: int32[] the router
    after the last one that dispatched (the round-robin pointer, kept across steps);
    dispatched_all: bool[] the step's dispatch phase is over (the replicas' admissions have
    begun); rr: int32[G] round-robin cursors of the replica choice; dseq: int32[]
    dispatches so far; ring_c: int32[D, G, K, 2], ring_d: int32[D, G, K], stamp: int32[D] the
    charges of the last D steps. reps: Replica (leading axis R); boundary: int32[R] each
    replica's step boundary (the end of its current step; <= step: at a boundary; the time
    it fell asleep where `asleep`); asleep: bool[R] an idle timed replica waiting for a
    dispatch (docs/CLUSTER.md, "Replica clocks"). Measures: dispatched
    int32[G, R, K]; snap, wsnap: int32[R, K, 2] service at the last step end; bs, bsw:
    int32[K, 2] service (and x counter_mult) in steps where every tenant is backlogged;
    drift: int32[2] max over those steps of max_k bsw - min_k bsw; bsteps: int32[];
    wait_hist: int32[K, LATENCY_BINS]; rec: int32[G * N, 4] or None. sent: int32[G * N,
    POOL_FIELDS] the pool record of each dispatch sequence (where a preempted request's
    record is read again), None unless the server preempts; sent_write: (position int32[],
    record int32[POOL_FIELDS]) the last event's dispatch record, written into `sent` at the
    next event's start (cluster._record_sent; position N: none), None with `sent`. fleet: the gateway's picker,
    metrics and flow-control state (cluster_fleet.init), None without a picker."""

    step: jax.Array
    done: jax.Array
    iterations: jax.Array
    rhead: jax.Array
    rarrived: jax.Array
    rnext: jax.Array
    rcounter: jax.Array
    rlast: jax.Array
    rpolicy: dict
    cursor: jax.Array
    dispatched_all: jax.Array
    rr: jax.Array
    dseq: jax.Array
    ring_c: jax.Array | None
    ring_d: jax.Array | None
    stamp: jax.Array | None
    reps: Replica
    boundary: jax.Array
    asleep: jax.Array
    dispatched: jax.Array
    snap: jax.Array
    wsnap: jax.Array
    bs: jax.Array
    bsw: jax.Array
    drift: jax.Array
    bsteps: jax.Array
    wait_hist: jax.Array
    rec: jax.Array | None
    sent: jax.Array | None = None
    sent_write: tuple | None = None
    fleet: dict | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterBatch:
    """The runner's per-lane inputs."""

    params: ClusterParams
    workload: ClusterWorkload


# ---- small exact helpers ----------------------------------------------------------------

def wadd(a, b):
    """Wide + wide (both normalized)."""
    low = a[..., 1] + b[..., 1]
    return jnp.stack([a[..., 0] + b[..., 0] + (low >> wide_mod.LOW_BITS), low & wide_mod.LOW_MASK], axis=-1)


def wsum(a, axis: int):
    """Sum of wide values over value axis `axis` (at most 64 entries: the lows cannot wrap)."""
    low = a[..., 1].sum(axis=axis)
    return jnp.stack([a[..., 0].sum(axis=axis) + (low >> wide_mod.LOW_BITS), low & wide_mod.LOW_MASK], axis=-1)


def pick(policy_id, values):
    """The lane's policy's value among one value per policy (pytrees of equal structure)."""
    if len(values) == 1:
        return values[0]

    def sel(*xs):
        if all(x is xs[0] for x in xs):
            return xs[0]
        return jnp.select([policy_id == i for i in range(len(xs) - 1)], list(xs[:-1]), xs[-1])
    return jax.tree_util.tree_map(sel, *values)


def choose(cond, a, b):
    """Pytrees: a where cond else b (a leaf both share is kept as is: no select over it)."""
    return jax.tree_util.tree_map(lambda x, y: x if x is y else jnp.where(cond, x, y), a, b)


def keep(old, new, mask):
    """Pytrees: new where mask else old (a leaf both share is kept as is)."""
    return jax.tree_util.tree_map(lambda a, b: a if a is b else jnp.where(mask, b, a), old, new)
