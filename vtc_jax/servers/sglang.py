"""`sglang`: SGLang 0.5.23's scheduler (event_loop_normal, page size 1) as a server component.

The engine owns the waiting queue and asks the policy which tenant's request the prefill
adder considers next; this server owns what SGLang's scheduler does around it, one
iteration per engine step (ENGINE_SGLANG.md; the literal reference is
vtc_jax/testing/sglang_reference.py):

- `begin_step` (the iteration's start, after its arrivals): the idle reset of the
  new-token ratio, the chunked request's stash (`checkpoint_kv_cache`), the last prefill
  batch merged into the running batch (the sticky `batch_is_full` cleared where a list
  shrank or an empty running batch is replaced), the gates of `get_new_batch_prefill`, and
  `PrefillAdder`'s budgets (the running requests' reservation at the new-token ratio, in
  doubles, in running order) with the chunked request continued first;
- `fits` / `admit` (one engine event per candidate, in the policy's order): `add_one_req`
  on the candidate's cache match (prompt + generated, capped at one token short), under a
  temporary lock of its matched path; the adder breaks after an admission that leaves no
  budget (NO_TOKEN sets `batch_is_full`); `refused` (the candidate that ends the pass)
  applies that candidate's match and SGLang's verdict on it (the row limit and NO_TOKEN set
  `batch_is_full`);
- `end_step`: a prefill batch (prepare_for_extend, then each request samples or checkpoints,
  a middle chunk does neither), else a decode of the running batch: the decode memory check,
  retraction (fewest outputs, then longest prompt, then latest in running order; each
  victim's KV released without caching, the shortfall below remaining * 20 free slots
  evicted; the rest left in sorted order; the ratio re-estimated) or the ratio's decay; one
  token each; finished requests cached (prompt + outputs but the last) and released.
  Retracted requests go to the TAIL of the waiting queue with their outputs
  (`Work.requeue`, engines/requeue.Tails).

The radix cache is servers/sglang_radix.py over the trace's prefix groups. What is not
modelled yet: lpm, and fcfs's every-32nd-pass refresh of the waiting requests' cached
prefixes (SGLANG_ENABLE_WAITING_PREFIX_REFRESH), which moves LRU eviction when waiting
requests share cached prefixes; time (the step-time models) and the fleet's replicas.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vtc_jax.core.rows import ORDER, OUTPUT, PROMPT
from vtc_jax.servers import sglang_radix as radix
from vtc_jax.servers import base, step_time
from vtc_jax.servers.records import outcome_record, timed_by_options
from vtc_jax.servers.vllm_v1_state import _per_client, add_gpu_time
from vtc_jax.servers import sglang_state as ss
from vtc_jax.servers.base import Finished, Load, Requeue, Server, Work
from vtc_jax.servers.sglang_state import DONE, F64, FREE, I32, NEW, RUN, SglangState, fill, ident, live

CONTINUE, NO_TOKEN, OTHER = 0, 1, 2  # PrefillAdder's AddReqResult


# ----------------------------------------------------------------------------------------
# KV slots and the cache, per slot.


def _evict_to_free(st: SglangState, num_tokens, mask) -> SglangState:
    """evict_to_free_tokens: evict only the shortfall below `num_tokens` free slots."""
    short = num_tokens - st.kv_free
    tree, evicted = radix.evict(st.tree, short, mask & (short > 0))
    return dataclasses.replace(st, tree=tree, kv_free=st.kv_free + evicted)


def _alloc(st: SglangState, num_tokens, mask) -> SglangState:
    st = _evict_to_free(st, num_tokens, mask)
    short = mask & (num_tokens > st.kv_free)  # SGLang raises out of memory: the lane is flagged
    return dataclasses.replace(st, kv_free=jnp.where(mask, st.kv_free - num_tokens, st.kv_free),
                               flagged=st.flagged | short)


def _set(st: SglangState, i, mask, **fields) -> SglangState:
    """Slot i's fields where mask."""
    return dataclasses.replace(st, **{name: getattr(st, name).at[i].set(
        jnp.where(mask, value, getattr(st, name)[i])) for name, value in fields.items()})


