"""Slow, literal pure-Python versions of the endpoint pickers (vtc_jax/pickers), that the
JAX pickers are checked against: llm-d's index as one OrderedDict LRU per replica (as
hashicorp's LRU in llm-d's indexer.go), its scores in float64 (Go's) or float32 (the JAX
picker's precision, same order of operations), Dynamo's cost in Python ints.

Each class: `pick(snapshot, request, draws) -> replica` and `routed(replica, request)`;
snapshot and request are the JAX pickers' NamedTuples holding host values (numpy or lists),
`draws` the tie draws (`vtc_jax.pickers.base.tie_draws(key, R)` as ints), None for the
lowest-index rule."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


def tie_break(tied: list[int], draws) -> int:
    """The replica `choose` takes among `tied` (indices, ascending): the largest draw >> 1,
    the lower index on equal draws; the lowest index when draws is None; -1 if none."""
    if not tied:
        return -1
    if draws is None:
        return tied[0]
    best = tied[0]
    for r in tied[1:]:
        if int(draws[r]) >> 1 > int(draws[best]) >> 1:
            best = r
    return best


def _present(snapshot) -> list[int]:
    return [r for r, p in enumerate(snapshot.present) if bool(p)]


class PrefixIndexReference:
    """Per replica an LRU set of block ids (OrderedDict: first = least recent)."""

    def __init__(self, capacity):
        self.capacity = [int(c) for c in capacity]
        self.sets = [OrderedDict() for _ in self.capacity]

    def match(self, blocks) -> list[int]:
        """llm-d's matchLongestPrefix: walk the blocks, stop at the first no replica holds,
        every holder of a block gets one."""
        m = [0] * len(self.sets)
        for b in blocks:
            holding = [r for r, s in enumerate(self.sets) if b in s]
            if not holding:
                break
            for r in holding:
                m[r] += 1
        return m

    def add(self, replica: int, blocks) -> None:
        """hashicorp LRU `Add` of each block in order: a held one moves to most recent, a new
        one evicts the least recent when full."""
        if replica < 0:
            return
        s, cap = self.sets[replica], self.capacity[replica]
        for b in blocks:
            if b in s:
                s.move_to_end(b)
            elif cap > 0:
                if len(s) >= cap:
                    s.popitem(last=False)
                s[b] = True


class LlmdLiteralIndex:
    """llm-d's indexer.go exactly as written (for comparison, not a picker): per pod a
    hashicorp LRU whose eviction callback removes the pod from hashToPods[hash], and
    hashToPods updated AFTER all of a request's LRU adds. When one request has more blocks
    than the pod's capacity, its first blocks are evicted from the LRU during the adds and
    then put back into hashToPods, where they stay (held for matching, absent from the LRU)
    until the hash enters the pod's LRU again and is evicted again. With at most capacity
    blocks per request it is `PrefixIndexReference` (tests/test_pickers.py checks both)."""

    def __init__(self, capacity):
        self.capacity = [int(c) for c in capacity]
        self.lrus = [OrderedDict() for _ in self.capacity]
        self.pods: dict = {}  # hashToPods

    def add(self, replica: int, blocks) -> None:
        lru, cap = self.lrus[replica], self.capacity[replica]
        for b in blocks:
            if b in lru:
                lru.move_to_end(b)
                continue
            if len(lru) >= cap:
                old, _ = lru.popitem(last=False)
                holders = self.pods.get(old)
                if holders is not None:  # makeEvictionFn
                    holders.discard(replica)
                    if not holders:
                        del self.pods[old]
            lru[b] = True
        for b in blocks:
            self.pods.setdefault(b, set()).add(replica)

    def match(self, blocks) -> list[int]:
        m = [0] * len(self.lrus)
        for b in blocks:
            holding = self.pods.get(b)
            if not holding:
                break
            for r in holding:
                m[r] += 1
        return m


def _blocks(request) -> list[int]:
    return [int(b) for b in list(request.blocks)[: int(request.num_blocks)]]


class LlmdReference:
    """llm-d's default picker: S = 2q + 2k + 3p over clamped terms, largest wins."""

    def __init__(self, capacity, weights=(2.0, 2.0, 3.0), dtype=np.float64):
        self.index = PrefixIndexReference(capacity)
        self.weights = [dtype(w) for w in weights]
        self.dtype = dtype

    def terms(self, snapshot, matched, num_blocks):
        """Per replica (q, k, p) in self.dtype, clamped to [0, 1]."""
        f = self.dtype
        cand = _present(snapshot)
        w = [int(x) for x in snapshot.waiting]
        w_min = min(w[r] for r in cand) if cand else 0
        w_max = max(w[r] for r in cand) if cand else 0
        out = []
        for r in range(len(w)):
            q = f(1) if w_max == w_min else f(w_max - w[r]) / f(w_max - w_min)
            usable = int(snapshot.kv_usable[r])
            kv = f(int(snapshot.kv_used[r])) / f(usable) if usable > 0 else f(0)
            k = f(1) - kv
            p = f(matched[r]) / f(num_blocks) if num_blocks > 0 else f(0)
            out.append(tuple(min(max(x, f(0)), f(1)) for x in (q, k, p)))
        return out

    def scores(self, snapshot, matched, num_blocks):
        """Per replica S in Go's order: 0 + q w_q, + k w_k, + p w_p."""
        out = []
        for q, k, p in self.terms(snapshot, matched, num_blocks):
            s = self.dtype(0)
            for term, weight in zip((q, k, p), self.weights):
                s = s + term * weight
            out.append(s)
        return out

    def pick(self, snapshot, request, draws=None) -> int:
        blocks = _blocks(request)
        s = self.scores(snapshot, self.index.match(blocks), len(blocks))
        cand = _present(snapshot)
        if not cand:
            return -1
        best = max(s[r] for r in cand)
        return tie_break([r for r in cand if s[r] == best], draws)

    def routed(self, replica, request) -> None:
        self.index.add(int(replica), _blocks(request))


