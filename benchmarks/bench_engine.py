"""Engine speed: end to end and engine alone, against a plain sequential implementation.

Workload (the seed's first experiment): two clients, Poisson 1.0 and 0.25 requests per
step, prompts U[64, 512], outputs U[32, 384], M = 8192, 6000 steps, policy vtc, the
measures of `sweeps.schedulers` (pair drift) unless --measures says otherwise.

For each lane count it reports, in lane-steps per second (lanes x 6000 / seconds):
  end to end, cold  one `simulate_traffic` call in a fresh process state: generation,
                    compilation, the run and collection of results to the host;
  end to end, warm  the same call again on other seeds (compiled code reused);
  engine alone      the compiled runner on pre-generated requests (best of --repeats: this
                    shared 2-core machine varies by up to 30% from run to run);
and beside them, measured in the same run on the same workload:
  sequential        tests/sequential.py, a plain Python implementation of the same model
                    (deques, integer counters, O(clients) decode), one lane;
  reference         vtc_jax/testing/reference.py, the slow literal reference (Fractions), one lane.

--dispatch adds the cost of mixing policies in one batch (at the largest --lanes): the engine
alone with every lane running vtc, against lanes cycling through every registered policy,
run as one compiled program that dispatches on each lane's policy id (old) and regrouped,
one sub-batch per policy (new: what the driver does for large batches,
driver/policy_groups.py); --each also times every policy alone (their mean is what a mix
costs at best); --dispatch-only skips the table above.

    python -m benchmarks.bench_engine                       # 1, 256 and 4096 lanes (CPU)
    python -m benchmarks.bench_engine --lanes 16384 65536   # on a GPU
    python -m benchmarks.bench_engine --dispatch --json out.json
    python -m benchmarks.bench_engine --lanes 4096 --dispatch-only --each --no-reference
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from tests.sequential import simulate_vtc
from vtc_jax.cli.common import Parser, guarded, int_arg, list_arg
from vtc_jax.core.fileio import check_writable_file
from vtc_jax.core.errors import InputError
from vtc_jax.driver import run as run_mod
from vtc_jax.driver import policy_groups, tiers
from vtc_jax.driver.devices import lane_mesh, shard
from vtc_jax.engines.engine import EngineBatch, LaneInput
from vtc_jax.engines.settings import Settings, encode_settings
from vtc_jax.inputs.traffic import overload
from vtc_jax.inputs.workload import ARRIVAL, CACHED, ORDER, OUTPUT, PROMPT, client_rows
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.policies import registry
from vtc_jax.testing import reference as ref

STEPS, KV_BUDGET, RATES = 6000, 8192, (1.0, 0.25)


def measures_of(names: list[str]) -> MeasureConfig:
    """--measures of the benchmarks ("none": no optional measure); an unknown name is bad input."""
    try:
        return MeasureConfig.of([n for n in names if n != "none"])
    except ValueError as err:
        raise InputError(f"--measures: {err}") from None


def lane_settings(lanes: int, policies: list[str]) -> list[Settings]:
    out = []
    for i in range(lanes):
        p = policies[i % len(policies)]
        extra = {"rpm_limit": 400, "rpm_window": 2000} if p == "rpm" else {}
        out.append(Settings(p, KV_BUDGET, **extra))
    return out


def end_to_end(lanes: int, measures: MeasureConfig, seed0: int) -> float:
    traffic = overload(list(RATES), STEPS)
    start = time.perf_counter()
    result = run_mod.simulate_traffic([traffic] * lanes, lane_settings(lanes, ["vtc"]),
                                      range(seed0, seed0 + lanes), measures=measures)
    seconds = time.perf_counter() - start
    if not result.finished.all():
        raise RuntimeError("a lane did not finish")
    return seconds


def engine_alone(lanes: int, measures: MeasureConfig, repeats: int, policies: list[str],
                 regroup: bool = False) -> tuple[float, float, int]:
    """(best seconds, compile-and-first-run seconds, events of the slowest lane); `regroup`:
    run the lanes as one sub-batch per policy (driver/policy_groups.py) instead of one
    program dispatching on each lane's policy."""
    timed = engine_runner(lane_settings(lanes, policies), measures, regroup)
    first, events = timed()
    runs = [timed()[0] for _ in range(repeats)]
    return min(runs), first, events


