"""Requests-per-minute caps against VTC: drift and throughput per RPM limit (the seed
document's fourth experiment). An RPM limit composes with any policy: --with vtc adds
VTC + the same limits."""

from __future__ import annotations

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import int_arg, list_arg
from vtc_jax.cli.sweep_command import add_workload_arguments, make_settings, workload_config, workload_is_default, workload_source
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.engines.settings import RPM_MODES
from vtc_jax.inputs.traffic import overload

RATES = "1.0,0.25"
PAPER_VALUES = {
    "rpm 5": {"max_drift": 3144, "throughput": 3.8},
    "rpm 20": {"max_drift": 6782, "throughput": 14.8},
    "rpm 40": {"max_drift": 23375, "throughput": 28.8},
    "rpm 80": {"max_drift": 44588, "throughput": 57.4},
    "rpm unlimited": {"max_drift": 248796, "throughput": 66.4},
    "vtc": {"max_drift": 6782, "throughput": 66.6},
}


def add_arguments(parser):
    add_workload_arguments(parser, rates=RATES)
    parser.add_argument("--limits", type=list_arg(int_arg(1, 1 << 30), name="limits", max_items=64),
                        default=[5, 20, 40, 80],
                        help="RPM limits (default 5,20,40,80; an unlimited row and VTC are always added)")
    parser.add_argument("--rpm-window", type=int_arg(1, 1 << 30), default=2000,
                        help="steps per 'minute' (default 2000)")
    parser.add_argument("--rpm-mode", choices=RPM_MODES, default="delay",
                        help="delay: over-limit requests wait (MODEL.md, default); reject: rejected at arrival over a "
                             "sliding window (the VTC artifact's baseline)")
    parser.add_argument("--with-vtc", action="store_true", help="also run VTC under each limit (RPM + VTC)")


def build(args) -> Sweep:
    source = workload_source(args, overload(args.rates, args.steps, prompt=args.prompt, output=args.output))
    limit = dict(rpm_window=args.rpm_window, rpm_mode=args.rpm_mode)
    rows = [Row(make_settings(args, "rpm", rpm_limit=r, baseline=True, **limit), source, f"rpm {r}") for r in args.limits]
    if args.with_vtc:
        rows += [Row(make_settings(args, "vtc", rpm_limit=r, **limit), source, f"vtc + rpm {r}") for r in args.limits]
    rows.append(Row(make_settings(args, "fcfs", baseline=True), source, "rpm unlimited"))
    rows.append(Row(make_settings(args, "vtc"), source, "vtc"))
    default = workload_is_default(args, RATES) and args.rpm_window == 2000 and args.rpm_mode == "delay"
    return Sweep(
        name="rpm", config=dict(workload_config(args), limits=args.limits, rpm_window=args.rpm_window,
                                rpm_mode=args.rpm_mode), rows=rows, metrics=base_metrics,
        columns=("max_drift", "throughput", "max_drift_over_2u", "backlogged_drift_over_2u"), measures=("pair_drift",),
        paper_values=PAPER_VALUES,
        default_workload=default,
        plots=(Plot("scatter", "throughput_vs_drift.png", "throughput vs max drift per RPM limit and VTC",
                    "max_drift", "throughput", ylabel="throughput (weighted tokens/step)", xlog=True),))


def main(argv=None) -> int:
    return sweep_command.main("rpm", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
