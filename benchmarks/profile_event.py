"""Where one engine event's time goes (issue 24's profile), on bench_engine's workload.

For K clients (default: bench_engine's two clients at Poisson 1.0 and 0.25 requests per
step; K > 2: K equal rates of 1.25 / K), prompts U[64, 512], outputs U[32, 384], M = 8192,
policy vtc, --measures (default: the schedulers sweep's pair drift), on --server (`ideal`,
or `vllm` with bench_vllm's settings: 513 blocks of 16, budget 2048, 256 seats, in its
first slot tier of 32), it reports:

  events per step   events a lane took over a full 6000-step run, per step;
  state bytes       every array of one lane's engine state (what an event reads and may
                    write), and its workload bytes (request rows and timeline);
  HLO               the compiled event of a batch of lanes (XLA's optimized module): its
                    kernels (top-level instructions: fusions, scatters, gathers, sorts,
                    copies ...) by kind, and XLA's cost analysis per lane-event (flops,
                    bytes accessed);
  time              ns per lane-event at several lane counts, mid-run (after 300
                    events), best of --repeats of --events events: where the lanes' state
                    leaves the caches, the time per lane-event rises;
  kernels           with --kernels N, the N kernels of the compiled event loop that take
                    the most time at the largest lane count (jax.profiler's trace of one
                    call, each kernel's share of all kernel time, its output shape and the
                    JAX operation it comes from).

    python -m benchmarks.profile_event                       # K = 2, lanes 64 .. 4096
    python -m benchmarks.profile_event --clients 87 --lanes 512
    python -m benchmarks.profile_event --lanes 4096 --kernels 12
    python -m benchmarks.profile_event --server vllm --lanes 1024 --measures none --kernels 12
    python -m benchmarks.profile_event --json profile.json
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import bench_vllm
from benchmarks.bench_engine import measures_of
from vtc_jax.cli.common import Parser, guarded, int_arg, list_arg
from vtc_jax.core.fileio import check_writable_file
from vtc_jax.driver import run as run_mod
from vtc_jax.driver import runner, tiers
from vtc_jax.engines.engine import PROGRAM, EngineBatch, LaneInput
from vtc_jax.engines.settings import Settings, encode_settings
from vtc_jax.inputs.traffic import overload
from vtc_jax.measures.online import MeasureConfig

STEPS, KV_BUDGET, TWO_RATES = 6000, 8192, (1.0, 0.25)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.+?)\s+([a-z][\w\-]*)\(")


def rates(clients: int) -> list[float]:
    return list(TWO_RATES) if clients == 2 else [1.25 / clients] * clients


def build(lanes: int, clients: int, measures: MeasureConfig, server: str = "ideal"):
    """(config, batch) of `lanes` lanes of the profile's workload, timeline included."""
    traffic = overload(rates(clients), STEPS)
    settings = [Settings("vtc", KV_BUDGET, server_options=bench_vllm.SERVERS[server])] * lanes
    config = run_mod.traffic_config([traffic] * lanes, settings, measures=measures, server=server)
    if server != "ideal":
        config = dataclasses.replace(config, slots=tiers.slot_tiers(config)[0])
    srcs = run_mod._traffic_sources([traffic] * lanes)
    workload = run_mod.with_timeline(run_mod.generate_workloads(srcs, range(lanes), config), batched=True)
    params, _ = encode_settings(settings, clients, config.policies, server)
    lane = LaneInput(params=params, horizon=jnp.full(lanes, STEPS, jnp.int32))
    return config, EngineBatch(lane=lane, workload=workload)


def tree_bytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def entry_kernels(hlo_text: str) -> collections.Counter:
    """Top-level instructions of the ENTRY computation of an optimized HLO module, by
    opcode: each is one kernel (or one copy) on XLA:CPU."""
    kinds: collections.Counter = collections.Counter()
    inside = False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY"):
            inside = True
            continue
        if inside and line.startswith("}"):
            break
        match = _INSTRUCTION.match(line) if inside else None
        if match and match.group(2) not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
            kinds[match.group(2)] += 1
    return kinds


