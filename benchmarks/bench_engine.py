"""Engine throughput on the two-client overload workload, against the slow reference.

Workload (issue 2): Poisson arrivals, client 0 at 1.0 and client 1 at 0.25 requests per
step, prompts uniform in [64, 512], outputs uniform in [32, 384], M = 8192, 6000 steps,
policy vtc. Prints the device, compile time apart, lane-steps per second (median of
`--repeats` warm runs, each ending in block_until_ready) per lane count, and the ratio to
the slow literal reference (tests/reference.py) timed in the same process.

    python -m benchmarks.bench_engine                 # 1, 256, 4096 lanes (CPU)
    python -m benchmarks.bench_engine --lanes 16384 65536   # on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from tests import reference as ref
from vtc_jax.devices import lane_mesh, pad_to, shard
from vtc_jax.engine import EngineConfig, advance_lanes, init_lanes
from vtc_jax.measures import MeasureConfig
from vtc_jax.run import default_chunk, generate_lanes, lane_keys, run_lanes, stack_traffic
from vtc_jax.settings import Settings, encode_settings
from vtc_jax.traffic import overload, stream_capacity

STEPS, KV_BUDGET = 6000, 8192


MEASURES = {"all": MeasureConfig(), "minimal": MeasureConfig(pair_drift=False, latency=False, resource=False)}


def workload(lanes: int, traffic, mesh=None, measures: str = "all"):
    capacity = stream_capacity(traffic)
    keys, params = lane_keys(range(lanes)), stack_traffic([traffic] * lanes)
    if mesh is not None:
        keys, params = shard((keys, params), mesh)
    wl = generate_lanes(keys, params, horizon=STEPS, capacity=capacity, pad=5)
    config = EngineConfig(num_clients=2, stream_len=capacity + 5, calendar_len=traffic.max_lengths()[1],
                          measures=MEASURES[measures])
    return jax.block_until_ready(wl), config


def time_engine(lanes: int, traffic, repeats: int, mesh, measures: str = "all") -> dict:
    lanes = pad_to(lanes, mesh)
    wl, config = workload(lanes, traffic, mesh, measures)
    settings = [Settings("vtc", KV_BUDGET)] * lanes
    params, _ = encode_settings(settings, 2)
    chunk = default_chunk(STEPS)
    state0 = init_lanes(np.full(lanes, STEPS, np.int32), config=config)
    state0, params = shard((state0, params), mesh)
    t0 = time.perf_counter()
    advance_lanes.lower(state0, wl, params, config=config, num_events=chunk,
                        shared_workload=False).compile()
    compile_s = time.perf_counter() - t0

    def once():
        t = time.perf_counter()
        state, _, finished = run_lanes(wl, settings, [STEPS] * lanes, config=config, event_budget=10 * STEPS,
                                       shared_workload=False, chunk=chunk, mesh=mesh)
        jax.block_until_ready(state)
        assert finished.all(), "a lane did not finish"
        return time.perf_counter() - t, int(np.asarray(state.iterations).max())

    first, _ = once()  # fills the jit cache (compiles again: AOT executables are not shared)
    runs = [once() for _ in range(repeats)]
    seconds = statistics.median(r[0] for r in runs)
    return {"lanes": lanes, "compile_s": compile_s, "first_call_s": first, "run_s": seconds,
            "events": runs[0][1], "lane_steps_per_s": lanes * STEPS / seconds}


def time_reference(traffic) -> float:
    """Steps per second of the literal reference on one lane of the same workload."""
    wl, _ = workload(1, traffic)
    rows = np.asarray(wl.requests[0])
    requests = [ref.Request(int(r[0]), k, int(r[2]), int(r[3]), int(r[4]))
                for k in range(rows.shape[0]) for r in rows[k] if r[0] < STEPS]
    t = time.perf_counter()
    result = ref.simulate(requests, num_clients=2, kv_budget=KV_BUDGET, policy="vtc", steps=STEPS)
    return result.steps / (time.perf_counter() - t)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int, nargs="+", default=None,
                        help="lane counts (default 1 256 4096 on CPU, plus 16384 65536 on GPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--devices", type=int, default=None, help="shard lanes over the first N devices (default all)")
    parser.add_argument("--no-reference", action="store_true", help="skip timing the slow reference")
    parser.add_argument("--measures", choices=sorted(MEASURES), default="all",
                        help="all measures (what sweeps use) or minimal (drift, service, counts: the core engine)")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    mesh = lane_mesh(args.devices)
    lanes = args.lanes or ([1, 256, 4096] + ([16384, 65536] if device.platform == "gpu" else []))
    traffic = overload([1.0, 0.25], STEPS)
    print(f"device: {device.platform} {device.device_kind}, lanes sharded over {mesh.devices.size} of "
          f"{jax.device_count()} device(s); jax {jax.__version__}; measures: {args.measures}")
    ref_rate = float("nan") if args.no_reference else time_reference(traffic)
    print(f"slow reference: {ref_rate:,.0f} steps/s (one lane, pure Python)")
    print(f"{'lanes':>6} {'compile s':>9} {'1st call s':>10} {'run s':>8} {'events':>7} "
          f"{'M lane-steps/s':>14} {'x reference':>11}")
    for n in lanes:
        r = time_engine(n, traffic, args.repeats, mesh, args.measures)
        print(f"{n:>6} {r['compile_s']:>9.2f} {r['first_call_s']:>10.2f} {r['run_s']:>8.3f} {r['events']:>7} "
              f"{r['lane_steps_per_s'] / 1e6:>14.2f} {r['lane_steps_per_s'] / ref_rate:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
