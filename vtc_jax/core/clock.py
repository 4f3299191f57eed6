"""The clock's integer width: int32 up to 2^30 (steps or microseconds), int64 past it.

A run's clock (the engine's step, arrivals, every stamp a component keeps) is int32 while
the planner proves it stays below NARROW_LIMIT (2^30: about 17.9 minutes of microseconds,
with room for a drain and a step's length before 2^31); past it the run takes a wide clock:
the same fields as int64, under JAX's 64-bit mode (`jax.enable_x64`), entered only around
such a run, so every other run compiles and runs exactly as before. Everything but the clock
stays int32 (counts, tokens, tags: the WIDE pairs of core/wide.py), so a wide clock costs
little; its results equal the narrow clock's wherever both can run (tests/test_wide_clock.py:
the same trace shifted past 2^32 microseconds gives the same schedule, shifted).
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from vtc_jax.core.rows import ARRIVAL

NARROW_LIMIT = 1 << 30  # the longest clock an int32 run plans (arrivals and drain horizons)
WIDE_LIMIT = 1 << 40  # a wide clock's: about 12.7 days of microseconds (a day is 8.64e10)


def never(wide: bool) -> int:
    """The arrival of a row that never arrives (layout padding): int32's largest value, or
    a wide clock's 2^62 (past any horizon, and any sum of two stays in int64)."""
    return (1 << 62) if wide else (1 << 31) - 1


def dtype(wide: bool):
    """The clock's dtype: int64 for a wide clock (valid only under `context(True)`)."""
    return jnp.int64 if wide else jnp.int32


def context(wide: bool):
    """JAX's 64-bit mode for a wide clock's run (arrays made and programs traced in it keep
    int64); nothing for a narrow one. (`jax.enable_x64` in jax 0.10; older releases had it
    in jax.experimental.)"""
    if not wide:
        return contextlib.nullcontext()
    enable = getattr(jax, "enable_x64", None)
    if enable is None:
        from jax.experimental import enable_x64 as enable
    return enable(True)


def needs_wide(largest: int) -> bool:
    """A clock that reaches `largest` (the last arrival plus the drain horizon) is wide."""
    return int(largest) >= NARROW_LIMIT


def split_rows(rows):
    """(rows int32[..., 5], arrivals or None) of request rows of the clock's dtype: a wide
    clock's rows narrowed to int32 (their ARRIVAL field cut at int32's largest value, which
    nothing reads) with their arrival times apart (int64[...]); narrow rows as they are."""
    if rows.dtype == jnp.int32:
        return rows, None
    return jnp.minimum(rows, (1 << 31) - 1).astype(jnp.int32), rows[..., ARRIVAL]
