"""JAX's Threefry-2x32 keys, with their random bits computed in straight-line code.

jax lowers Threefry's hash on CPU as a loop of 5 iterations (its compile time is smaller),
and XLA:CPU writes both 32-bit words of every counter to memory and reads them back in
each iteration: drawing a lane's requests spent most of its time there (2,048 lanes of
54,000 words: 0.44 s of bits a device, 0.09 s unrolled). `KEY_IMPL` is the same PRNG as
jax's default `threefry2x32` (same seed, split and fold_in; with
`jax_threefry_partitionable`, the default since jax 0.5, the same bits for every shape),
whose `random_bits` is the hash's 20 rounds written out, so that XLA fuses them into one
pass. Every distribution (`jax.random.uniform`, `exponential`, `randint`, `gamma` ...)
draws through `random_bits`, so a key of `KEY_IMPL` gives exactly the values a default
key with the same data gives (tests/test_threefry.py checks both, bit for bit).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import random as jax_random

U32 = np.uint32
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = U32(0x1BD11BDA)  # Threefry's key-schedule constant


def _rotate_left(x: jax.Array, bits: int) -> jax.Array:
    return (x << U32(bits)) | (x >> U32(32 - bits))


def hash_2x32(key: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds (Salmon et al., SC '11) of counters (x0, x1): uint32[...]
    each, under `key` uint32[2]; returns the two uint32[...] words."""
    schedule = (key[0], key[1], key[0] ^ key[1] ^ _PARITY)
    x0, x1 = x0 + schedule[0], x1 + schedule[1]
    for block in range(5):
        for bits in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = x0 ^ _rotate_left(x1, bits)
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + U32(block + 1)
    return x0, x1


def _counters(shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """The element index of every position of `shape` as (high, low) uint32 words."""
    size = int(np.prod(shape, dtype=np.int64))
    if size >= 2 ** 32:
        raise ValueError(f"random bits of {size} elements: at most 2^32 - 1 per draw")
    return jnp.zeros(shape, U32), lax.iota(U32, size).reshape(shape)


def random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    """jax's partitionable Threefry bits of `bit_width` (8, 16, 32 or 64) for `shape`, from
    key data uint32[2]: each element hashes its own index."""
    if not jax.config.jax_threefry_partitionable:  # the legacy layout: jax's own code
        return jax_random.threefry_prng_impl.random_bits(key, bit_width, shape)
    if bit_width not in (8, 16, 32, 64):
        raise TypeError(f"random bits of width {bit_width}: 8, 16, 32 or 64")
    high, low = hash_2x32(key, *_counters(tuple(shape)))
    if bit_width == 64:
        return (high.astype(np.uint64) << np.uint64(32)) | low.astype(np.uint64)
    bits = high ^ low
    return bits if bit_width == 32 else bits.astype(np.dtype(f"uint{bit_width}"))


_threefry = jax_random.threefry_prng_impl
KEY_IMPL = jax_random.define_prng_impl(
    key_shape=(2,), seed=_threefry.seed, split=_threefry.split, random_bits=random_bits,
    fold_in=_threefry.fold_in, name="threefry2x32_unrolled", tag="fry_u")


def key(seed: int) -> jax.Array:
    """What `jax.random.key(seed)` gives: on CPU a key of `KEY_IMPL` (the same values,
    drawn faster); elsewhere jax's own (its GPU lowering is already straight-line)."""
    if jax.default_backend() == "cpu":
        return jax.random.key(seed, impl=KEY_IMPL)
    return jax.random.key(seed)
