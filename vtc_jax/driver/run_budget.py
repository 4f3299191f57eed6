"""What a run will cost, said before it starts: memory and time from the batch's shapes.

A run's lanes are held all at once (one compiled batch) and each runs its events one after
another, so memory grows with lanes x (request rows, running slots, KV pool blocks) and
time with lanes x events x the cost of one event, which a prefix-caching pool makes grow
with its blocks (vllm_prefix keeps per-block reference counts, owners, positions and cache
times, and a block table per running slot, and scans them every event: a 67,660-block pool
on a 2-request log ran for over 16 minutes).

    shape = RunShape(lanes=2, slots=13, pool_blocks=67660, rows=config.num_rows,
                     events=expected_events, prefix_caching=True, devices=2)
    run_budget.check(shape)   # InputError past free memory; a one-line warning past WARN_SECONDS

The constants are measured (XLA:CPU on a loaded 2-core machine; see below): they make an
estimate, not a promise, biased high.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable

from vtc_jax.core.errors import InputError

# Bytes of one lane's state (x2 for XLA's double buffers, as driver/sweep.py's lane_bytes).
ROW_BYTES = 4 * (5 + 6)        # a request row's fields and the generator's temporaries, int32
SLOT_BYTES = 4 * 40            # a running slot's fields (prompt, output, tokens, value, row copy, ...)
BLOCK_BYTES = 4 * 5            # a pool block's ref, owner, pos, cached_at, freed_at (prefix caching)
TABLE_BYTES = 4                # a block table cell: running slots x pool blocks (prefix caching)
LANE_BASE_BYTES = 64 << 10     # measures, policy state, clocks

# Seconds of one event of one lane, measured on 2026-12-07 (XLA:CPU, 2 devices on a shared
# 2-core machine under a load of about 10, so high by a few times on an idle one; compile
# excluded) with timed vllm lanes (qwen2.5-7b-h100 step times) of 3 and 40 requests:
#   vllm_prefix, 1,024 / 4,096 / 16,384 blocks, 192 events: 1.1e-3 / 8.0e-3 / 2.5e-2 s an
#     event (1.1-2.0e-6 s a block); 4,096 blocks, 40 requests (50 running slots, not 13),
#     937 events: 6.7e-3 s (1.6e-6 s a block: the block table's width costs nothing seen);
#   vllm, 4,096 / 65,536 blocks, 192 events: 3.1e-4 / 1.0e-3 s (1.1e-8 s a block);
#     4,096 blocks, 40 requests, 960 events: 1.7e-4 s.
EVENT_SECONDS = 2.0e-4         # the engine's event on a small lane (call overheads included)
SLOT_SECONDS = 1.0e-7          # per running slot per event
POOL_SECONDS = 1.1e-8          # per pool block per event (a block pool without prefix caching)
BLOCK_SECONDS = 1.6e-6         # per pool block per event (prefix caching: its per-block tables)

WARN_SECONDS = 10 * 60         # past this, a one-line warning before the run
MEMORY_SHARE = 0.8             # of the machine's free memory a run may plan to hold


@dataclasses.dataclass(frozen=True)
class RunShape:
    """The shapes that size a run (plain ints).

    lanes: lanes held at once (the whole batch); slots: running slots per lane (at most the
    request rows; vllm_prefix's EngineConfig.slots is its pool, its running slots
    min(pool, rows)); pool_blocks: KV pool blocks per lane (num_gpu_blocks; 0 when the
    server keeps no block pool); rows: request rows per lane (EngineConfig.num_rows);
    events: engine events one lane is expected to run (plan_lanes' expected events);
    prefix_caching: whether the pool is vllm_prefix's (per-block tables scanned each event);
    devices: devices the lanes are spread over (each runs its share in parallel)."""

    lanes: int
    slots: int
    pool_blocks: int
    rows: int
    events: int
    prefix_caching: bool = False
    devices: int = 1


@dataclasses.dataclass(frozen=True)
class Estimate:
    """bytes: int, what the batch holds at its peak; seconds: float, its run time (compile
    not counted)."""

    bytes: int
    seconds: float


def lane_bytes(shape: RunShape) -> int:
    """int: bytes one lane holds while it runs (x2 for XLA's buffers)."""
    pool = shape.pool_blocks * (BLOCK_BYTES + TABLE_BYTES * shape.slots) if shape.prefix_caching else 0
    return 2 * (ROW_BYTES * shape.rows + SLOT_BYTES * shape.slots + pool + LANE_BASE_BYTES)


def event_seconds(shape: RunShape) -> float:
    """float: seconds one event of one lane takes."""
    per_block = BLOCK_SECONDS if shape.prefix_caching else POOL_SECONDS
    return EVENT_SECONDS + SLOT_SECONDS * shape.slots + per_block * shape.pool_blocks


def estimate(shape: RunShape) -> Estimate:
    """The run's memory (lanes x `lane_bytes`) and time (events x `event_seconds` for each
    lane of the busiest device: the devices run their lanes in parallel). ValueError for a
    shape that is not one (a caller's defect, not bad input)."""
    for name in ("lanes", "slots", "pool_blocks", "rows", "events", "devices"):
        value, least = getattr(shape, name), 1 if name in ("lanes", "devices") else 0
        if type(value) is not int or value < least:
            raise ValueError(f"RunShape.{name} must be an int >= {least}, got {value!r}")
    per_device = -(-shape.lanes // shape.devices)
    return Estimate(bytes=shape.lanes * lane_bytes(shape), seconds=per_device * shape.events * event_seconds(shape))


def free_bytes() -> int:
    """int: the host's available memory (bytes), 4 GiB when it cannot be read."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def _size_words(est: Estimate) -> str:
    return f"about {est.bytes / 2**30:,.1f} GiB / about {est.seconds / 60:,.1f} minutes"


def check(shape: RunShape, *, available: int | None = None, warn_seconds: float = WARN_SECONDS,
          warn: Callable[[str], None] | None = None, what: str = "this run",
          shrink: str = "fewer lanes (policies x seeds), a smaller --num-gpu-blocks or a shorter log") -> Estimate:
    """Refuse (InputError, one line) a run whose estimate needs more than MEMORY_SHARE of
    `available` bytes (default: the host's free memory, `free_bytes`); warn (one line
    through `warn`, default stderr) when it would run past `warn_seconds`. Returns the
    estimate."""
    est = estimate(shape)
    available = free_bytes() if available is None else available
    if est.bytes > MEMORY_SHARE * available:
        raise InputError(f"{what} needs {_size_words(est)} ({shape.lanes} lane(s) of {shape.rows:,} rows, "
                         f"{shape.slots:,} slots, {shape.pool_blocks:,} pool blocks), more than the "
                         f"{available / 2**30:,.1f} GiB of memory free: give {shrink}")
    if est.seconds > warn_seconds:
        line = (f"warning: {what} needs {_size_words(est)} to run ({shape.lanes} lane(s) x {shape.events:,} events"
                + (f" over a {shape.pool_blocks:,}-block prefix-caching pool" if shape.prefix_caching else "")
                + f"); for a quicker answer give {shrink}")
        (warn or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
    return est
