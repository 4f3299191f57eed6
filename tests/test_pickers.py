"""The endpoint pickers (vtc_jax/pickers): ENGINE_FLEET's hand-worked cases (section 7), the
peers' own tests ported as assertions (llm-d router, Dynamo's KV router, BLIS: each test
names its source file and test), and every registered picker against its slow literal
reference (vtc_jax/testing/pickers_reference.py) on many random lanes of picks and routes,
vmapped over lanes as the runner does."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.core.lanes import LANE_AXIS
from vtc_jax.pickers import Request, Shape, Snapshot, llmd, make_params, prefix_index, registry
from vtc_jax.pickers.base import tie_draws
from vtc_jax.testing import pickers_reference as ref

FIELDS = Snapshot._fields


def snapshot(r, **kw) -> Snapshot:
    """A Snapshot of r replicas: the given fields, zeros elsewhere, every replica present."""
    out = {f: jnp.asarray(kw.get(f, [0] * r), jnp.int32) for f in FIELDS if f != "present"}
    return Snapshot(**out, present=jnp.asarray(kw.get("present", [True] * r), bool))


def request(blocks=(), t_max=8, prompt=0, engine_blocks=0) -> Request:
    row = list(blocks) + [-1] * (t_max - len(blocks))
    return Request(jnp.asarray(row, jnp.int32), jnp.asarray(len(blocks), jnp.int32), jnp.asarray(prompt, jnp.int32),
                   jnp.asarray(engine_blocks, jnp.int32))


def kv(fractions, usable=10):
    """(kv_used, kv_usable) for KV usages given as multiples of 1 / usable."""
    return {"kv_used": [round(f * usable) for f in fractions], "kv_usable": [usable] * len(fractions)}


@functools.lru_cache(maxsize=None)
def jitted(name):
    picker = registry.get(name)
    return jax.jit(picker.pick), jax.jit(picker.routed)


def lowest(shape, **kw):
    return make_params(shape, ties="lowest", **kw)


KEY = jax.random.PRNGKey(0)


# ---- ENGINE_FLEET section 7 -----------------------------------------------------------------


def test_scoring_case_load_beats_a_75_percent_hit():
    """W = (4, 0, 2), KV = (0.5, 0.2, 0.9), m / T = (3/4, 0, 0): q = (0, 1, 0.5), k = (0.5, 0.8,
    0.1), S = (3.25, 3.6, 1.2): replica 1 wins; with m / T = (1, 0, 0), S0 = 4.0 wins."""
    snap = snapshot(3, waiting=[4, 0, 2], **kv([0.5, 0.2, 0.9]))
    q, k, p = (np.asarray(x) for x in llmd.terms(snap, jnp.asarray([3, 0, 0]), 4))
    assert q.tolist() == [0.0, 1.0, 0.5] and p.tolist() == [0.75, 0.0, 0.0]
    np.testing.assert_allclose(k, [0.5, 0.8, 0.1], rtol=1e-6)
    weights = jnp.asarray([2.0, 2.0, 3.0], jnp.float32)
    np.testing.assert_allclose(llmd.scores(snap, jnp.asarray([3, 0, 0]), 4, weights), [3.25, 3.6, 1.2], rtol=1e-6)
    assert float(llmd.scores(snap, jnp.asarray([4, 0, 0]), 4, weights)[0]) == 4.0
    # End to end: replica 0's index holds blocks 0, 1, 2 (routed there before).
    shape = Shape(3, 8, 16, 16)
    pick, routed = jitted("llm-d")
    params = lowest(shape)
    state = routed(registry.get("llm-d").init(shape, params), 0, request([0, 1, 2]), params)
    assert int(pick(state, snap, request([0, 1, 2, 3]), KEY, params)[0]) == 1  # m / T = 3/4
    assert int(pick(state, snap, request([0, 1, 2]), KEY, params)[0]) == 0  # m / T = 1


def test_match_rule_is_not_a_per_replica_contiguous_prefix():
    """B = 1 token, capacity 2: route [a, b, c] to R0 (its set keeps b, c: a is evicted as
    least recent), route [a] to R1; then [a, b, c] matches m = (2, 1): a is held by R1 so the
    walk goes on, R0 counts b and c. A per-replica contiguous rule would give (0, 1)."""
    a, b, c = 5, 6, 7
    shape = Shape(2, 4, 2, 8)
    params = lowest(shape)
    _, routed = jitted("llm-d")
    state = routed(registry.get("llm-d").init(shape, params), 0, request([a, b, c], 4), params)
    state = routed(state, 1, request([a], 4), params)
    assert prefix_index.contents(state, 0) == [b, c] and prefix_index.contents(state, 1) == [a]
    assert prefix_index.match(state, request([a, b, c], 4).blocks, 3).tolist() == [2, 1]
    assert prefix_index.match(state, request([b, c], 4).blocks, 2).tolist() == [2, 0]
    assert prefix_index.match(state, request([9, b, c], 4).blocks, 3).tolist() == [0, 0]  # nobody holds block 0


# ---- llm-d router's tests (llm-d/llm-d-router@ebab6879) -------------------------------------


@pytest.mark.parametrize("waiting, want", [([10, 5, 0], [0.0, 0.5, 1.0]), ([5, 5], [1.0, 1.0]), ([0, 0], [1.0, 1.0])])
def test_llmd_queue_test_TestQueueScorer(waiting, want):
    """scorer/queuedepth/queue_test.go TestQueueScorer: different, same and zero queue sizes."""
    q = llmd.terms(snapshot(len(waiting), waiting=waiting, **kv([0] * len(waiting))), jnp.zeros(len(waiting), jnp.int32), 0)[0]
    assert np.asarray(q).tolist() == want


@pytest.mark.parametrize("usage, want", [([0.8, 0.5, 0.0], [0.2, 0.5, 1.0]), ([0.6, 0.6], [0.4, 0.4]), ([0.0, 0.0], [1.0, 1.0]),
                                         ([1.0, 0.5], [0.0, 0.5])])
def test_llmd_kvcache_utilization_test_TestKvCacheUtilizationScorer(usage, want):
    """scorer/kvcacheutilization/kvcache_utilization_test.go TestKvCacheUtilizationScorer:
    different, same, zero and full utilization (InDelta 1e-4 there)."""
    k = llmd.terms(snapshot(len(usage), **kv(usage)), jnp.zeros(len(usage), jnp.int32), 0)[1]
    np.testing.assert_allclose(np.asarray(k), want, atol=1e-6)


def test_llmd_maxscore_picker_test_TestPickMaxScorePicker():
    """picker/maxscore/picker_test.go TestPickMaxScorePicker: "Single max score" (10, 25, 15)
    -> pod2; "all are equally scored" (50, 50, 30) -> pod1 or pod2, each for some keys;
    the sorted cases' first pick: (20, 25, 30) -> pod3, (30, 25, 30) -> pod1 or pod3 (our
    picker returns one endpoint, maxNumOfEndpoints > 1 lists are not ours)."""
    present = jnp.ones(3, bool)

    def picks(scores):
        s = jnp.asarray(scores, jnp.float32)
        return {int(llmd.max_score(s, present, jax.random.PRNGKey(i), True)) for i in range(40)}

    assert picks([10, 25, 15]) == {1}
    assert picks([50, 50, 30]) == {0, 1}
    assert picks([20, 25, 30]) == {2}
    assert picks([30, 25, 30]) == {0, 2}


def _index_after(capacity, routes, replicas=1, num_ids=32):
    shape = Shape(replicas, 16, max(capacity), num_ids)
    params = lowest(shape, capacity=capacity)
    _, routed = jitted("llm-d")
    state = registry.get("llm-d").init(shape, params)
    for replica, blocks in routes:
        state = routed(state, replica, request(blocks, 16), params)
    return state


def test_llmd_indexer_test_TestIndexer_AddAndGet():
    """approximateprefix/indexer_test.go TestIndexer_AddAndGet: capacity 2 (the pod's
    NumOfGPUBlocks); add hash 1 (size 1), hash 2 (size 2), hash 3 (size still 2, hash 1
    evicted); hash 4 was never added."""
    state = _index_after([2], [(0, [1])])
    assert int(state.count[0]) == 1 and prefix_index.holders(state, 1).tolist() == [True]
    state = _index_after([2], [(0, [1]), (0, [2])])
    assert int(state.count[0]) == 2
    state = _index_after([2], [(0, [1]), (0, [2]), (0, [3])])
    assert int(state.count[0]) == 2 and prefix_index.contents(state, 0) == [2, 3]
    assert not prefix_index.holders(state, 1).any() and not prefix_index.holders(state, 4).any()


def test_llmd_indexer_test_TestIndexer_RemovePodAndEviction():
    """approximateprefix/indexer_test.go TestIndexer_RemovePodAndEviction (its eviction half;
    RemovePod is the fleet's, not the picker's): capacity 10, hashes 0..9 added to server1
    and server2 one by one: each hash held by both; hash 10 added to server1 evicts hash 0
    there only, server1 still holds 10 entries."""
    routes = [(s, [h]) for h in range(10) for s in (0, 1)]
    state = _index_after([10, 10], routes, replicas=2)
    assert all(prefix_index.holders(state, h).tolist() == [True, True] for h in range(10))
    state = _index_after([10, 10], routes + [(0, [10])], replicas=2)
    assert int(state.count[0]) == 10 and prefix_index.holders(state, 0).tolist() == [False, True]
    assert prefix_index.contents(state, 0) == list(range(1, 11))


def test_llmd_plugin_test_TestPreRequest():
    """approximateprefix/plugin_test.go TestPreRequest: "Basic cache update": after the
    request [1, 2] (B = 1) is routed to pod1, pod1 holds each of its blocks; "Respects
    LRUCapacityPerServer config": capacity 2, three one-block requests: the first is
    evicted, the latter two held."""
    state = _index_after([64], [(0, [1, 2])])
    assert prefix_index.holders(state, 1).tolist() == [True] and prefix_index.holders(state, 2).tolist() == [True]
    state = _index_after([2], [(0, [1]), (0, [2]), (0, [3])])
    assert [bool(prefix_index.holders(state, h)[0]) for h in (1, 2, 3)] == [False, True, True]


def test_llmd_plugin_test_TestPrefixPluginPartialPrefixMatch():
    """approximateprefix/plugin_test.go TestPrefixPluginPartialPrefixMatch: [1, 2] routed to
    pod1 (and to pod3, the test's prefill node: a second `routed`); then [1, 3] (B = 1: its
    block 0 is [1, 2]'s, block 1 is new) matches 1 of 2 blocks on pod1 and pod3, 0 on pod2.
    Ids from the content: picker_blocks of a group sharing token 0."""
    from vtc_jax.inputs import picker_blocks, prefix_blocks

    offsets, ids = picker_blocks.picker_block_ids(prefix_blocks.groups(["g", "g"], [1, 1], [0, 0]), [2, 2], 1)
    first, second = ids[offsets[0]:offsets[1]].tolist(), ids[offsets[1]:offsets[2]].tolist()
    state = _index_after([64, 64, 64], [(0, first), (2, first)], replicas=3)
    assert prefix_index.match(state, request(second, 16).blocks, 2).tolist() == [1, 0, 1]


def test_llmd_plugin_test_TestPrefixPluginPrefixGrowth():
    """approximateprefix/plugin_test.go TestPrefixPluginPrefixGrowth: B = 2, tokens 1..6
    routed to pod1; tokens 1..12 then match its 3 blocks of 6 (the test asserts > 0 and
    TotalBlocks 6)."""
    from vtc_jax.inputs import picker_blocks, prefix_blocks

    offsets, ids = picker_blocks.picker_block_ids(prefix_blocks.groups(["p", "p"], [6, 6], [0, 0]), [6, 12], 2)
    state = _index_after([64], [(0, ids[offsets[0]:offsets[1]].tolist())])
    second = ids[offsets[1]:offsets[2]].tolist()
    assert len(second) == 6 and prefix_index.match(state, request(second, 16).blocks, 6).tolist() == [3]


# ---- Dynamo's KV router tests (ai-dynamo/dynamo, lib/kv-router/src/scheduling/selector/default.rs) --


def dynamo_pick(engine_blocks, key=KEY, ties="lowest", **fields):
    r = len(next(iter(fields.values())))
    shape = Shape(r)
    pick, _ = jitted("dynamo")
    return int(pick((), snapshot(r, **fields), request(engine_blocks=engine_blocks), key, make_params(shape, ties=ties))[0])


def test_dynamo_default_rs_test_effective_overlap_falls_back_when_tier_blocks_are_absent():
    """default.rs test_effective_overlap_falls_back_when_tier_blocks_are_absent: isl 64,
    block 16 (4 blocks); worker0 overlap 4, decode 1: cost 0 + 1; worker1: 4 + 0 -> worker0."""
    assert dynamo_pick(4, overlap=[4, 0], decode_blocks=[1, 0]) == 0


def test_dynamo_default_rs_test_no_shared_cache_unchanged():
    """default.rs test_no_shared_cache_unchanged: one worker, 64 tokens, overlap 2 -> worker0."""
    assert dynamo_pick(4, overlap=[2]) == 0


def test_dynamo_default_rs_test_overlap_credit_above_one_can_prefer_colocated_worker():
    """default.rs test_overlap_credit_above_one_can_prefer_colocated_worker, its credit-1.0
    half (credit 1.5 is a knob we fix at 1): 128 tokens / 16 = 8 blocks; warm: overlap 4,
    decode 5: 4 + 5 = 9; cold: 8 -> cold."""
    assert dynamo_pick(8, overlap=[4, 0], decode_blocks=[5, 0]) == 1


def test_dynamo_default_rs_test_overlap_credit_decay_no_decay_half():
    """default.rs test_overlap_credit_decay_can_prefer_less_loaded_cold_worker, its decay-0
    half (the default): 64 tokens (4 blocks); warm: overlap 4, 48 active prefill tokens (3
    blocks): max(0, 3 + 4 - 4) = 3; cold: 4 -> warm."""
    assert dynamo_pick(4, overlap=[4, 0], prefill_blocks=[3, 0]) == 0


def test_dynamo_default_rs_test_worker_logit_can_charge_active_requests_default():
    """default.rs test_worker_logit_can_charge_active_requests, the default weight (0): isl 0,
    decode 100, 4 active requests: cost 100 (a weight of 32 is a knob we do not take)."""
    from vtc_jax.pickers import dynamo

    cost = dynamo.costs(snapshot(1, decode_blocks=[100], in_flight=[4]), request(engine_blocks=0))
    assert cost.tolist() == [100]


def test_dynamo_default_rs_ties_random_and_seeded():
    """default.rs test_default_selector_randomizes_zero_temperature_ties (3 equal workers,
    120 picks: not always the same worker) and seeded_selector_is_stable_for_ties_... (the
    same seed gives the same sequence): with our seeded draw, the same key repeats its pick
    and 120 keys reach every tied worker."""
    picks = [dynamo_pick(1, key=jax.random.PRNGKey(i), ties="random", decode_blocks=[0, 0, 0]) for i in range(120)]
    again = [dynamo_pick(1, key=jax.random.PRNGKey(i), ties="random", decode_blocks=[0, 0, 0]) for i in range(120)]
    assert picks == again and set(picks) == {0, 1, 2}


# ---- BLIS (inference-sim/inference-sim@f90a1e3a) ------------------------------------------------


@pytest.mark.parametrize("waiting, want", [([10, 5, 0], [0.0, 0.5, 1.0]), ([5, 5], [1.0, 1.0]), ([42], [1.0]),
                                           ([0, 0], [1.0, 1.0])])
def test_blis_routing_scorers_test_TestScoreQueueDepth(waiting, want):
    """sim/routing_scorers_test.go TestScoreQueueDepth_MinMaxNormalization, _UniformLoad_AllScoreOne,
    _SingleInstance_ScoresOne, _AllZeroDepth_AllScoreOne (llm-d's queue scorer)."""
    r = len(waiting)
    assert np.asarray(llmd.terms(snapshot(r, waiting=waiting, **kv([0] * r)), jnp.zeros(r, jnp.int32), 0)[0]).tolist() == want


def test_blis_routing_scorers_test_TestScoreQueueDepth_IgnoresBatchSizeAndInFlight():
    """sim/routing_scorers_test.go TestScoreQueueDepth_IgnoresBatchSizeAndInFlight: (W 10, in
    flight 0) and (W 0, in flight 50): q = 0 and 1."""
    snap = snapshot(2, waiting=[10, 0], in_flight=[0, 50], **kv([0, 0]))
    assert np.asarray(llmd.terms(snap, jnp.zeros(2, jnp.int32), 0)[0]).tolist() == [0.0, 1.0]


def test_blis_routing_scorers_test_TestScoreKVUtilization_InverseUtilization():
    """sim/routing_scorers_test.go TestScoreKVUtilization_InverseUtilization: 0, 0.5, 1 -> 1, 0.5, 0."""
    assert np.asarray(llmd.terms(snapshot(3, **kv([0.0, 0.5, 1.0])), jnp.zeros(3, jnp.int32), 0)[1]).tolist() == [1.0, 0.5, 0.0]


@pytest.mark.parametrize("loads, want", [([12, 4, 7], 1), ([13, 10], 1), ([0, 0, 0], 0), ([175, 1], 1)])
def test_blis_routing_scorers_test_TestLoadBalanceOnly_EquivalentToLeastLoaded(loads, want):
    """sim/routing_scorers_test.go TestLoadBalanceOnly_EquivalentToLeastLoaded, its
    least-loaded side (nil rng: the lowest index on ties): BLIS's load QueueDepth + BatchSize
    + InFlightRequests is our in-flight count (requests routed and not finished)."""
    pick, _ = jitted("least-loaded")
    snap = snapshot(len(loads), in_flight=loads)
    assert int(pick((), snap, request(), KEY, lowest(Shape(len(loads))))[0]) == want


def test_blis_routing_test_TestRoundRobin_DeterministicOrdering():
    """sim/routing_test.go TestRoundRobin_DeterministicOrdering: 3 instances, 6 requests ->
    0, 1, 2, 0, 1, 2; and over the present replicas only (our mask): 0 and 2 alternate."""
    pick, _ = jitted("round-robin")
    shape = Shape(3)
    params = lowest(shape)
    for present, want in (([True] * 3, [0, 1, 2, 0, 1, 2]), ([True, False, True], [0, 2, 0, 2, 0, 2])):
        state, got = registry.get("round-robin").init(shape, params), []
        for _ in range(6):
            replica, state = pick(state, snapshot(3, present=present), request(), KEY, params)
            got.append(int(replica))
        assert got == want


def test_blis_routing_test_TestLeastLoaded_TieBreaking_Random_and_NilRNG_Positional():
    """sim/routing_test.go TestLeastLoaded_TieBreaking_Random (3 tied instances, 300 picks,
    each 50..150) and TestTieBreaking_NilRNG_Positional (no rng: always instance_0)."""
    pick, _ = jitted("least-loaded")
    shape, snap = Shape(3), snapshot(3, in_flight=[10, 10, 10])
    counts = np.bincount([int(pick((), snap, request(), jax.random.PRNGKey(i), make_params(shape))[0])
                          for i in range(300)], minlength=3)
    assert ((counts >= 50) & (counts <= 150)).all(), counts
    assert {int(pick((), snap, request(), jax.random.PRNGKey(i), lowest(shape))[0]) for i in range(10)} == {0}


# ---- ties, presence, params, reads -------------------------------------------------------------


def test_ties_are_uniform_over_keys_and_the_same_key_repeats():
    """4 replicas, 0 and 2 tied best (llm-d: equal W, KV, no match), 3 and 1 worse: over
    4,000 keys each tied replica gets 2,000 +- 150 (5 sigma), never another; a key repeats its
    pick; an integer seed is a key."""
    picker = registry.get("llm-d")
    shape = Shape(4, 8, 4, 8)
    params = make_params(shape)
    state = picker.init(shape, params)
    snap = snapshot(4, waiting=[1, 3, 1, 2], **kv([0.5, 0.5, 0.5, 0.5]))
    pick = jax.jit(jax.vmap(picker.pick, in_axes=(None, None, None, 0, None)))
    keys = jax.random.split(jax.random.PRNGKey(7), 4000)
    picks = np.asarray(pick(state, snap, request([1]), keys, params)[0])
    counts = np.bincount(picks, minlength=4)
    assert counts[1] == counts[3] == 0 and abs(int(counts[0]) - 2000) <= 150, counts
    assert np.array_equal(picks, np.asarray(pick(state, snap, request([1]), keys, params)[0]))
    seeded = pick(state, snap, request([1]), jnp.arange(30), params)[0].tolist()
    assert seeded == pick(state, snap, request([1]), jax.vmap(jax.random.PRNGKey)(jnp.arange(30)), params)[0].tolist()
    assert set(seeded) == {0, 2}


@pytest.mark.parametrize("name", registry.names())
def test_absent_replicas_are_never_picked(name):
    """A replica left out of `present` is never chosen, however good; none present: -1."""
    picker = registry.get(name)
    shape = Shape(3, 4, 4, 8)
    params = make_params(shape)
    # replica 1 is the best by every picker's measure, but absent
    snap = snapshot(3, waiting=[5, 0, 3], in_flight=[5, 0, 3], decode_blocks=[5, 0, 3], kv_used=[5, 0, 3],
                    kv_usable=[10, 10, 10], present=[True, False, True])
    state = picker.init(shape, params)
    pick, _ = jitted(name)
    for i in range(8):
        replica, state = pick(state, snap, request([1], 4), jax.random.PRNGKey(i), params)
        assert int(replica) in (0, 2)
    none = snap._replace(present=jnp.zeros(3, bool))
    replica, state = picker.pick(picker.init(shape, params), none, request([1], 4), KEY, params)
    assert int(replica) == -1
    after = picker.routed(state, replica, request([1], 4), params)  # routing nowhere changes nothing
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(state)))


