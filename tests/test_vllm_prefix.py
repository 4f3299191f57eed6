"""`vllm_prefix` (servers/vllm_prefix.py, vllm_blocks.py): vLLM V1 with prefix caching in
the engine, against the literal reference (vtc_jax/testing/vllm_reference.py) on random
lanes with shared prefixes, tight pools and preemptions, under vLLM's two policies; its
settings and the ORDER-indexed prefix tables. The real scheduler's goldens with prefix
caching run through the engine in tests/test_vllm_server.py and through the CLI in
tests/test_vllm_cli.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.test_vllm_server import assert_same, engine_schedules, random_lane
from vtc_jax import InputError
from vtc_jax.cli.input_flags import server_trace
from vtc_jax.inputs import prefix_blocks
from vtc_jax.inputs.request_log import read_requests
from vtc_jax.servers import registry, vllm_blocks, vllm_prefix, vllm_v1
from vtc_jax.testing.vllm_reference import WaitingOrder, simulate


def prefix_lane(rng: np.random.Generator, policy: str):
    """test_vllm_server's random lane with prefix caching: each request joins one of 1-3
    prefix groups (probability 0.7) sharing 0 to all of its prompt, or keeps a prefix of
    its own client (no id)."""
    requests, config = random_lane(rng, policy)
    groups = int(rng.integers(1, 4))
    out = []
    for r in requests:
        draw = rng.random()
        if draw < 0.7:
            r = dataclasses.replace(r, prefix_id=f"p{int(rng.integers(0, groups))}",
                                    prefix_len=int(rng.integers(0, r.prompt + 1)))
        elif draw < 0.8:
            r = dataclasses.replace(r, prefix_id=f"client:{r.client}", prefix_len=int(rng.integers(0, r.prompt + 1)))
        out.append(dataclasses.replace(r, prefix_id=r.prefix_id if r.prefix_len > 0 else None))
    return out, dict(config, prefix_caching=True)


def _hits_matter(lane) -> bool:
    requests, config = lane
    return simulate(requests, config)["steps"] != simulate(requests, dict(config, prefix_caching=False))["steps"]


class VtcOrder(WaitingOrder):
    """The engine's VTC (w_p = 1, w_q = 2, beta = 0, --charge-prefill sent) as the reference's waiting order, for
    lanes whose requests all arrive at step 0 (so no counter is ever lifted): each client
    a FIFO (a preempted request back at its front), the head of the client with the
    smallest counter (ties: the smallest client number, by first appearance) first. A
    client's counter: its admitted requests' prompts, once each, plus 2 per token sampled
    (read from the requests' states, so the decodes of a step count from the next one)."""

    def __init__(self):
        self.queues: dict[str, list] = {}
        self.admitted: dict[int, object] = {}

    def _counter(self, client):
        return sum(r.spec.prompt + 2 * r.generated for r in self.admitted.values() if r.spec.client == client)

    def _best(self):
        waiting = [c for c, q in self.queues.items() if q]  # in first-appearance order: ties keep the first
        return min(waiting, key=self._counter)

    def add(self, req):
        self.queues.setdefault(req.spec.client, []).append(req)

    def push_front(self, req):
        self.queues[req.spec.client].insert(0, req)

    def peek(self):
        return self.queues[self._best()][0]

    def pop(self):
        req = self.queues[self._best()].pop(0)
        self.admitted.setdefault(req.row, req)
        return req

    def __len__(self):
        return sum(len(q) for q in self.queues.values())


def _lanes(rng: np.random.Generator, policy: str, count: int, test) -> list:
    out = []
    while len(out) < count:
        lane = prefix_lane(rng, policy)
        if test(lane):
            out.append(lane)
    return out


def _vtc_lane(rng: np.random.Generator):
    """A prefix lane of 2-3 clients, every request at step 0 (VtcOrder's lanes)."""
    while True:
        requests, config = prefix_lane(rng, "fcfs")
        requests = [dataclasses.replace(r, arrival=0) for r in requests]
        if len({r.client for r in requests}) > 1:
            return requests, config


def test_random_lanes_match_the_reference():
    """One batch: 80 fcfs and 80 priority lanes in which prefix caching changes the
    schedule (against the same lane without it), and 60 lanes under the engine's VTC
    against the reference with the VTC order (fcfs's newest victim, preempted to the
    front of its client's queue)."""
    rng = np.random.default_rng(7)
    lanes = _lanes(rng, "fcfs", 80, _hits_matter) + _lanes(rng, "priority", 80, _hits_matter)
    vtc = [_vtc_lane(rng) for _ in range(60)]
    want = [simulate(reqs, config) for reqs, config in lanes] + [simulate(r, c, order=VtcOrder) for r, c in vtc]
    assert sum(w["total_preemptions"] > 0 for w in want) >= 40  # self-hits after a preemption are exercised
    assert sum(w["steps"] != simulate(r, c)["steps"] for w, (r, c) in zip(want[160:], vtc)) >= 15  # VTC is not fcfs
    got = engine_schedules(lanes + vtc, max(w["num_steps"] for w in want) + 1, policy=["fcfs"] * 160 + ["vtc"] * 60,
                           charge_sent=True)  # VtcOrder charges every sent prompt token
    for k, (mine, real) in enumerate(zip(got, want)):
        assert_same(mine, real, f"lane {k} ({(lanes + vtc)[k][1]})")


def test_the_closed_form_running_phase_is_the_walk(monkeypatch):
    """The running phase's closed form (vllm_prefix._fast_walk: one batched take and hash)
    on every step of every lane that preempts nothing, the walk on the others: the
    batch-wide choice made per lane (the `cond` becomes a select), so that big batches,
    where some lane nearly always preempts, still exercise it. 30 fcfs and 30 priority
    lanes, 20 under VTC, and 30 of them async beside their sync twins, against the
    reference step for step."""
    import jax

    from tests import test_vllm_server as tvs

    monkeypatch.setattr(vllm_prefix, "batch_any", lambda x: x)
    monkeypatch.setitem(tvs.OPTION_NAMES, "async_scheduling", "async_scheduling")
    jax.clear_caches()  # programs traced with the batch-wide choice must not be reused
    rng = np.random.default_rng(23)
    lanes = _lanes(rng, "fcfs", 30, _hits_matter) + _lanes(rng, "priority", 30, _hits_matter)
    lanes += [(r, dict(c, async_scheduling=flag)) for r, c in lanes[:60:4] for flag in (True, False)]
    vtc = [_vtc_lane(rng) for _ in range(20)]
    want = [simulate(reqs, config) for reqs, config in lanes] + [simulate(r, c, order=VtcOrder) for r, c in vtc]
    got = engine_schedules(lanes + vtc, max(w["num_steps"] for w in want) + 1,
                           policy=["fcfs"] * len(lanes) + ["vtc"] * len(vtc), charge_sent=True)
    jax.clear_caches()
    for k, (mine, real) in enumerate(zip(got, want)):
        assert_same(mine, real, f"lane {k} ({(lanes + vtc)[k][1]})")


def test_the_smallest_lru_ring_is_compacted_without_changing_anything(monkeypatch):
    """The LRU ring at its smallest valid size, P + W (a compacted ring's live entries plus
    one whole release), so that it is compacted whenever its stale and live entries pass
    P: 40 tight lanes still match the reference step for step."""
    monkeypatch.setattr(vllm_blocks, "ring_size", lambda blocks, width: blocks + width)
    rng = np.random.default_rng(11)
    lanes = _lanes(rng, "fcfs", 20, _hits_matter) + _lanes(rng, "priority", 20, _hits_matter)
    want = [simulate(reqs, config) for reqs, config in lanes]
    got = engine_schedules(lanes, max(w["num_steps"] for w in want) + 1, policy="fcfs")
    for k, (mine, real) in enumerate(zip(got, want)):
        assert_same(mine, real, f"lane {k} ({lanes[k][1]})")
    assert sum(w["total_preemptions"] > 0 for w in want) >= 10


def test_content_tables_are_indexed_by_order():
    """Rows out of arrival order: the block tables follow (arrival, row) order; a
    prefix_len without an id is its client's group; the ids are the blocks' contents
    through the whole sequence (prompt + output) at the lane's block size."""
    ident = prefix_blocks.groups(["x", None, None, "x"], [40, 0, 20, 32], [0, 1, 0, 1])
    options = vllm_prefix.prefix_options([5, 0, 5, 1], [40, 20, 30, 40], [2, 2, 2, 2], ident)
    # ORDER: row 1 (t 0), row 3 (t 1), row 0 (t 5), row 2 (t 5). Contents numbered by first
    # appearance in trace order: row 0's x-blocks 0, 1; row 1's own block 2; row 2's 3, 4.
    offsets, ids = options["prefix_blocks"].blocks(16)
    assert offsets.tolist() == [0, 1, 3, 5, 7] and ids.tolist() == [2, 0, 1, 0, 1, 3, 4]
    # At 8 tokens: row 0's x-blocks 0-4 (40 tokens), row 1's own 5, 6, row 2's client blocks
    # 7, 8 (its 20-token prefix holds two whole blocks) and own 9, 10, row 3's x-blocks 0-3
    # (32 tokens) and own 11.
    offsets, ids = options["prefix_blocks"].blocks(8)
    assert offsets.tolist() == [0, 2, 7, 12, 16] and ids.tolist() == [5, 6, 0, 1, 2, 3, 11, 0, 1, 2, 3, 4, 7, 8, 9, 10]
    encoded = vllm_prefix.encode({"num_gpu_blocks": 8, **options})
    assert encoded["block_offsets"][:6].tolist() == [0, 1, 3, 5, 7, 7] and encoded["block_offsets"].shape == (64,)


@pytest.mark.parametrize(("options", "message"), [
    ({"victim": "counter"}, "victim must be one of newest, priority"),
    ({"prefix_blocks": (1, 2)}, "prefix_blocks must be a PrefixTable"),
    ({"prefix_capacity": (1,)}, "prefix_capacity must be a pair"),
    ({"block_size": 0}, "block_size must be an integer"),
    ({"bogus": 1}, "server vllm_prefix has no setting 'bogus'"),
])
def test_bad_settings_are_refused(options, message):
    ident = prefix_blocks.groups([None], [0], [0])
    table = vllm_prefix.prefix_options([0], [4], [1], ident)
    with pytest.raises(InputError, match=message):
        vllm_prefix.validate({"num_gpu_blocks": 8, **table, **options})


def test_slots_are_the_seats_and_lanes_of_one_batch_share_a_size():
    server = registry.get("vllm_prefix")
    small = vllm_prefix.prefix_options([0, 0], [40, 8], [2, 1], prefix_blocks.groups([None, None], [0, 0], [0, 0]))
    big = vllm_prefix.prefix_options([0], [4000], [2], prefix_blocks.groups([None], [0], [0]))
    assert server.plan_slots([{"num_gpu_blocks": 300, "max_num_seqs": 4, **small}], 10, 50) == 4
    assert dict(server.static_options([{"num_gpu_blocks": 300, **small}, {"num_gpu_blocks": 30, **big}])) == {
        "token_times": 0, "pool_blocks": 300, "table_width": 251, "contents": 256}
    lanes = [{"num_gpu_blocks": 8, **small}, {"num_gpu_blocks": 8, **big}]
    with pytest.raises(InputError, match="differ in size"):
        server.plan_slots(lanes, 10, 50)
    assert server.plan_slots(vllm_prefix.common_capacity(lanes), 10, 50) == 50  # seats 256, 50 requests


def test_a_prefix_len_without_an_id_is_shared_within_its_client(tmp_path):
    """The server trace (as `replay --server vllm` reads it) takes a prefix_len without a
    prefix_id (as the goldens' harness made them: the client's own prefix); the content
    identity gives each client its group."""
    path = tmp_path / "t.csv"
    path.write_text("arrival,client,prompt,output,prefix_id,prefix_len\n0,a,40,2,,32\n0,b,40,2,,32\n1,a,40,2,,16\n"
                    "1,b,40,2,sys,8\n")
    source = server_trace(read_requests([path]), None)
    assert source.prefix_id == (None, None, None, "sys") and source.prefix_len.tolist() == [32, 32, 16, 8]
    ident = prefix_blocks.groups(source.prefix_id, source.prefix_len, source.tenant)
    got = vllm_prefix.prefix_options(source.arrival, source.prompt, source.output, ident)["prefix_blocks"].blocks(16)
    # 42 tokens each: two full blocks. a's 32-token prefix (ids 0, 1), b's (2, 3); row 2
    # shares a's first block only (its own second: 4); row 3's 8 tokens hold no whole block
    assert got[0].tolist() == [0, 2, 4, 6, 8] and got[1].tolist() == [0, 1, 2, 3, 0, 4, 5, 6]


def test_kv_blocks_in_use_are_vllms_where_nothing_is_shared():
    """vllm_prefix's `kv_blocks` (the fleet's KV metric: blocks held by requests over
    num_gpu_blocks - 1, cached free blocks free): on random lanes whose requests share no
    content, stopped mid-run at a fixed horizon, it equals vllm's on every lane where the
    schedules agree (at least 16 of 24: a request preempted and readmitted hits its own
    blocks, which vllm recomputes), and is 0 on a drained lane (every block freed, some
    kept cached)."""
    import random

    import jax

    from vtc_jax import MeasureConfig, Settings, Trace, run_traces
    from vtc_jax.inputs import prefix_blocks

    rng = random.Random(5)
    traces, plain, cached = [], [], []
    for _ in range(24):
        n = rng.randint(3, 10)
        trace = Trace.from_rows([(rng.randint(0, 20), rng.randint(0, 1), rng.randint(1, 40), rng.randint(1, 12))
                                 for _ in range(n)])
        options = vllm_v1.fuzz_options(rng, trace.prompt, trace.output)
        options.pop("victim", None)
        ident = prefix_blocks.groups([None] * n, np.zeros(n, np.int64), np.zeros(n, np.int64))
        traces.append(trace)
        plain.append(Settings(policy="fcfs", kv_budget=1 << 20, server_options=tuple(options.items())))
        extra = vllm_prefix.prefix_options(trace.arrival, trace.prompt, trace.output, ident)
        cached.append(Settings(policy="fcfs", kv_budget=1 << 20, server_options=tuple((options | extra).items())))
    k = 2
    for steps in (12, None):
        a = run_traces(traces, plain, num_clients=k, server="vllm", steps=steps, measures=MeasureConfig())
        b = run_traces(traces, cached, num_clients=k, server="vllm_prefix", steps=steps, measures=MeasureConfig())
        same = held = 0
        for lane in range(len(traces)):
            if not all(np.array_equal(np.asarray(getattr(a.server_state.out, f))[lane],
                                      np.asarray(getattr(b.server_state.out, f))[lane]) for f in ("scheduled", "finish")):
                continue  # a preempted request hit its own blocks again: another schedule
            same += 1
            pick = lambda tree, lane=lane: jax.tree_util.tree_map(lambda x: np.asarray(x)[lane], tree)  # noqa: E731
            params_a = registry.get("vllm").encode(dict(plain[lane].server_options))
            params_b = registry.get("vllm_prefix").encode(dict(cached[lane].server_options))
            used_a, usable_a = vllm_v1.kv_blocks(pick(a.server_state), _Params(params_a))
            used_b, usable_b = vllm_prefix.kv_blocks(pick(b.server_state), _Params(params_b))
            assert (int(used_b), int(usable_b)) == (int(used_a), int(usable_a)), (steps, lane)
            held += int(used_b) > 0
            if steps is None:
                assert int(used_b) == 0
        assert same >= 16 and (held >= 8 if steps else held == 0)


class _Params:
    """The lane's engine Params as a server's kv_blocks reads them (only `.server`)."""

    def __init__(self, server):
        self.server = server
