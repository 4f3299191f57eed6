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

Any bad input ends in one line `python -m sweeps.calibrate: error: ...` (naming the file
and line) and exit status 2.

  python -m sweeps.calibrate my_profile.csv --out step_time.json
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

from vtc_jax.cli.common import Parser, float_arg, guarded
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.engines.artifact import StepTime

COLUMNS = ("batch_size", "context_tokens", "prompt_tokens", "step_time_s")
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
    index = [header.index(c) for c in COLUMNS]
    rows = []
    for line, row in records:
        values = []
        for name, i in zip(COLUMNS, index):
            cell = row[i]
            shown = cell if len(cell) <= 24 else cell[:24] + "..."
            if name == "step_time_s":
                value = float(cell) if _NUMBER.match(cell) else math.nan
                if not (math.isfinite(value) and value > 0):
                    raise InputError(f"{source}: line {line}: step_time_s must be a finite number > 0, got {shown!r}")
            else:
                if not _INT.match(cell) or int(cell) > MAX_COUNT:
                    raise InputError(f"{source}: line {line}: {name} must be an integer in [0, {MAX_COUNT}], "
                                     f"got {shown!r}")
                value = float(int(cell))
            values.append(value)
        rows.append(values)
    if not rows:
        raise InputError(f"{source}: no rows (only a header)")
    return np.asarray(rows, np.float64)


def main(argv=None) -> int:
    return guarded("python -m sweeps.calibrate", lambda: _main(argv))


def _main(argv) -> int:
    parser = Parser(prog="python -m sweeps.calibrate", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="CSV: " + ", ".join(COLUMNS))
    parser.add_argument("--overhead", type=float_arg(0.0, 100.0, open_min=True), default=1.0,
                        help="fixed overhead factor (default 1)")
    parser.add_argument("--prefill-base", action="store_true", help="also fit a constant prefill term")
    parser.add_argument("--out", type=Path, default=None, help="write the coefficients as JSON (atomically)")
    args = parser.parse_args(argv)
    if args.out is not None:
        fileio.check_writable_file(args.out)
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
