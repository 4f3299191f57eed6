"""`vllm`: the vLLM V1 scheduler's server (docs/VLLM.md), as a server component.

The engine owns the waiting queue and asks the policy for the next candidate; this server
owns what vLLM's scheduler does with requests once they are running, in one lane:

- a step's token budget (`max_num_batched_tokens`) and seats (`max_num_seqs`);
- KV memory in blocks of `block_size` tokens, `num_gpu_blocks` of them, the null block
  never free: a request holds ceil(computed / block_size) blocks;
- the running phase first (`begin_step`), in admission order: each running request asks for
  its remaining prefill (capped by `long_prefill_token_threshold` when more than one
  request runs or waits) or one decode token, within what is left of the budget; when its
  new blocks do not fit, a victim is preempted (recompute: its blocks are freed, it goes
  back to the front of its client's queue with the tokens it had generated, to be
  recomputed), until they fit or it preempts itself (then it leaves unscheduled and the
  walk goes on);
- admissions after (`fits`, `admit`), one per engine event in the policy's order, head of
  line: none in a step that preempted; a request is admitted only if its whole prompt
  (plus what it had generated) fits the free blocks, a seat is free and budget is left
  (with chunked prefill off: its whole first chunk); it is given min(left, its prompt,
  the cap) tokens, and blocks for those only;
- at the step's end (`end_step`), a request whose computed tokens reach its prompt plus
  generated tokens samples one token; when it has its output, it finishes and frees its
  blocks. The clock moves one step; a lane with nothing running or waiting jumps to its
  next arrival, after one empty step if the step finished a request (as vLLM's scheduler
  still counts a finished request until it is reported).

Under the `newest` victim rule (vLLM fcfs's) this is the closed form of vLLM's own loop
without prefix caching: the running list is kept as S slots in admission order and each
step is O(S) elementwise work, no loops. The other rules (`priority`, vLLM priority's, and
`counter`, a fairness option) run vLLM's walk as a loop from the first request that must
preempt (vllm_victims.py; left out of the program when no lane of the batch needs it,
`static_options`); lanes of one batch may mix rules. Runs hold far fewer requests than
the seats, so the driver tries 32 slots first (`slot_tiers`). Under vLLM's priority policy
the waiting order is the engine's: policy fcfs with strict bands, each (tenant, priority)
pair its own engine client (`priority_queues`). docs/VLLM.md states every rule and which
golden schedule of the real scheduler needs it.

Settings (`Settings.server_options`, vLLM's flag names): num_gpu_blocks, block_size, max_num_batched_tokens,
max_num_seqs, enable_chunked_prefill, long_prefill_token_threshold, scheduling_policy (fcfs | priority), victim
(newest | priority | counter; default vLLM's for the policy); token_times (keep each token's time: below).
Per request the server also keeps its first-token and finish steps, its preemptions and, given token_times T > 0,
each token's time (`Outcome`), and, when the shape asks for a log, each step's schedule (`ScheduleLog`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients
from vtc_jax.core.errors import InputError
from vtc_jax.core.rows import ORDER, OUTPUT, PROMPT
from vtc_jax.servers import base, block_math, step_time
from vtc_jax.servers.records import VLLM_FLAGS, outcome_record, timed_by_options, vllm_memory
from vtc_jax.servers.base import Finished, Requeue, Server, Work
from vtc_jax.servers.vllm_v1_state import (  # noqa: F401  (Outcome, ScheduleLog, _log, gpu_record: read by servers/vllm_prefix.py)
    _MOVED,
    ONE_HOT_CLIENTS,
    Outcome,
    ScheduleLog,
    VllmState,
    _at,
    _blocks,
    _excl_cumsum,
    _leading,
    _log,
    _per_client,
    _running,
    _select,
    add_gpu_time,
    census,
    gpu_record,
    init,
    load,
)
from vtc_jax.servers.vllm_victims import FIELDS, NEWEST, OUT, VICTIMS, walk
from vtc_jax.servers import vllm_v1_async

I32 = jnp.int32
INT_MAX = 2**31 - 1
LIMIT = INT_MAX // 4
OPTIONS = {  # name: (default, lowest; None: a flag or a choice)
    "num_gpu_blocks": (None, 2), "block_size": (16, 1), "max_num_batched_tokens": (2048, 1),
    "max_num_seqs": (256, 1), "enable_chunked_prefill": (True, None), "long_prefill_token_threshold": (0, 0),
    "scheduling_policy": ("fcfs", None), "victim": (None, None),
    "time_model": ("", None),  # the step-time model's text (servers/step_time.py); "": untimed
    "time_shares": (False, None),  # keep each client's share of each step's time (--cost time; static)
    # BLIS's engine where it departs from vLLM's without preemption (docs/TIMED.md): a step that finishes every
    # request it runs, with none waiting at its start, frees the engine from that start (a request queued before
    # the step ends starts the next step then); the long-prefill threshold caps every chunk (vLLM: only while
    # more than one request runs or waits)
    "blis_engine": (False, None),
    "token_times": (0, 0),  # entries of the per-token time record (a static size: the most of any lane; 0: none)
    "async_scheduling": (False, None),  # vLLM's AsyncScheduler (docs/VLLM_ASYNC.md); vLLM's own default is on (GPU)
}
POLICIES = ("fcfs", "priority")
CHOICES = {"scheduling_policy": POLICIES, "victim": VICTIMS}


def validate(options: dict) -> None:
    """InputError naming the first setting that is missing, unknown or out of range."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InputError(f"server vllm has no setting {unknown[0]!r} (its settings: {', '.join(OPTIONS)})")
    if "num_gpu_blocks" not in options:
        raise InputError("server vllm needs num_gpu_blocks (--num-gpu-blocks)")
    filled = settings(options)
    for name, (_, low) in OPTIONS.items():
        value = filled[name]
        if name == "time_model":
            if value:
                step_time.parse_text(value)  # refuses a malformed model in one line
        elif name in CHOICES:
            if value not in CHOICES[name]:
                raise InputError(f"{name} must be one of {', '.join(CHOICES[name])}, got {value!r}")
        elif low is None:
            if type(value) is not bool:
                raise InputError(f"{name} must be true or false, got {value!r}")
        elif type(value) is not int or not low <= value <= LIMIT:
            raise InputError(f"{name} must be an integer in [{low}, {LIMIT}], got {value!r}")
    if filled["max_num_batched_tokens"] < filled["max_num_seqs"]:  # vLLM's SchedulerConfig refuses it too
        raise InputError(f"max_num_batched_tokens ({filled['max_num_batched_tokens']}) is below max_num_seqs "
                         f"({filled['max_num_seqs']}): vLLM refuses a token budget smaller than its seats")


