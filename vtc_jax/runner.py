"""The one runner: lanes of any engine, advanced in compiled chunks until done.

An engine gives the runner a `LaneProgram`: three pure functions of ONE lane,

  init(config, batched, shared) -> carry     the lane's initial state;
  step(carry, batched, shared, config) -> carry   one event (a no-op once done);
  done(carry) -> bool[]                      the lane has finished;

where `config` is the engine's static (hashable) configuration, `batched` a pytree whose
leaves all carry a leading lane axis (the lane's own inputs) and `shared` a pytree every
lane reads whole (for example one trace replayed under many settings). The runner owns
everything else, once for every engine: vmap over lanes, `lax.scan` of `chunk` events
per compiled call, jit with the config static (one compile per config and chunk size),
padding the lane count to the device mesh, sharding lanes over it, donating the carry on
accelerators, and the host loop that stops when every lane is done or the event budget is
spent (a lane still running then is reported as not finished, never as done).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vtc_jax.devices import lane_mesh, pad_to, shard


@dataclasses.dataclass(frozen=True)
class LaneProgram:
    """An engine's per-lane functions (see the module docstring)."""

    name: str
    init: Callable[[Any, Any, Any], Any]
    step: Callable[[Any, Any, Any, Any], Any]
    done: Callable[[Any], jax.Array]


def _scan_events(program: LaneProgram, config, num_events: int, carry, batched, shared):
    def body(c, _):
        return program.step(c, batched, shared, config), None

    carry, _ = jax.lax.scan(body, carry, None, length=num_events)
    return carry


@functools.partial(jax.jit, static_argnames=("program", "config", "num_events"))
def advance(carry, batched, shared, *, program: LaneProgram, config, num_events: int):
    """`num_events` events of every lane (vmapped over the leading lane axis)."""
    lane = functools.partial(_scan_events, program, config, num_events)
    return jax.vmap(lane, in_axes=(0, 0, None))(carry, batched, shared)


# The carry is dead after each chunk: donating it lets XLA update it in place on
# accelerators (the CPU backend ignores donation, with a warning, so it is not used there).
advance_donating = jax.jit(advance.__wrapped__, static_argnames=("program", "config", "num_events"),
                           donate_argnums=(0,))


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
      chunk: events per compiled call (default: from `expected_events`).
      mesh: devices to shard the lanes over (default: every local device). Lanes are
        padded to a multiple of its size with repeats whose results are dropped.
      progress: called as progress(events spent, events expected in all, seconds) after each
        chunk (the expected count, when given, else the budget; never below what was spent).

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
    step = advance if jax.default_backend() == "cpu" else advance_donating
    chunk = chunk or default_chunk(expected_events or event_budget)
    spent, started = 0, time.perf_counter()
    while spent < event_budget and not bool(jax.device_get(jnp.all(jax.vmap(program.done)(carry)))):
        carry = step(carry, batched, shared, program=program, config=config, num_events=chunk)
        spent += chunk
        if progress is not None:
            progress(spent, min(event_budget, max(expected_events or event_budget, spent)), time.perf_counter() - started)
    host = jax.tree_util.tree_map(lambda x: np.asarray(x)[:lanes], jax.device_get(carry))
    return host, np.asarray(jax.vmap(program.done)(carry))[:lanes]
