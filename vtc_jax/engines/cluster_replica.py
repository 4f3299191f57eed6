"""One cluster replica's functions (docs/CLUSTER.md), vmapped over the replica axis by the
cluster's events (cluster.py): a per-tenant FIFO of dispatched requests in a slot pool,
the replica's engine policy, and in front of it any registered server (servers/base.py),
reached only through its component functions (the cluster knows no server by name), and
its admission limits (engines/limits.py, as on one server). The replica charges the
server's `Work` with the lane's costs, as engine.py does. A server that preempts (vLLM's
recompute) keeps its own requeue here, as on one server (engines/requeue.py): at its
step's BEGIN the server hands back its victims, each goes onto its tenant's stack, and a
tenant's head is its stack's top (its pool record, read from the cluster's `sent`) before
its FIFO's."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from vtc_jax.core.rows import ARRIVAL, CACHED, NUM_FIELDS, ORDER, PROMPT
from vtc_jax.core.wide import WIDE
from vtc_jax.engines import limits, requeue
from vtc_jax.engines.cluster_settings import KV, ClusterConfig, ClusterParams
from vtc_jax.engines.cluster_state import EST, NUMBER, ORIG, POOL_FIELDS, ROW_FIELDS, ROWID, Replica, keep, pick
from vtc_jax.engines.settings import Params
from vtc_jax.policies import registry
from vtc_jax.policies.base import (Admission, Arrivals, Completion, Shape, StepEnd, View, admissible, onehot,
                                   step_charge)
from vtc_jax.servers import registry as servers

I32 = jnp.int32


def rep_heads(rep: Replica, sent=None):
    """int32[K, POOL_FIELDS]: each tenant's head record (meaningful where waiting): its
    stack's top where it holds preempted requests (`sent`: int32[N, POOL_FIELDS] the record
    of each dispatch sequence), else its FIFO's head."""
    fifo = rep.pool[jnp.maximum(rep.fh, 0)]
    if rep.stacks is None:
        return fifo
    top, _ = requeue.tops(rep.stacks)
    return jnp.where((rep.stacks.depth > 0)[:, None], sent[jnp.maximum(top, 0)], fifo)


def server_row(record, cfg: ClusterConfig):
    """int32[NUM_FIELDS]: a pool record as the server sees it. A server that keys its
    record by the index it is given (record_index "row": vLLM) sees the request's number as
    its ORDER, as on one server (a prefix cache finds its content by it); one that keys its
    record by ORDER (slora) sees the dispatch sequence there."""
    if servers.get(cfg.server).record_index != "row":
        return record[:NUM_FIELDS]
    return record[:NUM_FIELDS].at[ORDER].set(record[NUMBER])


def _in_fifo(rep: Replica):
    """int32[K]: each tenant's requests in its FIFO (its waiting ones less its stacked ones)."""
    return rep.nw if rep.stacks is None else rep.nw - rep.stacks.depth


def _generated(rep: Replica, client):
    """int32[]: tokens `client`'s head had generated (a preempted request: recomputed), 0 for a new one."""
    return jnp.zeros((), I32) if rep.stacks is None else requeue.tops(rep.stacks)[1][client]


def rep_load(rep: Replica, cfg: ClusterConfig):
    """The server's Load (running requests and the context they hold, per tenant)."""
    return servers.get(cfg.server).load(rep.server)


def keyed_by_sequence(cfg: ClusterConfig) -> bool:
    """The replica's policies key their per-request tables by dispatch sequence (< num_rows),
    not by waiting slot, when the server preempts: a preempted request comes back after its
    slot was freed and taken again, and its tags (wfq, sfq, drr) must still be there."""
    return servers.get(cfg.server).preempts


def table_rows(cfg: ClusterConfig) -> int:
    """Rows of a replica policy's per-request tables (policies.base.Shape.num_rows)."""
    return cfg.num_rows if keyed_by_sequence(cfg) else cfg.wait_slots


def _view(rep: Replica, heads, step, costs, cfg: ClusterConfig) -> View:
    load = rep_load(rep, cfg)
    index = heads[:, ORDER] if keyed_by_sequence(cfg) else jnp.maximum(rep.fh, 0)
    return View(num=WIDE, step=step, backlogged=rep.nw > 0, heads=heads, head_index=index,
                waiting=rep.nw, counter=rep.counter, running=load.running, context=load.context,
                last_left=rep.last_left, costs=costs, estimates=heads[:, EST])


