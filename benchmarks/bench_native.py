"""Engine speed against a native baseline: benchmarks/native/vtc_seed.c, a sequential C server.

The workload is bench_engine's (two clients, Poisson 1.0 and 0.25 requests per step, prompts
U[64, 512], outputs U[32, 384], M = 8192, 6000 steps, vtc, max drift every step); lane i's
requests come from the engine's own generator with seed i, as `bench_engine.engine_alone`'s.
For each lane count, in one run:
  native       the C binary, built here with the system's compiler (-O2), on the lanes'
               requests, one core; each lane's simulation timed inside C (best of
               --native-repeats), so reading the input and the process start are not counted;
  engine alone `bench_engine.engine_runner`'s compiled call (best of --repeats), every
               core jax uses;
timed in --rounds alternating rounds (native, then the engine): this shared machine's speed
drifts by up to 30% over minutes, so each round's ratio compares two timings seconds apart,
and the row reports the median round (native, engine and their ratio each the median of the
rounds; the ratio's range beside it). Once, tests/sequential.py on lane 0 (best of
--repeats). Every lane's native service, counters and max drift must equal the engine's
(`simulate_traffic` on the same seeds), and lane 0's must equal tests/sequential.py's:
otherwise one line names the lane and the exit status is 1.
No C compiler (cc, gcc, clang): one line "skipped: no C compiler", exit 0.

    python -m benchmarks.bench_native                       # 1, 256 and 4096 lanes
    python -m benchmarks.bench_native --lanes 4096 --rounds 5
    python -m benchmarks.bench_native --lanes 1 256 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from benchmarks.bench_engine import (KV_BUDGET, RATES, STEPS, engine_runner, lane_settings, measures_of, one_lane_rows,
                                     sequential_rate)
from tests.sequential import simulate_vtc
from vtc_jax.cli.common import Parser, guarded, int_arg, list_arg
from vtc_jax.core.fileio import check_writable_file
from vtc_jax.driver import run as run_mod
from vtc_jax.inputs.traffic import overload
from vtc_jax.inputs.workload import ARRIVAL, CACHED, ORDER, OUTPUT, PROMPT, client_rows
from vtc_jax.measures.online import MeasureConfig

SOURCE = Path(__file__).resolve().parent / "native" / "vtc_seed.c"
W_P, W_Q = 1, 2  # tests/sequential.py's units: a prefill token costs 1, a decoded token 2
GEN_CHUNK = 512  # lanes generated at a time (bounds the host memory of the 4096-lane input)


@dataclass(frozen=True)
class NativeLane:
    """One lane's result from the binary: integers in tests/sequential.py's units."""

    steps: int
    max_drift: int
    ns: int
    service: tuple[int, ...]
    counter: tuple[int, ...]


def find_compiler() -> str | None:
    """The first of cc, gcc, clang on PATH (None: there is none)."""
    return next((path for path in map(shutil.which, ("cc", "gcc", "clang")) if path), None)


def build(compiler: str, directory: str) -> str:
    """Compile vtc_seed.c into `directory`; the binary's path. A failed build raises with the compiler's message."""
    binary = os.path.join(directory, "vtc_seed")
    done = subprocess.run([compiler, "-std=c99", "-O2", "-o", binary, str(SOURCE)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{compiler} failed on {SOURCE.name}: {done.stderr.strip()[:500]}")
    return binary


def write_lanes(path: str, lanes, *, w_p: int = W_P, w_q: int = W_Q) -> int:
    """Write the binary's input: `lanes` yields (rows int[n, 5] of (arrival, client, prompt,
    output, cached) in trace order, num_clients, kv_budget, steps). Returns the lane count."""
    count = 0
    with open(path, "wb") as f:
        f.write(np.asarray([0, w_p, w_q], np.int32).tobytes())  # the lane count is patched in below
        for rows, k, m, steps in lanes:
            rows = np.asarray(rows, np.int64).reshape(-1, 5)
            if rows.size and (rows.min() < 0 or rows.max() > np.iinfo(np.int32).max):
                raise ValueError("a request field does not fit int32")
            f.write(np.asarray([len(rows), k, m, steps], np.int32).tobytes())
            f.write(np.ascontiguousarray(rows, np.int32).tobytes())
            count += 1
        f.seek(0)
        f.write(np.asarray([count], np.int32).tobytes())
    return count


def run_native(binary: str, path: str, repeats: int = 1) -> list[NativeLane]:
    """Run the binary on the input at `path`; one NativeLane per lane, in order."""
    out = path + ".out"
    subprocess.run([binary, path, out, str(repeats)], check=True)
    lanes = []
    for line in Path(out).read_text().splitlines():
        v = [int(x) for x in line.split()]
        k = (len(v) - 4) // 2
        lanes.append(NativeLane(v[1], v[2], v[3], tuple(v[4:4 + k]), tuple(v[4 + k:])))
    return lanes


def seed_lanes(lanes: int):
    """Lanes 0..lanes-1 of the seed workload, as `write_lanes` takes them: the requests the
    engine's generator draws for seed i (`one_lane_rows(i)`, a chunk of lanes at a time)."""
    traffic = overload(list(RATES), STEPS)
    for first in range(0, lanes, GEN_CHUNK):
        seeds = range(first, min(lanes, first + GEN_CHUNK))
        config = run_mod.traffic_config([traffic] * len(seeds), lane_settings(len(seeds), ["vtc"]),
                                        measures=MeasureConfig.of([]))
        rows = client_rows(run_mod.generate_workloads(run_mod._traffic_sources([traffic] * len(seeds)), seeds, config))
        b, k, n, _ = rows.shape
        client = np.broadcast_to(np.arange(k, dtype=np.int64)[None, :, None, None], (b, k, n, 1))
        flat = np.concatenate([rows, client], axis=-1).reshape(b, k * n, -1)
        flat = np.take_along_axis(flat, np.argsort(flat[:, :, ORDER], axis=1, kind="stable")[:, :, None], axis=1)
        for lane in flat:  # trace order sorts by arrival, so the requests within the horizon are a prefix
            kept = lane[lane[:, ARRIVAL] < STEPS]
            yield kept[:, [ARRIVAL, -1, PROMPT, OUTPUT, CACHED]], k, KV_BUDGET, STEPS


