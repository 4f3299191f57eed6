"""Running lanes of the MODEL.md engine, and the results users read.

`run_workloads` is the one path: it applies the rpm rejections, hands the lanes to the
runner (runner.py: chunked compiled calls until every lane is done or the event budget,
which always suffices for a valid input, is spent), and collects `LaneResults`, flagging
any lane that did not finish (a drained lane also when a request it holds never arrived).
`run_traces` / `replay_lanes` / `replay` feed it traces, `simulate_traffic` generated traffic
(a sweep chunk's settings as passes over its seeds' requests: `run_lanes`, lane_passes.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vtc_jax.core import clock, wide
from vtc_jax.core.errors import InputError
from vtc_jax.driver import lane_passes, policy_groups, tiers
from vtc_jax.driver.devices import lane_mesh
from vtc_jax.driver.lane_workloads import (distinct_workloads, generate_workloads, lane_keys, lanes_of,
                                           shared_workloads, with_timeline)
from vtc_jax.driver.results import LaneResults, collect, lane_workload_stats
from vtc_jax.engines import limits
from vtc_jax.engines.engine import EngineBatch, LaneInput
from vtc_jax.engines.engine_config import EngineConfig
from vtc_jax.engines.quiet import WINDOW as QUIET_WINDOW
from vtc_jax.engines.settings import (INT32_MAX, Scales, Settings, check_time_charges, encode_settings, lane_scales,
                                     limit_flags, policy_names)
from vtc_jax.inputs import sources
from vtc_jax.inputs.traffic import Traffic
from vtc_jax.inputs.workload import (MAX_ARRIVAL, ORDER, Trace, Workload, make_workload, requests_per_client,
                                     trace_work, wide_clock_for)
from vtc_jax.measures.online import ALL, MeasureConfig
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers
from vtc_jax.servers.step_time import MAX_STEP_US
from vtc_jax.policies.estimators import ESTIMATORS

MAX_HORIZON = INT32_MAX // 2


def check_exact_limits(settings: Settings, num_clients: int, *, min_prompt: int, max_prompt: int,
                       max_output: int, horizon: int, max_requests: int, arrival_width: int = 4,
                       context_totals: bool = True, work: tuple[int, int, int] | None = None) -> bool:
    """Refuse up front a lane whose exact integer arithmetic could overflow; return whether
    it needs the WIDE number format (False: every total, counter and tag of the lane is
    proved below 2^30, so plain int32 is exact; wide.py).

    Each single charge is added as an int32: the largest prefill charge and the largest
    per-client decode charge of one step, times the counter multiplier, must stay below
    wide.MAX_ADD (about 2^31), and totals below 2^55 (WIDE). Running requests are at most
    M / min_prompt (their prompts fit M together) and their context at most M + that many
    times (max_output - 1). Policies that charge or tag a request's whole estimated cost
    at once need it, times the weight scales, below MAX_ADD / arrival_width.
    `context_totals`: the run sums the context over steps (the ledger's decoded context, the
    occupancy measure); without them horizon x context is no total of the run.
    `work` (a trace's sums of prompts, outputs and output x (prompt + output)): the service
    a run can charge in all (each prompt token once, a recompute never, each decoded token
    and the context it attends once), a bound that does not grow with the horizon, which a
    wide clock's (microseconds over hours) would pass 2^55 with.
    """
    q, d, mult, scaled = lane_scales(settings, num_clients)
    a_p, a_q, b, a_t = scaled
    mult = max(mult)
    running = min(settings.kv_budget // max(min_prompt, 1), max_requests)
    context = settings.kv_budget + running * (max_output - 1)
    per_step = (a_p * settings.kv_budget + a_q * running + b * context) * mult
    service = horizon * per_step
    if work is not None:
        service = min(service, (a_p * work[0] + a_q * work[1] + b * work[2]) * mult)
    # GPU time (--cost time): a step's shares add up to at most its duration (<= MAX_STEP_US), the
    # run's to at most twice its clock (BLIS's idle rule lets a step start before the last one ends)
    service += 2 * horizon * a_t * mult
    limits_ = [
        ("the running context", context, 1),
        ("one prefill charge (w_p x prompt, in exact units, x weight scale)", a_p * max_prompt * mult, 1),
        ("one step's decode charge (w_q x running + beta x context, in exact units, x weight scale)",
         (a_q * running + b * context) * mult, 1),
        ("one step's time charge (w_time x its longest, in exact units, x weight scale)", a_t * MAX_STEP_US * mult, 1),
        ("the run's total service", service >> wide.LOW_BITS, 1),
    ]
    totals = [service, max_requests * horizon] + ([horizon * context] if context_totals else [])
    policy = registry.get(settings.policy)
    if policy.uses_estimator:
        e = max_output
        if settings.estimator == "fixed":
            e = max(e, settings.estimate_guess)
        elif settings.estimator == "noisy":
            e = int(max_output * (1 + settings.estimate_error)) + 1
        cost = a_p * max_prompt + a_q * e + b * (e * max_prompt + e * e)
        scale = 1
        for w in settings.client_weights(num_clients):
            scale = scale * w.denominator // np.gcd(scale, w.denominator)
        limits_.append(("one request's estimated cost (in exact units, x weight scales)", cost * max(mult, scale),
                        arrival_width))
        totals.append(max_requests * cost * max(mult, scale))
    for name, value, share in limits_:
        if value > wide.MAX_ADD // share:
            raise InputError(
                f"{name} could reach {value:.3g}, past the exact int32 limit {wide.MAX_ADD // share} "
                f"(M={settings.kv_budget}, max output {max_output}, costs scaled by their common "
                "denominator): use coarser fractions, closer weights, a smaller M or shorter outputs")
    return max(totals) >= wide.NARROW_LIMIT


def running_slots(settings: Sequence[Settings], min_prompt: int, max_requests: int) -> int:
    """Running-request slots: the most requests that can run at once, which is at most
    M // (smallest prompt) (running prompts fit M together) and at most the requests,
    rounded up to a power of two so that nearby sizes share one compiled program."""
    needed = max(1, min(max(s.kv_budget for s in settings) // max(min_prompt, 1), max_requests))
    return 1 << (int(needed) - 1).bit_length()


def calendar_rows(max_output: int) -> int:
    """Completion-calendar rows: more than the longest output (a power of two)."""
    return 1 << int(max_output).bit_length()


def engine_config(settings: Sequence[Settings], *, num_clients: int, num_rows: int, max_output: int, slots: int,
                  wide_numbers: bool, record_every: int,
                  num_checkpoints: int, arrival_width: int, drain: bool, measures: MeasureConfig,
                  policies: Sequence[str] | None = None, server: str = servers.DEFAULT_SERVER, log_steps: int = 0,
                  quiet_window: int = QUIET_WINDOW, wide_clock: bool = False) -> EngineConfig:
    """The static config that fits every lane of `settings` on server `server` (a
    servers.registry name; `log_steps`: steps of schedule it logs, for servers that do;
    `quiet_window`: engines/quiet.py, 0 to run every step in events of its own;
    `wide_clock`: core/clock.py)."""
    policies = tuple(policies) if policies is not None else policy_names(settings)
    chosen = servers.get(server)  # an unknown name is one InputError naming the choices
    options = [dict(s.server_options) for s in dict.fromkeys(settings)]
    for o in options:
        chosen.validate(o)
    if chosen.preempts and any(s.kv_cap is not None or s.rpm_limit is not None for s in settings):
        raise InputError(f"server {server} preempts requests: --kv-cap and --rpm limits are not defined on it yet")
    return EngineConfig(
        num_clients=num_clients, num_rows=num_rows, calendar_rows=calendar_rows(max_output),
        slots=chosen.plan_slots(options, slots, num_rows), policies=policies,
        **limit_flags(settings), estimator=any(registry.get(p).uses_estimator for p in policies),
        arrival_rows=any(registry.get(p).arrival_rows for p in policies), wide=wide_numbers,
        record_every=record_every, num_checkpoints=num_checkpoints, arrival_width=arrival_width, drain=drain,
        measures=measures if record_every else MeasureConfig.of(set(measures.names()) - {"demand"}), server=server,
        log_steps=log_steps, quiet_window=quiet_window, wide_clock=wide_clock,
        server_static=tuple(chosen.static_options(options)) if chosen.static_options is not None else ())


@functools.partial(jax.jit, static_argnames=("shared",))
def _reject(workload: Workload, limit, window, horizon, active, *, shared: bool):
    fn = jax.vmap(limits.reject_rpm, in_axes=(None if shared else 0, 0, 0, 0, 0))
    return fn(workload, limit, window, horizon, active)


def reject_at_arrival(workload: Workload, settings: Sequence[Settings], horizons, num_clients: int, shared: bool):
    """The lanes' workload without the requests an rpm limit in the reject mode rejects at
    arrival (engines/limits.py), the rejected count per lane and client (int64[B, K]), and
    whether the workload is still one shared by every lane."""
    rejecting = np.asarray([s.rpm_rejects for s in settings])
    if not rejecting.any():
        return workload, np.zeros((len(settings), num_clients), np.int64), shared
    limit = jnp.asarray([s.rpm_limit or 1 for s in settings], jnp.int32)
    window = jnp.asarray([s.rpm_window for s in settings], jnp.int32)
    out, rejected = _reject(workload, limit, window, jnp.asarray(horizons, jnp.int32), jnp.asarray(rejecting),
                            shared=shared)
    return dataclasses.replace(out, timeline=None), np.asarray(rejected, np.int64), False  # rows moved: no timeline


class LaneRun(NamedTuple):
    """A batch's run before `collect`, every field per lane (leading axis B): the engine's
    final carry (numpy leaves), done bool[B], the streams' counts (int64[B, K] arrived,
    float64[B, K] offered, int64[B] max prompt, float64[B, C, K] demand, int64[B] last
    arrival, int64[B, K] rejected; results.lane_workload_stats), and the lanes' units
    (object[B] cost and counter scales: settings.Scales)."""
    host: object
    done: np.ndarray
    arrived: np.ndarray
    offered: np.ndarray
    max_prompt: np.ndarray
    demand: np.ndarray
    last_arrival: np.ndarray
    rejected: np.ndarray
    cost_scale: np.ndarray
    counter_scale: np.ndarray


def run_workloads(workload: Workload, settings: Sequence[Settings], horizons: Sequence[int], *,
                  config: EngineConfig, shared: bool, event_budget: int, expected_events: int | None = None,
                  chunk: int | None = None, mesh: Mesh | None = None,
                  progress: Callable[[int, int, float], None] | None = None) -> LaneResults:
    """Run lane i (settings[i], horizons[i], the shared workload or lane i of a batched
    one) to its horizon; the common path of every runner."""
    lanes = run_lanes(workload, settings, horizons, config=config, shared=shared, event_budget=event_budget,
                      expected_events=expected_events, chunk=chunk, mesh=mesh, progress=progress)
    return collect_lanes(lanes, config, settings)


def run_lanes(workload: Workload, settings: Sequence[Settings], horizons: Sequence[int], *, config: EngineConfig,
              shared: bool, event_budget: int, expected_events: int | None = None, chunk: int | None = None,
              mesh: Mesh | None = None, progress: Callable[[int, int, float], None] | None = None,
              stats: dict | None = None) -> LaneRun:
    """`run_workloads` up to `collect`: its lanes' `LaneRun`. `stats`: a dict kept across
    calls on one and the same `workload` object (a chunk's passes), so that the streams'
    counts of equal inputs (steps and costs) are computed once."""
    params, scales = encode_settings(settings, config.num_clients, config.policies, config.server)
    horizons = np.asarray(horizons, np.int64)
    b = len(settings)
    given_shared = shared
    lane_workload, rejected, shared = reject_at_arrival(workload, settings, horizons, config.num_clients, shared)
    rejecting = any(s.rpm_rejects for s in settings)
    lane_workload = with_timeline(lane_workload, batched=not shared)
    batch = EngineBatch(lane=LaneInput(params=params, horizon=jnp.asarray(horizons, config.clock)),
                        workload=None if shared else lane_workload)
    host, done = policy_groups.run(tiers.run_in_tiers, config, settings, batch, lane_workload if shared else None,
                                   event_budget=event_budget, chunk=chunk, expected_events=expected_events,
                                   mesh=mesh or lane_mesh(), progress=progress)
    steps = np.asarray(host.step, np.int64)
    buckets = config.num_checkpoints if config.measures.demand else 0
    arrived_offered, offered, max_prompt, demand, last_arrival = _workload_stats(
        workload, steps, params, given_shared, config, buckets, {} if stats is None else stats)
    arrived_streams = arrived_offered  # without RPM rejection every offered request is in the stream
    if rejecting:
        arrived_streams = lane_workload_stats(lane_workload, steps, params, shared, config.num_clients)[0]
    done = done & ~np.asarray(jax.device_get(lane_workload.overflow) if not shared else False)
    if config.drain:  # every request of a drained lane's served stream (RPM rejections removed) arrives
        done = done & (arrived_streams.sum(axis=1) == existing_requests(lane_workload, shared, b))
    return LaneRun(host, done, arrived_streams, offered, max_prompt, demand, last_arrival, rejected,
                   scales.cost_scale, scales.counter_scale)


def _workload_stats(workload: Workload, steps: np.ndarray, params, shared: bool, config: EngineConfig,
                    buckets: int, memo: dict) -> tuple:
    """`lane_workload_stats`, computed once per distinct input in `memo` (which keeps the
    workload alive while it lives, so that its id names it)."""
    costs = params.costs
    key = (id(workload), shared, buckets, steps.tobytes(),
           *(np.asarray(x).tobytes() for x in (costs.prefill, costs.decode, costs.context, costs.charge_cached)))
    if key not in memo:
        memo[key] = workload, lane_workload_stats(workload, steps, params, shared, config.num_clients, buckets,
                                                  config.record_every)
    return memo[key][1]


def collect_lanes(lanes: LaneRun, config: EngineConfig, settings: Sequence[Settings]) -> LaneResults:
    """The `LaneResults` of a `LaneRun` of lanes `settings`."""
    scales = Scales(cost_scale=lanes.cost_scale, counter_scale=lanes.counter_scale)
    return collect(lanes.host, lanes.done, config, settings, scales, lanes.arrived, lanes.offered, lanes.max_prompt,
                   lanes.rejected, lanes.demand, lanes.last_arrival)


@jax.jit
def _existing(requests: jax.Array) -> jax.Array:
    return (requests[..., ORDER] != INT32_MAX).sum(axis=-1, dtype=jnp.int32)  # padding's ORDER, either clock


def existing_requests(workload: Workload, shared: bool, lanes: int) -> np.ndarray:
    """int64[lanes]: the real (non-padding) request rows of each lane's blocks, whether
    or not they arrive before the horizon."""
    count = np.asarray(_existing(workload.requests), np.int64)
    return np.broadcast_to(count, (lanes,)) if shared else count


def workload_pad(arrival_width: int = 4) -> int:
    """Padding rows after each client's block in a trace's workload (`run_traces`): the
    arrival look-ahead never leaves the block."""
    return arrival_width + 1


def server_drain(trace: Trace, settings: Settings, server: str) -> int:
    """A horizon that drains `trace` under `settings` on `server`: its `drain_steps` (in its
    time unit; ideal: last arrival + sum of outputs + 1; a bound a server may cut at the
    clock's limit, flagging a lane that needs more) plus one rpm window per request under an
    rpm delay (a request waits while nothing runs only for a window to end)."""
    window = settings.rpm_window if settings.rpm_delays else 0
    options = dict(settings.server_options)
    limit = clock.WIDE_LIMIT if wide_clock_for(trace) else servers.get(server).max_horizon
    return (servers.get(server).drain_steps(options, trace.arrival, trace.prompt, trace.output, limit)
            + len(trace) * window)


def validate_fits(trace: Trace, settings: Settings, num_clients: int, horizon: int | None,
                  allow_unadmittable: bool) -> None:
    """Refuse a prompt larger than M (it could never be admitted) unless explicitly allowed,
    and a request larger than its client's KV cap."""
    arrives = trace.arrival < horizon if horizon is not None else np.ones(len(trace), bool)
    caps = np.asarray(settings.client_caps(num_clients), dtype=np.int64)
    over_cap = arrives & (trace.prompt + trace.output > caps[trace.client])
    if over_cap.any() and settings.kv_cap is not None:
        trace.fail(int(np.argmax(over_cap)), f"prompt + output exceeds client's KV cap "
                                             f"{caps[trace.client[int(np.argmax(over_cap))]]}; it could never be admitted")
    too_big = arrives & (trace.prompt > settings.kv_budget)
    if too_big.any() and not allow_unadmittable:
        row = int(np.argmax(too_big))
        trace.fail(row, f"prompt {trace.prompt[row]} is larger than the KV budget M={settings.kv_budget}; "
                        "it could never be admitted")
    if too_big.any() and horizon is None:
        raise InputError("a prompt larger than M never completes: give a fixed number of steps")


def plan_lanes(traces: Sequence[Trace], settings: Sequence[Settings], num_clients: int, steps: int | None,
               record_every: int, allow_unadmittable: bool = False, arrival_width: int = 4,
               measures: MeasureConfig = ALL, policies: Sequence[str] | None = None, wide: bool | None = None,
               server: str = servers.DEFAULT_SERVER, log_steps: int = 0, quiet_window: int = QUIET_WINDOW):
    """Validate lanes (trace i under settings i) and size their common static config.

    Returns (config, horizons, event budget, expected events). Fixed horizon T: T + 3 *
    requests events always suffice; drain mode: `server_drain` steps suffice."""
    if num_clients < 1:
        raise InputError(f"clients must be >= 1, got {num_clients}")
    if len(settings) == 0:
        raise InputError("no settings given (need at least one lane)")
    if steps is not None and not 1 <= steps <= MAX_HORIZON:
        raise InputError(f"steps must be in [1, {MAX_HORIZON}], got {steps}")
    if record_every < 0 or arrival_width < 1:
        raise InputError("record_every must be >= 0 and arrival_width >= 1")
    horizons, expected, needs_wide = [], [], False
    wide_clock = any(wide_clock_for(t) for t in traces)
    for trace, s in zip(traces, settings, strict=True):
        if len(trace) == 0:
            raise InputError("the trace has no requests")
        trace.validate(num_clients)
        validate_fits(trace, s, num_clients, steps, allow_unadmittable)
        chosen = servers.get(server)
        never = chosen.never_served(dict(s.server_options), trace.prompt, trace.output, s.kv_budget)
        if never is not None:
            raise InputError(f"server {server}: {never}")
        check_time_charges(s, server)
        rpm_window = s.rpm_window if s.rpm_delays else 0
        horizons.append(int(steps) if steps is not None else server_drain(trace, s, server))
        expected.append(min(horizons[-1], int(trace.output.sum()) + len(trace) * (1 + rpm_window)) + 2 * len(trace))
        needs_wide |= check_exact_limits(s, num_clients, min_prompt=int(trace.prompt.min()),
                                         max_prompt=int(trace.prompt.max()), max_output=int(trace.output.max()),
                                         horizon=horizons[-1], max_requests=len(trace), arrival_width=arrival_width,
                                         context_totals=measures.ledger or measures.occupancy,
                                         work=trace_work(trace) if wide_clock else None)
    longest = max(horizons)
    limit = horizon_limit(server, drains=steps is None, wide_clock=wide_clock)
    if longest > limit:
        raise InputError(f"the run would need {longest} steps, past the limit {limit}")
    if record_every and longest // record_every * num_clients > 1 << 26:
        raise InputError(f"record_every {record_every} over {longest} steps keeps more than {1 << 26} checkpoint "
                         f"values for {num_clients} clients; record less often")
    most = max(len(t) for t in traces)
    min_prompt = min(int(t.prompt.min()) for t in traces)
    rows = max(int((requests_per_client(t, num_clients) + arrival_width + 1).sum()) for t in traces)
    config = engine_config(settings, num_clients=num_clients, num_rows=rows,
                           max_output=max(int(t.output.max()) for t in traces),
                           slots=running_slots(settings, min_prompt, most),
                           wide_numbers=needs_wide if wide is None else (wide or needs_wide),
                           record_every=record_every,
                           num_checkpoints=longest // record_every if record_every else 0,
                           arrival_width=arrival_width, drain=steps is None, measures=measures, policies=policies,
                           server=server, log_steps=log_steps, quiet_window=quiet_window, wide_clock=wide_clock)
    return config, horizons, servers.get(server).events_per_step * longest + 3 * most + 1, max(expected)


def run_traces(traces: Sequence[Trace], settings: Sequence[Settings], *, num_clients: int,
               steps: int | None = None, record_every: int = 0, chunk: int | None = None,
               allow_unadmittable: bool = False, arrival_width: int = 4, mesh: Mesh | None = None,
               measures: MeasureConfig = ALL, policies: Sequence[str] | None = None,
               progress: Callable | None = None, wide: bool | None = None, server: str = servers.DEFAULT_SERVER,
               log_steps: int = 0, quiet_window: int = QUIET_WINDOW) -> LaneResults:
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
      measures: the optional measures to keep (default: all; see measures.MeasureConfig).
      policies: the engine's static policy set (default: the lanes' policies); give a
        larger set to share one compiled program between batches.
      wide: True forces the WIDE number format (default: NARROW when the planner proves
        every value fits int32, else WIDE; results are identical).
      server: the server every lane runs (servers.registry; default `ideal`, MODEL.md's).
      log_steps: steps of schedule the server logs (servers that log, e.g. vllm; 0: none).
      quiet_window: quiet steps an event may run in bulk (engines/quiet.py; 0: none; any
        value gives the same results).
    """
    if len(traces) != len(settings):
        raise InputError(f"{len(traces)} traces for {len(settings)} settings")
    settings = servers.batch_settings(server, settings)
    config, horizons, budget, expected = plan_lanes(traces, settings, num_clients, steps, record_every,
                                                    allow_unadmittable, arrival_width, measures, policies, wide,
                                                    server, log_steps, quiet_window)
    with clock.context(config.x64):
        return _run_planned(traces, settings, config, horizons, budget, expected, num_clients=num_clients,
                            steps=steps, arrival_width=arrival_width, chunk=chunk, mesh=mesh, progress=progress)


def _run_planned(traces, settings, config: EngineConfig, horizons, budget: int, expected: int, *, num_clients: int,
                 steps: int | None, arrival_width: int, chunk, mesh, progress) -> LaneResults:
    """`run_traces` after its plan (under the clock's context)."""
    pad = workload_pad(arrival_width)
    shared = all(t is traces[0] for t in traces)
    if shared:
        workload = make_workload(traces[0], num_clients, pad, steps, wide_clock=config.wide_clock)
    else:
        rows = config.num_rows
        per_lane = []
        for t in traces:
            counts = requests_per_client(t, num_clients)
            sizes = counts + pad
            sizes[-1] += rows - int(sizes.sum())  # every lane: the same row count
            per_lane.append(jax.tree_util.tree_map(np.asarray, make_workload(t, num_clients, pad, steps, sizes,
                                                                             config.wide_clock)))
        workload = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)), *per_lane)
    return run_workloads(workload, settings, horizons, config=config, shared=shared, event_budget=budget,
                         expected_events=expected, chunk=chunk, mesh=mesh, progress=progress)


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


