"""The one list of policy names. CLIs (choices, --help), settings validation, the
reference simulator in tests/ and the random-lane fuzzing all read it, so a policy added
here (or registered at run time from a user's file) is validated, offered and fuzzed
against its own reference without touching anything else."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from vtc_jax.errors import InputError
from vtc_jax.policies.base import Policy

_REGISTRY: dict[str, Policy] = {}


def register(policy: Policy, *, replace: bool = False) -> Policy:
    """Add a policy (its name must be new unless `replace`)."""
    if not isinstance(policy, Policy):
        raise InputError(f"expected a vtc_jax.policies.Policy, got {type(policy).__name__}")
    if not policy.name.isidentifier():
        raise InputError(f"policy name {policy.name!r} must be an identifier")
    if policy.name in _REGISTRY and not replace and _REGISTRY[policy.name] is not policy:
        raise InputError(f"a policy named {policy.name!r} is already registered")
    _REGISTRY[policy.name] = policy
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


def load_policy_module(path) -> list[str]:
    """Import a user's policy file (outside the package) and register the policies it
    defines: a module attribute `POLICY` (one Policy) or `POLICIES` (a list). Returns
    their names. Loading the same file twice is harmless."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--policy-module {path}: no such file")
    module_name = f"vtc_jax_user_policy_{abs(hash(str(path.resolve())))}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise InputError(f"--policy-module {path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as err:  # a user's file: report, never a traceback
            raise InputError(f"--policy-module {path}: import failed ({type(err).__name__}: {err})") from None
        sys.modules[module_name] = module
    found = getattr(module, "POLICIES", None) or ([module.POLICY] if hasattr(module, "POLICY") else [])
    if not found:
        raise InputError(f"--policy-module {path}: defines no POLICY (or POLICIES list)")
    for policy in found:
        if policy.name in _REGISTRY and _REGISTRY[policy.name] is not policy:
            if _REGISTRY[policy.name].encode is not policy.encode:
                raise InputError(f"--policy-module {path}: policy {policy.name!r} is already registered")
        register(policy, replace=True)
    return [p.name for p in found]
