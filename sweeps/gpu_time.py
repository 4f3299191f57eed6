"""A long-context tenant against short ones: VTC charged in tokens against VTC charged in
GPU time (`compare --cost time`), per tenant TTFT p50/p99 and share of GPU time, with 95%
CIs over seeds.

The log (written to --out as log.csv, so every row can be rerun with `compare`): one
long-context tenant `rag` (prompts U[--long-prompt], outputs U[--long-output]) and
--short-tenants short ones `chat-a`, `chat-b`, ... (prompts U[--short-prompt], outputs
U[--short-output]), --requests requests in all, Poisson arrivals at --rate requests/s per
tenant (one Poisson stream of k x rate, each request's tenant drawn uniformly: every tenant
offers the same requests per second), exact microseconds, drawn from --log-seed. At the
defaults the offered load is about 1.5x the server's measured capacity on this mix, so the
queues grow for the whole arrival span and every tenant that is not served at once is
backlogged.

Rows, each one `compare` of the log on `--server vllm --preset P` (default
llama-3.1-8b-h100-physics: BLIS's physics step model, whose decode term grows with the
context a decode reads), --seeds seeds (seed 0 the log, seed s > 0 redraws each arrival
inside its second):
  fcfs        charges nothing, so one run serves both cost modes (run under --cost time);
  vtc-tokens  VTC charged w_p = 1 per prompt token at admission, w_q = 2 per decode token;
  vtc-time    VTC charged each tenant's share of each step's GPU time in us.

TTFT p50 and p99 (ms, vllm bench serve's definition) are over every request of a run that
drains. The share of GPU time is measured over --share-window: `overload` (default) the
arrival span, while tenants are backlogged and the policy decides who gets the GPU (a
second compare of each row, stopped at the last arrival: the same schedule up to there);
`all` the drained run, where every request is eventually served and each tenant's share is
close to its share of the demand whatever the policy. The share is compare's
`gpu_share[TENANT]` (mean and 95% CI over seeds); where a compare does not report it yet, a
row charged in GPU time shows its tenants' share of the charged time (mean over seeds, no
CI: `gpu_share_source` says which), and the others n/a.

Outputs in --out (written as one set): results.json (config and numbers), results.csv (one
row per row x tenant), results.md (the table), ttft_gpu_share.png (TTFT p99 and share of
GPU time per tenant and row, 95% CI bars) and log.csv.

  python -m sweeps.gpu_time                                 # a few minutes on 2 CPU cores
  python -m sweeps.gpu_time --seeds 32 --requests 600 --out results/gpu_time
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from vtc_jax.cli.common import Parser, float_arg, guarded, int_arg
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError

NAME = "gpu_time"
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "results" / NAME
OUTPUTS = ("results.json", "results.csv", "results.md", "ttft_gpu_share.png", "log.csv")
PRESET = "llama-3.1-8b-h100-physics"
LONG = "rag"
ROWS = (("fcfs", "time", "fcfs"), ("vtc-tokens", "tokens", "vtc"), ("vtc-time", "time", "vtc"))
MAX_TENANTS = 26


def _range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI tokens, got {text[:40]!r}") from None
    if not 1 <= lo <= hi <= 1 << 20:
        raise argparse.ArgumentTypeError(f"need 1 <= LO <= HI <= {1 << 20}, got {text[:40]!r}")
    return lo, hi


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m sweeps.{NAME}", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default docs/results/gpu_time)")
    p.add_argument("--seeds", type=int_arg(1, 1 << 12), default=8, help="seeds per row (default 8)")
    p.add_argument("--requests", type=int_arg(2, 100_000), default=300, help="requests in the log (default 300)")
    p.add_argument("--rate", type=float_arg(1e-3, 1e4), default=2.8,
                   help="requests per second each tenant offers (default 2.8)")
    p.add_argument("--short-tenants", type=int_arg(1, MAX_TENANTS - 1), default=3,
                   help="short-context tenants beside rag (default 3)")
    p.add_argument("--long-prompt", type=_range, default=(8000, 16000), metavar="LO:HI",
                   help="rag's prompt tokens, uniform (8000:16000 by default)")
    p.add_argument("--long-output", type=_range, default=(50, 150), metavar="LO:HI",
                   help="rag's output tokens (50:150 by default)")
    p.add_argument("--short-prompt", type=_range, default=(100, 800), metavar="LO:HI",
                   help="the short tenants' prompt tokens (100:800 by default)")
    p.add_argument("--short-output", type=_range, default=(100, 400), metavar="LO:HI",
                   help="the short tenants' output tokens (100:400 by default)")
    p.add_argument("--log-seed", type=int_arg(0, 2**31 - 1), default=0, help="seed of the log (default 0)")
    p.add_argument("--preset", default=PRESET, help=f"the step-time model (default {PRESET})")
    p.add_argument("--num-gpu-blocks", type=int_arg(2, (1 << 29) - 1), default=30000,
                   help="vLLM's KV blocks (default 30000)")
    p.add_argument("--block-size", type=int_arg(1, 1 << 12), default=16, help="tokens per KV block (default 16)")
    p.add_argument("--max-num-seqs", type=int_arg(1, 1 << 16), default=16, help="running requests at most (default 16)")
    p.add_argument("--max-num-batched-tokens", type=int_arg(1, (1 << 29) - 1), default=8192,
                   help="vLLM's token budget per step (default 8192)")
    p.add_argument("--share-window", choices=("overload", "all"), default="overload",
                   help="where the share of GPU time is measured: the arrival span (overload, the default) or the "
                        "whole drained run (all)")
    return p


# ---- the log ----------------------------------------------------------------------------

def tenants(short: int) -> list[str]:
    return [LONG] + [f"chat-{chr(ord('a') + i)}" for i in range(short)]


def make_log(args) -> list[tuple[int, str, int, int]]:
    """(arrival us, tenant, prompt, output) per request, in arrival order."""
    names = tenants(args.short_tenants)
    rng = np.random.default_rng(args.log_seed)
    gaps = rng.exponential(1e6 / (args.rate * len(names)), args.requests)
    arrivals = np.floor(np.cumsum(gaps)).astype(np.int64)
    if arrivals[-1] >= (1 << 30) - (1 << 26):
        raise InputError(f"--requests {args.requests} at --rate {args.rate:g} span {arrivals[-1] / 1e6:.0f} s: a timed "
                         f"lane holds {(1 << 30) / 1e6:.0f} s with its drain; fewer requests or a higher rate")
    who = rng.integers(0, len(names), args.requests)
    missing = [names[k] for k in range(len(names)) if not (who == k).any()]
    if missing:
        raise InputError(f"--requests {args.requests}: tenant {missing[0]} draws no request with --log-seed "
                         f"{args.log_seed}: give more requests")
    rows = []
    for t, k in zip(arrivals.tolist(), who.tolist()):
        prompt, output = (args.long_prompt, args.long_output) if k == 0 else (args.short_prompt, args.short_output)
        rows.append((t, names[k], int(rng.integers(prompt[0], prompt[1] + 1)),
                     int(rng.integers(output[0], output[1] + 1))))
    return rows


def log_text(rows) -> str:
    lines = ["timestamp,tenant,prompt,output"]
    lines += [f"{t // 1_000_000}.{t % 1_000_000:06d},{name},{p},{o}" for t, name, p, o in rows]
    return "\n".join(lines) + "\n"


# ---- the runs ---------------------------------------------------------------------------

def _compare(args, log: Path, cost: str, policies: list[str], work: Path, horizon_us: int | None) -> dict:
    from vtc_jax.cli import commands

    argv = ["compare", str(log), "--server", "vllm", "--preset", args.preset, "--cost", cost,
            "--policies", ",".join(policies), "--seeds", str(args.seeds), "--no-plots", "--out", str(work),
            "--num-gpu-blocks", str(args.num_gpu_blocks), "--block-size", str(args.block_size),
            "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if horizon_us is not None:
        argv += ["--steps", str(horizon_us)]
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():  # the sweep prints its own table
        warnings.simplefilter("ignore", RuntimeWarning)  # drift over a zero 2U bound under --cost time: not shown here
        status = commands.run(argv)
    if status != 0:
        raise InputError(f"compare --cost {cost} --policies {','.join(policies)} ended with status {status}")
    return json.loads((work / "results.json").read_text())


def _stat(metric: dict | None) -> dict:
    """{mean, half, n} of a results.json metric (half: the 95% CI's half width)."""
    if not metric or metric.get("mean") is None:
        return {"mean": None, "half": None, "n": 0 if not metric else metric.get("n", 0)}
    lo, hi = metric.get("ci95") or (None, None)
    half = None if lo is None or hi is None else (hi - lo) / 2
    return {"mean": metric["mean"], "half": half, "n": metric.get("n")}


def _row_of(result: dict, policy: str) -> dict:
    return next(r for r in result["rows"] if r["setting"]["policy"] == policy)


def _shares(row: dict, names: list[str], cost: str) -> tuple[dict, str]:
    """({tenant: stat}, source) of the share of GPU time in a compare row."""
    m = row["metrics"]
    if all(f"gpu_share[{t}]" in m for t in names):
        return {t: _stat(m[f"gpu_share[{t}]"]) for t in names}, "gpu_share"
    served = (row.get("clients") or {}).get("served_share")
    if cost == "time" and served and all(x is not None for x in served):
        order = row["_tenants"]
        return {t: {"mean": served[order.index(t)], "half": None, "n": None} for t in names}, "charged_time_share"
    return {t: {"mean": None, "half": None, "n": 0} for t in names}, "n/a"


def run(args, log_rows) -> dict:
    names = tenants(args.short_tenants)
    last = log_rows[-1][0]
    by_cost = {}
    for _label, cost, policy in ROWS:
        by_cost.setdefault(cost, []).append(policy)
    drained, window = {}, {}
    with tempfile.TemporaryDirectory(prefix="vtc_jax_gpu_time_") as tmp:
        log = Path(tmp) / "log.csv"
        log.write_text(log_text(log_rows))
        for cost, policies in by_cost.items():
            print(f"[gpu_time] compare --cost {cost} --policies {','.join(policies)}: drained", flush=True)
            drained[cost] = _compare(args, log, cost, policies, Path(tmp) / f"d_{cost}", None)
            if args.share_window == "overload":
                print(f"[gpu_time] compare --cost {cost} --policies {','.join(policies)}: stopped at the last "
                      f"arrival ({last / 1e6:.3f} s)", flush=True)
                window[cost] = _compare(args, log, cost, policies, Path(tmp) / f"w_{cost}", last + 1)
    if args.share_window == "all":
        window = drained
    rows, latency = [], drained[ROWS[0][1]].get("latency", {})
    for label, cost, policy in ROWS:
        d = _row_of(drained[cost], policy)
        w = dict(_row_of(window[cost], policy), _tenants=window[cost]["config"]["tenants"])
        shares, source = _shares(w, names, cost)
        per = {}
        for t in names:
            m = d["metrics"]
            per[t] = {"ttft_p50_ms": _stat(m.get(f"ttft_p50_ms[{t}]")), "ttft_p99_ms": _stat(m.get(f"ttft_p99_ms[{t}]")),
                      "gpu_share": shares[t],
                      "finished_in_window": _finished(w["metrics"].get(f"unfinished[{t}]"),
                                                      sum(1 for r in log_rows if r[1] == t))}
        rows.append({"row": label, "policy": policy, "cost": cost, "gpu_share_source": source, "tenants": per,
                     "unfinished_drained": _stat(d["metrics"].get("unfinished[all]"))["mean"]})
    load = latency.get("load", {})
    config = {"log_seed": args.log_seed, "requests": len(log_rows), "tenants": names, "long_tenant": LONG,
              "rate_per_tenant": args.rate, "arrival_span_s": last / 1e6,
              "requests_per_tenant": {t: sum(1 for r in log_rows if r[1] == t) for t in names},
              "long_prompt": list(args.long_prompt), "long_output": list(args.long_output),
              "short_prompt": list(args.short_prompt), "short_output": list(args.short_output),
              "preset": args.preset, "num_gpu_blocks": args.num_gpu_blocks, "block_size": args.block_size,
              "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
              "seeds": args.seeds, "share_window": args.share_window,
              "share_window_us": [0, last + 1] if args.share_window == "overload" else "the drained run",
              "offered_load": load.get("offered_load"), "capacity_requests_per_s":
                  (load.get("capacity") or {}).get("requests_per_s"),
              "rows": {label: f"compare --cost {cost} --policies {policy}" for label, cost, policy in ROWS},
              "ci": "95% CI over seeds (compare's); half = half its width"}
    return {"sweep": NAME, "config": config, "rows": rows}


def _finished(unfinished: dict | None, requests: int) -> float | None:
    u = _stat(unfinished)["mean"]
    return None if u is None or requests == 0 else 1 - u / requests


# ---- outputs ----------------------------------------------------------------------------

def _pm(s: dict, fmt: str) -> str:
    if s["mean"] is None:
        return "n/a"
    if s["half"] is None or (isinstance(s["half"], float) and math.isnan(s["half"])):
        return format(s["mean"], fmt) + (" (no CI)" if s.get("n") is None else "")
    return f"{format(s['mean'], fmt)} +- {format(s['half'], fmt)}"


def table(result: dict) -> str:
    c = result["config"]
    head = ["row", "tenant", "TTFT p50 ms", "TTFT p99 ms", "GPU share", "done in window"]
    lines = []
    for r in result["rows"]:
        for t, v in r["tenants"].items():
            done = v["finished_in_window"]
            lines.append([r["row"], t, _pm(v["ttft_p50_ms"], ".0f"), _pm(v["ttft_p99_ms"], ".0f"),
                          _pm(v["gpu_share"], ".3f"), "n/a" if done is None else f"{done:.2f}"])
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(x.ljust(w) for x, w in zip(line, widths)) + " |" for line in lines]
    window = ("the arrival span, 0 to %.3f s" % c["arrival_span_s"]) if c["share_window"] == "overload" \
        else "the whole drained run"
    sources = {r["row"]: r["gpu_share_source"] for r in result["rows"]}
    notes = [f"{c['requests']} requests ({', '.join(f'{t} {n}' for t, n in c['requests_per_tenant'].items())}), "
             f"{c['rate_per_tenant']:g} requests/s per tenant over {c['arrival_span_s']:.2f} s; offered load "
             + (f"{c['offered_load']:.2f}x" if c["offered_load"] else "n/a") + f" the measured capacity; {c['preset']}, "
             f"max_num_seqs {c['max_num_seqs']}, num_gpu_blocks {c['num_gpu_blocks']}, block {c['block_size']}, "
             f"token budget {c['max_num_batched_tokens']}; {c['seeds']} seeds, mean +- 95% CI half width.",
             "TTFT over every request of the drained run; GPU share and 'done in window' (fraction of the tenant's "
             f"requests finished) over {window}.",
             "GPU share source: " + ", ".join(f"{k} {v}" for k, v in sources.items())
             + " (gpu_share: compare's metric; charged_time_share: the tenant's share of the GPU time the row charged,"
               " mean over seeds, no CI; n/a: not reported by this compare)."]
    return "\n".join(out) + "\n\n" + "\n\n".join(notes) + "\n"


