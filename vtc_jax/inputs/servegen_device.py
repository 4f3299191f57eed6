"""ServeGen request streams generated on device (`generate`), from a plan's traced inputs
(`ServeGenParams`) and static shape (`ServeGenLayout`); servegen.py makes the plan.

Device (`generate`). Output rows int32[R, 5] (ARRIVAL, ORDER, PROMPT, OUTPUT, CACHED) and
the number of real requests (int32[]). Client-major blocks in sorted-id order
(`block_layout`): client k's block has sum_w capacity_kw + `pad` rows (static, the layout is
hashable; no overflow is possible); its real requests come first, sorted by arrival, then
padding rows (ARRIVAL = ORDER = INT32_MAX, PROMPT = OUTPUT = 1, CACHED = 0), at least `pad`
of them (the engine reads up to arrival_width + 1 rows past a client's last arrived row).
ORDER is the unique global rank of a real row in (arrival, client index, position in block)
order (a stable argsort on arrival * K + k); CACHED = 0. Randomness: the key of row w of
client k is fold_in(fold_in(key, client id), window timestamp); its count word (the
Bernoulli) uses fold_in(fold_in(that, 0), 2), its j-th gap fold_in(fold_in(that, j), 0) and
its j-th request's lengths fold_in(fold_in(that, j), 1), so a draw depends only on the lane
key, the client, the window and j, never on the batch, the chosen span or the other clients
(the count also depends on x, which depends on s). The device computes every slot a row's
capacity allows (capacity + 1 gaps, capacity arrival slots) and uses the first n + 1 and n
of them. Gaps are drawn in log space (`jax.random.loggamma`; Weibull by inverse CDF from
a standard exponential, log X = log scale + log(E) / shape) and normalized by the row's
largest used gap, so Gamma shapes as small as the data's 0.017 neither underflow nor divide
by zero (the float32 exponential caps Weibull draws at probability 2^-24 in the tail).
Positions are float32 fractions of the row (segmented prefix sums); one that rounds to the
row's end lands in its last step, and a running maximum undoes float reversals of
neighbours, so blocks are always sorted.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs.servegen_files import GAMMA
from vtc_jax.inputs.workload import ARRIVAL, CACHED, INT32_MAX, NUM_FIELDS, ORDER, OUTPUT, PROMPT, padding_rows

I32, U32, F32 = jnp.int32, jnp.uint32, jnp.float32

MAX_LANE_BYTES = 1 << 30


# ---- the plan's device inputs ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ServeGenLayout:
    """Static (hashable) shape of a plan's output.

    Attributes:
      num_clients, num_windows: K and W.
      num_slots: arrival slots computed, sum over client-rows of their capacity c_kw (the
        most arrivals the row can get).
      num_gaps: gap draws computed, sum over client-rows with c_kw >= 1 of c_kw + 1.
      sizes: rows of each client's block: its capacity sum_w c_kw plus `pad`.
      pad: padding rows every block ends in, at least.
      search_steps: binary-search rounds of the length tables.
      horizon: steps of the span.
    """

    num_clients: int
    num_windows: int
    num_slots: int
    num_gaps: int
    sizes: tuple[int, ...]
    pad: int
    search_steps: int
    horizon: int

    @property
    def num_rows(self) -> int:
        """R, the rows of a lane's output (real requests and padding)."""
        return int(sum(self.sizes))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ServeGenParams:
    """Traced generator inputs (shared by every lane).

    Attributes:
      base: int32[K, W] arrivals certain in row w of client k.
      extra: uint32[K, W] one more arrival when the row's count word (uint32) is below it:
        probability extra / 2^32 (0 under the servegen rule). Capacity: base + (extra > 0).
      client_id: uint32[K] ServeGen ids (key derivation).
      stamp: uint32[W] row timestamps (key derivation).
      start: int32[W] first step b_w of row w;  length: int32[W] its steps b_{w+1} - b_w.
      pattern: int32[K, W] IDLE / GAMMA / WEIBULL.
      shape: float32[K, W] arg1;  log_scale: float32[K, W] log(arg2) (0 when idle).
      prompt_table, output_table: int32[K, W] table index of the row's prompt / output PMF.
      table_start, table_size: int32[D] where each table's entries lie in the flat arrays.
      thresholds: uint32[E] per table, round(CDF * 2^32) of each entry, last = 2^32 - 1.
      values: int32[E] the table's lengths.
    """

    base: jax.Array
    extra: jax.Array
    client_id: jax.Array
    stamp: jax.Array
    start: jax.Array
    length: jax.Array
    pattern: jax.Array
    shape: jax.Array
    log_scale: jax.Array
    prompt_table: jax.Array
    output_table: jax.Array
    table_start: jax.Array
    table_size: jax.Array
    thresholds: jax.Array
    values: jax.Array


