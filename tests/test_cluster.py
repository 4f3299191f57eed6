"""The cluster lane (vtc_jax/engines/cluster.py) against its literal reference
(vtc_jax/testing/cluster_reference.py), to the integer, on many small random clusters (R, G in
1..3, K in 2..4, every saturation rule, replica choice and counter mode, several router
and engine policies); hand cases with known outcomes (the 1:1 collapse under full skew,
shared counters restoring 4:1, replica choice rules); the ingress and p2c hashes; input
refusal; the sweep CLI. Every simulated lane runs in one batch (one compile)."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.testing import cluster_reference as cref
from vtc_jax import Settings, Trace
from vtc_jax.core.errors import InputError
from vtc_jax.driver.cluster_run import simulate_traces
from vtc_jax.engines.cluster import ingress_router
from vtc_jax.engines.cluster_settings import AFFINITY_SALT, CHOICES, COUNTERS, INGRESS_BITS, ClusterSettings
from vtc_jax.inputs.workload import ARRIVAL, INT32_MAX, ORDER
from vtc_jax.measures.online import latency_bin
from vtc_jax.policies import registry
from vtc_jax.policies.base import weight_scale

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
    for n in range(len(reqs)):
        i = by_rank[rank[n]]
        assert i // tenant_rows == ref.router[n], (where, "router of request", n)
        want = [ref.dispatch_step[n], ref.dispatch_replica[n], ref.dispatch_seq[n], ref.admit_step[n]]
        assert [int(x) for x in res.records[b, i]] == [-1 if x is None else x for x in want], (where, "request", n)
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
