"""Speed of `vllm_prefix` (vLLM V1 with prefix caching, vtc_jax/servers/vllm_prefix.py)
beside `vllm` (no prefix caching) on one workload with shared prefixes, at the real pool.

Workload: bench_vllm's (two clients, Poisson 1.0 and 0.25 requests per step, prompts
U[64, 512], outputs U[32, 384], 6000 steps, policy vtc; lane i drawn with seed i) plus one
system prompt per tenant (a prefix group: client 0's requests share their first 256 prompt
tokens, client 1's their first 128; a shorter prompt is all prefix), as the content
identity `prefix_blocks.groups`. Both servers run vLLM's settings of bench_vllm (a
2048-token budget, 256 seats, chunked prefill, blocks of 16 tokens) on the
qwen2.5-7b-h100 preset's pool, 67,660 blocks (M = 1,082,544 tokens), each lane its own
trace for a fixed horizon of 6000 steps. Reported in lane-steps per second (lanes x 6000 /
seconds), all measured in this one run, so a loaded machine shows in both servers:
  engine alone   the compiled runner on the lanes' pre-built workloads and settings (best
                 of --repeats; compile and first run reported apart), as the driver runs
                 a batch (driver/policy_groups.py over driver/tiers.py's slot tiers);
  end to end     one `run_traces` call: planning, the content tables, encoding, the run,
                 results to the host (compiled code reused from the engine-alone runs);
  reference      vtc_jax/testing/vllm_reference.py (pure Python, the literal scheduler)
                 on lane 0's requests of the first --reference-steps steps, fcfs, with
                 and without prefix caching: the plain sequential implementation.

    python -m benchmarks.bench_prefix                  # 1024 lanes x 6000 steps (the issue's row)
    python -m benchmarks.bench_prefix --lanes 8 --steps 600 --repeats 1   # what a 2-core CPU allows
    python -m benchmarks.bench_prefix --lanes 4 --repeats 1 --no-end-to-end   # the full horizon on a CPU (minutes)
    python -m benchmarks.bench_prefix --lanes 8 --profile 40 --kernels 400   # where an event goes
    JAX_NUM_CPU_DEVICES=1 python -m benchmarks.bench_prefix --lanes 16 --steps 600 --profile 20 --kernels 80
        # the same on one CPU device: over several, the profile's program is partitioned op by op
        # (not the runner's shard_map) and every batch bound shows as a cross-device all-reduce
    python -m benchmarks.bench_prefix --lanes 2 --steps 600 --servers vllm_prefix --rates 0.1 0.025 \
        --no-end-to-end --reference-steps 600          # a calibration point of driver/run_budget.py
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_engine import on_lane_mesh
from benchmarks.bench_vllm import RATES, STEPS, VLLM
from vtc_jax.cli.common import Parser, guarded, int_arg
from vtc_jax.core.fileio import check_writable_file
from vtc_jax.core.rows import ARRIVAL, ORDER, OUTPUT, PROMPT
from vtc_jax.driver import policy_groups, tiers
from vtc_jax.driver import run as run_mod
from vtc_jax.engines.engine import EngineBatch, LaneInput
from vtc_jax.engines.settings import Settings, encode_settings
from vtc_jax.inputs import prefix_blocks
from vtc_jax.inputs.traffic import overload
from vtc_jax.inputs.workload import Trace, make_workload, requests_per_client
from vtc_jax.inputs.workload import client_rows
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.servers import registry as servers
from vtc_jax.servers.records import vllm_memory
from vtc_jax.servers.vllm_prefix import prefix_options
from vtc_jax.testing.vllm_reference import TraceRequest, simulate

POOL = 67_660                    # the qwen2.5-7b-h100 preset's num_gpu_blocks
SYSTEM = (256, 128)              # each tenant's system prompt (tokens)
OPTIONS = tuple((k, POOL if k == "num_gpu_blocks" else v) for k, v in VLLM)
MEMORY = vllm_memory(OPTIONS)


def lane_traces(lanes: int, seed0: int = 0, steps: int = STEPS, rates=RATES) -> list[Trace]:
    """Lane i's requests (bench_vllm's generator, seed seed0 + i) arriving before STEPS, as
    a trace in arrival order (ORDER)."""
    traffic = overload(list(rates), steps)
    settings = [Settings("vtc", MEMORY, server_options=OPTIONS)] * lanes
    config = run_mod.traffic_config([traffic] * lanes, settings, measures=MeasureConfig(), server="vllm")
    generated = run_mod.generate_workloads(run_mod._traffic_sources([traffic] * lanes), range(seed0, seed0 + lanes),
                                           config)
    out = []
    for rows in client_rows(generated):
        flat = np.concatenate([np.column_stack([r, np.full(len(r), k)]) for k, r in enumerate(rows)])
        flat = flat[flat[:, ARRIVAL] < steps]
        flat = flat[np.argsort(flat[:, ORDER], kind="stable")]
        out.append(Trace(flat[:, ARRIVAL], flat[:, -1], flat[:, PROMPT], flat[:, OUTPUT], np.zeros(len(flat))))
    return out


def system_prompts(trace: Trace) -> prefix_blocks.ContentIdentity:
    """The tenants' system prompts as prefix groups (one group per client)."""
    prefix = np.minimum(np.asarray(SYSTEM, np.int64)[trace.client], trace.prompt)
    return prefix_blocks.groups(trace.client.tolist(), prefix, trace.client)


