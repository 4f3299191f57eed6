"""Reliability: extreme settings run exactly or are refused up front; hostile input (fuzzed
with hypothesis) ends in a result or one error line with exit 2; long runs stay exact;
conservation holds and `--check` reports it."""

from __future__ import annotations

import csv

import json
import random
import string
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.helpers import one_error_line
from vtc_jax.testing import reference as ref
from vtc_jax.testing.lanes import run_reference, service_matrix, to_trace
from vtc_jax import InputError, MeasureConfig, Settings, replay, run_traces
from vtc_jax.cli.commands import main as cli_main
from vtc_jax.inputs.workload import read_trace_csv


def _random_requests(rng, k, n, max_arrival, prompt, output):
    return [ref.Request(rng.randrange(max_arrival), rng.randrange(k), rng.randint(*prompt), rng.randint(*output))
            for _ in range(n)]


# (name, clients, settings, requests maker, steps): every case must equal the reference.
EXACT = [
    ("1024 clients", 1024, Settings("vtc", 64), lambda r: _random_requests(r, 1024, 60, 20, (1, 30), (1, 9)), 30),
    ("M = 1, 1-token prompts", 3, Settings("lcf", 1), lambda r: _random_requests(r, 3, 20, 10, (1, 1), (1, 5)), 40),
    ("M = 2^20", 2, Settings("fcfs", 1 << 20),
     lambda r: _random_requests(r, 2, 12, 5, (1, 1 << 20), (1, 6)), 20),
    ("100k-token outputs", 2, Settings("vtc", 256), lambda r: _random_requests(r, 2, 6, 10, (1, 128), (1, 100_000)),
     1500),
    ("weights 1e-3 .. 1e3", 3, Settings("vtc", 64, weights=("0.001", "1", "1000")),
     lambda r: _random_requests(r, 3, 20, 15, (1, 30), (1, 8)), 40),
    ("beta = 1e3", 2, Settings("vtc", 128, beta=1000), lambda r: _random_requests(r, 2, 14, 10, (1, 60), (1, 9)), 40),
]

# (name, clients, settings, requests, message): each must be refused before running.
REFUSED = [
    ("30k requests of 100k outputs with 1-token prompts at M = 2^20", 2, Settings("vtc", 1 << 20),
     [ref.Request(0, i % 2, 1, 100_000) for i in range(30_000)], "running context"),
    ("weights 1e-3 .. 1e3 with 30k-token prompts", 2, Settings("vtc", 32768, weights=("0.001", "1000")),
     [ref.Request(0, 0, 30000, 5), ref.Request(0, 1, 100, 5)], "prefill charge"),
    ("beta = 1e3 at M = 2^20 with 2000 long requests", 2, Settings("vtc", 1 << 20, beta=1000),
     [ref.Request(0, i % 2, 1000, 2000) for i in range(2000)], "decode charge"),
    ("prompt larger than M", 1, Settings("vtc", 10), [ref.Request(0, 0, 11, 2)], "larger than the KV budget"),
]


@pytest.mark.parametrize("name, k, s, make, steps", EXACT, ids=[c[0] for c in EXACT])
def test_extreme_settings_run_exactly(name, k, s, make, steps):
    requests = make(random.Random(name))
    result = run_traces([to_trace(requests)], [s], num_clients=k, steps=steps, record_every=1)
    expect = run_reference(requests, k, s, steps)
    np.testing.assert_array_equal(result.checkpoints[0][:steps], service_matrix(expect))
    assert list(result.counters_exact[0]) == expect.counters[-1]
    assert result.conservation[0] == []


@pytest.mark.parametrize("name, k, s, requests, message", REFUSED, ids=[c[0] for c in REFUSED])
def test_extreme_settings_beyond_the_limits_are_refused(name, k, s, requests, message):
    with pytest.raises(InputError, match=message):
        replay(to_trace(requests), s, num_clients=k, steps=100)


