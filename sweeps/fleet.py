"""Capacity planning for a fleet (docs/FLEET.md): how many vLLM replicas keep every tenant
inside its SLO, per gateway fairness policy and endpoint picker, as the load grows.

Each point (offered load x replicas x picker) is one `compare` study of the log (the
study path of every command: `--load-scale X` offers X times the log's load,
`--replicas R --picker P [--flow-control] --policies ...`), so its numbers are
compare's: per tenant TTFT p99 and goodput from `vllm bench serve`'s definitions (seed 0:
the log as it is), shares and drift over `--seeds`. A point meets the SLO when every
request of every tenant finished (one the gateway's flow control shed at its 60 s TTL or
rejected at its band capacity did not: each point's `shed` and `rejected` per tenant) and
each tenant's TTFT p99 is within its `--slo`; with `--seeds S > 1`, in every seed (a seed
redraws arrivals inside their second and the picker's ties), and the upper end of the 95%
CI of each tenant's TTFT p99 over the S seeds within its `--slo` (a plan that holds for
the log's likely variants, not one draw). The table gives, per load, picker and policy,
the fewest replicas that meet it.

Default: examples/tenant_log.csv's first 60 s at 1x, 50x and 100x its load, 1 and 2
replicas, the llm-d and round-robin pickers with flow control, fcfs (llm-d's
global-strict) and vtc_gateway at the gateway, TTFT p99 <= 500 ms (a few minutes on 2 CPU
cores). `--log` takes any input compare reads (a ServeGen directory, Mooncake, ...)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
import tempfile
from pathlib import Path

from vtc_jax.cli.common import Parser, float_arg, guarded, int_arg, list_arg
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.pickers import registry as pickers
from vtc_jax.policies import registry

NAME = "fleet"
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOG = ROOT / "examples" / "tenant_log.csv"
OUTPUTS = ("results.json", "results.csv", "replicas_needed.png")


def _slo(text: str) -> dict:
    """--slo ttft:MS[,TENANT:ttft:MS...] -> {tenant or "*": ms}."""
    out = {}
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) == 2 and parts[0] == "ttft":
            key, ms = "*", parts[1]
        elif len(parts) == 3 and parts[1] == "ttft":
            key, ms = parts[0], parts[2]
        else:
            raise argparse.ArgumentTypeError(f"expected ttft:MS or TENANT:ttft:MS, got {item.strip()[:40]!r}")
        try:
            value = float(ms)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item.strip()[:40]!r}: MS must be a number") from None
        if not 0 < value <= 3.6e6:
            raise argparse.ArgumentTypeError(f"{item.strip()[:40]!r}: MS must be in (0, 3.6e6]")
        out[key] = value
    return out


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m sweeps.{NAME}", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", type=Path, default=DEFAULT_LOG, help="the log (default examples/tenant_log.csv)")
    p.add_argument("--time-window", default="0,60", metavar="START,SECONDS",
                   help="the part of the log to study (default 0,60; 'all': the whole log)")
    p.add_argument("--preset", default="qwen2.5-7b-h100", help="the replicas' step-time model and pool")
    p.add_argument("--loads", type=list_arg(float_arg(1e-3, 1e6), name="loads"), default=[1.0, 50.0, 100.0],
                   help="offered loads, x the log's (default 1,50,100)")
    p.add_argument("--replicas", type=list_arg(int_arg(1, 64), name="replicas"), default=[1, 2],
                   help="replica counts (default 1,2)")
    p.add_argument("--pickers", type=list_arg(str, name="pickers"), default=["llm-d", "round-robin"],
                   help=f"endpoint pickers (of {', '.join(pickers.names())}; default llm-d,round-robin)")
    p.add_argument("--policies", type=list_arg(str, name="policies"), default=["fcfs", "vtc_gateway"],
                   help="the gateway's fairness policies with --flow-control (default fcfs,vtc_gateway), else "
                        "the replicas'")
    p.add_argument("--no-flow-control", action="store_true",
                   help="route every request at its arrival (llm-d's default) instead of llm-d's flow control")
    p.add_argument("--slo", type=_slo, default={"*": 500.0}, metavar="ttft:MS[,TENANT:ttft:MS]",
                   help="each tenant's TTFT p99 target in ms (default ttft:500)")
    p.add_argument("--seeds", type=int_arg(1, 1 << 16), default=1,
                   help="seeds per point: past 1, the SLO must hold on every seed and at the 95%% CI's upper end")
    p.add_argument("--out", type=Path, default=Path("results") / NAME, help="output directory")
    return p


def _point(args, load: float, replicas: int, picker: str, work: Path) -> tuple[dict, dict]:
    """One compare study; returns its bench_serve.json ({policy: report}) and, over more
    than one seed, results.json's latency["over_seeds"] ({policy: spread}; else {})."""
    from vtc_jax.cli import commands

    argv = ["compare", str(args.log), "--server", "vllm", "--preset", args.preset, "--replicas", str(replicas),
            "--picker", picker, "--policies", ",".join(args.policies), "--load-scale", f"{load:g}",
            "--seeds", str(args.seeds), "--no-plots", "--out", str(work)]
    if args.time_window != "all":
        argv += ["--time-window", args.time_window]
    if not args.no_flow_control:
        argv.append("--flow-control")
    with contextlib.redirect_stdout(io.StringIO()):  # each study's own report: the sweep prints its table
        status = commands.run(argv)
    if status != 0:
        raise InputError(f"compare at load {load:g}, {replicas} replica(s), picker {picker} ended with status {status}")
    spread = json.loads((work / "results.json").read_text()).get("latency", {}).get("over_seeds") or {}
    return json.loads((work / "bench_serve.json").read_text()), spread


