"""vLLM's block pool with prefix caching (one full-attention group), for one lane of the
`vllm_prefix` server (servers/vllm_prefix.py); the rules are docs/VLLM.md's and the
literal reference's (`vtc_jax/testing/vllm_reference.py`, `_BlockPool`).

A block's hash is its CONTENT: a dense id from the trace (inputs/prefix_blocks.py: two
requests' blocks at one position have one id exactly when their tokens agree through the
block's last token). Physical blocks are handles only: which free block without a hash a
request gets is never observable, so those are a counter of never-used blocks (`fresh`)
and a stack of freed ones; what is observable is which hashes stay cached, and that is
kept exactly:

  - per block, int32[P]: `ref` holders, `key` its content (-1: no hash), `cnext`/`cprev`
    the other cached copies of its content in insertion order (hashes are not
    de-duplicated; a lookup returns the first copy), `freed_at` the stamp of its entry in
    the LRU queue (-1: not in it);
  - per content, int32[U]: `head`/`tail`, its first and last cached copy (-1: none): the
    hash-to-block map, of fixed capacity U (the trace's distinct blocks);
  - the LRU queue of free blocks with a hash: a ring of C entries (C >= 2 (P + W)), entry
    of stamp q at ring[q % C]; an entry is live while its block's freed_at is q (a hit on
    a free block only clears freed_at: the entry goes stale and is skipped when reached);
    the ring is compacted (live entries re-stamped in order) before it could overflow;
  - per running slot: `table` int32[S, W] its blocks by position, `held` and `hashed`
    int32[S] (blocks held; leading ones of them hashed). W bounds any request's blocks.

Per event the work is O(what changes): a take or a hash is O(1) per block (a loop over
the blocks, TAKE_CHUNK a pass, a step's running requests together), a release and a hit
are O(the request's blocks), SPAN positions a pass, not the table's width W (a trace whose
longest request holds 7,797 blocks made W-wide ones most of an event), a lookup is
vectorized over all W positions (`lookup` says why), a compaction is O(C) once per P + W
appends.
Masked-off calls change nothing (counts of 0, dropped scatter indices, `_when`).

In place: XLA:CPU copies a pool-sized array that a scatter updates while a gather of it
is not ordered before the scatter by data (twice a pass of a loop). So a scatter into an
array the same pass reads takes its values from that read (a holder count set to the
count read plus or minus one, not added; a dropped hash set to min(key read, -1)), and no
`cond` carries the pool (its branches copy it in and out).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vtc_jax.core.lanes import batch_any

I32 = jnp.int32
TAKE_CHUNK = 64  # blocks a take or a hash handles per pass
LRU_WINDOW = 2 * TAKE_CHUNK  # ring entries a take's pass looks at (stale ones among them are skipped)
SPAN = 128  # block positions a hit or a release handles per pass


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Pool:
    ref: jax.Array
    key: jax.Array
    cnext: jax.Array
    cprev: jax.Array
    head: jax.Array
    tail: jax.Array
    freed_at: jax.Array
    ring: jax.Array
    rhead: jax.Array
    rtail: jax.Array
    nlru: jax.Array
    fresh: jax.Array
    stack: jax.Array
    nstack: jax.Array
    table: jax.Array
    held: jax.Array
    hashed: jax.Array


def ring_size(blocks: int, width: int) -> int:
    """C: a power of two >= 2 (P + W), so a compacted ring (at most P - 1 live entries)
    takes a whole request's release (at most W entries) P + W times before the next."""
    return 1 << (2 * (blocks + width) - 1).bit_length()


