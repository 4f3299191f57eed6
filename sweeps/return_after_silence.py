"""A client that was quiet, then silent, returns overloaded: its share of service (and the
steady client's service) in the window after the return, per scheduler."""

from __future__ import annotations

import numpy as np

from vtc_jax.settings import Settings
from vtc_jax.sweep import Plot, Row, Sweep, add_workload_arguments, base_metrics, main, workload_config
from vtc_jax.traffic import silence_and_return

POLICIES = ("fcfs", "lcf", "vtc")
SEED_VALUES = {
    "fcfs": {"returning_share": 0.019, "steady_service": 38390},
    "lcf": {"returning_share": 0.835, "steady_service": 6662},
    "vtc": {"returning_share": 0.502, "steady_service": 20400},
}


def add_arguments(parser):
    add_workload_arguments(parser, rates="1.0,1.0")
    parser.add_argument("--quiet-rate", type=float, default=0.02, help="client 0's rate before silence (default 0.02)")
    parser.add_argument("--quiet-until", type=int, default=2000, help="silence starts (default step 2000)")
    parser.add_argument("--return-at", type=int, default=4000, help="client 0 returns (default step 4000)")
    parser.add_argument("--window", type=int, default=600, help="measured steps after the return (default 600)")
    parser.add_argument("--record-every", type=int, default=50, help="share series stride (default 50)")


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
    return_rate, steady_rate = (args.rates + args.rates)[:2]
    traffic = silence_and_return(args.steps, quiet_rate=args.quiet_rate, quiet_until=args.quiet_until,
                                 silent_until=args.return_at, return_rate=return_rate, other_rates=[steady_rate],
                                 prompt=args.prompt, output=args.output)
    window = (args.return_at, min(args.return_at + args.window, args.steps))
    rows = [Row({"policy": p, "kv_budget": args.kv_budget, "rpm": None},
                Settings(p, args.kv_budget, w_p=args.w_p, w_q=args.w_q, share_window=window), traffic, p)
            for p in POLICIES]
    config = dict(workload_config(args), quiet_rate=args.quiet_rate, quiet_until=args.quiet_until,
                  return_at=args.return_at, window=list(window))
    return Sweep(
        name="return_after_silence", config=config, rows=rows, metrics=metrics,
        columns=("returning_share", "steady_service", "max_drift", "throughput"), seed_values=SEED_VALUES,
        series=share_series, record_every=args.record_every,
        plots=(Plot("series", "returning_share_over_time.png",
                    f"client 0's share of service per {args.record_every} steps (return at {args.return_at})",
                    "step", "returning_share", ylabel="returning client's share"),))


if __name__ == "__main__":
    raise SystemExit(main("return_after_silence", __doc__, add_arguments, build))