def _meets(report: dict, slo: dict, spread: dict | None = None, seeds: int = 1) -> tuple[bool, dict, dict]:
    """(every tenant finished everything within its TTFT p99 target, {tenant: p99 ms of seed
    0}, {tenant: [lo, hi] the 95% CI of the p99 over seeds}). With `spread` (one policy's
    latency over its `seeds` seeds), every seed must finish every request and the CI's
    upper end must be within the target."""
    p99, ci, ok = {}, {}, bool(report.get("finished_all", False))
    for tenant, t in report["tenants"].items():
        p99[tenant] = t["p99_ttft_ms"]
        target = slo.get(tenant, slo.get("*"))
        ok &= t["failed"] == 0 and t["p99_ttft_ms"] is not None and (target is None or t["p99_ttft_ms"] <= target)
        if spread:
            s = spread["tenants"][tenant]
            hi = s["ttft"]["p99"]["ci95"][1]
            ci[tenant] = s["ttft"]["p99"]["ci95"]
            dropped = any((s[k]["max"] or 0) > 0 for k in ("unfinished", "shed", "rejected"))
            ok &= not dropped and s["ttft"]["p99"]["n"] == seeds and hi is not None \
                and (target is None or hi <= target)
    return ok, p99, ci


def run(args) -> dict:
    for name in args.pickers:
        pickers.get(name)
    for name in args.policies:
        registry.get(name)
    points = []
    with tempfile.TemporaryDirectory(prefix="vtc_jax_fleet_") as tmp:
        for i, load in enumerate(args.loads):
            for replicas in args.replicas:
                for picker in args.pickers:
                    work = Path(tmp) / f"p{i}_{replicas}_{picker}"
                    bench, spread = _point(args, load, replicas, picker, work)
                    for policy, report in bench.items():
                        ok, p99, ci = _meets(report, args.slo, spread.get(policy), args.seeds)
                        goodput = {t: r["request_throughput"] for t, r in report["tenants"].items()}
                        points.append({"load": load, "replicas": replicas, "picker": picker, "policy": policy,
                                       "meets_slo": ok, "ttft_p99_ms": p99, "ttft_p99_ms_ci95": ci,
                                       "request_throughput": goodput,
                                       "shed": {t: r.get("shed", 0) for t, r in report["tenants"].items()},
                                       "rejected": {t: r.get("rejected", 0) for t, r in report["tenants"].items()},
                                       "finished_all": bool(report.get("finished_all", False))})
                    print(f"[fleet] load {load:g}x, {replicas} replica(s), {picker}: "
                          + ", ".join(f"{p['policy']} {'meets' if p['meets_slo'] else 'misses'} the SLO"
                                      for p in points[-len(bench):]), flush=True)
    needed = []
    for load in args.loads:
        for picker in args.pickers:
            for policy in args.policies:
                ok = [p["replicas"] for p in points if (p["load"], p["picker"], p["policy"]) == (load, picker, policy)
                      and p["meets_slo"]]
                needed.append({"load": load, "picker": picker, "policy": policy,
                               "fewest_replicas": min(ok) if ok else None})
    return {"config": {"log": str(args.log), "time_window": args.time_window, "preset": args.preset,
                       "flow_control": not args.no_flow_control, "slo_ttft_p99_ms": args.slo, "seeds": args.seeds,
                       "latency": "seed 0 (the log as it is)" + (
                           f"; the SLO on every seed and the 95% CI's upper end over {args.seeds} seeds"
                           if args.seeds > 1 else "")},
            "points": points, "fewest_replicas": needed}


