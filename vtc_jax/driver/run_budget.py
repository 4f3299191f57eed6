"""What a run will cost, said before it starts: memory and time from the batch's shapes.

A run's lanes are held all at once (one compiled batch) and each runs its events one after
another, so memory grows with lanes x (request rows, running slots, the server's state) and
time with lanes x events x the cost of one event. A prefix-caching pool (vllm_prefix,
servers/vllm_blocks.py) holds O(P + U + S W) per lane: per pool block its holders, hash,
copy links, LRU stamp and free stack; a ring of ring_size(P, W) LRU entries; a head and
tail per distinct content (U, padded to a power of two) and the content table; a block
table of W cells per running slot. Its event's work is what changes: the running phase
walks the running requests one loop pass each, blocks are taken and hashed in passes of
up to 64, a release is vectorized over the W cells of a request's table.

    shape = RunShape(lanes=2, slots=256, pool_blocks=67660, rows=config.num_rows,
                     events=expected_events, prefix_caching=True, devices=2,
                     table_width=W, contents=U, running=mean_running, block_ops=blocks)
    run_budget.check(shape)   # InputError past free memory; a one-line warning past WARN_SECONDS

The constants are measured (XLA:CPU, jax 0.10.2, 2 devices on a shared 2-core machine; how,
beside each): they make an estimate, not a promise, biased high.
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
LANE_BASE_BYTES = 64 << 10     # measures, policy state, clocks
# A prefix-caching pool (servers/vllm_blocks.py Pool), int32 throughout: checked against the
# state `python -m benchmarks.bench_prefix --profile 40 --lanes 8` reports (5,033,894 B a lane
# at P = 67,660, W = 56, U' = 262,144, 256 slots, 7,500 rows: this model says 4,826,912 B of
# pool and 1,043,000 of rows, slots and base).
POOL_BLOCK_BYTES = 4 * 6       # per pool block: ref, key, cnext, cprev, freed_at, stack
RING_BYTES = 4                 # per LRU ring entry (ring_size(P, W) of them)
CONTENT_BYTES = 4 * 2          # per distinct content (padded to a power of two): head, tail
CONTENT_ID_BYTES = 4           # per block id of the content table (the lane's settings)
TABLE_BYTES = 4                # per block table cell: running slots x W, and held, hashed per slot

# Seconds. The engine's event on a small lane (call overheads included) and per running slot,
# measured on 2026-12-07 with timed vllm lanes (qwen2.5-7b-h100 step times) of 3 and 40
# requests; POOL_SECONDS for the vllm server's pool (no per-block state: 1.1e-8 s a block).
EVENT_SECONDS = 2.0e-4
SLOT_SECONDS = 1.0e-7
POOL_SECONDS = 1.1e-8
# vllm_prefix, refitted on 2026-12-07 after its running phase went closed-form (a walk only on
# a step that preempts) and its lookups batched: `python -m vtc_jax compare
# data/mooncake_fast25/conversation_trace.jsonl --server vllm --preset qwen2.5-7b-h100
# --tenants a:0.5,b:0.3,c:0.2 --policies fcfs,vtc [--time-window 0,1000]` ran its 2 lanes (a
# device each) in 203 s for the whole trace (536,247 events, W 7,908, 18.6 M block operations,
# 9 running) and 87 s for its first 1,000 s (150,505 events): about 3.0e-4 s an event and 42 s
# of compile and setup, what the vllm terms above already give at 1,024 slots; this model says
# 239 s and 67 s. The walk and chunk terms are what is left per running request and per 64
# blocks of W; BLOCK_SECONDS and RELEASE_SECONDS are the kernel profile's (`bench_prefix
# --profile`: a take or hash pass of 64 blocks is about a hundred small kernels); see
# benchmarks/HISTORY.md "vllm_prefix at the real pool". (The first fit, 6.6e-5 s per running
# request and 3.0e-5 per chunk, was of the per-request walk: it said 42 minutes for the whole
# trace.)
PREFIX_EVENT_SECONDS = 3.0e-5  # per event: the prefix server's passes that run every event
WALK_SECONDS = 2.0e-6          # per event per running request (the running phase's prefix sums)
CHUNK_SECONDS = 2.0e-7         # per event per 64 blocks of W (a lookup, all positions at once)
BLOCK_SECONDS = 2.0e-6         # per block taken or hashed (passes of up to 64 blocks)
RELEASE_SECONDS = 5.0e-9       # per table cell of a released or admitted request (W per request)

WARN_SECONDS = 10 * 60         # past this, a one-line warning before the run
MEMORY_SHARE = 0.8             # of the machine's free memory a run may plan to hold


def ring_size(blocks: int, width: int) -> int:
    """servers/vllm_blocks.ring_size: a power of two >= 2 (P + W) (repeated here: the driver
    floor does not import a server)."""
    return 1 << (2 * (blocks + width) - 1).bit_length()


def _pow2(n: int) -> int:
    """vllm_prefix's padding of a table size: a power of two, at least 64."""
    return max(64, 1 << max(int(n) - 1, 0).bit_length())