def engine_runner(settings: list[Settings], measures: MeasureConfig, regroup: bool = False, server: str = "ideal"):
    """A function of no arguments that runs the engine alone once on a lane of the
    workload (generated here, once) per `settings` on `server`, as the driver runs a batch
    (driver/policy_groups.py run, `regroup` as its own, over driver/tiers.py's slot
    tiers), and returns (seconds, events of the slowest lane); its first call also
    compiles. A lane that does not finish raises."""
    traffic = overload(list(RATES), STEPS)
    lanes = len(settings)
    config = run_mod.traffic_config([traffic] * lanes, settings, measures=measures, server=server)
    srcs = run_mod._traffic_sources([traffic] * lanes)
    workload = run_mod.with_timeline(run_mod.generate_workloads(srcs, range(lanes), config), batched=True)
    params, _ = encode_settings(settings, 2, config.policies, server)
    batch = EngineBatch(lane=LaneInput(params=params, horizon=jnp.full(lanes, STEPS, jnp.int32)), workload=workload)
    batch = jax.block_until_ready(on_lane_mesh(batch))
    expected = STEPS + 3 * int(sum(RATES) * STEPS)

    def timed():
        t = time.perf_counter()
        host, done = policy_groups.run(tiers.run_in_tiers, config, settings, batch, None, regroup=regroup,
                                       event_budget=4 * expected, expected_events=expected)
        if not np.asarray(done).all():
            raise RuntimeError("a lane did not finish")
        return time.perf_counter() - t, int(np.asarray(host.iterations).max())

    return timed


def on_lane_mesh(batch):
    """`batch` (leading lane axis) sharded over the runner's default mesh, as the drivers'
    generation leaves their lanes, when its lanes divide evenly over it (else as it is: the
    runner pads it). An unsharded batch is copied onto the mesh by every run: at 4096
    lanes 1.1 GB, 417K page faults and 1.3-2.3 s of a 3-4 s call on 2 devices."""
    mesh = lane_mesh()
    lanes = jax.tree_util.tree_leaves(batch)[0].shape[0]
    return shard(batch, mesh) if lanes % mesh.devices.size == 0 else batch


def one_lane_rows(seed: int = 0):
    """Lane `seed`'s generated requests as trace-order columns (for the host baselines)."""
    traffic = overload(list(RATES), STEPS)
    settings = [Settings("vtc", KV_BUDGET)]
    config = run_mod.traffic_config([traffic], settings, measures=MeasureConfig.of([]))
    rows = client_rows(run_mod.generate_workloads(run_mod._traffic_sources([traffic]), [seed], config))[0]
    flat = np.concatenate([np.column_stack([r, np.full(len(r), k)]) for k, r in enumerate(rows)])
    flat = flat[flat[:, ARRIVAL] < STEPS]
    return flat[np.argsort(flat[:, ORDER], kind="stable")]


def sequential_rate(flat) -> float:
    cols = [list(map(int, flat[:, f])) for f in (ARRIVAL, -1, PROMPT, OUTPUT, CACHED)]
    gc.disable()  # one call varied ~7x with when a collection ran (helper H2's measurement)
    try:
        start = time.perf_counter()
        simulate_vtc(*cols, num_clients=2, kv_budget=KV_BUDGET, w_p=1, w_q=2, steps=STEPS)
        return STEPS / (time.perf_counter() - start)
    finally:
        gc.enable()


def reference_rate(flat, steps: int) -> float:
    reqs = [ref.Request(int(r[ARRIVAL]), int(r[-1]), int(r[PROMPT]), int(r[OUTPUT]), int(r[CACHED]))
            for r in flat if r[ARRIVAL] < steps]
    start = time.perf_counter()
    ref.simulate(reqs, num_clients=2, kv_budget=KV_BUDGET, steps=steps)
    return steps / (time.perf_counter() - start)


