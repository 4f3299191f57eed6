"""The `vllm` server's per-lane state (servers/vllm_v1.py has the rules): the state and the
records it keeps (`VllmState`, `Outcome`, `ScheduleLog`), its empty value (`init`), the slot
helpers every event uses, and the host-side readers (`load`, `census`). Split from
vllm_v1.py for size; every name here is importable from there too."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.servers import base, block_math
from vtc_jax.servers.base import Load, ServerShape

I32 = jnp.int32
INT_MAX = 2**31 - 1

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Outcome:
    """Per workload row, int32[R]: first_token and finish (-1: not yet): the step, or on a
    timed lane the end of that step in us; scheduled: the start of the step that first
    scheduled it (-1: never); preemptions; times: each token's time, the same stamps.
    Stamps (first_token, finish, scheduled, times) are of the lane's clock dtype
    (ServerShape.clock: int64 for a wide clock), as are VllmState's t, ended, stamp and
    ScheduleLog.t. gpu_us: int32[R] each request's share of the steps' time in us
    (step_time.slot_shares), kept where some lane keeps time shares (None: not kept)."""

    first_token: jax.Array
    finish: jax.Array
    preemptions: jax.Array
    scheduled: jax.Array
    times: base.TokenTimes
    gpu_us: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScheduleLog:
    """The first L steps that did anything (L = ServerShape.log_steps; 0: none kept):
    count int32[]; t int32[L]; per step and slot, in vLLM's order (the running list, then
    admissions), index int32[L, S] (workload row, -1 none), tokens int32[L, S] scheduled,
    finished bool[L, S]; preempted int32[L, S] the rows preempted (-1 none)."""

    count: jax.Array
    t: jax.Array
    index: jax.Array
    tokens: jax.Array
    finished: jax.Array
    preempted: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class VllmState:
    """One lane. Scalars int32[]: t (the step in progress), nrun (slots [0, nrun) are the running list, in
    admission order, with the leaving requests still in their places), ndone (leaving requests: finished,
    generated == output, not yet handed back; none once the step's completions are settled, so the running phase
    and admissions see the running list alone), ended (the leaving requests' finish, written to `out` as each is
    handed back: the last step's end stamp, or under async scheduling the one before: their last token's), stamp
    (the last step's end stamp), free blocks, left (budget left this step), cap (the prefill cap
    this step); bool[]: preempted (this step preempted), just_finished (the last step finished a request),
    active (the step has something to log); running: int32[K] requests per client in the server (leaving ones
    included). Per slot, int32[S]: client, value (the policy's), index (workload row), prompt, output, computed,
    generated, tokens (scheduled this step), order (the request's ORDER field: the priority victim's key). out:
    Outcome; log; victims int32[S]: the rows this step preempted, in preemption order (-1 none; kept only when
    there is a log, else always -1). Slots at or past nrun hold no request (what they hold is never read).

    Async scheduling (docs/VLLM_ASYNC.md) adds two slot states: a request that sampled its last token in the last
    step and stops in this step's update keeps generated = output - 1 with computed = prompt + generated (it asks
    for 0 tokens, so the running phase skips it, but it holds its blocks and its seat); one preempted in that state
    (a victim whose last token was in flight) is back in a slot after the running phase with computed 0 and
    generated = output, to stop in this step's update without its blocks."""

    t: jax.Array
    nrun: jax.Array
    free: jax.Array
    left: jax.Array
    cap: jax.Array
    preempted: jax.Array
    just_finished: jax.Array
    active: jax.Array
    running: jax.Array
    client: jax.Array
    value: jax.Array
    index: jax.Array
    prompt: jax.Array
    output: jax.Array
    computed: jax.Array
    generated: jax.Array
    tokens: jax.Array
    order: jax.Array
    ndone: jax.Array
    ended: jax.Array
    stamp: jax.Array
    out: Outcome
    log: ScheduleLog
    victims: jax.Array
    walks: bool = dataclasses.field(default=True, metadata={"static": True})  # some lane's rule is not `newest`
    # every lane's block size is a power of two: block counts are shifts (`_blocks`)
    pow2_blocks: bool = dataclasses.field(default=False, metadata={"static": True})
    asyncs: bool = dataclasses.field(default=False, metadata={"static": True})  # some lane schedules async
    shares: bool = dataclasses.field(default=False, metadata={"static": True})  # some lane keeps time shares
    terms: tuple = dataclasses.field(default=(), metadata={"static": True})  # step_time.step_terms of the batch


def gpu_record(shape: ServerShape):
    """Outcome.gpu_us of a fresh lane: int32[R] zeros where the batch keeps time shares
    (the static option `time_shares`), else None."""
    return jnp.zeros(shape.num_rows, I32) if dict(shape.static).get("time_shares", False) else None


def add_gpu_time(out: Outcome, index, shares, mask) -> Outcome:
    """`out` with each slot's time share (int32[S]) added to its request's gpu_us where
    `mask` (bool[S]); unchanged when none is kept."""
    if out.gpu_us is None:
        return out
    rows = out.gpu_us.shape[0]
    return dataclasses.replace(out, gpu_us=out.gpu_us.at[jnp.where(mask, index, rows)].add(shares, mode="drop"))