class DynamoReference:
    """Dynamo's cost max(0, P + prompt blocks - overlap) + D, lowest wins."""

    def costs(self, snapshot, request) -> list[int]:
        e = int(request.engine_blocks)
        return [max(0, int(p) + e - int(o)) + int(d)
                for p, o, d in zip(snapshot.prefill_blocks, snapshot.overlap, snapshot.decode_blocks)]

    def pick(self, snapshot, request, draws=None) -> int:
        cost, cand = self.costs(snapshot, request), _present(snapshot)
        if not cand:
            return -1
        best = min(cost[r] for r in cand)
        return tie_break([r for r in cand if cost[r] == best], draws)

    def routed(self, replica, request) -> None:
        pass


class RoundRobinReference:
    """BLIS's RoundRobin over the present replicas: candidates[counter % n], counter += 1."""

    def __init__(self):
        self.counter = 0

    def pick(self, snapshot, request, draws=None) -> int:
        cand = _present(snapshot)
        if not cand:
            return -1
        replica = cand[self.counter % len(cand)]
        self.counter += 1
        return replica

    def routed(self, replica, request) -> None:
        pass


class LeastLoadedReference:
    """Fewest requests in flight."""

    def pick(self, snapshot, request, draws=None) -> int:
        cand = _present(snapshot)
        if not cand:
            return -1
        best = min(int(snapshot.in_flight[r]) for r in cand)
        return tie_break([r for r in cand if int(snapshot.in_flight[r]) == best], draws)

    def routed(self, replica, request) -> None:
        pass


def reference(name: str, capacity=(), dtype=np.float32):
    """A fresh reference of the registered picker `name` (capacity: llm-d's per replica)."""
    from vtc_jax.pickers import registry

    cls = registry.get(name).reference
    if cls == "LlmdReference":
        return LlmdReference(capacity, dtype=dtype)
    return globals()[cls]()
