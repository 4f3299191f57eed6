"""What an engine hands the driver's runner: three pure functions of ONE lane.

  init(config, batched, shared) -> carry          the lane's initial state;
  step(carry, batched, shared, config) -> carry   one event (a no-op once done);
  done(carry) -> bool[]                           the lane has finished;

and, optionally, events_left(carry) -> int32[], an estimate of the events the lane has
left (0 once done), by which the runner sizes its last calls so that a batch does not run
long past its slowest lane; results never depend on it.

The runner (vtc_jax.driver.runner) owns vmap, jit, chunking and sharding; an engine owns
only its lane. The type lives here, on the engines' floor, so engines import nothing
from the driver above them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax


@dataclasses.dataclass(frozen=True)
class LaneProgram:
    """An engine's per-lane functions (see the module docstring)."""

    name: str
    init: Callable[[Any, Any, Any], Any]
    step: Callable[[Any, Any, Any, Any], Any]
    done: Callable[[Any], jax.Array]
    events_left: Callable[[Any], jax.Array] | None = None
