"""The prefix-caching block pool (servers/vllm_blocks.py) by hand: its LRU ring keeps the
least recently freed order through hits (stale entries) and compactions, and a lookup
returns the first cached copy of a content. The whole server against the literal
reference is tests/test_vllm_prefix.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.servers import vllm_blocks as vb

NUM_BLOCKS = 4  # block 0 is the null block: 3 to hand out
IDS = jnp.asarray([0, 1, 2, 3], jnp.int32)  # request A's contents are 0, 1; B's are 2, 3
A, B = (0, 2), (2, 2)  # (offset, full blocks) in IDS; block size 1 token


@jax.jit
def _admit(pool, slot, off, nids, tokens):
    hits, evictable = vb.lookup(pool, tokens, IDS, off, nids, 1)
    pool = vb.touch(pool, slot, hits, IDS, off)
    pool = vb.take(pool, slot, tokens - 1 - hits, NUM_BLOCKS)
    return vb.hash_blocks(pool, slot, tokens - 1, IDS, off, nids, 1), hits, evictable


@jax.jit
def _release(pool, slot):
    return vb.release(pool, slot, jnp.bool_(True))


@jax.jit
def _lookup(pool, off, nids, tokens):
    return vb.lookup(pool, tokens, IDS, off, nids, 1)


def test_hits_on_free_blocks_go_stale_and_the_ring_compacts_in_order():
    """A holds contents 0, 1 and is freed (the LRU: 1 then 0, last block first); 40 times
    it comes back, hits both (their entries go stale) and is freed again: 80 entries
    through a ring of 16, so it compacts. Then B needs 2 new blocks: the never-used block 3
    and the least recently freed cached one, content 1's; content 0 stays cached."""
    pool = vb.pool_init(NUM_BLOCKS, 2, 2, 4)
    assert pool.ring.shape == (16,)
    pool, hits, _ = _admit(pool, 0, *A, 3)
    assert int(hits) == 0 and int(vb.num_free(pool, NUM_BLOCKS)) == 1
    pool = _release(pool, 0)
    for _ in range(40):
        pool, hits, evictable = _admit(pool, 0, *A, 3)
        assert (int(hits), int(evictable), int(pool.nlru)) == (2, 2, 0)
        pool = _release(pool, 0)
        assert int(pool.nlru) == 2 and int(pool.rtail - pool.rhead) <= 16
    assert int(pool.rtail) > 16  # the stamps went past one ring: it was compacted
    pool, hits, _ = _admit(pool, 1, *B, 3)
    assert int(hits) == 0 and int(vb.num_free(pool, NUM_BLOCKS)) == 1 and int(pool.nlru) == 1
    hits, evictable = _lookup(pool, *A, 3)
    assert (int(hits), int(evictable)) == (1, 1)  # A's first block is still cached (and free), its second not
    cached = np.asarray(pool.head).tolist()
    assert cached[0] >= 1 and cached[1] == -1 and cached[2] >= 1 and cached[3] >= 1


def test_a_lookup_returns_the_first_copy_and_the_next_after_it_is_evicted():
    """Two copies of content 0 (A holds one; C, whose lookup stops at tokens - 1, makes its
    own): the first stays the one a hit returns; when it is evicted the second is."""
    ids = jnp.asarray([0, 0], jnp.int32)

    @jax.jit
    def admit(pool, slot):
        pool = vb.take(pool, slot, 1, 3)
        return vb.hash_blocks(pool, slot, 1, ids, slot, 1, 1)

    pool = vb.pool_init(3, 2, 1, 1)
    pool = admit(pool, 0)
    first = int(pool.head[0])
    pool = admit(pool, 1)
    assert int(pool.head[0]) == first and int(pool.tail[0]) != first
    pool = jax.jit(lambda p: vb.release(p, 0, jnp.bool_(True)))(pool)
    pool = jax.jit(lambda p: vb.take(p, 0, 1, 3))(pool)  # the only free block: the first copy, evicted
    assert int(pool.head[0]) == int(pool.tail[0]) != first and int(pool.nlru) == 0


def test_a_batched_take_and_hash_are_the_calls_one_by_one():
    """take_many then hash_many over a step's requests (in walk order) leave the pool as
    take then hash_blocks for each request in turn: random pools of 40 blocks whose LRU
    holds copies of shared contents (evictions of two copies of one content, requests
    hashing one content in one step), 30 draws."""
    blocks, slots, width = 40, 4, 12
    ids = jnp.arange(64, dtype=jnp.int32) % 16  # a request's 12 at most distinct, shared with the others'

    def one_by_one(pool, order, counts, upto, offs, nids):
        for i in range(slots):
            pool = vb.take(pool, order[i], counts[i], blocks)
            pool = vb.hash_blocks(pool, order[i], upto[i], ids, offs[i], nids[i], 2)
        return pool

    def batched(pool, order, counts, upto, offs, nids):
        pool = vb.take_many(pool, order, counts, blocks)
        return vb.hash_many(pool, order, upto, ids, offs, nids, 2)

    one_by_one, batched = jax.jit(one_by_one), jax.jit(batched)
    rng = np.random.default_rng(8)
    compared = 0
    for _ in range(30):
        pool = vb.pool_init(blocks, slots, width, 16)
        offs = jnp.asarray(rng.integers(0, 48, slots), jnp.int32)
        nids = jnp.asarray(rng.integers(4, width + 1, slots), jnp.int32)
        for _ in range(3):  # fill and free: cached copies in the LRU, freed blocks without a hash
            held = np.asarray(pool.held)
            counts = jnp.asarray(np.minimum(rng.integers(0, 5, slots), width - held), jnp.int32)
            if int(counts.sum()) > int(vb.num_free(pool, blocks)):
                break
            pool = one_by_one(pool, jnp.arange(slots, dtype=jnp.int32), counts, 2 * (pool.held + counts), offs, nids)
            for s in rng.permutation(slots)[: rng.integers(0, 3)]:
                pool = _release_any(pool, int(s))
        held = np.asarray(pool.held)
        counts = np.minimum(rng.integers(0, 7, slots), width - held)
        if counts.sum() > int(vb.num_free(pool, blocks)):
            continue
        order = jnp.asarray(rng.permutation(slots), jnp.int32)
        counts = jnp.asarray(counts, jnp.int32)[order]
        upto = (2 * (pool.held[order] + counts) - jnp.asarray(rng.integers(0, 2, slots), jnp.int32)).clip(0)
        args = (order, counts, upto, offs[order], nids[order])
        want, got = one_by_one(pool, *args), batched(pool, *args)
        for name, a, b in zip(vb.Pool.__dataclass_fields__, jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
            assert np.array_equal(a, b), name
        compared += 1
    assert compared >= 20


_release_any = jax.jit(lambda pool, slot: vb.release(pool, slot, jnp.bool_(True)))
