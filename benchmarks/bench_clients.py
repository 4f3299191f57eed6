"""Cost of many clients per lane: bytes per lane and lane-steps per second against K.

Workload: K clients with equal Poisson rates 1.25 / K requests per step (1.25 in all: the
server is overloaded whatever K), prompts U[64, 512], outputs U[32, 384], M = 8192, 6000
steps, policy vtc, no optional measures (as issue 15's reference numbers) unless
--measures; then the same K with ServeGen's 87 real tenants (data/servegen/m-large at load
1.5) when K = 87 is asked.

Per K: the lane's state bytes (every array of the engine's state: counters, FIFO
pointers, calendar, measures, policy tables), its workload bytes (request rows and
timeline), and lane-steps per second end to end, warm (generation, run, collection; the
compile is done by a first call on other seeds), all K measured in one run: --repeats
rounds, each timing every K once on fresh seeds, the best of each K (a warm run of 512
lanes lasts about a second, and on a shared machine one such run of K = 2 varied from 2.5
to 4.1 M lane-steps/s within ten minutes).

    python -m benchmarks.bench_clients                 # K = 2, 16, 87, 256 at 512 lanes
    python -m benchmarks.bench_clients --lanes 4096 --clients 2 87
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks.bench_engine import measures_of
from vtc_jax.cli.common import Parser, guarded, int_arg, list_arg
from vtc_jax.core.fileio import check_writable_file
from vtc_jax.driver import run as run_mod
from vtc_jax.engines.engine import PROGRAM, EngineBatch, LaneInput
from vtc_jax.engines.settings import Settings, encode_settings
from vtc_jax.inputs import servegen
from vtc_jax.inputs.sources import ServeGenSource, TrafficSource
from vtc_jax.inputs.traffic import overload
from vtc_jax.inputs.workload import add_timeline
from vtc_jax.measures.online import MeasureConfig

STEPS, KV_BUDGET = 6000, 8192
DATA = Path(__file__).resolve().parent.parent / "data" / "servegen" / "m-large"


def lane_bytes(src, settings: Settings, measures: MeasureConfig) -> tuple[int, int]:
    """(state bytes, workload bytes) of one lane, from the shapes the program would build."""
    config = run_mod.source_config([src], [settings], measures=measures)
    workload = run_mod.generate_workloads([src], [0], config)
    params, _ = encode_settings([settings], src.num_clients, config.policies)
    lane = jax.tree_util.tree_map(lambda x: x[0], LaneInput(params=params, horizon=np.full(1, STEPS, np.int32)))
    one = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), workload)
    one = jax.eval_shape(add_timeline, dataclasses.replace(one, timeline=None))
    state = jax.eval_shape(lambda w: PROGRAM.init(config, EngineBatch(lane=lane, workload=w), None), one)
    size = lambda tree: sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))  # noqa
    return size(state), size(one)


def rate(srcs, lanes: int, measures: MeasureConfig, seed0: int) -> float:
    """Lane-steps per second of one warm run of `lanes` lanes on seeds from `seed0`."""
    settings = [Settings("vtc", srcs[0].plan.kv_budget if srcs[0].kind == "servegen" else KV_BUDGET)] * lanes
    start = time.perf_counter()
    result = run_mod.simulate_sources(srcs, settings, range(seed0, seed0 + lanes), measures=measures)
    seconds = time.perf_counter() - start
    if not result.finished.all():
        raise RuntimeError("a lane did not finish")
    return lanes * srcs[0].horizon / seconds


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.bench_clients", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int_arg(1, 1 << 20), default=512)
    parser.add_argument("--clients", type=int_arg(1, 4096), nargs="+", default=[2, 16, 87, 256])
    parser.add_argument("--measures", type=list_arg(str, name="measures"), default=["none"])
    parser.add_argument("--no-servegen", action="store_true", help="skip the ServeGen row")
    parser.add_argument("--repeats", type=int_arg(1, 100), default=3,
                        help="timed rounds, every K once a round (alternating: the machine's drift hits each alike); "
                             "the best of each K")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.json:
        check_writable_file(args.json)  # before the run's minutes, not after
    measures = measures_of(args.measures)
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind} x{jax.device_count()}, jax {jax.__version__}, {args.lanes} lanes, "
          f"measures {','.join(args.measures)}")
    print("| workload | K | state bytes/lane | workload bytes/lane | "
          f"M lane-steps/s (end to end, warm, best of {args.repeats}) | vs K=2 |")
    print("|---|---|---|---|---|---|")
    rows, base = [], None
    cases = [("poisson", k) for k in args.clients]
    if 87 in args.clients and not args.no_servegen:
        cases.append(("servegen", 87))
    srcs = []
    for i, (kind, k) in enumerate(cases):
        if kind == "poisson":
            src = TrafficSource(overload([1.25 / k] * k, STEPS))
        else:
            plan = servegen.plan(servegen.read_servegen(str(DATA)), load=1.5, kv_budget=KV_BUDGET, horizon=STEPS,
                                 max_output=4096)
            src = ServeGenSource(plan)
        rate([src] * args.lanes, args.lanes, measures, seed0=100_000 * (i + 1))  # compile, on other seeds
        srcs.append(src)
    best = [0.0] * len(cases)
    for round_ in range(args.repeats):
        for i, src in enumerate(srcs):
            seed0 = 100_000 * (i + 1) + (round_ + 1) * args.lanes
            best[i] = max(best[i], rate([src] * args.lanes, args.lanes, measures, seed0=seed0))
    for (kind, k), src, r in zip(cases, srcs, best):
        state_b, work_b = lane_bytes(src, Settings("vtc", KV_BUDGET), measures)
        if kind == "poisson" and k == 2:
            base = r
        ratio = r / base if base else float("nan")
        rows.append({"workload": kind, "clients": k, "state_bytes": state_b, "workload_bytes": work_b,
                     "lane_steps_per_s": r, "over_k2": ratio})
        print(f"| {kind} | {k} | {state_b:,} | {work_b:,} | {r / 1e6:.3f} | {ratio:.2f} |", flush=True)
    if args.json:
        from vtc_jax.core.fileio import write_text_atomically

        write_text_atomically(args.json, json.dumps({"lanes": args.lanes, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.bench_clients", lambda: main(sys.argv[1:])))
