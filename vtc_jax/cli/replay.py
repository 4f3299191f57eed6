"""`python -m vtc_jax replay`: one policy on one trace, exact numbers (a summary on stdout,
optionally the run's numbers and a per-client report as JSON)."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np

from vtc_jax.cli import cluster_flags, input_flags, timed_compare
from vtc_jax.cli.common import CheckFailed, in_file
from vtc_jax.cli.scheduler_flags import MAX_CLIENTS, settings_from_args
from vtc_jax.cli.server_flags import server_options
from vtc_jax.cli.server_replay import replay_on_server
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver.results import load_values, overloaded
from vtc_jax.driver.schedules import no_schedule
from vtc_jax.inputs.workload import Trace
from vtc_jax.measures.online import PAIR_DRIFT_MAX_CLIENTS, MeasureConfig
from vtc_jax.servers import registry as servers

# Service checkpoints kept on device: horizon // record_every * K values at most.
MAX_CHECKPOINT_VALUES = 1 << 26


def _number(value: Fraction):
    """Exact integers stay integers in JSON; other values are floats."""
    return int(value) if value.denominator == 1 else float(value)


def _plain(value: float):
    """A float that holds an integer as an int (JSON and the summary print it plainly)."""
    return int(value) if float(value).is_integer() else float(value)


def load_for_replay(args) -> tuple[Trace, int]:
    """The engine's trace of the input (the reader layer; a timed input in steps of
    --step-seconds) and its number of clients (--clients, else the largest id + 1)."""
    log = input_flags.read_input(args, "trace")
    if getattr(args, "kv_budget", None) is not None:  # a prompt past M: rejected and counted, the rest replayed
        log = input_flags.drop_unservable(args, log, args.kv_budget)
    trace = input_flags.engine_trace(args, log)
    num_clients = args.clients if args.clients is not None else trace.num_clients
    if num_clients > MAX_CLIENTS:
        row = int(trace.client.argmax())
        raise InputError(f"{args.trace}: {trace.where(row)}: client id {num_clients - 1} needs {num_clients} "
                         f"clients (ids are 0..K-1); at most {MAX_CLIENTS} are supported")
    return trace, num_clients


def replay_command(args) -> tuple[dict, dict, object]:
    """(the run's numbers, the per-client report, the LaneResults) of `replay`."""
    if timed_compare.model_given(args) and not servers.takes_step_time(args.server):
        raise InputError(f"--preset / --step-time / --roofline: --server {args.server} takes no step-time model "
                         f"(servers that do: {', '.join(n for n in servers.names() if servers.takes_step_time(n))})")
    if cluster_flags.given(args):
        return _cluster_replay(args)
    if servers.get(args.server).preempts:  # vllm: its memory is its own, not --kv-budget
        return _server_replay(args)
    from vtc_jax.driver.run import replay, server_drain

    if args.kv_budget is None:  # the server's own memory where it has one (slora's pool), as compare
        args.kv_budget = servers.default_memory(args.server)
        if args.kv_budget is None:
            raise InputError(f"--kv-budget M is required (the {args.server} server's memory)")
    server_options(args)  # refuses another server's flags
    if args.schedule_out:
        raise no_schedule(args.server)
    trace, num_clients = load_for_replay(args)
    window = args.share_window or (0, 0)
    settings = settings_from_args(args, args.policy, window)
    horizon = args.steps or server_drain(trace, settings, args.server)
    if horizon // args.record_every * num_clients > MAX_CHECKPOINT_VALUES:
        raise InputError(f"--record-every {args.record_every} over up to {horizon} steps keeps more than "
                         f"{MAX_CHECKPOINT_VALUES} checkpoint values for {num_clients} clients; "
                         "use a larger --record-every")
    pairs = ["pair_drift"] if num_clients <= PAIR_DRIFT_MAX_CLIENTS else []
    measures = pairs + ["latency"] + (["share"] if args.share_window else []) + (["ledger"] if args.check else [])
    input_flags.announce(args)
    try:
        result = replay(trace, settings, num_clients=num_clients, steps=args.steps, record_every=args.record_every,
                        measures=MeasureConfig.of(measures), server=args.server)
    except InputError as err:
        raise in_file(args.trace, err) from None
    out, details = report(result, args, num_clients)
    return out, details, result


def _server_replay(args):
    result, _, num_clients, schedule, labels, requests = replay_on_server(
        args, lambda a: settings_from_args(a, a.policy, (0, 0)))
    out, details = report(result, args, num_clients)
    details["queues"] = labels
    return out, details, (result, schedule, requests)


def report(result, args, num_clients: int) -> tuple[dict, dict]:
    """The run's numbers and the per-client report of lane 0 (JSON-ready)."""
    if not result.finished[0]:
        raise InputError("the run did not reach its horizon within the event budget (flagged, not reported)")
    if args.check and result.conservation[0]:
        raise CheckFailed("conservation violated: " + "; ".join(result.conservation[0]))
    steps = int(result.steps[0])
    service = result.service_exact[0]
    out = {
        "steps": steps,
        "clients": num_clients,
        "service": [_number(x) for x in service],
        "counters": [_number(x) for x in result.counters_exact[0]],
        "admitted": [int(x) for x in result.admitted[0]],
        "completed": [int(x) for x in result.completed[0]],
        "max_drift": _number(result.max_drift_exact[0]),
        "max_drift_step": int(result.max_drift_step[0]),
        "bound_2u": _plain(result.bound_2u[0]),
        "max_drift_over_2u": float(result.max_drift_over_2u[0]),
        "throughput": float(sum(service) / steps),
        "checkpoints": {"steps": [int(s) for s in result.checkpoint_steps],
                        "service": [[_number(Fraction(v)) for v in row] for row in result.checkpoints[0]]},
    }
    details = client_report(result, 0)
    drift = result.backlogged_drift_exact[0]
    details["backlogged_drift"] = None if drift is None else _number(drift)
    details["bound_2u"] = out["bound_2u"]
    details["backlogged_drift_over_2u"] = None if drift is None else float(drift) / float(result.bound_2u[0])
    if args.share_window:
        details["share_window"] = list(args.share_window)
        details["window_share"] = [None if not np.isfinite(x) else float(x) for x in result.share[0]]
    if not np.all(np.isnan(result.policy_counters[0])):
        details["policy_counters"] = [float(x) for x in result.policy_counters[0]]
    return out, details


def client_report(result, lane: int) -> dict:
    """Per-client shares, waits and the load line of one lane (JSON-ready)."""
    def floats(x):
        return [None if not np.isfinite(v) else float(v) for v in np.asarray(x, np.float64)]

    load = {k: float(v[lane]) for k, v in load_values(result).items()}
    rejected, wait_mean = getattr(result, "rejected", None), getattr(result, "wait_mean", None)
    out = {
        "share_of_service": floats(result.served_share[lane]),
        "share_of_demand": floats(result.offered_share[lane]),
        "arrived": [int(x) for x in result.arrived[lane]],
        "rejected": None if rejected is None else [int(x) for x in rejected[lane]],
        "waiting_at_end": [int(x) for x in result.waiting[lane]],
        "wait_p50": floats(result.latency_percentile("wait", 0.5)[lane]),
        "wait_p90": floats(result.latency_percentile("wait", 0.9)[lane]),
        "wait_p99": floats(result.latency_percentile("wait", 0.99)[lane]),
        "wait_mean": None if wait_mean is None else floats(wait_mean[lane]),
        "load": {"offered_per_step": load["offered_per_step"], "served_per_step": load["served_per_step"],
                 "offered_over_served": load["offered_over_served"] if math.isfinite(load["offered_over_served"])
                 else None, "waiting_at_span_end": int(load["waiting_at_span_end"]),
                 "waiting_at_end": int(load["waiting_at_end"])},
    }
    return {k: v for k, v in out.items() if v is not None}  # a cluster keeps no rejections or wait sums


def _cluster_replay(args):
    """`replay` at the replicas of a cluster (cluster_flags): lane seed 0 of `compare`'s
    cluster rows; its JSON keys are `cluster_report`'s."""
    from vtc_jax.cli.compare import check_unused
    from vtc_jax.driver.cluster_sweep import lane_settings, simulate_tenants
    from vtc_jax.driver.run import server_drain, validate_fits
    from vtc_jax.inputs.sources import TraceSource

    if args.kv_budget is None:
        raise InputError("--kv-budget M is required (each replica's memory)")
    server_options(args)  # refuses another server's flags
    for flag, why in (("schedule_out", "keeps no schedule"), ("check", "keeps no token ledger"),
                      ("share_window", "measures no share window")):
        if getattr(args, flag):
            raise InputError(f"--{flag.replace('_', '-')}: the cluster {why}")
    cluster_flags.check_flags(args)
    gateway = cluster_flags.gateway_policy(args)
    trace, num_clients = load_for_replay(args)
    check_unused(args, [args.policy], gateway)
    settings = settings_from_args(args, args.policy, lenient=True)
    horizon = args.steps or server_drain(trace, settings, args.server)
    try:
        validate_fits(trace, settings, num_clients, horizon, False)
        source = TraceSource(trace, num_clients=num_clients, horizon=horizon, drain=args.steps is None)
        cs = cluster_flags.cluster_settings(args, settings, settings_from_args(args, gateway, lenient=True),
                                            [str(k) for k in range(num_clients)])
        input_flags.announce(args)
        result = simulate_tenants([source], [lane_settings(cs, 0, 0)], [0], server=args.server)
    except InputError as err:
        raise in_file(args.trace, err) from None
    out, details = cluster_report(result, num_clients)
    out["cluster"] = details["cluster"] = cluster_flags.describe(args, gateway)
    return out, details, result


def cluster_report(result, num_clients: int) -> tuple[dict, dict]:
    """The run's numbers and the per-client report of a cluster's lane 0 (JSON-ready):
    exact service per tenant (and per replica), the replicas' counters, dispatches per
    (router, replica, tenant), the drift while every tenant waits (docs/CLUSTER.md)."""
    if not result.finished[0]:
        raise InputError("the run did not finish within the event budget (flagged, not reported)")
    c = result.cluster
    q, d = int(c.cost_scale[0]), int(c.counter_scale[0])
    per_replica = [[Fraction(int(x), q) for x in row] for row in c.service_units[0]]
    drift = _number(Fraction(int(c.drift_units[0]), q * d))
    out = {
        "steps": int(result.steps[0]),
        "clients": num_clients,
        "service": [_number(sum(col)) for col in zip(*per_replica)],
        "service_per_replica": [[_number(x) for x in row] for row in per_replica],
        "counters_per_replica": [[_number(Fraction(int(x), q * d)) for x in row] for row in c.counter_units[0]],
        "admitted": [int(x) for x in result.admitted[0]],
        "completed": [int(x) for x in result.completed[0]],
        "dispatched": np.asarray(c.dispatched[0]).tolist(),
        "all_backlogged_drift": drift,
        "all_backlogged_steps": int(c.backlogged_steps[0]),
    }
    details = client_report(result, 0)
    details["all_backlogged_drift"] = drift
    return out, details


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) >= 100):
        return f"{int(x)}"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.1f}"


