"""Running requests by completion step: a calendar of lists over a slot pool.

No preemption means a request's completion step is known when it is admitted
(admission step + output - 1). The engine files it in calendar row (completion step mod
L), L = the longest output + 1 rounded up, so that every running request's row holds only
requests completing at the same step; each row is a list threaded through a pool of S
slots holding the request (client, prompt, output, the policy's value). At the end of
step t the engine pops row t mod L, one request per event, last filed first (so a step's
completions are handled in reverse admission order). Push and pop are O(1) (a few gathers
and scatters); memory is L + 5 * S int32 per lane, whatever the number of clients (a
per-client calendar would be 2 * L * K). Free slots are a stack; S must be at least the
most requests that can run at once (a push into a full pool is dropped and reported: the
engine flags the lane).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

I32 = jnp.int32
FIELDS = ("client", "prompt", "output", "value")
CLIENT, PROMPT, OUTPUT, VALUE, NEXT = range(5)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Calendar:
    """head: int32[L] the last slot filed in each row (-1: empty); slots: int32[S, 5] per
    slot (client, prompt, output, value, the slot filed before it in its row or -1; slot
    major, so that a push writes and a pop reads one contiguous row: on CPU a scatter of
    a [5] column strided over S took twice as long);
    free: int32[S] stack of free slots (the first `top` entries); top: int32[]."""

    head: jax.Array
    slots: jax.Array
    free: jax.Array
    top: jax.Array


def init(rows: int, slots: int) -> Calendar:
    return Calendar(head=jnp.full(rows, -1, I32), slots=jnp.zeros((slots, len(FIELDS) + 1), I32),
                    free=jnp.arange(slots - 1, -1, -1, dtype=I32), top=jnp.asarray(slots, I32))


def due(cal: Calendar, step: jax.Array) -> jax.Array:
    """bool[]: a request whose completion step (step - 1) has ended is still filed."""
    rows = cal.head.shape[0]
    return (step > 0) & (cal.head[(step - 1) % rows] >= 0)


def full(cal: Calendar) -> jax.Array:
    return cal.top <= 0


def push(cal: Calendar, finish: jax.Array, entry: jax.Array, mask: jax.Array) -> Calendar:
    """File `entry` (int32[4]: client, prompt, output, value) for step `finish` where
    `mask` (a push into a full pool is dropped: check `full` first)."""
    rows, slots = cal.head.shape[0], cal.free.shape[0]
    mask = mask & (cal.top > 0)
    slot = cal.free[jnp.maximum(cal.top - 1, 0)]
    row = finish % rows
    record = jnp.concatenate([entry.astype(I32), cal.head[row][None]])
    table = cal.slots.at[jnp.where(mask, slot, slots)].set(record, mode="drop")
    # The head is written after the old head was read into the table: the write's index
    # reads the table back, a data dependency XLA must respect. Without it XLA may order
    # the read after the write and copy the whole array on every event.
    after = mask & (table[jnp.maximum(slot, 0), NEXT] >= -1)
    return Calendar(head=cal.head.at[jnp.where(after, row, rows)].set(slot, mode="drop"), slots=table,
                    free=cal.free, top=cal.top - mask.astype(I32))


def pop(cal: Calendar, step: jax.Array, mask: jax.Array) -> tuple[Calendar, jax.Array]:
    """Remove the last request filed for step `step - 1` where `mask` (and one is there);
    returns (calendar, int32[4] its entry)."""
    rows, slots = cal.head.shape[0], cal.free.shape[0]
    row = (step - 1) % rows
    slot = cal.head[row]
    mask = mask & (slot >= 0)
    record = cal.slots[jnp.maximum(slot, 0)]
    return Calendar(head=cal.head.at[jnp.where(mask, row, rows)].set(record[NEXT], mode="drop"), slots=cal.slots,
                    free=cal.free.at[jnp.where(mask, cal.top, slots)].set(slot, mode="drop"),
                    top=cal.top + mask.astype(I32)), record[:NEXT]
