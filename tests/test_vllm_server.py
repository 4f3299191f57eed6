"""The `vllm` server component in the engine (servers/vllm_v1.py; with prefix caching
`vllm_prefix`, servers/vllm_prefix.py), step for step against
the real vLLM 0.33 scheduler's goldens and the literal reference
(vtc_jax/testing/vllm_reference.py), under both of vLLM's scheduling policies.

A lane replays one trace through `run_traces(server="vllm")` with policy fcfs; under
vLLM's priority policy each (client, priority) pair is its own engine client
(`priority_queues`) and its band is its priority, so the engine's strict bands with FCFS
inside are vLLM's (priority, arrival) heap. Every lane of a test runs in one batch (one
compile)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from vtc_jax import InputError, MeasureConfig, Settings, Trace, run_traces
from vtc_jax.core.rows import ORDER
from vtc_jax.inputs.workload import layout_trace
from vtc_jax.inputs import prefix_blocks
from vtc_jax.servers import vllm_prefix, vllm_v1
from vtc_jax.testing.vllm_goldens import load_golden
from vtc_jax.testing.vllm_reference import TraceRequest, simulate

DATA = os.path.join(os.path.dirname(__file__), "data")
GOLDEN_DIRS = ("vllm_golden", "vllm_golden_more")
# The goldens' / reference's config keys as the server's settings (vLLM's flag names).
OPTION_NAMES = {"num_blocks": "num_gpu_blocks", "block_size": "block_size",
                "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
                "chunked_prefill": "enable_chunked_prefill", "long_prefill_threshold": "long_prefill_token_threshold",
                "policy": "scheduling_policy"}
# The reference's victim rules as the server's: `policy` is the order's own victim, the
# largest (priority, arrival) (all bands 0 under fcfs: the latest arrival); the server's
# own names pass through (`counter` has no reference).
VICTIM_NAMES = {"newest": "newest", "policy": "priority", "priority": "priority", "counter": "counter"}


def server_options(config: dict) -> dict:
    """A reference config dict as the vllm server's settings."""
    options = {OPTION_NAMES[k]: v for k, v in config.items() if k in OPTION_NAMES}
    if "victim" in config:
        options["victim"] = VICTIM_NAMES[config["victim"]]
    return options


def lane_input(requests: list[TraceRequest], config: dict) -> tuple[Trace, list[int] | None]:
    """(the engine trace, the bands per engine client or None): each (client, priority)
    pair one engine client under priority, each client one under fcfs."""
    tenant = [r.client for r in requests]
    by_priority = config.get("policy", "fcfs") == "priority"
    priority = [r.priority if by_priority else 0 for r in requests]
    queue, bands, _ = vllm_v1.priority_queues(np.asarray(tenant), np.asarray(priority))
    trace = Trace.from_rows([(r.arrival, int(q), r.prompt, r.output) for r, q in zip(requests, queue)])
    return trace, bands if by_priority else None


def lane_options(requests: list[TraceRequest], config: dict, rows: int) -> dict:
    """The server's settings of a lane: with prefix caching, the trace's content as prefix
    groups (vllm_prefix.prefix_options; the reference's prefix_id names a group, a
    prefix_len without one is its client's). `rows` is unused (the run pads the tables)."""
    options = server_options(config)
    if config.get("prefix_caching"):
        ident = prefix_blocks.groups([r.prefix_id for r in requests], [r.prefix_len for r in requests],
                                     np.zeros(len(requests), np.int64))
        options.update(vllm_prefix.prefix_options([r.arrival for r in requests], [r.prompt for r in requests],
                                                  [r.output for r in requests], ident))
    return options


