"""Inputs tell the truth: a trace's seed 0 is the trace, no request vanishes between the
trace and the engine, the order of a file's rows is no input, and errors name the file."""

from __future__ import annotations

import numpy as np
import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.driver import run
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs import sources
from vtc_jax.inputs.workload import ARRIVAL, INT32_MAX, Trace, layout_trace, make_workload, read_trace_csv

# 2 clients, 10 requests, distinct arrivals (so any row order has one (arrival, number) order).
ROWS = [(0, 0, 40, 6), (3, 1, 30, 4), (5, 0, 20, 5), (9, 1, 50, 3), (14, 0, 10, 7),
        (17, 1, 25, 2), (21, 0, 35, 4), (26, 1, 15, 6), (30, 0, 45, 3), (41, 1, 20, 5)]
BIG_UNIT = 1 << 20  # one window holds the whole trace: a redraw may move any request anywhere in it
M = 128


def _trace(rows=ROWS) -> Trace:
    return Trace.from_rows(rows)


def _source(trace: Trace, unit: int, drain: bool = True) -> sources.TraceSource:
    horizon = run.server_drain(trace, Settings(), "ideal")
    return sources.TraceSource(trace, num_clients=2, horizon=horizon, phase_unit=unit, drain=drain)


def _lanes(src: sources.TraceSource, seeds) -> tuple[np.ndarray, int]:
    """(int32[B, R, 5] each seed's generated blocks, the padding rows per block)."""
    settings = [Settings(policy="fcfs", kv_budget=M)] * len(seeds)
    config = run.source_config([src] * len(seeds), settings)
    return np.asarray(run.generate_workloads([src] * len(seeds), seeds, config).requests), config.arrival_width + 1


@pytest.mark.parametrize("unit", [7, BIG_UNIT])
def test_seed0_is_the_trace_whatever_the_phase_unit(unit):
    """Seed 0 lays out exactly the trace's rows; other seeds redraw, never past the last arrival."""
    trace = _trace()
    lanes, pad = _lanes(_source(trace, unit), [0, 1, 2])
    assert (lanes[0] == layout_trace(trace, 2, pad)).all()
    arrivals = lanes[1:, :, ARRIVAL]
    real = arrivals != INT32_MAX
    assert (real.sum(axis=1) == len(trace)).all()  # every request is in every lane
    assert (arrivals[real] <= trace.arrival.max()).all()
    assert (lanes[1] != lanes[0]).any()  # a redraw did move requests


def test_unsorted_trace_gives_the_sorted_lanes():
    """The same requests in another row order give the same lanes, every seed (the redraw
    belongs to a request, not to a row of the file)."""
    shuffled = [ROWS[i] for i in np.random.default_rng(3).permutation(len(ROWS))]
    a, _ = _lanes(_source(_trace(), 8), [0, 1, 2, 5])
    b, _ = _lanes(_source(_trace(shuffled), 8), [0, 1, 2, 5])
    assert (a == b).all()


def test_redraws_past_the_trace_all_arrive_and_complete():
    """Drained lanes under any redraw: every request arrives and completes (a redraw past
    the drain horizon vanished uncounted), and seed 0 is the plain replay."""
    trace = _trace()
    src = _source(trace, BIG_UNIT)
    seeds = [0, 1, 2, 3]
    settings = [Settings(policy="fcfs", kv_budget=M)] * len(seeds)
    result = run.simulate_sources([src] * len(seeds), settings, seeds)
    assert result.finished.all()
    assert (result.arrived.sum(axis=1) == len(trace)).all() and (result.completed.sum(axis=1) == len(trace)).all()
    plain = run.replay(trace, Settings(policy="fcfs", kv_budget=M), num_clients=2)
    assert (result.service_exact[0] == plain.service_exact[0]).all() and result.steps[0] == plain.steps[0]


def test_drained_lane_with_a_request_that_never_arrives_is_flagged():
    """Conservation in drain mode: a request in the blocks that never arrives (here its
    arrival is past the lane's request count) leaves the lane unfinished, not averaged in."""
    trace = _trace()
    settings = [Settings(policy="fcfs", kv_budget=M)]
    config, horizons, budget, expected = run.plan_lanes([trace], settings, 2, None, 0)
    # num_requests counts arrivals before step 20: the engine stops once those completed.
    workload = make_workload(trace, 2, config.arrival_width + 1, 20)
    result = run.run_workloads(workload, settings, horizons, config=config, shared=True, event_budget=budget,
                               expected_events=expected)
    assert result.arrived.sum() < len(trace)
    assert not result.finished[0]


def test_drained_source_horizon_must_pass_the_last_arrival():
    trace = _trace()
    with pytest.raises(InputError, match="must pass the trace's last arrival 41"):
        sources.TraceSource(trace, num_clients=2, horizon=41, drain=True)


def test_prompt_over_m_names_the_file(tmp_path):
    """validate_fits names the file and the line of the request that can never be admitted."""
    path = tmp_path / "big.csv"
    path.write_text("arrival,client,prompt,output\n0,0,10,2\n1,1,500,2\n")
    trace = read_trace_csv(path)
    with pytest.raises(InputError) as err:
        run.replay(trace, Settings(policy="fcfs", kv_budget=M))
    assert str(err.value).startswith(f"{path}: line 3: prompt 500 is larger than the KV budget M={M}"), str(err.value)
    path.write_text("arrival,client,prompt,output\n0,0,0,2\n")  # read errors name it once
    with pytest.raises(InputError) as err:
        read_trace_csv(path)
    assert str(err.value).startswith(f"{path}: line 2: prompt must be >= 1") and str(err.value).count(str(path)) == 1


def test_phase_unit_bounded_so_window_ends_fit_int32():
    with pytest.raises(InputError, match=r"phase unit must be in \[1, 1073741823\] steps, got 2147483648"):
        sources.TraceSource(_trace(), num_clients=2, horizon=100, phase_unit=1 << 31)
