"""core.over_clients: the folded reductions equal numpy's, at every K around the fold's
width and past it, for int32 extremes and booleans, under vmap and on leading axes; and
above the width the compiled program holds no reduce-window (the slow form it avoids)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.core import over_clients

SIZES = [1, 2, 31, 32, 33, 63, 64, 65, 87, 96, 130, 257]


def _ints(rng, shape):
    """int32 values with the type's extremes and many ties."""
    x = rng.integers(-5, 5, size=shape).astype(np.int64) * (1 << 28)
    x[rng.random(shape) < 0.05] = np.iinfo(np.int32).max
    x[rng.random(shape) < 0.05] = np.iinfo(np.int32).min
    return np.clip(x, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)


@pytest.mark.parametrize("k", SIZES)
def test_integer_reductions_equal_numpy(k):
    rng = np.random.default_rng(k)
    x = _ints(rng, (7, k))
    small = rng.integers(-1000, 1000, size=(7, k)).astype(np.int32)
    np.testing.assert_array_equal(over_clients.smallest(jnp.asarray(x)), x.min(axis=-1))
    np.testing.assert_array_equal(over_clients.largest(jnp.asarray(x)), x.max(axis=-1))
    np.testing.assert_array_equal(over_clients.first_argmin(jnp.asarray(x)), x.argmin(axis=-1))
    np.testing.assert_array_equal(over_clients.total(jnp.asarray(small)), small.sum(axis=-1))
    # wrapping as jnp.sum wraps in int32
    np.testing.assert_array_equal(over_clients.total(jnp.asarray(x)), jnp.sum(jnp.asarray(x), axis=-1))


@pytest.mark.parametrize("k", SIZES)
def test_any_of_equals_numpy(k):
    rng = np.random.default_rng(100 + k)
    b = rng.random((9, k)) < 0.02
    b[0] = False
    b[1, -1] = True  # only the last entry (in the padded slice past the width)
    np.testing.assert_array_equal(over_clients.any_of(jnp.asarray(b)), b.any(axis=-1))


@pytest.mark.parametrize("k", [33, 87])
def test_vmapped_and_jitted_equal_numpy(k):
    rng = np.random.default_rng(k)
    x = _ints(rng, (16, k))
    got = jax.jit(jax.vmap(lambda row: (over_clients.smallest(row), over_clients.first_argmin(row),
                                        over_clients.largest(row))))(jnp.asarray(x))
    np.testing.assert_array_equal(got[0], x.min(axis=-1))
    np.testing.assert_array_equal(got[1], x.argmin(axis=-1))
    np.testing.assert_array_equal(got[2], x.max(axis=-1))


def test_first_argmin_takes_the_first_of_tied_minima():
    x = jnp.asarray([5] * 40 + [1] + [3] * 20 + [1] * 30, jnp.int32)
    assert int(over_clients.first_argmin(x)) == 40
    assert int(over_clients.first_argmin(jnp.full(87, 7, jnp.int32))) == 0


def test_no_reduce_window_above_the_width():
    x = jnp.zeros((256, 87), jnp.int32)
    folded = jax.jit(lambda a: over_clients.smallest(a)).lower(x).compile().as_text()
    assert "reduce-window" not in folded
