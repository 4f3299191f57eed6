"""Running lanes to their horizon, and the results users read.

`run_lanes` is the one driver loop: it advances a batch of lanes in compiled chunks of
events until every lane is done or the event budget (which always suffices for a valid
input) is spent, and flags any lane that did not finish. `replay` wraps it for one trace.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vtc_jax import wide
from vtc_jax.devices import lane_mesh, pad_to, shard
from vtc_jax.engine import EngineConfig, State, advance_lanes, advance_lanes_donating, init_lanes
from vtc_jax.measures import MeasureConfig
from vtc_jax.results import LaneResults, collect
from vtc_jax.settings import INT32_MAX, InputError, Scales, Settings, encode_settings
from vtc_jax.traffic import Traffic, TrafficParams, generate, stream_capacity
from vtc_jax.workload import (Trace, Workload, make_workload, pad_rows,
                              requests_per_client)


def check_exact_limits(settings: Settings, num_clients: int, *, min_prompt: int, max_prompt: int,
                       max_output: int, horizon: int, max_requests: int) -> None:
    """Refuse up front a lane whose exact integer arithmetic could overflow.

    Totals and counters are wide (wide.py, exact to 2^55), but each single charge is added as
    an int32: the largest prefill charge and the largest per-client decode charge of one
    step, times the counter multiplier, must stay below wide.MAX_ADD (about 2^31). Running
    requests are at most M / min_prompt (their prompts fit M together) and their context at
    most M + that many times (max_output - 1).
    """
    params, _ = encode_settings([settings], num_clients)
    a_p, a_q, b = (int(x[0]) for x in (params.prefill_cost, params.decode_cost, params.context_cost))
    mult = int(np.max(np.asarray(params.counter_mult)))
    running = min(settings.kv_budget // max(min_prompt, 1), max_requests)
    context = settings.kv_budget + running * (max_output - 1)
    limits = [
        ("the running context", context),
        ("one prefill charge (w_p x prompt, in exact units, x weight scale)", a_p * max_prompt * mult),
        ("one step's decode charge (w_q x running + beta x context, in exact units, x weight scale)",
         (a_q * running + b * context) * mult),
        ("the run's total service", horizon * (a_p * settings.kv_budget + a_q * running + b * context) * mult
         >> wide.LOW_BITS),
    ]
    for name, value in limits:
        if value > wide.MAX_ADD:
            raise InputError(
                f"{name} could reach {value:.3g}, past the exact int32 limit {wide.MAX_ADD} "
                f"(M={settings.kv_budget}, max output {max_output}, costs scaled by their common "
                "denominator): use coarser fractions, closer weights, a smaller M or shorter outputs")


def default_chunk(expected_events: int) -> int:
    """Events per compiled call: about 1/8 of the expected run, so a finished batch wastes
    little, and the host checks `done` only a few times."""
    return int(min(8192, max(128, -(-expected_events // 8))))


def run_lanes(workload: Workload, settings: Sequence[Settings], horizons: Sequence[int], *,
              config: EngineConfig, event_budget: int, shared_workload: bool,
              chunk: int | None = None, mesh: Mesh | None = None) -> tuple[State, Scales, np.ndarray]:
    """Advance every lane until done or `event_budget` events; returns the final state,
    the lanes' scales and `finished` (bool[B]). One compile per (config, chunk, mesh).

    With a `mesh`, the lane axis is sharded over its devices (B must be a multiple of its
    size: see `devices.pad_to`); results are identical lane for lane.
    """
    params, scales = encode_settings(settings, config.num_clients)
    state = init_lanes(jnp.asarray(np.asarray(horizons, dtype=np.int32)), config=config)
    if mesh is not None:
        state, params = shard(state, mesh), shard(params, mesh)
        workload = shard(workload, mesh, batched=not shared_workload)
    step = advance_lanes if jax.default_backend() == "cpu" else advance_lanes_donating
    chunk = chunk or default_chunk(int(max(horizons)))
    spent = 0
    while spent < event_budget and not bool(jax.device_get(state.done.all())):
        state = step(state, workload, params, config=config, num_events=chunk, shared_workload=shared_workload)
        spent += chunk
    finished = np.asarray(jax.device_get(state.done & ~workload.overflow))
    finished = np.broadcast_to(finished, (len(settings),)).copy()
    return state, scales, finished


def drain_horizon(trace: Trace, rpm_window: int) -> int:
    """A horizon that drains `trace`: last arrival + sum of outputs + requests * rpm_window + 1.

    A request never waits while the server is empty (its prompt fits M) except for an rpm
    window to end (at most one window per admission; `rpm_window` = 0 for other policies),
    and at every other step some request runs.
    """
    return int(trace.arrival.max()) + int(trace.output.sum()) + len(trace) * rpm_window + 1


def plan_lanes(traces: Sequence[Trace], settings: Sequence[Settings], num_clients: int,
               steps: int | None, record_every: int, allow_unadmittable: bool = False,
               arrival_width: int = 4) -> tuple[EngineConfig, list[int], int]:
    """Validate lanes (trace i under settings i) and size their common static config.

    Returns (config, horizons, event budget). Fixed horizon T: T + 2 * requests events
    always suffice (T step ends, one admission per request, at most one extra arrival
    event per request). Drain mode: `drain_horizon` steps suffice.
    """
    if num_clients < 1:
        raise InputError(f"clients must be >= 1, got {num_clients}")
    if len(settings) == 0:
        raise InputError("no settings given (need at least one lane)")
    if steps is not None and steps < 1:
        raise InputError(f"steps must be >= 1, got {steps}")
    horizons = []
    for trace, s in zip(traces, settings, strict=True):
        if len(trace) == 0:
            raise InputError("the trace has no requests")
        trace.validate(num_clients)
        validate_fits(trace, s, num_clients, steps, allow_unadmittable)
        horizons.append(int(steps) if steps is not None else
                        drain_horizon(trace, s.rpm_window if s.policy == "rpm" else 0))
        check_exact_limits(s, num_clients, min_prompt=int(trace.prompt.min()), max_prompt=int(trace.prompt.max()),
                           max_output=int(trace.output.max()), horizon=horizons[-1], max_requests=len(trace))
    longest = max(horizons)
    if longest >= INT32_MAX // 2:
        raise InputError(f"horizon {longest} steps exceeds the limit {INT32_MAX // 2}")
    most_requests = max(int(requests_per_client(t, num_clients).max()) for t in traces)
    config = EngineConfig(
        num_clients=num_clients, stream_len=pad_rows(most_requests, arrival_width),
        calendar_len=max(int(t.output.max()) for t in traces), record_every=record_every,
        num_checkpoints=longest // record_every if record_every else 0,
        arrival_width=arrival_width, drain=steps is None,
        measures=MeasureConfig(pair_drift=num_clients <= 16))
    budget = longest + 2 * max(len(t) for t in traces) + 1
    return config, horizons, budget


def validate_fits(trace: Trace, settings: Settings, num_clients: int, horizon: int | None,
                  allow_unadmittable: bool) -> None:
    """Refuse a prompt larger than M (it could never be admitted) unless explicitly allowed,
    and a request larger than its client's KV cap."""
    arrives = trace.arrival < horizon if horizon is not None else np.ones(len(trace), bool)
    caps = np.asarray(settings.client_caps(num_clients), dtype=np.int64)
    over_cap = arrives & (trace.prompt + trace.output > caps[trace.client])
    if over_cap.any() and settings.kv_cap is not None:
        row = int(np.argmax(over_cap))
        raise InputError(f"row {row + 1}: prompt + output {trace.prompt[row] + trace.output[row]} exceeds "
                         f"client {trace.client[row]}'s KV cap; it could never be admitted")
    too_big = arrives & (trace.prompt > settings.kv_budget)
    if too_big.any() and not allow_unadmittable:
        row = int(np.argmax(too_big))
        raise InputError(f"row {row + 1}: prompt {trace.prompt[row]} is larger than the KV budget M="
                         f"{settings.kv_budget}; it could never be admitted")
    if too_big.any() and horizon is None:
        raise InputError("a prompt larger than M never completes: give a fixed number of steps")


