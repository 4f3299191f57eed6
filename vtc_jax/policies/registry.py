"""The one list of policy names. CLIs (choices, --help), settings validation, the
literal references in vtc_jax.testing and the random-lane fuzzing all read it, so a policy added
here (or registered at run time from a user's file) is validated, offered and fuzzed
against its own reference without touching anything else. A user's file may add new
names only, and its policies are checked before they are registered
(vtc_jax.driver.policy_modules, which traces them through the engine)."""

from __future__ import annotations

import contextlib

from vtc_jax.core.errors import InputError
from vtc_jax.policies.base import Policy

_REGISTRY: dict[str, Policy] = {}
_SOURCES: dict[str, str] = {}  # name -> where it was registered ("a built-in policy", "by FILE")


def register(policy: Policy, *, replace: bool = False, source: str = "registered in Python") -> Policy:
    """Add a policy (its name must be new unless `replace`); `source` says where it comes
    from, for the message refusing a module that reuses its name."""
    if not isinstance(policy, Policy):
        raise InputError(f"expected a vtc_jax.policies.Policy, got {type(policy).__name__}")
    if not isinstance(policy.name, str) or not policy.name.isidentifier():
        raise InputError(f"policy name {policy.name!r} must be an identifier")
    if policy.name in _REGISTRY and not replace and _REGISTRY[policy.name] is not policy:
        raise InputError(f"a policy named {policy.name!r} is already registered")
    _REGISTRY[policy.name] = policy
    _SOURCES[policy.name] = source
    return policy


def names() -> tuple[str, ...]:
    """Registered policy names, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> Policy:
    """The policy called `name` (InputError naming the choices otherwise)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise InputError(f"unknown policy {name!r}; choose one of {', '.join(_REGISTRY)}") from None


@contextlib.contextmanager
def provisionally(policy: Policy):
    """`policy` registered under its (new) name inside the with block only (the load-time
    check traces it through the engine, which finds policies here)."""
    if policy.name in _REGISTRY:
        raise InputError(f"a policy named {policy.name!r} is already registered")
    _REGISTRY[policy.name] = policy
    try:
        yield policy
    finally:
        del _REGISTRY[policy.name]


def source(name: str) -> str | None:
    """Where policy `name` was registered ("a built-in policy", "by FILE"), None if it is not."""
    return _SOURCES.get(name) if name in _REGISTRY else None


def registered(name: str) -> Policy | None:
    """The policy registered as `name`, None if none is."""
    return _REGISTRY.get(name)
