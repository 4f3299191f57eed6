"""Tokens to KV blocks, shared by the vLLM servers (vllm_v1, vllm_victims, vllm_prefix).

A request that has computed n tokens holds ceil(n / block_size) blocks. XLA:CPU has no
vector integer division: a division per slot runs as a scalar loop (two of a vllm
event's costliest kernels at 1024 lanes). vLLM's block sizes are powers of two, so when
every lane's is (a static fact of the batch), the count is a shift instead; the
division stays for any other size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def ceil_div(a, b):
    """ceil(a / b) of non-negative int32 a and positive b: a truncating division (lax.div;
    `//` adds a sign correction, several ops per element under vmap)."""
    return jax.lax.div(a + (b - 1), jnp.asarray(b, a.dtype))


def block_shift(block_size: int) -> int:
    """log2(block_size) for a power of two, else -1 (host)."""
    return block_size.bit_length() - 1 if block_size > 0 and block_size & (block_size - 1) == 0 else -1


def blocks_for(tokens, block_size, shift, pow2: bool):
    """ceil(tokens / block_size) for non-negative int32 tokens; `shift` = block_shift of
    the lane's block size, used when `pow2` (static: every lane's size is a power of two)."""
    if pow2:
        return jax.lax.shift_right_arithmetic(tokens + (block_size - 1), shift)
    return ceil_div(tokens, block_size)
