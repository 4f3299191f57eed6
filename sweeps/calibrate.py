"""Fit the artifact profile's step-time model (vtc_jax.artifact.StepTime) to a profile of
your own engine.

Input: a CSV with columns batch_size, context_tokens, prompt_tokens, step_time_s (one row
per measured step; a header row is required). A row with prompt_tokens > 0 is a prefill
step (prompt_tokens: the input tokens prefilled in it); a row with prompt_tokens == 0 is
a decode step (batch_size running requests holding context_tokens in all).

Model (divided by the fixed --overhead, default 1: the coefficients then include it):
  prefill: t / overhead = prefill_base + prefill_per_token * prompt_tokens
  decode : t / overhead = decode_base + decode_per_request * batch_size
                          + decode_per_context_token * context_tokens
Both are ordinary least squares (numpy.linalg.lstsq); --no-prefill-base forces
prefill_base = 0 as in the A10G fit. Prints the coefficients, each fit's R^2 and RMS
relative error, and writes them as JSON (--out) for `sweeps.paper --step-time`.

  python -m sweeps.calibrate my_profile.csv --out step_time.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from vtc_jax.artifact import StepTime

COLUMNS = ("batch_size", "context_tokens", "prompt_tokens", "step_time_s")


def fit(rows: np.ndarray, overhead: float = 1.0, prefill_base: bool = False) -> StepTime:
    """Least-squares StepTime from rows float[n, 4] (COLUMNS order)."""
    rows = np.asarray(rows, np.float64)
    if rows.ndim != 2 or rows.shape[1] != 4:
        raise ValueError(f"expected rows of {COLUMNS}")
    if not np.isfinite(rows).all() or (rows < 0).any():
        raise ValueError("every value must be a finite number >= 0")
    prefill = rows[rows[:, 2] > 0]
    decode = rows[rows[:, 2] == 0]
    if len(decode) < 3 or len(prefill) < (2 if prefill_base else 1):
        raise ValueError("need >= 3 decode rows (prompt_tokens == 0) and >= 1 prefill row")
    y = prefill[:, 3] / overhead
    a = np.column_stack([np.ones(len(prefill)), prefill[:, 2]]) if prefill_base else prefill[:, 2:3]
    pc = np.linalg.lstsq(a, y, rcond=None)[0]
    pb, pt = (pc[0], pc[1]) if prefill_base else (0.0, pc[0])
    a = np.column_stack([np.ones(len(decode)), decode[:, 0], decode[:, 1]])
    dc = np.linalg.lstsq(a, decode[:, 3] / overhead, rcond=None)[0]
    return StepTime(prefill_base=float(pb), prefill_per_token=float(pt), decode_base=float(dc[0]),
                    decode_per_request=float(dc[1]), decode_per_context_token=float(dc[2]), overhead=overhead)


def predict(st: StepTime, rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, np.float64)
    pre = st.prefill_base + st.prefill_per_token * rows[:, 2]
    dec = st.decode_base + st.decode_per_request * rows[:, 0] + st.decode_per_context_token * rows[:, 1]
    return st.overhead * np.where(rows[:, 2] > 0, pre, dec)


def read_csv(path: Path) -> np.ndarray:
    data = np.genfromtxt(path, delimiter=",", names=True)
    missing = [c for c in COLUMNS if c not in (data.dtype.names or ())]
    if missing:
        raise ValueError(f"{path}: missing columns {missing} (need {', '.join(COLUMNS)})")
    return np.column_stack([np.atleast_1d(data[c]) for c in COLUMNS])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="CSV: " + ", ".join(COLUMNS))
    parser.add_argument("--overhead", type=float, default=1.0, help="fixed overhead factor (default 1)")
    parser.add_argument("--prefill-base", action="store_true", help="also fit a constant prefill term")
    parser.add_argument("--out", type=Path, default=None, help="write the coefficients as JSON")
    args = parser.parse_args(argv)
    try:
        if not args.overhead > 0:
            raise ValueError("--overhead must be > 0")
        rows = read_csv(args.profile)
        st = fit(rows, args.overhead, args.prefill_base)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    pred = predict(st, rows)
    for label, mask in (("prefill", rows[:, 2] > 0), ("decode", rows[:, 2] == 0)):
        y, p = rows[mask, 3], pred[mask]
        r2 = 1 - ((y - p) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-30)
        rel = np.sqrt(np.mean(((p - y) / np.maximum(y, 1e-12)) ** 2))
        print(f"{label}: {mask.sum()} rows, R^2 {r2:.4f}, RMS relative error {100 * rel:.2f}%")
    print(json.dumps(dataclasses.asdict(st), indent=1))
    if args.out:
        args.out.write_text(json.dumps(dataclasses.asdict(st), indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
