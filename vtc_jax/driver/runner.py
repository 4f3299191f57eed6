"""The one runner: lanes of any engine, advanced in compiled chunks until done.

An engine gives the runner a `LaneProgram`: three pure functions of ONE lane,

  init(config, batched, shared) -> carry     the lane's initial state;
  step(carry, batched, shared, config) -> carry   one event (a no-op once done);
  done(carry) -> bool[]                      the lane has finished;

where `config` is the engine's static (hashable) configuration, `batched` a pytree whose
leaves all carry a leading lane axis (the lane's own inputs) and `shared` a pytree every
lane reads whole (for example one trace replayed under many settings). The runner owns
everything else, once for every engine: vmap over lanes, a loop of events per compiled
call (its count an argument, sized by measured time so a call lasts about CALL_SECONDS
and Ctrl-C is honoured, and near the end by the lanes' estimated events left when the
program gives `events_left`; the total is whole `chunk`s, as if every call ran `chunk`
events), jit with the config static (one compile per config),
padding the lane count to the device mesh, sharding lanes over it, donating the carry, and
the host loop that stops when every lane is done or the event budget is
spent (a lane still running then is reported as not finished, never as done).
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from vtc_jax.core.lanes import LANE_AXIS
from vtc_jax.driver.devices import LANES, lane_mesh, pad_to, shard
from vtc_jax.engines.program import LaneProgram


def _loop_events(program: LaneProgram, config, carry, batched, shared, num_events):
    def body(_, c):
        return program.step(c, batched, shared, config)

    return jax.lax.fori_loop(0, num_events, body, carry)


@functools.partial(jax.jit, static_argnames=("program", "config", "mesh"))
def advance(carry, batched, shared, num_events, *, program: LaneProgram, config, mesh: Mesh | None = None):
    """`num_events` events of every lane (vmapped over the leading lane axis). The count is
    an int32[] argument, not static: one compiled program runs any number of events, so the
    host can size each call by its measured time without compiling again. Over a `mesh` of
    several devices each runs its own lanes (shard_map: the lane program is compiled once,
    as for one device, not partitioned op by op; lanes never communicate)."""
    lane = functools.partial(_loop_events, program, config)

    def lanes(carry, batched, shared, num_events):
        return jax.vmap(lane, in_axes=(0, 0, None, None), axis_name=LANE_AXIS)(carry, batched, shared, num_events)

    if mesh is None or mesh.devices.size == 1:
        return lanes(carry, batched, shared, num_events)
    spec = PartitionSpec(LANES)
    return jax.shard_map(lanes, mesh=mesh, in_specs=(spec, spec, PartitionSpec(), PartitionSpec()), out_specs=spec,
                         check_vma=False)(carry, batched, shared, num_events)


# The carry is dead after each chunk: donating it lets XLA update it in place, on CPU too
# (jax 0.10 honours it there). Without it every call allocated and paged in a fresh carry:
# vllm at 4096 lanes, 560 MB a call and 50 s of a 90 s run in the kernel.
advance_donating = jax.jit(advance.__wrapped__, static_argnames=("program", "config", "mesh"), donate_argnums=(0,))


@functools.partial(jax.jit, static_argnames=("program",))
def all_done(carry, *, program: LaneProgram):
    """bool[]: every lane is done."""
    return jnp.all(jax.vmap(program.done)(carry))


@functools.partial(jax.jit, static_argnames=("program",))
def done_and_left(carry, *, program: LaneProgram):
    """(bool[] every lane is done, int32[] the program's estimate of the events its slowest
    lane has left)."""
    return jnp.all(jax.vmap(program.done)(carry)), jnp.max(jax.vmap(program.events_left)(carry))


def lanes_status(carry, program: LaneProgram) -> tuple[bool, int | None]:
    """(every lane is done, most events a lane has left by the program's estimate, or None
    when it gives none): one small device read between calls."""
    if program.events_left is None:
        return bool(jax.device_get(all_done(carry, program=program))), None
    finished, left = jax.device_get(done_and_left(carry, program=program))
    return bool(finished), int(left)


@functools.partial(jax.jit, static_argnames=("program", "config"))
def init(batched, shared, *, program: LaneProgram, config):
    """Every lane's initial carry."""
    return jax.vmap(lambda b: program.init(config, b, shared))(batched)


