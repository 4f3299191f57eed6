"""Where a lane's requests come from: generated traffic, a trace, or real tenants.

A `Source` describes one lane's workload, host side; a batch of lanes (seeds x settings)
is generated on device by `generate_lanes`, lane i from its key alone (the same seed gives
the same requests in any batch). Three kinds, each a frozen dataclass:

  TrafficSource   synthetic Poisson traffic (traffic.py: rates per phase, length ranges);
  TraceSource     a fixed trace (a user's log); seed 0 replays it exactly, other seeds
                  redraw each arrival uniformly inside its own `phase_unit` steps (the
                  paper's resampling of arrival phases within their second), never past
                  the trace's last arrival (so a bound that drains the trace drains every
                  redraw);
  ServeGenSource  ServeGen's production tenants (servegen.py), at a given load.

Sources of one kind share the engine's static layout: every lane's blocks are sized for
the largest lane of the batch (`layout`), so a sweep compiles once.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs import servegen
from vtc_jax.inputs import traffic as traffic_mod
from vtc_jax.inputs.workload import (
    ARRIVAL,
    INT32_MAX,
    NUM_FIELDS,
    ORDER,
    Trace,
    Workload,
    block_sizes,
    layout_trace,
    padding_rows,
    requests_per_client,
    wide_clock_for,
)

I32 = jnp.int32
MAX_PHASE_UNIT = INT32_MAX // 2  # int32 arrivals are <= 2^30 (workload.MAX_ARRIVAL): start + unit fits (a wide clock: int64)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static blocks of a batch: per client (first, size) rows, and the generator's own
    static facts (`extra`, hashable)."""

    first: tuple[int, ...]
    size: tuple[int, ...]
    extra: tuple = ()

    @property
    def num_rows(self) -> int:
        return int(sum(self.size))


@dataclasses.dataclass(frozen=True, eq=False)
class TrafficSource:
    """Synthetic traffic (traffic.Traffic)."""

    traffic: traffic_mod.Traffic
    kind = "traffic"

    @property
    def num_clients(self) -> int:
        return self.traffic.num_clients

    @property
    def horizon(self) -> int:
        return self.traffic.horizon

    def lengths(self) -> tuple[int, int, int]:
        """(smallest prompt, largest prompt, largest output) any lane can hold."""
        return self.traffic.min_prompt(), *self.traffic.max_lengths()

    def expected_requests(self) -> float:
        return float(self.traffic.expected_requests().sum())

    def capacities(self) -> np.ndarray:
        return traffic_mod.client_capacities(self.traffic)

    def params(self):
        return jax.tree_util.tree_map(np.asarray, self.traffic.params())


@dataclasses.dataclass(frozen=True, eq=False)
class TraceSource:
    """A fixed trace; `phase_unit` > 1 resamples arrival phases per seed (seed 0: exact).
    `drain`: run each lane until its requests have all completed (`horizon` is then only a
    bound that suffices, and steps, throughput and the load line count to the last
    completion; it must pass the last arrival, which no redraw moves past).

    The trace is kept in (arrival, number) order (a stable sort): the lanes depend on the
    requests, not on the order of the file's rows, so an unsorted copy of a sorted trace
    gives the same lanes, every seed."""

    trace: Trace
    num_clients: int
    horizon: int
    phase_unit: int = 1
    drain: bool = False
    kind = "trace"

    def __post_init__(self):
        self.trace.validate(self.num_clients)
        if not 1 <= self.phase_unit <= MAX_PHASE_UNIT:  # a window's end stays below 2^31
            raise InputError(f"phase unit must be in [1, {MAX_PHASE_UNIT}] steps, got {self.phase_unit}")
        if self.drain and self.horizon <= self.last_arrival:
            raise InputError(f"a drained run's horizon {self.horizon} must pass the trace's last arrival "
                             f"{self.last_arrival}")
        object.__setattr__(self, "trace", self.trace.in_arrival_order())

    @property
    def last_arrival(self) -> int:
        """The trace's last arrival step: no redraw moves a request past it."""
        return int(self.trace.arrival.max())

    def lengths(self) -> tuple[int, int, int]:
        t = self.trace
        return int(t.prompt.min()), int(t.prompt.max()), int(t.output.max())

    def expected_requests(self) -> float:
        return float((self.trace.arrival < self.horizon + self.phase_unit).sum())

    def capacities(self) -> np.ndarray:
        return requests_per_client(self.trace, self.num_clients)

    @property
    def wide_clock(self) -> bool:
        """Its arrivals pass an int32 clock's (workload.wide_clock_for): core/clock.py."""
        return wide_clock_for(self.trace)

    def params(self):
        t, clock = self.trace, np.int64 if self.wide_clock else np.int32  # arrival times: the clock's dtype
        return {"arrival": t.arrival.astype(clock), "client": t.client.astype(np.int32),
                "prompt": t.prompt.astype(np.int32), "output": t.output.astype(np.int32),
                "cached": t.cached.astype(np.int32), "unit": clock(self.phase_unit),
                "last": clock(self.last_arrival)}


