"""The cluster's G gateway routers (docs/CLUSTER.md): which leaves of a router policy's
state are per-row tables (kept once for all routers) or wide integers, the routers' views
(their own queues, or the cluster-wide backlog in the shared modes), the next dispatch of
a round (routers' selects vmapped over the router axis) and the replica it goes to."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import wide as wide_mod
from vtc_jax.core.wide import WIDE
from vtc_jax.engines import cluster_shed
from vtc_jax.engines.cluster_settings import (
    AFFINITY_SALT,
    LEAST_KV,
    LEAST_QUEUED,
    P2C,
    P2C_SALT,
    PER_ROUTER,
    ROUND_ROBIN,
    SHARED,
    ClusterConfig,
    ClusterParams,
)
from vtc_jax.engines.cluster_state import EST, ClusterState, choose, pick
from vtc_jax.engines.settings import INT32_MAX
from vtc_jax.policies import estimators, registry
from vtc_jax.policies.base import Shape, View, admissible

I32, U32 = jnp.int32, jnp.uint32


@functools.lru_cache(maxsize=None)
def _leaf_kinds_cached(name: str, k: int, rows: int, struct):
    pol = registry.get(name)
    tree, specs = struct
    params = jax.tree_util.tree_unflatten(tree, [jax.ShapeDtypeStruct(s, d) for s, d in specs])
    shape = lambda r, num: jax.eval_shape(lambda p: pol.init(p, Shape(k, r, num)), params)  # noqa: E731
    a, b, c = shape(rows, WIDE), shape(rows + 1, WIDE), shape(rows, wide_mod.NARROW)
    return (jax.tree_util.tree_map(lambda x, y: x.shape != y.shape, a, b),
            jax.tree_util.tree_map(lambda x, y: x.ndim != y.ndim, a, c))


def leaf_kinds(name: str, params, k: int, rows: int):
    """(tables, wides): per leaf of policy `name`'s state, whether it is a per-row table
    (its shape follows the row count; kept once for all routers, whose rows are disjoint)
    and whether it holds exact wide integers. `params`: the policy's params of one lane."""
    leaves, tree = jax.tree_util.tree_flatten(params)
    specs = tuple((tuple(np.shape(x)), np.dtype(x.dtype)) for x in leaves)
    return _leaf_kinds_cached(name, k, rows, (tree, specs))


def table_flags(name: str, params, k: int, rows: int):
    return leaf_kinds(name, params, k, rows)[0]


def rslice(state, flags, p):
    """Router-policy state at index p (per-tenant leaves) with the shared tables."""
    return jax.tree_util.tree_map(lambda x, f: x if f else x[p], state, flags)


def rput(state, flags, p, new, mask):
    """Write a router's policy state back at index p where `mask` (tables: the hooks'
    result, which changes only where they wrote masked rows)."""
    def put(x, n, f):
        if f:
            return n
        if n is x:
            return x
        return x.at[p].set(jnp.where(mask, n, x[p]))
    return jax.tree_util.tree_map(put, state, new, flags)



# ---- the routers ----------------------------------------------------------------------

def router_index(params: ClusterParams, j):
    """The policy-state index router j uses (0 for every router in the shared mode)."""
    return jnp.where(params.mode == SHARED, 0, j).astype(I32)


@dataclasses.dataclass(frozen=True)
class Routers:
    """Per-event router facts, stacked over the router axis G. back: bool[G, K] each
    router's own backlog; any_back: bool[K] the cluster-wide backlog; p: int32[G] the
    policy-state index of each router; backlogged, heads, head_index, waiting: what each
    router's policy sees (its own queues, or the cluster-wide backlog: a tenant it does not
    hold shows the head at the lowest router holding it, and waiting counts every router)."""

    back: jax.Array
    any_back: jax.Array
    p: jax.Array
    backlogged: jax.Array
    heads: jax.Array
    head_index: jax.Array
    waiting: jax.Array