_SLOTS = ("client", "value", "index", "prompt", "output", "computed", "generated", "tokens", "order")
_MOVED = ("client", "value", "index", "prompt", "output", "computed", "generated", "order")  # by `complete`


def init(shape: ServerShape) -> VllmState:
    s, r, steps, k = shape.slots, shape.num_rows, shape.log_steps, shape.num_clients
    zero, empty = jnp.zeros((), I32), jnp.zeros(s, I32)
    now, never = jnp.zeros((), shape.clock), jnp.full(r, -1, shape.clock)  # stamps: the lane's clock
    return VllmState(
        t=now, nrun=zero, free=jnp.full((), INT_MAX, I32), left=zero, cap=zero, preempted=jnp.zeros((), bool),
        just_finished=jnp.zeros((), bool), active=jnp.zeros((), bool), running=jnp.zeros(k, I32),
        **{f: empty for f in _SLOTS},
        ndone=zero, ended=now, stamp=now,
        out=Outcome(first_token=never, finish=never, preemptions=jnp.zeros(r, I32), scheduled=never,
                    times=base.token_times(shape), gpu_us=gpu_record(shape)),
        log=ScheduleLog(count=zero, t=jnp.zeros(steps, shape.clock), index=jnp.full((steps, s), -1, I32),
                        tokens=jnp.zeros((steps, s), I32), finished=jnp.zeros((steps, s), bool),
                        preempted=jnp.full((steps, s), -1, I32)),
        victims=jnp.full(s, -1, I32), walks=dict(shape.static).get("walks", True),
        pow2_blocks=dict(shape.static).get("pow2_blocks", False),
        asyncs=dict(shape.static).get("async_scheduling", False), shares=dict(shape.static).get("time_shares", False),
        terms=dict(shape.static).get("time_terms", ()))



def _blocks(tokens, state: VllmState, p: dict):
    """The blocks that many tokens hold (block_math.blocks_for)."""
    return block_math.blocks_for(tokens, p["block_size"], p["block_shift"], state.pow2_blocks)


def _excl_cumsum(x):
    return base.prefix_sum(x) - x


def _leading(ok):
    """How many leading entries of bool[S] are True: int32[] (the first False's position,
    a min: fewer ops than an argmin)."""
    return jnp.where(ok, ok.shape[0], jnp.arange(ok.shape[0], dtype=I32)).min()


def _at(x, i):
    """x[i] of int32/bool[S] for a computed i (0/False outside [0, S)): a masked sum, as a
    gather from an array computed in the same event would be fused with (and recompute)
    its producer."""
    hit = jnp.arange(x.shape[0]) == i
    return jnp.any(hit & x) if x.dtype == bool else jnp.where(hit, x, 0).sum(dtype=x.dtype)


ONE_HOT_CLIENTS = 16  # per-client sums over slots as a one-hot [S, K] sum up to this K; a scatter above


def _per_client(values, client, mask, k):
    if k <= ONE_HOT_CLIENTS:
        return jnp.where((client[:, None] == jnp.arange(k)[None, :]) & mask[:, None], values[:, None], 0).sum(
            axis=0, dtype=I32)
    return jnp.zeros(k, I32).at[jnp.where(mask, client, k)].add(values, mode="drop")


def _running(state: VllmState):
    """bool[S]: the slots of running requests (the running list without the leaving ones)."""
    return (jnp.arange(state.client.shape[0]) < state.nrun) & (state.generated < state.output)


def load(state: VllmState) -> Load:
    """Requests in the server (leaving ones included) and the tokens they hold (running ones), per client."""
    listed = _running(state)
    return Load(running=state.running, context=_per_client(state.computed, state.client, listed,
                                                           state.running.shape[0]))


def _select(mask, new: VllmState, old: VllmState) -> VllmState:
    """`new` where mask, else `old`, for the per-step and per-slot fields; the per-row
    tables (`out`, `log`) are written by masked scatters already, so they are taken as
    they are (a select over them would cost O(rows) per event)."""
    return base.select_fields(mask, new, old, skip=("out", "log"))



def _log(log: ScheduleLog, mask, t, index, tokens, finished, victims) -> ScheduleLog:
    steps = log.t.shape[0]
    if steps == 0:
        return log
    at = jnp.where(mask & (log.count < steps), log.count, steps)
    return ScheduleLog(count=log.count + mask.astype(I32), t=log.t.at[at].set(t, mode="drop"),
                       index=log.index.at[at].set(index, mode="drop"), tokens=log.tokens.at[at].set(tokens, mode="drop"),
                       finished=log.finished.at[at].set(finished, mode="drop"),
                       preempted=log.preempted.at[at].set(victims, mode="drop"))



def census(host: VllmState, num_clients: int) -> np.ndarray:
    """int64[B, K]: running and leaving requests per client, counted from the slots [0, nrun)."""
    client, nrun = np.asarray(host.client, np.int64), np.asarray(host.nrun, np.int64)
    out = np.zeros((client.shape[0], num_clients), np.int64)
    for b in range(client.shape[0]):
        out[b] += np.bincount(client[b, : nrun[b]], minlength=num_clients)[:num_clients]
    return out
