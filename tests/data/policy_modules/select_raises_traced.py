"""select branches in Python on a traced value (it raises when traced)."""

import dataclasses

import jax.numpy as jnp
from vtc_jax.policies import Choice, registry

FCFS = registry.get("fcfs")


def select(state, view, eligible, params):
    if view.step > 0:
        return Choice(client=jnp.int32(0), has=eligible[0], state=state)
    return Choice(client=jnp.int32(1), has=eligible[1], state=state)


POLICY = dataclasses.replace(FCFS, name="select_raises_traced", select=select)