def router_arrays(state: ClusterState, heads, head_index, params: ClusterParams, cfg: ClusterConfig) -> Routers:
    g, k = cfg.routers, cfg.num_clients
    waiting = cluster_shed.waiting(state.rhead, state.rarrived, state.fleet)
    back = waiting > 0
    any_back = back.any(axis=0)
    vb, vh, vi, vw = back, heads, head_index, waiting
    if cfg.union:
        union = params.mode != PER_ROUTER
        owner = jnp.argmax(back, axis=0)
        owner_heads = heads[owner, jnp.arange(k)]
        owner_index = head_index[owner, jnp.arange(k)]
        vh = jnp.where(union, jnp.where(back[:, :, None], heads, owner_heads[None]), heads)
        vi = jnp.where(union, jnp.where(back, head_index, owner_index[None]), head_index)
        vb = jnp.where(union, jnp.broadcast_to(any_back, back.shape), back)
        vw = jnp.where(union, jnp.broadcast_to(waiting.sum(axis=0), waiting.shape), waiting)
    return Routers(back=back, any_back=any_back, p=router_index(params, jnp.arange(g)), backlogged=vb, heads=vh,
                    head_index=vi, waiting=vw)


def router_view(step, backlogged, heads, head_index, waiting, counter, last_left, costs) -> View:
    zeros = jnp.zeros(backlogged.shape[0], I32)
    return View(num=WIDE, step=step, backlogged=backlogged, heads=heads, head_index=head_index, waiting=waiting,
                counter=counter, running=zeros, context=zeros, last_left=last_left, costs=costs,
                estimates=heads[:, EST])


def gathered(rpolicy: dict, flags: dict, p) -> dict:
    """Every policy's state with its per-tenant leaves gathered at p (int32[G]): [G, ...];
    tables as they are."""
    return {n: jax.tree_util.tree_map(lambda x, f: x if f else x[p], rpolicy[n], flags[n]) for n in rpolicy}


def router_axes(flags: dict) -> dict:
    """vmap in_axes over routers: tables unbatched."""
    return {n: jax.tree_util.tree_map(lambda f: None if f else 0, flags[n]) for n in flags}


def strip_tables(states: dict, flags: dict) -> dict:
    """Inside a function vmapped over routers: tables replaced by a dummy (never batched)."""
    return {n: jax.tree_util.tree_map(lambda x, f: jnp.zeros((), I32) if f else x, states[n], flags[n])
            for n in states}


def _restore(states: dict, flags: dict, rpolicy: dict) -> dict:
    return {n: jax.tree_util.tree_map(lambda x, f, orig: orig if f else x, states[n], flags[n], rpolicy[n])
            for n in states}


@dataclasses.dataclass(frozen=True)
class Offer:
    router: jax.Array  # int32[] the router that dispatches
    client: jax.Array  # int32[] its tenant
    has: jax.Array  # bool[] some router offers a request
    states: dict  # {policy: the dispatching router's choice state}


