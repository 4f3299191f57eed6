"""encode returns a list, not a dict of arrays."""

import dataclasses

from vtc_jax.policies import registry

FCFS = registry.get("fcfs")


def encode(settings, ctx):
    return [1, 2]


POLICY = dataclasses.replace(FCFS, name="encode_not_dict", encode=encode)