def pool_init(blocks: int, slots: int, width: int, contents: int) -> Pool:
    """An empty pool of `blocks` physical blocks (block 0 is the null block, never handed
    out), `slots` running requests of at most `width` blocks, `contents` distinct hashes."""
    p_none, u_none = jnp.full(blocks, -1, I32), jnp.full(max(contents, 1), -1, I32)
    zero = jnp.zeros((), I32)
    return Pool(ref=jnp.zeros(blocks, I32), key=p_none, cnext=p_none, cprev=p_none, head=u_none, tail=u_none,
                freed_at=p_none, ring=jnp.zeros(ring_size(blocks, width), I32), rhead=zero, rtail=zero, nlru=zero,
                fresh=jnp.ones((), I32), stack=jnp.zeros(blocks, I32), nstack=zero,
                table=jnp.zeros((slots, width), I32), held=jnp.zeros(slots, I32), hashed=jnp.zeros(slots, I32))


def _when(pred, fn, x):
    """fn(x, pred): a masked pass (fn changes nothing where pred is false) that runs only
    when some lane of the batch needs it (a `cond` would run in every lane; a loop whose
    condition differs between lanes would select the whole pool: core/lanes.py)."""
    return jax.lax.while_loop(lambda c: c[0], lambda c: (jnp.zeros((), bool), fn(c[1], pred)), (batch_any(pred), x))[1]


def num_free(pool: Pool, num_blocks):
    """int32[]: blocks free to take: never used, freed without a hash, cached in the LRU."""
    return num_blocks - pool.fresh + pool.nstack + pool.nlru


def _unlink(pool: Pool, b, on) -> Pool:
    """Where `on`: block b's hash is dropped (b leaves its content's list of copies)."""
    big, u = pool.ref.shape[0], pool.head.shape[0]
    k, p, n = pool.key[b], pool.cprev[b], pool.cnext[b]
    mine = jnp.where(on, b, big)
    return dataclasses.replace(
        pool, head=pool.head.at[jnp.where(on & (p < 0), k, u)].set(n, mode="drop"),
        tail=pool.tail.at[jnp.where(on & (n < 0), k, u)].set(p, mode="drop"),
        cnext=pool.cnext.at[jnp.where(on & (p >= 0), p, big)].set(n, mode="drop").at[mine].set(-1, mode="drop"),
        cprev=pool.cprev.at[jnp.where(on & (n >= 0), n, big)].set(p, mode="drop").at[mine].set(-1, mode="drop"),
        key=pool.key.at[mine].set(jnp.minimum(k, -1), mode="drop"),  # -1, read from key: in place (module doc)
        freed_at=pool.freed_at.at[mine].set(-1, mode="drop"))


def _link(pool: Pool, b, k, on) -> Pool:
    """Where `on`: block b gets hash k, as k's last cached copy."""
    big, u = pool.ref.shape[0], pool.head.shape[0]
    k = jnp.where(on, k, u)
    t = pool.tail[jnp.minimum(k, u - 1)]
    t = jnp.where(on, t, -1)
    mine = jnp.where(on, b, big)
    return dataclasses.replace(
        pool, head=pool.head.at[jnp.where(t < 0, k, u)].set(b, mode="drop"),
        tail=pool.tail.at[jnp.where(t < -1, u, k)].set(b, mode="drop"),  # at k, an index read from tail: in place
        cnext=pool.cnext.at[jnp.where(t >= 0, t, big)].set(b, mode="drop").at[mine].set(-1, mode="drop"),
        cprev=pool.cprev.at[mine].set(t, mode="drop"), key=pool.key.at[mine].set(k, mode="drop"))


def _first_repeat(key, on):
    """int32[]: the first position whose key an earlier position (both `on`) also has
    (the length when none): where a batch of copy-list updates must stop, since two
    updates of one content's list at once would race."""
    n = key.shape[0]
    i = jnp.arange(n, dtype=I32)
    same = (key[:, None] == key[None, :]) & on[:, None] & on[None, :] & (i[None, :] < i[:, None])
    return jnp.argmax(jnp.concatenate([same.any(axis=1), jnp.ones(1, bool)])).astype(I32)


