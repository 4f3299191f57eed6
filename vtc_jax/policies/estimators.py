"""Cost estimators: a prediction of a request's output length, for the policies that must
charge (or order) before the output is known (drr, wfq, sfq, vtc_predict, vtc_gateway).

  exact   : the true output (an oracle).
  fixed   : one guess g for every request (llm-d's gateway VTC uses 128).
  average : per client, 0 until its first completion, then its first observed output, then
            round((4 * old + actual) / 5) after each completion (the VTC artifact's
            predictor, in integers: (4 * old + actual + 2) // 5; completions of one step are
            applied in admission order).
  noisy   : the truth with a uniform relative error of up to +-r:
            max(1, output + round(float32(output * (2j + 1 - 256)) * float32(r) / 256)),
            j = the low 8 bits of a hash of the seed, the request's client and its position
            among that client's accepted requests in (arrival, number) order (one rejected
            by an RPM limit never reaches the server), so 256 symmetric levels
            in [-r * 255/256, r * 255/256]. One float32 product and an
            exact division by 256: a float32 reference reproduces it bit for bit.

The state (per client moving average) lives in the engine; `estimate` is a pure function
of a request's row, its client and that state.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

ESTIMATORS = ("exact", "fixed", "average", "noisy")
EXACT, FIXED, AVERAGE, NOISY = range(4)
I32, U32 = jnp.int32, jnp.uint32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EstimatorParams:
    """kind: int32[] (index into ESTIMATORS); guess: int32[] (fixed); error: float32[]
    (noisy r); seed: uint32[] (noisy)."""

    kind: jax.Array
    guess: jax.Array
    error: jax.Array
    seed: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EstimatorState:
    """average: int32[K] per-client moving average; seen: bool[K] a completion observed."""

    average: jax.Array
    seen: jax.Array


def encode(kind: str, guess: int, error, seed: int) -> dict:
    """Host: one lane's estimator params as numpy scalars."""
    return {"kind": np.int32(ESTIMATORS.index(kind)), "guess": np.int32(guess),
            "error": np.float32(float(error)), "seed": np.uint32(seed & 0xFFFFFFFF)}


def init(num_clients: int) -> EstimatorState:
    return EstimatorState(average=jnp.zeros(num_clients, I32), seen=jnp.zeros(num_clients, bool))


def mix32(x: jax.Array) -> jax.Array:
    """A 32-bit integer hash (lowbias32), uint32 -> uint32."""
    x = x.astype(U32)
    x = x ^ (x >> 16)
    x = x * U32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * U32(0x846CA68B)
    return x ^ (x >> 16)


def noise_level(client: jax.Array, position: jax.Array, seed: jax.Array) -> jax.Array:
    """int32 in [0, 256): the noise level j of the request at `position` of `client`'s
    requests under `seed`."""
    key = (mix32(seed) ^ client.astype(U32)) + position.astype(U32)
    return (mix32(key) & U32(255)).astype(I32)


def estimate(state: EstimatorState, params: EstimatorParams, client: jax.Array, output: jax.Array,
             position: jax.Array) -> jax.Array:
    """int32 prediction of `output` for the request at `position` of `client`'s requests
    (any shapes that broadcast)."""
    level = noise_level(client, position, params.seed)
    product = (output * (2 * level + 1 - 256)).astype(jnp.float32)
    noisy = jnp.maximum(1, output + jnp.round(product * params.error / 256.0).astype(I32))
    average = state.average[client]
    return jnp.select([params.kind == EXACT, params.kind == FIXED, params.kind == AVERAGE],
                      [output, jnp.broadcast_to(params.guess, jnp.shape(output)), average], noisy).astype(I32)


def observe(state: EstimatorState, client: jax.Array, output: jax.Array, mask: jax.Array) -> EstimatorState:
    """A completion of `client` with `output` tokens (where `mask`) updates its average."""
    old = state.average[client]
    new = jnp.where(state.seen[client], (4 * old + output + 2) // 5, output)
    return EstimatorState(average=state.average.at[client].set(jnp.where(mask, new, old)),
                          seen=state.seen.at[client].set(state.seen[client] | mask))


def reference_noise_level(client: int, position: int, seed: int) -> int:
    """Pure-Python `noise_level` (for literal references)."""
    def mix(x):
        x &= 0xFFFFFFFF
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)
    return mix((mix(seed) ^ client) + position) & 255


def reference_estimate(kind: str, output: int, client: int, position: int, *, guess: int, error, seed: int,
                       average: int) -> int:
    """Pure-Python `estimate` (numpy float32 for the noisy product)."""
    if kind == "exact":
        return output
    if kind == "fixed":
        return guess
    if kind == "average":
        return average
    level = reference_noise_level(client, position, seed)
    product = np.float32(output * (2 * level + 1 - 256))
    shift = np.round(product * np.float32(float(error)) / np.float32(256.0))
    return max(1, output + int(shift))
