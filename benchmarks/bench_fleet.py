"""Speed of the fleet (docs/FLEET.md) beside one vllm server, in one run.

Workload: bench_vllm's (two clients, Poisson 1.0 and 0.25 requests per step, prompts
U[64, 512], outputs U[32, 384], policy vtc, 513 blocks of 16 tokens, a 2048-token budget,
256 seats, chunked prefill) for --steps steps, no step-time model (a step is one step).
The fleet runs R vllm replicas behind the gateway (the round-robin picker, routed at
arrival), each replica on 1/R of the traffic's rate (so every replica sees one server's
load); lane-steps count the fleet's clock once per fleet step. Reported end to end
(simulate_traces / run_traces on pre-generated traces: the compiled run and its results on
the host; the first call, with compilation, is not timed), best of --repeats:

    python -m benchmarks.bench_fleet --lanes 8 --steps 2000 --replicas 4
"""

from __future__ import annotations

import sys
import time

import numpy as np

from vtc_jax.cli.common import Parser, guarded, int_arg
from vtc_jax.driver.cluster_run import simulate_traces
from vtc_jax.driver.run import run_traces
from vtc_jax.engines.cluster_settings import ClusterSettings, Gateway
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.workload import Trace
from vtc_jax.measures.online import MeasureConfig

OPTIONS = {"num_gpu_blocks": 513, "block_size": 16, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
           "enable_chunked_prefill": True}


def traces(lanes: int, steps: int, scale: float, seed: int = 0) -> list[Trace]:
    """Lane i: Poisson arrivals of two clients at (1.0, 0.25) x `scale` requests per step."""
    out = []
    for lane in range(lanes):
        rng = np.random.default_rng(seed + lane)
        rows = []
        for client, rate in enumerate((1.0 * scale, 0.25 * scale)):
            n = rng.poisson(rate * steps)
            for t in np.sort(rng.integers(0, steps, n)):
                rows.append((int(t), client, int(rng.integers(64, 513)), int(rng.integers(32, 385))))
        out.append(Trace.from_rows(sorted(rows)))
    return out


def best(fn, repeats: int) -> float:
    fn()  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> int:
    def body() -> int:
        p = Parser(prog="python -m benchmarks.bench_fleet", description=__doc__.split("\n\n")[0])
        p.add_argument("--lanes", type=int_arg(1, 1 << 16), default=8)
        p.add_argument("--steps", type=int_arg(10, 1 << 20), default=2000)
        p.add_argument("--replicas", type=int_arg(1, 64), default=4)
        p.add_argument("--repeats", type=int_arg(1, 100), default=2)
        args = p.parse_args(argv)
        settings = Settings(policy="vtc", kv_budget=8192, server_options=tuple(OPTIONS.items()))
        one = traces(args.lanes, args.steps, 1.0)
        fleet = traces(args.lanes, args.steps, float(args.replicas))
        single = best(lambda: run_traces(one, [settings] * args.lanes, num_clients=2, steps=args.steps,
                                         server="vllm", measures=MeasureConfig()), args.repeats)
        rules = Gateway(picker="round-robin", scrape_us=0)
        cs = ClusterSettings(engine=settings, gateway_policy="fcfs", replicas=args.replicas, gateway_rules=rules)
        many = best(lambda: simulate_traces(fleet, [cs] * args.lanes, num_clients=2, steps=args.steps, server="vllm"),
                    args.repeats)
        rate = lambda seconds: args.lanes * args.steps / seconds  # noqa: E731
        print(f"one vllm server: {rate(single):,.0f} lane-steps/s ({single:.2f} s)")
        print(f"fleet of {args.replicas} vllm replicas (gateway, round-robin): {rate(many):,.0f} lane-steps/s "
              f"({many:.2f} s): {single / many:.3f}x one server's")
        return 0
    return guarded("python -m benchmarks.bench_fleet", body)


if __name__ == "__main__":
    sys.exit(main())