def horizon_limit(server: str, *, drains: bool, wide_clock: bool = False) -> int:
    """The longest horizon a run may have: a drain bound in the server's time unit, else
    steps; with a wide clock, clock.WIDE_LIMIT (a server that keeps wide stamps only)."""
    chosen = servers.get(server)
    if wide_clock:
        if not chosen.wide_clock:
            raise InputError(f"server {server} runs arrivals up to {MAX_ARRIVAL:,} of its time unit (an int32 "
                             "clock): take a window of the input")
        return clock.WIDE_LIMIT
    return chosen.max_horizon if drains else min(MAX_HORIZON, chosen.max_horizon)


MAX_LANE_STREAM_BYTES = 2 << 30  # one lane's request blocks and generator words
# Generators keying requests by the int32 arrival * K + client (traffic.py, servegen_device.py):
# horizon x K must fit int32. A trace's ORDER is a rank (sources._trace_lane): no such key.
KEYED_KINDS = ("traffic", "servegen")


def source_config(srcs: Sequence[sources.Source], settings: Sequence[Settings], record_every: int = 0,
                  arrival_width: int = 4, measures: MeasureConfig = ALL,
                  policies: Sequence[str] | None = None, server: str = servers.DEFAULT_SERVER) -> EngineConfig:
    """The static config that fits every lane of `srcs` x `settings` (one compile)."""
    srcs = sources.unique(srcs)
    lay = sources.layout(srcs, arrival_width + 1)
    horizon, k = srcs[0].horizon, srcs[0].num_clients
    if lay.num_rows * 4 * (5 + 3) > MAX_LANE_STREAM_BYTES:
        raise InputError(f"a lane would hold {lay.num_rows:,} request rows (> {MAX_LANE_STREAM_BYTES >> 30} GiB "
                         "with the generator's words): shorten the horizon or lower the rates")
    wide_clock = sources.wide_clock(srcs)
    limit = horizon_limit(server, drains=sources.drains(srcs[0]), wide_clock=wide_clock)
    if horizon > limit:
        raise InputError(f"horizon {horizon} exceeds the limit {limit}")
    if srcs[0].kind in KEYED_KINDS and horizon * k >= INT32_MAX:  # the generator's arrival x K + client key
        raise InputError(f"horizon {horizon} x clients {k} exceeds the int32 limit {INT32_MAX}")
    min_prompt = min(s.lengths()[0] for s in srcs)
    max_prompt = max(s.lengths()[1] for s in srcs)
    max_output = max(s.lengths()[2] for s in srcs)
    work = None  # a wide clock's are traces': their work bounds the service (check_exact_limits)
    if wide_clock:
        work = tuple(max(w) for w in zip(*(trace_work(s.trace) for s in srcs)))
    needs_wide = any(check_exact_limits(s, k, min_prompt=min_prompt, max_prompt=max_prompt, max_output=max_output,
                                        horizon=horizon, max_requests=lay.num_rows, arrival_width=arrival_width,
                                        context_totals=measures.ledger or measures.occupancy, work=work)
                     for s in set(settings))
    return engine_config(settings, num_clients=k, num_rows=lay.num_rows, max_output=max_output,
                         slots=running_slots(settings, min_prompt, lay.num_rows), wide_numbers=needs_wide,
                         record_every=record_every, num_checkpoints=horizon // record_every if record_every else 0,
                         arrival_width=arrival_width, drain=sources.drains(srcs[0]), measures=measures,
                         policies=policies, server=server, wide_clock=wide_clock)


