"""llm-d's approximate prefix index: per replica an LRU set of picker block ids with a fixed
capacity (`llm-d/llm-d-router@ebab6879`, pkg/epp/framework/plugins/requestcontrol/
dataproducer/approximateprefix/indexer.go: one hashicorp LRU per pod), and its match rule.

State (`Index`), per replica r (R replicas, C slots, U dense block ids):
  where: int32[R, U]  the slot holding id u on replica r, -1 if r does not hold u;
  key:   int32[R, C]  the id a slot holds;
  prev, next: int32[R, C]  the replica's LRU list of slots (head = least recent), -1 = none;
  head, tail, count: int32[R].
Ids are dense (vtc_jax/inputs/picker_blocks.py), so `where` is a direct table: a lookup is
one gather and an add or eviction a few scatters, whatever the capacity (67,660 blocks at
the fleet's preset); memory is O(R (U + C)), the order of a replica's own content table
(servers/vllm_blocks.py). An id outside [0, U) is never held and never added.

Match (llm-d's `matchLongestPrefix`, exactly): walk i = 0 .. T-1; stop at the first block
that NO replica holds; every replica holding block i gets m += 1. Not a per-replica
contiguous prefix: a replica may count block 2 after missing block 1 if another replica
held block 1.

Add (llm-d's `PreRequest` -> `indexer.Add`): the request's blocks in order 0 .. T-1 each
become the most recent of the chosen replica's set (a held block moves, a new one evicts
the least recent when the set is full), so block 0 ends least recent among them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from vtc_jax.core.lanes import batch_max

I32 = jnp.int32


class Index(NamedTuple):
    """The index of R replicas (module docstring)."""

    where: jax.Array
    key: jax.Array
    prev: jax.Array
    next: jax.Array
    head: jax.Array
    tail: jax.Array
    count: jax.Array


def empty(num_replicas: int, capacity: int, num_ids: int) -> Index:
    """An index holding nothing: R replicas of at most C = capacity slots, U = num_ids ids."""
    none = jnp.full((num_replicas, max(capacity, 1)), -1, I32)
    r_none = jnp.full(num_replicas, -1, I32)
    return Index(jnp.full((num_replicas, max(num_ids, 1)), -1, I32), none, none, none, r_none, r_none,
                 jnp.zeros(num_replicas, I32))


def holders(index: Index, block) -> jax.Array:
    """bool[R]: which replicas hold block id `block` (int32[])."""
    u = index.where.shape[1]
    valid = (block >= 0) & (block < u)
    return valid & (index.where[:, jnp.clip(block, 0, u - 1)] >= 0)


def match(index: Index, blocks: jax.Array, num_blocks) -> jax.Array:
    """int32[R]: llm-d's matched blocks m_r of a request's blocks (int32[T_MAX], the first
    num_blocks real). The walk reads the index only, so its loop carries no table."""

    def go(c):
        i, _, alive = c
        return alive & (i < num_blocks)

    def step(c):
        i, m, _ = c
        held = holders(index, blocks[jnp.minimum(i, blocks.shape[0] - 1)])
        return i + 1, m + held.astype(I32), held.any()

    r = index.head.shape[0]
    return jax.lax.while_loop(go, step, (jnp.zeros((), I32), jnp.zeros(r, I32), jnp.ones((), bool)))[1]


def _set(x, at, value, on):
    """x with x[at] = value where `on` (at: a tuple of int32[] indices); nothing otherwise
    (an index past the end is dropped: one scatter, never a select over x)."""
    first = jnp.where(on, at[0], x.shape[0])
    return x.at[(first,) + tuple(at[1:])].set(value, mode="drop")


def touch(index: Index, r, block, capacity, on) -> Index:
    """Where `on`: block id `block` becomes the most recent of replica r's set (capacity:
    int32[], r's slots in use at most). Held: it moves to the tail. New: it takes a fresh
    slot, or the head's (the least recent, evicted) when the set is full; capacity 0 holds
    nothing."""
    c, u = index.key.shape[1], index.where.shape[1]
    on = on & (block >= 0) & (block < u)
    b = jnp.clip(block, 0, u - 1)
    s0 = index.where[r, b]
    found = s0 >= 0
    tail0 = index.tail[r]
    move = on & found & (s0 != tail0)
    new = on & ~found & (capacity > 0)
    full = index.count[r] >= capacity
    evict = new & full
    where, key, prev, nxt, head, tail, count = index

    # Evict the head slot h (a new block and the set full): its id leaves; h is reused.
    h = jnp.maximum(head[r], 0)
    hn = nxt[r, h]
    where = _set(where, (r, jnp.maximum(key[r, h], 0)), -1, evict)
    head = _set(head, (r,), hn, evict)
    prev = _set(prev, (r, jnp.maximum(hn, 0)), -1, evict & (hn >= 0))
    tail = _set(tail, (r,), -1, evict & (hn < 0))

    # Unlink a held slot s0 that is not the tail (its next exists).
    sp, sn = prev[r, jnp.maximum(s0, 0)], nxt[r, jnp.maximum(s0, 0)]
    nxt = _set(nxt, (r, jnp.maximum(sp, 0)), sn, move & (sp >= 0))
    head = _set(head, (r,), sn, move & (sp < 0))
    prev = _set(prev, (r, jnp.maximum(sn, 0)), sp, move)

    # Link slot s at the tail (a moved slot or a new block's).
    s = jnp.where(found, s0, jnp.where(full, h, jnp.minimum(count[r], c - 1)))
    link = move | new
    t = tail[r]
    prev = _set(prev, (r, s), t, link)
    nxt = _set(nxt, (r, s), -1, link)
    nxt = _set(nxt, (r, jnp.maximum(t, 0)), s, link & (t >= 0))
    head = _set(head, (r,), s, link & (t < 0))
    tail = _set(tail, (r,), s, link)
    key = _set(key, (r, s), b, new)
    where = _set(where, (r, b), s, new)
    count = _set(count, (r,), count[r] + 1, new & ~full)
    return Index(where, key, prev, nxt, head, tail, count)


def add(index: Index, r, blocks: jax.Array, num_blocks, capacity) -> Index:
    """The request's blocks (int32[T_MAX], the first num_blocks real) added to replica r's
    set in order 0 .. T-1 (`touch` each). r < 0 adds nothing. The loop's bound is the
    batch's largest T (core/lanes.py: a bound that differed between lanes would select the
    whole index after every pass); passes past a lane's own T change nothing."""
    rr = jnp.maximum(r, 0)

    def step(i, ix):
        return touch(ix, rr, blocks[jnp.minimum(i, blocks.shape[0] - 1)], capacity, (r >= 0) & (i < num_blocks))

    bound = jnp.minimum(batch_max(jnp.asarray(num_blocks, I32)), blocks.shape[0])
    return jax.lax.fori_loop(0, bound, step, index)


def contents(index: Index, r: int) -> list[int]:
    """Host, for tests: replica r's ids from least to most recent (walks the list)."""
    out, s = [], int(index.head[r])
    while s >= 0:
        out.append(int(index.key[r, s]))
        s = int(index.next[r, s])
    return out
