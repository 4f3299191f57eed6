"""Exact ITL percentiles: the vLLM servers' per-token record (servers/base.py TokenTimes,
on with the server option `token_times`) against the literal reference's token times
(vtc_jax.testing.vllm_reference.token_times), timed and untimed, and the pooled gaps that
driver/latency.py reports (vLLM bench serve's ITL: each gap between successive output
tokens of a finished request). One compile per server: every lane of a test module's
batch runs at once."""

from __future__ import annotations

import dataclasses
import types
from fractions import Fraction

import numpy as np
import pytest

from tests.test_vllm_prefix import prefix_lane
from tests.test_vllm_server import lane_input, lane_options, random_lane
from vtc_jax import MeasureConfig, Settings, run_traces
from vtc_jax.cli import timed_compare
from vtc_jax.driver import latency
from vtc_jax.driver.run import workload_pad
from vtc_jax.servers import base, step_time, vllm_v1
from vtc_jax.testing.vllm_reference import TraceRequest, linear_step_time, simulate, token_times

# The hand-worked lane: two requests of prompt 4 and output 4 at t = 0, blocks of 4 tokens,
# 3 usable (num_blocks 4), steps of 10 + prefill + 2 x decode us (b0 10, b1 1, b2 2).
HAND = [TraceRequest(arrival=0, client="a", prompt=4, output=4), TraceRequest(arrival=0, client="b", prompt=4, output=4)]
HAND_CONFIG = {"block_size": 4, "num_blocks": 4, "max_num_batched_tokens": 64, "max_num_seqs": 4}
HAND_TIME = (10, 1, 2, 1)  # time_b0, time_b1, time_b2, time_scale
HAND_TIMED = [[18, 30, 42, 54], [18, 69, 81, 93]]
HAND_STEPS = [[0, 1, 2, 3], [0, 4, 5, 6]]
# Preempted before its first token: b's first chunk (2 of 8 tokens) at step 0, then at step 1
# a's decode takes the last free block and b preempts itself; b comes back at step 8.
EARLY = [TraceRequest(arrival=0, client="a", prompt=4, output=8), TraceRequest(arrival=0, client="b", prompt=8, output=2)]
EARLY_CONFIG = {"block_size": 4, "num_blocks": 4, "max_num_batched_tokens": 6, "max_num_seqs": 4}


def _time_options(timing: tuple) -> dict:
    """The `time_model` option of (b0, b1, b2, scale): steps of (b0 + b1 p + b2 d) / scale us
    (scale 0: untimed)."""
    b0, b1, b2, scale = timing
    if not scale:
        return {"time_model": ""}
    return dict(step_time.StepTime.linear(*(Fraction(b, scale) for b in (b0, b1, b2))).options())


def _timing(rng: np.random.Generator) -> tuple:
    """A random step-time model in scaled integers (30%: untimed, time_scale 0)."""
    if rng.random() < 0.3:
        return (0, 0, 0, 0)
    return (int(rng.integers(0, 31)), int(rng.integers(0, 5)), int(rng.integers(0, 7)), int(rng.choice([1, 10])))


def _timed_lane(rng: np.random.Generator, make) -> tuple:
    """(requests, config, timing): a random lane (`make`), its arrivals spread over up to
    40 us a step when timed, so that timed lanes also go idle between bursts."""
    requests, config = make(rng)
    timing = _timing(rng)
    if timing[3]:
        spread = int(rng.integers(1, 41))
        requests = [dataclasses.replace(r, arrival=r.arrival * spread) for r in requests]
    return requests, config, timing


def _reference(requests, config, timing) -> list[list[int]]:
    return token_times(requests, config, step_time=linear_step_time(*timing) if timing[3] else None)


