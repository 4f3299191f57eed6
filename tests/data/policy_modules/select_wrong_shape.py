"""select returns a client of shape (2,), not a scalar."""

import dataclasses

import jax.numpy as jnp
from vtc_jax.policies import Choice, registry

FCFS = registry.get("fcfs")


def select(state, view, eligible, params):
    return Choice(client=jnp.zeros(2, jnp.int32), has=eligible.any(), state=state)


POLICY = dataclasses.replace(FCFS, name="select_wrong_shape", select=select)