def check_lane_bytes(rows: float) -> None:
    """Refuse a lane of `rows` request rows over MAX_LANE_BYTES; a float count (inf too)
    is checked before it becomes an integer, so no count wraps."""
    est = float(rows) * NUM_FIELDS * 4
    if not est <= MAX_LANE_BYTES:
        def shown(x):
            return f"{x:.0f}" if x < 1e15 else f"{x:.3g}"
        raise InputError(f"one lane would hold {shown(rows)} request rows ({shown(est / (1 << 20))} MiB of "
                         "int32[R, 5]), "
                         f"over the {MAX_LANE_BYTES >> 20} MiB limit per lane: lower the load or the horizon")


# ---- device generation --------------------------------------------------------------------

def _segments(count: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """For items 0..n-1 laid out in consecutive segments of `count` int32[S] items:
    (segment int32[n], index within it int32[n])."""
    end = jnp.cumsum(count)
    item = jnp.arange(n, dtype=I32)
    seg = jnp.searchsorted(end, item, side="right").astype(I32)
    return seg, item - (end[seg] - count[seg])


def _segmented_cumsum(x: jax.Array, first: jax.Array) -> jax.Array:
    """Inclusive cumsum of float32[n] restarting where `first` (bool[n]) is set."""
    def combine(a, b):
        return jnp.where(b[1], b[0], a[0] + b[0]), a[1] | b[1]
    return jax.lax.associative_scan(combine, (x, first))[0]


def _search(params: ServeGenParams, table: jax.Array, word: jax.Array, steps: int) -> jax.Array:
    """Inverse CDF: int32[n] length of `table` (int32[n]) for uniform words (uint32[n]):
    the first entry whose threshold exceeds the word (the last entry when none does)."""
    start, size = params.table_start[table], params.table_size[table]

    def halve(_, bounds):  # branchless lower bound on [lo, hi)
        lo, hi = bounds
        active = lo < hi
        mid = (lo + hi) // 2
        below = params.thresholds[start + jnp.minimum(mid, size - 1)] <= word
        return jnp.where(active & below, mid + 1, lo), jnp.where(active & ~below, mid, hi)
    lo, _ = jax.lax.fori_loop(0, steps, halve, (jnp.zeros_like(size), size))
    return params.values[start + jnp.minimum(lo, size - 1)]


def _row_keys(key: jax.Array, params: ServeGenParams) -> jax.Array:
    """Keys of every client-row, flattened client-major: fold_in(fold_in(key, id), stamp)."""
    per_client = jax.vmap(lambda c: jax.random.fold_in(key, c))(params.client_id)
    return jax.vmap(lambda kc: jax.vmap(lambda t: jax.random.fold_in(kc, t))(params.stamp))(per_client) \
        .reshape((-1,) + per_client.shape[1:])


def _item_keys(row_keys: jax.Array, j: jax.Array, channel: int) -> jax.Array:
    """fold_in(fold_in(row key, j), channel): channel 0 gaps, 1 lengths, 2 the row's count."""
    return jax.vmap(lambda kk, i: jax.random.fold_in(jax.random.fold_in(kk, i), channel))(row_keys, j)


def generate(key: jax.Array, params: ServeGenParams, *, layout: ServeGenLayout) -> tuple[jax.Array, jax.Array]:
    """One lane: (rows int32[R, 5], num_requests int32[] real rows); see the module doc.

    `params` and `layout` must come from the same `plan`. Jittable (layout static) and
    vmappable over keys: `jax.vmap(partial(generate, layout=L), (0, None))(keys, params)`.
    Working memory is about 40 bytes per gap slot (`layout.num_gaps`) and 60 per arrival
    slot (`layout.num_slots`) besides the output.
    """
    check_lane_bytes(layout.num_rows)
    k, w, g, n_slots = layout.num_clients, layout.num_windows, layout.num_gaps, layout.num_slots
    r = layout.num_rows
    pad_row = jnp.asarray(padding_rows(1)[0], I32)
    if n_slots == 0:
        return jnp.broadcast_to(pad_row, (r, NUM_FIELDS)), jnp.zeros((), I32)
    base, extra = params.base.reshape(-1), params.extra.reshape(-1)  # [S], S = K * W, client-major
    capacity = base + (extra > 0).astype(I32)
    row_keys = _row_keys(key, params)
    flat = lambda x: x.reshape(-1)  # noqa: E731
    pattern, shape, log_scale = flat(params.pattern), flat(params.shape), flat(params.log_scale)

    # Arrivals per client-row: base + Bernoulli(extra / 2^32), one word per row.
    words = jax.vmap(lambda kk: jax.random.bits(kk, (), U32))(_item_keys(row_keys, jnp.zeros_like(base), 2))
    count = base + (words < extra).astype(I32)
    gap_capacity = jnp.where(capacity > 0, capacity + 1, 0)

    # Gaps: capacity + 1 slots per row, the first count + 1 used, in log space.
    seg, idx = _segments(gap_capacity, g)
    used = idx <= count[seg]
    lg_keys = _item_keys(row_keys[seg], idx, 0)
    a = shape[seg]

    def log_gap(kk, a_):
        k_gamma, k_weibull = jax.random.split(kk)
        lg = jax.random.loggamma(k_gamma, a_)
        lw = jnp.log(jax.random.exponential(k_weibull, dtype=F32)) / a_
        return lg, lw
    lg, lw = jax.vmap(log_gap)(lg_keys, a)
    logs = jnp.where(used, jnp.where(pattern[seg] == GAMMA, lg, lw) + log_scale[seg], -jnp.inf)
    top = jax.ops.segment_max(logs, seg, num_segments=k * w, indices_are_sorted=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weight = jnp.where(used, jnp.exp(logs - top[seg]), 0.0)
    total = jax.ops.segment_sum(weight, seg, num_segments=k * w, indices_are_sorted=True)
    cum = _segmented_cumsum(weight, idx == 0)

    # Arrival slots: capacity per row, the first `count` real: window start + running sums.
    rseg, j = _segments(capacity, n_slots)
    real = j < count[rseg]
    gap_of = (jnp.cumsum(gap_capacity) - gap_capacity)[rseg] + j
    tot = total[rseg]
    frac = jnp.where(tot > 0, cum[gap_of] / jnp.where(tot > 0, tot, 1.0),
                     (j + 1).astype(F32) / (count[rseg] + 1).astype(F32))
    window = rseg % w
    client = rseg // w
    length = params.length[window]
    offset = jnp.clip(jnp.floor(frac * length.astype(F32)).astype(I32), 0, length - 1)
    # Float rounding may reverse neighbours by a step; a running max over the real slots
    # keeps each block sorted (client k's steps live in [k * horizon, (k + 1) * horizon) of
    # this global key; unreal slots add 0, which never raises the max).
    step_key = jax.lax.cummax(jnp.where(real, client * layout.horizon + params.start[window] + offset, 0))
    arrival = step_key - client * layout.horizon

    len_words = jax.vmap(lambda kk: jax.random.bits(kk, (2,), U32))(_item_keys(row_keys[rseg], j, 1))
    prompt = _search(params, flat(params.prompt_table)[rseg], len_words[:, 0], layout.search_steps)
    output = _search(params, flat(params.output_table)[rseg], len_words[:, 1], layout.search_steps)

    # ORDER: rank among real slots in (arrival, client, position) order. Slots are
    # client-major and sorted within a client, so a stable sort on arrival * K + k does it.
    sort_key = jnp.where(real, arrival * k + client, INT32_MAX)
    perm = jnp.argsort(sort_key, stable=True)
    rank = jnp.zeros(n_slots, I32).at[perm].set(jnp.arange(n_slots, dtype=I32), unique_indices=True)

    # Compaction: real slot -> first_k + (real slots of client k before it); others dropped.
    first = jnp.asarray(np.concatenate([[0], np.cumsum(layout.sizes)[:-1]]), I32)
    per_client = count.reshape(k, w).sum(axis=1)
    real_i = real.astype(I32)
    before = jnp.cumsum(real_i) - real_i
    dest = jnp.where(real, first[client] + before - (jnp.cumsum(per_client) - per_client)[client],
                     r + jnp.arange(n_slots, dtype=I32))
    assert (ARRIVAL, ORDER, PROMPT, OUTPUT, CACHED) == (0, 1, 2, 3, 4)
    slots = jnp.stack([arrival, rank, prompt, output, jnp.zeros_like(arrival)], axis=-1)
    rows = jnp.broadcast_to(pad_row, (r, NUM_FIELDS)).at[dest].set(slots, mode="drop", unique_indices=True)
    return rows, per_client.sum().astype(I32)
