"""`ideal`: the MODEL.md server (docs/MODEL.md), the default.

Memory M (`Params.kv_budget`) bounds admission only: a request fits when the context held
by every running request plus its prompt is at most M. Each step decodes one token of
every running request (no batch limit, no time but the step); a request admitted at step t
with output n completes at the end of step t + n - 1 and leaves then. Nothing is ever
preempted, so a request's completion step is known at admission and running requests wait
in a calendar (completions.py): O(1) per admission and completion.

State per lane: running, context: int32[K] per client; calendar: completions.Calendar.

`ideal_reserve` (IDEAL_RESERVE) is the same server with the VTC theorem's assumption as its
admission rule: a request fits when the prompt + output of every running request plus its
own prompt + output is at most M, so the context held never exceeds M (a request whose
prompt + output exceeds M is never admitted: keep such traces off it). Its state wraps
IdealState with that running total; every other function is the ideal server's
(`drain_steps` holds because each request fits M alone).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients
from vtc_jax.core.errors import InputError
from vtc_jax.core.rows import OUTPUT, PROMPT
from vtc_jax.servers import completions
from vtc_jax.servers.base import Finished, Load, Server, ServerShape, Work

I32 = jnp.int32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class IdealState:
    """running: int32[K]; context: int32[K] (prompt + generated of those requests);
    calendar: the running requests by completion step."""

    running: jax.Array
    context: jax.Array
    calendar: completions.Calendar


def init(shape: ServerShape) -> IdealState:
    zeros = jnp.zeros(shape.num_clients, I32)
    return IdealState(running=zeros, context=zeros, calendar=completions.init(shape.calendar_rows, shape.slots))


def load(state: IdealState) -> Load:
    return Load(running=state.running, context=state.context)


def fits(state: IdealState, params, row, *, generated=None) -> jax.Array:
    """bool[]: context held + the row's prompt <= M (`generated` is always 0 here)."""
    return over_clients.total(state.context) + row[PROMPT] <= params.kv_budget


def _onehot(client, k, mask):
    return ((jnp.arange(k) == client) & mask).astype(I32)


def admit(state: IdealState, params, row, client, value, step, mask, *, index=None, generated=None):
    """File the request for completion at step + output - 1 where `mask` (nothing is ever
    preempted here, so `index` and `generated` are not needed)."""
    take = _onehot(client, state.running.shape[0], mask)
    prompt, output = row[PROMPT], row[OUTPUT]
    entry = jnp.stack([client, prompt, output, value]).astype(I32)
    overflow = mask & completions.full(state.calendar)
    return IdealState(running=state.running + take, context=state.context + take * prompt,
                      calendar=completions.push(state.calendar, step + output - 1, entry, mask)), overflow


def end_step(state: IdealState, params, mask):
    """Decode one token of every running request where `mask`."""
    m = mask.astype(I32)
    work = Work(decoded=m * state.running, attended=m * state.context, elapsed=jnp.ones((), I32))
    return dataclasses.replace(state, context=state.context + m * state.running), work


def due(state: IdealState, step) -> jax.Array:
    return completions.due(state.calendar, step)


def complete(state: IdealState, step, mask):
    """The last request filed for step `step - 1` leaves where `mask`."""
    calendar, top = completions.pop(state.calendar, step, mask)
    client, prompt, output, value = top[0], top[1], top[2], top[3]
    take = _onehot(client, state.running.shape[0], mask)
    state = IdealState(running=state.running - take, context=state.context - take * (prompt + output),
                       calendar=calendar)
    return state, Finished(client=client, prompt=prompt, output=output, value=value)