def _pop_pass(pool: Pool, count, num_blocks):
    """(pool, blocks int32[TAKE_CHUNK], taken int32[]): up to TAKE_CHUNK of the `count`
    blocks of a take (each gets a holder), in the order one at a time would pop them:
    freed blocks without a hash (a stack), never-used ones, then the live entries of the
    LRU ring from its head (stale ones skipped; those hashes evicted); blocks[:taken] are
    they. A pass stops early at the ring's window's end or where two evicted blocks carry
    one content (`_first_repeat`); the caller loops. No table is written."""
    big = pool.ref.shape[0]
    c = pool.ring.shape[0]
    r = jnp.arange(TAKE_CHUNK, dtype=I32)
    want = jnp.minimum(count, TAKE_CHUNK)
    n_stack = jnp.minimum(want, pool.nstack)
    n_fresh = jnp.minimum(want - n_stack, jnp.maximum(num_blocks - pool.fresh, 0))
    m = want - n_stack - n_fresh  # from the LRU
    q = pool.rhead + jnp.arange(LRU_WINDOW, dtype=I32)
    entry = pool.ring[q % c]
    live = (q < pool.rtail) & (pool.freed_at[entry] == q)
    rank = jnp.cumsum(live, dtype=I32) - live
    pick = live & (rank < m)  # the first m live entries of the window
    order = jnp.argsort(~pick, stable=True).astype(I32)[:TAKE_CHUNK]  # their window positions, in order
    lru_on = r < pick.sum(dtype=I32)
    lru = entry[order]
    stop = _first_repeat(pool.key[lru], lru_on)
    lru_on = lru_on & (r < stop)
    n_lru = lru_on.sum(dtype=I32)
    last = jnp.where(n_lru > 0, order[jnp.maximum(n_lru - 1, 0)] + 1,
                     jnp.where(m > 0, LRU_WINDOW, 0))  # past the last entry taken (or the whole window)
    pool = _unlink(pool, jnp.where(lru_on, lru, 0), lru_on)
    j = r - n_stack - n_fresh
    blocks = jnp.where(r < n_stack, pool.stack[jnp.maximum(pool.nstack - 1 - r, 0)],
                       jnp.where(r < n_stack + n_fresh, pool.fresh + r - n_stack, lru[jnp.clip(j, 0, TAKE_CHUNK - 1)]))
    taken = n_stack + n_fresh + n_lru
    on = r < taken
    return dataclasses.replace(
        pool, ref=pool.ref.at[jnp.where(on, blocks, big)].set(1, mode="drop"),
        nstack=pool.nstack - n_stack, fresh=pool.fresh + n_fresh, nlru=pool.nlru - n_lru,
        rhead=jnp.where(m > 0, pool.rhead + last, pool.rhead)), blocks, taken


def _take_pass(pool: Pool, slot, count, num_blocks):
    """(pool, taken int32[]): a `_pop_pass` of `slot`'s take, its blocks written at the
    slot's table positions from `held` on."""
    s = pool.held.shape[0]
    pool, blocks, taken = _pop_pass(pool, count, num_blocks)
    r = jnp.arange(TAKE_CHUNK, dtype=I32)
    row = jnp.clip(slot, 0, s - 1)
    at = jnp.where(r < taken, pool.held[row] + r, pool.table.shape[1])
    return dataclasses.replace(pool, table=pool.table.at[row, at].set(blocks, mode="drop"),
                               held=pool.held.at[row].add(taken)), taken


def _owner(ends, g):
    """int32[G]: for flattened positions g int32[G] of a concatenation whose parts end at
    `ends` int32[N] (inclusive prefix sums of the parts' sizes), the part holding each
    (N past the end)."""
    return jnp.searchsorted(ends, g, side="right", method="scan_unrolled").astype(I32)  # log2(N) gathers of G


