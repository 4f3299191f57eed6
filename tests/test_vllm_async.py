"""vLLM's async scheduling (AsyncScheduler under EngineCore.step_with_batch_queue, the GPU
default; docs/VLLM_ASYNC.md): the literal reference's async mode
(vtc_jax/testing/vllm_reference.py, config `async_scheduling`) against the 69 async goldens
of the real scheduler (tests/data/vllm_golden_async/), and by hand on RULES.md's micro trace."""

from __future__ import annotations

import json
import os

import pytest

from vtc_jax.testing.vllm_goldens import load_golden
from vtc_jax.testing.vllm_reference import TraceRequest, simulate

DATA = os.path.join(os.path.dirname(__file__), "data")
ASYNC = os.path.join(DATA, "vllm_golden_async")
NAMES = sorted(f[: -len(".config.json")] for f in os.listdir(ASYNC) if f.endswith(".config.json"))


def _source(name: str) -> str:
    return os.path.join(DATA, "vllm_golden" if name.startswith("g") else "vllm_golden_more")


def test_the_async_goldens_are_every_golden_rerun_async():
    """Each async golden is a sync golden's trace and settings rerun with AsyncScheduler:
    the same CSV bytes, the same settings, and a schedule that differs (freed blocks come
    back one step later: every run but m018 takes more steps)."""
    assert len(NAMES) == 69 and sum(n.startswith("g") for n in NAMES) == 29
    longer = 0
    for name in NAMES:
        with open(os.path.join(ASYNC, name + ".csv"), "rb") as a, open(os.path.join(_source(name), name + ".csv"), "rb") as b:
            assert a.read() == b.read(), name
        _, config, schedule = load_golden(ASYNC, name)
        _, sync_config, sync_schedule = load_golden(_source(name), name)
        assert config.pop("async_scheduling") is True and config["effective"].pop("scheduler_class") == "AsyncScheduler"
        sync_config["effective"].pop("scheduler_class")
        assert config == sync_config, name
        assert schedule["num_steps"] >= sync_schedule["num_steps"] and schedule["steps"] != sync_schedule["steps"], name
        longer += schedule["num_steps"] > sync_schedule["num_steps"]
    assert longer == 68


@pytest.mark.parametrize("name", NAMES)
def test_reference_reproduces_the_async_golden(name):
    """Step for step: the clock, who got how many tokens in vLLM's order, who was
    preempted, whose stop the step's update processed; every request's first token,
    finish and preemptions."""
    requests, config, golden = load_golden(ASYNC, name)
    mine = simulate(requests, config)
    for a, b in zip(mine["steps"], golden["steps"]):
        assert a == b, f"{name}: first differing step {b['step']}"
        assert list(a["sched"]) == list(b["sched"]), f"{name}: step {b['step']} order"
    assert mine == golden


MICRO = [TraceRequest(arrival=0, client="A", prompt=32, output=4), TraceRequest(arrival=0, client="B", prompt=40, output=3),
         TraceRequest(arrival=2, client="A", prompt=64, output=2)]


def test_micro_trace_by_hand():
    """RULES.md section 10's micro trace `0,A,32,4 / 0,B,40,3 / 2,A,64,2` on an ample pool.

    Both modes compute the same tokens: step 0 prefills rows 0 and 1 (32 + 40; each
    samples its first token), step 1 decodes both, step 2 decodes both and prefills row 2
    (64, its first token), step 3 decodes rows 0 and 2. Row 1 samples its 3rd and last
    token in step 2, rows 0 and 2 their last in step 3: sync stops them in those steps.
    Async, step 2's update runs after step 3's schedule, so row 1 stops in step 3's record
    (it holds its blocks through step 3), and rows 0 and 2 in step 4, an empty schedule
    whose only work is that update: the run ends there. Finish steps (the step that
    sampled the last token) are the same in both."""
    work = [(0, {"0": 32, "1": 40}), (1, {"0": 1, "1": 1}), (2, {"0": 1, "1": 1, "2": 64}), (3, {"0": 1, "2": 1})]
    sync = [(t, s, [], f) for (t, s), f in zip(work, ([], [], [1], [0, 2]))]
    asynchronous = [(t, s, [], f) for (t, s), f in zip(work + [(4, {})], ([], [], [], [1], [0, 2]))]
    requests = {"0": {"first_token_step": 0, "finish_step": 3, "preemptions": 0},
                "1": {"first_token_step": 0, "finish_step": 2, "preemptions": 0},
                "2": {"first_token_step": 2, "finish_step": 3, "preemptions": 0}}
    for flag, want in ((False, sync), (True, asynchronous)):
        got = simulate(MICRO, {"num_blocks": 100, "async_scheduling": flag})
        assert [(s["step"], s["sched"], s["preempted"], s["finished"]) for s in got["steps"]] == want
        assert got["requests"] == requests


def test_async_golden_records_are_schedule_calls():
    """The reduced logs keep one record per schedule() call (make.py's reduce_log drops the
    harness's update-only records): steps strictly increase, and a run ends with the empty
    schedule whose update stops the last request."""
    for name in NAMES:
        with open(os.path.join(ASYNC, name + ".schedule.json")) as f:
            steps = json.load(f)["steps"]
        assert all(a["step"] < b["step"] for a, b in zip(steps, steps[1:])), name
        assert steps[-1]["sched"] == {} and steps[-1]["finished"], name
