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
from vtc_jax.inputs.request_log import read_requests
from vtc_jax.servers import registry, vllm_prefix
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
    """The engine's VTC (w_p = 1, w_q = 2, beta = 0) as the reference's waiting order, for
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
    got = engine_schedules(lanes + vtc, max(w["num_steps"] for w in want) + 1, policy=["fcfs"] * 160 + ["vtc"] * 60)
    for k, (mine, real) in enumerate(zip(got, want)):
        assert_same(mine, real, f"lane {k} ({(lanes + vtc)[k][1]})")


def test_prefix_tables_are_indexed_by_order():
    """Rows out of arrival order: the tables follow (arrival, row) order; a prefix_len
    without an id is its client's; nothing shared: no tables."""
    got = vllm_prefix.prefix_options([5, 0, 5, 1], ["a", "b", "a", "b"], ["x", None, None, "x"], [4, 3, 2, 0], rows=6)
    # ORDER: row 1 (t 0), row 3 (t 1), row 0 (t 5), row 2 (t 5)
    assert got == {"prefix_group": (1, -1, 0, 2, -1, -1), "prefix_len": (3, 0, 4, 2, 0, 0)}
    assert vllm_prefix.prefix_options([0, 1], ["a", "b"], [None, "x"], [0, 0]) == {}


@pytest.mark.parametrize(("options", "message"), [
    ({"victim": "counter"}, "victim must be one of newest, priority"),
    ({"prefix_group": (0, 1), "prefix_len": (3,)}, "differ in length"),
    ({"prefix_group": (0, -2), "prefix_len": (3, 0)}, "prefix_group must be a tuple"),
    ({"prefix_group": [0], "prefix_len": [3]}, "prefix_group must be a tuple"),
    ({"block_size": 0}, "block_size must be an integer"),
    ({"bogus": 1}, "server vllm_prefix has no setting 'bogus'"),
])
def test_bad_settings_are_refused(options, message):
    with pytest.raises(InputError, match=message):
        vllm_prefix.validate({"num_gpu_blocks": 8, **options})


def test_slots_hold_the_pool_and_tables_of_one_batch_share_a_size():
    server = registry.get("vllm_prefix")
    assert server.plan_slots([{"num_gpu_blocks": 300, "max_num_seqs": 4}], 10, 50) == 300
    assert server.plan_slots([{"num_gpu_blocks": 3, "max_num_seqs": 4}], 10, 50) == 4
    with pytest.raises(InputError, match="differ in size"):
        server.plan_slots([{"num_gpu_blocks": 8, "prefix_group": (0,) * 70, "prefix_len": (1,) * 70},
                           {"num_gpu_blocks": 8}], 10, 50)
    encoded = server.encode({"num_gpu_blocks": 8, "prefix_group": (2, -1), "prefix_len": (5, 0)})
    assert encoded["prefix_group"].tolist() == [2, -1] + [-1] * 62 and encoded["prefix_len"][:3].tolist() == [5, 0, 0]


def test_a_prefix_len_without_an_id_is_shared_within_its_client(tmp_path):
    """The server trace (as `replay --server vllm` reads it) takes a prefix_len without a
    prefix_id (as the goldens' harness made them: the client's own prefix); prefix_options
    gives each client its group."""
    path = tmp_path / "t.csv"
    path.write_text("arrival,client,prompt,output,prefix_id,prefix_len\n0,a,40,2,,32\n0,b,40,2,,32\n1,a,40,2,,16\n"
                    "1,b,40,2,sys,8\n")
    source = server_trace(read_requests([path]), None)
    assert source.prefix_id == (None, None, None, "sys") and source.prefix_len.tolist() == [32, 32, 16, 8]
    got = vllm_prefix.prefix_options(source.arrival, [source.tenants[t] for t in source.tenant], source.prefix_id,
                                     source.prefix_len)
    assert got == {"prefix_group": (0, 1, 0, 2), "prefix_len": (32, 32, 16, 8)}
