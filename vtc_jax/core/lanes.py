"""The lane axis: the name the runner gives the vmap over lanes, and loop bounds shared by
the lanes of a batch (and by a cluster lane's replicas).

Under vmap a `lax.while_loop` whose condition differs between lanes runs until every lane
is done and, after each pass, selects every lane's whole carry between its new and old
value: a loop that carries a large table (a block pool) then costs the table once per
pass. A loop bound taken as the batch's largest (`batch_max`) is the same in every lane,
so the loop selects nothing; its body masks the passes a lane does not need (counts,
dropped scatter indices). A cluster's replicas are a vmap of their own inside a lane
(`over_replicas`, REPLICA_AXIS): the bound is the largest over both (a bound that differed
between replicas copied every replica's block pool at each loop's entry). Outside both (a
test calling a server function) `batch_max` is the value itself."""

from __future__ import annotations

import jax

LANE_AXIS = "vmapped_lanes"  # not the device mesh's axis name: a bound is shared within a device, never across
REPLICA_AXIS = "vmapped_replicas"


def over_replicas(fn, in_axes=0):
    """jax.vmap of `fn` over a cluster lane's replica axis, named (REPLICA_AXIS)."""
    return jax.vmap(fn, in_axes=in_axes, axis_name=REPLICA_AXIS)


def batch_max(x):
    """The largest x over the lanes of the batch and a lane's replicas (x itself outside
    both vmaps)."""
    for axes in ((LANE_AXIS, REPLICA_AXIS), LANE_AXIS, REPLICA_AXIS):
        try:
            return jax.lax.pmax(x, axes)
        except NameError:  # an axis not bound here
            continue
    return x


def batch_any(x):
    """Whether x (bool[]) holds in some lane of the batch."""
    return batch_max(x.astype("int32")) > 0
