"""NVIDIA Dynamo's KV router cost (`ai-dynamo/dynamo`, lib/kv-router/src/scheduling/
selector/default.rs, `DefaultWorkerSelector` at temperature 0, overlap credit 1, prefill
load scale 1, the optional queue threshold off):

  cost_r = max(0, P_r + ceil(prompt / block_size) - overlap_r) + D_r,

lowest wins, ties at random (Dynamo's reservoir draw among equal costs; here `base.choose`).
P_r, D_r and overlap_r are the fleet's (Snapshot); the cost is an exact int32. Newer Dynamo
counts the active prefill in tokens / block_size (fractional blocks); the contract, and
this picker, count whole blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vtc_jax.pickers.base import I32, Params, Picker, Request, Snapshot, choose, no_state


def costs(snapshot: Snapshot, request: Request) -> jax.Array:
    """int32[R]: cost_r (module docstring)."""
    prefill = jnp.maximum(snapshot.prefill_blocks + request.engine_blocks - snapshot.overlap, 0)
    return (prefill + snapshot.decode_blocks).astype(I32)


def pick(state, snapshot: Snapshot, request: Request, key, params: Params):
    """(replica int32[], state): the present replica of lowest cost (-1 if none is present)."""
    cost = costs(snapshot, request)
    best = jnp.min(jnp.where(snapshot.present, cost, jnp.iinfo(I32).max))
    return choose(snapshot.present & (cost == best), key, params.tie_random), state


PICKER = Picker(
    name="dynamo",
    summary="Dynamo's KV router: max(0, P + prompt blocks - overlap) + D, lowest wins",
    init=no_state,
    pick=pick,
    reads=frozenset({"prefill_blocks", "decode_blocks", "overlap", "present"}),
    request_reads=frozenset({"engine_blocks"}),
    reference="DynamoReference",
)
