"""Loop bounds shared by a batch (core/lanes.py): the largest over the runner's lanes and a
cluster lane's replicas, so a loop carrying a block pool selects nothing after its passes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.lanes import LANE_AXIS, batch_any, batch_max, over_replicas


def test_batch_max_outside_any_vmap_is_the_value():
    assert int(batch_max(jnp.int32(7))) == 7
    assert bool(batch_any(jnp.asarray(False))) is False


def test_batch_max_spans_the_lanes_and_each_lanes_replicas():
    x = jnp.asarray([[3, 9, 1], [4, 0, 2]], jnp.int32)  # [lanes, replicas]
    lanes = jax.vmap(over_replicas(batch_max), axis_name=LANE_AXIS)(x)
    np.testing.assert_array_equal(lanes, np.full((2, 3), 9))
    np.testing.assert_array_equal(over_replicas(batch_max)(x[1]), [4, 4, 4])  # replicas alone
    np.testing.assert_array_equal(jax.vmap(batch_max, axis_name=LANE_AXIS)(x[:, 2]), [2, 2])  # lanes alone
    anyone = jax.vmap(over_replicas(batch_any), axis_name=LANE_AXIS)(x == 0)
    assert np.asarray(anyone).all()


def test_a_bound_shared_by_replicas_leaves_no_batched_loop():
    """A while loop whose bound is batch_max of a per-replica count has an unbatched
    condition inside the replicas' vmap: its jaxpr carries no per-replica predicate."""
    def body(n):
        bound = batch_max(n)
        return jax.lax.fori_loop(0, bound, lambda i, acc: acc + (i < n).astype(jnp.int32), jnp.int32(0))

    x = jnp.asarray([[1, 5], [2, 3]], jnp.int32)
    out = jax.vmap(over_replicas(body), axis_name=LANE_AXIS)(x)
    np.testing.assert_array_equal(out, x)
    text = str(jax.make_jaxpr(jax.vmap(over_replicas(body), axis_name=LANE_AXIS))(x))
    cond = text.split("cond_jaxpr")[1].split("body_jaxpr")[0]
    assert "bool[2,2]" not in cond and "bool[2]" not in cond
