"""A whole cluster in one lane: G gateway routers in front of R replicas (docs/CLUSTER.md).

Each replica is a copy of a registered server (ClusterConfig.server, default `ideal`:
MODEL.md's, KV budget M) with its own engine policy and per-tenant FIFO queues; in front
of them G routers each keep a gateway queue per tenant and a policy of their own (any
registered policy whose hooks a gateway can call: not `las` or `vtc_predict`, which need
completions) that picks which tenant's head to dispatch next, charging the request's
estimated cost at dispatch. Step t of the cluster, in this order:

  0. delayed counters: charges other routers made in steps s <= t - d become visible;
  1. router arrivals: requests with arrival t join the gateway queue of their router
     (drawn per request from the ingress matrix P[k, j] by a hash of the lane seed),
     routers in index order, each in trace order (the policies' arrival hooks run here);
  2. dispatch rounds: while some replica has room (the saturation rule), routers in
     round-robin order (continuing from the router after the last one that dispatched,
     across steps; a router with nothing to offer is skipped) each dispatch one request:
     its policy's candidate goes to the replica the choice rule names, joins that
     replica's FIFO (the replica policy's arrival hook) and is charged at the router
     (estimated cost / weight);
  3. replica steps, every replica independently: admission (its engine policy, stopping
     at the first candidate the server's `fits` refuses), the server's step, completion.

Counter modes: `per_router` (each router its own policy state, seeing only its queues),
`shared` (one state for all routers, and the cluster-wide backlog), `delayed` (each router
its own state plus the other routers' charges d steps late, and the cluster-wide backlog).
With shared knowledge a router holds back a candidate that is not the policy's pick over
the cluster-wide backlog (`holdback`), unless every router would hold back.

The JAX engine follows engine.py's pattern: one event per scan iteration chosen by masks
(DISPATCH one request, ADMIT at every replica that can, FINISH the step for all replicas;
then COMPLETE one request per replica and ARRIVE at the routers), queues as pointers into
request blocks laid out per (router, tenant), replicas as arrays with a replica axis (the
engine policies' hooks and the server's functions are vmapped over it). Exact integers
throughout (settings.py units; totals in the WIDE format of wide.py).

Modules: cluster_settings.py (settings, static config, traced params), cluster_state.py
(the lane's data), cluster_replica.py and cluster_router.py (one replica's and the routers'
functions), this module (the events and the layout); driver/cluster_run.py plans, encodes,
runs and collects lanes. The cluster knows no server by name.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.lanes import over_replicas
from vtc_jax.core.rows import ARRIVAL, CACHED, ORDER, OUTPUT, PROMPT
from vtc_jax.core.wide import WIDE
from vtc_jax.engines import cluster_fleet as fleet_mod
from vtc_jax.engines import cluster_replica as replica
from vtc_jax.engines import cluster_shed
from vtc_jax.engines.cluster_router import (
    Offer,
    Routers,
    choose_replica,
    gathered,
    router_arrays,
    router_axes,
    router_index,
    router_offer,
    router_view,
    rput,
    rslice,
    strip_tables,
    table_flags,
)
from vtc_jax.engines.cluster_settings import DELAYED, INGRESS_SALT, PER_ROUTER, ROUND_ROBIN, SHARED, ClusterConfig, ClusterParams
from vtc_jax.engines.cluster_state import (
    EST,
    POOL_FIELDS,
    REC_ADMIT,
    ROW_FIELDS,
    TIMELINE_PAD,
    ClusterBatch,
    ClusterState,
    ClusterWorkload,
    pick,
    wadd,
    wsum,
)
from vtc_jax.engines.program import LaneProgram
from vtc_jax.engines.settings import INT32_MAX
from vtc_jax.inputs.workload import Workload, block_of_rows
from vtc_jax.measures.online import LATENCY_BINS, latency_bin
from vtc_jax.policies import estimators, registry
from vtc_jax.policies.base import Admission, Arrivals, Shape, StepEnd, estimated_cost
from vtc_jax.servers import registry as servers

I32, U32 = jnp.int32, jnp.uint32
# Router-policy leaves that receive the other routers' charges in the delayed mode:
# (leaf, ring): "counter" rings hold estimated cost x counter_mult (counter units), "drr"
# rings the DRR cost (deficit units), subtracted. The router counter (vtc, lcf) always.
LEDGERS = {"vtc_gateway": ("counter", "counter"), "wfq": ("f_tail", "counter"), "sfq": ("f_tail", "counter"),
           "drr": ("deficit", "drr")}


# ---- hashes (the reference re-implements them in pure Python) -----------------------

def ingress_router(seed, client, position, thresholds):
    """int32 router of the request at `position` among tenant `client`'s requests:
    u = mix32(mix32(mix32(seed ^ INGRESS_SALT) ^ client) + position) >> 8 (24 bits), then
    the number of thresholds <= u (thresholds: int32[..., G], the last one 2^24)."""
    key = estimators.mix32(estimators.mix32(seed ^ U32(INGRESS_SALT)) ^ client.astype(U32)) + position.astype(U32)
    u = (estimators.mix32(key) >> 8).astype(I32)
    return (thresholds <= u[..., None]).sum(axis=-1, dtype=I32)


# ---- events ---------------------------------------------------------------------------

def _dispatch(state: ClusterState, wl: ClusterWorkload, params: ClusterParams, cfg: ClusterConfig, flags,
              routers: Routers, offer: Offer, rheads, room, load, queued, mask, live=None):
    """One dispatch where `mask`: the offering router's candidate leaves its gateway queue,
    is charged there and joins the chosen replica's FIFO (behind a picker: `live`, the
    replicas' metrics now, cluster_fleet.live_stats). Returns (state, its record for
    `sent`: (position int32[], record int32[POOL_FIELDS]), or None): the next event writes
    it first (`_record_sent`)."""
    g, r = cfg.routers, cfg.replicas
    j, c = offer.router, offer.client
    t = state.step
    index = wl.first[j, c] + state.rhead[j, c]
    row = wl.requests[index]
    est = row[EST]
    gp = params.gateway
    p = router_index(params, j)
    view = router_view(t, routers.backlogged[j], routers.heads[j], routers.head_index[j], routers.waiting[j],
                        state.rcounter[p], state.rlast[p], gp.costs)
    prefill = gp.costs.prefill * jnp.where(gp.costs.charge_cached, row[PROMPT], row[PROMPT] - row[CACHED])
    admission = Admission(client=c, row=row, index=index, estimate=est, prefill=prefill)
    rpolicy = {}
    for n in cfg.gateway_policies:
        new, _ = registry.get(n).admit(offer.states[n], view, admission, gp.policy[n])
        rpolicy[n] = rput(state.rpolicy[n], flags[n], p, new, mask)
    charge = estimated_cost(gp.costs, row, est) * gp.costs.counter_mult[c]
    rcounter = state.rcounter.at[p, c].set(WIDE.where(mask, WIDE.add(state.rcounter[p, c], charge),
                                                      state.rcounter[p, c]))
    ring_c, ring_d = state.ring_c, state.ring_d
    if cfg.ring:
        slot = t % cfg.ring
        ring_c = ring_c.at[slot, j, c].set(WIDE.where(mask, WIDE.add(ring_c[slot, j, c], charge), ring_c[slot, j, c]))
        if ring_d is not None:
            cost = offer.states["drr"]["chosen_cost"]
            ring_d = ring_d.at[slot, j, c].add(jnp.where(mask, cost, 0))
    fleet = state.fleet
    if fleet is None:
        target = choose_replica(state, params, cfg, room, load, queued, j, c)
    else:  # the endpoint picker (ENGINE_FLEET.md section 4); a cycle spent (flow control)
        present = jnp.arange(r) < params.replicas
        target, picked = fleet_mod.choose(state, fleet, state.reps, row, live, present, params, cfg, mask)
        fleet = fleet_mod.routed(fleet, picked, target, row[PROMPT], mask, params.fleet)
    record = jnp.concatenate([jnp.stack([t, state.dseq]), row[PROMPT:ROW_FIELDS],
                              jnp.stack([row[ARRIVAL], index, row[ORDER]])])
    into = mask & (jnp.arange(r) == target)
    reps = over_replicas(functools.partial(replica.rep_receive, cfg=cfg), in_axes=(0, 0, None, None, None, 0, None))(
        state.reps, rheads, t, record.astype(I32), c, into, params.engine)
    boundary, asleep = state.boundary, state.asleep
    wake = servers.get(cfg.server).wake
    if wake is not None:  # a sleeping replica looks at its queue again at its own poll (docs/CLUSTER.md)
        waking = into & asleep
        boundary = jnp.where(waking, over_replicas(wake, in_axes=(None, 0, None))(params.engine, boundary, t), boundary)
        asleep = asleep & ~waking
    rec = state.rec
    if rec is not None:
        rows = rec.shape[0]
        rec = rec.at[jnp.where(mask, index, rows)].set(
            jnp.stack([t, target, state.dseq, jnp.asarray(-1, I32)]), mode="drop")
    sent = None
    if state.sent is not None:  # a preempted request's record is read again from there
        sent = (jnp.where(mask, state.dseq, state.sent.shape[0]), record.astype(I32))
    m = mask.astype(I32)
    return dataclasses.replace(
        state, rhead=state.rhead.at[j, c].add(m), rcounter=rcounter,
        rlast=state.rlast.at[p].set(jnp.where(mask, c, state.rlast[p])), rpolicy=rpolicy,
        cursor=jnp.where(mask, (j + 1) % g, state.cursor).astype(I32),
        rr=state.rr.at[j].set(jnp.where(mask & (params.choice == ROUND_ROBIN), (target + 1) % params.replicas,
                                        state.rr[j])),
        dseq=state.dseq + m, ring_c=ring_c, ring_d=ring_d, reps=reps, boundary=boundary, asleep=asleep,
        dispatched=state.dispatched.at[j, target, c].add(m), rec=rec, fleet=fleet), sent


def _record_sent(state: ClusterState, write) -> ClusterState:
    """The previous event's dispatch record into `sent`, at the start of this event, before
    any read of it: an event's reads are of requests dispatched before it, and a table
    written first and read after is updated in place (read in the event that wrote it, XLA
    kept its old copy too: the whole [N, POOL_FIELDS] table copied twice an event)."""
    at, record = write
    return dataclasses.replace(state, sent=state.sent.at[at].set(record, mode="drop"))


def _admit(state: ClusterState, rheads, clients, rstates, admitting, params: ClusterParams,
           cfg: ClusterConfig) -> ClusterState:
    """Every replica where `admitting` admits its candidate."""
    t = state.step
    reps, (orig, rowid), first = over_replicas(functools.partial(replica.rep_admit, cfg=cfg),
                                                in_axes=(0, 0, 0, 0, 0, None, None))(
        state.reps, rheads, clients, rstates, admitting, t, params.engine)
    # a preempted request's admission again is not a wait (its first admission was)
    hist = state.wait_hist.at[clients, latency_bin(t - orig)].add(first.astype(I32))
    fleet = state.fleet
    if fleet is not None:
        prompts = jnp.take_along_axis(rheads[:, :, PROMPT], clients[:, None], axis=1)[:, 0]
        fleet = fleet_mod.started(fleet, prompts, first, params.fleet)
    rec = state.rec
    if rec is not None:
        rec = rec.at[jnp.where(first, rowid, rec.shape[0]), REC_ADMIT].set(t, mode="drop")
    return dataclasses.replace(state, reps=reps, wait_hist=hist, rec=rec, fleet=fleet)


def _begin(state: ClusterState, rheads, params: ClusterParams, cfg: ClusterConfig, mask) -> ClusterState:
    """Every replica where `mask` (bool[R]) runs its step's BEGIN (a server that preempts)."""
    reps = over_replicas(functools.partial(replica.rep_begin, cfg=cfg), in_axes=(0, 0, None, 0, None, None))(
        state.reps, rheads, state.step, mask, state.sent, params.engine)
    return dataclasses.replace(state, reps=reps)


