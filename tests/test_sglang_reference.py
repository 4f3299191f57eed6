"""The literal SGLang reference (vtc_jax/testing/sglang_reference.py): every golden schedule
of SGLang 0.5.23's own scheduler (tests/data/sglang_golden/) replayed step for step, and
small hand-worked cases of the rules the JAX server must keep."""

import glob
import json
import os

import pytest

from vtc_jax.testing.sglang_goldens import compare, load_golden, read_trace_csv, trace_from_json
from vtc_jax.testing.sglang_reference import ORDERS, RadixTree, SglangConfig, SglangRequest, simulate

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "data", "sglang_golden")
GOLDENS = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(GOLDEN_DIR, "*.json")))


def R(arrival, prompt, output, prefix_id=None, prefix_len=0):
    return SglangRequest(arrival=arrival, client="c", prompt=prompt, output=output, prefix_id=prefix_id,
                         prefix_len=prefix_len)


def steps_by_iteration(run):
    return {s["step"]: s for s in run.steps}


def first_prefill(run, row):
    return next(s["step"] for s in run.steps if any(e[0] == row and e[2] == "prefill" for e in s["scheduled"]))


# ----------------------------------------------------------------------------------------
# The goldens.


def test_all_shared_goldens_are_here():
    assert len(GOLDENS) == 21
    assert {g for g in GOLDENS if g.startswith("g")} == {"g1_fcfs_roomy", "g2_fcfs_retract",
                                                          "g3_lpm_shared_prefix_chunked"}
    for g in GOLDENS:
        if g.startswith("s"):
            assert os.path.exists(os.path.join(GOLDEN_DIR, g + ".csv"))


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_replays_step_for_step(name):
    requests, cfg, golden = load_golden(os.path.join(GOLDEN_DIR, name + ".json"))
    run = simulate(requests, cfg)
    # Every field of every listed iteration: scheduled (row, tokens, kind, prefix_len), kind,
    # retracted, finished, new_token_ratio (6 digits), kv_free, kv_evictable.
    assert compare(golden, run) is None
    assert not run.stalled and not run.aborted
    doc = json.load(open(os.path.join(GOLDEN_DIR, name + ".json")))
    assert doc["num_finished"] == doc["num_requests"] == len(requests)
    for row, r in enumerate(run.requests):
        assert r["finish_step"] == max(s["step"] for s in golden if row in s["finished"])
        assert r["first_token_step"] is not None and r["first_token_step"] <= r["finish_step"]


@pytest.mark.parametrize("name", [g for g in GOLDENS if g.startswith("s")])
def test_csv_trace_matches_json_trace(name):
    csv_reqs = read_trace_csv(os.path.join(GOLDEN_DIR, name + ".csv"))
    doc = json.load(open(os.path.join(GOLDEN_DIR, name + ".json")))
    json_reqs = trace_from_json(doc)
    assert [(r.arrival, r.prompt, r.output) for r in csv_reqs] == [(r.arrival, r.prompt, r.output) for r in json_reqs]


def test_hand_read_goldens_use_their_inline_tokens():
    requests, _, _ = load_golden(os.path.join(GOLDEN_DIR, "g3_lpm_shared_prefix_chunked.json"))
    assert all(r.tokens is not None for r in requests)
    assert len({r.tokens[:40] for r in requests}) == 1  # g3's 40-token shared prefix


def test_compare_names_the_first_difference():
    requests, cfg, golden = load_golden(os.path.join(GOLDEN_DIR, "g1_fcfs_roomy.json"))
    run = simulate(requests, cfg)
    run.steps[3] = dict(run.steps[3], kv_free=run.steps[3]["kv_free"] + 1)
    assert compare(golden, run) == (3, "kv_free", golden[3]["kv_free"], golden[3]["kv_free"] + 1)
    assert compare(golden, simulate(requests, cfg).steps[:-1])[1] == "length"