def _checkpoint(st: SglangState, i, up_to, mask) -> SglangState:
    """RadixCache.checkpoint: cache fill[:up_to] (and the prompt, splitting at its end), free
    the request's own copies of what was cached already, re-match, move its lock."""
    q, tree = ident(st, i), st.tree
    tree, existing, _ = radix.insert(tree, q, up_to, mask)
    tree, _, _ = radix.insert(tree, q, st.prompt[i], mask & (st.prompt[i] > 0) & (st.prompt[i] < up_to))
    tree, _, node = radix.match(tree, q, up_to, mask)
    old = st.lock[i]
    tree = radix.dec_lock(tree, jnp.maximum(old, 0), mask & (old >= 0))
    tree = radix.inc_lock(tree, node, mask)
    st = dataclasses.replace(st, tree=tree,
                             kv_free=st.kv_free + jnp.where(mask, jnp.maximum(existing - st.protected[i], 0), 0))
    return _set(st, i, mask, protected=up_to, lock=node)


def _release(st: SglangState, i, checkpoint, mask) -> SglangState:
    """release_kv_cache: (checkpoint the KV it holds,) free what is its own, unlock, free its row."""
    owned = st.kv_alloc[i]
    st = _checkpoint(st, i, owned, mask & checkpoint)
    lock = st.lock[i]
    tree = radix.dec_lock(st.tree, jnp.maximum(lock, 0), mask & (lock >= 0))
    st = dataclasses.replace(st, tree=tree, kv_free=st.kv_free + jnp.where(mask, jnp.maximum(owned - st.protected[i], 0), 0),
                             rows_free=st.rows_free + (mask & st.holds_row[i]).astype(I32))
    return _set(st, i, mask, lock=-1, holds_row=False)


def _in_order(st: SglangState, members, key, body):
    """body(st, i) for each slot i of `members` (bool[S]) in increasing `key` (int32[S],
    distinct among members), one pass each (a while loop: under vmap, the lanes' longest)."""

    def more(carry):
        return carry[1].any()

    def one(carry):
        st, left = carry
        i = jnp.argmin(jnp.where(left, key, ss.INT_MAX)).astype(I32)
        return body(st, i), left.at[i].set(False)

    return jax.lax.while_loop(more, one, (st, members))[0]


# ----------------------------------------------------------------------------------------
# The adder's budget (PrefillAdder with PrefillBudget, page size 1).


def _remaining_total(st: SglangState, tree: radix.Tree):
    return (st.kv_free + tree.evictable).astype(F64) - st.total


def _budget_state(st: SglangState, p: dict, tree: radix.Tree):
    no_token = ~((_remaining_total(st, tree) > 0) & (st.kv_free + tree.evictable - st.current > 0))
    other = (st.rem_input <= 0) | ((p["chunk"] > 0) & (st.rem_chunk <= 0))
    return jnp.where(no_token, NO_TOKEN, jnp.where(other, OTHER, CONTINUE))


def _allocatable(st: SglangState, p: dict, running, held):
    return jnp.minimum(p["rows"] - running, jnp.maximum(st.rows_free + held, 0))


def _held(st: SglangState):
    return ((st.phase == NEW) & st.holds_row).sum(dtype=I32)


def _running(st: SglangState):
    return (st.phase == RUN).sum(dtype=I32)


def _candidate(st: SglangState, p: dict, row, generated):
    """The candidate's identity, fill and max_new_tokens (its row's ORDER names its tokens)."""
    order = row[ORDER]
    at = jnp.clip(order, 0, p["group"].shape[0] - 1)
    inside = (order >= 0) & (order < p["group"].shape[0])
    q = radix.Ident(group=jnp.where(inside, p["group"][at], -1), shared=jnp.where(inside, p["shared"][at], 0),
                    prompt=row[PROMPT], row=order)
    return q, row[PROMPT] + generated, row[OUTPUT]


