"""A valid policy in a module that turns on jax_enable_x64 (which breaks every policy)."""

import dataclasses

import jax
from vtc_jax.policies import registry

jax.config.update("jax_enable_x64", True)

POLICY = dataclasses.replace(registry.get("fcfs"), name="enables_x64")
