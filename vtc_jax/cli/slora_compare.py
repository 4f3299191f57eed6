"""`compare LOG --server slora`, on one server or at the replicas of a cluster
(--routers/--replicas): beside compare's shares, drift and waits, what `vllm bench serve`
reports, per tenant and overall, in ms: TTFT, TPOT, ITL, E2EL and queueing delay (mean,
p50, p90, p99: latency.json and bench_serve.json; the table timed_compare prints),
throughput, goodput (`--goodput ttft:500 tpot:50`) and preemptions (none: slora never
preempts); `--requests-out FILE.csv` one row per request; and the log's offered rate
against slora's capacity measured on the log's own mix (a cluster's: R replicas x one
server's). All from slora's per-request record (admission, first token, finish in us, and
each token's time, which the lanes keep for ITL's percentiles: `with_token_times`;
servers/slora.py `request_record`) of the log as it is (seed 0): one server's through
driver/server_latency.py, a cluster's (each request's entry at the replica it was
dispatched to; TTFT and queueing delay from its arrival at the router) through
driver/cluster_latency.py, both into driver/latency.py, printed and written by
timed_compare.py's functions: one definition of every number for vllm and slora, one
server or a cluster."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver.latency import bench_serve, parse_goodput, summarize
from vtc_jax.servers import slora

STEP_TIME = "the artifact's A10G fit (docs/ARTIFACT.md)"  # compare gives slora no step-time flags: its defaults
OUTPUTS = ["latency.json", "bench_serve.json"]  # written in --out beside compare's files
RECORD = slora.request_record  # the per-request record compare reads (server_latency.RecordingEngine)


def reports_latency(server: str) -> bool:
    """Whether compare (on an untimed or slora server) reports per-request latencies:
    on slora, one server or a cluster's replicas (its own per-request record, RECORD)."""
    return server == "slora"


def check_flags(args) -> dict:
    """The SLOs of --goodput (ms; {} without it), after refusing, one line each, what
    this run cannot do: --preset / --step-time (vLLM's step-time models: slora has its
    own), --goodput / --requests-out where no latency is reported."""
    for flag in ("preset", "step_time"):
        if getattr(args, flag):
            raise InputError(f"--{flag.replace('_', '-')} is a step-time model of --server vllm (--server "
                             f"{args.server} {'has its own' if args.server == 'slora' else 'is untimed'})")
    latency = reports_latency(args.server)
    for flag in ("goodput", "requests_out"):
        if getattr(args, flag) and not latency:
            raise InputError(f"--{flag.replace('_', '-')} applies to a timed server (--server vllm, or --server "
                             f"slora alone or at a cluster's replicas; --server {args.server} is untimed)")
    return parse_goodput(args.goodput) if latency else {}


def record_copies(args, cluster: bool) -> int:
    """Per-token records a lane of compare keeps: one on one server; on a cluster one per
    replica, twice (a drained cluster lane also runs to its arrival span: ClusterEngine)."""
    return 2 * (args.replicas or 1) if cluster else 1


def with_token_times(settings: list, output: np.ndarray, lanes: int) -> list:
    """`settings` (the rows' Settings) asking slora for every token's time, sized by
    timed_compare.token_times_option (the log's output tokens; none, with a note, past its
    memory limit over `lanes`: the rows x seeds). Each lane of the sweep keeps its own
    record; only seed 0's is read."""
    from vtc_jax.cli.timed_compare import token_times_option

    record = token_times_option(output, lanes)
    return [dataclasses.replace(s, server_options=tuple(sorted({**dict(s.server_options), **record}.items())))
            for s in settings]


def default_memory(server: str) -> int | None:
    """M when --kv-budget is not given: slora's own pool less one adapter reserve (the
    most KV tokens its requests can hold, the artifact's M; compare gives slora no
    settings, so its defaults); None for a server without a pool of its own (ideal)."""
    if server != "slora":
        return None
    s = slora.settings({})
    return s["kv_pool"] - s["adapter_reserve"]


def check_requests_out(args) -> None:
    """Refuse, before the run, a --requests-out that cannot be written or that is one of
    the files compare writes in --out."""
    if args.requests_out:
        out = Path(args.out)
        fileio.check_distinct_outputs([args.requests_out, *(out / name for name in ("results.json", "results.csv",
                                                                                    *OUTPUTS))])
        fileio.check_writable_file(args.requests_out)


def report(args, recorder, rows, trace, names: list[str], file_row: np.ndarray, slos: dict, settings,
           cluster: dict | None = None) -> list:
    """Print the latency table and the load line of each row's lane of seed 0 (kept by
    `recorder`, a server_latency.RecordingEngine, or on a cluster a
    cluster_latency.ClusterRecordingEngine) and return the (path, writer) pairs of
    latency.json, bench_serve.json and --requests-out. `trace`: the log in file order,
    arrivals on slora's clock (us; on a cluster the routers'); `settings`: a row's
    (replicas') Settings (the capacity run's M and server options; its per-token record is
    not the capacity run's); `cluster`: cluster_flags.describe's dict, None on one server
    (the load line then reads R x one server's capacity: timed_compare.load_report)."""
    from vtc_jax.cli import timed_compare
    from vtc_jax.driver.server_latency import measure_capacity, record_table

    k = len(names)
    arrival_us = np.asarray(trace.arrival, np.int64)
    tenant, prompt = np.asarray(trace.client, np.int64), np.asarray(trace.prompt, np.int64)
    settings = dataclasses.replace(settings, server_options=tuple(
        (key, value) for key, value in settings.server_options if key not in slora.STATIC))
    measured = measure_capacity(trace.prompt, trace.output, settings, args.server, slora.request_record)
    options = {key: value for key, value in slora.settings(dict(settings.server_options)).items()
               if key not in (*slora.TIME_KEYS, *slora.STATIC, "overhead", "slots")}
    where = None if cluster is None else dict(cluster, server=args.server)
    out = {"log": str(args.log), "server": args.server, "step_time": STEP_TIME, "settings": options,
           "tenants": names, **({} if cluster is None else {"cluster": cluster}),
           "load": timed_compare.load_report(measured, arrival_us, where), "policies": {}}
    tables, bench = {}, {}
    for row in rows:
        table = record_table(recorder.records[id(row)], trace, k, arrival_us)
        finished = recorder.finished[id(row)]
        out["policies"][row.label] = dict(summarize(table, tenant, names, prompt, slos), finished_all=finished)
        bench[row.label] = dict(bench_serve(table, tenant, names, prompt, slos), finished_all=finished)
        tables[row.label] = table
    print(("latency of the log as it is (seed 0):\n" if args.seeds > 1 else "") + timed_compare.format_report(out, names))
    files = [(Path(args.out) / "latency.json", lambda p: p.write_text(json.dumps(out, indent=1))),
             (Path(args.out) / "bench_serve.json", lambda p: p.write_text(json.dumps(bench, indent=1)))]
    if args.requests_out:
        files.append((Path(args.requests_out),
                      lambda p: p.write_text(timed_compare.requests_csv(tables, tenant, names, prompt, file_row))))
    return files

