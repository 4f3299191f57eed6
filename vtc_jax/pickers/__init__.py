"""Endpoint pickers: how the fleet's gateway chooses a replica (docs/PICKERS.md). A picker
is a `Picker` bundle (base.py); `registry.get(name)` and `registry.names()` are the one list."""

from vtc_jax.pickers import baselines, dynamo, llmd, registry
from vtc_jax.pickers.base import Params, Picker, Request, Shape, Snapshot, make_params

for _picker in (llmd.PICKER, dynamo.PICKER, baselines.ROUND_ROBIN, baselines.LEAST_LOADED):
    registry.register(_picker)

__all__ = ["Params", "Picker", "Request", "Shape", "Snapshot", "make_params", "registry"]
