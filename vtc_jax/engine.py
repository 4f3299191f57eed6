"""The exact engine of MODEL.md as a pure JAX state machine.

One lane is one simulated server. Its `State` advances by *events*, one per scan iteration,
chosen per lane by masks (never a per-lane `lax.cond`: under vmap both branches run):

  * ARRIVE  : some request with arrival <= t has not joined its FIFO yet: take up to
              `arrival_width` more per client (phase 1, with the lift rule);
  * ADMIT   : otherwise, the policy's candidate exists and fits: admit it (phase 2);
  * FINISH  : otherwise, step t ends: decode and completion (phases 3-4), measures, t += 1,
              and the first arrival batch of step t+1 (phase 1 again).

A run of T steps takes T FINISH events, one ADMIT per admitted request and an ARRIVE per
step whose arrivals exceed `arrival_width` for some client: at most T + 2 * requests
iterations. Lanes that reach their horizon become no-ops (`done`).

Queues are pointers (DESIGN.md): client k's FIFO is `[head_k, arrived_k)` in its stream.
Decode is O(K): per client the number of running requests and the sum of their contexts;
a completion calendar indexed by `completion step mod calendar_len` retires requests.
All quantities are int32 in the exact units of settings.py.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from vtc_jax.measures import MeasureConfig, Measures, init_measures, on_admit, on_arrivals, on_finish, request_cost
from vtc_jax import wide
from vtc_jax.settings import INT32_MAX, Params
from vtc_jax.workload import ARRIVAL, CACHED, ORDER, OUTPUT, PROMPT, Workload

I32 = jnp.int32


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static settings: changing one recompiles.

    Attributes:
      num_clients: K.
      stream_len: N, rows per client stream (requests + look-ahead padding).
      calendar_len: L >= the longest output: completion-calendar rows.
      record_every: checkpoint W every this many steps (0: no checkpoints).
      num_checkpoints: rows of the checkpoint buffer (>= horizon // record_every).
      arrival_width: arrivals per client taken in one event.
      drain: run until every request completed (horizon is then only a safety bound).
      measures: which optional measures to accumulate.
    """

    num_clients: int
    stream_len: int
    calendar_len: int
    record_every: int = 0
    num_checkpoints: int = 0
    arrival_width: int = 4
    drain: bool = False
    measures: MeasureConfig = MeasureConfig()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """One lane's state (a batch adds a leading lane axis to every field).

    Attributes:
      step: int32[]  t, the step in progress (equals the steps run once `done`).
      horizon: int32[]  T: steps to run (drain mode: a bound that suffices).
      done: bool[]  reached the horizon (or, drain mode, every request completed).
      head: int32[K]  stream index of client k's next request to admit.
      arrived: int32[K]  requests of client k that have joined its FIFO.
      counter: int32[K, 2]  c_k in counter units (wide.py: exact int32 pairs).
      service: int32[K, 2]  W_k in cost units (wide).
      running: int32[K]  running requests of client k.
      context: int32[K]  sum over those of prompt + generated.
      reserved: int32[K]  sum over those of prompt + output (the KV they can reach).
      cal_count: int32[L, K]  running requests completing at step = row (mod L).
      cal_context: int32[L, K]  their contexts at completion (prompt + output).
      last_left: int32[]  client of the last admitted request, -1 for none.
      admitted, completed: int32[K]  request counts.
      window_admits: int32[K]  admissions in the current rpm window.
      measures: Measures  accumulated measures (measures.py).
      iterations: int32[]  events consumed (for the budget check).
    """

    step: jax.Array
    horizon: jax.Array
    done: jax.Array
    head: jax.Array
    arrived: jax.Array
    counter: jax.Array
    service: jax.Array
    running: jax.Array
    context: jax.Array
    reserved: jax.Array
    cal_count: jax.Array
    cal_context: jax.Array
    last_left: jax.Array
    admitted: jax.Array
    completed: jax.Array
    window_admits: jax.Array
    measures: Measures
    iterations: jax.Array


def init_state(config: EngineConfig, horizon: jax.Array) -> State:
    """Empty server at step 0 (step 0's arrivals are taken by the first ARRIVE event)."""
    k, zeros_k = config.num_clients, jnp.zeros(config.num_clients, I32)
    calendar = jnp.zeros((config.calendar_len, k), I32)
    return State(
        step=jnp.zeros((), I32), horizon=jnp.asarray(horizon, I32),
        done=jnp.asarray(horizon, I32) <= 0, head=zeros_k, arrived=zeros_k, counter=wide.zeros((k,)),
        service=wide.zeros((k,)), running=zeros_k, context=zeros_k, reserved=zeros_k, cal_count=calendar,
        cal_context=calendar, last_left=jnp.asarray(-1, I32), admitted=zeros_k,
        completed=zeros_k, window_admits=zeros_k,
        measures=init_measures(k, config.num_checkpoints, config.measures),
        iterations=jnp.zeros((), I32))