def settings(options: dict) -> dict:
    """The options with vLLM's defaults filled in (the victim: vLLM's for the policy,
    `newest` under fcfs, `priority` under priority)."""
    out = {name: options.get(name, default) for name, (default, _) in OPTIONS.items()}
    if out["victim"] is None:
        out["victim"] = "priority" if out["scheduling_policy"] == "priority" else "newest"
    return out


def encode(options: dict) -> dict:
    """The traced settings; the policy and the victim rule as int32 codes (their index in
    POLICIES, VICTIMS): lanes of one batch may differ."""
    s = settings(options)
    return {"block_size": np.int32(s["block_size"]), "block_shift": np.int32(block_math.block_shift(s["block_size"])),
            "num_blocks": np.int32(s["num_gpu_blocks"]),
            "budget": np.int32(s["max_num_batched_tokens"]), "seats": np.int32(s["max_num_seqs"]),
            "long_cap": np.int32(s["long_prefill_token_threshold"]), "chunked": np.bool_(s["enable_chunked_prefill"]),
            "policy": np.int32(POLICIES.index(s["scheduling_policy"])), "victim": np.int32(VICTIMS.index(s["victim"])),
            "async": np.bool_(s["async_scheduling"]), "blis_engine": np.bool_(s["blis_engine"]),
            **step_time.encode(*time_model(s))}


def time_model(s: dict) -> tuple[str, int, int]:
    """(time_model text, token budget, seats) of a lane's settings: what its step time
    is encoded from (step_time.encode, step_terms)."""
    return s["time_model"], s["max_num_batched_tokens"], s["max_num_seqs"]


