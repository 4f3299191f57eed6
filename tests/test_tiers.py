"""The two tiers of the suite (tests/conftest.py): which tests the fast tier leaves out, that
its list names real tests, and that its check that every module was imported has teeth."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests import conftest
from tests.helpers import ROOT, one_error_line, python


@pytest.mark.parametrize("nodeid, tier", [
    ("tests/test_layout.py::test_module_size[core/wide.py]", "fast"),
    ("tests/test_quiet_steps.py::test_quiet_stretches_give_every_result_of_step_by_step[1-drain]", "slow"),
    ("tests/test_engine_exact.py::test_matches_reference_every_step[burst-4]", "slow"),
    ("tests/test_engine_exact.py::test_matches_reference_every_step[drain-1]", "slow"),
    ("tests/test_engine_exact.py::test_matches_reference_every_step[drain-2]", "fast"),
    ("tests/test_hostile.py::test_hostile_input[gen-too-many-requests]", "slow"),
    ("tests/test_hostile.py::test_hostile_input[replay-missing-file]", "fast"),
])
def test_a_test_is_slow_when_a_pattern_names_it_and_no_keep_does(nodeid, tier):
    assert conftest.tier_of(nodeid) == tier


def test_every_pattern_names_a_collected_test():
    """A test renamed or removed would leave its pattern naming nothing: the tier would
    change without a word. Checked on a whole collection only (not on `pytest this_file`)."""
    if not conftest.FULL_COLLECTION[0]:
        pytest.skip("needs the whole suite collected")
    assert conftest.UNMATCHED == []


def test_package_modules_are_every_file_of_vtc_jax_and_sweeps():
    files = sorted(ROOT.glob("vtc_jax/**/*.py")) + sorted(ROOT.glob("sweeps/*.py"))
    names = conftest.package_modules()
    assert len(names) == len(files)
    assert {"vtc_jax", "vtc_jax.__main__", "vtc_jax.cli", "vtc_jax.cli.commands", "vtc_jax.core.wide", "sweeps",
            "sweeps.rpm"} <= names


def _fast_session(exitstatus=0, markexpr="not slow", args=("tests",), maxfail=0):
    lines = []
    reporter = SimpleNamespace(write_line=lambda text, **kw: lines.append(text))
    option = SimpleNamespace(markexpr=markexpr, keyword="", maxfail=maxfail)
    config = SimpleNamespace(option=option, args=list(args), rootpath=ROOT,
                             getini=lambda name: ["tests"], getoption=lambda name, default=None: default,
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: reporter))
    return SimpleNamespace(config=config, exitstatus=exitstatus), lines


def test_fast_tier_fails_naming_a_module_no_test_imported(monkeypatch):
    every = conftest.package_modules()
    monkeypatch.setattr(conftest, "_WORKER_MODULES", set())
    monkeypatch.setattr(conftest, "_imported", lambda: every - {"sweeps.rpm", "vtc_jax.core.wide", "vtc_jax.__main__"})
    session, lines = _fast_session()
    conftest._check_fast_tier_modules(session)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
    assert lines == ["fast tier: 2 modules imported by no test: sweeps.rpm, vtc_jax.core.wide"]
    # a run whose tests failed still names them
    session, lines = _fast_session(exitstatus=pytest.ExitCode.TESTS_FAILED)
    conftest._check_fast_tier_modules(session)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED and len(lines) == 1
    # a worker's imports count as the controller's
    monkeypatch.setattr(conftest, "_WORKER_MODULES", {"sweeps.rpm", "vtc_jax.core.wide"})
    session, lines = _fast_session()
    conftest._check_fast_tier_modules(session)
    assert session.exitstatus == 0 and lines == [f"fast tier: every one of the {len(every)} modules of vtc_jax "
                                                 "and sweeps imported"]


@pytest.mark.parametrize("exitstatus, markexpr, args, maxfail", [
    (pytest.ExitCode.INTERRUPTED, "not slow", ["tests"], 0),  # Ctrl-C: not every test ran
    (0, "not slow", ["tests"], 1),  # -x: a failure would have stopped it
    (0, "", ["tests"], 0),  # the full suite
    (0, "not slow", ["tests/test_tiers.py"], 0),  # one file
])
def test_module_check_runs_only_after_a_whole_fast_tier(monkeypatch, exitstatus, markexpr, args, maxfail):
    monkeypatch.setattr(conftest, "_WORKER_MODULES", set())
    monkeypatch.setattr(conftest, "_imported", lambda: set())
    session, lines = _fast_session(exitstatus, markexpr, args, maxfail)
    conftest._check_fast_tier_modules(session)
    assert session.exitstatus == exitstatus and lines == []


def test_python_m_vtc_jax_is_the_cli(tmp_path):
    """vtc_jax/__main__.py, which only runs as a process (the module check leaves it to
    this test): bad input is one line and exit 2."""
    done = python("-m", "vtc_jax", "replay", tmp_path / "missing.csv", "--policy", "vtc", "--kv-budget", "100")
    assert done.returncode == 2 and done.stdout == ""
    assert "missing.csv" in one_error_line(done.stderr)


def test_the_slow_mark_is_registered_in_pyproject():
    import tomllib

    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [m for m in markers if m.startswith("slow:")]
