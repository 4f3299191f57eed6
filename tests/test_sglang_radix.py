"""servers/sglang_radix.py against the literal reference RadixTree (testing/sglang_reference_parts.py):
random operation sequences on many lanes at once, compared after every operation, and hand-worked
cases. Every step runs all five operations, each masked to the one asked for, so the masked-off
calls are checked to change nothing as well."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.servers import sglang_radix as sr
from vtc_jax.testing.sglang_reference_parts import OUTPUT_TOKEN, RadixTree, SglangRequest, _prompt_tokens

MATCH, INSERT, LOCK, UNLOCK, EVICT, NOTHING = range(6)
LANES, OPS, CAPACITY = 200, 40, 96  # an insert makes at most 2 nodes: 1 + 2 * OPS < CAPACITY
SMALL = 8  # the hand cases' capacity


def _step(tree, op, q, length, node, amount):
    """One operation `op` on one lane: (tree, matched or existing length, node, evicted)."""
    tree, m_len, m_node = sr.match(tree, q, length, op == MATCH)
    tree, i_len, i_node = sr.insert(tree, q, length, op == INSERT)
    tree = sr.inc_lock(tree, node, op == LOCK)
    tree = sr.dec_lock(tree, node, op == UNLOCK)
    tree, evicted = sr.evict(tree, amount, op == EVICT)
    return tree, m_len + i_len, m_node + i_node, evicted  # masked-off results are 0


_one = jax.jit(_step)
_many = jax.jit(jax.vmap(_step))


# ---- the reference's side ------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _prompt(req: tuple, row: int) -> tuple:
    group, shared, prompt = req
    return _prompt_tokens(SglangRequest(arrival=0, client="c", prompt=prompt, output=1,
                                        prefix_id=None if group < 0 else f"g{group}", prefix_len=shared), row)


def _tokens(reqs, row: int, start: int, end: int) -> tuple:
    """Request `row`'s tokens [start, end): its prompt, then output tokens for ever."""
    prompt = _prompt(reqs[row], row)
    return tuple(prompt[n] if n < len(prompt) else OUTPUT_TOKEN for n in range(start, end))


def _key_length(fill: int, limit: int | None) -> int:
    return fill if limit is None else min(limit, fill)


def _ref_op(ref: RadixTree, reqs, op, row=0, fill=0, limit=None, node=None, amount=0):
    """The reference's operation: (length, nid of the node returned (the root's 1 if none), evicted)."""
    if op == MATCH:
        got, last = ref.match(_tokens(reqs, row, 0, fill), limit)
        return got, last.nid, 0
    if op == INSERT:
        got, last = ref.insert(_tokens(reqs, row, 0, fill))
        return got, last.nid, 0
    if op == LOCK:
        ref.inc_lock_ref(node)
    elif op == UNLOCK:
        ref.dec_lock_ref(node)
    elif op == EVICT:
        return 0, 1, ref.evict(amount)
    return 0, 1, 0


def _ref_nodes(ref: RadixTree) -> dict:
    """{nid: (node, parent's nid (0 for the root), start, end)} of the reference's tree."""
    out, stack = {}, [(ref.root, 0)]
    while stack:
        node, start = stack.pop()
        end = start + len(node.key)
        out[node.nid] = (node, node.parent.nid if node.parent is not None else 0, start, end)
        stack.extend((child, end) for child in node.children.values())
    return out


def _assert_same(ref: RadixTree, reqs, t: sr.Tree, where) -> dict:
    """The whole tree keyed by nid (parent, span, lock, access, and the rep's tokens over the
    span equal to the reference's key), the counters and the sizes. Returns {nid: index}."""
    nodes = _ref_nodes(ref)
    assert not t.overflow, where
    assert (int(t.clock), int(t.nids)) == (ref._ticks, ref._nids), where
    assert (int(t.evictable), int(t.protected)) == (ref.evictable_size, ref.protected_size), where
    assert int(sr.total_size(t)) == ref.total_size(), where
    index = {int(t.nid[i]): int(i) for i in np.flatnonzero(t.alive)}
    assert sorted(index) == sorted(nodes), where
    for nid, i in index.items():
        node, parent, start, end = nodes[nid]
        mine = (int(t.nid[t.parent[i]]) if i else 0, int(t.start[i]), int(t.end[i]), int(t.lock[i]), int(t.access[i]))
        assert mine == (parent, start, end, node.lock_ref, node.last_access_time), (where, nid)
        if i:
            assert _tokens(reqs, int(t.rep.row[i]), start, end) == node.key, (where, nid)
    return index


