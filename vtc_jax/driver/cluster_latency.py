"""Per-request latencies of a cluster whose replicas keep a per-request record (slora), in
the one-server record's layout, so that server_latency.record_table, and through it
latency.request_table / summarize / bench_serve, read a cluster lane exactly as they read
one server's: one definition of every number.

A replica's server numbers its requests by the cluster's dispatch sequence (its arrival is
the dispatch time; docs/CLUSTER.md, "Replicas"), and every replica holds arrays for every
sequence number, written only where the request went (-1 elsewhere). The cluster's
dispatch records (replica, sequence per cluster row) pick the one replica's entry
(cluster_run.ClusterResults.request_record); here each cluster row's entry goes to its
request number (ORDER: rank in (arrival, trace row) order, as on one server). The
replicas run on the cluster's clock (microseconds on slora), the clock of the router
arrivals, so TTFT and queueing delay run from the request's arrival at the router.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from vtc_jax.core.rows import ARRIVAL, ORDER, OUTPUT, PROMPT
from vtc_jax.driver.cluster_run import ClusterResults
from vtc_jax.driver.cluster_sweep import ClusterEngine
from vtc_jax.driver.server_latency import RecordingEngine, record_table
from vtc_jax.inputs.workload import INT32_MAX, Trace

RECORD_TIMES = ("scheduled", "first", "finish", "token_offset")  # per request; "token_at" is per token
RECORD_EXTRAS = ("preemptions", "cached", "recomputed", "replica", "dispatched", "status")  # per request, where kept


def lane_request_record(results: ClusterResults, lane: int) -> dict:
    """Lane `lane`'s per-request record by request number, as server_latency.record_outcome
    reads one server's: "scheduled", "first", "finish" (us on the cluster's clock, -1:
    never), "token_offset" (into "token_at", -1: no whole per-token record): int64[G * N],
    request numbers past the lane's requests -1; "token_at": int64[R * T] every replica's
    per-token record end to end. Needs a run that kept the record (ClusterEngine's
    `server_record`). Behind an endpoint picker also "replica_busy", "replica_kv_time"
    int64[R] and "replica_usable" int (ClusterResults.replica_use: `replica_report`)."""
    record, rows = results.request_record, results.rows
    if record is None or rows is None:
        raise ValueError("the cluster run kept no per-request record (ClusterEngine(server_record=...))")
    rows = np.asarray(rows[lane], np.int64)
    real = rows[:, ARRIVAL] < INT32_MAX  # layout padding never arrives (ORDER INT32_MAX too)
    number = rows[real, ORDER]
    out = {}
    for name in RECORD_TIMES + tuple(n for n in RECORD_EXTRAS if n in record):
        col = np.full(len(rows), -1, np.int64)  # G * N rows hold every request: its numbers are below that
        col[number] = np.asarray(record[name][lane], np.int64)[real]
        out[name] = col
    out["token_at"] = np.asarray(record["token_at"][lane], np.int64)
    use = results.replica_use
    if use is not None:
        r = int(use["replicas"][lane])  # the lane's own replicas (a batch has the most of any lane)
        out.update(replica_busy=np.asarray(use["busy"][lane][:r], np.int64),
                   replica_kv_time=np.asarray(use["kv_time"][lane][:r], np.int64),
                   replica_usable=int(use["usable"][lane]))
    return out


def replica_report(record: dict, table: dict, prompt: np.ndarray, duration_s: float) -> list | None:
    """Per replica of a fleet lane (None without `lane_request_record`'s replica sums):
    requests (routed there), busy_share (time in its steps that ran something over the
    run's span, `duration_s`: latency.summarize's first arrival to last finish),
    mean_kv_use (the KV each such step ended with, weighted by its duration, over usable KV
    x the span: its time-average occupancy) and, with prefix caching, prefix_cache_hit_rate
    (prompt tokens its requests got from cache at their first admission over their prompt
    tokens). `table`: server_latency.record_table's (its replica, cached_tokens columns)."""
    if "replica_busy" not in record:
        return None
    span = max(duration_s * 1e6, 1.0)
    out = []
    for r, (busy, kv) in enumerate(zip(record["replica_busy"], record["replica_kv_time"])):
        mine = table["replica"] == r
        entry = {"replica": r, "requests": int(mine.sum()), "busy_share": float(busy) / span,
                 "mean_kv_use": float(kv) / (record["replica_usable"] * span)}
        if "cached_tokens" in table:
            admitted = mine & (table["cached_tokens"] >= 0)
            sent = int(prompt[admitted].sum())
            entry["prefix_cache_hit_rate"] = int(table["cached_tokens"][admitted].sum()) / sent if sent else None
        out.append(entry)
    return out


def format_replicas(replicas: dict) -> str:
    """The per-replica table ({policy: replica_report's list}), printed after the tenant table."""
    cache = any("prefix_cache_hit_rate" in e for entries in replicas.values() for e in entries)
    width = max([6] + [len(p) for p in replicas])
    lines = [f"{'policy':{width}} replica requests busy kv-use" + (" cache-hit" if cache else "")
             + "  (busy: share of the run's span in steps that ran; kv-use: time-average KV occupancy)"]
    for policy, entries in replicas.items():
        for e in entries:
            hit = e.get("prefix_cache_hit_rate")
            lines.append(f"{policy:{width}} {e['replica']:>7} {e['requests']:>8} {100 * e['busy_share']:>5.1f}% "
                         f"{100 * e['mean_kv_use']:>5.1f}%"
                         + ((f" {'n/a':>9}" if hit is None else f" {100 * hit:>8.1f}%") if cache else ""))
    return "\n".join(lines)


def seed_table(record: dict, rows: np.ndarray, first: np.ndarray, tenant_rows: int, num_clients: int) -> dict:
    """One lane's server_latency.record_table over its own requests, whatever its seed drew:
    the trace in request-number order from the lane's cluster rows (int64[G * N, 6]: a seed
    past 0 redraws arrivals inside their phase unit, which renumbers requests), each row's
    tenant from its block (`first`: int64[K] the tenants' first rows in a router's N =
    `tenant_rows`; cluster.layout_lane). Its latencies are the lane's as it ran; with
    "tenant" and "prompt" int64[N] per request number."""
    real = rows[:, ORDER] != INT32_MAX  # padding's ORDER, either clock
    order = np.argsort(rows[real, ORDER], kind="stable")
    at = np.flatnonzero(real)[order]
    tenant = np.searchsorted(first, at % tenant_rows, side="right") - 1
    trace = Trace(rows[at, ARRIVAL], tenant, rows[at, PROMPT], rows[at, OUTPUT], np.zeros(len(at), np.int64))
    return dict(record_table(record, trace, num_clients, trace.arrival), tenant=trace.client, prompt=trace.prompt)


class ClusterRecordingEngine(RecordingEngine):
    """server_latency.RecordingEngine on the cluster engine with per-tenant results
    (ClusterEngine(per_tenant=True)): per sweep row, its lane with seed 0's per-request
    record by request number (`lane_request_record`) and whether that lane finished, and
    what every seed's table is made of (`table(row, seed)`: `seed_table`, built only when a
    report asks for the figures' spread over seeds). `server_record`: the replicas' server's record (host server state ->
    dict, servers/slora.py request_record). The run is the cluster engine's, unchanged but
    for the dispatch records it keeps."""

    def __init__(self, server_record: Callable):
        super().__init__(server_record, ClusterEngine(per_tenant=True, server_record=server_record))
        self._seed_lanes = {}  # {(id(row), seed): seed_table's arguments}

    def run(self, rows, seeds, config, base_seed: int, mesh, progress):
        from vtc_jax.inputs import sources

        results = super().run(rows, seeds, config, base_seed, mesh, progress)
        first = np.asarray(sources.layout(sources.unique([r.source for r in rows]), config.arrival_width + 2).first)
        for lane, (row, seed) in enumerate(zip(rows, seeds)):
            self._seed_lanes[(id(row), int(seed))] = (lane_request_record(results.cluster, lane),
                                                      np.asarray(results.cluster.rows[lane], np.int64), first,
                                                      config.tenant_rows, config.num_clients)
        return results

    def table(self, row, seed: int) -> dict | None:
        """`seed_table` of the row's lane with `seed`, None if it was not run."""
        args = self._seed_lanes.get((id(row), int(seed)))
        return None if args is None else seed_table(*args)

    def _lane_records(self, results) -> Callable[[int], dict]:
        return lambda lane: lane_request_record(results.cluster, lane)


__all__ = ["ClusterRecordingEngine", "format_replicas", "lane_request_record", "replica_report", "seed_table"]