def test_params_refuse_bad_values():
    shape = Shape(2, 4, 8, 8)
    with pytest.raises(InputError, match="picker ties 'first': one of random, lowest"):
        make_params(shape, ties="first")
    with pytest.raises(InputError, match=r"picker index capacity \[4, 9\]: each in \[0, 8\] blocks"):
        make_params(shape, capacity=[4, 9])
    with pytest.raises(InputError, match="three finite numbers"):
        make_params(shape, weights=(2, 2))
    assert make_params(shape, capacity=3).capacity.tolist() == [3, 3]
    assert make_params(shape).capacity.tolist() == [8, 8]


def test_registry():
    assert registry.names() == ("llm-d", "dynamo", "round-robin", "least-loaded")
    with pytest.raises(InputError, match="unknown picker 'vtc'; choose one of llm-d, dynamo, round-robin, least-loaded"):
        registry.get("vtc")
    with pytest.raises(InputError, match="already registered"):
        registry.register(dataclasses.replace(registry.get("dynamo"), name="llm-d"))
    for name in registry.names():
        picker = registry.get(name)
        assert picker.reads <= set(FIELDS) and picker.request_reads <= set(Request._fields)
        assert hasattr(ref, picker.reference)


# ---- every picker against its literal reference, on random lanes ---------------------------------

