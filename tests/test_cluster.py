"""The cluster lane (vtc_jax/engines/cluster.py) against its literal reference
(vtc_jax/testing/cluster_reference.py), to the integer, on many small random clusters (R, G in
1..3, K in 2..4, every saturation rule, replica choice and counter mode, several router
and engine policies); hand cases with known outcomes (the 1:1 collapse under full skew,
shared counters restoring 4:1, replica choice rules); the ingress and p2c hashes; input
refusal; the sweep CLI. Clusters of any server: every policy at the replicas and routers,
with replica limits (rpm in both modes, KV caps, bands), on ideal and on slora replicas
(per-replica microsecond clocks; first-token and finish times); a hand-worked slora
cluster; one router and one replica against the one-server references. The ideal lanes
run in one batch (one compile), the slora lanes in one more."""

from __future__ import annotations

import dataclasses
import json
import random
from fractions import Fraction
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.testing import cluster_reference as cref
from vtc_jax import Settings, Trace
from vtc_jax.core.errors import InputError
from vtc_jax.driver.cluster_run import simulate_traces
from vtc_jax.engines.cluster import ingress_router
from vtc_jax.driver.policy_modules import load_policy_module
from vtc_jax.engines.cluster_settings import AFFINITY_SALT, CHOICES, COUNTERS, INGRESS_BITS, ClusterSettings, gateway_problem
from vtc_jax.inputs.workload import ARRIVAL, INT32_MAX, ORDER
from vtc_jax.measures.online import latency_bin
from vtc_jax.policies import registry
from vtc_jax.policies.base import weight_scale
from vtc_jax.servers import slora
from vtc_jax.testing import reference as ref
from vtc_jax.testing.lanes import random_lanes, random_settings
from vtc_jax.testing.slora_reference import literal_slora

GATEWAY_POLICIES = ("vtc_gateway", "drr", "wfq", "sfq", "vtc", "fcfs", "lcf")
ENGINE_POLICIES = ("fcfs", "vtc", "lcf", "drr", "wfq", "sfq", "las", "vtc_predict", "vtc_gateway")
STEPS = 45
RANDOM_LANES = {2: 96, 3: 80, 4: 64}


def random_cluster(rng: random.Random, k: int) -> ClusterSettings:
    """Random exact cluster settings (R, G in 1..3), every rule and mode."""
    weights = None
    if rng.random() < 0.6:
        weights = tuple(Fraction(rng.choice([1, 2, 3, 4]), rng.choice([1, 1, 2, 3])) for _ in range(k))
    engine, gateway = rng.choice(ENGINE_POLICIES), rng.choice(GATEWAY_POLICIES)
    extra = {}
    if registry.get(engine).fuzz_options is not None:
        extra["options"] = tuple(registry.get(engine).fuzz_options(rng).items())
    eng = Settings(policy=engine, kv_budget=rng.randint(24, 64), w_p=rng.choice([1, 1, Fraction(1, 2), Fraction(3, 2)]),
                   w_q=rng.choice([2, 2, 1, Fraction(5, 4)]), beta=rng.choice([0, 0, Fraction(1, 4), 1]),
                   weights=weights, estimator=rng.choice(["exact", "fixed", "noisy"]),
                   estimate_guess=rng.randint(1, 12),
                   estimate_error=rng.choice([0, Fraction(1, 2)]), estimate_seed=rng.randrange(1 << 32),
                   charge_cached=rng.random() < 0.2, lift_last_left=rng.random() < 0.8, **extra)
    g = rng.randint(1, 3)
    gate_options = ()
    if registry.get(gateway).fuzz_options is not None:
        gate_options = tuple(registry.get(gateway).fuzz_options(rng).items())
    ingress = None
    if rng.random() < 0.2:
        cols = [[rng.randint(0, 3) for _ in range(g)] for _ in range(k)]
        ingress = tuple(tuple(Fraction(c, sum(row)) if sum(row) else Fraction(1, g) for c in row) for row in cols)
    return ClusterSettings(
        engine=eng, gateway_policy=gateway, gateway_options=gate_options, replicas=rng.randint(1, 3), routers=g,
        skew=rng.choice([0, Fraction(1, 2), 1]), ingress=ingress, counters=rng.choice(COUNTERS),
        delay=rng.randint(1, 4), holdback=rng.random() < 0.7, saturation=rng.choice(["kv", "queue"]),
        kv_threshold=rng.choice([Fraction(1, 2), Fraction(1), Fraction(3, 2), Fraction(2)]),
        queue_limit=rng.randint(1, 4), choice=rng.choice(CHOICES), seed=rng.randrange(1 << 32),
        measure_from=rng.choice([0, 0, 5]))


