"""The runner's tail: calls sized by the program's estimate of the events its lanes have
left (LaneProgram.events_left) end near the slowest lane and change no result; and the
engine's estimate itself."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.driver import runner
from vtc_jax.engines import engine
from vtc_jax.engines.program import LaneProgram


def _counting(events_left):
    """Lanes that count to their own stop (int32[] batched), one per event."""
    def init(config, batched, shared):
        return {"n": jnp.zeros((), jnp.int32), "stop": batched}

    def step(carry, batched, shared, config):
        return {"n": carry["n"] + (carry["n"] < carry["stop"]), "stop": carry["stop"]}

    return LaneProgram("count", init, step, lambda c: c["n"] >= c["stop"], events_left=events_left)


@pytest.mark.parametrize("estimate", ["exact", "low", "high"])
def test_tail_calls_stop_near_the_slowest_lane_and_change_nothing(estimate):
    """With an estimate (exact, too low by half, or 3x too high), the same carry as without
    one, and the last call ends at most MIN_TAIL_EVENTS past the slowest lane when the
    estimate is exact or low, less than a third of the way past when it is 3x too high
    (each call runs half the estimate; without one, the run goes on to the end of its
    chunk)."""
    scale = {"exact": 1.0, "low": 0.5, "high": 3.0}[estimate]
    left = lambda c: jnp.where(c["n"] >= c["stop"], 0, jnp.ceil((c["stop"] - c["n"]) * scale).astype(jnp.int32))  # noqa: E731
    stops = jnp.asarray([700, 1234, 5], jnp.int32)
    spent = {}
    hosts = {}
    for name, program in (("plain", _counting(None)), ("tail", _counting(left))):
        seen = []
        host, done = runner.run(program, None, stops, None, event_budget=100_000, chunk=1024,
                                progress=lambda s, e, t, seen=seen: seen.append(s))
        hosts[name], spent[name] = (np.asarray(host["n"]).tolist(), np.asarray(done).tolist()), seen[-1]
    assert hosts["plain"] == hosts["tail"] == ([700, 1234, 5], [True, True, True])
    assert spent["plain"] == 64 + 256 + 1024  # calls grow 4x to a whole chunk, far past 1234
    if estimate != "high":
        assert 1234 <= spent["tail"] <= 1234 + runner.MIN_TAIL_EVENTS
    else:
        assert 1234 <= spent["tail"] < 1234 + 1234 // 3
    assert spent["tail"] <= spent["plain"]


def test_next_call_events_is_capped_by_the_estimate():
    assert runner.next_call_events(256, 0.0, 1024, first=False) == 1024
    assert runner.next_call_events(256, 0.0, 1024, first=False, left=160) == 80
    assert runner.next_call_events(256, 0.0, 1024, first=False, left=161) == 81
    assert runner.next_call_events(256, 0.0, 1024, first=False, left=40) == runner.MIN_TAIL_EVENTS
    assert runner.next_call_events(256, 0.0, 1024, first=False, left=0) == runner.MIN_TAIL_EVENTS
    assert runner.next_call_events(256, 0.0, 1024, first=False, left=10**9) == 1024


def test_engine_events_left_estimate():
    """Steps to the horizon at the lane's events per step so far; 0 once done."""
    def state(step, horizon, iterations, done=False):
        return type("S", (), {"step": jnp.int32(step), "horizon": jnp.int32(horizon),
                              "iterations": jnp.int32(iterations), "done": jnp.bool_(done)})

    assert int(engine.events_left(state(100, 1000, 149))) == 1350  # 900 steps x 1.5
    assert int(engine.events_left(state(0, 10, 0))) == 10
    assert int(engine.events_left(state(1000, 1000, 1200))) == 0
    assert int(engine.events_left(state(5, 1000, 7, done=True))) == 0
    assert int(engine.events_left(state(1, 2**31 - 1, 10**6))) == 1 << 30  # capped: no wrap
    assert jax.numpy.asarray(engine.events_left(state(1, 5, 1))).dtype == jnp.int32