def run_lanes(lanes: list[tuple], server: str = "vllm", record: list[int] | None = None):
    """Every lane (requests, reference config, timing) in one batch of `server`, each lane
    asking for `record[i]` token times (default: its own output tokens). Returns (result,
    traces, num_clients)."""
    inputs = [lane_input(reqs, config) for reqs, config, _ in lanes]
    k = max(t.num_clients for t, _ in inputs)
    rows = max(len(reqs) for reqs, _, _ in lanes)
    record = record or [sum(r.output for r in reqs) for reqs, _, _ in lanes]
    settings = [Settings(policy="fcfs", kv_budget=1 << 29, bands=None if b is None else tuple(b + [0] * (k - len(b))),
                         server_options=tuple({**lane_options(reqs, config, rows), **_time_options(timing),
                                               "token_times": size}.items()))
                for (_, b), (reqs, config, timing), size in zip(inputs, lanes, record)]
    res = run_traces([t for t, _ in inputs], settings, num_clients=k, server=server, measures=MeasureConfig())
    assert res.finished.all()
    return res, [t for t, _ in inputs], k


def engine_tokens(res, trace, k: int, lane: int) -> list:
    """Per trace row, the server's token times (a list; None without a whole record)."""
    at, first = latency.token_record(res, trace, k, workload_pad(), lane)
    return [None if f < 0 else at[f:f + o].tolist() for f, o in zip(first, trace.output)]


def _table(res, trace, k, lane):
    return latency.request_table(res, trace, k, workload_pad(), np.asarray(trace.arrival, np.int64), lane)


