"""`python -m vtc_jax compare`: several policies on your own log (a trace CSV in steps, or a
timestamped log in seconds with any tenant names), per tenant and policy: shares, waits,
the backlogged drift and the load line, written as results.json/csv and plots; on `slora`
(one server or a cluster's replicas) also its latencies in ms (slora_compare.py), on
`vllm` only those (timed_compare.py)."""

from __future__ import annotations

import argparse
import sys

from vtc_jax.cli import cluster_flags, input_flags
from vtc_jax.cli.common import in_file
from vtc_jax.cli.scheduler_flags import ignored_flags, settings_from_args
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver.devices import enable_compilation_cache
from vtc_jax.inputs.workload import Trace
from vtc_jax.measures.online import PAIR_DRIFT_MAX_CLIENTS
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers


def read_log(path, step_seconds: float, args=None) -> tuple[Trace, list[str], int]:
    """Any input the reader layer reads (a trace CSV in steps, a timestamped log, Azure,
    Mooncake, BurstGPT, a ServeGen directory; `args`: the command's input flags), a timed
    one converted to steps: step = floor((t - t0) / step_seconds), exact. Returns (trace,
    tenant names, steps per second)."""
    if args is None:  # the reader's defaults
        args = argparse.Namespace(log=path, step_seconds=step_seconds, **input_flags.DEFAULTS)
    log, trace, names, per_second = _read(args)
    return trace, names, per_second


def _read(args):
    """(the reader's log, its engine trace in file order, tenant names, steps per second)."""
    log = input_flags.read_input(args, "log")
    step = input_flags.step_seconds_of(args, log)
    return log, input_flags.engine_trace(args, log), list(log.tenants), input_flags.steps_per_second(log, step)


def check_unused(args, policies: list[str], gateway: str | None = None) -> None:
    """Refuse a flag that no listed policy (nor the cluster's `gateway` policy) takes, one
    line; note on stderr, per policy, the flags it runs without."""
    skip = None if gateway is None else {line.split(":")[0] for line in ignored_flags(args, gateway)}
    ignored = {p: [line for line in ignored_flags(args, p) if skip is None or line.split(":")[0] in skip]
               for p in policies}
    for line in ignored[policies[0]]:  # a flag no listed policy reads is refused
        flag = line.split(":")[0]
        if all(any(x.split(":")[0] == flag for x in ignored[p]) for p in policies):
            raise InputError(line if len(policies) == 1 and gateway is None else
                             f"{flag}: none of the policies {', '.join(policies)}"
                             + (f" (nor the gateway policy {gateway})" if gateway else "")
                             + f" takes it ({line.split(': ', 1)[1]})")
    for p, lines in ignored.items():
        for line in lines:
            print(f"note: {line.split(':')[0]} does not apply to {p}; it runs without it", file=sys.stderr)