def engine_schedules(lanes: list[tuple[list[TraceRequest], dict]], log_steps: int, policy="fcfs",
                     charge_sent: bool = False) -> list[dict]:
    """Every lane (requests, reference config) through the engine in one batch (server
    vllm, or vllm_prefix when the lanes cache prefixes), in the reference's layout:
    {"steps": [{"step", "sched" {row: tokens} in scheduling order, "preempted",
    "finished"}], "requests": {row: {"first_token_step", "finish_step", "preemptions"}}}
    with rows the trace rows (as strings where they are keys). `policy`: the engine's, one
    for every lane or a list of one per lane (vLLM's own orders are fcfs with bands);
    `charge_sent`: a fairness policy charges every sent prompt token (--charge-prefill sent),
    not the computed ones (the prompt less its prefix hit)."""
    policies = [policy] * len(lanes) if isinstance(policy, str) else list(policy)
    caching = {bool(config.get("prefix_caching")) for _, config in lanes}
    assert len(caching) == 1, "one batch, one server"
    server = "vllm_prefix" if caching.pop() else "vllm"
    inputs = [lane_input(reqs, config) for reqs, config in lanes]
    k = max(t.num_clients for t, _ in inputs)
    rows = max(len(reqs) for reqs, _ in lanes)
    settings = [Settings(policy=name, kv_budget=1 << 29, charge_cached=charge_sent,
                         bands=None if b is None else tuple(b + [0] * (k - len(b))),
                         server_options=tuple(lane_options(reqs, config, rows).items()))
                for (_, b), (reqs, config), name in zip(inputs, lanes, policies)]
    res = run_traces([t for t, _ in inputs], settings, num_clients=k, server=server, log_steps=log_steps,
                     measures=MeasureConfig())
    assert res.finished.all()
    log, out = res.server_state.log, res.server_state.out
    count, t, index, tokens, finished, preempted = (np.asarray(a) for a in (log.count, log.t, log.index, log.tokens,
                                                                            log.finished, log.preempted))
    first_token, finish, preemptions = (np.asarray(a) for a in (out.first_token, out.finish, out.preemptions))
    results = []
    for lane, (trace, _) in enumerate(inputs):
        fcfs = np.lexsort((np.arange(len(trace)), trace.arrival))  # ORDER -> trace row
        order = layout_trace(trace, k, 5)[:, ORDER]  # per workload row (5: arrival_width + 1); padding: past the end
        source = np.where(order < len(trace), fcfs[np.minimum(order, len(trace) - 1)], -1)  # workload row -> trace row
        steps = []
        for j in range(min(int(count[lane]), index.shape[1])):
            live = index[lane, j] >= 0
            rows, toks = source[index[lane, j][live]], tokens[lane, j][live]
            steps.append({"step": int(t[lane, j]),
                          "sched": {str(r): int(n) for r, n in zip(rows, toks) if n > 0},
                          "preempted": sorted(int(r) for r in source[preempted[lane, j][preempted[lane, j] >= 0]]),
                          "finished": sorted(int(r) for r in rows[finished[lane, j][live]])})
        per_row = {}
        for w in np.flatnonzero(source >= 0):
            if first_token[lane, w] >= 0:
                per_row[int(source[w])] = {"first_token_step": int(first_token[lane, w]),
                                           "finish_step": int(finish[lane, w]),
                                           "preemptions": int(preemptions[lane, w])}
        results.append({"steps": steps, "requests": {str(r): per_row[r] for r in sorted(per_row)}})
    return results


def assert_same(mine: dict, real: dict, where: str) -> None:
    """Step for step: the clock, who got how many tokens (in vLLM's order), who was
    preempted, who finished; then every request's first token, finish and preemptions."""
    assert len(mine["steps"]) == len(real["steps"]), f"{where}: {len(mine['steps'])} steps, want {len(real['steps'])}"
    for a, b in zip(mine["steps"], real["steps"]):
        want = {key: b[key] for key in ("step", "sched", "preempted", "finished")}
        assert a == want, f"{where}: first differing step {b['step']}"
        assert list(a["sched"]) == list(b["sched"]), f"{where}: step {b['step']} order"
    assert mine["requests"] == real["requests"], where


# ----------------------------------------------------------------------------------------
# The real scheduler's goldens.


def _goldens() -> list[tuple[str, str]]:
    """(directory, name) of every golden the servers model: fcfs or priority, vLLM's own
    victim and re-queue rules, with prefix caching (server vllm_prefix) or without (vllm)."""
    out = []
    for d in GOLDEN_DIRS:
        for f in sorted(os.listdir(os.path.join(DATA, d))):
            if f.endswith(".config.json"):
                _, config, _ = load_golden(os.path.join(DATA, d), f[: -len(".config.json")])
                if "victim" not in config and "preempted_to" not in config:
                    out.append((d, f[: -len(".config.json")]))
    return out