def router_offer(state: ClusterState, routers: Routers, params: ClusterParams, cfg: ClusterConfig,
                  flags: dict) -> Offer:
    """The next dispatch of the round: each router's candidate (its policy's pick among its
    own backlogged tenants; with holdback in a shared mode, the pick over the cluster-wide
    backlog if this router holds it, else nothing), and the first router in round order
    from the cursor that offers one. If every router with a request would hold back, the
    first in round order dispatches its own pick. The routers' selects run vmapped."""
    g = cfg.routers
    gp = params.gateway
    names = cfg.gateway_policies
    holdback = params.holdback & (params.mode != PER_ROUTER)

    def one(st, back, vb, vh, vi, vw, counter, last):
        view = router_view(state.step, vb, vh, vi, vw, counter, last, gp.costs)
        loc = [registry.get(n).select(st[n], view, back, gp.policy[n]) for n in names]
        lc = pick(gp.policy_id, [c.client for c in loc]).astype(I32)
        lh = pick(gp.policy_id, [c.has for c in loc]) & admissible(back, lc)  # only a tenant it holds
        ls = {n: c.state for n, c in zip(names, loc)}
        if not cfg.union:
            return lc, lh, strip_tables(ls, flags), lh, lc, strip_tables(ls, flags)
        uni = [registry.get(n).select(st[n], view, routers.any_back, gp.policy[n]) for n in names]
        uc = pick(gp.policy_id, [c.client for c in uni]).astype(I32)
        uh = pick(gp.policy_id, [c.has for c in uni])
        us = {n: c.state for n, c in zip(names, uni)}
        ok = jnp.where(holdback, uh & admissible(back, uc), lh)
        return (lc, lh, strip_tables(ls, flags), ok, jnp.where(holdback, uc, lc).astype(I32),
                strip_tables(choose(holdback, us, ls), flags))

    p = routers.p
    lc, lh, ls, ok, pc, ps = jax.vmap(one, in_axes=(router_axes(flags), 0, 0, 0, 0, 0, 0, 0))(
        gathered(state.rpolicy, flags, p), routers.back, routers.backlogged, routers.heads, routers.head_index,
        routers.waiting, state.rcounter[p], state.rlast[p])
    any_pri = ok.any()
    offering = jnp.where(any_pri, ok, lh)
    distance = (jnp.arange(g, dtype=I32) - state.cursor) % g
    router = jnp.argmin(jnp.where(offering, distance, g)).astype(I32)
    client = jnp.where(any_pri, pc[router], lc[router]).astype(I32)
    chosen = jax.tree_util.tree_map(lambda a, b: jnp.where(any_pri, a[router], b[router]), ps, ls)
    return Offer(router=router, client=client, has=offering.any(), states=_restore(chosen, flags, state.rpolicy))


def choose_replica(state: ClusterState, params: ClusterParams, cfg: ClusterConfig, room, load, queued, router,
                    client):
    """The replica a dispatch goes to (among those with room; see docs/CLUSTER.md)."""
    r, n_r = cfg.replicas, params.replicas
    ar = jnp.arange(r, dtype=I32)
    rr = jnp.argmin(jnp.where(room, (ar - state.rr[router]) % n_r, r)).astype(I32)
    least_kv = jnp.argmin(jnp.where(room, load, INT32_MAX)).astype(I32)
    least_queued = jnp.argmin(jnp.where(room, queued, INT32_MAX)).astype(I32)
    n = room.sum(dtype=I32)
    rank = jnp.cumsum(room.astype(I32)) - 1
    h1 = estimators.mix32(estimators.mix32(params.seed ^ U32(P2C_SALT)) + state.dseq.astype(U32))
    h2 = estimators.mix32(h1)
    a = (h1 % jnp.maximum(n, 1).astype(U32)).astype(I32)
    b = jnp.where(n >= 2, (a + 1 + (h2 % jnp.maximum(n - 1, 1).astype(U32)).astype(I32)) % jnp.maximum(n, 1), a)
    ra = jnp.argmax(room & (rank == a)).astype(I32)
    rb = jnp.argmax(room & (rank == b)).astype(I32)
    p2c = jnp.where((load[rb] < load[ra]) | ((load[rb] == load[ra]) & (rb < ra)), rb, ra)
    home = (estimators.mix32(estimators.mix32(params.seed ^ U32(AFFINITY_SALT)) ^ client.astype(U32))
            % n_r.astype(U32)).astype(I32)
    affinity = jnp.argmin(jnp.where(room, (ar - home) % n_r, r)).astype(I32)
    return jnp.select([params.choice == ROUND_ROBIN, params.choice == LEAST_KV, params.choice == LEAST_QUEUED,
                       params.choice == P2C], [rr, least_kv, least_queued, p2c], affinity).astype(I32)