def command(args) -> int:
    """The compare command, one study on any server: every policy on the log as rows of
    one sweep (seeds redraw arrivals within --phase-unit; seed 0 is the log exactly), its
    fairness tables printed (drift, bound, load line, per-tenant shares and waits), and on
    a server that keeps time and a per-request record (servers.registry.keeps_time,
    request_record) its latencies per tenant, per policy, mean and 95% CI over the seeds
    (driver/study.py); results.json (one schema on every server: the sweep's rows and
    "latency", null on an untimed server), results.csv, plots, tenants.png (and on a timed
    server bench_serve.json, ttft_cdf.png, --requests-out) written as one set. With
    --routers/--replicas each policy runs at the replicas of a cluster (cluster_compare)."""
    from vtc_jax.cli import study_plan
    from vtc_jax.driver import sweep as sweep_mod
    from vtc_jax.driver import sweep_outputs
    from vtc_jax.driver.run import horizon_limit, server_drain, validate_fits
    from vtc_jax.inputs.workload import MAX_ARRIVAL, wide_clock_for
    from vtc_jax.inputs.sources import TraceSource

    for p in args.policies:
        registry.get(p)
    if len(set(args.policies)) != len(args.policies):
        raise InputError("--policies lists a policy twice")
    cluster = cluster_flags.given(args)
    plan = study_plan.plan(args, cluster)  # the server, its options and memory, the log on its clock
    gateway = None
    if cluster:
        cluster_flags.check_flags(args)
        gateway = cluster_flags.gateway_policy(args)
    trace, names, per_second, k = plan.trace, plan.clients, plan.per_second, plan.trace.num_clients
    if args.weights and len(args.weights) != k:
        raise InputError(f"--weights gives {len(args.weights)} weights for the log's {k} tenants "
                         f"({', '.join(names[:8])}{'...' if k > 8 else ''})")
    check_unused(args, args.policies, gateway)
    settings = [study_plan.lane_settings(args, plan, p, settings_from_args) for p in args.policies]
    if plan.latency:  # every token's time, for ITL's percentiles
        settings = study_plan.with_token_times(settings, trace.output, len(settings) * args.seeds
                                               * study_plan.record_copies(args, cluster))
    horizon = args.steps or max(server_drain(trace, s, plan.server) for s in settings)
    wide_clock = wide_clock_for(trace)
    if cluster and wide_clock:  # the cluster engine keeps an int32 clock (core/clock.py is one server's)
        raise InputError(f"{args.log}: a cluster of replicas runs arrivals up to {MAX_ARRIVAL / 1e6:,.0f} s of its "
                         "clock: take a window of the log (--time-window START,SECONDS); one server takes it whole")
    limit = horizon_limit(plan.server, drains=args.steps is None, wide_clock=wide_clock)
    if horizon > limit:  # a cut drain bound would leave requests unserved
        raise InputError(f"{args.log}: draining the log needs up to {horizon:,} steps, past the limit of "
                         f"{limit:,}: give --steps")
    unit = args.phase_unit or per_second
    source = TraceSource(trace, num_clients=k, horizon=horizon, phase_unit=unit, drain=args.steps is None)
    rows = []
    for s in settings:
        try:
            validate_fits(trace, s, k, source.horizon, False)
        except InputError as err:
            raise in_file(args.log, err) from None
        rows.append(sweep_mod.Row(s, source, s.policy, server=plan.server))
    config = {"log": str(args.log), "tenants": names, "step_seconds": plan.step_seconds, "horizon": source.horizon,
              "phase_unit": unit, "policies": args.policies, "server": plan.server, "settings": plan.shown_options}
    if cluster:
        return cluster_compare(args, settings, source, names, per_second, dict(config, cluster=cluster_flags.describe(
            args, gateway)), settings_from_args(args, gateway, lenient=True), trace, plan)
    enable_compilation_cache(None if args.no_cache else args.cache_dir)
    plots = (sweep_mod.Plot("metric", "backlogged_drift.png", "drift while jointly backlogged, per policy",
                            "policy", "backlogged_drift"),)
    engine = study_plan.study_engine(plan) if plan.latency else None
    sweep = sweep_mod.Sweep(name="compare", config=config,
                            rows=rows, metrics=sweep_mod.base_metrics,
                            measures=("pair_drift",) if k <= PAIR_DRIFT_MAX_CLIENTS else (),
                            columns=("backlogged_drift", "bound_2u", "backlogged_drift_over_2u", "max_drift",
                                     "throughput"), plots=plots, clients=True, engine=engine)
    draw = not args.no_plots
    fileio.check_writable_dir(args.out, sweep_outputs.output_names(sweep, plots=draw) + ["tenants.png"] * draw
                              + (study_plan.latency_outputs(draw) if plan.latency else []))
    if plan.latency:
        study_plan.check_requests_out(args)
    input_flags.announce(args)
    result = sweep_mod.run_sweep(sweep, args.seeds)
    print(sweep_outputs.format_table(sweep, result))
    print(sweep_outputs.format_load(result))
    print(f"per tenant (means over seeds; waits {wait_unit(plan.step_seconds, per_second)}):")
    print(sweep_outputs.format_clients(result, names))
    extra = study_plan.report(args, plan, engine, rows, settings[0], result) if plan.latency else []
    result["latency"] = result.get("latency")
    return _write(args, sweep, result, names, extra)


def wait_unit(step_seconds: float, per_second: int) -> str:
    """How the per-tenant table's waits read: steps, steps of a stated length, or us on a
    server's microsecond clock (slora's)."""
    if per_second == 1_000_000:
        return "in us (the server's clock)"
    return "in steps" + (f", x {step_seconds} s" if per_second > 1 else "")


def _write(args, sweep, result: dict, names: list[str], extra: list = ()) -> int:
    """results, plots, tenants.png and the caller's `extra` (path, writer) pairs as ONE
    set: a full disk or a Ctrl-C leaves the previous results, never results without plots."""
    from vtc_jax.driver import sweep_outputs

    draw = not args.no_plots
    tenants = [(args.out / "tenants.png", lambda path: sweep_outputs.draw_tenants(result, names, path))] * draw
    written = sweep_outputs.write_outputs(sweep, result, args.out, plots=draw, extra=tenants + list(extra))
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


CLUSTER_COLUMNS = ("all_backlogged_drift", "all_backlogged_steps", "wait_p50", "wait_p99")