GOLDENS = _goldens()


def _golden_batches(names: list[str], batches: list[list[str]]) -> dict:
    """The engine schedules of these goldens, batch by batch (a lane's log is sized to its
    batch's longest schedule): {name: (golden, ours)}."""
    loaded = {name: load_golden(os.path.join(DATA, d), name) for d, name in GOLDENS if name in names}
    out = {}
    for batch in batches:
        got = engine_schedules([loaded[n][:2] for n in batch], max(len(loaded[n][2]["steps"]) for n in batch) + 5)
        out.update({n: (loaded[n][2], mine) for n, mine in zip(batch, got)})
    return out


def _caching(name: str) -> bool:
    return bool(dict(GOLDEN_CONFIGS)[name].get("prefix_caching"))


GOLDEN_CONFIGS = [(n, load_golden(os.path.join(DATA, d), n)[1]) for d, n in GOLDENS]


@pytest.fixture(scope="module")
def golden_runs() -> dict:
    """The goldens without prefix caching, in 4 batches of similar length."""
    steps = {n: len(load_golden(os.path.join(DATA, d), n)[2]["steps"]) for d, n in GOLDENS}
    names = sorted((n for n in steps if not _caching(n)), key=steps.get)
    return _golden_batches(names, [list(b) for b in np.array_split(np.asarray(names), 4)])


@pytest.fixture(scope="module")
def prefix_golden_runs() -> dict:
    """The goldens with prefix caching (server vllm_prefix), in 2 batches by pool size
    (the pool's static size is a batch's largest)."""
    names = [n for _, n in GOLDENS if _caching(n)]
    blocks = {n: dict(GOLDEN_CONFIGS)[n]["num_blocks"] for n in names}
    batches = [[n for n in names if lo < blocks[n] <= hi] for lo, hi in ((0, 100), (100, 1 << 30))]
    return _golden_batches(names, [b for b in batches if b])


def test_the_goldens_cover_both_policies():
    configs = [c for _, c in GOLDEN_CONFIGS]
    policies = [c.get("policy", "fcfs") for c in configs]
    assert len(GOLDENS) == 69 and policies.count("fcfs") >= 30 and policies.count("priority") >= 15
    assert sum(bool(c.get("prefix_caching")) for c in configs) == 17


@pytest.mark.parametrize("name", [n for _, n in GOLDENS])
def test_golden_step_for_step(request, name):
    real, mine = request.getfixturevalue("prefix_golden_runs" if _caching(name) else "golden_runs")[name]
    assert_same(mine, real, name)


# ----------------------------------------------------------------------------------------
# Random small lanes against the literal reference.


