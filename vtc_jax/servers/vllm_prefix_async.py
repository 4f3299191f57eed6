"""vLLM's async scheduling in the `vllm_prefix` server (servers/vllm_prefix.py;
docs/VLLM_ASYNC.md, rules 1-5).

The `vllm` server's async rules (servers/vllm_v1_async.py) hold as they are: a request that
sampled its last token in the last step keeps generated = output - 1 with computed = prompt
+ generated (it asks for no token, so the walk skips it while it holds its blocks and its
seat) and stops in this step's update, its finish the last step's stamp; a victim in that
state (its blocks freed at once) stops in this step's update too, not from its queue. Here
the running list is the alive slots (a slot never moves), so such a victim simply stays in
its slot, alive, holding no blocks, with computed 0 and generated = output, until
`end_step` stops it.

Rule 5 (prefix caching): allocation hashes only tokens whose update has run, so a slot
that sampled in the last step (`sampled`) hashes at most prompt + generated - 1 tokens, and
that update, which runs after this step's schedule (admissions included), hashes the full
blocks each still-running such slot had computed by the step's start (`cache_updated`, at
the start of `end_step`). A victim frees its unhashed blocks as unhashed
(vllm_blocks.release). Sync lanes never have a slot in either state and never read
`sampled`, so lanes of one batch may mix the modes; none of this is in the program when no
lane schedules async (`PrefixState.asyncs`).
"""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp

from vtc_jax.servers import vllm_v1_async
from vtc_jax.servers import vllm_blocks as vb

I32 = jnp.int32
INT_MAX = 2**31 - 1


def _listed(state):
    """vllm_v1_async's functions read the running list as the slots [0, nrun); here it is
    the alive slots: a view with every slot listed and a dead one's computed -1 (never in
    flight)."""
    return types.SimpleNamespace(client=state.client, nrun=state.client.shape[0], prompt=state.prompt,
                                 generated=state.generated, output=state.output,
                                 computed=jnp.where(state.alive, state.computed, -1))


def in_flight(state):
    """bool[S]: alive slots whose last token is in flight (vllm_v1_async.in_flight)."""
    return vllm_v1_async.in_flight(_listed(state))


def sample_counts(state, samples, asynchronous):
    """int32[S]: generated tokens after the step (vllm_v1_async.sample_counts)."""
    return vllm_v1_async.sample_counts(_listed(state), samples, asynchronous)


def hash_limit(state, p: dict, slot, upto):
    """The tokens an allocation for `slot` may hash: `upto`, but only the known ones (at
    most prompt + generated - 1) when its last sample's update has not run."""
    pending = p["async"] & state.sampled[slot]
    return jnp.where(pending, jnp.minimum(upto, state.prompt[slot] + state.generated[slot] - 1), upto)


def stop_victims(state, walked, mask):
    """After the walk (`walked`: the state it left, `state` the step's start): the victims
    whose last token was in flight are alive again in their slots, holding no blocks,
    computed 0 and generated = output, to stop in this step's update, where `mask`; their
    rows' finish is the last step's stamp. Returns (the state, the Outcome's finish
    int32[R])."""
    back = mask & in_flight(state) & ~walked.alive
    rows = state.out.finish.shape[0]
    finish = state.out.finish.at[jnp.where(back, state.index, rows)].set(state.stamp, mode="drop")
    return dataclasses.replace(walked, alive=walked.alive | back, computed=jnp.where(back, 0, walked.computed),
                               generated=jnp.where(back, state.output, walked.generated)), finish


def requeued(finish, index):
    """bool[S]: victims (rows `index`) that go back to their queues (vllm_v1_async.requeued)."""
    return vllm_v1_async.requeued(finish, index)


def cache_updated(pool, state, p: dict, content, mask):
    """The last step's update, run after this step's schedule: each alive slot that
    sampled in the last step hashes the full blocks of what it had computed by this step's
    start, in running-list (admission) order (`content(row)`: its content table, as
    vllm_prefix._content): one batched hash of them all (vllm_blocks.hash_many)."""
    bs = p["block_size"]
    nids = jax.vmap(lambda row: content(row)[2])(state.row)
    todo = (mask & p["async"] & state.alive & state.sampled
            & (jnp.minimum(state.computed // bs, nids) > pool.hashed))
    walk = jnp.argsort(jnp.where(todo, state.adm, INT_MAX)).astype(I32)
    listed = jnp.arange(walk.shape[0]) < todo.sum(dtype=I32)
    ids, offs, n = jax.vmap(content, out_axes=(None, 0, 0))(state.row[walk])
    return vb.hash_many(pool, walk, jnp.where(listed, state.computed[walk], 0), ids, offs, n, bs)


def stop_order(state, asynchronous):
    """int32[S]: the key of the order a step's update stops its requests in: the step that
    sampled their last token's scheduling order (`lastpos` under async, this step's
    `spos` in sync)."""
    return jnp.where(asynchronous, state.lastpos, state.spos)
