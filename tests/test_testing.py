"""vtc_jax.testing: a user's policy is checked against the literal model in one call
(`check_policy`), the check can fail (a policy whose engine rule and reference disagree is
caught, naming the lane, the settings and the quantity), and the floor needs neither pytest
nor hypothesis."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.helpers import python
from vtc_jax import InputError
from vtc_jax.driver import policy_modules
from vtc_jax.inputs.workload import ORDER
from vtc_jax.policies import registry
from vtc_jax.policies.base import argmin_choice
from vtc_jax.policies.fcfs import FCFS
from vtc_jax.testing import check_policy

ROOT = Path(__file__).resolve().parents[1]


def test_example_policy_passes():
    name = policy_modules.load_policy_module(ROOT / "examples" / "my_policy.py")[0]
    check_policy(name)


def _newest_head(state, view, eligible, params):
    """The youngest eligible FIFO head: FCFS's order reversed (its reference still says FCFS)."""
    return argmin_choice(-view.heads[:, ORDER], eligible, state)


def test_a_policy_that_disagrees_with_its_reference_fails():
    wrong = dataclasses.replace(FCFS, name="fcfs_newest_head_h4", select=_newest_head)
    with registry.provisionally(wrong):
        with pytest.raises(AssertionError, match=r"policy 'fcfs_newest_head_h4', lane \d+ of 40 \(seed 3\), "
                                                 r"Settings\(.*\): .* differs: engine .*, reference "):
            check_policy(wrong.name, lanes=40, seed=3)
    assert registry.registered(wrong.name) is None


def test_unknown_policy_is_an_input_error():
    with pytest.raises(InputError, match="unknown policy 'nope'"):
        check_policy("nope")


def test_testing_needs_neither_pytest_nor_hypothesis():
    code = ("import sys, vtc_jax.testing, vtc_jax.testing.lanes, vtc_jax.testing.reference, "
            "vtc_jax.testing.vllm_reference; "
            "print(sorted(m for m in ('pytest', 'hypothesis', '_pytest') if m in sys.modules))")
    done = python("-c", code, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