def priority_queues(client, priority):
    """Per-request priorities as engine clients: each distinct (client, priority) pair of
    a trace becomes its own engine client, numbered by first appearance in trace order, so
    that the engine's strict bands (policy fcfs, `Settings.bands`) order the waiting queue
    by (priority, arrival) as vLLM's priority heap does, whatever priorities vary within a
    tenant. Returns (queue int64[N]: each request's engine client, band per queue: the
    rank of its priority among the distinct ones, 0 for the lowest (vLLM serves lower
    first), tenant per queue). Ranks keep the order and fit the bands' range."""
    client, priority = np.asarray(client), np.asarray(priority, np.int64)
    if client.shape != priority.shape or client.ndim != 1:
        raise InputError("client and priority must be 1-D and of equal length")
    pairs: dict = {}
    queue = np.asarray([pairs.setdefault((c.item(), int(q)), len(pairs)) for c, q in zip(client, priority)], np.int64)
    rank = {q: r for r, q in enumerate(sorted({q for _, q in pairs}))}
    return queue, [rank[q] for _, q in pairs], [c for c, _ in pairs]


def plan_slots(options: list, bound: int, requests: int) -> int:
    """Seats bound the running list: S = the most seats of any lane, at most the requests
    of a lane. (Not `bound`: with chunked prefill a running request may hold only part of
    its prompt, so more can run than M // the shortest prompt.)"""
    return max(1, min(requests, max(settings(o)["max_num_seqs"] for o in options)))


