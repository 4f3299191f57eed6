"""The exact engine of MODEL.md as a pure JAX state machine (one lane).

One lane is one simulated server. Its `State` advances by *events*, one per call of
`step_lane`, chosen by masks (never a per-lane `lax.cond`: under vmap both branches run):

  * COMPLETE: a request whose completion step has ended is still running: it leaves
              (phase 4, one request per event, in admission order within a step);
  * ARRIVE  : some request with arrival <= t has not joined its FIFO yet: the next
              `arrival_width` requests of the workload's timeline (all clients, in
              trace order) that have arrived join (phase 1; the policy's arrival hook,
              e.g. VTC's lift, runs here);
  * ADMIT   : otherwise, the policy's candidate exists, is eligible (`select`) and fits:
              admit it (phase 2); and when the candidate after it does not fit, the
              FINISH below in the same event (from that state the next event would be
              that FINISH: one event fewer, the same states);
  * FINISH  : otherwise, step t ends: decode (phase 3), t += 1 (or, when nothing runs or
              waits, a jump to the next arrival: idle steps cost nothing; or a stretch of
              quiet steps, below), then in the same event the first completion and the
              first arrivals of the new step.

Quiet steps (engines/quiet.py): when no waiting request fits and none will before a
completion, a FINISH event also runs the steps up to it, which only decode (and take
arrivals to clients already backlogged), in bulk: the same integers in far fewer events.

A run of T steps takes at most T FINISH events, one ADMIT per admitted request, one extra
COMPLETE per request and one extra ARRIVE per `arrival_width` arrivals of a step past the
first width: at most T + 3 * requests events. An arrival event reads W timeline entries,
and arrivals, admissions and completions update only their clients' entries (put_at /
add_at), so the O(K) work of an event is the selection and the step's charges and drift.
Lanes that reach their horizon become no-ops (`done`).

Queues are pointers (DESIGN.md): client k's FIFO is rows [head_k, arrived_k) of its block
in the workload. The policy (vtc_jax/policies) and the server (vtc_jax/servers) are
components: the engine knows neither by name. A batch may mix policies
(`EngineConfig.policies`, dispatched on the traced `Params.policy_id`); the server
(`EngineConfig.server`) says whether a request fits, runs the admitted ones, reports the
tokens each step computed (charged here with the lane's costs) and hands back those that
finished (servers/base.py; the default `ideal` is MODEL.md's server). A server that
preempts adds a BEGIN per step, after its arrivals and before its admissions: the
server schedules its running requests and hands back its victims, which go to the front
of their clients' queues (engines/requeue.py); it is taken at the end of the event that
settles the step's completions and arrivals (no event of its own but a run's first); a
step then lasts what the server says (`Work.elapsed`: 1 on `ideal`).
All quantities are int32 in the exact units of settings.py; times (the step, arrivals, stamps)
are int64 on a wide clock (EngineConfig.wide_clock, core/clock.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from vtc_jax.core import clock, over_clients
from vtc_jax.core.once import once_for
from vtc_jax.core.rows import ARRIVAL, CACHED, ORDER, OUTPUT, PROMPT
from vtc_jax.core.wide import numbers
from vtc_jax.engines import limits, quiet, requeue
from vtc_jax.engines.engine_config import EngineConfig
from vtc_jax.engines.program import LaneProgram
from vtc_jax.engines.settings import Params
from vtc_jax.inputs.workload import TIMELINE_FIELDS, TIMELINE_PAD, Workload
from vtc_jax.measures.online import Measures, init_measures, on_admit, on_finish
from vtc_jax.policies import estimators, registry
from vtc_jax.policies.base import (Admission, Arrivals, Completion, Shape, StepEnd, View, add_at, admissible,
                                   head_arrivals, put_at, step_charge)
from vtc_jax.servers import registry as servers
from vtc_jax.servers.base import Work

I32 = jnp.int32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """One lane's state (a batch adds a leading lane axis to every field).

    Attributes:
      step: int32[]  t, the step in progress (the steps run, once `done`); int64 on a wide clock.
      horizon: int32[]  T: steps to run (drain mode: a bound that suffices).
      done: bool[]  reached the horizon (or, drain mode, every request completed).
      head: int32[K]  position in client k's block of its next request to admit.
      arrived: int32[K]  requests of client k that have joined its FIFO.
      heads: int32[K, 5]  the row at each client's head (its FIFO's, or its stack's top),
        kept by every admission and BEGIN, so an event reads no row per client (a client
        that waits for nothing: its next request to arrive); head_index: int32[K] its index.
      next: int32[]  position in the workload's timeline of the next request to arrive.
      counter: int32[K, 2]  the MODEL.md counter c_k (wide).
      service: int32[K, 2]  W_k in cost units (wide).
      server: the server's state (its `init`; the ideal server: running and context per
        client and the completion calendar).
      last_left: int32[]  client of the last admitted request, -1 for none.
      admitted, completed: int32[K]  request counts.
      limits: limits.LimitState.
      policy: dict  {policy name: its state}.
      estimator: estimators.EstimatorState (None unless config.estimator).
      measures: Measures.
      stacks: requeue.Stacks  preempted requests per client (None unless the server
        preempts); begun: bool[] the step's BEGIN event has run (None likewise).
      iterations: int32[]  events consumed.
      overflow: bool[]  a fixed-size structure would have overflowed (the running-request
        slots were full): the lane is flagged as not finished, never reported.
      arrivals: int64[K] the heads' arrival times, with a wide clock (heads' ARRIVAL is
        int32; core/clock.split_rows), else None.
    """

    step: jax.Array
    horizon: jax.Array
    done: jax.Array
    head: jax.Array
    arrived: jax.Array
    heads: jax.Array
    head_index: jax.Array
    next: jax.Array
    counter: jax.Array
    service: jax.Array
    server: Any
    last_left: jax.Array
    admitted: jax.Array
    completed: jax.Array
    limits: limits.LimitState
    policy: dict
    estimator: estimators.EstimatorState | None
    measures: Measures
    iterations: jax.Array
    overflow: jax.Array
    stacks: requeue.Stacks | None = None
    begun: jax.Array | None = None
    arrivals: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LaneInput:
    """What one lane runs: its settings and its horizon (int32[])."""

    params: Params
    horizon: jax.Array


def init_state(config: EngineConfig, lane: LaneInput, workload: Workload) -> State:
    """Empty server at step 0 (step 0's arrivals are taken by the first event)."""
    k, zeros_k = config.num_clients, jnp.zeros(config.num_clients, I32)
    horizon = jnp.asarray(lane.horizon, config.clock)
    num = numbers(config.wide)
    shape = Shape(num_clients=k, num_rows=config.num_rows, num=num, clock=config.clock)
    heads, arrivals = clock.split_rows(workload.requests[workload.first])
    return State(
        step=jnp.zeros((), config.clock), horizon=horizon, done=horizon <= 0, head=zeros_k, arrived=zeros_k,
        heads=heads, arrivals=arrivals, head_index=workload.first.astype(I32), next=jnp.zeros((), I32),
        counter=num.zeros((k,)), service=num.zeros((k,)), server=servers.get(config.server).init(config.server_shape),
        last_left=jnp.asarray(-1, I32), admitted=zeros_k, completed=zeros_k, limits=limits.init(k, config.rpm, config.kv_cap),
        policy={name: registry.get(name).init(lane.params.policy[name], shape) for name in config.policies},
        estimator=estimators.init(k) if config.estimator else None,
        measures=init_measures(k, config.num_checkpoints, config.measures, num, config.clock), iterations=jnp.zeros((), I32),
        overflow=jnp.zeros((), bool), **_preemption_state(config))


def _preemption_state(config: EngineConfig) -> dict:
    server = servers.get(config.server)
    if not server.preempts:
        return {}
    queue = requeue.init_tails if server.requeue_to_tail else requeue.init
    return {"stacks": queue(config.num_clients, config.requeue_depth), "begun": jnp.zeros((), bool)}


def _heads(state: State):
    """(heads int32[K, 5], head_index int32[K]): each client's next request to admit, its
    stack's top when it has preempted requests, else its FIFO's head."""
    if state.stacks is None:
        return state.heads, state.head_index
    if isinstance(state.stacks, requeue.Tails):
        return state.heads, jnp.where(state.stacks.from_tail, requeue.fronts(state.stacks)[0], state.head_index)
    top_index, _ = requeue.tops(state.stacks)
    return state.heads, jnp.where(state.stacks.depth > 0, top_index, state.head_index)


def _waiting(state: State):
    """int32[K]: requests waiting per client (preempted ones included)."""
    waiting = state.arrived - state.head
    return waiting if state.stacks is None else waiting + state.stacks.depth


def _dispatch(config: EngineConfig, params: Params, values):
    """The lane's policy's value among one value per policy (pytrees of equal structure)."""
    if len(values) == 1:
        return values[0]
    pick = lambda *xs: jnp.select([params.policy_id == i for i in range(len(xs) - 1)], list(xs[:-1]), xs[-1])  # noqa: E731
    return jax.tree_util.tree_map(pick, *values)


def _estimates(state: State, params: Params, config: EngineConfig, client, rows, position):
    """The estimator's output prediction for request rows of `client` at `position` in its
    block (zeros if no policy in the batch estimates)."""
    if not config.estimator:
        return jnp.zeros(rows.shape[:-1], I32)
    return estimators.estimate(state.estimator, params.estimator, client, rows[..., OUTPUT], position)


def _view(state: State, params: Params, heads, head_index, estimates, config: EngineConfig) -> View:
    load = servers.get(config.server).load(state.server)
    waiting = _waiting(state)
    order = None  # the lane's one waiting order, when requeued requests join its tail (requeue.order_keys)
    if isinstance(state.stacks, requeue.Tails):
        order = requeue.order_keys(state.stacks, heads[:, ARRIVAL], heads[:, ORDER], config.num_rows)
    return View(num=numbers(config.wide), step=state.step, backlogged=waiting > 0, heads=heads, arrivals=state.arrivals,
                head_index=head_index, order=order,
                waiting=waiting,
                counter=state.counter, running=load.running, context=load.context, last_left=state.last_left,
                costs=params.costs, estimates=estimates)


def _onehot(client, k, mask):
    return ((jnp.arange(k) == client) & mask).astype(I32)


def admit(state: State, view: View, choice, params: Params, workload: Workload, mask, config: EngineConfig) -> State:
    """Admit the candidate's head request where `mask` (phase 2, one request). Only the
    client's own entries change (put_at: a scatter at many clients, no work over K)."""
    k, num = config.num_clients, view.num
    client = choice.client
    row, index = view.heads[client], view.head_index[client]
    prompt, output = row[PROMPT], row[OUTPUT]
    hit = servers.get(config.server).prefix_hit  # a server that caches says what it would serve from cache
    cached = row[CACHED] if hit is None else hit(state.server, params, row, generated=jnp.zeros((), I32))
    charged = jnp.where(params.costs.charge_cached, prompt, prompt - cached)  # sent, or computed (the default)
    prefill = params.costs.prefill * charged
    stacks, generated, first = state.stacks, jnp.zeros((), I32), mask  # first: a new request (not a preempted one)
    tails = isinstance(stacks, requeue.Tails)
    if tails:
        again = stacks.from_tail[client]
        generated = _generated(state, client)
        first = mask & ~again
        stacks = requeue.pop_tail(stacks, _onehot(client, k, mask & again))
        prefill = jnp.where(again, 0, prefill)
    elif stacks is not None:
        again = stacks.depth[client] > 0
        generated = _generated(state, client)
        first = mask & ~again
        stacks = requeue.pop(stacks, _onehot(client, k, mask & again))
        prefill = jnp.where(again, 0, prefill)  # a recompute is not charged again: its tokens were
    admission = Admission(client=client, row=row, index=index, estimate=view.estimates[client], prefill=prefill)
    policy_states, values = {}, []
    for name, base in zip(config.policies, _choice_states(choice, config)):
        chosen = registry.get(name)
        policy_states[name], value = chosen.admit(base, view, _own_estimates(admission, chosen), params.policy[name])
        values.append(value)
    value = _dispatch(config, params, values)
    server, overflow = servers.get(config.server).admit(state.server, params, row, client, value, state.step, mask,
                                                        index=index, generated=generated)
    fifo_index = state.head_index[client] + first  # the FIFO's head after the admission
    # The client's new head (meaningful if backlogged). Lanes that do not admit read row 0,
    # which every such event reads, so it stays cached: only admissions pay a miss.
    next_index = jnp.where(mask, fifo_index, 0)
    if tails:  # its FIFO's head or its ring's front, whichever waits first (requeue.Tails)
        fifo_row = workload.requests[next_index]
        fifo_waits = state.head[client] + first < state.arrived[client]
        front_index, _, front_at, _ = (x[client] for x in requeue.fronts(stacks))
        from_tail = (stacks.depth[client] > 0) & (~fifo_waits | (front_at < fifo_row[ARRIVAL]))
        next_index = jnp.where(from_tail, front_index, next_index)
        stacks = dataclasses.replace(stacks, from_tail=put_at(stacks.from_tail, client, from_tail, mask))
    elif stacks is not None:  # or its stack's new top, if any
        left = stacks.depth[client]
        next_index = jnp.where(left > 0, stacks.index[client, jnp.maximum(left - 1, 0)], next_index)
    next_row, next_arrival = clock.split_rows(workload.requests[next_index])
    arrival = head_arrivals(view)[client]
    return dataclasses.replace(
        state, arrivals=None if next_arrival is None else put_at(state.arrivals, client, next_arrival, mask),
        head=add_at(state.head, client, 1, first), head_index=put_at(state.head_index, client, fifo_index, first),
        stacks=stacks, heads=put_at(state.heads, client, next_row, mask), server=server,
        service=put_at(state.service, client, num.add(state.service[client], prefill), mask),
        counter=put_at(state.counter, client,
                       num.add(state.counter[client], prefill * params.costs.counter_mult[client]), mask),
        admitted=add_at(state.admitted, client, 1, first), last_left=jnp.where(mask, client, state.last_left),
        overflow=state.overflow | overflow, limits=limits.on_admit(state.limits, _onehot(client, k, first), row),
        policy=_keep(state.policy, policy_states, mask),
        measures=on_admit(state.measures, first, client, state.step, arrival, prompt, output, cached,
                          state.horizon, view.num))


def _own_estimates(event, policy):
    """`event` (an Admission or Arrivals) as `policy` sees it: the estimator's predictions
    only if it uses the estimator, else zeros, as in a batch without one (a lane's results
    never depend on the policies of the other lanes of its batch)."""
    if policy.uses_estimator:
        return event
    if isinstance(event, Admission):
        return event._replace(estimate=jnp.zeros_like(event.estimate))
    return event if event.estimates is None else event._replace(estimates=jnp.zeros_like(event.estimates))


def begin(state: State, view: View, params: Params, workload: Workload, mask, config: EngineConfig) -> State:
    """The step's BEGIN event where `mask` (servers that preempt): the server schedules its
    running requests; its victims go onto their clients' stacks (a client's head is then
    its stack's top, read from the workload)."""
    server, out = servers.get(config.server).begin_step(state.server, params, view, state.step, mask)
    if isinstance(state.stacks, requeue.Tails):  # its victims leave at the step's end (Work.requeue)
        return dataclasses.replace(state, server=server, begun=state.begun | mask)
    stacks, overflow = requeue.push(state.stacks, out.mask & mask, out.client, out.index, out.generated)
    top_index, _ = requeue.tops(stacks)
    pushed = stacks.depth > state.stacks.depth
    # Clients that pushed nothing read row 0, as every such event does, so it stays cached.
    top_row, top_arrival = clock.split_rows(workload.requests[jnp.where(pushed, top_index, 0)])
    return dataclasses.replace(state, server=server, stacks=stacks, begun=state.begun | mask,
                               arrivals=None if top_arrival is None else jnp.where(pushed, top_arrival, state.arrivals),
                               heads=jnp.where(pushed[:, None], top_row, state.heads),
                               overflow=state.overflow | (mask & overflow))


def _choice_states(choice, config):
    """Per policy, the state to admit from (the scan's state of each policy's choice)."""
    return choice.states


def _keep(old: dict, new: dict, mask) -> dict:
    """Policy states: `new` where `mask`, else `old`. A leaf the hook returned untouched
    (the same array) is kept as is: no select over it, so a large per-request table a hook
    does not change in this event costs nothing here."""
    return jax.tree_util.tree_map(lambda a, b: a if a is b else jnp.where(mask, b, a), old, new)


def finish(state: State, view: View, workload: Workload, params: Params, mask, next_arrival, ahead,
           config: EngineConfig, candidate, head_prompts, refused=None):
    """Phase 3 of step t where `mask`; t moves on (by a jump over idle steps when nothing
    runs or waits: to the next arrival or the horizon; or, with `ahead`, the timeline's next
    `quiet_window` entries, past the quiet steps that follow t). `candidate`: (client
    int32[], prompt int32[]) the policy's candidate, which did not fit (or none is
    eligible); `head_prompts` int32[K]: view.heads[:, PROMPT], computed once; `refused`:
    (bool[], row int32[5], generated int32[]) the candidate's request where one was refused
    (read by a server with a `refused` hook)."""
    t, num = state.step, view.num
    load = servers.get(config.server).load(state.server)
    server = state.server
    if servers.get(config.server).refused is not None:  # the candidate that ends the step, told to the server
        refusing, row, generated = refused
        server = servers.get(config.server).refused(server, params, row, generated=generated, mask=mask & refusing)
    server, work = servers.get(config.server).end_step(server, params, mask)
    stacks, heads, overflow = state.stacks, state.heads, state.overflow
    if work.requeue is not None:  # victims to the tail of the waiting queue (requeue.Tails)
        out = work.requeue
        fifo_empty = state.arrived <= state.head
        stacks, full = requeue.push_tail(stacks, out.mask & mask, out.client, out.index, out.generated, t, fifo_empty)
        newly = stacks.from_tail & ~state.stacks.from_tail
        front_rows = workload.requests[jnp.where(newly, requeue.fronts(stacks)[0], 0)]
        heads, overflow = jnp.where(newly[:, None], front_rows, heads), overflow | (mask & full)
    if work.overflow is not None:
        overflow = overflow | (mask & work.overflow)
    decode = step_charge(params.costs, work)
    service = num.add(state.service, decode)
    idle = ~servers.get(config.server).busy(state.server) & ~over_clients.any_of(view.backlogged)
    if work.emptied is not None:  # BLIS's event order: the engine is free from the step's start (servers/base.py)
        idle = idle | (work.emptied & ~over_clients.any_of(view.backlogged))
    wake = servers.get(config.server).wake
    target = jnp.minimum(next_arrival if wake is None else wake(params, t, next_arrival), state.horizon)
    arrived, taken, at_ends = state.arrived, jnp.zeros((), I32), {}
    if ahead is not None:
        chosen = None
        if not (config.rpm or config.kv_cap or config.bands):  # eligibility is fixed through the stretch
            def choose(steps):  # the policy's choice `steps` steps later (counters linear, all else fixed)
                later = num.add(view.counter, decode * params.costs.counter_mult * steps)
                return select(state, view._replace(counter=later), params, config).client
            chosen = (*candidate, choose)
        stretch = quiet.stretch(config, params, state.step, state.horizon, view.backlogged, head_prompts,
                                server, decode, mask & ~idle, ahead, chosen)
        server, arrived, taken = stretch.server, arrived + stretch.joined, stretch.taken
        more = step_charge(params.costs, stretch.work)
        at_ends = dict(quiet_steps=stretch.steps, step_service=service,
                     arrival_service=num.add(service, decode * stretch.since_arrival))
        work = Work(decoded=work.decoded + stretch.work.decoded, attended=work.attended + stretch.work.attended,
                    elapsed=work.elapsed + stretch.steps, detail=work.detail)
        decode, service = decode + more, num.add(service, more)
        # W's two ends, read by every measure's output: computed once
        service, at_ends["step_service"] = once_for(config.num_clients)(service, at_ends["step_service"])
    next_t = jnp.where(mask, jnp.where(idle, jnp.maximum(t + 1, target), t + work.elapsed), t)
    step_end = StepEnd(decode=decode, elapsed=next_t - t, detail=work.detail)
    policy_states = {name: registry.get(name).step(state.policy[name], view, step_end, params.policy[name])
                     for name in config.policies}
    measures = on_finish(state.measures, mask, t, next_t, service, state.arrived - view.waiting, arrived,
                         load.running, load.context, work.decoded, work.attended, params.share_window, params.resource,
                         config.record_every, num, **at_ends)
    return dataclasses.replace(
        state, step=next_t, service=service, counter=num.add(state.counter, decode * params.costs.counter_mult),
        server=server, arrived=arrived, next=state.next + taken, stacks=stacks, heads=heads, overflow=overflow,
        begun=None if state.begun is None else state.begun & ~mask,
        policy=_keep(state.policy, policy_states, mask),
        limits=limits.on_step(state.limits, t, next_t, mask, params), measures=measures)


def complete(state: State, view: View, params: Params, mask, config: EngineConfig) -> State:
    """Phase 4 for one request (the next to complete) where `mask`."""
    server, done = servers.get(config.server).complete(state.server, state.step, mask)
    client, prompt, output, value = done.client, done.prompt, done.output, done.value
    completion = Completion(client=client, prompt=prompt, output=output, estimate=value)
    policy_states = {name: registry.get(name).complete(state.policy[name], view, completion, params.policy[name])
                     for name in config.policies}
    estimator = state.estimator
    if config.estimator:
        estimator = estimators.observe(estimator, client, output, mask)
    return dataclasses.replace(
        state, server=server, completed=add_at(state.completed, client, 1, mask),
        limits=limits.on_complete(state.limits, _onehot(client, config.num_clients, mask), prompt, output),
        estimator=estimator,
        policy=_keep(state.policy, policy_states, mask))


def arrival_window(state: State, workload: Workload, config: EngineConfig):
    """(index int32[W], client int32[W], arrival int32[W], rows int32[W, 5] or None): the
    next `arrival_width` requests to arrive, in (arrival, number) order, from the timeline;
    rows (a gather, each a cache miss at many lanes) only if config.arrival_rows."""
    if not 1 <= config.arrival_width <= TIMELINE_PAD:
        raise ValueError(f"arrival_width must be in [1, {TIMELINE_PAD}] (the timeline's padding)")
    entries = jax.lax.dynamic_slice_in_dim(workload.timeline, state.next, config.arrival_width)
    rows = clock.split_rows(workload.requests[entries[:, 0]])[0] if config.arrival_rows else None
    return entries[:, 0].astype(I32), entries[:, 1].astype(I32), entries[:, 2], rows


def take_arrivals(state: State, view: View, workload: Workload, params: Params, mask, window,
                  config: EngineConfig) -> State:
    """Phase 1 at step t where `mask`: the next `arrival_width` requests of the timeline that
    arrive at t join their FIFOs, in trace order; the policies' arrival hooks (VTC's lift)
    see them as one event. Only a client's first arrival of a step can find it not
    backlogged, and every client's first arrival is in the step's first event (the timeline
    is in arrival order), so later events of the step lift nobody. `window` is
    `arrival_window` of this state. A newcomer's cached head already is its arriving row
    (a client not backlogged has head == arrived and an empty stack: State.heads)."""
    k, width = config.num_clients, config.arrival_width
    index, client, arrival, rows = window
    joins = mask & (arrival <= state.step)  # in arrival order: a prefix of the window
    # Per entry, the earlier joining entries of its client ([W, W]: no work over K).
    earlier = (client[:, None] == client[None, :]) & joins[None, :] & jnp.tri(width, k=-1, dtype=bool)
    before = earlier.sum(axis=1, dtype=I32)
    opens = joins & (before == 0) & ~view.backlogged[client]  # a newcomer's first request
    joins, opens = once_for(config.num_clients)(joins, opens)  # read by every output of the event
    newcomer = put_at(jnp.zeros(k, bool), client, True, opens)  # (opening entries are of distinct clients)
    joining = add_at(jnp.zeros(k, I32), client, 1, joins)  # (computed only for a policy that reads it)
    first = client[jnp.argmax(opens)]  # the first newcomer in trace order
    estimates = None
    if config.arrival_rows:
        estimates = _estimates(state, params, config, client, rows, state.arrived[client] + before)
    arrivals = Arrivals(joins=joins, client=client, index=index, rows=rows, estimates=estimates, joining=joining,
                        newcomer=newcomer, first=first)
    policy_states, counters = {}, []
    for name in config.policies:
        chosen = registry.get(name)
        policy_states[name], counter = chosen.arrive(state.policy[name], view, _own_estimates(arrivals, chosen),
                                                     params.policy[name])
        counters.append(counter)
    counter = _dispatch(config, params, counters)
    # Arrival hooks see only joining requests (`joins` is False outside this event), so
    # their states need no select (per-request tables stay O(1) per event).
    return dataclasses.replace(
        state, counter=view.num.where(mask, counter, state.counter), arrived=add_at(state.arrived, client, 1, joins),
        next=state.next + joins.sum(dtype=I32), policy=policy_states)


def select(state: State, view: View, params: Params, config: EngineConfig):
    """The lane's candidate: eligible clients (limits, bands), then each policy's choice,
    dispatched on the lane's policy. Returns a choice with `.states` (one per policy).

    `has` holds only where the policy's client is eligible: a policy's choice of a client
    the limits, bands or an empty FIFO rule out is refused like a candidate that does not
    fit (nothing is admitted and the step ends), so no policy can bypass --rpm, --kv-cap or
    --bands. A client outside [0, K) is ineligible too (never clamped to a real one)."""
    eligible = limits.eligible(state.limits, view.heads, view.backlogged, params, config.bands)
    choices = [registry.get(name).select(state.policy[name], view, eligible, params.policy[name])
               for name in config.policies]
    client = _dispatch(config, params, [c.client for c in choices]).astype(I32)
    has = _dispatch(config, params, [c.has for c in choices])
    return _Selected(client=client, has=has & admissible(eligible, client), states=[c.state for c in choices])


@dataclasses.dataclass(frozen=True)
class _Selected:
    client: jax.Array
    has: jax.Array  # the policy has a candidate and it is admissible (base.admissible)
    states: list


def step_lane(state: State, lane: LaneInput, workload: Workload, config: EngineConfig) -> State:
    """One event of one lane (see the module docstring)."""
    params = lane.params
    active = ~state.done
    jump = quiet.window(config)
    if workload.timeline.shape[-1] != TIMELINE_FIELDS:
        raise ValueError(f"the timeline's entries need {TIMELINE_FIELDS} fields (row, client, arrival)")
    ahead = jax.lax.dynamic_slice_in_dim(workload.timeline, state.next, max(jump, 1))
    next_arrival = ahead[0, 2]
    in_horizon = state.step < state.horizon
    server = servers.get(config.server)
    due = server.due(state.server, state.step)
    pending = in_horizon & (next_arrival <= state.step)
    ready = active & in_horizon & ~due & ~pending
    if server.preempts:
        ready = ready & state.begun  # (only the first event of a run can find a step not begun)
    view, choice, fits = _candidate(state, params, config)
    admitting, client = once_for(config.num_clients)(ready & choice.has & fits, choice.client)
    state = admit(state, view, dataclasses.replace(choice, client=client), params, workload, admitting, config)
    # The step ends in this event when its candidate now does not fit: from this state the
    # next event would end it, so ending it here changes nothing but the count of events.
    view, choice, fits = _candidate(state, params, config)
    finishing, client, prompt, prompts, backlogged = once_for(config.num_clients)(
        ready & ~server.due(state.server, state.step) & ~(choice.has & fits), choice.client,
        view.heads[choice.client, PROMPT], view.heads[:, PROMPT], view.backlogged)
    heads, head_index = view.heads, view.head_index
    view = view._replace(backlogged=backlogged)
    refused = None if server.refused is None else (choice.has, view.heads[client], _generated(state, client))
    state = finish(state, view, workload, params, finishing, next_arrival, ahead if jump else None, config,
                   (client, prompt), prompts, refused)
    view = _view(state, params, heads, head_index, view.estimates, config)
    completing = active & server.due(state.server, state.step)
    state = complete(state, view, params, completing, config)
    window = arrival_window(state, workload, config)  # read after a quiet stretch's joins
    arriving = (active & (state.step < state.horizon) & ~server.due(state.server, state.step)
                & (window[2][0] <= state.step))
    view = _view(state, params, heads, head_index, view.estimates, config)
    state = take_arrivals(state, view, workload, params, arriving, window, config)
    settled = ~server.due(state.server, state.step)
    finished = (state.step >= state.horizon) & settled
    if config.drain:
        finished |= (over_clients.total(state.completed) == workload.num_requests) & settled
    if server.preempts:
        state = _begin_if_settled(state, params, workload, active & ~finished & settled, config)
    return dataclasses.replace(state, done=state.done | (active & finished),
                               iterations=state.iterations + active.astype(I32))


def _lane_view(state: State, params: Params, config: EngineConfig) -> View:
    """The lane's view of `state`: its heads (stacks' tops first) and their estimates."""
    heads, head_index = _heads(state)
    return _view(state, params, heads, head_index,
                 _estimates(state, params, config, jnp.arange(config.num_clients, dtype=I32), heads, state.head),
                 config)


def _generated(state: State, client) -> jax.Array:
    """int32[]: the tokens `client`'s next request had generated (0 unless it was preempted)."""
    if state.stacks is None:
        return jnp.zeros((), I32)
    if isinstance(state.stacks, requeue.Tails):
        return jnp.where(state.stacks.from_tail[client], requeue.fronts(state.stacks)[1][client], 0)
    return requeue.tops(state.stacks)[1][client]


def _candidate(state: State, params: Params, config: EngineConfig):
    """(view, choice, fits bool[]): the lane's view, its policy's candidate and whether
    the candidate's request fits the server now."""
    view = _lane_view(state, params, config)
    choice = select(state, view, params, config)
    generated = _generated(state, choice.client)
    server = servers.get(config.server)
    fits = server.fits(state.server, params, view.heads[choice.client], generated=generated,
                       **({"client": choice.client} if server.fits_client else {}))
    return view, choice, fits


def _begin_if_settled(state: State, params: Params, workload: Workload, mask, config: EngineConfig) -> State:
    """The step's BEGIN in the event that settles it (`mask`: the lane goes on and no
    completion is due): when no arrival of the step is left either and the step has not
    begun, the next event would be its BEGIN alone, from this very state, so it is taken
    here (one event per step fewer, the same states)."""
    next_arrival = arrival_window(state, workload, config)[2][0]
    beginning = mask & (state.step < state.horizon) & (next_arrival > state.step) & ~state.begun
    return begin(state, _lane_view(state, params, config), params, workload, beginning, config)


def lane_done(state: State) -> jax.Array:
    return state.done


def events_left(state: State) -> jax.Array:
    """int32[]: about the events the lane has left: its steps to the horizon at its events
    per step so far (0 once done; a drained lane's far horizon makes it large)."""
    steps_left = jnp.maximum(state.horizon - state.step, 0).astype(jnp.float32)
    per_step = (state.iterations + 1).astype(jnp.float32) / jnp.maximum(state.step, 1).astype(jnp.float32)
    estimate = jnp.minimum(jnp.ceil(steps_left * per_step), float(1 << 30)).astype(I32)
    return jnp.where(state.done, 0, estimate)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EngineBatch:
    """The runner's per-lane inputs: the lane's settings and horizon, and its own workload
    (None when every lane replays one shared workload)."""

    lane: LaneInput
    workload: Workload | None


def _program_init(config: EngineConfig, batched: EngineBatch, shared) -> State:
    return init_state(config, batched.lane, batched.workload if batched.workload is not None else shared)


def _program_step(state: State, batched: EngineBatch, shared, config: EngineConfig) -> State:
    workload = batched.workload if batched.workload is not None else shared
    return step_lane(state, batched.lane, workload, config)


PROGRAM = LaneProgram(name="model", init=_program_init, step=_program_step, done=lane_done, events_left=events_left)
