"""One vLLM V1 server's scheduler step in JAX, exact to the reference, for many lanes at once.

The rules are docs/VLLM.md's; the yardstick is vtc_jax/testing/vllm_reference.py, which
this reproduces step for step (tests/test_vllm_jax.py). A lane is one server replaying one
trace; `run` vmaps lanes. Two step functions, chosen by the static config:

- `fast_step` (fcfs order, newest victim, preempted to the front, no prefix caching: vLLM's
  default and the common case) is closed form. Under these rules the running list followed
  by the preempted requests at the front of the waiting queue is ONE sequence that only
  changes at its split point (a victim is the running tail and becomes the waiting head; an
  admission takes the waiting head and appends it to the running list), so the lane keeps
  it as `max_num_seqs` slots; the never-admitted waiting requests are the rows
  [next_new, arrived) because rows are in arrival order. The victims are the shortest
  running tail whose blocks cover what is allocated (a count over suffix sums); the
  admissions are the head-of-line prefix of the slots after the running list, where the
  never-admitted rows are loaded behind the front (only S - nrun can be seated).
- `exact_step` (everything else: priority order or victims, prefix caching) is vLLM's loop
  as lax loops over running positions and admissions, with a block pool (physical blocks,
  hashes, reference counts, the free queue's order) when prefix caching is on.

Both follow what vLLM 0.33's goldens show: a request that preempts itself leaves the
running list and the walk goes on with the next one; an idle lane's clock jumps to its
next arrival, except that one empty step comes first right after a step that finished a
request (the state's `just_finished`).

Rows are re-ordered by (arrival, trace row) when packed (`pack_lane`); logs and results use
those packed rows, `Lane.source` maps them back. All arithmetic is int32; `check_lane`
refuses before the run whatever could wrap or could never be served.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError

I32 = jnp.int32
INT_MAX = 2**31 - 1
POLICIES = ("fcfs", "priority")
VICTIMS = ("newest", "policy")
PREEMPTED_TO = ("front", "policy")


@dataclasses.dataclass(frozen=True)
class VllmConfig:
    """Static server settings, vLLM's flag names (docs/VLLM.md gives each one's meaning).
    `victim` and `preempted_to` default to vLLM's own for the policy (None)."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = False
    victim: str | None = None
    preempted_to: str | None = None

    def __post_init__(self):
        for name, low in (("num_gpu_blocks", 2), ("block_size", 1), ("max_num_batched_tokens", 1),
                          ("max_num_seqs", 1), ("long_prefill_token_threshold", 0)):
            value = getattr(self, name)
            if type(value) is not int or not low <= value <= INT_MAX // 4:
                raise InputError(f"{name} must be an integer in [{low}, {INT_MAX // 4}], got {value!r}")
        for name in ("enable_chunked_prefill", "enable_prefix_caching"):
            if type(getattr(self, name)) is not bool:
                raise InputError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.scheduling_policy not in POLICIES:
            raise InputError(f"scheduling_policy must be one of {', '.join(POLICIES)}, "
                             f"got {self.scheduling_policy!r}")
        vllm_own = "newest" if self.scheduling_policy == "fcfs" else "policy"
        object.__setattr__(self, "victim", self.victim or vllm_own)
        object.__setattr__(self, "preempted_to", self.preempted_to or ("front" if vllm_own == "newest" else "policy"))
        for name, allowed in (("victim", VICTIMS), ("preempted_to", PREEMPTED_TO)):
            if getattr(self, name) not in allowed:
                raise InputError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InputError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below "
                             f"max_num_seqs ({self.max_num_seqs}), which vLLM refuses")

    @classmethod
    def from_golden(cls, config: dict) -> VllmConfig:
        """The goldens' / reference's config dict (docs/VLLM.md's keys) as a VllmConfig."""
        names = {"num_blocks": "num_gpu_blocks", "block_size": "block_size",
                 "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
                 "chunked_prefill": "enable_chunked_prefill", "long_prefill_threshold": "long_prefill_token_threshold",
                 "policy": "scheduling_policy", "prefix_caching": "enable_prefix_caching",
                 "victim": "victim", "preempted_to": "preempted_to"}
        ignored = ("vllm_version", "effective", "max_steps")
        unknown = [k for k in config if k not in names and k not in ignored]
        if unknown:
            raise InputError(f"config: unknown key {unknown[0]!r}")
        if "num_blocks" not in config:
            raise InputError("config: missing key 'num_blocks'")
        return cls(**{names[k]: v for k, v in config.items() if k in names})

    @property
    def rules(self) -> Rules:
        return Rules(self.scheduling_policy, self.victim, self.preempted_to, self.enable_prefix_caching)