def peak_blocks(prompt, output, block_size):
    """ceil((P + O - 1) / B): a request's most blocks (its last token never gets KV)."""
    return -(-(np.asarray(prompt, np.int64) + np.asarray(output, np.int64) - 1) // block_size)


def never_served(options: dict, prompt, output, kv_budget: int) -> str | None:
    """Why some request could never finish on this server, or None: its peak blocks exceed
    the N - 1 usable (it would preempt itself forever); with chunked prefill off, a budget
    below vLLM's max_model_len."""
    s = settings(options)
    peak = peak_blocks(prompt, output, s["block_size"])
    worst = int(np.argmax(peak))
    if peak[worst] > s["num_gpu_blocks"] - 1:
        return (f"request {worst} needs {int(peak[worst])} KV blocks at its peak, more than the "
                f"{s['num_gpu_blocks'] - 1} usable (num_gpu_blocks - 1): it could never finish")
    if not s["enable_chunked_prefill"]:
        longest = -(-int((np.asarray(prompt) + np.asarray(output)).max()) // s["block_size"]) * s["block_size"]
        if s["max_num_batched_tokens"] < longest:
            return (f"with chunked prefill off vLLM needs max_num_batched_tokens >= max_model_len ({longest}), "
                    f"got {s['max_num_batched_tokens']}")
    return None


def drain_steps(options: dict, arrival, prompt, output, limit: int = INT_MAX // 2) -> int:
    """Newest victim: last arrival + sum of (prompt + output) + requests + 1. The first
    running request is never a victim (newest first; it cannot preempt itself: its peak
    fits, see `never_served`), so every step before the last finish computes a token of
    it, or nothing runs and the clock jumps to an arrival (after at most one empty step
    per finish). Other victims: no such bound is proved, as a victim's lost work is
    recomputed (under `priority` every step that preempts still schedules, and keeps, a
    request of smaller key than its victims', so a run ends; `counter`'s keys move with
    the counters). That bound times (requests + 1), capped at the engine's longest
    horizon (`limit`: 2^30 - 1, or a wide clock's), is a generous margin (a lane past it is
    flagged as not finished, never reported)."""
    steps = int(np.max(arrival)) + int(np.sum(prompt) + np.sum(output)) + len(prompt) + 1
    s = settings(options)
    if s["async_scheduling"]:  # a request's stop comes one step later: at most one step more per request
        steps += len(prompt) + 1
    if s["victim"] != "newest":
        steps = steps * (len(prompt) + 1)
    model = step_time.model_of_options(s)
    if model is not None:  # timed: each step lasts at most its longest (the full budget, every seat)
        longest = model.longest_step(s["max_num_batched_tokens"], s["max_num_seqs"],
                                     int(np.max(np.asarray(prompt, np.int64) + np.asarray(output, np.int64))))
        steps = int(np.max(arrival)) + steps * longest
    return min(steps, limit)


def fuzz_options(rng, prompt, output) -> dict:
    """Random valid settings for requests of these lengths (random.Random): a pool that
    holds the largest request's peak and a little more, a small budget and few seats,
    sometimes no chunking, a prefill cap, priority order or another victim rule."""
    block = rng.choice((1, 2, 4, 16))
    peak = int(peak_blocks(prompt, output, block).max())
    longest = -(-int((np.asarray(prompt) + np.asarray(output)).max()) // block) * block
    chunked = rng.random() < 0.8
    out = {"num_gpu_blocks": peak + 1 + rng.randint(0, 2 * peak), "block_size": block,
           "max_num_batched_tokens": rng.randint(1, 64) if chunked else longest + rng.randint(0, 32),
           "max_num_seqs": 1, "enable_chunked_prefill": chunked,
           "long_prefill_token_threshold": rng.choice((0, 0, rng.randint(1, 16)))}
    out["max_num_seqs"] = rng.randint(1, min(8, out["max_num_batched_tokens"]))  # vLLM refuses a budget below it
    if rng.random() < 0.3:
        out["scheduling_policy"] = "priority"
    if rng.random() < 0.2:
        out["victim"] = rng.choice(VICTIMS)
    return out



def static_options(options: list) -> tuple:
    """(("walks", some lane's victim rule is not `newest`: else vLLM's walk, vllm_victims.py, is left out of
    the program), ("token_times", the most entries any lane asks for: 0, no record), ("pow2_blocks", every
    lane's block size is a power of two, as vLLM's are: block counts are then shifts), ("async_scheduling", some
    lane schedules async: else servers/vllm_v1_async.py is left out of the program), ("time_shares", some lane
    keeps each client's share of each step's time: else step_time.slot_shares is left out), ("time_terms", the
    step-time features any lane's model uses, the only ones a step computes, and whether in scaled integers:
    step_time.step_terms))."""
    return (("walks", any(settings(o)["victim"] != "newest" for o in options)),
            ("token_times", max(settings(o)["token_times"] for o in options)),
            ("pow2_blocks", all(block_math.block_shift(settings(o)["block_size"]) >= 0 for o in options)),
            ("async_scheduling", any(settings(o)["async_scheduling"] for o in options)),
            ("time_shares", any(settings(o)["time_shares"] for o in options)),
            ("time_terms", step_time.step_terms(time_model(settings(o)) for o in options)))


SLOT_TIER = 32  # slots a first run tries (the bench workload's lanes hold at most ~26)


def slot_tiers(slots: int) -> tuple:
    """Slot counts to try before `slots` (servers/base.py): 32, then x4 (a lane that
    overflows a tier reruns with the next; every event costs O(slots))."""
    return tuple(SLOT_TIER << (2 * i) for i in range(8) if SLOT_TIER << (2 * i) < slots)



def _newest(state: VllmState, p: dict, cap, free):
    """The running phase under the newest-victim rule, closed form (module docstring).
    Returns ((tokens int32[S], nrun, free, budget left, victims `out` (OUT fields over S
    entries), nvic, gone bool[S]: out's entries that are victims, newest first), the
    walk's start for the other rules (slot, tokens int32[S] before it, budget and free
    blocks left there))."""
    slots = state.client.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    listed = pos < state.nrun
    # Asks above budget + 1 act like budget + 1 (never fully served): keeps sums in int32.
    total = state.prompt + state.generated
    need = jnp.where(listed, jnp.minimum(jnp.minimum(total - state.computed, cap), p["budget"] + 1), 0)
    held = jnp.where(listed, _blocks(state.computed, state, p), 0)
    sums = base.prefix_sum(jnp.stack([need, held[::-1]]))  # both scans in one
    before = p["budget"] - (sums[0] - need)  # budget left at each slot
    tail = sums[1][::-1]  # blocks held by slots >= m, non-increasing in m
    n = jnp.clip(before, 0, need)
    walked = listed & (before > 0)
    want = base.prefix_sum(jnp.where(walked, _blocks(state.computed + n, state, p) - held, 0))  # blocks taken by slots <= i
    # m_i: the start of the shortest tail whose blocks, freed, cover want_i: m_i = min(#{m
    # in [0, S] : tail_m >= want_i - free} - 1, nrun) (tail padded with a final 0, and
    # non-increasing). Slot i is scheduled when m_i > i, that is when the blocks held
    # after it cover it: tail_{i+1} >= want_i - free.
    after = jnp.concatenate([tail[1:], jnp.zeros(1, I32)])  # tail_{i+1}
    done = _leading(walked & (after >= want - free))  # slots < done are scheduled
    want_last = _at(want, done - 1)  # 0 when done is 0
    covered = (tail >= want_last - free).sum(dtype=I32) + (want_last - free <= 0).astype(I32)
    m_prev = jnp.where(done > 0, jnp.minimum(covered - 1, state.nrun), state.nrun)
    # The next slot walks, is still listed, and even the whole tail after it is not enough
    # (m <= done: it is the first slot that is not scheduled): it preempts itself. vLLM's
    # walk goes on, but the newest-victim rule has already taken everything after it, so
    # the phase ends here.
    self_preempt = (done < state.nrun) & _at(walked, done) & (done < m_prev)
    victim_from = jnp.where(self_preempt, done, m_prev)
    # Under any victim rule the walk is this one up to the first slot whose blocks are
    # short (`first`, S if none): where vLLM's walk has to start preempting.
    first = _leading(~(walked & (want > free)))
    pre = jnp.where(pos < first, n, 0)
    start = (first, pre, p["budget"] - pre.sum(dtype=I32), free - _at(want, first - 1))
    free = free + jnp.where(victim_from < state.nrun, _at(tail, victim_from), 0)
    free = free - want_last
    tokens = jnp.where(pos < done, n, 0)
    victim_from = jnp.minimum(victim_from, state.nrun)
    # Newest first, without a gather: the slot arrays reversed (entry j is slot S - 1 - j),
    # the victims their entries [S - nrun, S - victim_from).
    out = {name: getattr(state, name)[::-1] for name in OUT}
    gone = (pos >= slots - state.nrun) & (pos < slots - victim_from)
    return (tokens, victim_from, free, p["budget"] - tokens.sum(dtype=I32), out, state.nrun - victim_from, gone), start


def begin_step(state: VllmState, params, view, step, mask):
    """The running phase of step `step` where `mask` (module docstring): the closed form
    for lanes whose victim rule is `newest`, vLLM's walk (vllm_victims.py) for the others.
    Returns (state, Requeue): the victims in preemption order (each goes to the front of
    its client's queue in turn, so the last preempted is served first again)."""
    p = params.server
    slots = state.client.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    free = jnp.where(state.free == INT_MAX, p["num_blocks"] - 1, state.free)  # the first step: all but the null block
    waiting = over_clients.total(view.waiting)
    cap = jnp.where((p["long_cap"] > 0) & ((state.nrun + waiting > 1) | p["blis_engine"]), p["long_cap"],
                    INT_MAX).astype(I32)
    (tokens, nrun, free, left, out, nvic, gone), (first, pre, budget, unused) = _newest(state, p, cap, free)
    f, looping, survived = {}, jnp.zeros((), bool), pos < nrun
    if state.walks:
        # One loop for every lane: it starts from the closed form's result where the rule
        # is `newest` and takes no iteration there (so nothing is selected after it).
        looping = p["victim"] != NEWEST
        on = lambda a, b: jnp.where(looping, a, b)  # noqa: E731
        f = {name: getattr(state, name) for name in FIELDS} | {"tokens": on(pre, tokens)}
        f |= {"slot": pos} if state.asyncs else {}  # each survivor's start slot, carried along by the walk
        f, nrun, free, left, out, nvic = walk(f, on(state.nrun, nrun), first, on(unused, free), on(budget, left), out,
                                              on(0, nvic), cap, p["block_size"], p["victim"], params.band, view.counter,
                                              view.num, mask & looping)
        tokens = f.pop("tokens")
        gone = on(pos < nvic, gone)  # the walk's victims: entries [0, nvic), in preemption order
        if state.asyncs:
            survived = on(vllm_v1_async.survivors(f.pop("slot"), nrun), survived)
    r = state.out.preemptions.shape[0]
    preemptions = state.out.preemptions.at[jnp.where(mask & gone, out["index"], r)].add(1, mode="drop")
    requeue, finish = gone, state.out.finish
    if state.asyncs:  # victims whose last token was in flight stop in this step's update instead
        slots_now = {name: getattr(state, name) for name in FIELDS} | f | {"tokens": tokens}
        victim = (pos < state.nrun) & ~survived
        f, nrun, finish = vllm_v1_async.stop_victims(state, victim, slots_now, nrun, state.stamp, mask)
        tokens = f.pop("tokens")
        requeue = gone & vllm_v1_async.requeued(finish, out["index"])
    leaving = _per_client(jnp.ones_like(pos), out["client"], requeue, state.running.shape[0])
    logged = {}
    if state.log.t.shape[0]:  # the log's victims: rows in preemption order, then -1
        newest = state.index[jnp.clip(state.nrun - 1 - pos, 0, slots - 1)]
        logged = {"victims": jnp.where(pos < nvic, jnp.where(looping, out["index"], newest), -1)}
    new = dataclasses.replace(
        state, **f, **logged, t=step, free=free, cap=cap, nrun=nrun, preempted=nvic > 0,
        left=jnp.where(nvic > 0, 0, left), tokens=tokens,
        out=dataclasses.replace(state.out, preemptions=preemptions, finish=finish),
        running=state.running - leaving, active=(state.nrun > 0) | (waiting > 0) | state.just_finished)
    return _select(mask, new, state), Requeue(mask=mask & requeue, **out)


def fits(state: VllmState, params, row, *, generated):
    """bool[]: vLLM admits the request now (module docstring)."""
    p = params.server
    total = row[PROMPT] + generated
    ask = jnp.minimum(total, state.cap)
    # Seats, not slots: a lane whose slots are fewer than its seats reports overflow in
    # `admit` (flagged, never reported) rather than turning vLLM's admission away.
    return (~state.preempted & (state.left > 0) & (state.nrun < p["seats"])
            & (_blocks(total, state, p) <= state.free) & (p["chunked"] | (ask <= state.left)))


def admit(state: VllmState, params, row, client, value, step, mask, *, index, generated):
    """Seat the request at the end of the running list where `mask`: its first chunk."""
    p = params.server
    slots = state.client.shape[0]
    n = jnp.minimum(state.left, jnp.minimum(row[PROMPT] + generated, state.cap))
    at, r = jnp.where(mask, state.nrun, slots), state.out.scheduled.shape[0]
    put = lambda x, v: x.at[at].set(v, mode="drop")  # noqa: E731
    first = jnp.where(mask & (state.out.scheduled[jnp.clip(index, 0, r - 1)] < 0), index, r)  # a readmission keeps it
    new = dataclasses.replace(
        state, client=put(state.client, client), value=put(state.value, value), index=put(state.index, index),
        prompt=put(state.prompt, row[PROMPT]), output=put(state.output, row[OUTPUT]), computed=put(state.computed, 0),
        generated=put(state.generated, generated), tokens=put(state.tokens, n),
        order=put(state.order, row[ORDER]), nrun=state.nrun + mask.astype(I32),
        running=state.running + ((jnp.arange(state.running.shape[0]) == client) & mask).astype(I32),
        free=state.free - jnp.where(mask, _blocks(n, state, p), 0), left=state.left - jnp.where(mask, n, 0),
        out=dataclasses.replace(state.out, scheduled=state.out.scheduled.at[first].set(step, mode="drop"),
                                times=base.token_rows(state.out.times, index, row[OUTPUT], mask)))
    return new, mask & (state.nrun >= slots)


def end_step(state: VllmState, params, mask):
    """The step's tokens are computed where `mask`: samples, finishes, the log. (No
    request is leaving: a step ends only once the last one's completions are settled.)
    A finished request stays in its slot, leaving, until `complete` hands it back."""
    p = params.server
    slots = state.client.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    listed = pos < state.nrun
    computed = state.computed + state.tokens
    samples = listed & (state.tokens > 0) & (computed == state.prompt + state.generated)
    generated = state.generated + samples
    if state.asyncs:  # a last token counts, and its request stops, one step later (servers/vllm_v1_async.py)
        generated = vllm_v1_async.sample_counts(state, samples, p["async"])
    finished = listed & (generated == state.output)
    rows, k = state.out.first_token.shape[0], state.running.shape[0]
    # A decode computes the one token after every known one (c = P + g - 1); anything else
    # scheduled is prefill (a prompt, or a recompute after a preemption).
    decoding = listed & (state.generated > 0) & (state.computed == state.prompt + state.generated - 1)
    slots_now = (jnp.where(listed, state.tokens, 0), decoding, state.prompt + state.generated, state.computed)
    elapsed = step_time.duration(p, *slots_now, terms=state.terms)
    shares = step_time.slot_shares(p, *slots_now, terms=state.terms) if state.shares else None
    stamp = jnp.where(p["timed"], state.t + elapsed, state.t)  # timed: the end of the step
    fresh = mask & samples & (state.generated == 0)  # its first token ever (a recompute keeps its count)
    first = state.out.first_token.at[jnp.where(fresh, state.index, rows)].set(stamp, mode="drop")
    counted = mask & samples  # a masked-off call computes nothing
    times = base.token_stamps(state.out.times, state.index, state.generated, stamp, counted)  # token `generated`
    log = _log(state.log, mask & state.active, state.t, jnp.where(listed, state.index, -1),
               jnp.where(listed, state.tokens, 0), finished, state.victims)
    nfin = finished.sum(dtype=I32)
    new = dataclasses.replace(
        state, computed=computed, generated=generated, tokens=jnp.zeros_like(state.tokens), ndone=nfin,
        ended=jnp.where(p["async"], state.stamp, stamp) if state.asyncs else stamp, stamp=stamp, just_finished=nfin > 0,
        free=state.free + jnp.where(finished, _blocks(computed, state, p), 0).sum(dtype=I32),
        out=add_gpu_time(dataclasses.replace(state.out, first_token=first, times=times), state.index, shares,
                         mask & listed & state.shares),
        log=log, preempted=jnp.zeros((), bool),
        **({"victims": jnp.full(slots, -1, I32)} if state.log.t.shape[0] else {}))
    work = Work(decoded=_per_client(samples.astype(I32), state.client, counted, k),
                attended=_per_client(state.prompt + state.generated, state.client, counted, k),
                elapsed=elapsed, emptied=mask & p["blis_engine"] & (state.nrun > 0) & (nfin == state.nrun),
                time=None if shares is None else _per_client(shares, state.client, mask & listed, k))
    return _select(mask, new, state), work



def due(state: VllmState, step) -> jax.Array:
    return state.ndone > 0


def complete(state: VllmState, step, mask):
    """The first leaving request (in scheduling order) is handed back where `mask`, its
    finish (the step that finished it: `ended`) written (one row per event, where
    `end_step` would write every slot's; a lane is done only once its completions are
    settled, so every finish is written): the slots after it move down one (the running
    list keeps its order), an empty slot (0) after them. Its `tokens` are 0 (the step
    ended), as every slot's: not moved."""
    slots = state.client.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    leaving = (pos < state.nrun) & (state.generated == state.output)
    at = _leading(~leaving)  # the first leaving slot (slots when none)
    done = Finished(client=_at(state.client, at), prompt=_at(state.prompt, at), output=_at(state.output, at),
                    value=_at(state.value, at))
    leaves = mask & (state.ndone > 0)
    moving = leaves & (pos >= at)

    def shift(x):
        up = jnp.concatenate([x[1:], jnp.zeros((1,) + x.shape[1:], x.dtype)])
        return jnp.where(moving.reshape((slots,) + (1,) * (x.ndim - 1)), up, x)

    k, rows = state.running.shape[0], state.out.finish.shape[0]
    one = leaves.astype(I32)
    finish = state.out.finish.at[jnp.where(leaves, _at(state.index, at), rows)].set(state.ended, mode="drop")
    return dataclasses.replace(state, ndone=state.ndone - one, nrun=state.nrun - one,
                               out=dataclasses.replace(state.out, finish=finish),
                               running=state.running - ((jnp.arange(k) == done.client) & leaves).astype(I32),
                               **{name: shift(getattr(state, name)) for name in _MOVED}), done


def busy(state: VllmState) -> jax.Array:
    return state.nrun > 0


def kv_blocks(state: VllmState, params):
    """(used, usable) int32[]: blocks in use and the pool's usable blocks (num_gpu_blocks - 1:
    the null block holds none); before the first step every usable block is free."""
    usable = params.server["num_blocks"] - 1
    free = jnp.where(state.free == INT_MAX, usable, state.free)
    return usable - free, usable


VLLM = Server(name="vllm", description="vLLM V1's scheduler: token budget, seats, KV blocks, chunked prefill, "
              "preemption by recompute (docs/VLLM.md)",
              init=init, load=load, fits=fits, admit=admit, end_step=end_step, due=due, complete=complete,
              census=census, busy=busy, validate=validate, encode=encode, plan_slots=plan_slots, preempts=True,
              begin_step=begin_step, never_served=never_served, drain_steps=drain_steps, events_per_step=3,
              fuzz_options=fuzz_options, slot_tiers=slot_tiers, static_options=static_options, keeps_time=timed_by_options,
              request_record=outcome_record, record_index="row", default_memory=vllm_memory,
              trace_columns=("priority",), step_time_model=True, flags=tuple(VLLM_FLAGS.items()), kv_blocks=kv_blocks,
              wide_clock=True)