def test_same_iteration_arrivals_join_in_rid_order():
    """The harness queues same-iteration arrivals sorted by rid as a string (r10 before r2);
    s1003 is one golden where file order would differ."""
    reqs = [R(0, 8, 3) for _ in range(11)]
    cfg = SglangConfig(kv_tokens=2048, max_running_requests=1, chunked_prefill_size=64)
    run = simulate(reqs, cfg)
    prefills = [s["scheduled"][0][0] for s in run.steps if s["kind"] == "prefill"]
    assert prefills == [0, 1, 10, 2, 3, 4, 5, 6, 7, 8, 9]


# ----------------------------------------------------------------------------------------
# Hand-worked cases.


def test_strict_total_below_remaining_total():
    """add_one_req admits only if extend + max_new + page < remaining_total (strict): on an
    empty pool of 31 slots a 10-token prompt with 20 outputs (total 31) never starts."""
    assert simulate([R(0, 10, 20)], SglangConfig(31, 4, 64, max_steps=50)).stalled
    run = simulate([R(0, 10, 20)], SglangConfig(32, 4, 64))
    assert run.steps[0]["scheduled"] == [(0, 10, "prefill", 0)] and not run.stalled


def test_batch_is_full_is_sticky_after_no_token():
    """With conservativeness 1.5 the ratio starts at 1.0 and decays, so the running request's
    reservation (1000 - out) * ratio shrinks faster than its decode uses memory. B (total
    101) is refused at iteration 1 (remaining 1100 - 10 - 999 = 91): NO_TOKEN sets
    batch_is_full, and no prefill is tried again until A leaves the batch (it finishes at
    999), although the budget admits B from iteration 9 on, as a fresh arrival shows."""
    cfg = SglangConfig(1100, 4, 256, schedule_conservativeness=1.5)
    run = simulate([R(0, 10, 1000), R(1, 50, 50)], cfg)
    assert run.requests[0]["finish_step"] == 999
    assert first_prefill(run, 1) == 1000
    assert [s["step"] for s in run.steps if s["kind"] == "prefill"] == [0, 1000]
    late = simulate([R(0, 10, 1000), R(9, 50, 50)], cfg)
    assert first_prefill(late, 1) == 9
    too_early = simulate([R(0, 10, 1000), R(8, 50, 50)], cfg)
    assert first_prefill(too_early, 1) == 1000  # refused at 8 (growth 992*7*decay < 10): sticky again


def test_retraction_victim_order_requeue_and_ratio():
    """Three decoding: A (prompt 14, 47 out) since 0, B (4, 39) and C (6, 33) since 2. When
    the pool runs dry at 34 the victim is the fewest-outputs request, ties to the longest
    prompt: C (6 > 4). C keeps its outputs, frees its decode KV without inserting it (its
    prompt stays cached, evictable), goes to the tail of the queue, and the ratio becomes
    min(1, (sum out + 20 n) / (sum max_new + 1)) over A and B."""
    reqs = [R(0, 14, 47), R(2, 4, 39), R(2, 6, 33)]
    run = simulate(reqs, SglangConfig(120, 4, 64, schedule_conservativeness=0.3))
    by = steps_by_iteration(run)
    assert by[2]["scheduled"] == [(1, 4, "prefill", 0), (2, 6, "prefill", 0)]
    s = by[34]
    assert s["retracted"] == [2] and [e[0] for e in s["scheduled"]] == [0, 1]
    out_a, out_b = 34, 32  # A sampled at 0..33, B at 2..33
    assert s["new_token_ratio"] == min(1.0, (out_a + out_b + 20 * 2) / (47 + 39 + 1))
    assert run.requests[2]["retractions"] == 1
    # It comes back later with prompt + outputs to recompute; its cached prompt is matched
    # unless evicted (extend + prefix_len == prompt + outputs kept).
    back = next(e for st in run.steps if st["step"] > 34 for e in st["scheduled"] if e[0] == 2)
    assert back[2] == "prefill" and back[1] + back[3] == 6 + 32


