"""Every registered policy on every registered server: the two registries are the one list
of names, so a new policy or server is run here without touching this file.

On every (policy, server) pair, random small lanes must drain (every request completes),
conserve requests (arrived = waiting + running + completed, the server's own structure
counted separately from the engine's counters) and charge exactly the tokens processed
(service = w_p x prompt + w_q x decoded + beta x attended context, from a separate ledger).
Exactness against a literal reference is checked where one exists: every policy on `ideal`
(tests/test_engine_exact.py), vLLM's own orders on `vllm` (tests/test_vllm_server.py),
`ideal_reserve` hand-worked and by property (tests/test_bounded_memory.py)."""

from __future__ import annotations

import dataclasses
import random
import zlib

import pytest

from vtc_jax import POLICIES, InputError
from vtc_jax.driver.run import run_traces
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.servers import registry as servers
from vtc_jax.testing.lanes import random_lanes

LANES = 12


def _lanes(policy: str, server_name: str, seed: int):
    rng = random.Random(seed)
    server = servers.get(server_name)
    # M holds any one request whole (prompt + output), so every server can serve every lane
    # (a server that reserves the output refuses a larger request before the run).
    roomy = lambda rng, s, reqs: dataclasses.replace(s, kv_budget=max(s.kv_budget, max(r.prompt + r.output for r in reqs)))
    lanes = random_lanes(rng, LANES, num_clients=3, policies=[policy], num_requests=(1, 12), adjust=roomy)
    out = []
    for trace, s in zip(lanes.traces, lanes.settings):
        options = server.fuzz_options(rng, trace.prompt, trace.output) if server.fuzz_options else {}
        if server.preempts:  # limits are not defined on a server that preempts (refused: see below)
            s = dataclasses.replace(s, rpm_limit=None, rpm_mode="delay", kv_cap=None)
        out.append((trace, dataclasses.replace(s, server_options=tuple(sorted(options.items())))))
    return out


def _runnable(policy: str, server: str) -> bool:
    return not (servers.get(server).preempts and policy == "rpm")  # limits are refused on a server that preempts


@pytest.mark.parametrize("server", [s for s in servers.names() if servers.get(s).preempts])
def test_rpm_is_refused_on_a_server_that_preempts(server):
    with pytest.raises(InputError, match="preempts"):
        lanes = _lanes("fcfs", server, 1)
        run_traces([lanes[0][0]], [dataclasses.replace(lanes[0][1], policy="rpm", rpm_limit=2)],
                   num_clients=3, server=server)


@pytest.mark.parametrize("server", servers.names())
def test_every_policy_drains_and_conserves_on_every_server(server):
    """Every policy's lanes in one batch per server (the engine dispatches on each lane's
    policy), so a server costs one compile, not one per policy."""
    lanes, names = [], []
    for policy in POLICIES:
        if _runnable(policy, server):
            mine = _lanes(policy, server, seed=zlib.crc32(f"{policy}@{server}".encode()))
            lanes += mine
            names += [policy] * len(mine)
    traces, settings = [t for t, _ in lanes], [s for _, s in lanes]
    result = run_traces(traces, settings, num_clients=3, server=server, measures=MeasureConfig.of(["ledger"]))
    for lane in range(len(lanes)):
        context = f"{names[lane]} on {server}, lane {lane}: {settings[lane]} (M={settings[lane].kv_budget})"
        assert result.finished[lane], context
        assert result.completed[lane].sum() + result.rejected[lane].sum() == len(traces[lane]), context
        assert result.conservation[lane] == [], (context, result.conservation[lane])
