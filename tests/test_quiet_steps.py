"""Quiet steps (vtc_jax/engines/quiet.py): a FINISH event that also runs the decode-only
steps up to the next completion gives the same integers as one event per step, every
result field, on random saturated lanes; and the literal reference agrees with it."""

from __future__ import annotations

import dataclasses
import random

import jax
import numpy as np
import pytest

from vtc_jax import run_traces
from vtc_jax.engines import quiet
from vtc_jax.engines.engine_config import EngineConfig
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.policies import registry
from vtc_jax.servers import completions, ideal
from vtc_jax.servers.base import ServerShape
from vtc_jax.testing.lanes import random_lanes, run_reference

QUIET_POLICIES = ("fcfs", "lcf", "vtc")
MEASURES = MeasureConfig(pair_drift=True, latency=True)


def _saturated(seed: int, num_clients: int, count: int = 16, max_arrival: int = 30, limits: bool = True):
    """Random traces whose outputs outlast their arrivals: memory fills, queues stay.
    Without `limits` no lane has an rpm limit or bands, so the engine may also use the
    policy's candidate (not only the smallest head) to find stretches."""
    adjust = None if limits else (lambda rng, s, reqs: dataclasses.replace(s, rpm_limit=None, rpm_mode="delay", bands=None))
    return random_lanes(random.Random(seed), count, num_clients=num_clients, policies=QUIET_POLICIES,
                        every_policy=True, num_requests=(8, 40), max_arrival=max_arrival, max_output=40,
                        adjust=adjust)


def _assert_same_results(a, b, context: str, skip=("events",)) -> None:
    """Every field of two LaneResults equal, except those in `skip`."""
    for field in dataclasses.fields(a):
        if field.name in skip:
            continue
        x, y = getattr(a, field.name), getattr(b, field.name)
        if x is None or y is None:
            assert x is None and y is None, f"{context}: {field.name}"
        elif isinstance(x, (np.ndarray, list, int, float, str)):
            np.testing.assert_array_equal(x, y, err_msg=f"{context}: {field.name}")
        else:  # a pytree (the final server state): leaf by leaf
            for u, v in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y), strict=True):
                np.testing.assert_array_equal(u, v, err_msg=f"{context}: {field.name}")


MODES = ("drain", "fixed", "burst", "checkpoints")


# From K = 8 (policies.base.SCATTER_CLIENTS) a stretch gathers its entries' clients.
@pytest.mark.parametrize("num_clients,mode", [(k, m) for k in (1, 2, 3, 5) for m in MODES] + [(9, "burst"), (9, "fixed")])
def test_quiet_stretches_give_every_result_of_step_by_step(num_clients, mode):
    """"fixed" cuts runs while requests still arrive (arrivals at the horizon never join),
    with rpm limits and bands in some lanes; "burst" packs arrivals into 6 steps taken one
    per event, so events begin with arrivals pending (which a stretch must leave to the
    arrival event and its lift); "checkpoints" records W every 3 steps (stretches end on a
    checkpoint's step); "drain", "burst" and "checkpoints" have no limits (the candidate
    rule)."""
    lanes = _saturated(500 + 10 * num_clients + len(mode), num_clients, max_arrival=6 if mode == "burst" else 30,
                       limits=mode == "fixed")
    steps = 17 if mode == "fixed" else None
    every = 3 if mode == "checkpoints" else 0
    run = lambda window: run_traces(lanes.traces, lanes.settings, num_clients=num_clients, steps=steps,  # noqa: E731
                                    measures=MEASURES, quiet_window=window, record_every=every,
                                    arrival_width=1 if mode == "burst" else 4)
    each_step = run(0)
    for window in (2, 5, quiet.WINDOW):
        bulk = run(window)
        assert bulk.finished.all()
        _assert_same_results(bulk, each_step, f"K={num_clients} {mode} window {window}")
        assert bulk.events.sum() < each_step.events.sum()  # stretches were taken
    assert (run(16).events < each_step.events).mean() > 0.3


def test_quiet_stretches_match_the_reference():
    lanes = _saturated(7, 3, count=24)
    result = run_traces(lanes.traces, lanes.settings, num_clients=3, steps=45, measures=MEASURES)
    for lane, (reqs, s) in enumerate(zip(lanes.requests, lanes.settings)):
        expect = run_reference(reqs, 3, s, 45)
        context = f"lane {lane}: {s}"
        assert list(result.service_exact[lane]) == expect.service[-1], context
        assert list(result.counters_exact[lane]) == expect.counters[-1], context
        assert list(result.admitted[lane]) == expect.admitted, context
        assert list(result.completed[lane]) == expect.completed, context
        drifts = [max(row) - min(row) for row in expect.service]
        assert result.max_drift_exact[lane] == max(drifts), context
        assert result.max_drift_step[lane] == drifts.index(max(drifts)), context


