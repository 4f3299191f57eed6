"""`compare LOG --server slora` on one server: the 600 s example log runs (fcfs, vtc, slora's
own pool without --kv-budget) and reports per tenant in ms what `vllm bench serve` does;
slora's per-request record (admission, first token, finish: servers/slora.py
`request_record`) read as latency.request_table's table (driver/server_latency.py) equals
the literal reference (`literal_slora_run`) on random small lanes and on the whole log, and
so does its per-token record (option `token_times`: each token's time, the ITL gaps); a
hand-worked TTFT/TPOT/ITL case; bad flags one line, exit 2."""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import types
from pathlib import Path

import numpy as np
import pytest

from vtc_jax import MeasureConfig, Settings, Trace, run_traces
from vtc_jax.cli import commands
from vtc_jax.cli.compare import read_log
from vtc_jax.cli.input_flags import file_rows
from vtc_jax.driver.latency import _itl_mean, summarize, token_record
from vtc_jax.driver.run import workload_pad
from vtc_jax.driver.server_latency import lane_record, record_outcome, record_table
from vtc_jax.inputs.request_log import read_requests
from vtc_jax.servers import slora
from vtc_jax.testing.lanes import random_lanes
from vtc_jax.testing.reference import Request
from vtc_jax.testing.slora_reference import literal_slora_run

LOG = Path(__file__).resolve().parents[1] / "examples" / "tenant_log.csv"
TIMES = ("scheduled", "first", "finish")
COLUMN = {"scheduled": "scheduled_us", "first": "first_token_us", "finish": "finish_us"}

# The hand-worked lane: 1 us per prefill token, 10 us per decode step, no overheads, no
# admission cadence, the idle jump, a pool that never binds.
HAND_OPTIONS = {"kv_pool": 10_000, "adapter_reserve": 0, "prefill_cap": 3072, "running_cap": 8, "cadence": 0,
                "poll_us": 1, "idle": "jump", "extra_finish_charge": False, "prefill_base": 0.0,
                "prefill_per_token": 1e-6, "decode_base": 10e-6, "decode_per_request": 0.0,
                "decode_per_context_token": 0.0, "overhead": 1.0}
HAND = Trace.from_rows([(5, 1, 50, 2), (0, 0, 100, 3)])  # rows out of arrival order: row 1 is request 0


@pytest.fixture(scope="module")
def small_runs():
    """Random small lanes (fcfs, vtc: random limits, random slora settings) and the
    hand-worked lane (3 clients, client 2 idle), in one run, each keeping every token's time
    (`token_times`: its own output tokens; the batch's record has the most of any lane):
    (traces, settings, requests, result). The record does not depend on the policy:
    tests/test_slora.py runs them all (without the per-token record)."""
    rng = random.Random(5)
    lanes = random_lanes(rng, 16, num_clients=3, policies=("fcfs", "vtc"), num_requests=(1, 12))

    def options(trace, fuzzed):
        return tuple(sorted({**fuzzed, "token_times": int(np.sum(trace.output))}.items()))

    settings = [dataclasses.replace(s, server_options=options(t, slora.fuzz_options(rng, t.prompt, t.output)))
                for t, s in zip(lanes.traces, lanes.settings)]
    traces = lanes.traces + [HAND]
    settings.append(Settings("fcfs", 10_000, server_options=options(HAND, HAND_OPTIONS)))
    requests = lanes.requests + [[Request(int(a), int(c), int(p), int(o)) for a, c, p, o in
                                  zip(HAND.arrival, HAND.client, HAND.prompt, HAND.output)]]
    res = run_traces(traces, settings, num_clients=3, server="slora", measures=MeasureConfig())
    return traces, settings, requests, res


def test_request_table_equals_the_literal_reference(small_runs):
    """Per trace row, the table's admission, first-token and finish times are
    literal_slora_run's (-1 where an rpm limit rejected the request), on every lane."""
    traces, settings, requests, res = small_runs
    for lane, (trace, s, reqs) in enumerate(zip(traces, settings, requests)):
        expect = literal_slora_run(reqs, s, 3)
        table = record_table(lane_record(slora.request_record, res.server_state, lane), trace, 3, trace.arrival)
        assert res.finished[lane], f"lane {lane}: {s}"
        for name in TIMES:
            assert table[COLUMN[name]].tolist() == expect[name], f"lane {lane} {name}: {s}"
        assert table["finished"].tolist() == [f >= 0 for f in expect["finish"]]


def _table(res, lane: int, trace) -> dict:
    return record_table(lane_record(slora.request_record, res.server_state, lane), trace, 3, trace.arrival)


def _token_times(res, lane: int, trace) -> list[list[int]]:
    """Each trace row's token times in the lane's per-token record, as latency.token_record
    reads it through server_latency.record_outcome ([]: no whole record)."""
    outcome = record_outcome(lane_record(slora.request_record, res.server_state, lane), trace, 3, workload_pad())
    view = types.SimpleNamespace(server_state=types.SimpleNamespace(out=outcome))
    at, first = token_record(view, trace, 3, workload_pad())
    return [at[f:f + o].tolist() if f >= 0 else [] for f, o in zip(first, trace.output)]


