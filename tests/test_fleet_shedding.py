"""The fleet gateway's flow control sheds and rejects as llm-d does (ENGINE_FLEET.md section
3; engines/cluster_shed.py): a request still queued `ttl` after its enqueue is shed at the
next TTL sweep, an arrival whose band already holds `capacity` queued requests is
rejected; neither reaches a replica nor gets a first token, and both are counted per
tenant. Hand-worked cases on one replica with one seat, a property over random fleets, and
that a TTL and a capacity that never bind change nothing."""

from __future__ import annotations

import numpy as np
import pytest

from vtc_jax import Trace
from vtc_jax.cli import commands
from vtc_jax.core.rows import ARRIVAL, ORDER
from vtc_jax.driver.cluster_run import simulate_traces
from vtc_jax.engines.cluster_settings import ClusterSettings, Gateway
from vtc_jax.engines.cluster_shed import REJECTED, SHED
from vtc_jax.engines.cluster_state import REC_DISPATCH

from tests.test_fleet import ROOT, _burst, _one_seat, _random_lanes

LOG = ROOT / "examples" / "tenant_log.csv"


def _fleet(trace: Trace, k: int = 2, policy: str = "fcfs", replicas: int = 1, steps: int = 300, **rules):
    """One lane of a flow-control fleet of one-seat vllm replicas (round robin, live metrics,
    queueDepthThreshold 1, a tick every step)."""
    gate = Gateway(picker="round-robin", flow_control=True, scrape_us=0, tick_us=1, queue_depth=1, ties="lowest",
                   **rules)
    cs = ClusterSettings(engine=_one_seat("fcfs"), gateway_policy=policy, replicas=replicas, gateway_rules=gate)
    return simulate_traces([trace], [cs], num_clients=k, steps=steps, record=True, server="vllm", server_record=True)


def _by_order(cl, n: int, lane: int = 0) -> dict:
    """{trace order: (dispatch time, first token, gateway status)} of a lane's requests."""
    rows = cl.rows[lane]
    status = cl.request_record["status"][lane] if cl.request_record else None
    out = {}
    for row in np.flatnonzero(rows[:, ORDER] < n):
        out[int(rows[row, ORDER])] = (int(cl.records[lane][row, REC_DISPATCH]), int(cl.first_token[lane, row]),
                                      None if status is None else int(status[row]))
    return out


def _shedding_run(sweep_us: int):
    """Tenant 0 sends 8 requests at 0, tenant 1 one at 3; one seat: dispatches at 0, 1, 5,
    9, 13, ... (a request's 5 steps), first tokens at 0, 4, 8, 12, 16. TTL 12."""
    return _fleet(_burst(8, 1, 3), request_ttl_us=12, sweep_us=sweep_us)


def test_a_request_queued_past_the_ttl_is_shed_at_the_sweep_after_not_before():
    """Sweeps every 4 steps: at 12 the five heavy requests still queued since 0 have waited
    12 >= TTL and are shed (shed at the sweep: 12 - 0 is not before 12); the light one
    (queued since 3: 9 < 12) stays and goes at 13. Sweeps every 5: the TTL runs out at 12
    but the sweep comes at 15, so heavy request 4 still goes at 13; at 15 the three heavy
    ones left and the light one (15 - 3 = 12) are shed. A shed request never reaches a
    replica and never gets a first token; the counts are per tenant, exact."""
    cl = _shedding_run(4)
    got = _by_order(cl, 9)
    assert [got[o][0] for o in range(9)] == [0, 1, 5, 9, -1, -1, -1, -1, 13]
    assert [got[o][1] for o in range(9)] == [0, 4, 8, 12, -1, -1, -1, -1, 16]
    assert [got[o][2] for o in range(9)] == [0, 0, 0, 0, SHED, SHED, SHED, SHED, 0]
    assert cl.shed[0].tolist() == [4, 0] and cl.gateway_rejected[0].tolist() == [0, 0]
    assert cl.completed[0, 0].tolist() == [4, 1] and cl.finished.all()

    late = _shedding_run(5)
    got = _by_order(late, 9)
    assert [got[o][0] for o in range(9)] == [0, 1, 5, 9, 13, -1, -1, -1, -1]
    assert [got[o][2] for o in range(9)] == [0, 0, 0, 0, 0, SHED, SHED, SHED, SHED]
    assert late.shed[0].tolist() == [3, 1] and late.completed[0, 0].tolist() == [5, 0]


