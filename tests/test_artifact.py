"""The artifact engine profile (vtc_jax/artifact.py) against a slow pure-Python reference
written from shared/ENGINE_ARTIFACT.md, hand-worked timelines, and plain numpy measures."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from vtc_jax import artifact as A
from vtc_jax import artifact_suites as S


# ------------------------------------------------------------------ pure-Python reference

def reference(arrival_s, client, prompt, output, policy, profile=A.Profile(), rpm_limit=None, weights=None,
              oracle=None, log=None):
    """The router loop of manager.py `_step`, request by request, in integer microseconds;
    each step's duration is a sum of float32 terms, each rounded to a microsecond, as the engine. Clients must be
    numbered by first arrival. Returns per request: status, first token and finish (us)."""
    n = len(arrival_s)
    k = max(client) + 1
    w = weights or [1.0] * k
    tc = np.asarray(A.make_params("fcfs", k, profile).time_coef)  # float32, as the engine

    def duration(*terms):  # each float32 term rounded half to even, as the engine
        return sum(int(np.round(np.float32(t))) for t in terms)

    arr_us = [int(round(a * 1e6)) for a in arrival_s]
    inp = [p + profile.input_extra for p in prompt]
    order = sorted(range(n), key=lambda i: (arr_us[i], i))
    fifo = [deque() for _ in range(k)]
    counter = [0.0] * k
    cpred = [0.0] * k
    status = ["future"] * n
    gen = [0] * n
    pred = [0.0] * n
    first, finish = [-1] * n, [-1] * n
    accepted_times = [[] for _ in range(k)]
    running = []
    now, wait, nxt = 0, 0, 0
    f32 = lambda x: float(np.float32(x))  # noqa: E731

    def arrive():
        nonlocal nxt
        while nxt < n and arr_us[order[nxt]] <= now:
            i = order[nxt]
            nxt += 1
            c = client[i]
            if rpm_limit is not None:
                recent = [t for t in accepted_times[c] if t >= arr_us[i] - int(round(profile.rpm_window_s * 1e6))]
                if len(recent) >= rpm_limit:
                    status[i] = "rejected"
                    continue
                accepted_times[c].append(arr_us[i])
            if policy in ("vtc", "vtc_oracle", "vtc_predict") and not fifo[c]:
                others = [counter[j] for j in range(k) if j != c and fifo[j]]
                if others:
                    counter[c] = max(counter[c], min(others))
            fifo[c].append(i)
            status[i] = "waiting"

    def fits(batch, cand):
        items = [(inp[r] + gen[r], output[r] - gen[r] - 1) for r in running]
        items += [(inp[r] + 1, output[r] - 1) for r in batch + [cand]]
        items.sort(key=lambda x: -x[1])
        need, cum = 0, 0
        for j, (held, left) in enumerate(items, 1):
            cum += held
            need = max(need, j * left + cum)
        clients = {client[r] for r in running + batch + [cand]}
        return (need < profile.kv_pool - profile.adapter_reserve * len(clients)
                and sum(inp[r] for r in batch) + inp[cand] <= profile.prefill_cap
                and len(items) <= profile.running_cap)

    def admit_round():
        batch = []
        while True:
            backlogged = [c for c in range(k) if fifo[c]]
            if not backlogged:
                break
            if policy in ("fcfs", "rpm"):
                c = min(backlogged, key=lambda j: (arr_us[fifo[j][0]], fifo[j][0]))
            else:
                c = min(backlogged, key=lambda j: (counter[j], j))
            cand = fifo[c][0]
            if not fits(batch, cand):
                break
            fifo[c].popleft()
            batch.append(cand)
            p = {"vtc_oracle": oracle[cand] if oracle is not None else output[cand],
                 "vtc_predict": cpred[c]}.get(policy, 0.0)
            pred[cand] = f32(p)
            counter[c] += (profile.w_p * inp[cand] + profile.w_q * pred[cand]) / w[c]
            gen[cand] = 1
            status[cand] = "running"
        return batch

    def settle(batch):
        done = [r for r in batch if gen[r] >= output[r]]
        if not done:
            return
        for r in batch:
            if profile.extra_finish_charge and gen[r] > pred[r]:
                counter[client[r]] += profile.w_q / w[client[r]]
        for r in done:
            c = client[r]
            if output[r] < pred[r]:
                counter[c] -= profile.w_q * (pred[r] - output[r]) / w[c]
            if policy == "vtc_predict":
                cpred[c] = float(output[r]) if cpred[c] == 0 else (4 * cpred[c] + output[r]) / 5
            status[r] = "done"
            finish[r] = now
            running.remove(r)

    while True:
        arrive()
        if not running or wait >= profile.cadence:
            batch = admit_round()
            if batch:
                now += duration(tc[0], tc[1] * np.float32(sum(inp[r] for r in batch)))
                for r in batch:
                    first[r] = now
                running.extend(batch)
                wait = 0
                settle(batch)
                continue
        if running:
            for r in running:
                if gen[r] > pred[r]:
                    counter[client[r]] += profile.w_q / w[client[r]]
            ctx = sum(inp[r] + gen[r] for r in running)
            if log is not None:
                log.append((now, len(running), ctx))
            now += duration(tc[2], tc[3] * np.float32(len(running)), tc[4] * np.float32(ctx))
            for r in running:
                gen[r] += 1
            wait += 1
            settle(list(running))
            continue
        if nxt >= n:
            break
        poll = int(round(profile.poll_s * 1e6))
        now += poll * max(1, math.ceil((arr_us[order[nxt]] - now) / poll))
    return status, first, finish


def run_engine(arrival_s, client, prompt, output, policies, profile=A.Profile(), rpm_limits=None, weights=None,
               oracle_r=0.0):
    k = max(client) + 1
    trace, new_id = A.make_trace(arrival_s, client, prompt, output, input_extra=profile.input_extra, num_clients=k,
                                 oracle_r=oracle_r, seed=3)
    assert (new_id == np.arange(k)).all(), "tests number clients by first arrival"
    params = [A.make_params(p, k, profile, rpm_limit=(rpm_limits or {}).get(p), weights=weights) for p in policies]
    config = A.Config(len(arrival_s), k, track_prediction="vtc_predict" in policies)
    state = A.run_lanes(A.stack([trace] * len(policies)), A.stack(params), config)
    return trace, state


def random_trace(seed, n=40, k=3, horizon=6.0, max_prompt=300, max_output=60):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, horizon, n))
    client = rng.integers(0, k, n)
    # renumber by first arrival
    seen = {}
    for c in client:
        seen.setdefault(int(c), len(seen))
    client = np.array([seen[int(c)] for c in client])
    return (arrival.tolist(), client.tolist(), rng.integers(1, max_prompt, n).tolist(),
            rng.integers(1, max_output, n).tolist())


SMALL = A.Profile(kv_pool=1500, prefill_cap=600, running_cap=12, cadence=3)
STATUS = {A.WAITING: "waiting", A.RUNNING: "running", A.DONE: "done", A.REJECTED: "rejected", A.FUTURE: "future"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_matches_reference(seed):
    cols = random_trace(seed)
    policies = ["fcfs", "lcf", "vtc", "vtc_predict", "vtc_oracle", "rpm"]
    trace, state = run_engine(*cols, policies, SMALL, rpm_limits={"rpm": 4})
    order = np.lexsort((np.arange(len(cols[0])), np.round(np.asarray(cols[0]) * 1e6)))
    for lane, policy in enumerate(policies):
        status, first, finish = reference(*cols, policy, SMALL, rpm_limit=4 if policy == "rpm" else None)
        got_status = [STATUS[int(s)] for s in np.asarray(state.status[lane])]
        assert got_status == [status[i] for i in order], policy
        assert np.asarray(state.first_token_us[lane]).tolist() == [first[i] for i in order], policy
        assert np.asarray(state.finish_us[lane]).tolist() == [finish[i] for i in order], policy


def test_engine_matches_reference_weighted_and_oracle_range():
    cols = random_trace(7, n=30, k=4)
    weights = [1.0, 2.0, 3.0, 4.0]
    trace, state = run_engine(*cols, ["vtc", "vtc_oracle"], SMALL, weights=weights, oracle_r=0.5)
    order = np.lexsort((np.arange(len(cols[0])), np.round(np.asarray(cols[0]) * 1e6)))
    oracle = np.empty(len(order), np.float32)
    oracle[order] = np.asarray(trace.oracle)
    for lane, policy in enumerate(["vtc", "vtc_oracle"]):
        _, first, finish = reference(*cols, policy, SMALL, weights=weights, oracle=oracle.tolist())
        assert np.asarray(state.first_token_us[lane]).tolist() == [first[i] for i in order], policy
        assert np.asarray(state.finish_us[lane]).tolist() == [finish[i] for i in order], policy


# ------------------------------------------------------------------ KV check

def test_kv_need_against_direct_computation():
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        held = rng.integers(1, 500, n)
        left = rng.integers(0, 400, n)
        member = rng.random(n) < 0.7
        items = sorted(zip(held[member], left[member]), key=lambda x: -x[1])
        direct = max([j * l + sum(h for h, _ in items[:j]) for j, (_, l) in enumerate(items, 1)], default=0)
        assert int(A.kv_need(held, left, member)) == direct


# ------------------------------------------------------------------ hand-worked timelines

ONE_TOKEN = A.StepTime(prefill_base=0.0, prefill_per_token=1e-3, decode_base=10e-3, decode_per_request=0.0,
                       decode_per_context_token=0.0, overhead=1.0)


def test_cadence_and_stall_timeline():
    """Request 0 (input 10, 6 outputs) at 0; request 1 (input 20, 2 outputs) at 1 ms.
    Prefill of 0: 10 ms -> t = 10 ms (first token of 0; the poll saw only request 0).
    Cadence 3: decode steps end at 20, 30, 40 ms (no admission although 1 waits).
    Before the 4th decode: admission -> prefill of 1 (20 ms, decoding stalls) -> 60 ms.
    Then 3 decode steps: 70 (0 has 5 tokens, 1 has 2 -> 1 finishes), 80 (0 finishes)."""
    prof = A.Profile(cadence=3, input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN)
    trace, state = run_engine([0.0, 0.001], [0, 1], [10, 20], [6, 2], ["fcfs"], prof)
    assert np.asarray(state.first_token_us[0]).tolist() == [10_000, 60_000]
    assert np.asarray(state.finish_us[0]).tolist() == [80_000, 70_000]
    assert int(state.prefills[0]) == 2 and int(state.steps[0]) == 2 + 3 + 2


def test_idle_poll_and_stall_of_running_batch():
    """Nothing runs until the poll after the first arrival (10 ms grid); a prefill admitted
    while a request runs delays that request's next token by the prefill's duration."""
    prof = A.Profile(cadence=0, input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN)
    trace, state = run_engine([0.025, 0.041], [0, 1], [5, 30], [4, 1], ["fcfs"], prof)
    # poll at 30 ms: prefill 5 ms -> 35; decode -> 45; admission sees request 1 (41 ms):
    # prefill 30 ms -> 75 (1 finishes at its prefill); decodes -> 85, 95 (0 finishes).
    assert np.asarray(state.first_token_us[0]).tolist() == [35_000, 75_000]
    assert np.asarray(state.finish_us[0]).tolist() == [95_000, 75_000]


# ------------------------------------------------------------------ RPM sliding window

def test_rpm_window_boundary_is_inclusive():
    """Limit 2: arrivals 0, 1, 60 (0 is exactly 60 s before: still in the window ->
    rejected), 60.000001 (only 1 and 60... window [0.000001, 60.000001] holds 1: accepted)."""
    arrivals = [0.0, 1.0, 60.0, 60.000001, 61.000002]
    trace, state = run_engine(arrivals, [0] * 5, [5] * 5, [1] * 5, ["rpm"], rpm_limits={"rpm": 2})
    got = [STATUS[int(s)] for s in np.asarray(state.status[0])]
    assert got == ["done", "done", "rejected", "done", "done"]
    m = A.lane_measures(trace, A.lane_index(state, 0), 1)
    assert m["rejected"] == 1 and m["rejected_per_client"].tolist() == [1]


# ------------------------------------------------------------------ prediction charges

def _counter_after(policy, outputs, oracle_r=0.0, profile=None):
    prof = profile or A.Profile(input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN)
    n = len(outputs)
    trace, state = run_engine([0.05 * i for i in range(n)], [0] * n, [10] * n, outputs, [policy], prof,
                              oracle_r=oracle_r)
    return float(state.counter[0, 0]), trace, state


def test_oracle_exact_charges_input_plus_twice_output_once():
    c, _, _ = _counter_after("vtc_oracle", [5, 3])
    assert c == (10 + 2 * 5) + (10 + 2 * 3)


def test_vtc_charges_decode_steps_plus_extra_at_finish():
    # alone, sequentially: input + 2 per decode step (L - 1) + 2 at the finishing step
    c, _, _ = _counter_after("vtc", [5])
    assert c == 10 + 2 * 4 + 2


def test_oracle_range_refunds_and_charges_beyond():
    prof = A.Profile(input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN, extra_finish_charge=False)
    c, trace, _ = _counter_after("vtc_oracle", [8], oracle_r=0.9, profile=prof)
    p = float(trace.oracle[0])
    # charged 10 + 2p; decode steps before which generated (1..7) exceeds p: charged 2 each;
    # refund 2 (p - 8) if p > 8
    beyond = sum(1 for g in range(1, 8) if g > np.float32(p))
    expected = 10 + 2 * p + 2 * beyond - (2 * (p - 8) if p > 8 else 0)
    assert c == pytest.approx(expected, rel=1e-6)


def test_predict_moving_average():
    """First request: prediction 0 (charged like vtc); after it, prediction = 6; after
    the second (output 11): (4 * 6 + 11) / 5 = 7."""
    prof = A.Profile(input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN, extra_finish_charge=False)
    n_out = [6, 11, 3]
    _, trace, state = _counter_after("vtc_predict", n_out, profile=prof)
    assert float(state.client_pred[0, 0]) == pytest.approx((4 * 7 + 3) / 5)
    assert np.asarray(state.charged_pred[0]).tolist() == pytest.approx([0, 6, 7])
    # counter: r0: 10 + 2*5 decode; r1: 10 + 2*6 prepaid, beyond: g in 7..10 -> 4 steps;
    # r2: 10 + 2*7, refund 2*(7-3)
    expected = (10 + 10) + (10 + 12 + 8) + (10 + 14 - 8)
    assert float(state.counter[0, 0]) == pytest.approx(expected)


# ------------------------------------------------------------------ suites

@pytest.mark.parametrize("name", sorted(S.SUITES))
def test_suite_rates_and_lengths(name):
    spec = S.SUITES[name]
    t = S.generate(name, seed=1)
    dur = spec.duration
    assert t["arrival_s"].min() >= 0 and t["arrival_s"].max() < dur
    assert (np.diff(t["arrival_s"]) >= 0).all()
    for c in range(spec.num_clients):
        mine = t["client"] == c
        expected, tol = S.expected_requests(name, c)
        assert abs(mine.sum() - expected) <= tol, (c, mine.sum(), expected)
        lo, hi = spec.prompt[c]
        assert t["prompt"][mine].min() >= lo and t["prompt"][mine].max() <= max(lo, hi - 1)
        lo, hi = spec.output[c]
        assert t["output"][mine].min() >= lo and t["output"][mine].max() <= max(lo, hi - 1)


def test_on_off_silences_client_zero_in_odd_minutes():
    t = S.generate("on_off_less", seed=0)
    a = t["arrival_s"][t["client"] == 0]
    assert ((a // 60) % 2 == 0).all()


# ------------------------------------------------------------------ measures vs numpy

def numpy_measures(arrival, client, prompt, output, first, end, served, k, ticks):
    lo, hi = ticks.bounds()
    rate = np.zeros((k, lo.size))
    demand = np.zeros((k, lo.size))
    for i in range(len(arrival)):
        s = prompt[i] + 2 * output[i]
        for t in range(lo.size):
            if lo[t] <= arrival[i] <= hi[t]:
                demand[client[i], t] += s / (hi[t] - lo[t])
            if served[i] and end[i] >= 1 and end[i] - first[i] >= 1e-5:
                ov = max(min(hi[t], end[i]) - max(lo[t], first[i]), 0)
                rate[client[i], t] += s * ov / (end[i] - first[i]) / (hi[t] - lo[t])
    present = sorted(set(client))
    diff = [sum(min(max(rate[j, t] for j in present) - rate[j, t], abs(demand[j, t] - rate[j, t]))
                for j in present) for t in range(lo.size)]
    thr = sum(prompt[i] + output[i] for i in range(len(arrival)) if served[i]) / (max(end[served]) - min(arrival))
    ttft = [first[i] - arrival[i] for i in range(len(arrival)) if served[i]]
    return np.array(diff), rate, demand, thr, float(np.median(ttft))


@pytest.mark.parametrize("policy", ["vtc", "fcfs", "rpm"])
def test_measures_against_numpy(policy):
    cols = random_trace(11, n=60, k=4, horizon=30.0, max_output=200)
    trace, state = run_engine(*cols, [policy], A.Profile(kv_pool=3000), rpm_limits={"rpm": 6})
    ticks = A.Ticks(spacing=3.0, count=8, window=6.0)
    lane = A.lane_index(state, 0)
    m = A.lane_measures(trace, lane, 4, ticks)
    arrival = np.asarray(trace.arrival_us) / 1e6
    served = np.asarray(lane.status) == A.DONE
    first = np.asarray(lane.first_token_us) / 1e6
    end = np.asarray(lane.finish_us) / 1e6
    diff, rate, demand, thr, med = numpy_measures(arrival, np.asarray(trace.client), np.asarray(trace.prompt),
                                                   np.asarray(trace.output), first, end, served, 4, ticks)
    np.testing.assert_allclose(m["rate"], rate, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(m["demand"], demand, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(m["diff"], diff, rtol=1e-4, atol=1e-2)
    assert m["avg_diff"] == pytest.approx(diff.mean(), rel=1e-4, abs=1e-2)
    assert m["max_diff"] == pytest.approx(diff.max(), rel=1e-4, abs=1e-2)
    assert m["throughput"] == pytest.approx(thr, rel=1e-9)
    assert m["ttft_median"] == pytest.approx(med, rel=1e-9)
    assert m["rejected"] == float((np.asarray(lane.status) == A.REJECTED).sum())


# ------------------------------------------------------------------ calibration

def test_calibration_recovers_coefficients():
    from sweeps.calibrate import fit

    rng = np.random.default_rng(0)
    true = A.StepTime()
    rows = []
    for _ in range(300):
        if rng.random() < 0.3:
            p = int(rng.integers(10, 3000))
            t = true.overhead * (true.prefill_base + true.prefill_per_token * p)
            rows.append((0, 0, p, t * (1 + rng.normal(0, 0.002))))
        else:
            b, ctx = int(rng.integers(1, 200)), int(rng.integers(100, 9000))
            t = true.overhead * (true.decode_base + true.decode_per_request * b + true.decode_per_context_token * ctx)
            rows.append((b, ctx, 0, t * (1 + rng.normal(0, 0.002))))
    got = fit(np.asarray(rows, np.float64), overhead=true.overhead)
    assert got.prefill_per_token == pytest.approx(true.prefill_per_token, rel=0.02)
    assert got.decode_base == pytest.approx(true.decode_base, rel=0.02)
    assert got.decode_per_request == pytest.approx(true.decode_per_request, rel=0.05)
    assert got.decode_per_context_token == pytest.approx(true.decode_per_context_token, rel=0.1)


def test_calibrate_cli(tmp_path, capsys):
    from sweeps.calibrate import main

    rows = ["batch_size,context_tokens,prompt_tokens,step_time_s"]
    for b, ctx, p in [(0, 0, 100), (0, 0, 2000), (4, 400, 0), (8, 3000, 0), (30, 6000, 0), (60, 9000, 0)]:
        t = 0.214e-3 * p if p else 19.7e-3 + 0.215e-3 * b + 1.71e-6 * ctx
        rows.append(f"{b},{ctx},{p},{t}")
    path = tmp_path / "profile.csv"
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "st.json"
    assert main([str(path), "--out", str(out)]) == 0
    import json

    got = json.loads(out.read_text())
    assert got["decode_base"] == pytest.approx(19.7e-3, rel=1e-6)
    assert got["prefill_per_token"] == pytest.approx(0.214e-3, rel=1e-6)
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main([str(bad)]) == 2


def test_paper_rejects_unknown_part():
    from sweeps.paper import main

    with pytest.raises(SystemExit) as err:
        main(["--parts", "nope"])
    assert err.value.code == 2


def test_paper_pipeline_on_a_small_trace(tmp_path):
    """paper.run/group/write on a 40-request trace: every policy name the tables use."""
    from sweeps import paper

    cols = dict(zip(("arrival_s", "client", "prompt", "output"), map(np.asarray, random_trace(4, n=40, k=4))))
    lanes = [paper.Lane("overload-weighted", p, None, 0, cols, (1.0, 2.0, 3.0, 4.0) if p == "vtc_weighted" else None)
             for p in ("vtc_weighted", "vtc", "vtc_oracle", "vtc_predict")]
    lanes.append(paper.Lane("overload-weighted", "rpm", 2, 0, cols))
    measures = paper.run(lanes, A.Profile(), 0.0, chunk=2)
    rows = paper.group(lanes, measures)
    assert [r["setting"]["policy"] for r in rows] == ["vtc_weighted", "vtc", "vtc_oracle", "vtc_predict", "rpm"]
    assert all(r["metrics"]["unfinished"]["max"] == 0 for r in rows)
    assert rows[-1]["metrics"]["rejected"]["mean"] > 0
    assert "overload-weighted" in paper.format_rows(rows)
