"""User policy modules (--policy-module): the engines admit only what `eligible` lets
through, a module may not take a built-in's name, and every broken module is refused at
load with one line naming the file, the policy and the function (exit 2 through the CLI).
Fixture modules: tests/data/policy_modules/."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import jax
import pytest

from tests.helpers import python
from vtc_jax import InputError, Settings, Trace, replay
from vtc_jax.cli import commands as cli
from vtc_jax.driver import policy_modules
from vtc_jax.driver.cluster_run import simulate_traces
from vtc_jax.engines.cluster_settings import ClusterSettings
from vtc_jax.policies import registry
from vtc_jax.policies.vtc import VTC

ROOT = Path(__file__).resolve().parents[1]
MODULES = ROOT / "tests" / "data" / "policy_modules"
SMALL_TRACE = ROOT / "examples" / "small_trace.csv"


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry as it was before the test (a module a test loads does not leak into
    the random-lane tests, which iterate every registered name)."""
    monkeypatch.setattr(registry.POLICIES, "_items", registry.POLICIES.snapshot())
    monkeypatch.setattr(registry, "_SOURCES", dict(registry._SOURCES))


def _load(name: str) -> str:
    return policy_modules.load_policy_module(MODULES / f"{name}.py")[0]


# ---- the engines admit only eligible clients ---------------------------------------------

# Client 0: four requests at step 0; client 1: two. Prompt 10, output 2.
LIMITED = Trace.from_rows([(0, 0, 10, 2)] * 4 + [(0, 1, 10, 2)] * 2)


@pytest.mark.parametrize("limit, steps, expected", [
    ({"rpm_limit": 1, "rpm_window": 100}, 20, [1, 0]),  # one admission per client per window
    ({"kv_cap": 12}, 5, [3, 0]),  # one running request per client: admitted at steps 0, 2, 4
    ({"bands": (1, 0)}, 20, [0, 0]),  # client 1 first: the policy's client 0 is never admissible
])
def test_a_policy_cannot_bypass_the_limits(clean_registry, limit, steps, expected):
    """`ignores_limits` always picks client 0 while it waits; the engine refuses the pick
    where limits or bands rule client 0 out, and admits nothing in that step (before: all
    4 of client 0's requests were admitted at step 0 under each limit)."""
    name = _load("ignores_limits")
    result = replay(LIMITED, Settings(name, kv_budget=64, **limit), steps=steps)
    assert result.finished[0]
    assert result.admitted[0].tolist() == expected


def test_an_impossible_choice_admits_nothing_and_every_step_ends(clean_registry):
    """A client outside [0, K) with has=True (before: admitted forever within step 0, the
    lane never finished)."""
    name = _load("picks_nobody")
    result = replay(LIMITED, Settings(name, kv_budget=64), steps=15)
    assert result.finished[0] and int(result.steps[0]) == 15
    assert result.admitted[0].tolist() == [0, 0] and result.waiting[0].tolist() == [4, 2]


def test_a_replica_admits_only_a_backlogged_tenant(clean_registry):
    """The cluster's replicas refuse an impossible choice too (before: the lane never
    finished)."""
    name = _load("picks_nobody")
    cluster = ClusterSettings(engine=Settings(name, kv_budget=64), gateway_policy="fcfs", replicas=1, routers=1)
    result = simulate_traces([LIMITED], [cluster], num_clients=2, steps=15)
    assert result.finished[0] and int(result.steps[0]) == 15
    assert result.admitted[0].sum() == 0


# ---- broken modules: one line naming the file, the policy and the function, exit 2 -------

BROKEN = {  # fixture: words the one stderr line must hold (besides the file's name)
    "shadows_builtin": ["policy 'vtc'", "built-in", "new names only"],
    "not_a_policy": ["POLICY holds an int"],
    "hook_not_callable": ["policy 'hook_not_callable'", "on_admit is an int"],
    "select_missing": ["policy 'select_missing'", "select is None"],
    "select_wrong_shape": ["policy 'select_wrong_shape'", "select returned a client", "int32[2]"],
    "select_raises_traced": ["policy 'select_raises_traced'", "select raised TracerBoolConversionError"],
    "admit_wrong_dtype": ["policy 'admit_wrong_dtype'", "on_admit returned a state", "float32[], need int32[]"],
    "step_wrong_pytree": ["policy 'step_wrong_pytree'", "on_step returned a state", "structure"],
    "arrival_not_pair": ["policy 'arrival_not_pair'", "on_arrival returned a tuple, need a pair"],
    "encode_not_dict": ["policy 'encode_not_dict'", "encode returned a list"],
}


