"""Aggregation over seeds: mean, standard deviation, 95% confidence interval, min, max."""

from __future__ import annotations

import math

import numpy as np

# Two-sided 95% Student-t quantiles for 1..30 degrees of freedom.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042)
_Z95 = 1.959963984540054


def t95(dof: int) -> float:
    """Two-sided 95% quantile of Student's t (table to 30 dof, Cornish-Fisher beyond)."""
    if dof < 1:
        return math.nan
    if dof <= len(_T95):
        return _T95[dof - 1]
    z, v = _Z95, float(dof)
    return z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)


def summarize(values) -> dict:
    """{"mean", "std", "ci95": [lo, hi], "min", "max", "n"} of finite values over seeds.

    The interval is mean +- t95(n-1) * std / sqrt(n) (std with n-1 dof); with one value it
    is [mean, mean]. Non-finite values are dropped and counted in "dropped".
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    finite = x[np.isfinite(x)]
    n = finite.size
    if n == 0:
        return {"mean": None, "std": None, "ci95": [None, None], "min": None, "max": None, "n": 0,
                "dropped": int(x.size)}
    mean = float(finite.mean())
    std = float(finite.std(ddof=1)) if n > 1 else 0.0
    half = t95(n - 1) * std / math.sqrt(n) if n > 1 else 0.0
    out = {"mean": mean, "std": std, "ci95": [mean - half, mean + half], "min": float(finite.min()),
           "max": float(finite.max()), "n": int(n)}
    if n < x.size:
        out["dropped"] = int(x.size - n)
    return out