R, T_MAX, C, U = 4, 6, 5, 24
EVENTS, LANES = 24, 48


@functools.lru_cache(maxsize=None)
def lane_runner(name):
    """jit(vmap over lanes, the runner's axis name) of a lane's EVENTS picks, each routed."""
    picker = registry.get(name)
    shape = Shape(R, T_MAX, C, U)

    def lane(params, snaps, reqs, keys):
        def step(state, event):
            snap, req, key = event
            replica, state = picker.pick(state, snap, req, key, params)
            return picker.routed(state, replica, req, params), replica

        return jax.lax.scan(step, picker.init(shape, params), (snaps, reqs, keys))[::-1]

    return jax.jit(jax.vmap(lane, axis_name=LANE_AXIS))


def random_lanes(rng, dyadic):
    """LANES lanes of EVENTS events: snapshots (small numbers: many ties), requests whose
    blocks follow one of 3 chains for a while then go their own way, capacities 0..C."""
    shp = (LANES, EVENTS, R)
    present = rng.random(shp) < 0.75
    none = ~present.any(-1)
    present[none, 0] = True
    usable = np.broadcast_to(rng.choice([8] if dyadic else [4, 8, 10], (LANES, EVENTS, 1)), shp)
    snap = dict(waiting=rng.choice([0, 2, 4], shp) if dyadic else rng.integers(0, 4, shp),
                kv_used=rng.integers(0, usable + 1), kv_usable=usable, in_flight=rng.integers(0, 4, shp),
                prefill_blocks=rng.integers(0, 5, shp), decode_blocks=rng.integers(0, 5, shp),
                overlap=rng.integers(0, 5, shp), present=present)
    num = rng.choice([1, 2, 4], (LANES, EVENTS)) if dyadic else rng.integers(0, T_MAX + 1, (LANES, EVENTS))
    blocks = np.full((LANES, EVENTS, T_MAX), -1, np.int32)
    for lane in range(LANES):
        for e in range(EVENTS):
            t, family = int(num[lane, e]), int(rng.integers(0, 3))
            shared = int(rng.integers(0, t + 1))
            blocks[lane, e, :t] = [family * T_MAX + j for j in range(shared)] + rng.integers(18, U, t - shared).tolist()
    req = dict(blocks=blocks, num_blocks=num, prompt=rng.integers(0, 100, (LANES, EVENTS)),
               engine_blocks=rng.integers(0, 6, (LANES, EVENTS)))
    capacity = rng.integers(0, C + 1, (LANES, R))
    ties = rng.random(LANES) < 0.5
    keys = jax.random.split(jax.random.PRNGKey(int(rng.integers(0, 2**31))), LANES * EVENTS).reshape(LANES, EVENTS, 2)
    return snap, req, capacity, ties, keys


