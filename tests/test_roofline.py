"""The roofline step time (vtc_jax/servers/roofline.py, docs/ROOFLINE.md): a step worked by
hand, the presets, a user's config.json, one-line refusals, `compare --roofline`, and
`sweeps.calibrate --roofline` recovering the efficiencies from the model's own profile."""

from __future__ import annotations

import csv
import json
from fractions import Fraction

import numpy as np
import pytest

from sweeps.calibrate import main as calibrate_main
from vtc_jax.cli.commands import main
from vtc_jax.core.errors import InputError
from vtc_jax.servers import roofline, step_time

pytestmark = pytest.mark.usefixtures("capacity_once_per_mix")

TINY = roofline.ModelShape("tiny", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, intermediate_size=128, vocab_size=256, param_bytes=2)
TOY_GPU = roofline.Gpu("toy", peak_flops=Fraction(10**9), hbm_bytes_per_s=Fraction(10**8), memory_bytes=1_000_000)
TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
               "vocab_size": 256, "torch_dtype": "bfloat16", "tie_word_embeddings": False, "hidden_act": "silu"}


def test_a_step_worked_by_hand():
    """The tiny model: L = 2 layers, h = 64, H = 4 heads of d = 16, Hkv = 2, I = 128, V = 256,
    bf16 (2 bytes). Per layer its matmuls hold 2 h H d + 2 h Hkv d + 3 h I = 8,192 + 4,096 +
    24,576 = 36,864 parameters, so W = 73,728; the LM head h V = 16,384; a step streams
    W + h V = 90,112 parameters = 180,224 bytes. KV per token K = 2 L Hkv d x 2 = 256 bytes;
    attention per query-key pair 4 L H d = 512 FLOPs.

    The toy GPU: 10^9 FLOP/s = 1,000 FLOP/us, 10^8 bytes/s = 100 bytes/us, 10^6 bytes. At
    efficiencies compute 0.5 (500 FLOP/us) and memory 0.8 (80 bytes/us):
      compute: per prefill token 2 W / 500 = 294.912, per decode token 2 (W + h V) / 500 =
               360.448, per context pair 512 / 500 = 1.024 us;
      memory:  per step 180,224 / 80 = 2,252.8, per new token (KV write) 256 / 80 = 3.2, per
               decode context token 3.2, per prefill context pair 3.2 / 128 = 0.025 us.

    The step: a prefill chunk of t = 8 tokens after c = 4 computed ones (context pairs
    t c + t (t + 1) / 2 = 32 + 36 = 68) and 2 decodes of contexts 10 and 20 (30):
      compute = 294.912 x 8 + 360.448 x 2 + 1.024 x (68 + 30) = 2,359.296 + 720.896 + 100.352
              = 3,180.544 us;
      memory  = 2,252.8 + 3.2 x (8 + 2) + 3.2 x 30 + 0.025 x 68 = 2,252.8 + 32 + 96 + 1.7
              = 2,382.5 us;
    compute binds: the step lasts trunc(3,180.544) = 3,180 us. The 2 decodes alone: compute
    720.896 + 1.024 x 30 = 751.616, memory 2,252.8 + 6.4 + 96 = 2,355.2: memory binds, 2,355 us.
    The pool: (10^6 x 0.9 - 106,816 parameters x 2 bytes) / (16 x 256) = 686,368 / 4,096 =
    167.6: 167 blocks (block 0 the null block)."""
    assert (TINY.layer_matmul_params, TINY.streamed_params, TINY.param_count) == (73_728, 90_112, 106_816)
    assert TINY.kv_bytes_per_token() == 256
    data = roofline.roofline_dict(TINY, TOY_GPU, "0.5", "0.8")
    assert data["max_of"] == [
        {"per_prefill_token": "294.912000000000", "per_decode_token": "360.448000000000",
         "per_prefill_context": "1.024000000000", "per_decode_context": "1.024000000000"},
        {"per_step": "2252.800000000000", "per_prefill_token": "3.200000000000", "per_decode_token": "3.200000000000",
         "per_decode_context": "3.200000000000", "per_prefill_context": "0.025000000000"}]
    assert (data["a0"], data["num_gpu_blocks"]) == (0, 167)
    model = roofline.roofline_model(TINY, TOY_GPU, "0.5", "0.8")
    sums = [sum(c * x for c, x in zip(form, (1, 0, 8, 2, 0, 30, 68))) for form in model.forms]
    assert sums == [Fraction("3180.544"), Fraction("2382.5")]
    assert model.step_us(8, 2, per_prefill_context=68, per_decode_context=30) == 3180
    assert model.step_us(0, 2, per_decode_context=30) == 2355
    assert model.name == "tiny-toy-roofline" and model.num_gpu_blocks == 167
    # tensor parallel 2: compute and weights halve; 1 KV head a GPU, so K halves too
    tp2 = roofline.roofline_model(TINY, TOY_GPU, "0.5", "0.8", tp=2)
    assert tp2.step_us(8, 2, per_prefill_context=68, per_decode_context=30) == 1590  # 3,180.544 / 2
    # the lane's exact sum agrees (encode -> exact_us over the same features, the doubled ones twice)
    coef = step_time.encode(model.text)["time_coef"]
    feats = np.array([[x % 10**4, x // 10**4, 0, 0, 0, 0] for x in (1, 0, 8, 2, 0, 30, 2 * 68)], np.int32)
    assert np.asarray(step_time.exact_us(coef, feats)).tolist() == [3180, 2382]


def test_presets_load_and_match_public_numbers():
    models, gpus = roofline.model_presets(), roofline.gpu_presets()
    assert {"llama-3.1-8b", "qwen2.5-7b", "qwen3-14b", "llama-3.1-70b"} <= set(models)
    assert set(gpus) == {"H100", "H200", "A100-80G", "L40S", "MI300X"}
    assert models["llama-3.1-8b"].param_count == 8_030_261_248  # Llama-3.1-8B's 8.03 B parameters
    assert models["llama-3.1-70b"].param_count == 70_553_706_496
    assert models["qwen2.5-7b"].head_dim == 128 and models["qwen2.5-7b"].kv_bytes_per_token() == 57_344
    assert gpus["H100"].peak_flops == Fraction("989.5e12") and gpus["H200"].hbm_bytes_per_s == Fraction("4.8e12")
    # vLLM's pool rule on H100 gives the qwen2.5-7b-h100 blackbox preset's measured pool exactly
    qwen = roofline.roofline_model(models["qwen2.5-7b"], roofline.gpu("h100"))
    assert qwen.num_gpu_blocks == step_time.preset("qwen2.5-7b-h100").num_gpu_blocks == 67_660
    for name in models:  # every preset makes a model on some GPU the lane can time
        tp = 4 if name == "llama-3.1-70b" else 1
        for g in gpus.values():
            m = roofline.roofline_model(models[name], g, tp=tp)
            m.check(8192, 1024, 32_768)


def test_a_users_config_json(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    shape = roofline.model_shape(str(folder / "config.json"))
    assert shape == TINY
    gpu_file = tmp_path / "toy.json"
    gpu_file.write_text(json.dumps({"peak_flops": 1e9, "hbm_bytes_per_s": "1e8", "memory_bytes": 1_000_000}))
    assert roofline.gpu(str(gpu_file)) == TOY_GPU
    no_head_dim = {k: v for k, v in TINY_CONFIG.items() if k not in ("head_dim", "num_key_value_heads")}
    assert roofline.shape_of(no_head_dim, "t", "t").num_key_value_heads == 4  # MHA: as many KV heads, d = h / H


@pytest.mark.parametrize("change, words", [
    ({"num_local_experts": 8}, "mixture-of-experts config (num_local_experts 8)"),
    ({"num_experts": 128}, "mixture-of-experts config (num_experts 128)"),
    ({"hidden_size": "64"}, "hidden_size must be an integer"),
    ({"torch_dtype": "float8_e4m3fn"}, "torch_dtype 'float8_e4m3fn' is not one of"),
    ({"quantization_config": {"quant_method": "awq"}}, "a quantized model"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
])
def test_bad_configs_are_one_line(tmp_path, change, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_CONFIG, **change}))
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
        roofline.read_config(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("flags, words", [
    (["--roofline", "llama-3.1-8b", "--preset", "qwen2.5-7b-h100"], "give one of --preset, --step-time, --roofline"),
    (["--preset", "qwen2.5-7b-h100", "--gpu", "H100"], "--gpu applies to --roofline MODEL"),
    (["--roofline", "nope"], "not a preset (llama-3.1-8b"),
    (["--roofline", "llama-3.1-8b", "--gpu", "X100"], "--gpu 'X100': not a preset"),
    (["--roofline", "llama-3.1-70b"], "the weights leave no KV blocks"),
    (["--roofline", "llama-3.1-8b", "--roofline-efficiency", "1.5,1"], "compute efficiency must be in (0, 1]"),
    (["--roofline", "llama-3.1-8b", "--tensor-parallel-size", "3"], "must split evenly across 3 GPUs"),
])
def test_bad_roofline_flags_are_one_line(tmp_path, capsys, flags, words):
    path = tmp_path / "log.csv"
    path.write_text("timestamp,tenant,prompt,output\n1.0,a,10,2\n")
    assert main(["compare", str(path), "--server", "vllm", "--policies", "fcfs", "--out", str(tmp_path),
                 "--no-cache", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_compare_with_a_roofline(tmp_path, capsys):
    """`compare LOG --server vllm --roofline llama-3.1-8b --gpu H100`: H100 takes vLLM's H100
    defaults (8,192 batched tokens; seats cut to 8 here to keep the capacity run short) and the
    roofline's pool; request a's first token ends its one prefill step of 100 fresh tokens."""
    log = tmp_path / "log.csv"
    log.write_text("timestamp,tenant,prompt,output\n100.5,a,100,3\n100.6,b,2000,5\n")
    requests = tmp_path / "requests.csv"
    assert main(["compare", str(log), "--server", "vllm", "--roofline", "llama-3.1-8b", "--gpu", "H100",
                 "--policies", "fcfs,vtc", "--max-num-seqs", "8", "--out", str(tmp_path / "out"), "--no-plots",
                 "--requests-out", str(requests), "--no-cache"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("server vllm, step time"))
    assert "llama-3.1-8b-h100-roofline;" in head and "num_gpu_blocks 29205" in head
    assert "max_num_batched_tokens 8192" in head
    model = roofline.roofline_model(roofline.model_presets()["llama-3.1-8b"], roofline.gpu("H100"))
    rows = list(csv.DictReader(requests.open()))
    a = next(r for r in rows if r["policy"] == "fcfs" and r["tenant"] == "a")
    assert int(a["first_token_us"]) == model.step_us(100, 0, per_prefill_context=100 * 101 // 2) == 4485


def _profile(path, model, n=240, seed=0):
    rng = np.random.default_rng(seed)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["decode_tokens", "step_time_us", "prefill_tokens", "decode_context", "prefill_context"])
        for _ in range(n):
            t = int(rng.integers(1, 4096)) if rng.random() < 0.4 else 0
            c = int(rng.integers(0, 4000))
            pc = t * c + t * (t + 1) // 2
            d = int(rng.integers(0 if t else 1, 512 if not t else 64))
            dc = d * int(rng.integers(100, 3000))
            w.writerow([d, model.step_us(t, d, per_prefill_context=pc, per_decode_context=dc), t, dc, pc])


def test_calibrate_recovers_the_efficiencies(tmp_path, capsys):
    """A profile of the roofline's own steps (llama-3.1-8b on H100, efficiencies 0.5 and 0.8,
    trunc'd to whole us): the fit finds 0.5000 and 0.8000, so the written file IS that model."""
    shape, h100 = roofline.model_presets()["llama-3.1-8b"], roofline.gpu("H100")
    profile, out = tmp_path / "steps.csv", tmp_path / "fit.json"
    _profile(profile, roofline.roofline_model(shape, h100, "0.5", "0.8"))
    assert calibrate_main(["--server", "vllm", str(profile), "--roofline", "llama-3.1-8b", "--gpu", "H100", "--a0",
                           "100", "--out", str(out)]) == 0
    assert "efficiency compute 0.5000 memory 0.8000, R^2 1.0000" in capsys.readouterr().out
    data = json.loads(out.read_text())
    want = roofline.roofline_dict(shape, h100, "0.5", "0.8", a0=100)
    assert (data["max_of"], data["a0"], data["num_gpu_blocks"]) == (want["max_of"], 100, 29205)
    assert step_time.read_step_time(out).forms == roofline.roofline_model(shape, h100, "0.5", "0.8").forms
    decode_only = tmp_path / "decode.csv"
    decode_only.write_text("prefill_tokens,decode_tokens,prefill_context,decode_context,step_time_us\n"
                           "0,1,0,100,6000\n0,8,0,800,6100\n0,16,0,1600,6200\n")
    assert calibrate_main(["--server", "vllm", str(decode_only), "--roofline", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert "the compute efficiency is not determined" in err and len(err.strip().splitlines()) == 1


def test_calibrate_fit_with_noise():
    """2,000 steps of qwen3-14b on an H200 at efficiencies 0.45 and 0.7, times off by 2%
    (normal): the fit is within 1% of both."""
    from sweeps.calibrate import fit_roofline, roofline_bases

    unit = roofline.roofline_model(roofline.model_presets()["qwen3-14b"], roofline.gpu("H200"))
    rng = np.random.default_rng(1)
    t = rng.integers(1, 8192, 2000) * (rng.random(2000) < 0.4)
    c = rng.integers(0, 8000, 2000)
    d = rng.integers(0, 256, 2000) + (t == 0)
    rows = np.column_stack([t, d, t * c + t * (t + 1) // 2, d * rng.integers(100, 8000, 2000)]).astype(np.float64)
    compute, memory = roofline_bases(unit.forms, rows)
    times = np.maximum(compute / 0.45, memory / 0.7) * (1 + rng.normal(0, 0.02, len(rows)))
    assert fit_roofline(compute, memory, times) == pytest.approx((0.45, 0.7), rel=0.01)
