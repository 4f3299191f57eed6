"""The fleet: vLLM replicas (a server that preempts, with its own requeue and clock) behind
the cluster's gateway (vtc_jax/engines/cluster.py), against the one-server engine, which
the vLLM goldens and the literal reference pin (tests/test_vllm_server.py).

- One replica behind one router with room for everything is one vllm server, request
  for request: per tenant W, c, admissions, completions; per request its first token,
  finish and preemptions; every engine policy, fcfs and priority victims, random pools
  tight enough to preempt.
- R replicas behind round robin, routed at arrival: the fleet decomposes. Each replica is
  one vllm server on the requests routed to it (its sub-trace, in dispatch order), exact.
Every lane of a test runs in one batch (one compile)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.test_vllm_server import lane_input, random_lane, server_options
from vtc_jax import MeasureConfig, Settings, Trace, run_traces
from vtc_jax.core.rows import ORDER
from vtc_jax.driver.cluster_run import simulate_traces
from vtc_jax.engines.cluster_settings import ClusterSettings, Gateway
from vtc_jax.inputs import prefix_blocks
from vtc_jax.inputs.workload import layout_trace
from vtc_jax.servers import vllm_prefix

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("fcfs", "vtc", "lcf", "drr", "wfq", "sfq", "las")
LANES = 28


def _ints(a) -> list[int]:
    """Per tenant exact ints (a wide array's trailing (high, low) pair joined)."""
    a = np.asarray(a)
    if a.dtype != object and a.ndim == 2 and a.shape[-1] == 2:
        return [int(h) * (1 << 24) + int(lo) for h, lo in a]
    return [int(x) for x in a.ravel()]


def _one_server(traces, settings, k):
    """Per lane: (service, counters, admitted, completed) per tenant, and per request (by
    trace order: rank in (arrival, row) order) its first token, finish and preemptions."""
    res = run_traces(traces, settings, num_clients=k, server="vllm", measures=MeasureConfig())
    assert res.finished.all()
    out = res.server_state.out
    first, finish, pre = (np.asarray(a) for a in (out.first_token, out.finish, out.preemptions))
    lanes = []
    for i, trace in enumerate(traces):
        order = layout_trace(trace, k, 5)[:, ORDER]
        real = order < len(trace)
        per = {int(o): (int(first[i, w]), int(finish[i, w]), int(pre[i, w])) for w, o in zip(np.flatnonzero(real), order[real])}
        lanes.append(((_ints(res.service_units[i]), _ints(res.counter_units[i]), _ints(res.admitted[i]),
                       _ints(res.completed[i])), per))
    return lanes


def _fleet_requests(cl, lane: int, n: int) -> dict:
    """{trace order: (first token, finish, replica, dispatch sequence)} of a fleet lane."""
    rows = cl.rows[lane]
    rec = cl.records[lane]
    got = {}
    for row in np.flatnonzero(rows[:, ORDER] < n):
        got[int(rows[row, ORDER])] = (int(cl.first_token[lane, row]), int(cl.finish[lane, row]), int(rec[row, 1]),
                                      int(rec[row, 2]))
    return got


def _random_lanes(seed: int, count: int):
    rng = np.random.default_rng(seed)
    lanes = []
    for i in range(count):
        reqs, config = random_lane(rng, "fcfs", victim=str(rng.choice(["newest", "policy"])))
        trace, _ = lane_input(reqs, config)
        s = Settings(policy=POLICIES[i % len(POLICIES)], kv_budget=1 << 20,
                     server_options=tuple(server_options(config).items()))
        lanes.append((trace, s))
    return lanes


def test_one_vllm_replica_is_one_vllm_server():
    """One router (fcfs, room for everything) in front of one vllm replica gives, per
    tenant and per request, exactly what one vllm server gives on the same trace."""
    lanes = _random_lanes(11, LANES)
    traces, settings = [t for t, _ in lanes], [s for _, s in lanes]
    k = max(t.num_clients for t in traces)
    want = _one_server(traces, settings, k)
    horizon = 400  # past every lane's drain (the lanes' steps are 1 each, no step-time model)
    clusters = [ClusterSettings(engine=s, gateway_policy="fcfs", kv_threshold=64) for s in settings]
    cl = simulate_traces(traces, clusters, num_clients=k, steps=horizon, record=True, server="vllm")
    assert cl.finished.all()
    preempted = 0
    for i, trace in enumerate(traces):
        totals, per = want[i]
        got_totals = (_ints(cl.service_units[i, 0]), _ints(cl.counter_units[i, 0]), _ints(cl.admitted[i, 0]),
                      _ints(cl.completed[i, 0]))
        assert got_totals == totals, f"lane {i} ({settings[i].policy})"
        fleet = _fleet_requests(cl, i, len(trace))
        assert {o: v[:2] for o, v in fleet.items()} == {o: v[:2] for o, v in per.items()}, f"lane {i}"
        preempted += sum(v[2] for v in per.values())
    assert preempted > 0  # the pools were tight enough to preempt


def _sub_trace(trace: Trace, orders: list[int]) -> Trace:
    """The requests of `trace` with trace order in `orders` (dispatch order), as a trace of
    their own in that order (same arrival: the dispatch order breaks ties)."""
    rank = np.lexsort((np.arange(len(trace)), trace.arrival))  # trace order -> trace row
    rows = [rank[o] for o in orders]
    return Trace.from_rows([(int(trace.arrival[r]), int(trace.client[r]), int(trace.prompt[r]), int(trace.output[r]))
                            for r in rows])


@pytest.mark.parametrize("replicas", [2, 3])
def test_round_robin_fleet_is_independent_vllm_servers(replicas):
    """R vllm replicas behind round robin, every request routed at its arrival (room for
    everything): replica r is one vllm server on the requests the fleet sent it, request for
    request (first token, finish) and tenant for tenant (W, admissions, completions)."""
    lanes = _random_lanes(20 + replicas, 16)
    traces, settings = [t for t, _ in lanes], [s for _, s in lanes]
    k = max(t.num_clients for t in traces)
    clusters = [ClusterSettings(engine=s, gateway_policy="fcfs", kv_threshold=64, replicas=replicas,
                                choice="round_robin") for s in settings]
    cl = simulate_traces(traces, clusters, num_clients=k, steps=400, record=True, server="vllm")
    assert cl.finished.all()
    subs, sub_settings, where = [], [], []
    for i, trace in enumerate(traces):
        fleet = _fleet_requests(cl, i, len(trace))
        for r in range(replicas):
            mine = sorted((v[3], o) for o, v in fleet.items() if v[2] == r)
            if mine:
                subs.append(_sub_trace(trace, [o for _, o in mine]))
                sub_settings.append(settings[i])
                where.append((i, r, [o for _, o in mine]))
    want = _one_server(subs, sub_settings, k)
    used = set()
    for (i, r, orders), (totals, per) in zip(where, want):
        fleet = _fleet_requests(cl, i, len(traces[i]))
        assert _ints(cl.service_units[i, r]) == totals[0], f"lane {i} replica {r}"
        assert (_ints(cl.admitted[i, r]), _ints(cl.completed[i, r])) == (totals[2], totals[3]), f"lane {i} replica {r}"
        assert {o: fleet[o][:2] for o in orders} == {orders[j]: per[j][:2] for j in range(len(orders))}, \
            f"lane {i} replica {r}"
        used.add(r)
    assert used == set(range(replicas))


def test_one_replica_behind_the_round_robin_picker_is_one_vllm_server():
    """The fleet's gateway (the round-robin picker, no flow control: every request routed
    at its arrival) in front of one vllm replica: one vllm server, request for request."""
    lanes = _random_lanes(41, 12)
    traces, settings = [t for t, _ in lanes], [s for _, s in lanes]
    k = max(t.num_clients for t in traces)
    want = _one_server(traces, settings, k)
    rules = Gateway(picker="round-robin", ties="lowest")
    clusters = [ClusterSettings(engine=s, gateway_policy="fcfs", gateway_rules=rules) for s in settings]
    cl = simulate_traces(traces, clusters, num_clients=k, steps=400, record=True, server="vllm")
    assert cl.finished.all()
    for i, trace in enumerate(traces):
        totals, per = want[i]
        assert (_ints(cl.service_units[i, 0]), _ints(cl.admitted[i, 0])) == (totals[0], totals[2]), f"lane {i}"
        fleet = _fleet_requests(cl, i, len(trace))
        assert {o: v[:2] for o, v in fleet.items()} == {o: v[:2] for o, v in per.items()}, f"lane {i}"


def test_a_replica_routed_at_arrival_queues_past_any_saturation_bound():
    """Routed at arrival (no flow control), nothing bounds a replica's queue but the
    requests: 30 requests at once on a one-seat replica with M = 64 (a saturation bound of
    a few requests) all queue there, and the fleet is still one vllm server, request for
    request (planned from the saturation rule, the queue overflowed and the lane was
    flagged)."""
    options = {"num_gpu_blocks": 9, "block_size": 4, "max_num_batched_tokens": 64, "max_num_seqs": 1}
    settings = [Settings(policy=p, kv_budget=64, server_options=tuple(options.items())) for p in ("fcfs", "vtc")]
    trace = Trace.from_rows([(0, r % 2, 16, 4) for r in range(30)])
    want = _one_server([trace] * 2, settings, 2)
    rules = Gateway(picker="round-robin", ties="lowest")
    clusters = [ClusterSettings(engine=s, gateway_policy="fcfs", gateway_rules=rules) for s in settings]
    cl = simulate_traces([trace] * 2, clusters, num_clients=2, steps=400, record=True, server="vllm")
    assert cl.finished.all()
    for i in range(2):
        totals, per = want[i]
        assert (_ints(cl.service_units[i, 0]), _ints(cl.admitted[i, 0])) == (totals[0], totals[2])
        assert {o: v[:2] for o, v in _fleet_requests(cl, i, len(trace)).items()} == {o: v[:2] for o, v in per.items()}


def test_slot_tiers_of_a_fleet_give_the_results_of_its_full_slots(monkeypatch):
    """The replicas' servers run in slot tiers (driver/tiers.py): lanes whose replicas hold
    more than 32 requests at once rerun with the full slots, the others keep the first
    tier's run widened; every result equals one run with the full slots."""
    from vtc_jax.driver import tiers

    options = {"num_gpu_blocks": 400, "block_size": 16, "max_num_batched_tokens": 2048, "max_num_seqs": 64}
    s = Settings(policy="vtc", kv_budget=1 << 16, server_options=tuple(options.items()))
    heavy = Trace.from_rows([(r // 20, r % 2, 8 + r % 5, 4 + r % 7) for r in range(90)])
    light = Trace.from_rows([(3 * r, r % 2, 8, 5) for r in range(12)])
    traces = [heavy, light, light, heavy]
    clusters = [ClusterSettings(engine=s, gateway_policy="fcfs", replicas=2, choice="round_robin")] * 4
    assert tiers.tier_sizes("vllm", 64) == [32, 64]
    reruns = []
    run = tiers.runner.run
    monkeypatch.setattr(tiers.runner, "run", lambda *a, **kw: reruns.append(a[1].slots) or run(*a, **kw))
    tiered = simulate_traces(traces, clusters, num_clients=2, steps=300, record=True, server="vllm")
    assert reruns == [32, 64]  # the heavy lanes overflowed the first tier
    monkeypatch.setattr(tiers, "tier_sizes", lambda server, slots: [slots])
    whole = simulate_traces(traces, clusters, num_clients=2, steps=300, record=True, server="vllm")
    assert tiered.finished.all() and whole.finished.all()
    for name in ("service_units", "counter_units", "admitted", "completed", "first_token", "finish", "records"):
        np.testing.assert_array_equal(np.asarray(getattr(tiered, name)), np.asarray(getattr(whole, name)), err_msg=name)


def _burst(heavy: int, light: int, light_at: int) -> Trace:
    """Tenant 0 sends `heavy` requests at 0, tenant 1 `light` requests at `light_at`
    (prompt 16, output 4 each)."""
    rows = [(0, 0, 16, 4)] * heavy + [(light_at, 1, 16, 4)] * light
    return Trace.from_rows(rows)


def _one_seat(policy: str) -> Settings:
    """One vllm seat (max_num_seqs 1), a pool for it: requests run one at a time, 5 steps each."""
    options = {"num_gpu_blocks": 9, "block_size": 4, "max_num_batched_tokens": 64, "max_num_seqs": 1}
    return Settings(policy=policy, kv_budget=1 << 20, server_options=tuple(options.items()))


def test_flow_control_holds_requests_at_the_gateway_and_vtc_there_serves_the_light_tenant():
    """Hand-worked (ENGINE_FLEET.md section 3): one replica that runs one request at a
    time, flow control with queueDepthThreshold 1 and live metrics: the pool is saturated
    while a request waits at the replica, so the gateway sends one request when the replica
    has none waiting (a request admitted, its W back to 0) and holds the rest in its
    queues. Tenant 0 sends 8 requests at 0, tenant 1 one at 3: global-strict (fcfs) serves
    tenant 1 after tenant 0's eight (it arrived last); VTC at the gateway (charged at
    dispatch) serves it next: tenant 1's first token comes much sooner. Without flow
    control every request goes to the replica at its arrival and its own fcfs order rules:
    the gateway's policy changes nothing."""
    trace = _burst(8, 1, 3)

    def light_first_token(gateway_policy: str, flow: bool) -> int:
        rules = Gateway(picker="round-robin", flow_control=flow, scrape_us=0, tick_us=1, queue_depth=1, ties="lowest")
        cs = ClusterSettings(engine=_one_seat("fcfs"), gateway_policy=gateway_policy, gateway_rules=rules)
        cl = simulate_traces([trace], [cs], num_clients=2, steps=300, record=True, server="vllm")
        assert cl.finished.all() and _ints(cl.completed[0, 0]) == [8, 1]
        fleet = _fleet_requests(cl, 0, len(trace))
        return fleet[8][0]  # the light tenant's request is the last in trace order

    strict, vtc = light_first_token("fcfs", True), light_first_token("vtc_gateway", True)
    assert vtc < strict
    assert light_first_token("fcfs", False) == light_first_token("vtc_gateway", False)


def _shared_prefix_log():
    """60 requests over 400 steps: tenant 1 (about 70%) shares a 384-token system prompt
    (prefix group 1), tenant 0's prompts are its own; (trace, vllm_prefix settings)."""
    rng = np.random.default_rng(0)
    n = 60
    arrival = np.sort(rng.integers(0, 400, n))
    client = (rng.random(n) < 0.7).astype(int)
    prompt = np.where(client == 1, 400 + rng.integers(0, 64, n), rng.integers(32, 200, n))
    output = rng.integers(4, 24, n)
    trace = Trace.from_rows([(int(a), int(c), int(p), int(o)) for a, c, p, o in zip(arrival, client, prompt, output)])
    ident = prefix_blocks.groups(np.where(client == 1, 1, -1), np.where(client == 1, 384, 0), client)
    options = {"num_gpu_blocks": 200, "block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 8}
    options.update(vllm_prefix.prefix_options(arrival, prompt, output, ident))
    return trace, Settings(policy="fcfs", kv_budget=1 << 20, server_options=tuple(options.items()))


def test_llmd_prefix_affinity_serves_more_prompt_tokens_from_cache_than_round_robin():
    """4 vllm replicas with prefix caching, the heavy tenant sharing a long prefix
    (ENGINE_FLEET.md section 7, BLIS prefix_routing_test, directional): llm-d's picker
    (prefix 3 over 64-token blocks) sends the shared prefix where its blocks are and serves
    more prompt tokens from cache than round-robin, concentrating the heavy tenant on fewer
    replicas; every request finishes either way."""
    trace, settings = _shared_prefix_log()
    lanes = [ClusterSettings(engine=settings, gateway_policy="fcfs", replicas=4,
                             gateway_rules=Gateway(picker=p, scrape_us=0)) for p in ("llm-d", "round-robin")]
    cached, spread = {}, {}
    for name, cs in zip(("llm-d", "round-robin"), lanes):
        cl = simulate_traces([trace], [cs], num_clients=2, steps=3000, record=True, server="vllm_prefix",
                             server_record=True)
        assert cl.finished.all()
        got = cl.request_record["cached"][0]
        real = cl.records[0][:, 2] >= 0  # dispatched rows
        assert (got[real] >= 0).all()
        cached[name] = int(got[real].sum())
        heavy = cl.dispatched[0, 0, :, 1]
        spread[name] = int((heavy > 0).sum()), int(heavy.max())
    assert cached["llm-d"] > cached["round-robin"] > 0
    assert spread["llm-d"][1] > spread["round-robin"][1]  # the heavy tenant piles up where its prefix is


def test_load_scale_divides_the_time_since_the_first_arrival():
    """--load-scale X: the same requests, each arriving X times sooner after the first (ns)."""
    from vtc_jax.inputs import request_log

    log = request_log.read_requests([str(ROOT / "examples" / "tenant_log.csv")])
    scaled = request_log.load_scaled(log, 4.0)
    first = log.arrival.min()
    assert len(scaled.arrival) == len(log.arrival) and (scaled.prompt == log.prompt).all()
    assert (scaled.arrival - first == np.round((log.arrival - first) / 4.0)).all()


def test_sweeps_fleet_writes_its_table(tmp_path, capsys):
    """sweeps.fleet on 10 s of the example log, one point: a study per point, the fewest
    replicas per policy, results.json/csv and the plot written as one set; bad input is
    one line, exit 2."""
    from sweeps import fleet

    out = tmp_path / "fleet"
    argv = ["--loads", "1", "--replicas", "1", "--pickers", "round-robin", "--time-window", "0,10",
            "--no-flow-control", "--policies", "fcfs", "--out", str(out)]
    assert fleet.main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["fewest_replicas"] == [{"load": 1.0, "picker": "round-robin", "policy": "fcfs", "fewest_replicas": 1}]
    assert result["points"][0]["meets_slo"] and result["points"][0]["ttft_p99_ms"]
    assert (out / "replicas_needed.png").stat().st_size > 1000 and "fewest replicas" in capsys.readouterr().out
    assert fleet.main(argv[:-2] + ["--slo", "nope", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x" / "results.json").exists()


def test_sweeps_fleet_decides_on_every_seed_and_the_ci_upper_end():
    """sweeps.fleet's decision, by hand: seed 0 within 500 ms meets the SLO alone; over 3
    seeds a tenant whose TTFT p99 CI reaches 600 ms misses it, one at 450 ms meets it, and a
    request shed in any seed (max over seeds 1) misses it whatever the latencies."""
    from sweeps.fleet import _meets

    report = {"finished_all": True, "tenants": {"a": {"p99_ttft_ms": 100.0, "failed": 0},
                                                "b": {"p99_ttft_ms": 300.0, "failed": 0}}}

    def flat(v):
        return {"mean": v, "max": v, "min": v, "n": 3, "ci95": [v, v]}

    def spread(hi_b, shed=0):
        def tenant(hi):
            return {"ttft": {"p99": {"mean": hi / 2, "n": 3, "ci95": [0.0, hi]}}, "unfinished": flat(0),
                    "shed": flat(shed), "rejected": flat(0), "requests": flat(5)}
        return {"tenants": {"a": tenant(400.0), "b": tenant(hi_b)}}

    assert _meets(report, {"*": 500.0}) == (True, {"a": 100.0, "b": 300.0}, {})
    assert not _meets(report, {"*": 500.0}, spread(600.0), 3)[0]
    ok, _, ci = _meets(report, {"*": 500.0}, spread(450.0), 3)
    assert ok and ci == {"a": [0.0, 400.0], "b": [0.0, 450.0]}
    assert not _meets(report, {"*": 500.0}, spread(450.0, shed=1), 3)[0]
    assert not _meets(report, {"*": 500.0, "b": 400.0}, spread(450.0), 3)[0]  # b's own target
    assert not _meets(report, {"*": 500.0}, spread(450.0), 4)[0]  # a seed that finished nothing