def run_traces(traces: Sequence[Trace], settings: Sequence[Settings], *, num_clients: int,
               steps: int | None = None, record_every: int = 0, chunk: int | None = None,
               allow_unadmittable: bool = False, arrival_width: int = 4,
               mesh: Mesh | None = None) -> LaneResults:
    """Run lane i = trace i under settings i, all lanes in one compiled batch.

    Args:
      traces, settings: one per lane (equal lengths); every trace has `num_clients` clients.
      num_clients: K (clients without requests still count in drift: their W stays 0).
      steps: fixed horizon T, or None to run each lane until its requests all completed.
      record_every: checkpoint service every N steps (0: only the last step).
      chunk: events per compiled call (default: about 1/8 of the run).
      allow_unadmittable: simulate prompts larger than M (they block their client's FIFO
        and, head-of-line, admission) instead of refusing them (fixed horizon only).
      arrival_width: arrivals per client taken per event (a speed knob; any value is exact).
      mesh: devices to shard the lanes over (default: every local device).
    """
    if len(traces) != len(settings):
        raise InputError(f"{len(traces)} traces for {len(settings)} settings")
    config, horizons, budget = plan_lanes(traces, settings, num_clients, steps, record_every,
                                          allow_unadmittable, arrival_width)
    mesh = mesh or lane_mesh()
    n_lanes, target = len(settings), pad_to(len(settings), mesh)
    traces, settings, horizons = ([x[i % n_lanes] for i in range(target)] for x in (traces, settings, horizons))
    shared = all(t is traces[0] for t in traces)
    if shared:
        workload = make_workload(traces[0], num_clients, config.stream_len, steps)
    else:
        per_lane = [jax.tree_util.tree_map(np.asarray, make_workload(t, num_clients, config.stream_len, steps))
                    for t in traces]
        workload = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)), *per_lane)
    state, scales, finished = run_lanes(workload, settings, horizons, config=config,
                                        event_budget=budget, shared_workload=shared, chunk=chunk, mesh=mesh)
    return collect(state, scales, finished, config, settings, workload).head(n_lanes)


