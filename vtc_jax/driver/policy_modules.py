"""A user's policy file: imported, checked and registered (`--policy-module FILE`).

A broken module is one InputError line naming the file, the policy and the hook, never an
"internal error" later in a run: its policies' attributes are checked
(vtc_jax.policies.checks), then a tiny batch (one lane of the policy, one of fcfs, 2
clients) is traced through the real engine in both number formats (jax.eval_shape: nothing
compiles or runs) with every function wrapped so that an exception or a wrong output is
reported as that function's. This sits on the driver's floor because the check runs the
engine; the registry below only holds names.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import run, runner
from vtc_jax.engines.engine import PROGRAM, EngineBatch, LaneInput
from vtc_jax.engines.settings import Settings, encode_settings
from vtc_jax.inputs.workload import Trace, make_workload
from vtc_jax.policies import checks, registry
from vtc_jax.policies.base import Policy


def preload_policy_modules(argv) -> None:
    """Register the policies of every --policy-module FILE in argv before the parser is
    built, so their names are valid choices."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--policy-module" and i + 1 < len(argv):
            load_policy_module(argv[i + 1])
        elif arg.startswith("--policy-module="):
            load_policy_module(arg.split("=", 1)[1])


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
        if registry.registered(policy.name) is not policy:
            registry.register(policy, source=f"by {path}")
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
            if registry.registered(policy.name) is not policy:
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
        if fileio.pending_interrupt() or _caused_by_interrupt(err):
            # Ctrl-C in a slow import that turned it into another error (C extensions raise
            # ImportError, a module's `except BaseException` re-raises its own): an interrupt
            # (exit 130, one line), not a broken file
            raise KeyboardInterrupt from None
        raise InputError(f"--policy-module {path}: import failed ({checks.describe(err)})") from None
    return module


def _caused_by_interrupt(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in `err`'s chain of causes and contexts."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


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
        if registry.registered(name) not in (None, policy):
            raise InputError(f"--policy-module {path}: policy {name!r} is already defined ({registry.source(name)}); "
                             "a module may define new names only")
    return list(found)


def _check(policy: Policy, path: Path) -> None:
    """checks.check_policy, its failure as one InputError naming the file and the policy."""
    try:
        check_policy(policy)
    except checks.HookFailed as err:
        raise InputError(f"--policy-module {path}: policy {policy.name!r}, {err.hook} {err.reason}") from None
    except InputError as err:
        raise InputError(f"--policy-module {path}: policy {policy.name!r} {err}") from None


# ---- the traced lane ---------------------------------------------------------------------

# (arrival, client, prompt, output) of the test lane. Tracing reaches every hook whatever
# the rows (an event runs every phase under masks); the rows only need to be valid.
TEST_ROWS = ((0, 0, 8, 3), (0, 1, 6, 4), (0, 0, 5, 2), (1, 1, 7, 1), (9, 0, 4, 2))
TEST_STEPS = 12


def trace_lane(name: str, *, wide: bool) -> None:
    """Trace (jax.eval_shape: no compile, no run) a batch of two 2-client lanes through the
    real engine, as the runner does (init, then events under vmap): one lane of policy
    `name` (as registered now), one of fcfs, so that the policy's params for another
    policy's lane (encode(None, ctx)) and the dispatch between policies are traced too.
    Raises whatever a hook or the engine raises."""
    trace = Trace.from_rows(TEST_ROWS)
    settings = [Settings(policy=name, kv_budget=16), Settings(policy="fcfs", kv_budget=16)]
    config, _, _, _ = run.plan_lanes([trace] * 2, settings, 2, TEST_STEPS, 0, policies=(name, "fcfs"), wide=wide)
    params, _ = encode_settings(settings, 2, config.policies)
    workload = make_workload(trace, 2, config.arrival_width + 1, TEST_STEPS)
    batch = EngineBatch(lane=LaneInput(params=params, horizon=jnp.full(2, TEST_STEPS, jnp.int32)), workload=None)

    def lane():
        carry = runner.init.__wrapped__(batch, workload, program=PROGRAM, config=config)
        return runner.advance.__wrapped__(carry, batch, workload, program=PROGRAM, config=config, num_events=2)

    final = jax.eval_shape(lane)
    counters = registry.get(name).counters
    if counters is not None:
        jax.eval_shape(jax.vmap(counters), final.policy[name])


def check_policy(policy: Policy) -> None:
    """Check `policy` (attributes, then a traced test lane in both number formats) with a
    guarded copy registered under its name for the check only. Raises HookFailed for a
    function of the policy, InputError for anything else."""
    checks.check_attributes(policy)
    with registry.provisionally(checks.guarded(policy)):
        for wide in (False, True):
            try:
                trace_lane(policy.name, wide=wide)
            except (checks.HookFailed, KeyboardInterrupt):
                raise
            except InputError as err:
                raise InputError(f"its default settings are refused on a test lane ({err})") from None
            except BaseException as err:  # noqa: BLE001 - anything else the traced lane hit
                if fileio.pending_interrupt() or _caused_by_interrupt(err):
                    raise KeyboardInterrupt from None
                raise InputError(f"fails on a traced test lane ({checks.describe(err)})") from None
