"""A long-horizon run past 2^31 of service: exactness, prefix agreement and cost.

One lane of the two-client overload workload (1.0 and 0.25 requests/step, prompts
U[64, 512], outputs U[32, 384]) at M = 32768, vtc, for `--steps` (default 10 million).
Checks that total service passes 2^31 (so int32 totals would have wrapped), that the
conservation ledger holds exactly, and that the first `--prefix` steps equal a separate
exact run of the same trace cut at that horizon (same admissions, same service at every
checkpoint). Prints the wall time and lane-steps per second.

    python -m benchmarks.long_horizon                    # 10M steps (minutes on a CPU)
    python -m benchmarks.long_horizon --steps 200000     # quick
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

from vtc_jax.cli.common import Parser, guarded, int_arg
from vtc_jax.driver import run as run_mod
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.sources import TrafficSource
from vtc_jax.inputs.traffic import overload
from vtc_jax.measures.online import ALL


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.long_horizon", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int_arg(2, 100_000_000), default=10_000_000)
    parser.add_argument("--prefix", type=int_arg(1, 100_000_000), default=100_000)
    parser.add_argument("--record-every", type=int_arg(1, 100_000_000), default=10_000)
    args = parser.parse_args(argv)
    if not args.prefix < args.steps:
        parser.error("--prefix must be below --steps")
    traffic = overload([1.0, 0.25], args.steps)
    settings = [Settings("vtc", 32768)]
    srcs = [TrafficSource(traffic)]
    config = run_mod.source_config(srcs, settings, args.record_every, measures=ALL)
    t0 = time.perf_counter()
    workload = jax.block_until_ready(run_mod.shared_workloads(srcs, [0], config))
    generated = time.perf_counter() - t0

    def run(horizon):  # the same requests, cut at `horizon`
        start = time.perf_counter()
        result = run_mod.run_workloads(workload, settings, [horizon], config=config, shared=False,
                                       event_budget=horizon + 3 * config.num_rows + 1)
        return result, time.perf_counter() - start

    long, long_s = run(args.steps)
    short, short_s = run(args.prefix)
    total = sum(long.service_exact[0])
    rows = args.prefix // args.record_every
    prefix_equal = np.array_equal(long.checkpoints[0][:rows], short.checkpoints[0][:rows])
    print(f"device: {jax.devices()[0].platform}; generation {generated:.1f} s")
    print(f"{args.steps:,} steps in {long_s:.1f} s ({args.steps / long_s:,.0f} lane-steps/s), finished "
          f"{bool(long.finished[0])}")
    print(f"total service {float(total):,.0f} = {float(total) / 2**31:.2f} x 2^31; per client "
          f"{[int(x) for x in long.service_exact[0]]}")
    print(f"conservation: {'holds' if not long.conservation[0] else long.conservation[0]}")
    print(f"first {args.prefix:,} steps equal a separate {args.prefix:,}-step run: {prefix_equal} "
          f"({rows} checkpoints; that run took {short_s:.1f} s)")
    ok = long.finished[0] and not long.conservation[0] and prefix_equal
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.long_horizon", lambda: main(sys.argv[1:])))