def rep_select(rep: Replica, heads, step, eparams: Params, cfg: ClusterConfig):
    """The replica's candidate (client, has, states) among the tenants its limits let
    through; `has` only where the policy chose one of them (base.admissible): any other
    choice admits nothing and the step ends."""
    view = _view(rep, heads, step, eparams.costs, cfg)
    eligible = limits.eligible(rep.limits, heads, view.backlogged, eparams, cfg.bands)
    choices = [registry.get(n).select(rep.policy[n], view, eligible, eparams.policy[n])
               for n in cfg.engine_policies]
    client = pick(eparams.policy_id, [c.client for c in choices]).astype(I32)
    has = pick(eparams.policy_id, [c.has for c in choices]) & admissible(eligible, client)
    return client, has, {n: c.state for n, c in zip(cfg.engine_policies, choices)}


def rep_fits(rep: Replica, heads, client, eparams: Params, cfg: ClusterConfig):
    """bool[]: the server's memory admits `client`'s FIFO head now (its `fits`)."""
    server = servers.get(cfg.server)
    extra = {"client": client} if server.fits_client else {}
    return server.fits(rep.server, eparams, server_row(heads[client], cfg), generated=_generated(rep, client), **extra)


def rep_room(rep: Replica, index, params: ClusterParams, cfg: ClusterConfig):
    """(room bool[], load int32[], queued int32[]): the saturation rule (context held by
    the server + waiting prompts < kv_limit, or fewer than queue_limit waiting) for
    routing, and the load and queue the replica choice compares."""
    load = rep_load(rep, cfg).context.sum() + rep.waitp
    queued = rep.nw.sum()
    room = jnp.where(params.saturation == KV, load < params.kv_limit, queued < params.queue_limit)
    return room & (index < params.replicas), load, queued


def rep_receive(rep: Replica, heads, step, record, client, mask, eparams: Params, cfg: ClusterConfig) -> Replica:
    """A dispatched request joins this replica's FIFO of `client` where `mask`; the engine
    policies' arrival hooks see it as one arrival (MODEL.md phase 1: VTC's lift)."""
    view = _view(rep, heads, step, eparams.costs, cfg)
    k, s = cfg.num_clients, cfg.wait_slots
    ok = mask & (rep.top > 0)
    slot = rep.free[jnp.maximum(rep.top - 1, 0)]
    # The write's index depends on the heads read from the pool at the event's start (a
    # data dependency XLA must respect): otherwise XLA may read them after the write and
    # copy the whole pool on every event (as servers/completions.py push guards against).
    after = ok & (heads[0, ARRIVAL] >= -1)
    pool = rep.pool.at[jnp.where(after, slot, s)].set(record, mode="drop")
    tail = rep.ft[client]
    queued = _in_fifo(rep)[client]
    link = ok & (queued > 0)
    nxt = rep.nxt.at[jnp.stack([jnp.where(ok, slot, s), jnp.where(link, tail, s)])].set(
        jnp.stack([jnp.asarray(-1, I32), slot]), mode="drop")
    fh = rep.fh.at[client].set(jnp.where(ok & (queued == 0), slot, rep.fh[client]))
    ft = rep.ft.at[client].set(jnp.where(ok, slot, tail))
    joining = onehot(client, k, ok)
    key = record[ORDER] if keyed_by_sequence(cfg) else slot
    arrivals = Arrivals(joins=ok[None], client=client.astype(I32)[None], index=key[None],
                        rows=record[None, :ROW_FIELDS], estimates=record[EST][None], joining=joining,
                        newcomer=~view.backlogged & (joining > 0), first=client.astype(I32))
    states, counters = {}, []
    for n in cfg.engine_policies:
        states[n], c = registry.get(n).arrive(rep.policy[n], view, arrivals, eparams.policy[n])
        counters.append(c)
    counter = WIDE.where(ok, pick(eparams.policy_id, counters), rep.counter)
    return dataclasses.replace(rep, pool=pool, nxt=nxt, fh=fh, ft=ft, nw=rep.nw + joining,
                               waitp=rep.waitp + ok.astype(I32) * record[PROMPT], top=rep.top - ok.astype(I32),
                               counter=counter, policy=states, overflow=rep.overflow | (mask & ~ok))


