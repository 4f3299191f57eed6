"""Values an engine event computes once and many outputs read.

XLA:CPU fuses an elementwise chain into every consumer that reads it: each output array of
an event is one loop fusion, and each recomputes, per lane, the whole chain of masks and
choices it depends on. An event's cost grows with the sum of those fusions' sizes, so a
chain read by ten outputs costs ten times. An optimization barrier does not stop this (the
CPU compiler removes it before fusion). A dynamic-update-slice does: `once` writes a value
into a buffer one entry longer, at an offset the compiler cannot prove to be 0, and reads
it back, so the chain runs in one fusion and its consumers load the result. The values
are unchanged (the offset is 0); only where they are computed moves.

Under vmap the offset is per lane, so the write is a scatter over every stored value, and
the buffers split the event into more kernels. With many clients, where the stored values
are K-sized, that costs more than the recomputation it saves: `once_for(K)` is `once`
below ONCE_CLIENTS clients and hands the values back as they are from there
(benchmarks/HISTORY.md: an event at K = 87 took 1,440-1,640 ns per lane without the
buffers against 2,170-2,450 with them; at K = 2 and 5, 540 and 650 with them against 650
and 820 without; equal at K = 9).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ONCE_CLIENTS = 8  # from this many clients an event runs faster without the buffers


def once(*values: jax.Array):
    """`values` (int32 or bool arrays, any shapes) unchanged, each computed once (all of
    them through one buffer: one more kernel per call)."""
    flat = [v.reshape(-1).astype(jnp.int32) for v in values]
    joined = jnp.concatenate(flat)
    zero = joined[0] & 0  # 0, but not a constant
    stored = jax.lax.dynamic_update_slice(jnp.zeros(joined.shape[0] + 1, jnp.int32), joined, (zero,))
    out, at = [], 0
    for v, f in zip(values, flat):
        out.append(stored[at:at + f.shape[0]].reshape(v.shape).astype(v.dtype))
        at += f.shape[0]
    return out[0] if len(out) == 1 else tuple(out)


def as_is(*values: jax.Array):
    """`values` unchanged (`once`'s signature, no buffer)."""
    return values[0] if len(values) == 1 else values


def once_for(num_clients: int):
    """`once` for an event of `num_clients` clients below ONCE_CLIENTS, else `as_is`."""
    return once if num_clients < ONCE_CLIENTS else as_is
