"""FCFS, least-counter-first (no lift) and VTC on two permanently overloaded clients."""

from __future__ import annotations


from vtc_jax.settings import Settings
from vtc_jax.sweep import Plot, Row, Sweep, add_workload_arguments, base_metrics, main, workload_config
from vtc_jax.traffic import overload

POLICIES = ("fcfs", "lcf", "vtc")
SEED_VALUES = {  # the seed document's table
    "fcfs": {"max_drift": 248796, "drift_over_2u": 7.59, "throughput": 66.4},
    "lcf": {"max_drift": 5606, "drift_over_2u": 0.17, "throughput": 66.3},
    "vtc": {"max_drift": 6782, "drift_over_2u": 0.21, "throughput": 66.6},
}


def add_arguments(parser):
    add_workload_arguments(parser)
    parser.add_argument("--record-every", type=int, default=100, help="W_0 - W_1 series stride (default 100)")


def gap_series(results, rows):
    return {"w0_minus_w1": results.checkpoints[:, :, 0] - results.checkpoints[:, :, 1]}


def build(args) -> Sweep:
    traffic = overload(args.rates, args.steps, prompt=args.prompt, output=args.output)
    rows = [Row({"policy": p, "kv_budget": args.kv_budget, "rpm": None},
                Settings(p, args.kv_budget, w_p=args.w_p, w_q=args.w_q), traffic, p) for p in POLICIES]
    return Sweep(
        name="schedulers", config=workload_config(args), rows=rows, metrics=base_metrics,
        columns=("max_drift", "drift_over_2u", "throughput", "backlogged_drift"), seed_values=SEED_VALUES,
        series=gap_series, record_every=args.record_every,
        plots=(Plot("series", "gap_over_time.png", "W_0 - W_1 over time (mean, 95% band)", "step",
                    "w0_minus_w1", ylabel="W_0 - W_1 (weighted tokens)"),
               Plot("metric", "drift.png", "max drift per scheduler", "policy", "max_drift")))


if __name__ == "__main__":
    raise SystemExit(main("schedulers", __doc__, add_arguments, build))
