"""Timed runs on the vllm server: `compare LOG --server vllm --preset NAME` reads the log's
timestamps as exact microseconds, steps last what the step-time model says, and the
latencies are the ones `vllm bench serve` reports. Hand-worked cases first."""

from __future__ import annotations

import csv
import json

import pytest

from vtc_jax.cli.commands import main
from vtc_jax.core.errors import InputError
from vtc_jax.servers import step_time

PRESET = "qwen2.5-7b-h100"  # b0 7051.8, b1 19.54 per prefill token, b2 25.43 per decode token, a0 4680 us


def _compare(tmp_path, log: str, *flags):
    path = tmp_path / "log.csv"
    path.write_text(log)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    requests = tmp_path / "requests.csv"
    argv = ["compare", str(path), "--server", "vllm", "--preset", PRESET, "--policies", "fcfs", "--out", str(out),
            "--requests-out", str(requests), "--no-cache", *flags]
    assert main(argv) == 0
    rows = list(csv.DictReader(requests.open()))
    return rows, json.loads((out / "results.json").read_text())


def test_one_request_worked_by_hand(tmp_path, capsys):
    """One request at t = 100.5 s: prompt 100, output 3. It joins the queue a0 = 4,680 us
    after it arrives. Its prefill step computes 100 tokens: trunc(7051.8 + 19.54 x 100) =
    trunc(9005.8) = 9,005 us, so its first token is at 4,680 + 9,005 = 13,685 us (TTFT
    13.685 ms). Two decode steps of one token, trunc(7051.8 + 25.43) = 7,077 us each: it
    finishes at 13,685 + 2 x 7,077 = 27,839 us (E2EL 27.839 ms), TPOT = (27,839 - 13,685) / 2
    = 7,077 us. Queueing delay: scheduled at 4,680 us."""
    rows, report = _compare(tmp_path, "timestamp,tenant,prompt,output\n100.5,a,100,3\n")
    assert rows == [{"policy": "fcfs", "row": "0", "tenant": "a", "arrival_us": "0", "first_token_us": "13685",
                     "finish_us": "27839", "ttft_us": "13685", "tpot_us": "7077", "e2e_us": "27839", "output": "3",
                     "preemptions": "0"}]
    a = report["policies"]["fcfs"]["tenants"]["a"]
    assert a["ttft"]["p50"] == pytest.approx(13.685) and a["e2el"]["p99"] == pytest.approx(27.839)
    assert a["tpot"]["mean"] == pytest.approx(7.077) and a["queue"]["p50"] == pytest.approx(4.680)
    assert a["output_tokens_per_s"] == pytest.approx(3 / 0.027839)


def test_two_requests_share_a_step_and_goodput(tmp_path, capsys):
    """Two requests arrive together (t = 0, tenants a and b; prompts 100 and 50, outputs 2
    and 1). Both are admitted in one step of 150 prefill tokens: trunc(7051.8 + 19.54 x
    150) = trunc(9982.8) = 9,982 us, ending at 4,680 + 9,982 = 14,662 us: both first tokens
    (b, output 1, finishes there). a's one decode step: 7,077 us, finishing at 21,739 us.
    Goodput with ttft:14 (ms): neither meets it (14.662 ms); with ttft:15 both do, and b
    has no TPOT (one token), which counts as met."""
    log = "timestamp,tenant,prompt,output\n0,a,100,2\n0,b,50,1\n"
    rows, report = _compare(tmp_path, log, "--goodput", "ttft:15")
    assert [(r["tenant"], r["first_token_us"], r["finish_us"], r["tpot_us"]) for r in rows] == [
        ("a", "14662", "21739", "7077"), ("b", "14662", "14662", "")]
    overall = report["policies"]["fcfs"]["overall"]
    assert overall["goodput"] == pytest.approx(2 / 0.021739)
    _, strict = _compare(tmp_path, log, "--goodput", "ttft:14")
    assert strict["policies"]["fcfs"]["overall"]["goodput"] == 0.0


def test_presets_are_exact_decimals():
    model = step_time.preset(PRESET)
    assert dict(model.options()) == {"time_b0": 705180, "time_b1": 1954, "time_b2": 2543, "time_scale": 100}
    assert model.a0 == 4680 and model.num_gpu_blocks == 67660


@pytest.mark.parametrize("flags, words", [
    ([], "needs a step-time model"),
    (["--preset", "nope"], "unknown --preset"),
    (["--preset", PRESET, "--kv-budget", "100"], "--kv-budget is the ideal server's"),
    (["--preset", PRESET, "--goodput", "ttft"], "need NAME:MS"),
    (["--preset", PRESET, "--goodput", "itl:5"], "need NAME:MS"),
    (["--preset", PRESET, "--seeds", "2"], "--seeds"),
])
def test_bad_timed_flags_are_one_line(tmp_path, capsys, flags, words):
    path = tmp_path / "log.csv"
    path.write_text("timestamp,tenant,prompt,output\n0,a,100,3\n")
    assert main(["compare", str(path), "--server", "vllm", "--policies", "fcfs", "--out", str(tmp_path),
                 "--no-cache", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_a_users_step_time_file(tmp_path):
    good = tmp_path / "m.json"
    good.write_text('{"b0": "1000", "b1": "2.5", "b2": "10", "a0": 0, "num_gpu_blocks": 100}')
    model = step_time.read_step_time(good)
    assert dict(model.options()) == {"time_b0": 10000, "time_b1": 25, "time_b2": 100, "time_scale": 10}
    bad = tmp_path / "bad.json"
    bad.write_text('{"b0": "1000", "b1": "2.5", "a0": 0}')
    with pytest.raises(InputError, match="missing key 'b2'"):
        step_time.read_step_time(bad)
