"""One event's cost on the `vllm` server (bench_vllm's workload, a mid-run state), for
tuning the server's per-event work: milliseconds per event of every lane (wall and this
process's CPU time, best of --repeats; the CPU time is steadier on a shared machine) and
nanoseconds per lane-event.

    PYTHONPATH=. python -m benchmarks.bench_vllm_event --lanes 1024 --slots 32
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import bench_vllm
from vtc_jax.cli.common import Parser, guarded, int_arg
from vtc_jax.driver import run as run_mod
from vtc_jax.driver import runner
from vtc_jax.engines.engine import PROGRAM, EngineBatch, LaneInput
from vtc_jax.engines.settings import encode_settings
from vtc_jax.inputs.traffic import overload
from vtc_jax.measures.online import MeasureConfig


def event_cost(lanes: int, slots: int, server: str, warm: int, events: int, repeats: int) -> tuple[float, float]:
    """(wall, cpu) seconds per event of `lanes` lanes with `slots` slots after `warm` events."""
    steps = 1000
    traffic = overload(list(bench_vllm.RATES), steps)
    settings = bench_vllm.settings(lanes, server)
    config = run_mod.traffic_config([traffic] * lanes, settings, measures=MeasureConfig(), server=server)
    config = dataclasses.replace(config, slots=slots)
    srcs = run_mod._traffic_sources([traffic] * lanes)
    workload = run_mod.with_timeline(run_mod.generate_workloads(srcs, range(lanes), config), batched=True)
    params, _ = encode_settings(settings, 2, config.policies, server)
    batch = EngineBatch(lane=LaneInput(params=params, horizon=jnp.full(lanes, steps, jnp.int32)), workload=workload)
    carry = runner.init(batch, None, program=PROGRAM, config=config)
    carry = runner.advance(carry, batch, None, np.int32(warm), program=PROGRAM, config=config)
    jax.block_until_ready(carry)
    wall = cpu = float("inf")
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(runner.advance(carry, batch, None, np.int32(events), program=PROGRAM, config=config))
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return wall / events, cpu / events


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.bench_vllm_event", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int_arg(1, 1 << 20), default=1024)
    parser.add_argument("--slots", type=int_arg(1, 4096), nargs="+", default=[32])
    parser.add_argument("--server", default="vllm", choices=sorted(bench_vllm.SERVERS))
    parser.add_argument("--events", type=int_arg(1, 1 << 20), default=200)
    parser.add_argument("--repeats", type=int_arg(1, 20), default=3)
    args = parser.parse_args(argv)
    for slots in args.slots:
        wall, cpu = event_cost(args.lanes, slots, args.server, 300, args.events, args.repeats)
        print(f"{args.server} lanes {args.lanes} slots {slots}: wall {wall * 1e3:.3f} ms/event, cpu {cpu * 1e3:.3f} "
              f"ms/event, {wall / args.lanes * 1e9:.0f} ns/lane-event (wall)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.bench_vllm_event", lambda: main(sys.argv[1:])))
