"""vLLM's block pool with prefix caching (one full-attention group), for one lane of the
`vllm_prefix` server (servers/vllm_prefix.py); the rules are docs/VLLM.md's and the
literal reference's (`vtc_jax/testing/vllm_reference.py`, `_BlockPool`).

Physical blocks 0..P-1 (P static); block 0 (vLLM's null block) and the blocks at or past
the lane's `num_blocks` are never handed out. Per block, int32[P]: `ref` holders; `owner`
its hash (-1 none): 2 g for block `pos` of shared-prefix group g, 2 o + 1 for block `pos`
of the request whose ORDER is o (its own tokens); `pos` the block's position in its
holders' tables; `cached_at` when it was hashed (a lookup returns the copy hashed first:
hashes are not de-duplicated); `freed_at` when it was last freed (hashed free blocks are
reused least recently freed first, after every free block without a hash). One clock
stamps both. Per running slot: `table` int32[S, W] its blocks by position, `held` and
`hashed` int32[S] (blocks it holds; leading blocks of them that carry its hash).

Every function is pure and O(P + W) (a take sorts the P free-queue keys), masked by a
count or a dropped scatter index, so that a masked-off call changes nothing.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

I32 = jnp.int32
INT_MAX = 2**31 - 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Pool:
    ref: jax.Array
    owner: jax.Array
    pos: jax.Array
    cached_at: jax.Array
    freed_at: jax.Array
    clock: jax.Array
    table: jax.Array
    held: jax.Array
    hashed: jax.Array


def pool_init(blocks: int, slots: int, width: int) -> Pool:
    """An empty pool of `blocks` physical blocks for `slots` requests of `width` blocks."""
    zeros = jnp.zeros(blocks, I32)
    return Pool(ref=zeros, owner=jnp.full(blocks, -1, I32), pos=zeros, cached_at=zeros, freed_at=zeros,
                clock=jnp.zeros((), I32), table=jnp.zeros((slots, width), I32), held=jnp.zeros(slots, I32),
                hashed=jnp.zeros(slots, I32))


def _usable(pool: Pool, num_blocks):
    ids = jnp.arange(pool.ref.shape[0], dtype=I32)
    return (ids >= 1) & (ids < num_blocks)


def num_free(pool: Pool, num_blocks):
    """int32[]: blocks in the free queue (hashed or not)."""
    return (_usable(pool, num_blocks) & (pool.ref == 0)).sum(dtype=I32)


def block_owner(j, group, prefix_len, order, block_size):
    """The hash owner of block position(s) j of a request: its prefix group's (2 g) when
    the block lies wholly inside the shared prefix, else the request's own (2 order + 1)."""
    shared = (group >= 0) & (block_size * (j + 1) <= prefix_len)
    return jnp.where(shared, 2 * group, 2 * order + 1).astype(I32)


def take(pool: Pool, slot, count, num_blocks) -> Pool:
    """`count` new blocks for `slot`, at its table positions [held, held + count): free
    blocks without a hash first, then hashed ones least recently freed first (their hash
    is evicted). The caller checked they are free; count 0 changes nothing."""
    p, w = pool.ref.shape[0], pool.table.shape[1]
    ids = jnp.arange(p, dtype=I32)
    free = _usable(pool, num_blocks) & (pool.ref == 0)
    queue = jnp.where(free, jnp.where(pool.owner < 0, ids - p, pool.freed_at), INT_MAX)
    order = jnp.argsort(queue).astype(I32)  # the free queue's order; distinct keys
    k = jnp.arange(p, dtype=I32)
    taken = jnp.where(k < count, order, p)  # the first `count` of the queue
    start = pool.held[slot]
    cols = jnp.arange(w, dtype=I32)
    fill = (cols >= start) & (cols < start + count)
    row = jnp.where(fill, order[jnp.clip(cols - start, 0, p - 1)], pool.table[slot])
    return dataclasses.replace(pool, ref=pool.ref.at[taken].set(1, mode="drop"),
                               owner=pool.owner.at[taken].set(-1, mode="drop"),
                               table=pool.table.at[slot].set(row, mode="drop"), held=pool.held.at[slot].add(count, mode="drop"))