def default_chunk(expected_events: int) -> int:
    """Events per compiled call: about 1/32 of the expected run (rounded to a power of
    two, so nearby runs share one compiled program), so a finished batch wastes little
    (lanes finish at different events) and the host checks `done` a few dozen times."""
    target = max(128, min(8192, -(-int(expected_events) // 32)))
    return 1 << (target - 1).bit_length()


# A signal handler (Ctrl-C) runs only between compiled calls: each call is kept to about
# this long, so a stop is honoured within a second or two whatever the events cost.
CALL_SECONDS = 0.5
FIRST_CALL_EVENTS = 64  # the first call also compiles: small, so it cannot run for minutes
# The smallest call sized by the lanes' estimated events left: each call costs a device
# read, so the tail is run in calls no smaller than this.
MIN_TAIL_EVENTS = 32


def next_call_events(events: int, seconds: float, chunk: int, first: bool, left: int | None = None) -> int:
    """Events for the next compiled call after one of `events` events took `seconds`:
    scaled to take about CALL_SECONDS, growing at most 4x a call (a fast call may be mostly
    overhead), within [1, chunk]. After the first call (its time is mostly compile) it
    only grows. With `left` (the most events a lane has left, estimated), no more than
    half of that (at least MIN_TAIL_EVENTS): a batch's last calls close in on its slowest
    lane instead of running past it (done lanes are no-ops, so this changes no result).
    The estimate, a maximum over lanes of noisy rates, runs high: kv_budget's M = 2048
    lanes were estimated at 252 events left with about 100 to go."""
    grown = min(chunk, 4 * events)
    if not (first or seconds <= 0):
        grown = max(1, min(grown, int(events * CALL_SECONDS / seconds)))
    if left is not None:
        grown = min(grown, max(MIN_TAIL_EVENTS, -(-left // 2)))
    return grown


def pad_lanes(tree, lanes: int, target: int):
    """Repeat lanes (cyclically) along the leading axis of every leaf up to `target`."""
    if target == lanes:
        return tree
    index = np.arange(target) % lanes
    return jax.tree_util.tree_map(lambda x: x[index], tree)


def run(program: LaneProgram, config, batched, shared=None, *, event_budget: int, chunk: int | None = None,
        expected_events: int | None = None, mesh: Mesh | None = None,
        progress: Callable[[int, int, float], None] | None = None):
    """Run every lane to done or `event_budget` events.

    Args:
      program: the engine's LaneProgram; config: its static config.
      batched: per-lane inputs (leading lane axis B on every leaf); shared: inputs every
        lane reads whole (or None).
      event_budget: events after which a lane that is not done is given up (not finished).
      chunk: events per compiled call at most (default: from `expected_events`); lanes not
        done run whole chunks (the budget rounded up to a multiple of it).
      mesh: devices to shard the lanes over (default: every local device). Lanes are
        padded to a multiple of its size with repeats whose results are dropped.
      progress: called as progress(events spent, events expected in all, seconds) after each
        compiled call (the expected count, when given, else the budget rounded up to whole
        chunks; never below what was spent).

    Returns (carry with B lanes, on the host as numpy, and done: bool[B]).
    """
    lanes = jax.tree_util.tree_leaves(batched)[0].shape[0]
    mesh = mesh or lane_mesh()
    target = pad_to(lanes, mesh)
    batched = shard(pad_lanes(batched, lanes, target), mesh)
    if shared is not None:
        shared = shard(shared, mesh, batched=False)
    # the carry enters `advance` with the sharding it leaves it with: one compile per shape
    carry = shard(init(batched, shared, program=program, config=config), mesh)
    chunk = chunk or default_chunk(expected_events or event_budget)
    # Every lane runs the events of whole chunks (a no-op once done), as when each call
    # ran `chunk` events: calls of any size add up to the same results.
    limit = -(-event_budget // chunk) * chunk
    events = min(chunk, FIRST_CALL_EVENTS)
    spent, started, first = 0, time.perf_counter(), True
    finished, left = lanes_status(carry, program)
    while spent < limit and not finished:
        n = min(events, limit - spent)
        call = time.perf_counter()
        carry = advance_donating(carry, batched, shared, np.int32(n), program=program, config=config, mesh=mesh)
        if mesh.devices.size > 1:  # jit returns empty leaves replicated: placed as before, no second compile
            carry = shard(carry, mesh)
        jax.block_until_ready(carry)
        seconds = time.perf_counter() - call
        finished, left = lanes_status(carry, program)
        events = next_call_events(n, seconds, chunk, first, left)
        spent, first = spent + n, False
        if progress is not None:
            progress(spent, min(limit, max(expected_events or event_budget, spent)), time.perf_counter() - started)
    host = jax.tree_util.tree_map(lambda x: np.asarray(x)[:lanes], jax.device_get(carry))
    return host, np.asarray(jax.vmap(program.done)(carry))[:lanes]
