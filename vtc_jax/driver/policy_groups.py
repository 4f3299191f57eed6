"""A batch that mixes policies, run as one sub-batch per policy.

One compiled program can serve lanes of several policies (`EngineConfig.policies`: every
policy's hooks are traced and each lane selects its own on its policy id), but then every
lane pays for every policy: on CPU a batch mixing all eleven policies ran 4.1x the mean
time of each policy alone, and 1.15x regrouped, from lanes sharded over the devices as the
sweeps generate them (benchmarks/RESULTS.md). `run` splits such a batch by policy instead:
each policy's lanes run under a config that traces that policy only (and the rpm delay, KV
caps and bands only if its lanes have them), with their settings encoded again for it
(policy ids follow `config.policies`), several sub-batches at once on devices of their own
when there are enough (each gathered shard by shard onto its device, the costliest planned
first), and their carries are put back in the batch's lane order, in the mixed program's
carry structure, so that everything read from them is what the mixed program gives
(tests/test_policy_groups.py checks every field of `LaneResults`). The one difference is
unread: where the mixed program carried the states of the policies a lane does not run
along (and the estimator, for a lane whose policy does not use it, and the limits' counts,
for lanes of a sub-batch without limits), the regrouped carry holds zeros.

A sub-batch is one more compile (about 3 s per policy on a 2-core CPU), so a small run is
cheaper mixed; `worth_regrouping` is the rule that decides, `decide` applies it counting
what earlier batches of the same config paid (its constants were measured with
`python -m benchmarks.bench_engine --lanes 4096 --dispatch-only`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import mmap
import threading
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vtc_jax.driver import runner
from vtc_jax.driver.devices import LANES, lane_mesh
from vtc_jax.engines import quiet
from vtc_jax.engines.engine import PROGRAM, EngineBatch, LaneInput
from vtc_jax.engines.engine_config import EngineConfig
from vtc_jax.engines.settings import Settings, encode_settings, limit_flags
from vtc_jax.policies import registry

# Measured on the 2-core CPU (`bench_engine --lanes 4096 --dispatch-only`, 2026-12-02: vtc
# alone 7.7 s, the 11-policy mixed program 57.0 s over 2.76e7 lane-events; regrouped, its
# 11 compiles ~28 s of its first call): each policy traced beside the lane's own adds
# about POLICY_SECONDS per lane-event to a mixed program, each sub-batch's compile about
# COMPILE_SECONDS.
POLICY_SECONDS = 1.8e-7
COMPILE_SECONDS = 2.6
# A lane of a sub-batch that runs quiet stretches (engines/quiet.py) costs about this share
# of one whose every step is an event (the seed workload's sub-batches of 186 lanes: vtc,
# fcfs, lcf and rpm 0.12-0.24 s, the other seven 0.40-0.98 s; bench_engine --each).
QUIET_SHARE = 0.27


def policy_lanes(settings: Sequence[Settings], policies: Sequence[str]) -> list[tuple[str, np.ndarray]]:
    """(policy, int64[n] its lanes in batch order) for each policy of `policies` some lane
    runs, in the order of `policies`."""
    names = np.asarray([s.policy for s in settings])
    return [(p, np.flatnonzero(names == p)) for p in policies if (names == p).any()]


def worth_regrouping(num_policies: int, num_groups: int, lane_events: int, paid: float = 0.0) -> bool:
    """Whether a batch of `lane_events` lane-events (lanes x expected events per lane)
    that traces `num_policies` policies, `num_groups` of them run by some lane, is to run
    as one sub-batch per group: when the mixed program's extra work, lane_events x
    (num_policies - 1) x POLICY_SECONDS, plus `paid` (what earlier batches of the same
    config paid for mixing), exceeds the sub-batches' compiles, num_groups x
    COMPILE_SECONDS. A config of one policy has nothing to split."""
    if num_policies <= 1:
        return False
    return paid + lane_events * (num_policies - 1) * POLICY_SECONDS > num_groups * COMPILE_SECONDS


# Seconds of mixing (estimated) paid so far in this process, per mixed config. A sweep runs
# chunk after chunk of at most a few thousand lanes under one config, each too small to
# repay the compiles alone, while the sub-batches, once compiled, serve every later chunk:
# mixing is paid until it has cost what the compiles would (ski rental: at most twice the
# better choice in hindsight), then the sweep runs regrouped. Process-wide, like jax's own
# compile cache: it changes how fast a batch runs, never its results.
_PAID: dict = {}


def decide(config: EngineConfig, num_groups: int, lane_events: int, paid: dict = _PAID) -> bool:
    """`worth_regrouping` of a batch of `lane_events` planned lane-events under `config`,
    counting the mixing earlier batches of `config` paid (`paid`, see `pay`)."""
    return worth_regrouping(len(config.policies), num_groups, lane_events, paid.get(config, 0.0))


def pay(config: EngineConfig, lane_events: int, paid: dict = _PAID) -> None:
    """Count `lane_events` lane-events a batch ran mixed under `config` into `paid`."""
    if len(config.policies) > 1:
        paid[config] = paid.get(config, 0.0) + lane_events * (len(config.policies) - 1) * POLICY_SECONDS


def planned_events(config: EngineConfig, lanes: int, run_args: dict) -> int:
    """Lane-events a batch is expected to take: lanes x the runner's expected events, or 0
    for lanes that drain (their horizon bounds the clock, on a us clock by ~1e9: far from
    their events; what they ran is counted after the run instead)."""
    if config.drain:
        return 0
    return lanes * int(run_args.get("expected_events") or run_args["event_budget"])


def policy_config(config: EngineConfig, policy: str, settings: Sequence[Settings]) -> EngineConfig:
    """`config` tracing `policy` alone for lanes of `settings`: arrival rows and the
    estimator only if the policy reads them (a policy that does not use the estimator sees
    zero estimates in any batch: engine._own_estimates), the rpm delay, KV caps and bands
    only if one of these lanes has them (a lane without one is eligible as if the part
    were absent; with rpm traced, no quiet step could choose ahead: engines/quiet.py)."""
    chosen = registry.get(policy)
    limits = {name: getattr(config, name) and needed for name, needed in limit_flags(settings).items()}
    return dataclasses.replace(config, policies=(policy,), estimator=chosen.uses_estimator,
                               arrival_rows=chosen.arrival_rows, **limits)


@jax.jit
def _take(tree, index: jax.Array):
    return jax.tree_util.tree_map(lambda x: jnp.take(x, index, axis=0), tree)


def _local_shards(x) -> tuple | None:
    """((first lane, shard) for each distinct lane range of `x`, in lane order), or None
    when some shard splits another axis: a replicated array has one range, held on
    several devices (the first is taken)."""
    found = {}
    for shard in x.addressable_shards:
        if any(part != slice(None) for part in shard.index[1:]):
            return None
        found.setdefault(shard.index[0].start or 0, shard)
    return tuple(sorted(found.items(), key=lambda item: item[0]))


def _take_onto(tree, lanes: np.ndarray, device):
    """Lanes `lanes` (increasing) of every leaf of `tree` (jax arrays, leading lane axis,
    possibly sharded over several devices), on `device`: each shard gathers its own lanes
    where it lives (one jitted gather per shard layout) and only those lanes move. A jitted
    gather of the sharded arrays would first copy all of them onto every device (2048 lanes
    of the seed workload: 1.24 s against 0.41 s from one device; benchmarks/RESULTS.md)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    layouts: dict = {}  # leaves with the same lane ranges on the same devices gather together
    out = [None] * len(leaves)
    for i, leaf in enumerate(leaves):
        shards = _local_shards(leaf)
        if shards is None:  # not split by lane only: one gather over its devices
            out[i] = jax.device_put(_take(leaf, jnp.asarray(lanes, jnp.int32)), device)
            continue
        key = tuple((low, shard.data.shape[0], shard.device) for low, shard in shards)
        layouts.setdefault(key, []).append((i, shards))
    for key, members in layouts.items():
        parts = []
        for k, (low, size, home) in enumerate(key):
            mine = lanes[(lanes >= low) & (lanes < low + size)] - low
            if mine.size:
                local = _take([shards[k][1].data for _, shards in members], jax.device_put(mine.astype(np.int32), home))
                parts.append(jax.device_put(local, device))
        for j, (i, _) in enumerate(members):
            out[i] = parts[0][j] if len(parts) == 1 else jnp.concatenate([part[j] for part in parts])
    return jax.tree_util.tree_unflatten(treedef, out)


