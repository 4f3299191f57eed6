"""Values an engine event computes once and many outputs read.

XLA:CPU fuses an elementwise chain into every consumer that reads it: each output array of
an event is one loop fusion, and each recomputes, per lane, the whole chain of masks and
choices it depends on. An event's cost grows with the sum of those fusions' sizes, so a
chain read by ten outputs costs ten times. An optimization barrier does not stop this (the
CPU compiler removes it before fusion). A dynamic-update-slice does: `once` writes a value
into a buffer one entry longer, at an offset the compiler cannot prove to be 0, and reads
it back, so the chain runs in one fusion and its consumers load the result. The values
are unchanged (the offset is 0); only where they are computed moves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
