"""Host side of the fleet's gateway (engines/cluster_fleet.py): the static picker config a
batch of cluster lanes shares, and each lane's gateway rules as arrays (FleetParams),
with the picker block ids derived once from the content the lane's server options carry
(the `prefix_blocks` PrefixTable: one derivation serves the replicas' caches and the
picker's index, ENGINE_FLEET.md section 5)."""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.engines import flow_control
from vtc_jax.engines.cluster_settings import ClusterSettings, FleetParams
from vtc_jax.inputs.picker_blocks import MAX_PREFIX_TOKENS, picker_block_ids, picker_block_size
from vtc_jax.pickers import base as picker_base
from vtc_jax.servers import registry as servers

DEFAULT_BLOCK = 16  # a server without KV blocks of its own: vLLM's default block size


def _options(c: ClusterSettings) -> dict:
    return dict(c.engine.server_options)


def engine_block(c: ClusterSettings) -> int:
    return int(_options(c).get("block_size", DEFAULT_BLOCK))


def usable_kv(c: ClusterSettings, server: str) -> int:
    """A replica's usable KV: blocks on a server that declares them (num_gpu_blocks - 1 on
    vLLM), else M in tokens."""
    options = _options(c)
    if servers.get(server).kv_blocks is not None and "num_gpu_blocks" in options:
        return int(options["num_gpu_blocks"]) - 1
    return int(c.engine.kv_budget)


def lane_blocks(c: ClusterSettings) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64[N + 1], ids int64[total]) the lane's picker block ids by request
    number (ORDER rank), from its content (none without: one empty request)."""
    table = _options(c).get("prefix_blocks")
    if table is None:
        return np.zeros(2, np.int64), np.zeros(0, np.int64)
    size = picker_block_size(engine_block(c))
    offsets, ids = picker_block_ids(table.ident, table.prompt, size, max_tokens=MAX_PREFIX_TOKENS)
    count = np.diff(offsets)[table.order]
    start = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    at = np.repeat(offsets[:-1][table.order] - start[:-1], count) + np.arange(int(start[-1]), dtype=np.int64)
    return start, ids[at]


def gateway_config(clusters: Sequence[ClusterSettings], replicas: int, server: str) -> dict:
    """ClusterConfig's picker fields for these lanes: one picker for the batch (lanes with
    different pickers run as batches of their own)."""
    rules = {c.gateway_rules.picker if c.gateway_rules is not None else None for c in clusters}
    if len(rules) > 1:
        raise InputError(f"one batch of cluster lanes runs one endpoint picker, got {sorted(map(str, rules))}")
    picker = rules.pop()
    if picker is None:
        return {}
    tables = [lane_blocks(c) for c in clusters]
    most = max(max(int(np.diff(o).max(initial=0)) for o, _ in tables), 1)
    ids = max(max(int(i.max(initial=-1)) + 1 for _, i in tables), 1)
    capacity = max(usable_kv(c, server) + 1 for c in clusters)
    return {"picker": picker, "flow_control": any(c.gateway_rules.flow_control for c in clusters),
            "picker_shape": (replicas, most, capacity, ids)}


def encode_gateway(clusters: Sequence[ClusterSettings], picker_shape: tuple, server: str) -> FleetParams:
    """The lanes' FleetParams (a leading lane axis)."""
    shape = picker_base.Shape(*picker_shape)
    tables = [lane_blocks(c) for c in clusters]
    rows = max(len(o) for o, _ in tables)
    total = max(len(i) for _, i in tables) + shape.max_blocks
    offsets = np.stack([np.concatenate([o, np.full(rows - len(o), o[-1])]) for o, _ in tables]).astype(np.int32)
    blocks = np.stack([np.concatenate([i, np.full(total - len(i), -1)]) for _, i in tables]).astype(np.int32)
    lanes = []
    for c in clusters:
        g = c.gateway_rules
        # llm-d's auto-tune: the index holds num_gpu_blocks entries of a replica (vLLM's blocks; the set counts
        # picker blocks: the mismatch is llm-d's, kept)
        lanes.append((picker_base.make_params(shape, ties=g.ties, capacity=usable_kv(c, server) + 1),
                      flow_control.saturation_params(g.queue_depth, g.kv_threshold), g))
    stack = lambda f, dt=np.int32: jnp.asarray(np.asarray([f(x) for x in lanes], dt))  # noqa: E731
    picker = picker_base.Params(*(jnp.stack([jnp.asarray(p[i]) for p, _, _ in lanes]) for i in range(3)))
    saturation = flow_control.SaturationParams(*(jnp.asarray(np.stack([s[i] for _, s, _ in lanes]))
                                                 for i in range(3)))
    return FleetParams(picker=picker, saturation=saturation, flow=stack(lambda x: bool(x[2].flow_control), np.bool_),
                       scrape_us=stack(lambda x: x[2].scrape_us), tick_us=stack(lambda x: x[2].tick_us),
                       usable=jnp.asarray(np.asarray([usable_kv(c, server) for c in clusters], np.int32)),
                       block=jnp.asarray(np.asarray([engine_block(c) for c in clusters], np.int32)),
                       blocks=jnp.asarray(blocks), offsets=jnp.asarray(offsets),
                       ttl_us=stack(lambda x: x[2].request_ttl_us), sweep_us=stack(lambda x: x[2].sweep_us),
                       capacity=stack(lambda x: x[2].band_capacity))