@pytest.fixture(scope="module")
def vllm_batch():
    """The hand lane timed and untimed, 120 random lanes (60 fcfs, 60 priority; 70%
    timed), and a lane whose record is too small (the batch's T, the most any lane asks
    for, is 3 below its output tokens): one batch, one compile."""
    rng = np.random.default_rng(11)
    lanes = [(HAND, HAND_CONFIG, HAND_TIME), (HAND, HAND_CONFIG, (0, 0, 0, 0))]
    lanes.append((EARLY, EARLY_CONFIG, (0, 0, 0, 0)))  # also checked against the reference with the random lanes
    lanes += [_timed_lane(rng, lambda g, p=policy: random_lane(g, p)) for policy in ("fcfs", "priority") for _ in range(60)]
    outputs = [sum(r.output for r in reqs) for reqs, _, _ in lanes]
    big = [TraceRequest(arrival=0, client="a", prompt=4, output=max(outputs) // 2 + 2) for _ in range(2)]
    lanes.append((big, {"block_size": 4, "num_blocks": 64, "max_num_batched_tokens": 64, "max_num_seqs": 2}, HAND_TIME))
    record = outputs + [2 * big[0].output - 3]
    res, traces, k = run_lanes(lanes, record=record)
    return lanes, res, traces, k


def test_hand_worked_itl_across_a_preemption(vllm_batch):
    """Both requests are admitted at t = 0 (1 block each, 1 left): a step of 8 prefill
    tokens, 10 + 8 = 18 us, both first tokens at 18. At t = 18 a's decode takes the last
    free block (a's 5th token needs a 2nd block); b's then has none and b, the newest,
    preempts itself (recompute: its 1 generated token is kept). a decodes alone: steps of
    10 + 2 = 12 us, tokens at 30, 42, 54 (a finishes; b cannot come back before: its 5
    tokens need 2 blocks, 1 is free while a holds 2). At t = 54 b is admitted and
    recomputes its 5 tokens: 10 + 5 = 15 us, its 2nd token at 69, then decodes at 81, 93.
    ITL gaps: a 12, 12, 12; b 51 (the stall), 12, 12. Pooled, sorted: 12 x 5, 51: mean
    111 / 6 = 18.5 us; p50 12; p90 (numpy's linear interpolation at 0.9 x 5 = 4.5) 12 +
    0.5 x 39 = 31.5; p99 (at 4.95) 12 + 0.95 x 39 = 49.05. Tenant b alone (12, 12, 51):
    p90 at 1.8, 12 + 0.8 x 39 = 43.2. Untimed, the same schedule in steps: a at 0, 1, 2, 3,
    b at 0, 4, 5, 6."""
    assert token_times(HAND, HAND_CONFIG, step_time=linear_step_time(*HAND_TIME)) == HAND_TIMED
    assert token_times(HAND, HAND_CONFIG) == HAND_STEPS
    assert simulate(HAND, HAND_CONFIG)["requests"]["1"]["preemptions"] == 1
    _, res, traces, k = vllm_batch
    assert engine_tokens(res, traces[0], k, 0) == HAND_TIMED and engine_tokens(res, traces[1], k, 1) == HAND_STEPS
    table = _table(res, traces[0], k, 0)
    assert table["itl_us"].tolist() == [12, 12, 12, 51, 12, 12] and table["itl_row"].tolist() == [0, 0, 0, 1, 1, 1]
    tenant, prompt = np.asarray(traces[0].client), np.asarray(traces[0].prompt)
    summary = latency.summarize(table, tenant, ["a", "b"], prompt, {})
    assert summary["overall"]["itl"] == pytest.approx({"mean": 0.0185, "p50": 0.012, "p90": 0.0315, "p99": 0.04905},
                                                      rel=1e-12)
    assert summary["overall"]["itl"]["mean"] == summary["overall"]["itl_mean"]
    assert summary["tenants"]["b"]["itl"]["p90"] == pytest.approx(0.0432, rel=1e-12)
    assert summary["tenants"]["a"]["itl"] == pytest.approx({"mean": 0.012, "p50": 0.012, "p90": 0.012, "p99": 0.012})
    bench = latency.bench_serve(table, tenant, ["a", "b"], prompt, {})
    assert bench["median_itl_ms"] == pytest.approx(0.012) and bench["p99_itl_ms"] == pytest.approx(0.04905)
    assert bench["std_itl_ms"] == pytest.approx(np.std([12, 12, 12, 51, 12, 12]) / 1000, rel=1e-12)
    assert bench["mean_itl_ms"] == summary["overall"]["itl_mean"]
    assert bench["tenants"]["b"]["median_itl_ms"] == pytest.approx(0.012)
    # compare's table: ITL p50 and p99 beside TPOT's (values set apart from the others to find them)
    shown = dict(summary, overall=dict(summary["overall"], itl={"p50": 7.5, "p99": 51.0}), finished_all=True)
    text = timed_compare.format_report({"server": "vllm", "step_time": "hand", "settings": {},
                                        "policies": {"fcfs": shown}}, ["a", "b"]).splitlines()
    head, row = text[1].replace(" p", "_p").split(), next(line for line in text if " all " in line).split()
    assert head[5:9] == ["TPOT_p50", "TPOT_p99", "ITL_p50", "ITL_p99"] and row[7:9] == ["7.5", "51.0"]


def test_first_scheduling_survives_a_preemption_before_the_first_token(vllm_batch):
    """EARLY (untimed, budget 6, 3 usable blocks of 4): step 0 schedules a's 4 prompt
    tokens and b's first 2 (1 block each, 1 left); at step 1 a's 5th token takes the last
    block, b's next chunk finds none and b, the newest, preempts itself with no token yet.
    a decodes to step 7; b is admitted again at step 8 (6 tokens), 9 (its last 2: first
    token), 10 (its 2nd, finished). Its queueing delay is from its first scheduling, step
    0, not its readmission at 8."""
    assert simulate(EARLY, EARLY_CONFIG)["steps"][1]["preempted"] == [1]
    _, res, traces, k = vllm_batch
    table = _table(res, traces[2], k, 2)
    assert table["scheduled_us"].tolist() == [0, 0] and table["first_token_us"].tolist() == [0, 9]
    assert table["preemptions"].tolist() == [0, 1] and table["queue_us"].tolist() == [0.0, 0.0]


def test_token_times_match_the_reference_on_random_lanes(vllm_batch):
    """Every token's time on 120 random lanes (fcfs and priority, preemptions, chunked
    prefill, idle gaps; timed and untimed) is the reference's, and the exact mean of the
    pooled gaps is `_itl_mean`'s (first token to finish over output - 1) to the last bit."""
    lanes, res, traces, k = vllm_batch
    preempted = 0
    for lane, (reqs, config, timing) in enumerate(lanes[2:-1], start=2):
        assert engine_tokens(res, traces[lane], k, lane) == _reference(reqs, config, timing), f"lane {lane}"
        table = _table(res, traces[lane], k, lane)
        gaps, count = table["itl_us"], int((table["output"] - 1).sum())
        assert gaps.size == count and np.all(gaps >= 0)
        if count:
            assert latency._itl_mean(table, table["finished"]) == float(gaps.sum() / count / 1000.0)
        preempted += int(table["preemptions"].sum() > 0)
    assert preempted >= 20  # gaps across a preemption are exercised


def test_a_record_too_small_keeps_whole_rows_only(vllm_batch):
    """The last lane's two requests need 2 x O entries and the record has 2 x O - 3: the
    first admitted keeps its whole record, the second none; with a finished request
    lacking its record, ITL has its mean only (never percentiles over part of it)."""
    lanes, res, traces, k = vllm_batch
    reqs, config, timing = lanes[-1]
    want = _reference(reqs, config, timing)
    assert engine_tokens(res, traces[-1], k, len(lanes) - 1) == [want[0], None]
    table = _table(res, traces[-1], k, len(lanes) - 1)
    assert table["itl_us"] is None
    summary = latency.summarize(table, np.asarray(traces[-1].client), ["a"], np.asarray(traces[-1].prompt), {})
    assert summary["overall"]["itl"]["p50"] is None and summary["overall"]["itl"]["mean"] is not None


def test_prefix_caching_server_keeps_the_same_record():
    """vllm_prefix: 24 random prefix-caching lanes (fcfs and priority), timed and untimed,
    against the reference with prefix caching."""
    rng = np.random.default_rng(5)
    lanes = [_timed_lane(rng, lambda g, p=policy: prefix_lane(g, p)) for policy in ("fcfs", "priority") for _ in range(12)]
    res, traces, k = run_lanes(lanes, server="vllm_prefix")
    for lane, (reqs, config, timing) in enumerate(lanes):
        assert engine_tokens(res, traces[lane], k, lane) == _reference(reqs, config, timing), f"lane {lane}"


def test_no_record_unless_asked():
    """Without `token_times` the record is empty (nothing allocated, nothing written) and
    ITL has its exact mean only, as before; T is the most any lane of a batch asks for."""
    shape = base.ServerShape(num_clients=2, calendar_rows=8, slots=4, num_rows=10,
                             static=vllm_v1.static_options([{"num_gpu_blocks": 8}]))
    times = vllm_v1.init(shape).out.times
    assert times.at.shape == (0,) and times.offset.shape == (0,)
    assert dict(vllm_v1.static_options([{"num_gpu_blocks": 8, "token_times": 5}, {"num_gpu_blocks": 8}]))[
        "token_times"] == 5
    out = types.SimpleNamespace(times=times)
    assert latency.token_record(types.SimpleNamespace(server_state=types.SimpleNamespace(out=out)), None, 2, 5) is None
    assert base.token_rows(times, 3, 7, True) is times and base.token_stamps(times, np.zeros(4), 0, 9, True) is times


def test_the_record_is_refused_past_its_memory_limit(monkeypatch, capsys):
    """compare asks for one entry per output token and lane; past RECORD_BYTES it asks for
    none and says so in one line (ITL's mean stays exact)."""
    assert timed_compare.token_times_option(np.array([3, 5]), 2) == {"token_times": 8}
    monkeypatch.setattr(timed_compare, "RECORD_BYTES", 63)  # 8 tokens x 2 lanes x 4 bytes = 64
    assert timed_compare.token_times_option(np.array([3, 5]), 2) == {}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "only ITL's mean is reported" in err[0]
