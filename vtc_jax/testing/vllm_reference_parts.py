"""The parts of the literal vLLM V1 reference (vtc_jax/testing/vllm_reference.py, which
re-exports every public name here): the trace and config types, a request's state, the
waiting queue's pluggable orders (vLLM's RequestQueue) and the block pool (vLLM's BlockPool
for one full-attention group). Plain Python, integers only."""

from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
from collections.abc import Iterable

@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request: `arrival` (scheduler step it joins the waiting queue, int >= 0), `client`
    (str; the scheduler does not see it), `prompt` P and `output` O (ints >= 1; exactly O
    tokens are sampled), `priority` (int, lower first), `prefix_id` (str or None) and
    `prefix_len` (int in [0, P]: requests with the same prefix_id share their first
    prefix_len prompt tokens; every other token is distinct)."""

    arrival: int
    client: str
    prompt: int
    output: int
    priority: int = 0
    prefix_id: str | None = None
    prefix_len: int = 0


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """The checked settings (see docs/VLLM.md for each): all ints are exact Python ints."""

    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    chunked_prefill: bool
    policy: str
    prefix_caching: bool
    long_prefill_threshold: int
    victim: str
    preempted_to: str
    max_steps: int
    async_scheduling: bool = False


class RequestState:
    """A request's mutable state, what a WaitingOrder sees: `row`, `spec` (its
    TraceRequest), `computed` tokens c (KV written), `generated` tokens g, `preemptions`;
    `blocks` (physical block ids it holds, in position order) and `hashed` (how many of
    its leading blocks carry a prefix-cache hash) belong to the KV manager."""

    __slots__ = (
        "blocks",
        "token_times",
        "computed",
        "finish_step",
        "first_token_step",
        "generated",
        "hashed",
        "preemptions",
        "row",
        "spec",
    )

    def __init__(self, row: int, spec: TraceRequest):
        self.row, self.spec = row, spec
        self.computed = self.generated = self.hashed = self.preemptions = 0
        self.blocks: list[int] = []
        self.token_times: list[int] = []  # each sampled token's time (the step, or timed: its end)
        self.first_token_step = self.finish_step = None

    @property
    def num_tokens(self) -> int:
        """Tokens known so far, P + g: what the request owes KV for, minus `computed`."""
        return self.spec.prompt + self.generated

    def order_key(self) -> tuple[int, int]:
        """(arrival, row): vLLM's arrival_time order (trace order within a step)."""
        return self.spec.arrival, self.row


# ----------------------------------------------------------------------------------------
# The waiting queue's order (vLLM's RequestQueue), pluggable.


class WaitingOrder:
    """Which waiting request is the head. `add` takes an arrival; `push_front` puts a
    request ahead of every waiting one (vLLM fcfs's place for a preempted request);
    `requeue` puts a preempted request at the order's own place for it; `victim` is the
    order's choice of a running request to preempt (used with `victim="policy"`); `remove`
    takes a request out wherever it is (async scheduling only: a victim whose last token was
    in flight finishes from the queue)."""

    def add(self, req: RequestState) -> None:
        raise NotImplementedError

    def push_front(self, req: RequestState) -> None:
        raise NotImplementedError

    def requeue(self, req: RequestState) -> None:
        raise NotImplementedError

    def peek(self) -> RequestState:
        raise NotImplementedError

    def pop(self) -> RequestState:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def victim(self, running: list[RequestState]) -> RequestState:
        raise NotImplementedError

    def remove(self, req: RequestState) -> None:
        raise NotImplementedError


class FcfsOrder(WaitingOrder):
    """vLLM's fcfs: a FIFO by arrival; its own place for a preempted request is its
    arrival place, its own victim the latest arrival."""

    def __init__(self):
        self._queue: collections.deque[RequestState] = collections.deque()

    def add(self, req):
        self._queue.append(req)

    def push_front(self, req):
        self._queue.appendleft(req)

    def requeue(self, req):
        keys = [r.order_key() for r in self._queue]
        self._queue.insert(bisect.bisect_left(keys, req.order_key()), req)

    def peek(self):
        return self._queue[0]

    def pop(self):
        return self._queue.popleft()

    def __len__(self):
        return len(self._queue)

    def victim(self, running):
        return max(running, key=RequestState.order_key)

    def remove(self, req):
        self._queue.remove(req)


