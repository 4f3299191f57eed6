"""vLLM's async scheduling in the `vllm` server (servers/vllm_v1.py; docs/VLLM_ASYNC.md).

Under vLLM's AsyncScheduler (EngineCore.step_with_batch_queue, two batches in flight) the
update of step k runs after step k+1's schedule. A sampled token is known at once as an
output placeholder, so decoding goes on as in sync; what the update carries is the stop: a
request that sampled its last token in step k is skipped by step k+1's running phase (vLLM
knows it reaches max_tokens) while it still holds its blocks and its seat, and it stops,
freeing its blocks, in the update after step k+1's schedule. A lane keeps such a request in
its slot with generated = output - 1 and computed = prompt + generated: it asks for no
token, so both running-phase forms skip it without a rule of their own. If it is preempted
there (a victim, as any running request), vLLM frees its blocks at once, and the update
still delivers its last token and stops it from the waiting queue (scheduler.py
update_from_output: stopped_preempted_reqs): here it comes back to a slot after the running
phase, to stop in this step's update, rather than to its client's queue.

Sync lanes never hold a slot in either state, so a batch may mix async and sync lanes; the
code below is left out of the program when no lane schedules async (`static_options`).
"""

from __future__ import annotations

import jax.numpy as jnp

from vtc_jax.servers.vllm_v1_state import I32, VllmState, _excl_cumsum

RETURNING = ("client", "value", "index", "prompt", "output", "order")  # a returning victim's own fields


def in_flight(state: VllmState):
    """bool[S]: listed slots whose last token is in flight (sampled in the last step; it
    stops in this step's update): computed = prompt + generated, a state only async leaves."""
    listed = jnp.arange(state.client.shape[0], dtype=I32) < state.nrun
    return listed & (state.computed == state.prompt + state.generated)


def survivors(slot, nrun):
    """bool[S] over the step-start slots: those still listed after vLLM's walk, which
    carried each slot's start position `slot` int32[S] along as it removed victims."""
    slots = slot.shape[0]
    listed = jnp.arange(slots, dtype=I32) < nrun
    return jnp.zeros(slots, bool).at[jnp.where(listed, slot, slots)].set(True, mode="drop")


def stop_victims(state: VllmState, victim, fields: dict, nrun, stamp, mask):
    """The victims whose last token was in flight (`victim` bool[S] over the step-start
    slots, in slot order) back in slots [nrun, nrun + k) after the running phase, computed 0
    (their blocks are free) and generated = output (this step's update stops them), where
    `mask`. `fields`: the slot arrays after the running phase. Their rows' finish is the
    stamp of the step that sampled their last token (`stamp`, written now so that the
    caller can tell them from the victims that go back to their queues). Returns (fields,
    nrun, the Outcome's finish int32[R])."""
    slots = state.client.shape[0]
    back = victim & in_flight(state) & mask
    at = jnp.where(back, nrun + _excl_cumsum(back.astype(I32)), slots)
    put = lambda name, value: fields[name].at[at].set(value, mode="drop")  # noqa: E731
    fields = dict(fields, **{name: put(name, getattr(state, name)) for name in RETURNING},
                  computed=put("computed", 0), generated=put("generated", state.output), tokens=put("tokens", 0))
    rows = state.out.finish.shape[0]
    finish = state.out.finish.at[jnp.where(back, state.index, rows)].set(stamp, mode="drop")
    return fields, nrun + back.sum(dtype=I32), finish


def requeued(finish, index):
    """bool[S]: victims `index` (workload rows) that go back to their clients' queues: all
    but those `stop_victims` kept (their finish is written)."""
    rows = finish.shape[0]
    return finish[jnp.clip(index, 0, rows - 1)] < 0


def sample_counts(state: VllmState, samples, asynchronous):
    """int32[S]: generated tokens after the step: each sample counts, but under async
    (`asynchronous` bool[]) a last token only in the next step's update; the in-flight
    last tokens of the last step count now (their stop)."""
    last = samples & (state.generated + 1 == state.output)
    return state.generated + (samples & ~(asynchronous & last)).astype(I32) + in_flight(state).astype(I32)
