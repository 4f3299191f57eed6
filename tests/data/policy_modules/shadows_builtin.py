"""LCF under the built-in name "vtc": must be refused (a module may define new names only)."""

import dataclasses

from vtc_jax.policies import registry

POLICY = dataclasses.replace(registry.get("lcf"), name="vtc")