def test_the_third_request_into_a_band_of_capacity_two_is_rejected():
    """Band capacity 2: tenant 0's first request goes at 0 (the replica is then saturated),
    its 2nd and 3rd queue, the 4th..8th find the band full and are rejected at enqueue
    (counted, never served; later ones of the tenant queue behind them in its block and the
    head steps over them). At 3 the band holds one (the 2nd went at 1): the light one
    joins. Capacity 3, tenant 0 sending 5 at 0 and tenant 1 two at 2: tenant 0's 5th finds 3
    queued (rejected); at 2 the band holds 2 (one went at 1), so tenant 1's first joins
    and its second finds the band full: one rejected each."""
    trace = _burst(8, 1, 3)
    cl = _fleet(trace, band_capacity=2)
    got = _by_order(cl, 9)
    assert [got[o][0] for o in range(9)] == [0, 1, 5, -1, -1, -1, -1, -1, 9]
    assert [got[o][1] for o in range(9)] == [0, 4, 8, -1, -1, -1, -1, -1, 12]
    assert cl.gateway_rejected[0].tolist() == [5, 0] and cl.shed[0].tolist() == [0, 0]
    assert cl.completed[0, 0].tolist() == [3, 1]

    three = _fleet(Trace.from_rows([(0, 0, 16, 4)] * 5 + [(2, 1, 16, 4)] * 2), band_capacity=3)
    assert three.gateway_rejected[0].tolist() == [1, 1] and three.completed[0, 0].tolist() == [4, 1]


def _random_trace(rng, k: int, n: int) -> Trace:
    arrival = np.sort(rng.integers(0, 60, n))
    client = rng.integers(0, k, n)
    return Trace.from_rows([(int(a), int(c), int(rng.integers(4, 24)), int(rng.integers(1, 6)))
                            for a, c in zip(arrival, client)])


