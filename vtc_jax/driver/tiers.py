"""A server's slot tiers: a batch run with the smallest slot count first, then only its
lanes that overflowed it with the next, and so on (servers.base `slot_tiers`: an event
costs O(slots), and a run often holds far fewer requests than its bound). The results are
those of one run with the config's slots."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.driver import runner
from vtc_jax.driver.lane_workloads import take_lanes
from vtc_jax.engines.engine import PROGRAM
from vtc_jax.engines.engine_config import EngineConfig
from vtc_jax.servers import registry as servers


def tier_sizes(server: str, slots: int) -> list[int]:
    """The slot counts a run of server `server` tries, smallest first, ending at `slots`
    (the server's `slot_tiers`; just `slots` for a server without them)."""
    chosen = servers.get(server)
    tiers = chosen.slot_tiers(slots) if chosen.slot_tiers is not None else ()
    return sorted({int(s) for s in tiers if 0 < s < slots}) + [slots]


def slot_tiers(config: EngineConfig) -> list[int]:
    """The slot counts an engine run tries (`tier_sizes` of its server and slots)."""
    return tier_sizes(config.server, config.slots)


@dataclasses.dataclass(frozen=True)
class Lanes:
    """Where a program's host state keeps what tiers read: `servers(host)` the server
    states (leaves with the lane axis first, then any axes of servers per lane: a cluster's
    replicas), `with_servers(host, tree)` the host state with them replaced, and
    `overflowed(host)` bool[lanes] the lanes to rerun with more slots."""

    servers: Callable
    with_servers: Callable
    overflowed: Callable


ENGINE_LANES = Lanes(servers=lambda host: host.server,
                     with_servers=lambda host, tree: dataclasses.replace(host, server=tree),
                     overflowed=lambda host: np.asarray(host.overflow, bool))


def run_in_tiers(config, batch, shared, *, program=PROGRAM, lanes_of: Lanes = ENGINE_LANES, **run_args):
    """`runner.run` of every lane with the smallest slot tier, then of the lanes that
    overflowed it with the next, and so on (a server's events cost O(slots), its runs
    often hold far fewer requests than its bound). A lane that did not overflow is what it
    would be with more slots (servers/base.py), so its state is widened to config.slots
    with the server's empty slots and the results are those of one run with config.slots.
    `config` is any program's static config with `server`, `slots` and `server_shape`
    (the engine's, or a cluster's: `program` and `lanes_of` say where its servers are)."""
    tiers = tier_sizes(config.server, config.slots)
    lanes = np.arange(jax.tree_util.tree_leaves(batch)[0].shape[0])
    host = done = None
    previous = config
    for slots in tiers:
        tier = dataclasses.replace(config, slots=slots)
        part = batch if host is None else take_lanes(batch, jnp.asarray(lanes, jnp.int32))
        h, d = runner.run(program, tier, part, shared, **run_args)
        if host is None:
            host, done = h, np.asarray(d).copy()
        else:
            host = _merge_lanes(widen_server(host, config, previous, tier, lanes_of), h, lanes)
            done[lanes] = d
        previous = tier
        lanes = lanes[lanes_of.overflowed(h)]
        if lanes.size == 0:
            break
    return widen_server(host, config, previous, config, lanes_of), done


def widen_server(host, config, small, large, lanes_of: Lanes = ENGINE_LANES):
    """Host lanes run with `small`'s slots, as with `large`'s: each server-state leaf whose
    shape grew is the server's empty `init` leaf with the smaller one in its corner (past
    the lane axis and any axes of servers per lane)."""
    if small.slots == large.slots:
        return host
    chosen = servers.get(config.server)
    before = jax.eval_shape(lambda: chosen.init(small.server_shape))
    empty = jax.device_get(chosen.init(large.server_shape))

    def embed(blank, shape, leaf):
        if blank.shape == shape.shape:
            return leaf
        lead = leaf.shape[:leaf.ndim - blank.ndim]
        out = np.broadcast_to(np.asarray(blank), lead + blank.shape).copy()
        out[(slice(None),) * len(lead) + tuple(slice(0, n) for n in shape.shape)] = leaf
        return out

    return lanes_of.with_servers(host, jax.tree_util.tree_map(embed, empty, before, lanes_of.servers(host)))


def _merge_lanes(host, rerun, lanes: np.ndarray):
    """`host` with its lanes `lanes` replaced by `rerun`'s (host numpy trees of equal shapes)."""
    def put(a, b):
        a = np.array(a, copy=True)
        a[lanes] = b
        return a

    return jax.tree_util.tree_map(put, host, rerun)