@dataclasses.dataclass(frozen=True)
class RunShape:
    """The shapes that size a run (plain ints).

    lanes: lanes held at once (the whole batch); slots: running slots per lane (at most the
    request rows); pool_blocks: KV pool blocks per lane (num_gpu_blocks; 0 when the server
    keeps no block pool); rows: request rows per lane (EngineConfig.num_rows); events:
    engine events one lane is expected to run (plan_lanes' expected events); prefix_caching:
    whether the pool is vllm_prefix's; devices: devices the lanes are spread over (each runs
    its share in parallel). With prefix_caching: table_width W, the most blocks a request
    holds (ceil((prompt + output - 1) / block size)); contents U, the lane's distinct block
    contents; content_ids, the block ids of its content table (every request's full blocks
    through its sequence; 0: U); running, the requests running a step on average (0: slots);
    block_ops, blocks taken plus blocks hashed over the run (0: none counted)."""

    lanes: int
    slots: int
    pool_blocks: int
    rows: int
    events: int
    prefix_caching: bool = False
    devices: int = 1
    table_width: int = 0
    contents: int = 0
    content_ids: int = 0
    running: int = 0
    block_ops: int = 0


@dataclasses.dataclass(frozen=True)
class Estimate:
    """bytes: int, what the batch holds at its peak; seconds: float, its run time (compile
    not counted)."""

    bytes: int
    seconds: float


def pool_bytes(shape: RunShape) -> int:
    """int: bytes of one lane's prefix-caching pool and content table (0 without prefix
    caching): P blocks, the ring, U contents, the S x W tables."""
    if not shape.prefix_caching:
        return 0
    p, w = shape.pool_blocks, max(shape.table_width, 1)
    return (POOL_BLOCK_BYTES * p + RING_BYTES * ring_size(p, w) + CONTENT_BYTES * _pow2(shape.contents)
            + CONTENT_ID_BYTES * _pow2(shape.content_ids or shape.contents) + TABLE_BYTES * shape.slots * (w + 2))


def lane_bytes(shape: RunShape) -> int:
    """int: bytes one lane holds while it runs (x2 for XLA's buffers)."""
    return 2 * (ROW_BYTES * shape.rows + SLOT_BYTES * shape.slots + pool_bytes(shape) + LANE_BASE_BYTES)


def lane_seconds(shape: RunShape) -> float:
    """float: seconds one lane's run takes: its events, and with prefix caching the walk
    over the running requests, a lookup's passes over W, the blocks taken and hashed, and
    the tables released."""
    base = shape.events * (EVENT_SECONDS + SLOT_SECONDS * shape.slots)
    if not shape.prefix_caching:
        return base + shape.events * POOL_SECONDS * shape.pool_blocks
    running = shape.running or shape.slots
    chunks = -(-shape.table_width // 64)
    return (base + shape.events * (PREFIX_EVENT_SECONDS + WALK_SECONDS * running + CHUNK_SECONDS * chunks)
            + BLOCK_SECONDS * shape.block_ops + RELEASE_SECONDS * 2 * shape.rows * shape.table_width)


def estimate(shape: RunShape) -> Estimate:
    """The run's memory (lanes x `lane_bytes`) and time (`lane_seconds` for each lane of
    the busiest device: the devices run their lanes in parallel). ValueError for a shape
    that is not one (a caller's defect, not bad input)."""
    for name in ("lanes", "slots", "pool_blocks", "rows", "events", "devices", "table_width", "contents",
                 "content_ids", "running", "block_ops"):
        value, least = getattr(shape, name), 1 if name in ("lanes", "devices") else 0
        if type(value) is not int or value < least:
            raise ValueError(f"RunShape.{name} must be an int >= {least}, got {value!r}")
    per_device = -(-shape.lanes // shape.devices)
    return Estimate(bytes=shape.lanes * lane_bytes(shape), seconds=per_device * lane_seconds(shape))


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