def _finish(state: ClusterState, wl: ClusterWorkload, rheads, routers: Routers, params: ClusterParams,
            cfg: ClusterConfig, flags, mask, next_arrival) -> ClusterState:
    """Step t ends where `mask`: every replica decodes, step-end hooks run, t moves on (a
    jump over idle steps when nothing runs or waits anywhere), the delayed charges due by
    the new step are applied."""
    t = state.step
    horizon = params.horizon
    queued = cluster_shed.waiting(state.rhead, state.rarrived, state.fleet)
    waiting = queued.sum(axis=0) + state.reps.nw.sum(axis=0)  # [K]
    running = over_replicas(functools.partial(replica.rep_load, cfg=cfg))(state.reps).running
    # the replicas at a boundary (docs/CLUSTER.md, "Replica clocks"); on ideal: all of them
    bound = state.boundary <= t
    stepping = mask & bound & ~state.asleep
    busy = (running.sum(axis=1) > 0) | (state.reps.nw.sum(axis=1) > 0)
    server, work = over_replicas(functools.partial(replica.rep_end_step, cfg=cfg), in_axes=(0, 0, None))(
        state.reps, stepping, params.engine)
    stepped = stepping & busy
    boundary = jnp.where(stepped, t + work.elapsed, jnp.where(stepping, t, state.boundary))
    asleep = state.asleep
    if servers.get(cfg.server).wake is not None:
        asleep = asleep | (stepping & ~busy)
    ahead = boundary > t
    soonest = jnp.minimum(jnp.where(ahead, boundary, INT32_MAX).min(), jnp.minimum(next_arrival.min(), horizon))
    routed = queued.sum() > 0
    waits_for_tick = jnp.zeros((), bool)
    if state.fleet is not None:  # under flow control a waiting request goes at a tick (at the latest)
        soonest = jnp.minimum(soonest, fleet_mod.next_event(t, routed, params.fleet))
        waits_for_tick = params.fleet.flow
    next_t = jnp.where(mask, jnp.where(~ahead.any() & routed & ~waits_for_tick, t + 1, jnp.maximum(t + 1, soonest)), t)
    elapsed = next_t - t
    reps = over_replicas(functools.partial(replica.rep_finish, cfg=cfg),
                         in_axes=(0, 0, None, None, 0, None, 0, 0, 0, None))(
        state.reps, rheads, t, next_t, mask & bound, mask, server, work,
        jnp.where(stepped, work.elapsed, elapsed), params.engine)
    fleet = state.fleet
    if fleet is not None:  # the metrics each stepping replica's step will end with; the clock's cycles
        live = fleet_mod.live_stats(reps, params.engine, cfg)
        stats, stats_at = fleet_mod.step_stats(reps.stats, reps.stats_at, live, stepped, boundary)
        reps = dataclasses.replace(reps, stats=stats, stats_at=stats_at)
        fleet = fleet_mod.account(fleet_mod.new_time(fleet, t, next_t, params.fleet), live, stepped, work.elapsed)
    # measures over steps in which every tenant is backlogged (after the admissions)
    tenant = jnp.arange(cfg.num_clients) < params.tenants
    flag = mask & ((waiting > 0) | ~tenant).all() & (t >= params.measure_from)
    ds = wsum(WIDE.sub(reps.service, state.snap), 0)
    dw = wsum(WIDE.sub(reps.wsvc, state.wsnap), 0)
    bs = WIDE.where(flag, wadd(state.bs, ds), state.bs)
    bsw = WIDE.where(flag, wadd(state.bsw, dw), state.bsw)
    among = WIDE.where(tenant, bsw, bsw[0])  # the lane's own tenants only
    gap = WIDE.sub(WIDE.max_of(among), WIDE.min_of(among))
    drift = WIDE.where(flag, WIDE.maximum(state.drift, gap), state.drift)
    snap = WIDE.where(mask, reps.service, state.snap)
    wsnap = WIDE.where(mask, reps.wsvc, state.wsnap)
    # the routers' step-end hooks, vmapped over routers (shared mode: once, on the shared state)
    gp = params.gateway
    names = cfg.gateway_policies
    zeros = jnp.zeros(cfg.num_clients, I32)

    def one(st, vb, vh, vi, vw, counter, last):
        view = router_view(t, vb, vh, vi, vw, counter, last, gp.costs)
        new = {n: registry.get(n).step(st[n], view, StepEnd(decode=zeros, elapsed=elapsed), gp.policy[n])
               for n in names}
        for n in names:
            for f, a, b in zip(jax.tree_util.tree_leaves(flags[n]), jax.tree_util.tree_leaves(st[n]),
                               jax.tree_util.tree_leaves(new[n])):
                if f and a is not b:
                    raise NotImplementedError(f"policy {n}: a router's step hook may not change per-row tables")
        return strip_tables(new, flags)

    p = routers.p
    new = jax.vmap(one, in_axes=(router_axes(flags), 0, 0, 0, 0, 0, 0))(
        gathered(state.rpolicy, flags, p), routers.backlogged, routers.heads, routers.head_index, routers.waiting,
        state.rcounter[p], state.rlast[p])
    call = mask & ((params.mode != SHARED) | (jnp.arange(cfg.routers) == 0))
    shared = params.mode == SHARED

    def put(old, n_, f):
        if f:
            return old
        c = call.reshape(call.shape + (1,) * (old.ndim - 1))
        return jnp.where(shared, old.at[0].set(jnp.where(mask, n_[0], old[0])), jnp.where(c, n_, old))
    rpolicy = {n: jax.tree_util.tree_map(put, state.rpolicy[n], new[n], flags[n]) for n in names}
    rcounter, ring_c, ring_d, stamp = state.rcounter, state.ring_c, state.ring_d, state.stamp
    if cfg.ring:
        apply = mask & (params.mode == DELAYED)
        # charges visible at the start of a step that is run (< horizon) by the new step
        due = apply & (stamp >= 0) & (stamp + params.delay <= jnp.minimum(next_t, horizon - 1))
        per_router = wsum(WIDE.where(due[:, None, None], ring_c, WIDE.zeros(ring_c.shape[1:-1])), 0)  # [G, K, 2]
        others = WIDE.sub(wsum(per_router, 0)[None], per_router)  # the other routers' charges
        rcounter = wadd(rcounter, others)
        for n in cfg.gateway_policies:
            if n in LEDGERS and LEDGERS[n][1] == "counter":
                leaf = LEDGERS[n][0]
                rpolicy[n] = dict(rpolicy[n], **{leaf: wadd(rpolicy[n][leaf], others)})
        if ring_d is not None:
            per_d = jnp.where(due[:, None, None], ring_d, 0).sum(axis=0)
            rpolicy["drr"] = dict(rpolicy["drr"], deficit=rpolicy["drr"]["deficit"] - (per_d.sum(axis=0)[None] - per_d))
        slot = next_t % cfg.ring
        fresh = mask & (jnp.arange(cfg.ring) == slot)
        stamp = jnp.where(fresh, next_t, jnp.where(due, -1, stamp))
        ring_c = WIDE.where(fresh[:, None, None], WIDE.zeros(ring_c.shape[1:-1]), ring_c)
        if ring_d is not None:
            ring_d = jnp.where(fresh[:, None, None], 0, ring_d)
    return dataclasses.replace(
        state, step=next_t, reps=reps, bs=bs, bsw=bsw, drift=drift, snap=snap, wsnap=wsnap,
        bsteps=state.bsteps + flag.astype(I32), rpolicy=rpolicy, rcounter=rcounter, ring_c=ring_c, ring_d=ring_d,
        stamp=stamp, dispatched_all=state.dispatched_all & ~mask, boundary=boundary, asleep=asleep, fleet=fleet)