def replay_lanes(trace: Trace, settings: Sequence[Settings], *, num_clients: int | None = None,
                 **kwargs) -> LaneResults:
    """Replay one trace under many settings at once (one lane per setting, one compile).
    `num_clients` defaults to the largest client id + 1; other arguments as `run_traces`."""
    num_clients = trace.num_clients if num_clients is None else int(num_clients)
    return run_traces([trace] * len(settings), settings, num_clients=num_clients, **kwargs)


def replay(trace: Trace, settings: Settings | None = None, **kwargs) -> LaneResults:
    """Replay one trace under one setting (a batch of one lane); see `replay_lanes`.

    Example:
      >>> trace = Trace.from_rows([(0, 0, 100, 20), (0, 1, 50, 40), (3, 0, 100, 20)])
      >>> result = replay(trace, Settings(policy="vtc", kv_budget=256))
      >>> result.service[0], result.max_drift[0]
    """
    return replay_lanes(trace, [settings or Settings()], **kwargs)


@functools.partial(jax.jit, static_argnames=("horizon", "capacity", "pad"))
def generate_lanes(keys: jax.Array, traffic: TrafficParams, *, horizon: int, capacity: int,
                   pad: int) -> Workload:
    """`traffic.generate` vmapped over lane keys and lane traffic params."""
    lane = functools.partial(generate, horizon=horizon, capacity=capacity, pad=pad)
    return jax.vmap(lane)(keys, traffic)


def lane_keys(seeds: Sequence[int], base_seed: int = 0) -> jax.Array:
    """One key per lane from its seed alone: the same seed gives the same trace in any batch."""
    seeds = np.asarray(seeds, dtype=np.int64)
    if seeds.ndim != 1 or (seeds < 0).any() or (seeds > INT32_MAX).any():
        raise InputError("seeds must be integers in [0, 2^31)")
    base = jax.random.key(base_seed)
    return jax.vmap(lambda s: jax.random.fold_in(base, s))(jnp.asarray(seeds, jnp.uint32))


def stack_traffic(traffics: Sequence[Traffic]) -> TrafficParams:
    """Lane-batched traffic params; every lane must share K, the phase count and the pool size.
    Each distinct Traffic is encoded once and gathered on the host (no per-lane device ops)."""
    unique = {id(t): t for t in traffics}
    index = {key: i for i, key in enumerate(unique)}
    encoded = [jax.tree_util.tree_map(np.asarray, t.params()) for t in unique.values()]
    shapes = {repr(jax.tree_util.tree_map(np.shape, e)) for e in encoded}
    if len(shapes) != 1:
        raise InputError("lanes' traffic must share clients, phase count and pool size")
    lanes = np.asarray([index[id(t)] for t in traffics])
    return jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)[lanes]), *encoded)


MAX_LANE_STREAM_BYTES = 2 << 30  # one lane's request streams and generator words


