"""`sglang`'s settings and state (servers/sglang.py): SGLang's flags and their validation and
encoding (host side), the per-lane state and its small pure helpers.

Settings (`Settings.server_options`, SGLang's names): max_total_tokens (the KV pool in
tokens, page size 1), max_running_requests (capped at max_total_tokens // 2 as SGLang
does), chunked_prefill_size (<= 0: chunking off), max_prefill_tokens, schedule_conservativeness,
schedule_policy (fcfs), and `prefix_blocks` (the trace's content, inputs/prefix_blocks.py:
prefix groups). SGLang's environment constants keep their defaults (ENGINE_SGLANG.md A0).
Options SGLang has that this server does not model are refused by name: the overlap loop
(`disable_overlap_schedule` must stay True), mixed chunk, priority scheduling, retraction
policy `priority`, page size > 1, the radix cache disabled, and schedule policies other than
fcfs (lpm is SGLang's, not yet modelled here; the others are refused by SGLang's names).

The new-token ratio and the admission budget's offsets are doubles, as in SGLang's Python:
a lane runs under JAX's 64-bit mode (`Server.x64`), its counts stay int32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs.prefix_blocks import PrefixTable
from vtc_jax.servers import base, sglang_radix, step_time
from vtc_jax.servers.base import ServerShape
from vtc_jax.servers.vllm_v1_state import Outcome, ScheduleLog, gpu_record

I32, F64 = jnp.int32, jnp.float64
INT_MAX = 2**31 - 1
LIMIT = INT_MAX // 4
NO_CHUNK = LIMIT  # rem_chunk_tokens when chunking is off (never the binding budget)

OPTIONS = {  # name: (default, lowest; None: a flag or a choice)
    "max_total_tokens": (None, 2), "max_running_requests": (None, 1), "chunked_prefill_size": (8192, None),
    "max_prefill_tokens": (16384, 1), "schedule_conservativeness": (1.0, None), "schedule_policy": ("fcfs", None),
    "disable_overlap_schedule": (True, None), "enable_mixed_chunk": (False, None),
    "enable_priority_scheduling": (False, None), "retraction_policy": ("length", None), "page_size": (1, None),
    "disable_radix_cache": (False, None), "prefix_blocks": (None, None),
    "time_model": ("", None),  # the step-time model's text (servers/step_time.py); "": untimed, a step lasts 1
    "token_times": (0, 0),  # entries of the per-token time record (a static size: the most of any lane; 0: none)
    "time_shares": (False, None),  # keep each request's share of each step's time (--cost time, GPU time; static)
}
FLAGS = (("max_total_tokens", "--max-total-tokens"), ("max_running_requests", "--max-running-requests"),
         ("chunked_prefill_size", "--chunked-prefill-size"), ("max_prefill_tokens", "--max-prefill-tokens"),
         ("schedule_conservativeness", "--schedule-conservativeness"), ("schedule_policy", "--schedule-policy"))
SCHEDULE_POLICIES = ("fcfs",)
SGLANG_POLICIES = ("lpm", "random", "dfs-weight", "lof", "priority", "routing-key", "hrrn", "shortest-prefill-first")
# SGLang's environment constants (ENGINE_SGLANG.md A0)
CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20


def settings(options: dict) -> dict:
    """Every setting, defaults filled in (the prefix table apart)."""
    return {name: options.get(name, default) for name, (default, _) in OPTIONS.items()}


def _refuse_unmodelled(s: dict) -> None:
    if s["disable_overlap_schedule"] is not True:
        raise InputError("the overlap event loop is not supported: server sglang models event_loop_normal "
                         "(--disable-overlap-schedule)")
    if s["enable_mixed_chunk"]:
        raise InputError("--enable-mixed-chunk (mixed chunked prefill) is not supported by server sglang")
    if s["enable_priority_scheduling"]:
        raise InputError("--enable-priority-scheduling is not supported by server sglang")
    if s["retraction_policy"] != "length":
        raise InputError(f"--retraction-policy {s['retraction_policy']} is not supported by server sglang "
                         "(only length)")
    if s["page_size"] != 1:
        raise InputError(f"--page-size {s['page_size']} is not supported by server sglang (only 1)")
    if s["disable_radix_cache"]:
        raise InputError("--disable-radix-cache is not supported by server sglang (it runs the radix cache)")
    policy = s["schedule_policy"]
    if policy in SGLANG_POLICIES:
        raise InputError(f"--schedule-policy {policy} is not supported by server sglang yet (only fcfs)")
    if policy not in SCHEDULE_POLICIES:
        raise InputError(f"--schedule-policy must be one of {', '.join(SCHEDULE_POLICIES)}, got {policy!r}")


def validate(options: dict) -> None:
    """InputError naming the first setting that is missing, unknown, out of range or not modelled."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InputError(f"server sglang has no setting {unknown[0]!r} (its settings: {', '.join(OPTIONS)})")
    for name in ("max_total_tokens", "max_running_requests"):
        if name not in options:
            raise InputError(f"server sglang needs {name} (--{name.replace('_', '-')})")
    s = settings(options)
    _refuse_unmodelled(s)
    for name, (_, low) in OPTIONS.items():
        value = s[name]
        if name == "time_shares" and type(value) is not bool:
            raise InputError(f"time_shares must be true or false, got {value!r}")
        if low is not None and (type(value) is not int or not low <= value <= LIMIT):
            raise InputError(f"{name} must be an integer in [{low}, {LIMIT:,}], got {value!r}")
    if type(s["chunked_prefill_size"]) is not int or abs(s["chunked_prefill_size"]) > LIMIT:
        raise InputError(f"chunked_prefill_size must be an integer (<= 0: chunking off), got "
                         f"{s['chunked_prefill_size']!r}")
    c = s["schedule_conservativeness"]
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < 1e6:
        raise InputError(f"schedule_conservativeness must be a number > 0, got {c!r}")
    if s["time_model"]:
        step_time.parse_text(s["time_model"])  # refuses a malformed model in one line
    table = s["prefix_blocks"]
    if table is not None:
        if not isinstance(table, PrefixTable):
            raise InputError("prefix_blocks must be a PrefixTable (inputs/prefix_blocks.py)")
        if table.ident.kind != "groups":
            raise InputError(f"server sglang reads prefix groups (prefix_id, prefix_len), not {table.ident.kind}")


