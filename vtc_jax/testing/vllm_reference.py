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

from collections.abc import Callable

from vtc_jax.core.errors import InputError
from vtc_jax.testing.vllm_reference_parts import (  # noqa: F401  (re-exported: the reference's public names)
    ORDERS,
    FcfsOrder,
    PriorityOrder,
    RequestState,
    ServerConfig,
    TraceRequest,
    WaitingOrder,
    _BlockPool,
)

POLICIES = ("fcfs", "priority")
VICTIMS = ("newest", "policy")
PREEMPTED_TO = ("front", "policy")
# Defaults are vLLM's own behaviour for each policy: fcfs evicts the newest admitted
# request and puts it at the front; priority evicts and re-queues by (priority, arrival).
_VLLM_VICTIM = {"fcfs": "newest", "priority": "policy"}
_VLLM_PREEMPTED_TO = {"fcfs": "front", "priority": "policy"}
CONFIG_KEYS = ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs",
               "chunked_prefill", "policy", "prefix_caching", "long_prefill_threshold",
               "victim", "preempted_to", "max_steps", "async_scheduling")
_METADATA_KEYS = ("vllm_version", "effective")  # recorded by the harness, not settings
_DEFAULTS = {"block_size": 16, "chunked_prefill": True, "policy": "fcfs", "prefix_caching": False,
             "long_prefill_threshold": 0, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
             "max_steps": 1_000_000, "async_scheduling": False}
TRACE_COLUMNS = ("arrival", "client", "prompt", "output")
TRACE_OPTIONAL = ("priority", "prefix_id", "prefix_len", "cached")



# ----------------------------------------------------------------------------------------
# The server.


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Server:
    """One vLLM V1 server: `step(t)` is one `schedule()` + `update_from_output()` call.

    Async scheduling (vLLM's AsyncScheduler under EngineCore.step_with_batch_queue, two
    batches in flight): `update_from_output` of a step runs after the NEXT step's
    `schedule()`. A sampled token is known to the scheduler as an output placeholder at
    once, so the counts below (`generated`) already hold it and the next step decodes on
    it; what waits for the update is the stop: a request that sampled its last token
    stays in the running list through the next schedule call (skipped: vLLM does not
    schedule a request known to reach max_tokens; it still holds its blocks and its seat,
    and counts as running), and finishes, freeing its blocks, in the update that follows
    it (`in_flight`). The step's record lists what that update finished."""

    def __init__(self, cfg: ServerConfig, reqs: list[RequestState], waiting: WaitingOrder):
        self.cfg = cfg
        self.reqs = reqs
        self.pool = _BlockPool(cfg.num_blocks)
        self.waiting = waiting
        self.running: list[RequestState] = []
        self.in_flight: list[RequestState] = []  # async: sampled their last token in the last step, not yet stopped
        self.placeholders: set[int] = set()  # async: rows that sampled in the last step (their update has not run)

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

    def _hash_full_blocks(self, req: RequestState, upto: int, final: bool = False) -> None:
        """Blocks are hashed when allocated, for the `upto` tokens computed by the end of
        this step, so a request admitted later in the same step can hit them; only tokens
        the scheduler knows are final count (kv_cache_manager.py: at most
        `request.num_tokens`), which under async scheduling leaves out a token sampled in
        the last step (its update has not run: `placeholders`) unless `final`."""
        if not self.cfg.prefix_caching:
            return
        known = req.num_tokens - (not final and req.row in self.placeholders)
        full = min(upto, known) // self.cfg.block_size
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
            if req.generated == req.spec.output:
                # Async only (sync requests leave when they stop): its last token is in flight;
                # vLLM does not schedule it again (scheduler.py: num_output_placeholders > 0
                # and computed + 2 - placeholders >= prompt + max_tokens), nor counts it here.
                i += 1
                continue
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
        self._cache_updated()
        stopped, sampled = [], set()
        for row, n in sched.items():  # vLLM's update_from_output order
            req = self.reqs[row]
            req.computed += n
            if req.computed < req.num_tokens:
                continue  # mid-prefill: no token
            sampled.add(row)
            req.generated += 1
            req.token_times.append(stamp)
            if req.first_token_step is None:
                req.first_token_step = t
            if req.generated == req.spec.output:
                req.finish_step = t
                stopped.append(req)
        finished = self._stop(stopped)
        if self.cfg.async_scheduling:
            self.placeholders = sampled
        return {"step": t, "sched": {str(row): n for row, n in sched.items()},
                "preempted": sorted(r.row for r in preempted),
                "finished": sorted(r.row for r in finished)}, end

    def _cache_updated(self) -> None:
        """Async: the last step's update, which runs after this step's schedule, hashes the
        blocks each request that sampled in the last step had computed by then, if it is
        still running (scheduler.py update_from_output: cache_blocks for a RUNNING request
        with output placeholders); a request this schedule preempted loses them unhashed.
        (Sync: schedule-time hashing already covered them.)"""
        for req in self.running:
            if req.row in self.placeholders:
                self._hash_full_blocks(req, req.computed, final=True)

    def _stop(self, stopped: list[RequestState]) -> list[RequestState]:
        """The requests this step's update stops, in the order their step scheduled them:
        those that sampled their last token now (sync), or in the step before (async: the
        update runs one schedule call late). Each frees its blocks, last block first, and
        leaves the running list, or, a victim preempted while its last token was in
        flight (its blocks already freed), the waiting queue."""
        if self.cfg.async_scheduling:
            stopped, self.in_flight = self.in_flight, stopped
        for req in stopped:
            self.pool.release(reversed(req.blocks))
            req.blocks = []
            if req in self.running:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
        return stopped

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
    for key in ("chunked_prefill", "prefix_caching", "async_scheduling"):
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