def test_token_times_equal_the_literal_reference(small_runs):
    """Per trace row, the per-token record's times are literal_slora_run's `tokens` (the
    end of each step that sampled one: a prefill token 0, each decode step the next; the
    extra finish charge is none), so the table's pooled ITL gaps are the reference's, row
    by row, and their exact mean is latency._itl_mean's (sum of E2EL - TTFT over the gaps:
    the first and last token are the first-token and finish times)."""
    traces, settings, requests, res = small_runs
    gaps_seen = 0
    for lane, (trace, s, reqs) in enumerate(zip(traces, settings, requests)):
        expect = literal_slora_run(reqs, s, 3)["tokens"]
        assert _token_times(res, lane, trace) == expect, f"lane {lane}: {s}"
        table = _table(res, lane, trace)
        done = table["finished"]
        assert [len(t) for t in expect] == np.where(done, trace.output, 0).tolist(), f"lane {lane}: {s}"
        gaps = [np.diff(t) for t in expect]
        assert table["itl_us"].tolist() == np.concatenate([[], *gaps]).astype(np.int64).tolist(), f"lane {lane}: {s}"
        assert table["itl_row"].tolist() == [n for n, g in enumerate(gaps) for _ in g]
        count = sum(g.size for g in gaps)
        if count:
            assert _itl_mean(table, done) == float(table["itl_us"].sum() / count / 1000.0)
        gaps_seen += count
    assert gaps_seen > 100  # the lanes decode: the record is exercised, not empty


def test_hand_worked_ttft_tpot(small_runs):
    """HAND_OPTIONS; request 0 (client 0, arrives 0 us, prompt 100, output 3), request 1
    (client 1, arrives 5, prompt 50, output 2); client 2 sends nothing.
    t=0: 0 admitted, prefill of 100 tokens, 100 us: its first token at 100.
    t=100: 1 admitted (cadence 0), prefill of 50 tokens alone (prefill stalls): first at 150.
    t=150: decode step of both, 10 us: 1 has its 2 tokens, finishes at 160.
    t=160: decode step of 0: its 3rd token, finishes at 170.
    Request 0: queue 0, TTFT 100, E2EL 170, TPOT (170 - 100) / 2 = 35 us.
    Request 1: queue 100 - 5 = 95, TTFT 150 - 5 = 145, E2EL 155, TPOT (155 - 145) / 1 = 10.
    Tokens: request 0 at 100, 160, 170 (gaps 60, 10); request 1 at 150, 160 (gap 10). ITL
    pooled in row order (row 0 is request 1): [10, 60, 10] us, mean (70 + 10) / (2 + 1) =
    26.667 us; sorted [10, 10, 60]: p50 10 us, p90 at rank 0.9 x 2 = 1.8: 10 + 0.8 x 50 =
    50 us, p99 at 1.98: 10 + 0.98 x 50 = 59 us. Tenant a (request 0): p50 of [60, 10] = 35.
    5 output tokens over 170 us = 29,411.8 tok/s; goodput at TTFT <= 0.12 ms and TPOT <=
    0.05 ms: request 0 only, 1 per 170 us."""
    traces, _, _, res = small_runs
    trace, lane = HAND, len(traces) - 1
    table = _table(res, lane, trace)
    # rows in the trace's order: row 0 is request 1, row 1 is request 0
    assert table["queue_us"].tolist() == [95, 0]
    assert table["ttft_us"].tolist() == [145, 100]
    assert table["e2el_us"].tolist() == [155, 170]
    assert table["tpot_us"].tolist() == [10, 35]
    s = summarize(table, trace.client, ["a", "b", "idle"], trace.prompt, {"ttft": 0.12, "tpot": 0.05})
    assert s["overall"]["ttft"]["mean"] == pytest.approx(0.1225)
    assert s["tenants"]["a"]["tpot"]["p50"] == pytest.approx(0.035) and s["tenants"]["b"]["queue"]["p99"] == 0.095
    assert s["overall"]["itl_mean"] == pytest.approx(80 / 3 / 1000)
    assert table["itl_us"].tolist() == [10, 60, 10] and table["itl_row"].tolist() == [0, 1, 1]
    assert s["overall"]["itl"] == pytest.approx({"mean": 80 / 3 / 1000, "p50": 0.010, "p90": 0.050, "p99": 0.059})
    assert s["tenants"]["a"]["itl"]["p50"] == pytest.approx(0.035) and s["tenants"]["b"]["itl"]["p99"] == 0.010
    assert s["overall"]["output_tokens_per_s"] == pytest.approx(5 / 170e-6)
    assert s["overall"]["goodput"] == pytest.approx(1 / 170e-6)  # only request 0 (TTFT 0.1 ms, TPOT 0.035 ms)
    assert s["overall"]["preemptions"] == 0


@pytest.fixture(scope="module")
def log_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("slora_compare")
    argv = ["compare", str(LOG), "--server", "slora", "--policies", "fcfs,vtc", "--goodput", "ttft:500", "tpot:50",
            "--requests-out", str(out / "requests.csv"), "--out", str(out), "--no-plots"]
    assert commands.main(argv) == 0
    return out


