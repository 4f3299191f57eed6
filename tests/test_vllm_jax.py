"""The JAX vLLM V1 step (vtc_jax/servers/vllm.py) against the literal reference
(vtc_jax/testing/vllm_reference.py): the 29 real-scheduler goldens step for step, and
hundreds of random small lanes, batched with vmap, compared at every step."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

from vtc_jax.errors import InputError
from vtc_jax.servers import vllm
from vtc_jax.testing.vllm_reference import TraceRequest, load_golden, simulate

GOLDEN_DIR = pathlib.Path(__file__).parent / "data" / "vllm_golden"
GOLDENS = sorted(p.name[: -len(".csv")] for p in GOLDEN_DIR.glob("g*.csv"))


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
    """Every golden through the JAX step, batched by rules (a few compiles, not 29)."""
    loaded = {name: load_golden(GOLDEN_DIR, name) for name in GOLDENS}
    groups: dict = {}
    for name, (_, config, _) in loaded.items():
        groups.setdefault(vllm.VllmConfig.from_golden(config).rules, []).append(name)
    runs = {}
    for names in groups.values():
        steps = max(loaded[n][2]["num_steps"] for n in names) + 1
        got = schedules([loaded[n][1] for n in names], [loaded[n][0] for n in names], steps)
        runs.update(zip(names, got))
    return {name: (runs[name], loaded[name][2]) for name in GOLDENS}


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_step_for_step(name, golden_runs):
    got, golden = golden_runs[name]
    assert len(got["steps"]) == golden["num_steps"]
    for mine, real in zip(got["steps"], golden["steps"]):
        assert mine == real, f"{name}: first differing step {real['step']}"
    assert got["requests"] == golden["requests"]