def take_many(pool: Pool, slots, counts, num_blocks) -> Pool:
    """`counts[i]` new blocks for slot `slots[i]` (int32[N] each; distinct slots), at its
    table positions [held, held + count), the takes one after another in entry order:
    exactly `take` called for each entry in turn, since one take of their sum pops the
    same sequence of blocks (a take changes nothing but the pops) and entry i gets its
    slice [before_i, before_i + counts_i) of it. Passes of `_pop_pass` over the sum, so
    a step's running requests cost a pass per TAKE_CHUNK blocks, not one per request."""
    s, w = pool.held.shape[0], pool.table.shape[1]
    counts = jnp.maximum(counts, 0)
    ends = jnp.cumsum(counts, dtype=I32)
    total = ends[-1]
    n = counts.shape[0]
    start = pool.held[jnp.clip(slots, 0, s - 1)]  # each slot's first new position
    r = jnp.arange(TAKE_CHUNK, dtype=I32)

    def one(carry):
        done, pool = carry
        pool, blocks, taken = _pop_pass(pool, total - done, num_blocks)
        g = done + r
        i = jnp.minimum(_owner(ends, g), n - 1)
        on = r < taken
        row = jnp.where(on, slots[i], s)
        at = jnp.where(on, start[i] + g - (ends[i] - counts[i]), w)
        return done + taken, dataclasses.replace(pool, table=pool.table.at[row, at].set(blocks, mode="drop"))

    pool = jax.lax.while_loop(lambda c: batch_any(c[0] < total), one, (jnp.zeros((), I32), pool))[1]
    return dataclasses.replace(pool, held=pool.held.at[jnp.where(counts > 0, slots, s)].add(counts, mode="drop"))


def take(pool: Pool, slot, count, num_blocks) -> Pool:
    """`count` new blocks for `slot`, at its table positions [held, held + count) (the
    caller checked they are free; count 0 changes nothing): passes of `_take_pass`."""

    def one(carry):
        left, pool = carry
        pool, taken = _take_pass(pool, slot, left, num_blocks)
        return left - taken, pool

    return jax.lax.while_loop(lambda c: batch_any(c[0] > 0), one, (jnp.maximum(count, 0), pool))[1]


def _content(ids, off, j):
    return ids[jnp.clip(off + j, 0, ids.shape[0] - 1)]


