"""The cluster on a user's log: `compare` and `replay` with --routers/--replicas
(docs/CLUSTER.md, "On your own log"): the files, the numbers against a direct
`simulate_traces` run, one router and one replica against the single server, bad flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vtc_jax.cli import commands
from vtc_jax.cli.compare import read_log
from vtc_jax.driver.cluster_run import simulate_traces
from vtc_jax.driver.cluster_sweep import lane_settings
from vtc_jax.driver.results import histogram_quantile, shares
from vtc_jax.driver.run import server_drain
from vtc_jax.engines.cluster_settings import ClusterSettings
from vtc_jax.engines.settings import Settings

LOG = Path(__file__).resolve().parents[1] / "examples" / "tenant_log.csv"
TRACE = Path(__file__).resolve().parents[1] / "examples" / "small_trace.csv"
CLUSTER = ["--routers", "2", "--replicas", "2", "--ingress", "chat-app:0,search-api:1", "--counter", "shared",
           "--gateway-policy", "vtc"]


def _compare(out: Path, *flags: str, plots: bool = False) -> dict:
    argv = ["compare", str(LOG), "--policies", "fcfs,vtc", *flags, "--out", str(out)] + ([] if plots else ["--no-plots"])
    assert commands.main(argv) == 0
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster_compare")
    return out, _compare(out, *CLUSTER, "--kv-budget", "2048", plots=True)


def test_compare_on_a_cluster_writes_its_files(cluster_run):
    out, result = cluster_run
    for name in ("results.json", "results.csv", "all_backlogged_drift.png", "tenants.png"):
        assert (out / name).stat().st_size > 100, name
    assert result["config"]["cluster"] == {"routers": 2, "replicas": 2, "gateway_policy": "vtc", "counters": "shared",
                                           "choice": "least_kv", "saturation": "kv",
                                           "ingress": "chat-app:0,search-api:1", "holdback": True, "kv_threshold": "1"}
    assert [r["label"] for r in result["rows"]] == ["fcfs", "vtc"]
    for row in result["rows"]:
        assert row["setting"]["engine_policy"] == row["label"] and row["setting"]["gateway_policy"] == "vtc"
        assert {"offered_per_step", "served_per_step", "waiting_at_span_end", "all_backlogged_drift",
                "wait_p99"} <= set(row["metrics"])
        assert len(row["clients"]["served_share"]) == 3 and len(row["clients"]["wait_p99"]) == 3
    assert "all_backlogged_drift" in (out / "results.csv").read_text()


def test_compare_cluster_matches_simulate_traces(cluster_run):
    """Seed 0 replays the log: each row is simulate_traces on the log's trace with the row's
    settings and the lane's seeds (lane_settings of seed 0), to the drain bound."""
    _, result = cluster_run
    trace, names, _ = read_log(LOG, 0.025)
    chosen = ((1, 0), (0, 1), (0.5, 0.5))  # chat-app -> 0, search-api -> 1, nightly-eval uniform
    for row in result["rows"]:
        cs = ClusterSettings(engine=Settings(row["label"], kv_budget=2048), gateway_policy="vtc", replicas=2,
                             routers=2, ingress=chosen, counters="shared")
        res = simulate_traces([trace], [lane_settings(cs, 0, 0)], num_clients=3, steps=server_drain(trace, Settings(), "ideal"))
        assert res.finished[0] and res.completed[0].sum() == len(trace)
        service = res.service.sum(axis=1)
        c, m = row["clients"], row["metrics"]
        np.testing.assert_allclose(c["served_share"], shares(service)[0], rtol=1e-12)
        for q in (0.5, 0.9, 0.99):
            assert c[f"wait_p{round(q * 100)}"] == list(histogram_quantile(res.wait_hist, q)[0])
        assert m["all_backlogged_drift"]["mean"] == pytest.approx(float(res.max_drift[0]), rel=1e-12)
        assert m["all_backlogged_steps"]["mean"] == res.backlogged_steps[0]
        assert m["wait_p99"]["mean"] == res.wait_percentile(0.99)[0]
        assert c["admitted_over_arrived"] == [1.0, 1.0, 1.0]


def _numbers(result: dict) -> dict:
    return {r["label"]: (r["clients"]["served"], r["clients"]["wait_p50"], r["clients"]["wait_p99"],
                         r["metrics"]["served_per_step"]["mean"], r["metrics"]["waiting_at_span_end"]["mean"],
                         r["clients"]["offered"]) for r in result["rows"]}


def test_one_router_one_replica_is_the_single_server(tmp_path):
    """One router and one replica are the single server when the replica's waiting queue
    holds what the single server's would (docs/CLUSTER.md, "Dispatch" and "Replicas").

    The gateway (fcfs) dispatches in arrival order while the replica has room (KV +
    waiting prompts < kv_threshold x M), before that step's admissions. With threshold 1,
    every request the single server could admit this step was dispatched (a prefix of
    FCFS order that fits M also passes the strict room test, prompts being >= 1), so FCFS
    at the replica is exactly FCFS. VTC at the replica is not: it picks only among the
    dispatched requests, a short FCFS prefix of the backlog, so the waits and service
    differ. With threshold 64 the replica holds the whole backlog (dispatch on arrival, in
    order, its lift seeing the same arrivals), and VTC is the single server's too.
    --steps 3000 keeps the service a real measure (drained, every run serves the whole log)."""
    flags = ["--kv-budget", "4096", "--steps", "3000"]
    single = _numbers(_compare(tmp_path / "single", *flags))
    one = ["--routers", "1", "--replicas", "1"]
    held = _numbers(_compare(tmp_path / "held", *one, "--kv-threshold", "64", *flags))
    assert held == single
    tight = _numbers(_compare(tmp_path / "tight", *one, *flags))
    assert tight["fcfs"] == single["fcfs"]
    assert tight["vtc"][0] != single["vtc"][0] and tight["vtc"][5] == single["vtc"][5]  # same demand, other service


