"""Prototype: one vLLM V1 scheduler step for one lane, vectorized (fcfs victims, no prefix
caching). Groundwork for the `vllm` server component; see docs/VLLM.md for the rules.

The running phase is closed-form: vLLM walks the running list in admission order, each
request takes min(owed, budget left) tokens, and when its new blocks are not free it
preempts from the tail of the list. The victims after request i are the shortest tail whose
held blocks cover the blocks allocated so far: a suffix sum compared with a prefix sum.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

I32 = jnp.int32
BIG = jnp.iinfo(jnp.int32).max
FUTURE, WAITING, RUNNING, DONE = 0, 1, 2, 3
SELF_STOP = [True]


@dataclasses.dataclass(frozen=True)
class VllmConfig:
    """Static server settings (vLLM's flag names)."""

    block_size: int = 16
    num_blocks: int = 1024
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Trace:
    """arrival, prompt, output, priority: int32[R]; valid: bool[R] (padding rows False)."""

    arrival: jax.Array
    prompt: jax.Array
    output: jax.Array
    priority: jax.Array
    valid: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """One lane. t: int32[] the step; status, computed, generated, run_key, wait_key,
    preemptions, first_token, finish: int32[R]; next_run_key, next_front, free: int32[]."""

    t: jax.Array
    status: jax.Array
    computed: jax.Array
    generated: jax.Array
    run_key: jax.Array
    wait_key: jax.Array
    next_run_key: jax.Array
    next_front: jax.Array
    free: jax.Array
    preemptions: jax.Array
    first_token: jax.Array
    finish: jax.Array


def init(config: VllmConfig, trace: Trace) -> State:
    r = trace.arrival.shape[0]
    z = jnp.zeros(r, I32)
    return State(t=jnp.zeros((), I32), status=z, computed=z, generated=z, run_key=z, wait_key=z,
                 next_run_key=jnp.zeros((), I32), next_front=jnp.zeros((), I32),
                 free=jnp.asarray(config.num_blocks - 1, I32), preemptions=z, first_token=z - 1, finish=z - 1)


def _blocks(tokens, block_size):
    return (tokens + block_size - 1) // block_size


def _excl_cumsum(x):
    return jnp.cumsum(x) - x


def step(config: VllmConfig, trace: Trace, s: State):
    """One schedule call. Returns (state, log) with log = (step int32[], sched int32[R],
    preempted bool[R], finished bool[R])."""
    bs, mbt = config.block_size, config.max_num_batched_tokens
    r = trace.arrival.shape[0]
    rows = jnp.arange(r, dtype=I32)
    future = (s.status == FUTURE) & trace.valid
    busy = ((s.status == RUNNING) | (s.status == WAITING)).any()
    next_arrival = jnp.min(jnp.where(future, trace.arrival, BIG))
    t = jnp.where(busy, s.t, jnp.maximum(s.t, next_arrival))
    joins = future & (trace.arrival <= t)
    status = jnp.where(joins, WAITING, s.status)
    wait_key = jnp.where(joins, rows, s.wait_key)

    running = status == RUNNING
    nrun = running.sum(dtype=I32)
    nwait = (status == WAITING).sum(dtype=I32)
    cap = jnp.where((config.long_prefill_token_threshold > 0) & (nrun + nwait > 1),
                    config.long_prefill_token_threshold, BIG)

    # Running phase, in admission order (position p of the running list).
    order = jnp.argsort(jnp.where(running, s.run_key, BIG))
    pos = jnp.arange(r, dtype=I32)
    in_list = pos < nrun
    c, g = s.computed[order], s.generated[order]
    p_, o_ = trace.prompt[order], trace.output[order]
    need = jnp.where(in_list, jnp.minimum(p_ + g - c, cap), 0)
    before = mbt - _excl_cumsum(need)
    n = jnp.clip(before, 0, need)
    proc = in_list & (before > 0)
    held = jnp.where(in_list, _blocks(c, bs), 0)
    alloc = jnp.where(proc, _blocks(c + n, bs) - held, 0)
    want = jnp.cumsum(alloc)  # blocks allocated by positions <= i
    suffix = jnp.concatenate([jnp.cumsum(held[::-1])[::-1], jnp.zeros(1, I32)])  # [R+1]
    # m_i: the start of the shortest victim tail that covers want_i (largest m that does).
    covers = (s.free + suffix[None, :] >= want[:, None]) & (jnp.arange(r + 1)[None, :] <= nrun)
    m = covers.sum(axis=1, dtype=I32) - 1
    ok = proc & (m > pos)
    sched_pos = jnp.cumsum(~ok) == 0
    first_bad = sched_pos.sum(dtype=I32)
    m_prev = jnp.where(first_bad > 0, m[jnp.maximum(first_bad - 1, 0)], nrun)
    bad = jnp.minimum(first_bad, r - 1)
    fail = (first_bad < nrun) & proc[bad] & (first_bad < m_prev) & (m[bad] <= first_bad)
    victim_from = jnp.where(fail, first_bad, m_prev)
    victim_pos = in_list & (pos >= victim_from)
    sched_run = jnp.where(sched_pos, n, 0)
    free = s.free + suffix[victim_from] - jnp.where(first_bad > 0, want[jnp.maximum(first_bad - 1, 0)], 0)

    # Back to row order.
    sched = jnp.zeros(r, I32).at[order].set(sched_run)
    victims = jnp.zeros(r, bool).at[order].set(victim_pos)
    if config.policy == "priority":
        sched, victims, _, free = running_phase_loop(config, trace, s, status, cap, SELF_STOP[0])
    preempted_any = victims.any()
    sched_run = sched
    front_key = jnp.zeros(r, I32).at[order].set(s.next_front - (nrun - pos))
    next_front = s.next_front - (nrun - victim_from)
    computed = jnp.where(victims, 0, s.computed + sched)
    status = jnp.where(victims, WAITING, status)
    wait_key = jnp.where(victims, front_key, wait_key)
    preemptions = s.preemptions + victims

    # Waiting phase: only in a step that preempted nothing; head-of-line.
    waiting = status == WAITING
    if config.policy == "priority":
        key = jnp.where(waiting, trace.priority, BIG)
        worder = jnp.lexsort((rows, trace.arrival, key))
    else:
        worder = jnp.argsort(jnp.where(waiting, wait_key, BIG))
    nw = waiting.sum(dtype=I32)
    w_in = (pos < nw) & ~preempted_any
    total = trace.prompt[worder] + s.generated[worder]
    tcap = jnp.minimum(total, cap)
    budget = mbt - sched_run.sum()
    wbefore = budget - _excl_cumsum(jnp.where(w_in, tcap, 0))
    chunk = jnp.clip(wbefore, 0, tcap)
    wblocks = _blocks(chunk, bs)
    free_before = free - _excl_cumsum(jnp.where(w_in, wblocks, 0))
    wok = (w_in & (wbefore > 0) & (pos < config.max_num_seqs - nrun) & (_blocks(total, bs) <= free_before))
    if not config.chunked_prefill:
        wok &= total <= wbefore
    admit_pos = jnp.cumsum(~wok) == 0
    nadmit = admit_pos.sum(dtype=I32)
    admitted = jnp.zeros(r, bool).at[worder].set(admit_pos)
    sched = sched + jnp.zeros(r, I32).at[worder].set(jnp.where(admit_pos, chunk, 0))
    computed = computed + jnp.zeros(r, I32).at[worder].set(jnp.where(admit_pos, chunk, 0))
    free = free - jnp.where(admit_pos, wblocks, 0).sum()
    run_key = jnp.where(admitted, s.next_run_key + jnp.zeros(r, I32).at[worder].set(pos), s.run_key)
    status = jnp.where(admitted, RUNNING, status)

    # Sampling and completion.
    scheduled = sched > 0
    samples = scheduled & (computed == trace.prompt + s.generated)
    generated = s.generated + samples
    first_token = jnp.where(samples & (s.first_token < 0), t, s.first_token)
    finished = samples & (generated == trace.output)
    free = free + jnp.where(finished, _blocks(computed, bs), 0).sum()
    status = jnp.where(finished, DONE, status)
    finish = jnp.where(finished, t, s.finish)
    new = State(t=t + 1, status=status, computed=computed, generated=generated, run_key=run_key,
                wait_key=wait_key, next_run_key=s.next_run_key + nadmit, next_front=next_front, free=free,
                preemptions=preemptions, first_token=first_token, finish=finish)
    return new, (t, sched, victims, finished)


def running_phase_loop(config: VllmConfig, trace: Trace, s: State, status, cap, self_stop: bool):
    """The running phase as vLLM's literal loop (priority victims: the largest (priority,
    arrival) anywhere in the list; a scheduled victim gives its tokens back). Returns
    (sched int32[R], victims bool[R], free int32[], order of victims key int32[R])."""
    bs, mbt = config.block_size, config.max_num_batched_tokens
    r = trace.arrival.shape[0]
    running = status == RUNNING
    order = jnp.argsort(jnp.where(running, s.run_key, BIG))
    nrun = running.sum(dtype=I32)
    # Victim: the largest (priority, arrival); Python's max keeps the first in list order.

    def body(carry):
        i, budget, free, alive, sched, vic, count, stop = carry
        row = order[i]
        c, g = s.computed[row], s.generated[row]
        need = jnp.minimum(trace.prompt[row] + g - c, cap)
        n = jnp.minimum(need, budget)
        alloc = _blocks(c + n, bs) - _blocks(c, bs)

        def cond(st):
            free, alive, sched, vic, budget, selfgone = st
            return (free < alloc) & ~selfgone

        def preempt(st):
            free, alive, sched, vic, budget, selfgone = st
            pr = jnp.where(alive, trace.priority, -1)
            best = jnp.max(pr)
            # arrival_time is arrival + 1e-6 * row: ties go to the later row.
            v = jnp.argmax(jnp.where(alive & (pr == best), jnp.arange(r, dtype=I32), -1))
            held = _blocks(s.computed[v] + sched[v], bs)
            free = free + held
            budget = budget + sched[v]
            sched = sched.at[v].set(0)
            alive = alive.at[v].set(False)
            return free, alive, sched, vic, budget, v == row

        free2, alive2, sched2, vic2, budget2, selfgone = jax.lax.while_loop(
            cond, preempt, (free, alive, sched, vic, budget, jnp.asarray(False)))
        ok = ~selfgone
        sched2 = jnp.where(ok, sched2.at[row].set(n), sched2)
        budget2 = jnp.where(ok, budget2 - n, budget2)
        free2 = jnp.where(ok, free2 - alloc, free2)
        stop = selfgone if self_stop else jnp.asarray(False)
        return i + 1, budget2, free2, alive2, sched2, vic2, count, stop

    def cond_outer(carry):
        i, budget, free, alive, sched, vic, count, stop = carry
        return (i < nrun) & (budget > 0) & ~stop & alive[order[jnp.minimum(i, r - 1)]]

    # `alive[order[i]]` false means the request was already preempted: under priority the
    # loop index is corrected by vLLM (req_index -= 1), which we model by skipping it.
    def body_skip(carry):
        i, budget, free, alive, sched, vic, count, stop = carry
        return jax.lax.cond(alive[order[i]], body, lambda c: (c[0] + 1,) + c[1:], carry)

    def cond_any(carry):
        i, budget, free, alive, sched, vic, count, stop = carry
        return (i < nrun) & (budget > 0) & ~stop

    init = (jnp.asarray(0, I32), jnp.asarray(mbt, I32), s.free, running, jnp.zeros(r, I32),
            jnp.zeros(r, I32), jnp.asarray(1, I32), jnp.asarray(False))
    _, budget, free, alive, sched, vic, _, _ = jax.lax.while_loop(cond_any, body_skip, init)
    return sched, running & ~alive, vic, free