def traffic_config(traffics: Sequence[Traffic], record_every: int = 0, arrival_width: int = 4,
                   measures: MeasureConfig | None = None) -> EngineConfig:
    """The static config that fits every lane of `traffics` (one compile for all chunks)."""
    horizon, k = traffics[0].horizon, traffics[0].num_clients
    capacity = max(stream_capacity(t) for t in traffics)
    if capacity * k * 4 * (5 + 3) > MAX_LANE_STREAM_BYTES:
        raise InputError(f"a lane would hold {capacity:,} requests per client x {k} clients "
                         f"(> {MAX_LANE_STREAM_BYTES >> 30} GiB of streams): shorten the horizon or lower the rates")
    return EngineConfig(
        num_clients=k, stream_len=capacity + arrival_width + 1,
        calendar_len=max(t.max_lengths()[1] for t in traffics), record_every=record_every,
        num_checkpoints=horizon // record_every if record_every else 0, arrival_width=arrival_width,
        measures=measures or MeasureConfig(pair_drift=k <= 16))


def simulate_traffic(traffics: Sequence[Traffic], settings: Sequence[Settings], seeds: Sequence[int], *,
                     base_seed: int = 0, record_every: int = 0, chunk: int | None = None,
                     arrival_width: int = 4, config: EngineConfig | None = None,
                     mesh: Mesh | None = None) -> LaneResults:
    """Generate lane i's traffic from `seeds[i]` and run it under `settings[i]`, all lanes in
    one compiled batch, for the traffic's horizon.

    Args:
      traffics: one `Traffic` per lane (equal horizon, clients and phase count).
      settings: one `Settings` per lane.
      seeds: one non-negative int per lane; the trace depends only on (base_seed, seed, traffic).
      record_every: checkpoint service every N steps (0: only the last step).
      config: a static config from `traffic_config` over a larger set of lanes, so that
        chunks of a sweep share one compile (default: sized for these lanes).
      mesh: devices to shard the lanes over (default: every local device).
    """
    if not (len(traffics) == len(settings) == len(seeds)):
        raise InputError(f"{len(traffics)} traffics, {len(settings)} settings, {len(seeds)} seeds: need one each per lane")
    if len(seeds) == 0:
        raise InputError("no lanes: give at least one seed")
    horizon, k = traffics[0].horizon, traffics[0].num_clients
    if any(t.horizon != horizon for t in traffics):
        raise InputError("every lane's traffic must have the same horizon")
    if horizon * k >= INT32_MAX:
        raise InputError(f"horizon x clients = {horizon * k} exceeds the int32 limit {INT32_MAX}")
    max_prompt = max(t.max_lengths()[0] for t in traffics)
    for s in settings:
        if max_prompt > s.kv_budget:
            raise InputError(f"prompts up to {max_prompt} tokens exceed the KV budget M={s.kv_budget}; "
                             "they could never be admitted")
    config = config or traffic_config(traffics, record_every, arrival_width)
    max_output = max(t.max_lengths()[1] for t in traffics)
    for s in set(settings):
        check_exact_limits(s, k, min_prompt=min(t.min_prompt() for t in traffics), max_prompt=max_prompt,
                           max_output=max_output, horizon=horizon, max_requests=config.stream_len * k)
        if min(s.client_caps(k)) < max_prompt + max_output:
            raise InputError(f"a request of up to {max_prompt + max_output} KV tokens (prompt + output) "
                             f"could never fit the KV cap {min(s.client_caps(k))}")
    if any(stream_capacity(t) + config.arrival_width + 1 > config.stream_len or
           t.max_lengths()[1] > config.calendar_len for t in traffics):
        raise InputError("the given engine config is too small for these lanes' traffic")
    pad = config.arrival_width + 1
    mesh = mesh or lane_mesh()
    n_lanes, target = len(settings), pad_to(len(settings), mesh)
    traffics, settings, seeds = ([x[i % n_lanes] for i in range(target)] for x in (traffics, settings, list(seeds)))
    keys, traffic = shard((lane_keys(seeds, base_seed), stack_traffic(traffics)), mesh)
    workload = generate_lanes(keys, traffic, horizon=horizon, capacity=config.stream_len - pad, pad=pad)
    budget = horizon + 2 * config.stream_len * k + 1
    state, scales, finished = run_lanes(workload, settings, [horizon] * target, config=config,
                                        event_budget=budget, shared_workload=False, chunk=chunk, mesh=mesh)
    return collect(state, scales, finished, config, settings, workload).head(n_lanes)