def run_jax(name, snap, req, capacity, ties, keys):
    params = make_params(Shape(R, T_MAX, C, U))
    params = params._replace(tie_random=jnp.asarray(ties), weights=jnp.broadcast_to(params.weights, (LANES, 3)),
                             capacity=jnp.asarray(capacity, jnp.int32))
    snaps = Snapshot(**{f: jnp.asarray(snap[f], bool if f == "present" else jnp.int32) for f in FIELDS})
    reqs = Request(**{f: jnp.asarray(req[f], jnp.int32) for f in Request._fields})
    replicas, state = lane_runner(name)(params, snaps, reqs, keys)
    return np.asarray(replicas), state


def run_reference(name, snap, req, capacity, ties, keys, dtype=np.float32):
    """Per lane the reference's picks (and the reference objects, for their final state)."""
    draws = np.asarray(jax.vmap(jax.vmap(lambda k: tie_draws(k, R)))(keys))
    picks, objs = np.zeros((LANES, EVENTS), np.int64), []
    for lane in range(LANES):
        obj = ref.reference(name, capacity[lane], dtype=dtype)
        for e in range(EVENTS):
            s = Snapshot(**{f: snap[f][lane, e] for f in FIELDS})
            r = Request(**{f: req[f][lane, e] for f in Request._fields})
            picks[lane, e] = obj.pick(s, r, draws[lane, e] if ties[lane] else None)
            obj.routed(picks[lane, e], r)
        objs.append(obj)
    return picks, objs


