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


# ----------------------------------------------------------------------------------------
# Tail requeue (SGLang's retraction): a victim goes to the TAIL of the waiting queue, behind
# every request waiting when it left and ahead of every later arrival.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tails:
    """Per client a FIFO ring of D requeued requests (a server with `requeue_to_tail`).

    index, generated int32[K, D] as in Stacks; at int32[K, D] the step whose end requeued it
    (it waits behind every request that arrived by then); seq int32[K, D] its number among
    the lane's requeues (victims of one step in the server's order); front, depth int32[K];
    from_tail bool[K]: the client's next request is its ring's front (its FIFO is empty, or
    its FIFO head arrived after the front was requeued); count int32[] requeues so far.
    The ring's front sorts in the lane's one waiting order as (at, R + seq) against a FIFO
    head's (arrival, ORDER) (R: the workload's rows): `order_keys`."""

    index: jax.Array
    generated: jax.Array
    at: jax.Array
    seq: jax.Array
    front: jax.Array
    depth: jax.Array
    from_tail: jax.Array
    count: jax.Array


def init_tails(num_clients: int, depth: int) -> Tails:
    zeros = jnp.zeros((num_clients, depth), I32)
    return Tails(index=zeros, generated=zeros, at=zeros, seq=zeros, front=jnp.zeros(num_clients, I32),
                 depth=jnp.zeros(num_clients, I32), from_tail=jnp.zeros(num_clients, bool), count=jnp.zeros((), I32))


def _front(q: Tails, field: jax.Array) -> jax.Array:
    return field[jnp.arange(q.front.shape[0]), q.front]


def fronts(q: Tails):
    """(index, generated, at, seq) int32[K] at each ring's front (meaningful where depth > 0)."""
    return _front(q, q.index), jnp.where(q.depth > 0, _front(q, q.generated), 0), _front(q, q.at), _front(q, q.seq)


def push_tail(q: Tails, mask, client, index, generated, step, fifo_empty):
    """Entries i (in order) where mask[i] join their clients' rings at the back, requeued at
    the end of `step` (int32[]); fifo_empty bool[K]: the client's FIFO holds no arrived
    request (its next request is then the ring's front). Returns (tails, overflow bool[])."""
    k, d = q.index.shape
    s = client.shape[0]
    earlier = (client[:, None] == client[None, :]) & mask[None, :] & jnp.tri(s, k=-1, dtype=bool)
    safe = jnp.clip(client, 0, k - 1)
    place = q.depth[safe] + earlier.sum(axis=1, dtype=I32)
    ok = mask & (place < d)
    c = jnp.where(ok, client, k)
    p = jnp.where(ok, (q.front[safe] + place) % d, 0)
    seq = q.count + jnp.cumsum(mask.astype(I32)) - 1
    mine = ((client[None, :] == jnp.arange(k)[:, None]) & mask[None, :]).sum(axis=1, dtype=I32)
    return Tails(index=q.index.at[c, p].set(index, mode="drop"), generated=q.generated.at[c, p].set(generated, mode="drop"),
                 at=q.at.at[c, p].set(jnp.broadcast_to(step, (s,)).astype(I32), mode="drop"),
                 seq=q.seq.at[c, p].set(seq, mode="drop"), front=q.front, depth=jnp.minimum(q.depth + mine, d),
                 from_tail=q.from_tail | ((mine > 0) & fifo_empty),
                 count=q.count + mask.sum(dtype=I32)), (mask & (place >= d)).any()


def pop_tail(q: Tails, take) -> Tails:
    """The front off the rings where take int32[K] is 1 (and the ring is not empty)."""
    take = jnp.where(q.depth > 0, take, 0)
    return dataclasses.replace(q, front=(q.front + take) % q.index.shape[1], depth=q.depth - take)


def order_keys(q: Tails, heads_arrival, heads_order, num_rows: int):
    """int32[K, 2]: each client's next request's place in the lane's one waiting order,
    (arrival, ORDER) for a FIFO head, (requeue step, R + seq) for a ring's front (compared as
    core/wide.WIDE pairs: lexicographically)."""
    _, _, at, seq = fronts(q)
    first = jnp.where(q.from_tail, at, heads_arrival)
    second = jnp.where(q.from_tail, num_rows + seq, heads_order)
    return jnp.stack([first.astype(I32), second.astype(I32)], axis=-1)
