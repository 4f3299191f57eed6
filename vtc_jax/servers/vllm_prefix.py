"""`vllm_prefix`: the vLLM V1 scheduler's server with prefix caching (docs/VLLM.md).

The `vllm` server's rules (servers/vllm_v1.py: token budget, seats, KV blocks, chunked
prefill, the long-prefill cap, preemption by recompute, vLLM's victims), plus vLLM's
block pool with prefix caching (servers/vllm_blocks.py): a full block is hashed when it
is allocated, a waiting request's longest run of cached leading blocks (at most P + g - 1
tokens) is a hit that costs no budget and no new block, a free hit block counts as needed
at admission, freed blocks keep their hash in an LRU free queue until reused. Everything
runs as vLLM's loops, literally (correctness first), but for the running phase of a step
in which no request is short of blocks (the common case), in closed form as vllm's
(prefix sums over the running list, one batched take and one batched hash); otherwise it
walks the running list (one `lax.while_loop`, one victim or one scheduled request per
iteration); admissions are the engine's, one per event, finished requests release their
blocks in scheduling order, each its last block first. Per request it keeps vllm's record (`Outcome`,
each token's time too given `token_times`).

Which blocks are shared comes from the trace's content (inputs/prefix_blocks.py): the
setting `prefix_blocks` is a PrefixTable (prefix groups, block-hash chains or sessions),
from which each request's full blocks get content ids at the lane's block size, by ORDER
(the request's rank in (arrival, trace row) order); two blocks with one id are one hash.
A request past the table is never hashed and never hits. `prefix_options` builds the
setting from a trace's columns.

Static sizes (ServerShape.static, from `static_options`): the pool's P physical blocks
(the largest num_gpu_blocks of the batch), W (the most blocks any request can hold) and
U (the most distinct contents of a lane). The running slots are vllm's (the seats). State
is O(P + U + S W) per lane; an event's work is what it changes (servers/vllm_blocks.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients
from vtc_jax.core.lanes import batch_any, batch_max
from vtc_jax.core.rows import NUM_FIELDS, ORDER, OUTPUT, PROMPT
from vtc_jax.servers import base, block_math, step_time
from vtc_jax.servers import vllm_blocks as vb
from vtc_jax.servers import vllm_prefix_async as pa
from vtc_jax.servers.vllm_prefix_settings import (  # noqa: F401  (the server's settings, re-exported)
    common_capacity,
    drain_steps,
    encode,
    fuzz_options,
    MIN_TABLE,
    never_served,
    plan_slots,
    prefix_options,
    PREFIX_OPTIONS,
    static_options,
    validate,
    VICTIMS,
)
from vtc_jax.servers.records import VLLM_FLAGS, outcome_record, timed_by_options, vllm_memory
from vtc_jax.servers.base import Finished, Load, Requeue, Server, ServerShape, Work
from vtc_jax.servers.vllm_v1 import Outcome, ScheduleLog, add_gpu_time, gpu_record
from vtc_jax.servers.vllm_v1 import _log  # one writer of the schedule log for both vLLM servers

I32 = jnp.int32
INT_MAX = 2**31 - 1
WALKED = ("alive", "tokens", "spos", "computed", "nsched", "pool")  # what the running walk changes


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PrefixState:
    """One lane. Scalars int32[]: t (the step in progress), nrun (running requests), left
    (budget left this step), cap (the prefill cap this step), seq (admissions so far),
    nsched (requests scheduled this step); bool[]: preempted, just_finished, active (the
    step has something to log); running int32[K] requests per client in the server
    (leaving ones included). Per slot (a running request keeps its slot), S entries:
    alive bool; adm (its admission number: the running list is the alive slots by adm),
    client, value, index (workload row), prompt, output, computed, generated, tokens
    (scheduled this step), spos (its place in this step's scheduling order, INT_MAX
    none) int32; row int32[S, 5]. Leaving requests (finished, not yet handed back), in
    scheduling order: ndone, done_client, done_prompt, done_output, done_value. out,
    log: as vllm's (vllm_v1.Outcome, ScheduleLog); victims int32[S] the rows this step
    preempted (-1 none); pool: the block pool (vllm_blocks.Pool). Per workload row,
    int32[R]: cached, the prompt tokens served from cache at its first admission (-1: not
    yet admitted); recomputed, the tokens it was scheduled to compute again at its
    readmissions after preemptions (net of their cache hits).

    Async scheduling (servers/vllm_prefix_async.py): stamp [] (the clock's dtype) the last step's end
    stamp; per slot, sampled bool[S] (it sampled in the last step: that update has not
    run) and lastpos int32[S] (its spos in the last step); asyncs (static): some lane
    schedules async."""

    t: jax.Array
    nrun: jax.Array
    left: jax.Array
    cap: jax.Array
    seq: jax.Array
    nsched: jax.Array
    preempted: jax.Array
    just_finished: jax.Array
    active: jax.Array
    running: jax.Array
    alive: jax.Array
    adm: jax.Array
    client: jax.Array
    value: jax.Array
    index: jax.Array
    prompt: jax.Array
    output: jax.Array
    computed: jax.Array
    generated: jax.Array
    tokens: jax.Array
    spos: jax.Array
    row: jax.Array
    ndone: jax.Array
    done_client: jax.Array
    done_prompt: jax.Array
    done_output: jax.Array
    done_value: jax.Array
    out: Outcome
    log: ScheduleLog
    victims: jax.Array
    pool: vb.Pool
    cached: jax.Array
    recomputed: jax.Array
    stamp: jax.Array
    sampled: jax.Array
    lastpos: jax.Array
    asyncs: bool = dataclasses.field(default=False, metadata={"static": True})
    shares: bool = dataclasses.field(default=False, metadata={"static": True})  # some lane keeps time shares
    terms: tuple = dataclasses.field(default=(), metadata={"static": True})  # step_time.step_terms of the batch


def init(shape: ServerShape) -> PrefixState:
    """An empty server: a pool of P blocks, running slots for `shape.slots` requests of at
    most W blocks, U contents (P, W, U: `static_options`)."""
    static = dict(shape.static)
    blocks, width, contents = static["pool_blocks"], static["table_width"], static["contents"]
    r, steps, k, s = shape.num_rows, shape.log_steps, shape.num_clients, shape.slots
    zero, empty = jnp.zeros((), I32), jnp.zeros(s, I32)
    none_r, never = jnp.full(r, -1, I32), jnp.full(r, -1, shape.clock)  # stamps: the lane's clock
    return PrefixState(
        t=jnp.zeros((), shape.clock), nrun=zero, left=zero, cap=zero, seq=zero, nsched=zero, preempted=jnp.zeros((), bool),
        just_finished=jnp.zeros((), bool), active=jnp.zeros((), bool), running=jnp.zeros(k, I32),
        alive=jnp.zeros(s, bool), adm=empty, client=empty, value=empty, index=empty, prompt=empty, output=empty,
        computed=empty, generated=empty, tokens=empty, spos=jnp.full(s, INT_MAX, I32),
        row=jnp.zeros((s, NUM_FIELDS), I32), ndone=zero, done_client=empty, done_prompt=empty, done_output=empty,
        done_value=empty,
        out=Outcome(first_token=never, finish=never, preemptions=jnp.zeros(r, I32), scheduled=never, gpu_us=gpu_record(shape),
                    times=base.token_times(shape)),
        log=ScheduleLog(count=zero, t=jnp.zeros(steps, shape.clock), index=jnp.full((steps, s), -1, I32),
                        tokens=jnp.zeros((steps, s), I32), finished=jnp.zeros((steps, s), bool),
                        preempted=jnp.full((steps, s), -1, I32)),
        victims=jnp.full(s, -1, I32), pool=vb.pool_init(blocks, s, width, contents), cached=none_r,
        recomputed=jnp.zeros(r, I32), stamp=jnp.zeros((), shape.clock), sampled=jnp.zeros(s, bool),
        lastpos=jnp.full(s, INT_MAX, I32),
        asyncs=static.get("async_scheduling", False), shares=static.get("time_shares", False),
        terms=static.get("time_terms", ()))


def _per_client(values, client, mask, k):
    return jnp.zeros(k, I32).at[jnp.where(mask, client, k)].add(values, mode="drop")


def _content(p: dict, row):
    """(ids int32[I'], off int32[], nids int32[]): the content table and where the request
    of this row finds its blocks' contents (by ORDER; none past the table)."""
    offsets = p["block_offsets"]
    order = row[ORDER]
    inside = (order >= 0) & (order < offsets.shape[0] - 1)
    at = jnp.clip(order, 0, offsets.shape[0] - 2)
    return p["block_ids"], offsets[at], jnp.where(inside, offsets[at + 1] - offsets[at], 0)


def load(state: PrefixState) -> Load:
    k = state.running.shape[0]
    return Load(running=state.running, context=_per_client(state.computed, state.client, state.alive, k))


def _select(mask, new: PrefixState, old: PrefixState) -> PrefixState:
    """`new` where mask, else `old`, for every field but the per-row tables (written by
    masked scatters) and the pool (changed only under the mask)."""
    return base.select_fields(mask, new, old, skip=("out", "log", "pool", "cached", "recomputed"))


def _victim(state: PrefixState, params, alive):
    """The slot vLLM preempts: the newest admitted (`newest`), or the largest (band,
    ORDER) (`priority`)."""
    newest = jnp.argmax(jnp.where(alive, state.adm, -1)).astype(I32)
    band = jnp.where(alive, params.band[state.client], -1)
    top = alive & (band == band.max())
    by_priority = jnp.argmax(jnp.where(top, state.row[:, ORDER], -1)).astype(I32)
    return jnp.where(params.server["victim"] == 1, by_priority, newest)


def _grow(pool, state: PrefixState, p: dict, slot, n, on):
    """allocate_slots where `on` for a running request scheduled for n tokens (the caller
    checked its new blocks are free): take them, hash the blocks this step fills."""
    bs = p["block_size"]
    c = state.computed[slot]
    need = jnp.where(on, jnp.maximum(block_math.ceil_div(c + n, bs) - pool.held[slot], 0), 0)
    pool = vb.take(pool, slot, need, p["num_blocks"])
    ids, off, nids = _content(p, state.row[slot])
    upto = pa.hash_limit(state, p, slot, c + n) if state.asyncs else c + n
    return vb.hash_blocks(pool, slot, jnp.where(on, upto, 0), ids, off, nids, bs)


def _slow_walk(state: PrefixState, params, cap, walk, start, budget, mask):
    """vLLM's walk of the running list, literally (one `lax.while_loop`, one victim or one
    scheduled request a pass), from `start` (the state with the step's schedule cleared)
    and `budget`. Returns (the fields it changes, budget left, victims int32[S] in
    preemption order, their count)."""
    p = params.server
    slots = state.alive.shape[0]
    bs = p["block_size"]
    nlist = state.nrun

    def ask(st, i, budget):
        s = walk[jnp.minimum(i, slots - 1)]
        return jnp.minimum(jnp.minimum(st.prompt[s] + st.generated[s] - st.computed[s], cap), budget)

    def going(carry):
        _, i, _, budget, _, _ = carry
        return mask & (i < nlist) & (budget > 0)

    def body(carry):  # a pass of a lane that is done changes nothing (the loop runs while some lane goes)
        f, i, n, budget, vic, nvic = carry
        st = dataclasses.replace(state, **f)
        s = walk[jnp.minimum(i, slots - 1)]
        go = going(carry)
        live = go & st.alive[s]
        need = block_math.ceil_div(st.computed[s] + n, bs) - st.pool.held[s]
        short = live & (need > vb.num_free(st.pool, p["num_blocks"]))
        v = _victim(st, params, st.alive)
        # Preempt v (its blocks, with any tokens it got this step, come back), or schedule s:
        # the pool's updates are masked by their counts (no select over the pool).
        back = st.tokens[v]
        grown = live & ~short & (n > 0) if state.asyncs else live & ~short  # async: an in-flight last token asks 0
        pool = vb.release(st.pool, v, short)
        pool = _grow(pool, st, p, s, n, grown)
        p_f = dict(alive=st.alive.at[v].set(False), tokens=st.tokens.at[v].set(0), spos=st.spos.at[v].set(INT_MAX),
                   computed=st.computed.at[v].set(0), nsched=st.nsched)
        g_f = dict(alive=st.alive, tokens=st.tokens.at[s].set(n), spos=st.spos.at[s].set(st.nsched),
                   computed=st.computed, nsched=st.nsched + 1)
        small = {name: f[name] for name in g_f}
        f2 = jax.tree_util.tree_map(lambda x, y, z: jnp.where(short, x, jnp.where(grown, y, z)), p_f, g_f, small)
        f2["pool"] = pool
        moves = go & (~short | (v == s))  # scheduled, skipped (not running any more) or preempted itself
        budget2 = jnp.where(short, budget + back, jnp.where(grown, budget - n, budget))
        i2 = i + moves.astype(I32)
        n2 = jnp.where(moves, ask(dataclasses.replace(state, **f2), i2, budget2), n)
        vic2 = jnp.where(short, vic.at[nvic].set(v), vic)
        return f2, i2, n2, budget2, vic2, nvic + short.astype(I32)

    carry = ({name: getattr(start, name) for name in WALKED}, jnp.zeros((), I32), ask(start, 0, budget), budget,
             jnp.zeros(slots, I32), jnp.zeros((), I32))
    f, _, _, budget, vic, nvic = jax.lax.while_loop(lambda c: batch_any(going(c)), body, carry)
    return f, budget, vic, nvic


def _fast_plan(state: PrefixState, p: dict, cap, walk, budget, mask):
    """The walk in closed form, as vllm's (servers/vllm_v1.py `_newest`), for a step in
    which no running request is short of blocks: over the running list (walk position i,
    slot walk[i]), n_i = its ask within the budget its predecessors left, and the walk's
    takes, one after another, leave free - (blocks taken before i) for slot i. Returns
    (n int32[S], grown bool[S]: scheduled, need int32[S]: new blocks, short bool[]: some
    walked request's blocks do not fit: the walk would preempt, spos int32[S]: a scheduled
    one's place in the step's scheduling order), by walk position."""
    slots = state.alive.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    bs = p["block_size"]
    listed = pos < state.nrun
    computed, held = state.computed[walk], state.pool.held[walk]
    # Asks above budget + 1 act like budget + 1 (never fully served): keeps sums in int32.
    ask = jnp.where(listed, jnp.minimum(jnp.minimum(state.prompt[walk] + state.generated[walk] - computed, cap),
                                        budget + 1), 0)
    before = budget - (base.prefix_sum(ask) - ask)  # budget left at each position
    n = jnp.clip(before, 0, ask)
    walked = mask & listed & (before > 0)  # a masked-off lane walks nothing
    grown = walked & (n > 0) if state.asyncs else walked  # async: an in-flight last token asks 0
    blocks = block_math.ceil_div(computed + n, bs) - held
    need = jnp.where(grown, jnp.maximum(blocks, 0), 0)
    sums = base.prefix_sum(jnp.stack([need, grown.astype(I32)]))  # both scans in one
    taken_before, spos = sums[0] - need, sums[1] - grown  # spos: the scheduling order
    short = (walked & (blocks > vb.num_free(state.pool, p["num_blocks"]) - taken_before)).any()
    return n, grown, need, short, spos


def _fast_walk(state: PrefixState, p: dict, walk, start, budget, plan, on):
    """The walk's result where it preempts nothing (`_fast_plan`): tokens and scheduling
    order by position, one batched take of every scheduled request's new blocks and one
    batched hash, in walk order (vllm_blocks.take_many, hash_many: exactly the walk's
    takes and hashes one by one). Returns `_slow_walk`'s (fields, budget, victims, 0)."""
    slots = state.alive.shape[0]
    n, grown, need, short, spos = plan
    off = short | ~on  # (a lane short of blocks is walked instead)
    grown, need = grown & ~off, jnp.where(off, 0, need)
    at = jnp.where(grown, walk, slots)
    pool = vb.take_many(start.pool, walk, need, p["num_blocks"])
    c = state.computed[walk]
    upto = pa.hash_limit(state, p, walk, c + n) if state.asyncs else c + n
    ids, offs, nids = jax.vmap(lambda row: _content(p, row), out_axes=(None, 0, 0))(state.row[walk])
    pool = vb.hash_many(pool, walk, jnp.where(grown, upto, 0), ids, offs, nids, p["block_size"])
    f = dict(alive=start.alive, computed=start.computed, pool=pool,
             tokens=start.tokens.at[at].set(n, mode="drop"), spos=start.spos.at[at].set(spos, mode="drop"),
             nsched=grown.sum(dtype=I32))
    return f, budget - jnp.where(grown, n, 0).sum(dtype=I32), jnp.zeros(slots, I32), jnp.zeros((), I32)


def begin_step(state: PrefixState, params, view, step, mask):
    """The running phase where `mask`; returns (state, Requeue): the victims in preemption
    order. In closed form (`_fast_walk`) when no lane of the batch would preempt, else
    vLLM's walk literally (`_slow_walk`): the choice is batch-wide (core/lanes.py), so
    the other one's loops take no pass."""
    p = params.server
    slots = state.alive.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    waiting = over_clients.total(view.waiting)
    cap = jnp.where((p["long_cap"] > 0) & ((state.nrun + waiting > 1) | p["blis_engine"]), p["long_cap"],
                    INT_MAX).astype(I32)
    walk = jnp.argsort(jnp.where(state.alive, state.adm, INT_MAX)).astype(I32)  # the running list's slots
    start = dataclasses.replace(state, tokens=jnp.zeros(slots, I32), spos=jnp.full(slots, INT_MAX, I32),
                                nsched=jnp.zeros((), I32))
    budget = p["budget"].astype(I32)
    plan = _fast_plan(state, p, cap, walk, budget, mask)
    # Both run, one of them masked off entirely (no pass of its loops): a `cond` would copy
    # the pool in and out of its branches (XLA:CPU), twice an event.
    slow = batch_any(plan[3])
    ff, fbudget, _, _ = _fast_walk(state, p, walk, start, budget, plan, ~slow)
    f, budget, vic, nvic = _slow_walk(state, params, cap, walk, dataclasses.replace(start, pool=ff.pop("pool")), budget,
                                      mask & slow)
    f = {name: f[name] if name == "pool" else jnp.where(slow, f[name], ff[name]) for name in f}
    budget = jnp.where(slow, budget, fbudget)
    st = dataclasses.replace(state, **f)
    gone = pos < nvic
    slot = jnp.where(gone, vic, 0)
    r = state.out.preemptions.shape[0]
    victim_index = jnp.where(gone, state.index[slot], -1)
    preemptions = state.out.preemptions.at[jnp.where(mask & gone, victim_index, r)].add(1, mode="drop")
    requeue, finish = gone, state.out.finish
    if state.asyncs:  # victims whose last token was in flight stop in this step's update instead
        st, finish = pa.stop_victims(state, st, mask)
        requeue = gone & pa.requeued(finish, victim_index)
    k = state.running.shape[0]
    new = dataclasses.replace(
        st, t=step, cap=cap, nrun=st.alive.sum(dtype=I32), preempted=nvic > 0, left=jnp.where(nvic > 0, 0, budget),
        out=dataclasses.replace(state.out, preemptions=preemptions, finish=finish), victims=victim_index,
        running=state.running - _per_client(jnp.ones(slots, I32), state.client[slot], requeue, k),
        active=(state.nrun > 0) | (waiting > 0) | state.just_finished)
    requeue = Requeue(mask=mask & requeue, client=state.client[slot], index=state.index[slot],
                      generated=state.generated[slot])
    return _select(mask, new, state), requeue


def _admission(state: PrefixState, p: dict, row, generated):
    """(ok, n, hits, evictable, chunk): vLLM's admission check for this request now."""
    bs = p["block_size"]
    total = row[PROMPT] + generated
    ids, off, nids = _content(p, row)
    hits, evictable = vb.lookup(state.pool, total, ids, off, nids, bs)
    ask = jnp.minimum(total - hits * bs, state.cap)
    n = jnp.minimum(ask, state.left)
    free = vb.num_free(state.pool, p["num_blocks"])
    whole = jnp.maximum(block_math.ceil_div(total, bs) - hits, 0) + evictable
    chunk = jnp.maximum(block_math.ceil_div(hits * bs + n, bs) - hits, 0) + evictable
    ok = (~state.preempted & (state.left > 0) & (state.nrun < p["seats"]) & (p["chunked"] | (ask <= state.left))
          & (whole <= free) & (chunk <= free))
    return ok, n, hits, evictable, chunk


def fits(state: PrefixState, params, row, *, generated):
    return _admission(state, params.server, row, generated)[0]


def prefix_hit(state: PrefixState, params, row, *, generated):
    """int32[]: the tokens a hit now would serve from cache (whole blocks)."""
    p = params.server
    ids, off, nids = _content(p, row)
    return vb.lookup(state.pool, row[PROMPT] + generated, ids, off, nids, p["block_size"])[0] * p["block_size"]


def admit(state: PrefixState, params, row, client, value, step, mask, *, index, generated):
    """Seat the request where `mask`: its hits gain a holder, its first chunk's blocks are
    taken and hashed, it joins the end of the running list."""
    p = params.server
    bs = p["block_size"]
    slots = state.alive.shape[0]
    _, n, hits, evictable, chunk = _admission(state, p, row, generated)
    has_slot = ~state.alive.all()
    on = mask & has_slot
    s = jnp.where(on, jnp.argmin(state.alive), slots).astype(I32)  # out of range: every write below is dropped
    ids, off, nids = _content(p, row)
    hits = jnp.where(on, hits, 0)
    pool = vb.touch(state.pool, s, hits, ids, off)
    pool = vb.take(pool, s, jnp.where(on, chunk - evictable, 0), p["num_blocks"])
    pool = vb.hash_blocks(pool, s, jnp.where(on, hits * bs + n, 0), ids, off, nids, bs)
    put = lambda x, v: x.at[s].set(v, mode="drop")  # noqa: E731
    k, r = state.running.shape[0], state.out.scheduled.shape[0]  # scheduled: the first scheduling only
    first = on & (state.out.scheduled[jnp.clip(index, 0, r - 1)] < 0)
    again = jnp.where(on & ~first, index, r)
    new = dataclasses.replace(
        state, alive=put(state.alive, True), adm=put(state.adm, state.seq), seq=state.seq + 1,
        client=put(state.client, client), value=put(state.value, value), index=put(state.index, index),
        prompt=put(state.prompt, row[PROMPT]), output=put(state.output, row[OUTPUT]),
        computed=put(state.computed, hits * bs), generated=put(state.generated, generated), tokens=put(state.tokens, n),
        spos=put(state.spos, state.nsched), nsched=state.nsched + 1, row=state.row.at[s].set(row, mode="drop"),
        sampled=put(state.sampled, False),
        nrun=state.nrun + 1, left=state.left - n, running=state.running + (jnp.arange(k) == client).astype(I32),
        cached=state.cached.at[jnp.where(first, index, r)].set(hits * bs, mode="drop"),
        recomputed=state.recomputed.at[again].add(row[PROMPT] + generated - hits * bs, mode="drop"),
        pool=pool, out=dataclasses.replace(state.out, scheduled=state.out.scheduled.at[
            jnp.where(first, index, r)].set(step, mode="drop"),
            times=base.token_rows(state.out.times, index, row[OUTPUT], on)))
    return _select(on, new, state), mask & ~has_slot


def end_step(state: PrefixState, params, mask):
    """The step's tokens are computed where `mask`: samples, finishes (their blocks freed
    in scheduling order, each last block first), the log."""
    p = params.server
    slots = state.alive.shape[0]
    live = state.alive
    computed = state.computed + state.tokens
    total = state.prompt + state.generated
    samples = live & (state.tokens > 0) & (computed == total)
    generated = state.generated + samples
    pool = state.pool
    if state.asyncs:  # the last step's update (it runs now), and stops one step late (servers/vllm_prefix_async.py)
        pool = pa.cache_updated(pool, state, p, lambda row: _content(p, row), mask)
        generated = pa.sample_counts(state, samples, p["async"])
    finished = live & (generated == state.output) if state.asyncs else samples & (generated == state.output)
    rows, k = state.out.first_token.shape[0], state.running.shape[0]
    decoding = live & (state.generated > 0) & (state.computed == total - 1)
    slots_now = (jnp.where(live, state.tokens, 0), decoding, total, state.computed)
    elapsed = step_time.duration(p, *slots_now, terms=state.terms)
    shares = step_time.slot_shares(p, *slots_now, terms=state.terms) if state.shares else None
    stamp = jnp.where(p["timed"], state.t + elapsed, state.t)
    fresh = mask & samples & (state.out.first_token[jnp.clip(state.index, 0, rows - 1)] < 0)
    first = state.out.first_token.at[jnp.where(fresh, state.index, rows)].set(stamp, mode="drop")
    ended = jnp.where(p["async"], state.stamp, stamp) if state.asyncs else stamp  # the last token's step
    finish = state.out.finish.at[jnp.where(mask & finished, state.index, rows)].set(ended, mode="drop")
    times = base.token_stamps(state.out.times, state.index, state.generated, stamp, mask & samples)
    # Scheduling order: the slots by spos (scheduled ones first; async: then the stops of
    # requests this step did not schedule). Stops come in their last token's step's order.
    key = jnp.where(finished & (state.spos == INT_MAX), INT_MAX - 1, state.spos) if state.asyncs else state.spos
    order = jnp.argsort(key).astype(I32)
    scheduled = key[order] < INT_MAX
    log = _log(state.log, mask & state.active, state.t, jnp.where(scheduled, state.index[order], -1),
               jnp.where(scheduled, state.tokens[order], 0), scheduled & finished[order], state.victims)
    if state.asyncs:
        order = jnp.argsort(pa.stop_order(state, p["async"])).astype(I32)
    fin_sorted = finished[order]
    nfin = jnp.where(mask, finished.sum(dtype=I32), 0)
    fin_slots = jnp.where(fin_sorted, order, slots)[jnp.argsort(~fin_sorted)]  # finished slots, scheduling order

    def free_one(j, pool):
        return vb.release(pool, jnp.minimum(fin_slots[j], slots - 1), j < nfin)

    pool = jax.lax.fori_loop(0, batch_max(nfin), free_one, pool)  # one bound for the batch: core/lanes.py
    fs = jnp.minimum(fin_slots, slots - 1)
    got = jnp.arange(slots) < finished.sum(dtype=I32)
    new = dataclasses.replace(
        state, computed=jnp.where(live, computed, state.computed), generated=jnp.where(live, generated, state.generated),
        alive=live & ~finished, nrun=state.nrun - finished.sum(dtype=I32), tokens=jnp.zeros(slots, I32),
        spos=jnp.full(slots, INT_MAX, I32), nsched=jnp.zeros((), I32), ndone=finished.sum(dtype=I32),
        done_client=jnp.where(got, state.client[fs], 0), done_prompt=jnp.where(got, state.prompt[fs], 0),
        done_output=jnp.where(got, state.output[fs], 0), done_value=jnp.where(got, state.value[fs], 0),
        just_finished=finished.any(), pool=pool, log=log, preempted=jnp.zeros((), bool), victims=jnp.full(slots, -1, I32),
        out=add_gpu_time(dataclasses.replace(state.out, first_token=first, finish=finish, times=times), state.index,
                         shares, mask & live & state.shares),
        **({"stamp": stamp, "sampled": samples, "lastpos": state.spos} if state.asyncs else {}))
    counted = mask & samples
    work = Work(decoded=_per_client(samples.astype(I32), state.client, counted, k),
                attended=_per_client(total, state.client, counted, k), elapsed=elapsed,
                emptied=mask & p["blis_engine"] & (state.nrun > 0) & (finished.sum(dtype=I32) == state.nrun),
                time=None if shares is None else _per_client(shares, state.client, mask & live, k))
    return _select(mask, new, state), work


def due(state: PrefixState, step) -> jax.Array:
    return state.ndone > 0


def complete(state: PrefixState, step, mask):
    """The first leaving request (in scheduling order) is handed back where `mask`."""
    done = Finished(client=state.done_client[0], prompt=state.done_prompt[0], output=state.done_output[0],
                    value=state.done_value[0])
    shift = lambda x: jnp.where(mask, jnp.roll(x, -1), x)  # noqa: E731
    leaves = mask & (state.ndone > 0)
    k = state.running.shape[0]
    return dataclasses.replace(state, ndone=state.ndone - leaves.astype(I32),
                               running=state.running - ((jnp.arange(k) == done.client) & leaves).astype(I32),
                               done_client=shift(state.done_client), done_prompt=shift(state.done_prompt),
                               done_output=shift(state.done_output), done_value=shift(state.done_value)), done


def busy(state: PrefixState) -> jax.Array:
    return state.nrun > 0


def census(host: PrefixState, num_clients: int) -> np.ndarray:
    """int64[B, K]: running and leaving requests per client, counted from the slots."""
    client, alive = np.asarray(host.client, np.int64), np.asarray(host.alive, bool)
    done, ndone = np.asarray(host.done_client, np.int64), np.asarray(host.ndone, np.int64)
    out = np.zeros((client.shape[0], num_clients), np.int64)
    for b in range(client.shape[0]):
        out[b] += np.bincount(client[b][alive[b]], minlength=num_clients)[:num_clients]
        out[b] += np.bincount(done[b, : ndone[b]], minlength=num_clients)[:num_clients]
    return out


def prefix_record(host) -> dict:
    """vllm's record (records.outcome_record) and, by workload row, int64[B, R]: "cached"
    (prompt tokens served from cache at the first admission, -1 not admitted) and
    "recomputed" (tokens computed again after preemptions)."""
    return dict(outcome_record(host), cached=np.asarray(host.cached, np.int64),
                recomputed=np.asarray(host.recomputed, np.int64))


def kv_blocks(state: PrefixState, params):
    """(used, usable) int32[]: blocks held by requests and the pool's usable blocks
    (num_gpu_blocks - 1); a cached block in the LRU is free (vLLM's kv_cache_usage_perc)."""
    usable = params.server["num_blocks"] - 1
    return usable - vb.num_free(state.pool, params.server["num_blocks"]), usable


VLLM_PREFIX = Server(name="vllm_prefix", description="vLLM V1's scheduler with prefix caching: the vllm server and "
                     "KV blocks shared by common prefixes, an LRU cache of freed blocks (docs/VLLM.md)",
                     init=init, load=load, fits=fits, admit=admit, end_step=end_step, due=due, complete=complete,
                     census=census, busy=busy, validate=validate, encode=encode, plan_slots=plan_slots, preempts=True,
                     begin_step=begin_step, never_served=never_served, drain_steps=drain_steps, events_per_step=3,
                     fuzz_options=fuzz_options, static_options=static_options, keeps_time=timed_by_options,
                     request_record=prefix_record, record_index="row", prefix_hit=prefix_hit, default_memory=vllm_memory,
                     trace_columns=("priority", "prefix_id", "prefix_len"), step_time_model=True,
                     flags=tuple(VLLM_FLAGS.items()), batch_options=common_capacity, wide_clock=True,
                     kv_blocks=kv_blocks)