def _ident(reqs, row):
    return (*reqs[row], row)  # (group, shared, prompt, row)


# ---- random sequences ----------------------------------------------------------------------


@dataclasses.dataclass
class _Lane:
    rng: np.random.Generator
    reqs: list  # (group, shared, prompt) per row
    ref: RadixTree = dataclasses.field(default_factory=RadixTree)
    handles: list = dataclasses.field(default_factory=list)  # reference nodes match / insert returned
    locked: list = dataclasses.field(default_factory=list)  # ... that this lane inc_locked, once each


def _requests(rng) -> list[tuple]:
    """A few groups (-1: none), all-prefix rows, and shared lengths without a group (which
    the reference ignores)."""
    reqs = []
    for _ in range(int(rng.integers(3, 8))):
        prompt = int(rng.integers(1, 13))
        shared = prompt if rng.random() < 0.3 else int(rng.integers(0, prompt + 1))
        reqs.append((int(rng.integers(-1, 3)), shared, prompt))
    return reqs


def _choose(lane: _Lane) -> tuple:
    """A random operation: (op, row, fill, limit, reference node, amount). A fill is the prompt
    and 0..5 outputs; a match's limit is none, fill - 1 (the scheduler's) or any; an insert
    may take a prefix of the fill (an empty one too)."""
    rng = lane.rng
    op = int(rng.choice([MATCH, INSERT, LOCK, UNLOCK, EVICT], p=[0.3, 0.32, 0.13, 0.13, 0.12]))
    nodes = _ref_nodes(lane.ref)
    alive = [h for h in lane.handles if h.nid in nodes]
    if op == LOCK and alive:
        node = alive[int(rng.integers(len(alive)))]
        lane.locked.append(node)
        return LOCK, 0, 0, None, node, 0
    if op == UNLOCK and lane.locked:
        return UNLOCK, 0, 0, None, lane.locked.pop(int(rng.integers(len(lane.locked)))), 0
    if op == EVICT:
        return EVICT, 0, 0, None, None, int(rng.integers(0, 13))
    row = int(rng.integers(len(lane.reqs)))
    fill = lane.reqs[row][2] + int(rng.integers(0, 6))
    if op == INSERT:
        return INSERT, row, fill if rng.random() < 0.6 else int(rng.integers(0, fill + 1)), None, None, 0
    return MATCH, row, fill, [None, fill - 1, int(rng.integers(0, fill + 1))][int(rng.integers(3))], None, 0


def test_random_sequences_match_the_reference():
    seeds = np.random.default_rng(20260).integers(0, 2**31, LANES)
    lanes = []
    for seed in seeds:
        rng = np.random.default_rng(int(seed))
        lanes.append(_Lane(rng=rng, reqs=_requests(rng)))
    tree = jax.vmap(lambda _: sr.init(CAPACITY))(jnp.arange(LANES))
    host = jax.device_get(tree)
    index = [_assert_same(lane.ref, lane.reqs, jax.tree.map(lambda a, i=i: a[i], host), "init")
             for i, lane in enumerate(lanes)]
    seen = set()
    for step in range(OPS):
        args, expected = [], []
        for i, lane in enumerate(lanes):
            op, row, fill, limit, node, amount = _choose(lane)
            got = _ref_op(lane.ref, lane.reqs, op, row, fill, limit, node, amount)
            if op in (MATCH, INSERT):
                lane.handles.append(_ref_nodes(lane.ref)[got[1]][0])
                seen.add((op, limit is not None, _key_length(fill, limit) == 0))
            seen.add(op)
            args.append((op, *_ident(lane.reqs, row), _key_length(fill, limit), index[i][node.nid] if node else 0,
                         amount))
            expected.append(got)
        a = jnp.asarray(np.asarray(args, np.int32).T)
        tree, lengths, nodes, evicted = _many(tree, a[0], sr.ident(*a[1:5]), a[5], a[6], a[7])
        host, lengths, nodes, evicted = jax.device_get((tree, lengths, nodes, evicted))
        for i, lane in enumerate(lanes):
            where = f"lane {i} step {step} op {args[i]}"
            index[i] = _assert_same(lane.ref, lane.reqs, jax.tree.map(lambda a, i=i: a[i], host), where)
            assert (int(lengths[i]), int(host.nid[i][nodes[i]]), int(evicted[i])) == expected[i], where
    # every kind of operation came up, limits and empty keys among them
    assert {MATCH, INSERT, LOCK, UNLOCK, EVICT, (MATCH, True, True), (MATCH, True, False), (MATCH, False, False),
            (INSERT, False, True), (INSERT, False, False)} <= seen