def event_hlo(config, batch, carry, lanes: int) -> dict:
    """Kernels and cost analysis of one event of every lane (the runner's step, vmapped)."""
    step = jax.jit(jax.vmap(lambda c, b: PROGRAM.step(c, b, None, config)))
    compiled = step.lower(carry, batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    kinds = entry_kernels(compiled.as_text())
    return {"kernels": sum(kinds.values()), "by_kind": dict(kinds.most_common()),
            "flops_per_lane": float(cost.get("flops", 0.0)) / lanes,
            "bytes_per_lane": float(cost.get("bytes accessed", 0.0)) / lanes}


def event_ns(config, batch, carry, events: int, repeats: int, lanes: int) -> float:
    """ns per lane-event over `events` events from `carry` (best of `repeats`)."""
    jax.block_until_ready(runner.advance(carry, batch, None, np.int32(events), program=PROGRAM, config=config))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(runner.advance(carry, batch, None, np.int32(events), program=PROGRAM, config=config))
        best = min(best, time.perf_counter() - start)
    return best / events / lanes * 1e9


_KERNEL = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+)\s+[a-z][\w\-]*\(.*?op_name=\"([^\"]+)\"", re.M)
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def source_lines(hlo_text: str) -> dict:
    """{kernel: "file.py:line function"}: where in our code each kernel's operation was
    traced (the innermost frame of the module's stack-frame tables; {} when the module has
    none)."""
    tables: dict = {name: {} for name in _TABLES}
    current = None
    for line in hlo_text.splitlines():
        text = line.strip()
        if text in _TABLES:
            current = tables[text]
            continue
        entry = re.match(r"^(\d+) (.*)$", text)
        if current is not None and entry:
            current[int(entry.group(1))] = entry.group(2).strip('"')
        elif text:
            current = None

    def where(frame: int) -> str:
        try:
            loc = tables["FileLocations"][int(re.search(r"file_location_id=(\d+)", tables["StackFrames"][frame])[1])]
            file = tables["FileNames"][int(re.search(r"file_name_id=(\d+)", loc)[1])]
            func = tables["FunctionNames"][int(re.search(r"function_name_id=(\d+)", loc)[1])]
            line = re.search(r"line=(\d+)", loc)[1]
            return f"{os.path.basename(file)}:{line} {func}"
        except (KeyError, TypeError):
            return ""

    out = {}
    for m in _KERNEL.finditer(hlo_text):
        frame = _FRAME.search(hlo_text, m.end(), hlo_text.find("\n", m.end()) % (len(hlo_text) + 1))
        if frame:
            out[m.group(1)] = where(int(frame.group(1)))
    return out


def kernel_times(config, batch, carry, events: int, top: int) -> list[dict]:
    """The `top` kernels by time in one call of `events` events (jax.profiler's trace of
    the compiled event loop; a temporary directory, removed after)."""
    compiled = runner.advance.lower(carry, batch, None, np.int32(events), program=PROGRAM, config=config).compile()
    text = compiled.as_text()
    described = {m.group(1): (m.group(2), m.group(3).split("/")[-1]) for m in _KERNEL.finditer(text)}
    lines = source_lines(text)
    jax.block_until_ready(compiled(carry, batch, None, np.int32(events)))
    with tempfile.TemporaryDirectory() as where:
        jax.profiler.start_trace(where)
        try:
            jax.block_until_ready(compiled(carry, batch, None, np.int32(events)))
        finally:
            jax.profiler.stop_trace()
        found = glob.glob(os.path.join(where, "**", "*.trace.json.gz"), recursive=True)
        if not found:
            return []
        with gzip.open(found[0]) as f:
            trace = json.load(f)
    spent: collections.Counter = collections.Counter()
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("name") in described:
            spent[e["name"]] += float(e.get("dur", 0.0))
    total = sum(spent.values()) or 1.0
    return [{"kernel": name, "share": us / total, "us_per_event": us / events, "shape": described[name][0],
             "op": described[name][1], "source": lines.get(name, "")} for name, us in spent.most_common(top)]


def events_per_step(config, batch) -> float:
    """Events a lane takes per step over a full run (mean over the lanes; on a server with
    slot tiers, over the lanes that fit the first tier)."""
    carry = runner.init(batch, None, program=PROGRAM, config=config)
    budget = STEPS * 4 + 3 * config.num_rows
    carry = runner.advance(carry, batch, None, np.int32(budget), program=PROGRAM, config=config)
    done = np.asarray(carry.done) & ~np.asarray(carry.overflow)
    if not done.any():
        raise RuntimeError("no lane finished within the event budget")
    return float(np.asarray(carry.iterations)[done].mean()) / STEPS