@pytest.mark.parametrize("name", registry.names())
def test_pickers_match_the_literal_reference_on_random_lanes(name):
    """Every pick of 2 x 48 lanes of 24 events (ties seeded or lowest), and llm-d's final
    index per replica (its LRU order), equal the reference's (llm-d: float32 scores in Go's
    order). On the lanes whose scores are exact dyadic fractions (span of W 2 or 4, usable
    8, T in 1, 2, 4) llm-d also equals the float64 reference (Go's precision). Changing the
    Snapshot and Request fields a picker does not declare in `reads` changes no pick."""
    rng = np.random.default_rng(sum(map(ord, name)))
    matched = tied = 0
    for dyadic in (False, True):
        snap, req, capacity, ties, keys = random_lanes(rng, dyadic)
        got, state = run_jax(name, snap, req, capacity, ties, keys)
        want, objs = run_reference(name, snap, req, capacity, ties, keys)
        assert np.array_equal(got, want), np.argwhere(got != want)[:5]
        if name == "llm-d":
            for lane, obj in enumerate(objs):
                lane_state = jax.tree.map(lambda x, i=lane: x[i], state)
                assert [prefix_index.contents(lane_state, r) for r in range(R)] == [list(s) for s in obj.index.sets]
            if dyadic:
                assert np.array_equal(got, run_reference(name, snap, req, capacity, ties, keys, np.float64)[0])
            matched += sum(any(len(s) for s in obj.index.sets) for obj in objs)
        # the fields the picker does not read, replaced, change nothing
        picker = registry.get(name)
        other = {f: (v if f in picker.reads or f == "present" else rng.integers(0, 9, v.shape)) for f, v in snap.items()}
        other_req = {f: (v if f in picker.request_reads else rng.integers(0, U, v.shape)) for f, v in req.items()}
        assert np.array_equal(run_jax(name, other, other_req, capacity, ties, keys)[0], got)
        tied += int((np.asarray(ties)[:, None] & (got != run_jax(name, snap, req, capacity, ~ties, keys)[0])).sum())
    if name != "round-robin":  # the cases are not vacuous: the seeded draw decides many picks
        assert tied > 50, tied
    if name == "llm-d":
        assert matched > 40


