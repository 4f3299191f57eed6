"""on_admit is a number, not a function."""

import dataclasses

from vtc_jax.policies import registry

FCFS = registry.get("fcfs")

POLICY = dataclasses.replace(FCFS, name="hook_not_callable", on_admit=5)
