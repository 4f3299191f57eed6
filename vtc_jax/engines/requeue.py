"""Preempted requests back at the front of their client's queue (servers that preempt).

The engine's queues are pointers into the workload (client k waits on rows [head_k,
arrived_k) of its block), which cannot take a request back. A server that preempts
(vLLM's recompute) hands the engine its victims at the start of a step; each goes onto its
client's stack, and a client's queue is then its stack, top first, followed by its FIFO.
Victims of one step are pushed in the server's order, so the last pushed is the first
served again (vLLM puts each victim at the front in turn). A stack holds D entries (a
static depth); a push past it is dropped and flags the lane as not finished.

Per lane: index int32[K, D] (the requests' rows in the workload, where the engine reads
them), generated int32[K, D] (tokens the request had generated when preempted: the server
recomputes them), depth int32[K]. All functions are pure and masked.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vtc_jax.servers.base import prefix_sum

I32 = jnp.int32
# Up to this many entries (slots) a push counts earlier victims as one [S, S] pass; above, a
# prefix sum over [K, S] (S^2 grows past it: the slot tiers run to 512 and beyond).
SQUARE_SLOTS = 64


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stacks:
    index: jax.Array
    generated: jax.Array
    depth: jax.Array


def init(num_clients: int, depth: int) -> Stacks:
    return Stacks(index=jnp.zeros((num_clients, depth), I32), generated=jnp.zeros((num_clients, depth), I32),
                  depth=jnp.zeros(num_clients, I32))


def tops(stacks: Stacks):
    """(index int32[K], generated int32[K]) at each stack's top (index meaningful where
    depth > 0; generated is 0 where the stack is empty)."""
    k = stacks.depth.shape[0]
    at = jnp.maximum(stacks.depth - 1, 0)
    kk = jnp.arange(k)
    held = stacks.depth > 0
    return stacks.index[kk, at], jnp.where(held, stacks.generated[kk, at], 0)


def push(stacks: Stacks, mask, client, index, generated):
    """Push entries i (in order) where mask[i]: client, index, generated int32[S].
    Returns (stacks, overflow bool[])."""
    k, d = stacks.index.shape
    s = client.shape[0]
    mine = (client[None, :] == jnp.arange(k)[:, None]) & mask[None, :]  # [K, S]
    # Each entry's place on its client's stack: the depth plus the earlier pushed entries
    # of its client, one [S, S] count (a prefix sum over [K, S] fused into its consumer was
    # recomputed per element: the costliest kernel of a vllm event).
    if s <= SQUARE_SLOTS:
        earlier = (client[:, None] == client[None, :]) & mask[None, :] & jnp.tri(s, k=-1, dtype=bool)
        pos = stacks.depth[jnp.clip(client, 0, k - 1)] + earlier.sum(axis=1, dtype=I32)
    else:  # O(K S log S), not O(S^2), for the larger slot tiers
        upto = prefix_sum(mine.astype(I32))
        pos = jnp.where(mine, stacks.depth[:, None] + upto - 1, 0).sum(axis=0, dtype=I32)
    ok = mask & (pos < d)
    c = jnp.where(ok, client, k)  # out of range: dropped
    p = jnp.where(ok, pos, 0)
    return Stacks(index=stacks.index.at[c, p].set(index, mode="drop"),
                  generated=stacks.generated.at[c, p].set(generated, mode="drop"),
                  depth=jnp.minimum(stacks.depth + mine.sum(axis=1, dtype=I32), d)), (mask & (pos >= d)).any()


def pop(stacks: Stacks, take) -> Stacks:
    """One entry off the stacks where take int32[K] is 1 (and the stack is not empty)."""
    return dataclasses.replace(stacks, depth=jnp.maximum(stacks.depth - take, 0))