def traffic_config(traffics: Sequence[Traffic], settings: Sequence[Settings], record_every: int = 0,
                   arrival_width: int = 4, measures: MeasureConfig = ALL,
                   policies: Sequence[str] | None = None, server: str = servers.DEFAULT_SERVER) -> EngineConfig:
    """`source_config` of synthetic traffic."""
    return source_config(_traffic_sources(traffics), settings, record_every, arrival_width, measures, policies,
                         server)


def _traffic_sources(traffics: Sequence[Traffic]) -> list:
    made = {}
    return [made.setdefault(id(t), sources.TrafficSource(t)) for t in traffics]


def validate_lanes(srcs: Sequence[sources.Source], settings: Sequence[Settings], config: EngineConfig) -> None:
    """Refuse lanes that could not run exactly within `config` (checked before any work)."""
    sources.check_batch(srcs)
    k = srcs[0].num_clients
    max_prompt = max(s.lengths()[1] for s in sources.unique(srcs))
    max_output = max(s.lengths()[2] for s in sources.unique(srcs))
    for s in set(settings):
        if max_prompt > s.kv_budget:
            raise InputError(f"prompts up to {max_prompt} tokens exceed the KV budget M={s.kv_budget}; "
                             "they could never be admitted")
        if min(s.client_caps(k)) < max_prompt + max_output:
            raise InputError(f"a request of up to {max_prompt + max_output} KV tokens (prompt + output) "
                             f"could never fit the KV cap {min(s.client_caps(k))}")
        if s.policy not in config.policies:
            raise InputError(f"policy {s.policy} is not in the engine config's policies {config.policies}")
        never = servers.get(config.server).never_served(dict(s.server_options), np.asarray([max_prompt]),
                                                         np.asarray([max_output]), s.kv_budget)
        if never is not None:
            raise InputError(f"server {config.server}: {never}")
    needed = source_config(srcs, settings, config.record_every, config.arrival_width, config.measures,
                           config.policies, config.server)
    if (needed.num_rows > config.num_rows or needed.slots > config.slots
            or needed.calendar_rows > config.calendar_rows or (needed.wide and not config.wide)
            or needed.wide_clock != config.wide_clock
            or needed.num_clients != config.num_clients or not _covers(config.server_static, needed.server_static)):
        raise InputError("the given engine config is too small for these lanes' workloads")


