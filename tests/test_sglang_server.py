"""The `sglang` server (servers/sglang.py) against the literal reference of SGLang's scheduler
(vtc_jax/testing/sglang_reference.py), which replays the real scheduler's goldens: random
traces and settings, every listed iteration equal (the tokens scheduled per request, the
requests retracted and finished), and hand-worked cases of the rules it keeps."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from vtc_jax import Settings, Trace
from vtc_jax.core.errors import InputError
from vtc_jax.driver.run import run_traces, workload_pad
from vtc_jax.inputs import prefix_blocks
from vtc_jax.inputs.workload import trace_rows
from vtc_jax.servers import registry as servers
from vtc_jax.testing.sglang_reference import SglangRequest, simulate


def _lane(requests, config, num_clients):
    """(Trace, Settings) of a reference trace and config (request i is trace row i)."""
    trace = Trace.from_rows([(r.arrival, int(r.client), r.prompt, r.output) for r in requests])
    ident = prefix_blocks.groups([r.prefix_id for r in requests], [r.prefix_len for r in requests],
                                 [int(r.client) for r in requests])
    table = prefix_blocks.prefix_table(ident, trace.arrival, trace.prompt, trace.output)
    options = {"max_total_tokens": config["kv_tokens"], "max_running_requests": config["max_running_requests"],
               "chunked_prefill_size": config["chunked_prefill_size"] or 0,
               "max_prefill_tokens": config["max_prefill_tokens"],
               "schedule_conservativeness": config["schedule_conservativeness"], "prefix_blocks": table}
    return trace, Settings(policy="fcfs", kv_budget=config["kv_tokens"], server_options=tuple(sorted(options.items())))


def _steps(result, lane, trace, num_clients):
    """The lane's logged iterations as the reference lists them: (step, {row: tokens},
    retracted rows, finished rows)."""
    log = result.server_state.log
    rows = trace_rows(trace, num_clients, workload_pad())
    out = []
    for j in range(int(np.asarray(log.count)[lane])):
        index, tokens = np.asarray(log.index)[lane, j], np.asarray(log.tokens)[lane, j]
        finished, retracted = np.asarray(log.finished)[lane, j], np.asarray(log.preempted)[lane, j]
        out.append((int(np.asarray(log.t)[lane, j]),
                    {int(rows[i]): int(n) for i, n in zip(index, tokens) if i >= 0 and n > 0},
                    sorted(int(rows[i]) for i in retracted if i >= 0),
                    sorted(int(rows[i]) for i, f in zip(index, finished) if f and i >= 0)))
    return out


def _reference_steps(run):
    return [(s["step"], {row: n for row, n, _, _ in s["scheduled"]}, sorted(s["retracted"]), sorted(s["finished"]))
            for s in run.steps]


def _random_case(rng: random.Random):
    k = rng.randint(1, 3)
    n = rng.randint(3, 12)
    requests = []
    for i in range(n):
        prompt = rng.randint(1, 40)
        group = rng.choice([None, "a", "b"])
        shared = rng.randint(0, prompt) if group is not None else 0
        requests.append(SglangRequest(arrival=rng.randint(0, 12), client=str(rng.randrange(k)), prompt=prompt,
                                      output=rng.randint(1, 30), prefix_id=group, prefix_len=shared,
                                      rid=f"r{i:04d}"))  # ids in row order: same-iteration ties by row
    need = max(r.prompt + r.output for r in requests) + 2
    config = {"kv_tokens": need + rng.randint(0, 2 * need), "max_running_requests": rng.randint(1, 5),
              "chunked_prefill_size": rng.choice([None, rng.randint(4, 48)]),
              "max_prefill_tokens": rng.randint(8, 160), "schedule_conservativeness": rng.choice([0.3, 1.0, 1.6])}
    return requests, config, k


def test_random_traces_equal_the_literal_reference():
    """48 random lanes in one batch (tight pools: retractions and evictions; chunking on
    and off; prefix groups, all-prefix prompts included): every iteration the reference
    lists is the server's, to the token."""
    rng = random.Random(5)
    cases = [_random_case(rng) for _ in range(48)]
    k = max(c[2] for c in cases)
    lanes = [_lane(requests, config, k) for requests, config, _ in cases]
    result = run_traces([t for t, _ in lanes], [s for _, s in lanes], num_clients=k, server="sglang",
                        log_steps=1024)
    retractions = 0
    for lane, ((requests, config, _), (trace, _)) in enumerate(zip(cases, lanes)):
        run = simulate(requests, dict(config, policy="fcfs"))
        assert not run.stalled and not run.aborted
        assert not bool(np.asarray(result.server_state.flagged)[lane])
        assert _steps(result, lane, trace, k) == _reference_steps(run), (lane, config)
        retractions += sum(len(s["retracted"]) for s in run.steps)
    assert retractions > 0  # the draw exercises retraction


