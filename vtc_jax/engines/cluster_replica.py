"""One cluster replica's functions (docs/CLUSTER.md), vmapped over the replica axis by the
cluster's events (cluster.py): a per-tenant FIFO of dispatched requests in a slot pool,
the replica's engine policy, and in front of it any registered server (servers/base.py),
reached only through its component functions (the cluster knows no server by name), and
its admission limits (engines/limits.py, as on one server). The replica charges the
server's `Work` with the lane's costs, as engine.py does."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from vtc_jax.core.rows import ARRIVAL, CACHED, NUM_FIELDS, PROMPT
from vtc_jax.core.wide import WIDE
from vtc_jax.engines import limits
from vtc_jax.engines.cluster_settings import KV, ClusterConfig, ClusterParams
from vtc_jax.engines.cluster_state import EST, ORIG, POOL_FIELDS, ROW_FIELDS, ROWID, Replica, keep, pick
from vtc_jax.engines.settings import Params
from vtc_jax.policies import registry
from vtc_jax.policies.base import Admission, Arrivals, Completion, Shape, StepEnd, View, admissible, onehot
from vtc_jax.servers import registry as servers

I32 = jnp.int32


def rep_heads(rep: Replica):
    """int32[K, POOL_FIELDS]: each tenant's FIFO head record (meaningful where waiting)."""
    return rep.pool[jnp.maximum(rep.fh, 0)]


def rep_load(rep: Replica, cfg: ClusterConfig):
    """The server's Load (running requests and the context they hold, per tenant)."""
    return servers.get(cfg.server).load(rep.server)


def _view(rep: Replica, heads, step, costs, cfg: ClusterConfig) -> View:
    load = rep_load(rep, cfg)
    return View(num=WIDE, step=step, backlogged=rep.nw > 0, heads=heads, head_index=jnp.maximum(rep.fh, 0),
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
    return server.fits(rep.server, eparams, heads[client, :NUM_FIELDS], **extra)


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
    link = ok & (rep.nw[client] > 0)
    nxt = rep.nxt.at[jnp.stack([jnp.where(ok, slot, s), jnp.where(link, tail, s)])].set(
        jnp.stack([jnp.asarray(-1, I32), slot]), mode="drop")
    fh = rep.fh.at[client].set(jnp.where(ok & (rep.nw[client] == 0), slot, rep.fh[client]))
    ft = rep.ft.at[client].set(jnp.where(ok, slot, tail))
    joining = onehot(client, k, ok)
    arrivals = Arrivals(joins=ok[None], client=client.astype(I32)[None], index=slot[None],
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
    """Admit the candidate (its FIFO head) where `mask` (MODEL.md phase 2, one request): it
    leaves the FIFO and the server starts it. Returns (replica, (router arrival, cluster
    row) of the request)."""
    view = _view(rep, heads, step, eparams.costs, cfg)
    k, s = cfg.num_clients, cfg.wait_slots
    row = view.heads[client]
    slot = view.head_index[client]
    take = onehot(client, k, mask)
    prompt = row[PROMPT]
    costs = eparams.costs
    prefill = costs.prefill * jnp.where(costs.charge_cached, prompt, prompt - row[CACHED])
    admission = Admission(client=client, row=row[:ROW_FIELDS], index=slot, estimate=row[EST], prefill=prefill)
    new_states, values = {}, []
    for n in cfg.engine_policies:
        new_states[n], v = registry.get(n).admit(states[n], view, admission, eparams.policy[n])
        values.append(v)
    value = pick(eparams.policy_id, values)
    server, overflow = servers.get(cfg.server).admit(rep.server, eparams, row[:NUM_FIELDS], client, value, step, mask)
    last = rep.nw[client] == 1
    fh = rep.fh.at[client].set(jnp.where(mask, jnp.where(last, -1, rep.nxt[slot]), rep.fh[client]))
    ft = rep.ft.at[client].set(jnp.where(mask & last, -1, rep.ft[client]))
    free = rep.free.at[jnp.where(mask, rep.top, s)].set(slot, mode="drop")
    charge = take * prefill
    weighted = charge * costs.counter_mult
    rep = dataclasses.replace(
        rep, fh=fh, ft=ft, free=free, top=rep.top + mask.astype(I32), nw=rep.nw - take,
        waitp=rep.waitp - mask.astype(I32) * prompt, server=server,
        service=WIDE.add(rep.service, charge), counter=WIDE.add(rep.counter, weighted),
        wsvc=WIDE.add(rep.wsvc, weighted), admitted=rep.admitted + take,
        last_left=jnp.where(mask, client, rep.last_left), limits=limits.on_admit(rep.limits, take, row),
        overflow=rep.overflow | overflow, policy=keep(rep.policy, new_states, mask))
    return rep, (row[ORIG], row[ROWID])


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
    decode = costs.decode * work.decoded + costs.context * work.attended
    weighted = decode * costs.counter_mult
    step_end = StepEnd(decode=decode, elapsed=elapsed, detail=work.detail)
    states = {n: registry.get(n).step(rep.policy[n], view, step_end, eparams.policy[n]) for n in cfg.engine_policies}
    return dataclasses.replace(rep, service=WIDE.add(rep.service, decode), counter=WIDE.add(rep.counter, weighted),
                               wsvc=WIDE.add(rep.wsvc, weighted), server=server,
                               limits=limits.on_step(rep.limits, step, next_step, moving, eparams),
                               policy=keep(rep.policy, states, mask))


def rep_due(rep: Replica, step, cfg: ClusterConfig):
    """bool[]: a request the server finished by the end of step `step - 1` has not left."""
    return servers.get(cfg.server).due(rep.server, step)


def rep_complete(rep: Replica, heads, mask, step, eparams: Params, cfg: ClusterConfig) -> Replica:
    """MODEL.md phase 4 for one request (the server's next to leave) where `mask`."""
    view = _view(rep, heads, step, eparams.costs, cfg)
    server, done = servers.get(cfg.server).complete(rep.server, step, mask)
    take = onehot(done.client, cfg.num_clients, mask)
    completion = Completion(client=done.client, prompt=done.prompt, output=done.output, estimate=done.value)
    states = {n: registry.get(n).complete(rep.policy[n], view, completion, eparams.policy[n])
              for n in cfg.engine_policies}
    return dataclasses.replace(rep, server=server, completed=rep.completed + take,
                               limits=limits.on_complete(rep.limits, take, done.prompt, done.output),
                               policy=keep(rep.policy, states, mask))


def rep_init(cfg: ClusterConfig, eparams: Params) -> Replica:
    k, s = cfg.num_clients, cfg.wait_slots
    shape = Shape(num_clients=k, num_rows=s, num=WIDE)
    zk = jnp.zeros(k, I32)
    return Replica(pool=jnp.zeros((s, POOL_FIELDS), I32), nxt=jnp.full(s, -1, I32),
                   free=jnp.arange(s - 1, -1, -1, dtype=I32), top=jnp.asarray(s, I32), fh=jnp.full(k, -1, I32),
                   ft=jnp.full(k, -1, I32), nw=zk, waitp=jnp.zeros((), I32), counter=WIDE.zeros((k,)),
                   service=WIDE.zeros((k,)), wsvc=WIDE.zeros((k,)),
                   server=servers.get(cfg.server).init(cfg.server_shape),
                   last_left=jnp.asarray(-1, I32), admitted=zk, completed=zk,
                   policy={n: registry.get(n).init(eparams.policy[n], shape) for n in cfg.engine_policies},
                   limits=limits.init(k, cfg.rpm, cfg.kv_cap), overflow=jnp.zeros((), bool))