def random_requests(rng: random.Random, k: int, m: int) -> list:
    reqs = []
    for _ in range(rng.randint(4, 28)):
        prompt = rng.randint(1, max(1, m // 3)) if rng.random() < 0.7 else rng.randint(1, m)
        cached = rng.randint(1, prompt - 1) if prompt >= 2 and rng.random() < 0.2 else 0
        reqs.append(cref.Req(rng.randrange(STEPS - 5), rng.randrange(k), prompt, rng.randint(1, 10), cached))
    return reqs


# ---- hand cases: (name, settings, K, requests) -------------------------------------------

def _overload(n=60):
    """Two tenants, equal requests (prompt 4, output 1), all at step 0."""
    return [cref.Req(0, k, 4, 1) for _ in range(n) for k in (0, 1)]


def _skewed(counters: str, **kw) -> ClusterSettings:
    """2 routers, fully skewed ingress (tenant k -> router k), one replica admitting one
    request per step (M = 4, queue limit 1), weights 4:1, gateway VTC."""
    return ClusterSettings(engine=Settings("fcfs", kv_budget=4, weights=(4, 1)), gateway_policy="vtc_gateway",
                           replicas=1, routers=2, skew=1, counters=counters, saturation="queue", queue_limit=1, **kw)


def _spread(choice: str) -> ClusterSettings:
    return ClusterSettings(engine=Settings("fcfs", kv_budget=64), gateway_policy="fcfs", replicas=3, routers=1,
                           saturation="kv", kv_threshold=64, choice=choice, seed=7)


HAND = {
    "collapse": (_skewed("per_router"), 2, _overload()),
    "shared": (_skewed("shared"), 2, _overload()),
    "shared_no_holdback": (_skewed("shared", holdback=False), 2, _overload()),
    "delayed": (_skewed("delayed", delay=6), 2, _overload()),
    "round_robin": (_spread("round_robin"), 2, [cref.Req(0, 0, 4, 3) for _ in range(9)]),
    "affinity": (_spread("affinity"), 2, [cref.Req(0, k, 4, 3) for k in (0, 1, 0, 1, 0, 1)]),
    "least_kv": (_spread("least_kv"), 2, [cref.Req(0, 0, p, 5) for p in (10, 3, 6, 1)]),
}


def _trace(reqs) -> Trace:
    return Trace.from_rows([(r.arrival, r.client, r.prompt, r.output, r.cached) for r in reqs])


@pytest.fixture(scope="module")
def batch():
    """Every lane of this module in one compiled batch: (results, lanes), each lane
    (name, settings, K, requests)."""
    rng = random.Random(2024)
    lanes = []
    for k, count in RANDOM_LANES.items():
        for i in range(count):
            cs = random_cluster(rng, k)
            lanes.append((f"random K={k} #{i}", cs, k, random_requests(rng, k, cs.engine.kv_budget)))
    lanes += [(name, cs, k, reqs) for name, (cs, k, reqs) in HAND.items()]
    lanes += timed_lanes("ideal", TIMED_LANES, 41)  # test_every_policy_and_limit_on_clusters_of_ideal
    res = simulate_traces([_trace(r) for _, _, _, r in lanes], [cs for _, cs, _, _ in lanes],
                          num_clients=[k for _, _, k, _ in lanes], steps=STEPS, record=True)
    return res, lanes


def _frac(units, scale) -> Fraction:
    return Fraction(int(units), int(scale))


def compare(res, b: int, ref: cref.ClusterRef, cs: ClusterSettings, reqs, k: int) -> None:
    """Lane b of the JAX results against the reference, to the integer: per replica and
    tenant service, counters, admissions, completions; dispatch counts per (router,
    replica, tenant); router counters and policy state; every request's router, dispatch
    step, replica, dispatch sequence and admission step; the backlogged measures."""
    where = f"lane {b}: {cs}"
    assert res.finished[b], where
    q, d = int(res.cost_scale[b]), int(res.counter_scale[b])
    big_r, big_g, big_k = res.dispatched.shape[2], res.dispatched.shape[1], res.service_units.shape[2]
    for r in range(big_r):
        for c in range(big_k):
            live = r < cs.replicas and c < k
            assert _frac(res.service_units[b, r, c], q) == (ref.service[r][c] if live else 0), (where, "W", r, c)
            assert _frac(res.counter_units[b, r, c], q * d) == (ref.counters[r][c] if live else 0), (where, "c", r, c)
            assert res.admitted[b, r, c] == (ref.admitted[r][c] if live else 0), (where, "admitted", r, c)
            assert res.completed[b, r, c] == (ref.completed[r][c] if live else 0), (where, "completed", r, c)
            for j in range(big_g):
                want = ref.dispatched[j][r][c] if live and j < cs.routers else 0
                assert res.dispatched[b, j, r, c] == want, (where, "dispatched", j, r, c)
    for p in range(1 if cs.counters == "shared" else cs.routers):
        pol = ref.policies[p]
        assert [_frac(x, q * d) for x in res.router_counter_units[b, p, :k]] == ref.router_counter[p], (where, "rc", p)
        state = res.policy_state.get(cs.gateway_policy, {})
        if cs.gateway_policy == "vtc_gateway":
            assert [_frac(x, q * d) for x in state["counter"][b, p, :k]] == pol.v, (where, "vtc_gateway counter", p)
        if cs.gateway_policy == "drr":
            scale = weight_scale(cs.engine.client_weights(k))
            assert [_frac(x, q * scale) for x in state["deficit"][b, p, :k]] == pol.deficit, (where, "deficit", p)
        if cs.gateway_policy in ("wfq", "sfq"):
            assert [_frac(x, q * d) for x in state["f_tail"][b, p, :k]] == pol.f_tail, (where, "f_tail", p)
            assert _frac(state["v"][b, p], q * d) == pol.v, (where, "v", p)
    order = sorted(range(len(reqs)), key=lambda n: (reqs[n].arrival, n))
    rank = {n: i for i, n in enumerate(order)}
    rows = res.rows[b]
    by_rank = {int(rows[i, ORDER]): i for i in np.flatnonzero(rows[:, ARRIVAL] < INT32_MAX)}
    tenant_rows = rows.shape[0] // big_g
    none = lambda x: -1 if x is None else x  # noqa: E731
    for n in range(len(reqs)):
        if ref.router[n] is None:  # rejected at arrival (rpm reject mode): it never reaches a router
            assert rank[n] not in by_rank, (where, "rejected request has a row", n)
            continue
        i = by_rank[rank[n]]
        assert i // tenant_rows == ref.router[n], (where, "router of request", n)
        want = [ref.dispatch_step[n], ref.dispatch_replica[n], ref.dispatch_seq[n], ref.admit_step[n]]
        assert [int(x) for x in res.records[b, i]] == [none(x) for x in want], (where, "request", n)
        if res.first_token is not None:
            assert [int(res.first_token[b, i]), int(res.finish[b, i])] == [none(ref.first_token[n]), none(ref.finish[n])], (
                where, "first token, finish of request", n)
    assert res.rejected[b, :k].tolist() == ref.rejected, (where, "rejected")
    assert [_frac(x, q) for x in res.backlogged_units[b, :k]] == ref.backlogged, (where, "backlogged service")
    assert _frac(res.drift_units[b], q * d) == ref.drift, (where, "drift")
    assert res.backlogged_steps[b] == ref.backlogged_steps, (where, "backlogged steps")
    hist = np.zeros(res.wait_hist.shape[2], np.int64)
    for w in ref.waits:
        hist[int(latency_bin(jnp.int32(w)))] += 1
    assert (res.wait_hist[b].sum(axis=0) == hist).all(), (where, "waits")


def test_random_clusters_match_reference(batch):
    res, lanes = batch
    seen = {"counters": set(), "saturation": set(), "choice": set(), "gateway": set(), "engine": set(), "rg": set()}
    for b, (name, cs, k, reqs) in enumerate(lanes):
        if not name.startswith("random"):
            continue
        compare(res, b, cref.simulate(reqs, k, cs, STEPS), cs, reqs, k)
        seen["counters"].add(cs.counters)
        seen["saturation"].add(cs.saturation)
        seen["choice"].add(cs.choice)
        seen["gateway"].add(cs.gateway_policy)
        seen["engine"].add(cs.engine.policy)
        seen["rg"].add((cs.replicas, cs.routers))
    assert seen["counters"] == set(COUNTERS) and seen["saturation"] == {"kv", "queue"}
    assert seen["choice"] == set(CHOICES) and seen["gateway"] == set(GATEWAY_POLICIES)
    assert seen["engine"] == set(ENGINE_POLICIES) and len(seen["rg"]) == 9
    assert (res.dispatched.sum() > 0) and res.finished.all()


def _hand(batch, name):
    res, lanes = batch
    b = next(i for i, lane in enumerate(lanes) if lane[0] == name)
    _, cs, k, reqs = lanes[b]
    ref = cref.simulate(reqs, k, cs, STEPS)
    compare(res, b, ref, cs, reqs, k)
    return res, b, ref


def test_collapse_and_what_shared_counters_buy(batch):
    """Fully skewed ingress (tenant k reaches router k), one request per step: with
    per-router counters the routers alternate and the 4:1 weighting collapses to exactly
    1:1; with shared counters and hold-back the routers dispatch in the order one VTC
    would (4:1, exactly 36:9 in 45 steps); shared counters without hold-back buy nothing;
    delayed counters land in between."""
    per = {}
    for name in ("collapse", "shared", "shared_no_holdback", "delayed"):
        res, b, ref = _hand(batch, name)
        per[name] = res.dispatched[b].sum(axis=(0, 1))[:2]
    assert list(per["collapse"]) == [23, 22]  # alternating routers, router 0 first
    assert list(per["shared_no_holdback"]) == [23, 22]
    assert list(per["shared"]) == [36, 9]
    assert per["collapse"][0] < per["delayed"][0] < per["shared"][0]


def test_replica_choice_rules(batch):
    res, b, ref = _hand(batch, "round_robin")
    assert [ref.dispatch_replica[n] for n in range(9)] == [0, 1, 2] * 3
    res, b, ref = _hand(batch, "affinity")
    homes = [cref.mix32(cref.mix32(7 ^ AFFINITY_SALT) ^ k) % 3 for k in (0, 1)]
    assert [ref.dispatch_replica[n] for n in range(6)] == [homes[k] for k in (0, 1, 0, 1, 0, 1)]
    assert res.dispatched[b, 0, homes[0], 0] == 3
    res, b, ref = _hand(batch, "least_kv")
    # loads 0,0,0 -> 0 (10 tokens); 0,0 -> 1 (3); then replica 2 (0), then replica 1 (3 < 6, 10)
    assert [ref.dispatch_replica[n] for n in range(4)] == [0, 1, 2, 1]


def test_ingress_hash_matches_reference_and_probabilities():
    """The JAX ingress draw is the reference's integer hash, and its frequencies follow P."""
    cs = ClusterSettings(engine=Settings("fcfs"), routers=3, skew=Fraction(1, 2), seed=12345)
    thr = np.asarray(cs.thresholds(2), np.int32)
    n = 6000
    client = np.repeat([0, 1], n)
    position = np.tile(np.arange(n), 2)
    got = np.asarray(ingress_router(jnp.uint32(cs.seed), jnp.asarray(client), jnp.asarray(position),
                                    jnp.asarray(thr[client])))
    for i in range(0, 2 * n, 997):
        u = cref.mix32((cref.mix32(cref.mix32(cs.seed ^ cref.INGRESS_SALT) ^ int(client[i])) + int(position[i]))
                       & cref.M32) >> 8
        assert got[i] == sum(1 for x in thr[client[i]] if x <= u)
    for k in (0, 1):
        freq = np.bincount(got[client == k], minlength=3) / n
        want = [float(x) for x in cs.probabilities(2)[k]]  # 2/3 to router k, 1/6 to each other
        assert np.abs(freq - want).max() < 0.02
    assert thr[0, -1] == 1 << INGRESS_BITS


@pytest.mark.parametrize("kwargs, message", [
    (dict(gateway_policy="las"), "needs completions"),
    (dict(gateway_policy="vtc_predict"), "needs completions"),
    (dict(gateway_policy="rpm"), "admission limit"),
    (dict(engine=Settings("vtc_gateway", estimator="average")), "estimator"),
    (dict(replicas=0), "replicas"),
    (dict(routers=17), "routers"),
    (dict(skew=Fraction(3, 2)), "skew"),
    (dict(counters="global"), "counters"),
    (dict(delay=0), "delay"),
    (dict(saturation="tokens"), "saturation"),
    (dict(kv_threshold=0), "kv threshold"),
    (dict(choice="random"), "replica choice"),
    (dict(routers=2, ingress=((Fraction(1, 2), Fraction(1, 3)),)), "summing to 1"),
    (dict(policy_typo=1), None),
])
def test_bad_settings_are_refused(kwargs, message):
    if message is None:
        with pytest.raises(TypeError):
            ClusterSettings(**kwargs)
        return
    with pytest.raises(InputError, match=message):
        ClusterSettings(**kwargs)


def test_ingress_matrix_must_match_tenants():
    cs = ClusterSettings(engine=Settings("fcfs"), routers=2, ingress=((1, 0), (0, 1)))
    with pytest.raises(InputError, match="rows for 3 tenants"):
        cs.thresholds(3)
    with pytest.raises(InputError, match="larger than the KV budget"):
        simulate_traces([Trace.from_rows([(0, 0, 9000, 2)])], [cs], num_clients=2, steps=5)


def test_sweep_cli(tmp_path, capsys):
    from sweeps import cluster as sweep_cluster

    out = tmp_path / "cluster"
    argv = ["--seeds", "2", "--steps", "300", "--replicas", "2", "--routers", "2", "--skew", "0,1",
            "--counters", "per_router,shared", "--estimate-error", "0", "--no-compare", "--out", str(out)]
    assert sweep_cluster.main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    rows = {(r["setting"]["skew"], r["setting"]["counters"]): r["metrics"] for r in result["rows"]
            if r["setting"]["group"] == "grid"}
    assert set(rows) == {(0, "per_router"), (0, "shared"), (1, "per_router"), (1, "shared")}
    for m in rows.values():
        assert {"weight_ratio", "weighted_share_error", "max_drift", "throughput", "p99_wait"} <= set(m)
        assert m["weight_ratio"]["n"] == 2
    # full skew with per-router counters collapses towards 1:1; shared counters restore ~4:1
    assert rows[(1, "per_router")]["weight_ratio"]["mean"] < 2
    assert rows[(1, "shared")]["weight_ratio"]["mean"] > 3
    assert (out / "ratio_vs_skew.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "weight_ratio" in printed
    assert sweep_cluster.main(["--seeds", "1", "--skew", "2", "--out", str(tmp_path / "x")]) == 2


# ---- clusters of any server (ideal, slora), replica limits ---------------------------------------

ROOT = Path(__file__).resolve().parents[1]
SLORA_HORIZON = 400  # microseconds: about half the random slora lanes drain by it
TIMED_LANES = 240  # per server


def _hand_slora_options(idle: str) -> tuple:
    """Steps of whole microseconds: prefill 10 + 1 per input token, decode 5; poll 7 us."""
    opts = {"kv_pool": 1000, "adapter_reserve": 0, "prefill_cap": 1000, "running_cap": 10, "cadence": 0, "poll_us": 7,
            "idle": idle, "extra_finish_charge": False, "overhead": 1.0, "prefill_base": 10e-6,
            "prefill_per_token": 1e-6, "decode_base": 5e-6, "decode_per_request": 0.0, "decode_per_context_token": 0.0}
    return tuple(sorted(opts.items()))


def _hand_slora(idle: str):
    """Two slora replicas behind one FCFS router (round robin), three requests."""
    cs = ClusterSettings(engine=Settings("fcfs", kv_budget=1000, server_options=_hand_slora_options(idle)),
                         gateway_policy="fcfs", replicas=2, routers=1, kv_threshold=64, choice="round_robin")
    return cs, 2, [cref.Req(0, 0, 4, 3), cref.Req(2, 1, 6, 2), cref.Req(9, 0, 2, 1)]


HAND_SLORA = {f"hand slora {idle}": _hand_slora(idle) for idle in ("poll", "jump")}


def test_hand_worked_slora_cluster():
    """Two slora replicas (prefill 10 + 1/token us, decode 5 us, poll 7 us, cadence 0), one
    FCFS router dispatching round robin; n0 = (t 0, tenant 0, prompt 4, output 3), n1 =
    (2, 1, 6, 2), n2 = (9, 0, 2, 1). Idle rule poll:
      t=0: n0 -> replica 0, admitted, prefill 10 + 4 = 14 (first token 14); replica 1 has
        nothing and falls asleep at 0.
      t=2: n1 -> replica 1: asleep since 0, it wakes at the first whole poll, 0 + 7 = 7.
      t=7: replica 1 admits n1: prefill 10 + 6 = 16 (first token 23).
      t=9: n2 -> replica 0 (round robin), which is inside its step: n2 waits.
      t=14: replica 0 admits n2 (cadence 0); its prefill stalls n0: 10 + 2 = 12, n2
        (output 1) gets its first and last token at 26.
      t=23: replica 1 decodes n1 (5 us): finished at 28. t=26: n2 leaves; n0 decodes (31).
      t=28: n1 leaves, replica 1 sleeps. t=31: n0 decodes again, finished at 36.
    Idle rule jump: replica 1 wakes at the dispatch, 2: n1's first token 18, finish 23.
    Horizon 30: n0's last step (31..36) is not reached; its decode step 26..31, started
    before the horizon, is charged (service counted at a step's start). Horizon 33: that
    last step is charged but still running: n0 is not finished (no finish time)."""
    cs, k, reqs = HAND_SLORA["hand slora poll"]
    ref = cref.simulate(reqs, k, cs, 40, server="slora")
    assert (ref.dispatch_step, ref.dispatch_replica, ref.dispatch_seq) == ([0, 2, 9], [0, 1, 0], [0, 1, 2])
    assert (ref.admit_step, ref.first_token, ref.finish) == ([0, 7, 14], [14, 23, 26], [36, 28, 26])
    assert ref.service == [[10, 0], [0, 8]] and ref.completed == [[2, 0], [0, 1]] and ref.waits == [0, 5, 5]
    cut = cref.simulate(reqs, k, cs, 30, server="slora")
    assert (cut.first_token, cut.finish) == ([14, 23, 26], [None, 28, 26])
    assert cut.service == [[4 + 2 + 2, 0], [0, 8]] and cut.completed == [[1, 0], [0, 1]]
    inside = cref.simulate(reqs, k, cs, 33, server="slora")  # n0's last step, 31..36, is running at 33
    assert inside.finish == [None, 28, 26] and inside.service == [[10, 0], [0, 8]] and inside.completed == cut.completed
    cs, k, reqs = HAND_SLORA["hand slora jump"]
    jump = cref.simulate(reqs, k, cs, 40, server="slora")
    assert (jump.admit_step, jump.first_token, jump.finish) == ([0, 2, 14], [14, 18, 26], [36, 23, 26])


def _every_engine_policy() -> list:
    """Every registered policy and the user's own (examples/my_policy.py)."""
    mine = load_policy_module(ROOT / "examples" / "my_policy.py")
    names = list(registry.names())
    assert mine and set(mine) <= set(names)
    return names


def _replica_settings(rng: random.Random, policy: str, k: int, m: int, server: str, reqs) -> Settings:
    """lanes.random_settings (rpm in both modes, bands, estimators, options, prices) with
    more limits: an rpm limit on 30% of lanes, bands on 20%, KV caps on 20%; slora's fuzzed
    settings on slora (microsecond steps interleaving with the arrivals)."""
    s = random_settings(rng, policy, k, m)
    extra = {"estimator": "exact"} if s.estimator == "average" else {}  # the cluster has no average estimator
    if s.rpm_limit is None and rng.random() < 0.3:
        extra.update(rpm_limit=rng.randint(1, 3), rpm_mode=rng.choice(["delay", "reject"]))
    if s.bands is None and rng.random() < 0.2:
        extra["bands"] = tuple(rng.choice([0, 0, 1]) for _ in range(k))
    if rng.random() < 0.2:
        # a cap at least each tenant's largest request: a request over its cap would never run, and the literal
        # references that drain (literal_slora) would wait for it forever
        most = [max([r.prompt + r.output for r in reqs if r.client == c], default=1) for c in range(k)]
        if rng.random() < 0.5:
            extra["kv_cap"] = tuple(max(rng.randint(m // 2, 2 * m), most[c]) for c in range(k))
        else:
            extra["kv_cap"] = max(rng.randint(m, 3 * m), *most)
    if server == "slora":
        extra["rpm_window"] = rng.randint(1, 80)
        extra["server_options"] = tuple(sorted(slora.fuzz_options(rng, [r.prompt for r in reqs],
                                                                  [r.output for r in reqs]).items()))
    return dataclasses.replace(s, **extra)


def test_one_router_one_replica_cluster_is_one_server():
    """One FCFS router with room for everything in front of one replica is the one-server
    engine: the cluster reference against vtc_jax.testing.reference (ideal, horizon 50) and
    literal_slora (slora, until drained), every policy, random limits: per tenant W and c
    (exact), admissions, completions, rejections; per request the admission step (ideal),
    first token and finish (slora)."""
    names = _every_engine_policy()
    rng = random.Random(31)
    lanes = random_lanes(rng, 12 * len(names), num_clients=3, policies=names, num_requests=(1, 16))
    servers_seen = set()
    for i, (reqs, s0) in enumerate(zip(lanes.requests, lanes.settings)):
        server = ("ideal", "slora")[i % 2]
        s = _replica_settings(rng, s0.policy, 3, s0.kv_budget, server, reqs)
        cs = ClusterSettings(engine=s, gateway_policy="fcfs", kv_threshold=64)
        where = f"lane {i} ({server}): {s}"
        if server == "ideal":
            one = ref.simulate(reqs, num_clients=3, settings=s, steps=50)
            got = cref.simulate(reqs, 3, cs, 50, server=server)
            want = (one.service[-1], one.counters[-1], one.admitted, one.completed, one.rejected, one.admit_step)
            assert (got.service[0], got.counters[0], got.admitted[0], got.completed[0], got.rejected,
                    got.admit_step) == want, where
        else:
            W, c, admitted, completed, rejected, first, finish = literal_slora(reqs, s, 3)
            opts = dict(s.server_options)
            horizon = slora.drain_steps(opts, [r.arrival for r in reqs], [r.prompt for r in reqs], [r.output for r in reqs])
            got = cref.simulate(reqs, 3, cs, horizon, server=server)
            none = lambda xs: [-1 if x is None else x for x in xs]  # noqa: E731
            assert (got.service[0], got.counters[0], got.admitted[0], got.completed[0], got.rejected, none(got.first_token),
                    none(got.finish)) == (W, c, admitted, completed, rejected, first, finish), where
        servers_seen.add(server)
    assert servers_seen == {"ideal", "slora"}


def timed_lanes(server: str, count: int, seed: int) -> list:
    """`count` random clusters of `server` replicas (name, settings, K, requests): every
    engine policy (the user's own too) at the replicas and every gateway policy the cluster
    allows at the routers, in turn; G in {1, 2}, R in {1, 2, 3}; random_cluster's counter
    modes, saturation rules and replica choices; _replica_settings' limits."""
    engines = _every_engine_policy()
    gateways = [n for n in engines if gateway_problem(n) is None]
    rng = random.Random(seed)
    lanes = []
    for i in range(count):
        k = rng.randint(2, 3)
        base = random_cluster(rng, k)
        m = base.engine.kv_budget
        reqs = random_requests(rng, k, m)
        eng = _replica_settings(rng, engines[i % len(engines)], k, m, server, reqs)
        if eng.kv_cap is not None:  # a request over its tenant's cap is refused: caps at least the largest
            most = [max([r.prompt + r.output for r in reqs if r.client == c], default=1) for c in range(k)]
            eng = dataclasses.replace(eng, kv_cap=tuple(x + rng.randint(0, m) for x in most))
        gateway = gateways[(i // len(engines) + i) % len(gateways)]
        spec = registry.get(gateway)
        options = tuple(spec.fuzz_options(rng).items()) if spec.fuzz_options is not None else ()
        cs = dataclasses.replace(base, engine=eng, gateway_policy=gateway, gateway_options=options, ingress=None,
                                 routers=rng.randint(1, 2), replicas=rng.randint(1, 3))
        lanes.append((f"{server} #{i}", cs, k, reqs))
    return lanes


@pytest.fixture(scope="module")
def slora_batch():
    """(results, lanes): TIMED_LANES random clusters of slora replicas and the hand-worked
    slora lanes in one engine call, horizon SLORA_HORIZON microseconds."""
    lanes = timed_lanes("slora", TIMED_LANES, 43) + [(name, cs, k, reqs) for name, (cs, k, reqs) in HAND_SLORA.items()]
    res = simulate_traces([_trace(r) for _, _, _, r in lanes], [cs for _, cs, _, _ in lanes],
                          num_clients=[k for _, _, k, _ in lanes], steps=SLORA_HORIZON, record=True, server="slora")
    return res, lanes


def check_timed(server: str, horizon: int, res, lanes) -> None:
    """Every lane of `server` replicas against the literal reference, exact (compare: per
    request router, dispatch time, replica, sequence, admission, first token, finish; per
    replica and tenant W, c, admissions, completions; router counters and state; drift;
    backlogged events; waits; rejections), and what the lanes covered."""
    seen = {"engine": set(), "gateway": set(), "gr": set(), "counters": set(), "limits": set()}
    for b, (name, cs, k, reqs) in enumerate(lanes):
        if not name.startswith(server):
            continue
        compare(res, b, cref.simulate(reqs, k, cs, horizon, server=server), cs, reqs, k)
        e = cs.engine
        seen["engine"].add(e.policy)
        seen["gateway"].add(cs.gateway_policy)
        seen["gr"].add((cs.routers, cs.replicas))
        seen["counters"].add(cs.counters)
        seen["limits"] |= {x for x, on in (("delay", e.rpm_delays), ("reject", e.rpm_rejects), ("cap", e.kv_cap is not None),
                                           ("bands", e.bands is not None)) if on}
    engines = _every_engine_policy()
    assert seen["engine"] == set(engines) and seen["gateway"] == {n for n in engines if gateway_problem(n) is None}
    assert len(seen["gr"]) == 6 and seen["counters"] == set(COUNTERS)
    assert seen["limits"] == {"delay", "reject", "cap", "bands"}
    assert res.rejected.sum() > 0 and res.finished.all()


def test_every_policy_and_limit_on_clusters_of_ideal(batch):
    """Clusters of ideal replicas (in the module's batch), every engine and gateway policy,
    random replica limits (rpm in both modes, KV caps, bands): engine = reference."""
    res, lanes = batch
    check_timed("ideal", STEPS, res, lanes)


def test_every_policy_and_limit_on_clusters_of_slora(slora_batch):
    """Clusters of slora replicas (microsecond steps interleaving with the arrivals,
    per-replica clocks, sleep and wake), every engine and gateway policy, random replica
    limits: engine = reference, first-token and finish times included; the horizon cuts
    some lanes (their steps running at it are not finished) and others drain; the
    hand-worked lanes' engine timelines are the reference's."""
    res, lanes = slora_batch
    check_timed("slora", SLORA_HORIZON, res, lanes)
    drained = [all(x is not None for x in cref.simulate(r, k, cs, SLORA_HORIZON, server="slora").finish)
               for name, cs, k, r in lanes if name.startswith("slora")]
    assert 0 < sum(drained) < len(drained)
    for b, (name, cs, k, reqs) in enumerate(lanes):
        if name.startswith("hand slora"):
            compare(res, b, cref.simulate(reqs, k, cs, SLORA_HORIZON, server="slora"), cs, reqs, k)
