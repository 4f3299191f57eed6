"""A policy whose candidate is always a client that does not exist (index K) with
has=True (tests: the engine must admit nothing and still end every step)."""

import jax.numpy as jnp
from vtc_jax.policies import Choice, Policy
from vtc_jax.policies.base import no_params, no_state


def select(state, view, eligible, params):
    return Choice(client=jnp.asarray(eligible.shape[0], jnp.int32), has=jnp.asarray(True), state=state)


POLICY = Policy(name="picks_nobody", summary="always a client outside [0, K) (a test policy)",
                encode=no_params, init=no_state, select=select)
