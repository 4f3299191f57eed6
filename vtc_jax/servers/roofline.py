"""A roofline step time from a model's shape and a GPU's peaks (docs/ROOFLINE.md).

A step lasts the larger of its compute and its bytes (step_time.StepTime, `max_of` =
[compute form, memory form] over step_time.FEATURES), per GPU of a tensor-parallel group
of `tp` (TP divides the FLOPs, the weights and the KV heads; no communication is modelled):

compute (us, at peak x eff_c FLOP/us):
  per_prefill_token = 2 W / tp / F           W: the layers' matmul parameters
  per_decode_token  = 2 (W + h V) / tp / F   + the LM head (h x vocab) for the sampled token
  per_prefill_context = per_decode_context = 4 L H d / tp / F   (QK^T and AV per query-key pair)
memory (us, at bandwidth x eff_m bytes/us):
  per_step = (W + h V) x param_bytes / tp / B          the weights, once a step
  per_prefill_token = per_decode_token = K / B         each new token's KV written
  per_decode_context = K / B                           a decode reads its context's KV once
  per_prefill_context = K / (QUERY_TILE x B)           a prefill chunk reads the KV once per query tile
K = 2 L Hkv d x param_bytes / tp bytes of KV per token per GPU (Hkv / tp heads, at least 1).

Each coefficient is rounded half-even to DECIMALS decimals of a microsecond: the written
decimals are the model. num_gpu_blocks as vLLM V1 sizes the pool, floor((memory x
utilization - weights per GPU) / (block_size x K)), block 0 of which is the null block.
"""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from importlib import resources
from pathlib import Path

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import read_text
from vtc_jax.servers import step_time

