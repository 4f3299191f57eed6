"""Exact wide integers from int32 pairs (no x64 needed).

A wide value is an int32 array whose last axis is (high, low) with 0 <= low < 2^24:
value = high * 2^24 + low, exact up to 2^55. Service totals and counters are kept this
way, so long horizons and fine-grained exact costs never wrap, while every operation
stays in int32 (x64 made the engine 1.66x slower, DESIGN.md). Only what the engine needs
is here: add a non-negative int32, compare, min/max/argmin over clients, subtract.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

I32 = jnp.int32
LOW_BITS = 24
LOW_MASK = (1 << LOW_BITS) - 1
MAX_ADD = (1 << 31) - (1 << LOW_BITS) - 1  # largest int32 addend that cannot overflow `low`
MAX_HIGH = np.iinfo(np.int32).max


def zeros(shape=()) -> jnp.ndarray:
    return jnp.zeros(tuple(shape) + (2,), I32)


def add(a: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
    """a + x for 0 <= x <= MAX_ADD (int32, broadcast against a's value shape)."""
    low = a[..., 1] + x
    return jnp.stack([a[..., 0] + (low >> LOW_BITS), low & LOW_MASK], axis=-1)


def sub(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """a - b (any sign; the result's high word carries it)."""
    low = a[..., 1] - b[..., 1]
    borrow = (low < 0).astype(I32)
    return jnp.stack([a[..., 0] - b[..., 0] - borrow, low + borrow * (1 << LOW_BITS)], axis=-1)


def less(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    return (a[..., 0] < b[..., 0]) | ((a[..., 0] == b[..., 0]) & (a[..., 1] < b[..., 1]))


def maximum(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    return jnp.where(less(a, b)[..., None], b, a)


def where(cond: jnp.ndarray, a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    return jnp.where(cond[..., None], a, b)


def argmin(a: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Index of the smallest masked value of a 1-D wide array (first on ties; 0 if none)."""
    high = jnp.where(mask, a[:, 0], MAX_HIGH)
    tied = mask & (a[:, 0] == high.min())
    return jnp.argmin(jnp.where(tied, a[:, 1], MAX_HIGH))


def min_of(a: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
    """Smallest (masked) value of a 1-D wide array."""
    mask = jnp.ones(a.shape[0], bool) if mask is None else mask
    return a[argmin(a, mask)]


def max_of(a: jnp.ndarray) -> jnp.ndarray:
    """Largest value of a 1-D wide array."""
    high = a[:, 0].max()
    return jnp.stack([high, jnp.where(a[:, 0] == high, a[:, 1], -1).max()])


def to_int(a) -> np.ndarray:
    """Host: exact Python ints (object array) of a wide array."""
    a = np.asarray(a, dtype=np.int64)
    out = np.empty(a.shape[:-1], dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = (int(a[idx + (0,)]) << LOW_BITS) + int(a[idx + (1,)])
    return out


def to_float(a) -> np.ndarray:
    """Host: float64 of a wide array (exact below 2^53)."""
    a = np.asarray(a, dtype=np.int64)
    return (a[..., 0] * float(1 << LOW_BITS) + a[..., 1]).astype(np.float64)
