"""The timed side of a study (cli/study_plan.py, `compare` on a server that keeps time):
step-time models (`--preset NAME | --step-time FILE` for a server that takes one: arrivals
are the log's timestamps in exact microseconds, no --step-seconds), and the latency report
per tenant, as `vllm bench serve` reports it: TTFT, TPOT, ITL, E2EL and queueing delay in ms
(mean, p50, p90, p99; with --seeds S > 1 each as mean and 95% CI over the seeds),
throughput, goodput (`--goodput ttft:500 tpot:50`), preemptions, requests that did not
finish; `--requests-out FILE.csv` one row per request; each tenant's TTFT distribution
(ttft_cdf.png). ITL's percentiles come from each token's time, which the server keeps for
the run (`token_times_option`)."""

from __future__ import annotations

import csv
import dataclasses
import io
import sys

import numpy as np

from vtc_jax.cli import input_flags
from vtc_jax.cli.server_flags import server_options
from vtc_jax.core.errors import InputError
from vtc_jax.driver import capacity
from vtc_jax.driver.latency import DEFAULT_SLO, PERCENTILES, gateway_drops, per_tenant
from vtc_jax.servers import registry as servers
from vtc_jax.servers import step_time

RECORD_BYTES = 1 << 30  # the most memory the per-token record (ITL percentiles) may take, every lane together
H100_DEFAULTS = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}  # vLLM's server defaults on H100/H200
REQUEST_COLUMNS = ("row", "tenant", "arrival_us", "scheduled_us", "first_token_us", "finish_us", "ttft_us", "tpot_us",
                   "e2e_us", "prompt", "output", "preemptions")
CACHE_COLUMNS = ("cached_tokens", "recomputed_tokens")  # with prefix caching (vLLM's name: cached_tokens)
GPU_COLUMNS = ("gpu_time_us",)  # each request's share of the steps' time (where kept: step_time.slot_shares)
FLEET_COLUMNS = ("replica", "gateway_queue_us", "status")  # on a cluster: where it ran, how long it waited at the
#                                                             gateway, finished / shed / rejected / unfinished


def read_timed_log(args):
    """The requests of any timed input of the reader layer (a trace in steps is refused:
    a timed server needs times)."""
    log = input_flags.read_input(args, "log")
    if not log.timed:
        raise InputError(f"{args.log}: a trace in steps has no times; a timed server (--server {args.server}) "
                         "needs timestamps (a timestamped log or a public trace format: --format)")
    return log


def note_unused_columns(log, server: str, shares: bool) -> None:
    """A note when the log has content columns the run does not use."""
    unused = sorted(log.columns & {"cached"} | (log.columns & {"prefix_id", "prefix_len"} if not shares else set()))
    if unused:
        print(f"note: the log's {', '.join(unused)} column(s) are not used by --server {server} (vLLM computes "
              "prefix hits itself" + ("; give --enable-prefix-caching to share the logged prefixes)" if
                                      not shares else ")"), file=sys.stderr)


MODEL_FLAGS = ("preset", "step_time", "roofline")  # the ways to give a step-time model


def model_given(args) -> bool:
    """Whether the flags give a step-time model (any of MODEL_FLAGS)."""
    return any(getattr(args, f, None) for f in MODEL_FLAGS)


def model_of(args) -> step_time.StepTime:
    """The step-time model of --preset NAME, --step-time FILE.json or --roofline MODEL (one
    of the three; --roofline's --gpu, --tensor-parallel-size, --roofline-efficiency and
    --gpu-memory-utilization only with it)."""
    given = [f for f in MODEL_FLAGS if getattr(args, f, None)]
    if len(given) > 1:
        raise InputError(f"give one of --preset, --step-time, --roofline, not --{given[0].replace('_', '-')} and "
                         f"--{given[1].replace('_', '-')}")
    own = ("gpu", "tensor_parallel_size", "roofline_efficiency", "gpu_memory_utilization")  # --roofline's flags
    extra = [f for f in own if getattr(args, f, None) is not None]
    if extra and given != ["roofline"]:
        raise InputError(f"--{extra[0].replace('_', '-')} applies to --roofline MODEL")
    if args.preset:
        return step_time.preset(args.preset)
    if args.step_time:
        return step_time.read_step_time(args.step_time)
    if getattr(args, "roofline", None):
        from vtc_jax.servers import roofline

        shape, gpu = roofline.model_shape(args.roofline), roofline.gpu(args.gpu)
        text = args.roofline_efficiency or "1,1"
        parts = text.split(",")
        if len(parts) != 2:
            raise InputError(f"--roofline-efficiency: expected COMPUTE,MEMORY (e.g. 0.5,0.8), got {text[:40]!r}")
        tp = args.tensor_parallel_size or 1
        return roofline.roofline_model(shape, gpu, parts[0].strip(), parts[1].strip(), tp,
                                       getattr(args, "block_size", None) or 16, args.gpu_memory_utilization or "0.9")
    raise InputError(f"compare --server {args.server} needs a step-time model: --preset NAME (e.g. "
                     f"{next(iter(step_time.presets()))}), --step-time FILE.json or --roofline MODEL")