def hash_blocks(pool: Pool, slot, upto, ids, off, nids, block_size) -> Pool:
    """Hash the blocks of `slot` full with `upto` tokens that carry no hash yet, in
    position order (when allocated, so that a later admission in the same step can hit
    them): block j's hash is the content ids[off + j] (j < nids: the request's full
    blocks in the trace; a request past the table is never hashed). A request's blocks
    are distinct contents, so TAKE_CHUNK of them are linked at once."""
    s = pool.held.shape[0]
    row = jnp.clip(slot, 0, s - 1)
    lo = pool.hashed[row]
    count = jnp.maximum(jnp.minimum(upto // block_size, nids) - lo, 0)
    r = jnp.arange(TAKE_CHUNK, dtype=I32)

    def one(carry):
        t, pool = carry
        j = lo + t + r
        on = t + r < count
        return t + TAKE_CHUNK, _link(pool, pool.table[row, jnp.minimum(j, pool.table.shape[1] - 1)],
                                     _content(ids, off, j), on)

    pool = jax.lax.while_loop(lambda c: batch_any(c[0] < count), one, (jnp.zeros((), I32), pool))[1]
    return dataclasses.replace(pool, hashed=pool.hashed.at[jnp.where(count > 0, slot, s)].set(lo + count, mode="drop"))


def hash_many(pool: Pool, slots, upto, ids, offs, nids, block_size) -> Pool:
    """`hash_blocks` for each entry i in turn (int32[N] each: slot, upto, off, nids;
    distinct slots): the blocks to hash, concatenated in entry order, are linked
    TAKE_CHUNK a pass, a pass stopping where two carry one content (two requests may
    hash one content in a step, and its copies stay in hashing order: `_first_repeat`);
    the links commute with nothing else, so the pool ends as the calls one by one leave
    it."""
    s, w = pool.held.shape[0], pool.table.shape[1]
    rows = jnp.clip(slots, 0, s - 1)
    lo = pool.hashed[rows]
    count = jnp.maximum(jnp.minimum(upto // block_size, nids) - lo, 0)
    ends = jnp.cumsum(count, dtype=I32)
    total = ends[-1]
    n = count.shape[0]
    r = jnp.arange(TAKE_CHUNK, dtype=I32)

    def one(carry):
        done, pool = carry
        g = done + r
        i = jnp.minimum(_owner(ends, g), n - 1)
        on = g < total
        j = lo[i] + g - (ends[i] - count[i])
        k = _content(ids, offs[i], j)
        on = on & (r < _first_repeat(k, on))
        b = pool.table[rows[i], jnp.clip(j, 0, w - 1)]
        return done + on.sum(dtype=I32), _link(pool, b, k, on)

    pool = jax.lax.while_loop(lambda c: batch_any(c[0] < total), one, (jnp.zeros((), I32), pool))[1]
    return dataclasses.replace(pool, hashed=pool.hashed.at[jnp.where(count > 0, slots, s)].set(lo + count, mode="drop"))


def _compact(pool: Pool, on) -> Pool:
    """Where `on`: the ring's live entries, in order, re-stamped from rtail on (O(C))."""
    c, big = pool.ring.shape[0], pool.ref.shape[0]
    q = pool.rhead + jnp.arange(c, dtype=I32)
    b = pool.ring[q % c]
    live = on & (q < pool.rtail) & (pool.freed_at[b] == q)
    stamp = pool.rtail + jnp.cumsum(live, dtype=I32) - live
    return dataclasses.replace(
        pool, ring=pool.ring.at[jnp.where(live, stamp % c, c)].set(b, mode="drop"),
        freed_at=pool.freed_at.at[jnp.where(live, b, big)].set(stamp, mode="drop"),
        rhead=jnp.where(on, pool.rtail, pool.rhead), rtail=pool.rtail + live.sum(dtype=I32))


def _release_span(pool: Pool, row, held, start, on) -> Pool:
    """Where `on`: the blocks of slot `row` at positions [start, start + SPAN) below
    `held` drop a holder; those that become free join the LRU's back, last block first
    (the span's blocks after this one stamped before it), or the stack when unhashed."""
    w, c, big = pool.table.shape[1], pool.ring.shape[0], pool.ref.shape[0]
    j = start + jnp.arange(SPAN, dtype=I32)
    blocks = pool.table[row, jnp.clip(j, 0, w - 1)]
    mine = on & (j >= 0) & (j < held)
    holders = pool.ref[blocks]  # a request's blocks are distinct: the scatter below sets each once
    freed = mine & (holders == 1)
    key = pool.key[blocks]
    cached = freed & (key >= 0)
    plain = freed & (key < 0)
    later = jnp.cumsum(cached[::-1], dtype=I32)[::-1] - cached  # cached blocks after this one: last block first
    stamp = pool.rtail + later
    ncached = cached.sum(dtype=I32)
    below = jnp.cumsum(plain, dtype=I32) - plain  # (which unhashed free block is taken is never observable)
    return dataclasses.replace(
        pool, ref=pool.ref.at[jnp.where(mine, blocks, big)].set(holders - 1, mode="drop"),
        ring=pool.ring.at[jnp.where(cached, stamp % c, c)].set(blocks, mode="drop"),
        freed_at=pool.freed_at.at[jnp.where(cached, blocks, big)].set(stamp, mode="drop"),
        rtail=pool.rtail + ncached, nlru=pool.nlru + ncached,
        stack=pool.stack.at[jnp.where(plain, pool.nstack + below, big)].set(blocks, mode="drop"),
        nstack=pool.nstack + plain.sum(dtype=I32))


def _release(pool: Pool, slot, on) -> Pool:
    """Spans of SPAN positions from the slot's last held block down to its first: the
    work is its blocks', not the table's width W."""
    w, c, s = pool.table.shape[1], pool.ring.shape[0], pool.held.shape[0]
    pool = _when(on & (pool.rtail - pool.rhead + w > c), _compact, pool)
    row = jnp.clip(slot, 0, s - 1)
    held = jnp.where(on, pool.held[row], 0)

    def one(carry):
        start, pool = carry
        return start - SPAN, _release_span(pool, row, held, start, start + SPAN > 0)

    last = (jnp.maximum(held, 1) - 1) // SPAN * SPAN  # the last span's first position
    pool = jax.lax.while_loop(lambda c: batch_any(c[0] + SPAN > 0), one, (jnp.where(held > 0, last, -SPAN), pool))[1]
    gone = jnp.where(on, slot, s)
    return dataclasses.replace(pool, held=pool.held.at[gone].set(0, mode="drop"),
                               hashed=pool.hashed.at[gone].set(0, mode="drop"))


def release(pool: Pool, slot, on) -> Pool:
    """Where `on`: `slot` drops its hold on every block, last block first (a block that
    becomes free joins the LRU's back in that order when it has a hash, keeping it)."""
    held = pool.held[jnp.clip(slot, 0, pool.held.shape[0] - 1)]
    return _when(on & (held > 0), lambda p, m: _release(p, slot, m), pool)


def lookup(pool: Pool, tokens, ids, off, nids, block_size):
    """The prefix hit of a request knowing `tokens` tokens: the longest run of its leading
    blocks whose content is cached, whole blocks of at most tokens - 1 tokens. Returns
    (hits int32[], evictable int32[]: hit blocks free now, which the admission counts as
    needed). All W positions at once, no loop: the gathers do not depend on `tokens`, so
    every lookup of one request in an event (the engine's `prefix_hit`, the admission's,
    `touch`'s) is one computation after XLA's CSE, ordered before the pool's in-place
    updates; a read of the content table in a loop or apart from them made XLA:CPU copy
    the table (U entries) twice an event (a SPAN loop here: 2.7x slower an event at 2^21
    contents, benchmarks/HISTORY.md 2026-12-07)."""
    w = pool.table.shape[1]
    limit = jnp.minimum((tokens - 1) // block_size, nids)  # <= W: a request's blocks
    j = jnp.arange(w, dtype=I32)
    copy = pool.head[_content(ids, off, j)]
    ok = (j < limit) & (copy >= 0)
    run = jnp.argmin(jnp.concatenate([ok, jnp.zeros(1, bool)])).astype(I32)
    return run, ((j < run) & (pool.ref[jnp.maximum(copy, 0)] == 0)).sum(dtype=I32)


def _touch(pool: Pool, slot, hits, ids, off, on) -> Pool:
    """SPAN positions a pass over the first `hits` (the caller masks with `on`)."""
    big, s, w = pool.ref.shape[0], pool.held.shape[0], pool.table.shape[1]
    r = jnp.arange(SPAN, dtype=I32)
    row = jnp.where(on, slot, s)

    def one(carry):
        start, pool = carry
        j = start + r
        mine = on & (j < hits)
        copy = pool.head[_content(ids, off, j)]
        holders = pool.ref[jnp.maximum(copy, 0)]  # distinct blocks (distinct contents' first copies)
        was_free = mine & (holders == 0)
        return start + SPAN, dataclasses.replace(
            pool, ref=pool.ref.at[jnp.where(mine, copy, big)].set(holders + 1, mode="drop"),
            freed_at=pool.freed_at.at[jnp.where(was_free, copy, big)].set(-1, mode="drop"),
            nlru=pool.nlru - was_free.sum(dtype=I32),
            table=pool.table.at[row, jnp.where(mine, j, w)].set(copy, mode="drop"))

    hits = jnp.where(on, hits, 0)
    pool = jax.lax.while_loop(lambda c: batch_any(c[0] < hits), one, (jnp.zeros((), I32), pool))[1]
    return dataclasses.replace(pool, held=pool.held.at[row].set(hits, mode="drop"),
                               hashed=pool.hashed.at[row].set(hits, mode="drop"))


def touch(pool: Pool, slot, hits, ids, off) -> Pool:
    """`slot` starts holding the first copies of its first `hits` blocks' contents (a free
    one leaves the LRU: its entry goes stale); its table is those, every one hashed."""
    return _when(hits > 0, lambda p, m: _touch(p, slot, hits, ids, off, m), pool)