def hash_blocks(pool: Pool, slot, upto, group, prefix_len, order, block_size) -> Pool:
    """Hash the blocks of `slot` that are full with `upto` tokens and carry no hash yet,
    in position order (when they are allocated, so a later admission in the same step
    can hit them)."""
    w = pool.table.shape[1]
    j = jnp.arange(w, dtype=I32)
    lo, hi = pool.hashed[slot], jnp.maximum(upto // block_size, pool.hashed[slot])
    mine = (j >= lo) & (j < hi)
    dest = jnp.where(mine, pool.table[slot], pool.ref.shape[0])
    return dataclasses.replace(
        pool, owner=pool.owner.at[dest].set(block_owner(j, group, prefix_len, order, block_size), mode="drop"),
        pos=pool.pos.at[dest].set(j, mode="drop"), cached_at=pool.cached_at.at[dest].set(pool.clock + j - lo, mode="drop"),
        clock=pool.clock + (hi - lo), hashed=pool.hashed.at[slot].set(hi, mode="drop"))


def release(pool: Pool, slot, on) -> Pool:
    """Where `on`: `slot` drops its hold on every block, last block first (a hashed block
    that becomes free joins the back of the queue in that order; its hash is kept)."""
    w = pool.table.shape[1]
    j = jnp.arange(w, dtype=I32)
    held = jnp.where(on, pool.held[slot], 0)
    blocks = pool.table[slot]
    mine = j < held
    dest = jnp.where(mine, blocks, pool.ref.shape[0])
    freed = mine & (pool.ref[blocks] == 1)
    stamp = jnp.where(freed, pool.clock + held - 1 - j, pool.freed_at[blocks])
    return dataclasses.replace(pool, ref=pool.ref.at[dest].add(-1, mode="drop"),
                               freed_at=pool.freed_at.at[dest].set(stamp, mode="drop"), clock=pool.clock + held,
                               held=pool.held.at[slot].set(jnp.where(on, 0, pool.held[slot]), mode="drop"),
                               hashed=pool.hashed.at[slot].set(jnp.where(on, 0, pool.hashed[slot]), mode="drop"))


def lookup(pool: Pool, tokens, group, prefix_len, order, block_size):
    """The prefix hit of a request knowing `tokens` tokens: the longest run of leading
    positions whose hash is cached, whole blocks of at most tokens - 1 tokens. Returns
    (hits int32[], copy int32[W]: each position's first-hashed copy, evictable int32[]:
    hit blocks that are free now, which the admission counts as needed)."""
    p, w = pool.ref.shape[0], pool.table.shape[1]
    j = pool.pos
    want = block_owner(j, group, prefix_len, order, block_size)
    match = (pool.owner >= 0) & (pool.owner == want) & (j < (tokens - 1) // block_size)
    at = jnp.where(match, j, w)
    best = jnp.full(w, INT_MAX, I32).at[at].min(pool.cached_at, mode="drop")
    first = match & (pool.cached_at == best[jnp.clip(j, 0, w - 1)])
    copy = jnp.zeros(w, I32).at[jnp.where(first, j, w)].set(jnp.arange(p, dtype=I32), mode="drop")
    found = best < INT_MAX
    hits = jnp.argmin(jnp.concatenate([found, jnp.zeros(1, bool)])).astype(I32)
    evictable = ((jnp.arange(w) < hits) & (pool.ref[copy] == 0)).sum(dtype=I32)
    return hits, copy, evictable


def touch(pool: Pool, slot, hits, copy) -> Pool:
    """`slot` starts holding the hit blocks copy[:hits] (a free one leaves the free
    queue); its table is those, every one hashed."""
    w = pool.table.shape[1]
    j = jnp.arange(w, dtype=I32)
    mine = j < hits
    return dataclasses.replace(pool, ref=pool.ref.at[jnp.where(mine, copy, pool.ref.shape[0])].add(1, mode="drop"),
                               table=pool.table.at[slot].set(jnp.where(mine, copy, 0), mode="drop"),
                               held=pool.held.at[slot].set(hits, mode="drop"), hashed=pool.hashed.at[slot].set(hits, mode="drop"))
