"""The endpoint-picker component: how a fleet's gateway chooses a replica for a request, in
the style of optax's `GradientTransformation` (a named bundle of small pure functions over
a state of its own; parameters apart from the state).

  init(shape, params)                              -> state
  pick(state, snapshot, request, key, params)      -> (replica int32[], state)
  routed(state, replica, request, params)          -> state

`pick` chooses among the present replicas (`Snapshot.present`); `routed` records that the
request was sent to `replica` (llm-d's approximate prefix index learns from it; the other
pickers ignore it), and leaves the state as it is for `replica` < 0 (an event that routes
nothing: the fleet masks there, not by a select over the state). The fleet calls `routed`
right after the `pick` it acts on. Every
function is pure, of one lane, with static shapes (`Shape`), and jit- and vmap-able; under
the runner's vmap over lanes (core/lanes.py) the loops take bounds shared by the lanes.

Ties: every picker breaks ties between equally good replicas one way, `choose`: with
`Params.tie_random` a seeded draw (`key`: one uint32[2] PRNG key or an integer seed; the
same key gives the same pick, and over keys the pick is uniform among the tied replicas:
the fleet folds the request's index into the lane's key), else the lowest index (tests).

A picker declares what it reads (`reads`: Snapshot fields, `request_reads`: Request
fields), so the fleet computes only those; a field it does not read may hold anything of
its shape. Its literal pure-Python version lives in vtc_jax/testing/pickers_reference.py.
See docs/PICKERS.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError

I32 = jnp.int32
TIES = ("random", "lowest")


class Shape(NamedTuple):
    """Static sizes of a picker's state: R replicas, T_MAX picker blocks per request, C the
    largest index capacity of a replica (blocks), U the number of distinct picker block ids
    (ids are dense in [0, U): vtc_jax/inputs/picker_blocks.py numbers them so)."""

    num_replicas: int
    max_blocks: int = 1
    capacity: int = 1
    num_ids: int = 1


class Snapshot(NamedTuple):
    """What the picker sees of the R replicas (one lane; every field int32[R] but present).

    waiting: W, requests waiting at the replica (`vllm:num_requests_waiting`, scraped);
    kv_used, kv_usable: KV usage = kv_used / kv_usable (`vllm:kv_cache_usage_perc`, scraped;
      cached-but-free blocks count as free);
    in_flight: requests routed to the replica and not finished (kept at the gateway, fresh);
    prefill_blocks: Dynamo's P_r, prefill blocks routed to r and not yet past their first token;
    decode_blocks: Dynamo's D_r, blocks of requests routed to r and not finished;
    overlap: Dynamo's overlap_r, the request's leading full engine blocks that r's pool
      holds now (computed by the fleet from the replica's real pool);
    present: bool[R], the replica is a candidate (a fleet of fewer than R replicas leaves the
      rest out)."""

    waiting: jax.Array
    kv_used: jax.Array
    kv_usable: jax.Array
    in_flight: jax.Array
    prefill_blocks: jax.Array
    decode_blocks: jax.Array
    overlap: jax.Array
    present: jax.Array


class Request(NamedTuple):
    """The request being routed (one lane).

    blocks: int32[T_MAX] its picker block ids in order, -1 past num_blocks (llm-d's blocks of
      B = max(64, engine block size) tokens, the trailing partial chunk included:
      vtc_jax/inputs/picker_blocks.py); num_blocks: int32[] T; prompt: int32[] prompt tokens;
    engine_blocks: int32[] ceil(prompt / engine block size) (Dynamo)."""

    blocks: jax.Array
    num_blocks: jax.Array
    prompt: jax.Array
    engine_blocks: jax.Array


class Params(NamedTuple):
    """A lane's picker parameters (traced, so lanes may differ; `make_params` builds them).

    tie_random: bool[] seeded ties (else the lowest index); weights: float32[3] llm-d's
    scorer weights (queue, KV, prefix); capacity: int32[R] llm-d's index capacity per
    replica in picker blocks (<= Shape.capacity; llm-d's auto-tune takes the replica's
    num_gpu_blocks)."""

    tie_random: jax.Array
    weights: jax.Array
    capacity: jax.Array


def make_params(shape: Shape, *, ties: str = "random", weights=(2.0, 2.0, 3.0), capacity=None) -> Params:
    """Host: a lane's Params. capacity: None (Shape.capacity for every replica), an int, or
    one int per replica; InputError for bad values."""
    if ties not in TIES:
        raise InputError(f"picker ties {ties!r}: one of {', '.join(TIES)}")
    w = np.asarray(weights, np.float64)
    if w.shape != (3,) or not np.isfinite(w).all() or (w < 0).any():
        raise InputError(f"picker weights {weights!r}: three finite numbers >= 0 (queue, KV, prefix)")
    cap = np.full(shape.num_replicas, shape.capacity, np.int64) if capacity is None else \
        np.broadcast_to(np.asarray(capacity, np.int64), (shape.num_replicas,))
    if (cap < 0).any() or (cap > shape.capacity).any():
        raise InputError(f"picker index capacity {capacity!r}: each in [0, {shape.capacity}] blocks")
    return Params(jnp.asarray(ties == "random"), jnp.asarray(w, jnp.float32), jnp.asarray(cap, I32))


def as_key(key) -> jax.Array:
    """A PRNG key from `key`: uint32[2] as is, an integer seed (int32[]) through PRNGKey."""
    key = jnp.asarray(key)
    return jax.random.PRNGKey(key) if key.ndim == 0 else key.astype(jnp.uint32)


def tie_draws(key, num_replicas: int) -> jax.Array:
    """uint32[R]: the draws `choose` ranks tied replicas by (the literal reference takes
    the same draws, so both break a tie alike)."""
    return jax.random.bits(as_key(key), (num_replicas,), jnp.uint32)


def choose(tied: jax.Array, key, tie_random: jax.Array) -> jax.Array:
    """int32[]: one replica of `tied` (bool[R]), -1 if none. Random: the tied replica with the
    largest draw (top bit set so a tied replica outranks every other; equal draws, about
    2^-31 per pair: the lower index), else the lowest tied index."""
    draws = tie_draws(key, tied.shape[0])
    ranked = jnp.where(tied, (draws >> 1) | jnp.uint32(1 << 31), jnp.uint32(0))
    best = jnp.where(tie_random, jnp.argmax(ranked), jnp.argmax(tied))
    return jnp.where(tied.any(), best, -1).astype(I32)


def no_state(shape: Shape, params: Params):
    """`init` of a stateless picker."""
    return ()


def not_routed(state, replica, request: Request, params: Params):
    """`routed` of a picker that learns nothing from where a request went."""
    return state


@dataclasses.dataclass(frozen=True)
class Picker:
    """An endpoint picker (signatures in the module docstring).

    Attributes:
      name: registry name ("llm-d", "dynamo", ...).
      summary: one line for --help.
      reads: Snapshot fields `pick` reads (the fleet computes only those).
      request_reads: Request fields `pick` and `routed` read (only llm-d reads the picker
        block ids, which the fleet then derives).
      reference: the literal pure-Python class of the same rule
        (vtc_jax/testing/pickers_reference.py), by name: the testing floor sits above.
    """

    name: str
    summary: str
    init: Callable[..., Any]
    pick: Callable[..., tuple]
    routed: Callable[..., Any] = not_routed
    reads: frozenset = frozenset()
    request_reads: frozenset = frozenset()
    reference: str = ""