def _verdict(st: SglangState, p: dict, row, generated, mask):
    """The loop's checks before `add_one_req` and add_one_req's verdict on the candidate, on
    the tree after its match: (tree, prefix_len, last node, pass bool[] (the checks before
    the match let it through), verdict int32[])."""
    stage = _budget_state(st, p, st.tree)
    rows_full = st.a_count >= _allocatable(st, p, _running(st), _held(st))
    passes = st.open & ~st.stopped & (stage != OTHER) & ~rows_full & ~st.full
    q, fill_len, output = _candidate(st, p, row, generated)
    tree, prefix, last = radix.match(st.tree, q, jnp.maximum(fill_len - 1, 0), mask & passes)
    max_new = jnp.minimum(jnp.maximum(output - generated, 0), ss.CLIP_MAX_NEW_TOKENS)
    extend = fill_len - prefix
    pinned = radix.inc_lock(tree, last, mask & passes)  # the temporary pin: its path is not evictable now
    no_token = ~((extend + max_new + 1).astype(F64) < _remaining_total(st, pinned))
    chunked = p["chunk"] > 0
    other = (~chunked & (st.a_count > 0) & (extend >= st.rem_input)) | (chunked & (extend > st.rem_chunk)
                                                                        & (st.rem_chunk <= 0))
    verdict = jnp.where(no_token, NO_TOKEN, jnp.where(other, OTHER, CONTINUE))
    return tree, prefix, last, passes, verdict, rows_full


def _update_budget(st: SglangState, extend, max_new_tokens, mask) -> SglangState:
    """_update_prefill_budget at page size 1: extend + 1 now, plus max_new_tokens in total."""
    return dataclasses.replace(
        st, total=jnp.where(mask, st.total + (extend + 1 + max_new_tokens).astype(F64), st.total),
        current=st.current + jnp.where(mask, extend + 1, 0), rem_input=st.rem_input - jnp.where(mask, extend, 0),
        rem_chunk=st.rem_chunk - jnp.where(mask, extend, 0))


# ----------------------------------------------------------------------------------------
# The iteration.


def begin_step(st: SglangState, params, view, step, mask):
    p = params.server
    waiting = (view.waiting > 0).any()
    empty = ~live(st).any() & (st.chunk < 0)
    idle = mask & empty & (~waiting | (step > st.t_end))  # an iteration with nothing at all ran
    first = mask & ~st.started  # init has no settings: the pool, the rows and the ratio start here
    st = dataclasses.replace(st, ratio=jnp.where(idle | first, p["ratio_init"], st.ratio),
                             kv_free=jnp.where(first, p["kv_tokens"], st.kv_free),
                             rows_free=jnp.where(first, p["rows"], st.rows_free), started=st.started | mask)
    # stash the chunked request: cache what it computed so far
    c = jnp.maximum(st.chunk, 0)
    stash = mask & (st.chunk >= 0) & (st.extend_end[c] > st.prefix_len[c])
    st = _checkpoint(st, c, st.extend_end[c], stash)
    st = _set(st, c, stash, prefix_len=st.extend_end[c])
    # merge the last prefill batch (but the chunked request) into the running batch
    merging = mask & st.last_extend
    joining = merging & (st.phase == NEW) & (jnp.arange(st.phase.shape[0]) != st.chunk)
    was_empty = _running(st) == 0
    full = st.full & ~(merging & st.l_shrank) & ~(merging & was_empty & joining.any())
    full = full & ~(mask & st.r_shrank)
    st = dataclasses.replace(st, phase=jnp.where(joining, RUN, st.phase), full=full,
                             last_extend=st.last_extend & ~mask, l_shrank=st.l_shrank & ~mask,
                             r_shrank=st.r_shrank & ~mask)
    running = _running(st)
    full = st.full & ~(mask & (running == 0))
    has_chunk = st.chunk >= 0
    closed = (full | ~waiting) & ~has_chunk
    no_rows = ~closed & (_allocatable(st, p, running, 0) <= 0) & ~has_chunk
    full = full | (mask & no_rows)
    opened = mask & ~closed & ~no_rows
    # fcfs's waiting-prefix refresh counter (the refresh itself is not modelled: module docstring)
    calls = st.refresh_calls + (opened & waiting).astype(I32)
    # the adder: the running requests' reservation, summed in running order as SGLang's Python does
    reserve = (jnp.minimum(st.output - st.n_out, ss.CLIP_MAX_NEW_TOKENS).astype(F64) * st.ratio)

    order = jnp.argsort(jnp.where(st.phase == RUN, st.pos, ss.INT_MAX))
    total = jax.lax.fori_loop(0, jnp.where(opened, running, 0), lambda j, acc: acc + reserve[order[j]],
                              jnp.zeros((), F64))
    st = dataclasses.replace(
        st, full=full, open=jnp.where(mask, opened, st.open), stopped=st.stopped & ~mask, refresh_calls=calls,
        t_begin=jnp.where(mask, step, st.t_begin).astype(I32),
        a_count=jnp.where(mask, 0, st.a_count), rem_input=jnp.where(opened, p["max_prefill"], st.rem_input),
        rem_chunk=jnp.where(opened, jnp.where(p["chunk"] > 0, p["chunk"], ss.NO_CHUNK), st.rem_chunk),
        total=jnp.where(opened, total, st.total), current=jnp.where(opened, 0, st.current))
    st = _continue_chunk(st, p, opened & has_chunk)
    none = jnp.zeros(st.phase.shape[0], I32)
    return st, Requeue(mask=jnp.zeros(st.phase.shape[0], bool), client=none, index=none, generated=none)