def lane_settings(traces: list[Trace], server: str) -> list[Settings]:
    """One Settings per lane: vtc on the pool; `vllm_prefix` with the lane's content."""
    out = []
    for t in traces:
        extra = prefix_options(t.arrival, t.prompt, t.output, system_prompts(t)) if server == "vllm_prefix" else {}
        out.append(Settings("vtc", MEMORY, server_options=tuple(sorted({**dict(OPTIONS), **extra}.items()))))
    return out


def build(traces: list[Trace], server: str, steps: int = STEPS):
    """(config, settings, batch, event budget, expected events) of the lanes `traces` on
    `server`, built as run_traces builds them (the batch on the lane mesh)."""
    settings = servers.batch_settings(server, lane_settings(traces, server))
    config, horizons, budget, expected = run_mod.plan_lanes(traces, settings, 2, steps, 0, measures=MeasureConfig(),
                                                            server=server)
    pad = run_mod.workload_pad()
    per_lane = []
    for t in traces:
        sizes = requests_per_client(t, 2) + pad
        sizes[-1] += config.num_rows - int(sizes.sum())
        per_lane.append(jax.tree_util.tree_map(np.asarray, make_workload(t, 2, pad, steps, sizes)))
    workload = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)), *per_lane)
    workload = run_mod.with_timeline(workload, batched=True)
    params, _ = encode_settings(settings, 2, config.policies, server)
    batch = EngineBatch(lane=LaneInput(params=params, horizon=jnp.asarray(horizons, jnp.int32)), workload=workload)
    return config, settings, jax.block_until_ready(on_lane_mesh(batch)), budget, expected


def engine_runner(traces: list[Trace], server: str, steps: int = STEPS):
    """A function of no arguments that runs the engine alone once on the lanes (`build`)
    and returns (seconds, events of the slowest lane); its first call also compiles."""
    config, settings, batch, budget, expected = build(traces, server, steps)

    def timed():
        t = time.perf_counter()
        host, done = policy_groups.run(tiers.run_in_tiers, config, settings, batch, None, event_budget=budget,
                                       expected_events=expected)
        if not np.asarray(done).all():
            raise RuntimeError(f"{server}: a lane did not finish ({len(traces)} lanes)")
        return time.perf_counter() - t, int(np.asarray(host.iterations).max())

    return timed