def rep_admit(rep: Replica, heads, client, states, mask, step, eparams: Params, cfg: ClusterConfig):
    """Admit the candidate (its head) where `mask` (MODEL.md phase 2, one request): it
    leaves its stack (a preempted request, recomputed and not charged again) or its FIFO,
    and the server starts it. Returns (replica, (router arrival, cluster row) of the
    request, first bool[]: a new request, not a preempted one)."""
    view = _view(rep, heads, step, eparams.costs, cfg)
    k, s = cfg.num_clients, cfg.wait_slots
    row = view.heads[client]
    slot = jnp.maximum(rep.fh[client], 0)  # the FIFO head's waiting slot (freed if it is the one admitted)
    stacks, again, generated = rep.stacks, jnp.zeros((), bool), _generated(rep, client)
    if stacks is not None:
        again = stacks.depth[client] > 0
        stacks = requeue.pop(stacks, onehot(client, k, mask & again))
    first = mask & ~again
    take, fresh = onehot(client, k, mask), onehot(client, k, first)
    prompt = row[PROMPT]
    costs = eparams.costs
    server = servers.get(cfg.server)
    cached = row[CACHED] if server.prefix_hit is None else server.prefix_hit(rep.server, eparams, server_row(row, cfg),
                                                                             generated=generated)
    prefill = jnp.where(again, 0, costs.prefill * jnp.where(costs.charge_cached, prompt, prompt - cached))
    admission = Admission(client=client, row=row[:ROW_FIELDS], index=view.head_index[client], estimate=row[EST],
                          prefill=prefill)
    new_states, values = {}, []
    for n in cfg.engine_policies:
        new_states[n], v = registry.get(n).admit(states[n], view, admission, eparams.policy[n])
        values.append(v)
    value = pick(eparams.policy_id, values)
    # the server numbers the replica's requests by dispatch sequence (the record's ORDER)
    started, overflow = server.admit(rep.server, eparams, server_row(row, cfg), client, value, step, mask,
                                     index=row[ORDER], generated=generated)
    last = _in_fifo(rep)[client] == 1
    fh = rep.fh.at[client].set(jnp.where(first, jnp.where(last, -1, rep.nxt[slot]), rep.fh[client]))
    ft = rep.ft.at[client].set(jnp.where(first & last, -1, rep.ft[client]))
    free = rep.free.at[jnp.where(first, rep.top, s)].set(slot, mode="drop")
    charge = take * prefill
    weighted = charge * costs.counter_mult
    rep = dataclasses.replace(
        rep, fh=fh, ft=ft, free=free, top=rep.top + first.astype(I32), nw=rep.nw - take,
        waitp=rep.waitp - mask.astype(I32) * prompt, server=started, stacks=stacks,
        service=WIDE.add(rep.service, charge), counter=WIDE.add(rep.counter, weighted),
        wsvc=WIDE.add(rep.wsvc, weighted), admitted=rep.admitted + fresh,
        last_left=jnp.where(mask, client, rep.last_left), limits=limits.on_admit(rep.limits, fresh, row),
        overflow=rep.overflow | overflow, policy=keep(rep.policy, new_states, mask))
    return rep, (row[ORIG], row[ROWID]), first


def rep_begin(rep: Replica, heads, step, mask, sent, eparams: Params, cfg: ClusterConfig) -> Replica:
    """The replica's step BEGIN where `mask` (a server that preempts): the server schedules
    its running requests and hands back its victims, which go onto their tenants' stacks
    (in the server's order: the last one is served first again) and count as waiting."""
    view = _view(rep, heads, step, eparams.costs, cfg)
    server, out = servers.get(cfg.server).begin_step(rep.server, eparams, view, step, mask)
    pushing = out.mask & mask
    stacks, overflow = requeue.push(rep.stacks, pushing, out.client, out.index, out.generated)
    mine = (out.client[None, :] == jnp.arange(cfg.num_clients)[:, None]) & pushing[None, :]  # [K, S]
    prompts = jnp.where(pushing, sent[jnp.clip(out.index, 0, sent.shape[0] - 1), PROMPT], 0)
    return dataclasses.replace(rep, server=server, stacks=stacks, begun=rep.begun | mask,
                               nw=rep.nw + mine.sum(axis=1, dtype=I32), waitp=rep.waitp + prompts.sum(dtype=I32),
                               overflow=rep.overflow | (mask & overflow))


