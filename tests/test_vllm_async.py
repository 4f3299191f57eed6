"""vLLM's async scheduling (AsyncScheduler under EngineCore.step_with_batch_queue, the GPU
default; docs/VLLM_ASYNC.md): the literal reference's async mode
(vtc_jax/testing/vllm_reference.py, config `async_scheduling`) against the 69 async goldens
of the real scheduler (tests/data/vllm_golden_async/), and by hand on RULES.md's micro trace;
the `vllm` server (52 goldens without prefix caching) and the `vllm_prefix` server (the 17
with it) through the engine against the goldens and the reference on random lanes."""

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


# ----------------------------------------------------------------------------------------
# The `vllm` server (servers/vllm_v1.py with vllm_v1_async.py) through the engine.


@pytest.fixture(scope="module")
def engine():
    """tests/test_vllm_server.py's lane runner, with the reference config's
    `async_scheduling` passed on as the server's setting of the same name."""
    from tests import test_vllm_server as tvs
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(tvs.OPTION_NAMES, "async_scheduling", "async_scheduling")
        yield tvs


def _without_prefix_caching() -> list[str]:
    return [n for n in NAMES if not load_golden(ASYNC, n)[1]["prefix_caching"]]


@pytest.fixture(scope="module")
def golden_runs(engine) -> dict:
    """The 52 async goldens without prefix caching through the engine, in 4 batches of
    similar length: {name: (golden, ours)}."""
    loaded = {n: load_golden(ASYNC, n) for n in _without_prefix_caching()}
    names = sorted(loaded, key=lambda n: len(loaded[n][2]["steps"]))
    out = {}
    for k in range(4):
        batch = names[k * len(names) // 4: (k + 1) * len(names) // 4]
        got = engine.engine_schedules([loaded[n][:2] for n in batch], max(len(loaded[n][2]["steps"]) for n in batch) + 5)
        out.update({n: (loaded[n][2], mine) for n, mine in zip(batch, got)})
    return out


@pytest.mark.parametrize("name", _without_prefix_caching())
def test_server_reproduces_the_async_golden(golden_runs, engine, name):
    real, mine = golden_runs[name]
    engine.assert_same(mine, real, name)


def test_server_micro_trace_by_hand(engine):
    """The micro trace above through the engine, async and sync in one batch."""
    got = engine.engine_schedules([(MICRO, {"num_blocks": 100, "async_scheduling": flag}) for flag in (True, False)], 8)
    for mine, flag in zip(got, (True, False)):
        want = simulate(MICRO, {"num_blocks": 100, "async_scheduling": flag})
        engine.assert_same(mine, want, f"async {flag}")
    assert [s["finished"] for s in got[0]["steps"]] == [[], [], [], [1], [0, 2]]


def _stopped_victims(schedule: dict) -> int:
    """Victims whose last token was in flight: preempted and stopped in one step."""
    return sum(len(set(s["preempted"]) & set(s["finished"])) for s in schedule["steps"])


def test_random_lanes_match_the_reference(engine):
    """Random small lanes (tests/test_vllm_server.py's, tight pools to ample) under async
    scheduling, fcfs and priority, against the reference's async mode, with sync lanes of
    the same traces in the same batch (lanes may mix the modes): 90 lanes of each; among
    them victims whose last token was in flight (they stop from the waiting queue)."""
    import numpy as np
    rng = np.random.default_rng(49)
    lanes = [engine.random_lane(rng, policy, async_scheduling=True) for policy in ("fcfs", "priority") for _ in range(45)]
    lanes += [(reqs, dict(config, async_scheduling=False)) for reqs, config in lanes]
    want = [simulate(reqs, config) for reqs, config in lanes]
    assert sum(_stopped_victims(w) > 0 for w in want[:90]) >= 3
    assert all(_stopped_victims(w) == 0 for w in want[90:])
    got = engine.engine_schedules(lanes, max(w["num_steps"] for w in want) + 1)
    for k, (mine, real) in enumerate(zip(got, want)):
        engine.assert_same(mine, real, f"lane {k} ({lanes[k][1]})")


def test_the_setting_is_a_bool_off_by_default_with_vllms_flag_name():
    from vtc_jax.core.errors import InputError
    from vtc_jax.servers import records, vllm_v1
    assert vllm_v1.settings({"num_gpu_blocks": 8})["async_scheduling"] is False
    assert bool(vllm_v1.encode({"num_gpu_blocks": 8, "async_scheduling": True})["async"])
    assert dict(vllm_v1.static_options([{}, {"async_scheduling": True}]))["async_scheduling"]
    assert not dict(vllm_v1.static_options([{}, {"async_scheduling": False}]))["async_scheduling"]
    assert records.VLLM_FLAGS["async_scheduling"] == "--async-scheduling"
    with pytest.raises(InputError, match="async_scheduling must be true or false, got 'yes'"):
        vllm_v1.validate({"num_gpu_blocks": 8, "async_scheduling": "yes"})
    with pytest.raises(InputError, match="config: async_scheduling must be true or false, got 1"):
        simulate(MICRO, {"num_blocks": 100, "async_scheduling": 1})


def test_a_stop_adds_at_most_one_step_to_the_drain_bound():
    """drain_steps: async adds requests + 1 steps (one skipped step per request, one empty
    step after the last stop) to the newest victim's bound; the goldens' runs fit it."""
    from vtc_jax.servers import vllm_v1
    for name in _without_prefix_caching():
        requests, config, golden = load_golden(ASYNC, name)
        arrival, prompt, output = ([getattr(r, f) for r in requests] for f in ("arrival", "prompt", "output"))
        options = {"num_gpu_blocks": config["num_blocks"], "async_scheduling": True}
        bound = vllm_v1.drain_steps(options, arrival, prompt, output)
        assert bound == vllm_v1.drain_steps(dict(options, async_scheduling=False), arrival, prompt, output) + len(requests) + 1
        assert golden["steps"][-1]["step"] < bound, name


def test_every_policy_drains_async_lanes_computing_each_token_once_unless_preempted(engine):
    """Every registered policy that needs no setting of its own picks the waiting order
    on async lanes (one batch): every
    request finishes after its first token, and a request never preempted is computed
    exactly once: P + O - 1 tokens (its last token gets no KV), its stop one step after."""
    import numpy as np

    from vtc_jax.policies import registry
    from vtc_jax import InputError, Settings

    def plain(name: str) -> bool:  # runs without settings of its own (rpm needs a limit)
        try:
            Settings(policy=name, kv_budget=1 << 29)
        except InputError:
            return False
        return True

    rng = np.random.default_rng(7)
    names = [n for n in registry.names() if plain(n)]
    assert len(names) >= 5
    lanes = [engine.random_lane(rng, "fcfs", async_scheduling=True) for _ in names for _ in range(3)]
    got = engine.engine_schedules(lanes, 600, policy=[n for n in names for _ in range(3)])
    for (requests, _), mine in zip(lanes, got):
        tokens = {}
        for s in mine["steps"]:
            for row, n in s["sched"].items():
                tokens[row] = tokens.get(row, 0) + n
        stops = {row: s["step"] for s in mine["steps"] for row in s["finished"]}
        for row, r in enumerate(requests):
            rec = mine["requests"][str(row)]
            assert rec["first_token_step"] <= rec["finish_step"] < stops[row]
            if rec["preemptions"] == 0:
                assert tokens[str(row)] == r.prompt + r.output - 1 and stops[row] == rec["finish_step"] + 1


# ----------------------------------------------------------------------------------------
# The `vllm_prefix` server (servers/vllm_prefix.py with vllm_prefix_async.py) through the engine.


def _with_prefix_caching() -> list[str]:
    return [n for n in NAMES if load_golden(ASYNC, n)[1]["prefix_caching"]]


@pytest.fixture(scope="module")
def prefix_golden_runs(engine) -> dict:
    """The 17 async goldens with prefix caching through the engine, in one batch (server
    vllm_prefix): {name: (golden, ours)}."""
    loaded = {n: load_golden(ASYNC, n) for n in _with_prefix_caching()}
    got = engine.engine_schedules([v[:2] for v in loaded.values()], max(len(v[2]["steps"]) for v in loaded.values()) + 5)
    return {n: (v[2], mine) for (n, v), mine in zip(loaded.items(), got)}


def test_the_prefix_caching_goldens_show_rule_5():
    """17 goldens cache prefixes. Hashing as in sync (every sampled token at once: the
    reference with no `placeholders`) misses 7 of them (docs/VLLM_ASYNC.md: a decode's
    block freed unhashed and recomputed); hashing only at allocation (no update's hashing,
    `_cache_updated`) misses g027."""
    from vtc_jax.testing import vllm_reference

    def misses() -> list[str]:
        return [n for n in names if simulate(*load_golden(ASYNC, n)[:2]) != load_golden(ASYNC, n)[2]]

    names = _with_prefix_caching()
    assert len(names) == 17
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_reference._Server, "placeholders", property(lambda self: set(), lambda self, v: None),
                      raising=False)
        assert misses() == ["g006", "g016", "g019", "m009", "m011", "m012", "m013"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_reference._Server, "_cache_updated", lambda self: None)
        assert misses() == ["g027"]