DECIMALS = 12  # decimals of a us kept in each coefficient (step_time takes up to 23)
QUERY_TILE = 128  # tokens of a prefill chunk that share one read of the KV (FlashAttention's query block)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size")
GPU_KEYS = ("peak_flops", "hbm_bytes_per_s", "memory_bytes")
MAX_DIM = 1 << 24
DEFAULT_GPU = "H100"


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A dense decoder (Llama, Qwen, Mistral): gated MLP of 3 matrices, grouped-query
    attention, untied or tied embeddings; param_bytes per parameter (and per KV element)."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    param_bytes: int = 2
    tie_word_embeddings: bool = False

    @property
    def layer_matmul_params(self) -> int:
        """The layers' matmul weights: q, k, v, o and the MLP's gate, up and down."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return self.num_hidden_layers * (2 * h * q + 2 * h * kv + 3 * h * self.intermediate_size)

    @property
    def streamed_params(self) -> int:
        """The weights a step reads: the layers' matmuls and the LM head (norms and the
        embedding rows gathered are left out)."""
        return self.layer_matmul_params + self.hidden_size * self.vocab_size

    @property
    def param_count(self) -> int:
        """Every parameter: the streamed ones, the embedding (unless tied), the RMS norms
        (2 a layer and the final one); biases are left out."""
        h = self.hidden_size
        embed = 0 if self.tie_word_embeddings else h * self.vocab_size
        return self.streamed_params + embed + (2 * self.num_hidden_layers + 1) * h

    def kv_heads(self, tp: int) -> int:
        """KV heads per GPU (vLLM replicates a head when tp passes their number)."""
        return max(1, self.num_key_value_heads // tp)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        return 2 * self.num_hidden_layers * self.kv_heads(tp) * self.head_dim * self.param_bytes


@dataclasses.dataclass(frozen=True)
class Gpu:
    """peak_flops: dense bf16 FLOP/s; hbm_bytes_per_s; memory_bytes (exact numbers)."""

    name: str
    peak_flops: Fraction
    hbm_bytes_per_s: Fraction
    memory_bytes: int
    source: str = ""


def _number(value, key: str, source: str, integer: bool = False) -> Fraction:
    try:
        if isinstance(value, Fraction):
            if value <= 0 or (integer and value.denominator != 1):
                raise InputError(f"{source}: {key} must be {'an integer' if integer else 'a number'} > 0, got {value}")
            return value
        if isinstance(value, Decimal):
            d = value
        elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise InvalidOperation
        else:
            d = Decimal(str(value))
    except InvalidOperation:
        raise InputError(f"{source}: {key} must be a number, got {str(value)[:24]!r}") from None
    if not d.is_finite() or d <= 0 or (integer and d != d.to_integral_value()):
        raise InputError(f"{source}: {key} must be a finite {'integer' if integer else 'number'} > 0, got {value!r}")
    return Fraction(d)


def shape_of(config: dict, name: str, source: str) -> ModelShape:
    """The shape of a Hugging Face config.json object; InputError (one line) for a MoE
    config, a quantized one, a missing or bad key, an unknown dtype."""
    if not isinstance(config, dict):
        raise InputError(f"{source}: a model config is a JSON object (Hugging Face config.json)")
    moe = [k for k in ("num_local_experts", "num_experts", "n_routed_experts") if config.get(k) not in (None, 0, 1)]
    if moe:
        raise InputError(f"{source}: a mixture-of-experts config ({moe[0]} {config[moe[0]]}): the roofline models "
                         "dense models only")
    if config.get("quantization_config"):
        raise InputError(f"{source}: a quantized model (quantization_config): the roofline models bf16/fp16/fp32 "
                         "weights only")
    dims = {}
    for key in SHAPE_KEYS:
        value = config.get(key)
        if value is None and key == "num_key_value_heads":
            value = config.get("num_attention_heads")
        if value is None and key == "head_dim" and dims.get("num_attention_heads"):
            value = config.get("hidden_size", 0) // dims["num_attention_heads"]
        if type(value) is not int or not 1 <= value <= MAX_DIM:
            raise InputError(f"{source}: {key} must be an integer in [1, {MAX_DIM}], got {value!r}")
        dims[key] = value
    if dims["num_attention_heads"] % dims["num_key_value_heads"]:
        raise InputError(f"{source}: num_attention_heads {dims['num_attention_heads']} is not a multiple of "
                         f"num_key_value_heads {dims['num_key_value_heads']}")
    dtype = config.get("torch_dtype", config.get("dtype", "bfloat16"))
    if dtype not in DTYPE_BYTES:
        raise InputError(f"{source}: torch_dtype {str(dtype)[:24]!r} is not one of {', '.join(DTYPE_BYTES)}")
    return ModelShape(name=name, **dims, param_bytes=DTYPE_BYTES[dtype],
                      tie_word_embeddings=bool(config.get("tie_word_embeddings", False)))


def _json(path, what: str):
    text = read_text(path, limit=1 << 22, what=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None


def read_config(path) -> ModelShape:
    """A Hugging Face config.json (named after its folder, or the file)."""
    p = Path(path)
    return shape_of(_json(path, "model config"), p.parent.name if p.name == "config.json" and p.parent.name else p.stem,
                    str(path))


def gpu_of(data: dict, name: str, source: str) -> Gpu:
    if not isinstance(data, dict):
        raise InputError(f"{source}: a GPU is an object of {', '.join(GPU_KEYS)}")
    unknown = sorted(set(data) - set(GPU_KEYS) - {"source"})
    if unknown:
        raise InputError(f"{source}: unknown key {unknown[0]!r} (keys: {', '.join(GPU_KEYS)}, source)")
    missing = [k for k in GPU_KEYS if k not in data]
    if missing:
        raise InputError(f"{source}: missing key {missing[0]!r} (keys: {', '.join(GPU_KEYS)})")
    return Gpu(name, _number(data["peak_flops"], "peak_flops", source),
               _number(data["hbm_bytes_per_s"], "hbm_bytes_per_s", source),
               int(_number(data["memory_bytes"], "memory_bytes", source, integer=True)), str(data.get("source", "")))


def _presets() -> dict:
    return json.loads(resources.files("vtc_jax.servers").joinpath("presets/roofline.json").read_text())


def model_presets() -> dict[str, ModelShape]:
    return {n: shape_of(c, n, "presets/roofline.json") for n, c in _presets()["models"].items()}


def gpu_presets() -> dict[str, Gpu]:
    return {n: gpu_of(g, n, "presets/roofline.json") for n, g in _presets()["gpus"].items()}


def model_shape(text: str) -> ModelShape:
    """--roofline: a preset's name, a config.json's path or the folder that holds it."""
    known = model_presets()
    if text in known:
        return known[text]
    if Path(text).is_dir() and (Path(text) / "config.json").is_file():
        return read_config(Path(text) / "config.json")
    if text.endswith(".json") or Path(text).exists():
        return read_config(text)
    raise InputError(f"--roofline {text!r}: not a preset ({', '.join(known)}) nor a config.json file")


def gpu(text: str | None) -> Gpu:
    """--gpu: a preset's name (any case) or a JSON file of GPU_KEYS."""
    text = DEFAULT_GPU if text is None else text
    known = {n.lower(): g for n, g in gpu_presets().items()}
    if text.lower() in known:
        return known[text.lower()]
    if text.endswith(".json") or Path(text).exists():
        return gpu_of(_json(text, "GPU"), Path(text).stem, text)
    raise InputError(f"--gpu {text!r}: not a preset ({', '.join(gpu_presets())}) nor a JSON file of "
                     f"{', '.join(GPU_KEYS)}")


def efficiency(value, what: str) -> Fraction:
    """An efficiency factor: an exact decimal in (0, 1]."""
    f = _number(value, what, "--roofline-efficiency")
    if f > 1:
        raise InputError(f"--roofline-efficiency: {what} efficiency must be in (0, 1], got {value}")
    return f