def _continue_chunk(st: SglangState, p: dict, mask) -> SglangState:
    """add_chunked_req: the chunked request's next chunk, first in the prefill list."""
    c = jnp.maximum(st.chunk, 0)
    rem = jnp.minimum(st.rem_chunk, jnp.trunc(_remaining_total(st, st.tree)).astype(I32))  # int() truncates
    rem = jnp.where(rem <= 0, st.rem_chunk, rem)
    cand = fill(st)[c] - st.prefix_len[c]
    truncated = cand > rem
    new_len = jnp.minimum(cand, rem)
    st = _set(st, c, mask, extend_end=st.prefix_len[c] + new_len, pos=st.next_pos)
    st = _update_budget(st, new_len, jnp.where(truncated, 0, jnp.minimum(st.output[c], ss.CLIP_MAX_NEW_TOKENS)), mask)
    return dataclasses.replace(st, a_count=st.a_count + mask.astype(I32), next_pos=st.next_pos + mask.astype(I32),
                               chunk=jnp.where(mask & ~truncated, -1, st.chunk))


def fits(st: SglangState, params, row, *, generated):
    _, _, _, passes, verdict, _ = _verdict(st, params.server, row, generated, jnp.ones((), bool))
    return passes & (verdict == CONTINUE)


def admit(st: SglangState, params, row, client, value, step, mask, *, index, generated):
    p = params.server
    tree, prefix, last, passes, verdict, _ = _verdict(st, p, row, generated, mask)
    ok = mask & passes & (verdict == CONTINUE)
    q, fill_len, output = _candidate(st, p, row, generated)
    extend = fill_len - prefix
    chunked = (p["chunk"] > 0) & (extend > st.rem_chunk)
    extend = jnp.where(chunked, st.rem_chunk, extend)
    tree = radix.inc_lock(tree, last, ok)
    free = st.phase == FREE
    i = jnp.argmax(free).astype(I32)
    overflow = ok & ~free.any()
    ok = ok & free.any()
    st = dataclasses.replace(st, tree=jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), tree, st.tree))
    st = _set(st, i, ok, phase=NEW, pos=st.next_pos, client=client, value=value, index=index, order=q.row,
              prompt=q.prompt, output=output, group=q.group, shared=q.shared, n_out=generated, prefix_len=prefix,
              extend_end=prefix + extend, kv_alloc=0, protected=prefix, lock=last, middle=0, holds_row=False)
    st = _update_budget(st, extend, jnp.where(chunked, 0, jnp.minimum(output, ss.CLIP_MAX_NEW_TOKENS)), ok)
    st = dataclasses.replace(
        st, a_count=st.a_count + ok.astype(I32), next_pos=st.next_pos + ok.astype(I32),
        chunk=jnp.where(ok & chunked, i, st.chunk),
        out=dataclasses.replace(st.out, times=base.token_rows(st.out.times, index, output, ok),
                                scheduled=st.out.scheduled.at[jnp.where(ok & (st.out.scheduled[index] < 0),
                                                                                index, st.out.scheduled.shape[0])].set(
            step.astype(st.out.scheduled.dtype), mode="drop")))
    after = _budget_state(st, p, st.tree)
    return dataclasses.replace(st, stopped=st.stopped | (ok & (after != CONTINUE)),
                               full=st.full | (ok & (after == NO_TOKEN))), overflow


def refused(st: SglangState, params, row, *, generated, mask):
    """The candidate that ends this iteration's pass: its match happened (touching and
    splitting the tree), and SGLang's verdict on it sets batch_is_full (the row limit, or
    NO_TOKEN while something runs or was added)."""
    p = params.server
    tree, _, _, passes, verdict, rows_full = _verdict(st, p, row, generated, mask)
    pre = mask & st.open & ~st.stopped & (_budget_state(st, p, st.tree) != OTHER)
    full = st.full | (pre & rows_full) | (mask & passes & (verdict == NO_TOKEN) & ((st.a_count > 0) | (_running(st) > 0)))
    return dataclasses.replace(st, tree=tree, full=full)