def _rows_at(requests: jax.Array, index: jax.Array) -> jax.Array:
    """requests[k, index[k], :] for every client: int32[K, 5]."""
    return jnp.take_along_axis(requests, index[:, None, None], axis=1)[:, 0, :]


def select_candidate(state: State, requests: jax.Array, params: Params):
    """The policy's candidate (phase 2): one interface for every policy.

    FCFS and RPM take the oldest head request (smallest global ORDER); LCF and VTC the
    head of the least-counter backlogged client (argmin takes the smallest k on ties).
    RPM's limit masks clients that used their window's admissions (INT32_MAX elsewhere);
    a per-client KV cap masks clients whose head would take their reserved KV past it.

    Returns (has_candidate: bool[], client: int32[], row: int32[5]).
    """
    heads = _rows_at(requests, state.head)
    within_cap = state.reserved <= params.kv_cap - heads[:, PROMPT] - heads[:, OUTPUT]
    eligible = (state.head < state.arrived) & (state.window_admits < params.rpm_limit) & within_cap
    oldest = jnp.argmin(jnp.where(eligible, heads[:, ORDER], INT32_MAX))
    least = wide.argmin(state.counter, eligible)
    client = jnp.where(params.by_counter, least, oldest).astype(I32)
    return eligible.any(), client, heads[client]


def admit(state: State, client: jax.Array, row: jax.Array, params: Params, mask: jax.Array,
          config: EngineConfig) -> State:
    """Admit `row` of `client` where `mask` (phase 2, one request)."""
    onehot = (jnp.arange(config.num_clients) == client) & mask
    take = onehot.astype(I32)
    prompt, output = row[PROMPT], row[OUTPUT]
    charged_tokens = jnp.where(params.charge_cached, prompt, prompt - row[CACHED])
    charge = params.prefill_cost * charged_tokens
    finish_row = (state.step + output - 1) % config.calendar_len
    add = mask.astype(I32)
    return dataclasses.replace(
        state,
        head=state.head + take,
        running=state.running + take,
        context=state.context + take * prompt,
        reserved=state.reserved + take * (prompt + output),
        service=wide.add(state.service, take * charge),
        counter=wide.add(state.counter, take * charge * params.counter_mult),
        admitted=state.admitted + take,
        window_admits=state.window_admits + take,
        last_left=jnp.where(mask, client, state.last_left),
        cal_count=state.cal_count.at[finish_row, client].add(add),
        cal_context=state.cal_context.at[finish_row, client].add(add * (prompt + output)),
        measures=on_admit(state.measures, mask, client, state.step, row[ARRIVAL], prompt, output,
                          row[CACHED], state.horizon),
    )