def rep_end_step(rep: Replica, mask, eparams: Params, cfg: ClusterConfig):
    """The server's step where `mask` (MODEL.md phase 3): (server state, Work)."""
    return servers.get(cfg.server).end_step(rep.server, eparams, mask)


def rep_finish(rep: Replica, heads, step, next_step, mask, moving, server, work, elapsed, eparams: Params,
               cfg: ClusterConfig) -> Replica:
    """Where `mask`: the step's work (from rep_end_step) charged with the lane's costs (w_q x
    decoded + beta x attended) and the policies' step-end hooks (`elapsed`). Where `moving`
    (the cluster's clock moves from `step` to `next_step`): the limits' rpm window."""
    view = _view(rep, heads, step, eparams.costs, cfg)
    costs = eparams.costs
    decode = step_charge(costs, work)
    weighted = decode * costs.counter_mult
    step_end = StepEnd(decode=decode, elapsed=elapsed, detail=work.detail)
    states = {n: registry.get(n).step(rep.policy[n], view, step_end, eparams.policy[n]) for n in cfg.engine_policies}
    begun = None if rep.begun is None else rep.begun & ~mask  # the next step begins again
    return dataclasses.replace(rep, service=WIDE.add(rep.service, decode), counter=WIDE.add(rep.counter, weighted),
                               wsvc=WIDE.add(rep.wsvc, weighted), server=server, begun=begun,
                               limits=limits.on_step(rep.limits, step, next_step, moving, eparams),
                               policy=keep(rep.policy, states, mask))


def rep_due(rep: Replica, step, cfg: ClusterConfig):
    """bool[]: a request the server finished by the end of step `step - 1` has not left."""
    return servers.get(cfg.server).due(rep.server, step)


def rep_complete(rep: Replica, heads, mask, step, eparams: Params, cfg: ClusterConfig):
    """MODEL.md phase 4 for one request (the server's next to leave) where `mask`. Returns
    (replica, the request's prompt tokens)."""
    view = _view(rep, heads, step, eparams.costs, cfg)
    server, done = servers.get(cfg.server).complete(rep.server, step, mask)
    take = onehot(done.client, cfg.num_clients, mask)
    completion = Completion(client=done.client, prompt=done.prompt, output=done.output, estimate=done.value)
    states = {n: registry.get(n).complete(rep.policy[n], view, completion, eparams.policy[n])
              for n in cfg.engine_policies}
    return dataclasses.replace(rep, server=server, completed=rep.completed + take,
                               limits=limits.on_complete(rep.limits, take, done.prompt, done.output),
                               policy=keep(rep.policy, states, mask)), done.prompt


def rep_init(cfg: ClusterConfig, eparams: Params) -> Replica:
    k, s = cfg.num_clients, cfg.wait_slots
    shape = Shape(num_clients=k, num_rows=table_rows(cfg), num=WIDE)
    zk = jnp.zeros(k, I32)
    return Replica(pool=jnp.zeros((s, POOL_FIELDS), I32), nxt=jnp.full(s, -1, I32),
                   free=jnp.arange(s - 1, -1, -1, dtype=I32), top=jnp.asarray(s, I32), fh=jnp.full(k, -1, I32),
                   ft=jnp.full(k, -1, I32), nw=zk, waitp=jnp.zeros((), I32), counter=WIDE.zeros((k,)),
                   service=WIDE.zeros((k,)), wsvc=WIDE.zeros((k,)),
                   server=servers.get(cfg.server).init(cfg.server_shape),
                   last_left=jnp.asarray(-1, I32), admitted=zk, completed=zk,
                   policy={n: registry.get(n).init(eparams.policy[n], shape) for n in cfg.engine_policies},
                   limits=limits.init(k, cfg.rpm, cfg.kv_cap), overflow=jnp.zeros((), bool),
                   **_preemption_state(cfg), **_metrics_state(cfg))


def _metrics_state(cfg: ClusterConfig) -> dict:
    """Behind an endpoint picker: the metrics the replica's steps end with (cluster_fleet.py)."""
    if cfg.picker is None:
        return {}
    return {"stats": jnp.zeros((2, 2), I32), "stats_at": jnp.zeros((), I32)}


def _preemption_state(cfg: ClusterConfig) -> dict:
    if not servers.get(cfg.server).preempts:
        return {}
    return {"stacks": requeue.init(cfg.num_clients, cfg.requeue_depth), "begun": jnp.zeros((), bool)}
