"""`compare LOG --server vllm [--preset NAME | --step-time FILE]`: every policy on the
user's own log on a timed vLLM server, and per tenant what `vllm bench serve` reports:
TTFT, TPOT, ITL, E2EL and queueing delay in ms (mean, p50, p90, p99), throughput, goodput
(`--goodput ttft:500 tpot:50`), preemptions; `--requests-out FILE.csv` one row per
request. Arrivals are the log's timestamps in exact microseconds (no --step-seconds).
ITL's percentiles come from each token's time, which the server keeps for this run
(`token_times_option`)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import sys
from pathlib import Path

import numpy as np

from vtc_jax.cli import input_flags
from vtc_jax.cli.common import in_file
from vtc_jax.cli.scheduler_flags import settings_from_args
from vtc_jax.cli.server_flags import memory_tokens, server_options
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import capacity
from vtc_jax.driver.latency import PERCENTILES, bench_serve, parse_goodput, request_table, summarize
from vtc_jax.inputs.workload import MAX_ARRIVAL, Trace
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.servers import step_time
from vtc_jax.servers.vllm_prefix import prefix_options

RECORD_BYTES = 1 << 30  # the most memory the per-token record (ITL percentiles) may take, every lane together
H100_DEFAULTS = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}  # vLLM's server defaults on H100/H200
REQUEST_COLUMNS = ("row", "tenant", "arrival_us", "scheduled_us", "first_token_us", "finish_us", "ttft_us", "tpot_us",
                   "e2e_us", "prompt", "output", "preemptions")


def read_timed_log(args):
    """The requests of any timed input of the reader layer (a trace in steps is refused:
    a timed server needs times)."""
    log = input_flags.read_input(args, "log")
    if not log.timed:
        raise InputError(f"{args.log}: a trace in steps has no times; a timed server (--server {args.server}) "
                         "needs timestamps (a timestamped log or a public trace format: --format)")
    return log


def _prefix_tables(args, log) -> dict:
    """vllm_prefix's shared-prefix tables from the log's prefix_id/prefix_len columns (for
    Mooncake: its hash_ids); a note when the log has columns the run does not use."""
    unused = sorted(log.columns & {"cached"} | (log.columns & {"prefix_id", "prefix_len"}
                                                  if args.server != "vllm_prefix" else set()))
    if unused:
        print(f"note: the log's {', '.join(unused)} column(s) are not used by --server {args.server} (vLLM computes "
              "prefix hits itself" + ("; give --enable-prefix-caching to share the logged prefixes)" if
                                      args.server != "vllm_prefix" else ")"), file=sys.stderr)
    if args.server != "vllm_prefix":
        return {}
    return prefix_options(log.arrival, [log.tenants[c] for c in log.client], log.prefix_id, log.prefix_len)


def model_of(args) -> step_time.StepTime:
    if args.preset and args.step_time:
        raise InputError("give --preset or --step-time, not both")
    if args.preset:
        return step_time.preset(args.preset)
    if args.step_time:
        return step_time.read_step_time(args.step_time)
    raise InputError("compare --server vllm needs a step-time model: --preset NAME (e.g. qwen2.5-7b-h100) or "
                     "--step-time FILE.json")


def server_settings(args, model: step_time.StepTime) -> dict:
    options = dict(server_options(args))
    if "num_gpu_blocks" not in options:
        if model.num_gpu_blocks is None:
            raise InputError(f"step-time model {model.name} names no KV pool: give --num-gpu-blocks")
        options["num_gpu_blocks"] = model.num_gpu_blocks
    if "h100" in model.name or "h200" in model.name:
        for name, value in H100_DEFAULTS.items():
            options.setdefault(name, value)
    model.check(options.get("max_num_batched_tokens", 2048), options.get("max_num_seqs", 256))
    return options


def command(args) -> int:
    from vtc_jax.driver.run import run_traces, workload_pad

    if args.kv_budget is not None:
        raise InputError("--kv-budget is the ideal server's memory; --server vllm takes --num-gpu-blocks")
    if args.seeds != 1:
        raise InputError("--seeds redraws arrivals in steps; a timed server replays the log as it is (--seeds 1)")
    slos = parse_goodput(args.goodput)
    model = model_of(args)
    options = server_settings(args, model)
    log = read_timed_log(args)
    arrival_us, tenant, names, prompt, output = log.arrival_us(), log.client, list(log.tenants), log.prompt, log.output
    file_row = input_flags.file_rows(log)
    shared = _prefix_tables(args, log)  # in the run only: tables of 1 entry per request stay out of the report
    if int(arrival_us.max()) + model.a0 > MAX_ARRIVAL:
        raise InputError(f"{args.log}: the log spans {arrival_us.max() / 1e6:.1f} s; a timed run holds up to "
                         f"{MAX_ARRIVAL / 1e6:.0f} s of arrivals (int32 microseconds): take a window of it "
                         "(--time-window START,SECONDS)")
    trace = Trace(arrival_us + model.a0, tenant, prompt, output, np.zeros_like(prompt), source=str(args.log))
    trace.validate()
    k = len(names)
    run_options = tuple(sorted({**options, **dict(model.options())}.items()))
    record = token_times_option(output, len(args.policies))
    lanes = []
    for policy in args.policies:
        s = settings_from_args(_with_budget(args, memory_tokens(options)), policy, lenient=True)
        lanes.append(dataclasses.replace(s, server_options=tuple(sorted({**dict(run_options), **shared,
                                                                         **record}.items()))))
    fileio.check_distinct_outputs([args.requests_out])
    for path in ([args.requests_out] if args.requests_out else []):
        fileio.check_writable_file(path)
    fileio.check_writable_dir(args.out, ["results.json", "bench_serve.json"])
    input_flags.announce(args)
    try:
        result = run_traces([trace] * len(lanes), lanes, num_clients=k, server=args.server, measures=MeasureConfig(),
                            steps=args.steps)
    except InputError as err:
        raise in_file(args.log, err) from None
    # a run of its own: in the policies' batch its seats would size every lane (measured: 2x the time)
    measured = capacity.measure(prompt, output, dataclasses.replace(lanes[0], server_options=run_options), args.server)
    report = {"log": str(args.log), "server": args.server, "step_time": model.name, "settings": options,
              "tenants": names, "load": load_report(measured, arrival_us), "policies": {}}
    tables, bench = {}, {}
    for lane, policy in enumerate(args.policies):
        table = request_table(result, trace, k, workload_pad(), arrival_us, lane)
        report["policies"][policy] = summarize(table, tenant, names, prompt, slos)
        report["policies"][policy]["finished_all"] = bool(result.finished[lane])
        tables[policy] = table
        bench[policy] = dict(bench_serve(table, tenant, names, prompt, slos), finished_all=bool(result.finished[lane]))
    print(format_report(report, names))
    files = [(Path(args.out) / "results.json", lambda p: p.write_text(json.dumps(report, indent=1))),
             (Path(args.out) / "bench_serve.json", lambda p: p.write_text(json.dumps(bench, indent=1)))]
    if args.requests_out:
        files.append((Path(args.requests_out), lambda p: p.write_text(requests_csv(tables, tenant, names, prompt, file_row))))
    fileio.write_outputs_atomically(files)
    print(f"wrote {', '.join(str(p) for p, _ in files)}")
    return 0


def load_report(cap: capacity.Capacity, arrival_us: np.ndarray, cluster: dict | None = None) -> dict:
    """The log's offered rate (requests over the span of its arrivals) against the
    server's capacity measured on the log's own mix (driver/capacity.py). On a `cluster`
    (its "replicas" R, those of the server "server"): against R x that capacity, what
    the replicas sustain together when every one is kept busy (the figure an operator
    sizes a fleet by; routing can only lose from it), with one replica's beside it."""
    n = len(arrival_us)
    span_s = float(arrival_us.max() - arrival_us.min()) / 1e6
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


