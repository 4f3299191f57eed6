"""A wide clock (core/clock.py): arrivals past 2^30 steps or microseconds run in one pass
on int64 stamps, and give the schedule of the same trace at its narrow times, shifted.

Time-translation is the check: the servers and policies read time only through differences
and order (vLLM's, VTC's, LAS's waits, WFQ's arrival ties), so a trace moved by OFFSET
(past 2^32, where an int32 stamp would wrap) must give the same schedule, every stamp moved
by OFFSET, every count and counter equal. A stamp cut to int32 anywhere breaks it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vtc_jax import InputError, MeasureConfig, Settings, Trace, run_traces
from vtc_jax.core import clock
from vtc_jax.servers import vllm_prefix, vllm_v1

OFFSET = (1 << 33) + 12_345  # past 2^32: a cut or wrapped stamp cannot agree by chance
TIMED = {"time_model": "per_step=7051.8,per_prefill_token=19.54,per_decode_token=25.43"}  # qwen2.5-7b-h100's model


def _lane(rng: random.Random, server: str, timed: bool, asynchronous: bool):
    """A random small trace (1-3 clients, 3-12 requests in bursts) and valid settings."""
    n = rng.randint(3, 12)
    scale = 20_000 if timed else 1  # a timed lane's arrivals are microseconds
    bursts = [rng.randint(0, 40) * scale for _ in range(rng.randint(1, 3))]
    rows = [(rng.choice(bursts) + rng.randint(0, 2) * scale, rng.randint(0, 2), rng.randint(1, 40), rng.randint(1, 12))
            for _ in range(n)]
    trace = Trace.from_rows(rows)
    module = vllm_prefix if server == "vllm_prefix" else vllm_v1
    options = module.fuzz_options(rng, trace.prompt, trace.output)
    if timed:
        options.update(TIMED)
    if asynchronous:
        options["async_scheduling"] = True
    return trace, options


def _shifted(trace: Trace, by: int) -> Trace:
    return Trace(trace.arrival + by, trace.client, trace.prompt, trace.output, trace.cached)


def _run(traces, settings, server):
    k = max(t.num_clients for t in traces)
    return run_traces(traces, settings, num_clients=k, server=server, log_steps=400, measures=MeasureConfig.of(["all"]))


def _assert_shifted(narrow, wide, lanes: int):
    """`wide` is `narrow` with every stamp moved by OFFSET (never-set stamps stay -1)."""
    assert narrow.finished.all() and wide.finished.all()
    np.testing.assert_array_equal(wide.steps, narrow.steps + OFFSET)
    for name in ("service", "counters", "admitted", "completed", "arrived", "max_drift"):
        np.testing.assert_array_equal(getattr(wide, name), getattr(narrow, name), err_msg=name)
    a, b = narrow.server_state, wide.server_state
    for name in ("first_token", "finish", "scheduled"):
        x, y = np.asarray(getattr(a.out, name), np.int64), np.asarray(getattr(b.out, name), np.int64)
        np.testing.assert_array_equal(np.where(x >= 0, x + OFFSET, x), y, err_msg=name)
    np.testing.assert_array_equal(a.out.preemptions, b.out.preemptions)
    count = np.asarray(a.log.count)
    np.testing.assert_array_equal(count, b.log.count)
    for lane in range(lanes):
        c = int(count[lane])
        np.testing.assert_array_equal(np.asarray(a.log.t)[lane, :c].astype(np.int64) + OFFSET,
                                      np.asarray(b.log.t)[lane, :c])
        for name in ("index", "tokens", "finished", "preempted"):
            np.testing.assert_array_equal(np.asarray(getattr(a.log, name))[lane, :c],
                                          np.asarray(getattr(b.log, name))[lane, :c], err_msg=name)
    assert np.asarray(b.out.finish).dtype == np.int64 and np.asarray(a.out.finish).dtype == np.int32


@pytest.mark.parametrize("server", ["vllm", "vllm_prefix"])
@pytest.mark.parametrize("timed", [False, True], ids=["steps", "microseconds"])
def test_a_shifted_trace_runs_the_same_schedule_shifted(server, timed):
    """40 random lanes (every policy that reads time among them: LAS's waits, WFQ's and
    SFQ's arrival ties, VTC's lifts; sync and async scheduling), each run at its own times
    on an int32 clock and moved past 2^33 on a wide one."""
    rng = random.Random(2026 + timed)
    policies = ("fcfs", "vtc", "las", "wfq", "sfq", "drr", "vtc_gateway", "rr")
    lanes = [_lane(rng, server, timed, asynchronous=i % 3 == 0) for i in range(40)]
    settings = [Settings(policy=policies[i % len(policies)], kv_budget=1 << 20, server_options=tuple(o.items()))
                for i, (_, o) in enumerate(lanes)]
    narrow = _run([t for t, _ in lanes], settings, server)
    wide = _run([_shifted(t, OFFSET) for t, _ in lanes], settings, server)
    _assert_shifted(narrow, wide, len(lanes))


def test_the_clock_is_wide_only_past_the_narrow_limit():
    """A trace inside 2^30 runs on int32 as before; one past it on int64 (and only a server
    that keeps wide stamps takes it: the ideal server refuses it in one line)."""
    trace = Trace.from_rows([(0, 0, 4, 2), (3, 1, 4, 2)])
    settings = [Settings(policy="vtc", kv_budget=64, server_options=(("num_gpu_blocks", 9), ("block_size", 4)))]
    near = _shifted(trace, clock.NARROW_LIMIT - 10)
    far = _shifted(trace, clock.NARROW_LIMIT)
    assert np.asarray(_run([near], settings, "vllm").server_state.out.finish).dtype == np.int32
    assert np.asarray(_run([far], settings, "vllm").server_state.out.finish).dtype == np.int64
    with pytest.raises(InputError, match="int32 clock"):
        run_traces([far], [Settings(policy="vtc", kv_budget=64)], num_clients=2)


def test_arrivals_past_the_wide_limit_are_refused():
    with pytest.raises(InputError, match="arrival too large"):
        Trace.from_rows([(clock.WIDE_LIMIT + 1, 0, 4, 2)])


def test_a_log_past_the_int32_clock_runs_in_one_pass(tmp_path):
    """compare on a log of two bursts 40 minutes apart (past 2^31 us): one pass, and the
    second burst, which finds the server empty, runs as it does alone (fcfs), every stamp
    moved by the gap; a log inside the int32 clock still runs on it."""
    import csv

    from vtc_jax.cli.commands import main

    burst = [(0.0, "a", 300, 40), (0.01, "b", 500, 20), (0.02, "a", 200, 60), (0.5, "b", 100, 30)]
    gap = 2400.0

    def run(rows, name):
        path = tmp_path / f"{name}.csv"
        path.write_text("timestamp,tenant,prompt,output\n" + "".join(f"{t},{c},{p},{o}\n" for t, c, p, o in rows))
        requests = tmp_path / f"{name}_requests.csv"
        argv = ["compare", str(path), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--max-num-seqs", "8",
                "--policies", "fcfs", "--out", str(tmp_path / name), "--requests-out", str(requests), "--no-cache"]
        assert main(argv) == 0
        return list(csv.DictReader(requests.open()))

    both = run(burst + [(gap + t, c, p, o) for t, c, p, o in burst], "both")
    alone = run(burst, "alone")
    later = [r for r in both if int(r["arrival_us"]) >= gap * 1e6]
    assert len(later) == len(alone) == len(burst)
    for x, y in zip(sorted(later, key=lambda r: int(r["arrival_us"])), sorted(alone, key=lambda r: int(r["arrival_us"]))):
        for stamp in ("arrival_us", "scheduled_us", "first_token_us", "finish_us"):
            assert int(x[stamp]) == int(y[stamp]) + int(gap * 1e6), stamp
        for value in ("ttft_us", "e2e_us", "prompt", "output", "preemptions"):
            assert x[value] == y[value], value


def test_a_cluster_refuses_a_log_past_its_clock_in_one_line(tmp_path, capsys):
    """The cluster engine keeps an int32 clock: a fleet run of a log past 2^30 us is refused
    before any work, one line naming the way out, exit 2 (one server runs it whole)."""
    from vtc_jax.cli.commands import main

    path = tmp_path / "long.csv"
    path.write_text("timestamp,tenant,prompt,output\n0.0,a,100,10\n1500.0,b,100,10\n")
    argv = ["compare", str(path), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--replicas", "2", "--picker",
            "round-robin", "--policies", "fcfs", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--time-window" in err[0] and "cluster" in err[0]
