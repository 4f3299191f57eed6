"""A batch whose lanes share their seeds' requests, run as one pass per setting.

A sweep's chunk holds whole seeds of every row (driver/sweep.py), so each seed's requests
are generated once and read by every row's lane. Run whole, every lane of the chunk runs
as many events as its slowest (a done lane is a vmapped no-op, and on CPU a no-op costs
as much as an event): `kv_budget`'s lanes need about 400 events at M = 2048 and 3,450 at
M = 32768, so 5 x 3,450 lane-events are paid where about 7,000 are needed. Run as one pass
per setting over the same generated requests (nothing copied: a pass's lanes are the
requests' own rows, in order), each pass stops at its own slowest lane.

On an accelerator an event's cost hardly grows with the lanes, so passes run one after
another would add up each pass's events: they are for CPU only, and only when each pass
still fills the devices (PASS_LANES_PER_DEVICE). Lanes never interact, so a lane's
results are the same in a pass as in the whole batch (tests/test_lane_passes.py).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

# Measured on the 2-core CPU (kv_budget's rows, one pass per M over the same seeds): 7.1,
# 8.0, 6.8 and 6.6 ms per seed at 128, 256, 512 and 1024 lanes per device, 12 ms per seed
# run whole: a pass of 128 lanes a device already costs no more per lane than a larger one.
PASS_LANES_PER_DEVICE = 128


def worth_passes(distinct: int, mesh: Mesh) -> bool:
    """Whether lanes sharing `distinct` generated workloads run in passes on `mesh`: on CPU
    devices, when each pass has at least PASS_LANES_PER_DEVICE lanes per device."""
    return mesh.devices.flat[0].platform == "cpu" and distinct >= PASS_LANES_PER_DEVICE * mesh.devices.size


def plan(keys: Sequence[Hashable], distinct: int, mesh: Mesh) -> list[np.ndarray] | None:
    """The passes of a batch of lanes that read `distinct` generated workloads: for each
    distinct key (a lane's setting and source), in order of first appearance, int64[n] its
    lanes in batch order; None to run the batch whole (no workload is shared by lanes, one
    key only, or `worth_passes` says no)."""
    groups: dict = {}
    for lane, key in enumerate(keys):
        groups.setdefault(key, []).append(lane)
    if distinct >= len(keys) or len(groups) < 2 or not worth_passes(distinct, mesh):
        return None
    return [np.asarray(lanes, np.int64) for lanes in groups.values()]


def join(parts: Sequence, passes: Sequence[np.ndarray], lanes: int):
    """One pytree of `lanes` lanes from one per pass (each of its structure, every leaf with
    a leading lane axis of its pass's lanes): pass i's lanes go to `passes[i]`."""
    def place(*leaves):
        first = np.asarray(leaves[0])
        out = np.empty((lanes,) + first.shape[1:], first.dtype)
        for where, leaf in zip(passes, leaves):
            out[where] = np.asarray(leaf)
        return out

    return jax.tree_util.tree_map(place, *parts)
