"""vtc_jax/core/once.py: the values come back unchanged, and `once_for` picks the buffer by K."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.core.once import ONCE_CLIENTS, as_is, once, once_for
from vtc_jax.policies.base import SCATTER_CLIENTS


def _values(x):
    return x * 3 - 7, x > 4, (x % 5)[:2], jnp.sum(x)


@pytest.mark.parametrize("keep", [once, as_is, once_for(2), once_for(87)])
def test_values_unchanged_under_jit_and_vmap(keep):
    x = jnp.asarray(np.random.default_rng(0).integers(-1000, 1000, (6, 9)), jnp.int32)
    want = jax.vmap(_values)(x)
    got = jax.jit(jax.vmap(lambda r: keep(*_values(r))))(x)
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_array_equal(np.asarray(w), np.asarray(g))
    single = jax.jit(lambda r: keep(r + 1))(x[0])
    np.testing.assert_array_equal(np.asarray(single), np.asarray(x[0] + 1))


def test_once_for_threshold():
    assert once_for(1) is once and once_for(ONCE_CLIENTS - 1) is once
    assert once_for(ONCE_CLIENTS) is as_is and once_for(87) is as_is
    assert as_is(jnp.int32(3)) == 3 and len(as_is(jnp.int32(3), jnp.int32(4))) == 2
    # engines/quiet.py's scatter branch (K >= SCATTER_CLIENTS) stores nothing through once
    assert ONCE_CLIENTS <= SCATTER_CLIENTS
