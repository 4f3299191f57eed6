"""select is None (a Policy needs encode, init and select)."""

import dataclasses

from vtc_jax.policies import registry

FCFS = registry.get("fcfs")

POLICY = dataclasses.replace(FCFS, name="select_missing", select=None)
