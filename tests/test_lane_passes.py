"""A chunk whose lanes share their seeds' requests, run as one pass per setting
(driver/lane_passes.py): every result field as when the chunk runs whole, the passes it
is split into, their streams' counts computed once per distinct input, and the sweep
driver's chunks sized in seeds when they pay."""

from __future__ import annotations

import types

import numpy as np

from vtc_jax import Settings
from vtc_jax.driver import lane_passes
from vtc_jax.driver import run as run_mod
from vtc_jax.driver import sweep as sweep_mod
from vtc_jax.driver.devices import lane_mesh
from vtc_jax.inputs import sources
from vtc_jax.inputs.traffic import overload
from vtc_jax.inputs.workload import Trace
from vtc_jax.measures.online import MeasureConfig
from tests.test_policy_groups import assert_same_results


def _run(monkeypatch, passes: bool, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` with passes forced on (from one lane a device) or off, and
    the passes the chunk was split into (None: run whole)."""
    planned = []
    plan = lane_passes.plan

    def recording(keys, distinct, mesh):
        planned.append(plan(keys, distinct, mesh))
        return planned[-1]

    with monkeypatch.context() as patch:
        patch.setattr(lane_passes, "PASS_LANES_PER_DEVICE", 1 if passes else 1 << 30)
        patch.setattr(lane_passes, "plan", recording)
        return fn(*args, **kwargs), planned


def _seed_major(settings, seeds):
    """Lanes (setting, seed) in a sweep chunk's order: whole seeds of every setting."""
    lanes = [(s, seed) for seed in seeds for s in settings]
    return [s for s, _ in lanes], [seed for _, seed in lanes]


def test_passes_equal_the_whole_chunk(monkeypatch):
    """KV budgets, policies, an rpm limit that rejects and one that delays, KV caps and a
    second policy: every field of every lane as in the whole chunk, lanes back in order."""
    rows = [Settings("vtc", kv_budget=1024), Settings("vtc", kv_budget=4096), Settings("fcfs", kv_budget=2048),
            Settings("rpm", kv_budget=2048, rpm_limit=3, rpm_window=11, rpm_mode="reject"),
            Settings("rpm", kv_budget=2048, rpm_limit=2, rpm_window=7), Settings("vtc", kv_budget=2048,
                                                                               kv_cap=(1500, 2048))]
    settings, seeds = _seed_major(rows, range(4))
    traffic = overload([0.5, 0.25], 120)
    kwargs = dict(measures=MeasureConfig.of(["latency", "ledger", "pair_drift", "demand"]), record_every=16)
    whole, plans = _run(monkeypatch, False, run_mod.simulate_traffic, [traffic] * len(settings), settings, seeds,
                        **kwargs)
    assert plans == [None]
    split, plans = _run(monkeypatch, True, run_mod.simulate_traffic, [traffic] * len(settings), settings, seeds,
                        **kwargs)
    assert [p.tolist() for p in plans[0]] == [list(range(r, len(settings), len(rows))) for r in range(len(rows))]
    assert_same_results(split, whole)
    assert whole.finished.all() and (whole.rejected.sum(axis=1)[3::6] > 0).any()


def test_drained_trace_with_repeated_seeds(monkeypatch):
    """A drained trace (lanes end at their own last completion, so a pass's checkpoint
    rows differ from the chunk's until collected whole) with phases redrawn per seed, and
    a pass that reads one seed twice (its requests gathered, not the generated rows)."""
    rng = np.random.default_rng(5)
    n = 40
    trace = Trace.from_rows([(int(a), int(c), int(p), int(o)) for a, c, p, o in zip(
        np.sort(rng.integers(0, 60, n)), rng.integers(0, 3, n), rng.integers(8, 200, n), rng.integers(1, 40, n))])
    src = sources.TraceSource(trace, num_clients=3, horizon=4000, phase_unit=8, drain=True)
    rows = [Settings("vtc", kv_budget=256), Settings("vtc", kv_budget=1024), Settings("drr", kv_budget=512)]
    settings, seeds = _seed_major(rows, [0, 1, 2, 1])
    kwargs = dict(measures=MeasureConfig.of(["latency", "demand"]), record_every=8)
    whole, _ = _run(monkeypatch, False, run_mod.simulate_sources, [src] * len(settings), settings, seeds, **kwargs)
    split, plans = _run(monkeypatch, True, run_mod.simulate_sources, [src] * len(settings), settings, seeds,
                        **kwargs)
    assert len(plans[0]) == 3
    assert_same_results(split, whole)
    assert whole.finished.all() and len(set(whole.steps.tolist())) > 1


def test_streams_counted_once_per_distinct_costs(monkeypatch):
    """Passes that differ only in M read equal counts: computed once; a pass with other
    costs (w_q) gets its own."""
    calls = []
    count = run_mod.lane_workload_stats
    monkeypatch.setattr(run_mod, "lane_workload_stats", lambda *a, **k: calls.append(1) or count(*a, **k))
    rows = [Settings("vtc", kv_budget=m) for m in (1024, 2048, 4096)] + [Settings("vtc", kv_budget=1024, w_q=3)]
    settings, seeds = _seed_major(rows, range(3))
    traffic = overload([0.5, 0.25], 60)
    split, _ = _run(monkeypatch, True, run_mod.simulate_traffic, [traffic] * len(settings), settings, seeds)
    assert len(calls) == 2
    whole, _ = _run(monkeypatch, False, run_mod.simulate_traffic, [traffic] * len(settings), settings, seeds)
    assert_same_results(split, whole)


def _fake_mesh(platform: str, devices: int):
    return types.SimpleNamespace(devices=np.asarray([types.SimpleNamespace(platform=platform)] * devices))


def test_plan():
    mesh = _fake_mesh("cpu", 2)
    many = lane_passes.PASS_LANES_PER_DEVICE * 2  # seeds: a pass of `many` lanes fills 2 devices
    keys = ["a", "b"] * many  # seed-major: two settings of each seed
    passes = lane_passes.plan(keys, many, mesh)
    assert [p.tolist() for p in passes] == [list(range(0, 2 * many, 2)), list(range(1, 2 * many, 2))]
    assert lane_passes.plan(keys, 2 * many, mesh) is None  # no lane shares a workload
    assert lane_passes.plan(["a"] * 2 * many, many, mesh) is None  # one setting: the chunk is one pass
    assert lane_passes.plan(keys[:-2], many - 1, mesh) is None  # a pass would not fill the devices
    assert lane_passes.plan(keys, many, _fake_mesh("gpu", 2)) is None  # passes add up events on a GPU


def test_join_puts_lanes_back_in_order():
    parts = [{"x": np.asarray([10, 30]), "y": np.asarray([[1, 1], [3, 3]])},
             {"x": np.asarray([20]), "y": np.asarray([[2, 2]])}]
    out = lane_passes.join(parts, [np.asarray([0, 2]), np.asarray([1])], 3)
    assert out["x"].tolist() == [10, 20, 30] and out["y"].tolist() == [[1, 1], [2, 2], [3, 3]]


def _kv_sweep(budgets, steps=80):
    src = sources.TrafficSource(overload([0.5, 0.25], steps))
    rows = [sweep_mod.Row(Settings("vtc", kv_budget=m), src, f"M={m}") for m in budgets]
    return sweep_mod.Sweep(name="passes", config={}, rows=rows, metrics=sweep_mod.base_metrics, columns=("max_drift",))


def test_sweep_chunks_sized_in_seeds(monkeypatch):
    """With passes, a chunk holds whole seeds of every row and a compiled call one row's
    seeds (the `chunk` reported); every lane's values as with chunks sized in lanes."""
    sweep = _kv_sweep([512, 1024, 2048])
    with monkeypatch.context() as patch:
        patch.setattr(lane_passes, "PASS_LANES_PER_DEVICE", 1 << 30)
        whole = sweep_mod.evaluate(sweep, range(5), chunk=4, devices=1)
    calls = []
    run = run_mod.simulate_sources
    with monkeypatch.context() as patch:
        patch.setattr(lane_passes, "PASS_LANES_PER_DEVICE", 1)
        patch.setattr(run_mod, "simulate_sources", lambda srcs, *a, **k: calls.append(len(srcs)) or run(srcs, *a, **k))
        split = sweep_mod.evaluate(sweep, range(5), chunk=4, devices=1)
    assert whole.chunk == 4 and split.chunk == 4
    assert calls == [12, 12]  # 4 seeds x 3 rows a chunk, the last one's seeds repeated
    for name in whole.metrics:
        np.testing.assert_array_equal(split.metrics[name], whole.metrics[name], err_msg=name)
    np.testing.assert_array_equal(split.finished, whole.finished)


def test_pass_seeds(monkeypatch):
    config = sweep_mod.MODEL_ENGINE.config(_kv_sweep([512, 1024]).rows, 0, MeasureConfig())
    mesh = lane_mesh(1)
    assert sweep_mod.MODEL_ENGINE.pass_seeds(config, 100, 2, None, mesh) is None  # 100 < 128 lanes
    assert sweep_mod.MODEL_ENGINE.pass_seeds(config, 300, 2, None, mesh) == 300
    assert sweep_mod.MODEL_ENGINE.pass_seeds(config, 3000, 2, None, mesh) == sweep_mod.CPU_CHUNK_LANES
    assert sweep_mod.MODEL_ENGINE.pass_seeds(config, 3000, 2, 200, mesh) == 200
    lane = sweep_mod.MODEL_ENGINE.lane_bytes(config)
    state = lane - 2 * 4 * sweep_mod.NUM_WORDS * config.num_rows
    monkeypatch.setattr(sweep_mod, "available_bytes", lambda mesh: 2 * 300 * lane)
    # half the memory holds 300 lanes running, or the state of 2 rows x 292 lanes kept
    assert sweep_mod.MODEL_ENGINE.pass_seeds(config, 3000, 2, None, mesh) == min(300, 300 * lane // (2 * state)) == 292
    monkeypatch.setattr(sweep_mod, "available_bytes", lambda mesh: 2 * 100 * lane)
    assert sweep_mod.MODEL_ENGINE.pass_seeds(config, 3000, 2, None, mesh) is None  # 97 seeds a chunk: < 128
