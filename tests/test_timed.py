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

pytestmark = pytest.mark.usefixtures("capacity_once_per_mix")

PRESET = "qwen2.5-7b-h100"  # b0 7051.8, b1 19.54 per prefill token, b2 25.43 per decode token, a0 4680 us
# The hand-worked cases of two requests hold at most 2 seats, so their schedule is the same on
# 8 as on the preset's default 1,024 (test_one_request_worked_by_hand runs those defaults);
# the load line's saturating run is then 256 requests, not 4 x 1,024.
FEW_SEATS = ("--max-num-seqs", "8")


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
    return rows, json.loads((out / "results.json").read_text())["latency"]  # one schema: the latency report


def test_one_request_worked_by_hand(tmp_path, capsys):
    """One request at t = 100.5 s: prompt 100, output 3. It joins the queue a0 = 4,680 us
    after it arrives. Its prefill step computes 100 tokens: trunc(7051.8 + 19.54 x 100) =
    trunc(9005.8) = 9,005 us, so its first token is at 4,680 + 9,005 = 13,685 us (TTFT
    13.685 ms). Two decode steps of one token, trunc(7051.8 + 25.43) = 7,077 us each: it
    finishes at 13,685 + 2 x 7,077 = 27,839 us (E2EL 27.839 ms), TPOT = (27,839 - 13,685) / 2
    = 7,077 us, and ITL's two gaps are 7,077 us each. Queueing delay: scheduled at 4,680 us."""
    rows, report = _compare(tmp_path, "timestamp,tenant,prompt,output\n100.5,a,100,3\n")
    assert rows == [{"policy": "fcfs", "row": "0", "tenant": "a", "arrival_us": "0", "scheduled_us": "4680",
                     "first_token_us": "13685", "finish_us": "27839", "ttft_us": "13685", "tpot_us": "7077",
                     "e2e_us": "27839", "prompt": "100", "output": "3", "preemptions": "0",
                     # its GPU time: the steps' shares, each trunc(own terms) + trunc(b0) over one request:
                     # (1954 + 7051) + 2 x (25 + 7051) = 23157 us (the steps last 23159: 1 us of truncation each)
                     "gpu_time_us": "23157"}]
    a = report["policies"]["fcfs"]["tenants"]["a"]
    assert a["ttft"]["p50"] == pytest.approx(13.685) and a["e2el"]["p99"] == pytest.approx(27.839)
    assert a["tpot"]["mean"] == pytest.approx(7.077) and a["queue"]["p50"] == pytest.approx(4.680)
    assert a["output_tokens_per_s"] == pytest.approx(3 / 0.027839)
    bench = json.loads((tmp_path / "out" / "bench_serve.json").read_text())["fcfs"]
    assert (bench["completed"], bench["failed"], bench["total_input_tokens"], bench["total_output_tokens"]) == (1, 0, 100, 3)
    assert bench["mean_ttft_ms"] == bench["median_ttft_ms"] == bench["p99_ttft_ms"] == pytest.approx(13.685)
    assert bench["std_ttft_ms"] == 0.0 and bench["mean_e2el_ms"] == pytest.approx(27.839)
    assert bench["mean_tpot_ms"] == bench["mean_itl_ms"] == pytest.approx(7.077)
    assert bench["median_itl_ms"] == pytest.approx(7.077) and bench["request_goodput"] is None  # no --goodput
    assert bench["output_throughput"] == pytest.approx(3 / 0.027839)
    assert bench["tenants"]["a"]["p90_tpot_ms"] == pytest.approx(7.077)


def test_two_requests_share_a_step_and_goodput(tmp_path, capsys):
    """Two requests arrive together (t = 0, tenants a and b; prompts 100 and 50, outputs 2
    and 1). Both are admitted in one step of 150 prefill tokens: trunc(7051.8 + 19.54 x
    150) = trunc(9982.8) = 9,982 us, ending at 4,680 + 9,982 = 14,662 us: both first tokens
    (b, output 1, finishes there). a's one decode step: 7,077 us, finishing at 21,739 us.
    Goodput with ttft:14 (ms): neither meets it (14.662 ms); with ttft:15 both do, and b
    has no TPOT (one token), which counts as met."""
    log = "timestamp,tenant,prompt,output\n0,a,100,2\n0,b,50,1\n"
    rows, report = _compare(tmp_path, log, *FEW_SEATS, "--goodput", "ttft:15")
    assert [(r["tenant"], r["first_token_us"], r["finish_us"], r["tpot_us"]) for r in rows] == [
        ("a", "14662", "21739", "7077"), ("b", "14662", "14662", "")]
    overall = report["policies"]["fcfs"]["overall"]
    assert overall["goodput"] == pytest.approx(2 / 0.021739)
    _, strict = _compare(tmp_path, log, *FEW_SEATS, "--goodput", "ttft:14")
    assert strict["policies"]["fcfs"]["overall"]["goodput"] == 0.0