def _covers(given: tuple, needed: tuple) -> bool:
    """A config's static server flags allow what these lanes need (a flag these lanes set
    is set there too, or left to the server's default)."""
    flags = dict(given)
    return all(not value or flags.get(name, True) for name, value in needed)


def simulate_sources(srcs: Sequence[sources.Source], settings: Sequence[Settings], seeds: Sequence[int], *,
                     base_seed: int = 0, record_every: int = 0, chunk: int | None = None, arrival_width: int = 4,
                     config: EngineConfig | None = None, mesh: Mesh | None = None, measures: MeasureConfig = ALL,
                     policies: Sequence[str] | None = None, progress: Callable | None = None,
                     server: str = servers.DEFAULT_SERVER) -> LaneResults:
    """Generate lane i's requests from `seeds[i]` and `srcs[i]` and run them under
    `settings[i]`, all lanes in one compiled batch, for the sources' horizon (each distinct
    source and seed generated once; on CPU, lanes that share them run one pass per setting
    when that pays, lane_passes.py: the same results).

    Args:
      srcs: one Source per lane (sources.py; one kind, equal horizon and clients).
      settings: one `Settings` per lane.
      seeds: one non-negative int per lane; the requests depend only on (base_seed, seed, source).
      record_every: checkpoint service every N steps (0: only the last step).
      config: a static config from `source_config` over a larger set of lanes, so that
        chunks of a sweep share one compile (default: sized for these lanes).
      mesh: devices to shard the lanes over (default: every local device).
      measures, policies, server: as `run_traces` (ignored when `config` is given).
    """
    if not (len(srcs) == len(settings) == len(seeds)):
        raise InputError(f"{len(srcs)} workloads, {len(settings)} settings, {len(seeds)} seeds: need one each per lane")
    if len(seeds) == 0:
        raise InputError("no lanes: give at least one seed")
    config = config or source_config(srcs, settings, record_every, arrival_width, measures, policies, server)
    validate_lanes(srcs, settings, config)
    with clock.context(config.x64):
        return _simulate(srcs, settings, seeds, config, base_seed=base_seed, chunk=chunk, mesh=mesh,
                         progress=progress)


