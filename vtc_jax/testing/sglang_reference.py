"""A slow, literal, pure-Python reference of one SGLang server's scheduler, step by step.

It follows SGLang 0.5.23's non-overlap event loop (`event_loop_normal`, i.e.
`--disable-overlap-schedule`) at page size 1, as the project's contract ENGINE_SGLANG.md
states it (checked against sglang 0.5.23's own source where the contract is terse), and
reproduces the real scheduler's golden schedules in tests/data/sglang_golden/ to the token
(the same kv_free / kv_evictable and new-token ratio at every listed iteration). It is what a
fast implementation is checked against, not a fast implementation: no jax, no numpy.

What is modelled, each as SGLang's code does it (`S:` = python/sglang/srt/ of sglang 0.5.23):
- `get_next_batch_to_run` (S:managers/scheduler.py): stash the chunked request
  (`checkpoint_kv_cache`), filter the last extend batch and merge it into the running batch
  (an empty running batch is *replaced* by it, flag included), filter finished requests;
  prefill first, decode only when no prefill batch is built.
- `_get_new_batch_prefill_raw` and `PrefillAdder` (S:managers/schedule_policy.py,
  S:mem_cache/prefill_budget.py): the sticky `batch_is_full`, the row budget, the waiting
  order, the chunked request continued first, `add_one_req` (strict `total < remaining_total`
  under a temporary lock of the candidate's matched prefix), truncation into the one chunked
  request, the float budgets with the new-token ratio.
- `update_running_batch` / `retract_decode` (S:managers/schedule_batch.py): the decode
  memory check (evicting the shortfall), the ratio decay, retraction (victim order, release
  without insertion, the shortfall eviction of remaining*20 tokens, the batch left in sorted
  order, the re-estimated ratio, the tail requeue).
- The radix cache (S:mem_cache/radix_cache.py) over real token sequences: match with node
  splits, insert, lock_ref, evictable/protected sizes, LRU leaf eviction. `time.monotonic()`
  is a counter that ticks at every read, in the order SGLang reads it.
- Result processing as the golden harness condenses it (one token id 1 per sampled token,
  never EOS, so requests finish by length), and the idle reset of the ratio.

Token sequences are built as the golden harness does: a request's prompt is unique tokens
except its first `prefix_len`, shared by every request of the same `prefix_id`; outputs are
token id 1. A request may instead carry its own prompt tokens (`tokens`). The config and
request types and the radix tree live in sglang_reference_parts.py.

Rules the contract leaves implicit that the goldens confirm (a rule changed breaks them):
same-iteration arrivals join in rid-string order (the harness's); an empty running batch is
replaced by the last prefill batch, so a sticky batch_is_full set while it was empty is
lost; a checkpoint frees the request's own copy of tokens another request already cached;
retraction evicts only the shortfall below remaining*20 free slots and leaves the batch in
its sorted order; check_decode_mem evicts the shortfall even when it passes; a finished
request caches prompt + outputs minus its last token; under fcfs every 32nd prefill pass
re-touches the waiting requests' cached prefixes (SGLANG_ENABLE_WAITING_PREFIX_REFRESH),
which moves LRU eviction.

The waiting queue's order is one function (`ORDERS`: `fcfs`, `lpm`): it takes the queue and
the scheduler and returns the new order and whether the pass matched prefixes (a
cache-aware pass); a fairness policy is a third such function (`simulate(..., order=...)`).

Unsupported (ValueError naming the option): the overlap loop, mixed chunk, priority
scheduling, retraction policy `priority`, page size > 1, the radix cache disabled, policies
other than fcfs and lpm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vtc_jax.testing.sglang_reference_parts import (  # noqa: F401  (re-exported: the reference's public names)
    CONTINUE,
    NO_TOKEN,
    OTHER,
    OUTPUT_TOKEN,
    POLICIES,
    RadixTree,
    SglangConfig,
    SglangRequest,
    _Node,
    _prompt_tokens,
    check_requests,
)

# ----------------------------------------------------------------------------------------
# Requests and batches.


@dataclass(eq=False)
class _Req:
    row: int
    rid: str
    arrival: int
    prompt: tuple
    max_new_tokens: int
    n_out: int = 0
    prefix_len: int = 0
    extend_end: int | None = None
    last_node: _Node | None = None
    lock: _Node | None = None
    cache_protected_len: int = 0
    kv_allocated: int = 0  # KV slots in its row (== kv_committed_len at page 1, no speculation)
    holds_row: bool = False
    inflight_middle_chunks: int = 0
    num_matched_prefix_tokens: int = 0
    is_retracted: bool = False
    finished: bool = False
    aborted: bool = False
    first_token_step: int | None = None
    finish_step: int | None = None
    retractions: int = 0

    @property
    def fill(self) -> tuple:
        """full_untruncated_fill_ids: prompt + output ids."""
        return self.prompt + (OUTPUT_TOKEN,) * self.n_out

    @property
    def fill_len(self) -> int:
        return len(self.prompt) + self.n_out


@dataclass(eq=False)
class _Batch:
    reqs: list
    extend: bool = False
    batch_is_full: bool = False
    chunked_req: _Req | None = None

    def filter(self, exclude=(), keep: list[int] | None = None) -> None:
        """filter_batch: drop finished and excluded requests, or keep `keep` in its order."""
        if keep is None:
            keep = [i for i, r in enumerate(self.reqs) if not r.finished and r not in exclude]
        if not keep:
            self.reqs = []
            return
        if len(keep) == len(self.reqs):
            return
        self.reqs = [self.reqs[i] for i in keep]


# ----------------------------------------------------------------------------------------
# Waiting-queue orders (SchedulePolicy.calc_priority). Each takes the waiting queue and the
# scheduler and returns (the new order, whether this pass was cache-aware).

WaitingOrderFn = Callable[[list, "_Scheduler"], tuple[list, bool]]


def fcfs_order(queue: list, sim: _Scheduler) -> tuple[list, bool]:
    """fcfs: the queue as it stands (arrivals and retracted requests appended at the tail)."""
    return list(queue), False


def lpm_order(queue: list, sim: _Scheduler) -> tuple[list, bool]:
    """lpm: longest cached prefix first (stable), the in-batch deprioritized requests last;
    an fcfs pass when more than WAITING_QUEUE_PREFIX_MATCH_MAX requests wait."""
    cfg = sim.cfg
    if len(queue) > cfg.waiting_queue_prefix_match_max:
        return list(queue), False
    deprioritized = set()
    scratch = RadixTree()  # waiting_queue_radix_tree, reset every pass
    for r in queue:
        fill = r.fill
        # match_kv_cache without a cap: prefix_len is the uncapped match.
        r.prefix_len, r.last_node = sim.tree.match(fill)
        r.num_matched_prefix_tokens = min(r.prefix_len, max(len(fill) - 1, 0))
        if r.prefix_len <= cfg.in_batch_prefix_check_threshold:
            in_batch, _ = scratch.match(fill)
            if in_batch >= cfg.in_batch_prefix_deprioritize_threshold:
                deprioritized.add(r)
            else:
                scratch.insert(fill)
    order = sorted(queue, key=lambda r: float("inf") if r in deprioritized else -r.num_matched_prefix_tokens)
    return order, True


ORDERS: dict[str, WaitingOrderFn] = {"fcfs": fcfs_order, "lpm": lpm_order}


# ----------------------------------------------------------------------------------------
# PrefillAdder (schedule_policy.py) with PrefillBudget (prefill_budget.py).


class _Adder:
    def __init__(self, sim: _Scheduler, running: _Batch):
        self.sim = sim
        cfg = sim.cfg
        self.clip = cfg.clip_max_new_tokens
        self.rem_input_tokens = cfg.max_prefill_tokens
        self.rem_chunk_tokens = cfg.chunk_size
        self.total_offset = 0
        self.current_offset = 0
        ratio = sim.ratio
        self.total_offset += sum([min(r.max_new_tokens - r.n_out, self.clip) * ratio for r in running.reqs])
        self.can_run_list: list[_Req] = []
        self.new_chunked_req: _Req | None = None

    def _available_and_evictable(self) -> int:
        return self.sim.kv_free + self.sim.tree.evictable_size

    @property
    def remaining_total(self):
        return self._available_and_evictable() - self.total_offset

    @property
    def remaining_current(self):
        return self._available_and_evictable() - self.current_offset

    def budget_state(self) -> str:
        if not (self.remaining_total > 0 and self.remaining_current > 0):
            return NO_TOKEN
        if self.rem_input_tokens <= 0:
            return OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return OTHER
        return CONTINUE

    def _update_prefill_budget(self, extend_len: int, max_new_tokens: int) -> None:
        immediate = extend_len + 1  # ceil_paged(extend) + page_size (+ 0 extra at page 1)
        self.total_offset += immediate + max_new_tokens
        self.current_offset += immediate
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len

    def add_chunked_req(self, req: _Req) -> _Req | None:
        rem = min(self.rem_chunk_tokens, int(self.remaining_total))
        if rem <= 0:  # a single-pool continuation must make progress to release its KV
            rem = self.rem_chunk_tokens
        cand = req.fill_len - req.prefix_len
        truncated = cand > rem
        new_len = min(cand, rem)
        req.extend_end = req.prefix_len + new_len
        self.can_run_list.append(req)
        self._update_prefill_budget(new_len, min(req.max_new_tokens, self.clip) if not truncated else 0)
        return req if truncated else None

    def add_one_req(self, req: _Req) -> str:
        tree = self.sim.tree
        max_new = min(max(req.max_new_tokens - req.n_out, 0), self.clip)
        cand = req.fill_len - req.prefix_len
        total_tokens = cand + max_new + 1
        tree.inc_lock_ref(req.last_node)  # the temporary pin: its prefix is not evictable now
        try:
            prefix_len = req.prefix_len
            extend_len = req.fill_len - prefix_len
            if not total_tokens < self.remaining_total:
                return NO_TOKEN
            if self.rem_chunk_tokens is None and self.can_run_list and extend_len >= self.rem_input_tokens:
                return OTHER
            is_chunked = False
            max_new_tokens = min(req.max_new_tokens, self.clip)
            if self.rem_chunk_tokens is not None and extend_len > self.rem_chunk_tokens:
                extend_len = self.rem_chunk_tokens
                if extend_len <= 0:
                    return OTHER
                is_chunked = True
                max_new_tokens = 0
            req.extend_end = prefix_len + extend_len
            req.lock = req.last_node
            tree.inc_lock_ref(req.lock)
            self.can_run_list.append(req)
            if is_chunked:
                self.new_chunked_req = req
            self._update_prefill_budget(extend_len, max_new_tokens)
        finally:
            tree.dec_lock_ref(req.last_node)
        return self.budget_state()


# ----------------------------------------------------------------------------------------
# The scheduler.


@dataclass
class SglangRun:
    """`steps`: every iteration that ran a batch or retracted, in the goldens' layout with
    rows for rids: {step, kind, scheduled [(row, tokens, kind, prefix_len or None)],
    retracted, finished, new_token_ratio (unrounded double), kv_free, kv_evictable}.
    `requests[row]`: first_token_step, finish_step, retractions. `iterations`: the loop's
    iteration count; `stalled`: some request never finished (max_steps ran out, or nothing
    could run and nothing was left to arrive)."""

    steps: list[dict]
    requests: list[dict]
    iterations: int
    stalled: bool
    aborted: list[int] = field(default_factory=list)


class _Scheduler:
    def __init__(self, cfg: SglangConfig, requests: Sequence[SglangRequest], order: WaitingOrderFn | None):
        self.cfg = cfg
        self.order = order or ORDERS[cfg.policy]
        self.tree = RadixTree()
        self.kv_free = cfg.kv_tokens
        self.rows_free = cfg.rows
        self.ratio_init, self.ratio_min, self.ratio_decay = cfg.ratio_constants()
        self.ratio = self.ratio_init
        self.waiting: list[_Req] = []
        self.running = _Batch([])
        self.last_batch: _Batch | None = None
        self.chunked_req: _Req | None = None
        self.refresh_calls = 0
        self.step = 0
        self.aborted: list[int] = []
        self.reqs = [_Req(row=i, rid=r.rid or f"r{i}", arrival=r.arrival, prompt=_prompt_tokens(r, i),
                          max_new_tokens=r.output) for i, r in enumerate(requests)]

    # -- KV slots --------------------------------------------------------------------------

    def _evict_to_free(self, num_tokens: int) -> None:
        """evict_to_free_tokens: evict only the shortfall below `num_tokens` free slots."""
        shortfall = num_tokens - self.kv_free
        if shortfall > 0:
            self.kv_free += self.tree.evict(shortfall)

    def _alloc(self, num_tokens: int) -> None:
        self._evict_to_free(num_tokens)
        if num_tokens > self.kv_free:
            raise RuntimeError(f"SGLang out of memory: allocating {num_tokens} KV slots with {self.kv_free} free "
                               f"and {self.tree.evictable_size} evictable (iteration {self.step})")
        self.kv_free -= num_tokens

    def _checkpoint(self, req: _Req, up_to: int) -> None:
        """RadixCache.checkpoint: insert fill[:up_to] (and the prompt, splitting the leaf at
        the prompt boundary), free the request's duplicates of what was already cached,
        re-match, and move the request's lock to the new last node."""
        tree = self.tree
        tokens = req.fill[:up_to]
        existing, _ = tree.insert(tokens)
        if 0 < len(req.prompt) < len(tokens):
            tree.insert(req.prompt)
        self.kv_free += max(existing - req.cache_protected_len, 0)
        matched, new_last = tree.match(tokens)
        assert matched == len(tokens), (matched, len(tokens))
        req.cache_protected_len = len(tokens)
        if req.lock is not None:
            tree.dec_lock_ref(req.lock)
        req.lock = new_last
        tree.inc_lock_ref(new_last)
        req.last_node = new_last

    def _checkpoint_kv_cache(self, req: _Req) -> None:
        self._checkpoint(req, req.extend_end)
        req.prefix_len = req.extend_end

    def _release_kv_cache(self, req: _Req, checkpoint: bool) -> None:
        owned = req.kv_allocated
        if checkpoint:
            self._checkpoint(req, owned)
        self.kv_free += max(owned - req.cache_protected_len, 0)
        if req.lock is not None:
            self.tree.dec_lock_ref(req.lock)
        req.lock = None
        req.holds_row = False
        self.rows_free += 1

    def _release_req(self, req: _Req, remaining: int) -> None:
        """release_req (retraction): free without inserting, evict the shortfall below
        remaining * RETRACT_DECODE_STEPS free slots, reset_for_retract (outputs kept)."""
        self._release_kv_cache(req, checkpoint=False)
        self._evict_to_free(remaining * self.cfg.retract_decode_steps)
        req.retractions += 1
        req.prefix_len = 0
        req.last_node = None
        req.cache_protected_len = 0
        req.num_matched_prefix_tokens = 0
        req.extend_end = None
        req.is_retracted = True
        req.inflight_middle_chunks = 0
        req.kv_allocated = 0

    def _init_next_round_input(self, req: _Req) -> None:
        fill = req.fill
        max_prefix = max(len(fill) - 1, 0)
        req.prefix_len, req.last_node = self.tree.match(fill, limit=max_prefix)
        req.num_matched_prefix_tokens = min(req.prefix_len, max_prefix)
        req.cache_protected_len = req.prefix_len

    # -- one iteration ---------------------------------------------------------------------

    def _allocatable(self, running_bs: int, held_rows: int) -> int:
        return min(self.cfg.rows - running_bs, max(self.rows_free + held_rows, 0))

    def _calc_priority(self) -> None:
        order, cache_aware = self.order(self.waiting, self)
        if sorted(map(id, order)) != sorted(map(id, self.waiting)):
            raise ValueError("a waiting order must return a permutation of the waiting queue")
        self.waiting[:] = order
        # _touch_waiting_prefixes: head last, so LRU evicts in reverse admission order.
        if cache_aware or not self.waiting or not self.cfg.waiting_prefix_refresh:
            return
        refresh = self.refresh_calls % self.cfg.waiting_prefix_refresh_interval == 0
        self.refresh_calls += 1
        if refresh:
            for r in reversed(self.waiting[:self.cfg.waiting_queue_prefix_match_max]):
                self.tree.match(r.fill)

    def _get_new_batch_prefill(self) -> _Batch | None:
        running = self.running
        if not running.reqs:
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        running_bs = len(running.reqs)
        if self._allocatable(running_bs, 0) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        self._calc_priority()
        adder = _Adder(self, running)
        if self.chunked_req is not None:
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            if adder.budget_state() == OTHER:
                break
            held = sum(1 for r in adder.can_run_list if r.holds_row)
            if len(adder.can_run_list) >= self._allocatable(len(running.reqs), held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            self._init_next_round_input(req)
            res = adder.add_one_req(req)
            if res != CONTINUE:
                if res == NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run_list) or bool(running.reqs)
                break
        can_run = adder.can_run_list
        if not can_run:
            return None
        chosen = set(map(id, can_run))
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = _Batch(list(can_run), extend=True, chunked_req=self.chunked_req)
        # prepare_for_extend: a request row each, then the extend tokens' KV slots.
        for r in can_run:
            if not r.holds_row:
                r.holds_row = True
                self.rows_free -= 1
            r.is_retracted = False
        self._alloc(sum(r.extend_end - r.prefix_len for r in can_run))
        for r in can_run:
            r.kv_allocated = r.extend_end
        return batch

    def _check_decode_mem(self, reqs: list) -> bool:
        need = len(reqs)  # page 1: one slot per request
        self._evict_to_free(need)
        return self.kv_free >= need

    def _retract_decode(self, batch: _Batch) -> list[_Req]:
        reqs = batch.reqs
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].n_out, -len(reqs[i].prompt)), reverse=True)
        retracted = []
        first = True
        while first or not self._check_decode_mem([reqs[i] for i in order]):
            if len(order) == 1:
                break  # always keep at least one request
            first = False
            idx = order.pop()
            self._release_req(reqs[idx], len(order))
            retracted.append(reqs[idx])
        if len(order) <= 1 and not self._check_decode_mem([reqs[i] for i in order]):
            last = reqs[order.pop()]  # not even one fits: SGLang aborts it
            self._release_req(last, 0)
            last.finished = last.aborted = True
            last.finish_step = self.step
            self.aborted.append(last.row)
        batch.filter(keep=order)
        remaining = batch.reqs
        estimate = (sum(r.n_out for r in remaining) + self.cfg.retract_decode_steps * len(remaining)) / (
            sum(r.max_new_tokens for r in remaining) + 1)
        self.ratio = min(1.0, estimate)
        return retracted

    def _update_running_batch(self, batch: _Batch) -> _Batch:
        initial_bs = len(batch.reqs)
        if not self._check_decode_mem(batch.reqs):
            for req in self._retract_decode(batch):
                self.waiting.append(req)  # _add_request_to_queue: the tail, in pop order
        else:
            self.ratio = max(self.ratio - self.ratio_decay, self.ratio_min)
        if len(batch.reqs) < initial_bs:
            batch.batch_is_full = False
        if not batch.reqs:
            return batch
        self._alloc(len(batch.reqs))  # prepare_for_decode
        for r in batch.reqs:
            r.kv_allocated += 1
        batch.extend = False
        return batch

    def _get_next_batch_to_run(self) -> _Batch | None:
        exclude = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                self._checkpoint_kv_cache(self.chunked_req)  # stash_chunked_request
        last = self.last_batch
        if last is not None and last.extend:
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            last_bs = len(last.reqs)
            last.filter(exclude=exclude)
            if len(last.reqs) < last_bs:
                self.running.batch_is_full = False
            if last.reqs and last is not self.running:
                if not self.running.reqs:
                    self.running = last
                else:
                    self.running.reqs.extend(last.reqs)
        running_bs = len(self.running.reqs)
        self.running.filter()
        if len(self.running.reqs) < running_bs:
            self.running.batch_is_full = False
        new_batch = self._get_new_batch_prefill()
        if new_batch is not None:
            return new_batch
        if self.running.reqs:
            decode = self._update_running_batch(self.running)
            return decode if decode.reqs else None
        return None

    def _process_result(self, batch: _Batch) -> list[int]:
        finished = []
        if batch.extend:
            for req in batch.reqs:
                if (req.finished and req.inflight_middle_chunks <= 0) or req.is_retracted:
                    continue
                if req.inflight_middle_chunks <= 0:
                    self._sample(req)
                    if req.finished:
                        self._release_kv_cache(req, checkpoint=True)
                    else:
                        self._checkpoint_kv_cache(req)
                else:
                    req.inflight_middle_chunks -= 1
        else:
            for req in batch.reqs:
                if req.finished or req.is_retracted:
                    continue
                self._sample(req)
                if req.finished:
                    self._release_kv_cache(req, checkpoint=True)
        for req in batch.reqs:
            if req.finished and req.row not in finished:
                finished.append(req.row)
        return finished

    def _sample(self, req: _Req) -> None:
        req.n_out += 1
        if req.first_token_step is None:
            req.first_token_step = self.step
        if req.n_out >= req.max_new_tokens:  # update_finish_state: by length only
            req.finished = True
            req.finish_step = self.step

    def run(self) -> SglangRun:
        pending = sorted(self.reqs, key=lambda r: (r.arrival, r.rid))
        pending.reverse()
        steps = []
        while (pending or self.waiting or self.running.reqs or self.chunked_req is not None
               or (self.last_batch is not None and self.last_batch.reqs)) and self.step < self.cfg.max_steps:
            while pending and pending[-1].arrival <= self.step:
                self.waiting.append(pending.pop())
            waiting_before = set(map(id, self.waiting))
            batch = self._get_next_batch_to_run()
            retracted = [r.row for r in self.waiting if id(r) not in waiting_before]
            rec = {"step": self.step, "kind": None, "scheduled": [], "retracted": retracted, "finished": [],
                   "new_token_ratio": self.ratio}
            if batch is not None:
                if batch.extend:
                    rec["kind"] = "prefill"
                    rec["scheduled"] = [(r.row, r.extend_end - r.prefix_len, "prefill", r.prefix_len)
                                        for r in batch.reqs]
                else:
                    rec["kind"] = "decode"
                    rec["scheduled"] = [(r.row, 1, "decode", None) for r in batch.reqs]
                rec["finished"] = self._process_result(batch)
            elif (not self.running.reqs and self.chunked_req is None and not self.waiting
                  and (self.last_batch is None or not self.last_batch.reqs)):
                self.ratio = self.ratio_init  # Scheduler.on_idle when fully idle
            self.last_batch = batch
            rec["kv_free"] = self.kv_free
            rec["kv_evictable"] = self.tree.evictable_size
            if batch is not None or retracted:
                steps.append(rec)
            self.step += 1
            if batch is None and not pending and not self.running.reqs and self.chunked_req is None and self.waiting:
                break  # nothing runs, nothing arrives: admission sees the same budget forever
        stalled = any(not r.finished for r in self.reqs)
        requests = [{"first_token_step": r.first_token_step, "finish_step": r.finish_step,
                     "retractions": r.retractions} for r in self.reqs]
        return SglangRun(steps=steps, requests=requests, iterations=self.step, stalled=stalled,
                         aborted=list(self.aborted))


def simulate(requests: Sequence[SglangRequest], config: SglangConfig | dict,
             order: WaitingOrderFn | None = None) -> SglangRun:
    """Run the trace through SGLang's scheduler (non-overlap loop, page 1) until every
    request finished (or config.max_steps iterations). `order` replaces the policy's
    waiting order (see ORDERS)."""
    cfg = config if isinstance(config, SglangConfig) else SglangConfig.from_dict(config)
    check_requests(requests)
    return _Scheduler(cfg, requests, order).run()
