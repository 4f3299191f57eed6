"""`replay --server NAME` for servers with settings of their own (vllm, vllm_prefix, sglang):
the trace's tenant labels and priorities, the server's flags, and the run's schedule in the
layout of the real scheduler's golden logs (`--schedule-out`).

A `--server sglang` replay runs its trace's rows in the SGLang golden harness's order of
same-iteration arrivals (its `arrival_order`, servers/sglang_state.py) and reports every row under its row in
the file."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from vtc_jax.cli import input_flags
from vtc_jax.cli.common import in_file
from vtc_jax.cli.scheduler_flags import with_time_shares
from vtc_jax.cli.server_flags import content_options, group_options, prefix_caching_default, server_options
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver.schedules import keeps_schedule, logged_steps, schedule_report
from vtc_jax.measures.online import PAIR_DRIFT_MAX_CLIENTS, MeasureConfig
from vtc_jax.servers import registry as servers

FIRST_LOG = 4096  # steps the schedule log holds on a first run (a longer run is rerun with room)
MAX_LOG_BYTES = 1 << 30


def _memory_flags(server: str) -> str:
    flags = servers.flags(server)
    if "max_total_tokens" in flags:
        return flags["max_total_tokens"]
    return "--num-gpu-blocks x --block-size"


def server_settings(args, settings_from_args, queue_bands, extra=None):
    """The lane's Settings on a server with settings: the server's options (and `extra`
    ones from the trace), its memory as M (for the 2U bound and the load line), bands from
    the trace's priorities."""
    options = {**dict(server_options(args)), **(extra or {})}
    server = servers.get(args.server)
    server.validate(options)
    if args.kv_budget is not None:
        raise InputError(f"--kv-budget is the ideal server's memory; --server {args.server} takes its own "
                         f"({_memory_flags(args.server)})")
    if args.bands and queue_bands is not None:
        raise InputError("--bands and --scheduling-policy priority both set priorities: use the trace's column")
    memory = servers.default_memory(args.server, options)
    if memory is None and "max_total_tokens" in options:  # sglang declares no default_memory: its pool is its M
        memory = int(options["max_total_tokens"])
    settings = settings_from_args(argparse.Namespace(**{**vars(args), "kv_budget": memory}))
    settings = dataclasses.replace(settings, server_options=tuple(sorted(options.items())),
                                   bands=tuple(queue_bands) if queue_bands is not None else settings.bands)
    return with_time_shares(settings, args.server)


def _timed(args, log):
    """(a step-time model's options, the model) when --preset / --step-time is given
    (a timed replay: arrivals are the log's timestamps in exact us, its a0 later in the queue),
    else ({}, None); refused on a server that takes no step-time model or a log without times."""
    from vtc_jax.cli import timed_compare

    if not timed_compare.model_given(args):
        if getattr(args, "requests_out", None):
            raise InputError("--requests-out needs a timed run: give --preset NAME, --step-time FILE.json or "
                             "--roofline MODEL")
        return {}, None
    if not servers.takes_step_time(args.server):
        raise InputError(f"--preset / --step-time / --roofline: --server {args.server} takes no step-time model")
    if not log.timed:
        raise InputError(f"{args.trace}: a trace in steps has no times; a timed replay needs timestamps")
    model = timed_compare.model_of(args)
    return {**timed_compare.server_settings(args, model), **dict(model.options())}, model


def replay_on_server(args, settings_from_args):
    """(result, trace, num_clients, schedule, labels, requests): the run, with the schedule
    logged when asked; `requests`: --requests-out's text on a timed replay (None otherwise)."""
    from vtc_jax.driver.run import run_traces, workload_pad

    log = input_flags.read_input(args, "trace")
    timed, model = _timed(args, log)
    a0 = None if model is None else model.a0
    source = input_flags.server_trace(log, 1e-6 if a0 is not None else input_flags.step_seconds_of(args, log))
    file_rows = input_flags.file_rows(log)  # each trace row's row in the file, as reported
    server_options(args)  # refuses another server's flags; sets args.server (--enable-prefix-caching: vllm_prefix)
    chosen = servers.get(args.server)
    order = np.arange(len(source), dtype=np.int64)  # trace row -> log row
    if chosen.arrival_order is not None:  # the server's order of same-step arrivals (SGLang's golden harness's)
        order = chosen.arrival_order(source.arrival, file_rows)
        source, file_rows = source.reordered(order), file_rows[order]
    by_priority = getattr(args, "scheduling_policy", None) == "priority"
    queue, bands, tenant_of = source.queues(by_priority)
    trace = source.engine_trace(queue)
    if a0 is not None:
        trace = dataclasses.replace(trace, arrival=np.asarray(log.arrival_us(), np.int64)[order] + a0)
    num_clients = len(bands)
    prefix_caching_default(args, log)  # vLLM V1's default: on when the log carries its content
    if chosen.arrival_order is not None:  # a server of iteration traces reads prefix groups only, by ORDER
        content = group_options(source.prefix_id, source.prefix_len, source.tenant, trace.arrival, source.prompt,
                                source.output)
    else:
        content = content_options(args, log, trace.arrival)  # the log's content, by ORDER
    extra = dict(timed, **content)
    if args.requests_out:
        fileio.check_writable_file(args.requests_out)
    settings = server_settings(args, settings_from_args, bands if by_priority else None, extra)
    pairs = ["pair_drift"] if num_clients <= PAIR_DRIFT_MAX_CLIENTS else []
    measures = MeasureConfig.of(pairs + ["latency"] + (["ledger"] if args.check else []))
    log_steps = FIRST_LOG if args.schedule_out else 0

    def run(log_steps):
        try:
            return run_traces([trace], [settings], num_clients=num_clients, steps=args.steps,
                              record_every=args.record_every, measures=measures, server=args.server,
                              log_steps=log_steps)
        except InputError as err:
            raise in_file(args.trace, err) from None

    input_flags.announce(args)
    result = run(log_steps)
    if args.schedule_out and keeps_schedule(result.server_state) and logged_steps(result) > log_steps:
        need = logged_steps(result)
        slots = result.server_state.index.shape[-1]
        if need * slots * 13 > MAX_LOG_BYTES:
            raise InputError(f"--schedule-out: the run took {need} steps; its log ({need} x {slots} seats) would "
                             f"pass {MAX_LOG_BYTES >> 20} MiB: replay fewer steps (--steps)")
        result = run(need)
    schedule = None
    if args.schedule_out:
        schedule = schedule_report(result, trace, num_clients, workload_pad(),
                                   retracts=chosen.requeue_to_tail,
                                   names=file_rows if chosen.arrival_order is not None else None)
    labels = [{"queue": q, "tenant": source.tenants[t], "priority": int(b)} for q, (t, b) in
              enumerate(zip(tenant_of, bands))]
    requests = None
    if args.requests_out:
        from vtc_jax.cli.timed_compare import requests_csv
        from vtc_jax.driver.latency import request_table

        table = request_table(result, trace, num_clients, workload_pad(), trace.arrival - a0, 0,
                              (model.a1, model.a2))
        tenant = np.asarray(tenant_of, np.int64)[np.asarray(queue, np.int64)]
        requests = requests_csv({args.policy: table}, tenant, list(source.tenants), np.asarray(source.prompt, np.int64),
                                file_rows)
    return result, trace, num_clients, schedule, labels, requests