def format_report(report: dict, names) -> str:
    c = report.get("cluster")  # a cluster's replicas (slora_compare.report)
    where = (f" at each of {c['replicas']} replica(s) behind {c['routers']} router(s) running {c['gateway_policy']}"
             if c else "")
    head = (f"server {report['server']}{where}, step time {report['step_time']}; "
            + ", ".join(f"{k} {v}" for k, v in report["settings"].items() if not k.startswith("time_")))
    lines = [head, f"{'policy':10} {'tenant':14} {'reqs':>5} " + " ".join(f"{label:>9}" for label, _, _ in COLUMNS)
             + f" {'tok/s':>8} {'goodput':>8} {'preempt':>7}  (ms)"]
    for policy, summary in report["policies"].items():
        groups = [(name, summary["tenants"][name]) for name in names] + [("all", summary["overall"])]
        for name, g in groups:
            goodput = "n/a" if g["goodput"] is None else f"{g['goodput']:.2f}"
            lines.append(f"{policy:10} {name[:14]:14} {g['finished']:>5} "
                         + " ".join(f"{_ms(g[metric][q]):>9}" for _, metric, q in COLUMNS)
                         + f" {g['output_tokens_per_s']:>8.1f} {goodput:>8} {g['preemptions']:>7}")
        if not summary["finished_all"]:
            lines.append(f"{policy}: NOT FINISHED: some requests did not finish within the horizon (not averaged in)")
    if report["policies"] and next(iter(report["policies"].values()))["slos_ms"]:
        slos = next(iter(report["policies"].values()))["slos_ms"]
        lines.append("goodput: requests/s meeting " + " and ".join(f"{k} <= {v:g} ms" for k, v in slos.items()))
    lines.append(f"percentiles p{', p'.join(str(q) for q in PERCENTILES)} exact over finished requests (ITL: over "
                 "every gap between two of their tokens)")
    if "load" in report:
        lines.append(report["load"]["line"])
    return "\n".join(lines)


def requests_csv(tables: dict, tenant: np.ndarray, names, prompt: np.ndarray, file_row: np.ndarray) -> str:
    """One row per request and policy, in the file's row order; times in us from the first
    arrival (`scheduled_us`: its first admission; empty: never)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(("policy",) + REQUEST_COLUMNS)
    def us(x):
        return "" if not np.isfinite(x) else f"{x:.0f}" if float(x).is_integer() else f"{x:.3f}"

    def stamp(x):
        return int(x) if x >= 0 else ""

    for policy, t in tables.items():
        for i in np.argsort(file_row, kind="stable"):
            w.writerow((policy, int(file_row[i]), names[tenant[i]], int(t["arrival_us"][i]), stamp(t["scheduled_us"][i]),
                        stamp(t["first_token_us"][i]), stamp(t["finish_us"][i]), us(t["ttft_us"][i]), us(t["tpot_us"][i]),
                        us(t["e2el_us"][i]), int(prompt[i]), int(t["output"][i]), int(t["preemptions"][i])))
    return out.getvalue()
