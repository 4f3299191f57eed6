"""The JAX vLLM V1 step (vtc_jax/servers/vllm.py) against the literal reference
(vtc_jax/testing/vllm_reference.py): the 29 real-scheduler goldens step for step, and
hundreds of random small lanes, batched with vmap, compared at every step."""

from __future__ import annotations

import pathlib

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


def schedules(cfg: vllm.VllmConfig, lanes: list[list[TraceRequest]], rows: int, num_steps: int) -> list[dict]:
    """Each lane's schedule from the JAX step, in the reference's layout (rows as strings)."""
    traces = vllm.stack_lanes([pack(cfg, reqs, rows) for reqs in lanes])
    vllm.check_run(cfg, traces, num_steps)
    out, log = vllm.run(cfg, traces, num_steps, vllm.table_width(cfg, traces))
    out, log, source = (jax_to_np(x) for x in (out, log, traces.source))
    results = []
    for lane in range(len(lanes)):
        src = source[lane]
        steps = []
        for k in np.nonzero(log.active[lane])[0]:
            rows_k, tokens = log.rows[lane, k], log.tokens[lane, k]
            steps.append({"step": int(log.t[lane, k]),
                          "sched": {str(src[r]): int(n) for r, n in zip(rows_k, tokens) if n > 0},
                          "preempted": sorted(int(src[r]) for r in rows_k[log.preempted[lane, k]]),
                          "finished": sorted(int(src[r]) for r in rows_k[log.finished[lane, k]])})
        reqs = {}
        for r in range(len(lanes[lane])):
            reqs[str(src[r])] = {"first_token_step": _opt(out.first_token[lane, r]),
                                 "finish_step": _opt(out.finish[lane, r]),
                                 "preemptions": int(out.preemptions[lane, r])}
        results.append({"steps": steps, "requests": dict(sorted(reqs.items(), key=lambda kv: int(kv[0])))})
    return results


def _opt(x) -> int | None:
    return None if x < 0 else int(x)


def jax_to_np(tree):
    import jax

    return jax.tree.map(np.asarray, tree)


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_step_for_step(name):
    requests, config, golden = load_golden(GOLDEN_DIR, name)
    cfg = vllm.VllmConfig.from_golden(config)
    got = schedules(cfg, [requests], len(requests), golden["num_steps"] + 1)[0]
    assert len(got["steps"]) == golden["num_steps"]
    for mine, real in zip(got["steps"], golden["steps"]):
        assert mine == real, f"{name}: first differing step {real['step']}"
    assert got["requests"] == golden["requests"]