def quiet_steps(state: IdealState, params, step, smallest_prompt, limit: int) -> jax.Array:
    """int32[] in [0, limit]: after step `step`'s decode, the steps that follow in which
    nothing completes (calendar rows `step` .. `step + n - 1` are empty) and no request of
    `smallest_prompt` tokens or more fits: the context held only grows while nothing
    completes, so what does not fit now fits at none of them. 0 while the context is so
    large that `limit` steps of it could pass int32 (run_quiet's sums)."""
    held = over_clients.total(state.context)
    blocked = (smallest_prompt > params.kv_budget - held) & (held <= np.iinfo(np.int32).max // (2 * limit + 2))
    rows = state.calendar.head.shape[0]
    ahead = jnp.arange(limit, dtype=I32)
    empty = state.calendar.head[(step + ahead) % rows] < 0
    leading = over_clients.smallest(jnp.where(empty, limit, ahead))  # the first row that is not empty
    return jnp.where(blocked, leading, 0)


def run_quiet(state: IdealState, params, steps):
    """`steps` quiet steps at once: every running request decodes `steps` tokens."""
    work = Work(decoded=state.running * steps,
                attended=state.context * steps + state.running * (steps * (steps - 1) // 2), elapsed=steps)
    return dataclasses.replace(state, context=state.context + state.running * steps), work


def busy(state: IdealState) -> jax.Array:
    return over_clients.total(state.running) > 0


def validate(options: dict) -> None:
    if options:
        raise InputError(f"the ideal server has no settings of its own (got {', '.join(sorted(options))}); "
                         "its memory is --kv-budget")


def encode(options: dict) -> dict:
    return {}


def plan_slots(options: list, bound: int, requests: int) -> int:
    return bound  # a running request holds its whole prompt


def never_served(options: dict, prompt, output, kv_budget: int) -> str | None:
    return None  # a prompt larger than M is refused by the driver (it refuses it for every server)


def reserve_never_served(options: dict, prompt, output, kv_budget: int) -> str | None:
    """A request whose prompt + output passes M is never admitted (it reserves both)."""
    total = np.asarray(prompt, np.int64) + np.asarray(output, np.int64)
    worst = int(np.argmax(total))
    if total[worst] > kv_budget:
        return (f"request {worst} reserves its prompt + output, {int(total[worst])} tokens, more than M={kv_budget}: "
                "it could never be admitted")
    return None


def drain_steps(options: dict, arrival, prompt, output, limit: int = 0) -> int:
    """Last arrival + sum of outputs + 1: a request never waits while nothing runs (its
    prompt fits M), and at every other step before the last completion some request runs
    or arrives later (exact: never cut at `limit`, the driver refuses a run past it)."""
    return int(np.max(arrival)) + int(np.sum(output)) + 1


def fuzz_options(rng, prompt, output) -> dict:
    return {}  # no settings of its own


def census(host: IdealState, num_clients: int) -> np.ndarray:
    """int64[B, K]: requests filed in each lane's calendar, per client (host side)."""
    table = np.asarray(host.calendar.slots, np.int64)  # [B, S, 5]
    free, top = np.asarray(host.calendar.free, np.int64), np.asarray(host.calendar.top, np.int64)
    out = np.zeros((table.shape[0], num_clients), np.int64)
    for b in range(table.shape[0]):
        used = np.ones(table.shape[1], bool)
        used[free[b, : top[b]]] = False
        out[b] = np.bincount(table[b, used, 0], minlength=num_clients)[:num_clients]
    return out


IDEAL = Server(name="ideal", description="the MODEL.md server: memory bounds admission only, one token per step",
               init=init, load=load, fits=fits, admit=admit, end_step=end_step, due=due, complete=complete,
               census=census, busy=busy, validate=validate, encode=encode, plan_slots=plan_slots,
               never_served=never_served, drain_steps=drain_steps, fuzz_options=fuzz_options,
               quiet_steps=quiet_steps, run_quiet=run_quiet)


# ---------------------------------------------------------------------------------
# `ideal_reserve`: the theorem's assumption as a server
# ---------------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReserveState:
    """ideal: the ideal server's state; reserved: int32[] the sum of prompt + output over
    the running requests (what they will hold at their peak)."""

    ideal: IdealState
    reserved: jax.Array


def reserve_init(shape: ServerShape) -> ReserveState:
    return ReserveState(ideal=init(shape), reserved=jnp.zeros((), I32))


def reserve_load(state: ReserveState) -> Load:
    return load(state.ideal)


def reserve_fits(state: ReserveState, params, row, *, generated=None) -> jax.Array:
    """bool[]: reserved + the row's prompt + output <= M, so the running requests' context
    (at most their prompt + output each) never exceeds M."""
    return state.reserved + row[PROMPT] + row[OUTPUT] <= params.kv_budget


def reserve_admit(state: ReserveState, params, row, client, value, step, mask, *, index=None, generated=None):
    inner, overflow = admit(state.ideal, params, row, client, value, step, mask, index=index, generated=generated)
    return ReserveState(ideal=inner, reserved=state.reserved + jnp.where(mask, row[PROMPT] + row[OUTPUT], 0)), overflow


def reserve_end_step(state: ReserveState, params, mask):
    inner, work = end_step(state.ideal, params, mask)
    return dataclasses.replace(state, ideal=inner), work


def reserve_due(state: ReserveState, step) -> jax.Array:
    return due(state.ideal, step)


def reserve_complete(state: ReserveState, step, mask):
    inner, done = complete(state.ideal, step, mask)
    return ReserveState(ideal=inner, reserved=state.reserved - jnp.where(mask, done.prompt + done.output, 0)), done


def reserve_busy(state: ReserveState) -> jax.Array:
    return busy(state.ideal)


def reserve_census(host: ReserveState, num_clients: int) -> np.ndarray:
    return census(host.ideal, num_clients)


def reserve_validate(options: dict) -> None:
    if options:
        raise InputError(f"the ideal_reserve server has no settings of its own (got {', '.join(sorted(options))}); "
                         "its memory is --kv-budget")


IDEAL_RESERVE = Server(
    name="ideal_reserve", description="the ideal server, admitting a request only when the prompt + output of "
    "every running request and its own fit M (the VTC theorem's assumption: memory never passes M)",
    init=reserve_init, load=reserve_load, fits=reserve_fits, admit=reserve_admit, end_step=reserve_end_step,
    due=reserve_due, complete=reserve_complete, census=reserve_census, busy=reserve_busy, validate=reserve_validate,
    encode=encode, plan_slots=plan_slots, never_served=reserve_never_served, drain_steps=drain_steps,
    fuzz_options=fuzz_options)
