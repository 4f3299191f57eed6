"""The artifact profile (the `slora` server and the artifact's schedulers as registry
policies, vtc_jax/driver/artifact_run.py) against a slow pure-Python reference written from
the artifact's router loop, hand-worked timelines, plain numpy measures, the artifact's own
traces, and its command lines (sweeps.paper, sweeps.calibrate).

Every engine run here has K = 4 clients (`run_engine`), so the file compiles the engine a
few times only."""

from __future__ import annotations

import json
import math
import sys
from collections import deque
from fractions import Fraction

import numpy as np
import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.driver import artifact_run as AR
from vtc_jax.engines import artifact as A
from vtc_jax.engines import artifact_inputs as AI
from vtc_jax.inputs import artifact_suites as S
from vtc_jax.policies.estimators import reference_estimate
from vtc_jax.servers import slora

K = 4
SEED = 3  # the lanes' seed (the noisy oracle's draws)


# ------------------------------------------------------------------ pure-Python reference

def reference(arrival_s, client, prompt, output, policy, profile=A.Profile(), rpm_limit=None, weights=None,  # noqa: B008 (frozen)
              oracle=None, log=None):
    """The router loop of manager.py `_step`, request by request, in integer microseconds;
    each step's duration is a sum of float32 terms, each rounded to a microsecond, as the
    engine. Clients must be numbered by first arrival. Returns per request: status, first
    token and finish (us)."""
    n = len(arrival_s)
    k = max(client) + 1
    w = weights or [1.0] * k
    tc = profile.step_time.coefficients_us()  # float32, as the engine

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
        for r in sorted(done):
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
        gap = arr_us[order[nxt]] - now
        now += gap if profile.idle == "jump" else poll * max(1, math.ceil(gap / poll))
    return status, first, finish


def run_engine(arrival_s, client, prompt, output, policies, profile=A.Profile(), rpm_limits=None, weights=None,  # noqa: B008 (frozen)
               oracle_r=0.0):
    """Every policy as one lane of a batch on K clients: (the lane, its replays)."""
    k = max(client) + 1
    lane = AI.make_trace(arrival_s, client, prompt, output, input_extra=profile.input_extra, num_clients=K)
    assert (lane.new_id[:k] == np.arange(k)).all(), "tests number clients by first arrival"
    w = None if weights is None else tuple(list(weights) + [1.0] * (K - len(weights)))
    scheds = [AR.Scheduler(p, rpm_limit=(rpm_limits or {}).get(p) if p == "rpm" else None, weights=w, profile=profile,
                           oracle_r=oracle_r) for p in policies]
    replays, done = AR.run([lane] * len(scheds), scheds, K, seeds=[SEED] * len(scheds))
    assert done.all()
    return lane, replays


def oracle_predictions(lane, oracle_r):
    """vtc_oracle's predictions per request (the lane's order): the output, or with a range
    r > 0 the `noisy` estimator's draw (relative error up to r) for the lane's seed."""
    if oracle_r == 0:
        return lane.output.astype(np.float32).tolist()
    position, seen = [], [0] * K
    for c in lane.client:
        position.append(seen[c])
        seen[c] += 1
    return [float(reference_estimate("noisy", int(o), int(c), p, guess=128, error=Fraction(str(oracle_r)), seed=SEED,
                                     average=0)) for o, c, p in zip(lane.output, lane.client, position)]


def random_trace(seed, n=40, k=3, horizon=6.0, max_prompt=300, max_output=60):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, horizon, n))
    client = rng.integers(0, k, n)
    seen = {}  # renumber by first arrival
    for c in client:
        seen.setdefault(int(c), len(seen))
    client = np.array([seen[int(c)] for c in client])
    return (arrival.tolist(), client.tolist(), rng.integers(1, max_prompt, n).tolist(),
            rng.integers(1, max_output, n).tolist())


SMALL = A.Profile(kv_pool=1500, prefill_cap=600, running_cap=12, cadence=3)
STATUS = {A.DONE: "done", A.REJECTED: "rejected", A.NONE: "unfinished"}
POLICIES = ["fcfs", "lcf", "vtc", "vtc_predict", "vtc_oracle", "rpm"]


