"""The one list of policy names. CLIs (choices, --help), settings validation, the
literal references in vtc_jax.testing and the random-lane fuzzing all read it, so a policy added
here (or registered at run time from a user's file) is validated, offered and fuzzed
against its own reference without touching anything else. A user's file may add new
names only, and its policies are checked before they are registered
(vtc_jax.driver.policy_modules, which traces them through the engine)."""

from __future__ import annotations

from vtc_jax.core.errors import InputError
from vtc_jax.core.registry import Registry
from vtc_jax.policies.base import Policy

POLICIES = Registry("policy", Policy, "vtc_jax.policies.Policy")
names, get, registered, provisionally = POLICIES.names, POLICIES.get, POLICIES.registered, POLICIES.provisionally
_SOURCES: dict[str, str] = {}  # name -> where it was registered ("a built-in policy", "by FILE")


def register(policy: Policy, *, replace: bool = False, source: str = "registered in Python") -> Policy:
    """Add a policy (its name must be a new identifier unless `replace`); `source` says where
    it comes from, for the message refusing a module that reuses its name."""
    if isinstance(policy, Policy) and not (isinstance(policy.name, str) and policy.name.isidentifier()):
        raise InputError(f"policy name {policy.name!r} must be an identifier")
    POLICIES.register(policy, replace=replace)
    _SOURCES[policy.name] = source
    return policy


def source(name: str) -> str | None:
    """Where policy `name` was registered ("a built-in policy", "by FILE"), None if it is not."""
    return _SOURCES.get(name) if registered(name) is not None else None
