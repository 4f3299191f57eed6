"""The one list of endpoint-picker names: the fleet's CLI choices, settings validation and
the tests read it (`names()`, `get(name)`), so a picker registered here is offered and
checked against its literal reference without touching anything else."""

from __future__ import annotations

from vtc_jax.core.errors import InputError
from vtc_jax.pickers.base import Picker

_REGISTRY: dict[str, Picker] = {}


def register(picker: Picker, *, replace: bool = False) -> Picker:
    """Add a picker (its name must be new unless `replace`)."""
    if not isinstance(picker, Picker):
        raise InputError(f"expected a vtc_jax.pickers.Picker, got {type(picker).__name__}")
    if picker.name in _REGISTRY and not replace and _REGISTRY[picker.name] is not picker:
        raise InputError(f"a picker named {picker.name!r} is already registered")
    _REGISTRY[picker.name] = picker
    return picker


def names() -> tuple[str, ...]:
    """Registered picker names, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> Picker:
    """The picker called `name` (InputError naming the choices otherwise)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise InputError(f"unknown picker {name!r}; choose one of {', '.join(_REGISTRY)}") from None
