"""engines/requeue.py against a literal list-of-stacks: victims pushed in order onto their
clients' stacks (the last pushed on top), pushes past the depth dropped and flagged, pops
from the top, tops read where the stack holds something."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

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