def load_line(load: dict) -> str:
    """The load line of `client_report`'s "load": offered and served over the arrival span,
    and the overload warning where `results.overloaded` says so."""
    ratio = load["offered_over_served"]
    offered = load["offered_per_step"]  # NaN under GPU-time charges: demand is priced in tokens
    offered = "n/a (demand is priced in tokens)" if offered != offered else f"{offered:.4g}"
    line = (f"load: offered {offered} vs served {load['served_per_step']:.4g} weighted "
            f"tokens/step over the arrival span ({load['waiting_at_span_end']} requests queued when the last "
            f"arrived); {load['waiting_at_end']} requests still waiting")
    if overloaded(ratio, load["waiting_at_span_end"]):
        line += (f"\nOVERLOAD: {ratio:.2f}x the served work was offered: queues grow as long as requests arrive, "
                 "so drift and shares describe a backlog, not a steady state")
    return line


def _labels(args, count: int) -> list[str]:
    """Each client as the summary names it: its tenant name for a timed input (its id is its
    rank of first appearance), else its id."""
    log = getattr(args, "input_log", None)
    if log is not None and log.timed and len(log.tenants) == count:
        return list(log.tenants)  # whole: two names alike in their first characters stay two
    return [str(k) for k in range(count)]


def _summary(out: dict, details: dict, policy: str, labels: list[str]) -> str:
    w = max([6] + [len(x) for x in labels])  # the client column holds the longest name
    lines = [f"{policy}: {out['steps']} steps, {out['clients']} clients, "
             f"throughput {out['throughput']:.2f} weighted tokens/step, "
             f"max drift {out['max_drift']} at step {out['max_drift_step']}, "
             "drift while jointly backlogged " + (
                 f"{details['backlogged_drift']} = {details['backlogged_drift_over_2u']:.3g} x VTC's bound "
                 f"2U = {details['bound_2u']}" if details["backlogged_drift"] is not None
                 else f"not measured (over {PAIR_DRIFT_MAX_CLIENTS} clients: it costs K^2 per event; VTC's bound "
                      f"2U = {details['bound_2u']})"),
             f"{'client':>{w}} {'service':>14} {'counter':>14} {'admitted':>9} {'completed':>9} {'share':>7} "
             f"{'demand':>7} {'wait p50':>9} {'wait p99':>9}"]
    for k in range(out["clients"]):
        lines.append(f"{labels[k]:>{w}} {out['service'][k]:>14} {out['counters'][k]:>14} "
                     f"{out['admitted'][k]:>9} {out['completed'][k]:>9} {_fmt(details['share_of_service'][k]):>7} "
                     f"{_fmt(details['share_of_demand'][k]):>7} {_fmt(details['wait_p50'][k]):>9} "
                     f"{_fmt(details['wait_p99'][k]):>9}")
    lines.append(load_line(details["load"]))
    if "window_share" in details:
        start, end = details["share_window"]
        lines.append(f"share of service in steps [{start}, {end}): "
                     + ", ".join(_fmt(x) for x in details["window_share"]))
    return "\n".join(lines)