@pytest.mark.parametrize("seed", [0, 1])
def test_every_request_is_finished_shed_rejected_or_unfinished(seed):
    """Random overloaded fleets (1-3 one-seat replicas, any gateway policy, random TTL, sweep
    and capacity): per tenant finished + shed + rejected + unfinished = requests, the
    engine's counts equal its per-request marks, a dropped request has no dispatch and no
    first token, and no request was dispatched after the first sweep at which its wait
    reached the TTL."""
    rng = np.random.default_rng(seed)
    k, lanes = 3, []
    for i in range(6):
        ttl, sweep = int(rng.integers(3, 30)), int(rng.integers(1, 8))
        gate = Gateway(picker="round-robin", flow_control=True, scrape_us=0, tick_us=1, queue_depth=1,
                       ties="lowest", request_ttl_us=ttl, sweep_us=sweep, band_capacity=int(rng.integers(0, 6)))
        cs = ClusterSettings(engine=_one_seat("fcfs"), gateway_policy=("fcfs", "vtc_gateway", "drr")[i % 3],
                             replicas=int(rng.integers(1, 4)), gateway_rules=gate)
        lanes.append((_random_trace(rng, k, 40), cs))
    cl = simulate_traces([t for t, _ in lanes], [c for _, c in lanes], num_clients=k, steps=2000, record=True,
                         server="vllm", server_record=True)
    assert cl.finished.all()
    dropped_any = 0
    for i, (trace, cs) in enumerate(lanes):
        gate = cs.gateway_rules
        rows = cl.rows[i]
        real = rows[:, ORDER] < len(trace)
        status = cl.request_record["status"][i][real]
        by_order = np.asarray(trace.client)[np.lexsort((np.arange(len(trace)), trace.arrival))]
        tenant = by_order[rows[real, ORDER]]
        finished = cl.finish[i][real] >= 0
        dispatch = cl.records[i][real, REC_DISPATCH]
        shed, rejected = status == SHED, status == REJECTED
        assert not (finished & (shed | rejected)).any()
        assert (dispatch[shed | rejected] == -1).all() and (cl.first_token[i][real][shed | rejected] == -1).all()
        for c in range(k):
            mine = tenant == c
            assert cl.shed[i, c] == (shed & mine).sum() and cl.gateway_rejected[i, c] == (rejected & mine).sum()
            unfinished = mine & ~finished & ~shed & ~rejected
            assert (finished & mine).sum() + cl.shed[i, c] + cl.gateway_rejected[i, c] + unfinished.sum() == mine.sum()
            assert cl.completed[i, :, c].sum() == (finished & mine).sum()
        arrival = rows[real, ARRIVAL]
        sent = dispatch >= 0
        due = -(-(arrival + gate.request_ttl_us) // gate.sweep_us) * gate.sweep_us  # the first sweep past the TTL
        assert (dispatch[sent] <= due[sent]).all()
        dropped_any += int((shed | rejected).sum())
    assert dropped_any > 0


def test_a_ttl_and_a_capacity_that_never_bind_change_nothing():
    """Flow control with the TTL and the capacity off (0) and with both past anything the
    trace reaches give the same run, request for request and tenant for tenant, on random
    pools tight enough to preempt and every gateway policy: the drops are the only change."""
    lanes = _random_lanes(7, 6)
    traces, settings = [t for t, _ in lanes], [s for _, s in lanes]
    k = max(t.num_clients for t in traces)
    out = []
    for ttl, cap in ((0, 0), (1 << 30, 1 << 30), (60_000_000, 5000)):
        gate = Gateway(picker="round-robin", flow_control=True, scrape_us=0, tick_us=1, ties="lowest",
                       request_ttl_us=ttl, band_capacity=cap)
        clusters = [ClusterSettings(engine=s, gateway_policy=("fcfs", "vtc_gateway", "wfq")[i % 3],
                                    gateway_rules=gate) for i, s in enumerate(settings)]
        cl = simulate_traces(traces, clusters, num_clients=k, steps=400, record=True, server="vllm")
        assert cl.finished.all() and not cl.shed.any() and not cl.gateway_rejected.any()
        out.append((cl.records.tolist(), cl.first_token.tolist(), cl.finish.tolist(), cl.completed.tolist(),
                    cl.service_units.tolist(), cl.iterations.tolist()))
    assert out[0] == out[1] == out[2]


BAD = [
    (["--replicas", "2", "--picker", "llm-d", "--flow-control-default-request-ttl", "5"],
     "--flow-control-default-request-ttl applies to --flow-control"),
    (["--replicas", "2", "--picker", "llm-d", "--flow-control-band-max-requests", "5"],
     "--flow-control-band-max-requests applies to --flow-control"),
    (["--flow-control-band-max-requests", "5"], "applies to a cluster"),
    (["--replicas", "2", "--picker", "llm-d", "--flow-control", "--flow-control-default-request-ttl", "-1"],
     "--flow-control-default-request-ttl must be in"),
    (["--replicas", "2", "--picker", "llm-d", "--flow-control", "--flow-control-band-max-requests", "-1"],
     "--flow-control-band-max-requests"),
]


@pytest.mark.parametrize("flags, message", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_flow_control_flags_are_one_line(flags, message, tmp_path, capsys):
    argv = ["compare", str(LOG), "--server", "vllm", "--preset", "qwen2.5-7b-h100", *flags, "--out", str(tmp_path)]
    assert commands.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vtc_jax: error: ") and message in err[0], err


def _replica_report(cl, trace: Trace, k: int, lane: int = 0):
    """(replica_report's list, the lane's table) of a fleet lane (cluster_latency's path)."""
    from vtc_jax.driver.cluster_latency import lane_request_record, replica_report
    from vtc_jax.driver.latency import summarize
    from vtc_jax.driver.server_latency import record_table

    record = lane_request_record(cl, lane)
    arrival = np.asarray(trace.arrival, np.int64)
    table = record_table(record, trace, k, arrival)
    prompt = np.asarray(trace.prompt, np.int64)
    duration = summarize(table, np.asarray(trace.client), [str(c) for c in range(k)], prompt, {})["duration_s"]
    return replica_report(record, table, prompt, duration), table


def test_the_replica_report_decomposes_and_one_replica_is_one_server():
    """Per replica: the requests routed add up to the fleet's dispatches (3 replicas, llm-d's
    picker, prefix caching), busy shares and KV use in [0, 1] and the busy time no more than
    the run; the prefix-cache hit rate of a 1-replica fleet (no flow control)
    equals the one vllm_prefix server's on the same log (the picker has one choice): cached over prompt tokens of the
    admitted requests."""
    from vtc_jax import MeasureConfig, run_traces
    from vtc_jax.core.rows import PROMPT
    from vtc_jax.inputs.workload import layout_trace
    from vtc_jax.servers import registry as servers

    from tests.test_fleet import _shared_prefix_log

    trace, settings = _shared_prefix_log()
    lanes = [ClusterSettings(engine=settings, gateway_policy="fcfs", replicas=r,
                             gateway_rules=Gateway(picker=p, scrape_us=0, ties="lowest"))
             for r, p in ((3, "llm-d"), (1, "llm-d"))]  # one batch runs one picker
    cl = simulate_traces([trace, trace], lanes, num_clients=2, steps=3000, record=True, server="vllm_prefix",
                         server_record=True)
    assert cl.finished.all()
    many, table = _replica_report(cl, trace, 2, 0)
    assert [e["replica"] for e in many] == [0, 1, 2]
    assert sum(e["requests"] for e in many) == int(cl.dispatched[0].sum()) == len(trace)
    assert [e["requests"] for e in many] == cl.dispatched[0].sum(axis=(0, 2)).tolist()
    assert all(0 < e["busy_share"] <= 1 and 0 < e["mean_kv_use"] <= 1 for e in many)
    assert (cl.replica_use["busy"][0] <= cl.steps[0]).all()

    one, _ = _replica_report(cl, trace, 2, 1)
    record, index = servers.request_record("vllm_prefix")
    assert index == "row"
    res = run_traces([trace], [settings], num_clients=2, server="vllm_prefix", measures=MeasureConfig())
    cached = np.asarray(record(res.server_state)["cached"][0], np.int64)
    prompt = layout_trace(trace, 2, 5)[:, PROMPT].astype(np.int64)
    admitted = cached[:len(prompt)] >= 0
    want = cached[:len(prompt)][admitted].sum() / prompt[admitted].sum()
    assert len(one) == 1 and one[0]["requests"] == len(trace) and want > 0
    assert one[0]["prefix_cache_hit_rate"] == want


def test_compare_reports_shed_requests_per_tenant_and_per_replica(tmp_path, capsys):
    """compare on 2 vllm replicas behind flow control with a 0.5 s TTL (the example log's
    first 20 s, 30 times as fast: overloaded): bench_serve.json counts the shed requests per
    tenant (in `failed` too, never in `completed`), --requests-out marks them `shed`, the
    report names them, and the per-replica table's requests add up to the dispatches."""
    import csv
    import json

    out, requests = tmp_path / "o", tmp_path / "requests.csv"
    argv = ["compare", str(LOG), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--replicas", "2", "--picker",
            "round-robin", "--flow-control", "--load-scale", "30", "--time-window", "0,20",
            "--flow-control-default-request-ttl", "0.5", "--num-gpu-blocks", "300", "--policies", "fcfs",
            "--no-plots", "--out", str(out), "--requests-out", str(requests)]
    assert commands.main(argv) == 0
    printed = capsys.readouterr().out
    bench = json.loads((out / "bench_serve.json").read_text())["fcfs"]
    rows = list(csv.DictReader(requests.open()))
    assert bench["shed"] > 0 and bench["rejected"] == 0
    assert bench["shed"] == sum(t["shed"] for t in bench["tenants"].values())
    assert bench["completed"] + bench["failed"] == bench["num_prompts"] == len(rows)
    assert bench["failed"] >= bench["shed"] and sum(r["status"] == "shed" for r in rows) == bench["shed"]
    assert sum(r["status"] == "finished" for r in rows) == bench["completed"]
    assert all(r["first_token_us"] == "" and r["replica"] == "" for r in rows if r["status"] == "shed")
    for name, t in bench["tenants"].items():
        assert t["shed"] == sum(r["status"] == "shed" and r["tenant"] == name for r in rows)
    assert "gateway flow control shed (TTL) / rejected (band full)" in printed
    replicas = bench["replicas"]
    assert [e["replica"] for e in replicas] == [0, 1]
    assert sum(e["requests"] for e in replicas) == sum(r["replica"] != "" for r in rows) == len(rows) - bench["shed"]
    assert all(0 < e["busy_share"] <= 1 and 0 < e["mean_kv_use"] <= 1 for e in replicas)


def test_latency_over_seeds_behind_a_gateway(tmp_path, capsys):
    """A fleet's latency figures over --seeds, as on one server: results.json's
    latency["over_seeds"] per policy, tenant and figure (mean, 95% CI, min, max over the
    seeds) and the rows' ttft_p99_ms[TENANT] metrics. With --phase-unit 1 every seed
    replays the log as it is, and the round-robin picker draws no ties: each seed's table
    (cluster_latency.seed_table, from the lane's own rows) then gives exactly seed 0's
    report (min = max = the log's figure); with the default unit (one second) and llm-d's
    picker (seeded ties) the seeds differ."""
    import json

    def run(name, picker, *flags):
        out = tmp_path / name
        argv = ["compare", str(LOG), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--replicas", "2", "--picker",
                picker, "--flow-control", "--load-scale", "30", "--time-window", "0,20", "--num-gpu-blocks", "400",
                "--policies", "fcfs,vtc", "--no-plots", "--seeds", "3", "--out", str(out), *flags]
        assert commands.main(argv) == 0
        return json.loads((out / "results.json").read_text())

    same = run("same", "round-robin", "--phase-unit", "1")
    latency = same["latency"]
    printed = capsys.readouterr().out  # the table's heading names the seeds it spans (it once said "over 1 seeds")
    assert latency["seeds"] == 3 and "half width over 3 seeds" in printed and "seeds 1..2 redraw" in printed
    for policy, summary in latency["policies"].items():
        spread = latency["over_seeds"][policy]
        for name in [*latency["tenants"]]:
            for metric, q in (("ttft", "p99"), ("ttft", "mean"), ("e2el", "p50")):
                want = summary["tenants"][name][metric][q]
                got = spread["tenants"][name][metric][q]
                assert got["n"] == 3 and got["min"] == got["max"] == pytest.approx(want, rel=1e-12), (policy, name)
        row = next(r for r in same["rows"] if r["label"] == policy)
        assert row["metrics"]["ttft_p99_ms[all]"]["mean"] == pytest.approx(summary["overall"]["ttft"]["p99"])
    drawn = run("drawn", "llm-d")["latency"]["over_seeds"]
    spans = [drawn[p]["overall"]["ttft"]["p99"] for p in drawn]
    assert all(s["n"] == 3 for s in spans) and any(s["max"] > s["min"] for s in spans)
