"""Per-request latencies of a timed run, and the numbers `vllm bench serve` prints.

From a timed server's per-request record (first token and finish times, in us on the
lane's clock, `LaneResults.server_state.out`) and each request's own arrival (before the
step-time model's queueing delay a0): per request TTFT = first token - arrival, E2EL =
finish - arrival, TPOT = (E2EL - TTFT) / (output - 1) (requests of one token have none),
queueing delay = first scheduled - arrival. Per tenant and overall: mean, median (p50),
p90, p99 (numpy's linear interpolation, as vLLM's benchmark), in ms; throughput in tokens/s
over the run (first arrival to last finish); goodput in vLLM's form: requests per second
that meet every SLO given (`ttft:500 tpot:50`, ms). All exact from the per-request record:
no histogram, no error bound needed. A request that did not finish is counted as such and
never averaged in.
"""

from __future__ import annotations

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs.workload import Trace, trace_rows

METRICS = ("ttft", "tpot", "e2el", "queue")
SLO_METRICS = ("ttft", "tpot", "e2el")
PERCENTILES = (50, 90, 99)


def parse_goodput(items) -> dict[str, float]:
    """`ttft:500 tpot:50` (ms) -> {"ttft": 500.0, "tpot": 50.0}; one InputError per bad item."""
    slos = {}
    for item in items or ():
        name, sep, value = str(item).partition(":")
        if not sep or name not in SLO_METRICS:
            raise InputError(f"--goodput {item!r}: need NAME:MS with NAME one of {', '.join(SLO_METRICS)}")
        try:
            ms = float(value)
        except ValueError:
            raise InputError(f"--goodput {item!r}: {value!r} is not a number of ms") from None
        if not np.isfinite(ms) or ms <= 0:
            raise InputError(f"--goodput {item!r}: the SLO must be a positive number of ms")
        slos[name] = ms
    return slos


def request_table(result, trace: Trace, num_clients: int, pad: int, arrival_us: np.ndarray, lane: int = 0) -> dict:
    """Per trace row (int64 / float64 arrays of N): arrival_us, first_token_us, finish_us,
    scheduled_us (-1: never), ttft_us, tpot_us, e2el_us, queue_us (NaN where undefined),
    output, preemptions, finished (bool)."""
    out = result.server_state.out
    rows = trace_rows(trace, num_clients, pad)
    n = len(trace)
    fields = {"first_token_us": out.first_token, "finish_us": out.finish, "scheduled_us": out.scheduled,
              "preemptions": out.preemptions}
    table = {}
    for name, values in fields.items():
        col = np.full(n, -1, np.int64)
        v = np.asarray(values, np.int64)[lane][:len(rows)]  # a batch of other traces may pad the lane's rows
        live = rows >= 0
        col[rows[live]] = v[live]
        table[name] = col
    arrival = np.asarray(arrival_us, np.int64)
    finished = table["finish_us"] >= 0
    output = np.asarray(trace.output, np.int64)

    def since(col):
        return np.where(col >= 0, (col - arrival).astype(np.float64), np.nan)

    ttft, e2el = since(table["first_token_us"]), since(table["finish_us"])
    tpot = np.where(finished & (output > 1), (e2el - ttft) / np.maximum(output - 1, 1), np.nan)
    table.update(arrival_us=arrival, ttft_us=ttft, tpot_us=tpot, e2el_us=e2el, queue_us=since(table["scheduled_us"]),
                 output=output, finished=finished)
    return table


def _stats(values_us: np.ndarray) -> dict:
    v = values_us[np.isfinite(values_us)] / 1000.0
    if v.size == 0:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    return {"mean": float(v.mean()), **{f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES}}


def summarize(table: dict, tenant: np.ndarray, tenants, prompt: np.ndarray, slos: dict) -> dict:
    """{"overall": {...}, "tenants": {name: {...}}}: per group the request counts, each
    metric's mean/p50/p90/p99 in ms, throughput and goodput per second, preemptions."""
    finished = table["finished"]
    if not finished.any():
        raise InputError("no request finished: nothing to summarize (run longer)")
    start = int(table["arrival_us"].min())
    end = int(table["finish_us"][finished].max())
    seconds = max(end - start, 1) / 1e6
    good = finished.copy()
    for name, ms in slos.items():
        v = table[f"{name}_us"]
        good &= np.where(np.isfinite(v), v <= ms * 1000.0, name == "tpot")  # a 1-token request has no TPOT

    def group(mask):
        done = mask & finished
        return {"requests": int(mask.sum()), "finished": int(done.sum()),
                **{name: _stats(np.where(done, table[f"{name}_us"], np.nan)) for name in METRICS},
                "output_tokens_per_s": float(table["output"][done].sum() / seconds),
                "total_tokens_per_s": float((table["output"][done] + prompt[done]).sum() / seconds),
                "request_throughput": float(done.sum() / seconds),
                "goodput": float((good & mask).sum() / seconds) if slos else None,
                "preemptions": int(table["preemptions"][mask].sum())}

    return {"duration_s": seconds, "slos_ms": slos, "overall": group(np.ones_like(finished)),
            "tenants": {name: group(tenant == k) for k, name in enumerate(tenants)}}
