"""A client that was quiet, then silent, returns overloaded: its share of service (and the
steady client's service) in the window after the return, per scheduler (the seed
document's second experiment)."""

from __future__ import annotations

import numpy as np

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import float_arg, int_arg
from vtc_jax.cli.sweep_command import add_workload_arguments, make_settings, workload_config, workload_is_default, workload_source
from vtc_jax.core.errors import InputError
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.inputs.traffic import silence_and_return

POLICIES = ("fcfs", "lcf", "vtc")
RATES = "1.0,1.0"
PAPER_VALUES = {
    "fcfs": {"returning_share": 0.019, "steady_service": 38390},
    "lcf": {"returning_share": 0.835, "steady_service": 6662},
    "vtc": {"returning_share": 0.502, "steady_service": 20400},
}


def add_arguments(parser):
    add_workload_arguments(parser, rates=RATES)
    parser.add_argument("--quiet-rate", type=float_arg(0.0, 1e6), default=0.02,
                        help="client 0's rate before its silence (default 0.02)")
    parser.add_argument("--quiet-until", type=int_arg(1), default=2000, help="silence starts (default step 2000)")
    parser.add_argument("--return-at", type=int_arg(1), default=4000, help="client 0 returns (default step 4000)")
    parser.add_argument("--window", type=int_arg(1), default=600, help="measured steps after the return (default 600)")
    parser.add_argument("--record-every", type=int_arg(1), default=50, help="share series stride (default 50)")


def metrics(results, rows):
    out = base_metrics(results, rows)
    out["returning_share"] = results.share[:, 0]
    out["steady_service"] = results.share_service[:, 1]
    return out


def share_series(results, rows):
    w = np.concatenate([np.zeros_like(results.checkpoints[:, :1]), results.checkpoints], axis=1)
    delta = np.diff(w, axis=1)
    total = delta.sum(axis=2)
    share = np.divide(delta[:, :, 0], total, out=np.full_like(total, np.nan), where=total > 0)
    return {"returning_share": np.nan_to_num(share, nan=0.0)}


def build(args) -> Sweep:
    if len(args.rates) != 2:
        raise InputError(f"--rates needs two rates (returning client, steady client), got {len(args.rates)}")
    if not args.quiet_until < args.return_at < args.steps:
        raise InputError(f"need --quiet-until {args.quiet_until} < --return-at {args.return_at} < --steps {args.steps}")
    if args.trace is not None:
        raise InputError("--trace does not apply: this sweep's workload is the silence-and-return pattern")
    return_rate, steady_rate = args.rates
    traffic = silence_and_return(args.steps, quiet_rate=args.quiet_rate, quiet_until=args.quiet_until,
                                 silent_until=args.return_at, return_rate=return_rate, other_rates=[steady_rate],
                                 prompt=args.prompt, output=args.output)
    window = (args.return_at, min(args.return_at + args.window, args.steps))
    source = workload_source(args, traffic)
    rows = [Row(make_settings(args, p, share_window=window, baseline=True), source, p) for p in POLICIES]
    config = dict(workload_config(args), quiet_rate=args.quiet_rate, quiet_until=args.quiet_until,
                  return_at=args.return_at, window=list(window))
    default = (workload_is_default(args, RATES) and args.quiet_rate == 0.02 and args.quiet_until == 2000
               and args.return_at == 4000 and args.window == 600)
    return Sweep(
        name="return_after_silence", config=config, rows=rows, metrics=metrics,
        columns=("returning_share", "steady_service", "max_drift", "throughput"), measures=("share",),
        paper_values=PAPER_VALUES, default_workload=default,
        series=share_series, record_every=args.record_every,
        plots=(Plot("series", "returning_share_over_time.png",
                    f"client 0's share of service per {args.record_every} steps (return at {args.return_at})",
                    "step", "returning_share", ylabel="returning client's share"),))


def main(argv=None) -> int:
    return sweep_command.main("return_after_silence", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