def _table(result: dict) -> str:
    lines = ["load  picker        policy        fewest replicas meeting every tenant's TTFT p99"]
    for n in result["fewest_replicas"]:
        most = max(p["replicas"] for p in result["points"])
        shown = n["fewest_replicas"] if n["fewest_replicas"] is not None else f"none of 1..{most}"
        lines.append(f"{n['load']:<5g} {n['picker']:<13} {n['policy']:<13} {shown}")
    return "\n".join(lines)


def _csv(result: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(("load", "replicas", "picker", "policy", "tenant", "ttft_p99_ms", "ttft_p99_ms_ci95_lo",
                "ttft_p99_ms_ci95_hi", "request_throughput", "meets_slo"))
    for p in result["points"]:
        for tenant, ms in p["ttft_p99_ms"].items():
            lo, hi = p["ttft_p99_ms_ci95"].get(tenant) or (None, None)
            w.writerow((p["load"], p["replicas"], p["picker"], p["policy"], tenant, *(
                "" if x is None else f"{x:.3f}" for x in (ms, lo, hi)),
                f"{p['request_throughput'][tenant]:.4f}", int(p["meets_slo"])))
    return out.getvalue()


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for picker in dict.fromkeys(p["picker"] for p in result["points"]):
        for policy in dict.fromkeys(p["policy"] for p in result["points"]):
            mine = [n for n in result["fewest_replicas"] if (n["picker"], n["policy"]) == (picker, policy)]
            ax.plot([n["load"] for n in mine], [n["fewest_replicas"] or float("nan") for n in mine], "o-",
                    label=f"{picker} / {policy}")
    ax.set_xlabel("offered load (x the log's)")
    ax.set_ylabel("fewest replicas meeting every tenant's SLO")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def main(argv=None) -> int:
    def body() -> int:
        args = parser().parse_args(argv)
        if not args.log.exists():
            raise InputError(f"--log {args.log}: no such file or directory")
        fileio.check_writable_dir(args.out, OUTPUTS)
        result = run(args)
        print(_table(result))
        written = fileio.write_outputs_atomically([
            (args.out / "results.json", lambda p: p.write_text(json.dumps(result, indent=1))),
            (args.out / "results.csv", lambda p: p.write_text(_csv(result))),
            (args.out / "replicas_needed.png", lambda p: _plot(result, p))])
        print(f"wrote {', '.join(str(p) for p in written)}")
        return 0
    return guarded(f"sweeps.{NAME}", body)


if __name__ == "__main__":
    sys.exit(main())
