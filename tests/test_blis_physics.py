"""BLIS's physics preset (llama-3.1-8b-h100-physics) on the vllm server: the step worked by
hand, BLIS's engine rules worked by hand, the lanes against BLIS's own golden runs
(tests/data/blis: every request's TTFT and E2E to the us) and against a literal reference
of BLIS's engine (vtc_jax.testing.blis_reference) on random small traces."""

from __future__ import annotations

import csv
import json
import random
from fractions import Fraction
from pathlib import Path

import jax.numpy as jnp
import pytest

from vtc_jax.cli.commands import main
from vtc_jax.servers import step_time
from vtc_jax.testing.blis_reference import blis_run

DATA = Path(__file__).parent / "data" / "blis"
PRESET = "llama-3.1-8b-h100-physics"
GOLDENS = sorted(p.name[: -len(".config.json")] for p in DATA.glob("*.config.json"))


def test_the_physics_step_worked_by_hand():
    """One 100-token chunk of a 100-token prompt and two decodes at contexts 53 and 21:
    S = 6830.410804906928 + 3 x 4.41684444 (13.25053332) + 100 x 2.146033906638844
    (214.6033906638844) + 8.060523988276908e-05 x 100 x (100 + 50) (1.2090785982415362) +
    0.0761824781388418 x 74 (5.6375033822742932) = 7065.1113108713...: 7065 us."""
    model = step_time.preset(PRESET)
    want = (Fraction("6830.410804906928") + 3 * Fraction("4.41684444") + 100 * Fraction("2.146033906638844")
            + Fraction("8.060523988276908e-05") * 100 * 150 + Fraction("0.0761824781388418") * 74)
    assert int(want) == 7065
    assert model.step_us(100, 2, per_request=3, per_chunk_attention=100 * 150, per_decode_context=74) == 7065
    lane = step_time.duration(step_time.encode(model.text), jnp.asarray([100, 1, 1, 0], jnp.int32),
                              jnp.asarray([False, True, True, False]), jnp.asarray([100, 53, 21, 7], jnp.int32),
                              jnp.asarray([0, 52, 20, 0], jnp.int32))
    assert int(lane) == 7065
    assert (model.a0, model.a1, model.a2, model.blis_engine) == (15563, 777, 45, True)


def _replay(tmp_path, log: Path, cfg: dict, model_flags: list) -> dict:
    out = tmp_path / f"{log.stem}.requests.csv"
    argv = ["replay", str(log), "--policy", "fcfs", "--server", "vllm", *model_flags,
            "--num-gpu-blocks", str(cfg["num_gpu_blocks"]), "--block-size", "16",
            "--max-num-batched-tokens", str(cfg["max_num_batched_tokens"]), "--max-num-seqs", str(cfg["max_num_seqs"]),
            "--long-prefill-token-threshold", str(cfg["long_prefill_threshold"]), "--no-enable-prefix-caching",
            "--requests-out", str(out), "--no-cache"]
    assert main(argv) == 0
    return {int(r["row"]): (int(r["ttft_us"]), int(r["e2e_us"])) for r in csv.DictReader(out.open())}


@pytest.mark.parametrize("name", GOLDENS)
def test_blis_golden_runs_to_the_microsecond(tmp_path, name):
    """Every request of BLIS's own run (ample KV: nothing preempted) has our TTFT and E2E."""
    cfg = json.loads((DATA / f"{name}.config.json").read_text())
    ours = _replay(tmp_path, DATA / f"{name}.csv", cfg, ["--preset", PRESET])
    blis = {int(r["row"]): (int(r["ttft_us"]), int(r["e2e_us"])) for r in csv.DictReader((DATA / f"{name}.blis.csv").open())}
    assert ours == blis


def _model_file(tmp_path, blis_engine: bool) -> Path:
    data = json.loads(step_time.resources.files("vtc_jax.servers").joinpath("presets/step_time.json").read_text())[PRESET]
    data["blis_engine"] = blis_engine
    path = tmp_path / f"physics_{blis_engine}.json"
    path.write_text(json.dumps(data))
    return path