# ---- hand-worked cases ---------------------------------------------------------------------


class _Pair:
    """One lane run by the reference and the JAX tree (capacity SMALL) side by side, compared
    after every operation."""

    def __init__(self, reqs):
        self.reqs, self.ref, self.tree = reqs, RadixTree(), sr.init(SMALL)
        self.index = _assert_same(self.ref, reqs, self.tree, "init")

    def run(self, op, row=0, fill=0, limit=None, nid=1, amount=0):
        """Returns (length, nid of the node returned, evicted), the reference's and the tree's."""
        node = _ref_nodes(self.ref)[nid][0]
        expected = _ref_op(self.ref, self.reqs, op, row, fill, limit, node, amount)
        self.tree, length, last, evicted = _one(self.tree, op, sr.ident(*_ident(self.reqs, row)),
                                                _key_length(fill, limit), self.index[nid], amount)
        self.index = _assert_same(self.ref, self.reqs, jax.device_get(self.tree), (op, row, fill, limit, nid))
        got = (int(length), int(self.tree.nid[last]), int(evicted))
        assert got == expected
        return got


def test_diverge_is_the_first_differing_token():
    """The closed form against the token tuples, past the prompts: group -1 and shared 0 are
    both "no prefix", all-prefix rows of one shared length never differ."""
    reqs = [(-1, 0, 3), (-1, 2, 3), (0, 0, 2), (0, 2, 2), (0, 2, 2), (0, 2, 5), (0, 4, 4), (1, 2, 2), (-1, 0, 4),
            (-1, 1, 4)]
    far = 30

    def first(a, b):
        x, y = _tokens(reqs, a, 0, far), _tokens(reqs, b, 0, far)
        return next((n for n in range(far) if x[n] != y[n]), sr.NEVER)

    q = np.asarray([_ident(reqs, row) for row in range(len(reqs))], np.int32).T
    got = sr.diverge(sr.ident(*q[:, :, None]), sr.ident(*q[:, None, :]))
    assert np.asarray(got).tolist() == [[first(a, b) for b in range(len(reqs))] for a in range(len(reqs))]


def test_a_split_on_match_gives_the_upper_node_a_later_tick():
    pair = _Pair([(-1, 0, 4)])
    assert pair.run(INSERT, 0, 4) == (0, 2, 0)  # ticks: root 1, insert 2, the leaf 3
    assert pair.run(MATCH, 0, 4, limit=2) == (2, 3, 0)  # the match's tick 4, the split's 5
    t = pair.tree
    upper, lower = pair.index[3], pair.index[2]
    assert (int(t.start[upper]), int(t.end[upper]), int(t.access[upper])) == (0, 2, 5)
    assert (int(t.start[lower]), int(t.end[lower]), int(t.access[lower]), int(t.parent[lower])) == (2, 4, 4, upper)
    assert lower == 1  # the lower part keeps its index (handles stay valid); the new node takes the free one
    assert pair.run(MATCH, 0, 0) == (0, 1, 0) and int(pair.tree.clock) == 5  # an empty key ticks nothing
    assert pair.run(INSERT, 0, 0) == (0, 1, 0) and int(pair.tree.clock) == 6  # an empty insert ticks


def _lru_pair() -> _Pair:
    """Leaves nid 3 (row 1, index 2), 4 (row 2, index 3), 5 (row 3, index 1: reused)."""
    pair = _Pair([(-1, 0, 2), (-1, 0, 3), (-1, 0, 4), (-1, 0, 5)])
    for row in range(3):
        pair.run(INSERT, row, row + 2)
    assert pair.run(EVICT, amount=1) == (0, 1, 2)  # nid 2, the least recently used
    pair.run(INSERT, 3, 5)
    pair.run(MATCH, 1, 3)  # nid 3 becomes the most recently used
    assert [pair.index[nid] for nid in (3, 4, 5)] == [2, 3, 1]
    return pair


