"""Speed of the JAX vLLM V1 step (vtc_jax/servers/vllm.py), engine alone.

    PYTHONPATH=. python3 benchmarks/bench_vllm.py [--lanes 4096,512] [--steps 512]

One workload (the lead's prototype bench): R = 64 requests per lane arriving over 400
steps, prompts 16-699, outputs 1-199, a 400-block pool of 16-token blocks, a 512-token
budget, 16 seats, fcfs (the closed-form path). Reported, all in this one run so a loaded
machine shows as a lower baseline too: compile time, lane-steps/s at each lane count;
the literal lax-loop step (`exact_step`, forced on the same lanes) at 512 lanes; the
pure-Python reference (vtc_jax/testing/vllm_reference.py) on a few lanes; and a simple
baseline, a scan of 16 int32 elementwise ops over [lanes, R] per step, in element-ops/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.servers import vllm
from vtc_jax.testing.vllm_reference import TraceRequest, simulate

ROWS = 64
CONFIG = {"num_blocks": 400, "block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 16}


def workload(lanes: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"arrival": np.sort(rng.integers(0, 400, ROWS)), "prompt": rng.integers(16, 700, ROWS),
             "output": rng.integers(1, 200, ROWS)} for _ in range(lanes)]


def packed(cfg: vllm.VllmConfig, lanes: list[dict]) -> vllm.Lane:
    return vllm.stack_lanes([vllm.pack_lane(cfg, ROWS, lane["arrival"], lane["prompt"], lane["output"])
                             for lane in lanes])


def timed_run(rules: vllm.Rules, traces: vllm.Lane, steps: int) -> tuple[float, float, float]:
    """(compile s, run s, share of active lane-steps) of `steps` steps without logs."""
    shapes = vllm.shapes_of(traces)
    vllm.check_run(rules, traces, steps)
    t0 = time.perf_counter()
    compiled = vllm.run.lower(rules, traces, steps, shapes, False).compile()
    t1 = time.perf_counter()
    out, _ = compiled(traces)
    jax.block_until_ready(out)
    t2 = time.perf_counter()
    finished = float((np.asarray(out.finish) >= 0).mean())
    return t1 - t0, t2 - t1, finished


def baseline(lanes: int, steps: int) -> float:
    """Element-ops/s of a scan of 16 dependent int32 elementwise ops over [lanes, ROWS]."""

    @jax.jit
    def go(x):
        def body(x, _):
            for k in range(8):
                x = (x * 3 + k) % 1021
            return x, None

        return jax.lax.scan(body, x, None, length=steps)[0]

    x = jnp.ones((lanes, ROWS), jnp.int32)
    go(x).block_until_ready()
    t0 = time.perf_counter()
    go(x).block_until_ready()
    return 16 * lanes * ROWS * steps / (time.perf_counter() - t0)


def reference_rate(cfg_dict: dict, lanes: list[dict]) -> float:
    """Lane-steps/s of the pure-Python reference, each lane run to the end."""
    t0, total = time.perf_counter(), 0
    for lane in lanes:
        reqs = [TraceRequest(arrival=int(a), client="c", prompt=int(p), output=int(o))
                for a, p, o in zip(lane["arrival"], lane["prompt"], lane["output"])]
        total += simulate(reqs, cfg_dict)["num_steps"]
    return total / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lanes", default="4096,512", help="comma-separated lane counts")
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--reference-lanes", type=int, default=8)
    args = parser.parse_args()
    cfg = vllm.VllmConfig.from_golden(CONFIG)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; R = {ROWS}, {args.steps} steps, config {CONFIG}")
    print(f"baseline: {baseline(512, args.steps) / 1e9:.2f} G int32 elementwise ops/s at 512 x {ROWS}")
    for count in (int(x) for x in args.lanes.split(",")):
        lanes = workload(count)
        comp, secs, fin = timed_run(cfg.rules, packed(cfg, lanes), args.steps)
        print(f"fast_step  {count:5d} lanes: {count * args.steps / secs / 1e6:7.3f} M lane-steps/s "
              f"(run {secs:.2f} s, compile {comp:.1f} s, {fin:.0%} of requests finished)")
    lanes = workload(512)
    # The same lanes through the literal loop: the rules forced off the closed form.
    exact = dataclasses.replace(cfg.rules, victim="policy")
    comp, secs, _ = timed_run(exact, packed(cfg, lanes), args.steps)
    print(f"exact_step   512 lanes: {512 * args.steps / secs / 1e6:7.3f} M lane-steps/s "
          f"(run {secs:.2f} s, compile {comp:.1f} s; fcfs's arrival-order victim, which here is the newest)")
    rate = reference_rate(CONFIG, lanes[: args.reference_lanes])
    print(f"reference  {args.reference_lanes:5d} lanes: {rate / 1e6:7.4f} M lane-steps/s (pure Python)")


if __name__ == "__main__":
    main()