def server_settings(args, model: step_time.StepTime) -> dict:
    options = dict(server_options(args))
    own = servers.get(args.server).model_options
    if own is not None:  # a server that fills its own settings from the model (its KV pool)
        return own(model, options)
    if "num_gpu_blocks" not in options:
        if model.num_gpu_blocks is None:
            raise InputError(f"step-time model {model.name} names no KV pool: give --num-gpu-blocks")
        options["num_gpu_blocks"] = model.num_gpu_blocks
    if "h100" in model.name or "h200" in model.name:
        for name, value in H100_DEFAULTS.items():
            options.setdefault(name, value)
    model.check(options.get("max_num_batched_tokens", 2048), options.get("max_num_seqs", 256))
    return options


def load_report(cap: capacity.Capacity | str, arrival_us: np.ndarray, cluster: dict | None = None) -> dict:
    """The log's offered rate (requests over the span of its arrivals) against the
    server's capacity measured on the log's own mix (driver/capacity.py). On a `cluster`
    (its "replicas" R, those of the server "server"): against R x that capacity, what
    the replicas sustain together when every one is kept busy (the figure an operator
    sizes a fleet by; routing can only lose from it), with one replica's beside it. `cap`
    a string: why the capacity could not be measured (the line says so; no load figure)."""
    n = len(arrival_us)
    span_s = float(arrival_us.max() - arrival_us.min()) / 1e6
    if isinstance(cap, str):
        offered = f"offers {n / span_s:.4g} requests/s" if span_s > 0 else "arrives at once"
        return {"requests": n, "arrival_span_s": span_s, "offered_requests_per_s": n / span_s if span_s > 0 else None,
                "capacity": None, "offered_load": None,
                "line": f"load: the log ({n} requests over {span_s:.4g} s) {offered}; the server's capacity on this "
                        f"mix was not measured ({cap})"}
    whose, basis, out = "the server's", "measured capacity on this mix", {}
    if cluster is not None:
        r = int(cluster["replicas"])
        whose = "the cluster's"
        basis = (f"capacity on this mix ({r} replica(s) x one {cluster['server']} server's measured capacity; an upper "
                 "bound: routing can only lose from it)")
        out = {"replicas": r, "replica_capacity": cap.to_json()}
        cap = dataclasses.replace(cap, requests_per_unit=cap.requests_per_unit * r)
    rate = {key: value for key, value in cap.to_json().items()  # a cluster's saturated run is its replica's
            if cluster is None or key not in ("saturated_requests", "window", "completions")}
    out = {"requests": n, "arrival_span_s": span_s, "offered_requests_per_s": n / span_s if span_s > 0 else None,
           "capacity": rate, **out}
    if span_s > 0:
        return dict(out, offered_load=capacity.offered_load(n / span_s, cap),
                    line=capacity.offered_line(n / span_s, cap, f"the log ({n} requests over {span_s:.4g} s)", whose,
                                               basis))
    return dict(out, offered_load=None, line=f"load: the log's {n} requests all arrive at once (no rate); {whose} "
                                             f"{basis} is {cap.describe()}")


def token_times_option(output: np.ndarray, lanes: int) -> dict:
    """{"token_times": T}, T the log's output tokens: each lane keeps every token's time
    (int32, 4 T bytes a lane, servers/base.py TokenTimes), for ITL's exact percentiles.
    Past RECORD_BYTES over the lanes: {} and a note (ITL then has its exact mean only)."""
    tokens = int(np.asarray(output, np.int64).sum())
    if 4 * tokens * lanes <= RECORD_BYTES:
        return {"token_times": tokens}
    print(f"note: ITL percentiles need every token's time: {tokens} output tokens x {lanes} policies take "
          f"{4 * tokens * lanes / 2**30:.1f} GiB, past {RECORD_BYTES / 2**30:g} GiB; only ITL's mean is reported",
          file=sys.stderr)
    return {}


