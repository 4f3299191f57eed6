"""The one list of endpoint-picker names: the fleet's CLI choices, settings validation and
the tests read it (`names()`, `get(name)`), so a picker registered here is offered and
checked against its literal reference without touching anything else."""

from __future__ import annotations

from vtc_jax.core.registry import Registry
from vtc_jax.pickers.base import Picker

PICKERS = Registry("picker", Picker, "vtc_jax.pickers.Picker")
register, names, get = PICKERS.register, PICKERS.names, PICKERS.get
