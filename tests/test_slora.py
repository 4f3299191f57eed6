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
from vtc_jax.testing.lanes import random_lanes
from vtc_jax.testing.slora_reference import literal_slora

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