def dispatch(lanes: int, measures: MeasureConfig, repeats: int, each: bool) -> dict:
    """A batch of `lanes` lanes cycling through every registered policy, as one mixed
    program (old) and regrouped by policy (new), against vtc alone and, with `each`, the
    mean time of every policy alone (what a mix costs at best: some policies cost more
    than vtc). Seconds are the engine alone, best of `repeats`; compiles are left out."""
    names = list(registry.names())
    rate = lambda s: lanes * STEPS / s / 1e6  # noqa: E731
    single, _, _ = engine_alone(lanes, measures, repeats, ["vtc"])
    mixed, mixed_first, _ = engine_alone(lanes, measures, repeats, names)
    grouped, grouped_first, _ = engine_alone(lanes, measures, repeats, names, regroup=True)
    row = {"lanes": lanes, "single_policy": rate(single), "all_policies": rate(mixed), "regrouped": rate(grouped),
           "overhead": mixed / single, "regrouped_over_vtc": grouped / single,
           "mixed_first_call_s": mixed_first, "regrouped_first_call_s": grouped_first}
    print(f"dispatch at {lanes} lanes, {len(names)} policies: vtc alone {rate(single):.2f} M lane-steps/s; mixed "
          f"(one program) {rate(mixed):.2f} ({mixed / single:.2f}x vtc's time, compile+first {mixed_first:.1f} s); "
          f"regrouped {rate(grouped):.2f} ({grouped / single:.2f}x, compile+first {grouped_first:.1f} s)")
    if each:
        alone = {p: engine_alone(lanes, measures, repeats, [p])[0] for p in names}
        mean = float(np.mean(list(alone.values())))
        row.update(each={p: rate(s) for p, s in alone.items()}, mean_alone=rate(mean),
                   regrouped_over_mean=grouped / mean, mixed_over_mean=mixed / mean)
        print("each alone (M lane-steps/s): " + ", ".join(f"{p} {rate(s):.2f}" for p, s in alone.items()))
        print(f"mean of each alone {rate(mean):.2f} M lane-steps/s: regrouped {grouped / mean:.2f}x its time, "
              f"mixed {mixed / mean:.2f}x")
    return row


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.bench_engine", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int_arg(1, 1 << 20), nargs="+", default=[1, 256, 4096])
    parser.add_argument("--repeats", type=int_arg(1, 20), default=3)
    parser.add_argument("--measures", type=list_arg(str, name="measures"), default=["pair_drift"],
                        help="measures kept (default pair_drift, as sweeps.schedulers; 'none' for the core engine)")
    parser.add_argument("--dispatch", action="store_true", help="also time a batch mixing every registered policy")
    parser.add_argument("--dispatch-only", action="store_true", help="--dispatch without the table of lane counts")
    parser.add_argument("--each", action="store_true", help="with --dispatch: also time every policy alone")
    parser.add_argument("--no-reference", action="store_true", help="skip the slow reference")
    parser.add_argument("--reference-steps", type=int_arg(100, STEPS), default=2000)
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    if args.json:
        check_writable_file(args.json)  # before the run's minutes, not after
    measures = measures_of(args.measures)
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind} x{jax.device_count()}, jax {jax.__version__}, "
          f"measures {','.join(args.measures)}")
    flat = one_lane_rows()
    seq = sequential_rate(flat)
    reference = None if args.no_reference else reference_rate(flat, args.reference_steps)
    print(f"sequential (tests/sequential.py, one lane): {seq:,.0f} steps/s"
          + ("" if reference is None else f"; slow reference (vtc_jax/testing/reference.py): {reference:,.0f} steps/s"))
    out = {"device": f"{device.platform} {device.device_kind}", "jax": jax.__version__, "measures": args.measures,
           "sequential_steps_per_s": seq, "reference_steps_per_s": reference, "rows": []}
    rows = [] if args.dispatch_only else args.lanes
    if rows:
        print("| lanes | end to end cold M/s | end to end warm M/s | engine alone M/s | compile+first s | events "
              "| engine / sequential |")
        print("|---|---|---|---|---|---|---|")
    for i, lanes in enumerate(rows):
        cold = end_to_end(lanes, measures, seed0=10_000 * (i + 1))
        warm = end_to_end(lanes, measures, seed0=10_000 * (i + 1) + lanes)
        alone, first, events = engine_alone(lanes, measures, args.repeats, ["vtc"])
        rate = lambda s, lanes=lanes: lanes * STEPS / s / 1e6
        row = {"lanes": lanes, "end_to_end_cold": rate(cold), "end_to_end_warm": rate(warm),
               "engine_alone": rate(alone), "first_call_s": first, "events": events,
               "engine_over_sequential": lanes * STEPS / alone / seq}
        out["rows"].append(row)
        print(f"| {lanes} | {row['end_to_end_cold']:.2f} | {row['end_to_end_warm']:.2f} | {row['engine_alone']:.2f} "
              f"| {first:.2f} | {events} | {row['engine_over_sequential']:.0f}x |", flush=True)
    if args.dispatch or args.dispatch_only:
        out["dispatch"] = dispatch(max(args.lanes), measures, args.repeats, args.each)
    if args.json:
        from vtc_jax.core.fileio import write_text_atomically

        write_text_atomically(args.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.bench_engine", lambda: main(sys.argv[1:])))