def test_lru_order_and_ties_broken_by_nid():
    pair = _lru_pair()
    assert [pair.run(EVICT, amount=1)[2] for _ in range(4)] == [4, 5, 3, 0]  # nids 4, 5, 3 by access
    # With the tick clock two evictable leaves never share an access time (one tick touches one
    # path); force a tie in both to check the order falls back to nid, not to the index.
    pair = _lru_pair()
    for node, *_ in _ref_nodes(pair.ref).values():
        node.last_access_time = 10
    pair.tree = dataclasses.replace(pair.tree, access=jnp.full(SMALL, 10, jnp.int32))
    order = []
    for _ in range(3):
        before = set(pair.index)
        pair.run(EVICT, amount=1)
        order += sorted(before - set(pair.index))
    assert order == [3, 4, 5]


def test_all_prefix_requests_share_their_output_tokens():
    pair = _Pair([(0, 3, 3), (0, 3, 3), (0, 3, 5), (0, 2, 4)])
    assert pair.run(INSERT, 0, 6) == (0, 2, 0)
    assert pair.run(MATCH, 1, 6) == (6, 2, 0)  # row 1 is row 0's prefix and the same 3 outputs
    assert pair.run(INSERT, 1, 8) == (6, 3, 0)  # two more outputs hang below row 0's leaf
    assert pair.run(MATCH, 2, 5) == (3, 4, 0)  # row 2 has its own tokens past the prefix: split at 3
    assert pair.run(MATCH, 3, 4) == (2, 5, 0)  # a shorter prefix of the group: split at 2
    pair.run(LOCK, nid=3)
    assert (int(pair.tree.evictable), int(pair.tree.protected)) == (0, 8)
    assert pair.run(EVICT, amount=8) == (0, 1, 0)  # everything is on the locked path
    pair.run(UNLOCK, nid=3)
    # whole leaves: nid 3 (2 tokens) is short of 3, so its parent nid 2 (3 tokens) goes too
    assert pair.run(EVICT, amount=3) == (0, 1, 5)


def _assert_whole(t: sr.Tree):
    """Consistent: every alive node hangs below an alive parent whose span ends where its
    starts, and the sizes add up to the cached tokens."""
    for i in np.flatnonzero(t.alive)[1:]:
        p = int(t.parent[i])
        assert t.alive[p] and int(t.end[p]) == int(t.start[i]) < int(t.end[i])
    assert int(t.evictable) + int(t.protected) == int(sr.total_size(t))


def test_overflow_at_tiny_capacity_keeps_the_tree_consistent():
    reqs = [(-1, 0, 3)] * SMALL
    pair = _Pair(reqs)
    for row in range(SMALL - 1):
        pair.run(INSERT, row, 3)  # the root and 7 leaves fill all 8 indices
    full = jax.device_get(pair.tree)
    q = sr.ident(*_ident(reqs, 0))
    for op, row, length in ((MATCH, 0, 2), (INSERT, 0, 5), (INSERT, SMALL - 1, 3)):  # a split, two leaves
        t, *_ = jax.device_get(_one(full, op, sr.ident(*_ident(reqs, row)), length, 0, 0))
        assert t.overflow and int(t.clock) == int(full.clock) + 1  # the walk's tick only
        for name in ("start", "end", "parent", "lock", "nid", "alive", "nids", "evictable"):
            assert np.array_equal(getattr(t, name), getattr(full, name)), (op, name)
        _assert_whole(t)
    # once a leaf is evicted (row 0's, the least recently used) its index is free again
    t, *_ = _one(full, EVICT, q, 0, 0, 1)
    t, length, node, _ = jax.device_get(_one(t, MATCH, sr.ident(*_ident(reqs, 1)), 2, 0, 0))
    assert not t.overflow and int(length) == 2 and int(node) == 1 and int(t.end[node]) == 2
    _assert_whole(t)


def test_masked_off_operations_change_nothing():
    pair = _Pair([(0, 3, 3), (0, 2, 5), (-1, 0, 4)])
    pair.run(INSERT, 0, 5)
    pair.run(INSERT, 1, 5)
    pair.run(LOCK, nid=4)
    before = jax.device_get(pair.tree)
    for row, length, node, amount in ((0, 2, 1, 9), (2, 4, 2, 1), (1, 0, 0, 0)):
        out = jax.device_get(_one(before, NOTHING, sr.ident(*_ident(pair.reqs, row)), length, node, amount))
        assert jax.tree.all(jax.tree.map(np.array_equal, out[0], before))
        assert out[1:] == (0, 0, 0)