def test_blis_engine_rules_worked_by_hand(tmp_path):
    """A (prompt 16, output 1) arrives at 0 and queues at a0 = 15563; its one step lasts
    trunc(6830.410804906928 + 4.41684444 + 16 x 2.146033906638844 + 8.060523988276908e-05
    x 16 x 24) = trunc(6869.19...) = 6869 us, to 22432, and finishes it. B, the same, arrives
    at 1000 and queues at 16563, inside A's step. BLIS frees the engine from the start of a
    step that finishes all it runs: B's step starts at 16563 and ends at 23432, TTFT 23432 +
    45 - 1000 = 22477, E2E 22477 + 777 = 23254. vLLM's engine (the same model without
    blis_engine) runs B after A's step: it ends at 29301, TTFT 28346, E2E 29123. A: TTFT
    22432 + 45 = 22477, E2E 23254 either way."""
    log = tmp_path / "two.csv"
    log.write_text("timestamp,tenant,prompt,output\n0,a,16,1\n0.001,b,16,1\n")
    cfg = {"num_gpu_blocks": 100, "max_num_batched_tokens": 256, "max_num_seqs": 4, "long_prefill_threshold": 0}
    assert _replay(tmp_path, log, cfg, ["--step-time", str(_model_file(tmp_path, True))]) == {
        0: (22477, 23254), 1: (22477, 23254)}
    assert _replay(tmp_path, log, cfg, ["--step-time", str(_model_file(tmp_path, False))]) == {
        0: (22477, 23254), 1: (28346, 29123)}
    # the long-prefill threshold: BLIS caps every chunk, vLLM only while more than one request runs or waits
    log.write_text("timestamp,tenant,prompt,output\n0,a,100,2\n")
    cfg["long_prefill_threshold"] = 64
    (blis_ttft, _), = _replay(tmp_path, log, cfg, ["--step-time", str(_model_file(tmp_path, True))]).values()
    (vllm_ttft, _), = _replay(tmp_path, log, cfg, ["--step-time", str(_model_file(tmp_path, False))]).values()
    model = step_time.preset(PRESET)
    two = (model.step_us(64, 0, per_request=1, per_chunk_attention=64 * 132)
           + model.step_us(36, 0, per_request=1, per_chunk_attention=36 * 118))
    one = model.step_us(100, 0, per_request=1, per_chunk_attention=100 * 150)
    assert (blis_ttft, vllm_ttft) == (model.a0 + two + model.a2, model.a0 + one + model.a2)


def _random_trace(rng: random.Random) -> tuple[list, dict]:
    n = rng.randint(3, 14)
    t, rows = 0, []
    for _ in range(n):
        t += rng.choice((0, rng.randint(0, 3000), rng.randint(0, 40000)))
        rows.append((t, rng.randint(1, 900), rng.randint(1, 40)))
    cfg = {"num_gpu_blocks": 4000, "max_num_batched_tokens": rng.choice((64, 128, 512, 2048)),
           "max_num_seqs": rng.randint(1, 6), "long_prefill_threshold": rng.choice((0, 0, rng.randint(1, 300)))}
    cfg["max_num_seqs"] = min(cfg["max_num_seqs"], cfg["max_num_batched_tokens"])
    return rows, cfg


@pytest.mark.parametrize("seed", range(6))
def test_lanes_match_the_blis_reference_on_random_traces(tmp_path, seed):
    """Random small traces with ample KV (ties in arrival time, idle gaps, overlapping
    steps, long-prefill caps): every request's TTFT and E2E as the literal reference has it."""
    rng = random.Random(seed)
    rows, cfg = _random_trace(rng)
    log = tmp_path / "r.csv"
    log.write_text("timestamp,tenant,prompt,output\n" + "".join(
        f"{a // 10**6}.{a % 10**6:06d},t{i % 3},{p},{o}\n" for i, (a, p, o) in enumerate(rows)))
    ours = _replay(tmp_path, log, cfg, ["--preset", PRESET])
    want = blis_run(rows, step_time.preset(PRESET), cfg["max_num_batched_tokens"], cfg["max_num_seqs"],
                    cfg["long_prefill_threshold"])
    assert [ours[i] for i in range(len(rows))] == want
