"""The server component: the registry, the engine driving a server it does not know by
name (a user's server from examples/my_server.py), and hand-worked cases."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vtc_jax import InputError, Settings, Trace, replay
from vtc_jax.servers import registry as servers
from vtc_jax.servers.base import Server

ROOT = Path(__file__).resolve().parents[1]


def _example_server() -> Server:
    spec = importlib.util.spec_from_file_location("my_server_example", ROOT / "examples" / "my_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SERVER


def test_registry_lists_ideal_first_and_refuses_unknown_names():
    assert servers.names()[0] == "ideal"
    assert all(isinstance(servers.get(n), Server) for n in servers.names())
    with pytest.raises(InputError, match="unknown server 'nope'; choose one of ideal"):
        servers.get("nope")
    trace = Trace.from_rows([(0, 0, 10, 3)])
    with pytest.raises(InputError, match="unknown server"):
        replay(trace, Settings(policy="fcfs", kv_budget=100), steps=3, server="nope")


def test_register_refuses_a_second_server_under_a_taken_name():
    import dataclasses

    with pytest.raises(InputError, match="already registered"):
        servers.register(dataclasses.replace(servers.get("ideal"), description="another"))


def test_a_users_server_runs_in_the_engine_unchanged():
    """examples/my_server.py: one seat. Two requests of one client at step 0 (prompt 10,
    outputs 3 and 2), M = 1000. Hand-worked: the first runs steps 0-2 and leaves at the
    end of step 2; the second is admitted at step 3 and leaves at the end of step 4. The
    ideal server runs both from step 0 (both done by the end of step 2)."""
    server = _example_server()
    if server.name not in servers.names():
        servers.register(server)
    trace = Trace.from_rows([(0, 0, 10, 3), (0, 0, 10, 2)])
    settings = Settings(policy="fcfs", kv_budget=1000)
    for steps, one_seat, ideal in ((3, 1, 2), (4, 1, 2), (5, 2, 2)):
        seat = replay(trace, settings, steps=steps, server="one_seat")
        free = replay(trace, settings, steps=steps, server="ideal")
        assert seat.completed.tolist() == [[one_seat]] and free.completed.tolist() == [[ideal]], steps
    # Service (w_p = 1, w_q = 2: prompts charged at admission, 2 per decoded token): at
    # T = 3 one prompt and 3 tokens on one seat (16), both prompts and 5 tokens on the
    # ideal server (30); at T = 5 both servers have done everything (30).
    for steps, one_seat, ideal in ((3, 16, 30), (5, 30, 30)):
        assert replay(trace, settings, steps=steps, server="one_seat").service.tolist() == [[one_seat]]
        assert replay(trace, settings, steps=steps, server="ideal").service.tolist() == [[ideal]]