def cluster_compare(args, settings, source, names: list[str], per_second: int, config: dict, gateway, trace,
                    plan) -> int:
    """Each policy at the replicas of the cluster the flags describe (its routers run
    `gateway`'s policy), as rows of one sweep through the cluster's adapter: the same
    load line and per-tenant shares as compare, waits also in seconds for a timestamped log;
    on slora replicas the latencies of each row's lane of the log as it is (`trace`, file
    order; `plan`: the study's, cli/study_plan.py), as on one server (slora_compare.report),
    written with the other files as one set (results.json's "latency")."""
    from vtc_jax.cli import slora_compare, study_plan
    from vtc_jax.driver import sweep as sweep_mod
    from vtc_jax.driver import sweep_outputs
    from vtc_jax.driver.cluster_latency import ClusterRecordingEngine
    from vtc_jax.driver.cluster_sweep import ClusterEngine, tenant_metrics

    extra = {} if args.ingress is None else {"ingress": args.ingress}
    rows = [sweep_mod.Row(cluster_flags.cluster_settings(args, s, gateway, names, per_second), source, s.policy,
                          extra, server=args.server) for s in settings]
    enable_compilation_cache(None if args.no_cache else args.cache_dir)
    plots = (sweep_mod.Plot("metric", "all_backlogged_drift.png", "cluster: drift while every tenant is backlogged, "
                            "per engine policy", "engine_policy", "all_backlogged_drift"),)
    latency = plan.latency
    recorder = ClusterRecordingEngine(servers.request_record(plan.server)[0]) if latency else None
    sweep = sweep_mod.Sweep(name="compare", config=config, rows=rows, metrics=tenant_metrics, columns=CLUSTER_COLUMNS,
                            plots=plots, engine=recorder or ClusterEngine(per_tenant=True), clients=True)
    draw = not args.no_plots
    fileio.check_writable_dir(args.out, sweep_outputs.output_names(sweep, plots=draw) + ["tenants.png"] * draw
                              + (slora_compare.OUTPUTS if latency else []))
    if latency:
        study_plan.check_requests_out(args)
    input_flags.announce(args)
    result = sweep_mod.run_sweep(sweep, args.seeds)
    c = config["cluster"]
    if "picker" in c:
        print(f"fleet: a gateway with the {c['picker']} picker"
              + (" and flow control" if c["flow_control"] else " routing every request at its arrival")
              + f" in front of {c['replicas']} replica(s) of --server {args.server}; rows: the "
              + ("gateway's fairness policy (replicas: fcfs)" if c["flow_control"] else "replicas' policy"))
    else:
        print(f"cluster: {c['routers']} router(s) running {c['gateway_policy']} ({c['counters']} counters) in front "
              f"of {c['replicas']} replica(s) of --server {args.server} with M = {args.kv_budget} each; rows: the "
              "replicas' policy")
    print(sweep_outputs.format_table(sweep, result))
    print(sweep_outputs.format_load(result))
    seconds = args.step_seconds if per_second > 1 else None
    print("per tenant (means over seeds; waits from router arrival to admission, in steps"
          + (f" and seconds at {seconds} s per step" if seconds else "") + "):")
    print(format_tenants(result, names, seconds))
    extra = []
    if latency:
        measured = study_plan.capacity_of(plan, settings[0])
        extra = slora_compare.report(args, recorder, rows, trace, names, plan.file_row, plan.slos, settings[0],
                                     measured, c, result, (plan.model or "the server's own clock", plan.shown_options))
    result["latency"] = result.get("latency")
    return _write(args, sweep, result, names, extra)


def format_tenants(result: dict, names: list[str], step_seconds: float | None) -> str:
    """Per row, per tenant: share of service and of demand, admitted/arrived, wait p50 and
    p99 in steps (and in seconds when `step_seconds` is given)."""
    from vtc_jax.driver.sweep_outputs import _fmt, _render

    keys = ("served_share", "offered_share", "admitted_over_arrived", "wait_p50", "wait_p99")
    header = ["tenant", "share of service", "share of demand", "admitted/arrived", "wait p50", "wait p99"]
    header += ["wait p50 (s)", "wait p99 (s)"] if step_seconds else []
    out = []
    for entry in result["rows"]:
        c = entry.get("clients") or {}
        lines = []
        for i in range(len(c.get("served_share", []))):
            cells = [names[i]] + [_fmt(c[key][i]) for key in keys]
            if step_seconds:
                cells += [_fmt(None if c[key][i] is None else c[key][i] * step_seconds) for key in keys[3:]]
            lines.append(cells)
        out.append(f"{entry['label']}:\n" + _render(header, lines))
    return "\n".join(out)