def test_long_run_prefix_equals_short_run():
    """A 20,000-step run's first 5,000 steps are the 5,000-step run, to the integer."""
    rng = random.Random(2)
    requests = _random_requests(rng, 3, 3000, 19000, (16, 400), (8, 300))
    trace = to_trace(requests)
    s = Settings("vtc", 2048, beta="1/3", weights=(1, 2, 5))
    long = replay(trace, s, steps=20000, record_every=100)
    short = replay(trace, s, steps=5000, record_every=100)
    np.testing.assert_array_equal(long.checkpoints[0][:50], short.checkpoints[0])
    assert long.conservation[0] == [] and short.conservation[0] == []


# ---- hostile input ------------------------------------------------------------------

@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_fuzzed_csv_bytes_load_or_fail_cleanly(tmp_path, data):
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    try:
        trace = read_trace_csv(path)
    except InputError as err:
        assert str(err).startswith(str(path))  # names the file
        return
    trace.validate()  # whatever loads is a valid trace


CELLS = st.one_of(st.integers(-5, 2**40).map(str), st.sampled_from(["nan", "inf", "-inf", "1.5", "1e3", "", " ",
                                                                     "0x10", "٣", "9" * 30, '"1"', "NaN"]),
                  st.text(string.printable, max_size=6))
HEADERS = st.one_of(st.just("arrival,client,prompt,output"), st.just("arrival,client,prompt,output,cached"),
                    st.just("arrival,client,prompt"), st.just("arrival,client,prompt,output,output"),
                    st.just("client,arrival,output,prompt"), st.just(""), st.text(string.printable, max_size=30))


@hsettings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(HEADERS, st.lists(st.lists(CELLS, min_size=3, max_size=6), max_size=6))
def test_fuzzed_csv_text_loads_or_fails_cleanly(tmp_path, header, rows):
    """Whatever loads is a valid trace whose numbers are exactly the file's; whatever does
    not gives one line naming the file (and a line of it when a row is at fault)."""
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "\n".join(",".join(r) for r in rows))
    try:
        trace = read_trace_csv(path)
    except InputError as err:
        message = str(err)
        assert message.startswith(str(path)) and "\n" not in message
        return
    trace.validate()
    columns = [h.strip() for h in header.split(",")]
    data = [r for r in rows if any(c.strip() for c in r)]
    assert len(trace) == len(data)
    for i, row in enumerate(data):
        row = next(csv.reader([",".join(row)]))  # CSV's quoting: the cell "1" holds 1
        cells = dict(zip(columns, (int(c.strip().lstrip("+")) for c in row)))
        assert (trace.arrival[i], trace.client[i], trace.prompt[i], trace.output[i]) == tuple(
            cells[c] for c in ("arrival", "client", "prompt", "output"))


GOOD_TRACE = "arrival,client,prompt,output,cached\n0,0,5,3,1\n1,1,4,2,0\n2,0,3,4,0\n"
FLAG_VALUES = {
    "--policy": st.sampled_from(["vtc", "fcfs", "lcf", "rpm", "VTC", "wfq", ""]),
    "--kv-budget": st.sampled_from(["16", "0", "-3", "1.5", "abc", "99999999999", "5", "64"]),
    "--w-p": st.sampled_from(["1", "0.5", "1/3", "-1", "nan", "inf", "1e999", "x"]),
    "--w-q": st.sampled_from(["2", "0", "3/2", "-2", "NaN"]),
    "--beta": st.sampled_from(["0", "0.25", "1e-3", "-0.1", "inf", "1e5000", "1/0"]),
    "--weights": st.sampled_from(["1,2", "1", "1,2,3", "0,1", "-1,1", "a,b", ",", "1e-5000,1"]),
    "--rpm": st.sampled_from(["1", "3", "0", "-1", "x"]),
    "--rpm-window": st.sampled_from(["5", "0", "-5"]),
    "--clients": st.sampled_from(["2", "3", "1", "0", "1000000000"]),
    "--steps": st.sampled_from(["5", "20", "0", "-1", "1e9"]),
    "--record-every": st.sampled_from(["1", "7", "0"]),
}


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(sorted(FLAG_VALUES)), st.none(), max_size=6).flatmap(
    lambda keys: st.fixed_dictionaries({k: FLAG_VALUES[k] for k in keys})))