def _with_budget(args, memory: int):
    import argparse

    return argparse.Namespace(**{**vars(args), "kv_budget": memory})


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


COLUMNS = (("TTFT p50", "ttft", "p50"), ("TTFT p99", "ttft", "p99"), ("TPOT p50", "tpot", "p50"),
           ("TPOT p99", "tpot", "p99"), ("ITL p50", "itl", "p50"), ("ITL p99", "itl", "p99"), ("E2EL p99", "e2el", "p99"),
           ("queue p99", "queue", "p99"))  # the table's columns in ms: (label, metric, percentile)


def _cell(value, spread: dict | None) -> str:
    """A table cell in ms: the value, or with a spread over seeds its mean +- the 95% CI's half width."""
    if spread is None:
        return _ms(value)
    if not isinstance(spread, dict) or spread.get("mean") is None:
        return "n/a"
    lo, hi = spread["ci95"]
    return f"{spread['mean']:.1f}+-{(hi - lo) / 2:.1f}"


def _reqs(g: dict) -> str:
    """Finished requests, "F of N" when some did not finish."""
    return str(g["finished"]) if g["finished"] == g["requests"] else f"{g['finished']} of {g['requests']}"


def format_report(report: dict, names) -> str:
    """The latency table: per policy and tenant (and "all") the finished requests ("F of N"
    when some did not), each COLUMNS figure in ms (with --seeds S > 1: mean +- the 95% CI's
    half width over the seeds), output tokens/s, goodput, preemptions; a NOT FINISHED line
    per policy with requests left, naming each tenant's count."""
    c = report.get("cluster")  # a cluster's replicas (slora_compare.report)
    where = (f" at each of {c['replicas']} replica(s) behind {c['routers']} router(s) running {c['gateway_policy']}"
             if c else "")
    head = (f"server {report['server']}{where}, step time {report['step_time']}; "
            + ", ".join(f"{k} {v}" for k, v in report["settings"].items() if not k.startswith("time_")))
    seeds = report.get("seeds", 1)
    spread_of = report.get("over_seeds") or {}
    width = max([6, len("tenant")] + [len(str(n)) for n in names])  # the longest name, never cut
    pol = max([6] + [len(p) for p in report["policies"]])
    rows = []
    for policy, summary in report["policies"].items():
        spread = spread_of.get(policy)
        groups = [(name, summary["tenants"][name], (spread or {}).get("tenants", {}).get(name)) for name in names]
        groups.append(("all", summary["overall"], (spread or {}).get("overall")))
        for name, g, sg in groups:
            goodput = "n/a" if g["goodput"] is None else f"{g['goodput']:.2f}"
            cells = [_cell(g[metric][q], None if sg is None else (sg.get(metric) or {}).get(q)) for _, metric, q in COLUMNS]
            hit = g.get("prefix_cache_hit_rate")
            rows.append((policy, name, _reqs(g), cells, f"{g['output_tokens_per_s']:.1f}", goodput, str(g["preemptions"]),
                         "" if hit is None else f"{100 * hit:.1f}%"))
        dropped = [(name, g) for name, g, _ in groups[:-1] if g.get("shed") or g.get("rejected")]
        if dropped:  # a fleet gateway's flow control: counted, never served
            rows.append(f"{policy}: gateway flow control shed (TTL) / rejected (band full): "
                        + ", ".join(f"{name} {g['shed']} / {g['rejected']}" for name, g in dropped))
        left = [(name, g) for name, g, _ in groups[:-1] if g.get("unfinished", g["requests"] - g["finished"]) > 0]
        if left or not summary["finished_all"]:
            rows.append(f"{policy}: NOT FINISHED: " + (", ".join(f"{name} {g['finished']} of {g['requests']}"
                                                                for name, g in left) or "the run")
                        + " finished within the horizon (the rest are not averaged in)")
    reqs = max([5] + [len(r[2]) for r in rows if not isinstance(r, str)])
    cached = any(r[7] for r in rows if not isinstance(r, str))  # the prefix cache's hit rate (prompt tokens)
    cell = max([9] + [len(x) for r in rows if not isinstance(r, str) for x in r[3]])
    lines = [head, f"{'policy':{pol}} {'tenant':{width}} {'reqs':>{reqs}} "
             + " ".join(f"{label:>{cell}}" for label, _, _ in COLUMNS) + f" {'tok/s':>8} {'goodput':>8} {'preempt':>7}"
             + (f" {'cache hit':>9}" if cached else "") + "  (ms"
             + (f"; mean +- 95% CI half width over {seeds} seeds)" if spread_of else ")")]
    for r in rows:
        if isinstance(r, str):
            lines.append(r)
            continue
        policy, name, n, cells, tok, goodput, pre, hit = r
        lines.append(f"{policy:{pol}} {name:{width}} {n:>{reqs}} " + " ".join(f"{x:>{cell}}" for x in cells)
                     + f" {tok:>8} {goodput:>8} {pre:>7}" + (f" {hit:>9}" if cached else ""))
    if report["policies"] and next(iter(report["policies"].values()))["slos_ms"]:
        slos = next(iter(report["policies"].values()))["slos_ms"]
        lines.append("goodput: requests/s meeting " + describe_slos(slos))
    lines.append(f"percentiles p{', p'.join(str(q) for q in PERCENTILES)} exact over finished requests (ITL: over "
                 "every gap between two of their tokens)" + (f"; seed 0 replays the log, seeds 1..{seeds - 1} redraw "
                                                            "its arrivals within the phase unit" if spread_of else ""))
    if "load" in report:
        lines.append(report["load"]["line"])
    return "\n".join(lines)