def test_retracted_request_goes_to_the_tail():
    """As above with D (5, 30) arriving at 20, held back by the full pool: C, retracted at 34,
    queues behind D, so D is prefilled first (41) and C recomputes its 6 + 32 tokens after."""
    reqs = [R(0, 14, 47), R(2, 4, 39), R(2, 6, 33), R(20, 5, 30)]
    run = simulate(reqs, SglangConfig(120, 4, 64, schedule_conservativeness=0.3))
    assert steps_by_iteration(run)[34]["retracted"] == [2]
    prefills = [(s["step"], e[0], e[1]) for s in run.steps if s["kind"] == "prefill" for e in s["scheduled"]]
    assert prefills[-2:] == [(41, 3, 5), (49, 2, 38)]


def test_retraction_ratio_below_one_and_batch_left_in_sorted_order():
    """g2 (the hand-read retraction golden): at 32 r2 is retracted from 7 decoding and the
    ratio is re-estimated to 0.895522; the batch is kept in retract_decode's sorted order."""
    requests, cfg, golden = load_golden(os.path.join(GOLDEN_DIR, "g2_fcfs_retract.json"))
    run = simulate(requests, cfg)
    s = steps_by_iteration(run)[32]
    assert s["retracted"] == [2] and round(s["new_token_ratio"], 6) == 0.895522
    before = [e[0] for e in steps_by_iteration(run)[31]["scheduled"]]
    # outputs: the first token at the prefill, then one per decode step (prefill steps stall decodes)
    out = {r: 1 + sum((r, 1, "decode", None) in st["scheduled"] for st in run.steps if st["step"] < 32) for r in before}
    kept = sorted(before, key=lambda r: (out[r], -requests[r].prompt), reverse=True)
    assert kept[-1] == 2 and [e[0] for e in s["scheduled"]] == kept[:-1] != [r for r in before if r != 2]


def test_lpm_deprioritizes_in_batch_shared_prefixes():
    """Nothing cached: rows 0-2 share a 40-token prefix, row 3 does not. lpm's in-batch check
    (cache match <= 32) inserts row 0 into its scratch tree and finds rows 1 and 2 matching
    40 >= 32 tokens there: they go last. With two request rows the first prefill is rows 0
    and 3 under lpm, rows 0 and 1 under fcfs."""
    reqs = [R(0, 50, 5, "p", 40), R(0, 50, 5, "p", 40), R(0, 50, 5, "p", 40), R(0, 20, 5)]
    lpm = simulate(reqs, SglangConfig(4096, 2, 4096, policy="lpm"))
    fcfs = simulate(reqs, SglangConfig(4096, 2, 4096, policy="fcfs"))
    assert lpm.steps[0]["scheduled"] == [(0, 50, "prefill", 0), (3, 20, "prefill", 0)]
    assert fcfs.steps[0]["scheduled"] == [(0, 50, "prefill", 0), (1, 50, "prefill", 0)]
    # Next prefill: rows 1 and 2 hit row 0's cached prefix (40 tokens free of charge).
    nxt = next(s for s in lpm.steps[1:] if s["kind"] == "prefill")
    assert [(e[0], e[3]) for e in nxt["scheduled"]] == [(1, 40), (2, 40)]


def test_lpm_falls_back_to_fcfs_past_128_waiting():
    """With more than 128 waiting the lpm pass is fcfs (no matching, no dedupe)."""
    reqs = [R(0, 50, 2, "p", 40) for _ in range(129)] + [R(0, 20, 2)]
    run = simulate(reqs, SglangConfig(65536, 2, 8192, policy="lpm", max_steps=3))
    assert [e[0] for e in run.steps[0]["scheduled"]] == [0, 1]  # fcfs: r0, r1 (then r10, r100, ...)
    few = simulate(reqs[-4:], SglangConfig(65536, 2, 8192, policy="lpm", max_steps=3))
    assert [e[0] for e in few.steps[0]["scheduled"]] == [0, 3]  # lpm proper: 1 and 2 deprioritized


