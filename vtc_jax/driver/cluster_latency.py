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

from vtc_jax.core.rows import ARRIVAL, ORDER
from vtc_jax.driver.cluster_run import ClusterResults
from vtc_jax.driver.cluster_sweep import ClusterEngine
from vtc_jax.driver.server_latency import RecordingEngine
from vtc_jax.inputs.workload import INT32_MAX

RECORD_TIMES = ("scheduled", "first", "finish", "token_offset")  # per request; "token_at" is per token
RECORD_EXTRAS = ("preemptions", "cached", "recomputed", "replica", "dispatched")  # per request, where kept


def lane_request_record(results: ClusterResults, lane: int) -> dict:
    """Lane `lane`'s per-request record by request number, as server_latency.record_outcome
    reads one server's: "scheduled", "first", "finish" (us on the cluster's clock, -1:
    never), "token_offset" (into "token_at", -1: no whole per-token record): int64[G * N],
    request numbers past the lane's requests -1; "token_at": int64[R * T] every replica's
    per-token record end to end. Needs a run that kept the record (ClusterEngine's
    `server_record`)."""
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
    return out


class ClusterRecordingEngine(RecordingEngine):
    """server_latency.RecordingEngine on the cluster engine with per-tenant results
    (ClusterEngine(per_tenant=True)): per sweep row, its lane with seed 0's per-request
    record by request number (`lane_request_record`) and whether that lane finished.
    `server_record`: the replicas' server's record (host server state -> dict,
    servers/slora.py request_record). The run is the cluster engine's, unchanged but for
    the dispatch records it keeps."""

    def __init__(self, server_record: Callable):
        super().__init__(server_record, ClusterEngine(per_tenant=True, server_record=server_record))

    def _lane_records(self, results) -> Callable[[int], dict]:
        return lambda lane: lane_request_record(results.cluster, lane)


__all__ = ["ClusterRecordingEngine", "lane_request_record"]
