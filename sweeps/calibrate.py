"""Fit the artifact profile's step-time model (vtc_jax.engines.artifact.StepTime) to a profile of
your own engine.

Input: a CSV with header batch_size,context_tokens,prompt_tokens,step_time_s (any column
order, no others; one row per measured step). A row with prompt_tokens > 0 is a prefill
step (prompt_tokens: the input tokens prefilled in it); a row with prompt_tokens == 0 is
a decode step (batch_size running requests holding context_tokens in all). batch_size,
context_tokens and prompt_tokens are integers >= 0, step_time_s a finite number > 0.

Model (divided by the fixed --overhead, default 1: the coefficients then include it):
  prefill: t / overhead = prefill_base + prefill_per_token * prompt_tokens
  decode : t / overhead = decode_base + decode_per_request * batch_size
                          + decode_per_context_token * context_tokens
Both are ordinary least squares (numpy.linalg.lstsq); --prefill-base also fits a constant
prefill term (the A10G fit has none). A coefficient the data pushes below 0 is refused
(StepTime takes only finite coefficients >= 0): measure a wider range of batch sizes and
contexts. Prints the coefficients, each fit's R^2 and RMS relative error, and writes them
as JSON (--out, written atomically) for `sweeps.paper --step-time`.

--server vllm fits the vllm server's step-time model instead (vtc_jax/servers/step_time.py:
a step lasts trunc(b0 + b1 * prefill_tokens + b2 * decode_tokens) us). Input: a CSV with
header prefill_tokens,decode_tokens and ONE of step_time_us or step_time_s (any column
order; one row per measured engine step: the prompt tokens it computed, recomputed ones
included, and the requests it decoded one token for). Ordinary least squares with an
intercept gives b0 (us per step), b1 (us per prefill token), b2 (us per decode token),
rounded to --decimals (default 2) decimals of a microsecond; a coefficient below 0 is
refused. a0 (us from arrival to the waiting queue) is no step's time: give it with --a0
(default 0); --num-gpu-blocks records the KV pool the profile was measured with. The JSON
(--out) is what `python -m vtc_jax compare LOG --server vllm --step-time FILE.json` reads.

--server vllm --roofline MODEL --gpu G fits a roofline's two efficiency factors instead
(vtc_jax/servers/roofline.py, docs/ROOFLINE.md: a step lasts max(compute / eff_c, bytes /
eff_m)). Input: a CSV with header prefill_tokens,decode_tokens,prefill_context,
decode_context and ONE of step_time_us or step_time_s (prefill_context: over the step's
prefill chunks, the sum of t c + t (t + 1) / 2 for a chunk of t tokens after c computed
ones; decode_context: over its decoding requests, the sum of prompt + generated tokens).
Each step is classed by the form that binds it, each factor fitted by least squares on its
class (no intercept), alternately until no step changes class; the factors are written
to 4 decimals and the coefficients as the roofline writes them (12 decimals of a us).

Any bad input ends in one line `python -m sweeps.calibrate: error: ...` (naming the file
and line) and exit status 2.

  python -m sweeps.calibrate my_profile.csv --out step_time.json
  python -m sweeps.calibrate --server vllm vllm_steps.csv --a0 4680 --num-gpu-blocks 67660 --out qwen.json
  python -m sweeps.calibrate --server vllm steps.csv --roofline llama-3.1-8b --gpu H100 --out roof.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
from pathlib import Path

import numpy as np

from vtc_jax.cli.common import Parser, float_arg, guarded, int_arg
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.engines.artifact import StepTime

COLUMNS = ("batch_size", "context_tokens", "prompt_tokens", "step_time_s")
VLLM_COLUMNS = ("prefill_tokens", "decode_tokens")
VLLM_TIMES = {"step_time_us": 1.0, "step_time_s": 1e6}  # column: its factor to microseconds
VLLM_KEYS = ("b0", "b1", "b2")
ROOFLINE_COLUMNS = ("prefill_tokens", "decode_tokens", "prefill_context", "decode_context")
EFFICIENCY_DECIMALS = 4
MIN_BOUND = 2  # steps each roofline form must bind for its factor to count as fitted
MAX_COUNT = 1 << 40  # batch sizes, contexts, prompts: far beyond any engine
_INT = re.compile(r"^[+]?\d{1,13}$")
_NUMBER = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,3})?$")


def fit(rows: np.ndarray, overhead: float = 1.0, prefill_base: bool = False) -> StepTime:
    """Least-squares StepTime from rows float[n, 4] (COLUMNS order). InputError if the
    rows are too few, not finite, negative, or give a coefficient that is not finite
    and >= 0."""
    rows = np.asarray(rows, np.float64)
    if rows.ndim != 2 or rows.shape[1] != 4:
        raise InputError(f"expected rows of {', '.join(COLUMNS)}")
    if not np.isfinite(rows).all() or (rows < 0).any():
        raise InputError("every value must be a finite number >= 0")
    if not (math.isfinite(overhead) and overhead > 0):
        raise InputError(f"--overhead must be a finite number > 0, got {overhead}")
    prefill = rows[rows[:, 2] > 0]
    decode = rows[rows[:, 2] == 0]
    need = 2 if prefill_base else 1
    if len(decode) < 3 or len(prefill) < need:
        raise InputError(f"need >= 3 decode rows (prompt_tokens == 0) and >= {need} prefill row(s) "
                         f"(prompt_tokens > 0); got {len(decode)} and {len(prefill)}")
    y = prefill[:, 3] / overhead
    a = np.column_stack([np.ones(len(prefill)), prefill[:, 2]]) if prefill_base else prefill[:, 2:3]
    pc = np.linalg.lstsq(a, y, rcond=None)[0]
    pb, pt = (pc[0], pc[1]) if prefill_base else (0.0, pc[0])
    a = np.column_stack([np.ones(len(decode)), decode[:, 0], decode[:, 1]])
    if np.linalg.matrix_rank(a) < 3:
        raise InputError("the decode rows do not vary enough to fit 3 coefficients (vary batch_size and "
                         "context_tokens independently)")
    dc = np.linalg.lstsq(a, decode[:, 3] / overhead, rcond=None)[0]
    coefficients = {"prefill_base": float(pb), "prefill_per_token": float(pt), "decode_base": float(dc[0]),
                    "decode_per_request": float(dc[1]), "decode_per_context_token": float(dc[2])}
    for name, value in coefficients.items():
        if not math.isfinite(value):
            raise InputError(f"the fit of {name} is not finite: the rows do not determine it")
        if value < 0:
            if value > -1e-12:  # rounding of a true zero
                coefficients[name] = 0.0
                continue
            raise InputError(f"the fit gives {name} = {value:.3g} < 0, which no engine has: measure a wider range "
                             "of batch sizes and contexts")
    return StepTime(**coefficients, overhead=overhead)


def predict(st: StepTime, rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, np.float64)
    pre = st.prefill_base + st.prefill_per_token * rows[:, 2]
    dec = st.decode_base + st.decode_per_request * rows[:, 0] + st.decode_per_context_token * rows[:, 1]
    return st.overhead * np.where(rows[:, 2] > 0, pre, dec)


def read_csv(path) -> np.ndarray:
    """The profile's rows, float64[n, 4] in COLUMNS order. InputError (file, line,
    problem) for a missing file, an empty file, a missing, unknown or repeated column, a
    row with the wrong number of fields, a count that is not an integer >= 0, a time that
    is not a finite number > 0, no rows. A `#` is an ordinary character, never a comment."""
    source = os.fspath(path)
    text = fileio.read_text(path, limit=1 << 28, what="profile")
    header, records = fileio.csv_table(text, source, COLUMNS)
    return _parse_rows(records, source, COLUMNS, [header.index(c) for c in COLUMNS], {"step_time_s": 1.0})


def _parse_rows(records, source: str, names, index, times: dict) -> np.ndarray:
    """float64[n, len(names)] of the records' cells `index` (named `names`): a name in
    `times` is a finite time > 0 (x its factor), any other an integer count in [0,
    MAX_COUNT]; InputError (file, line, problem) otherwise, or when there are no rows."""
    rows = []
    for line, row in records:
        values = []
        for name, i in zip(names, index):
            cell = row[i]
            shown = cell if len(cell) <= 24 else cell[:24] + "..."
            if name in times:
                value = float(cell) * times[name] if _NUMBER.match(cell) else math.nan
                if not (math.isfinite(value) and value > 0):
                    raise InputError(f"{source}: line {line}: {name} must be a finite number > 0, got {shown!r}")
            elif not _INT.match(cell) or int(cell) > MAX_COUNT:
                raise InputError(f"{source}: line {line}: {name} must be an integer in [0, {MAX_COUNT}], got {shown!r}")
            else:
                value = float(int(cell))
            values.append(value)
        rows.append(values)
    if not rows:
        raise InputError(f"{source}: no rows (only a header)")
    return np.asarray(rows, np.float64)


def read_vllm_csv(path, columns: tuple = VLLM_COLUMNS) -> np.ndarray:
    """A vllm step profile: float64[n, len(columns) + 1] of `columns` (default
    prefill_tokens, decode_tokens) and the step time in us. InputError (file, line,
    problem) as `read_csv`, and unless exactly one of step_time_us, step_time_s is given."""
    source = os.fspath(path)
    text = fileio.read_text(path, limit=1 << 28, what="profile")
    header, records = fileio.csv_table(text, source, columns, tuple(VLLM_TIMES))
    times = [c for c in VLLM_TIMES if c in header]
    if len(times) != 1:
        raise InputError(f"{source}: give exactly one step-time column, step_time_us or step_time_s "
                         f"(header: {','.join(header)[:200]})")
    names = columns + (times[0],)
    return _parse_rows(records, source, names, [header.index(c) for c in names], VLLM_TIMES)


def fit_vllm(rows: np.ndarray) -> dict[str, float]:
    """Least squares {b0, b1, b2} (us) of t = b0 + b1 * prefill + b2 * decode from rows
    float64[n, 3]; InputError when the rows do not determine all three or one is < 0."""
    rows = np.asarray(rows, np.float64)
    a = np.column_stack([np.ones(len(rows)), rows[:, 0], rows[:, 1]])
    if len(rows) < 3 or np.linalg.matrix_rank(a) < 3:
        raise InputError(f"the {len(rows)} rows do not determine b0, b1, b2: measure steps whose prefill_tokens and "
                         "decode_tokens vary independently (at least 3 such rows)")
    coefficients = dict(zip(VLLM_KEYS, (float(c) for c in np.linalg.lstsq(a, rows[:, 2], rcond=None)[0])))
    for name, value in coefficients.items():
        if value < 0:
            if value > -1e-9:  # rounding of a true zero
                coefficients[name] = 0.0
                continue
            raise InputError(f"the fit gives {name} = {value:.4g} us < 0, which no engine has: measure a wider range "
                             "of prefill and decode tokens per step")
    return coefficients


def vllm_model(coefficients: dict, decimals: int, a0: int, num_gpu_blocks: int | None, source: str) -> dict:
    """The JSON object `compare --step-time` reads (servers/step_time.py): b0, b1, b2 as
    exact decimal text of `decimals` places, a0, and num_gpu_blocks when given."""
    out = {k: f"{round(coefficients[k], decimals):.{decimals}f}" for k in VLLM_KEYS}
    out["a0"] = a0
    if num_gpu_blocks is not None:
        out["num_gpu_blocks"] = num_gpu_blocks
    out["source"] = source
    return out


def _main_vllm(args) -> int:
    from vtc_jax.servers import step_time

    for flag in ("overhead", "prefill_base"):
        if getattr(args, flag) != {"overhead": 1.0, "prefill_base": False}[flag]:
            raise InputError(f"--{flag.replace('_', '-')} is the artifact profile's; --server vllm fits b0 + b1 * "
                             "prefill_tokens + b2 * decode_tokens")
    rows = read_vllm_csv(args.profile)
    coefficients = fit_vllm(rows)
    data = vllm_model(coefficients, args.decimals, args.a0, args.num_gpu_blocks,
                      f"sweeps.calibrate --server vllm {Path(args.profile).name}, {len(rows)} steps")
    model = step_time.from_dict(data, "fit", str(args.profile))  # what compare --step-time will read
    b = [float(getattr(model, k)) for k in VLLM_KEYS]
    pred = b[0] + b[1] * rows[:, 0] + b[2] * rows[:, 1]
    y = rows[:, 2]
    r2, rel = _fit_quality(pred, y)
    print(f"vllm step time: {len(rows)} steps, R^2 {r2:.4f}, RMS relative error {100 * rel:.2f}% "
          f"(coefficients as written, {args.decimals} decimals of a us)")
    return _write_model(data, args.out)


def _fit_quality(pred: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(R^2, RMS relative error) of a fitted step-time model's `pred` against the steps' `y` (us)."""
    r2 = 1 - ((y - pred) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-30)
    return r2, float(np.sqrt(np.mean(((pred - y) / y) ** 2)))


