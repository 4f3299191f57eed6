"""Load-time checks of a user's policy (driver.policy_modules.load_policy_module), so that a broken
`--policy-module` is one InputError line naming the file, the policy and the hook, never an
"internal error" later in a run.

`check_policy` checks what a `Policy` holds (types, callables), then traces a tiny batch
(one lane of the policy, one of fcfs, 2 clients) through the real engine in both number
formats (jax.eval_shape: tracing only, nothing compiles or runs; under a second each) with
every function wrapped so that an exception or a wrong output (structure, shape or dtype)
is reported as that function's. Hooks the cluster's routers call with their own views are
the same functions with the same contract, so they are not traced separately.
`jax_flags` / `changed_flags` snapshot the jax configuration a module must leave alone (a
module that turns on jax_enable_x64 breaks every policy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.policies.base import Choice, Policy

# The jax settings a policy module could change that change what the engine computes.
JAX_FLAGS = ("jax_enable_x64", "jax_numpy_rank_promotion", "jax_numpy_dtype_promotion", "jax_default_matmul_precision",
             "jax_disable_jit", "jax_debug_nans", "jax_debug_infs")
HOOKS = ("on_arrival", "on_admit", "on_step", "on_complete")
OPTIONAL_FUNCTIONS = HOOKS + ("counters", "validate", "fuzz_options", "reference")


class HookFailed(Exception):
    """A policy function failed its check: `hook` names it, `reason` says how."""

    def __init__(self, hook: str, reason: str):
        super().__init__(f"{hook}: {reason}")
        self.hook, self.reason = hook, reason


def jax_flags() -> dict[str, Any]:
    """{flag: value} of JAX_FLAGS now."""
    return {name: getattr(jax.config, name) for name in JAX_FLAGS}


def changed_flags(saved: dict[str, Any]) -> list[str]:
    """Restore every flag of `saved` (jax_flags()) that changed; return "flag: old -> new"
    for each."""
    changed = []
    for name, value in saved.items():
        now = getattr(jax.config, name)
        if now != value:
            changed.append(f"{name}: {value!r} -> {now!r}")
            jax.config.update(name, value)
    return changed


def describe(err: BaseException) -> str:
    """One short line for an exception (jax's messages run to many lines)."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= 240 else text[:237] + "..."


# ---- attributes ------------------------------------------------------------------------

def check_attributes(policy) -> None:
    """Raise HookFailed unless `policy` is a Policy whose fields have the documented types."""
    if not isinstance(policy, Policy):
        raise HookFailed("POLICY", f"is {kind(policy)}, need a vtc_jax.policies.Policy")
    if not isinstance(policy.name, str) or not policy.name.isidentifier():
        raise HookFailed("name", f"{policy.name!r} is not an identifier")
    if not isinstance(policy.summary, str):
        raise HookFailed("summary", f"is {kind(policy.summary)}, need a str")
    for field in ("encode", "init", "select"):
        if not callable(getattr(policy, field)):
            raise HookFailed(field, f"is {kind(getattr(policy, field))}, need a function")
    for field in OPTIONAL_FUNCTIONS:
        value = getattr(policy, field)
        if value is not None and not callable(value):
            raise HookFailed(field, f"is {kind(value)}, need a function or None")
    if not isinstance(policy.reads, (tuple, list)) or not all(isinstance(r, str) for r in policy.reads):
        raise HookFailed("reads", "must be a tuple of Settings field names (str)")
    if not isinstance(policy.options, dict) or not all(isinstance(o, str) for o in policy.options):
        raise HookFailed("options", "must be a dict {name: default}")
    for field in ("uses_estimator", "arrival_rows"):
        if not isinstance(getattr(policy, field), (bool, np.bool_)):
            raise HookFailed(field, f"is {kind(getattr(policy, field))}, need True or False")


def kind(value) -> str:
    """'None', 'an int', 'a list', ... (what a value is, for a message)."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


# ---- outputs ---------------------------------------------------------------------------

def _spec(x):
    """(shape, dtype) of an array leaf, or None for a leaf that is not one."""
    try:
        return tuple(jnp.shape(x)), jnp.result_type(x)
    except Exception:  # noqa: BLE001 - any non-array leaf
        return None


def tree_mismatch(expected, got) -> str | None:
    """Why pytree `got` is not `expected` in structure, shapes and dtypes (None: it is)."""
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    g_leaves, g_tree = jax.tree_util.tree_flatten(got)
    if e_tree != g_tree:
        return f"has structure {_short(g_tree)}, need {_short(e_tree)}"
    for path_leaf, e, g in zip(jax.tree_util.tree_flatten_with_path(got)[0], e_leaves, g_leaves):
        where = jax.tree_util.keystr(path_leaf[0]) or "the value"
        es, gs = _spec(e), _spec(g)
        if gs is None:
            return f"has {where} {kind(g)}, not an array"
        if es != gs:
            return f"has {where} {_show(gs)}, need {_show(es)}"
    return None


def _short(treedef) -> str:
    text = str(treedef)
    return text if len(text) <= 100 else text[:97] + "..."


def _show(spec) -> str:
    shape, dtype = spec
    return f"{np.dtype(dtype).name}[{', '.join(map(str, shape))}]"


def _scalar(value, kinds: str, need: str) -> str | None:
    """Why `value` is not a scalar array of a dtype kind in `kinds` ("b", "iu")."""
    spec = _spec(value)
    if spec is None or spec[0] != () or np.dtype(spec[1]).kind not in kinds:
        return f"is {_show(spec) if spec else kind(value)}, need {need}"
    return None


def _expect(detail: str | None, hook: str, what: str) -> None:
    """Raise HookFailed(hook, "returned WHAT that DETAIL") unless `detail` is None."""
    if detail is not None:
        raise HookFailed(hook, f"returned {what} that {detail}")


# ---- the guarded policy ------------------------------------------------------------------

def guarded(policy: Policy) -> Policy:
    """`policy` with every function wrapped: an exception or an output of the wrong form
    raises HookFailed naming the function. Its state is checked against `init`'s output."""
    seen: dict[str, Any] = {}

    def guard(hook: str, fn: Callable, check: Callable) -> Callable:
        def wrapped(*args):
            try:
                out = fn(*args)
            except (HookFailed, KeyboardInterrupt):
                raise
            except BaseException as err:  # noqa: BLE001 - a user's function: report, never a traceback
                raise HookFailed(hook, f"raised {describe(err)}") from None
            check(out, *args)
            return out
        return wrapped

    def check_encode(out, settings, ctx):
        if not isinstance(out, dict):
            raise HookFailed("encode", f"returned {kind(out)}, need a dict of numpy arrays")
        for leaf in jax.tree_util.tree_leaves(out):
            if _spec(leaf) is None or np.asarray(leaf).dtype.kind not in "biuf":
                raise HookFailed("encode", f"returned {kind(leaf)} leaf, need numeric arrays")
        leaves, treedef = jax.tree_util.tree_flatten(out)
        form = (treedef, [np.shape(leaf) for leaf in leaves])  # lanes' params are stacked: one form
        if seen.setdefault("encode", form) != form:
            raise HookFailed("encode", "returned params of another structure or shape for a lane of another "
                                       "policy (settings None) than for its own lane")

    def check_init(out, params, shape):
        for leaf in jax.tree_util.tree_leaves(out):
            if _spec(leaf) is None:
                raise HookFailed("init", f"returned a state with {kind(leaf)} leaf, need arrays")
        seen["state"] = out

    def same_state(hook):
        def check(state):
            _expect(tree_mismatch(seen["state"], state), hook, "a state")
        return check

    def check_select(out, state, view, eligible, params):
        if not isinstance(out, Choice):
            raise HookFailed("select", f"returned {kind(out)}, need a Choice(client, has, state)")
        _expect(_scalar(out.client, "iu", "an int32[]"), "select", "a client")
        _expect(_scalar(out.has, "b", "a bool[]"), "select", "a has")
        same_state("select")(out.state)
        seen["counter"] = view.counter

    def check_pair(hook, second: str):
        def check(out, state, view, event, params):
            if not isinstance(out, tuple) or len(out) != 2:
                raise HookFailed(hook, f"returned {kind(out)}, need a pair (state, {second})")
            same_state(hook)(out[0])
            if second == "counter":
                _expect(tree_mismatch(view.counter, out[1]), hook, "a counter")
            else:
                _expect(_scalar(out[1], "iu", "an int32[]"), hook, "a value")
        return check

    def check_state(hook):
        def check(out, state, view, event, params):
            same_state(hook)(out)
        return check

    def check_counters(out, state):
        if "counter" in seen:
            spec, need = _spec(out), _spec(seen["counter"])
            if spec is None or spec[0] != need[0] or np.dtype(spec[1]).kind not in "iu":
                raise HookFailed("counters", f"returned {_show(spec) if spec else kind(out)}, need "
                                             f"{_show(need)} (the engine's counter format)")

    def check_nothing(out, *args):
        return None

    def lenient(validate):
        # Default settings may rightly be refused (rpm needs a limit): the test lane then
        # runs them anyway; only an exception other than InputError is the policy's defect.
        def run(settings):
            try:
                validate(settings)
            except InputError:
                pass
        return run

    wrapped = {"encode": guard("encode", policy.encode, check_encode), "init": guard("init", policy.init, check_init),
               "select": guard("select", policy.select, check_select)}
    checks = {"on_arrival": check_pair("on_arrival", "counter"), "on_admit": check_pair("on_admit", "value"),
              "on_step": check_state("on_step"), "on_complete": check_state("on_complete"),
              "counters": check_counters}
    for hook, check in checks.items():
        if getattr(policy, hook) is not None:
            wrapped[hook] = guard(hook, getattr(policy, hook), check)
    if policy.validate is not None:
        wrapped["validate"] = guard("validate", lenient(policy.validate), check_nothing)
    return dataclasses.replace(policy, **wrapped)
