"""Per-request latencies of a cluster of slora replicas (`compare LOG --server slora
--routers G --replicas R`): the replicas' per-request record (servers/slora.py
`request_record`, numbered by dispatch sequence at each replica) read per request
(driver/cluster_latency.py) through the one-server functions. One router in front of one
replica is the single slora server, to the microsecond, in every file compare writes; on two
replicas every request's admission, first token, finish and each token's time are the
literal cluster reference's (vtc_jax/testing/cluster_reference.py), and each request is in
exactly one replica's record; the CLI end to end; bad flags one line, exit 2."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from vtc_jax.cli import commands
from vtc_jax.cli.compare import read_log
from vtc_jax.cli.input_flags import file_rows
from vtc_jax.core.rows import ARRIVAL
from vtc_jax.driver.cluster_latency import lane_request_record
from vtc_jax.driver.cluster_run import source_config
from vtc_jax.driver.cluster_sweep import lane_settings, simulate_tenants
from vtc_jax.driver.run import server_drain
from vtc_jax.driver.server_latency import record_table
from vtc_jax.engines.cluster_settings import ClusterSettings
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.request_log import read_requests
from vtc_jax.inputs.sources import TraceSource
from vtc_jax.inputs.workload import INT32_MAX
from vtc_jax.servers import slora
from vtc_jax.testing import cluster_reference as cref

LOG = Path(__file__).resolve().parents[1] / "examples" / "tenant_log.csv"
M = 9968  # slora's pool less one adapter reserve: compare's M without --kv-budget
GOODPUT = ["--goodput", "ttft:500", "tpot:50"]
TIMES = ("scheduled_us", "first_token_us", "finish_us")


def _compare(out: Path, *flags: str) -> tuple[int, str]:
    """compare on the log with slora (exit code, stdout); its requests in out/requests.csv."""
    argv = ["compare", str(LOG), "--server", "slora", *flags, "--requests-out", str(out / "requests.csv"),
            "--out", str(out), "--no-plots"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = commands.main(argv)
    return code, printed.getvalue()


def _files(out: Path) -> tuple[list, dict, dict]:
    rows = list(csv.DictReader((out / "requests.csv").open()))
    return rows, json.loads((out / "bench_serve.json").read_text()), (
        json.loads((out / "results.json").read_text())["latency"])


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    assert _compare(out, "--policies", "fcfs,vtc", *GOODPUT)[0] == 0
    return _files(out)


def test_one_router_one_replica_is_the_single_server(single, tmp_path):
    """One fcfs router in front of one replica is the single slora server when the replica
    holds the whole backlog (--kv-threshold 64: every request is dispatched at its arrival,
    in order; docs/CLUSTER.md, "One router, one replica is the single server"): fcfs and
    vtc, every request's admission, first token and finish, every number of
    bench_serve.json and results.json's latency tables. At threshold 1 (the default) the router
    holds back what the replica has no room for; FCFS still equals the single server (a
    prefix of FCFS order that slora admits passes the room test), VTC, choosing among the
    dispatched requests only, need not."""
    rows, bench, latency = single
    held = tmp_path / "held"
    assert _compare(held, "--policies", "fcfs,vtc", *GOODPUT, "--routers", "1", "--replicas", "1",
                    "--kv-threshold", "64")[0] == 0
    got_rows, got_bench, got_latency = _files(held)
    # a cluster's rows add where each request ran, how long it waited at the gateway and how it ended: replica 0,
    # no wait, finished
    where = [(r.pop("replica"), r.pop("gateway_queue_us"), r.pop("status")) for r in got_rows]
    assert set(where) == {("0", "0", "finished")}
    assert got_rows == rows and got_bench == bench
    assert got_latency["policies"] == latency["policies"]
    assert got_latency["load"]["offered_load"] == pytest.approx(latency["load"]["offered_load"], rel=1e-12)
    assert got_latency["load"]["replicas"] == 1 and got_latency["cluster"]["replicas"] == 1
    tight = tmp_path / "tight"
    assert _compare(tight, "--policies", "fcfs", *GOODPUT, "--routers", "1", "--replicas", "1")[0] == 0
    got_rows, got_bench, _ = _files(tight)
    assert {r.pop("replica") for r in got_rows} == {"0"}  # (the router may hold requests back: gateway waits)
    got_rows = [{k: v for k, v in r.items() if k not in ("gateway_queue_us", "status")} for r in got_rows]
    assert got_rows == [r for r in rows if r["policy"] == "fcfs"] and got_bench["fcfs"] == bench["fcfs"]


# ---- two replicas against the literal cluster reference ---------------------------------------

CLUSTER = ["--routers", "2", "--replicas", "2", "--skew", "1"]  # tenant k always enters router k mod 2


def _cluster_settings(policy: str, options: tuple = ()) -> ClusterSettings:
    """compare's row for CLUSTER (gateway fcfs, per-router counters, kv < 1 x M, least_kv)
    with the seeds of lane seed 0; `options`: slora's."""
    cs = ClusterSettings(engine=Settings(policy, kv_budget=M, server_options=options), gateway_policy="fcfs",
                         replicas=2, routers=2, skew=1)
    return lane_settings(cs, 0, 0)


