"""SGLang's radix cache at page size 1, in pure JAX, for one lane (callers vmap over lanes).

It is exact against the literal reference `RadixTree` (vtc_jax/testing/sglang_reference_parts.py,
radix_cache.py of sglang 0.5.23): the same lengths returned, the same evictable and protected
sizes, the same nodes (by creation number `nid`) with the same spans, locks and last access
times, and so the same LRU evictions.

Token identity. No token is stored. A request's fill (prompt, then generated outputs) is named
by an `Ident(group, shared, prompt, row)` of int32 scalars; its token at position n is

  n < shared:             ("prefix", group, n)   (group == -1 or shared == 0: no shared prefix)
  shared <= n < prompt:   ("row", row, n - shared)
  n >= prompt:            the output token 1 (every generated token is the same id)

which is the reference harness's `_prompt_tokens` (prefix_id -> group, prefix_len -> shared)
followed by OUTPUT_TOKEN. So where two requests first differ has a closed form (`diverge`),
and a node keeps the Ident of one request whose tokens it holds (its "rep"): node c holds
positions [start_c, end_c) of rep_c's token sequence, and the path from the root to c is
rep_c's tokens [0, end_c). A request's tokens are defined past its current fill (outputs are
all 1), so a rep stays valid while the request grows.

The tree (`Tree`, capacity N static from the arrays' shape; node 0 is the root):
  rep: Ident of int32[N]; start, end, parent (-1: none), lock (lock_ref; the root's is 1),
  access (last_access_time), nid (creation number): int32[N]; alive: bool[N];
  clock (the reference's tick counter), nids (its creation counter), evictable, protected
  (evictable_size, protected_size): int32[]; overflow: bool[] (a node was needed and no index
  was free: that node was not made, the tree stays consistent, results are no longer the
  reference's).
The reference's clock is a counter read once per `_new_node` and once per non-empty match or
any insert; ticking in the same order makes access times and nids equal the reference's.

Every function is pure and takes a `mask` bool[]: where it is False the tree is returned
unchanged and the results are 0. Nothing branches on traced values: a walk down the tree is
one vectorized test over all N nodes (`_on_path`), an eviction is a `lax.while_loop` that
removes one leaf per pass. New nodes take the lowest free index; freed indices are reused.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

I32 = jnp.int32
NEVER = 1 << 30  # diverge() of two requests whose token sequences never differ
_MAX = jnp.iinfo(jnp.int32).max


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Ident:
    """Names a request's token sequence (see the module docstring): int32 fields, scalars for
    one request, int32[N] for the tree's reps."""

    group: jax.Array
    shared: jax.Array
    prompt: jax.Array
    row: jax.Array


