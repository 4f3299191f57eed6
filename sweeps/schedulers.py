"""FCFS, least-counter-first (no lift) and VTC on two permanently overloaded clients (the
seed document's first experiment), or on your own --trace."""

from __future__ import annotations

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import int_arg
from vtc_jax.cli.sweep_command import add_workload_arguments, make_settings, workload_config, workload_is_default, workload_source
from vtc_jax.core.errors import InputError
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.inputs.traffic import overload

POLICIES = ("fcfs", "lcf", "vtc")
RATES = "1.0,0.25"
PAPER_VALUES = {  # the seed document's table (one run each)
    "fcfs": {"max_drift": 248796, "max_drift_over_2u": 7.59, "throughput": 66.4},
    "lcf": {"max_drift": 5606, "max_drift_over_2u": 0.17, "throughput": 66.3},
    "vtc": {"max_drift": 6782, "max_drift_over_2u": 0.21, "throughput": 66.6},
}


def add_arguments(parser):
    add_workload_arguments(parser, rates=RATES)
    parser.add_argument("--record-every", type=int_arg(1), default=100, help="service series stride (default 100)")


def gap_series(results, rows):
    """Each client's service minus the clients' mean, over time: float64[B, C, K]."""
    w = results.checkpoints
    return {"service_minus_mean": w - w.mean(axis=2, keepdims=True)}


def build(args) -> Sweep:
    if not 1 <= args.record_every <= args.steps:
        raise InputError("--record-every must be in [1, --steps]")
    source = workload_source(args, overload(args.rates, args.steps, prompt=args.prompt, output=args.output))
    rows = [Row(make_settings(args, p, baseline=True), source, p) for p in POLICIES]
    return Sweep(
        name="schedulers", config=workload_config(args), rows=rows, metrics=base_metrics,
        columns=("max_drift", "max_drift_over_2u", "throughput", "backlogged_drift", "backlogged_drift_over_2u"),
        measures=("pair_drift",),
        paper_values=PAPER_VALUES, default_workload=workload_is_default(args, RATES),
        series=gap_series, record_every=args.record_every,
        plots=(Plot("series", "gap_over_time.png", "each client's service minus the mean of all clients",
                    "step", "service_minus_mean", ylabel="W_k - mean W (weighted tokens)"),
               Plot("metric", "drift.png", "max drift per scheduler (log scale when values differ by > 10x)",
                    "policy", "max_drift")))


def main(argv=None) -> int:
    return sweep_command.main("schedulers", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
