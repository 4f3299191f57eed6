"""Devices, hosts and memory: sharding the lane axis, sizing chunks, the compilation cache.

A sweep is embarrassingly parallel over lanes, so scale-out is data placement only: the
lane axis of every batched array is sharded over a 1-D `jax.sharding.Mesh` of local
devices (`NamedSharding(mesh, P("lanes"))`); jit then runs the same program on every
device with no communication. Across hosts, `jax.distributed` (JAX's own runtime) starts
the processes; each runs a contiguous share of the lanes on its local devices and the
per-lane results are gathered with `multihost_utils.process_allgather`.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LANES = "lanes"
DEFAULT_CACHE_DIR = Path(os.environ.get("VTC_JAX_CACHE", Path.home() / ".cache" / "vtc_jax" / "xla"))


def host_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def use_every_core() -> int | None:
    """Give XLA:CPU one host device per core (returns the count set, or None when left
    alone). A CPU device runs its lanes' event loop on one thread, so one device leaves the
    other cores mostly idle; lanes sharded over one device per core run up to 2x faster on
    2 cores (benchmarks/RESULTS.md), with identical results. Only before JAX's backends
    start, and never over the user's own choice (JAX_NUM_CPU_DEVICES, jax_num_cpu_devices
    or XLA_FLAGS' --xla_force_host_platform_device_count)."""
    chosen = ("JAX_NUM_CPU_DEVICES" in os.environ or getattr(jax.config, "jax_num_cpu_devices", -1) >= 0
              or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""))
    if chosen:
        return None
    count = host_cores()
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except (RuntimeError, AttributeError):  # the backends have started (or a JAX without the option): keep one
        return None
    return count


def lane_mesh(devices: int | None = None) -> Mesh:
    """A 1-D mesh over the first `devices` local devices (default: all of them)."""
    local = jax.local_devices()
    if devices is not None:
        if devices < 1 or devices > len(local):
            raise ValueError(f"--devices must be in [1, {len(local)}], got {devices}")
        local = local[:devices]
    return Mesh(np.asarray(local), (LANES,))


def pad_to(n: int, mesh: Mesh) -> int:
    """Lanes rounded up to a multiple of the mesh size."""
    size = mesh.devices.size
    return -(-n // size) * size


def shard(tree, mesh: Mesh, batched: bool = True):
    """Place a pytree: leading axis split over the mesh (batched) or replicated."""
    spec = PartitionSpec(LANES) if batched else PartitionSpec()
    return jax.device_put(tree, NamedSharding(mesh, spec))


def available_bytes(mesh: Mesh) -> int:
    """Free memory usable by one chunk: free accelerator memory summed over the mesh, or
    half of the host's available memory for CPU devices."""
    total = 0
    for device in mesh.devices.flat:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if stats and "bytes_limit" in stats:
            total += int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        else:
            try:
                host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            except (ValueError, OSError):
                host = 4 << 30
            return int(host // 2)
    return int(total * 0.8)


def enable_compilation_cache(directory: str | os.PathLike | None = DEFAULT_CACHE_DIR) -> None:
    """Persist compiled executables across runs in `directory` (None: leave it off)."""
    if directory is None:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # every compile, however short: what a run writes must not depend on the machine's load
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def init_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Start JAX's distributed runtime when a coordinator is given (flags or the usual
    JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables)."""
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not coordinator:
        return
    num_processes = num_processes if num_processes is not None else int(os.environ.get("JAX_NUM_PROCESSES", "1"))
    process_id = process_id if process_id is not None else int(os.environ.get("JAX_PROCESS_ID", "0"))
    # Cross-process collectives for CPU devices (GPUs use NCCL); touches no backend.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


def process_share(total: int) -> tuple[int, int]:
    """This process's contiguous lane range [start, stop) of `total` lanes."""
    count, index = jax.process_count(), jax.process_index()
    per = -(-total // count)
    return min(index * per, total), min((index + 1) * per, total)


def gather_lanes(values: np.ndarray, total: int) -> np.ndarray:
    """Concatenate every process's share (in process order) of a per-lane array."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    # Exchange raw bytes (as int32): without x64, JAX would round float64 to float32.
    per = -(-total // jax.process_count())
    raw = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), -1)
    padded = np.zeros((per, raw.shape[1]), dtype=np.int32)
    padded[: len(values)] = raw
    gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(-1, raw.shape[1])[:total]
    return gathered.astype(np.uint8).view(values.dtype).reshape((total,) + values.shape[1:])
