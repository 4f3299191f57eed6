"""Speed of the artifact profile (the slora server on the main engine, with the artifact's
schedulers: vtc_jax/driver/artifact_run.py) on the VTC paper's real trace.

Replays the real trace (data/vtc_real_trace.csv: 1,500 requests, 27 clients, 600 s) as
batches of B lanes (the paper's schedulers, repeated), compiles once per batch size
(timed apart), then times `--repeat` runs and reports, per batch size: wall seconds per
lane, CPU seconds per lane (process time: every thread of this process), lanes/s and
events/s. Every lane's results are checked against the first run's (same numbers).

  python -m benchmarks.artifact_bench                 # B = 1, 5, 10
  python -m benchmarks.artifact_bench --lanes 1,10,40 --repeat 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

from vtc_jax.cli.common import Parser, guarded, int_arg, list_arg
from vtc_jax.core.fileio import check_writable_file
from vtc_jax.driver import artifact_run as AR
from vtc_jax.engines import artifact as A
from vtc_jax.engines import artifact_inputs as AI

TRACE = Path(__file__).resolve().parents[1] / "data" / "vtc_real_trace.csv"
POLICIES = ("vtc", "fcfs", "lcf", "vtc_oracle", "vtc_predict")


def batch(num_lanes: int, cols: dict, profile: A.Profile, config: A.Config):
    lanes = [AI.make_trace(cols["arrival_s"], cols["client"], cols["prompt"], cols["output"],
                           input_extra=profile.input_extra, num_clients=config.num_clients)] * num_lanes
    return lanes, [AR.Scheduler(POLICIES[i % len(POLICIES)], profile=profile) for i in range(num_lanes)]


def measure(num_lanes: int, repeat: int, cols: dict, profile: A.Profile, config: A.Config) -> dict:
    lanes, scheds = batch(num_lanes, cols, profile, config)
    t0 = time.perf_counter()
    replays, done = AR.run(lanes, scheds, config.num_clients)  # compiles, then runs
    first_wall = time.perf_counter() - t0
    reference = [r.finish_us for r in replays]
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        replays, done = AR.run(lanes, scheds, config.num_clients)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if not (done.all() and all(np.array_equal(r.finish_us, f) for r, f in zip(replays, reference))):
            raise SystemExit("artifact_bench: a repeated run gave different results")
    wall, cpu = min(walls), min(cpus)
    events = sum(r.events for r in replays)
    return {"lanes": num_lanes, "compile_s": round(max(first_wall - wall, 0.0), 2), "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "wall_s_per_lane": round(wall / num_lanes, 3),
            "cpu_s_per_lane": round(cpu / num_lanes, 3), "lanes_per_s": round(num_lanes / wall, 2),
            "events_per_lane": events // num_lanes, "events_per_s": round(events / wall)}


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.artifact_bench", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=list_arg(int_arg(1, 4096), name="lanes"), default=[1, 5, 10],
                        help="batch sizes (default 1,5,10)")
    parser.add_argument("--repeat", type=int_arg(1, 100), default=2, help="timed runs per batch size (best kept)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")

    def body() -> int:
        args = parser.parse_args(argv)  # inside guarded: a bad flag is one line, exit 2
        if args.json:
            check_writable_file(args.json)  # before the run's minutes, not after
        cols = AI.read_trace_csv(TRACE)
        profile = A.Profile()
        workload = AR.Workload.fixed("real", cols)
        config = AR.ARTIFACT_ENGINE.config([_row(workload, profile)])
        cpu = platform.processor() or platform.machine()
        print(f"device {jax.devices()[0].platform} ({cpu}), jax {jax.__version__}, config {config}", flush=True)
        rows = []
        for b in args.lanes:
            row = measure(b, args.repeat, cols, profile, config)
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.json:
            from vtc_jax.core.fileio import write_text_atomically

            write_text_atomically(args.json, json.dumps({"jax": jax.__version__, "config": str(config), "rows": rows},
                                                        indent=1))
        return 0

    return guarded("python -m benchmarks.artifact_bench", body)


def _row(workload, profile):
    from vtc_jax.driver.sweep import Row

    return Row(AR.Scheduler("vtc", profile=profile), workload, "real vtc")


if __name__ == "__main__":
    sys.exit(main())
