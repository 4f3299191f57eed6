"""A batch that mixes policies, run as one sub-batch per policy.

One compiled program can serve lanes of several policies (`EngineConfig.policies`: every
policy's hooks are traced and each lane selects its own on its policy id), but then every
lane pays for every policy: on CPU a batch mixing all eleven policies ran 7.4x the time of
vtc alone, regrouped 1.5x (benchmarks/RESULTS.md). `run` splits such a batch by policy instead: each policy's
lanes run under a config that traces that policy only, with their settings encoded again
for it (policy ids follow `config.policies`), and their carries are put back in the
batch's lane order, in the mixed program's carry structure, so that everything read from
them is what the mixed program gives (tests/test_policy_groups.py checks every field of
`LaneResults`). The one difference is unread: where the mixed program carried the states
of the policies a lane does not run along (and the estimator, for a lane whose policy
does not use it), the regrouped carry holds zeros.

A sub-batch is one more compile (about 3 s per policy on a 2-core CPU), so a small run is
cheaper mixed; `worth_regrouping` is the rule that decides, `decide` applies it counting
what earlier batches of the same config paid (its constants were measured with
`python -m benchmarks.bench_engine --lanes 4096 --dispatch-only`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.driver import runner
from vtc_jax.engines.engine import PROGRAM, EngineBatch, EngineConfig, LaneInput
from vtc_jax.engines.settings import Settings, encode_settings
from vtc_jax.policies import registry

# Measured on the 2-core CPU (`bench_engine --lanes 4096 --dispatch-only`, 2026-12-02: vtc
# alone 7.7 s, the 11-policy mixed program 57.0 s over 2.76e7 lane-events; regrouped, its
# 11 compiles ~28 s of its first call): each policy traced beside the lane's own adds
# about POLICY_SECONDS per lane-event to a mixed program, each sub-batch's compile about
# COMPILE_SECONDS.
POLICY_SECONDS = 1.8e-7
COMPILE_SECONDS = 2.6


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


def policy_config(config: EngineConfig, policy: str) -> EngineConfig:
    """`config` tracing `policy` alone, with arrival rows and the estimator only if it
    reads them (a policy that does not use the estimator sees zero estimates in any batch:
    engine._own_estimates)."""
    chosen = registry.get(policy)
    return dataclasses.replace(config, policies=(policy,), estimator=chosen.uses_estimator,
                               arrival_rows=chosen.arrival_rows)


@jax.jit
def _take(tree, index: jax.Array):
    return jax.tree_util.tree_map(lambda x: jnp.take(x, index, axis=0), tree)


def sub_batch(config: EngineConfig, settings: Sequence[Settings], batch: EngineBatch, lanes: np.ndarray,
              policy: str) -> EngineBatch:
    """Lanes `lanes` of `batch` (all running `policy`), their settings encoded for a
    config of `policy` alone; their workloads gathered when each lane has its own."""
    params, _ = encode_settings([settings[i] for i in lanes], config.num_clients, (policy,), config.server)
    index = jnp.asarray(lanes, jnp.int32)
    return EngineBatch(lane=LaneInput(params=params, horizon=_take(batch.lane.horizon, index)),
                       workload=None if batch.workload is None else _take(batch.workload, index))


def merge(template, parts: Sequence[tuple[np.ndarray, object]]):
    """The carry of `template`'s structure (shape-dtype leaves with the batch's leading
    lane axis) whose lanes `lanes` hold `host`'s leaf at the same path, for each (lanes,
    host) of `parts` (host numpy trees); a leaf a part does not carry is zero there."""
    found = [dict(jax.tree_util.tree_flatten_with_path(host)[0]) for _, host in parts]

    def fill(path, shape):
        out = np.zeros(shape.shape, shape.dtype)
        for (lanes, _), leaves in zip(parts, found):
            if path in leaves:
                out[lanes] = leaves[path]
        return out

    return jax.tree_util.tree_map_with_path(fill, template)


class SplitProgress:
    """The runner's progress callback for a batch run as sequential sub-batches: each part
    reports its events weighted by its share of the lanes, so the batch's count goes from
    0 to about the events per lane, as one run's would (a part's retries of some lanes,
    slot tiers, count its most events), and seconds from the first part's start."""

    def __init__(self, progress: Callable[[int, int, float], None], sizes: Sequence[int]):
        self.progress, self.started = progress, None
        self.share = np.asarray(sizes, np.float64) / max(sum(sizes), 1)
        self.spent = np.zeros(len(sizes))

    def part(self, i: int) -> Callable[[int, int, float], None]:
        def report(spent: int, expected: int, seconds: float):
            self.started = self.started or time.perf_counter() - seconds
            self.spent[i] = max(self.spent[i], spent)
            total = int(round(float(self.share @ self.spent)))
            self.progress(total, max(int(expected), total), time.perf_counter() - self.started)
        return report


def run(run_batch: Callable, config: EngineConfig, settings: Sequence[Settings], batch: EngineBatch, shared, *,
        regroup: bool | None = None, **run_args):
    """`run_batch(config, batch, shared, **run_args)` -> (host carry, done bool[B]), or,
    when the batch mixes policies and `regroup` (default: `worth_regrouping`), the same
    from one `run_batch` per policy (`run_args` as runner.run's: `progress` is split)."""
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
    split = SplitProgress(progress, [len(lanes) for _, lanes in groups]) if progress is not None else None
    parts, done = [], np.zeros(len(settings), bool)
    for i, (policy, lanes) in enumerate(groups):
        part = sub_batch(config, settings, batch, lanes, policy)
        host, d = run_batch(policy_config(config, policy), part, shared, progress=split and split.part(i), **run_args)
        parts.append((lanes, host))
        done[lanes] = np.asarray(d)
    return merge(template, parts), done