def test_a_prefix_hit_costs_nothing_in_the_budget_but_pins_its_path():
    """Hand-worked: kv 200, one row at a time. r0 (prompt 40, 30 of them the group's
    prefix; output 2) runs alone and finishes at iteration 1, caching 41 tokens. r1
    (prompt 35, the same 30-token prefix; output 1) arrives at iteration 2: it matches the
    30 shared tokens and prefills only its 5 own."""
    requests = [SglangRequest(arrival=0, client="0", prompt=40, output=2, prefix_id="g", prefix_len=30, rid="r0"),
                SglangRequest(arrival=2, client="0", prompt=35, output=1, prefix_id="g", prefix_len=30, rid="r1")]
    config = {"kv_tokens": 200, "max_running_requests": 1, "chunked_prefill_size": None, "max_prefill_tokens": 500,
              "schedule_conservativeness": 1.0}
    trace, settings = _lane(requests, config, 1)
    result = run_traces([trace], [settings], num_clients=1, server="sglang", log_steps=16)
    assert _steps(result, 0, trace, 1) == [(0, {0: 40}, [], []), (1, {0: 1}, [], [0]), (2, {1: 5}, [], [1])]
    assert _reference_steps(simulate(requests, dict(config, policy="fcfs"))) == _steps(result, 0, trace, 1)


@pytest.mark.parametrize("options, message", [
    ({"schedule_policy": "lpm"}, "lpm is not supported"),
    ({"disable_overlap_schedule": False}, "overlap event loop"),
    ({"page_size": 16}, "page-size 16"),
    ({"max_total_tokens": 1}, "max_total_tokens must be an integer in"),
])
def test_unmodelled_or_bad_settings_are_refused_by_name(options, message):
    base = {"max_total_tokens": 100, "max_running_requests": 2}
    with pytest.raises(InputError, match=message):
        servers.get("sglang").validate(dict(base, **options))


def test_a_timed_lane_stamps_the_end_of_each_step():
    """Hand-worked, step time 1000 us + 10 us per prefill token + 100 us per decode token:
    r0 (prompt 10, output 2) arrives at 0 us; its prefill step lasts 1,100 us (first token
    at 1,100), its decode step 1,100 us more (finish at 2,200). r1 (prompt 5, output 1)
    arrives at 1,500 us, while r0 decodes: it is prefilled at 2,200 (1,050 us) and finishes
    with its first token at 3,250."""
    config = {"kv_tokens": 100, "max_running_requests": 2, "chunked_prefill_size": None, "max_prefill_tokens": 64,
              "schedule_conservativeness": 1.0}
    requests = [SglangRequest(arrival=0, client="0", prompt=10, output=2),
                SglangRequest(arrival=1500, client="0", prompt=5, output=1)]
    trace, settings = _lane(requests, config, 1)
    options = dict(settings.server_options, time_model="per_step=1000,per_prefill_token=10,per_decode_token=100")
    settings = dataclasses.replace(settings, server_options=tuple(sorted(options.items())))
    result = run_traces([trace], [settings], num_clients=1, server="sglang", log_steps=8)
    out = result.server_state.out
    rows = trace_rows(trace, 1, workload_pad())
    first = {int(rows[i]): int(v) for i, v in enumerate(np.asarray(out.first_token)[0]) if rows[i] >= 0}
    finish = {int(rows[i]): int(v) for i, v in enumerate(np.asarray(out.finish)[0]) if rows[i] >= 0}
    assert first == {0: 1100, 1: 3250} and finish == {0: 2200, 1: 3250}
    assert [s[0] for s in _steps(result, 0, trace, 1)] == [0, 1100, 2200]  # each step's start, in us
