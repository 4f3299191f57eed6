"""The JAX vLLM V1 step (vtc_jax/servers/vllm.py) against the literal reference
(vtc_jax/testing/vllm_reference.py): the 69 real-scheduler goldens (29 in vllm_golden, 40
in vllm_golden_more) step for step, and
hundreds of random small lanes, batched with vmap, compared at every step."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.servers import vllm
from vtc_jax.testing.vllm_reference import TraceRequest, load_golden, simulate

DATA = pathlib.Path(__file__).parent / "data"
# name -> its folder: g* in vllm_golden, m* in vllm_golden_more.
GOLDEN_DIRS = {p.name[: -len(".csv")]: p.parent for folder, prefix in (("vllm_golden", "g"), ("vllm_golden_more", "m"))
               for p in (DATA / folder).glob(f"{prefix}*.csv")}
GOLDENS = sorted(GOLDEN_DIRS)
LANES = 64  # random lanes per rule set (4 sets)


def pack(cfg: vllm.VllmConfig, requests: list[TraceRequest], rows: int) -> vllm.LaneTrace:
    return vllm.pack_lane(cfg, rows, [r.arrival for r in requests], [r.prompt for r in requests],
                          [r.output for r in requests], [r.priority for r in requests],
                          [r.prefix_id for r in requests], [r.prefix_len for r in requests])


def schedules(configs: list[dict], lanes: list[list[TraceRequest]], num_steps: int) -> list[dict]:
    """Each lane's schedule from the JAX step (one compiled call for all: the configs
    must share their rules), in the reference's layout (rows as strings)."""
    cfgs = [vllm.VllmConfig.from_golden(c) for c in configs]
    rules = {c.rules for c in cfgs}
    assert len(rules) == 1
    rows = max(len(reqs) for reqs in lanes)
    traces = vllm.stack_lanes([pack(c, reqs, rows) for c, reqs in zip(cfgs, lanes)])
    vllm.check_run(cfgs[0].rules, traces, num_steps)
    out, log = vllm.run(cfgs[0].rules, traces, num_steps, vllm.shapes_of(traces))
    out, log, source = jax.tree.map(np.asarray, (out, log, traces.source))
    results = []
    for lane, reqs in enumerate(lanes):
        src = source[lane]
        steps = []
        for k in np.nonzero(log.active[lane])[0]:
            rows_k, tokens = log.rows[lane, k], log.tokens[lane, k]
            steps.append({"step": int(log.t[lane, k]),
                          "sched": {str(src[r]): int(n) for r, n in zip(rows_k, tokens) if n > 0},
                          "preempted": sorted(int(src[r]) for r in rows_k[log.preempted[lane, k]]),
                          "finished": sorted(int(src[r]) for r in rows_k[log.finished[lane, k]])})
        per_row = {int(src[r]): {"first_token_step": _opt(out.first_token[lane, r]),
                                 "finish_step": _opt(out.finish[lane, r]),
                                 "preemptions": int(out.preemptions[lane, r])} for r in range(len(reqs))}
        results.append({"steps": steps, "requests": {str(r): per_row[r] for r in sorted(per_row)}})
    return results


def _opt(x) -> int | None:
    return None if x < 0 else int(x)


@pytest.fixture(scope="module")
def golden_runs() -> dict:
    """Every golden through the JAX step, batched by rules (a few compiles, not 69)."""
    loaded = {name: load_golden(GOLDEN_DIRS[name], name) for name in GOLDENS}
    groups: dict = {}
    for name, (_, config, _) in loaded.items():
        groups.setdefault(vllm.VllmConfig.from_golden(config).rules, []).append(name)
    runs = {}
    for names in groups.values():
        steps = max(loaded[n][2]["num_steps"] for n in names) + 1
        got = schedules([loaded[n][1] for n in names], [loaded[n][0] for n in names], steps)
        runs.update(zip(names, got))
    return {name: (runs[name], loaded[name][2]) for name in GOLDENS}


def test_all_69_goldens_are_found():
    assert len(GOLDENS) == 69 and sum(name.startswith("m") for name in GOLDENS) == 40


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_step_for_step(name, golden_runs):
    got, golden = golden_runs[name]
    assert len(got["steps"]) == golden["num_steps"]
    for mine, real in zip(got["steps"], golden["steps"]):
        assert mine == real, f"{name}: first differing step {real['step']}"
        # Also in vLLM's scheduling order: the running list in admission order, then admissions.
        assert list(mine["sched"]) == list(real["sched"]), f"{name}: step {real['step']} order"
    assert got["requests"] == golden["requests"]