def _complete(state: ClusterState, params: ClusterParams, cfg: ClusterConfig, mask) -> ClusterState:
    t = state.step
    heads = over_replicas(replica.rep_heads, in_axes=(0, None))(state.reps, state.sent)
    reps, prompts = over_replicas(functools.partial(replica.rep_complete, cfg=cfg), in_axes=(0, 0, 0, None, None))(
        state.reps, heads, mask, t, params.engine)
    fleet = state.fleet
    if fleet is not None:
        fleet = fleet_mod.finished(fleet, prompts, mask, params.fleet)
    return dataclasses.replace(state, reps=reps, fleet=fleet)


def _arrive(state: ClusterState, wl: ClusterWorkload, heads, head_index, params: ClusterParams, cfg: ClusterConfig,
            flags, mask, entries, warr) -> ClusterState:
    """Router arrivals at step t where `mask`: routers in index order (a loop over the
    router axis), each taking the next `arrival_width` requests of its timeline that arrive
    at t (in trace order) in one go; router j goes only once every router before it has
    taken all of its arrivals of the step. entries: int32[G, W + 1, 2] the next timeline
    entries (row, tenant) of every router; warr: int32[G, W + 1] their arrival steps."""
    g, k, w = cfg.routers, cfg.num_clients, cfg.arrival_width
    t = state.step
    gp = params.gateway
    union = params.mode != PER_ROUTER
    arrival_rows = any(registry.get(n).arrival_rows for n in cfg.gateway_policies)
    # under flow control one arrival per event: each enqueue runs its dispatch cycle before the next
    one = jnp.zeros((), bool) if state.fleet is None else params.fleet.flow
    width = jnp.where(one, 1, w)
    refuse = None  # flow control: the band's capacity (one arrival per event: the window's first)
    if state.fleet is not None and "held" in state.fleet:
        refuse = cluster_shed.refused(cluster_shed.waiting(state.rhead, state.rarrived, state.fleet).sum(),
                                      params.fleet, one)

    def body(j, carry):
        rarrived, rnext, rcounter, rpolicy, prior = carry
        ent, wa = entries[j], warr[j]
        pending = wa[0] <= t
        go = mask & pending & prior
        rest = jnp.where(one, wa[1], wa[w]) <= t
        prior = prior & (~pending | (go & ~rest))
        taken = go & (wa[:w] <= t) & (jnp.arange(w) < width)  # in arrival order: a prefix of the window
        joins = taken if refuse is None else taken & ~(refuse & (jnp.arange(w) == 0))  # a rejected one never joins
        index, client = ent[:w, 0], ent[:w, 1]
        mine = (client[:, None] == jnp.arange(k)[None, :]) & joins[:, None]  # [W, K]
        joining = mine.sum(axis=0, dtype=I32)
        back = cluster_shed.waiting(state.rhead, rarrived, state.fleet) > 0
        backlogged = jnp.where(union, back.any(axis=0), back[j]) if cfg.union else back[j]
        newcomer = ~backlogged & (joining > 0)
        opens = mine & (jnp.cumsum(mine, axis=0) == 1) & newcomer[None, :]
        first = client[jnp.argmax(opens.any(axis=1))]
        rows = estimates = None
        if arrival_rows:
            rows = wl.requests[index]
            estimates = rows[:, EST]
        p = router_index(params, j)
        view = router_view(t, backlogged, heads[j], head_index[j], rarrived[j] - state.rhead[j], rcounter[p],
                            state.rlast[p], gp.costs)
        arrivals = Arrivals(joins=joins, client=client, index=index, rows=rows, estimates=estimates, joining=joining,
                            newcomer=newcomer, first=first)
        counters, rpolicy = [], dict(rpolicy)
        for n in cfg.gateway_policies:
            st = rslice(rpolicy[n], flags[n], p)
            new, counter = registry.get(n).arrive(st, view, arrivals, gp.policy[n])
            counters.append(counter)
            rpolicy[n] = rput(rpolicy[n], flags[n], p, new, go)
        counter = pick(gp.policy_id, counters)
        rcounter = rcounter.at[p].set(WIDE.where(go, counter, rcounter[p]))
        took = ((client[:, None] == jnp.arange(k)[None, :]) & taken[:, None]).sum(axis=0, dtype=I32)
        return (rarrived.at[j].add(took), rnext.at[j].add(taken.sum(dtype=I32)), rcounter, rpolicy, prior)

    carry = (state.rarrived, state.rnext, state.rcounter, dict(state.rpolicy), jnp.asarray(True))
    carry = body(0, carry) if g == 1 else jax.lax.fori_loop(0, g, body, carry)
    rarrived, rnext, rcounter, rpolicy, _ = carry
    fleet = state.fleet
    if fleet is not None:  # each enqueue brings a dispatch cycle (a rejected arrival enqueues nothing)
        refused = jnp.zeros((), bool) if refuse is None else refuse & (rnext[0] > state.rnext[0])  # one router
        enqueued = (rnext - state.rnext).sum(dtype=I32) - refused.astype(I32)
        fleet = dict(fleet, cycles=fleet["cycles"] + jnp.where(one, enqueued, 0))
        if refuse is not None:
            fleet = cluster_shed.reject(fleet, 0, entries[0, 0, 0], entries[0, 0, 1], refused)
    return dataclasses.replace(state, rarrived=rarrived, rnext=rnext, rcounter=rcounter, rpolicy=rpolicy,
                               fleet=fleet)