def sub_batch(config: EngineConfig, settings: Sequence[Settings], batch: EngineBatch, lanes: np.ndarray,
              policy: str, device=None) -> EngineBatch:
    """Lanes `lanes` (increasing) of `batch` (all running `policy`), their settings encoded
    for a config of `policy` alone; their workloads gathered when each lane has its own.
    With `device` (a sub-batch run on that one device), the lanes are gathered shard by
    shard onto it (_take_onto); else by one gather over the batch's devices."""
    params, _ = encode_settings([settings[i] for i in lanes], config.num_clients, (policy,), config.server)
    lane_arrays = (batch.lane.horizon, batch.workload)
    if device is None:
        horizon, workload = _take(lane_arrays, jnp.asarray(lanes, jnp.int32))
    else:
        horizon, workload = _take_onto(lane_arrays, lanes, device)
    return EngineBatch(lane=LaneInput(params=params, horizon=horizon), workload=workload)


def _zeros(shape: tuple, dtype) -> np.ndarray:
    """np.zeros(shape, dtype), large ones on an anonymous mapping: its pages are mapped as
    rows are written, and a policy's lanes are every k-th row of the batch. numpy asks
    for transparent huge pages on large arrays, so each 2 MB page such a row touches is
    zeroed whole, at times with a compaction first: 0.25 s for a 69 MB leaf written at
    every 11th row on the 2-core CPU, against 0.01 s mapped (benchmarks/RESULTS.md)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes < 1 << 22:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)


def merge(template, parts: Sequence[tuple[np.ndarray, object]]):
    """The carry of `template`'s structure (shape-dtype leaves with the batch's leading
    lane axis) whose lanes `lanes` hold `host`'s leaf at the same path, for each (lanes,
    host) of `parts` (host numpy trees); a leaf a part does not carry is zero there."""
    found = [dict(jax.tree_util.tree_flatten_with_path(host)[0]) for _, host in parts]

    def fill(path, shape):
        out = _zeros(shape.shape, shape.dtype)
        for (lanes, _), leaves in zip(parts, found):
            if path in leaves:
                out[lanes] = leaves[path]
        return out

    return jax.tree_util.tree_map_with_path(fill, template)


class SplitProgress:
    """The runner's progress callback for a batch run as sub-batches: each part reports
    its events weighted by its share of the lanes, so the batch's count goes from 0 to
    about the events per lane, as one run's would (a part's retries of some lanes, slot
    tiers, count its most events), and seconds from the first part's start. Parts may
    report from several threads: one at a time."""

    def __init__(self, progress: Callable[[int, int, float], None], sizes: Sequence[int]):
        self.progress, self.started = progress, None
        self.share = np.asarray(sizes, np.float64) / max(sum(sizes), 1)
        self.spent = np.zeros(len(sizes))
        self.lock = threading.Lock()

    def part(self, i: int) -> Callable[[int, int, float], None]:
        def report(spent: int, expected: int, seconds: float):
            with self.lock:
                self.started = self.started or time.perf_counter() - seconds
                self.spent[i] = max(self.spent[i], spent)
                total = int(round(float(self.share @ self.spent)))
                self.progress(total, max(int(expected), total), time.perf_counter() - self.started)
        return report


def sub_batch_cost(config: EngineConfig, lanes: int) -> float:
    """A sub-batch's expected run time, in lanes of a policy whose every step is an event:
    `lanes`, times QUIET_SHARE when its config (`policy_config`) runs quiet stretches."""
    return lanes * (QUIET_SHARE if quiet.window(config) else 1.0)


def device_plan(costs: Sequence[float], num_devices: int) -> list[list[int]]:
    """For each of `num_devices` devices, the sub-batches (indices into `costs`, their
    expected run times) it runs one after another, in index order: the costliest first
    (ties: the first), each to the device with the least cost so far (ties: the first).
    Fixed by the costs, so a sweep's chunks compile each policy for one device only."""
    plan, load = [[] for _ in range(num_devices)], [0.0] * num_devices
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        d = load.index(min(load))
        plan[d].append(i)
        load[d] += costs[i]
    return [sorted(indices) for indices in plan]