def test_presets_are_exact_decimals():
    model = step_time.preset(PRESET)
    assert dict(model.options()) == {"time_model": "per_step=7051.8,per_prefill_token=19.54,per_decode_token=25.43"}
    assert model.a0 == 4680 and model.num_gpu_blocks == 67660


@pytest.mark.parametrize("flags, words", [
    ([], "needs a step-time model"),
    (["--preset", "nope"], "unknown --preset"),
    (["--preset", PRESET, "--kv-budget", "100"], "--kv-budget is the ideal server's"),
    (["--preset", PRESET, "--goodput", "ttft"], "need NAME:MS"),
    (["--preset", PRESET, "--goodput", "itl:5"], "need NAME:MS"),
    (["--preset", PRESET, "--max-num-seqs", "9000", "--max-num-batched-tokens", "100"],
     "max_num_batched_tokens (100) is below max_num_seqs (9000)"),
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
    assert dict(model.options()) == {"time_model": "per_step=1000,per_prefill_token=2.5,per_decode_token=10"}
    bad = tmp_path / "bad.json"
    bad.write_text('{"b0": "1000", "b1": "2.5", "a0": 0}')
    with pytest.raises(InputError, match="missing key 'b2'"):
        step_time.read_step_time(bad)


# ---- the load line against the server's measured capacity (driver/capacity.py) ----------

def test_saturated_rate_by_hand():
    from vtc_jax.driver.capacity import saturated_rate

    # window from the 2nd completion (t = 20) to the last first scheduling (t = 35): the
    # completions at 30 and 35 are inside it, 2 in 15 units
    rate, window, inside = saturated_rate([10, 20, 30, 35, 50], [0, 0, 10, 20, 35], hold=2)
    assert (rate, window, inside) == (2 / 15, (20, 35), 2)
    with pytest.raises(InputError, match="did not finish"):
        saturated_rate([10, -1], [0, 0], hold=1)


def _small_server(*more):
    return ("--num-gpu-blocks", "64", "--max-num-seqs", "1", "--max-num-batched-tokens", "512", *more)


def test_capacity_of_one_seat_is_one_request_per_period():
    """One seat, every request prompt 100 and output 3: a request's prefill step lasts
    trunc(7051.8 + 19.54 x 100) = 9,005 us and its two decode steps 7,077 us each; the next
    waits for the seat, so the server completes one request per 23,159 us (43.18 requests/s)
    and, untimed, one per 3 steps."""
    from vtc_jax.servers.records import vllm_memory as memory_tokens
    from vtc_jax.driver.capacity import measure
    from vtc_jax.engines.settings import Settings

    options = {"num_gpu_blocks": 64, "max_num_seqs": 1, "max_num_batched_tokens": 512}
    timed = tuple(sorted({**options, **dict(step_time.preset(PRESET).options())}.items()))
    got = measure([100], [3], Settings("vtc", memory_tokens(options), server_options=timed), "vllm")
    assert got.timed and got.per_second == pytest.approx(1e6 / 23159, rel=1e-12) and got.requests == 256
    untimed = measure([100], [3], Settings("vtc", memory_tokens(options), server_options=tuple(sorted(options.items()))),
                      "vllm")
    assert not untimed.timed and untimed.per_second == pytest.approx(1 / 3, rel=1e-12)


def _even_log(rate_per_s: float, n: int) -> str:
    gap = 1 / rate_per_s
    return "timestamp,tenant,prompt,output\n" + "".join(
        f"{i * gap:.6f},{'ab'[i % 2]},100,3\n" for i in range(n))


@pytest.mark.parametrize("fraction, overloaded", [(0.8, False), (1.5, True)])
def test_load_line_is_against_measured_capacity(tmp_path, capsys, fraction, overloaded):
    """A log at 0.8 of the one-seat server's capacity (43.18 requests/s, above) is not
    called overloaded and its queueing delay stays under one request's period; at 1.5 it is,
    and its queue grows."""
    capacity = 1e6 / 23159
    n = 60
    _, report = _compare(tmp_path, _even_log(fraction * capacity, n), *_small_server())
    load = report["load"]
    assert load["capacity"]["requests_per_s"] == pytest.approx(capacity, rel=1e-12)
    assert load["offered_load"] == pytest.approx(fraction * n / (n - 1), rel=1e-4)
    line = capsys.readouterr().out.strip().splitlines()
    line = next(x for x in line if x.startswith("load: the log"))  # the latency report's (the sweep's load table is first)
    assert f"offered load {fraction * n / (n - 1):.2f}" in line and ("OVERLOAD" in line) == overloaded
    queue_p99 = report["policies"]["fcfs"]["overall"]["queue"]["p99"]
    assert (queue_p99 > 100) == overloaded and (queue_p99 < 23.159) != overloaded


def test_itl_mean_pools_every_gap(tmp_path):
    """a (prompt 100, output 3) and b (prompt 50, output 2) arrive together. One prefill
    step of 150 tokens (9,982 us) gives both first tokens at 14,662 us; a decode step of 2
    tokens, trunc(7051.8 + 25.43 x 2) = 7,102 us, ends b at 21,764 us; one of 1 token
    (7,077 us) ends a at 28,841 us. vLLM's mean ITL pools the gaps 7,102, 7,077 (a) and
    7,102 (b): 7,093.67 us, not the mean of the TPOTs (7,089.5 and 7,102: 7,095.75)."""
    rows, report = _compare(tmp_path, "timestamp,tenant,prompt,output\n0,a,100,3\n0,b,50,2\n", *FEW_SEATS)
    assert [(r["first_token_us"], r["finish_us"]) for r in rows] == [("14662", "28841"), ("14662", "21764")]
    overall = report["policies"]["fcfs"]["overall"]
    assert overall["itl_mean"] == pytest.approx((7102 + 7077 + 7102) / 3 / 1000, rel=1e-12)
    assert overall["tpot"]["mean"] == pytest.approx((7089.5 + 7102) / 2 / 1000, rel=1e-12)
    assert report["policies"]["fcfs"]["tenants"]["b"]["itl_mean"] == pytest.approx(7.102, rel=1e-12)


def test_mooncake_hash_ids_share_blocks_by_hand(tmp_path):
    """Mooncake's hash_ids drive vLLM's prefix caching. Two requests of 1,100 tokens (3
    Mooncake blocks of 512 tokens), output 2, share their first two ids (group "0/1",
    prefix_len 1,024). r1 at t = 0: prefill 1,100 tokens, trunc(7051.8 + 19.54 x 1100) =
    28,545 us, first token at 4,680 + 28,545 = 33,225 us. r2 at t = 1 s finds r1's 64 hashed
    blocks of 16 tokens (1,024 tokens) cached: its prefill computes 76 tokens,
    trunc(7051.8 + 19.54 x 76) = 8,536 us, first token 4,680 + 8,536 = 13,216 us after it
    arrives; --requests-out says so (cached_tokens 0 and 1,024). Prefix caching is on by
    default (the log carries hash_ids, as vLLM V1); with --no-enable-prefix-caching both
    take 33,225 us."""
    path = tmp_path / "moon.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [0, 1, 5]}\n'
                    '{"timestamp": 1000, "input_length": 1100, "output_length": 2, "hash_ids": [0, 1, 3]}\n')
    got = {}
    for flags in (("--no-enable-prefix-caching",), ()):
        out, requests = tmp_path / f"out{len(flags)}", tmp_path / f"requests{len(flags)}.csv"
        argv = ["compare", str(path), "--server", "vllm", "--preset", PRESET, "--policies", "fcfs", "--out", str(out),
                "--requests-out", str(requests), "--num-gpu-blocks", "256", "--no-cache", *FEW_SEATS, *flags]
        assert main(argv) == 0
        got[not flags] = [(r["arrival_us"], r["ttft_us"], r.get("cached_tokens")) for r in csv.DictReader(requests.open())]
    assert got[False] == [("0", "33225", None), ("1000000", "33225", None)]
    assert got[True] == [("0", "33225", "0"), ("1000000", "13216", "1024")]
