"""engines/requeue.py against a literal list-of-stacks: victims pushed in order onto their
clients' stacks (the last pushed on top), pushes past the depth dropped and flagged, pops
from the top, tops read where the stack holds something."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.core import wide
from vtc_jax.engines import requeue

I32 = jnp.int32


def _literal_push(index, generated, depth, mask, client, rows, gens):
    index, generated, depth, over = index.copy(), generated.copy(), depth.copy(), False
    for i in np.flatnonzero(mask):
        c = client[i]
        if depth[c] < index.shape[1]:
            index[c, depth[c]], generated[c, depth[c]] = rows[i], gens[i]
            depth[c] += 1
        else:
            over = True
    return index, generated, depth, over


@pytest.mark.parametrize("seed", range(3))
def test_push_pop_and_tops_equal_literal_stacks(seed):
    assert 33 <= requeue.SQUARE_SLOTS < 130  # both of push's forms are drawn below
    rng = np.random.default_rng(seed)
    for _ in range(40):
        # slot counts on both sides of requeue.SQUARE_SLOTS (the [S, S] count and the prefix sum)
        k, s, d = int(rng.choice([1, 2, 3, 9])), int(rng.choice([1, 5, 32, 33, 64, 65, 130])), int(rng.integers(1, 12))
        index = rng.integers(0, 100, (k, d))
        generated = rng.integers(0, 9, (k, d))
        depth = rng.integers(0, d + 1, k)
        stacks = requeue.Stacks(index=jnp.asarray(index, I32), generated=jnp.asarray(generated, I32),
                                depth=jnp.asarray(depth, I32))
        mask = rng.random(s) < rng.random()
        client, rows, gens = rng.integers(0, k, s), rng.integers(0, 1000, s), rng.integers(0, 50, s)
        got, over = requeue.push(stacks, jnp.asarray(mask), jnp.asarray(client, I32), jnp.asarray(rows, I32),
                                 jnp.asarray(gens, I32))
        want = _literal_push(index, generated, depth, mask, client, rows, gens)
        np.testing.assert_array_equal(np.asarray(got.depth), want[2])
        for c in range(k):  # only entries below the depth are meaningful
            np.testing.assert_array_equal(np.asarray(got.index)[c, :want[2][c]], want[0][c, :want[2][c]])
            np.testing.assert_array_equal(np.asarray(got.generated)[c, :want[2][c]], want[1][c, :want[2][c]])
        assert bool(over) == want[3]
        top_index, top_generated = (np.asarray(x) for x in requeue.tops(got))
        for c in range(k):
            if want[2][c]:
                assert (top_index[c], top_generated[c]) == (want[0][c, want[2][c] - 1], want[1][c, want[2][c] - 1])
            else:
                assert top_generated[c] == 0
        take = rng.integers(0, 2, k)
        popped = requeue.pop(got, jnp.asarray(take, I32))
        np.testing.assert_array_equal(np.asarray(popped.depth), np.maximum(want[2] - take, 0))


# ----------------------------------------------------------------------------------------
# Tails (SGLang's retraction): per-client FIFO rings against literal deques.


@pytest.mark.parametrize("seed", range(2))
def test_tails_push_and_pop_equal_literal_queues(seed):
    """Victims join their clients' rings at the back in the order given, each stamped with
    the step and its lane-wide number; pops take the front; a push past the depth is
    dropped and flagged; from_tail turns on where a client's FIFO is empty when it pushes."""
    rng = np.random.default_rng(seed)
    k, d, s = 3, 4, 6
    tails, queues, count, from_tail = requeue.init_tails(k, d), [[] for _ in range(k)], 0, [False] * k
    for step in range(60):
        if rng.random() < 0.5:
            mask = rng.random(s) < 0.4
            client, rows, gens = rng.integers(0, k, s), rng.integers(0, 50, s), rng.integers(0, 9, s)
            fifo_empty = rng.random(k) < 0.5
            tails, over = requeue.push_tail(tails, jnp.asarray(mask), jnp.asarray(client, I32), jnp.asarray(rows, I32),
                                            jnp.asarray(gens, I32), jnp.asarray(step, I32), jnp.asarray(fifo_empty))
            want_over = False
            for i in np.flatnonzero(mask):
                if len(queues[client[i]]) < d:
                    queues[client[i]].append((rows[i], gens[i], step, count))
                else:
                    want_over = True
                count += 1
            for c in set(client[mask].tolist()):
                from_tail[c] = from_tail[c] or bool(fifo_empty[c])
            assert bool(over) == want_over
        else:
            take = (rng.random(k) < 0.5).astype(np.int32)
            tails = requeue.pop_tail(tails, jnp.asarray(take, I32))
            for c in range(k):
                if take[c] and queues[c]:
                    queues[c].pop(0)
        index, generated, at, seq = (np.asarray(x) for x in requeue.fronts(tails))
        np.testing.assert_array_equal(np.asarray(tails.depth), [len(q) for q in queues])
        assert np.asarray(tails.from_tail).tolist() == from_tail
        assert int(tails.count) == count
        for c, q in enumerate(queues):
            if q:
                assert (index[c], generated[c], at[c], seq[c]) == q[0]
            else:
                assert generated[c] == 0


def test_tails_order_keys_put_a_requeued_request_behind_earlier_arrivals_only():
    """A ring's front sorts as (requeue step, R + seq): behind every request that arrived by
    that step (arrival <= step), ahead of later ones, and among fronts in requeue order."""
    tails = requeue.init_tails(3, 2)
    tails, _ = requeue.push_tail(tails, jnp.asarray([True, True, False]), jnp.asarray([0, 1, 2], I32),
                                 jnp.asarray([7, 8, 9], I32), jnp.asarray([1, 1, 1], I32), jnp.asarray(5, I32),
                                 jnp.asarray([True, True, True]))
    keys = np.asarray(requeue.order_keys(tails, jnp.asarray([3, 3, 5], I32), jnp.asarray([1, 2, 4], I32), 100))
    assert keys.tolist() == [[5, 100], [5, 101], [5, 4]]
    # client 2's FIFO head (arrival 5, ORDER 4) arrived by step 5: it comes first; then 0's, then 1's
    order = sorted(range(3), key=lambda c: tuple(keys[c]))
    assert order == [2, 0, 1]
    assert int(wide.WIDE.argmin(jnp.asarray(keys), jnp.asarray([True, True, True]))) == 2
    assert int(wide.WIDE.argmin(jnp.asarray(keys), jnp.asarray([True, True, False]))) == 0
    assert int(wide.WIDE.argmin(jnp.asarray(keys), jnp.asarray([False, True, False]))) == 1