@dataclasses.dataclass(frozen=True, eq=False)
class ServeGenSource:
    """Real tenants: a servegen.plan (its load, M, horizon and counting rule)."""

    plan: servegen.ServeGenPlan
    kind = "servegen"

    @property
    def num_clients(self) -> int:
        return self.plan.num_clients

    @property
    def horizon(self) -> int:
        return self.plan.horizon

    def lengths(self) -> tuple[int, int, int]:
        p = self.plan.params
        return int(np.min(np.asarray(p.values))), int(self.plan.max_prompt), int(self.plan.max_output)

    def expected_requests(self) -> float:
        return float(self.plan.expected_requests.sum())

    def capacities(self) -> np.ndarray:
        return np.asarray(self.plan.max_requests, np.int64)

    def params(self):
        return jax.tree_util.tree_map(np.asarray, self.plan.params)


Source = TrafficSource | TraceSource | ServeGenSource


def signature(source: Source) -> tuple:
    """What lanes batched together must share: kind, clients, horizon and the shapes of
    the generator's params (phases, pool, trace length, ServeGen layout)."""
    shapes = tuple(np.shape(x) for x in jax.tree_util.tree_leaves(source.params()))
    extra = (source.plan.layout,) if source.kind == "servegen" else ()
    return (source.kind, source.num_clients, source.horizon, shapes, drains(source)) + extra


def replays_exactly(seeds: Sequence[int]) -> np.ndarray:
    """bool[B]: the lanes whose trace is taken as it is (seed 0; `generate_lanes`' `exact`)."""
    return np.asarray(seeds, np.int64) == 0


def wide_clock(sources: Sequence[Source]) -> bool:
    """Some source's arrivals need a wide clock (only a trace's can: generators key by int32)."""
    return any(getattr(s, "wide_clock", False) for s in sources)


def drains(source: Source) -> bool:
    """Whether lanes of `source` run until every request completed (TraceSource.drain)."""
    return bool(getattr(source, "drain", False))


def check_batch(sources: Sequence[Source]) -> None:
    kinds = {s.kind for s in sources}
    if len(kinds) != 1:
        raise InputError(f"one batch needs one kind of workload, got {sorted(kinds)}")
    if len({s.num_clients for s in sources}) != 1:
        raise InputError("every lane of a batch needs the same number of clients")
    if len({s.horizon for s in sources}) != 1:
        raise InputError("every lane of a batch needs the same horizon")
    if len({drains(s) for s in sources}) != 1:
        raise InputError("the lanes of a batch must all drain or all stop at the horizon")


def unique(sources: Sequence[Source]) -> list[Source]:
    return list({id(s): s for s in sources}.values())


def layout(sources: Sequence[Source], pad: int) -> Layout:
    """Blocks that fit every lane of `sources`, each ending in `pad` padding rows."""
    check_batch(sources)
    uniq = unique(sources)
    caps = np.max([s.capacities() for s in uniq], axis=0)
    first, size = block_sizes(caps, pad)
    extra = ()
    if uniq[0].kind == "traffic":
        extra = (max(traffic_mod.stream_capacity(s.traffic) for s in uniq),)
    elif uniq[0].kind == "servegen":
        layouts = {s.plan.layout for s in uniq}
        if len(layouts) != 1:  # one generator program: every plan must share its static layout
            raise InputError("ServeGen lanes of one batch must share their plan's layout (loads give different "
                             "capacities): run each load as its own batch")
        extra = (layouts.pop(),)
    return Layout(first=tuple(int(x) for x in first), size=tuple(int(x) for x in size), extra=extra)


def stack(sources: Sequence[Source]):
    """Lane-batched params (each distinct source encoded once, gathered on the host)."""
    uniq = unique(sources)
    index = {id(s): i for i, s in enumerate(uniq)}
    encoded = [s.params() for s in uniq]
    shapes = {repr(jax.tree_util.tree_map(np.shape, e)) for e in encoded}
    if len(shapes) != 1:
        raise InputError("lanes' workloads must share clients, phase count and pool size")
    lanes = np.asarray([index[id(s)] for s in sources])
    return jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)[lanes]), *encoded)


def generate_lanes(keys: jax.Array, params, *, kind: str, horizon: int, lay: Layout, pad: int,
                   num_clients: int, exact: np.ndarray | None = None) -> Workload:
    """Every lane's Workload (leading lane axis), lane i from keys[i] and params lane i.
    `exact` (bool[B], default none): trace lanes that replay the trace without a redraw
    (`replays_exactly(seeds)`: seed 0)."""
    if kind == "trace":
        params = dict(params, exact=jnp.zeros(keys.shape[0], bool) if exact is None else jnp.asarray(exact, bool))
    draws = keys
    if kind == "traffic":  # the lanes' random words first: hashed and stored once, read by every use
        draws = _traffic_words(keys, num_clients=params.prompt_low.shape[-1], capacity=lay.extra[0])
    return _generate_lanes(draws, params, kind=kind, horizon=horizon, lay=lay, pad=pad, num_clients=num_clients)