def check_against_reference(cols, policies, profile, rpm=4, weights=None, oracle_r=0.0):
    lane, replays = run_engine(*cols, policies, profile, rpm_limits={"rpm": rpm}, weights=weights, oracle_r=oracle_r)
    n = len(cols[0])
    order = np.lexsort((np.arange(n), np.round(np.asarray(cols[0]) * 1e6)))
    oracle = np.empty(n, np.float32)
    oracle[order] = oracle_predictions(lane, oracle_r)
    for policy, got in zip(policies, replays):
        status, first, finish = reference(*cols, policy, profile, rpm_limit=rpm if policy == "rpm" else None,
                                          weights=weights, oracle=oracle.tolist())
        assert [STATUS[int(s)] for s in got.outcome[:n]] == [status[j] for j in order], policy
        done = got.outcome[:n] == A.DONE
        assert got.first_us[:n][done].tolist() == [first[j] for j in order[done]], policy
        assert got.finish_us[:n][done].tolist() == [finish[j] for j in order[done]], policy


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_matches_reference(seed):
    check_against_reference(random_trace(seed), POLICIES, SMALL)


def test_engine_matches_reference_weighted_and_oracle_range():
    cols = random_trace(7, n=30, k=4)
    check_against_reference(cols, ["vtc", "vtc_oracle"], SMALL, weights=[1.0, 2.0, 3.0, 4.0], oracle_r=0.5)


def test_engine_matches_reference_idle_jump():
    """The `jump` idle rule: after an idle gap the server starts at the arrival itself."""
    cols = random_trace(5, n=24, k=3, horizon=20.0)
    check_against_reference(cols, POLICIES, SMALL.replace(idle="jump"))


def test_slots_bound_capacity_only():
    """A lane's results do not depend on the running slots its batch is given: alone (few
    slots) and beside a lane of many short requests (the batch's slots sized for those)."""
    cols = random_trace(1)
    many = random_trace(4, n=200, max_prompt=3, max_output=4, horizon=0.5)
    profile = SMALL.replace(running_cap=1000)
    lane, alone = run_engine(*cols, POLICIES, profile, rpm_limits={"rpm": 4})
    other = AI.make_trace(*many, input_extra=profile.input_extra, num_clients=K)
    scheds = [AR.Scheduler(p, rpm_limit=4 if p == "rpm" else None, profile=profile) for p in POLICIES]
    mixed, done = AR.run([lane] * len(scheds) + [other], scheds + scheds[:1], K, seeds=[SEED] * (len(scheds) + 1))
    assert done.all()
    for a, b in zip(alone, mixed):
        assert a.outcome.tolist() == b.outcome.tolist() and a.first_us.tolist() == b.first_us.tolist()
        assert a.finish_us.tolist() == b.finish_us.tolist() and (a.steps, a.prefills) == (b.steps, b.prefills)


# ------------------------------------------------------------------ KV check

def sorted_view(held, left) -> tuple[np.ndarray, np.ndarray]:
    """Host reference of the KV check's sorted view: (left sorted descending, V with
    V_j = (j + 1) * left_j + held of positions <= j), int64."""
    held, left = np.asarray(held, np.int64), np.asarray(left, np.int64)
    order = np.argsort(-left, kind="stable")
    lo = left[order]
    return lo, np.arange(1, lo.size + 1) * lo + np.cumsum(held[order])


