"""A slow, literal, pure-Python reference of one vLLM V1 server's scheduler, step by step.

It follows vLLM 0.33.0's `Scheduler.schedule` / `update_from_output`, its KV cache manager
and block pool, as stated in docs/VLLM.md, and reproduces the real scheduler's golden
schedules in tests/data/vllm_golden/ to the token. Integers only; no jax, no numpy: this is
what a fast implementation is checked against, not a fast implementation.

Inputs: a list of `TraceRequest` (row = index in the list) and a config dict with the
goldens' keys (`CONFIG_KEYS`). Output (`simulate`): the goldens' schedule layout,
`{"steps": [{"step", "sched": {row: tokens}, "preempted": [rows], "finished": [rows]}],
"requests": {row: {"first_token_step", "finish_step", "preemptions"}}, "num_steps",
"total_preemptions", "stalled"}` with rows as strings where they are JSON object keys, so
a golden read with `json` compares equal as a dict; `token_times`: each output token's time
per row. Timed (`step_time`, the step-time model of servers/step_time.py as a function of a
step's prefill and decode tokens): the clock is in us and a token's time is its step's end.

The waiting queue's order is pluggable (`WaitingOrder`): vLLM's `fcfs` and `priority` are
two orders; a fairness policy is a third. Where the preemption victim and the preempted
request's place come from is a named option (`victim`, `preempted_to`).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
from collections.abc import Callable, Iterable

from vtc_jax.core.errors import InputError

POLICIES = ("fcfs", "priority")
VICTIMS = ("newest", "policy")
PREEMPTED_TO = ("front", "policy")
# Defaults are vLLM's own behaviour for each policy: fcfs evicts the newest admitted
# request and puts it at the front; priority evicts and re-queues by (priority, arrival).
_VLLM_VICTIM = {"fcfs": "newest", "priority": "policy"}
_VLLM_PREEMPTED_TO = {"fcfs": "front", "priority": "policy"}
CONFIG_KEYS = ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs",
               "chunked_prefill", "policy", "prefix_caching", "long_prefill_threshold",
               "victim", "preempted_to", "max_steps")
_METADATA_KEYS = ("vllm_version", "effective")  # recorded by the harness, not settings
_DEFAULTS = {"block_size": 16, "chunked_prefill": True, "policy": "fcfs", "prefix_caching": False,
             "long_prefill_threshold": 0, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
             "max_steps": 1_000_000}
TRACE_COLUMNS = ("arrival", "client", "prompt", "output")
TRACE_OPTIONAL = ("priority", "prefix_id", "prefix_len", "cached")


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
    order's choice of a running request to preempt (used with `victim="policy"`)."""

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


