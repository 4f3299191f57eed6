"""on_admit returns its int32 state as float32."""

import dataclasses

import jax.numpy as jnp
from vtc_jax.policies import registry

FCFS = registry.get("fcfs")


def init(params, shape):
    return {"admitted": jnp.zeros((), jnp.int32)}


def on_admit(state, view, admission, params):
    return {"admitted": state["admitted"] + 0.5}, admission.estimate


POLICY = dataclasses.replace(FCFS, name="admit_wrong_dtype", init=init, on_admit=on_admit)
