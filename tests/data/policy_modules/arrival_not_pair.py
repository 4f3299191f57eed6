"""on_arrival returns only the state, not (state, counter)."""

import dataclasses

from vtc_jax.policies import registry

FCFS = registry.get("fcfs")


def on_arrival(state, view, arrivals, params):
    return state


POLICY = dataclasses.replace(FCFS, name="arrival_not_pair", on_arrival=on_arrival)
