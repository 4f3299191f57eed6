"""sweeps.kv_blocks: vLLM's KV blocks x token budget x policy on the vllm server. Its numbers
are checked against direct runs of the same lanes: fcfs against the literal reference
(vtc_jax.testing.vllm_reference), vtc against run_traces, untimed and timed."""

from __future__ import annotations


import numpy as np
import pytest

from sweeps import kv_blocks
from tests.helpers import metrics_by_label, sweep_result
from vtc_jax.core.rows import ARRIVAL, OUTPUT, PROMPT
from vtc_jax.driver import run
from vtc_jax.driver.latency import request_table
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.sources import TrafficSource
from vtc_jax.inputs.traffic import overload
from vtc_jax.inputs.workload import Trace
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.servers import step_time
from vtc_jax.testing.vllm_reference import TraceRequest, simulate

STEPS = 200
SMALL = ["--workloads", "overload", "--block-size", "4", "--blocks", "17", "--budgets", "16,64", "--max-num-seqs", "8",
         "--rates", "0.6,0.15",
         "--prompt", "8,24", "--output", "2,8", "--steps", str(STEPS), "--seeds", "2", "--policy", "fcfs,vtc", "--no-plots",
         "--no-cache"]


def _sweep(tmp_path, *flags):
    result = sweep_result(kv_blocks.main, tmp_path / "kvb", *SMALL, *flags)
    return metrics_by_label(result), result


def _lanes(unit: int):
    """The sweep's lanes as traces (seed 0 and 1 of its overload source): arrival, client,
    prompt, output of the requests that arrive before the horizon, in arrival order."""
    source = TrafficSource(overload([0.6 / unit, 0.15 / unit], STEPS * unit, prompt=(8, 24), output=(2, 8)))
    config = run.source_config([source] * 2, [Settings("fcfs", 64)] * 2, measures=MeasureConfig())
    workload = run.generate_workloads([source] * 2, [0, 1], config)
    traces = []
    for lane in range(2):
        requests = np.asarray(workload.requests[lane], np.int64)
        first = np.asarray(workload.first[lane])
        client = np.searchsorted(first, np.arange(len(requests)), side="right") - 1
        live = requests[:, ARRIVAL] < source.horizon
        order = np.lexsort((np.flatnonzero(live), client[live], requests[live, ARRIVAL]))
        rows, who = requests[live][order], client[live][order]
        traces.append(Trace(rows[:, ARRIVAL], who, rows[:, PROMPT], rows[:, OUTPUT], np.zeros(len(rows), np.int64)))
    return traces


def _p99(values):
    return float(np.percentile(values, 99)) if len(values) else np.nan


def _check(metrics, label, per_lane):
    """per_lane: [(ttft of tenant 0, of tenant 1, max_drift)] of each seed."""
    for c in range(2):
        want = np.nanmean([_p99(lane[c]) for lane in per_lane])
        assert metrics[label][f"ttft_p99_t{c}"]["mean"] == pytest.approx(want, rel=1e-12), (label, c)
    everyone = np.mean([_p99(np.concatenate(lane[:2])) for lane in per_lane])
    assert metrics[label]["ttft_p99_all"]["mean"] == pytest.approx(everyone, rel=1e-12)
    if per_lane[0][2] is not None:
        assert metrics[label]["max_drift"]["mean"] == pytest.approx(np.mean([lane[2] for lane in per_lane]), rel=1e-12)


def _direct(traces, settings, steps: int, offset):
    """[(ttft of tenant 0, of tenant 1, max_drift)] per (settings, trace), from one
    run_traces batch; TTFT = (first token - arrival) + offset(trace)."""
    lanes = [(s, t) for s in settings for t in traces]
    r = run.run_traces([t for _, t in lanes], [s for s, _ in lanes], num_clients=2, steps=steps, server="vllm")
    out = []
    for i, (_, trace) in enumerate(lanes):
        ttft = request_table(r, trace, 2, run.workload_pad(), trace.arrival, i)["ttft_us"] + offset
        out.append(tuple(ttft[(trace.client == c) & np.isfinite(ttft)] for c in range(2)) + (float(r.max_drift[i]),))
    return [out[j:j + len(traces)] for j in range(0, len(out), len(traces))]