@dataclasses.dataclass(frozen=True)
class Rules:
    """The settings that change the step's program (static under jit); every number of
    a VllmConfig is lane data instead (`Lane`), so lanes with different pools, budgets
    and block sizes share one compiled call."""

    scheduling_policy: str
    victim: str
    preempted_to: str
    enable_prefix_caching: bool

    @property
    def closed_form(self) -> bool:
        """Whether `fast_step` applies (vLLM's default fcfs rules, no prefix caching)."""
        return (self.scheduling_policy == "fcfs" and self.victim == "newest" and self.preempted_to == "front"
                and not self.enable_prefix_caching)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Static array sizes of a batch of lanes: `rows` R, `width` J (block-table columns:
    the largest peak blocks), `slots` S (the most seats), `pool` N (the most blocks)."""

    rows: int
    width: int
    slots: int
    pool: int


# ----------------------------------------------------------------------------------------
# Lanes: packing and checking a trace (host side, numpy).


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Lane:
    """One lane: a server's numbers, int32[]: `block_size`, `num_blocks`, `budget`
    (max_num_batched_tokens), `seats` (max_num_seqs), `long_cap` (L, 0 off), `chunked`
    bool[]; its requests in (arrival, trace row) order, padded to R rows, int32[R]:
    `arrival` (padding INT_MAX), `prompt`, `output`, `rank` (place in the policy's order:
    (arrival, row) for fcfs, (priority, arrival, row) for priority), `group` (shared-prefix
    group, -1 none), `prefix_len`, `source` (the trace row, -1 padding)."""

    block_size: jax.Array
    num_blocks: jax.Array
    budget: jax.Array
    seats: jax.Array
    long_cap: jax.Array
    chunked: jax.Array

    arrival: jax.Array
    prompt: jax.Array
    output: jax.Array
    rank: jax.Array
    group: jax.Array
    prefix_len: jax.Array
    source: jax.Array


def peak_blocks(prompt, output, block_size):
    """ceil((P + O - 1) / B): a request's most blocks (its last token never gets KV)."""
    return -(-(np.asarray(prompt, np.int64) + np.asarray(output, np.int64) - 1) // block_size)


def check_lane(cfg: VllmConfig, arrival, prompt, output, prefix_len) -> None:
    """InputError for a lane that could wrap int32 or never be served: a request whose
    peak blocks exceed the N - 1 usable (it would preempt itself forever), with chunking
    off a budget below vLLM's max_model_len, values too large for int32 arithmetic."""
    arrival, prompt, output, prefix_len = (np.asarray(a, np.int64) for a in (arrival, prompt, output, prefix_len))
    if arrival.size == 0:
        raise InputError("no requests")
    if arrival.min() < 0 or prompt.min() < 1 or output.min() < 1:
        raise InputError("requests need arrival >= 0, prompt >= 1, output >= 1")
    if arrival.max() > INT_MAX // 2 or (prompt + output).max() > INT_MAX // 4:
        raise InputError("an arrival, prompt or output is too large for int32 steps and tokens")
    if (prefix_len < 0).any() or (prefix_len > prompt).any():
        raise InputError("prefix_len must lie in [0, prompt]")
    peak = peak_blocks(prompt, output, cfg.block_size)
    worst = int(peak.argmax())
    if peak[worst] > cfg.num_gpu_blocks - 1:
        raise InputError(f"request {worst}: needs {peak[worst]} KV blocks at its peak, more than the "
                         f"{cfg.num_gpu_blocks - 1} usable (num_gpu_blocks - 1): it could never finish")
    if not cfg.enable_chunked_prefill:
        longest = -(-int((prompt + output).max()) // cfg.block_size) * cfg.block_size
        if cfg.max_num_batched_tokens < longest:
            raise InputError(f"with chunked prefill off vLLM needs max_num_batched_tokens >= max_model_len "
                             f"({longest}), got {cfg.max_num_batched_tokens}")


def pack_lane(cfg: VllmConfig, rows: int, arrival, prompt, output, priority=None, prefix_group=None,
              prefix_len=None) -> Lane:
    """One checked lane as numpy arrays of `rows` rows (`check_lane`). Inputs are per
    request in trace order: ints, `prefix_group` any hashable per request (None: no shared
    prefix), `prefix_len` its shared tokens."""
    n = len(arrival)
    priority = np.zeros(n, np.int64) if priority is None else np.asarray(priority, np.int64)
    prefix_len = np.zeros(n, np.int64) if prefix_len is None else np.asarray(prefix_len, np.int64)
    prefix_group = [None] * n if prefix_group is None else list(prefix_group)
    check_lane(cfg, arrival, prompt, output, prefix_len)
    if n > rows:
        raise InputError(f"a lane has {n} requests, more than the {rows} rows")
    arrival, prompt, output = (np.asarray(a, np.int64) for a in (arrival, prompt, output))
    order = np.lexsort((np.arange(n), arrival))  # (arrival, row): vLLM's arrival order
    if cfg.scheduling_policy == "priority":
        by_policy = np.lexsort((np.arange(n), priority[order]))  # (priority, arrival, row)
    else:
        by_policy = np.arange(n)
    rank = np.empty(n, np.int64)
    rank[by_policy] = np.arange(n)
    ids: dict = {}
    group = np.array([ids.setdefault(prefix_group[r], len(ids)) if prefix_group[r] is not None and prefix_len[r] > 0
                      else -1 for r in order], np.int64)

    def pad(values, fill):
        out = np.full(rows, fill, np.int32)
        out[:n] = values
        return out

    return Lane(block_size=np.int32(cfg.block_size), num_blocks=np.int32(cfg.num_gpu_blocks),
                budget=np.int32(cfg.max_num_batched_tokens), seats=np.int32(cfg.max_num_seqs),
                long_cap=np.int32(cfg.long_prefill_token_threshold), chunked=np.bool_(cfg.enable_chunked_prefill),
                arrival=pad(arrival[order], INT_MAX), prompt=pad(prompt[order], 1),
                output=pad(output[order], 1), rank=pad(rank, INT_MAX), group=pad(group, -1),
                prefix_len=pad(prefix_len[order], 0), source=pad(order, -1))


def stack_lanes(lanes: list[Lane]) -> Lane:
    """Lanes of equal rows as one batched Lane (int32[L, R] fields)."""
    return jax.tree.map(lambda *a: jnp.asarray(np.stack(a)), *lanes)


def shapes_of(lanes: Lane) -> Shapes:
    """The static sizes of a batch of lanes (Lane with int32[L, ...] fields)."""
    peak = peak_blocks(lanes.prompt, lanes.output, np.asarray(lanes.block_size)[..., None])
    rows = lanes.arrival.shape[-1]
    return Shapes(rows=rows, width=max(int(peak.max()), 1), slots=min(int(np.max(lanes.seats)), rows),
                  pool=int(np.max(lanes.num_blocks)))


def check_run(rules: Rules, lanes: Lane, num_steps: int) -> None:
    """InputError when `num_steps` steps of these lanes could wrap an int32: the clock
    (steps after the last arrival), sums over seats of tokens or blocks, the block pool's
    stamps or a hash key (< 2 R J). A
    step stamps at most 2 S J times: at most S requests are scheduled (each hashes at most
    J blocks) and at most S preempted or finished (each frees at most J)."""
    shapes = shapes_of(lanes)
    sums = (shapes.slots + 1) * max(int(np.max(lanes.budget)) + 1, shapes.pool)
    if sums >= INT_MAX:
        raise InputError(f"{shapes.slots} seats x a budget of {int(np.max(lanes.budget))} tokens or "
                         f"{shapes.pool} blocks exceed int32 sums")
    arrival = np.asarray(lanes.arrival)
    last = int(np.where(arrival < INT_MAX, arrival, 0).max())
    if last + num_steps >= INT_MAX // 2:
        raise InputError(f"{num_steps} steps after arrivals up to {last} exceed the int32 clock")
    if rules.enable_prefix_caching:
        per_step = 2 * shapes.slots * shapes.width
        if num_steps * per_step + shapes.pool >= INT_MAX or 2 * shapes.rows * shapes.width >= INT_MAX:
            raise InputError(f"{num_steps} steps of a {shapes.pool}-block pool with {shapes.rows} rows "
                             "exceed the int32 block stamps; run fewer steps or fewer rows")


# ----------------------------------------------------------------------------------------
# Shared pieces of one step.


def _cdiv(a, b):
    return (a + (b - 1)) // b


def _excl_cumsum(x):
    return jnp.cumsum(x) - x


def _leading(ok):
    """How many leading entries of bool[K] are True: int32[]."""
    return jnp.argmin(jnp.concatenate([ok, jnp.zeros(1, bool)])).astype(I32)


def _clock_and_arrivals(trace: Lane, t, arrived, busy, just_finished):
    """The step's clock and how many rows have arrived by then (rows are in arrival
    order), and whether this is the one empty step an idle lane takes right after a step
    that finished a request (vLLM's `has_requests()` still counts a finished request until
    it is reported; golden m033 step 5): (int32[], int32[], bool[]). Otherwise an idle
    lane's clock jumps to its next arrival."""
    rows = trace.arrival.shape[0]
    upcoming = trace.arrival[jnp.minimum(arrived, rows - 1)]
    more = ~busy & (arrived < rows) & (upcoming < INT_MAX)
    t = jnp.where(more & ~just_finished, jnp.maximum(t, upcoming), t)
    return t, jnp.searchsorted(trace.arrival, t, side="right").astype(I32), more & just_finished


def _long_cap(trace: Lane, busy_count):
    """L when set and more than one request is running or waiting (after arrivals), else
    no cap: int32[]."""
    return jnp.where((trace.long_cap > 0) & (busy_count > 1), trace.long_cap, INT_MAX).astype(I32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepLog:
    """What one step did, over K slots in vLLM's scheduling order (the running list, then
    admissions): `t` int32[] the step, `active` bool[] (something ran or waited, or the
    empty step after a finish, `_clock_and_arrivals`), `rows` int32[K] packed rows (-1
    none), `tokens` int32[K] scheduled (0: none), `preempted`, `finished`: bool[K]."""

    t: jax.Array
    active: jax.Array
    rows: jax.Array
    tokens: jax.Array
    preempted: jax.Array
    finished: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Outcome:
    """Per packed row, int32[R]: `first_token` and `finish` step (-1: not yet), `preemptions`."""

    first_token: jax.Array
    finish: jax.Array
    preemptions: jax.Array


# ----------------------------------------------------------------------------------------
# The closed-form step (fcfs, newest victim, front, no prefix caching).


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FastState:
    """One lane. Scalars int32[]: `t`, `arrived` (rows < arrived have arrived), `next_new`
    (rows in [next_new, arrived) wait, never admitted), `free` blocks, `nrun`, `nfront`;
    `just_finished` bool[] (the last step finished a request).
    Slots int32[S] (S = min(max_num_seqs, R)): slots [0, nrun) are the running list
    in admission order, [nrun, nrun + nfront) the preempted requests at the waiting queue's
    front, in queue order; per slot its `row`, `prompt`, `output`, `computed`, `generated`,
    `first` token step, `preempts`. `out`: per-row results, written when a request finishes."""

    t: jax.Array
    arrived: jax.Array
    next_new: jax.Array
    free: jax.Array
    nrun: jax.Array
    nfront: jax.Array
    just_finished: jax.Array
    row: jax.Array
    prompt: jax.Array
    output: jax.Array
    computed: jax.Array
    generated: jax.Array
    first: jax.Array
    preempts: jax.Array
    out: Outcome


_SLOT_FIELDS = ("row", "prompt", "output", "computed", "generated", "first", "preempts")


def _fresh_outcome(rows: int) -> Outcome:
    none = jnp.full(rows, -1, I32)
    return Outcome(first_token=none, finish=none, preemptions=jnp.zeros(rows, I32))


def fast_init(trace: Lane, shapes: Shapes) -> FastState:
    rows = trace.arrival.shape[0]
    slots = shapes.slots
    zero = jnp.zeros((), I32)
    empty = jnp.zeros(slots, I32)
    return FastState(t=zero, arrived=zero, next_new=zero, free=(trace.num_blocks - 1).astype(I32),
                     nrun=zero, nfront=zero, just_finished=jnp.asarray(False), **{f: empty for f in _SLOT_FIELDS},
                     out=_fresh_outcome(rows))


def _fast_running(trace: Lane, s: FastState, cap):
    """The running phase in closed form. Returns (tokens int32[K] per slot, victim_from
    int32[]: slots [victim_from, nrun) are preempted, free blocks after)."""
    bs, slots = trace.block_size, s.row.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    listed = pos < s.nrun
    # Asks above budget + 1 act like budget + 1 (never fully served): keeps sums in int32.
    need = jnp.where(listed, jnp.minimum(jnp.minimum(s.prompt + s.generated - s.computed, cap), trace.budget + 1), 0)
    before = trace.budget - _excl_cumsum(need)  # budget left at each slot
    n = jnp.clip(before, 0, need)
    walked = listed & (before > 0)
    held = jnp.where(listed, _cdiv(s.computed, bs), 0)
    want = jnp.cumsum(jnp.where(walked, _cdiv(s.computed + n, bs) - held, 0))  # blocks taken by slots <= i
    tail = jnp.cumsum(held[::-1])[::-1]  # blocks held by slots >= m, non-increasing in m
    # m_i: the start of the shortest tail whose blocks, freed, cover want_i.
    covered = jnp.concatenate([tail, jnp.zeros(1, I32)]) >= (want - s.free)[:, None]
    m = jnp.minimum(covered.sum(axis=1, dtype=I32) - 1, s.nrun)
    done = _leading(walked & (m > pos))  # slots < done are scheduled
    last = jnp.maximum(done - 1, 0)
    m_prev = jnp.where(done > 0, m[last], s.nrun)
    at = jnp.minimum(done, slots - 1)
    # The next slot walks, is still listed, and even the whole tail after it is not enough:
    # it preempts itself. vLLM's walk goes on (`continue`), but the newest-victim rule
    # has already taken everything after it, so the phase ends here.
    self_preempt = (done < s.nrun) & walked[at] & (done < m_prev) & (m[at] <= done)
    victim_from = jnp.where(self_preempt, done, m_prev)
    free = s.free + jnp.where(victim_from < s.nrun, tail[jnp.minimum(victim_from, slots - 1)], 0)
    free = free - jnp.where(done > 0, want[last], 0)
    return jnp.where(pos < done, n, 0), victim_from, free


def _fast_waiting(trace: Lane, s: FastState, cap, budget, tokens):
    """The waiting phase in closed form: the head-of-line prefix of the waiting queue,
    which is the slots from nrun on (the preempted front, then never-admitted rows loaded
    after it in arrival order; only S - nrun could be seated anyway). Returns (state,
    tokens int32[S])."""
    bs, slots = trace.block_size, s.row.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    new_row = s.next_new + pos - s.nrun - s.nfront
    fresh = pos >= s.nrun + s.nfront  # a row loaded past the queue's end is never read
    source = jnp.clip(new_row, 0, trace.prompt.shape[0] - 1)
    loaded = {"row": new_row, "prompt": trace.prompt[source], "output": trace.output[source], "computed": 0,
              "generated": 0, "first": -1, "preempts": 0}
    s = dataclasses.replace(s, **{f: jnp.where(fresh, loaded[f], getattr(s, f)) for f in _SLOT_FIELDS})
    place = pos - s.nrun  # place in the waiting queue
    queued = (place >= 0) & (place < s.nfront + s.arrived - s.next_new)
    total = s.prompt + s.generated
    ask = jnp.where(queued, jnp.minimum(jnp.minimum(total, cap), budget + 1), 0)  # as in _fast_running
    left = budget - _excl_cumsum(ask)
    n = jnp.clip(left, 0, ask)
    free_before = s.free - _excl_cumsum(_cdiv(n, bs))
    # The whole P + g must fit the free blocks (a check); only the first chunk is allocated.
    ok = queued & (left > 0) & (pos < trace.seats) & (_cdiv(total, bs) <= free_before)
    ok &= trace.chunked | (ask <= left)
    admitted = _leading(ok | (place < 0)) - s.nrun
    taken = queued & (place < admitted)
    n = jnp.where(taken, n, 0)
    s = dataclasses.replace(s, nrun=s.nrun + admitted, nfront=jnp.maximum(s.nfront - admitted, 0),
                            next_new=s.next_new + jnp.maximum(admitted - s.nfront, 0),
                            free=s.free - _cdiv(n, bs).sum(dtype=I32))
    return s, tokens + n


def _compact(values: dict, keep, slots: int) -> dict:
    """Slot arrays with the kept slots moved to the front, in order (int32[K] each)."""
    dest = jnp.where(keep, _excl_cumsum(keep.astype(I32)), slots)
    stacked = jnp.stack(list(values.values()))  # one scatter, not one per field
    return dict(zip(values, jnp.zeros_like(stacked).at[:, dest].set(stacked, mode="drop")))


def fast_step(trace: Lane, s: FastState) -> tuple[FastState, StepLog]:
    """One schedule() + update_from_output() of one lane under fcfs rules (module docstring)."""
    bs, slots = trace.block_size, s.row.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    busy = (s.nrun + s.nfront > 0) | (s.next_new < s.arrived)
    t, arrived, empty = _clock_and_arrivals(trace, s.t, s.arrived, busy, s.just_finished)
    s = dataclasses.replace(s, arrived=arrived)
    active = (s.nrun + s.nfront > 0) | (s.next_new < arrived) | empty
    cap = _long_cap(trace, s.nrun + s.nfront + arrived - s.next_new)

    tokens, victim_from, free = _fast_running(trace, s, cap)
    victims = (pos >= victim_from) & (pos < s.nrun)
    # No admission in a step that preempted: a zero budget admits nothing.
    budget = jnp.where(victims.any(), 0, trace.budget - tokens.sum(dtype=I32))
    # Victims keep their slots: the running tail becomes the waiting queue's front.
    s = dataclasses.replace(s, computed=jnp.where(victims, 0, s.computed), preempts=s.preempts + victims,
                            nfront=s.nfront + s.nrun - victim_from, nrun=victim_from, free=free)
    s, tokens = _fast_waiting(trace, s, cap, budget, tokens)

    computed = s.computed + tokens
    samples = (tokens > 0) & (computed == s.prompt + s.generated)
    generated = s.generated + samples
    first = jnp.where(samples & (s.first < 0), t, s.first)
    finished = samples & (generated == s.output)
    dest = jnp.where(finished, s.row, trace.arrival.shape[0])
    out = Outcome(first_token=s.out.first_token.at[dest].set(first, mode="drop"),
                  finish=s.out.finish.at[dest].set(t, mode="drop"),
                  preemptions=s.out.preemptions.at[dest].set(s.preempts, mode="drop"))
    log = StepLog(t=t, active=active, rows=jnp.where(pos < s.nrun + s.nfront, s.row, -1), tokens=tokens,
                  preempted=victims, finished=finished)
    keep = (pos < s.nrun + s.nfront) & ~finished
    moved = _compact({"row": s.row, "prompt": s.prompt, "output": s.output, "computed": computed,
                      "generated": generated, "first": first, "preempts": s.preempts}, keep, slots)
    nfin = finished.sum(dtype=I32)
    s = dataclasses.replace(s, **moved, t=t + 1, nrun=s.nrun - nfin, just_finished=nfin > 0,
                            free=s.free + jnp.where(finished, _cdiv(computed, bs), 0).sum(dtype=I32), out=out)
    return s, log


# ----------------------------------------------------------------------------------------
# The block pool (prefix caching): physical blocks with hash identity.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Blocks:
    """vLLM's BlockPool for one lane. Per physical block, int32[N]: `ref` holders (the
    null block 0 keeps 1 forever), `key` its hash (-1 none; block j of row r hashes to
    `_block_keys`), `cached_at` when it was hashed (a lookup returns the copy hashed
    first), `freed_at` when it was last freed (hashed free blocks are reused least
    recently freed first). `clock` int32[] stamps both; `table` int32[R, J] each row's
    blocks by position (stale past what the row holds)."""

    ref: jax.Array
    key: jax.Array
    cached_at: jax.Array
    freed_at: jax.Array
    clock: jax.Array
    table: jax.Array


def blocks_init(trace: Lane, shapes: Shapes) -> Blocks:
    """An empty pool: the null block 0 and the blocks past this lane's num_blocks (padding
    to the batch's largest pool) are held forever."""
    n, rows, width = shapes.pool, shapes.rows, shapes.width
    ids = jnp.arange(n, dtype=I32)
    held = (ids == 0) | (ids >= trace.num_blocks)
    return Blocks(ref=held.astype(I32), key=jnp.full(n, -1, I32), cached_at=jnp.zeros(n, I32),
                  freed_at=jnp.zeros(n, I32), clock=jnp.zeros((), I32), table=jnp.zeros((rows, width), I32))


def _block_keys(trace: Lane, row, width: int):
    """The hash of each block position of `row`, int32[J]: a block wholly inside a shared
    prefix is its group's (group * J + j), any other the row's own ((R + row) * J + j)."""
    j = jnp.arange(width, dtype=I32)
    shared = (trace.group[row] >= 0) & (trace.block_size * (j + 1) <= trace.prefix_len[row])
    return jnp.where(shared, trace.group[row], trace.arrival.shape[0] + row) * width + j


def _take(bp: Blocks, row, start, count) -> Blocks:
    """Give `row` `count` new blocks at table positions [start, start + count): unhashed
    free blocks first, then hashed ones least recently freed first, whose hash is evicted.
    The caller checked they are free."""
    nblocks = bp.ref.shape[0]
    ids = jnp.arange(nblocks, dtype=I32)
    free = bp.ref == 0
    # The free queue's order as distinct keys: unhashed in [-N, 0), hashed by freed_at.
    queue = jnp.where(free & (bp.key < 0), ids - nblocks, jnp.where(free, bp.freed_at, INT_MAX))
    taken = free & (queue <= _kth_smallest(queue, count, -nblocks, bp.clock))
    cols = jnp.where(taken, start + jnp.cumsum(taken, dtype=I32) - 1, bp.table.shape[1])
    hit = jnp.where(taken, ids, nblocks)
    return dataclasses.replace(bp, ref=bp.ref.at[hit].set(1, mode="drop"), key=bp.key.at[hit].set(-1, mode="drop"),
                               table=bp.table.at[row].set(bp.table[row].at[cols].set(ids, mode="drop")))


def _kth_smallest(values, k, low, high):
    """The k-th smallest of distinct int32[N] values in [low, high] (low - 1 for k = 0),
    by bisection: a sort costs ten times more here."""

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = (values <= mid).sum(dtype=I32) >= k
        return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    bounds = (jnp.asarray(low - 1, I32), jnp.asarray(high, I32))
    return jax.lax.fori_loop(0, 32, halve, bounds)[1]


def _hash(trace: Lane, bp: Blocks, row, lo, hi) -> Blocks:
    """Hash the full blocks at positions [lo, hi) of `row` (when they are allocated, so a
    later admission in the same step can hit them), in position order."""
    width = bp.table.shape[1]
    j = jnp.arange(width, dtype=I32)
    mine = (j >= lo) & (j < hi)
    dest = jnp.where(mine, bp.table[row], bp.ref.shape[0])
    return dataclasses.replace(bp, key=bp.key.at[dest].set(_block_keys(trace, row, width), mode="drop"),
                               cached_at=bp.cached_at.at[dest].set(bp.clock + j - lo, mode="drop"),
                               clock=bp.clock + jnp.maximum(hi - lo, 0))


def _release(bp: Blocks, row, held):
    """Drop `row`'s hold on its first `held` blocks, last block first (so its tail is
    evicted first). Returns (Blocks, blocks that became free int32[])."""
    width = bp.table.shape[1]
    j = jnp.arange(width, dtype=I32)
    mine = j < held
    blocks = bp.table[row]
    dest = jnp.where(mine, blocks, bp.ref.shape[0])
    freed = mine & (bp.ref[blocks] == 1)
    stamp = jnp.where(freed, bp.clock + held - 1 - j, bp.freed_at[blocks])
    bp = dataclasses.replace(bp, ref=bp.ref.at[dest].add(-1, mode="drop"),
                             freed_at=bp.freed_at.at[dest].set(stamp, mode="drop"), clock=bp.clock + held)
    return bp, freed.sum(dtype=I32)


def _lookup(trace: Lane, bp: Blocks, row, tokens):
    """The prefix hit of `row` knowing `tokens` tokens: the longest run of leading blocks
    whose hash is cached, whole blocks of at most tokens - 1 tokens. Returns (hit blocks
    int32[], each position's first-hashed copy int32[J])."""
    width = bp.table.shape[1]
    keys = _block_keys(trace, row, width)
    stamp = jnp.where(bp.key[None, :] == keys[:, None], bp.cached_at[None, :], INT_MAX)
    copy = jnp.argmin(stamp, axis=1).astype(I32)
    found = (stamp.min(axis=1) < INT_MAX) & (jnp.arange(width) < (tokens - 1) // trace.block_size)
    return _leading(found), copy


# ----------------------------------------------------------------------------------------
# The literal step (any policy, victims, prefix caching).


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ExactState:
    """One lane. Scalars int32[]: `t`, `arrived`, `free` blocks, `nrun`, `nfront`;
    `just_finished` bool[] (the last step finished a request). Per
    packed row int32[R]: `computed`, `generated`; `pooled` bool[R] (waiting in the policy's
    order: arrived or re-queued, not at the front). `seq` int32[S]: rows, the running list
    in admission order then the requests preempted to the waiting queue's front (newest
    preempted first). `out`: per-row results. `blocks`: the pool (prefix caching) or None."""

    t: jax.Array
    arrived: jax.Array
    free: jax.Array
    nrun: jax.Array
    nfront: jax.Array
    just_finished: jax.Array
    computed: jax.Array
    generated: jax.Array
    pooled: jax.Array
    seq: jax.Array
    out: Outcome
    blocks: Blocks | None


def exact_init(rules: Rules, trace: Lane, shapes: Shapes) -> ExactState:
    rows = trace.arrival.shape[0]
    zero = jnp.zeros((), I32)
    return ExactState(t=zero, arrived=zero, free=(trace.num_blocks - 1).astype(I32), nrun=zero, nfront=zero,
                      just_finished=jnp.asarray(False),
                      computed=jnp.zeros(rows, I32), generated=jnp.zeros(rows, I32), pooled=jnp.zeros(rows, bool),
                      seq=jnp.full(shapes.slots, -1, I32), out=_fresh_outcome(rows),
                      blocks=blocks_init(trace, shapes) if rules.enable_prefix_caching else None)


def _grow(trace: Lane, s: ExactState, row, n) -> ExactState:
    """allocate_slots for running `row` scheduled for n tokens (the caller checked the
    new blocks are free): take them, hash the blocks this step fills."""
    bs = trace.block_size
    c = s.computed[row]
    count = _cdiv(c + n, bs) - _cdiv(c, bs)
    if s.blocks is None:
        return dataclasses.replace(s, free=s.free - count)
    bp = _take(s.blocks, row, _cdiv(c, bs), count)
    return dataclasses.replace(s, free=s.free - count, blocks=_hash(trace, bp, row, c // bs, (c + n) // bs))


def _drop_blocks(s: ExactState, row, held) -> ExactState:
    """`row` gives up its first `held` blocks, last first."""
    if s.blocks is None:
        return dataclasses.replace(s, free=s.free + held)
    bp, freed = _release(s.blocks, row, held)
    return dataclasses.replace(s, free=s.free + freed, blocks=bp)


def _pick_victim(rules: Rules, trace: Lane, order, alive):
    """The slot to preempt: the newest admitted alive one, or the policy's largest rank."""
    if rules.victim == "newest":
        return jnp.argmax(jnp.where(alive, jnp.arange(order.shape[0]), -1)).astype(I32)
    return jnp.argmax(jnp.where(alive, trace.rank[jnp.maximum(order, 0)], -1)).astype(I32)


def _exact_running(rules: Rules, trace: Lane, s: ExactState, cap):
    """vLLM's running loop over the running list `order = seq[:nrun]`. Returns (state,
    tokens int32[S] per slot, victim sequence int32[S]: -1, or the order of preemption)."""
    bs = trace.block_size
    order = s.seq
    slots = order.shape[0]

    def preempt(carry):
        s, i, need, budget, tokens, alive, vic, nvic, _ = carry
        v = _pick_victim(rules, trace, order, alive)
        row = order[v]
        s = _drop_blocks(s, row, _cdiv(s.computed[row] + tokens[v], bs))
        s = dataclasses.replace(s, computed=s.computed.at[row].set(0))
        # A victim already scheduled in this step gives its tokens back.
        return (s, i, need, budget + tokens[v], tokens.at[v].set(0), alive.at[v].set(False), vic.at[v].set(nvic),
                nvic + 1, v == i)

    def short(carry):
        s, need, gone = carry[0], carry[2], carry[-1]
        return ~gone & (s.free < need)

    def visit(carry):
        s, i, budget, tokens, alive, vic, nvic = carry
        row = order[i]
        c = s.computed[row]
        # A slot preempted earlier in the walk (a policy victim) asks for nothing.
        n = jnp.where(alive[i], jnp.minimum(jnp.minimum(trace.prompt[row] + s.generated[row] - c, cap), budget), 0)
        need = _cdiv(c + n, bs) - _cdiv(c, bs)
        s, _, _, budget, tokens, alive, vic, nvic, gone = jax.lax.while_loop(
            short, preempt, (s, i, need, budget, tokens, alive, vic, nvic, jnp.asarray(False)))
        # A request that preempted itself is out of the list (its slot dead, asking for
        # nothing) and the walk goes on with the next one: vLLM 0.33's `continue`.
        n = jnp.where(gone, 0, n)
        return _grow(trace, s, row, n), i + 1, budget - n, tokens.at[i].add(n), alive, vic, nvic

    def walking(carry):
        _, i, budget, _, _, _, _ = carry
        return (i < s.nrun) & (budget > 0)

    alive = jnp.arange(slots) < s.nrun
    init = (s, jnp.zeros((), I32), jnp.asarray(trace.budget, I32), jnp.zeros(slots, I32), alive,
            jnp.full(slots, -1, I32), jnp.zeros((), I32))
    s, _, _, tokens, alive, vic, nvic = jax.lax.while_loop(walking, visit, init)
    return s, tokens, vic, nvic


def _requeue(rules: Rules, s: ExactState, vic, nvic) -> ExactState:
    """After the running phase: the seq without the victims, who go to the waiting queue's
    front (newest preempted first, ahead of the old front) or back to the policy's pool."""
    slots = s.seq.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    running = (pos < s.nrun) & (vic < 0)
    nalive = running.sum(dtype=I32)
    front = rules.preempted_to == "front"
    moved = nvic if front else 0
    dest = jnp.where(running, _excl_cumsum(running.astype(I32)), slots)
    if front:
        dest = jnp.where(vic >= 0, nalive + nvic - 1 - vic, dest)
    old_front = (pos >= s.nrun) & (pos < s.nrun + s.nfront)
    dest = jnp.where(old_front, nalive + moved + pos - s.nrun, dest)
    seq = jnp.full(slots, -1, I32).at[dest].set(s.seq, mode="drop")
    pooled = s.pooled
    if not front:
        pooled = pooled.at[jnp.where(vic >= 0, s.seq, pooled.shape[0])].set(True, mode="drop")
    return dataclasses.replace(s, seq=seq, nrun=nalive, nfront=s.nfront + moved, pooled=pooled)


def _exact_waiting(trace: Lane, s: ExactState, cap, budget, tokens):
    """vLLM's waiting loop: admit the head while budget, seats and blocks last; the first
    head that fails ends it. Returns (state, tokens int32[S] per seq slot)."""
    bs = trace.block_size
    slots = s.seq.shape[0]

    def head(s):
        from_front = s.nfront > 0
        pooled_head = jnp.argmin(jnp.where(s.pooled, trace.rank, INT_MAX)).astype(I32)
        return from_front, jnp.where(from_front, s.seq[jnp.minimum(s.nrun, slots - 1)], pooled_head)

    def admit(carry):
        s, budget, tokens, _ = carry
        from_front, row = head(s)
        total = trace.prompt[row] + s.generated[row]
        if s.blocks is None:
            hits, copy, spare = jnp.zeros((), I32), None, jnp.zeros((), I32)
        else:
            hits, copy = _lookup(trace, s.blocks, row, total)
            # A free hit block counts as needed: using it takes it out of the free queue.
            spare = ((jnp.arange(copy.shape[0]) < hits) & (s.blocks.ref[copy] == 0)).sum(dtype=I32)
        n = jnp.minimum(total - hits * bs, cap)
        fits = trace.chunked | (n <= budget)
        n = jnp.minimum(n, budget)
        whole = _cdiv(total, bs) - hits + spare
        chunk = _cdiv(hits * bs + n, bs) - hits
        ok = fits & (whole <= s.free) & (chunk + spare <= s.free)
        # Every update below is a no-op when the head is refused (ok False).
        hits, spare, n = jnp.where(ok, hits, 0), jnp.where(ok, spare, 0), jnp.where(ok, n, 0)
        at = s.nrun
        s = dataclasses.replace(s, computed=s.computed.at[row].set(jnp.where(ok, hits * bs, s.computed[row])),
                                seq=s.seq.at[at].set(jnp.where(ok, row, s.seq[at])), nrun=at + ok,
                                nfront=s.nfront - (ok & from_front), pooled=s.pooled.at[row].set(s.pooled[row] & ~ok),
                                free=s.free - spare)
        if s.blocks is not None:
            j = jnp.arange(copy.shape[0])
            hit = jnp.where(j < hits, copy, s.blocks.ref.shape[0])
            bp = dataclasses.replace(s.blocks, ref=s.blocks.ref.at[hit].add(1, mode="drop"),
                                     table=s.blocks.table.at[row].set(jnp.where(j < hits, copy, s.blocks.table[row])))
            s = dataclasses.replace(s, blocks=bp)
        return _grow(trace, s, row, n), budget - n, tokens.at[at].add(n), ~ok

    def admitting(carry):
        s, budget, _, stop = carry
        return ~stop & (budget > 0) & (s.nrun < jnp.minimum(slots, trace.seats)) & ((s.nfront > 0) | s.pooled.any())

    s, _, tokens, _ = jax.lax.while_loop(admitting, admit, (s, budget, tokens, jnp.asarray(False)))
    return s, tokens


def _finish(trace: Lane, s: ExactState, rows, finished) -> ExactState:
    """Finished requests release their blocks in scheduling order, each last block first."""
    bs = trace.block_size
    if s.blocks is None:
        held = jnp.where(finished, _cdiv(s.computed[jnp.maximum(rows, 0)], bs), 0)
        return dataclasses.replace(s, free=s.free + held.sum(dtype=I32))

    def release(k, s):
        row = jnp.maximum(rows[k], 0)
        return _drop_blocks(s, row, jnp.where(finished[k], _cdiv(s.computed[row], bs), 0))

    return jax.lax.fori_loop(0, rows.shape[0], release, s)


def exact_step(rules: Rules, trace: Lane, s: ExactState) -> tuple[ExactState, StepLog]:
    """One schedule() + update_from_output() of one lane, vLLM's loops literally."""
    nrows, slots = trace.arrival.shape[0], s.seq.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    busy = (s.nrun + s.nfront > 0) | s.pooled.any()
    t, arrived, empty = _clock_and_arrivals(trace, s.t, s.arrived, busy, s.just_finished)
    rows_all = jnp.arange(nrows, dtype=I32)
    pooled = s.pooled | ((rows_all >= s.arrived) & (rows_all < arrived))
    s = dataclasses.replace(s, arrived=arrived, pooled=pooled)
    active = (s.nrun + s.nfront > 0) | pooled.any() | empty
    cap = _long_cap(trace, s.nrun + s.nfront + pooled.sum(dtype=I32))

    walked = jnp.where(pos < s.nrun, s.seq, -1)
    s, tokens, vic, nvic = _exact_running(rules, trace, s, cap)
    preempted = vic >= 0
    victim_rows = jnp.where(preempted, walked, nrows)
    out = dataclasses.replace(s.out, preemptions=s.out.preemptions.at[victim_rows].add(1, mode="drop"))
    s = _requeue(rules, dataclasses.replace(s, out=out), vic, nvic)
    # No admission in a step that preempted (a zero budget); without victims the seq's
    # running part is the walked list, so admissions append to it slot for slot.
    budget = jnp.where(nvic > 0, 0, trace.budget - tokens.sum(dtype=I32))
    s, tokens = _exact_waiting(trace, s, cap, budget, tokens)
    rows = jnp.where(nvic > 0, walked, jnp.where(pos < s.nrun, s.seq, -1))

    safe = jnp.maximum(rows, 0)
    computed = s.computed.at[jnp.where(tokens > 0, rows, nrows)].add(tokens, mode="drop")
    samples = (tokens > 0) & (computed[safe] == trace.prompt[safe] + s.generated[safe])
    generated = s.generated.at[jnp.where(samples, rows, nrows)].add(1, mode="drop")
    finished = samples & (generated[safe] == trace.output[safe])
    first = jnp.where(samples & (s.out.first_token[safe] < 0), rows, nrows)
    out = dataclasses.replace(s.out, first_token=s.out.first_token.at[first].set(t, mode="drop"),
                              finish=s.out.finish.at[jnp.where(finished, rows, nrows)].set(t, mode="drop"))
    s = _finish(trace, dataclasses.replace(s, computed=computed, generated=generated, out=out), rows, finished)
    done = jnp.zeros(nrows, bool).at[jnp.where(finished, rows, nrows)].set(True, mode="drop")
    keep = (pos < s.nrun + s.nfront) & ~done[jnp.maximum(s.seq, 0)]
    seq = _compact({"seq": s.seq}, keep, slots)["seq"]
    s = dataclasses.replace(s, t=t + 1, seq=jnp.where(pos < keep.sum(), seq, -1), nrun=s.nrun - finished.sum(dtype=I32),
                            just_finished=finished.any())
    return s, StepLog(t=t, active=active, rows=rows, tokens=tokens, preempted=preempted, finished=finished)


# ----------------------------------------------------------------------------------------
# Running lanes.


def init(rules: Rules, trace: Lane, shapes: Shapes):
    """The start state of one lane: FastState for `rules.closed_form`, else ExactState."""
    return fast_init(trace, shapes) if rules.closed_form else exact_init(rules, trace, shapes)


def step(rules: Rules, trace: Lane, state):
    """One step of one lane (`fast_step` or `exact_step` per the static rules)."""
    return fast_step(trace, state) if rules.closed_form else exact_step(rules, trace, state)


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 4))
def run(rules: Rules, lanes: Lane, num_steps: int, shapes: Shapes, log: bool = True):
    """`num_steps` steps of every lane (Lane with int32[L, ...] fields, `stack_lanes`).
    Returns (Outcome int32[L, R], StepLog with a leading [L, num_steps], or None). Steps
    after a lane is done are inactive no-ops. `shapes` is `shapes_of(lanes)`; call
    `check_run` first."""

    def lane(trace):
        def body(state, _):
            state, record = step(rules, trace, state)
            return state, record if log else None

        state, records = jax.lax.scan(body, init(rules, trace, shapes), None, length=num_steps)
        return state.out, records

    return jax.vmap(lane)(lanes)
