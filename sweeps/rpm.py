"""Requests-per-minute caps against VTC: drift and throughput per RPM limit."""

from __future__ import annotations

from vtc_jax.settings import Settings
from vtc_jax.sweep import Plot, Row, Sweep, add_workload_arguments, base_metrics, main, workload_config
from vtc_jax.traffic import overload

SEED_VALUES = {
    "rpm 5": {"max_drift": 3144, "throughput": 3.8},
    "rpm 20": {"max_drift": 6782, "throughput": 14.8},
    "rpm 40": {"max_drift": 23375, "throughput": 28.8},
    "rpm 80": {"max_drift": 44588, "throughput": 57.4},
    "rpm unlimited": {"max_drift": 248796, "throughput": 66.4},
    "vtc": {"max_drift": 6782, "throughput": 66.6},
}


def _limits(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def add_arguments(parser):
    add_workload_arguments(parser)
    parser.add_argument("--limits", type=_limits, default=[5, 20, 40, 80],
                        help="RPM limits (default 5,20,40,80; an unlimited row and VTC are always added)")
    parser.add_argument("--rpm-window", type=int, default=2000, help="steps per 'minute' (default 2000)")


def build(args) -> Sweep:
    traffic = overload(args.rates, args.steps, prompt=args.prompt, output=args.output)
    m = args.kv_budget
    rows = [Row({"policy": "rpm", "kv_budget": m, "rpm": r},
                Settings("rpm", m, w_p=args.w_p, w_q=args.w_q, rpm_limit=r, rpm_window=args.rpm_window),
                traffic, f"rpm {r}") for r in args.limits]
    rows.append(Row({"policy": "rpm", "kv_budget": m, "rpm": None},  # no limit: FCFS
                    Settings("fcfs", m, w_p=args.w_p, w_q=args.w_q), traffic, "rpm unlimited"))
    rows.append(Row({"policy": "vtc", "kv_budget": m, "rpm": None},
                    Settings("vtc", m, w_p=args.w_p, w_q=args.w_q), traffic, "vtc"))
    return Sweep(
        name="rpm", config=dict(workload_config(args), limits=args.limits, rpm_window=args.rpm_window),
        rows=rows, metrics=base_metrics, columns=("max_drift", "throughput", "drift_over_2u"),
        seed_values=SEED_VALUES,
        plots=(Plot("scatter", "throughput_vs_drift.png", "throughput vs max drift per RPM limit and VTC",
                    "max_drift", "throughput", ylabel="throughput (weighted tokens/step)"),))


if __name__ == "__main__":
    raise SystemExit(main("rpm", __doc__, add_arguments, build))