def _selecting_loops(jaxpr, size):
    """While loops (any depth) whose condition differs between lanes (a batched predicate:
    lowering then selects the whole carry after every pass) and that carry an array of at
    least `size` elements."""
    found = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while" and eqn.params["cond_jaxpr"].jaxpr.outvars[0].aval.ndim > 0:
            found += any(int(np.prod(v.aval.shape)) >= size for v in eqn.outvars)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _selecting_loops(sub, size)
    return found


def test_llmd_loops_select_no_table_under_the_runners_vmap():
    """Under the runner's vmap (axis LANE_AXIS) neither llm-d's pick nor its routed selects a
    whole table between passes of a loop (what would make an event's cost grow with the
    index: core/lanes.py); a plain vmap, whose loop bounds differ between lanes, does."""
    picker = registry.get("llm-d")
    shape = Shape(3, 8, 64, 256)
    lanes = 2
    params = jax.tree.map(lambda x: jnp.stack([x] * lanes), make_params(shape))
    state = jax.tree.map(lambda x: jnp.stack([x] * lanes), picker.init(shape, params))
    req = jax.tree.map(lambda x: jnp.stack([x] * lanes), request([1, 2, 3], 8))
    snap = jax.tree.map(lambda x: jnp.stack([x] * lanes), snapshot(3))
    replica, keys = jnp.zeros(lanes, jnp.int32), jax.random.split(KEY, lanes)
    table = 3 * 64  # the smallest table: key, prev, next are int32[R, C]

    def routed(axis_name):
        return jax.make_jaxpr(jax.vmap(picker.routed, axis_name=axis_name))(state, replica, req, params).jaxpr

    assert _selecting_loops(routed(LANE_AXIS), table) == 0
    assert _selecting_loops(routed(None), table) > 0
    # nor does XLA copy a table per block (a read of an array after a write to it, or
    # unordered with it, makes it copy the whole array: 60x slower at 67,660 slots)
    compiled = jax.jit(jax.vmap(picker.routed, axis_name=LANE_AXIS), donate_argnums=0).lower(state, replica, req, params)
    copies = [line for line in compiled.compile().as_text().splitlines()
              if " copy(" in line and ("s32[2,3,64]" in line or "s32[2,3,256]" in line)]
    assert not copies, copies
    pick = jax.make_jaxpr(jax.vmap(picker.pick, axis_name=LANE_AXIS))(state, snap, req, keys, params).jaxpr
    assert _selecting_loops(pick, table) == 0