def test_untimed_sweep_agrees_with_the_reference_and_run_traces(tmp_path):
    metrics, result = _sweep(tmp_path)
    assert result["config"]["ttft_unit"] == "steps"
    traces = _lanes(1)
    budgets = (16, 64)
    options = [{"block_size": 4, "num_gpu_blocks": 17, "max_num_batched_tokens": b, "max_num_seqs": 8} for b in budgets]
    for budget in budgets:  # fcfs: the literal reference; TTFT = first-token step - arrival + 1
        config = {"block_size": 4, "num_blocks": 17, "max_num_batched_tokens": budget, "max_num_seqs": 8}
        per_lane = []
        for trace in traces:
            requests = [TraceRequest(int(a), str(c), int(p), int(o))
                        for a, c, p, o in zip(trace.arrival, trace.client, trace.prompt, trace.output)]
            got = simulate(requests, config)["requests"]
            first = np.asarray([got[str(i)]["first_token_step"] for i in range(len(requests))], np.int64)
            ttft = np.where(first < STEPS, first - trace.arrival + 1, -1)
            per_lane.append(tuple(ttft[(trace.client == c) & (ttft >= 0)] for c in range(2)) + (None,))
        _check(metrics, f"overload N=17 T={budget} fcfs", per_lane)
    settings = [Settings("vtc", 64, server_options=tuple(sorted(o.items()))) for o in options]
    for budget, per_lane in zip(budgets, _direct(traces, settings, STEPS, 1)):  # vtc: direct runs of the traces
        _check(metrics, f"overload N=17 T={budget} vtc", per_lane)
    # 0.75 requests per step against a measured capacity of about 0.5: overloaded
    assert all(m["offered_over_capacity"]["mean"] > 1 for m in metrics.values())


def test_timed_sweep_is_in_ms_and_agrees_with_run_traces(tmp_path):
    model = step_time.preset("qwen2.5-7b-h100")
    metrics, result = _sweep(tmp_path, "--preset", "qwen2.5-7b-h100", "--step-seconds", "0.01", "--budgets", "64",
                             "--policy", "vtc")
    assert result["config"]["ttft_unit"] == "ms" and result["config"]["us_per_step"] == 10000
    options = {"block_size": 4, "num_gpu_blocks": 17, "max_num_batched_tokens": 64, "max_num_seqs": 8,
               **dict(model.options())}
    settings = [Settings("vtc", 64, server_options=tuple(sorted(options.items())))]
    (per_lane,) = _direct(_lanes(10000), settings, STEPS * 10000, model.a0)  # TTFT includes a0
    per_lane = [tuple(x / 1000 for x in lane[:2]) + lane[2:] for lane in per_lane]
    _check(metrics, "overload N=17 T=64 vtc", per_lane)


@pytest.mark.parametrize("flags, words", [
    (["--server", "ideal", "--workloads", "overload"], "runs on --server vllm"),
    (["--num-gpu-blocks", "100"], "--num-gpu-blocks: this sweep's grid sets it"),
    (["--blocks", "3"], "--blocks 3 with --budgets 16: overload's longest request"),
    (["--workloads", "overload,zipf"], "--workloads"),
    (["--step-seconds", "0.01"], "--step-seconds applies to a timed run"),
    (["--preset", "qwen2.5-7b-h100", "--step-time", "x.json"], "not both"),
    (["--preset", "nope"], "unknown --preset"),
    (["--no-enable-chunked-prefill", "--budgets", "16"], "could never be served"),
    (["--trace", "t.csv"], "--trace"),
    (["--policy", "fcfs,fcfs"], "twice"),
    (["--blocks", "17,17"], "each value once"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, words):
    base = [] if "ideal" in flags else SMALL
    assert kv_blocks.main([*base, "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and err.startswith("python -m sweeps.kv_blocks: error:"), err
    assert not (tmp_path / "o").exists()


def test_servegen_rows_are_scaled_to_the_largest_servers_measured_capacity():
    """servegen: one workload for the whole grid, offering --load x the measured capacity
    (requests per step, on its own length mix) of the grid's largest server; prompts
    clipped so every request fits the smallest pool. (That capacity is the saturating
    run's on the mix: tests/test_sweeps.py checks it against capacity.measure.)"""
    from vtc_jax.cli import sweep_command

    parser = sweep_command.base_parser("kv_blocks", "")
    kv_blocks.add_arguments(parser)
    args = sweep_command.parse_args(parser, ["--workloads", "servegen", "--blocks", "65,129", "--budgets", "256",
                                             "--max-output", "128", "--steps", "400", "--load", "1.5",
                                             "--policy", "vtc"])
    sweep = kv_blocks.build(args)
    source = sweep.rows[0].source
    assert all(r.source is source for r in sweep.rows) and source.plan.max_prompt == 64 * 16 - 128 + 1
    caps = {r.extra["num_gpu_blocks"]: r.extra["capacity_per_unit"] for r in sweep.rows}
    assert source.plan.expected_requests.sum() / 400 == pytest.approx(1.5 * caps[129], rel=1e-6)
    assert caps[65] < caps[129]  # a larger pool serves more of the same mix