def _sample(st: SglangState, mask, stamp) -> tuple[SglangState, jax.Array]:
    """One token for each slot of `mask` (bool[S]), stamped `stamp`; returns (state,
    finished bool[S]). (No cache work: the caller caches or releases, in order.)"""
    n_out = st.n_out + mask.astype(I32)
    finished = mask & (n_out >= st.output)
    r = st.out.first_token.shape[0]
    first = jnp.where(mask & (st.out.first_token[st.index] < 0), st.index, r)
    out = dataclasses.replace(st.out, first_token=st.out.first_token.at[first].set(stamp, mode="drop"),
                              finish=st.out.finish.at[jnp.where(finished, st.index, r)].set(stamp, mode="drop"),
                              times=base.token_stamps(st.out.times, st.index, st.n_out, stamp, mask))
    return dataclasses.replace(st, out=out, n_out=n_out), finished


def _finish(st: SglangState, i, finished) -> SglangState:
    st = _release(st, i, True, finished)
    return _set(st, i, finished, phase=DONE)


def _prefill(st: SglangState, p: dict, mask):
    """A prefill batch: rows, KV for the extends, then each request in order samples (and
    finishes or checkpoints) unless it is a middle chunk."""
    a = mask & (st.phase == NEW)
    c = jnp.maximum(st.chunk, 0)
    st = _set(st, c, mask & (st.chunk >= 0), middle=st.middle[c] + 1)
    new_rows = a & ~st.holds_row
    st = dataclasses.replace(st, holds_row=st.holds_row | a, rows_free=st.rows_free - new_rows.sum(dtype=I32))
    scheduled = jnp.where(a, st.extend_end - st.prefix_len, 0)
    st = _alloc(st, scheduled.sum(dtype=I32), mask)
    st = dataclasses.replace(st, kv_alloc=jnp.where(a, st.extend_end, st.kv_alloc))
    sampled = a & (st.middle == 0)
    context = jnp.where(sampled, fill(st), 0)
    slots = (scheduled, jnp.zeros_like(a), fill(st), st.prefix_len)
    elapsed = step_time.duration(p, *slots, st.terms)
    st, shares = _shares(st, p, slots, a & mask)
    stamp = _stamp(st, p, elapsed)

    st = dataclasses.replace(st, middle=st.middle - (a & ~sampled).astype(I32))  # a middle chunk samples nothing
    st, finished = _sample(st, sampled, stamp)

    def process(st, i):  # in the batch's order: a finished request is cached whole, the others checkpointed
        st = _finish(st, i, finished[i])
        keep = ~finished[i]
        st = _checkpoint(st, i, st.extend_end[i], keep)
        return _set(st, i, keep, prefix_len=st.extend_end[i])

    st = _in_order(st, sampled, st.pos, process)
    st = dataclasses.replace(st, l_shrank=st.l_shrank | (mask & (finished.any() | (st.chunk >= 0))),
                             last_extend=st.last_extend | mask)
    return st, scheduled, sampled, context, finished, elapsed, shares


def _shares(st: SglangState, p: dict, slots, mask):
    """(state, int32[S]): each slot's share of the step's time in us, added to its request's
    GPU time, where the batch keeps them (else zeros, nothing kept)."""
    if not st.shares:
        return st, jnp.zeros_like(slots[0])
    shares = jnp.where(mask, step_time.slot_shares(p, *slots, terms=st.terms), 0)
    return dataclasses.replace(st, out=add_gpu_time(st.out, st.index, shares, mask)), shares


def _stamp(st: SglangState, p: dict, elapsed):
    """A token's stamp: the step, or on a timed lane the end of the step in us."""
    return (st.t_begin + jnp.where(p["timed"], elapsed, 0)).astype(st.out.first_token.dtype)


def _victim(st: SglangState, left):
    """retract_decode's next victim among `left`: fewest outputs, then longest prompt, then
    latest in running order (the end of SGLang's stable descending sort)."""
    few = left & (st.n_out == jnp.min(jnp.where(left, st.n_out, ss.INT_MAX)))
    long = few & (st.prompt == jnp.max(jnp.where(few, st.prompt, -1)))
    return jnp.argmax(jnp.where(long, st.pos, -1)).astype(I32)