class _Stopped(Exception):
    """A sub-batch's thread stops between compiled calls: the batch was abandoned."""


def _run_sub_batches(run_one: Callable[[int, Mesh | None, Callable | None], tuple], costs: Sequence[float], mesh: Mesh,
                     split: SplitProgress | None) -> list[tuple]:
    """[run_one(i, mesh_i, progress_i) for each sub-batch i of `costs` (sub_batch_cost)]. With at
    least as many sub-batches as the mesh's devices (and > 1), the devices run theirs at
    once, a thread each (device_plan; XLA releases the GIL): a small sub-batch sharded
    over every device pays each event's fixed cost on each of them, one per device pays
    it once (the 11-policy mix of benchmarks/HISTORY.md: 1.55x the mean of each policy
    alone run one after another). Otherwise one after another over the whole mesh
    (mesh_i None)."""
    devices, count = list(mesh.devices.flat), len(costs)
    if count < max(2, len(devices)):
        return [run_one(i, None, split and split.part(i)) for i in range(count)]
    stop, out = threading.Event(), [None] * count

    def watched(i: int) -> Callable:
        def report(*args):
            if stop.is_set():
                raise _Stopped
            if split is not None:
                split.part(i)(*args)
        return report

    def device(d: int, indices: list[int]) -> None:
        one = Mesh(np.asarray([devices[d]]), (LANES,))
        for i in indices:
            out[i] = run_one(i, one, watched(i))

    with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
        futures = [pool.submit(device, d, indices) for d, indices in enumerate(device_plan(costs, len(devices)))]
        try:
            finished, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            failed = [f for f in futures if f in finished and f.exception() is not None]
            if failed:
                failed[0].result()
        except BaseException:  # Ctrl-C or a failed part: the other threads stop at their next call
            stop.set()
            raise
    return out


