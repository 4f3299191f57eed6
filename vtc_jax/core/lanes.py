"""The lane axis: the name the runner gives the vmap over lanes, and loop bounds shared by
the lanes of a batch.

Under vmap a `lax.while_loop` whose condition differs between lanes runs until every lane
is done and, after each pass, selects every lane's whole carry between its new and old
value: a loop that carries a large table (a block pool) then costs the table once per
pass. A loop bound taken as the batch's largest (`batch_max`) is the same in every lane,
so the loop selects nothing; its body masks the passes a lane does not need (counts,
dropped scatter indices). Outside a vmap over LANE_AXIS (a test calling a server
function, a cluster's replicas) `batch_max` is the value itself."""

from __future__ import annotations

import jax

LANE_AXIS = "vmapped_lanes"  # not the device mesh's axis name: a bound is shared within a device, never across


def batch_max(x):
    """The largest x over the lanes of the batch (x itself outside the runner's vmap)."""
    try:
        return jax.lax.pmax(x, LANE_AXIS)
    except NameError:  # no such axis bound here: one lane
        return x


def batch_any(x):
    """Whether x (bool[]) holds in some lane of the batch."""
    return batch_max(x.astype("int32")) > 0
