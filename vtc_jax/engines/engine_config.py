"""The engine's static configuration (engines/engine.py): changing a field recompiles."""

from __future__ import annotations

import dataclasses

from vtc_jax.core import clock
from vtc_jax.engines import quiet
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.servers import registry as servers
from vtc_jax.servers.base import ServerShape


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Static settings: changing one recompiles.

    Attributes:
      num_clients: K.
      num_rows: R, rows of the workload (all blocks, padding included).
      calendar_rows: L, rows of the completion calendar (the longest output + 1).
      slots: running-request slots (>= the most requests that can run at once).
      policies: the policies present in the batch (registry names); lanes pick theirs by
        `Params.policy_id`.
      rpm: some lane has an RPM limit that delays admissions.
      kv_cap: some lane has per-client KV caps.
      bands: some lane has priority bands.
      estimator: some lane's policy predicts outputs (the estimator state is kept).
      arrival_rows: some policy reads arriving requests' rows (Policy.arrival_rows).
      wide: exact integers in the WIDE format (to 2^55); False: NARROW int32, which the
        planner allows only when it proved every total, counter and tag below 2^30.
      record_every: checkpoint W every this many steps (0: no checkpoints).
      num_checkpoints: rows of the checkpoint buffer (>= horizon // record_every).
      arrival_width: arrivals taken in one event, all clients together (any value up to
        workload.TIMELINE_PAD is exact).
      quiet_window: quiet steps one FINISH event may run after its own (0: none); it reads
        that many timeline entries ahead (any value up to workload.TIMELINE_PAD is exact).
      drain: run until every request completed (the horizon is then a safety bound).
      measures: which optional measures to accumulate.
      server: the server's registry name (servers/registry.py).
      requeue_depth: preempted requests a client's stack holds (servers that preempt).
      log_steps: steps of schedule the server keeps a log of (0: none; servers that log).
      server_static: the server's static settings for every lane (ServerShape.static).
      wide_clock: the clock (step, arrivals, stamps) is int64 (core/clock.py; the run is
        traced under JAX's 64-bit mode), for runs past 2^30 steps or microseconds.
    """

    num_clients: int
    num_rows: int
    calendar_rows: int
    slots: int
    policies: tuple[str, ...] = ("vtc",)
    rpm: bool = False
    kv_cap: bool = False
    bands: bool = False
    estimator: bool = False
    arrival_rows: bool = False
    wide: bool = True
    record_every: int = 0
    num_checkpoints: int = 0
    arrival_width: int = 4
    quiet_window: int = quiet.WINDOW
    drain: bool = False
    measures: MeasureConfig = MeasureConfig()
    server: str = servers.DEFAULT_SERVER
    requeue_depth: int = 16
    log_steps: int = 0
    server_static: tuple = ()
    wide_clock: bool = False

    @property
    def x64(self) -> bool:
        """The run needs JAX's 64-bit mode: a wide clock, or a server that computes in doubles."""
        return self.wide_clock or servers.get(self.server).x64

    @property
    def clock(self):
        """The clock's dtype (int32, or int64 for a wide clock)."""
        return clock.dtype(self.wide_clock)

    @property
    def server_shape(self) -> ServerShape:
        return ServerShape(num_clients=self.num_clients, calendar_rows=self.calendar_rows, slots=self.slots,
                           num_rows=self.num_rows, log_steps=self.log_steps, static=self.server_static,
                           wide_clock=self.wide_clock)