def test_llmd_literal_indexer_differs_only_past_capacity():
    """llm-d's indexer.go as written updates hashToPods after the LRU adds, so a request with
    more blocks than the capacity leaves its evicted first blocks matchable (a ghost): the
    section 7 case gives m = (3, 1) there, (2, 1) under the LRU-set rule we keep (the
    contract's). With at most capacity blocks per request the two agree on every match of
    300 random sequences; past it they differ on some."""
    literal = ref.LlmdLiteralIndex([2, 2])
    literal.add(0, [5, 6, 7])
    literal.add(1, [5])
    assert literal.match([5, 6, 7]) == [3, 1]
    rng = np.random.default_rng(3)
    differ = {False: 0, True: 0}
    for past in (False, True):
        for _ in range(300):
            capacity = rng.integers(2, 5, 3)
            ours, theirs = ref.PrefixIndexReference(capacity), ref.LlmdLiteralIndex(capacity)
            for _ in range(20):
                top = int(capacity.min()) + (3 if past else 0)
                blocks = rng.integers(0, 8, int(rng.integers(0, top + 1))).tolist()
                differ[past] += ours.match(blocks) != theirs.match(blocks)
                replica = int(rng.integers(0, 3))
                ours.add(replica, blocks)
                theirs.add(replica, blocks)
    assert differ[False] == 0 and differ[True] > 20, differ


