"""Gateway fairness across routers and replicas (docs/CLUSTER.md): two overloaded tenants
weighted 4:1 enter a cluster of R replicas through G routers; does the 4:1 survive skewed
ingress with per-router, shared or delayed-shared gateway counters? Also compares
engine-level VTC (gateway FCFS, engine VTC) with gateway VTC (gateway vtc_gateway, engine
FCFS) at equal throughput.

Default: replicas 4, routers 1,2,4, skew 0,0.5,1, counters per_router,shared,delayed,
estimate error 0, 1000 steps, 32 seeds (a few minutes on 2 CPU cores);
--full runs the whole grid (replicas 1,2,4,8,16, estimate error 0,0.5).

--server names the replicas' server (vllm keeps a requeue per replica; the fleet gateway's
pickers and flow control are sweeps.fleet's)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import float_arg, guarded, int_arg, list_arg, number_text
from vtc_jax.cli.server_flags import server_options
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import sweep, sweep_outputs
from vtc_jax.driver.sweep import Row, Sweep
from vtc_jax.driver.cluster_run import check_server
from vtc_jax.driver.cluster_sweep import ClusterEngine
from vtc_jax.engines.cluster_settings import CHOICES, COUNTERS, SATURATION, ClusterSettings, gateway_problem
from vtc_jax.engines.settings import Settings, to_fraction
from vtc_jax.inputs.sources import TrafficSource
from vtc_jax.inputs.traffic import overload
from vtc_jax.measures.online import MeasureConfig

NAME = "cluster"
FULL = {"replicas": [1, 2, 4, 8, 16], "routers": [1, 2, 4], "skew": ["0", "0.5", "1"],
        "counters": list(COUNTERS), "estimate_error": ["0", "0.5"]}
DEFAULT = {"replicas": [4], "routers": [1, 2, 4], "skew": ["0", "0.5", "1"], "counters": list(COUNTERS),
           "estimate_error": ["0"]}
DEFAULT_SEEDS = 32
COLUMNS = ("weight_ratio", "weighted_share_error", "max_drift", "throughput", "p99_wait")
COMPARE = (("vtc_gateway", "fcfs"), ("fcfs", "vtc"), ("fcfs", "fcfs"))
STYLES = {"per_router": "o-", "shared": "s-", "delayed": "x--"}  # overlapping lines stay visible


def _fraction_list(name: str):
    def parse(text: str):
        return [str(to_fraction(x, name)) for x in list_arg(number_text, name=name)(text)]
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("grid (comma-separated lists; --full: every value)")
    g.add_argument("--full", action="store_true", help="the whole grid: replicas 1,2,4,8,16, routers 1,2,4, skew "
                   "0,0.5,1, every counter mode, estimate error 0,0.5 (overrides the grid flags)")
    g.add_argument("--replicas", type=list_arg(int_arg(1, 64), name="replicas"), default=DEFAULT["replicas"],
                   help="replicas R (default 4)")
    g.add_argument("--routers", type=list_arg(int_arg(1, 16), name="routers"), default=DEFAULT["routers"],
                   help="routers G (default 1,2,4)")
    g.add_argument("--skew", type=_fraction_list("skew"), default=DEFAULT["skew"],
                   help="ingress skew: 0 uniform, 1 tenant k -> router k mod G (default 0,0.5,1)")
    g.add_argument("--counters", type=list_arg(str, name="counters"), default=DEFAULT["counters"],
                   help=f"counter modes from {', '.join(COUNTERS)} (default all)")
    g.add_argument("--estimate-error", type=_fraction_list("estimate error"), default=DEFAULT["estimate_error"],
                   help="relative output-estimate error r (noisy estimator, uniform within +-r; default 0)")
    c = parser.add_argument_group("cluster")
    c.add_argument("--gateway-policy", default="vtc_gateway", help="router policy (default vtc_gateway)")
    c.add_argument("--engine-policy", default="fcfs", help="replica policy (default fcfs, what engines run)")
    c.add_argument("--delay", type=int_arg(1, 64), default=10, help="delayed mode: d steps (default 10)")
    c.add_argument("--no-holdback", action="store_true",
                   help="shared modes: routers pick only among their own tenants (no hold-back)")
    c.add_argument("--saturation", choices=SATURATION, default="kv", help="replica saturation rule (default kv)")
    c.add_argument("--kv-threshold", type=number_text, default="1",
                   help="kv rule: room while KV + waiting prompts < this x M (default 1)")
    c.add_argument("--queue-limit", type=int_arg(1, 1 << 16), default=8, help="queue rule: q (default 8)")
    c.add_argument("--choice", choices=CHOICES, default="least_kv", help="replica choice (default least_kv)")
    c.add_argument("--no-compare", action="store_true",
                   help="skip the extra rows: engine-level VTC vs gateway VTC (one router, kv < 1M and < 2M), "
                        "and, at full skew, shared counters without hold-back and delays 1 and 50")
    w = parser.add_argument_group("workload (two tenants, Poisson, both overloaded)")
    w.add_argument("--steps", type=int_arg(50, 1 << 24), default=1000, help="horizon in steps (default 1000)")
    w.add_argument("--warmup", type=int_arg(0, 1 << 24), default=None,
                   help="steps before the measures start (default a quarter of the horizon: the start-up "
                        "catch-up of vtc_gateway lasts about 100 steps)")
    w.add_argument("--rate", type=float_arg(0.0, 1e4, open_min=True), default=0.75,
                   help="arrivals per step of EACH tenant per replica (default 0.75; a replica serves about 0.6)")
    w.add_argument("--prompt", type=sweep_command.range_arg, default=(16, 128), help="prompt range (default 16,128)")
    w.add_argument("--output", type=sweep_command.range_arg, default=(8, 64), help="output range (default 8,64)")
    w.add_argument("--kv-budget", type=int_arg(1, 1 << 24), default=2048, help="M per replica (default 2048)")
    w.add_argument("--weights", type=list_arg(number_text, name="weights", min_items=2, max_items=2),
                   default=["4", "1"], help="the two tenants' weights (default 4,1)")
    w.add_argument("--w-p", type=number_text, default="1", help="prefill token cost (default 1)")
    w.add_argument("--w-q", type=number_text, default="2", help="decode token cost (default 2)")


def _grid(args) -> dict:
    if args.full:
        return dict(FULL)
    grid = {"replicas": args.replicas, "routers": args.routers, "skew": args.skew, "counters": args.counters,
            "estimate_error": args.estimate_error}
    for m in grid["counters"]:
        if m not in COUNTERS:
            raise InputError(f"--counters: unknown mode {m!r}; choose from {', '.join(COUNTERS)}")
    return grid


def build(args) -> Sweep:
    options = server_options(args)  # a server's flag without its --server is one line
    check_server(args.server)
    if args.check:
        raise InputError("--check (the conservation ledger) is not available for the cluster sweep")
    if args.measures:
        raise InputError("--measures does not apply to the cluster sweep (its measures are fixed: docs/CLUSTER.md)")
    for name, policy in (("--gateway-policy", args.gateway_policy), ("--engine-policy", args.engine_policy)):
        Settings(policy)  # names the choices if unknown
        if name == "--gateway-policy" and gateway_problem(policy):
            raise InputError(f"{name}: {gateway_problem(policy)}")
    grid = _grid(args)
    if args.steps < 50:
        raise InputError("--steps must be >= 50")
    warmup = args.steps // 4 if args.warmup is None else args.warmup
    if warmup >= args.steps:
        raise InputError("--warmup must be below --steps")
    weights = tuple(to_fraction(w, "weight") for w in args.weights)

    def settings(r: int, g: int, skew, counters, error, gateway, engine, theta=None) -> ClusterSettings:
        eng = Settings(engine, args.kv_budget, w_p=args.w_p, w_q=args.w_q, weights=weights, estimator="noisy",
                       estimate_error=error, server_options=options)
        return ClusterSettings(engine=eng, gateway_policy=gateway, replicas=r, routers=g, skew=skew,
                               counters=counters, delay=args.delay, holdback=not args.no_holdback,
                               saturation=args.saturation, kv_threshold=theta or args.kv_threshold,
                               queue_limit=args.queue_limit, choice=args.choice, measure_from=warmup)

    sources = {r: TrafficSource(overload([args.rate * r] * 2, args.steps, prompt=args.prompt, output=args.output))
               for r in grid["replicas"]}
    rows = []
    for r in grid["replicas"]:
        for error in grid["estimate_error"]:
            for g in grid["routers"]:
                for skew in (grid["skew"] if g > 1 else ["0"]):
                    for counters in (grid["counters"] if g > 1 else ["per_router"]):
                        cs = settings(r, g, skew, counters, error, args.gateway_policy, args.engine_policy)
                        mode = counters if counters != "delayed" else f"delayed d={args.delay}"
                        rows.append(Row(cs, sources[r], f"R={r} G={g} skew={skew} {mode} err={error}",
                                        {"group": "grid"}))
            g_max = max(grid["routers"])
            if not args.no_compare and r == grid["replicas"][0] and g_max > 1:
                # what the gate and the delay do under full skew
                for counters, delay, holdback in (("shared", args.delay, False), ("delayed", args.delay, False),
                                                  ("delayed", 1, True), ("delayed", 50, True)):
                    cs = dataclasses.replace(settings(r, g_max, "1", counters, error, args.gateway_policy,
                                                      args.engine_policy), delay=delay, holdback=holdback)
                    mode = counters if counters != "delayed" else f"delayed d={delay}"
                    rows.append(Row(cs, sources[r], f"gate R={r} G={g_max} skew=1 {mode} "
                                    f"{'hold-back' if holdback else 'no hold-back'} err={error}", {"group": "gate"}))
            if not args.no_compare and r == grid["replicas"][0]:
                for theta in ("1", "2"):
                    for gateway, engine in COMPARE:
                        cs = settings(r, 1, "0", "per_router", error, gateway, engine, theta)
                        rows.append(Row(cs, sources[r], f"compare R={r} gw={gateway} eng={engine} kv<{theta}M "
                                        f"err={error}", {"group": "compare"}))
    config = {"steps": args.steps, "warmup": warmup, "rate_per_tenant_per_replica": args.rate,
              "prompt": list(args.prompt), "output": list(args.output), "kv_budget": args.kv_budget,
              "weights": [str(w) for w in weights], "w_p": str(args.w_p), "w_q": str(args.w_q),
              "gateway_policy": args.gateway_policy, "engine_policy": args.engine_policy, "delay": args.delay,
              "holdback": not args.no_holdback, "saturation": args.saturation, "kv_threshold": str(args.kv_threshold),
              "queue_limit": args.queue_limit, "choice": args.choice, "grid": grid, "full": bool(args.full)}
    sw = Sweep(name=NAME, config=config, rows=rows, metrics=metrics, columns=COLUMNS, engine=ClusterEngine(),
               clients=False)
    return sweep_command.on_server(sw, args)


def metrics(results, rows) -> dict:
    """Per lane: weight_ratio (service of tenant 0 over tenant 1 in the steps from the
    warm-up on in which both were backlogged), weighted_share_error, max_drift (tokens per
    unit weight), throughput (weighted tokens per step, all replicas), p99_wait (steps from
    router arrival to admission), backlogged_fraction (of the measured steps)."""
    span = np.maximum(results.steps - np.asarray([r.settings.measure_from for r in rows]), 1)
    return {"weight_ratio": results.weight_ratio, "weighted_share_error": results.weighted_share_error,
            "max_drift": results.max_drift, "throughput": results.throughput,
            "p99_wait": results.wait_percentile(0.99),
            "backlogged_fraction": results.backlogged_steps / span}


# ---- output ------------------------------------------------------------------------------

def draw_ratio(result: dict, path: Path) -> None:
    """Achieved weight ratio against skew, one line per counter mode; one panel per
    (replicas, routers > 1) of the grid; the single-router rows as a dashed reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["setting"].get("group") == "grid"]
    panels = sorted({(r["setting"]["replicas"], r["setting"]["routers"]) for r in rows if r["setting"]["routers"] > 1})
    if not panels:
        panels = sorted({(r["setting"]["replicas"], 1) for r in rows})
    errors = sorted({r["setting"]["estimate_error"] for r in rows})
    dpi = 110 if len(panels) * len(errors) <= 4 else 60  # a full grid has 20 panels
    fig, axes = plt.subplots(len(errors), len(panels), figsize=(4.2 * len(panels), 3.4 * len(errors)), dpi=dpi,
                             squeeze=False)
    for ei, err in enumerate(errors):
        for pi, (rep, g) in enumerate(panels):
            ax = axes[ei][pi]
            base = [r for r in rows if r["setting"]["replicas"] == rep and r["setting"]["routers"] == 1
                    and r["setting"]["estimate_error"] == err]
            if base and base[0]["metrics"]["weight_ratio"]["mean"] is not None:
                ax.axhline(base[0]["metrics"]["weight_ratio"]["mean"], color="k", ls="--", lw=1, label="one router")
            mine = [r for r in rows if r["setting"]["replicas"] == rep and r["setting"]["routers"] == g
                    and r["setting"]["estimate_error"] == err]
            for mode in sorted({(r["setting"]["counters"], r["setting"].get("delay")) for r in mine}, key=str):
                pts = sorted((r["setting"]["skew"], r["metrics"]["weight_ratio"]) for r in mine
                             if (r["setting"]["counters"], r["setting"].get("delay")) == mode
                             and r["metrics"]["weight_ratio"]["mean"] is not None)
                if not pts:
                    continue
                mode = mode[0] if mode[1] is None else f"{mode[0]} (d={mode[1]})"
                x = np.asarray([p[0] for p in pts], float)
                y = np.asarray([p[1]["mean"] for p in pts], float)
                lo = np.asarray([p[1]["ci95"][0] for p in pts], float)
                hi = np.asarray([p[1]["ci95"][1] for p in pts], float)
                style = STYLES.get(mode.split(" ")[0], "o-")
                ax.plot(x, y, style, label=mode, alpha=0.85, markersize=7 if style.startswith("x") else 5)
                ax.fill_between(x, lo, hi, alpha=0.2)
            ax.axhline(4, color="g", lw=0.8, alpha=0.6)
            ax.axhline(1, color="r", lw=0.8, alpha=0.6)
            ax.set_title(f"R={rep}, G={g}, estimate error {err}", fontsize=9)
            ax.set_xlabel("ingress skew")
            ax.set_ylabel("achieved service ratio (weights 4:1)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


def main(argv=None) -> int:
    return guarded(f"python -m sweeps.{NAME}", lambda: _main(argv))


def _main(argv) -> int:
    from vtc_jax.driver.policy_modules import preload_policy_modules

    preload_policy_modules(sys.argv[1:] if argv is None else argv)
    parser = sweep_command.base_parser(NAME, __doc__)
    parser.set_defaults(seeds=DEFAULT_SEEDS)
    for action in parser._actions:
        if action.dest == "seeds":
            action.help = f"seeds per setting (default {DEFAULT_SEEDS})"
    add_arguments(parser)
    args = parser.parse_args(argv)
    sweep_command.setup_runtime(args)
    sw = build(args)
    fileio.check_writable_dir(args.out, sweep_outputs.output_names(sw, plots=False)
                              + ["ratio_vs_skew.png"] * (not args.no_plots))
    result = sweep.run_sweep(sw, args.seeds, base_seed=args.base_seed, chunk=args.chunk, devices=args.devices,
                             measures=MeasureConfig())
    print(sweep_outputs.format_table(sw, result))
    plots = [] if args.no_plots else [(Path(args.out) / "ratio_vs_skew.png", lambda p: draw_ratio(result, p))]
    written = sweep_outputs.write_outputs(sw, result, Path(args.out), plots=False, extra=plots)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