def run(run_batch: Callable, config: EngineConfig, settings: Sequence[Settings], batch: EngineBatch, shared, *,
        regroup: bool | None = None, **run_args):
    """`run_batch(config, batch, shared, **run_args)` -> (host carry, done bool[B]), or,
    when the batch mixes policies and `regroup` (default: `worth_regrouping`), the same
    from one `run_batch` per policy (`run_args` as runner.run's: `progress` is split; the
    sub-batches run a device each when there are enough of them, see _run_sub_batches)."""
    groups = policy_lanes(settings, config.policies)
    ruled = regroup is None
    if ruled:
        regroup = decide(config, len(groups), planned_events(config, len(settings), run_args))
    if not regroup or config.policies == (groups[0][0],):
        host, done = run_batch(config, batch, shared, **run_args)
        if ruled and hasattr(host, "iterations"):  # the events each lane ran, mixed
            pay(config, int(np.asarray(host.iterations, np.int64).sum()))
        return host, done
    template = jax.eval_shape(functools.partial(runner.init, program=PROGRAM, config=config), batch, shared)
    progress = run_args.pop("progress", None)
    mesh = run_args.pop("mesh", None) or lane_mesh()
    split = SplitProgress(progress, [len(lanes) for _, lanes in groups]) if progress is not None else None

    configs = [policy_config(config, policy, [settings[j] for j in lanes]) for policy, lanes in groups]

    def run_one(i: int, device: Mesh | None, report: Callable | None):
        policy, lanes = groups[i]
        own = configs[i]
        part = sub_batch(config, settings, batch, lanes, policy, device and device.devices.flat[0])
        return run_batch(own, part, shared, mesh=device or mesh, progress=report, **run_args)

    costs = [sub_batch_cost(own, len(lanes)) for own, (_, lanes) in zip(configs, groups)]
    hosts = _run_sub_batches(run_one, costs, mesh, split)
    done = np.zeros(len(settings), bool)
    for (_, lanes), (_, d) in zip(groups, hosts):
        done[lanes] = np.asarray(d)
    return merge(template, [(lanes, host) for (_, lanes), (host, _) in zip(groups, hosts)]), done
