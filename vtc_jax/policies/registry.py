"""The one list of policy names. CLIs (choices, --help), settings validation, the
reference simulator in tests/ and the random-lane fuzzing all read it, so a policy added
here (or registered at run time from a user's file) is validated, offered and fuzzed
against its own reference without touching anything else. A user's file may add new
names only, and its policies are checked before they are registered (checks.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

from vtc_jax.errors import InputError
from vtc_jax.policies import checks
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


def load_policy_module(path) -> list[str]:
    """Import a user's policy file (outside the package), check the policies it defines (a
    module attribute `POLICY`, one Policy, or `POLICIES`, a list) and register them; return
    their names. A module may define new names only. Loading the same file twice is
    harmless (it is imported and checked once).

    Every failure is one InputError naming the file (and the policy and function): the
    import raising anything (SystemExit too; not KeyboardInterrupt), a module that changes
    jax's configuration (jax_enable_x64, ...; restored), wrong attributes, and hooks that
    raise or return the wrong form on a traced test lane (checks.py)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--policy-module {path}: no such file")
    module_name = f"vtc_jax_user_policy_{abs(hash(str(path.resolve())))}"
    module = sys.modules.get(module_name)
    if module is None:
        module = _import_checked(module_name, path)
    found = _module_policies(module, path)
    for policy in found:
        if _REGISTRY.get(policy.name) is not policy:
            register(policy, source=f"by {path}")
    return [p.name for p in found]


def _import_checked(module_name: str, path: Path):
    """Import the file and check its new policies (checks.py), with jax's configuration
    restored and compared after the import and after the checks. Nothing stays imported
    on failure."""
    flags = checks.jax_flags()
    try:
        module = _import(module_name, path)
        _refuse_changed(checks.changed_flags(flags), path)
        for policy in _module_policies(module, path):
            if _REGISTRY.get(policy.name) is not policy:
                _check(policy, path)
        _refuse_changed(checks.changed_flags(flags), path)
    except BaseException:
        sys.modules.pop(module_name, None)
        checks.changed_flags(flags)
        raise
    return module


def _refuse_changed(changed: list[str], path: Path) -> None:
    if changed:
        raise InputError(f"--policy-module {path}: the module changed jax's configuration ({'; '.join(changed)}); "
                         "a policy module must leave it alone")


def _import(module_name: str, path: Path):
    """Execute the file as module `module_name` (in sys.modules, as dataclasses need)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InputError(f"--policy-module {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - a user's file (SystemExit too): one line, never an exit
        raise InputError(f"--policy-module {path}: import failed ({checks.describe(err)})") from None
    return module


def _module_policies(module, path: Path) -> list[Policy]:
    """The module's POLICIES (or [POLICY]), each a Policy with a name new to the registry
    (or already registered from this very module), no name twice."""
    listed = getattr(module, "POLICIES", None)
    if listed is not None and not isinstance(listed, (list, tuple)):
        raise InputError(f"--policy-module {path}: POLICIES is {checks.kind(listed)}, need a list of "
                         "vtc_jax.policies.Policy")
    if listed:
        found, attribute = listed, "POLICIES"
    elif hasattr(module, "POLICY"):
        found, attribute = [module.POLICY], "POLICY"
    else:
        raise InputError(f"--policy-module {path}: defines no POLICY (or POLICIES list)")
    seen = set()
    for policy in found:
        if not isinstance(policy, Policy):
            raise InputError(f"--policy-module {path}: {attribute} holds {checks.kind(policy)}, need a "
                             "vtc_jax.policies.Policy")
        name = policy.name
        if not isinstance(name, str) or not name.isidentifier():
            raise InputError(f"--policy-module {path}: policy name {name!r} must be an identifier")
        if name in seen:
            raise InputError(f"--policy-module {path}: defines policy {name!r} twice")
        seen.add(name)
        if name in _REGISTRY and _REGISTRY[name] is not policy:
            raise InputError(f"--policy-module {path}: policy {name!r} is already defined ({_SOURCES[name]}); "
                             "a module may define new names only")
    return list(found)


def _check(policy: Policy, path: Path) -> None:
    """checks.check_policy, its failure as one InputError naming the file and the policy."""
    try:
        checks.check_policy(policy)
    except checks.HookFailed as err:
        raise InputError(f"--policy-module {path}: policy {policy.name!r}, {err.hook} {err.reason}") from None
    except InputError as err:
        raise InputError(f"--policy-module {path}: policy {policy.name!r} {err}") from None
