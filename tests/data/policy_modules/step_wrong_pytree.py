"""on_step returns a state with a key init did not make."""

import dataclasses

import jax.numpy as jnp
from vtc_jax.policies import registry

FCFS = registry.get("fcfs")


def init(params, shape):
    return {"steps": jnp.zeros((), jnp.int32)}


def on_step(state, view, step_end, params):
    return {"steps": state["steps"] + step_end.elapsed, "extra": jnp.zeros((), jnp.int32)}


POLICY = dataclasses.replace(FCFS, name="step_wrong_pytree", init=init, on_step=on_step)