def rows(s: dict) -> int:
    """Request rows (req_to_token_pool): min(max_running_requests, max_total_tokens // 2)."""
    return min(int(s["max_running_requests"]), int(s["max_total_tokens"]) // 2)


def ratio_constants(s: dict) -> tuple[float, float, float]:
    """(init, min, decay) of SGLang's NewTokenRatioTracker, in doubles."""
    init = min(INIT_NEW_TOKEN_RATIO * float(s["schedule_conservativeness"]), 1.0)
    low = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
    return init, low, (init - low) / NEW_TOKEN_RATIO_DECAY_STEPS


def _groups(s: dict) -> tuple[np.ndarray, np.ndarray]:
    """(group, shared) int32[R'] by ORDER rank (R' a power of two >= 64; -1, 0 past the trace)."""
    table = s["prefix_blocks"]
    n = 0 if table is None else len(table)
    size = max(64, 1 << max(n - 1, 0).bit_length())
    group, shared = np.full(size, -1, np.int32), np.zeros(size, np.int32)
    if n:
        key = np.asarray(table.ident.key, np.int64)[table.order]
        length = np.minimum(np.asarray(table.ident.prefix_len, np.int64)[table.order], table.prompt[table.order])
        has = (key >= 0) & (length > 0)
        group[:n] = np.where(has, key, -1)
        shared[:n] = np.where(has, length, 0)
    return group, shared


def encode(options: dict) -> dict:
    s = settings(options)
    init, low, decay = ratio_constants(s)
    chunk = int(s["chunked_prefill_size"])
    group, shared = _groups(s)
    return {**step_time.encode(*time_model(s)),"kv_tokens": np.int32(s["max_total_tokens"]), "rows": np.int32(rows(s)),
            "chunk": np.int32(chunk if chunk > 0 else 0), "max_prefill": np.int32(s["max_prefill_tokens"]),
            "ratio_init": np.float64(init), "ratio_min": np.float64(low), "ratio_decay": np.float64(decay),
            "group": group, "shared": shared}


def time_model(s: dict) -> tuple[str, int, int]:
    """(time_model text, the most tokens a step computes, the most requests it runs): a
    step's tokens never pass the pool, its requests the rows."""
    return s["time_model"], int(s["max_total_tokens"]), rows(s)


def static_options(options: list) -> tuple:
    """(("time_terms", the step-time features any lane's model uses: step_time.step_terms),
    ("time_shares", some lane keeps each request's share of each step's time), ("token_times", the most
    entries of any lane's per-token record))."""
    return (("time_terms", step_time.step_terms(time_model(settings(o)) for o in options)),
            ("time_shares", any(bool(settings(o)["time_shares"]) for o in options)),
            ("token_times", max(int(settings(o)["token_times"]) for o in options)))


DEFAULT_RUNNING = 4096  # SGLang's max_running_requests when unset: clamp(pool / context_len x 512, 2048, 4096)


def model_options(model, options: dict) -> dict:
    """Settings from a step-time model (--preset / --step-time / --roofline): the KV pool it
    names as --max-total-tokens ((num_gpu_blocks - 1) x 16 tokens: the tokens vLLM's pool
    of those blocks holds, the same GPU's KV), SGLang's max_running_requests default for a
    model whose context fits the pool 8 times over (4096, capped at the pool // 2), and the
    model checked against the longest step they allow."""
    options = dict(options)
    if "max_total_tokens" not in options:
        if model.num_gpu_blocks is None:
            raise InputError(f"step-time model {model.name} names no KV pool: give --max-total-tokens")
        options["max_total_tokens"] = (int(model.num_gpu_blocks) - 1) * 16
    options.setdefault("max_running_requests", min(DEFAULT_RUNNING, int(options["max_total_tokens"]) // 2))
    s = settings(options)
    model.check(min(int(s["max_total_tokens"]), max(int(s["max_prefill_tokens"]), int(s["chunked_prefill_size"]))),
                rows(s))
    return options


def memory(options: dict) -> int | None:
    """M, the KV tokens the server holds: max_total_tokens (None when not given)."""
    value = dict(options).get("max_total_tokens")
    return None if value is None else int(value)


def plan_slots(options: list, bound: int, requests: int) -> int:
    """Running slots: the most request rows of any lane (a request holds a row while it runs)."""
    return max(1, min(max(rows(settings(o)) for o in options), max(int(requests), 1)))


def never_served(options: dict, prompt, output, kv_budget: int) -> str | None:
    """A request whose prompt and output cannot be held by the KV pool never finishes."""
    kv = int(settings(options)["max_total_tokens"])
    need = np.asarray(prompt, np.int64) + np.asarray(output, np.int64)
    if need.size and int(need.max()) + 1 > kv:
        return (f"a request needs {int(need.max()):,} KV tokens (prompt + output) but the pool holds {kv:,} "
                "(--max-total-tokens)")
    return None


def drain_steps(options: dict, arrival, prompt, output, limit: int = INT_MAX // 2) -> int:
    """Iterations that surely drain the trace: every request prefilled in chunks of one
    token and decoded alone, retracted at most once per token it generates, after the last
    arrival (a generous bound: the run stops when it drains); on a timed lane each such
    iteration at the model's longest step."""
    p, o = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    work = int((p + o).sum()) * 2 + int(o.sum()) * int(o.max(initial=1)) + 16
    last = int(np.asarray(arrival, np.int64).max(initial=0))
    s = settings(options)
    model = step_time.model_of_options(s)
    if model is not None:  # timed: each step lasts at most its longest (the whole pool, every row)
        budget, seats = int(s["max_total_tokens"]), rows(s)
        work *= model.longest_step(budget, seats, int((p + o).max(initial=1)))
    return int(min(limit, last + work))


def fuzz_options(rng, prompt, output) -> dict:
    """Random valid settings that hold every request of such a trace."""
    need = int(max(p + o for p, o in zip(prompt, output))) + 2
    kv = need + rng.randint(0, 3 * need)
    return {"max_total_tokens": kv, "max_running_requests": rng.randint(1, 6),
            "chunked_prefill_size": rng.choice([0, -1, rng.randint(4, 64)]),
            "max_prefill_tokens": rng.randint(8, 256), "schedule_conservativeness": rng.choice([0.3, 1.0, 1.7])}


def arrival_order(arrival, rows) -> np.ndarray:
    """The SGLang golden harness's order of same-iteration arrivals: requests that arrive at
    the same scheduler iteration join SGLang's waiting queue sorted by their request id as a
    STRING, and a row's request id is r<row> (its 0-based data row in the file), so "r10"
    comes before "r8" and "r9" (tests/data/sglang_golden/README.md). int64[N]: the trace's
    row indices stably sorted by (arrival, "r%d" % row); `rows`: each request's file row."""
    arrival = np.asarray(arrival, np.int64)
    rid = np.array(["r%d" % r for r in np.asarray(rows, np.int64).tolist()], dtype=str)
    return np.lexsort((np.arange(len(arrival)), rid, arrival)).astype(np.int64)


# ----------------------------------------------------------------------------------------
# The state.

FREE, RUN, NEW, DONE = 0, 1, 2, 3  # a slot's phase: NEW = in this iteration's prefill list (the last one's after it)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SglangState:
    """One lane.

    tree: the radix cache (sglang_radix.Tree). Per slot, int32[S]: phase (FREE, RUN: in the
    running batch, NEW: in the prefill list, DONE: finished, not yet handed back), pos (its
    place in its list: running order, or admission order), client, value, index (workload
    row), order (ORDER rank: its identity's row), prompt, output (max_new_tokens), group,
    shared (its prefix group), n_out (tokens generated), prefix_len, extend_end, kv_alloc
    (KV slots it holds), protected (cache_protected_len), lock (the node it locks, -1 none),
    middle (inflight middle chunks); bool[S] holds_row. Scalars: kv_free, rows_free, chunk
    (the chunked request's slot, -1 none), next_pos, refresh_calls, a_count (the prefill
    list's length), rem_input, rem_chunk, current (current_offset), t_begin (the last
    BEGIN's step), t_end (when the last step ended: a BEGIN past it follows idle
    iterations): int32; ratio, total (total_offset): float64; full (the sticky
    batch_is_full), open (this iteration's prefill pass is open), stopped (the adder broke
    after an admission), last_extend (the last batch was a prefill), l_shrank, r_shrank
    (the last batch's list shrank: batch_is_full resets), flagged (SGLang ran out of KV, a
    request was aborted, or the tree was full: the lane is not finished), started (the
    first BEGIN set the pool, the rows and the ratio from the lane's settings): bool.
    out: per workload row first token,
    finish, retractions (Outcome.preemptions); log: the first L iterations that ran a batch
    or retracted (ScheduleLog; `preempted`: the rows retracted).
    """

    tree: sglang_radix.Tree
    phase: jax.Array
    pos: jax.Array
    client: jax.Array
    value: jax.Array
    index: jax.Array
    order: jax.Array
    prompt: jax.Array
    output: jax.Array
    group: jax.Array
    shared: jax.Array
    n_out: jax.Array
    prefix_len: jax.Array
    extend_end: jax.Array
    kv_alloc: jax.Array
    protected: jax.Array
    lock: jax.Array
    middle: jax.Array
    holds_row: jax.Array
    kv_free: jax.Array
    rows_free: jax.Array
    chunk: jax.Array
    next_pos: jax.Array
    refresh_calls: jax.Array
    a_count: jax.Array
    rem_input: jax.Array
    rem_chunk: jax.Array
    current: jax.Array
    t_begin: jax.Array
    t_end: jax.Array
    ratio: jax.Array
    total: jax.Array
    full: jax.Array
    open: jax.Array
    stopped: jax.Array
    last_extend: jax.Array
    l_shrank: jax.Array
    r_shrank: jax.Array
    flagged: jax.Array
    started: jax.Array
    out: Outcome
    log: ScheduleLog
    num_clients: int = dataclasses.field(default=1, metadata={"static": True})  # K, for per-client counts
    terms: tuple = dataclasses.field(default=(), metadata={"static": True})  # step_time.step_terms of the batch
    shares: bool = dataclasses.field(default=False, metadata={"static": True})  # some lane keeps time shares


_SLOT_FIELDS = ("phase", "pos", "client", "value", "index", "order", "prompt", "output", "group", "shared", "n_out",
                "prefix_len", "extend_end", "kv_alloc", "protected", "middle")


def tree_capacity(shape: ServerShape) -> int:
    """Radix nodes a lane keeps: each request's path adds at most a leaf and two splits, and
    the pool's cached tokens bound the rest (a node holds at least one); static, from the
    shape (the tree flags the lane when it fills)."""
    return max(16, 4 * shape.num_rows + 4 * shape.slots + 2)


def init(shape: ServerShape) -> SglangState:
    s, r, steps = shape.slots, shape.num_rows, shape.log_steps
    zero, empty, f = jnp.zeros((), I32), jnp.zeros(s, I32), jnp.zeros((), bool)
    never = jnp.full(r, -1, shape.clock)
    return SglangState(
        tree=sglang_radix.init(tree_capacity(shape)), **{name: empty for name in _SLOT_FIELDS},
        lock=jnp.full(s, -1, I32), holds_row=jnp.zeros(s, bool), kv_free=zero, rows_free=zero,
        chunk=jnp.full((), -1, I32), next_pos=zero, refresh_calls=zero, a_count=zero, rem_input=zero, rem_chunk=zero,
        current=zero, t_begin=jnp.full((), -2, I32), t_end=jnp.full((), -1, I32), ratio=jnp.zeros((), F64),
        total=jnp.zeros((), F64),
        full=f, open=f, stopped=f, last_extend=f, l_shrank=f, r_shrank=f, flagged=f, started=f,
        out=Outcome(first_token=never, finish=never, preemptions=jnp.zeros(r, I32), scheduled=never,
                    times=base.token_times(shape), gpu_us=gpu_record(shape)),
        log=ScheduleLog(count=zero, t=jnp.zeros(steps, shape.clock), index=jnp.full((steps, s), -1, I32),
                        tokens=jnp.zeros((steps, s), I32), finished=jnp.zeros((steps, s), bool),
                        preempted=jnp.full((steps, s), -1, I32)), num_clients=shape.num_clients,
        terms=dict(shape.static).get("time_terms", ()), shares=dict(shape.static).get("time_shares", False))


def ident(st: SglangState, i) -> sglang_radix.Ident:
    """Slot i's token identity (its ORDER rank names its own tokens)."""
    return sglang_radix.Ident(group=st.group[i], shared=st.shared[i], prompt=st.prompt[i], row=st.order[i])


def fill(st: SglangState):
    """int32[S]: prompt + generated tokens per slot."""
    return st.prompt + st.n_out


def live(st: SglangState):
    """bool[S]: slots whose request is in the server and not finished (running or in the prefill list)."""
    return (st.phase == RUN) | (st.phase == NEW)


def census(host: SglangState, num_clients: int) -> np.ndarray:
    """int64[B, K]: requests the server holds per client (running, in the prefill list, or
    finished and not yet handed back), counted from the slots."""
    phase, client = np.asarray(host.phase), np.asarray(host.client)
    phase, client = phase.reshape(-1, phase.shape[-1]), client.reshape(-1, client.shape[-1])
    out = np.zeros((phase.shape[0], num_clients), np.int64)
    for b in range(phase.shape[0]):
        held = phase[b] != FREE
        out[b] += np.bincount(client[b][held], minlength=num_clients)[:num_clients]
    return out