def test_prefix_index_long_random_runs_against_the_ordered_dict():
    """The index alone over 8 lanes of 300 routes (capacities 1..20 of 40 ids, requests of
    up to 12 blocks from 4 chains then their own): each route's match before it and every
    replica's final LRU order equal the OrderedDict reference's."""
    rng = np.random.default_rng(21)
    lanes, routes, r, t_max, c, u = 8, 300, 3, 12, 20, 40
    num = rng.integers(0, t_max + 1, (lanes, routes))
    blocks = np.full((lanes, routes, t_max), -1, np.int32)
    for lane in range(lanes):
        for e in range(routes):
            n, chain = int(num[lane, e]), int(rng.integers(0, 4))
            shared = int(rng.integers(0, n + 1))
            blocks[lane, e, :n] = [(chain * 7 + j) % 28 for j in range(shared)] + rng.integers(28, u, n - shared).tolist()
    replicas = rng.integers(0, r, (lanes, routes))
    capacity = rng.integers(1, c + 1, (lanes, r))

    def lane(cap, blk, n, rep):
        def step(ix, event):
            b, k, q = event
            m = prefix_index.match(ix, b, k)
            return prefix_index.add(ix, q, b, k, cap[q]), m

        return jax.lax.scan(step, prefix_index.empty(r, c, u), (blk, n, rep))

    run = jax.jit(jax.vmap(lane, axis_name=LANE_AXIS))
    index, matches = run(jnp.asarray(capacity, jnp.int32), jnp.asarray(blocks), jnp.asarray(num, jnp.int32),
                         jnp.asarray(replicas, jnp.int32))
    matches = np.asarray(matches)
    evicted = 0
    for lane in range(lanes):
        want = ref.PrefixIndexReference(capacity[lane])
        for e in range(routes):
            row = blocks[lane, e, :num[lane, e]].tolist()
            assert matches[lane, e].tolist() == want.match(row), (lane, e)
            target = want.sets[int(replicas[lane, e])]
            before, fresh = len(target), len(set(row) - set(target))
            want.add(int(replicas[lane, e]), row)
            evicted += before + fresh - len(target)
        lane_index = jax.tree.map(lambda x, i=lane: x[i], index)
        assert [prefix_index.contents(lane_index, q) for q in range(r)] == [list(s) for s in want.sets]
    assert evicted > 500 and (matches > 0).sum() > 1000  # full sets and long matches, not a vacuous run