def test_fuzzed_cli_flags_end_in_a_result_or_one_error_line(tmp_path, capsys, flags):
    path = tmp_path / "t.csv"
    path.write_text(GOOD_TRACE)
    argv = ["replay", str(path), "--no-cache", "--check"] + [x for kv in flags.items() for x in kv]
    code = cli_main(argv)
    if code == 0:
        out = capsys.readouterr().out
        assert "conservation holds" in out
    else:
        assert code == 2
        one_error_line(capsys.readouterr().err)


SWEEP_VALUES = {
    "--seeds": st.sampled_from(["1", "2", "0", "-4", "x", "1e3"]),
    "--steps": st.sampled_from(["40", "0", "-10", "x"]),
    "--budgets": st.sampled_from(["1024", "100", "0", "a", "2048,x"]),
    "--chunk": st.sampled_from(["1", "0", "-1", "x"]),
    "--base-seed": st.sampled_from(["0", "-1", "x", "4294967296"]),
    "--rates": st.sampled_from(["1.0,0.25", "-1,1", "nan,1", "x", "0,0"]),
    "--prompt": st.sampled_from(["64,512", "5,1", "0,3", "x"]),
    "--devices": st.sampled_from(["1", "0", "9"]),
}


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(sorted(SWEEP_VALUES)), st.none(), max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({k: SWEEP_VALUES[k] for k in keys})))
def test_fuzzed_sweep_flags_end_in_a_result_or_one_error_line(tmp_path, capsys, flags):
    from sweeps import kv_budget

    flags = {"--seeds": "1", "--steps": "40", "--budgets": "1024", **flags}
    out = tmp_path / uuid.uuid4().hex  # a fresh directory per example
    argv = ["--out", str(out), "--no-plots", "--no-cache"] + [x for kv in flags.items() for x in kv]
    code = kv_budget.main(argv)
    captured = capsys.readouterr()
    if code == 0:
        assert (out / "results.json").exists() and (out / "results.csv").exists()
    else:
        assert code == 2
        err = [line for line in captured.err.splitlines() if "error:" in line]
        assert len(err) == 1 and err[0].startswith("python -m sweeps.kv_budget: error: "), captured.err
        assert "Traceback" not in captured.err
        assert not (out / "results.json").exists()


def test_million_row_trace(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 1_000_000
    cols = [rng.integers(0, 100_000, n), rng.integers(0, 8, n), rng.integers(1, 500, n), rng.integers(1, 300, n)]
    path = tmp_path / "big.csv"
    with open(path, "w") as fh:
        fh.write("arrival,client,prompt,output\n")
        np.savetxt(fh, np.stack(cols, axis=1), fmt="%d", delimiter=",")
    assert cli_main(["replay", str(path), "--policy", "vtc", "--kv-budget", "8192", "--steps", "300",
                     "--no-cache", "--check"]) == 0
    assert "conservation holds" in capsys.readouterr().out


def test_billion_step_sparse_replay_jumps_its_idle_steps(tmp_path, capsys):
    """Four requests over 10^9 steps: the idle stretches are jumped (a few dozen events,
    not 10^9) and the numbers are the hand-worked ones."""
    trace = tmp_path / "sparse.csv"
    trace.write_text("arrival,client,prompt,output\n0,0,10,5\n500000000,1,20,3\n"
                     "999999990,0,30,4\n999999990,1,30,4\n")
    out = tmp_path / "out.json"
    assert cli_main(["replay", str(trace), "--policy", "vtc", "--kv-budget", "100", "--steps", "1000000000",
                     "--record-every", "100000000", "--json", str(out), "--no-cache"]) == 0
    got = json.loads(out.read_text())
    # client 0: 10 + 2*5 and 30 + 2*4; client 1: 20 + 2*3 and 30 + 2*4 (w_p = 1, w_q = 2)
    assert got["service"] == [58, 64] and got["steps"] == 10**9
    assert got["max_drift"] == 20 and got["max_drift_step"] == 4  # client 0 alone after its first request
    assert got["checkpoints"]["service"][4] == [20, 0]  # after step 499,999,999: client 1 not arrived
    assert got["checkpoints"]["service"][5] == [20, 26]
    result = replay(read_trace_csv(trace), Settings("vtc", 100), steps=10**9, measures=MeasureConfig.of([]))
    assert result.events[0] < 100