def _write_model(data: dict, out) -> int:
    """Print the step-time JSON `compare --step-time` reads and write it to `out` (if given)."""
    text = json.dumps(data, indent=1)
    print(text)
    if out is not None:
        fileio.write_text_atomically(out, text + "\n")
        print(f"wrote {out}")
    return 0


def read_roofline_csv(path) -> np.ndarray:
    """A roofline step profile: float64[n, 5] of ROOFLINE_COLUMNS and the step time in us;
    InputError as `read_vllm_csv`."""
    return read_vllm_csv(path, ROOFLINE_COLUMNS)


def roofline_bases(forms: tuple, rows: np.ndarray) -> np.ndarray:
    """float64[2, n]: each form's sum (us) on each row (ROOFLINE_COLUMNS first)."""
    from vtc_jax.servers import step_time

    x = {"per_step": np.ones(len(rows)), "per_prefill_token": rows[:, 0], "per_decode_token": rows[:, 1],
         "per_prefill_context": rows[:, 2], "per_decode_context": rows[:, 3]}
    return np.stack([sum(float(c) * x[n] for n, c in zip(step_time.FEATURES, form) if c) for form in forms])


def fit_roofline(compute: np.ndarray, memory: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(eff_c, eff_m) of t = max(compute / eff_c, memory / eff_m), compute and memory the
    forms at efficiency 1: start from the tightest factors (t >= each form / its factor),
    then class each step by its binding form and fit 1 / factor by least squares (no
    intercept) on each class, until no step changes class. InputError when a form binds
    fewer than MIN_BOUND steps (its factor is then not determined) or a factor passes 1
    (faster than the peak)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.min(np.where(compute > 0, t / compute, np.inf))
        v = np.min(np.where(memory > 0, t / memory, np.inf))
    binds = None
    for _ in range(100):
        now = u * compute >= v * memory
        if binds is not None and (now == binds).all():
            break
        binds = now
        for mask, base, label in ((binds, compute, "compute"), (~binds, memory, "memory")):
            if (base[mask] > 0).sum() < MIN_BOUND:
                raise InputError(f"fewer than {MIN_BOUND} steps of the profile are {label}-bound under the fit, so the "
                                 f"{label} efficiency is not determined: measure " + (
                                     "steps with long prefills" if label == "compute" else "steps of few decodes"))
        u = float((t[binds] * compute[binds]).sum() / (compute[binds] ** 2).sum())
        v = float((t[~binds] * memory[~binds]).sum() / (memory[~binds] ** 2).sum())
    effs = (1 / u, 1 / v)
    for label, e in zip(("compute", "memory"), effs):
        if not e <= 1 + 10**-EFFICIENCY_DECIMALS:
            raise InputError(f"the fit gives a {label} efficiency of {e:.4g} > 1 (faster than the GPU's peak): check "
                             "--gpu, --tensor-parallel-size and the profile's units")
    return effs


def _main_roofline(args) -> int:
    from vtc_jax.servers import roofline, step_time

    if args.decimals is not None:
        raise InputError("--decimals applies to b0, b1, b2; a roofline writes its coefficients to "
                         f"{roofline.DECIMALS} decimals and the efficiencies to {EFFICIENCY_DECIMALS}")
    shape, gpu, tp = roofline.model_shape(args.roofline), roofline.gpu(args.gpu), args.tensor_parallel_size or 1
    rows = read_roofline_csv(args.profile)
    unit = roofline.roofline_model(shape, gpu, 1, 1, tp, args.block_size, args.gpu_memory_utilization)
    ec, em = fit_roofline(*roofline_bases(unit.forms, rows), rows[:, 4])
    effs = [f"{min(round(e, EFFICIENCY_DECIMALS), 1.0):.{EFFICIENCY_DECIMALS}f}" for e in (ec, em)]
    if min(float(e) for e in effs) <= 0:
        raise InputError(f"the fit gives efficiencies {ec:.3g}, {em:.3g}: too small to write in "
                         f"{EFFICIENCY_DECIMALS} decimals")
    data = roofline.roofline_dict(shape, gpu, effs[0], effs[1], tp, args.block_size, args.gpu_memory_utilization,
                                  args.a0)
    if args.num_gpu_blocks is not None:
        data["num_gpu_blocks"] = args.num_gpu_blocks
    data["source"] += f"; fitted by sweeps.calibrate to {Path(args.profile).name}, {len(rows)} steps"
    model = step_time.from_dict(data, "fit", str(args.profile))  # what compare --step-time will read
    pred = roofline_bases(model.forms, rows).max(0)
    y = rows[:, 4]
    r2, rel = _fit_quality(pred, y)
    bound = int((roofline_bases(model.forms, rows).argmax(0) == 0).sum())
    print(f"roofline {shape.name} on {tp} x {gpu.name}: {len(rows)} steps ({bound} compute-bound), efficiency compute "
          f"{effs[0]} memory {effs[1]}, R^2 {r2:.4f}, RMS relative error {100 * rel:.2f}%")
    return _write_model(data, args.out)


def main(argv=None) -> int:
    return guarded("python -m sweeps.calibrate", lambda: _main(argv))


def _main(argv) -> int:
    parser = Parser(prog="python -m sweeps.calibrate", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="CSV: " + ", ".join(COLUMNS) + " (--server vllm: "
                        + ", ".join(VLLM_COLUMNS) + ", step_time_us or step_time_s)")
    parser.add_argument("--server", choices=("artifact", "vllm"), default="artifact",
                        help="artifact: the paper's S-LoRA profile (default); vllm: the vllm server's b0, b1, b2")
    parser.add_argument("--overhead", type=float_arg(0.0, 100.0, open_min=True), default=1.0,
                        help="fixed overhead factor (default 1)")
    parser.add_argument("--prefill-base", action="store_true", help="also fit a constant prefill term")
    parser.add_argument("--out", type=Path, default=None, help="write the coefficients as JSON (atomically)")
    vllm = parser.add_argument_group("--server vllm")
    vllm.add_argument("--a0", type=int_arg(0, 1 << 30), default=None,
                      help="us from arrival to the waiting queue, written as a0 (default 0)")
    vllm.add_argument("--num-gpu-blocks", type=int_arg(2, (2**31 - 1) // 4), default=None,
                      help="the KV blocks the profile was measured with, written as num_gpu_blocks")
    vllm.add_argument("--decimals", type=int_arg(0, 6), default=None,
                      help="decimals of a us kept in b0, b1, b2 (default 2; more decimals shorten the longest "
                           "step the server can time exactly)")
    roof = parser.add_argument_group("--server vllm --roofline (vtc_jax/servers/roofline.py)")
    roof.add_argument("--roofline", default=None, metavar="MODEL",
                      help="fit a roofline's efficiency factors: a model preset or a config.json")
    roof.add_argument("--gpu", default=None, metavar="NAME|FILE.json", help="the roofline's GPU (default H100)")
    roof.add_argument("--tensor-parallel-size", type=int_arg(1, 64), default=None, metavar="N",
                      help="GPUs the model is split across (default 1)")
    roof.add_argument("--block-size", type=int_arg(1, 1 << 20), default=None, metavar="B",
                      help="tokens per KV block, for num_gpu_blocks (default 16)")
    roof.add_argument("--gpu-memory-utilization", default=None, metavar="U",
                      help="the fraction of GPU memory for weights and KV, for num_gpu_blocks (default 0.9)")
    args = parser.parse_args(argv)
    own = ("gpu", "tensor_parallel_size", "block_size", "gpu_memory_utilization")
    if args.roofline is None and any(getattr(args, f) is not None for f in own):
        flag = next(f for f in own if getattr(args, f) is not None)
        raise InputError(f"--{flag.replace('_', '-')} applies to --server vllm --roofline MODEL")
    if args.out is not None:
        fileio.check_writable_file(args.out)
    if args.roofline is not None and args.server != "vllm":
        raise InputError("--roofline applies to --server vllm")
    if args.server == "vllm":
        args.a0 = 0 if args.a0 is None else args.a0
        if args.roofline is not None:
            args.block_size = args.block_size or 16
            args.gpu_memory_utilization = args.gpu_memory_utilization or "0.9"
            for flag in ("overhead", "prefill_base"):
                if getattr(args, flag) != {"overhead": 1.0, "prefill_base": False}[flag]:
                    raise InputError(f"--{flag.replace('_', '-')} is the artifact profile's, not the roofline's")
            return _main_roofline(args)
        args.decimals = 2 if args.decimals is None else args.decimals
        return _main_vllm(args)
    given = [flag for flag in ("a0", "num_gpu_blocks", "decimals") if getattr(args, flag) is not None]
    if given:
        raise InputError(f"--{given[0].replace('_', '-')} applies to --server vllm")
    rows = read_csv(args.profile)
    st = fit(rows, args.overhead, args.prefill_base)
    pred = predict(st, rows)
    for label, mask in (("prefill", rows[:, 2] > 0), ("decode", rows[:, 2] == 0)):
        y, p = rows[mask, 3], pred[mask]
        r2 = 1 - ((y - p) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-30)
        rel = np.sqrt(np.mean(((p - y) / np.maximum(y, 1e-12)) ** 2))
        print(f"{label}: {mask.sum()} rows, R^2 {r2:.4f}, RMS relative error {100 * rel:.2f}%")
    text = json.dumps(dataclasses.asdict(st), indent=1, allow_nan=False)
    print(text)
    if args.out is not None:
        fileio.write_text_atomically(args.out, text + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
