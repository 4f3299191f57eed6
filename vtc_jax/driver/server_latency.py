"""Per-request latencies of a server that keeps its own record per request number (slora:
admission, first token and finish in us, and each token's time when the run asked for it:
`servers.slora.request_record`), read through
latency.request_table as a vLLM run's, so that latency.summarize / bench_serve report
them unchanged; the sweep engine adapter that keeps that record for the lanes of the
log as it is (seed 0); and such a server's capacity on the log's mix (the load line).

The record is indexed by request number (ORDER: rank in (arrival, trace row) order), the
vLLM servers' by workload row; `record_outcome` lays the one out as the other, so the
derived columns (TTFT, TPOT, E2EL, queueing delay, the ITL gaps) are computed in one place.
"""

from __future__ import annotations

import types
from typing import Callable

import numpy as np

from vtc_jax.core.rows import ORDER
from vtc_jax.driver import capacity
from vtc_jax.driver.latency import ModelEngineWrapper, request_table
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.workload import Trace, layout_trace
from vtc_jax.measures.online import MeasureConfig

# a record's per-request counts as request_table columns (a prefix cache's, a fleet's replica)
RECORD_COLUMNS = {"cached": "cached_tokens", "recomputed": "recomputed_tokens", "replica": "replica"}
Record = Callable[[object], dict]  # host server state -> {"scheduled", "first", "finish", "token_offset"}: int64[B, R]
#                                    by ORDER, "token_at": int64[B, T] (servers.slora.request_record)


def record_outcome(record: dict, trace: Trace, num_clients: int, pad: int):
    """One lane's record ({"scheduled", "first", "finish"}: int64[R'] by request number,
    R' >= len(trace); "token_at" int64[T], "token_offset" int64[R']: the per-token record,
    absent or empty without one; "preemptions" where the server keeps them) as the vLLM
    servers' Outcome of `layout_trace(trace, num_clients, pad)`: first_token, finish,
    scheduled, preemptions int64[1, rows] by workload row (-1 on padding rows; preemptions
    0 where the record has none: the server never preempts); times (TokenTimes' at
    int64[1, T] as kept, offset int64[1, rows] by workload row) or None without one."""
    rank = layout_trace(trace, num_clients, pad)[:, ORDER].astype(np.int64)
    real = rank < len(trace)

    def by_row(values) -> np.ndarray:
        out = np.full((1, len(rank)), -1, np.int64)
        out[0, real] = np.asarray(values, np.int64)[rank[real]]
        return out

    at = np.asarray(record.get("token_at", ()), np.int64)
    times = types.SimpleNamespace(at=at[None], offset=by_row(record["token_offset"])) if at.size else None
    preemptions = np.maximum(by_row(record["preemptions"]), 0) if "preemptions" in record else \
        np.zeros((1, len(rank)), np.int64)
    return types.SimpleNamespace(first_token=by_row(record["first"]), finish=by_row(record["finish"]),
                                 scheduled=by_row(record["scheduled"]), preemptions=preemptions, times=times)


def record_table(record: dict, trace: Trace, num_clients: int, arrival_us: np.ndarray) -> dict:
    """latency.request_table of one lane's record (`record_outcome`), with its counts
    (RECORD_COLUMNS) and, on a fleet, the gateway's queue time where the record has them;
    `arrival_us`: int64[N] each trace row's arrival on the lane's clock (us)."""
    from vtc_jax.driver.run import workload_pad

    pad = workload_pad()
    view = types.SimpleNamespace(server_state=types.SimpleNamespace(out=record_outcome(record, trace, num_clients, pad)))
    table = request_table(view, trace, num_clients, pad, arrival_us, 0)
    number = np.empty(len(trace), np.int64)  # each trace row's request number (rank in (arrival, row) order)
    number[np.lexsort((np.arange(len(trace)), np.asarray(trace.arrival)))] = np.arange(len(trace))
    for name, column in RECORD_COLUMNS.items():
        if name in record:
            table[column] = np.asarray(record[name], np.int64)[number]
    if "status" in record:  # a fleet's flow control: shed or rejected at the gateway (cluster_shed's codes)
        table["gateway_status"] = np.asarray(record["status"], np.int64)[number]
    if "dispatched" in record:  # a fleet's gateway: the time a request waited there (NaN: never dispatched)
        sent = np.asarray(record["dispatched"], np.int64)[number]
        table["gateway_queue_us"] = np.where(sent >= 0, (sent - np.asarray(arrival_us, np.int64)).astype(np.float64),
                                             np.nan)
    return table


def lane_record(record: Record, host_state, lane: int) -> dict:
    """Lane `lane`'s entries of the batched record of `host_state`."""
    return _lane(record(host_state), lane)


def _lane(batched: dict, lane: int) -> dict:
    return {name: values[lane] for name, values in batched.items()}


class RecordingEngine(ModelEngineWrapper):
    """The model engine (or `engine`) that also keeps, per sweep row, the server's
    per-request record of its lane with seed 0 (the log as it is:
    sources.replays_exactly), in `records` ({id(row): record}), and whether that lane
    finished (`finished`: {id(row): bool}). The run is the wrapped engine's, unchanged."""

    def __init__(self, record: Record, engine=None):
        super().__init__(engine)
        self._record, self.records, self.finished = record, {}, {}

    def run(self, rows, seeds, config, base_seed: int, mesh, progress):
        results = self._engine.run(rows, seeds, config, base_seed, mesh, progress)
        lane_of = self._lane_records(results)
        for lane, (row, seed) in enumerate(zip(rows, seeds)):
            if int(seed) == 0:
                self.records[id(row)] = lane_of(lane)
                self.finished[id(row)] = bool(results.finished[lane])
        return results

    def _lane_records(self, results) -> Callable[[int], dict]:
        """lane -> its record. The batched record is read once per run, on the first lane
        asked for (with the per-token record it holds T entries a lane)."""
        batched = []

        def lane_of(lane: int) -> dict:
            if not batched:
                batched.append(self._record(results.server_state))
            return _lane(batched[0], lane)

        return lane_of


def measure_capacity(prompt, output, settings: Settings, server: str, record: Record) -> capacity.Capacity:
    """capacity.measure for a server with its own record (`record`): the saturating lane
    of the mix (capacity.saturating_lane) in a run of its own, its rate from the record's
    finish and admission times (capacity.saturated_rate). Every request of the saturated
    trace arrives at 0, so its request number is its row."""
    from vtc_jax.driver.run import run_traces

    lane = capacity.saturating_lane(prompt, output, settings)
    result = run_traces([lane.trace], [lane.settings], num_clients=1, server=server, measures=MeasureConfig())
    times = lane_record(record, result.server_state, 0)
    n = len(lane.trace)
    rate, window, inside = capacity.saturated_rate(times["finish"][:n], times["scheduled"][:n], lane.hold)
    return capacity.Capacity(rate, float(lane.trace.prompt.mean()), float(lane.trace.output.mean()), True, n, window,
                             inside)