def profile(clients: int, lane_counts: list[int], measures: MeasureConfig, events: int, repeats: int,
            kernels: int = 0, server: str = "ideal") -> dict:
    largest = max(lane_counts)
    config, batch = build(largest, clients, measures, server)
    take = lambda n: jax.tree_util.tree_map(lambda x: x[:n], batch)  # noqa: E731
    small = take(min(64, largest))
    eps = events_per_step(config, small)
    out = {"server": server, "slots": config.slots, "clients": clients, "measures": sorted(measures.names()),
           "events_per_step": eps, "rows": []}
    for n in lane_counts:
        lanes_batch = take(n)
        carry = runner.init(lanes_batch, None, program=PROGRAM, config=config)
        carry = jax.block_until_ready(runner.advance(carry, lanes_batch, None, np.int32(300), program=PROGRAM,
                                                     config=config))
        row = {"lanes": n, "state_bytes_per_lane": tree_bytes(carry) // n,
               "workload_bytes_per_lane": tree_bytes(lanes_batch.workload) // n}
        row.update(event_hlo(config, lanes_batch, carry, n))
        row["ns_per_lane_event"] = event_ns(config, lanes_batch, carry, events, repeats, n)
        row["lane_steps_per_s"] = 1e9 / row["ns_per_lane_event"] / eps
        out["rows"].append(row)
        if kernels and n == lane_counts[-1]:
            out["kernels"] = kernel_times(config, lanes_batch, carry, events, kernels)
    return out


def print_profile(out: dict) -> None:
    print(f"{out['server']} ({out['slots']} slots), K = {out['clients']}, measures {','.join(out['measures']) or 'none'}: "
          f"{out['events_per_step']:.3f} events per step")
    print("| lanes | state B/lane | workload B/lane | kernels/event | flops/lane-event | bytes/lane-event "
          "| ns/lane-event | M lane-steps/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out["rows"]:
        print(f"| {r['lanes']} | {r['state_bytes_per_lane']:,} | {r['workload_bytes_per_lane']:,} | {r['kernels']} | "
              f"{r['flops_per_lane']:,.0f} | {r['bytes_per_lane']:,.0f} | {r['ns_per_lane_event']:.0f} | "
              f"{r['lane_steps_per_s'] / 1e6:.2f} |")
    kinds = out["rows"][-1]["by_kind"]
    print(f"kernels of one event at {out['rows'][-1]['lanes']} lanes: "
          + ", ".join(f"{k} {v}" for k, v in kinds.items()), flush=True)
    if out.get("kernels"):
        print("| kernel | share of kernel time | us/event | output | operation | traced at |")
        print("|---|---|---|---|---|---|")
        for r in out["kernels"]:
            print(f"| {r['kernel']} | {100 * r['share']:.1f}% | {r['us_per_event']:.1f} | {r['shape']} | {r['op']} | "
                  f"{r['source']} |")


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.profile_event", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int_arg(2, 4096), nargs="+", default=[2])
    parser.add_argument("--lanes", type=int_arg(1, 1 << 20), nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--server", choices=sorted(bench_vllm.SERVERS), default="ideal")
    parser.add_argument("--measures", type=list_arg(str, name="measures"), default=["pair_drift"])
    parser.add_argument("--events", type=int_arg(1, 1 << 20), default=400)
    parser.add_argument("--repeats", type=int_arg(1, 20), default=3)
    parser.add_argument("--kernels", type=int_arg(0, 1000), default=0, help="list the N costliest kernels")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    measures = measures_of(args.measures)
    if args.json:
        check_writable_file(args.json)  # before the profile's minutes, not after
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind} x{jax.device_count()}, jax {jax.__version__}")
    outs = []
    for k in args.clients:
        outs.append(profile(k, sorted(args.lanes), measures, args.events, args.repeats, args.kernels,
                            args.server))
        print_profile(outs[-1])
    if args.json:
        from vtc_jax.core.fileio import write_text_atomically

        write_text_atomically(args.json, json.dumps(outs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.profile_event", lambda: main(sys.argv[1:])))
