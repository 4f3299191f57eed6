"""`python -m sweeps.calibrate --server vllm`: the vllm server's step-time model (b0, b1, b2
us) fitted to a profile of engine steps, written as the JSON `compare --step-time` reads."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from sweeps.calibrate import fit_vllm, main
from vtc_jax.servers import step_time

pytestmark = pytest.mark.usefixtures("capacity_once_per_mix")

TRUE = (7051.8, 19.54, 25.43)  # the qwen2.5-7b-h100 preset's b0, b1, b2


def _profile(rng, n: int, noise: float) -> np.ndarray:
    prefill = rng.integers(0, 8192, n) * (rng.random(n) < 0.6)
    decode = rng.integers(0, 512, n)
    t = TRUE[0] + TRUE[1] * prefill + TRUE[2] * decode
    return np.column_stack([prefill, decode, t * (1 + rng.normal(0, noise, n))]).astype(np.float64)


def test_fit_recovers_known_coefficients():
    rng = np.random.default_rng(3)
    exact = fit_vllm(_profile(rng, 40, 0.0))
    assert [exact[k] for k in ("b0", "b1", "b2")] == pytest.approx(TRUE, rel=1e-9)
    noisy = fit_vllm(_profile(rng, 2000, 0.01))
    assert noisy["b0"] == pytest.approx(TRUE[0], rel=0.02)
    assert noisy["b1"] == pytest.approx(TRUE[1], rel=0.01)
    assert noisy["b2"] == pytest.approx(TRUE[2], rel=0.02)


def _write(path, rows, column="step_time_us", factor=1.0):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["decode_tokens", column, "prefill_tokens"])  # any column order
        for p, d, t in rows:
            w.writerow([int(d), repr(float(t) / factor), int(p)])


@pytest.mark.parametrize("column, factor", [("step_time_us", 1.0), ("step_time_s", 1e6)])
def test_written_file_is_the_preset_and_compare_reads_it(tmp_path, capsys, column, factor):
    """Exact profile of the qwen2.5-7b-h100 preset: the written model is the preset's
    (2 decimals), and `compare --step-time` on it gives the preset's hand-worked
    schedule (tests/test_timed.py: first token 13,685 us, finish 27,839 us)."""
    from vtc_jax.cli.commands import main as vtc_main

    profile = tmp_path / "steps.csv"
    _write(profile, _profile(np.random.default_rng(0), 30, 0.0), column, factor)
    out = tmp_path / "fit.json"
    assert main(["--server", "vllm", str(profile), "--a0", "4680", "--num-gpu-blocks", "67660", "--out",
                 str(out)]) == 0
    data = json.loads(out.read_text())
    assert {k: data[k] for k in ("b0", "b1", "b2", "a0", "num_gpu_blocks")} == {
        "b0": "7051.80", "b1": "19.54", "b2": "25.43", "a0": 4680, "num_gpu_blocks": 67660}
    model = step_time.read_step_time(out)
    preset = step_time.preset("qwen2.5-7b-h100")
    assert (model.b0, model.b1, model.b2, model.a0) == (preset.b0, preset.b1, preset.b2, preset.a0)
    assert "R^2 1.0000" in capsys.readouterr().out
    log = tmp_path / "log.csv"
    log.write_text("timestamp,tenant,prompt,output\n100.5,a,100,3\n")
    requests = tmp_path / "requests.csv"
    assert vtc_main(["compare", str(log), "--server", "vllm", "--step-time", str(out), "--policies", "fcfs",
                     "--out", str(tmp_path), "--requests-out", str(requests), "--no-cache"]) == 0
    row = next(csv.DictReader(requests.open()))
    assert (row["first_token_us"], row["finish_us"]) == ("13685", "27839")


GOOD = "prefill_tokens,decode_tokens,step_time_us\n0,1,7077\n100,0,9005\n100,5,9100\n"


@pytest.mark.parametrize("body, flags, needle", [
    ("", [], "empty file"),
    ("prefill_tokens,decode_tokens\n1,2\n", [], "exactly one step-time column"),
    ("prefill_tokens,decode_tokens,step_time_us,step_time_s\n1,2,3,4\n", [], "exactly one step-time column"),
    ("prefill_tokens,decode_tokens,step_time_us,batch\n1,2,3,4\n", [], "unexpected column 'batch'"),
    ("prefill_tokens,decode_tokens,step_time_us\n", [], "no rows"),
    ("prefill_tokens,decode_tokens,step_time_us\n1,2,nan\n", [], "line 2: step_time_us"),
    ("prefill_tokens,decode_tokens,step_time_s\n1,2,0\n", [], "line 2: step_time_s"),
    ("prefill_tokens,decode_tokens,step_time_us\n-1,2,5\n", [], "line 2: prefill_tokens"),
    ("prefill_tokens,decode_tokens,step_time_us\n1,2.5,5\n", [], "line 2: decode_tokens"),
    ("prefill_tokens,decode_tokens,step_time_us\n1,0,5\n2,0,6\n3,0,7\n", [], "do not determine"),
    # more decode tokens, shorter steps: b2 < 0 is refused, never written
    ("prefill_tokens,decode_tokens,step_time_us\n0,1,900\n0,10,800\n100,1,2000\n100,10,1900\n", [], "b2 ="),
    (GOOD, ["--overhead", "2"], "--overhead is the artifact profile's"),
    (GOOD.replace("step_time_us", "step_time_s"), ["--a0", "-1"], "--a0"),
    (GOOD, ["--decimals", "9"], "--decimals"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, body, flags, needle):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    out = tmp_path / "st.json"
    assert main(["--server", "vllm", str(path), "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and err.startswith("python -m sweeps.calibrate: error:")
    assert not out.exists()


def test_vllm_flags_on_the_artifact_fit_are_refused(tmp_path, capsys):
    path = tmp_path / "p.csv"
    path.write_text(GOOD)
    assert main([str(path), "--a0", "5"]) == 2
    assert "--a0 applies to --server vllm" in capsys.readouterr().err
