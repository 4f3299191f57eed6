"""The plan of one study (`compare` on any server): the server the flags name and what it
declares (servers.registry: whether it keeps time and a per-request record, its memory,
the trace columns it reads, whether it takes a step-time model), its options, the log on
the server's clock, and the latency report that follows the sweep on a server that keeps
time (driver/study.py). No server is named here: every difference between servers is a
declaration of theirs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from vtc_jax.cli import input_flags, timed_compare
from vtc_jax.cli.scheduler_flags import with_time_shares
from vtc_jax.cli.server_flags import content_options, prefix_caching_default, server_options
from vtc_jax.core import clock, fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver.latency import bench_serve, check_slo_tenants, parse_goodput
from vtc_jax.inputs.workload import MAX_ARRIVAL, Trace
from vtc_jax.servers import registry as servers

US = 1_000_000  # steps per second on a clock of microseconds


@dataclasses.dataclass
class Plan:
    """server: the server that runs (after --enable-prefix-caching); options: its run
    options (step-time model's included); shown_options: those a report prints; memory:
    the M of every lane; model: what the step times are (a step-time model's name, or
    what a server with a clock of its own declares; None: untimed);
    offset: the lane clock's lead on the log's arrivals (us; a step-time model's a0);
    trace: the log on the server's clock, file order, clients the engine's (a (tenant,
    priority) pair each under priority scheduling); clients: their names; tenant_of:
    int64[K] each client's tenant; tenants: the tenants' names; bands: per client, under
    priority scheduling (None otherwise); shared: options from the log's columns (shared
    prefixes); per_second: steps per second; step_seconds; file_row: int64[N] each
    request's data row; latency: the server keeps time and a per-request record; slos;
    delivery: the step-time model's (a1, a2) us (latency.outcome_table)."""

    server: str
    options: dict
    shown_options: dict
    memory: int
    model: str | None
    offset: int
    trace: Trace
    clients: list
    tenant_of: np.ndarray
    tenants: list
    bands: list | None
    shared: dict
    per_second: int
    step_seconds: float | None
    file_row: np.ndarray
    latency: bool
    slos: dict
    delivery: tuple = (0, 0)


def _refuse_model_flags(args, server: str) -> None:
    for flag in (*timed_compare.MODEL_FLAGS, "gpu", "tensor_parallel_size", "roofline_efficiency",
                 "gpu_memory_utilization"):
        if getattr(args, flag, None) is not None:
            kind = "has its own clock" if servers.keeps_time(server) else "is untimed"
            raise InputError(f"--{flag.replace('_', '-')} is a step-time model, which --server {server} does not "
                             f"take (it {kind}; servers that take one: "
                             f"{', '.join(n for n in servers.names() if servers.takes_step_time(n))})")


def server_setup(args) -> tuple[str, dict, dict, object]:
    """(server, run options, shown options, step-time model or None) of the flags: a flag
    of another server refused, the model's options and the KV pool it names filled in,
    the whole validated by the server (one line)."""
    given = dict(server_options(args))  # sets args.server (--enable-prefix-caching)
    server = args.server
    model = None
    if servers.takes_step_time(server):
        model = timed_compare.model_of(args)
        given = timed_compare.server_settings(args, model)
    else:
        _refuse_model_flags(args, server)
    options = {**given, **(dict(model.options()) if model else {})}
    servers.get(server).validate(options)
    return server, options, given, model


def memory_of(args, server: str, options: dict) -> int:
    """M: --kv-budget, or the server's own (its flags set it: then --kv-budget is refused)."""
    own = servers.default_memory(server, options)
    if servers.flags(server) and args.kv_budget is not None:
        raise InputError(f"--kv-budget is the ideal server's memory; --server {server} takes its own "
                         "(--num-gpu-blocks x --block-size)")
    memory = args.kv_budget if args.kv_budget is not None else own
    if memory is None:
        raise InputError(f"--kv-budget M is required (the {server} server's memory)")
    return int(memory)


def check_latency_flags(args, server: str, latency: bool) -> dict:
    """--goodput's SLOs ({} without it); --goodput and --requests-out refused where the
    server reports no latency."""
    for flag in ("goodput", "requests_out"):
        if getattr(args, flag, None) and not latency:
            timed = [n for n in servers.names() if servers.keeps_time(n, {"time_model": "per_step=1"})]
            raise InputError(f"--{flag.replace('_', '-')} applies to a timed server ({', '.join(timed)}; "
                             f"--server {server} is untimed)")
    return parse_goodput(args.goodput) if latency else {}


def _priority_queues(log, order: np.ndarray):
    """(queue int64[N], band per queue, tenant per queue): one engine client per (tenant,
    priority) pair, numbered by first appearance in the file's row order; its band the
    rank of its priority (0 served first: lower priority values first, as vLLM)."""
    ids: dict = {}
    for i in order:
        ids.setdefault((int(log.client[i]), int(log.priority[i])), len(ids))
    queue = np.asarray([ids[(int(c), int(p))] for c, p in zip(log.client, log.priority)], np.int64)
    pairs = sorted(ids, key=ids.get)
    rank = {p: r for r, p in enumerate(sorted({p for _, p in pairs}))}
    return queue, [rank[p] for _, p in pairs], [t for t, _ in pairs], [p for _, p in pairs]


def check_size(args, options: dict, log, prefix_caching: bool, model, arrival_us: np.ndarray) -> None:
    """Before a timed run: refuse (one line) what one lane per device cannot hold, warn (one
    line) when the whole study would run for long (driver/run_budget.py). A lane's steps: at
    most its output tokens (a step decodes at least one), and about its busy clock
    (`model.drain_floor` less the first arrival) over the shortest step; plus three events
    per request (arrival, admission, completion). With prefix caching the pool's sizes come
    from the log: W, its longest request's blocks (ceil((prompt + output - 1) / B)); U and
    the content table, its blocks' contents (inputs/prefix_blocks.block_ids through the
    sequence); the requests running a step, its output tokens over its steps (each running
    request decodes one a step); blocks taken and hashed, every request's blocks once each.
    The sweep chunks the lanes, so only one chunk must fit."""
    import jax

    from vtc_jax.driver import run_budget

    rows = len(log)
    budget = int(options.get("max_num_batched_tokens", 2048))
    prompt, output = np.asarray(log.prompt, np.int64), np.asarray(log.output, np.int64)
    busy = model.drain_floor(arrival_us, prompt, output, budget) - int(np.min(arrival_us))
    steps = min(int(output.sum()), busy // model.step_us(0, 1) + 1)
    slots = min(int(options.get("max_num_seqs", rows)), rows)
    pool = {}
    if prefix_caching:
        from vtc_jax.inputs import prefix_blocks

        bs = int(options.get("block_size", 16))
        blocks = -(-(prompt + output - 1) // bs)
        _, ids = prefix_blocks.block_ids(prefix_blocks.of_log(log), prompt, output, bs, through="sequence")
        pool = dict(table_width=int(blocks.max()), contents=int(ids.max(initial=-1)) + 1, content_ids=int(ids.size),
                    running=min(slots, max(1, -(-int(output.sum()) // max(steps, 1)))),
                    block_ops=int(blocks.sum()) + int(ids.size))
    shape = run_budget.RunShape(lanes=len(args.policies) * args.seeds, slots=slots,
                                pool_blocks=int(options.get("num_gpu_blocks", 0)), rows=rows, events=steps + 3 * rows,
                                prefix_caching=prefix_caching, devices=jax.device_count(), **pool)
    run_budget.check(dataclasses.replace(shape, lanes=shape.devices), warn_seconds=float("inf"))
    run_budget.check(shape, available=1 << 62)


def _cached_tokens(log) -> np.ndarray:
    """int64[N]: per request, the prompt tokens an earlier request holds (an unbounded
    cache: what the drain bound may take as never computed)."""
    from vtc_jax.inputs import prefix_blocks

    return prefix_blocks.shared_tokens(prefix_blocks.of_log(log), log.prompt, log.output, through="sequence")


def plan(args, cluster: bool = False) -> Plan:
    """The study's plan from the command's flags (every refusal one line, before a run)."""
    server, options, given, model = server_setup(args)
    memory = memory_of(args, server, options)
    args.kv_budget = memory  # every Settings the command builds (a cluster's gateway too) has the server's M
    latency = servers.keeps_time(server, options) and servers.request_record(server) is not None
    slos = check_latency_flags(args, server, latency)
    if model is not None:
        log = timed_compare.read_timed_log(args)
        step_seconds, per_second, offset = 1e-6, US, model.a0
    else:
        args.step_seconds = input_flags.resolved_step_seconds(args)  # a server's own clock (us) unless given
        log = input_flags.read_input(args, "log")
        step_seconds = input_flags.step_seconds_of(args, log)
        per_second, offset = input_flags.steps_per_second(log, step_seconds), 0
    log = input_flags.drop_unservable(args, log, memory)  # a prompt past M: rejected and counted, the rest served
    server = prefix_caching_default(args, log)  # vLLM V1's default: on when the log carries its content
    columns = servers.trace_columns(server)
    if model is not None:  # a vLLM engine: which of the log's content columns it does not read
        timed_compare.note_unused_columns(log, server, "prefix_id" in columns)
    file_row = input_flags.file_rows(log)
    tenants = list(log.tenants)
    check_slo_tenants(slos, tenants)
    if model is not None:
        arrival_us = log.arrival_us()
        end = int(arrival_us.max()) + offset  # past MAX_ARRIVAL: a wide clock (core/clock.py)
        longest = MAX_ARRIVAL if not servers.get(server).wide_clock else clock.WIDE_LIMIT
        if end > longest:
            raise InputError(f"{args.log}: the log spans {arrival_us.max() / 1e6:,.1f} s; a timed run on --server "
                             f"{server} holds up to {longest / 1e6:,.0f} s of arrivals: take a window of it "
                             "(--time-window START,SECONDS)")
        model.check_drain(arrival_us, log.prompt, log.output, options.get("max_num_batched_tokens", 2048),
                          limit=servers.get(server).max_horizon if end <= MAX_ARRIVAL else clock.WIDE_LIMIT,
                          cached=_cached_tokens(log) if "prefix_id" in columns else None)
        check_size(args, options, log, "prefix_id" in columns, model, arrival_us)
        client = np.asarray(log.client, np.int64)
        trace = Trace(arrival_us + offset, client, log.prompt, log.output, np.zeros_like(log.prompt), source=str(args.log))
    else:
        trace = input_flags.engine_trace(args, log)
        client = np.asarray(trace.client, np.int64)
    clients, tenant_of, bands = tenants, np.arange(len(tenants), dtype=np.int64), None
    if "priority" in columns and options.get("scheduling_policy") == "priority":
        queue, bands, owner, level = _priority_queues(log, np.argsort(file_row, kind="stable"))
        clients = [f"{tenants[t]}/priority {p}" for t, p in zip(owner, level)]
        tenant_of = np.asarray(owner, np.int64)
        trace = dataclasses.replace(trace, client=queue)
    elif "priority" in columns and (np.asarray(log.priority) != 0).any():
        print("note: the log's priority column orders requests only under --scheduling-policy priority",
              file=sys.stderr)
    trace.validate()
    shared = content_options(args, log, trace.arrival)
    if shared:
        servers.get(server).validate({**options, **shared})
    shown = {key: value for key, value in options.items() if not key.startswith("time_")}
    clock_name = None if model is None else model.name
    if model is None and latency:  # the server's own clock: what it declares of it
        own = servers.get(server).own_clock
        clock_name, shown = ("the server's own clock", {}) if own is None else own(options)
    return Plan(server, options, shown, memory, clock_name, offset, trace, clients,
                tenant_of, tenants, bands, shared, per_second, step_seconds, file_row, latency, slos,
                (0, 0) if model is None else (model.a1, model.a2))


def lane_settings(args, plan: Plan, policy: str, settings_from_args):
    """One policy's Settings: M, the server's options (and the log's shared prefixes),
    priority bands under priority scheduling."""
    s = settings_from_args(argparse.Namespace(**{**vars(args), "kv_budget": plan.memory}), policy, lenient=True)
    options = tuple(sorted({**plan.options, **plan.shared}.items()))
    s = dataclasses.replace(s, server_options=options, bands=tuple(plan.bands) if plan.bands else s.bands)
    return with_time_shares(s, plan.server)


def record_copies(args, cluster: bool) -> int:
    """Per-token records a lane of compare keeps: one on one server; on a cluster one per
    replica, twice (a drained cluster lane also runs to its arrival span: ClusterEngine)."""
    return 2 * (args.replicas or 1) if cluster else 1


def with_token_times(settings: list, output: np.ndarray, lanes: int) -> list:
    """`settings` asking the server for every token's time, sized by
    timed_compare.token_times_option (none, with a note, past its memory limit over
    `lanes`: the rows x seeds)."""
    record = timed_compare.token_times_option(output, lanes)
    return [dataclasses.replace(s, server_options=tuple(sorted({**dict(s.server_options), **record}.items())))
            for s in settings]


def latency_outputs(draw: bool) -> list[str]:
    """The files a timed study writes in --out beside the sweep's."""
    return ["bench_serve.json"] + ["ttft_cdf.png"] * draw


def check_requests_out(args) -> None:
    """Refuse, before the run (and after --out exists), a --requests-out that cannot be
    written or that is one of the files compare writes in --out."""
    if args.requests_out:
        out = Path(args.out)
        fileio.check_distinct_outputs([args.requests_out, *(out / name for name in (
            "results.json", "results.csv", *latency_outputs(True)))])
        fileio.check_writable_file(args.requests_out)


def study_engine(plan: Plan):
    from vtc_jax.driver.study import LatencyPlan, StudyEngine

    record, index = servers.request_record(plan.server)
    return StudyEngine(LatencyPlan(record, index, plan.trace, plan.offset, plan.tenant_of, plan.tenants, plan.slos,
                                   plan.delivery))


def capacity_of(plan: Plan, settings):
    """The server's capacity on the log's mix (the load line), in a run of its own
    without the per-token record; with prefix caching, of the same engine without it (the
    saturated mix is not the log's order, so its content does not apply: a floor)."""
    from vtc_jax.driver import capacity
    from vtc_jax.driver.server_latency import measure_capacity

    options = tuple((k, v) for k, v in settings.server_options if k not in ("token_times", *plan.shared))
    settings = dataclasses.replace(settings, server_options=options)
    server = servers.prefix_caching(plan.server, False) if plan.shared else plan.server
    record, index = servers.request_record(server)
    if index == "row":
        return capacity.measure(plan.trace.prompt, plan.trace.output, settings, server)
    return measure_capacity(plan.trace.prompt, plan.trace.output, settings, server, record)


def report(args, plan: Plan, engine, rows, settings, result: dict) -> list:
    """Print the latency table (seed 0: the log as it is; with --seeds S > 1 each figure's
    mean and 95% CI over the S seeds), put the report in result["latency"] and return the
    (path, writer) pairs of bench_serve.json, ttft_cdf.png and --requests-out."""
    from vtc_jax.driver.study import latency_metrics, over_seeds

    arrival_us = np.asarray(plan.trace.arrival, np.int64) - plan.offset
    try:
        measured = capacity_of(plan, settings)
    except InputError as err:  # the load line's own run (a saturated mix) failed: the study's numbers stand
        measured = str(err)
    out = {"log": str(args.log), "server": plan.server, "step_time": plan.model or "the server's own clock",
           "settings": plan.shown_options, "tenants": plan.tenants, "seeds": args.seeds,
           "load": timed_compare.load_report(measured, arrival_us), "policies": {}, "over_seeds": {}}
    tables, bench = {}, {}
    for row in rows:
        table = engine.tables[id(row)]
        summary = engine.summaries[(id(row), 0)]
        if summary is None:
            raise InputError(f"{args.log}: no request finished under {row.label} (run longer: --steps)")
        out["policies"][row.label] = dict(summary, finished_all=summary["finished_all"] and engine.finished[id(row)])
        bench[row.label] = dict(bench_serve(table, table["tenant"], plan.tenants, table["prompt"], plan.slos),
                                finished_all=out["policies"][row.label]["finished_all"])
        if args.seeds > 1:
            out["over_seeds"][row.label] = over_seeds(engine.per_seed(row, args.seeds))
        for entry in result["rows"]:  # the latency figures as the row's metrics too (results.json rows, results.csv)
            if entry["label"] == row.label:
                entry["metrics"].update(latency_metrics(engine.per_seed(row, args.seeds), plan.tenants))
        tables[row.label] = table
    print(timed_compare.format_report(out, plan.tenants))
    result["latency"] = out
    files = [(Path(args.out) / "bench_serve.json", lambda p: p.write_text(json.dumps(bench, indent=1)))]
    if not args.no_plots:
        files.append((Path(args.out) / "ttft_cdf.png", lambda p: timed_compare.draw_ttft_cdf(tables, plan.tenants, p)))
    if args.requests_out:
        first = next(iter(tables.values()))
        files.append((Path(args.requests_out), lambda p: p.write_text(timed_compare.requests_csv(
            tables, first["tenant"], plan.tenants, first["prompt"], plan.file_row[first["file_row"]]))))
    return files