@pytest.fixture(scope="module")
def reference(monkeypatch_module):
    """The literal cluster reference on the whole log, per policy: admission, first token,
    finish (-1: never) and each token's time per request in the trace's (reader's) order.
    A token's time is the end of the replica's step that sampled it (as one slora server's
    reference: slora_reference.literal_slora_run), recorded around ReplicaSim.act."""
    trace, names, _ = read_log(LOG, 1e-6)
    reqs = [cref.Req(int(a), int(c), int(p), int(o)) for a, c, p, o in zip(trace.arrival, trace.client, trace.prompt,
                                                                           trace.output)]
    horizon = server_drain(trace, Settings("fcfs", kv_budget=M), "slora")
    tokens: list[list[int]] = []
    act = cref.ReplicaSim.act

    def recording_act(self, res, step_service):
        step = act(self, res, step_service)
        if step is not None:
            for m in step.sampled:
                tokens[self.orig[m]].append(self.b)  # b: this step's end
        return step

    monkeypatch_module.setattr(cref.ReplicaSim, "act", recording_act)
    out = {}
    for policy in ("fcfs", "vtc"):
        tokens[:] = [[] for _ in reqs]
        got = cref.simulate(reqs, len(names), _cluster_settings(policy), horizon, server="slora")
        none = lambda xs: [-1 if x is None else x for x in xs]  # noqa: E731
        out[policy] = {"scheduled_us": none(got.admit_step), "first_token_us": none(got.first_token),
                       "finish_us": none(got.finish), "tokens": [list(t) for t in tokens],
                       "replica": got.dispatch_replica}
    return trace, names, out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def cluster_cli(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster")
    code, printed = _compare(out, "--policies", "fcfs,vtc", *GOODPUT, *CLUSTER)
    assert code == 0
    return out, printed


def test_two_replicas_equal_the_cluster_reference(cluster_cli, reference):
    """compare's --requests-out on two replicas behind two routers: per request and policy
    the admission, first-token and finish times are the literal reference's (all in us on
    the cluster's clock, TTFT and queueing delay from the arrival at the router), and the
    requests spread over both replicas."""
    out, _ = cluster_cli
    rows, bench, _ = _files(out)
    trace, _, expect = reference
    in_trace_order = file_rows(read_requests([LOG]))  # the CSV's row: the file's; the reference's: the reader's
    for policy in ("fcfs", "vtc"):
        by_row = {int(r["row"]): r for r in rows if r["policy"] == policy}
        mine = [by_row[int(i)] for i in in_trace_order]
        want = expect[policy]
        assert [int(r["arrival_us"]) for r in mine] == [int(a) for a in trace.arrival]
        for name in TIMES:
            assert [int(r[name]) for r in mine] == want[name], (policy, name)
        ttft = [int(r["first_token_us"]) - int(r["arrival_us"]) for r in mine]
        assert [int(r["ttft_us"]) for r in mine] == ttft
        assert set(want["replica"]) == {0, 1}
        assert (bench[policy]["completed"], bench[policy]["failed"], bench[policy]["finished_all"]) == (565, 0, True)


@pytest.fixture(scope="module")
def driver_run():
    """The compare row of fcfs on CLUSTER run through the driver as compare runs it
    (simulate_tenants, a drained TraceSource, each token's time kept), with the replicas'
    raw record captured: (trace, results, raw {name: [2 lanes, R, S or T]})."""
    trace, names, per_second = read_log(LOG, 1e-6)
    tokens = int(trace.output.sum())
    s = Settings("fcfs", kv_budget=M, server_options=(("token_times", tokens),))
    horizon = server_drain(trace, s, "slora")
    source = TraceSource(trace, num_clients=len(names), horizon=horizon, phase_unit=per_second, drain=True)
    cs = _cluster_settings("fcfs", s.server_options)
    raw = {}

    def capture(host):
        raw.update(slora.request_record(host))
        return raw

    cfg = source_config([source], [cs], server="slora", record=True)
    res = simulate_tenants([source], [cs], [0], config=cfg, server="slora", server_record=capture)
    return trace, names, res, raw


def test_each_request_is_in_one_replica_record(driver_run):
    """Every replica's server holds arrays for every dispatch sequence number; a dispatched
    request is written only at its replica (-1 at the other), the cluster's dispatch record
    names that replica, and there first token >= admission >= router arrival, finish >=
    first token, with exactly `output` token times from the first token to the finish."""
    trace, _, res, raw = driver_run
    c = res.cluster
    rec, rows = c.records[0], c.rows[0]
    real = rows[:, ARRIVAL] < INT32_MAX
    assert real.sum() == len(trace) and (rec[real, 2] >= 0).all()
    seq, replica = rec[real, 2], rec[real, 1]
    assert sorted(seq.tolist()) == list(range(len(trace)))  # each request dispatched once
    scheduled = raw["scheduled"][0]  # the main lane: [R, S]
    written = scheduled[:, seq] >= 0
    assert (written.sum(axis=0) == 1).all() and (written.argmax(axis=0) == replica).all()
    assert (scheduled[:, len(trace):] == -1).all()
    assert [int((replica == r).sum()) for r in range(2)] == c.admitted[0].sum(axis=1).tolist()
    record = lane_request_record(c, 0)
    table = record_table(record, trace, 3, np.asarray(trace.arrival, np.int64))
    arrival, first = table["arrival_us"], table["first_token_us"]
    assert table["finished"].all()
    assert (table["scheduled_us"] >= arrival).all() and (first >= table["scheduled_us"]).all()
    assert (table["finish_us"] >= first).all()
    gaps = np.split(table["itl_us"], np.cumsum(np.bincount(table["itl_row"], minlength=len(trace)))[:-1])
    assert [len(g) for g in gaps] == (trace.output - 1).tolist()  # output tokens, one gap fewer
    assert all((g >= 0).all() for g in gaps)
    assert ((first + [g.sum() for g in gaps]) == table["finish_us"]).all()  # the tokens run first token to finish


def test_token_times_equal_the_cluster_reference(driver_run, reference):
    """Each request's token times (the concatenated replicas' per-token records, read
    through latency.request_table's ITL gaps) are the literal reference's, and so are its
    admission, first token and finish: the pooled ITL gaps of the log are the reference's."""
    trace, _, res, _ = driver_run
    _, _, expect = reference
    table = record_table(lane_request_record(res.cluster, 0), trace, 3, np.asarray(trace.arrival, np.int64))
    for name in TIMES:
        assert table[name].tolist() == expect["fcfs"][name], name
    want = np.concatenate([np.diff(t) for t in expect["fcfs"]["tokens"]])
    assert table["itl_us"].tolist() == want.tolist()
    assert [t[0] for t in expect["fcfs"]["tokens"]] == expect["fcfs"]["first_token_us"]


# ---- the command line ----------------------------------------------------------------------------

def test_compare_prints_and_writes_latency_on_a_cluster(cluster_cli):
    """The table prints TTFT/TPOT p50/p99 per tenant and policy (results.json's latency values), the
    load line reads the cluster's capacity (2 x one slora server's), --requests-out has one
    row per request and policy, goodput is reported; one set of files in --out."""
    out, printed = cluster_cli
    rows, bench, latency = _files(out)
    head = next(line for line in printed.splitlines() if line.startswith("policy ") and "TTFT p50" in line)
    for label in ("TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "ITL p99", "queue p99"):
        assert label in head
    assert "server slora at each of 2 replica(s) behind 2 router(s) running fcfs" in printed
    for policy in ("fcfs", "vtc"):
        for tenant in ("chat-app", "search-api", "nightly-eval", "all"):
            group = latency["policies"][policy]["overall" if tenant == "all" else "tenants"]
            g = group if tenant == "all" else group[tenant]
            line = next(x for x in printed.splitlines() if x.split()[:2] == [policy, tenant])
            cells = line.split()
            assert cells[3:7] == [f"{g['ttft']['p50']:.1f}", f"{g['ttft']['p99']:.1f}", f"{g['tpot']['p50']:.1f}",
                                  f"{g['tpot']['p99']:.1f}"], line
        assert bench[policy]["request_goodput"] > 0 and bench[policy]["p99_itl_ms"] is not None
    assert len(rows) == 2 * 565 and {r["policy"] for r in rows} == {"fcfs", "vtc"}
    load = latency["load"]
    assert load["replicas"] == 2
    assert load["capacity"]["requests_per_s"] == pytest.approx(2 * load["replica_capacity"]["requests_per_s"])
    assert load["offered_load"] == pytest.approx(load["offered_requests_per_s"] / load["capacity"]["requests_per_s"])
    assert "against the cluster's capacity on this mix (2 replica(s) x one slora server's measured" in printed
    assert "goodput: requests/s meeting ttft <= 500 ms and tpot <= 50 ms" in printed
    for name in ("results.json", "results.csv", "bench_serve.json"):
        assert (out / name).stat().st_size > 100, name


BAD = [
    (["--goodput", "ttft:soon"], "--goodput 'ttft:soon'"),
    (["--goodput", "speed:5"], "--goodput 'speed:5'"),
    (["--requests-out", "OUT/bench_serve.json"], "name the same output file"),
]


@pytest.mark.parametrize("flags, message", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_flags_on_a_cluster_are_one_line(flags, message, tmp_path, capsys):
    """A bad --goodput or a --requests-out that is one of compare's own files: one line,
    exit 2, before any run (no file written)."""
    out = tmp_path / "o"
    flags = [str(out / "bench_serve.json") if f == "OUT/bench_serve.json" else f for f in flags]
    argv = ["compare", str(LOG), "--server", "slora", "--policies", "fcfs", *CLUSTER, *flags, "--out", str(out)]
    assert commands.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vtc_jax: error: ") and message in err[0], err
    assert not out.exists() or not any(out.iterdir())