def random_lane(rng: np.random.Generator, policy: str, prefix_caching: bool,
                **options: str) -> tuple[list[TraceRequest], dict]:
    """A small random trace and server: 1-4 clients, 5-40 requests in bursts, prompts
    1-300, outputs 1-60; block size 4/8/16, a pool from tight (the largest peak plus 0-2
    blocks) to ample (up to 3 peaks, or all requests at their peak), budgets, seats,
    chunking and L at random within vLLM's constraints."""
    clients = int(rng.integers(1, 5))
    count = int(rng.integers(5, 41))
    bursts = np.sort(rng.integers(0, 200, int(rng.integers(1, 5))))
    arrival = rng.choice(bursts, count) + rng.integers(0, 4, count) * (rng.random(count) < 0.5)
    prompt = rng.integers(1, 301, count)
    output = rng.integers(1, 61, count)
    client = rng.integers(0, clients, count)
    groups = rng.random() < 0.6  # shared prefixes per client (a cache hit is possible without)
    requests = []
    for r in range(count):
        shared = int(rng.integers(0, prompt[r] + 1)) if groups and rng.random() < 0.8 else 0
        requests.append(TraceRequest(arrival=int(arrival[r]), client=f"c{client[r]}", prompt=int(prompt[r]),
                                     output=int(output[r]), priority=int(client[r] * rng.integers(0, 2)),
                                     prefix_id=f"p{client[r]}" if shared else None, prefix_len=shared))
    block = int(rng.choice([4, 8, 16]))
    peak = int(max(-(-(r.prompt + r.output - 1) // block) for r in requests))
    demand = int(sum(-(-(r.prompt + r.output - 1) // block) for r in requests))
    ample = max(min(demand, 3 * peak), peak)  # beyond 3 peaks little changes, and pools cost time
    usable = peak + int(rng.integers(0, 3)) if rng.random() < 0.5 else int(rng.integers(peak, ample + 1))
    seats = int(rng.integers(1, 9))
    chunked = bool(rng.random() < 0.75)
    low = seats if chunked else -(-max(r.prompt + r.output for r in requests) // block) * block
    budget = int(rng.integers(max(low, 8), max(low, 8) + 400))
    config = {"block_size": block, "num_blocks": usable + 1, "max_num_batched_tokens": budget,
              "max_num_seqs": seats, "chunked_prefill": chunked, "policy": policy,
              "prefix_caching": prefix_caching,
              "long_prefill_threshold": int(rng.choice([0, 0, 4, 16, 64])), **options}
    return requests, config


@pytest.mark.parametrize(("seed", "policy", "prefix_caching", "options"), [
    (0, "fcfs", False, {}), (1, "fcfs", True, {}), (2, "priority", False, {}), (3, "priority", True, {}),
    # The reference's other victim / re-queue rules (a fairness policy's), literal path.
    (4, "fcfs", False, {"victim": "policy", "preempted_to": "policy"}),
    (5, "priority", True, {"victim": "newest", "preempted_to": "front"}),
])
def test_random_lanes_match_reference(seed, policy, prefix_caching, options):
    rng = np.random.default_rng(1000 + seed)
    lanes = [random_lane(rng, policy, prefix_caching, **options) for _ in range(LANES if not options else LANES // 2)]
    want = [simulate(reqs, config) for reqs, config in lanes]
    got = schedules([c for _, c in lanes], [r for r, _ in lanes], max(w["num_steps"] for w in want) + 1)
    for k, (mine, real) in enumerate(zip(got, want)):
        where = f"lane {k} ({lanes[k][1]})"
        assert len(mine["steps"]) == real["num_steps"], where
        for a, b in zip(mine["steps"], real["steps"]):
            assert a == b, f"{where}: first differing step {b['step']}"
            assert list(a["sched"]) == list(b["sched"]), f"{where}: step {b['step']} order"
        assert mine["requests"] == real["requests"], where


@pytest.mark.parametrize(("config", "requests", "message"), [
    ({"num_blocks": 3, "block_size": 4}, [(0, 8, 2)], "could never finish"),  # peak ceil(9/4) = 3 > 2 usable
    ({"num_blocks": 99, "block_size": 16, "chunked_prefill": False, "max_num_batched_tokens": 16,
      "max_num_seqs": 4},
     [(0, 10, 7)], "max_model_len"),  # P + O = 17 rounds up to 32 > 16
    ({"num_blocks": 99, "max_num_batched_tokens": 4, "max_num_seqs": 8}, [(0, 1, 1)], "below max_num_seqs"),
    ({"num_blocks": 99, "policy": "lifo"}, [(0, 1, 1)], "scheduling_policy"),
    ({"num_blocks": 99}, [(-1, 1, 1)], "arrival >= 0"),
    ({"num_blocks": 99}, [(0, 2**30, 1)], "too large for int32"),
])
def test_bad_input_is_refused_before_the_run(config, requests, message):
    with pytest.raises(InputError, match=message):
        cfg = vllm.VllmConfig.from_golden(config)
        pack(cfg, [TraceRequest(arrival=a, client="c", prompt=p, output=o) for a, p, o in requests], 4)


def test_a_lane_longer_than_its_rows_and_a_run_past_the_int32_clock_are_refused():
    cfg = vllm.VllmConfig.from_golden({"num_blocks": 99, "prefix_caching": True})
    reqs = [TraceRequest(arrival=a, client="c", prompt=5, output=3) for a in (0, 2**29)]
    with pytest.raises(InputError, match="more than the 1 rows"):
        pack(cfg, reqs, 1)
    lanes = vllm.stack_lanes([pack(cfg, reqs, 2)])
    vllm.check_run(cfg.rules, lanes, 1000)
    with pytest.raises(InputError, match="int32 clock"):
        vllm.check_run(cfg.rules, lanes, 2**30)