def csv_text(result: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(("row", "policy", "cost", "tenant", "ttft_p50_ms", "ttft_p50_ms_ci_half", "ttft_p99_ms",
                "ttft_p99_ms_ci_half", "gpu_share", "gpu_share_ci_half", "gpu_share_source", "finished_in_window"))

    def f(x):
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.6g}"

    for r in result["rows"]:
        for t, v in r["tenants"].items():
            w.writerow((r["row"], r["policy"], r["cost"], t, f(v["ttft_p50_ms"]["mean"]), f(v["ttft_p50_ms"]["half"]),
                        f(v["ttft_p99_ms"]["mean"]), f(v["ttft_p99_ms"]["half"]), f(v["gpu_share"]["mean"]),
                        f(v["gpu_share"]["half"]), r["gpu_share_source"], f(v["finished_in_window"])))
    return out.getvalue()


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = result["config"]["tenants"]
    rows = result["rows"]
    x = np.arange(len(names))
    width = 0.8 / len(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, ylabel in zip(axes, ("ttft_p99_ms", "gpu_share"),
                               ("TTFT p99 (ms), drained run", "share of GPU time")):
        for i, r in enumerate(rows):
            means = [r["tenants"][t][key]["mean"] for t in names]
            halves = [r["tenants"][t][key]["half"] for t in names]
            ax.bar(x - 0.4 + width * (i + 0.5), [np.nan if m is None else m for m in means], width,
                   yerr=[np.nan if h is None else h for h in halves], capsize=3, label=r["row"])
        ax.set_xticks(x)
        ax.set_xticklabels(names)
        ax.set_ylabel(ylabel)
        if key == "gpu_share":
            ax.axhline(1 / len(names), color="grey", lw=0.8, ls="--")
            ax.set_title("share of GPU time (" + ("arrival span" if result["config"]["share_window"] == "overload"
                                                  else "drained run") + "; n/a rows left out)", fontsize=9)
        else:
            ax.set_title("per-tenant TTFT p99, 95% CI over seeds", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def check(args) -> None:
    from vtc_jax.servers import step_time

    if args.preset not in step_time.presets():
        raise InputError(f"--preset {args.preset[:60]!r}: choose one of {', '.join(step_time.presets())}")
    for lo_hi, name in ((args.long_prompt, "long"), (args.short_prompt, "short")):
        if lo_hi[1] + max(args.long_output[1], args.short_output[1]) > (args.num_gpu_blocks - 1) * args.block_size:
            raise InputError(f"--{name}-prompt {lo_hi[0]}:{lo_hi[1]}: its longest request does not fit "
                             f"--num-gpu-blocks {args.num_gpu_blocks} of --block-size {args.block_size}")


def main(argv=None) -> int:
    def body() -> int:
        args = build_parser().parse_args(argv)
        check(args)
        fileio.check_writable_dir(args.out, OUTPUTS)
        log_rows = make_log(args)
        result = run(args, log_rows)
        text = table(result)
        print(text, end="")
        written = fileio.write_outputs_atomically([
            (args.out / "results.json", lambda p: p.write_text(json.dumps(result, indent=1))),
            (args.out / "results.csv", lambda p: p.write_text(csv_text(result))),
            (args.out / "results.md", lambda p: p.write_text(f"# GPU-time fairness sweep (sweeps.{NAME})\n\n" + text)),
            (args.out / "ttft_gpu_share.png", lambda p: plot(result, p)),
            (args.out / "log.csv", lambda p: p.write_text(log_text(log_rows)))])
        print(f"wrote {', '.join(str(p) for p in written)}")
        return 0
    return guarded(f"sweeps.{NAME}", body)


if __name__ == "__main__":
    sys.exit(main())
