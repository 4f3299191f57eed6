"""Speed of the `vllm` server (vtc_jax/servers/vllm_v1.py) on the engine, beside `ideal`.

Workload (bench_engine's: the seed's first experiment): two clients, Poisson 1.0 and 0.25
requests per step, prompts U[64, 512], outputs U[32, 384], 6000 steps, policy vtc. On
`vllm`: 513 blocks of 16 tokens (M = 8192, the ideal run's budget), a 2048-token budget,
256 seats, chunked prefill (vLLM's defaults off H100). Reported in lane-steps per second
(lanes x 6000 / seconds), all measured in this one run so a loaded machine shows as a lower
baseline too:
  engine alone   the compiled runner on pre-generated requests (best of --repeats), for
                 each server, in the server's slot tiers as the driver runs it
                 (driver/tiers.py run_in_tiers);
  end to end     one simulate_traffic call (generation, the run, results to the host);
  reference      vtc_jax/testing/vllm_reference.py (pure Python, the literal scheduler)
                 on one lane under fcfs, as the plain sequential implementation.

    python -m benchmarks.bench_vllm                   # 1024 and 4096 lanes (CPU)
    python -m benchmarks.bench_vllm --lanes 65536     # on a GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np

from benchmarks.bench_engine import engine_runner
from vtc_jax.cli.common import Parser, guarded, int_arg
from vtc_jax.core.fileio import check_writable_file
from vtc_jax.core.rows import ARRIVAL, ORDER, OUTPUT, PROMPT
from vtc_jax.driver import run as run_mod
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.traffic import overload
from vtc_jax.inputs.workload import client_rows
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.testing.vllm_reference import TraceRequest, simulate

STEPS, KV_BUDGET, RATES = 6000, 8192, (1.0, 0.25)
VLLM = (("block_size", 16), ("max_num_batched_tokens", 2048), ("max_num_seqs", 256), ("num_gpu_blocks", 513))
SERVERS = {"ideal": (), "vllm": VLLM}


def settings(lanes: int, server: str, policy: str = "vtc") -> list[Settings]:
    return [Settings(policy, KV_BUDGET, server_options=SERVERS[server])] * lanes


def engine_alone(lanes: int, server: str, repeats: int) -> tuple[float, float, int]:
    """(best seconds, compile-and-first-run seconds, events of the slowest lane)."""
    timed = engine_runner(settings(lanes, server), MeasureConfig(), server=server)
    first, events = timed()
    return min(timed()[0] for _ in range(repeats)), first, events


def end_to_end(lanes: int, server: str, seed0: int) -> float:
    traffic = overload(list(RATES), STEPS)
    start = time.perf_counter()
    result = run_mod.simulate_traffic([traffic] * lanes, settings(lanes, server), range(seed0, seed0 + lanes),
                                      measures=MeasureConfig(), server=server)
    if not result.finished.all():
        raise RuntimeError("a lane did not finish")
    return time.perf_counter() - start


def reference_rate(steps: int) -> float:
    """Steps per second of the literal scheduler on lane 0's requests (fcfs)."""
    traffic = overload(list(RATES), STEPS)
    config = run_mod.traffic_config([traffic], settings(1, "vllm"), measures=MeasureConfig(), server="vllm")
    rows = client_rows(run_mod.generate_workloads(run_mod._traffic_sources([traffic]), [0], config))[0]
    flat = np.concatenate([np.column_stack([r, np.full(len(r), k)]) for k, r in enumerate(rows)])
    flat = flat[flat[:, ARRIVAL] < steps]
    flat = flat[np.argsort(flat[:, ORDER], kind="stable")]
    reqs = [TraceRequest(int(r[ARRIVAL]), str(r[-1]), int(r[PROMPT]), int(r[OUTPUT])) for r in flat]
    cfg = dict(VLLM)
    cfg = {"num_blocks": cfg["num_gpu_blocks"], "block_size": 16, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
           "max_steps": 1000 * steps}
    start = time.perf_counter()
    out = simulate(reqs, cfg)
    seconds = time.perf_counter() - start
    return len(out["steps"]) / seconds


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.bench_vllm", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int_arg(1, 1 << 20), nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int_arg(1, 20), default=3)
    parser.add_argument("--servers", nargs="+", choices=sorted(SERVERS), default=list(SERVERS))
    parser.add_argument("--no-end-to-end", action="store_true", help="measure the engine alone only")
    parser.add_argument("--reference-steps", type=int_arg(10, STEPS), default=100,
                        help="arrival steps of the lane the reference drains (default 100)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.json:
        check_writable_file(args.json)  # before the run's minutes, not after
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind} x{jax.device_count()}, jax {jax.__version__}")
    ref = reference_rate(args.reference_steps)
    print(f"reference (vtc_jax/testing/vllm_reference.py, one lane, fcfs): {ref:,.0f} steps/s")
    out = {"device": f"{device.platform} {device.device_kind}", "reference_steps_per_s": ref, "rows": []}
    print("| server | lanes | engine alone M lane-steps/s | end to end M lane-steps/s | compile+first s | events |")
    print("|---|---|---|---|---|---|")
    for lanes in args.lanes:
        for server in args.servers:
            alone, first, events = engine_alone(lanes, server, args.repeats)
            e2e = float("nan") if args.no_end_to_end else end_to_end(lanes, server, seed0=100_000 + lanes)
            row = {"server": server, "lanes": lanes, "engine_alone": lanes * STEPS / alone / 1e6,
                   "end_to_end": lanes * STEPS / e2e / 1e6, "first_call_s": first, "events": events}
            out["rows"].append(row)
            print(f"| {server} | {lanes} | {row['engine_alone']:.3f} | {row['end_to_end']:.3f} | {first:.1f} "
                  f"| {events} |", flush=True)
    if args.json:
        from vtc_jax.core.fileio import write_text_atomically

        write_text_atomically(args.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.bench_vllm", lambda: main(sys.argv[1:])))