def _flags(params: ClusterParams, cfg: ClusterConfig) -> dict:
    return {n: table_flags(n, params.gateway.policy[n], cfg.num_clients, cfg.num_rows) for n in cfg.gateway_policies}


def _due(state: ClusterState, cfg: ClusterConfig):
    """bool[R]: each replica at a boundary holds a request its last step finished."""
    due = over_replicas(functools.partial(replica.rep_due, cfg=cfg), in_axes=(0, None))(state.reps, state.step)
    return due & (state.boundary <= state.step)


def step_lane(state: ClusterState, params: ClusterParams, wl: ClusterWorkload, cfg: ClusterConfig) -> ClusterState:
    """One event of one cluster lane (see the module docstring)."""
    r, w = cfg.replicas, cfg.arrival_width
    flags = _flags(params, cfg)
    t = state.step
    if state.fleet is not None and "held" in state.fleet:  # a due TTL sweep; heads past rejected rows
        fleet, rhead = cluster_shed.drop_heads(state.fleet, state.rhead, state.rarrived, wl.first, wl.requests, t,
                                               ~state.done, params.fleet)
        state = dataclasses.replace(state, fleet=fleet, rhead=rhead)
    active = ~state.done
    in_horizon = t < params.horizon
    if state.sent is not None:
        state = _record_sent(state, state.sent_write)
    # replicas
    rheads = over_replicas(replica.rep_heads, in_axes=(0, None))(state.reps, state.sent)
    due = _due(state, cfg)
    room, load, queued = over_replicas(functools.partial(replica.rep_room, cfg=cfg), in_axes=(0, 0, None))(
        state.reps, jnp.arange(r, dtype=I32), params)
    cycles = flow = live = None
    if state.fleet is not None:  # the gateway: a scrape due by now; room = a cycle and no saturation (flow control)
        fp = params.fleet
        fleet = fleet_mod.scrape(state.fleet, state.reps.stats, state.reps.stats_at, t, fp)
        state = dataclasses.replace(state, fleet=fleet)
        live = fleet_mod.live_stats(state.reps, params.engine, cfg)
        present = jnp.arange(r) < params.replicas
        flow = fp.flow
        held = flow & fleet_mod.saturated(fleet, live, present, fp)
        room = present & ~held
    # routers
    at = state.rnext[:, None] + jnp.arange(w + 1, dtype=I32)[None, :]  # [G, W + 1]
    entries = jnp.take_along_axis(wl.timeline, at[:, :, None], axis=1)  # [G, W + 1, 2]
    warr = wl.requests[entries[:, :, 0], ARRIVAL]
    next_arrival = warr[:, 0]
    pending = in_horizon & (next_arrival <= t).any()
    head_index = wl.first + state.rhead
    heads = wl.requests[head_index]
    routers = router_arrays(state, heads, head_index, params, cfg)
    offer = router_offer(state, routers, params, cfg, flags)
    ready = active & in_horizon & ~due.any() & ~pending
    gate = ready
    if flow is not None:  # under flow control a dispatch needs a cycle (an enqueue's, or the tick's once arrivals are in)
        cycles = fleet_mod.cycles_now(state.fleet, pending)
        gate = jnp.where(flow, active & in_horizon & ~due.any() & (cycles > 0), ready)
    dispatching = gate & ~state.dispatched_all & room.any() & offer.has
    clients, has, rstates = over_replicas(functools.partial(replica.rep_select, cfg=cfg), in_axes=(0, 0, None, None))(
        state.reps, rheads, t, params.engine)
    fits = over_replicas(functools.partial(replica.rep_fits, cfg=cfg), in_axes=(0, 0, 0, None))(
        state.reps, rheads, clients, params.engine)
    settled = ready & ~dispatching
    at_bound = (state.boundary <= t) & ~state.asleep
    admitting = settled & has & fits & at_bound
    beginning = None
    if state.reps.begun is not None:  # a replica's BEGIN is an event of its own, before its admissions
        beginning = settled & at_bound & ~state.reps.begun
        admitting = admitting & ~beginning.any() & state.reps.begun
        settled = settled & ~beginning.any()
    finishing = settled & ~admitting.any()

    state, sent_write = _dispatch(state, wl, params, cfg, flags, routers, offer, rheads, room, load, queued,
                                  dispatching, live)
    state = dataclasses.replace(state, dispatched_all=state.dispatched_all | ready & ~dispatching)
    if flow is not None:  # a cycle dispatches one request; one that finds none to send (saturated, empty) is spent
        state = dataclasses.replace(state, fleet=fleet_mod.spend(state.fleet, pending, flow & gate, dispatching))
    if beginning is not None:
        state = _begin(state, rheads, params, cfg, beginning)
    state = _admit(state, rheads, clients, rstates, admitting, params, cfg)
    state = _finish(state, wl, rheads, routers, params, cfg, flags, finishing, next_arrival)
    completing = active & _due(state, cfg)
    state = _complete(state, params, cfg, completing)
    settled_now = ~_due(state, cfg).any()
    arriving = active & (state.step < params.horizon) & settled_now & (next_arrival <= state.step).any()
    if flow is not None:  # the last enqueue's cycle first
        arriving = arriving & (~flow | (state.fleet["cycles"] <= 0))
    state = _arrive(state, wl, heads, head_index, params, cfg, flags, arriving, entries, warr)
    finished = (state.step >= params.horizon) & settled_now
    return dataclasses.replace(state, done=state.done | (active & finished), sent_write=sent_write,
                               iterations=state.iterations + active.astype(I32))