@functools.partial(jax.jit, static_argnames=("kind", "horizon", "lay", "pad", "num_clients"))
def _generate_lanes(draws: jax.Array, params, *, kind: str, horizon: int, lay: Layout, pad: int,
                    num_clients: int) -> Workload:
    """`draws`: the lanes' keys, or for traffic the words drawn from them (`_traffic_words`)."""
    fn = {"traffic": _traffic_lane, "trace": _trace_lane, "servegen": _servegen_lane}[kind]
    return jax.vmap(functools.partial(fn, horizon=horizon, lay=lay, pad=pad, num_clients=num_clients))(draws, params)


@functools.partial(jax.jit, static_argnames=("num_clients", "capacity"))
def _traffic_words(keys: jax.Array, *, num_clients: int, capacity: int) -> jax.Array:
    """uint32[B, 3, K, capacity + 1]: every lane's `traffic.draw_words`, in a compiled call
    of their own (a buffer written inside the vmapped generator is a scatter of every word,
    core/once.py)."""
    return jax.vmap(lambda key: traffic_mod.draw_words(key, num_clients, capacity))(keys)


def _traffic_lane(words, params, *, horizon, lay: Layout, pad, num_clients):
    return traffic_mod.generate_from_words(words, params, horizon=horizon, capacity=lay.extra[0], first=lay.first,
                                size=lay.size, pad=pad)


def _trace_lane(key, params, *, horizon, lay: Layout, pad, num_clients):
    """A trace with arrivals redrawn inside their phase unit (unit 1 or an exact lane:
    unchanged), laid out in blocks sorted by (arrival, number); ORDER = rank in (arrival,
    number)."""
    n = params["arrival"].shape[0]
    arrival = redraw_arrivals(key, params["arrival"], params["unit"], params["last"])
    arrival = jnp.where(params["exact"], params["arrival"], arrival)
    number = jnp.arange(n, dtype=I32)
    fcfs = jnp.lexsort((number, arrival))  # (arrival, number)
    rank = jnp.zeros(n, I32).at[fcfs].set(jnp.arange(n, dtype=I32))
    client = params["client"]
    by_client = jnp.lexsort((number, arrival, client))
    count = jnp.zeros(num_clients, I32).at[client].add(1)
    before = jnp.cumsum(count) - count
    sorted_client = client[by_client]
    position = jnp.arange(n, dtype=I32) - before[sorted_client]
    dest = jnp.asarray(lay.first, I32)[sorted_client] + position
    rows = jnp.stack([arrival, rank, params["prompt"], params["output"], params["cached"]], axis=-1)[by_client]
    wide_clock = arrival.dtype == jnp.int64  # rows of the clock's dtype
    requests = jnp.broadcast_to(jnp.asarray(padding_rows(1, wide_clock)[0]), (lay.num_rows, NUM_FIELDS))
    requests = requests.at[dest].set(rows)
    arrives = arrival < horizon
    return Workload(requests=requests, first=jnp.asarray(lay.first, I32), size=jnp.asarray(lay.size, I32),
                    num_requests=arrives.sum(dtype=I32), overflow=jnp.zeros((), bool))


def redraw_arrivals(key: jax.Array, arrival: jax.Array, unit: jax.Array, last: jax.Array) -> jax.Array:
    """int32[N]: each arrival redrawn uniformly in its window [a // unit * unit, + unit),
    cut at `last` (the trace's last arrival), so no request moves past the trace's end and
    a bound that drains the trace drains every redraw. unit 1: unchanged."""
    unit = jnp.maximum(unit, 1)
    start = arrival // unit * unit
    span = jnp.minimum(start + unit, last + 1) - start  # >= 1: start <= arrival <= last
    return start + jax.random.randint(key, arrival.shape, 0, span, dtype=arrival.dtype)


def _servegen_lane(key, params, *, horizon, lay: Layout, pad, num_clients):
    """ServeGen rows re-packed from the plan's blocks into the batch's layout."""
    plan_layout = lay.extra[0]
    rows, count = servegen.generate(key, params, layout=plan_layout)
    src_size = np.asarray(plan_layout.sizes)
    src_first = np.concatenate([[0], np.cumsum(src_size)[:-1]])
    block = np.repeat(np.arange(num_clients), src_size)
    dest = jnp.asarray(np.asarray(lay.first)[block] + (np.arange(plan_layout.num_rows) - src_first[block]), I32)
    requests = jnp.broadcast_to(jnp.asarray(padding_rows(1)[0]), (lay.num_rows, NUM_FIELDS))
    requests = requests.at[dest].set(rows)
    return Workload(requests=requests, first=jnp.asarray(lay.first, I32), size=jnp.asarray(lay.size, I32),
                    num_requests=count, overflow=jnp.zeros((), bool))


def trace_layout_host(trace: Trace, num_clients: int, pad: int) -> np.ndarray:
    """The trace's rows laid out on the host (seed 0 of a TraceSource, for checks)."""
    return layout_trace(trace, num_clients, pad)


__all__ = ["TrafficSource", "TraceSource", "ServeGenSource", "Layout", "layout", "stack", "generate_lanes",
           "replays_exactly", "redraw_arrivals", "ARRIVAL", "ORDER", "INT32_MAX"]
