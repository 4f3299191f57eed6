"""The `slora` server (vtc_jax/servers/slora.py) on the main engine against the literal
reference of the artifact's router loop (tests/test_artifact.py `reference`): every
request's first-token and finish time in microseconds, rejections, on hundreds of random
lanes with random engine settings (cadence, idle rule, adapter reserve, the extra finish
charge, caps). The artifact's policies map to registry policies: fcfs, lcf, vtc without
the last_left clause, weighted vtc (weights), vtc_oracle (r = 0) = vtc_predict with the
exact estimator, rpm = fcfs under an rpm limit in reject mode. Every registered policy and
the user's own (examples/my_policy.py) also drains and conserves on slora."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest

from tests.test_artifact import SMALL, random_trace, reference
from vtc_jax import InputError, MeasureConfig, Settings, Trace, run_traces
from vtc_jax.driver.policy_modules import load_policy_module
from vtc_jax.engines import artifact as A
from vtc_jax.policies import registry
from vtc_jax.servers import slora
from vtc_jax.testing import reference as ref
from vtc_jax.testing.lanes import random_lanes

ROOT = Path(__file__).resolve().parents[1]
K = 4
WINDOW_S = 2.0
# the artifact's policy -> the registry's (Settings fields)
MAPPED = {"fcfs": {"policy": "fcfs"}, "lcf": {"policy": "lcf"}, "vtc": {"policy": "vtc", "lift_last_left": False},
          "vtc_oracle": {"policy": "vtc_predict", "estimator": "exact", "lift_last_left": False},
          "rpm": {"policy": "rpm", "rpm_mode": "reject", "rpm_window": int(WINDOW_S * 1e6)}}


def slora_options(profile: A.Profile) -> dict:
    """The slora server options of an artifact Profile."""
    st = profile.step_time
    return {"kv_pool": profile.kv_pool, "adapter_reserve": profile.adapter_reserve, "prefill_cap": profile.prefill_cap,
            "running_cap": profile.running_cap, "cadence": profile.cadence, "poll_us": int(round(profile.poll_s * 1e6)),
            "idle": profile.idle, "extra_finish_charge": profile.extra_finish_charge,
            **{key: getattr(st, key) for key in (*slora.TIME_KEYS, "overhead")}}


def random_profile(rng: random.Random) -> A.Profile:
    return SMALL.replace(cadence=rng.randint(0, 4), idle=rng.choice(A.IDLE_RULES), adapter_reserve=rng.choice((0, 32, 96)),
                         extra_finish_charge=rng.random() < 0.7, running_cap=rng.randint(2, 14),
                         prefill_cap=rng.choice((400, 600, 900)), rpm_window_s=WINDOW_S)


def engine_times(traces, settings, num_clients):
    """(LaneResults, per lane [first, finish] per trace row, -1 where not served)."""
    res = run_traces(traces, settings, num_clients=num_clients, server="slora", measures=MeasureConfig())
    out = []
    for lane, trace in enumerate(traces):
        n = len(trace)
        fcfs = np.lexsort((np.arange(n), trace.arrival))  # ORDER -> trace row
        times = np.full((2, n), -1, np.int64)
        times[:, fcfs] = (np.asarray(res.server_state.first)[lane, :n], np.asarray(res.server_state.finish)[lane, :n])
        out.append(times)
    return res, out


def lanes_of(seed: int, count: int, policies):
    """`count` random traces, each under every artifact policy in `policies`, each lane with
    a random profile: (traces, settings, reference runs, what was drawn)."""
    rng = random.Random(seed)
    traces, settings, expect, drawn = [], [], [], []
    for i in range(count):
        cols = random_trace(seed * 1000 + i, n=rng.randint(1, 40), k=K, horizon=rng.choice((2.0, 6.0, 20.0)))
        weights = [rng.choice((1, 2, 3, 4)) for _ in range(K)] if rng.random() < 0.3 else None
        arr, client, prompt, output = cols
        for policy in policies:
            profile = random_profile(rng)
            w = weights if policy in ("vtc", "lcf", "vtc_oracle") else None
            trace = Trace.from_rows([(int(round(a * 1e6)), c, p + profile.input_extra, o)
                                     for a, c, p, o in zip(arr, client, prompt, output)])
            limit = rng.randint(1, 4) if policy == "rpm" else None
            traces.append(trace)
            settings.append(Settings(kv_budget=profile.kv_pool, w_p=1, w_q=2, rpm_limit=limit,
                                     weights=None if w is None else tuple(w),
                                     server_options=tuple(sorted(slora_options(profile).items())), **MAPPED[policy]))
            expect.append(reference(*cols, policy, profile, rpm_limit=limit,
                                    weights=None if w is None else [float(x) for x in w]))
            drawn.append((seed, i, policy, profile, limit, w))
    return traces, settings, expect, drawn


@pytest.mark.parametrize("seed", [1, 2])
def test_slora_matches_the_artifact_reference_on_random_lanes(seed):
    traces, settings, expect, drawn = lanes_of(seed, 60, ("fcfs", "lcf", "vtc", "vtc_oracle", "rpm"))
    res, times = engine_times(traces, settings, K)
    for lane, ((status, first, finish), got, what) in enumerate(zip(expect, times, drawn)):
        assert res.finished[lane], what
        done = np.asarray([s == "done" for s in status])
        assert np.array_equal(done, got[0] >= 0), what
        assert got[0][done].tolist() == np.asarray(first)[done].tolist(), what
        assert got[1][done].tolist() == np.asarray(finish)[done].tolist(), what
        assert int(res.rejected[lane].sum()) == status.count("rejected"), what


def test_hand_worked_timeline_prefill_stall_and_cadence():
    """Two requests of one client at t = 0 and 0.05 s, the artifact's step-time model:
    the first prefill (12 input tokens: 231.12 us each, 2,773 us), decode steps of one
    request (21,276 + 232 + 1.8468 us per context token), the second arrival waits out the
    cadence (10 decode steps), its prefill stalls the running request, then both decode
    until the second (output 3) leaves."""
    profile = A.Profile()
    traces, settings = [Trace.from_rows([(0, 0, 12, 20), (50_000, 0, 12, 3)])], [
        Settings(policy="fcfs", kv_budget=10_000, server_options=tuple(sorted(slora_options(profile).items())))]
    res, (times,) = engine_times(traces, settings, 1)
    tc = A.StepTime().coefficients_us()
    prefill = lambda tokens: int(np.round(tc[0])) + int(np.round(tc[1] * np.float32(tokens)))  # noqa: E731
    decode = lambda running, context: (int(np.round(tc[2])) + int(np.round(tc[3] * np.float32(running)))  # noqa: E731
                                       + int(np.round(tc[4] * np.float32(context))))
    t = prefill(12)
    assert times[0, 0] == t == 2773
    for g in range(1, 11):  # 10 decode steps before the next admission
        t += decode(1, 12 + g)
    assert decode(1, 13) == 21_276 + 232 + 24
    second_first = t + prefill(12)
    assert times[0, 1] == second_first
    t = second_first
    for g in range(11, 20):
        t += decode(2, 12 + g + 12 + (g - 10)) if g <= 12 else decode(1, 12 + g)
        if g == 12:
            assert times[1, 1] == t  # the second request (output 3) finishes with the first's 13th token
    assert times[1, 0] == t


def test_idle_poll_and_jump():
    """An arrival after an idle gap starts at the first whole 10 ms poll, counted from the
    idle start, at or after the arrival (poll), or at the arrival itself (jump)."""
    base = A.Profile()
    rows = [(0, 0, 10, 1), (1_234_567, 0, 10, 1)]
    lanes = [Settings(policy="fcfs", kv_budget=10_000,
                      server_options=tuple(sorted(slora_options(base.replace(idle=idle)).items())))
             for idle in A.IDLE_RULES]
    _, (poll, jump) = engine_times([Trace.from_rows(rows)] * 2, lanes, 1)
    pre = poll[0, 0]  # one prefill of 10 tokens; the first request (output 1) leaves with it
    assert pre == 2311 and poll[0, 1] == pre + 124 * 10_000 + pre and jump[0, 1] == 1_234_567 + pre


def test_every_policy_and_a_users_own_drain_on_slora():
    """Every registered policy and examples/my_policy.py, on random lanes with random slora
    settings: every lane drains and the conservation laws hold (requests, service = the
    charged tokens from a separate ledger)."""
    mine = load_policy_module(ROOT / "examples" / "my_policy.py")
    names = list(registry.names())
    assert mine and set(mine) <= set(names)
    rng = random.Random(7)
    lanes = random_lanes(rng, 2 * len(names), num_clients=3, policies=names, num_requests=(1, 12))
    settings = []
    for trace, s in zip(lanes.traces, lanes.settings):
        options = slora.fuzz_options(rng, trace.prompt, trace.output)
        settings.append(dataclasses.replace(s, server_options=tuple(sorted(options.items()))))
    res = run_traces(lanes.traces, settings, num_clients=3, server="slora", measures=MeasureConfig.of(["ledger"]))
    for lane, s in enumerate(settings):
        assert res.finished[lane], s
        assert res.completed[lane].sum() + res.rejected[lane].sum() == len(lanes.traces[lane]), s
        assert res.conservation[lane] == [], (s, res.conservation[lane])


def test_settings_are_checked_in_one_line():
    for options, needle in (({"cadence": -1}, "cadence"), ({"idle": "sleep"}, "idle"), ({"nope": 1}, "no setting"),
                            ({"decode_base": float("nan")}, "decode_base"), ({"decode_base": 1e3}, "longest step")):
        with pytest.raises(InputError, match=needle):
            slora.validate(options)
    assert "prefill_cap" in slora.never_served({"prefill_cap": 10}, np.asarray([11]), np.asarray([1]), 10_000)
    assert "never" in slora.never_served({}, np.asarray([100]), np.asarray([9_868]), 10_000)
    assert slora.never_served({}, np.asarray([100]), np.asarray([9_867]), 10_000) is None


# ------------------------------------------------------------------ every policy, exactly

def literal_slora(requests, settings: Settings, num_clients: int):
    """The engine with the slora server, literally: events in MODEL.md's order (the last
    step's completions, in request order; arrivals; admissions while the policy's candidate
    passes slora's checks; the step: the round's prefill, else a decode step, else a poll,
    or an idle wait to the next whole poll), the policy's own literal reference driven by
    its hooks (vtc_jax.testing.reference's conventions), exact Fractions for W and c.
    Returns (W, c, admitted, completed, rejected per client; first, finish per request)."""
    reqs = list(requests)
    K, s = num_clients, settings
    o = slora.settings(dict(s.server_options))
    tc = slora.coefficients_us(o)
    sim = ref._Sim(reqs, s, K)
    pol = registry.get(s.policy).reference(s, sim)
    call = lambda name, *a, default=None: getattr(pol, name)(*a) if hasattr(pol, name) else default  # noqa: E731
    n_req = len(reqs)
    order = sorted(range(n_req), key=lambda n: (reqs[n].arrival, n))
    rank = {n: i for i, n in enumerate(order)}
    caps, bands, R, window = list(s.client_caps(K)), list(s.client_bands(K)), s.rpm_limit, s.rpm_window
    rejected_set, rejected = set(), [0] * K
    if s.rpm_rejects:
        accepted = [[] for _ in range(K)]
        for n in order:
            r = reqs[n]
            if sum(1 for a in accepted[r.client] if a >= r.arrival - window) >= R:
                rejected_set.add(n)
            else:
                accepted[r.client].append(r.arrival)
        seen = [0] * K
        for n in order:
            if n not in rejected_set:
                sim.position[n], seen[reqs[n].client] = seen[reqs[n].client], seen[reqs[n].client] + 1
    admitted, completed, rpm_counts, value = [0] * K, [0] * K, {}, {}
    first, finish, gen = [-1] * n_req, [-1] * n_req, {}
    round_, leaving, nxt, t, wait = [], [], 0, 0, 0
    slot, free, fresh = {}, [], [0]  # slots as the server's free-list stack hands them out

    def charge(k, x):
        sim.W[k] += x
        sim.c[k] += x / sim.omega[k]

    def eligible_clients():
        def under_cap(k):
            held = sum(reqs[n].prompt + reqs[n].output for n in sim.running if reqs[n].client == k)
            return held + reqs[sim.fifo[k][0]].prompt + reqs[sim.fifo[k][0]].output <= caps[k]
        ok = [k for k in range(K) if sim.fifo[k] and under_cap(k)]
        if s.rpm_delays:
            ok = [k for k in ok if rpm_counts.get((t // window, k), 0) < R]
        if ok and s.bands is not None:
            ok = [k for k in ok if bands[k] == min(bands[j] for j in ok)]
        return ok

    def fits(n):
        items = [(reqs[m].prompt + gen[m], reqs[m].output - gen[m] - 1) for m in sim.running if m not in round_]
        items += [(reqs[m].prompt + 1, reqs[m].output - 1) for m in round_ + [n]]
        items.sort(key=lambda x: -x[1])
        need = max(j * left + sum(h for h, _ in items[:j]) for j, (_, left) in enumerate(items, 1))
        clients = len({reqs[m].client for m in sim.running + [n]})
        allowed = len(sim.running) == len(round_) or wait >= o["cadence"]
        return (allowed and need < o["kv_pool"] - o["adapter_reserve"] * clients and len(sim.running) + 1 <= o["running_cap"]
                and sum(reqs[m].prompt for m in round_) + reqs[n].prompt <= o["prefill_cap"])

    def terms(*xs):
        return max(1, sum(int(np.round(np.float32(x))) for x in xs))

    for n in rejected_set:  # decided at arrival, counted for the run
        rejected[reqs[n].client] += 1
    while True:
        sim.t = t
        for n in sorted(leaving, key=rank.get):  # the last step's completions, in request order
            sim.running.remove(n)
            free.append(slot.pop(n))
            completed[reqs[n].client] += 1
            call("on_complete", n, value.pop(n))
            sim.observe(n)
        leaving = []
        if sum(completed) == n_req - len(rejected_set):
            break
        while nxt < n_req and reqs[order[nxt]].arrival <= t:  # arrivals
            n = order[nxt]
            nxt += 1
            if n in rejected_set:
                continue
            call("on_arrival", n)
            sim.fifo[reqs[n].client].append(n)
        while True:  # admissions
            eligible = eligible_clients()
            k = pol.select(eligible) if eligible else None
            if k is None or not fits(sim.fifo[k][0]):
                break
            n = sim.fifo[k].pop(0)
            sim.running.append(n)
            if free:
                slot[n] = free.pop()
            else:
                slot[n], fresh[0] = fresh[0], fresh[0] + 1
            round_.append(n)
            sim.last_left = k
            charge(k, sim.prefill_charge(n))
            admitted[k] += 1
            if s.rpm_delays:
                rpm_counts[(t // window, k)] = rpm_counts.get((t // window, k), 0) + 1
            value[n] = call("on_admit", n, default=sim.estimate(n))
        if round_:  # the round's prefill
            elapsed = terms(tc[0], tc[1] * np.float32(sum(reqs[n].prompt for n in round_)))
            batch, decoders = round_, []
            for n in round_:
                gen[n], first[n] = 1, t + elapsed
            wait = 0
        elif sim.running:  # a decode step
            decoders = list(sim.running)
            context = sum(reqs[n].prompt + gen[n] for n in decoders)
            elapsed = terms(tc[2], tc[3] * np.float32(len(decoders)), tc[4] * np.float32(context))
            batch = decoders
            wait += 1
        elif any(sim.fifo):  # something waits that no round admitted: one poll
            elapsed, batch, decoders = o["poll_us"], [], []
        else:  # idle: to the next whole poll at or after the next arrival (or the arrival)
            a = reqs[order[nxt]].arrival
            wake = a if o["idle"] == "jump" else t + -(-(a - t) // o["poll_us"]) * o["poll_us"]
            elapsed, batch, decoders = max(1, wake - t), [], []
        sim.detail = artifact_charges(reqs, K, batch, decoders, gen, value, slot, o["extra_finish_charge"])
        for n in decoders:
            charge(reqs[n].client, sim.w_q + sim.beta * (reqs[n].prompt + gen[n]))
            gen[n] += 1
        done = [n for n in batch if gen[n] >= reqs[n].output]
        if done and o["extra_finish_charge"]:
            for n in batch:
                charge(reqs[n].client, sim.w_q)
        for n in done:
            finish[n] = t + elapsed
        sim.generated = {n: gen[n] for n in sim.running}
        call("on_step_end", elapsed)
        round_, leaving, t = [], done, t + elapsed
    return sim.W, sim.c, admitted, completed, rejected, first, finish


def artifact_charges(reqs, num_clients, batch, decoders, gen, value, slot, extra_on) -> dict:
    """slora's Work.detail of a step, literally: per client, in float32 summed in slot
    order, the decoders past their prediction (the value's float32 bits) and the extra
    finish charges past it less the unused predictions of the finishing requests."""
    f = np.float32
    pred = {n: value[n] if isinstance(value[n], np.floating) else np.asarray(int(value[n] or 0), np.int32).view(f)
            for n in batch}  # only vtc_artifact reads these (its values are float32 predictions)
    charge, settle = [f(0)] * num_clients, [f(0)] * num_clients
    after = {n: gen[n] + (n in decoders) for n in batch}
    finishing = any(after[n] >= reqs[n].output for n in batch)
    for n in sorted(batch, key=slot.get):
        k, out = reqs[n].client, f(reqs[n].output)
        if n in decoders and f(gen[n]) > pred[n]:
            charge[k] = f(charge[k] + f(1))
        late = f(1) if extra_on and finishing and f(after[n]) > pred[n] else f(0)
        refund = f(pred[n] - out) if after[n] >= reqs[n].output and out < pred[n] else f(0)
        settle[k] = f(settle[k] + f(late - refund))
    return {"charge": charge, "settle": settle}


def test_every_policy_and_a_users_own_are_exact_on_slora():
    """Every registered policy and examples/my_policy.py on slora, on hundreds of random
    lanes (random settings: weights, fractional prices, beta, rpm limits in both modes,
    bands, estimators, policy options; random slora settings with microsecond steps that
    interleave with the arrivals), against `literal_slora`: every request's first-token
    and finish time, and per client the final service W and counter c (exact), admissions,
    completions and rejections."""
    load_policy_module(ROOT / "examples" / "my_policy.py")
    names = list(registry.names())
    rng = random.Random(11)
    lanes = random_lanes(rng, 25 * len(names), num_clients=3, policies=names, num_requests=(1, 14))
    settings = [dataclasses.replace(s, server_options=tuple(sorted(slora.fuzz_options(rng, t.prompt, t.output).items())))
                for t, s in zip(lanes.traces, lanes.settings)]
    res, times = engine_times(lanes.traces, settings, 3)
    for lane, (reqs, s) in enumerate(zip(lanes.requests, settings)):
        W, c, admitted, completed, rejected, first, finish = literal_slora(reqs, s, 3)
        where = f"lane {lane}: {s}"
        assert res.finished[lane], where
        assert times[lane][0].tolist() == first and times[lane][1].tolist() == finish, where
        assert list(res.service_exact[lane]) == W and list(res.counters_exact[lane]) == c, where
        assert (res.admitted[lane].tolist(), res.completed[lane].tolist(), res.rejected[lane].tolist()) == (
            admitted, completed, rejected), where