def describe_slos(slos: dict) -> str:
    """`ttft <= 500 ms and tpot <= 50 ms`; per tenant where --goodput named tenants
    (`chat: ttft <= 500 ms; every other tenant: ttft <= 800 ms`)."""
    def one(per: dict) -> str:
        return " and ".join(f"{k} <= {v:g} ms" for k, v in per.items())

    if not per_tenant(slos):
        return one(slos)
    named = [f"{who}: {one(per)}" for who, per in slos.items() if who != DEFAULT_SLO]
    rest = slos.get(DEFAULT_SLO)
    return "; ".join(named + ([f"every other tenant: {one(rest)}"] if rest else ["every other tenant: none (all count)"]))


def draw_ttft_cdf(tables: dict, names, path) -> None:
    """Each tenant's TTFT distribution (CDF over its finished requests, seed 0), one panel
    per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 4), squeeze=False)
    for ax, (policy, t) in zip(axes[0], tables.items()):
        for k, name in enumerate(names):
            v = np.sort(t["ttft_us"][(t["tenant"] == k) & t["finished"]]) / 1000.0
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=str(name))
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{policy}: TTFT per tenant")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def requests_csv(tables: dict, tenant: np.ndarray, names, prompt: np.ndarray, file_row: np.ndarray) -> str:
    """One row per request and policy, in the file's row order; times in us from the first
    arrival (`scheduled_us`: its first admission; empty: never)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    cache = all("cached_tokens" in t for t in tables.values())  # a prefix cache's counts (empty: never admitted)
    fleet = all("replica" in t for t in tables.values())  # a fleet's replica and gateway queue time
    gpu = all("gpu_time_us" in t for t in tables.values())
    w.writerow(("policy",) + REQUEST_COLUMNS + (CACHE_COLUMNS if cache else ()) + (FLEET_COLUMNS if fleet else ())
               + (GPU_COLUMNS if gpu else ()))
    def us(x):
        return "" if not np.isfinite(x) else f"{x:.0f}" if float(x).is_integer() else f"{x:.3f}"

    def stamp(x):
        return int(x) if x >= 0 else ""

    for policy, t in tables.items():
        shed, rejected = gateway_drops(t)
        status = np.where(t["finished"], "finished", np.where(shed, "shed", np.where(rejected, "rejected",
                                                                                      "unfinished")))
        for i in np.argsort(file_row, kind="stable"):
            w.writerow((policy, int(file_row[i]), names[tenant[i]], int(t["arrival_us"][i]), stamp(t["scheduled_us"][i]),
                        stamp(t["first_token_us"][i]), stamp(t["finish_us"][i]), us(t["ttft_us"][i]), us(t["tpot_us"][i]),
                        us(t["e2el_us"][i]), int(prompt[i]), int(t["output"][i]), int(t["preemptions"][i]))
                       + ((stamp(t["cached_tokens"][i]), int(t["recomputed_tokens"][i])) if cache else ())
                       + ((stamp(t["replica"][i]), us(t["gateway_queue_us"][i]), status[i]) if fleet else ())
                       + ((int(t["gpu_time_us"][i]),) if gpu else ()))
    return out.getvalue()