@pytest.fixture(scope="module")
def log_reference():
    """literal_slora_run of fcfs on the whole log (M 9,968: slora's pool less one reserve),
    its requests in the trace's (reader's) order."""
    trace, names, _ = read_log(LOG, 1e-6)
    reqs = [Request(int(a), int(c), int(p), int(o)) for a, c, p, o in zip(trace.arrival, trace.client, trace.prompt,
                                                                          trace.output)]
    return literal_slora_run(reqs, Settings("fcfs", 9968), len(names))


def test_the_600_s_log_on_one_slora_server(log_run, log_reference):
    """Without --kv-budget (slora's pool: M = 10,000 - 32), every request of both policies
    finishes; bench_serve.json and results.json's latency agree with the per-request rows; fcfs's
    rows are literal_slora_run's on the whole log."""
    out = log_run
    bench = json.loads((out / "bench_serve.json").read_text())
    latency = json.loads((out / "results.json").read_text())["latency"]
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert json.loads((out / "results.json").read_text())["rows"][0]["setting"]["kv_budget"] == 9968
    assert len(rows) == 2 * 565
    for policy in ("fcfs", "vtc"):
        b = bench[policy]
        assert (b["completed"], b["failed"], b["preemptions"], b["finished_all"]) == (565, 0, 0, True)
        mine = [r for r in rows if r["policy"] == policy]
        ttft = np.asarray([float(r["ttft_us"]) for r in mine])
        assert b["mean_ttft_ms"] == pytest.approx(ttft.mean() / 1000)
        assert sum(int(r["output"]) for r in mine) == b["total_output_tokens"]
        assert latency["policies"][policy]["overall"]["finished"] == 565
    assert 0.5 < latency["load"]["offered_load"] < 1.2  # the log is under the measured capacity, not far under

    expect = log_reference
    by_row = {int(r["row"]): r for r in rows if r["policy"] == "fcfs"}  # the CSV's row: the file's (unsorted) row
    fcfs = [by_row[int(i)] for i in file_rows(read_requests([LOG]))]  # in the trace's (reader's) order
    assert [int(r["scheduled_us"]) for r in fcfs] == expect["scheduled"]
    assert [int(r["first_token_us"]) for r in fcfs] == expect["first"]
    assert [int(r["finish_us"]) for r in fcfs] == expect["finish"]


def test_the_600_s_log_itl_percentiles(log_run, log_reference):
    """compare asks every lane for each token's time (slora_compare.with_token_times), so
    ITL's percentiles are reported: fcfs's are those of literal_slora_run's token times on
    the whole log (the pooled gaps in ms), and results.json's latency agree with bench_serve.json's."""
    bench = json.loads((log_run / "bench_serve.json").read_text())
    latency = json.loads((log_run / "results.json").read_text())["latency"]
    gaps = np.concatenate([np.diff(t) for t in log_reference["tokens"]]) / 1000.0
    assert bench["fcfs"]["median_itl_ms"] == np.median(gaps) and bench["fcfs"]["p99_itl_ms"] == np.percentile(gaps, 99)
    assert bench["fcfs"]["mean_itl_ms"] == pytest.approx(gaps.mean(), rel=1e-12)
    for policy in ("fcfs", "vtc"):
        itl = latency["policies"][policy]["overall"]["itl"]
        assert itl["p50"] is not None and itl["p99"] > itl["p50"]
        assert (itl["p50"], itl["p99"]) == (bench[policy]["median_itl_ms"], bench[policy]["p99_itl_ms"])


BAD = [
    (["--server", "slora", "--goodput", "bad:1"], "--goodput 'bad:1'"),
    (["--server", "slora", "--goodput", "ttft:-3"], "positive"),
    (["--server", "slora", "--preset", "qwen2.5-7b-h100"], "--preset is a step-time model, which --server slora does not take"),
    (["--routers", "2", "--requests-out", "r.csv", "--kv-budget", "2048"], "--requests-out applies to a timed server"),
    (["--goodput", "ttft:5", "--kv-budget", "2048"], "--goodput applies to a timed server"),
    (["--policies", "fcfs"], "--kv-budget M is required (the ideal server's memory)"),
    (["--server", "slora", "--requests-out", "OUT/results.json"], "name the same output file"),
]


@pytest.mark.parametrize("flags, message", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_flags_are_one_line(flags, message, tmp_path, capsys):
    out = tmp_path / "o"
    flags = [str(out / "results.json") if f == "OUT/results.json" else f for f in flags]
    assert commands.main(["compare", str(LOG), *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vtc_jax: error: ") and message in err[0], err


def test_per_tenant_waits_name_their_unit():
    """compare's per-tenant table states its waits' unit: us on slora's microsecond clock
    (not "steps, x 1e-06 s"), steps of a stated length on a timestamped log, else steps."""
    from vtc_jax.cli.compare import wait_unit

    assert wait_unit(1e-6, 1_000_000) == "in us (the server's clock)"
    assert wait_unit(0.025, 40) == "in steps, x 0.025 s"
    assert wait_unit(None, 1) == "in steps"
