"""llm-d's default endpoint picker (`llm-d/llm-d-router@ebab6879`,
pkg/epp/config/loader/defaults.go): no filter; the queue, KV-cache-utilization and
prefix-cache scorers weighted 2, 2, 3; the max-score picker.

  q_r = (Wmax - W_r) / (Wmax - Wmin), 1 for every replica when all W are equal
        (scorer/queuedepth/queue.go; min and max over the candidates);
  k_r = 1 - KV_r, KV_r = kv_used_r / kv_usable_r (scorer/kvcacheutilization);
  p_r = m_r / T, 0 when T = 0 (scorer/prefix/plugin.go, matchLengthWeight 0);
  S_r = 2 clamp(q_r) + 2 clamp(k_r) + 3 clamp(p_r), clamp to [0, 1]
        (scheduling/scheduler_profile.go: `enforceScoreRange(score) * weight`, summed);
the largest S wins, ties as `base.choose` (llm-d shuffles them at random:
picker/maxscore/picker.go). m_r is the approximate prefix index's match (prefix_index.py),
and after the pick the request's blocks join the chosen replica's set (`routed`).

Float32: the score is float32 (llm-d's Go is float64), computed in the Go code's order
(0 + q w_q, + k w_k, + p w_p, each product rounded before its sum), so replicas whose terms
are equal get bit-equal scores and exact ties stay ties; scores that differ only past
float32's precision may rank differently from float64 (the literal reference computes
either: vtc_jax/testing/pickers_reference.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vtc_jax.pickers import prefix_index
from vtc_jax.pickers.base import I32, Params, Picker, Request, Shape, Snapshot, choose

F32 = jnp.float32


def init(shape: Shape, params: Params) -> prefix_index.Index:
    """An empty index: R replicas of Shape.capacity slots over Shape.num_ids ids."""
    return prefix_index.empty(shape.num_replicas, shape.capacity, shape.num_ids)


def terms(snapshot: Snapshot, matched: jax.Array, num_blocks) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(q, k, p) float32[R] each, clamped to [0, 1]: the three scorers' values (module
    docstring); W's min and max are taken over the present replicas."""
    present = snapshot.present
    w = snapshot.waiting
    big, some = jnp.iinfo(I32).max, present.any()
    w_min = jnp.where(some, jnp.min(jnp.where(present, w, big)), 0)  # no candidate: no span to wrap
    w_max = jnp.where(some, jnp.max(jnp.where(present, w, -big)), 0)
    span = jnp.maximum(w_max - w_min, 1).astype(F32)
    q = jnp.where(w_max == w_min, F32(1), (w_max - w).astype(F32) / span)
    kv = jnp.where(snapshot.kv_usable > 0, snapshot.kv_used.astype(F32) / jnp.maximum(snapshot.kv_usable, 1).astype(F32),
                   F32(0))
    k = F32(1) - kv
    p = jnp.where(num_blocks > 0, matched.astype(F32) / jnp.maximum(num_blocks, 1).astype(F32), F32(0))
    return tuple(jnp.clip(x, F32(0), F32(1)) for x in (q, k, p))


def scores(snapshot: Snapshot, matched: jax.Array, num_blocks, weights: jax.Array) -> jax.Array:
    """float32[R]: S_r in llm-d's order of operations. Each weighted term passes an
    optimization barrier so that no backend fuses a product into its sum (an FMA rounds
    once where Go and the reference round twice)."""
    q, k, p = terms(snapshot, matched, num_blocks)
    total = jnp.zeros_like(q)
    for term, weight in zip((q, k, p), (weights[0], weights[1], weights[2])):
        total = total + jax.lax.optimization_barrier(term * weight)
    return total


def pick(state: prefix_index.Index, snapshot: Snapshot, request: Request, key, params: Params):
    """(replica int32[], state): the present replica of largest S (-1 if none is present)."""
    matched = prefix_index.match(state, request.blocks, request.num_blocks)
    s = scores(snapshot, matched, request.num_blocks, params.weights)
    return max_score(s, snapshot.present, key, params.tie_random), state


def max_score(s: jax.Array, present: jax.Array, key, tie_random) -> jax.Array:
    """int32[]: llm-d's max-score picker over the present replicas (s float32[R]): the
    largest score, ties as `base.choose`; -1 if none is present."""
    best = jnp.max(jnp.where(present, s, -jnp.inf))
    return choose(present & (s == best), key, tie_random)


def routed(state: prefix_index.Index, replica, request: Request, params: Params) -> prefix_index.Index:
    """The request's blocks join `replica`'s set in order 0 .. T-1 (nothing for replica < 0)."""
    capacity = params.capacity[jnp.maximum(replica, 0)]
    return prefix_index.add(state, replica, request.blocks, request.num_blocks, capacity)


PICKER = Picker(
    name="llm-d",
    summary="llm-d's default: 2 queue + 2 KV + 3 prefix (approximate LRU index), largest wins",
    init=init,
    pick=pick,
    routed=routed,
    reads=frozenset({"waiting", "kv_used", "kv_usable", "present"}),
    request_reads=frozenset({"blocks", "num_blocks"}),
    reference="LlmdReference",
)