def engine_lanes(lanes: int, measures: MeasureConfig):
    """The engine's (service, counters, max drift) of lanes 0..lanes-1, exact."""
    traffic = overload(list(RATES), STEPS)
    got = run_mod.simulate_traffic([traffic] * lanes, lane_settings(lanes, ["vtc"]), range(lanes), measures=measures)
    return got.service_exact, got.counters_exact, got.max_drift_exact


def mismatch(native: list[NativeLane], engine) -> str | None:
    """A line naming the first lane where the native result differs from the engine's (None: all equal)."""
    service, counters, drift = engine
    for i, lane in enumerate(native):
        want = (tuple(service[i]), tuple(counters[i]), drift[i])
        if (lane.service, lane.counter, lane.max_drift) != want:
            return (f"lane {i}: native service {list(lane.service)}, counters {list(lane.counter)}, max drift "
                    f"{lane.max_drift}; engine {[str(x) for x in want[0]]}, {[str(x) for x in want[1]]}, {want[2]}")
    return None


def cores() -> int:
    """The cores this process (and so jax's CPU thread pool) may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.bench_native", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int_arg(1, 1 << 16), nargs="+", default=[1, 256, 4096])
    parser.add_argument("--rounds", type=int_arg(1, 20), default=3,
                        help="alternating rounds of native and engine timings (the median round is reported)")
    parser.add_argument("--repeats", type=int_arg(1, 20), default=2,
                        help="engine runs per round and sequential runs (best kept)")
    parser.add_argument("--native-repeats", type=int_arg(1, 1000), default=5, help="native runs of each lane (best kept)")
    parser.add_argument("--measures", type=list_arg(str, name="measures"), default=["pair_drift"],
                        help="measures the engine keeps (default pair_drift, as bench_engine)")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    if args.json:
        check_writable_file(args.json)  # before the run's minutes, not after
    compiler = find_compiler()
    if compiler is None:
        print("skipped: no C compiler")
        return 0
    measures, n_cores = measures_of(args.measures), cores()
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind} x{jax.device_count()}, jax {jax.__version__}, "
          f"{n_cores} cores, compiler {compiler} -O2, measures {','.join(args.measures)}")
    out = {"device": f"{device.platform} {device.device_kind}", "jax": jax.__version__, "cores": n_cores,
           "compiler": compiler, "measures": args.measures, "rows": []}
    with tempfile.TemporaryDirectory(prefix="bench_native_") as tmp:
        binary = build(compiler, tmp)
        flat = one_lane_rows()
        cols = [list(map(int, flat[:, f])) for f in (ARRIVAL, -1, PROMPT, OUTPUT, CACHED)]
        service, counter, drift = simulate_vtc(*cols, num_clients=2, kv_budget=KV_BUDGET, w_p=W_P, w_q=W_Q, steps=STEPS)
        seq = max(sequential_rate(flat) for _ in range(args.repeats))  # a collection of Python's garbage can cost 5x
        out["sequential_steps_per_s"] = seq
        print(f"sequential (tests/sequential.py, one lane, best of {args.repeats}): {seq:,.0f} steps/s")
        print(f"| lanes | native M steps/s (1 core) | engine alone M lane-steps/s ({n_cores} cores) "
              "| engine per core M | engine per core / native (range over rounds) | native / sequential "
              "| engine CPU s / wall s |")
        print("|---|---|---|---|---|---|---|")
        for lanes in args.lanes:
            path = os.path.join(tmp, f"lanes{lanes}.bin")
            write_lanes(path, seed_lanes(lanes))
            wall, cpu = time.perf_counter(), time.process_time()
            timed = engine_runner(lane_settings(lanes, ["vtc"]), measures)
            timed()  # compiles
            busy = (time.process_time() - cpu) / (time.perf_counter() - wall)  # generation, compile and first run
            rounds = []
            for _ in range(args.rounds):
                native = run_native(binary, path, args.native_repeats)
                first = native[0]
                if (first.service, first.counter, first.max_drift) != (tuple(service), tuple(counter), drift):
                    print(f"lane 0: native {list(first.service)}, {list(first.counter)}, {first.max_drift}; "
                          f"tests/sequential.py {service}, {counter}, {drift}")
                    return 1
                native_rate = sum(x.steps for x in native) / (sum(x.ns for x in native) * 1e-9)
                engine = lanes * STEPS / min(timed()[0] for _ in range(args.repeats))
                rounds.append((native_rate, engine, engine / n_cores / native_rate))
            os.remove(path)
            bad = mismatch(native, engine_lanes(lanes, measures))
            if bad is not None:
                print(f"{lanes} lanes, {bad}")
                return 1
            native_rate, engine, ratio = (statistics.median(r[i] for r in rounds) for i in range(3))
            row = {"lanes": lanes, "native_steps_per_s": native_rate, "engine_lane_steps_per_s": engine,
                   "engine_per_core": engine / n_cores, "engine_per_core_over_native": ratio,
                   "rounds": [{"native_steps_per_s": a, "engine_lane_steps_per_s": b, "engine_per_core_over_native": c}
                              for a, b, c in rounds],
                   "native_over_sequential": native_rate / seq, "engine_cores_busy": busy,
                   "cross_checked_lanes": len(native)}
            out["rows"].append(row)
            low, high = min(r[2] for r in rounds), max(r[2] for r in rounds)
            print(f"| {lanes} | {native_rate / 1e6:.2f} | {engine / 1e6:.3f} | {row['engine_per_core'] / 1e6:.3f} "
                  f"| {ratio:.3f} ({low:.3f}-{high:.3f}) | {row['native_over_sequential']:.0f}x | {busy:.2f} |",
                  flush=True)
    print("every lane's service, counters and max drift: native = engine (and lane 0 = tests/sequential.py)")
    if args.json:
        from vtc_jax.core.fileio import write_text_atomically

        write_text_atomically(args.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.bench_native", lambda: main(sys.argv[1:])))