def test_wide_numbers_take_the_same_stretches():
    lanes = _saturated(11, 2, count=12)
    narrow = run_traces(lanes.traces, lanes.settings, num_clients=2, measures=MEASURES)
    wide = run_traces(lanes.traces, lanes.settings, num_clients=2, measures=MEASURES, wide=True)
    units = ("service_units", "counter_units", "drift_units", "pair_units", "number_format")  # the formats' own
    _assert_same_results(narrow, wide, "wide", skip=units)
    np.testing.assert_array_equal(narrow.events, wide.events)


def test_window_is_off_where_a_feature_acts_per_step():
    base = EngineConfig(num_clients=2, num_rows=8, calendar_rows=8, slots=4, measures=MEASURES)
    assert quiet.window(base) == quiet.WINDOW
    off = [dict(policies=("vtc", "drr")), dict(estimator=True), dict(arrival_rows=True),
           dict(measures=MeasureConfig(ledger=True)), dict(measures=MeasureConfig(occupancy=True)),
           dict(measures=MeasureConfig(share=True)), dict(measures=MeasureConfig(resource=True)),
           dict(server="ideal_reserve"), dict(server="vllm"), dict(quiet_window=0)]
    for change in off:
        assert quiet.window(dataclasses.replace(base, **change)) == 0, change
    assert quiet.window(dataclasses.replace(base, rpm=True, kv_cap=True, bands=True)) == quiet.WINDOW
    assert quiet.window(dataclasses.replace(base, record_every=3, num_checkpoints=9)) == quiet.WINDOW
    stepping = dataclasses.replace(registry.get("fcfs"), name="fcfs_stepping", on_step=lambda s, v, e, p: s)
    with registry.provisionally(stepping):  # a quiet policy given a step hook is never run in bulk
        assert quiet.window(dataclasses.replace(base, policies=("fcfs_stepping",))) == 0
    with pytest.raises(ValueError):
        quiet.window(dataclasses.replace(base, quiet_window=65))


def _server_after(admitted):
    """An ideal server (K = 2, 8 calendar rows) with (client, prompt, output, step) admitted."""
    import jax.numpy as jnp

    state = ideal.init(ServerShape(num_clients=2, calendar_rows=8, slots=4, num_rows=8, log_steps=0, static=()))
    for client, prompt, output, step in admitted:
        row = jnp.asarray([step, 0, prompt, output, 0], jnp.int32)
        state, _ = ideal.admit(state, None, row, jnp.int32(client), jnp.int32(0), jnp.int32(step), jnp.bool_(True))
    return state


def test_ideal_quiet_steps_hand_worked():
    """Two requests admitted at step 0 finish at the ends of steps 3 and 5 (outputs 4 and 6)."""
    import jax.numpy as jnp

    class P:
        kv_budget = jnp.int32(20)

    state = _server_after([(0, 5, 4, 0), (1, 7, 6, 0)])  # context 12 held
    # At step 0: rows 0, 1, 2 are empty, row 3 holds the first completion.
    assert int(ideal.quiet_steps(state, P, 0, 9, 8)) == 3  # 12 + 9 > 20: nothing fits
    assert int(ideal.quiet_steps(state, P, 0, 8, 8)) == 0  # 12 + 8 fits now
    assert int(ideal.quiet_steps(state, P, 0, 9, 2)) == 2  # the limit
    assert int(ideal.quiet_steps(state, P, 3, 9, 8)) == 0  # a completion ends step 3
    assert int(ideal.quiet_steps(state, P, 4, 9, 8)) == 1  # row 4 empty, row 5 not
    after, work = ideal.run_quiet(state, P, jnp.int32(3))
    assert list(map(int, after.context)) == [8, 10]
    assert list(map(int, work.decoded)) == [3, 3]
    assert list(map(int, work.attended)) == [5 * 3 + 3, 7 * 3 + 3]  # prompt + 0, + 1, + 2
    assert int(work.elapsed) == 3
    assert completions.due(after.calendar, jnp.int32(4)) == completions.due(state.calendar, jnp.int32(4))


def test_a_saturated_server_takes_far_fewer_events_than_steps():
    """Two clients always backlogged, one long-running request at a time: about one event
    per completion, not one per step."""
    from vtc_jax.engines.settings import Settings
    from vtc_jax.inputs.workload import Trace

    n = 40
    trace = Trace(arrival=np.zeros(n, np.int64), client=np.arange(n) % 2, prompt=np.full(n, 6, np.int64),
                  output=np.full(n, 50, np.int64), cached=np.zeros(n, np.int64))
    out = run_traces([trace], [Settings("vtc", 10)], num_clients=2, steps=1000, measures=MEASURES)
    assert int(out.completed.sum()) == 20  # one at a time, 50 steps each
    assert int(out.events[0]) < 1000 // 16 + 3 * 20 + 5
