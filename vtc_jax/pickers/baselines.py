"""The baselines: round-robin (BLIS's default routing, `inference-sim/inference-sim@f90a1e3a`
sim/routing.go `RoundRobin`: snapshots[counter % n], counter += 1 on every pick) and
least-loaded (fewest requests in flight; BLIS's `LeastLoaded` ranks QueueDepth + BatchSize +
InFlightRequests and breaks ties with the router's seeded rng, lowest index without one:
`base.choose` does both)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vtc_jax.pickers.base import I32, Params, Picker, Request, Shape, Snapshot, choose, no_state


def rr_init(shape: Shape, params: Params) -> jax.Array:
    """int32[]: picks made so far (a lane routes fewer than 2^31 requests)."""
    return jnp.zeros((), I32)


def rr_pick(counter, snapshot: Snapshot, request: Request, key, params: Params):
    """(replica, counter + 1): the (counter mod n)-th present replica in index order, n the
    number present (-1 and the counter unchanged if none is)."""
    present = snapshot.present
    n = jnp.sum(present.astype(I32))
    rank = jnp.cumsum(present.astype(I32)) - 1  # each present replica's place among them
    want = counter % jnp.maximum(n, 1)
    replica = jnp.where(n > 0, jnp.argmax(present & (rank == want)), -1).astype(I32)
    return replica, counter + (n > 0).astype(I32)


def ll_pick(state, snapshot: Snapshot, request: Request, key, params: Params):
    """(replica, state): the present replica with the fewest requests in flight."""
    best = jnp.min(jnp.where(snapshot.present, snapshot.in_flight, jnp.iinfo(I32).max))
    return choose(snapshot.present & (snapshot.in_flight == best), key, params.tie_random), state


ROUND_ROBIN = Picker(
    name="round-robin",
    summary="round-robin over the present replicas (BLIS's default)",
    init=rr_init,
    pick=rr_pick,
    reads=frozenset({"present"}),
    reference="RoundRobinReference",
)

LEAST_LOADED = Picker(
    name="least-loaded",
    summary="fewest requests in flight",
    init=no_state,
    pick=ll_pick,
    reads=frozenset({"in_flight", "present"}),
    reference="LeastLoadedReference",
)
