"""VTC's drift against the KV budget M, beside the bound 2 * w_q * M."""

from __future__ import annotations

from vtc_jax.settings import Settings
from vtc_jax.sweep import Plot, Row, Sweep, add_workload_arguments, base_metrics, main, workload_config
from vtc_jax.traffic import overload

SEED_VALUES = {
    "M=2048": {"max_drift": 2299, "bound": 8192, "drift_over_total": 0.023},
    "M=4096": {"max_drift": 3268, "bound": 16384, "drift_over_total": 0.017},
    "M=8192": {"max_drift": 6782, "bound": 32768, "drift_over_total": 0.017},
    "M=16384": {"max_drift": 17753, "bound": 65536, "drift_over_total": 0.022},
    "M=32768": {"max_drift": 36014, "bound": 131072, "drift_over_total": 0.023},
}


def _budgets(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def add_arguments(parser):
    add_workload_arguments(parser)
    parser.add_argument("--budgets", type=_budgets, default=[2048, 4096, 8192, 16384, 32768],
                        help="KV budgets M to sweep (default 2048,4096,8192,16384,32768)")
    parser.add_argument("--policy", default="vtc", help="scheduler (default vtc)")


def metrics(results, rows):
    out = base_metrics(results, rows)
    out["bound"] = 2 * results.kv_budget * float(rows[0].settings.w_q) + 0 * results.max_drift
    return out


def build(args) -> Sweep:
    traffic = overload(args.rates, args.steps, prompt=args.prompt, output=args.output)
    rows = [Row({"policy": args.policy, "kv_budget": m, "rpm": None},
                Settings(args.policy, m, w_p=args.w_p, w_q=args.w_q), traffic, f"M={m}") for m in args.budgets]
    return Sweep(
        name="kv_budget", config=dict(workload_config(args), budgets=args.budgets), rows=rows, metrics=metrics,
        columns=("max_drift", "bound", "drift_over_total", "drift_over_2u", "throughput"), seed_values=SEED_VALUES,
        plots=(Plot("metric", "drift_vs_kv_budget.png", "max drift vs KV budget (bound 2 w_q M dashed)",
                    "kv_budget", "max_drift", extra="bound", xlog=True),))


if __name__ == "__main__":
    raise SystemExit(main("kv_budget", __doc__, add_arguments, build))
