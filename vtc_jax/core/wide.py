"""Exact integers for totals, counters and tags: two interchangeable number formats.

`WIDE`: an int32 array whose last axis is (high, low) with 0 <= low < 2^24, value = high *
2^24 + low, exact up to 2^55 while every operation stays in int32 (x64 made the engine
1.66x slower, DESIGN.md). `NARROW`: a plain int32 array, exact up to 2^31 - 1. Both expose
the same operations (the engine, measures and policies call them through a `num` object),
and the planner (run.py) picks NARROW only when it has proved, before the run, that no
total, counter or tag of any lane can pass 2^30; otherwise WIDE. Same results either way,
to the integer; NARROW is about a third cheaper per event.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients

I32 = jnp.int32
LOW_BITS = 24
LOW_MASK = (1 << LOW_BITS) - 1
MAX_ADD = (1 << 31) - (1 << LOW_BITS) - 1  # largest int32 addend that cannot overflow `low`
MAX_HIGH = np.iinfo(np.int32).max
NARROW_LIMIT = 1 << 30  # a proved bound below this lets a run use NARROW


class Wide:
    """Exact to 2^55 as int32 (high, low) pairs (a trailing axis of 2)."""

    name = "wide"

    @staticmethod
    def zeros(shape=()) -> jnp.ndarray:
        return jnp.zeros(tuple(shape) + (2,), I32)

    @staticmethod
    def constant(shape, value: int) -> jnp.ndarray:
        return jnp.broadcast_to(jnp.asarray([value >> LOW_BITS, value & LOW_MASK], I32), tuple(shape) + (2,))

    @staticmethod
    def add(a, x):
        """a + x for an int32 x with |x| <= MAX_ADD (broadcast against a's value shape)."""
        low = a[..., 1] + x
        return jnp.stack([a[..., 0] + (low >> LOW_BITS), low & LOW_MASK], axis=-1)

    @staticmethod
    def sub(a, b):
        """a - b (any sign; the result's high word carries it)."""
        low = a[..., 1] - b[..., 1]
        borrow = (low < 0).astype(I32)
        return jnp.stack([a[..., 0] - b[..., 0] - borrow, low + borrow * (1 << LOW_BITS)], axis=-1)

    @staticmethod
    def less(a, b):
        return (a[..., 0] < b[..., 0]) | ((a[..., 0] == b[..., 0]) & (a[..., 1] < b[..., 1]))

    @classmethod
    def maximum(cls, a, b):
        return jnp.where(cls.less(a, b)[..., None], b, a)

    @classmethod
    def minimum(cls, a, b):
        return jnp.where(cls.less(a, b)[..., None], a, b)

    @staticmethod
    def where(cond, a, b):
        return jnp.where(jnp.asarray(cond)[..., None], a, b)

    @staticmethod
    def argmin(a, mask):
        """Index of the smallest masked value of a 1-D array (first on ties; 0 if none)."""
        high = jnp.where(mask, a[:, 0], MAX_HIGH)
        tied = mask & (a[:, 0] == over_clients.smallest(high))
        return over_clients.first_argmin(jnp.where(tied, a[:, 1], MAX_HIGH))

    @classmethod
    def min_of(cls, a, mask=None):
        mask = jnp.ones(a.shape[0], bool) if mask is None else mask
        return a[cls.argmin(a, mask)]

    @staticmethod
    def max_of(a):
        high = over_clients.largest(a[:, 0])
        return jnp.stack([high, over_clients.largest(jnp.where(a[:, 0] == high, a[:, 1], -1))])

    @staticmethod
    def broadcast(a, shape):
        """a (one value per element) broadcast to value shape `shape`."""
        return jnp.broadcast_to(a, tuple(shape) + (2,))

    @staticmethod
    def expand(a, axis: int):
        """A new value axis at `axis` (counted among value axes)."""
        return jnp.expand_dims(a, axis if axis >= 0 else axis - 1)

    @staticmethod
    def to_int(a) -> np.ndarray:
        """Host: exact Python ints (object array)."""
        a = np.asarray(a, dtype=np.int64)
        out = np.empty(a.shape[:-1], dtype=object)
        for idx in np.ndindex(out.shape):
            out[idx] = (int(a[idx + (0,)]) << LOW_BITS) + int(a[idx + (1,)])
        return out

    @staticmethod
    def to_float(a) -> np.ndarray:
        """Host: float64 (exact below 2^53)."""
        a = np.asarray(a, dtype=np.int64)
        return (a[..., 0] * float(1 << LOW_BITS) + a[..., 1]).astype(np.float64)

    @staticmethod
    def value_shape(a) -> tuple:
        return np.shape(a)[:-1]


class Narrow:
    """Plain int32 (used only when every value is proved below 2^30)."""

    name = "narrow"

    @staticmethod
    def zeros(shape=()):
        return jnp.zeros(tuple(shape), I32)

    @staticmethod
    def constant(shape, value: int):
        return jnp.full(tuple(shape), value, I32)

    @staticmethod
    def add(a, x):
        return a + x

    @staticmethod
    def sub(a, b):
        return a - b

    @staticmethod
    def less(a, b):
        return a < b

    @staticmethod
    def maximum(a, b):
        return jnp.maximum(a, b)

    @staticmethod
    def minimum(a, b):
        return jnp.minimum(a, b)

    @staticmethod
    def where(cond, a, b):
        return jnp.where(cond, a, b)

    @staticmethod
    def argmin(a, mask):
        return over_clients.first_argmin(jnp.where(mask, a, MAX_HIGH))

    @classmethod
    def min_of(cls, a, mask=None):
        return over_clients.smallest(a if mask is None else jnp.where(mask, a, MAX_HIGH))

    @staticmethod
    def max_of(a):
        return over_clients.largest(a)

    @staticmethod
    def broadcast(a, shape):
        return jnp.broadcast_to(a, tuple(shape))

    @staticmethod
    def expand(a, axis: int):
        return jnp.expand_dims(a, axis)

    @staticmethod
    def to_int(a) -> np.ndarray:
        a = np.asarray(a, dtype=np.int64)
        out = np.empty(a.shape, dtype=object)
        for idx in np.ndindex(a.shape):
            out[idx] = int(a[idx])
        return out

    @staticmethod
    def to_float(a) -> np.ndarray:
        return np.asarray(a, dtype=np.float64)

    @staticmethod
    def value_shape(a) -> tuple:
        return np.shape(a)


WIDE, NARROW = Wide(), Narrow()


def numbers(wide: bool):
    """The number format of a run (EngineConfig.wide)."""
    return WIDE if wide else NARROW


# Module-level aliases: the wide format's operations (host code and older callers).
zeros, add, sub, less, maximum, where, argmin = Wide.zeros, Wide.add, Wide.sub, Wide.less, Wide.maximum, Wide.where, Wide.argmin
min_of, max_of, to_int, to_float = Wide.min_of, Wide.max_of, Wide.to_int, Wide.to_float
