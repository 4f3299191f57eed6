"""`compare LOG` at the replicas of a cluster (--routers/--replicas) of a server that
keeps time and a per-request record (servers/slora.py's): beside compare's shares, drift
and waits, what `vllm bench serve` reports, per tenant and overall, in ms: TTFT, TPOT, ITL,
E2EL and queueing delay (mean, p50, p90, p99: results.json's "latency" and
bench_serve.json; the table timed_compare prints; one server's: cli/study_plan.py),
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

import json
from pathlib import Path

import numpy as np

from vtc_jax.driver.latency import bench_serve, summarize
from vtc_jax.driver.study import latency_metrics, over_seeds
from vtc_jax.servers import registry as servers

OUTPUTS = ["bench_serve.json"]  # written in --out beside compare's files (the latency: results.json's "latency")


def _summary(table: dict | None, names: list[str], slos: dict) -> dict | None:
    """latency.summarize of one seed's table (cluster_latency.seed_table), None when the seed
    finished no request (it reports nothing to average) or was not run."""
    if table is None or not table["finished"].any():
        return None
    return summarize(table, table["tenant"], names, table["prompt"], slos)


def report(args, recorder, rows, trace, names: list[str], file_row: np.ndarray, slos: dict, settings, measured,
           cluster: dict | None = None, result: dict | None = None, shown: tuple | None = None) -> list:
    """Print the latency table and the load line of each row's lane of seed 0 (kept by
    `recorder`, a server_latency.RecordingEngine, or on a cluster a
    cluster_latency.ClusterRecordingEngine) and return the (path, writer) pairs of
    bench_serve.json and --requests-out. `trace`: the log in file order,
    arrivals on slora's clock (us; on a cluster the routers'); `settings`: a row's
    (replicas') Settings (the capacity run's M and server options; its per-token record is
    not the capacity run's); `cluster`: cluster_flags.describe's dict, None on one server
    (the load line then reads R x one server's capacity: timed_compare.load_report);
    `result`: the sweep's, which gets the report as "latency"; `measured`: one server's
    capacity on the log's mix (study_plan.capacity_of); `shown`: (the step-time model, the
    settings a report prints) of a server without a clock of its own (vLLM's)."""
    from vtc_jax.cli import timed_compare
    from vtc_jax.driver.cluster_latency import format_replicas, replica_report
    from vtc_jax.driver.server_latency import record_table

    k = len(names)
    arrival_us = np.asarray(trace.arrival, np.int64)
    tenant, prompt = np.asarray(trace.client, np.int64), np.asarray(trace.prompt, np.int64)
    own = servers.get(args.server).own_clock
    clock, options = own(dict(settings.server_options)) if own is not None else shown  # what its reports print
    where = None if cluster is None else dict(cluster, server=args.server)
    out = {"log": str(args.log), "server": args.server, "step_time": clock, "settings": options,
           "tenants": names, "seeds": args.seeds, **({} if cluster is None else {"cluster": cluster}),
           "load": timed_compare.load_report(measured, arrival_us, where), "policies": {}}
    tables, bench, replicas = {}, {}, {}
    for row in rows:
        record = recorder.records[id(row)]
        table = record_table(record, trace, k, arrival_us)
        finished = recorder.finished[id(row)]
        out["policies"][row.label] = dict(summarize(table, tenant, names, prompt, slos), finished_all=finished)
        bench[row.label] = dict(bench_serve(table, tenant, names, prompt, slos), finished_all=finished)
        tables[row.label] = table
        per_replica = replica_report(record, table, prompt, out["policies"][row.label]["duration_s"])
        if per_replica is not None:  # a fleet: its replicas' requests, busy share, KV use, prefix hits
            replicas[row.label] = bench[row.label]["replicas"] = out["policies"][row.label]["replicas"] = per_replica
        if args.seeds > 1 and hasattr(recorder, "table"):  # a cluster's every seed: each figure's spread
            per_seed = [_summary(recorder.table(row, s), names, slos) for s in range(args.seeds)]
            out.setdefault("over_seeds", {})[row.label] = over_seeds(per_seed)
            for entry in (result or {}).get("rows", []):  # as the row's metrics too (results.json rows, results.csv)
                if entry["label"] == row.label:
                    entry["metrics"].update(latency_metrics(per_seed, names))
    heading = "latency of the log as it is (seed 0)" + (", and over seeds" if out.get("over_seeds") else "")
    print((heading + ":\n" if args.seeds > 1 else "") + timed_compare.format_report(out, names))
    if replicas:
        print(format_replicas(replicas))
    if result is not None:
        result["latency"] = out
    files = [(Path(args.out) / "bench_serve.json", lambda p: p.write_text(json.dumps(bench, indent=1)))]
    if args.requests_out:
        files.append((Path(args.requests_out),
                      lambda p: p.write_text(timed_compare.requests_csv(tables, tenant, names, prompt, file_row))))
    return files

