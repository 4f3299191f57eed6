"""Per-client KV caps under VTC: the drift a cap buys and the throughput it costs, against
uncapped VTC. A capped client holds at most `cap` KV tokens (reserved as prompt + output
at admission, so the cap holds at every step)."""

from __future__ import annotations

from vtc_jax.settings import Settings
from vtc_jax.sweep import Plot, Row, Sweep, add_workload_arguments, base_metrics, main, workload_config
from vtc_jax.traffic import overload


def _caps(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def add_arguments(parser):
    add_workload_arguments(parser)
    parser.add_argument("--caps", type=_caps, default=[1024, 2048, 3072, 4096, 6144],
                        help="per-client KV caps in tokens (default 1024,2048,3072,4096,6144; "
                             "uncapped VTC is always added)")
    parser.add_argument("--policy", default="vtc", help="scheduler (default vtc)")


def build(args) -> Sweep:
    traffic = overload(args.rates, args.steps, prompt=args.prompt, output=args.output)
    m = args.kv_budget
    rows = [Row({"policy": args.policy, "kv_budget": m, "rpm": None, "kv_cap": cap, "cap_value": cap},
                Settings(args.policy, m, w_p=args.w_p, w_q=args.w_q, kv_cap=cap), traffic, f"cap {cap}")
            for cap in args.caps]
    rows.append(Row({"policy": args.policy, "kv_budget": m, "rpm": None, "kv_cap": None, "cap_value": m},
                    Settings(args.policy, m, w_p=args.w_p, w_q=args.w_q), traffic, "uncapped"))
    return Sweep(
        name="kv_cap", config=dict(workload_config(args), caps=args.caps), rows=rows, metrics=base_metrics,
        columns=("max_drift", "throughput", "mean_occupancy", "drift_over_2u"),
        plots=(Plot("scatter", "throughput_vs_drift.png", "KV caps: throughput vs max drift",
                    "max_drift", "throughput"),
               Plot("metric", "drift_vs_cap.png", "max drift vs per-client cap (uncapped = M)", "cap_value",
                    "max_drift")))


if __name__ == "__main__":
    raise SystemExit(main("kv_cap", __doc__, add_arguments, build))