def init_state(cfg: ClusterConfig, params: ClusterParams, wl: ClusterWorkload) -> ClusterState:
    g, k, r = cfg.routers, cfg.num_clients, cfg.replicas
    flags = _flags(params, cfg)
    shape = Shape(num_clients=k, num_rows=cfg.num_rows, num=WIDE)
    rpolicy = {}
    for n in cfg.gateway_policies:
        s = registry.get(n).init(params.gateway.policy[n], shape)
        rpolicy[n] = jax.tree_util.tree_map(lambda x, f: x if f else jnp.broadcast_to(x, (g,) + x.shape), s, flags[n])
    rep = replica.rep_init(cfg, params.engine)
    reps = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (r,) + x.shape), rep)
    ring_c = ring_d = stamp = None
    if cfg.ring:
        ring_c = WIDE.zeros((cfg.ring, g, k))
        if "drr" in cfg.gateway_policies:
            ring_d = jnp.zeros((cfg.ring, g, k), I32)
        stamp = jnp.full(cfg.ring, -1, I32).at[0].set(0)
    zgk = jnp.zeros((g, k), I32)
    rec = jnp.full((cfg.num_rows, 4), -1, I32) if cfg.record else None
    sent = jnp.zeros((cfg.num_rows, POOL_FIELDS), I32) if servers.get(cfg.server).preempts else None
    return ClusterState(
        step=jnp.zeros((), I32), done=params.horizon <= 0, iterations=jnp.zeros((), I32), rhead=zgk, rarrived=zgk,
        rnext=jnp.zeros(g, I32),
        rcounter=WIDE.zeros((g, k)), rlast=jnp.full(g, -1, I32), rpolicy=rpolicy, cursor=jnp.zeros((), I32),
        dispatched_all=jnp.zeros((), bool),
        rr=jnp.zeros(g, I32), dseq=jnp.zeros((), I32), ring_c=ring_c, ring_d=ring_d, stamp=stamp, reps=reps,
        boundary=jnp.zeros(r, I32), asleep=jnp.zeros(r, bool),
        dispatched=jnp.zeros((g, r, k), I32), snap=WIDE.zeros((r, k)), wsnap=WIDE.zeros((r, k)),
        bs=WIDE.zeros((k,)), bsw=WIDE.zeros((k,)), drift=WIDE.zeros(), bsteps=jnp.zeros((), I32),
        wait_hist=jnp.zeros((k, LATENCY_BINS), I32), rec=rec, sent=sent,
        sent_write=None if sent is None else (jnp.asarray(cfg.num_rows, I32), jnp.zeros(POOL_FIELDS, I32)),
        fleet=None if cfg.picker is None else fleet_mod.init(cfg, params))