@pytest.mark.parametrize("name", _with_prefix_caching())
def test_prefix_server_reproduces_the_async_golden(prefix_golden_runs, engine, name):
    real, mine = prefix_golden_runs[name]
    engine.assert_same(mine, real, name)


def test_random_prefix_lanes_match_the_reference(engine):
    """Random prefix lanes (tests/test_vllm_prefix.py's: shared prefixes, tight pools)
    in which prefix caching changes the async schedule, fcfs and priority, against the
    reference's async mode, with sync lanes of the same traces in the same batch: 90
    lanes of each. Among them victims whose last token was in flight, and lanes whose
    schedule a decode's block hashed one update late changes (rule 5: the reference
    without `_cache_updated` differs)."""
    import numpy as np

    from tests.test_vllm_prefix import prefix_lane
    from vtc_jax.testing import vllm_reference

    def lane(policy):
        while True:
            requests, config = prefix_lane(rng, policy)
            config = dict(config, async_scheduling=True)
            if simulate(requests, config)["steps"] != simulate(requests, dict(config, prefix_caching=False))["steps"]:
                return requests, config

    rng = np.random.default_rng(5)
    lanes = [lane(policy) for policy in ("fcfs", "priority") for _ in range(45)]
    lanes += [(reqs, dict(config, async_scheduling=False)) for reqs, config in lanes]
    want = [simulate(reqs, config) for reqs, config in lanes]
    assert sum(_stopped_victims(w) > 0 for w in want[:90]) >= 3
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_reference._Server, "_cache_updated", lambda self: None)
        assert sum(simulate(*lanes[k]) != want[k] for k in range(90)) >= 3
    got = engine.engine_schedules(lanes, max(w["num_steps"] for w in want) + 1)
    for k, (mine, real) in enumerate(zip(got, want)):
        engine.assert_same(mine, real, f"lane {k} ({lanes[k][1]})")


def test_prefix_caching_keeps_the_drain_bound():
    """vllm_prefix's drain bound is vllm's (async adds requests + 1 steps); the async
    goldens with prefix caching fit it."""
    from vtc_jax.servers import vllm_prefix
    for name in _with_prefix_caching():
        requests, config, golden = load_golden(ASYNC, name)
        arrival, prompt, output = ([getattr(r, f) for r in requests] for f in ("arrival", "prompt", "output"))
        bound = vllm_prefix.drain_steps({"num_gpu_blocks": config["num_blocks"], "async_scheduling": True},
                                        arrival, prompt, output)
        assert golden["steps"][-1]["step"] < bound, name
