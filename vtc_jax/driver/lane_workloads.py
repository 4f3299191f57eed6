"""Lanes' requests on the devices: generated from seeds (each distinct source and seed
once, gathered into every setting's lane that shares it), with their arrival timelines,
placed where the runner will run them (sharded over a mesh of several devices)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vtc_jax.core.errors import InputError
from vtc_jax.driver.devices import LANES, shard
from vtc_jax.engines.engine_config import EngineConfig
from vtc_jax.engines.settings import INT32_MAX
from vtc_jax.inputs import sources, threefry
from vtc_jax.inputs.workload import Workload, add_timelines


def with_timeline(workload: Workload, *, batched: bool) -> Workload:
    """`workload` with its arrival timeline (built on the device when missing; a batched
    workload has a leading lane axis)."""
    if workload.timeline is not None:
        return workload
    return (_timeline_many if batched else _timeline_one)(workload)


# Module-level so that every call with the same shapes reuses one compile.
_timeline_one = jax.jit(functools.partial(add_timelines, batched=False))
_timeline_many = jax.jit(functools.partial(add_timelines, batched=True))


def lane_keys(seeds: Sequence[int], base_seed: int = 0) -> jax.Array:
    """One key per lane from its seed alone: the same seed gives the same trace in any batch
    (jax's Threefry keys, drawing through `threefry.KEY_IMPL`: the same bits, faster)."""
    seeds = np.asarray(seeds, dtype=np.int64)
    if seeds.ndim != 1 or (seeds < 0).any() or (seeds > INT32_MAX).any():
        raise InputError("seeds must be integers in [0, 2^31)")
    if not 0 <= base_seed <= INT32_MAX:
        raise InputError(f"the base seed must be in [0, 2^31), got {base_seed}")
    base = threefry.key(base_seed)
    return jax.vmap(lambda s: jax.random.fold_in(base, s))(jnp.asarray(seeds, jnp.uint32))


def generate_workloads(srcs: Sequence[sources.Source], seeds: Sequence[int], config: EngineConfig,
                       base_seed: int = 0, mesh: Mesh | None = None) -> Workload:
    """Lane i's requests from seeds[i] and srcs[i], laid out for `config` (device); a
    trace's seed 0 is the trace itself (`sources.replays_exactly`). With `mesh`, and lanes
    a multiple of its size, they are generated where the runner will run them: lanes
    sharded over its devices (every device generates its own, nothing is copied after)."""
    lay = sources.layout(sources.unique(srcs), config.arrival_width + 1)
    extra = config.num_rows - lay.num_rows  # a larger shared config: pad the last block
    lay = dataclasses.replace(lay, size=lay.size[:-1] + (lay.size[-1] + extra,))
    keys, params = lane_keys(seeds, base_seed), sources.stack(srcs)
    if _shards(mesh, len(seeds)):
        keys, params = shard(keys, mesh), shard(params, mesh)
    return sources.generate_lanes(keys, params, kind=srcs[0].kind,
                                  horizon=srcs[0].horizon, lay=lay, pad=config.arrival_width + 1,
                                  num_clients=config.num_clients, exact=sources.replays_exactly(seeds))


def _shards(mesh: Mesh | None, lanes: int) -> bool:
    """Whether `lanes` lanes are placed sharded over `mesh` (several devices, evenly)."""
    return mesh is not None and mesh.devices.size > 1 and lanes % mesh.devices.size == 0


def distinct_workloads(srcs: Sequence[sources.Source], seeds: Sequence[int], config: EngineConfig,
                       base_seed: int = 0, mesh: Mesh | None = None) -> tuple[Workload, np.ndarray]:
    """Each distinct (source, seed) of the lanes generated once, with its timeline, and
    int32[B] the row of it lane i uses (a sweep's settings share their seeds' requests:
    generation is paid once per seed, not once per setting). With `mesh`, generated where
    the runner will run them (when lanes share seeds and divide evenly over its devices,
    the last distinct one is repeated so that the distinct ones divide evenly too)."""
    pairs = [(id(src), int(seed)) for src, seed in zip(srcs, seeds)]
    distinct = list(dict.fromkeys(pairs))
    where = {pair: i for i, pair in enumerate(distinct)}
    index = np.asarray([where[p] for p in pairs], np.int32)
    source_of = dict(zip(pairs, srcs))
    if len(distinct) < len(pairs) and _shards(mesh, len(pairs)):
        distinct = distinct + distinct[-1:] * (-len(distinct) % mesh.devices.size)
    made = with_timeline(generate_workloads([source_of[p] for p in distinct], [p[1] for p in distinct], config,
                                            base_seed, mesh), batched=True)
    return made, index


def lanes_of(made: Workload, index: np.ndarray, mesh: Mesh | None = None) -> Workload:
    """Lanes `index` (int32[B]) of `made` (`distinct_workloads`): `made` itself when
    that is every lane of it in order (nothing copied), else gathered (straight into lanes
    sharded over `mesh` when they divide evenly)."""
    if len(index) == made.requests.shape[0] and np.array_equal(index, np.arange(len(index))):
        return made
    if _shards(mesh, len(index)):
        return take_lanes_sharded(made, jnp.asarray(index), NamedSharding(mesh, PartitionSpec(LANES)))
    return take_lanes(made, jnp.asarray(index))


def shared_workloads(srcs: Sequence[sources.Source], seeds: Sequence[int], config: EngineConfig,
                     base_seed: int = 0, mesh: Mesh | None = None) -> Workload:
    """`generate_workloads` with its timeline, each distinct (source, seed) generated once
    and gathered into every lane that uses it. With `mesh`, the lanes are sharded over it
    (when they divide evenly), as the runner will run them."""
    made, index = distinct_workloads(srcs, seeds, config, base_seed, mesh)
    return lanes_of(made, index, mesh)


@jax.jit
def take_lanes(workload: Workload, index: jax.Array) -> Workload:
    """Lanes `index` (int32[B]) of a batched workload (or any pytree with a leading lane axis)."""
    return jax.tree_util.tree_map(lambda x: jnp.take(x, index, axis=0), workload)


@functools.partial(jax.jit, static_argnames=("sharding",))
def take_lanes_sharded(workload: Workload, index: jax.Array, sharding: NamedSharding) -> Workload:
    """`take_lanes` written straight into lanes sharded by `sharding`."""
    return jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(jnp.take(x, index, axis=0), sharding),
                                  workload)