def test_replay_on_a_cluster(tmp_path, capsys):
    """replay's cluster path: lane seed 0 of compare's row, exact service per replica."""
    out = tmp_path / "r.json"
    argv = ["replay", str(TRACE), "--policy", "vtc", "--kv-budget", "512", "--routers", "2", "--replicas", "2",
            "--skew", "1", "--json", str(out), "--details", str(tmp_path / "d.json")]
    assert commands.main(argv) == 0
    printed = capsys.readouterr().out
    assert "vtc at 2 replica(s) behind 2 router(s) running fcfs" in printed and "load: offered" in printed
    got = json.loads(out.read_text())
    assert got["service"] == [sum(col) for col in zip(*got["service_per_replica"])]
    assert np.asarray(got["dispatched"]).sum(axis=(0, 1)).tolist() == got["admitted"] == got["completed"]
    details = json.loads((tmp_path / "d.json").read_text())
    assert "wait_mean" not in details and "rejected" not in details and details["cluster"]["routers"] == 2


BAD = [
    (["compare", str(LOG), "--routers", "2", "--ingress", "nobody:0"], "unknown tenant 'nobody'"),
    (["compare", str(LOG), "--routers", "2", "--ingress", "chat-app:2"], "router must be an index in 0..1"),
    (["compare", str(LOG), "--routers", "2", "--ingress", "chat-app:0,chat-app:1"], "named twice"),
    (["compare", str(LOG), "--routers", "2", "--ingress", "chat-app"], "expected TENANT:ROUTER"),
    (["compare", str(LOG), "--routers", "2", "--ingress", "chat-app:0", "--skew", "0.5"], "--ingress and --skew"),
    (["compare", str(LOG), "--routers", "2", "--skew", "2"], "--skew must be in [0, 1]"),
    (["compare", str(LOG), "--skew", "0.5"], "--skew applies to a cluster"),
    (["compare", str(LOG), "--gateway-policy", "vtc"], "--gateway-policy applies to a cluster"),
    (["compare", str(LOG), "--routers", "2", "--delay", "5"], "--delay applies to --counter delayed"),
    (["compare", str(LOG), "--replicas", "2", "--flow-control"], "--flow-control applies to a fleet gateway"),
    (["compare", str(LOG), "--replicas", "2", "--scrape-interval", "0"], "--scrape-interval applies to a fleet"),
    (["compare", str(LOG), "--flow-control"], "--flow-control applies to a cluster"),
    (["compare", str(LOG), "--replicas", "2", "--picker", "llm-d", "--routers", "2"], "one gateway"),
    (["compare", str(LOG), "--replicas", "2", "--picker", "llm-d", "--choice", "p2c"], "--choice is a rule"),
    (["compare", str(LOG), "--replicas", "2", "--picker", "llm-d", "--queue-depth-threshold", "3"],
     "--queue-depth-threshold applies to --flow-control"),
    (["compare", str(LOG), "--replicas", "2", "--picker", "nope"], "--picker"),
    (["compare", str(LOG), "--replicas", "2", "--picker", "dynamo", "--flow-control", "--policies", "las"],
     "needs completions"),
    (["compare", str(LOG), "--replicas", "2", "--picker", "llm-d", "--flow-control", "--kv-cache-util-threshold",
      "1.5"], "KV threshold"),
    (["compare", str(LOG), "--replicas", "2", "--picker", "llm-d", "--scrape-interval", "99"], "--scrape-interval"),
    (["compare", str(LOG), "--load-scale", "0"], "--load-scale"),
    (["compare", str(LOG), "--routers", "2", "--no-holdback"], "--no-holdback applies to --counter shared"),
    (["compare", str(LOG), "--routers", "2", "--queue-limit", "4"], "--queue-limit applies to --saturation queue"),
    (["compare", str(LOG), "--routers", "2", "--saturation", "queue", "--kv-threshold", "2"],
     "--kv-threshold applies to --saturation kv"),
    (["compare", str(LOG), "--routers", "2", "--gateway-policy", "las"], "needs completions"),
    (["compare", str(LOG), "--routers", "2", "--gateway-policy", "nope"], "nope"),
    (["compare", str(LOG), "--routers", "99"], "--routers"),
    (["compare", str(LOG), "--routers", "2", "--gateway-policy", "rpm"], "admission limit"),
    (["compare", str(LOG), "--routers", "2", "--policies", "fcfs", "--weights", "1,2,1"],
     "--weights: none of the policies fcfs (nor the gateway policy fcfs)"),
    (["compare", str(LOG), "--replicas", "2", "--estimate-seed", "3"], "--estimate-seed"),
    (["replay", str(TRACE), "--policy", "vtc", "--routers", "2", "--check"], "no token ledger"),
    (["replay", str(TRACE), "--policy", "vtc", "--routers", "2", "--ingress", "7:0"], "unknown tenant '7'"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a[2:]) for a, _ in BAD])
def test_bad_cluster_flags_are_one_line(argv, message, tmp_path, capsys):
    argv = argv + ["--kv-budget", "2048"] + (["--out", str(tmp_path / "o")] if argv[0] == "compare" else [])
    assert commands.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vtc_jax: error: ") and message in err[0], err