def test_chunked_request_is_continued_first():
    """Chunk 32: A (80 tokens) runs 32 at 0 and is the chunked request. At 1 it continues
    first and spends the whole chunk budget (OTHER: B waits); at 2 its last 16 tokens go
    first and B fills the rest of the chunk."""
    run = simulate([R(0, 80, 3), R(1, 10, 3)], SglangConfig(1024, 4, 32))
    by = steps_by_iteration(run)
    assert by[0]["scheduled"] == [(0, 32, "prefill", 0)]
    assert by[1]["scheduled"] == [(0, 32, "prefill", 32)]
    assert by[2]["scheduled"] == [(0, 16, "prefill", 64), (1, 10, "prefill", 0)]
    assert run.requests[0]["first_token_step"] == 2  # middle chunks sample nothing


def test_idle_reset_of_the_ratio():
    """Decode steps decay the ratio; a fully idle iteration resets it to init."""
    cfg = SglangConfig(1024, 4, 64)
    run = simulate([R(0, 10, 5), R(20, 10, 5)], cfg)
    by = steps_by_iteration(run)
    init, low, decay = cfg.ratio_constants()
    assert (init, low) == (0.7, 0.7 * 0.14) and decay == (0.7 - 0.098) / 600
    assert by[4]["new_token_ratio"] == init - decay - decay - decay - decay  # decodes at 1..4
    assert by[20]["new_token_ratio"] == init


def test_radix_tree_lru_eviction_and_locks():
    tree = RadixTree()
    tree.insert((1, 2, 3))
    tree.insert((1, 2, 4, 5))  # splits (1, 2) off
    tree.insert((7, 8))
    assert tree.evictable_size == 7 and tree.total_size() == 7
    n, node = tree.match((1, 2, 4, 5, 6))
    assert n == 4
    tree.inc_lock_ref(node)
    assert (tree.evictable_size, tree.protected_size) == (3, 4)
    assert tree.evict(1) == 1  # least recent unlocked leaf: (3,)
    assert tree.evict(10) == 2  # then (7, 8); the locked path stays
    tree.dec_lock_ref(node)
    assert tree.evictable_size == 4 and tree.evict(4) == 4 and tree.total_size() == 0


@pytest.mark.parametrize("bad, word", [
    (dict(disable_overlap_schedule=False), "overlap"),
    (dict(enable_mixed_chunk=True), "enable_mixed_chunk"),
    (dict(enable_priority_scheduling=True), "enable_priority_scheduling"),
    (dict(policy="lof"), "lof"),
    (dict(policy="priority"), "priority"),
    (dict(policy="nope"), "nope"),
    (dict(retraction_policy="priority"), "retraction_policy"),
    (dict(page_size=16), "page_size"),
    (dict(disable_radix_cache=True), "disable_radix_cache"),
    (dict(kv_tokens=0), "kv_tokens"),
    (dict(max_running_requests=-1), "max_running_requests"),
    (dict(schedule_conservativeness=0), "schedule_conservativeness"),
])
def test_bad_config_raises(bad, word):
    base = dict(kv_tokens=100, max_running_requests=2, chunked_prefill_size=16)
    with pytest.raises(ValueError, match=word):
        SglangConfig(**(base | bad))


def test_unknown_config_key_and_bad_requests():
    with pytest.raises(ValueError, match="speculative"):
        SglangConfig.from_dict(dict(kv_tokens=100, max_running_requests=2, chunked_prefill_size=16, speculative=1))
    with pytest.raises(ValueError, match="prefix_len"):
        simulate([R(0, 10, 2, "p", 11)], SglangConfig(100, 2, 16))
    with pytest.raises(ValueError, match="output"):
        simulate([R(0, 10, 0)], SglangConfig(100, 2, 16))


def test_a_waiting_order_is_a_pluggable_function():
    """The seam for a fairness policy: a function (queue, scheduler) -> (order, cache_aware)."""
    reqs = [R(0, 10, 3), R(0, 10, 3), R(0, 10, 3)]
    newest_first = lambda queue, sim: (sorted(queue, key=lambda r: -r.row), False)
    run = simulate(reqs, SglangConfig(1024, 1, 64), order=newest_first)
    assert [s["scheduled"][0][0] for s in run.steps if s["kind"] == "prefill"] == [2, 1, 0]
    assert set(ORDERS) == {"fcfs", "lpm"}