def _retract(st: SglangState, p: dict, mask):
    """retract_decode where mask: victims in pop order (int32[S], -1 after the last)."""
    s = st.phase.shape[0]

    def mem_ok(st, left):
        need = left.sum(dtype=I32)
        st = _evict_to_free(st, need, mask)
        return st, st.kv_free >= need

    def more(carry):  # the first pass always retracts (done starts False); then until the rest fits
        st, left, victims, n, done = carry
        return mask & ~done & (left.sum() > 1)

    def one(carry):
        st, left, victims, n, done = carry
        v = _victim(st, left)
        left = left.at[v].set(False)
        st = _release(st, v, False, True)
        st = _evict_to_free(st, left.sum(dtype=I32) * ss.RETRACT_DECODE_STEPS, True)
        st = _set(st, v, True, phase=FREE, prefix_len=0, protected=0, kv_alloc=0, middle=0, extend_end=0)
        st = dataclasses.replace(st, out=dataclasses.replace(st.out, preemptions=st.out.preemptions.at[
            st.index[v]].add(1)))
        st, ok = mem_ok(st, left)
        return st, left, victims.at[n].set(v), n + 1, ok

    left = mask & (st.phase == RUN)
    carry = (st, left, jnp.full(s, -1, I32), jnp.zeros((), I32), jnp.zeros((), bool))
    st, left, victims, _, _ = jax.lax.while_loop(more, one, carry)
    st, ok = mem_ok(st, left)
    abort = mask & (left.sum() <= 1) & ~ok  # SGLang aborts the last request: the lane is flagged
    # the rest in sorted order: (n_out, -prompt) descending, ties in running order (a stable sort)
    order = jnp.lexsort((st.pos, st.prompt, -st.n_out, ~left))
    rank = jnp.zeros(s, I32).at[order].set(jnp.arange(s, dtype=I32))
    pos = jnp.where(left, st.next_pos + rank, st.pos)
    outs = jnp.where(left, st.n_out, 0).sum(dtype=I32) + ss.RETRACT_DECODE_STEPS * left.sum(dtype=I32)
    ratio = jnp.minimum(1.0, outs.astype(F64) / (jnp.where(left, st.output, 0).sum(dtype=I32) + 1).astype(F64))
    st = dataclasses.replace(st, pos=jnp.where(mask, pos, st.pos), next_pos=st.next_pos + jnp.where(mask, s, 0),
                             ratio=jnp.where(mask, ratio, st.ratio), full=st.full & ~mask,
                             flagged=st.flagged | abort)
    return st, victims


def _decode(st: SglangState, p: dict, mask):
    running = st.phase == RUN
    need = running.sum(dtype=I32)
    st = _evict_to_free(st, need, mask)
    retract = mask & (st.kv_free < need)
    st, victims = _retract(st, p, retract)
    st = dataclasses.replace(st, ratio=jnp.where(mask & ~retract, jnp.maximum(st.ratio - p["ratio_decay"],
                                                                               p["ratio_min"]), st.ratio))
    running = mask & (st.phase == RUN)
    st = _alloc(st, running.sum(dtype=I32), mask & running.any())
    st = dataclasses.replace(st, kv_alloc=st.kv_alloc + running.astype(I32))
    context = jnp.where(running, fill(st), 0)
    slots = (running.astype(I32), running, context, context - 1)
    elapsed = step_time.duration(p, *slots, st.terms)
    st, shares = _shares(st, p, slots, running)
    stamp = _stamp(st, p, elapsed)

    st, finished = _sample(st, running, stamp)
    st = _in_order(st, finished, st.pos, lambda st, i: _finish(st, i, jnp.ones((), bool)))
    st = dataclasses.replace(st, r_shrank=st.r_shrank | (mask & finished.any()))
    return st, running, context, finished, victims, elapsed, shares


