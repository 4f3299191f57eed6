"""A policy that ignores `eligible`: the lowest-numbered backlogged client, whatever the
limits and bands say (tests: the engines must refuse such a choice)."""

import jax.numpy as jnp
from vtc_jax.policies import Choice, Policy
from vtc_jax.policies.base import no_params, no_state


def select(state, view, eligible, params):
    client = jnp.argmax(view.backlogged).astype(jnp.int32)
    return Choice(client=client, has=view.backlogged.any(), state=state)


POLICY = Policy(name="ignores_limits", summary="first backlogged client, ignoring eligible (a test policy)",
                encode=no_params, init=no_state, select=select)