def finish_step(state: State, workload: Workload, params: Params, mask: jax.Array,
                config: EngineConfig) -> State:
    """Phases 3-4 of step t where `mask`, then the step's measures; t += 1."""
    m = mask.astype(I32)
    t = state.step
    decode = params.decode_cost * state.running + params.context_cost * state.context
    service = wide.add(state.service, m * decode)
    counter = wide.add(state.counter, m * decode * params.counter_mult)
    context = state.context + m * state.running
    row = t % config.calendar_len
    leaving, leaving_context = state.cal_count[row], state.cal_context[row]
    running = state.running - m * leaving
    context = context - m * leaving_context
    reserved = state.reserved - m * leaving_context
    completed = state.completed + m * leaving
    cal_count = state.cal_count.at[row].add(-m * leaving)
    cal_context = state.cal_context.at[row].add(-m * leaving_context)

    measures = on_finish(state.measures, mask, t, service, state.head, state.arrived, state.running,
                         state.context, params.share_window, params.resource, config.record_every)
    next_t = t + m
    new_window = (next_t // params.rpm_window) != (t // params.rpm_window)
    finished = next_t >= state.horizon
    if config.drain:
        finished |= completed.sum() == workload.num_requests
    return dataclasses.replace(
        state, step=next_t, done=state.done | (mask & finished), service=service, counter=counter,
        running=running, context=context, reserved=reserved, completed=completed, cal_count=cal_count,
        cal_context=cal_context, measures=measures,
        window_admits=jnp.where(mask & new_window, 0, state.window_admits))


def take_arrivals(state: State, requests: jax.Array, params: Params, mask: jax.Array,
                  config: EngineConfig) -> State:
    """Phase 1 at step t where `mask`: up to `arrival_width` arrivals per client.

    The lift rule, applied request by request in trace order, reduces to one floor: if
    some client is backlogged when the step's arrivals begin, every arriving client that was
    not backlogged is lifted to that minimum (each lifted counter is >= it, so the minimum
    never changes). If none is, the first newcomer in trace order is lifted to
    c_{last_left}, and that value is the floor for every later newcomer. Only a client's
    first arrival of a step can find it not backlogged, and every client's first arrival is
    in the step's first batch, so later batches (no admissions in between) lift nobody.
    """
    width = config.arrival_width
    index = state.arrived[:, None] + jnp.arange(width, dtype=I32)[None, :]
    upcoming = jnp.take_along_axis(requests, index[:, :, None], axis=1)  # [K, width, 5]
    joins = mask & (upcoming[..., ARRIVAL] <= state.step)  # sorted: a prefix of each row
    joining = joins.sum(axis=1, dtype=I32)
    backlogged = state.head < state.arrived
    newcomer = ~backlogged & (joining > 0)

    first_order = jnp.where(newcomer, _rows_at(requests, state.arrived)[:, ORDER], INT32_MAX)
    first = jnp.argmin(first_order)
    has_last = params.lift_last_left & (state.last_left >= 0)
    last_counter = state.counter[jnp.maximum(state.last_left, 0)]
    first_floor = wide.where(has_last, wide.maximum(state.counter[first], last_counter),
                             state.counter[first])
    floor = wide.where(backlogged.any(), wide.min_of(state.counter, backlogged), first_floor)
    lifted = newcomer & params.lift
    cost = request_cost(upcoming[..., PROMPT], upcoming[..., OUTPUT], upcoming[..., CACHED],
                        params.prefill_cost, params.decode_cost, params.context_cost)
    return dataclasses.replace(
        state,
        counter=wide.where(lifted, wide.maximum(state.counter, floor), state.counter),
        arrived=state.arrived + joining,
        measures=on_arrivals(state.measures, state.step, cost, joins, config.record_every))


def iterate(state: State, workload: Workload, params: Params, config: EngineConfig) -> State:
    """One event of one lane (see module docstring)."""
    requests = workload.requests
    active = ~state.done
    next_arrival = _rows_at(requests, state.arrived)[:, ARRIVAL]
    pending = active & (next_arrival <= state.step).any()
    has_candidate, client, row = select_candidate(state, requests, params)
    fits = state.context.sum() + row[PROMPT] <= params.kv_budget
    admitting = active & ~pending & has_candidate & fits
    finishing = active & ~pending & ~admitting

    state = admit(state, client, row, params, admitting, config)
    state = finish_step(state, workload, params, finishing, config)
    arriving = pending | (finishing & ~state.done)
    state = take_arrivals(state, requests, params, arriving, config)
    return dataclasses.replace(state, iterations=state.iterations + active.astype(I32))


def advance(state: State, workload: Workload, params: Params, config: EngineConfig,
            num_events: int) -> State:
    """`num_events` iterations of one lane."""

    def body(carry, _):
        return iterate(carry, workload, params, config), None

    state, _ = jax.lax.scan(body, state, None, length=num_events)
    return state


def _advance_lanes(state: State, workload: Workload, params: Params, *, config: EngineConfig,
                   num_events: int, shared_workload: bool) -> State:
    lane = functools.partial(advance, config=config, num_events=num_events)
    return jax.vmap(lane, in_axes=(0, None if shared_workload else 0, 0))(state, workload, params)


_STATIC = ("config", "num_events", "shared_workload")
advance_lanes = jax.jit(_advance_lanes, static_argnames=_STATIC)
advance_lanes.__doc__ = """`advance` vmapped over a leading lane axis of state and params (and of the
workload unless `shared_workload`, when every lane replays the same one)."""
# The carried state is dead after each chunk: donating it lets XLA update it in place on
# accelerators (the CPU backend ignores donation, with a warning, so it is not used there).
advance_lanes_donating = jax.jit(_advance_lanes, static_argnames=_STATIC, donate_argnums=(0,))


@functools.partial(jax.jit, static_argnames=("config",))
def init_lanes(horizons: jax.Array, *, config: EngineConfig) -> State:
    """Batched initial state, one lane per horizon: int32[B]."""
    return jax.vmap(functools.partial(init_state, config))(horizons)
