"""vtc_jax/inputs/threefry.py: keys of KEY_IMPL draw exactly what jax's default keys draw."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.driver.lane_workloads import generate_workloads
from vtc_jax.driver.run import _traffic_sources, traffic_config
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs import threefry
from vtc_jax.inputs.traffic import overload

SEEDS = (0, 1, 7, 12345, 2 ** 31 - 1)

DRAWS = {
    "bits8": lambda k: jax.random.bits(k, (13,), jnp.uint8),
    "bits16": lambda k: jax.random.bits(k, (3, 5), jnp.uint16),
    "bits32": lambda k: jax.random.bits(k, (3, 2, 101), jnp.uint32),
    "scalar": lambda k: jax.random.bits(k, (), jnp.uint32),
    "uniform": lambda k: jax.random.uniform(k, (4, 257)),
    "exponential": lambda k: jax.random.exponential(k, (77,)),
    "randint": lambda k: jax.random.randint(k, (5, 9), 3, 900),
    "loggamma": lambda k: jax.random.loggamma(k, jnp.array([0.05, 0.3, 2.5, 9.0])),
    "normal": lambda k: jax.random.normal(k, (33,)),
    "split": lambda k: jax.random.key_data(jax.random.split(k, 3)),
    "fold_in": lambda k: jax.random.key_data(jax.random.fold_in(k, 99)),
}


def _pair(seed):
    return jax.random.key(seed), jax.random.key(seed, impl=threefry.KEY_IMPL)


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_every_draw_equals_jax_default(name):
    draw = DRAWS[name]
    for seed in SEEDS:
        default, fast = _pair(seed)
        a, b = np.asarray(draw(default)), np.asarray(draw(fast))
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b, err_msg=f"{name}, seed {seed}")


def test_hash_against_jax_primitive():
    """The hash itself, on counters that are not an iota (high words non-zero too)."""
    rng = np.random.default_rng(0)
    key = rng.integers(0, 2 ** 32, 2, dtype=np.uint32)
    x0, x1 = (rng.integers(0, 2 ** 32, 1000, dtype=np.uint32) for _ in range(2))
    want = jax.extend.random.threefry2x32_p.bind(jnp.uint32(key[0]), jnp.uint32(key[1]), jnp.asarray(x0), jnp.asarray(x1))
    got = threefry.hash_2x32(jnp.asarray(key), jnp.asarray(x0), jnp.asarray(x1))
    for w, g in zip(want, got):
        np.testing.assert_array_equal(np.asarray(w), np.asarray(g))


def test_batched_and_jitted_keys():
    seeds = jnp.arange(6, dtype=jnp.uint32)
    draw = jax.jit(jax.vmap(lambda k: jax.random.uniform(k, (3, 50))))
    default = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(5), s))(seeds)
    fast = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(5, impl=threefry.KEY_IMPL), s))(seeds)
    np.testing.assert_array_equal(np.asarray(draw(default)), np.asarray(draw(fast)))


def test_generated_requests_equal_default_keys(monkeypatch):
    """A sweep's lanes (lane_keys: KEY_IMPL on CPU) hold the requests jax's default keys
    give: the traces did not change."""
    traffic = overload([0.9, 0.3, 0.05], 700)
    srcs = _traffic_sources([traffic] * 4)
    config = traffic_config([traffic] * 4, [Settings("vtc", 4096)] * 4)
    fast = generate_workloads(srcs, [0, 3, 11, 2 ** 20], config)
    monkeypatch.setattr(threefry, "key", jax.random.key)
    default = generate_workloads(srcs, [0, 3, 11, 2 ** 20], config)
    for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(default)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(np.asarray(fast.num_requests).min()) > 0


def test_key_impl_on_cpu():
    assert jax.random.key_impl(threefry.key(3)) == threefry.KEY_IMPL