def _round(x: Fraction) -> str:
    n = round(x * 10**DECIMALS)  # half-even
    return f"{Decimal(n).scaleb(-DECIMALS):f}"


def unit_forms(shape: ModelShape, g: Gpu, tp: int = 1) -> tuple[dict, dict]:
    """The compute and memory forms at efficiency 1, exact Fractions of us per feature."""
    if tp < 1 or shape.num_attention_heads % tp or (shape.num_key_value_heads % tp and tp % shape.num_key_value_heads):
        raise InputError(f"--tensor-parallel-size {tp}: {shape.name}'s {shape.num_attention_heads} attention heads and "
                         f"{shape.num_key_value_heads} KV heads must split evenly across {tp} GPUs")
    flop_us, byte_us = Fraction(10**6) / g.peak_flops, Fraction(10**6) / g.hbm_bytes_per_s  # us per FLOP / per byte
    attention = 4 * shape.num_hidden_layers * shape.num_attention_heads * shape.head_dim
    compute = {"per_prefill_token": Fraction(2 * shape.layer_matmul_params, tp) * flop_us,
               "per_decode_token": Fraction(2 * shape.streamed_params, tp) * flop_us,
               "per_prefill_context": Fraction(attention, tp) * flop_us,
               "per_decode_context": Fraction(attention, tp) * flop_us}
    kv = shape.kv_bytes_per_token(tp) * byte_us
    memory = {"per_step": Fraction(shape.streamed_params * shape.param_bytes, tp) * byte_us,
              "per_prefill_token": kv, "per_decode_token": kv, "per_decode_context": kv,
              "per_prefill_context": kv / QUERY_TILE}
    return compute, memory


def num_gpu_blocks(shape: ModelShape, g: Gpu, tp: int = 1, block_size: int = 16,
                   gpu_memory_utilization="0.9") -> int:
    """vLLM V1's pool: floor((memory x utilization - weights per GPU) / block bytes), the
    null block included (no activation or CUDA-graph memory is subtracted)."""
    util = _number(gpu_memory_utilization, "gpu_memory_utilization", "--gpu-memory-utilization")
    if util > 1:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    free = g.memory_bytes * util - Fraction(shape.param_count * shape.param_bytes, tp)
    blocks = int(free // (block_size * shape.kv_bytes_per_token(tp))) if free > 0 else 0
    if blocks < 2:
        raise InputError(f"{shape.name} on {tp} x {g.name} at utilization {float(util):g}: the weights leave no KV "
                         "blocks (give a larger --tensor-parallel-size or --gpu-memory-utilization)")
    return min(blocks, step_time.INT32_MAX // 4)


def roofline_dict(shape: ModelShape, g: Gpu, compute_efficiency=1, memory_efficiency=1, tp: int = 1,
                  block_size: int = 16, gpu_memory_utilization="0.9", a0: int = 0) -> dict:
    """The step-time JSON object (step_time.from_dict: `max_of` [compute, memory], each
    coefficient DECIMALS decimals of a us), a0, num_gpu_blocks and its source."""
    ec, em = efficiency(compute_efficiency, "compute"), efficiency(memory_efficiency, "memory")
    compute, memory = unit_forms(shape, g, tp)
    forms = [{k: _round(v / e) for k, v in form.items()} for form, e in ((compute, ec), (memory, em))]
    return {"max_of": forms, "a0": a0,
            "num_gpu_blocks": num_gpu_blocks(shape, g, tp, block_size, gpu_memory_utilization),
            "source": f"roofline: {shape.name} on {tp} x {g.name}, efficiency compute {_plain(ec)} memory {_plain(em)}, "
                      f"block size {block_size}, gpu_memory_utilization {gpu_memory_utilization}"}


def _plain(f: Fraction) -> str:
    return f"{Decimal(f.numerator) / Decimal(f.denominator):f}"


def model_name(shape: ModelShape, g: Gpu, tp: int = 1) -> str:
    """e.g. llama-3.1-8b-h100-roofline (-tp2): an H100/H200 name takes vLLM's H100 defaults."""
    return f"{shape.name}-{g.name.lower()}-roofline" + (f"-tp{tp}" if tp > 1 else "")


def roofline_model(shape: ModelShape, g: Gpu, compute_efficiency=1, memory_efficiency=1, tp: int = 1,
                   block_size: int = 16, gpu_memory_utilization="0.9", a0: int = 0) -> step_time.StepTime:
    data = roofline_dict(shape, g, compute_efficiency, memory_efficiency, tp, block_size, gpu_memory_utilization, a0)
    return step_time.from_dict(data, model_name(shape, g, tp), "roofline")
