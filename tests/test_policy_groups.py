"""A batch mixing policies, run as one sub-batch per policy (driver/policy_groups.py):
the same results as the mixed program, in the same lane order, and the rule that decides."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import random
import threading
import time
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from vtc_jax import POLICIES, Settings, registry, run_traces
from vtc_jax.driver import policy_groups, runner, tiers
from vtc_jax.driver import run as run_mod
from vtc_jax.engines.engine import EngineBatch, LaneInput
from vtc_jax.engines.settings import encode_settings
from vtc_jax.inputs.traffic import overload
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.testing.lanes import random_lanes
from tests.test_vllm_server import lane_input, random_lane, server_options

ROOT = Path(__file__).resolve().parents[1]

RUN = runner.run


def assert_same_results(got, want, skip=()) -> None:
    """Every field of two LaneResults equal but those in `skip` (NaN equal to NaN; the
    server state leaf by leaf), and the exact values read from them."""
    for field in dataclasses.fields(want):
        if field.name in skip:
            continue
        a, b = getattr(got, field.name), getattr(want, field.name)
        flat_a, tree_a = jax.tree_util.tree_flatten(a)
        flat_b, tree_b = jax.tree_util.tree_flatten(b)
        assert tree_a == tree_b, field.name
        for x, y in zip(flat_a, flat_b):
            x, y = np.asarray(x), np.asarray(y)
            assert x.dtype == y.dtype and x.shape == y.shape, field.name
            if x.dtype == object:
                assert (x == y).all(), field.name
            else:
                np.testing.assert_array_equal(x, y, err_msg=field.name)
    for name in ("service_exact", "counters_exact", "max_drift_exact"):
        assert (getattr(got, name) == getattr(want, name)).all(), name


def _run(monkeypatch, regroup: bool, run, *args, **kwargs):
    """`run(*args, **kwargs)` with the regrouping rule forced to `regroup`, and the
    configs the runner was given."""
    seen = []

    def recording(program, config, *a, **k):
        seen.append(config)
        return RUN(program, config, *a, **k)

    with monkeypatch.context() as patch:
        patch.setattr(runner, "run", recording)
        patch.setattr(policy_groups, "decide", lambda *a: regroup)
        return run(*args, **kwargs), seen


def _example_policy():
    """examples/my_policy.py's round_robin, registered for the with block unless a test of
    this process loaded it already: a user's policy whose admit hook files the estimate it
    is given as its value (what it sees must not depend on the other lanes' policies)."""
    if registry.registered("round_robin") is not None:
        return contextlib.nullcontext()
    spec = importlib.util.spec_from_file_location("my_policy_example", ROOT / "examples" / "my_policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return registry.provisionally(module.POLICY)


def test_regrouped_equals_mixed_across_every_policy(monkeypatch):
    """Every built-in policy and a user's, two lanes each, interleaved (lane i runs policy
    i mod P), on traces of their own: each lane's results are the mixed program's, field
    by field, and a regrouped lane is the lane run alone (one policy compiled). This is
    also the check that dispatch on the traced policy id changes nothing."""
    names = [*POLICIES, "round_robin"]
    with _example_policy():
        traces, settings, _ = random_lanes(random.Random(5), 2 * len(names), num_clients=3, policies=names)
        # the cheapest compiles: no optional measures (the tests below keep them)
        kwargs = dict(num_clients=3, steps=40, record_every=5, measures=MeasureConfig.of([]))
        mixed, mixed_runs = _run(monkeypatch, False, run_traces, traces, settings, policies=names, **kwargs)
        grouped, grouped_runs = _run(monkeypatch, True, run_traces, traces, settings, policies=names, **kwargs)
        assert [c.policies for c in mixed_runs] == [tuple(names)]
        assert [c.policies for c in grouped_runs] == [(p,) for p in names]  # one sub-batch per policy, in the config's order
        assert_same_results(grouped, mixed, skip=("events",))
        # A quiet policy's own sub-batch may run quiet steps in bulk (engines/quiet.py),
        # which the mixed program, tracing policies that are not quiet, never does: the
        # same results in fewer events. Every other lane takes the same events.
        quiet = np.asarray([registry.get(s.policy).quiet for s in settings])
        np.testing.assert_array_equal(grouped.events[~quiet], mixed.events[~quiet])
        assert (grouped.events[quiet] <= mixed.events[quiet]).all()
        assert (grouped.events[quiet] < mixed.events[quiet]).any()
        assert mixed.finished.all()
        for i in (3, len(names) + 7, len(names) - 1):  # lane order kept: lane i is the lane run alone
            alone = run_traces([traces[i]], [settings[i]], **kwargs)
            np.testing.assert_array_equal(grouped.checkpoints[i], alone.checkpoints[0])
            np.testing.assert_array_equal(grouped.policy_counters[i], alone.policy_counters[0])


def test_regrouped_equals_mixed_on_shared_drained_vllm(monkeypatch):
    """One trace shared by every lane, drained, on the vllm server (slot tiers, preemption,
    its schedule log in the server state), policies interleaved."""
    reqs, config = random_lane(np.random.default_rng(3), "fcfs")
    trace, _ = lane_input(reqs, config)
    options = tuple(server_options(dict(config, max_num_seqs=4)).items())
    settings = [Settings(p, kv_budget=1 << 29, server_options=options) for p in ("vtc", "fcfs", "vtc", "fcfs")]
    kwargs = dict(server="vllm", log_steps=16, measures=MeasureConfig.of(["latency", "ledger"]))
    mixed, _ = _run(monkeypatch, False, run_mod.replay_lanes, trace, settings, **kwargs)
    grouped, runs = _run(monkeypatch, True, run_mod.replay_lanes, trace, settings, **kwargs)
    assert {c.policies for c in runs} == {("fcfs",), ("vtc",)}
    assert_same_results(grouped, mixed)
    assert mixed.finished.all()


def test_generated_sweep_lanes_regrouped(monkeypatch):
    """simulate_traffic, the sweeps' path: seed-major lanes whose requests are generated
    once per seed for every setting, one config over all the lanes' policies."""
    traffic = overload([0.5, 0.25], 60)
    settings = [Settings(p, kv_budget=1024) for p in ("vtc", "las", "vtc")] * 2
    seeds = [0, 0, 0, 1, 1, 1]
    mixed, _ = _run(monkeypatch, False, run_mod.simulate_traffic, [traffic] * 6, settings, seeds)
    grouped, runs = _run(monkeypatch, True, run_mod.simulate_traffic, [traffic] * 6, settings, seeds)
    assert [c.policies for c in runs] == [("vtc",), ("las",)]
    assert_same_results(grouped, mixed)


def test_limits_traced_only_for_the_sub_batches_that_have_them(monkeypatch):
    """A sub-batch traces the rpm delay, KV caps and bands only when one of its lanes has
    them (with the rpm delay traced a quiet policy could not run quiet steps): fcfs lanes
    without limits run with none, and every lane's results are the mixed program's."""
    traffic = overload([0.5, 0.25], 80)
    settings = [Settings("fcfs", kv_budget=1024), Settings("rpm", kv_budget=1024, rpm_limit=2, rpm_window=7),
                Settings("vtc", kv_budget=1024, kv_cap=(900, 1024)), Settings("las", kv_budget=1024, bands=(1, 0)),
                Settings("fcfs", kv_budget=1024), Settings("vtc", kv_budget=1024)]
    seeds = [0, 0, 1, 1, 2, 2]
    mixed, mixed_runs = _run(monkeypatch, False, run_mod.simulate_traffic, [traffic] * 6, settings, seeds)
    grouped, runs = _run(monkeypatch, True, run_mod.simulate_traffic, [traffic] * 6, settings, seeds)
    assert [(c.rpm, c.kv_cap, c.bands) for c in mixed_runs] == [(True, True, True)]
    flags = {c.policies[0]: (c.rpm, c.kv_cap, c.bands) for c in runs}
    assert flags == {"fcfs": (False, False, False), "rpm": (True, False, False), "vtc": (False, True, False),
                     "las": (False, False, True)}
    assert_same_results(grouped, mixed, skip=("events",))
    assert mixed.finished.all()


def test_progress_adds_up_over_sub_batches():
    """Parts report their events weighted by their lanes: the batch's count rises to the
    lanes' mean events and never falls, whatever order parts report in."""
    reports = []
    split = policy_groups.SplitProgress(lambda *r: reports.append(r), [1, 3])
    first, second = split.part(0), split.part(1)
    first(100, 400, 1.0)
    first(400, 400, 2.0)
    second(200, 400, 1.0)
    second(50, 400, 1.5)  # a retry of some lanes (a slot tier) counts its most events
    second(300, 400, 2.0)
    assert [r[0] for r in reports] == [25, 100, 250, 250, 325]
    assert all(r[1] == 400 for r in reports)


def _vtc_config():
    return run_mod.engine_config([Settings("vtc", kv_budget=64)], num_clients=2, num_rows=8, max_output=4, slots=4,
                                 wide_numbers=False, record_every=0, num_checkpoints=0, arrival_width=4, drain=False,
                                 measures=MeasureConfig.of([]))


def test_rule():
    """Regroup when the mixed program's extra per-policy work exceeds the sub-batches'
    compiles; never for a config of one policy."""
    per_compile = policy_groups.COMPILE_SECONDS / policy_groups.POLICY_SECONDS
    even = int(per_compile * 11 / 10)  # 11 policies traced and run: the break-even point
    assert not policy_groups.worth_regrouping(1, 1, 10 ** 12)
    assert not policy_groups.worth_regrouping(11, 11, even - 10)
    assert policy_groups.worth_regrouping(11, 11, even + 10)
    assert policy_groups.worth_regrouping(11, 1, int(per_compile / 10) + 10)  # one policy present, ten traced
    assert policy_groups.worth_regrouping(11, 11, even // 2, paid=policy_groups.COMPILE_SECONDS * 6)
    # the sizes the tests run stay mixed: 1024 lanes of 1000 events of every policy
    names = registry.names()
    assert not policy_groups.worth_regrouping(len(names), len(names), 1024 * 1000)


def test_decide_counts_what_mixing_paid():
    """Batches of one config too small to repay the compiles run mixed until what they
    paid together would: a sweep's chunks regroup from then on."""
    names = registry.names()
    config = dataclasses.replace(_vtc_config(), policies=tuple(names))
    chunk = 2048 * 7000  # a CPU sweep chunk of 2048 lanes of 6000 steps
    per_chunk = chunk * (len(names) - 1) * policy_groups.POLICY_SECONDS
    mixed_chunks = int(len(names) * policy_groups.COMPILE_SECONDS // per_chunk)
    assert 1 <= mixed_chunks <= 10
    paid, choices = {}, []
    for _ in range(mixed_chunks + 3):
        choices.append(policy_groups.decide(config, len(names), chunk, paid))
        if not choices[-1]:
            policy_groups.pay(config, chunk, paid)
    assert choices == [False] * mixed_chunks + [True] * 3
    assert paid[config] == pytest.approx(mixed_chunks * per_chunk)
    one = dataclasses.replace(config, policies=("vtc",))
    policy_groups.pay(one, 10 ** 12, paid)
    assert not policy_groups.decide(one, 1, 10 ** 12, paid) and one not in paid


def test_drained_lanes_plan_no_events_and_pay_what_they_ran():
    """A drained batch's horizon is a bound (on a us clock ~1e9), so it plans no events:
    its first batch runs mixed, and what it ran, read from the lanes' event counts, is
    what the next batch of its config finds paid."""
    config = dataclasses.replace(_vtc_config(), policies=("fcfs", "vtc"), drain=True)
    assert policy_groups.planned_events(config, 4, {"event_budget": 1 << 30, "expected_events": 1 << 30}) == 0
    assert policy_groups.planned_events(dataclasses.replace(config, drain=False), 4,
                                        {"event_budget": 99, "expected_events": None}) == 4 * 99
    host = types.SimpleNamespace(iterations=np.asarray([10, 30], np.int32))
    settings = [Settings("fcfs", kv_budget=64), Settings("vtc", kv_budget=64)]
    before = policy_groups._PAID.get(config, 0.0)
    out = policy_groups.run(lambda *a, **k: (host, np.ones(2, bool)), config, settings, object(), None,
                            event_budget=1 << 30, expected_events=1 << 30)
    assert out[0] is host
    assert policy_groups._PAID[config] - before == pytest.approx(40 * policy_groups.POLICY_SECONDS)


def test_merge_puts_lanes_back_in_order():
    """Parts' lanes land where they came from; a leaf no part carries (another policy's
    state) is zero, in the template's dtype."""
    template = {"a": jax.ShapeDtypeStruct((4, 2), np.int32), "b": {"x": jax.ShapeDtypeStruct((4,), np.bool_),
                                                                   "y": jax.ShapeDtypeStruct((4,), np.int32)}}
    first = {"a": np.asarray([[1, 2], [3, 4]], np.int32), "b": {"x": np.asarray([True, True])}}
    second = {"a": np.asarray([[5, 6], [7, 8]], np.int32), "b": {"y": np.asarray([9, 10], np.int32)}}
    out = policy_groups.merge(template, [(np.asarray([3, 0]), first), (np.asarray([1, 2]), second)])
    np.testing.assert_array_equal(out["a"], [[3, 4], [5, 6], [7, 8], [1, 2]])
    np.testing.assert_array_equal(out["b"]["x"], [True, False, False, True])
    np.testing.assert_array_equal(out["b"]["y"], [0, 9, 10, 0])
    assert out["a"].dtype == np.int32 and out["b"]["x"].dtype == np.bool_


def test_unsplit_batches_run_as_given():
    """A config of one policy, or a batch the rule keeps whole, is one run of the batch as
    given (its config and encoding); a forced split of a batch whose lanes all run one
    policy under a larger config is one run under that policy alone."""
    calls = []

    def run_batch(config, batch, shared, **kwargs):
        calls.append((config, batch))
        return "host", np.ones(2, bool)

    vtc = [Settings("vtc", kv_budget=64)] * 2
    config = _vtc_config()
    wider = dataclasses.replace(config, policies=("fcfs", "vtc"))
    batch = object()
    for cfg, regroup in ((config, True), (config, None), (wider, False), (wider, None)):
        calls.clear()
        assert policy_groups.run(run_batch, cfg, vtc, batch, None, regroup=regroup, event_budget=10)[0] == "host"
        assert calls == [(cfg, batch)]
    assert policy_groups.policy_config(wider, "vtc", vtc) == config


def test_device_plan():
    """The costliest sub-batch first, each to the device with the least cost so far (ties:
    the first); a device runs its own in index order."""
    assert policy_groups.device_plan([5, 3, 3, 1], 2) == [[0, 3], [1, 2]]
    assert policy_groups.device_plan([2, 2, 2], 3) == [[0], [1], [2]]
    assert policy_groups.device_plan([1, 1, 1, 1, 1], 2) == [[0, 2, 4], [1, 3]]
    assert policy_groups.device_plan([2, 1, 1, 2], 2) == [[0, 1], [2, 3]]  # in turn: loads 4 and 2
    assert policy_groups.device_plan([0.27, 1.0, 0.27, 1.0, 1.0], 2) == [[1, 4], [0, 2, 3]]


def test_quiet_sub_batches_cost_less():
    """A sub-batch whose policy runs quiet stretches costs QUIET_SHARE of its lanes; one
    that runs every step (las, not quiet in the registry), its lanes."""
    settings = [Settings("vtc", kv_budget=64), Settings("las", kv_budget=64)]
    config = dataclasses.replace(_vtc_config(), policies=("vtc", "las"))
    vtc, las = (policy_groups.policy_config(config, p, [s]) for p, s in zip(config.policies, settings))
    assert policy_groups.sub_batch_cost(vtc, 10) == 10 * policy_groups.QUIET_SHARE
    assert policy_groups.sub_batch_cost(las, 10) == 10


def _two_devices():
    """A mesh-like object of two devices (the one CPU device twice: the sub-batches still
    run a thread each, on meshes of one device)."""
    cpu = jax.local_devices()[0]
    return types.SimpleNamespace(devices=np.asarray([cpu, cpu], dtype=object))


def test_sub_batches_run_a_device_each_at_once():
    """With as many sub-batches as devices, each runs on a mesh of one device, in a thread
    of its own: the carry is the one of the sub-batches run one after another, leaf by
    leaf, and progress adds up."""
    traffic = overload([0.5, 0.25], 60)
    settings = [Settings(p, kv_budget=1024) for p in ("vtc", "las", "drr", "vtc", "las")]
    seeds = [0, 1, 2, 3, 4]
    config = run_mod.traffic_config([traffic] * 5, settings, measures=MeasureConfig.of(["latency"]))
    workload = run_mod.with_timeline(run_mod.generate_workloads(run_mod._traffic_sources([traffic] * 5), seeds, config),
                                     batched=True)
    params, _ = encode_settings(settings, 2, config.policies)
    batch = EngineBatch(lane=LaneInput(params=params, horizon=jax.numpy.full(5, 60, jax.numpy.int32)), workload=workload)
    calls, reports = [], []

    def run_in_tiers(config, batch, shared, **kwargs):
        calls.append((config.policies, kwargs["mesh"].devices.size, threading.get_ident()))
        return tiers.run_in_tiers(config, batch, shared, **kwargs)

    def regrouped(**kwargs):
        return policy_groups.run(run_in_tiers, config, settings, batch, None, regroup=True, event_budget=4096, **kwargs)

    at_once, done = regrouped(mesh=_two_devices(), progress=lambda *r: reports.append(r))
    assert sorted(c[0] for c in calls) == [("drr",), ("las",), ("vtc",)]
    assert all(c[1] == 1 for c in calls) and len({c[2] for c in calls}) == 2
    calls.clear()
    in_turn, done_in_turn = regrouped()  # this process's one CPU device: one after another
    assert len({c[2] for c in calls}) == 1
    assert done.all() and done_in_turn.all()
    for a, b in zip(jax.tree_util.tree_leaves(at_once), jax.tree_util.tree_leaves(in_turn)):
        np.testing.assert_array_equal(a, b)
    assert reports and [r[0] for r in reports] == sorted(r[0] for r in reports)


def test_a_failed_sub_batch_stops_the_others():
    """A sub-batch that fails is the batch's error; the others stop at their next call."""
    calls = []

    def run_batch(config, batch, shared, *, progress, **kwargs):
        if config.policies == ("las",):
            raise ValueError("broken")
        for i in range(200):
            time.sleep(0.01)
            calls.append(i)
            progress(i, 200, 0.0)
        return "host", np.ones(1, bool)

    settings = [Settings("vtc", kv_budget=64), Settings("las", kv_budget=64)]
    config = dataclasses.replace(_vtc_config(), policies=("vtc", "las"))
    with pytest.raises(ValueError, match="broken"):
        policy_groups._run_sub_batches(
            lambda i, mesh, report: run_batch(policy_groups.policy_config(config, config.policies[i], settings[i:i + 1]),
                                              None, None, progress=report), [1, 1], _two_devices(), None)
    assert len(calls) < 200
