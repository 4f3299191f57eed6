"""Per-client KV caps under VTC: the drift a cap buys and the throughput it costs, against
uncapped VTC. A capped client holds at most `cap` KV tokens (reserved as prompt + output
at admission, so the cap holds at every step)."""

from __future__ import annotations

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import int_arg, list_arg
from vtc_jax.cli.sweep_command import add_workload_arguments, make_settings, workload_config, workload_source
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.inputs.traffic import overload
from vtc_jax.policies import registry


def add_arguments(parser):
    add_workload_arguments(parser)
    parser.add_argument("--caps", type=list_arg(int_arg(1, 1 << 30), name="caps", max_items=64),
                        default=[1024, 2048, 3072, 4096, 6144],
                        help="per-client KV caps in tokens (default 1024,2048,3072,4096,6144; "
                             "uncapped is always added)")
    parser.add_argument("--policy", choices=registry.names(), default="vtc", help="scheduler (default vtc)")


def build(args) -> Sweep:
    source = workload_source(args, overload(args.rates, args.steps, prompt=args.prompt, output=args.output))
    rows = [Row(make_settings(args, args.policy, kv_cap=cap), source, f"cap {cap}", {"cap_value": cap})
            for cap in args.caps]
    rows.append(Row(make_settings(args, args.policy), source, "uncapped", {"cap_value": args.kv_budget}))
    return Sweep(
        name="kv_cap", config=dict(workload_config(args), caps=args.caps, policy=args.policy), rows=rows,
        metrics=base_metrics, columns=("max_drift", "throughput", "mean_occupancy", "max_drift_over_2u"),
        measures=("occupancy",),
        plots=(Plot("scatter", "throughput_vs_drift.png", "KV caps: throughput vs max drift",
                    "max_drift", "throughput"),
               Plot("metric", "drift_vs_cap.png", "max drift vs per-client cap (uncapped = M)", "cap_value",
                    "max_drift")))


def main(argv=None) -> int:
    return sweep_command.main("kv_cap", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