def _cluster_summary(out: dict, details: dict, policy: str, labels: list[str]) -> str:
    w = max([6] + [len(x) for x in labels])  # the client column holds the longest name
    c = out["cluster"]
    lines = [f"{policy} at {c['replicas']} replica(s) behind {c['routers']} router(s) running {c['gateway_policy']} "
             f"({c['counters']} counters): {out['steps']} steps, {out['clients']} clients, drift while every tenant "
             f"was backlogged {out['all_backlogged_drift']} tokens per unit weight ({out['all_backlogged_steps']} "
             "such steps)",
             f"{'client':>{w}} {'service':>14} {'admitted':>9} {'completed':>9} {'share':>7} {'demand':>7} "
             f"{'wait p50':>9} {'wait p99':>9}"]
    for k in range(out["clients"]):
        lines.append(f"{labels[k]:>{w}} {out['service'][k]:>14} {out['admitted'][k]:>9} {out['completed'][k]:>9} "
                     f"{_fmt(details['share_of_service'][k]):>7} {_fmt(details['share_of_demand'][k]):>7} "
                     f"{_fmt(details['wait_p50'][k]):>9} {_fmt(details['wait_p99'][k]):>9}")
    lines.append(load_line(details["load"]))
    return "\n".join(lines)


def command(args) -> int:
    """The replay command: the run's numbers, its summary on stdout, and --json/--details
    written as one set."""
    for path in fileio.check_distinct_outputs([args.json, args.details, args.schedule_out, args.requests_out]):
        fileio.check_writable_file(path)
    if args.requests_out and not servers.takes_step_time(args.server):
        raise InputError(f"--requests-out needs a timed replay (--server with a step-time model: --preset, "
                         f"--step-time or --roofline; --server {args.server} has none)")
    out, details, ran = replay_command(args)
    files = []
    if args.schedule_out:
        schedule = ran[1]
        files.append((Path(args.schedule_out), lambda p: p.write_text(json.dumps(schedule, indent=1))))
    if args.requests_out:
        requests = ran[2]
        files.append((Path(args.requests_out), lambda p: p.write_text(requests)))
    if args.json:
        files.append((Path(args.json), lambda p: p.write_text(json.dumps(out, indent=1))))
    if args.details:
        files.append((Path(args.details), lambda p: p.write_text(json.dumps(details, indent=1))))
    if files:
        fileio.write_outputs_atomically(files)
    print((_cluster_summary if "cluster" in out else _summary)(out, details, args.policy, _labels(args, out["clients"])))
    if args.check:
        print("check: conservation holds (requests arrived = waiting + running + completed; "
              "service = charges of processed tokens)")
    return 0

