"""One study, one report: the per-request latencies of every lane of a sweep (every
policy, every seed) on a server that keeps time and a per-request record, for `compare`
on any server (vtc_jax/cli/compare.py). The fairness side (drift, bound, shares, waits)
is the sweep's own (driver/sweep.py); this module adds, per lane, the table of
driver/latency.py (TTFT, TPOT, ITL, E2EL, queueing delay) and its summary, and over the
seeds each figure's mean and 95% CI (measures/stats.py).

Seed 0 replays the log exactly (sources.replays_exactly); seed s > 0 redraws each arrival
within its phase unit, so the lanes of seeds 0..S-1 are S draws of the same log and a
figure's CI says how much of it is the exact phase of the arrivals. A lane's requests are
the workload's rows, each with its request number (ORDER: its rank in the log's arrival
order, `SortedLog`); the server's record is read by request number or by workload row as
the server declares (`servers.registry.request_record`). Nothing here names a server.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.rows import ARRIVAL, ORDER, OUTPUT, PROMPT
from vtc_jax.driver.latency import ModelEngineWrapper, outcome_table, summarize
from vtc_jax.inputs.workload import Trace
from vtc_jax.measures import stats

STAMPS = {"scheduled_us": "scheduled", "first_token_us": "first", "finish_us": "finish"}


@dataclasses.dataclass(frozen=True)
class LatencyPlan:
    """What a study reads of each lane's record.

    record: host server state -> the batched per-request record (servers/base.py
      `request_record`); index: "order" (by request number) or "row" (by workload row).
    trace: the log as the lanes run it, in the file's row order (arrivals on the lane's
      clock, us; clients: the engine's clients, a (tenant, priority) pair each under
      priority scheduling). offset: int, the lane clock's lead on the log's arrival (a
      step-time model's a0, us): latencies count from arrival_us = lane arrival - offset.
    tenant_of: int64[K] each engine client's tenant; names: the tenants' names.
    slos: {"default": {metric: ms}, tenant name: {metric: ms}} (latency.parse_goodput).
    delivery: (a1, a2) us, the step-time model's delivery costs (latency.outcome_table)."""

    record: Callable
    index: str
    trace: Trace
    offset: int
    tenant_of: np.ndarray
    names: list
    slos: dict
    delivery: tuple = (0, 0)

    @property
    def by_arrival(self) -> np.ndarray:
        """int64[N]: the file-order row of each request number (the trace in (arrival,
        row) order, as sources.TraceSource keeps it: a stable sort)."""
        return np.argsort(np.asarray(self.trace.arrival), kind="stable").astype(np.int64)


CACHE_COUNTS = {"cached": "cached_tokens", "recomputed": "recomputed_tokens",  # record name -> table column
                "gpu": "gpu_time_us"}  # a server's per-request counts


def lane_table(plan: LatencyPlan, record: dict, requests: np.ndarray, first: np.ndarray, horizon: int) -> dict:
    """One lane's latency table over the log's N requests by request number
    (driver/latency.outcome_table's columns, and tenant, prompt int64[N]).

    record: the lane's entries of the server's record; requests: int64[R, fields] its
    workload rows; first: int64[K] each client's first workload row; horizon: the lane's.
    A request whose row never arrived before the horizon keeps its log values and no
    stamps (it did not finish: counted, never averaged in)."""
    perm = plan.by_arrival
    trace = plan.trace
    n = len(trace)
    arrival_us = np.asarray(trace.arrival, np.int64)[perm] - plan.offset
    client = np.asarray(trace.client, np.int64)[perm]
    prompt, output = np.asarray(trace.prompt, np.int64)[perm], np.asarray(trace.output, np.int64)[perm]
    rows = np.arange(requests.shape[0])
    real = requests[:, ARRIVAL] < horizon
    number = requests[:, ORDER]
    if real.any() and (number[real].min() < 0 or number[real].max() >= n):
        raise InputError("a lane's request numbers are not the log's (internal)")
    at_row = rows[real]
    num = number[real]
    arrival_us[num] = requests[real, ARRIVAL] - plan.offset
    client[num] = np.searchsorted(first, at_row, side="right") - 1
    prompt[num], output[num] = requests[real, PROMPT], requests[real, OUTPUT]
    where = num if plan.index == "order" else at_row  # where each present request's entry lies in the record
    stamps = {}
    for column, name in STAMPS.items():
        col = np.full(n, -1, np.int64)
        col[num] = np.asarray(record[name], np.int64)[where]
        stamps[column] = col
    preempt = np.zeros(n, np.int64)
    if "preemptions" in record:
        preempt[num] = np.asarray(record["preemptions"], np.int64)[where]
    stamps["preemptions"] = preempt
    for name, column in CACHE_COUNTS.items():  # a caching server's per-request counts
        if name in record:
            col = np.full(n, -1 if name == "cached" else 0, np.int64)  # never admitted: no cache read, no time
            col[num] = np.asarray(record[name], np.int64)[where]
            stamps[column] = col
    token = None
    at = np.asarray(record.get("token_at", ()), np.int64)
    if at.size:
        start = np.full(n, -1, np.int64)
        start[num] = np.asarray(record["token_offset"], np.int64)[where]
        whole = (start >= 0) & (start + output <= at.shape[0])
        token = (at, np.where(whole, start, -1))
    table = outcome_table(stamps, arrival_us, output, token, plan.delivery)
    table.update(tenant=np.asarray(plan.tenant_of, np.int64)[client], prompt=prompt, file_row=perm)
    return table


def lane_summary(plan: LatencyPlan, table: dict) -> dict | None:
    """latency.summarize of one lane's table per tenant, with finished_all; None when no
    request finished (the lane reports nothing to average)."""
    try:
        out = summarize(table, table["tenant"], plan.names, table["prompt"], plan.slos)
    except InputError:
        return None
    return dict(out, finished_all=bool(table["finished"].all()))


def over_seeds(summaries: list) -> dict | None:
    """Every number of the lanes' summaries (one per seed; None: nothing finished in that
    seed) as stats.summarize over the seeds ({"mean", "std", "ci95", ...}), in the same
    tree; None when no seed finished a request."""
    present = [s for s in summaries if s is not None]
    if not present:
        return None

    def walk(nodes):
        first = nodes[0]
        if isinstance(first, dict):
            return {key: walk([node.get(key) if isinstance(node, dict) else None for node in nodes]) for key in first}
        if isinstance(first, bool) or not isinstance(first, (int, float)) and first is not None:
            return first
        if all(v is None for v in nodes):
            return None
        return stats.summarize([np.nan if v is None else float(v) for v in nodes])

    return walk(present + [None] * (len(summaries) - len(present)))


class StudyEngine(ModelEngineWrapper):
    """The sweep's engine (default the model engine) that also reads, for every lane,
    its latency table from the server's record (`lane_table`) and keeps its summary
    (`summaries`: {(id(row), seed): summary or None}), seed 0's whole table (`tables`:
    {id(row): table}, the log as it is, for --requests-out) and whether each lane ran to
    its end (`finished`). The run is the wrapped engine's, unchanged."""

    def __init__(self, plan: LatencyPlan, engine=None):
        super().__init__(engine)
        self.plan, self.summaries, self.tables, self.finished = plan, {}, {}, {}

    def run(self, rows, seeds, config, base_seed: int, mesh, progress):
        from vtc_jax.driver.run import generate_workloads

        results = self._engine.run(rows, seeds, config, base_seed, mesh, progress)
        workload = generate_workloads([r.source for r in rows], list(seeds), config, base_seed)
        requests = np.asarray(workload.requests, np.int64)
        first = np.asarray(workload.first, np.int64)
        batched = self.plan.record(results.server_state)
        for lane, (row, seed) in enumerate(zip(rows, seeds)):
            record = {name: values[lane] for name, values in batched.items()}
            table = lane_table(self.plan, record, requests[lane], first[lane], row.source.horizon)
            done = bool(results.finished[lane]) and bool(table["finished"].all())
            self.summaries[(id(row), int(seed))] = lane_summary(self.plan, table)
            if int(seed) == 0:
                self.tables[id(row)] = table
                self.finished[id(row)] = done
        return results

    def per_seed(self, row, seeds: int) -> list:
        """The row's lane summaries, seed 0 first."""
        return [self.summaries.get((id(row), s)) for s in range(seeds)]


LATENCY_FIGURES = (("ttft", ("mean", "p50", "p90", "p99")), ("tpot", ("mean", "p50", "p99")),
                   ("itl", ("mean", "p50", "p99")), ("e2el", ("mean", "p50", "p99")), ("queue", ("mean", "p99")))


def latency_metrics(summaries: list, tenants) -> dict:
    """Sweep-row metrics (stats.summarize over the seeds, as every metric of results.json's
    rows and results.csv) of the lanes' summaries (one per seed; None: nothing finished):
    `ttft_p99_ms[all]`, `ttft_p99_ms[TENANT]`, ... for LATENCY_FIGURES, and per group
    `goodput[...]` (requests/s), `output_tokens_per_s[...]`, `unfinished[...]` (requests)."""
    out = {}
    for group in ["all", *tenants]:
        def pick(s, group=group):
            return None if s is None else (s["overall"] if group == "all" else s["tenants"][group])

        values = [pick(s) for s in summaries]
        for metric, quantities in LATENCY_FIGURES:
            for q in quantities:
                out[f"{metric}_{q}_ms[{group}]"] = stats.summarize(
                    [np.nan if v is None or v[metric][q] is None else v[metric][q] for v in values])
        for name in ("goodput", "output_tokens_per_s", "unfinished", "gpu_share"):
            if name == "gpu_share" and not any(v is not None and name in v for v in values):
                continue  # no time shares kept
            out[f"{name}[{group}]"] = stats.summarize([np.nan if v is None or v.get(name) is None else v[name]
                                                       for v in values])
    return out
