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
never averaged in. ITL (inter-token latency, vLLM's): every gap between successive output
tokens of a finished request, pooled; its mean is exact from the per-request record
(`_itl_mean`), its percentiles from the server's per-token record (`out.times`, kept when
the run's server options ask for `token_times`: `token_record`), else None.
"""

from __future__ import annotations

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.engines.cluster_shed import REJECTED, SHED
from vtc_jax.inputs.workload import Trace, trace_rows

METRICS = ("ttft", "tpot", "e2el", "queue")
SLO_METRICS = ("ttft", "tpot", "e2el")
PERCENTILES = (50, 90, 99)


DEFAULT_SLO = "*"  # the key of the SLOs of every tenant not named (per-tenant --goodput)


def parse_goodput(items) -> dict:
    """`ttft:500 tpot:50` (ms) -> {"ttft": 500.0, "tpot": 50.0}; with per-tenant items,
    `chat:ttft:500 batch:e2el:120000 ttft:800` -> {"chat": {"ttft": 500.0}, "batch":
    {"e2el": 120000.0}, "*": {"ttft": 800.0}} (a named tenant meets its own SLOs, every
    other tenant the unnamed ones, DEFAULT_SLO); one InputError per bad item."""
    slos: dict = {}
    for item in items or ():
        parts = str(item).split(":")
        tenant = ":".join(parts[:-2]) if len(parts) > 2 else DEFAULT_SLO
        name, value = (parts[-2], parts[-1]) if len(parts) >= 2 else (parts[0], None)
        if value is None or name not in SLO_METRICS or (len(parts) > 2 and not tenant):
            raise InputError(f"--goodput {item!r}: need NAME:MS or TENANT:NAME:MS with NAME one of "
                             f"{', '.join(SLO_METRICS)}")
        try:
            ms = float(value)
        except ValueError:
            raise InputError(f"--goodput {item!r}: {value!r} is not a number of ms") from None
        if not np.isfinite(ms) or ms <= 0:
            raise InputError(f"--goodput {item!r}: the SLO must be a positive number of ms")
        slos.setdefault(tenant, {})[name] = ms
    if set(slos) <= {DEFAULT_SLO}:
        return slos.get(DEFAULT_SLO, {})  # vLLM's form: one set for every request
    return slos


def per_tenant(slos: dict) -> bool:
    """Whether `slos` (parse_goodput's) names tenants."""
    return any(isinstance(v, dict) for v in slos.values())


def slos_of(slos: dict, tenant: str) -> dict:
    """The SLOs tenant `tenant` meets: its own where --goodput named it, else the default ones."""
    if not per_tenant(slos):
        return slos
    return slos.get(tenant, slos.get(DEFAULT_SLO, {}))


def check_slo_tenants(slos: dict, tenants) -> None:
    """Refuse a per-tenant SLO that names no tenant of the log (one line)."""
    unknown = sorted(set(slos) - set(tenants) - {DEFAULT_SLO}) if per_tenant(slos) else []
    if unknown:
        raise InputError(f"--goodput names tenant {unknown[0]!r}, which the log does not have (its tenants: "
                         f"{', '.join(list(tenants)[:8])}{'...' if len(tenants) > 8 else ''})")


def token_record(result, trace: Trace, num_clients: int, pad: int, lane: int = 0) -> tuple | None:
    """The server's per-token record of one lane (servers/base.py TokenTimes) per trace row:
    (at int64[T]: token times, first int64[N]: where each row's tokens start in `at`, -1 for
    a row without a whole record: never admitted, or past the record's T entries), or None
    when the run kept none (its server options asked for no `token_times`)."""
    times = getattr(result.server_state.out, "times", None)
    if times is None or np.asarray(times.at).shape[-1] == 0:
        return None
    at = np.asarray(times.at, np.int64)[lane]
    rows = trace_rows(trace, num_clients, pad)
    offset = np.asarray(times.offset, np.int64)[lane][:len(rows)]
    first = np.full(len(trace), -1, np.int64)
    live = rows >= 0
    first[rows[live]] = offset[live]
    whole = (first >= 0) & (first + np.asarray(trace.output, np.int64) <= at.shape[0])
    return at, np.where(whole, first, -1)


def _itl_gaps(record: tuple, output: np.ndarray, finished: np.ndarray) -> tuple:
    """(gaps int64[G]: token g+1's time - token g's, us, row int64[G]: whose) over every
    finished request, in row order; (None, None) without a whole record of each."""
    at, first = record
    if (finished & (first < 0)).any():
        return None, None
    rows = np.flatnonzero(finished & (output > 1))
    counts = output[rows] - 1
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)  # g per gap
    pos = np.repeat(first[rows], counts) + within + 1
    return at[pos] - at[pos - 1], np.repeat(rows, counts)


def request_table(result, trace: Trace, num_clients: int, pad: int, arrival_us: np.ndarray, lane: int = 0,
                  delivery: tuple = (0, 0)) -> dict:
    """Per trace row (int64 / float64 arrays of N): arrival_us, first_token_us, finish_us,
    scheduled_us (-1: never), ttft_us, tpot_us, e2el_us, queue_us (NaN where undefined),
    output, preemptions, finished (bool); and the pooled ITL gaps of finished requests,
    itl_us int64[G] and itl_row int64[G] (`_itl_gaps`; None without a per-token record)."""
    out = result.server_state.out
    rows = trace_rows(trace, num_clients, pad)
    n = len(trace)
    fields = {"first_token_us": out.first_token, "finish_us": out.finish, "scheduled_us": out.scheduled,
              "preemptions": out.preemptions}
    if getattr(out, "gpu_us", None) is not None:  # each request's share of the steps' time (servers' Outcome)
        fields["gpu_time_us"] = out.gpu_us
    table = {}
    for name, values in fields.items():
        col = np.full(n, 0 if name == "gpu_time_us" else -1, np.int64)
        v = np.asarray(values, np.int64)[lane][:len(rows)]  # a batch of other traces may pad the lane's rows
        live = rows >= 0
        col[rows[live]] = v[live]
        table[name] = col
    return outcome_table(table, arrival_us, trace.output, token_record(result, trace, num_clients, pad, lane), delivery)


def outcome_table(stamps: dict, arrival_us: np.ndarray, output: np.ndarray, record: tuple | None,
                  delivery: tuple = (0, 0)) -> dict:
    """`request_table`'s columns from per-request stamps ({"first_token_us", "finish_us",
    "scheduled_us", "preemptions"}: int64[N], -1: never), arrivals int64[N] (us), output
    lengths int64[N] and the per-token record (at int64[T], first int64[N]; None: none).
    delivery: (a1, a2) us, a step-time model's delivery costs (BLIS's counting): the first
    token reaches the client a2 after its step ends, a finished request a2 x output + a1
    after its last step (TTFT and E2EL count them; ITL's gaps are the steps')."""
    table = dict(stamps)
    arrival = np.asarray(arrival_us, np.int64)
    finished = table["finish_us"] >= 0
    output = np.asarray(output, np.int64)
    a1, a2 = delivery
    if a1 or a2:
        first = table["first_token_us"]
        table["first_token_us"] = np.where(first >= 0, first + a2, first)
        table["finish_us"] = np.where(finished, table["finish_us"] + a2 * output + a1, table["finish_us"])

    def since(col):
        return np.where(col >= 0, (col - arrival).astype(np.float64), np.nan)

    ttft, e2el = since(table["first_token_us"]), since(table["finish_us"])
    tpot = np.where(finished & (output > 1), (e2el - ttft) / np.maximum(output - 1, 1), np.nan)
    table.update(arrival_us=arrival, ttft_us=ttft, tpot_us=tpot, e2el_us=e2el, queue_us=since(table["scheduled_us"]),
                 output=output, finished=finished)
    table["itl_us"], table["itl_row"] = (None, None) if record is None else _itl_gaps(record, output, finished)
    return table


def _stats(values_us: np.ndarray) -> dict:
    v = values_us[np.isfinite(values_us)] / 1000.0
    if v.size == 0:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    return {"mean": float(v.mean()), **{f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES}}


def _itl_mean(table: dict, done: np.ndarray) -> float | None:
    """vLLM's mean ITL (ms): the gaps between successive output tokens pooled over every
    finished request, sum(E2EL - TTFT) / sum(output - 1) (each request's gaps add up to
    its E2EL - TTFT); None without a second token."""
    many = done & (table["output"] > 1)
    gaps = int((table["output"][many] - 1).sum())
    return float((table["e2el_us"][many] - table["ttft_us"][many]).sum() / gaps / 1000.0) if gaps else None


def _itl_ms(table: dict, done: np.ndarray) -> np.ndarray | None:
    """float64[G]: the pooled ITL gaps (ms) of the requests `done`; None without a per-token record."""
    if table.get("itl_us") is None:
        return None
    return table["itl_us"][done[table["itl_row"]]] / 1000.0


def _itl_stats(table: dict, done: np.ndarray) -> dict:
    """ITL's mean (exact, `_itl_mean`) and p50/p90/p99 (numpy's linear interpolation over
    the pooled gaps, as `_stats`; None without a per-token record or a second token)."""
    gaps, mean = _itl_ms(table, done), _itl_mean(table, done)
    known = gaps is not None and gaps.size > 0
    return {"mean": mean, **{f"p{q}": float(np.percentile(gaps, q)) if known else None for q in PERCENTILES}}


def summarize(table: dict, tenant: np.ndarray, tenants, prompt: np.ndarray, slos: dict) -> dict:
    """{"overall": {...}, "tenants": {name: {...}}}: per group the request counts (requests,
    finished, unfinished: counted, never averaged in), each metric's mean/p50/p90/p99 in ms,
    throughput and goodput per second (the requests that meet their tenant's SLOs:
    `slos_of`), preemptions."""
    finished = table["finished"]
    if not finished.any():
        raise InputError("no request finished: nothing to summarize (run longer)")
    shed, rejected = gateway_drops(table)
    start = int(table["arrival_us"].min())
    end = int(table["finish_us"][finished].max())
    seconds = max(end - start, 1) / 1e6
    good = finished.copy()
    for k, who in enumerate(tenants):
        mine = tenant == k
        for name, ms in slos_of(slos, who).items():
            v = table[f"{name}_us"][mine]
            good[mine] &= np.where(np.isfinite(v), v <= ms * 1000.0, name == "tpot")  # a 1-token request has no TPOT

    def group(mask):
        done = mask & finished
        return {"requests": int(mask.sum()), "finished": int(done.sum()),
                "unfinished": int((mask & ~finished & ~shed & ~rejected).sum()),
                "shed": int((mask & shed).sum()), "rejected": int((mask & rejected).sum()),
                **{name: _stats(np.where(done, table[f"{name}_us"], np.nan)) for name in METRICS},
                "output_tokens_per_s": float(table["output"][done].sum() / seconds),
                "total_tokens_per_s": float((table["output"][done] + prompt[done]).sum() / seconds),
                "request_throughput": float(done.sum() / seconds),
                "goodput": float((good & mask).sum() / seconds) if slos else None,
                "preemptions": int(table["preemptions"][mask].sum()), "itl_mean": _itl_mean(table, done),
                "itl": _itl_stats(table, done), **_cache_counts(table, mask, prompt), **_gpu_time(table, mask)}

    return {"duration_s": seconds, "slos_ms": slos, "overall": group(np.ones_like(finished)),
            "tenants": {name: group(tenant == k) for k, name in enumerate(tenants)}}



def gateway_drops(table: dict) -> tuple[np.ndarray, np.ndarray]:
    """(shed, rejected) bool[N]: the requests a fleet gateway's flow control shed at its TTL
    or rejected at its band capacity (table["gateway_status"]; none without it). Neither
    ever finishes: each is counted as such, never averaged in nor counted unfinished."""
    status = table.get("gateway_status")
    if status is None:
        none = np.zeros(len(table["finished"]), bool)
        return none, none
    return status == SHED, status == REJECTED


def _gpu_time(table: dict, mask: np.ndarray) -> dict:
    """Where the server kept each request's share of the steps' time (gpu_time_us:
    step_time.slot_shares): the group's GPU time in s and its share of all requests'; {}
    otherwise. Every request counts, finished or not: the time was spent."""
    if "gpu_time_us" not in table:
        return {}
    total = int(table["gpu_time_us"].sum())
    mine = int(table["gpu_time_us"][mask].sum())
    return {"gpu_time_s": mine / 1e6, "gpu_share": mine / total if total else None}


def _cache_counts(table: dict, mask: np.ndarray, prompt: np.ndarray) -> dict:
    """With a prefix cache (the table's cached_tokens: -1 never admitted): prompt tokens
    served from cache at first admission, the hit rate over the admitted requests' prompt
    tokens, tokens recomputed after preemptions; {} without one."""
    if "cached_tokens" not in table:
        return {}
    admitted = mask & (table["cached_tokens"] >= 0)
    cached, sent = int(table["cached_tokens"][admitted].sum()), int(prompt[admitted].sum())
    return {"cached_tokens": cached, "prefix_cache_hit_rate": cached / sent if sent else None,
            "recomputed_tokens": int(table["recomputed_tokens"][mask].sum())}


BENCH_METRICS = ("ttft", "tpot", "itl", "e2el")  # vllm bench serve's --percentile-metrics names


def _bench_metric(name: str, values_ms: np.ndarray | None, mean_ms: float | None = None) -> dict:
    """`mean_/median_/std_/pNN_{name}_ms` as `vllm bench serve` names them (np.std: ddof
    0, as it uses). `mean_ms`: the exact mean where known (ITL's `_itl_mean`: the integer
    gaps' sum over their count, rounded once, where np.mean of the ms values may differ in
    the last bit); `values_ms` None: only the mean is known (ITL without a per-token
    record), the rest are None."""
    keys = ["mean", "median", "std"] + [f"p{q}" for q in PERCENTILES]
    if values_ms is None:
        return {f"{k}_{name}_ms": (mean_ms if k == "mean" else None) for k in keys}
    if values_ms.size == 0:
        return {f"{k}_{name}_ms": None for k in keys}
    got = [values_ms.mean() if mean_ms is None else mean_ms, np.median(values_ms), values_ms.std()] + [
        np.percentile(values_ms, q) for q in PERCENTILES]
    return {f"{k}_{name}_ms": float(v) for k, v in zip(keys, got)}


def bench_serve(table: dict, tenant: np.ndarray, tenants, prompt: np.ndarray, slos: dict) -> dict:
    """The summary in `vllm bench serve --save-result`'s names (`completed`,
    `request_throughput`, `request_goodput`, `output_throughput`, `total_token_throughput`,
    `mean_ttft_ms`, `median_ttft_ms`, `std_ttft_ms`, `p99_ttft_ms`, ..., for ttft, tpot,
    itl, e2el), overall and per tenant, over the same finished requests and duration as
    `summarize`; ITL over the pooled gaps between tokens (its mean only, the rest None,
    where the run kept no per-token record). Also `num_prompts`, `failed` (requests that
    never finished: vLLM's benchmark counts them as unsuccessful too; a fleet's shed and
    rejected requests among them), `shed`, `rejected` (a fleet gateway's flow control: 0
    elsewhere) and `preemptions`."""
    base = summarize(table, tenant, tenants, prompt, slos)
    finished = table["finished"]

    def group(mask, summary):
        done = mask & finished
        out = {"num_prompts": int(mask.sum()), "completed": int(done.sum()), "failed": int((mask & ~finished).sum()),
               "duration": base["duration_s"], "total_input_tokens": int(prompt[done].sum()),
               "total_output_tokens": int(table["output"][done].sum()),
               "request_throughput": summary["request_throughput"], "request_goodput": summary["goodput"],
               "output_throughput": summary["output_tokens_per_s"], "total_token_throughput": summary["total_tokens_per_s"],
               "shed": summary["shed"], "rejected": summary["rejected"], "preemptions": summary["preemptions"],
               **{k: summary[k] for k in ("cached_tokens", "prefix_cache_hit_rate", "recomputed_tokens") if k in summary}}
        for name in BENCH_METRICS:
            if name == "itl":
                out.update(_bench_metric(name, _itl_ms(table, done), summary["itl_mean"]))
            else:
                v = table[f"{name}_us"][done]
                out.update(_bench_metric(name, v[np.isfinite(v)] / 1000.0))
        return out

    return {"slos_ms": slos, "percentiles": list(PERCENTILES), **group(np.ones_like(finished), base["overall"]),
            "tenants": {name: group(tenant == k, base["tenants"][name]) for k, name in enumerate(tenants)}}

# ---- per-tenant TTFT in a sweep of generated workloads ----------------------------------

class RequestTimes:
    """A chunk's LaneResults (every attribute) plus each lane's requests as generated:
    arrival, client (int64[B, R] per workload row; arrival -1 where no request arrived
    before the horizon) and horizon (int64[B]), for metrics that read the server's
    per-request record (`server_state.out`)."""

    def __init__(self, results, arrival: np.ndarray, client: np.ndarray, horizon: np.ndarray):
        self._results, self.arrival, self.client, self.horizon = results, arrival, client, horizon

    def __getattr__(self, name):
        return getattr(self._results, name)


class ModelEngineWrapper:
    """A sweep engine adapter (driver/sweep.py; default the MODEL.md engine's) under
    another object: everything but `run` is the wrapped engine's, so a subclass's `run`
    reads more from the same run."""

    def __init__(self, engine=None):
        if engine is None:
            from vtc_jax.driver.sweep import MODEL_ENGINE  # sweep imports this module

            engine = MODEL_ENGINE
        self._engine, self.name = engine, engine.name
        for method in ("group_key", "config", "lane_bytes", "steps"):
            setattr(self, method, getattr(engine, method))


class RequestTimesEngine(ModelEngineWrapper):
    """The model engine whose results also carry each lane's generated requests
    (`RequestTimes`): they are generated again from the same seeds (a lane's requests
    depend only on its seed and source), so the run is unchanged."""

    def run(self, rows, seeds, config, base_seed: int, mesh, progress):
        from vtc_jax.core.rows import ARRIVAL
        from vtc_jax.driver.run import generate_workloads

        results = self._engine.run(rows, seeds, config, base_seed, mesh, progress)
        workload = generate_workloads([r.source for r in rows], list(seeds), config, base_seed)
        requests = np.asarray(workload.requests, np.int64)
        first = np.asarray(workload.first, np.int64)
        horizon = np.asarray([r.source.horizon for r in rows], np.int64)
        arrival = requests[:, :, ARRIVAL]
        arrival = np.where(arrival < horizon[:, None], arrival, -1)
        index = np.arange(requests.shape[1])
        client = np.stack([np.searchsorted(f, index, side="right") - 1 for f in first])
        return RequestTimes(results, arrival, client, horizon)


def lane_ttft(results: RequestTimes, num_clients: int, offset: int, scale: float) -> dict:
    """Per lane and tenant from the server's first-token record: TTFT of every request
    that arrived = (first token - arrival + offset) * scale; returns float64[B, K]
    ttft_p99 (NaN: no first token in the tenant), float64[B] ttft_p99 over all tenants,
    float64[B, K] no_first_token (the fraction of a tenant's arrived requests without a
    first token by the horizon; NaN: none arrived), float64[B] no_first_token_all."""
    first = np.asarray(results.server_state.out.first_token, np.int64)[:, :results.arrival.shape[1]]
    arrived = results.arrival >= 0
    got = arrived & (first >= 0)
    ttft = np.where(got, (first - results.arrival + offset) * scale, np.nan)
    b = ttft.shape[0]
    per, missing, overall = np.full((b, num_clients), np.nan), np.full((b, num_clients), np.nan), np.full(b, np.nan)
    for i in range(b):
        if got[i].any():
            overall[i] = np.percentile(ttft[i, got[i]], 99)
        for k in range(num_clients):
            mine = results.client[i] == k
            if (got[i] & mine).any():
                per[i, k] = np.percentile(ttft[i, got[i] & mine], 99)
            if (arrived[i] & mine).any():
                missing[i, k] = 1.0 - (got[i] & mine).sum() / (arrived[i] & mine).sum()
    all_missing = 1.0 - got.sum(axis=1) / np.maximum(arrived.sum(axis=1), 1)
    return {"ttft_p99": per, "ttft_p99_all": overall, "no_first_token": missing,
            "no_first_token_all": np.where(arrived.any(axis=1), all_missing, np.nan)}
