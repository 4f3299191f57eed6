"""User policy modules (--policy-module): the engines admit only what `eligible` lets
through, a module may not take a built-in's name, and every broken module is refused at
load with one line naming the file, the policy and the function (exit 2 through the CLI).
Fixture modules: tests/data/policy_modules/."""

from __future__ import annotations

from pathlib import Path

import pytest

from vtc_jax import Settings, Trace, replay
from vtc_jax.cluster import ClusterSettings, simulate_traces
from vtc_jax.policies import registry

ROOT = Path(__file__).resolve().parents[1]
MODULES = ROOT / "tests" / "data" / "policy_modules"


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry as it was before the test (a module a test loads does not leak into
    the random-lane tests, which iterate every registered name)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_SOURCES", dict(getattr(registry, "_SOURCES", {})), raising=False)


def _load(name: str) -> str:
    return registry.load_policy_module(MODULES / f"{name}.py")[0]


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