def _replay_line(capsys, module: Path, policy: str = "vtc") -> tuple[int, list[str]]:
    code = cli.main(["replay", str(SMALL_TRACE), "--policy-module", str(module), "--policy", policy,
                     "--kv-budget", "4096", "--steps", "20", "--no-cache"])
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


@pytest.mark.parametrize("fixture", sorted(BROKEN))
def test_a_broken_module_is_one_line_and_exit_2(clean_registry, capsys, fixture):
    """Before: 'internal error (a defect, please report it)' and exit 1, or (a built-in's
    name) the built-in silently replaced and exit 0."""
    before = registry.names()
    module = MODULES / f"{fixture}.py"
    code, err = _replay_line(capsys, module)
    assert code == 2 and len(err) == 1, err
    assert str(module) in err[0] and all(words in err[0] for words in BROKEN[fixture]), err[0]
    assert "internal error" not in err[0]
    assert registry.names() == before and registry.get("vtc") is VTC


def _cli(*args) -> subprocess.CompletedProcess:
    return python("-m", "vtc_jax", "replay", SMALL_TRACE, "--kv-budget", "4096", "--steps", "20", "--no-cache", *args)


def test_sys_exit_at_import_does_not_end_the_command():
    """Before: `replay` ended silently with exit 0 and no output."""
    done = _cli("--policy-module", str(MODULES / "exits_at_import.py"), "--policy", "vtc")
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "import failed (SystemExit: 0)" in err[0], done.stderr
    assert done.stdout == ""


def test_a_module_enabling_x64_is_refused_and_jax_is_restored(clean_registry, capsys):
    """Before: the module loaded, and then every policy failed (int64 state against int32
    params) with an internal error."""
    code, err = _replay_line(capsys, MODULES / "enables_x64.py")
    assert code == 2 and len(err) == 1 and "jax_enable_x64: False -> True" in err[0], err
    assert jax.config.jax_enable_x64 is False
    done = _cli("--policy-module", str(MODULES / "enables_x64.py"), "--policy", "vtc")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "jax_enable_x64" in done.stderr


def test_a_name_is_defined_once(clean_registry, tmp_path):
    """The same file twice is harmless (one import, one check); another file defining a
    name already taken is refused, naming where it came from; a module defining a name
    twice is refused; a refused module registers nothing."""
    first = MODULES / "ignores_limits.py"
    assert policy_modules.load_policy_module(first) == ["ignores_limits"]
    policy = registry.get("ignores_limits")
    assert policy_modules.load_policy_module(first) == ["ignores_limits"] and registry.get("ignores_limits") is policy
    copy = tmp_path / "copy.py"
    copy.write_text(first.read_text())
    with pytest.raises(InputError, match=r"policy 'ignores_limits' is already defined \(.*ignores_limits\.py\)"):
        policy_modules.load_policy_module(copy)
    twice = tmp_path / "twice.py"
    twice.write_text(first.read_text().replace("POLICY = Policy(", "ONE = Policy(").replace(
        'name="ignores_limits"', 'name="named_twice"').replace(
        "encode=no_params, init=no_state, select=select)",
        "encode=no_params, init=no_state, select=select)\nPOLICIES = [ONE, ONE]"))
    with pytest.raises(InputError, match="defines policy 'named_twice' twice"):
        policy_modules.load_policy_module(twice)
    before = registry.names()
    with pytest.raises(InputError, match="select_missing"):
        policy_modules.load_policy_module(MODULES / "select_missing.py")
    assert registry.names() == before


def test_the_example_policy_passes_the_checks(clean_registry):
    """examples/my_policy.py loads (its check traces it in both number formats)."""
    assert policy_modules.load_policy_module(ROOT / "examples" / "my_policy.py") == ["round_robin"]
    assert registry.get("round_robin").select.__module__ != "vtc_jax.policies.checks"  # the original, not the guard


@pytest.mark.parametrize("builtin", ["fcfs", "vtc", "rpm", "drr", "vtc_predict", "vtc_gateway"])
def test_a_renamed_builtin_passes_the_checks(builtin):
    """No valid policy is refused: each kind of built-in (stateless, arrival hook, a scan's
    state, estimator and counters, options and a validate that refuses the defaults)
    passes under a new name."""
    policy_modules.check_policy(dataclasses.replace(registry.get(builtin), name=f"renamed_{builtin}"))
    assert f"renamed_{builtin}" not in registry.names()  # registered for the check only