def random_lane(rng: np.random.Generator, policy: str, blocks=(2, 4, 8), **options) -> tuple[list[TraceRequest], dict]:
    """A small random trace and server: 1-3 clients, 2-14 requests in bursts, prompts
    1-40, outputs 1-12, priorities 0-2 per request (varying within a client); block size
    one of `blocks`, a pool from tight (the largest peak plus 0-2 blocks) to ample, 1-5
    seats, budgets, chunking and L at random within vLLM's constraints."""
    count = int(rng.integers(2, 15))
    client = rng.integers(0, int(rng.integers(1, 4)), count)
    bursts = np.sort(rng.integers(0, 30, int(rng.integers(1, 4))))
    arrival = rng.choice(bursts, count) + rng.integers(0, 3, count) * (rng.random(count) < 0.5)
    prompt, output, priority = rng.integers(1, 41, count), rng.integers(1, 13, count), rng.integers(0, 3, count)
    requests = [TraceRequest(arrival=int(arrival[r]), client=f"c{client[r]}", prompt=int(prompt[r]),
                             output=int(output[r]), priority=int(priority[r])) for r in range(count)]
    block = int(rng.choice(list(blocks)))
    peaks = [-(-(r.prompt + r.output - 1) // block) for r in requests]
    usable = max(peaks) + int(rng.integers(0, 3)) if rng.random() < 0.6 else int(rng.integers(max(peaks), sum(peaks) + 1))
    seats = int(rng.integers(1, 6))
    chunked = bool(rng.random() < 0.75)
    low = seats if chunked else -(-max(r.prompt + r.output for r in requests) // block) * block
    config = {"block_size": block, "num_blocks": usable + 1, "max_num_batched_tokens": int(rng.integers(low, low + 60)),
              "max_num_seqs": seats, "chunked_prefill": chunked, "policy": policy,
              "long_prefill_threshold": int(rng.choice([0, 0, 2, 8])), **options}
    return requests, config


def _victim_matters(lane: tuple[list[TraceRequest], dict]) -> bool:
    """The priority victim changes the lane's schedule (against the newest victim)."""
    requests, config = lane
    return simulate(requests, config)["steps"] != simulate(requests, dict(config, victim="newest"))["steps"]


def test_random_lanes_match_the_reference():
    """fcfs and priority lanes with vLLM's own rules (105 each), and 60 priority lanes in
    which the priority victim is not always the newest admitted (in the goldens it always
    is, docs/VLLM.md), so the walk preempts from inside the running list; one batch."""
    rng = np.random.default_rng(2024)
    lanes = [random_lane(rng, policy) for policy in ("fcfs", "priority") for _ in range(105)]
    informative = []
    while len(informative) < 60:
        lane = random_lane(rng, "priority")
        if _victim_matters(lane):
            informative.append(lane)
    lanes += informative
    want = [simulate(reqs, config) for reqs, config in lanes]
    got = engine_schedules(lanes, max(w["num_steps"] for w in want) + 1)
    for k, (mine, real) in enumerate(zip(got, want)):
        assert_same(mine, real, f"lane {k} ({lanes[k][1]})")


def test_block_sizes_not_powers_of_two_match_the_reference():
    """Block counts are shifts when every lane's block size is a power of two (as vLLM's
    are, and every lane above); a batch with other sizes divides (servers/block_math.py):
    80 lanes of block sizes 3, 5, 6 and 4 in one batch, against the reference."""
    rng = np.random.default_rng(77)
    lanes = [random_lane(rng, policy, blocks=(3, 5, 6, 4)) for policy in ("fcfs", "priority") for _ in range(40)]
    assert not all(vllm_v1.block_math.block_shift(config["block_size"]) >= 0 for _, config in lanes)
    want = [simulate(reqs, config) for reqs, config in lanes]
    got = engine_schedules(lanes, max(w["num_steps"] for w in want) + 1)
    for k, (mine, real) in enumerate(zip(got, want)):
        assert_same(mine, real, f"lane {k} ({lanes[k][1]})")


def test_block_counts_shift_exactly_for_powers_of_two():
    """blocks_for: the shift equals ceil(tokens / size) for every power-of-two size, the
    division for any size; block_shift is -1 off the powers; the static flag follows."""
    bm = vllm_v1.block_math
    tokens = np.concatenate([np.arange(0, 300), np.array([2**29 - 1, 2**30, 2**31 - 2**12])]).astype(np.int32)
    for size in (1, 2, 3, 16, 24, 128, 4096):
        want = -(-tokens.astype(np.int64) // size)
        shift = bm.block_shift(size)
        assert (shift >= 0) == (size & (size - 1) == 0)
        np.testing.assert_array_equal(bm.blocks_for(tokens, np.int32(size), np.int32(shift), False), want)
        if shift >= 0:
            np.testing.assert_array_equal(bm.blocks_for(tokens, np.int32(size), np.int32(shift), True), want)
    flag = lambda sizes: dict(vllm_v1.static_options([{"block_size": b} for b in sizes]))["pow2_blocks"]  # noqa: E731
    assert flag([16, 1, 128]) and not flag([16, 24])


# ----------------------------------------------------------------------------------------
# Hand-worked cases and settings.


HAND = [TraceRequest(arrival=0, client="a", prompt=4, output=6, priority=1),
        TraceRequest(arrival=1, client="b", prompt=4, output=6, priority=0)]
HAND_CONFIG = {"block_size": 4, "num_blocks": 5, "max_num_batched_tokens": 64, "max_num_seqs": 4}


def _steps(schedule: dict) -> list[tuple]:
    return [(s["step"], s["sched"], s["preempted"], s["finished"]) for s in schedule["steps"]]


def test_hand_worked_priority_victim_preempts_itself_and_the_walk_goes_on():
    """Blocks of 4 tokens, 4 usable; r0 (priority 1) at step 0, r1 (priority 0) at step 1,
    both prompt 4 and output 6 (peak ceil(9 / 4) = 3 blocks: both cannot reach it).

    Step 0: r0 prefills 4 tokens (1 block, 3 free), samples g = 1. Step 1: r0 decodes
    (c = 4 -> 5 needs a 2nd block: 2 free); r1 is admitted (1 block fits: 1 free),
    prefills 4. Step 2: r0 (c 5 -> 6) keeps 2 blocks; r1 (c 4 -> 5) takes the last
    block (0 free). Steps 3, 4: both decode within their blocks (r0 reaches c = 8, g = 5;
    r1 c = 7, g = 4). Step 5: r0 (c 8 -> 9) needs a 3rd block, none is free. The victim
    is the largest (priority, arrival): r0 itself. It frees its 2 blocks and leaves
    unscheduled, and the walk goes on: r1 decodes (c = 8, g = 5); no admission in a step
    that preempted. Step 6: r1 takes a 3rd block (1 free) and finishes (g = 6); r0's whole
    P + g = 9 tokens need 3 blocks > 1 free: not admitted. Step 7: r0 is admitted and
    recomputes 9 tokens at once, samples its 6th token and finishes.

    Under fcfs the victim is the newest, r1 (c = 7, g = 4), instead: r0 finishes in step
    5; r1 recomputes its P + g = 8 tokens in step 6 (2 blocks), samples its 5th token, and
    finishes in step 7. The `counter` victim under fcfs picks r0 like
    priority does: at step 5, client a's counter is 4 (prompt, w_p = 1) + 2 x 5 decoded
    (w_q = 2) = 14 > client b's 4 + 2 x 4 = 12."""
    by_priority = [(0, {"0": 4}, [], []), (1, {"0": 1, "1": 4}, [], []), (2, {"0": 1, "1": 1}, [], []),
                   (3, {"0": 1, "1": 1}, [], []), (4, {"0": 1, "1": 1}, [], []), (5, {"1": 1}, [0], []),
                   (6, {"1": 1}, [], [1]), (7, {"0": 9}, [], [0])]
    by_arrival = by_priority[:5] + [(5, {"0": 1}, [1], [0]), (6, {"1": 8}, [], []), (7, {"1": 1}, [], [1])]
    priority, fcfs = dict(HAND_CONFIG, policy="priority"), dict(HAND_CONFIG, policy="fcfs")
    assert _steps(simulate(HAND, priority)) == by_priority
    assert _steps(simulate(HAND, fcfs)) == by_arrival
    got = engine_schedules([(HAND, priority), (HAND, fcfs), (HAND, dict(fcfs, victim="counter"))], 16)
    assert [_steps(g) for g in got] == [by_priority, by_arrival, by_priority]


def test_priority_queues_number_pairs_by_first_appearance():
    """Tenant a at priorities 2 and 0, tenant b at 2: three engine clients in order of
    first appearance; bands are the priorities' ranks (0, 2 -> 0, 1)."""
    queue, bands, tenants = vllm_v1.priority_queues(np.array(["a", "b", "a", "a", "b"]), np.array([2, 2, 0, 2, 2]))
    assert queue.tolist() == [0, 1, 2, 0, 1] and bands == [1, 1, 0] and tenants == ["a", "b", "a"]
    with pytest.raises(InputError, match="equal length"):
        vllm_v1.priority_queues(np.array([0, 1]), np.array([0]))


@pytest.mark.parametrize(("options", "message"), [
    ({"scheduling_policy": "lifo"}, "scheduling_policy must be one of fcfs, priority"),
    ({"victim": "oldest"}, "victim must be one of newest, priority, counter"),
])
def test_bad_choices_are_refused(options, message):
    with pytest.raises(InputError, match=message):
        vllm_v1.validate({"num_gpu_blocks": 8, **options})


def test_the_victim_defaults_to_vllms_for_the_policy():
    codes = [vllm_v1.encode({"num_gpu_blocks": 8, **o})["victim"] for o in
             ({}, {"scheduling_policy": "priority"}, {"scheduling_policy": "priority", "victim": "newest"},
              {"victim": "counter"})]
    assert [int(c) for c in codes] == [0, 1, 0, 2]
