"""The engine's tail requeue (engines/requeue.Tails, `Server.requeue_to_tail`, `Work.requeue`)
and its `refused` hook, end to end, against a literal list model of one waiting queue.

A test server with one seat: a running request decodes one token a step; the first time it
has one token (of more), the step's end retracts it to the TAIL of the waiting queue (SGLang's
retraction); a refused candidate blocks the next step's admission (a sticky flag told through
`refused`). Under fcfs the engine must then admit in the order of SGLang's one waiting queue:
arrivals in trace order, each retracted request behind everything waiting when it left and
ahead of every later arrival."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax import Settings, Trace, replay
from vtc_jax.core.rows import OUTPUT, PROMPT
from vtc_jax.servers import registry as servers
from vtc_jax.servers.base import Finished, Load, Requeue, Server, Work

I32 = jnp.int32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SeatState:
    running: jax.Array  # int32[K] requests on the seat per client
    busy: jax.Array  # bool[] the seat is taken
    due: jax.Array  # bool[] its request finished and has not left
    client: jax.Array
    index: jax.Array
    prompt: jax.Array
    output: jax.Array
    value: jax.Array
    generated: jax.Array
    retracted: jax.Array  # int32[R] rows retracted once
    blocked: jax.Array  # bool[] this step admits nothing (the last step refused a candidate and was not blocked)
    block_next: jax.Array  # bool[] this step refused a candidate and was not blocked


def _init(shape):
    z = jnp.zeros((), I32)
    return SeatState(running=jnp.zeros(shape.num_clients, I32), busy=jnp.zeros((), bool), due=jnp.zeros((), bool),
                     client=z, index=z, prompt=z, output=z, value=z, generated=z,
                     retracted=jnp.zeros(max(shape.num_rows, 1), I32), blocked=jnp.zeros((), bool),
                     block_next=jnp.zeros((), bool))


def _fits(state, params, row, *, generated):
    return ~state.busy & ~state.due & ~state.blocked


def _admit(state, params, row, client, value, step, mask, *, index, generated):
    k = state.running.shape[0]
    pick = lambda new, old: jnp.where(mask, new, old)  # noqa: E731
    return dataclasses.replace(
        state, running=state.running + ((jnp.arange(k) == client) & mask).astype(I32), busy=state.busy | mask,
        client=pick(client, state.client), index=pick(index, state.index), prompt=pick(row[PROMPT], state.prompt),
        output=pick(row[OUTPUT], state.output), value=pick(value, state.value),
        generated=pick(generated, state.generated)), jnp.zeros((), bool)


def _begin_step(state, params, view, step, mask):
    none = jnp.zeros(1, I32)
    return state, Requeue(
        mask=jnp.zeros(1, bool), client=none, index=none, generated=none)


def _refused(state, params, row, *, generated, mask):
    return dataclasses.replace(state, block_next=state.block_next | (mask & ~state.blocked))


def _end_step(state, params, mask):
    k = state.running.shape[0]
    run = mask & state.busy
    generated = state.generated + run.astype(I32)
    retract = run & (generated == 1) & (state.output > 1) & (state.retracted[state.index] == 0)
    finished = run & ~retract & (generated >= state.output)
    mine = ((jnp.arange(k) == state.client) & run).astype(I32)
    out = Requeue(mask=retract[None], client=state.client[None], index=state.index[None], generated=generated[None])
    state = dataclasses.replace(
        state, generated=generated, busy=state.busy & ~retract & ~finished, due=state.due | finished,
        running=state.running - mine * retract.astype(I32),
        retracted=state.retracted.at[state.index].add(retract.astype(I32)),
        blocked=jnp.where(mask, state.block_next, state.blocked), block_next=state.block_next & ~mask)
    return state, Work(decoded=mine, attended=jnp.zeros(k, I32), elapsed=jnp.ones((), I32), requeue=out)


def _complete(state, step, mask):
    k = state.running.shape[0]
    leave = mask & state.due
    done = Finished(client=state.client, prompt=state.prompt, output=state.output, value=state.value)
    return dataclasses.replace(state, due=state.due & ~leave,
                               running=state.running - ((jnp.arange(k) == state.client) & leave).astype(I32)), done


def _census(host, k):
    held = np.asarray(host.running).reshape(-1, k).astype(np.int64)
    return held


TAIL_SEAT = Server(
    name="tail_seat", description="a test server: one seat, each request retracted to the queue's tail once",
    init=_init, load=lambda s: Load(running=s.running, context=s.running), fits=_fits, admit=_admit,
    end_step=_end_step, due=lambda s, step: s.due, complete=_complete, census=_census,
    busy=lambda s: s.busy | s.due, validate=lambda options: None, encode=lambda options: {},
    plan_slots=lambda options, bound, requests: 1, never_served=lambda *a, **k: None,
    drain_steps=lambda options, arrival, prompt, output, limit=0: int(4 * (max(arrival) + 2 * sum(output) + 4)),
    preempts=True, begin_step=_begin_step, requeue_to_tail=True, refused=_refused)


def literal(rows, horizon):
    """Per step: completions, arrivals (trace order), admission of the queue's front unless
    the step is blocked or the seat taken (a candidate left waiting is refused, and blocks
    the next step unless this one was blocked), the seat's decode (a retraction to the
    tail, or a finish). Returns the completed count per client by the horizon."""
    queue, seat, due, done, blocked, retracted, kept = [], None, None, {}, False, set(), {}
    for t in range(horizon):
        if due is not None:
            done[rows[due][1]] = done.get(rows[due][1], 0) + 1
            due = None
        queue += [i for i, r in enumerate(rows) if r[0] == t]
        if queue and not blocked and seat is None:
            i = queue.pop(0)
            seat = [i, kept.get(i, 0)]  # a retracted request keeps its tokens
        block_next = bool(queue) and not blocked
        if seat is not None:
            seat[1] += 1
            i, g = seat
            if g == 1 and rows[i][3] > 1 and i not in retracted:
                retracted.add(i)
                kept[i] = g
                queue.append(i)
                seat = None
            elif g >= rows[i][3]:
                due, seat = i, None
        blocked = block_next
    if due is not None:  # it finished by the end of the last step: it counts
        done[rows[due][1]] = done.get(rows[due][1], 0) + 1
    return done


@pytest.fixture(scope="module")
def tail_seat():
    with servers.SERVERS.provisionally(TAIL_SEAT):
        yield TAIL_SEAT.name


def test_tail_requeue_admits_in_the_one_queues_order(tail_seat):
    rng = np.random.default_rng(7)
    for case in range(12):
        n = int(rng.integers(3, 9))
        rows = sorted((int(rng.integers(0, 8)), int(rng.integers(0, 3)), 5, int(rng.integers(1, 4))) for _ in range(n))
        trace = Trace.from_rows(rows)
        for horizon in (6, 12, 40):
            got = replay(trace, Settings(policy="fcfs", kv_budget=1000), steps=horizon, num_clients=3,
                         server=tail_seat).completed[0].tolist()
            want = literal(rows, horizon)
            assert got == [want.get(c, 0) for c in range(3)], (case, horizon, rows)