def end_step(st: SglangState, params, mask):
    p = params.server
    k = st.num_clients
    prefill = mask & (st.phase == NEW).any()
    decode = mask & ~prefill & (st.phase == RUN).any()
    clients = st.client
    st, scheduled, sampled, context_p, finished_p, elapsed_p, shares_p = _prefill(st, p, prefill)
    st, decoding, context_d, finished_d, victims, elapsed_d, shares_d = _decode(st, p, decode)
    elapsed = jnp.where(prefill, elapsed_p, jnp.where(decode, elapsed_d, 1))
    sampled = sampled | decoding
    finished = finished_p | finished_d
    v = jnp.maximum(victims, 0)
    requeue = Requeue(mask=victims >= 0, client=clients[v], index=st.index[v], generated=st.n_out[v])
    tokens = jnp.where(prefill, scheduled, decoding.astype(I32))
    st = dataclasses.replace(st, open=st.open & ~mask, t_end=jnp.where(mask, st.t_begin + elapsed, st.t_end),
                             log=_log(st, prefill | decode | requeue.mask.any(), tokens, finished, requeue))
    counted = mask & sampled
    work = Work(decoded=_per_client(counted.astype(I32), clients, counted, k),
                attended=_per_client(context_p + context_d, clients, counted, k), elapsed=elapsed,
                requeue=requeue, overflow=st.flagged | st.tree.overflow,
                time=_per_client(shares_p + shares_d, clients, jnp.broadcast_to(mask, clients.shape), k)
                if st.shares else None)
    return st, work


def _log(st: SglangState, mask, tokens, finished, requeue: Requeue):
    log = st.log
    steps = log.t.shape[0]
    if steps == 0:
        return log
    at = jnp.where(mask & (log.count < steps), log.count, steps)
    shown = tokens > 0
    victims = jnp.where(requeue.mask, requeue.index, -1)
    return dataclasses.replace(
        log, count=log.count + mask.astype(I32), t=log.t.at[at].set(st.t_begin.astype(log.t.dtype), mode="drop"),
        index=log.index.at[at].set(jnp.where(shown, st.index, -1), mode="drop"),
        tokens=log.tokens.at[at].set(tokens, mode="drop"), finished=log.finished.at[at].set(finished, mode="drop"),
        preempted=log.preempted.at[at].set(victims, mode="drop"))


def due(st: SglangState, step) -> jax.Array:
    return (st.phase == DONE).any()


def complete(st: SglangState, step, mask):
    """The finished request first in its list leaves (its KV and row are already released)."""
    done = st.phase == DONE
    i = jnp.argmin(jnp.where(done, st.pos, ss.INT_MAX)).astype(I32)
    leave = mask & done[i]
    out = Finished(client=st.client[i], prompt=st.prompt[i], output=st.output[i], value=st.value[i])
    return _set(st, i, leave, phase=FREE), out


def busy(st: SglangState) -> jax.Array:
    return (st.phase != FREE).any() | (st.chunk >= 0)


def load(st: SglangState) -> Load:
    k = st.num_clients
    held = live(st)
    return Load(running=_per_client(held.astype(I32), st.client, held, k),
                context=_per_client(fill(st), st.client, held, k))


def prefix_hit(st: SglangState, params, row, *, generated):
    """The prompt tokens the cache would serve were the request admitted now (its match)."""
    q, fill_len, _ = _candidate(st, params.server, row, generated)
    _, matched, _ = radix.match(st.tree, q, jnp.maximum(fill_len - 1, 0), jnp.ones((), bool))
    return jnp.minimum(matched, row[PROMPT])


SGLANG = Server(
    name="sglang", description="SGLang's scheduler (non-overlap loop, page size 1): prefill and decode steps apart, "
                               "the new-token ratio, sticky batch_is_full, retraction to the tail, the radix cache",
    init=ss.init, load=load, fits=fits, admit=admit, end_step=end_step, due=due, complete=complete,
    census=ss.census, busy=busy, validate=ss.validate, encode=ss.encode, plan_slots=ss.plan_slots,
    never_served=ss.never_served, drain_steps=ss.drain_steps, fuzz_options=ss.fuzz_options, preempts=True,
    begin_step=begin_step, requeue_to_tail=True, refused=refused, prefix_hit=prefix_hit, x64=True,
    trace_columns=("prefix_id", "prefix_len"), flags=ss.FLAGS, events_per_step=2, static_options=ss.static_options,
    keeps_time=timed_by_options, request_record=outcome_record, record_index="row", default_memory=ss.memory,
    step_time_model=True, model_options=ss.model_options,
    arrival_order=ss.arrival_order)