def ident(group, shared, prompt, row) -> Ident:
    """An Ident with int32 fields."""
    return Ident(*(jnp.asarray(x, I32) for x in (group, shared, prompt, row)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tree:
    """One lane's radix tree (the module docstring gives the fields)."""

    rep: Ident
    start: jax.Array
    end: jax.Array
    parent: jax.Array
    lock: jax.Array
    access: jax.Array
    nid: jax.Array
    alive: jax.Array
    clock: jax.Array
    nids: jax.Array
    evictable: jax.Array
    protected: jax.Array
    overflow: jax.Array

    @property
    def capacity(self) -> int:
        return self.start.shape[-1]


def init(capacity: int) -> Tree:
    """An empty tree of `capacity` nodes: the root only, made at tick 1 with nid 1 and locked
    once (the reference's RadixTree())."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 (the root), got {capacity}")
    zeros = jnp.zeros(capacity, I32)
    root = jnp.arange(capacity, dtype=I32) == 0
    one_at_root = root.astype(I32)
    return Tree(rep=Ident(group=jnp.full(capacity, -1, I32), shared=zeros, prompt=zeros,
                          row=jnp.full(capacity, -1, I32)),
                start=zeros, end=zeros, parent=jnp.full(capacity, -1, I32), lock=one_at_root,
                access=one_at_root, nid=one_at_root, alive=root,
                clock=jnp.asarray(1, I32), nids=jnp.asarray(1, I32), evictable=jnp.asarray(0, I32),
                protected=jnp.asarray(0, I32), overflow=jnp.asarray(False))


# ---- token identity ------------------------------------------------------------------------


def _prefix(q: Ident):
    """(group, shared) with "no shared prefix" always spelled (-1, 0): the reference gives a
    request without prefix_id no shared tokens whatever its prefix_len."""
    has = (q.group >= 0) & (q.shared > 0)
    return jnp.where(has, q.group, -1).astype(I32), jnp.where(has, q.shared, 0).astype(I32)


def diverge(q: Ident, r: Ident) -> jax.Array:
    """The first position at which q's and r's token sequences differ (NEVER if they do not);
    broadcasts over the fields' shapes.

    One row is one request. Otherwise row tokens never agree, so the sequences agree exactly
    over the shared prefix both have, m = min(shared) of one group (0 across groups); past it
    one of them has a row token or the other group's prefix, unless both are all-prefix of one
    group with the same shared length: then both go on with output tokens 1 for ever."""
    gq, sq = _prefix(q)
    gr, sr = _prefix(r)
    same = gq == gr  # two requests without a prefix count as one group of shared length 0
    alike = same & (sq == sr) & (sq == q.prompt) & (sr == r.prompt)
    never = (q.row == r.row) | alike
    return jnp.where(never, NEVER, jnp.where(same, jnp.minimum(sq, sr), 0)).astype(I32)


def _rep(tree: Tree, i) -> Ident:
    return jax.tree.map(lambda a: a[i], tree.rep)


def _on_path(tree: Tree, q: Ident, length) -> jax.Array:
    """bool[N]: the non-root nodes a walk down the tree along q's first `length` tokens enters.
    The walk enters child c exactly when the key agrees with c's path through c's first
    token, i.e. diverge(q, rep_c) > start_c, and has a token there, start_c < length. These
    nodes form one chain from the root; the deepest (largest start) is where the walk ends."""
    idx = jnp.arange(tree.capacity, dtype=I32)
    return tree.alive & (idx > 0) & (diverge(q, tree.rep) > tree.start) & (tree.start < length)


# ---- nodes ---------------------------------------------------------------------------------


def _new_node(tree: Tree, want, rep: Ident, start, end, parent, lock):
    """The reference's `_new_node` plus the caller's fields: the lowest free index gets the next
    tick as its access time and the next nid. Returns (tree, index, made); with no free index
    nothing is made and `overflow` is set."""
    idx = jnp.arange(tree.capacity, dtype=I32)
    free = ~tree.alive & (idx > 0)
    u = jnp.argmax(free).astype(I32)  # the lowest free index (0, the root, when none is free)
    made = want & free.any()
    at = (idx == u) & made
    clock = tree.clock + made.astype(I32)
    nids = tree.nids + made.astype(I32)
    tree = dataclasses.replace(
        tree, rep=jax.tree.map(lambda new, old: jnp.where(at, new, old), rep, tree.rep),
        start=jnp.where(at, start, tree.start), end=jnp.where(at, end, tree.end),
        parent=jnp.where(at, parent, tree.parent), lock=jnp.where(at, lock, tree.lock),
        access=jnp.where(at, clock, tree.access), nid=jnp.where(at, nids, tree.nid), alive=tree.alive | at,
        clock=clock, nids=nids, overflow=tree.overflow | (want & ~made))
    return tree, u, made


def _split(tree: Tree, c, at, want):
    """The reference's `_split(c, at - start_c)`: a new upper node [start_c, at) with c's rep,
    parent and lock takes c's place; c keeps its index, nid and access time as the lower part
    [at, end_c) below it. Returns (tree, the node the walk ends at): the new node, or c when no
    split was wanted or none could be made."""
    tree, u, made = _new_node(tree, want, _rep(tree, c), tree.start[c], at, tree.parent[c], tree.lock[c])
    lower = (jnp.arange(tree.capacity, dtype=I32) == c) & made
    tree = dataclasses.replace(tree, start=jnp.where(lower, at, tree.start), parent=jnp.where(lower, u, tree.parent))
    return tree, jnp.where(made, u, c).astype(I32)


def _walk(tree: Tree, q: Ident, length, mask):
    """The loop match and insert share: one tick, every node entered and the root touched with
    it (before the split's own tick, as the reference sets access before splitting), and the
    node the key ends or diverges inside split there. Returns (tree, matched, node)."""
    idx = jnp.arange(tree.capacity, dtype=I32)
    on = _on_path(tree, q, length)
    c = jnp.argmax(jnp.where(on, tree.start, -1)).astype(I32)  # the deepest entered node; the root if none
    d = diverge(q, _rep(tree, c))
    matched = jnp.where(on.any(), jnp.minimum(jnp.minimum(d, tree.end[c]), length), 0).astype(I32)
    tick = tree.clock + 1
    tree = dataclasses.replace(tree, access=jnp.where(mask & (on | (idx == 0)), tick, tree.access),
                               clock=jnp.where(mask, tick, tree.clock))
    tree, node = _split(tree, c, matched, mask & (matched < tree.end[c]))
    return tree, matched, node


def match(tree: Tree, q: Ident, length, mask):
    """The reference's `match(tokens, limit)` on q's first `length` tokens (the caller takes
    min(limit, fill length)). Returns (tree, matched int32[], node int32[]): the cached prefix
    length and the node it ends at (a split's new upper node when it ended inside a node). An
    empty key returns (0, root) and neither ticks nor touches anything."""
    mask = jnp.asarray(mask) & (length > 0)
    tree, matched, node = _walk(tree, q, length, mask)
    return tree, jnp.where(mask, matched, 0).astype(I32), jnp.where(mask, node, 0).astype(I32)


def insert(tree: Tree, q: Ident, length, mask):
    """The reference's `insert(tokens)` of q's first `length` tokens: ticks (even for an empty
    key), touches the path and the root, splits where the key ends or diverges inside a node,
    and hangs the rest [matched, length) as a new leaf with rep q (evictable by its length).
    Returns (tree, tokens already cached int32[], the last node int32[])."""
    mask = jnp.asarray(mask)
    tree, matched, node = _walk(tree, q, length, mask)
    # A split that found no free index leaves none for the leaf either: the tree stays whole.
    tree, leaf, made = _new_node(tree, mask & (matched < length), q, matched, length, node, jnp.asarray(0, I32))
    tree = dataclasses.replace(tree, evictable=tree.evictable + jnp.where(made, length - matched, 0).astype(I32))
    node = jnp.where(made, leaf, node)
    return tree, jnp.where(mask, matched, 0).astype(I32), jnp.where(mask, node, 0).astype(I32)


# ---- locks ---------------------------------------------------------------------------------


def _lock_path(tree: Tree, node, mask, delta: int) -> Tree:
    """inc_lock_ref (delta 1) or dec_lock_ref (delta -1) of `node`: every node from it up to,
    not including, the root. Its ancestors are exactly the nodes a walk along its own path
    [0, end) enters. A node's tokens move from evictable to protected when its lock leaves 0,
    and back when it returns to 0."""
    path = _on_path(tree, _rep(tree, node), tree.end[node]) & mask
    edge = path & (tree.lock == (0 if delta > 0 else 1))
    moved = jnp.sum(jnp.where(edge, tree.end - tree.start, 0), dtype=I32)
    return dataclasses.replace(tree, lock=tree.lock + jnp.where(path, delta, 0).astype(I32),
                               evictable=tree.evictable - delta * moved, protected=tree.protected + delta * moved)


def inc_lock(tree: Tree, node, mask) -> Tree:
    """The reference's `inc_lock_ref(node)`; `node` must be alive (the root: nothing)."""
    return _lock_path(tree, node, jnp.asarray(mask), 1)


def dec_lock(tree: Tree, node, mask) -> Tree:
    """The reference's `dec_lock_ref(node)`; only of a node inc_lock locked."""
    return _lock_path(tree, node, jnp.asarray(mask), -1)


# ---- eviction ------------------------------------------------------------------------------


def _evictable_leaves(tree: Tree) -> jax.Array:
    """bool[N]: the reference's `evictable_leaves`, the alive, unlocked, childless non-root
    nodes (it adds and drops a node exactly when one of these changes)."""
    idx = jnp.arange(tree.capacity, dtype=I32)
    inner = tree.alive & (idx > 0)
    has_child = jnp.zeros(tree.capacity, bool).at[jnp.where(inner, tree.parent, tree.capacity)].set(True, mode="drop")
    return inner & (tree.lock == 0) & ~has_child


def evict(tree: Tree, num_tokens, mask):
    """The reference's `evict(num_tokens)`: removes the evictable leaf of least (access, nid),
    one per pass, until at least `num_tokens` are evicted or none is left (whole leaves, so it
    may evict more). The reference's heap holds exactly the evictable leaves (a parent joins
    it when it becomes one; access times do not change while it runs), so its pops are these.
    Returns (tree, tokens evicted int32[])."""
    target = jnp.where(jnp.asarray(mask), num_tokens, 0).astype(I32)

    def pending(carry):
        _, evicted, leaves = carry
        return (evicted < target) & leaves.any()

    def one(carry):
        tree, evicted, leaves = carry
        oldest = jnp.min(jnp.where(leaves, tree.access, _MAX))
        x = jnp.argmin(jnp.where(leaves & (tree.access == oldest), tree.nid, _MAX)).astype(I32)
        size = tree.end[x] - tree.start[x]
        gone = jnp.arange(tree.capacity, dtype=I32) == x
        tree = dataclasses.replace(tree, alive=tree.alive & ~gone, parent=jnp.where(gone, -1, tree.parent),
                                   evictable=tree.evictable - size)
        return tree, evicted + size, _evictable_leaves(tree)

    tree, evicted, _ = jax.lax.while_loop(pending, one, (tree, jnp.asarray(0, I32), _evictable_leaves(tree)))
    return tree, evicted


def total_size(tree: Tree) -> jax.Array:
    """The reference's `total_size()`: the tokens cached, int32[]."""
    inner = tree.alive & (jnp.arange(tree.capacity, dtype=I32) > 0)
    return jnp.sum(jnp.where(inner, tree.end - tree.start, 0), dtype=I32)