def test_kv_need_against_direct_computation():
    """The sorted view's need with a candidate, and its insertion, against the definition
    (sort by tokens to come, max over k of k * left_k + held of the first k)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        m = int(rng.integers(0, 20))
        held = rng.integers(1, 500, m + 1)
        left = rng.integers(0, 400, m + 1)
        lo, v = sorted_view(held[:m], left[:m])
        slots = 24
        pad = lambda x, slots=slots: np.concatenate([x, np.zeros(slots - x.size, np.int64)]).astype(np.int32)
        need, place, v_new, v_shift = (np.asarray(x) for x in slora.kv_need_with(
            pad(lo), pad(v), np.int32(m), np.int32(held[m]), np.int32(left[m])))
        items = sorted(zip(held, left), key=lambda x: -x[1])
        direct = max(j * l + sum(h for h, _ in items[:j]) for j, (_, l) in enumerate(items, 1))
        assert int(need) == direct
        inserted = np.concatenate([v[:place], [v_new], v_shift[:m][place:]])
        assert inserted.tolist() == sorted_view(held, left)[1].tolist()


def test_sorted_view_invariant_under_a_decode_step():
    """A decode step (left - 1, held + 1 for every member) leaves every V unchanged."""
    rng = np.random.default_rng(2)
    held, left = rng.integers(1, 300, 12), rng.integers(1, 200, 12)
    assert sorted_view(held, left)[1].tolist() == sorted_view(held + 1, left - 1)[1].tolist()


# ------------------------------------------------------------------ hand-worked timelines

ONE_TOKEN = A.StepTime(prefill_base=0.0, prefill_per_token=1e-3, decode_base=10e-3, decode_per_request=0.0,
                       decode_per_context_token=0.0, overhead=1.0)


def times(replays, lane=0, n=None):
    return replays[lane].first_us[:n].tolist(), replays[lane].finish_us[:n].tolist()


def test_cadence_and_stall_timeline():
    """Request 0 (input 10, 6 outputs) at 0; request 1 (input 20, 2 outputs) at 1 ms.
    Prefill of 0: 10 ms -> t = 10 ms (first token of 0; the poll saw only request 0).
    Cadence 3: decode steps end at 20, 30, 40 ms (no admission although 1 waits).
    Before the 4th decode: admission -> prefill of 1 (20 ms, decoding stalls) -> 60 ms.
    Then 3 decode steps: 70 (0 has 5 tokens, 1 has 2 -> 1 finishes), 80 (0 finishes)."""
    prof = A.Profile(cadence=3, input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN)
    _, state = run_engine([0.0, 0.001], [0, 1], [10, 20], [6, 2], ["fcfs"], prof)
    assert times(state, n=2) == ([10_000, 60_000], [80_000, 70_000])
    assert state[0].prefills == 2 and state[0].steps == 2 + 3 + 2


def test_idle_poll_and_stall_of_running_batch():
    """Nothing runs until the poll after the first arrival (10 ms grid); a prefill admitted
    while a request runs delays that request's next token by the prefill's duration."""
    prof = A.Profile(cadence=0, input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN)
    _, state = run_engine([0.025, 0.041], [0, 1], [5, 30], [4, 1], ["fcfs"], prof)
    # poll at 30 ms: prefill 5 ms -> 35; decode -> 45; admission sees request 1 (41 ms):
    # prefill 30 ms -> 75 (1 finishes at its prefill); decodes -> 85, 95 (0 finishes).
    assert times(state, n=2) == ([35_000, 75_000], [95_000, 75_000])


def test_idle_jump_starts_at_the_arrival():
    """Same trace, idle = "jump": the prefill starts at 25 ms itself -> 30; decodes -> 40
    (request 1 arrives at 41 ms: not yet), 50; then request 1's prefill (30 ms) -> 80 (it
    finishes there) and the last decode of request 0 -> 90."""
    prof = A.Profile(cadence=0, input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN, idle="jump")
    _, state = run_engine([0.025, 0.041], [0, 1], [5, 30], [4, 1], ["fcfs"], prof)
    assert times(state, n=2) == ([30_000, 80_000], [90_000, 80_000])


def test_clock_near_its_limit_and_refused_past_it():
    """The clock is int32 microseconds: arrivals up to 2^30 - 1 us (1,073.7 s), runs up to
    slora.MAX_HORIZON (about 1,610 s): a request at 1,073 s is exact against the reference;
    an arrival past the clock is refused in one line naming it."""
    prof = A.Profile(cadence=0, input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN)
    arrivals = [0.0, 1000.0005, 1073.000123]
    _, state = run_engine(arrivals, [0, 0, 0], [5, 7, 9], [2, 3, 100], ["fcfs"], prof)
    status, first, finish = reference(arrivals, [0, 0, 0], [5, 7, 9], [2, 3, 100], "fcfs", prof)
    assert times(state, n=3) == (first, finish)
    assert finish[2] > 1 << 30
    with pytest.raises(InputError, match=r"^trace: an arrival at 3000 s is past the engine's int32 clock") as err:
        run_engine([0.0, 3000.0], [0, 0], [5, 7], [2, 3], ["fcfs"], prof)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ RPM sliding window

def test_rpm_window_boundary_is_inclusive():
    """Limit 2: arrivals 0, 1, 60 (0 is exactly 60 s before: still in the window ->
    rejected), 60.000001 (the window [0.000001, 60.000001] holds 1 only: accepted)."""
    arrivals = [0.0, 1.0, 60.0, 60.000001, 61.000002]
    lane, state = run_engine(arrivals, [0] * 5, [5] * 5, [1] * 5, ["rpm"], rpm_limits={"rpm": 2})
    got = [STATUS[int(s)] for s in state[0].outcome[:5]]
    assert got == ["done", "done", "rejected", "done", "done"]
    m = AR.lane_measures(lane, state[0], 4)
    assert m["rejected"] == 1 and m["rejected_per_client"].tolist() == [1, 0, 0, 0]


# ------------------------------------------------------------------ prediction charges

def _counter_after(policy, outputs, oracle_r=0.0, profile=None):
    prof = profile or A.Profile(input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN)
    n = len(outputs)
    lane, state = run_engine([0.05 * i for i in range(n)], [0] * n, [10] * n, outputs, [policy], prof,
                             oracle_r=oracle_r)
    return float(state[0].policy_counters[0]), lane, state


def test_oracle_exact_charges_input_plus_twice_output_once():
    c, _, _ = _counter_after("vtc_oracle", [5, 3])
    assert c == (10 + 2 * 5) + (10 + 2 * 3)


def test_vtc_charges_decode_steps_plus_extra_at_finish():
    # alone, sequentially: input + 2 per decode step (L - 1) + 2 at the finishing step
    c, _, _ = _counter_after("vtc", [5])
    assert c == 10 + 2 * 4 + 2


def test_oracle_range_refunds_and_charges_beyond():
    prof = A.Profile(input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN, extra_finish_charge=False)
    for r, output in ((0.9, 8), (0.9, 30), (0.5, 12)):
        c, lane, state = _counter_after("vtc_oracle", [output], oracle_r=r, profile=prof)
        p = oracle_predictions(lane, r)[0]
        # charged 10 + 2p; decode steps before which generated (1..L-1) exceeds p: charged 2
        # each; refund 2 (p - L) if p > L
        beyond = sum(1 for g in range(1, output) if g > np.float32(p))
        expected = 10 + 2 * p + 2 * beyond - (2 * (p - output) if p > output else 0)
        assert c == pytest.approx(expected, rel=1e-6), (r, output, p)


def test_predict_moving_average():
    """First request: prediction 0 (charged like vtc); after it, prediction = 6; after
    the second (output 11): 0.8 * 6 + 0.2 * 11 = 7."""
    prof = A.Profile(input_extra=0, adapter_reserve=0, step_time=ONE_TOKEN, extra_finish_charge=False)
    _, lane, state = _counter_after("vtc_predict", [6, 11, 3], profile=prof)
    # counter: r0: 10 + 2*5 decode; r1: 10 + 2*6 prepaid, beyond: g in 7..10 -> 4 steps;
    # r2: 10 + 2*7, refund 2*(7-3)
    expected = (10 + 10) + (10 + 12 + 8) + (10 + 14 - 8)
    assert float(state[0].policy_counters[0]) == pytest.approx(expected)


# ------------------------------------------------------------------ settings

def test_step_time_accepts_only_finite_non_negative_coefficients():
    for bad in (float("nan"), float("inf"), -1e-3, "x"):
        with pytest.raises(InputError):
            A.StepTime(decode_base=bad)
    with pytest.raises(InputError, match="unknown key"):
        A.StepTime.from_dict({"decode_bse": 0.02})
    assert A.StepTime(prefill_base=0).prefill_base == 0.0
    with pytest.raises(InputError):
        A.Profile(idle="sleep")
    with pytest.raises(InputError):
        A.Profile(input_extra=1 << 30)


def test_limits_are_refused_up_front():
    with pytest.raises(InputError, match="arrivals"):
        AI.make_trace([0.0, 2.0e12], [0, 0], [1, 1], [1, 1])
    with pytest.raises(InputError, match="prompt"):
        AI.make_trace([0.0], [0], [1 << 21], [1])
    cols = {"arrival_s": np.array([0.0]), "client": np.array([0]), "prompt": np.array([10]), "output": np.array([5])}
    slow = A.Profile(step_time=A.StepTime(prefill_per_token=1.0))  # 3,072 s per full prefill
    with pytest.raises(InputError, match="per step"):
        AR.check_limits(AR.Workload.fixed("slow", cols), slow, 32)


def test_never_admitted_is_exactly_the_engines_admission_rule():
    """At SMALL's limits (prefill_cap 600, kv_pool 1500 - adapter_reserve 32, input_extra
    2): a request at each limit runs to completion; one token over it, `never_admitted`
    says so, and so does the slora server, which refuses such a run before it starts; a
    lane holding one is reported as not finished, its requests neither served nor
    rejected, beside lanes that run."""
    prompt, output = [598, 599, 500, 500], [10, 10, 965, 966]
    assert AI.never_admitted(prompt, output, SMALL).tolist() == [False, True, False, True]
    options = dict(SMALL.server_options())
    for p, o, never in zip(prompt, output, AI.never_admitted(prompt, output, SMALL)):
        assert (slora.never_served(options, np.asarray([p + 2]), np.asarray([o]), SMALL.kv_pool) is not None) == never
    _, fits = run_engine([0.0, 0.5], [0, 0], [598, 500], [10, 965], ["fcfs"], SMALL)
    assert (fits[0].outcome[:2] == A.DONE).all()
    over = [AI.make_trace([0.0, 0.1], [0, 0], [p, 10], [o, 5], input_extra=2, num_clients=K)
            for p, o in ((599, 10), (500, 966))]
    good = AI.make_trace([0.0, 0.5], [0, 0], [598, 500], [10, 965], input_extra=2, num_clients=K)
    replays, done = AR.run([good] + over, [AR.Scheduler("fcfs", profile=SMALL)] * 3, K)
    assert done.tolist() == [True, False, False]
    assert (replays[0].outcome == A.DONE).all() and AR.stranded(replays).tolist() == [0, 2, 2]
    for trace in over:
        engine = AR.engine_trace(trace, SMALL)
        with pytest.raises(InputError, match="server slora: request 0"):
            AR.run_traces([engine], [AR.engine_settings(AR.Scheduler("fcfs", profile=SMALL), trace, K, 0)],
                          num_clients=K, server="slora")


def test_check_admissible_names_the_line_the_prompt_and_the_limit():
    cols = {"prompt": np.array([10, 3071, 3000]), "output": np.array([5, 5, 7000])}
    with pytest.raises(InputError) as err:
        AI.check_admissible(cols, A.Profile(), "log.csv", lines=np.array([2, 3, 5]))
    text = str(err.value)
    assert text.startswith("log.csv: line 3: server input 3073 tokens (prompt 3071") and "prefill_cap 3072" in text
    assert "(1 more such requests)" in text and "\n" not in text
    with pytest.raises(InputError, match=r"x: request 1: prompt 3000 .* output 7000 = 10002 KV tokens .* kv_pool 10000"):
        AI.check_admissible({"prompt": cols["prompt"][[0, 2]], "output": cols["output"][[0, 2]]}, A.Profile(), "x")
    AI.check_admissible({"prompt": np.array([3070]), "output": np.array([6895])}, A.Profile(), "x")  # both at the limit


# ------------------------------------------------------------------ suites

@pytest.mark.parametrize("name", sorted(S.SUITES))
def test_suite_rates_and_lengths(name):
    spec = S.SUITES[name]
    t = S.generate(name, seed=1)
    assert t["arrival_s"].min() >= 0 and t["arrival_s"].size <= spec.max_requests()
    assert (np.diff(t["arrival_s"]) >= 0).all()
    assert t["arrival_s"].max() < spec.duration + 60  # not cut at the duration, but near it
    for c in range(spec.num_clients):
        mine = t["client"] == c
        expected, tol = S.expected_requests(name, c)
        assert abs(mine.sum() - expected) <= tol, (c, mine.sum(), expected)
        (plo, phi), (olo, ohi) = spec.lengths(c)
        assert plo <= t["prompt"][mine].min() and t["prompt"][mine].max() <= phi
        assert olo <= t["output"][mine].min() and t["output"][mine].max() <= ohi


def test_on_off_silences_client_zero_in_odd_minutes():
    t = S.generate("on_off_less", seed=0)
    a = t["arrival_s"][t["client"] == 0]
    assert ((a // 60) % 2 == 0).all()


def test_suite_seed_42_is_the_artifacts_trace():
    """The artifact's committed dist_shift runs (fair_bench/VTC/all_results_dist_shift.jsonl)
    served 1,889 requests, the first at 0.9753571532049581 s (client 1), then
    2.749080237694725 s (client 0), the last at 900.3120372808849 s (client 0)."""
    t = S.generate("dist_shift")
    assert t["arrival_s"].size == 1889
    assert t["arrival_s"][:5].tolist() == [0.9753571532049581, 1.475357153204958, 1.975357153204958,
                                           2.475357153204958, 2.749080237694725]
    assert t["client"][:5].tolist() == [1, 1, 1, 1, 0]
    assert t["arrival_s"][-1] == 900.3120372808849 and t["client"][-1] == 0


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
    thr = sum(prompt[i] + output[i] for i in range(len(arrival)) if served[i]) / max(end[served])  # from t = 0
    ttft = [first[i] - arrival[i] for i in range(len(arrival)) if served[i]]
    return np.array(diff), rate, demand, thr, float(np.median(ttft))


@pytest.mark.parametrize("policy", ["vtc", "fcfs", "rpm"])
def test_measures_against_numpy(policy):
    cols = random_trace(11, n=60, k=4, horizon=30.0, max_output=200)
    lane, state = run_engine(*cols, [policy], A.Profile(kv_pool=3000), rpm_limits={"rpm": 6})
    ticks = AR.Ticks(spacing=3.0, count=8, window=6.0)
    s = state[0]
    m = AR.lane_measures(lane, s, 4, ticks)
    n = lane.prompt.size
    served = s.outcome[:n] == A.DONE
    arrival = np.round(lane.arrival_s * 1e6) / 1e6
    first, end = s.first_us[:n] / 1e6, s.finish_us[:n] / 1e6
    diff, rate, demand, thr, med = numpy_measures(arrival, lane.client, lane.prompt, lane.output, first, end,
                                                   served, 4, ticks)
    np.testing.assert_allclose(m["rate"], rate, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(m["demand"], demand, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(m["diff"], diff, rtol=1e-4, atol=1e-2)
    assert m["avg_diff"] == pytest.approx(diff.mean(), rel=1e-4, abs=1e-2)
    assert m["max_diff"] == pytest.approx(diff.max(), rel=1e-4, abs=1e-2)
    assert m["throughput"] == pytest.approx(thr, rel=1e-9)
    assert m["ttft_median"] == pytest.approx(med, rel=1e-9)
    assert m["rejected"] == float((s.outcome[:n] == A.REJECTED).sum())


def test_revision_ticks():
    assert AR.Ticks.for_duration(360).bounds()[0][:2].tolist() == [28.5, 57.0]  # the artifact used T = 600
    assert AR.Ticks.for_duration(600) == AR.Ticks()
    assert AR.Ticks.for_duration(900).spacing == 43.5


# ------------------------------------------------------------------ reading traces

def test_trace_csv_errors_name_file_and_line(tmp_path):
    path = tmp_path / "t.csv"
    for body, needle in (("", "empty file"), ("arrival_s,client,prompt\n0,0,1\n", "missing column 'output'"),
                         ("arrival_s,client,prompt,output\n", "no requests"),
                         ("arrival_s,client,prompt,output\n0,0,1,1\n1,0,2#3,1\n", "line 3: prompt"),
                         ("arrival_s,client,prompt,output\nnan,0,1,1\n", "line 2: arrival_s"),
                         ("arrival_s,client,prompt,output\n0,0,1,1,9\n", "line 2: 5 fields"),
                         ("arrival_s,client,prompt,output,x\n", "unexpected column")):
        path.write_text(body)
        with pytest.raises(InputError, match=needle) as err:
            AI.read_trace_csv(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value)
    path.write_text("client,arrival_s,prompt,output\n3,0.5,10,#2\n")  # '#' is no comment marker
    with pytest.raises(InputError, match="line 2: output"):
        AI.read_trace_csv(path)
    path.write_text("client,arrival_s,prompt,output\n3,0.5,10,2\n\n1,0.25,4,1\n")
    cols = AI.read_trace_csv(path)
    assert cols["arrival_s"].tolist() == [0.5, 0.25] and cols["client"].tolist() == [3, 1]


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


def _profile_rows():
    rows = ["batch_size,context_tokens,prompt_tokens,step_time_s"]
    for b, ctx, p in [(0, 0, 100), (0, 0, 2000), (4, 400, 0), (8, 3000, 0), (30, 6000, 0), (60, 9000, 0)]:
        t = 0.214e-3 * p if p else 19.7e-3 + 0.215e-3 * b + 1.71e-6 * ctx
        rows.append(f"{b},{ctx},{p},{t}")
    return rows


def test_calibrate_cli(tmp_path, capsys):
    from sweeps.calibrate import main

    path = tmp_path / "profile.csv"
    path.write_text("\n".join(_profile_rows()) + "\n")
    out = tmp_path / "st.json"
    assert main([str(path), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["decode_base"] == pytest.approx(19.7e-3, rel=1e-6)
    assert got["prefill_per_token"] == pytest.approx(0.214e-3, rel=1e-6)
    assert A.StepTime.from_dict(got).decode_base == got["decode_base"]
    assert [p.name for p in tmp_path.iterdir()] and not any(p.name.startswith(".st.json") for p in tmp_path.iterdir())


@pytest.mark.parametrize("body, needle", [
    ("", "empty file"),
    ("a,b\n1,2\n", "unexpected column"),
    ("batch_size,context_tokens,prompt_tokens,step_time_s\n", "no rows"),
    ("batch_size,context_tokens,prompt_tokens,step_time_s\n1,2,0,nan\n", "line 2: step_time_s"),
    ("batch_size,context_tokens,prompt_tokens,step_time_s\n1,2,0,inf\n", "line 2: step_time_s"),
    ("batch_size,context_tokens,prompt_tokens,step_time_s\n-1,2,0,0.1\n", "line 2: batch_size"),
    ("batch_size,context_tokens,prompt_tokens,step_time_s\n1,2#3,0,0.1\n", "line 2: context_tokens"),
    ("batch_size,context_tokens,prompt_tokens,step_time_s\n1,2,0,0.1\n", "need >= 3 decode rows"),
    # decode time falling with the batch: a negative coefficient, never written
    ("batch_size,context_tokens,prompt_tokens,step_time_s\n0,0,100,0.02\n1,10,0,0.05\n2,10,0,0.04\n"
     "3,10,0,0.03\n4,20,0,0.02\n", "< 0"),
])
def test_calibrate_bad_input_is_one_line_and_exit_2(tmp_path, capsys, body, needle):
    from sweeps.calibrate import main

    path = tmp_path / "bad.csv"
    path.write_text(body)
    out = tmp_path / "st.json"
    assert main([str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and err.startswith("python -m sweeps.calibrate: error:")
    assert not out.exists()


# ------------------------------------------------------------------ the paper sweep

@pytest.mark.parametrize("args, needle", [
    (["--parts", "nope"], "--parts"),
    (["--parts", "real", "--input-extra", "99999999999"], "--input-extra"),
    (["--parts", "real", "--step-time", "MISSING.json"], "MISSING.json"),
    (["--parts", "real", "--idle", "sleep"], "--idle"),
    (["--parts", "suites", "--check"], "--check"),
])
def test_paper_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, args, needle):
    from sweeps.paper import main

    assert main(args + ["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_paper_bad_trace_and_step_time_are_one_line(tmp_path, capsys):
    from sweeps.paper import main

    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_s,client,prompt,output\n0.5,0,10,-3\n")
    assert main(["--parts", "real", "--trace", str(trace), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{trace}: line 2: output" in err and err.count("\n") == 1
    st = tmp_path / "st.json"
    st.write_text(json.dumps({**{f: 1e-3 for f in ("prefill_base", "prefill_per_token", "decode_base",
                                                    "decode_per_request", "decode_per_context_token")},
                              "overhead": float("nan")}))
    assert main(["--parts", "real", "--step-time", str(st), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "overhead" in err and err.count("\n") == 1


def test_paper_on_another_trace_labels_rows_with_its_name(tmp_path, capsys):
    """Every policy name the tables use, on a 40-request trace of one's own: rows carry
    the file's name, no paper values are shown or stored, the outputs are one set."""
    from sweeps.paper import main

    cols = random_trace(4, n=40, k=4)
    trace = tmp_path / "my_trace.csv"
    trace.write_text("arrival_s,client,prompt,output\n" + "\n".join(",".join(map(str, r)) for r in zip(*cols)) + "\n")
    out = tmp_path / "out"
    assert main(["--parts", "real,rpm", "--trace", str(trace), "--seeds", "1", "--out", str(out), "--no-plots",
                 "--no-cache"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    labels = [r["label"] for r in result["rows"]]
    assert labels[:5] == [f"my_trace {p}" for p in ("vtc", "fcfs", "lcf", "vtc_oracle", "vtc_predict")]
    assert "my_trace rpm R=5" in labels and not any(l.startswith("real") for l in labels)
    assert not any("paper" in r for r in result["rows"]) and "(paper)" not in printed and "(779" not in printed
    assert all(r["metrics"]["unfinished"]["max"] == 0 for r in result["rows"])
    assert result["rows"][0]["service_rate"]["ticks_s"][0] == 28.5
    assert sorted(p.name for p in out.iterdir()) == ["results.csv", "results.json"]


def test_paper_weighted_rows_through_the_driver():
    """Weighted VTC, oracle, predict and RPM rows through the driver on one small workload:
    weights follow the workload's own client ids, RPM rejects, every lane finishes."""
    from sweeps import paper
    from vtc_jax.driver.sweep import run_sweep

    cols = dict(zip(AI.TRACE_COLUMNS, map(np.asarray, random_trace(4, n=40, k=4))))
    wl = AR.Workload.fixed("tiny", cols)
    prof = A.Profile()
    rows = [paper._row(wl, p, prof, 0.0) for p in ("vtc", "vtc_oracle", "vtc_predict")]
    rows.append(paper._row(wl, "rpm", prof, 0.0, rpm=2))
    sched = AR.Scheduler("vtc", name="vtc_weighted", weights=(1.0, 2.0, 3.0, 4.0), profile=prof)
    rows.insert(0, paper.Row(sched, wl, "tiny vtc_weighted", {"workload": "tiny"}))
    result = run_sweep(paper.declare("paper", rows, {}, False), 1, log=sys.stderr)
    assert [r["setting"]["policy"] for r in result["rows"]] == ["vtc_weighted", "vtc", "vtc_oracle", "vtc_predict",
                                                                  "rpm"]
    assert all(r["metrics"]["unfinished"]["max"] == 0 for r in result["rows"])
    assert result["rows"][-1]["metrics"]["rejected"]["mean"] > 0
    assert sum(result["rows"][-1]["rejected_per_client"]) == result["rows"][-1]["metrics"]["rejected"]["mean"]
