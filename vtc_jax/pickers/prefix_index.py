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


def _put(x, r, at, values, on):
    """x with x[r, at[i]] = values[i] where on[i] (or x[r] = values[0] for a 1-d x): one
    scatter per array and event, the masked entries dropped (an index past the end), never
    a select over x. The active positions are distinct (`touch` shows why)."""
    rows = jnp.where(jnp.stack(on), r, x.shape[0])
    if x.ndim == 1:
        return x.at[rows].set(jnp.stack(values).astype(x.dtype), mode="drop")
    return x.at[rows, jnp.maximum(jnp.stack(at), 0)].set(jnp.stack(values).astype(x.dtype), mode="drop")


def touch(index: Index, r, block, capacity, on) -> Index:
    """Where `on`: block id `block` becomes the most recent of replica r's set (capacity:
    int32[], r's slots in use at most). Held: it moves to the tail. New: it takes a fresh
    slot, or the head's (the least recent, evicted) when the set is full; capacity 0 holds
    nothing.

    Every value is read from the index as it was, and each array then gets one scatter of
    its final entries (a read after a write of the same array would make XLA copy the whole
    array, once per block). The three cases, s the slot linked at the tail:
      move (held, not the tail): s = the held slot; sp, sn its neighbours (sn exists);
        next[sp] = sn (or head = sn), prev[sn] = sp; t = the tail;
      new, a free slot: s = count; t = the tail;
      evict (new, full): s = head, hn its next; the head's id leaves `where`; head = hn
        (prev[hn] = -1), or the set empties (t = -1);
    then prev[s] = t, next[s] = -1, next[t] = s (or head = s), tail = s. The positions
    written to one array are distinct: sp, s, t differ (s is next[sp]; t is the tail, s
    not), sn != s, hn != s."""
    c, u = index.key.shape[1], index.where.shape[1]
    on = on & (block >= 0) & (block < u)
    b = jnp.clip(block, 0, u - 1)
    s0 = index.where[r, b]
    found = s0 >= 0
    head0, tail0, count0 = index.head[r], index.tail[r], index.count[r]
    move = on & found & (s0 != tail0)
    new = on & ~found & (capacity > 0)
    full = count0 >= capacity
    evict = new & full
    link = move | new

    h = jnp.maximum(head0, 0)
    hn = index.next[r, h]
    old = index.key[r, h]
    sp, sn = index.prev[r, jnp.maximum(s0, 0)], index.next[r, jnp.maximum(s0, 0)]
    s = jnp.where(found, s0, jnp.where(full, h, jnp.minimum(count0, c - 1)))
    t = jnp.where(evict & (hn < 0), -1, tail0)
    head = jnp.where(move, jnp.where(sp < 0, sn, head0),
                     jnp.where(t < 0, s, jnp.where(evict, hn, head0)))
    return Index(
        where=_put(index.where, r, (old, b), (-1, s), (evict, new)),
        # `old > -2` always holds; it orders the read of key before the write (else XLA copies key)
        key=_put(index.key, r, (s,), (b,), (new & (old > -2),)),
        prev=_put(index.prev, r, (jnp.where(move, sn, hn), s), (jnp.where(move, sp, -1), t),
                  (move | (evict & (hn >= 0)), link)),
        next=_put(index.next, r, (sp, s, t), (sn, -1, s), (move & (sp >= 0), link, link & (t >= 0))),
        head=_put(index.head, r, (), (head,), (link,)),
        tail=_put(index.tail, r, (), (s,), (link,)),
        count=_put(index.count, r, (), (count0 + 1,), (new & ~full,)),
    )


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