def _program_init(cfg: ClusterConfig, batched: ClusterBatch, shared) -> ClusterState:
    return init_state(cfg, batched.params, batched.workload)


def _program_step(state: ClusterState, batched: ClusterBatch, shared, cfg: ClusterConfig) -> ClusterState:
    return step_lane(state, batched.params, batched.workload, cfg)


PROGRAM = LaneProgram(name="cluster", init=_program_init, step=_program_step, done=lambda s: s.done)


# ---- layout: client-major requests -> (router, tenant) blocks ----------------------------

def layout_lane(wl: Workload, params: ClusterParams, *, routers: int) -> ClusterWorkload:
    """One lane's requests in (router, tenant) blocks (see ClusterWorkload). The router of
    the request at position p of tenant k's block is `ingress_router(seed, k, p, P)`; its
    estimate is the estimator's prediction for (k, p) (estimators.py, one value per request)."""
    rows = wl.requests
    n = rows.shape[0]
    k = wl.first.shape[0]
    g = routers
    idx = jnp.arange(n, dtype=I32)
    tenant = block_of_rows(wl.first, n)
    position = idx - wl.first[tenant]
    real = rows[:, ARRIVAL] < INT32_MAX
    router = ingress_router(params.seed, tenant, position, params.thresholds[tenant])
    est = estimators.estimate(estimators.init(k), params.engine.estimator, tenant, rows[:, OUTPUT], position)
    hot = ((router[:, None] == jnp.arange(g)) & real[:, None]).astype(I32)  # [N, G]
    before = jnp.cumsum(hot, axis=0) - hot
    rank = jnp.take_along_axis(before - before[wl.first[tenant]], router[:, None], axis=1)[:, 0]
    dest = jnp.where(real, router * n + wl.first[tenant] + rank, g * n)
    pad = np.zeros(ROW_FIELDS, np.int32)
    pad[ARRIVAL] = pad[ORDER] = INT32_MAX
    pad[PROMPT] = pad[OUTPUT] = pad[EST] = 1
    out = jnp.broadcast_to(jnp.asarray(pad), (g * n, ROW_FIELDS))
    out = out.at[dest].set(jnp.concatenate([rows, est[:, None]], axis=1), mode="drop")
    first = (jnp.arange(g, dtype=I32)[:, None] * n + wl.first[None, :]).astype(I32)
    lines = []
    for j in range(g):  # router j's rows in (ORDER, row) order; padding (ORDER = INT32_MAX) last
        order = jax.lax.sort((out[j * n:(j + 1) * n, ORDER], idx), num_keys=1, is_stable=True)[1]
        lines.append(jnp.stack([j * n + order, tenant[order]], axis=1))
    timeline = jnp.stack(lines)
    timeline = jnp.concatenate([timeline, jnp.broadcast_to(timeline[:, -1:], (g, TIMELINE_PAD, 2))], axis=1)
    return ClusterWorkload(requests=out, first=first, timeline=timeline.astype(I32), num_requests=wl.num_requests,
                           overflow=wl.overflow)


@functools.partial(jax.jit, static_argnames=("routers", "shared"))
def layout_lanes(wl: Workload, params: ClusterParams, *, routers: int, shared: bool) -> ClusterWorkload:
    return jax.vmap(functools.partial(layout_lane, routers=routers), in_axes=(None if shared else 0, 0))(wl, params)

