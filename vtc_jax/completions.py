"""Running requests ordered by completion: a binary min-heap in fixed-size arrays.

No preemption means a request's completion step is known when it is admitted
(admission step + output - 1), so the engine pushes it here and pops requests as their
step ends, one per event, in (completion step, admission sequence) order. Memory is
O(slots) per lane (slots >= the most requests that can run at once), whatever the longest
output; push and pop cost O(log slots) gathers. Ties between requests completing in the
same step are broken by admission order, so completion hooks see a defined order.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from vtc_jax.workload import INT32_MAX

I32 = jnp.int32
FIELDS = ("finish", "seq", "client", "prompt", "output", "estimate")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Heap:
    """entries: int32[6, S] rows FIELDS (finish step, admission sequence number, client,
    prompt, output, estimate), heap-ordered by (finish, seq) over the first `size` columns;
    empty columns hold finish = INT32_MAX. size: int32[]."""

    entries: jax.Array
    size: jax.Array

    @property
    def top_finish(self) -> jax.Array:
        """int32[]: completion step of the next request to complete (INT32_MAX: none)."""
        return self.entries[0, 0]

    def top(self) -> jax.Array:
        """int32[6]: the next request to complete."""
        return self.entries[:, 0]


def init(slots: int) -> Heap:
    entries = jnp.zeros((len(FIELDS), max(slots, 1)), I32).at[0].set(INT32_MAX)
    return Heap(entries=entries, size=jnp.zeros((), I32))


def depth(slots: int) -> int:
    """Levels below the root of a heap of `slots` entries."""
    return max(1, math.ceil(math.log2(slots + 1)))


def _before(a: jax.Array, b: jax.Array) -> jax.Array:
    """Entry a completes before entry b: (finish, seq) lexicographic."""
    return (a[0] < b[0]) | ((a[0] == b[0]) & (a[1] < b[1]))


def push(heap: Heap, entry: jax.Array, mask: jax.Array) -> Heap:
    """Insert `entry` (int32[6]) where `mask` (the caller guarantees size < slots)."""
    slots = heap.entries.shape[1]
    entries = heap.entries
    pos = jnp.where(mask, heap.size, slots)  # slots: out of range, writes dropped
    for _ in range(depth(slots)):
        parent = jnp.maximum(pos - 1, 0) // 2
        up = (pos > 0) & (pos < slots) & _before(entry, entries[:, parent])
        entries = entries.at[:, jnp.where(up, pos, slots)].set(entries[:, parent], mode="drop")
        pos = jnp.where(up, parent, pos)
    entries = entries.at[:, pos].set(entry, mode="drop")
    return Heap(entries=entries, size=heap.size + mask.astype(I32))


def pop(heap: Heap, mask: jax.Array) -> Heap:
    """Remove the top entry where `mask` (read it first with `top`)."""
    slots = heap.entries.shape[1]
    size = heap.size - mask.astype(I32)
    last = heap.entries[:, jnp.maximum(size, 0)]
    entries = heap.entries.at[:, jnp.where(mask, size, slots)].set(
        jnp.asarray([INT32_MAX] + [0] * (len(FIELDS) - 1), I32), mode="drop")
    sifting = mask & (size > 0)
    pos = jnp.zeros((), I32)
    for _ in range(depth(slots)):
        left = 2 * pos + 1
        right = left + 1
        left_e = entries[:, jnp.minimum(left, slots - 1)]
        right_e = entries[:, jnp.minimum(right, slots - 1)]
        use_right = (right < size) & _before(right_e, left_e)
        child = jnp.where(use_right, right, left)
        child_e = jnp.where(use_right, right_e, left_e)
        sifting = sifting & (child < size) & _before(child_e, last)
        entries = entries.at[:, jnp.where(sifting, pos, slots)].set(child_e, mode="drop")
        pos = jnp.where(sifting, child, pos)
    entries = entries.at[:, jnp.where(mask & (size > 0), pos, slots)].set(last, mode="drop")
    return Heap(entries=entries, size=size)
