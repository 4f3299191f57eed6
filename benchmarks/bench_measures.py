"""What the optional measures cost: the engine alone under several measure sets, one run.

On profile_event's workload (bench_engine's two clients at Poisson 1.0 and 0.25 requests
per step, prompts U[64, 512], outputs U[32, 384], M = 8192, 6000 steps, vtc), the same
lanes run to the end under each measure set in turn, --rounds times, alternating (a shared
machine drifts; alternating and taking each set's best cancels most of it):

  none                no optional measure (max drift and per-client service only);
  pair_drift          what `sweeps.schedulers` keeps per lane;
  pair_drift + series the same and its W series, a checkpoint every --record-every steps
                      (the schedulers sweep's gap plot; default 100, the sweep's default);
  every measure       all of them (the ledger, occupancy, demand, share, latency,
                      resource, pair drift) with the series.

It prints each set's events per step, its M lane-steps/s (lanes x 6000 / the best full
run) and its time against `none`. Every set's per-client service must equal none's on
every lane (the measures observe, never steer): otherwise one line and exit 1.

    python -m benchmarks.bench_measures                    # 2048 lanes, 3 rounds
    python -m benchmarks.bench_measures --lanes 4096 --rounds 2 --json measures.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import numpy as np

from benchmarks import profile_event
from benchmarks.bench_engine import on_lane_mesh
from vtc_jax.cli.common import Parser, guarded, int_arg
from vtc_jax.core.fileio import check_writable_file, write_text_atomically
from vtc_jax.driver import runner
from vtc_jax.engines.engine import PROGRAM
from vtc_jax.measures.online import MeasureConfig

# Events a lane may take one per step: every step, and an admission, completion and
# arrival per request (bench_engine's bound).
EXPECTED = profile_event.STEPS + 3 * int(sum(profile_event.TWO_RATES) * profile_event.STEPS)
ALL_MEASURES = ("ledger", "occupancy", "demand", "share", "latency", "resource", "pair_drift")


def measure_sets(record_every: int) -> list:
    """[(name, MeasureConfig, record_every)] in the order they run."""
    every = MeasureConfig.of(ALL_MEASURES)
    return [("none", MeasureConfig(), 0), ("pair_drift", MeasureConfig(pair_drift=True), 0),
            ("pair_drift + series", MeasureConfig(pair_drift=True), record_every),
            ("every measure", every, record_every)]


def configured(lanes: int, measures: MeasureConfig, record_every: int):
    """(config, batch) of profile_event's workload with these measures and checkpoints."""
    config, batch = profile_event.build(lanes, 2, measures)
    batch = jax.block_until_ready(on_lane_mesh(batch))  # placed once, as the drivers' lanes are
    if record_every:
        config = dataclasses.replace(config, record_every=record_every,
                                     num_checkpoints=profile_event.STEPS // record_every + 1)
    return config, batch


def run_to_end(config, batch):
    """The host carry after every lane finished (the project's runner, as bench_engine's
    engine alone: its event budget from the requests, its chunks from what it expects)."""
    host, done = runner.run(PROGRAM, config, batch, None, event_budget=4 * EXPECTED, expected_events=EXPECTED)
    if not np.asarray(done).all():
        raise RuntimeError("a lane did not finish")
    return host


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.bench_measures", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int_arg(1, 1 << 16), default=2048)
    parser.add_argument("--rounds", type=int_arg(1, 20), default=3)
    parser.add_argument("--record-every", type=int_arg(1, profile_event.STEPS), default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.json:
        check_writable_file(args.json)
    sets = [(name, configured(args.lanes, m, every)) for name, m, every in measure_sets(args.record_every)]
    base = None
    events = {}
    for name, (config, batch) in sets:  # compile, and check the measures steer nothing
        carry = run_to_end(config, batch)
        service = np.asarray(carry.service)
        if base is None:
            base = service
        elif not np.array_equal(service, base):
            print(f"bench_measures: {name} changed the service of lane "
                  f"{int(np.argwhere((service != base).reshape(len(base), -1).any(axis=1))[0, 0])}")
            return 1
        events[name] = float(np.asarray(carry.iterations).mean()) / profile_event.STEPS
    times = {name: [] for name, _ in sets}
    for _ in range(args.rounds):
        for name, (config, batch) in sets:
            start = time.perf_counter()
            run_to_end(config, batch)
            times[name].append(time.perf_counter() - start)
    device = jax.devices()[0]
    print(f"device: {device.platform} x{jax.device_count()}, jax {jax.__version__}, {args.lanes} lanes, "
          f"best of {args.rounds} alternating rounds")
    print("| measures | events per step | M lane-steps/s | time vs none |")
    print("|---|---|---|---|")
    rows = []
    for name, _ in sets:
        best = min(times[name])
        rate = args.lanes * profile_event.STEPS / best / 1e6
        ratio = best / min(times["none"])
        rows.append({"measures": name, "events_per_step": events[name], "lane_steps_per_s": rate * 1e6,
                     "time_vs_none": ratio, "seconds": times[name]})
        print(f"| {name} | {events[name]:.3f} | {rate:.2f} | {ratio:.2f}x |")
    if args.json:
        write_text_atomically(args.json, json.dumps({"lanes": args.lanes, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.bench_measures", lambda: main(sys.argv[1:])))