class PriorityOrder(WaitingOrder):
    """vLLM's priority: a heap by (priority, arrival, row), lower first; requests pushed to
    the front (only with `preempted_to="front"`) come before the heap, newest first."""

    def __init__(self):
        self._heap: list[tuple[int, int, int, RequestState]] = []
        self._front: collections.deque[RequestState] = collections.deque()

    @staticmethod
    def key(req: RequestState) -> tuple[int, int, int]:
        return req.spec.priority, req.spec.arrival, req.row

    def add(self, req):
        heapq.heappush(self._heap, (*self.key(req), req))

    requeue = add  # vLLM's heap `prepend_request` is a plain push

    def push_front(self, req):
        self._front.appendleft(req)

    def peek(self):
        return self._front[0] if self._front else self._heap[0][-1]

    def pop(self):
        return self._front.popleft() if self._front else heapq.heappop(self._heap)[-1]

    def __len__(self):
        return len(self._front) + len(self._heap)

    def victim(self, running):
        # max() keeps the first of equal keys, as vLLM's does; keys are unique here anyway.
        return max(running, key=self.key)

    def remove(self, req):
        if req in self._front:
            self._front.remove(req)
        else:
            self._heap = [entry for entry in self._heap if entry[-1] is not req]
            heapq.heapify(self._heap)


ORDERS = {"fcfs": FcfsOrder, "priority": PriorityOrder}


# ----------------------------------------------------------------------------------------
# KV blocks (vLLM's BlockPool for one full-attention group).


class _BlockPool:
    """Blocks 1..N-1 (block 0 is the null block, never handed out). A free block is either
    unhashed (reused first) or keeps its prefix-cache hash in an LRU queue until reused;
    `cached` maps a hash to its blocks in insertion order (a lookup returns the first)."""

    def __init__(self, num_blocks: int):
        self.ref = [0] * num_blocks
        self.hash_of: list[tuple | None] = [None] * num_blocks
        self.free_unhashed = list(range(num_blocks - 1, 0, -1))  # which one is irrelevant
        self.free_hashed: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.cached: dict[tuple, dict[int, None]] = {}

    def num_free(self) -> int:
        return len(self.free_unhashed) + len(self.free_hashed)

    def take(self, n: int) -> list[int]:
        """n new blocks: unhashed first, then the least recently freed hashed ones, whose
        hash is dropped (evicted). The caller checked `n <= num_free()`."""
        out = []
        for _ in range(n):
            if self.free_unhashed:
                block = self.free_unhashed.pop()
            else:
                block, _ = self.free_hashed.popitem(last=False)
                self._evict(block)
            self.ref[block] = 1
            out.append(block)
        return out

    def _evict(self, block: int) -> None:
        key = self.hash_of[block]
        holders = self.cached[key]
        del holders[block]
        if not holders:
            del self.cached[key]
        self.hash_of[block] = None

    def touch(self, blocks: Iterable[int]) -> None:
        """Prefix hits: a free hit block leaves the free queue; every hit gains a holder."""
        for block in blocks:
            if self.ref[block] == 0:
                del self.free_hashed[block]
            self.ref[block] += 1

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one holder of each block, in the given order (eviction order among them)."""
        for block in blocks:
            self.ref[block] -= 1
            if self.ref[block] == 0:
                if self.hash_of[block] is None:
                    self.free_unhashed.append(block)
                else:
                    self.free_hashed[block] = None

    def cache(self, block: int, key: tuple) -> None:
        self.hash_of[block] = key
        self.cached.setdefault(key, {})[block] = None

    def lookup(self, key: tuple) -> int | None:
        holders = self.cached.get(key)
        return next(iter(holders)) if holders else None