# ----------------------------------------------------------------------------------------
# The server.


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Server:
    """One vLLM V1 server: `step(t)` is one `schedule()` + `update_from_output()` call."""

    def __init__(self, cfg: ServerConfig, reqs: list[RequestState], waiting: WaitingOrder):
        self.cfg = cfg
        self.reqs = reqs
        self.pool = _BlockPool(cfg.num_blocks)
        self.waiting = waiting
        self.running: list[RequestState] = []

    # -- prefix caching ------------------------------------------------------------------

    def _block_key(self, req: RequestState, j: int) -> tuple:
        """The hash of block j of `req`: a block wholly inside the shared prefix is the
        prefix's; any other holds tokens only this request has (distinct random ids)."""
        end = self.cfg.block_size * (j + 1)
        if req.spec.prefix_id is not None and end <= req.spec.prefix_len:
            return ("prefix", req.spec.prefix_id, j)
        return ("request", req.row, j)

    def _hits(self, req: RequestState) -> list[int]:
        """The cached blocks of the longest hit: whole blocks, at most P + g - 1 tokens."""
        if not self.cfg.prefix_caching:
            return []
        hits = []
        for j in range((req.num_tokens - 1) // self.cfg.block_size):
            block = self.pool.lookup(self._block_key(req, j))
            if block is None:
                break
            hits.append(block)
        return hits

    def _hash_full_blocks(self, req: RequestState, upto: int) -> None:
        """Blocks are hashed when allocated, for the `upto` tokens computed by the end of
        this step, so a request admitted later in the same step can hit them."""
        if not self.cfg.prefix_caching:
            return
        full = min(upto, req.num_tokens) // self.cfg.block_size
        for j in range(req.hashed, full):
            self.pool.cache(req.blocks[j], self._block_key(req, j))
        req.hashed = max(req.hashed, full)

    # -- allocation ------------------------------------------------------------------------

    def _grow(self, req: RequestState, n: int) -> bool:
        """allocate_slots for a running request scheduled for n tokens: its new blocks, or
        False when fewer are free."""
        need = _cdiv(req.computed + n, self.cfg.block_size) - len(req.blocks)
        if need > self.pool.num_free():
            return False
        req.blocks += self.pool.take(max(need, 0))
        self._hash_full_blocks(req, req.computed + n)
        return True

    def _admit(self, req: RequestState, hits: list[int], n: int) -> bool:
        """allocate_slots for a waiting request with prefix hits `hits` and a first chunk of
        n tokens: the whole P + g must fit in the free blocks now (scheduler_reserve_full_isl;
        a check, not a reservation), then the chunk's blocks are allocated. A free hit
        block counts as needed: it stops being free when touched."""
        bs, free = self.cfg.block_size, self.pool.num_free()
        evictable = sum(self.pool.ref[b] == 0 for b in hits)
        hit_tokens = len(hits) * bs
        whole = max(_cdiv(req.num_tokens, bs) - len(hits), 0) + evictable
        chunk = max(_cdiv(hit_tokens + n, bs) - len(hits), 0) + evictable
        if whole > free or chunk > free:
            return False
        self.pool.touch(hits)
        req.blocks = hits + self.pool.take(chunk - evictable)
        req.hashed = len(hits)
        req.computed = hit_tokens
        self._hash_full_blocks(req, hit_tokens + n)
        return True

    def _preempt(self, req: RequestState) -> None:
        """Recompute preemption: all blocks freed tail first (hashes kept), c = 0, g kept."""
        self.pool.release(reversed(req.blocks))
        req.blocks, req.hashed, req.computed = [], 0, 0
        req.preemptions += 1
        if self.cfg.preempted_to == "front":
            self.waiting.push_front(req)
        else:
            self.waiting.requeue(req)

    def _victim(self) -> RequestState:
        if self.cfg.victim == "newest":
            return self.running[-1]
        return self.waiting.victim(self.running)

    # -- one step --------------------------------------------------------------------------

    def _long_cap(self) -> int:
        """The long-prefill cap L, in force only when more than one request is running or
        waiting at the step's start."""
        busy = len(self.running) + len(self.waiting)
        return self.cfg.long_prefill_threshold if busy > 1 else 0

    def _running_phase(self, budget: int, cap: int, sched: dict[int, int]) -> tuple[int, list[RequestState]]:
        """Walk the running list in admission order; returns the budget left and the
        preempted requests. `sched` (row -> tokens) is filled in scheduling order."""
        preempted: list[RequestState] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = req.num_tokens - req.computed
            if 0 < cap < n:
                n = cap
            n = min(n, budget)
            scheduled = True
            while not self._grow(req, n):
                victim = self._victim()
                self.running.remove(victim)
                if victim.row in sched:  # already scheduled this step: give its tokens back
                    budget += sched.pop(victim.row)
                    i -= 1
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                # A request that preempted itself is out of the list and the walk goes on
                # with the next one (vLLM 0.33 scheduler.py: `continue`; golden m000 step 22
                # shows requests behind it still decoding). Under fcfs the victim is the
                # list's tail, so nothing follows it.
                continue
            sched[req.row] = n
            budget -= n
            i += 1
        return budget, preempted

    def _waiting_phase(self, budget: int, cap: int, sched: dict[int, int]) -> None:
        """Admit heads of the waiting queue while budget and seats last; the first head
        that fails a check ends the phase (no skipping)."""
        while len(self.waiting) and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting.peek()
            hits = self._hits(req)
            n = req.num_tokens - len(hits) * self.cfg.block_size
            if 0 < cap < n:
                n = cap
            if not self.cfg.chunked_prefill and n > budget:
                return
            n = min(n, budget)
            if not self._admit(req, hits, n):
                return
            self.waiting.pop()
            self.running.append(req)
            sched[req.row] = n
            budget -= n

    def step(self, t: int, step_time: Callable[[int, int], int] | None = None) -> tuple[dict, int]:
        """One scheduler step at clock t: schedule, compute, sample, finish. Returns (its
        record, the clock after it): t + 1, or timed, when anything runs or waits, t + its
        duration, step_time(prefill tokens, decode tokens) (a decode: a request that had
        generated and had computed all but its last token; anything else is prefill)."""
        cap = self._long_cap()
        sched: dict[int, int] = {}
        budget, preempted = self._running_phase(self.cfg.max_num_batched_tokens, cap, sched)
        if not preempted:
            self._waiting_phase(budget, cap, sched)
        decode = sum(n for row, n in sched.items()
                     if self.reqs[row].generated > 0 and self.reqs[row].computed == self.reqs[row].num_tokens - 1)
        timed = step_time is not None and bool(self.running or len(self.waiting))
        end = t + step_time(sum(sched.values()) - decode, decode) if timed else t + 1
        stamp = end if step_time is not None else t
        finished = []
        for row, n in sched.items():  # vLLM's update_from_output order
            req = self.reqs[row]
            req.computed += n
            if req.computed < req.num_tokens:
                continue  # mid-prefill: no token
            req.generated += 1
            req.token_times.append(stamp)
            if req.first_token_step is None:
                req.first_token_step = t
            if req.generated == req.spec.output:
                req.finish_step = t
                self.pool.release(reversed(req.blocks))
                req.blocks = []
                finished.append(req)
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
        return {"step": t, "sched": {str(row): n for row, n in sched.items()},
                "preempted": sorted(r.row for r in preempted),
                "finished": sorted(r.row for r in finished)}, end

    def idle(self) -> bool:
        return not self.running and not len(self.waiting)


# ----------------------------------------------------------------------------------------
# Checking inputs and running.


def check_config(config: dict) -> ServerConfig:
    """The config dict (the goldens' keys, `CONFIG_KEYS`; `vllm_version` and `effective`
    are ignored metadata) as a ServerConfig, or InputError naming the bad key."""
    if not isinstance(config, dict):
        raise InputError(f"config must be a JSON object, not {type(config).__name__}")
    unknown = [k for k in config if k not in CONFIG_KEYS and k not in _METADATA_KEYS]
    if unknown:
        raise InputError(f"config: unknown key {unknown[0]!r} (known: {', '.join(CONFIG_KEYS)})")
    if "num_blocks" not in config:
        raise InputError("config: missing key 'num_blocks'")
    values = {**_DEFAULTS, **{k: v for k, v in config.items() if k in CONFIG_KEYS}}
    for key, low in (("block_size", 1), ("num_blocks", 2), ("max_num_batched_tokens", 1),
                     ("max_num_seqs", 1), ("long_prefill_threshold", 0), ("max_steps", 1)):
        value = values[key]
        if type(value) is not int or value < low:
            raise InputError(f"config: {key} must be an integer >= {low}, got {value!r}")
    for key in ("chunked_prefill", "prefix_caching"):
        if type(values[key]) is not bool:
            raise InputError(f"config: {key} must be true or false, got {values[key]!r}")
    if values["policy"] not in POLICIES:
        raise InputError(f"config: policy must be one of {', '.join(POLICIES)}, got {values['policy']!r}")
    values.setdefault("victim", _VLLM_VICTIM[values["policy"]])
    values.setdefault("preempted_to", _VLLM_PREEMPTED_TO[values["policy"]])
    for key, allowed in (("victim", VICTIMS), ("preempted_to", PREEMPTED_TO)):
        if values[key] not in allowed:
            raise InputError(f"config: {key} must be one of {', '.join(allowed)}, got {values[key]!r}")
    if values["max_num_batched_tokens"] < values["max_num_seqs"]:
        raise InputError(f"config: max_num_batched_tokens ({values['max_num_batched_tokens']}) is below "
                         f"max_num_seqs ({values['max_num_seqs']}), which vLLM refuses")
    return ServerConfig(**values)


def check_requests(requests: list[TraceRequest], cfg: ServerConfig) -> None:
    """InputError for a malformed request, or one that can never be served: its peak
    ceil((P + O - 1) / B) blocks over the N - 1 usable ones, or (chunking off) a budget
    below vLLM's max_model_len (the longest P + O rounded up to a block)."""
    if not requests:
        raise InputError("no requests")
    for row, r in enumerate(requests):
        if not isinstance(r, TraceRequest):
            raise InputError(f"request {row}: not a TraceRequest")
        for name in ("arrival", "prompt", "output", "priority", "prefix_len"):
            if type(getattr(r, name)) is not int:
                raise InputError(f"request {row}: {name} must be an integer, got {getattr(r, name)!r}")
        if r.arrival < 0 or r.prompt < 1 or r.output < 1:
            raise InputError(f"request {row}: needs arrival >= 0, prompt >= 1, output >= 1")
        if not 0 <= r.prefix_len <= r.prompt:
            raise InputError(f"request {row}: prefix_len {r.prefix_len} is not in [0, prompt {r.prompt}]")
        peak = _cdiv(r.prompt + r.output - 1, cfg.block_size)
        if peak > cfg.num_blocks - 1:
            raise InputError(f"request {row}: needs {peak} KV blocks at its peak, more than the "
                             f"{cfg.num_blocks - 1} usable (num_blocks - 1): it could never finish")
    if not cfg.chunked_prefill:
        longest = _cdiv(max(r.prompt + r.output for r in requests), cfg.block_size) * cfg.block_size
        if cfg.max_num_batched_tokens < longest:
            raise InputError(f"with chunked_prefill off vLLM needs max_num_batched_tokens >= max_model_len "
                             f"({longest}), got {cfg.max_num_batched_tokens}")


def simulate(requests: list[TraceRequest], config: dict, order: Callable[[], WaitingOrder] | None = None,
             step_time: Callable[[int, int], int] | None = None) -> dict:
    """The schedule of `requests` (row = list index) on one vLLM V1 server (`config`), in
    the goldens' layout (module docstring). The clock is +1 per step (timed: `step_time`,
    `_Server.step`) and jumps an idle gap to the next arrival (after one empty step if a
    request finished in the last one); same-step arrivals join in row order. `order`
    makes the waiting queue (default: the config policy's, `ORDERS`)."""
    steps, reqs = _run(requests, config, order, step_time)
    return {"steps": steps,
            "requests": {str(r.row): {"first_token_step": r.first_token_step, "finish_step": r.finish_step,
                                      "preemptions": r.preemptions} for r in reqs},
            "num_steps": len(steps), "total_preemptions": sum(r.preemptions for r in reqs),
            "stalled": False}


def token_times(requests: list[TraceRequest], config: dict, order: Callable[[], WaitingOrder] | None = None,
                step_time: Callable[[int, int], int] | None = None) -> list[list[int]]:
    """Per row, the time of each output token in order (`simulate`'s run): the step that
    sampled it, or timed its end (us). A recompute after a preemption keeps the tokens it
    had, so a gap across a preemption holds the stall, as a streaming client sees it."""
    return [r.token_times for r in _run(requests, config, order, step_time)[1]]


def linear_step_time(b0: int, b1: int, b2: int, scale: int) -> Callable[[int, int], int]:
    """servers/step_time.py's model in its scaled integers: max(1, (b0 + b1 p + b2 d) // scale) us."""
    return lambda prefill, decode: max(1, (b0 + b1 * prefill + b2 * decode) // scale)


def _run(requests, config, order, step_time) -> tuple[list[dict], list[RequestState]]:
    cfg = check_config(config)
    check_requests(requests, cfg)
    reqs = [RequestState(row, spec) for row, spec in enumerate(requests)]
    arrivals = sorted(reqs, key=RequestState.order_key)
    server = _Server(cfg, reqs, (order or ORDERS[cfg.policy])())
    steps: list[dict] = []
    t = nxt = done = 0
    just_finished = False
    while done < len(reqs):
        # Idle: the clock jumps to the next arrival, but not right after a step in which a
        # request finished: vLLM's `has_requests()` still counts finished requests not yet
        # reported, so one empty schedule call (a step) comes first (golden m033 step 5).
        if server.idle() and not just_finished:
            t = max(t, arrivals[nxt].spec.arrival)
        while nxt < len(arrivals) and arrivals[nxt].spec.arrival <= t:
            server.waiting.add(arrivals[nxt])
            nxt += 1
        if len(steps) == cfg.max_steps:
            raise InputError(f"the run did not finish within max_steps = {cfg.max_steps} steps")
        record, t = server.step(t, step_time)
        steps.append(record)
        done += len(record["finished"])
        just_finished = bool(record["finished"])
    return steps, reqs