_SHAPE = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(\S+)\s+([a-z][\w\-]*)\(", re.M)


def big_instructions(hlo_text: str, sizes: dict) -> dict:
    """{name: {opcode: count}}: the instructions of a compiled module (every computation:
    loop bodies included) whose output has a dimension of one of `sizes` ({name: length}),
    by opcode (fusions, copies, scatters, dynamic-update-slices ... over a pool-sized
    array)."""
    out = {name: collections.Counter() for name in sizes}
    for shape, op in _SHAPE.findall(hlo_text):
        dims = set(re.findall(r"\d+", shape.split("{")[0]))
        for name, n in sizes.items():
            if str(n) in dims:
                out[name][op] += 1
    return {name: dict(c.most_common()) for name, c in out.items()}


def profile(traces: list[Trace], server: str, events: int, top: int, steps: int = STEPS) -> dict:
    """Where an event's time goes (profile_event's tools on this workload, the first slot
    tier): state bytes per lane, the compiled event's kernels, the compiled event loop's
    instructions over pool-, ring- and content-sized arrays, ns per lane-event mid-run
    (after 300 events) and the `top` kernels by time."""
    from benchmarks import profile_event as pe
    from vtc_jax.driver import runner
    from vtc_jax.engines.engine import PROGRAM
    from vtc_jax.servers.vllm_blocks import ring_size

    config, _, batch, _, _ = build(traces, server, steps)
    config = dataclasses.replace(config, slots=tiers.slot_tiers(config)[0])
    lanes = len(traces)
    carry = runner.init(batch, None, program=PROGRAM, config=config)
    carry = jax.block_until_ready(runner.advance(carry, batch, None, np.int32(300), program=PROGRAM, config=config))
    out = {"server": server, "lanes": lanes, "slots": config.slots, "state_bytes_per_lane": pe.tree_bytes(carry) // lanes}
    hlo = pe.event_hlo(config, batch, carry, lanes)
    out.update(kernels_count=hlo["kernels"], by_kind=hlo["by_kind"], flops_per_lane=hlo["flops_per_lane"],
               bytes_per_lane=hlo["bytes_per_lane"])
    sizes = {"pool": POOL}
    if server == "vllm_prefix":
        shape = dict(servers.get(server).static_options([dict(s.server_options) for s in lane_settings(traces, server)]))
        sizes.update(ring=ring_size(POOL, shape["table_width"]), contents=shape["contents"])
        out["static"] = {k: v for k, v in shape.items() if k != "token_times"}
    text = runner.advance.lower(carry, batch, None, np.int32(events), program=PROGRAM, config=config).compile().as_text()
    out["big_instructions"] = big_instructions(text, sizes)
    out["sizes"] = sizes
    out["ns_per_lane_event"] = pe.event_ns(config, batch, carry, events, 1, lanes)
    out["kernels"] = pe.kernel_times(config, batch, carry, events, top) if top else []
    return out


def print_profile(out: dict) -> None:
    print(f"profile of {out['server']} at {out['lanes']} lanes ({out['slots']} slots"
          + (f", {out['static']}" if "static" in out else "") + f"): state {out['state_bytes_per_lane']:,} B a lane, "
          f"{out['kernels_count']} kernels an event, "
          f"XLA's bytes accessed {out['bytes_per_lane']:,.0f} a lane-event, {out['ns_per_lane_event']:,.0f} ns a "
          "lane-event")
    for name, ops in out["big_instructions"].items():
        print(f"  instructions over {name}-sized arrays in the compiled event loop: "
              + (", ".join(f"{op} {n}" for op, n in ops.items()) or "none"))
    if out["kernels"]:
        by_source: collections.Counter = collections.Counter()
        by_size: collections.Counter = collections.Counter()
        for r in out["kernels"]:
            by_source[r["source"].split(" ")[0] or "?"] += r["us_per_event"]
            dims = set(re.findall(r"\d+", r["shape"].split("{")[0]))
            by_size[next((name for name, n in out["sizes"].items() if str(n) in dims), "small")] += r["us_per_event"]
        total = sum(by_source.values()) or 1.0
        print(f"  kernel time of the {len(out['kernels'])} costliest kernels, {total:,.0f} us an event, by output size: "
              + ", ".join(f"{k} {v / total:.1%}" for k, v in by_size.most_common()))
        print("  by source line: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by_source.most_common(12)))
        print("| kernel | share of kernel time | us/event | output | operation | traced at |")
        print("|---|---|---|---|---|---|")
        for r in out["kernels"][:20]:
            print(f"| {r['kernel']} | {100 * r['share']:.1f}% | {r['us_per_event']:.1f} | {r['shape']} | {r['op']} | "
                  f"{r['source']} |")


def end_to_end(traces: list[Trace], server: str, steps: int = STEPS) -> float:
    start = time.perf_counter()
    result = run_mod.run_traces(traces, lane_settings(traces, server), num_clients=2, steps=steps,
                                measures=MeasureConfig(), server=server)
    if not result.finished.all():
        raise RuntimeError(f"{server}: a lane did not finish")
    return time.perf_counter() - start


def reference_rate(trace: Trace, steps: int, caching: bool) -> tuple[float, int, float]:
    """(steps per second, steps, requests scheduled a step) of the literal scheduler (fcfs) on `trace`'s requests
    arriving before `steps`, with or without prefix caching."""
    prefix = system_prompts(trace).prefix_len
    reqs = [TraceRequest(int(a), str(c), int(p), int(o), prefix_id=str(c), prefix_len=int(n))
            for a, c, p, o, n in zip(trace.arrival, trace.client, trace.prompt, trace.output, prefix) if a < steps]
    cfg = dict(OPTIONS)
    cfg = {"num_blocks": cfg["num_gpu_blocks"], "block_size": cfg["block_size"],
           "max_num_batched_tokens": cfg["max_num_batched_tokens"], "max_num_seqs": cfg["max_num_seqs"],
           "prefix_caching": caching, "max_steps": 1000 * steps}
    start = time.perf_counter()
    out = simulate(reqs, cfg)
    seconds = time.perf_counter() - start
    return out["num_steps"] / seconds, out["num_steps"], float(np.mean([len(s["sched"]) for s in out["steps"]]))


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.bench_prefix", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int_arg(1, 1 << 20), nargs="+", default=[1024])
    parser.add_argument("--repeats", type=int_arg(1, 20), default=2)
    parser.add_argument("--servers", nargs="+", choices=["vllm", "vllm_prefix"], default=["vllm", "vllm_prefix"])
    parser.add_argument("--no-end-to-end", action="store_true", help="measure the engine alone only")
    parser.add_argument("--reference-steps", type=int_arg(10, STEPS), default=200,
                        help="arrival steps of the lane the reference drains (default 200)")
    parser.add_argument("--steps", type=int_arg(10, STEPS), default=STEPS,
                        help="the horizon: arrivals and steps of each lane (default 6000)")
    parser.add_argument("--rates", type=float, nargs=2, default=list(RATES),
                        help="the two clients' Poisson rates, requests per step (default 1.0 0.25)")
    parser.add_argument("--profile", type=int_arg(0, 1 << 20), default=0, metavar="EVENTS",
                        help="instead of the table: where an event's time goes at each --lanes, over EVENTS events "
                             "mid-run (profile_event's tools)")
    parser.add_argument("--kernels", type=int_arg(0, 1000), default=12, help="with --profile: the N costliest kernels")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.json:
        check_writable_file(args.json)  # before the run's minutes, not after
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind} x{jax.device_count()}, jax {jax.__version__}; "
          f"pool {POOL:,} blocks, system prompts {SYSTEM}")
    out = {"device": f"{device.platform} {device.device_kind}", "jax": jax.__version__, "pool": POOL, "rows": []}
    if args.profile:
        out["profiles"] = []
        for lanes in args.lanes:
            traces = lane_traces(lanes, seed0=100_000, steps=args.steps, rates=args.rates)
            for server in args.servers:
                out["profiles"].append(profile(traces, server, args.profile, args.kernels, args.steps))
                print_profile(out["profiles"][-1])
        if args.json:
            from vtc_jax.core.fileio import write_text_atomically

            write_text_atomically(args.json, json.dumps(out, indent=1))
        return 0
    lane0 = lane_traces(1, steps=args.steps, rates=args.rates)[0]
    for caching in (False, True):
        rate, steps, running = reference_rate(lane0, args.reference_steps, caching)
        out[f"reference_{'prefix' if caching else 'plain'}_steps_per_s"] = rate
        print(f"reference (vtc_jax/testing/vllm_reference.py, lane 0, fcfs, prefix caching {'on' if caching else 'off'}"
              f", {steps} steps, {running:.1f} requests scheduled a step): {rate:,.0f} steps/s", flush=True)
    print("| server | lanes | engine alone M lane-steps/s (s) | end to end M lane-steps/s (s) | compile+first s | events |")
    print("|---|---|---|---|---|---|")
    for lanes in args.lanes:
        traces = lane_traces(lanes, seed0=100_000, steps=args.steps, rates=args.rates)
        rate = lambda s, lanes=lanes: lanes * args.steps / s / 1e6  # noqa: E731
        for server in args.servers:
            built = time.perf_counter()
            timed = engine_runner(traces, server, args.steps)
            print(f"  {server}: lanes built in {time.perf_counter() - built:.1f} s", file=sys.stderr, flush=True)
            first, events = timed()
            print(f"  {server}: compile + first run {first:.1f} s", file=sys.stderr, flush=True)
            alone = min(timed()[0] for _ in range(args.repeats))
            e2e = float("nan") if args.no_end_to_end else end_to_end(traces, server, args.steps)
            row = {"server": server, "lanes": lanes, "engine_alone": rate(alone), "end_to_end": rate(e2e),
                   "engine_alone_s": alone, "end_to_end_s": e2e, "first_call_s": first, "events": events}
            out["rows"].append(row)
            print(f"| {server} | {lanes} | {row['engine_alone']:.4f} ({alone:.2f}) | {row['end_to_end']:.4f} ({e2e:.1f}) "
                  f"| {first:.1f} "
                  f"| {events} |", flush=True)
        by = {r["server"]: r for r in out["rows"] if r["lanes"] == lanes}
        if len(by) == 2:
            ratio = by["vllm_prefix"]["engine_alone"] / by["vllm"]["engine_alone"]
            e2e_ratio = by["vllm_prefix"]["end_to_end"] / by["vllm"]["end_to_end"]
            print(f"vllm_prefix / vllm at {lanes} lanes: engine alone {ratio:.3f}x, end to end {e2e_ratio:.3f}x "
                  "(target >= 0.5x)", flush=True)
    if args.json:
        from vtc_jax.core.fileio import write_text_atomically

        write_text_atomically(args.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.bench_prefix", lambda: main(sys.argv[1:])))