def _simulate(srcs, settings, seeds, config: EngineConfig, *, base_seed: int, chunk, mesh, progress) -> LaneResults:
    """`simulate_sources` after its plan (under the clock's context)."""
    horizon = srcs[0].horizon
    mesh = mesh or lane_mesh()
    made, index = distinct_workloads(srcs, seeds, config, base_seed, mesh)
    # From the sources' expectation, not the draw: the chunk size (a static argument of
    # the compiled call) must not change from one batch of seeds to the next.
    run_args = dict(config=config, shared=False, chunk=chunk, mesh=mesh,
                    event_budget=servers.get(config.server).events_per_step * horizon + 3 * config.num_rows + 1,
                    expected_events=horizon + int(2 * max(s.expected_requests() for s in sources.unique(srcs))))
    passes = lane_passes.plan([(id(src), s) for src, s in zip(srcs, settings)], made.requests.shape[0], mesh)
    if passes is None:
        return run_workloads(lanes_of(made, index, mesh), settings, [horizon] * len(settings), progress=progress,
                             **run_args)
    split = policy_groups.SplitProgress(progress, [len(p) for p in passes]) if progress is not None else None
    stats, parts = {}, []
    for i, p in enumerate(passes):
        workload = lanes_of(made, index[p], mesh)
        parts.append(run_lanes(workload, [settings[j] for j in p], [horizon] * len(p), progress=split and split.part(i),
                               stats=stats if workload is made else None, **run_args))
    return collect_lanes(lane_passes.join(parts, passes, len(settings)), config, settings)


def simulate_traffic(traffics: Sequence[Traffic], settings: Sequence[Settings], seeds: Sequence[int],
                     **kwargs) -> LaneResults:
    """`simulate_sources` of synthetic traffic (traffic.Traffic per lane)."""
    return simulate_sources(_traffic_sources(traffics), settings, seeds, **kwargs)


__all__ = ["run_traces", "shared_workloads", "replay", "replay_lanes", "simulate_traffic", "simulate_sources", "traffic_config",
           "source_config", "run_workloads", "check_exact_limits", "server_drain", "plan_lanes", "lane_keys",
           "generate_workloads", "ESTIMATORS"]
