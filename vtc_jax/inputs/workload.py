"""Traces and their device layout: per-client request blocks.

A `Trace` is a host-side table of requests (numpy int64 columns, trace order). The engine
never keeps a waiting buffer: each client's requests are laid out once, sorted by
(arrival, number), as a contiguous block of `Workload.requests` (client-major, CSR-like:
block k is rows [first_k, first_k + size_k)); the waiting FIFO of client k is then the
index range [head_k, arrived_k) of its block (engine.py). Blocks are sized per client, so
a lane's streams take memory in proportion to its requests, not K x the busiest client's.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import re

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import clock
from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table, read_text
from vtc_jax.core.rows import ARRIVAL, CACHED, NUM_FIELDS, ORDER, OUTPUT, PROMPT  # noqa: F401 (TODO: importers to core.rows)

INT32_MAX = int(np.iinfo(np.int32).max)
REQUIRED_COLUMNS = ("arrival", "client", "prompt", "output")
OPTIONAL_COLUMNS = ("cached",)
MAX_LENGTH = INT32_MAX // 4  # largest prompt or output a trace may hold
MAX_ARRIVAL = INT32_MAX // 2  # largest arrival step: the longest horizon (completion steps stay < 2^31)
_INT_RE = re.compile(r"^[+]?\d+$")


@dataclasses.dataclass(frozen=True)
class Trace:
    """Requests in trace order (row i is request number i). All columns int64[N].
    `lines` (optional, int64[N]): the file line of each row, and `source` (optional) the
    file's name, for error messages."""

    arrival: np.ndarray
    client: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    cached: np.ndarray
    lines: np.ndarray | None = dataclasses.field(default=None, compare=False)
    source: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        names = ("arrival", "client", "prompt", "output", "cached")
        cols = [np.asarray(getattr(self, n), dtype=np.int64) for n in names]
        for name, col in zip(names, cols):
            object.__setattr__(self, name, col)
            if col.ndim != 1 or col.shape != cols[0].shape:
                raise InputError("trace columns must be 1-D and of equal length")

    @classmethod
    def from_rows(cls, rows) -> "Trace":
        """From (arrival, client, prompt, output[, cached]) tuples; validates."""
        rows = [tuple(r) + (0,) * (5 - len(r)) for r in rows]
        cols = np.asarray(rows, dtype=np.int64).reshape(-1, 5).T
        trace = cls(*cols)
        trace.validate()
        return trace

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    @property
    def num_clients(self) -> int:
        return int(self.client.max()) + 1 if len(self) else 0

    def in_arrival_order(self) -> "Trace":
        """The same requests in (arrival, number) order (a stable sort; self when sorted):
        request numbers among equal arrivals keep their order, so FCFS ranks are unchanged."""
        if (np.diff(self.arrival) >= 0).all():
            return self
        order = np.argsort(self.arrival, kind="stable")
        return Trace(self.arrival[order], self.client[order], self.prompt[order], self.output[order],
                     self.cached[order], lines=None if self.lines is None else self.lines[order], source=self.source)

    def where(self, row: int) -> str:
        """'line L' of the file (when read from one), else 'row R' (1-based)."""
        return f"line {int(self.lines[row])}" if self.lines is not None else f"row {row + 1}"

    def validate(self, num_clients: int | None = None) -> None:
        """Raise InputError naming the first bad row (its file line when known)."""
        checks = [
            (self.arrival < 0, "arrival must be >= 0"),
            (self.client < 0, "client must be >= 0"),
            (self.prompt < 1, "prompt must be >= 1"),
            (self.output < 1, "output must be >= 1"),
            (self.cached < 0, "cached must be >= 0"),
            (self.cached >= self.prompt, "cached must be < prompt"),
        ]
        if num_clients is not None:
            checks.append((self.client >= num_clients, f"client id outside --clients {num_clients}"))
        for col, name, limit in ((self.arrival, "arrival", clock.WIDE_LIMIT), (self.prompt, "prompt", MAX_LENGTH),
                                 (self.output, "output", MAX_LENGTH)):
            checks.append((col > limit, f"{name} too large (limit {limit})"))
        for bad, message in checks:
            if bad.any():
                self.fail(int(np.argmax(bad)), message)

    def fail(self, row: int, message: str):
        """Raise InputError: '[source: ]line L: message (the row's fields)'."""
        prefix = f"{self.source}: " if self.source else ""
        raise InputError(f"{prefix}{self.where(row)}: {message} ({self._describe(row)})")

    def _describe(self, row: int) -> str:
        return (f"arrival={self.arrival[row]}, client={self.client[row]}, prompt={self.prompt[row]}, "
                f"output={self.output[row]}, cached={self.cached[row]}")


def trace_text(path_or_text, source: str | None) -> tuple[str, str]:
    """(text, source name) of a trace CSV given as a path or an io.StringIO; a file over
    fileio.MAX_INPUT_BYTES or holding NUL bytes is one InputError naming it."""
    if isinstance(path_or_text, io.StringIO):
        text, source = path_or_text.getvalue(), source or "<text>"
    else:
        source = source or str(path_or_text)
        text = read_text(path_or_text, what="trace")
    if "\x00" in text:
        raise InputError(f"{source}: not a text CSV (contains NUL bytes)")
    return text, source


def read_trace_csv(path_or_text, *, source: str | None = None) -> Trace:
    """Read a trace CSV with header `arrival,client,prompt,output[,cached]`.

    Every value must be a non-negative decimal integer. Raises InputError naming the file,
    the line (the physical line, blank lines and quoted newlines counted) and the problem.
    `path_or_text` is a path or an io.StringIO. Files over fileio.MAX_INPUT_BYTES are refused.
    """
    text, source = trace_text(path_or_text, source)
    header, records = csv_table(text, source, REQUIRED_COLUMNS, OPTIONAL_COLUMNS)
    columns = {name: [] for name in header}
    lines = []
    for line_no, row in records:
        for name, cell in zip(header, row):
            if not _INT_RE.match(cell):
                shown = cell if len(cell) <= 24 else cell[:24] + "..."
                raise InputError(f"{source}: line {line_no}: {name} must be a non-negative integer, got {shown!r}")
            digits = cell.lstrip("+").lstrip("0") or "0"
            if len(digits) > len(str(INT32_MAX)) or int(digits) > INT32_MAX:  # no int() of huge text
                shown = digits if len(digits) <= 24 else digits[:24] + "..."
                raise InputError(f"{source}: line {line_no}: {name} {shown} exceeds {INT32_MAX}")
            columns[name].append(int(digits))
        lines.append(line_no)
    n = len(columns["arrival"])
    if n == 0:
        raise InputError(f"{source}: no requests (header only)")
    cached = columns.get("cached", [0] * n)
    trace = Trace(np.array(columns["arrival"]), np.array(columns["client"]), np.array(columns["prompt"]),
                  np.array(columns["output"]), np.array(cached), lines=np.asarray(lines, np.int64), source=source)
    trace.validate()  # names the file: the trace knows its source
    return trace


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Workload:
    """A lane's request blocks on device.

    Attributes:
      requests: int32[R, 5]  client-major blocks; block k = rows [first_k, first_k + size_k)
        holds client k's requests sorted by (arrival, number), fields (ARRIVAL, ORDER,
        PROMPT, OUTPUT, CACHED); ORDER orders requests by (arrival, number): FCFS picks the
        smallest head (a trace's rows: the rank in (arrival, number) order; generated
        traffic: arrival * K + client, same-step requests of a client sharing it). Each block ends in at least `pad` padding
        rows with ARRIVAL = ORDER = INT32_MAX (they never arrive), so the engine's arrival
        look-ahead never leaves the block.
      first: int32[K]  first row of each block.
      size: int32[K]  rows of each block (requests + padding).
      num_requests: int32[]  requests that arrive before the horizon (drain mode waits for
        all of them to complete).
      overflow: bool[]  a generated block had more arrivals than rows: the lane is flagged
        as not finished (never silently shortened).
      timeline: int32[R + P, 3]  (row, client, arrival) of every row in (arrival, ORDER)
        order, padding last, then P more padding entries: the order in which requests
        arrive, so that an arrival event reads a few rows, not one per client, and the
        engine sees when the next requests arrive without reading their rows
        (`add_timeline` fills it).
    """

    requests: jax.Array
    first: jax.Array
    size: jax.Array
    num_requests: jax.Array
    overflow: jax.Array
    timeline: jax.Array | None = None


TIMELINE_PAD = 64  # entries past the end of a timeline: the widest arrival window
TIMELINE_FIELDS = 3  # a timeline entry: (row, client, arrival)


def padding_rows(count: int, wide_clock: bool = False) -> np.ndarray:
    """int32[count, 5] rows that never arrive (int64 with a wide clock, arriving at
    clock.NEVER)."""
    rows = np.zeros((count, NUM_FIELDS), np.int64 if wide_clock else np.int32)
    rows[:, ARRIVAL] = clock.never(wide_clock)
    rows[:, ORDER] = INT32_MAX
    rows[:, PROMPT] = 1
    rows[:, OUTPUT] = 1
    return rows


def block_sizes(counts, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, size) int32[K] of blocks holding `counts` requests plus `pad` rows each."""
    size = np.asarray(counts, np.int64) + pad
    first = np.concatenate([[0], np.cumsum(size)[:-1]])
    if size.sum() > INT32_MAX // 2:
        raise InputError(f"{int(size.sum()):,} request rows exceed the limit of {INT32_MAX // 2:,} per lane")
    return first.astype(np.int32), size.astype(np.int32)


def layout_trace(trace: Trace, num_clients: int, pad: int, sizes: np.ndarray | None = None,
                 wide_clock: bool = False) -> np.ndarray:
    """Client-major sorted request rows, int32[R, 5] (numpy; int64 with a wide clock),
    blocks of `sizes` rows (default: each client's count + pad)."""
    counts = requests_per_client(trace, num_clients)
    sizes = counts + pad if sizes is None else np.asarray(sizes)
    if (sizes < counts + pad).any():
        k = int(np.argmax(sizes < counts + pad))
        raise InputError(f"client {k} has {counts[k]} requests; block of {sizes[k]} rows too small")
    order = np.lexsort((np.arange(len(trace)), trace.arrival))  # FCFS order: (arrival, number)
    rank = np.empty(len(trace), dtype=np.int64)
    rank[order] = np.arange(len(trace))
    blocks = []
    for k in range(num_clients):
        idx = order[trace.client[order] == k]
        rows = np.stack([trace.arrival[idx], rank[idx], trace.prompt[idx], trace.output[idx], trace.cached[idx]],
                        axis=1).astype(np.int64 if wide_clock else np.int32).reshape(-1, NUM_FIELDS)
        blocks.append(np.concatenate([rows, padding_rows(int(sizes[k]) - len(idx), wide_clock)]))
    return np.concatenate(blocks) if blocks else padding_rows(0, wide_clock)


def trace_rows(trace: Trace, num_clients: int, pad: int) -> np.ndarray:
    """int64[R]: the trace row of each row of `layout_trace(trace, num_clients, pad)`
    (-1 for padding), so that what a lane reports per workload row reads per trace row."""
    order = np.lexsort((np.arange(len(trace)), trace.arrival))
    rows = layout_trace(trace, num_clients, pad)
    rank = rows[:, ORDER].astype(np.int64)
    return np.where(rank < len(trace), order[np.minimum(rank, len(trace) - 1)], -1)


def trace_work(trace: Trace) -> tuple[int, int, int]:
    """(sum of prompts, of outputs, of output x (prompt + output)): check_exact_limits's `work`."""
    p, o = trace.prompt.astype(object), trace.output.astype(object)
    return int(p.sum()), int(o.sum()), int((o * (p + o)).sum())


def wide_clock_for(trace: Trace) -> bool:
    """The trace's arrivals pass what an int32 clock runs (MAX_ARRIVAL): its run
    takes a wide clock (core/clock.py)."""
    return len(trace) > 0 and int(trace.arrival.max()) > MAX_ARRIVAL


def requests_per_client(trace: Trace, num_clients: int) -> np.ndarray:
    return np.bincount(trace.client, minlength=num_clients)


def make_workload(trace: Trace, num_clients: int, pad: int, horizon: int | None,
                  sizes: np.ndarray | None = None, wide_clock: bool = False) -> Workload:
    """Device layout of one trace, timeline included. `horizon=None` counts every request
    (drain mode). A wide clock's rows and timeline are int64 (made under clock.context)."""
    counts = requests_per_client(trace, num_clients)
    sizes = counts + pad if sizes is None else np.asarray(sizes)
    first, size = block_sizes(sizes - pad, pad)
    arrives = trace.arrival < horizon if horizon is not None else np.ones(len(trace), bool)
    rows = layout_trace(trace, num_clients, pad, sizes, wide_clock)
    return Workload(requests=jnp.asarray(rows), first=jnp.asarray(first), size=jnp.asarray(size),
                    num_requests=jnp.asarray(int(arrives.sum()), dtype=jnp.int32), overflow=jnp.asarray(False),
                    timeline=jnp.asarray(timeline_host(rows, first)))


def timeline_host(rows: np.ndarray, first: np.ndarray) -> np.ndarray:
    """numpy `timeline` of request rows int32[R, 5] in blocks starting at `first` (of the
    rows' dtype: int64 with a wide clock)."""
    order = np.argsort(rows[:, ORDER], kind="stable")
    block = np.searchsorted(first, order, side="right") - 1
    out = np.stack([order, block, rows[order, ARRIVAL]], axis=1).astype(rows.dtype)
    return np.concatenate([out, np.repeat(out[-1:], TIMELINE_PAD, axis=0)])


def pack_limit(num_rows: int) -> int:
    """Keys below this pack with their row number into one int32 (key * R + row)."""
    return (2 ** 31 - num_rows) // num_rows


def packable(keys: jax.Array) -> jax.Array:
    """bool[]: every ORDER key of int32[..., R] packs (`pack_limit`) or is a padding row's."""
    return jnp.all(((keys >= 0) & (keys < pack_limit(keys.shape[-1]))) | (keys == INT32_MAX))


def timeline_order(keys: jax.Array, packed: bool = False) -> jax.Array:
    """int32[R]: the rows of keys int32[R] in stable (key, row) order. `packed` (every key
    `packable`) sorts key * R + row as one int32 array, about 9x faster on CPU than the
    two-array stable sort and the same order: rows are distinct, and the padding key
    (INT32_MAX) becomes pack_limit, above every key that packs."""
    r = keys.shape[0]
    row = jnp.arange(r, dtype=jnp.int32)
    if packed:
        limit = pack_limit(r)
        return jax.lax.sort(jnp.where(keys == INT32_MAX, limit, keys) * r + row) % r
    return jax.lax.sort((keys, row), num_keys=1, is_stable=True)[1]


def in_stable_order(order: jax.Array, keys: jax.Array) -> jax.Array:
    """bool[]: rows int32[R] are in stable (key, row) order of keys int32[R], i.e. they
    are `timeline_order(keys)` (with distinct rows that order is the only sorted one)."""
    k = keys[order]
    return jnp.all((k[1:] > k[:-1]) | ((k[1:] == k[:-1]) & (order[1:] > order[:-1])))


def block_of_rows(first: jax.Array, num_rows: int) -> jax.Array:
    """int32[num_rows]: each row's block (client), from the blocks' sorted first rows
    int32[K]: the blocks begun at or before it, minus one (as a binary search of `first`,
    in one pass: no dependent gathers)."""
    return jnp.zeros(num_rows + 1, jnp.int32).at[first].add(1, mode="drop").cumsum()[:num_rows] - 1


def add_timeline(workload: Workload, order: jax.Array | None = None) -> Workload:
    """`workload` with its timeline (one stable sort by ORDER; jittable, one lane; `order`
    int32[R]: that sort's result, already known: `add_timelines`)."""
    rows, first = workload.requests, workload.first
    if order is None:
        order = timeline_order(rows[:, ORDER].astype(jnp.int32))
    if first.shape[0] <= 16:  # few clients: K compares a row
        block = (jnp.searchsorted(first, order, side="right", method="compare_all") - 1).astype(jnp.int32)
    else:  # many: each row's block by an O(R) count of block starts, read once per entry
        block = block_of_rows(first, rows.shape[0])[order]
    timeline = jnp.stack([order, block, rows[order, ARRIVAL]], axis=1)
    timeline = jnp.concatenate([timeline, jnp.broadcast_to(timeline[-1:], (TIMELINE_PAD, TIMELINE_FIELDS))])
    return dataclasses.replace(workload, timeline=timeline)


def add_timelines(workload: Workload, *, batched: bool) -> Workload:
    """`add_timeline` of one lane or of every lane (a leading lane axis). One decision for
    the batch (a per-lane choice would run every sort under vmap), fastest first:

    - every ORDER key packs: the packed sort by ORDER;
    - else every ARRIVAL packs: the packed sort by ARRIVAL, kept where every lane's result
      is `in_stable_order` of ORDER (generated traffic's rows, whose ORDER is arrival * K +
      client in client-major blocks, always are: K = 87's keys do not pack, arrivals do);
    - else the two-array stable sort by ORDER.

    A wide clock's rows (int64) have int32 ORDER keys, and arrivals that are not tried."""
    lanes = jax.vmap if batched else (lambda f: f)
    keys, arrivals = workload.requests[..., ORDER].astype(jnp.int32), workload.requests[..., ARRIVAL]
    stable = lambda _: lanes(timeline_order)(keys)  # noqa: E731
    packed = lanes(functools.partial(timeline_order, packed=True))

    def by_arrival(_):
        order = packed(arrivals)
        return jax.lax.cond(jnp.all(lanes(in_stable_order)(order, keys)), lambda _: order, stable, None)

    def unpacked(_):
        if arrivals.dtype != jnp.int32:
            return stable(None)
        return jax.lax.cond(packable(arrivals), by_arrival, stable, None)

    order = jax.lax.cond(packable(keys), lambda _: packed(keys), unpacked, None)
    return lanes(lambda w, o: add_timeline(w, order=o))(workload, order)


def client_rows(workload: Workload) -> np.ndarray:
    """Host view of a (batched) workload's blocks as int64[..., K, N, 5], one row of N per
    client (N = the largest block; short blocks padded with rows that never arrive)."""
    requests = np.asarray(workload.requests, np.int64)
    first, size = np.asarray(workload.first), np.asarray(workload.size)
    batch = requests.shape[:-2]
    requests = requests.reshape((-1,) + requests.shape[-2:])
    first = np.broadcast_to(first, batch + first.shape[-1:]).reshape(-1, first.shape[-1])
    size = np.broadcast_to(size, batch + size.shape[-1:]).reshape(-1, size.shape[-1])
    n = int(size.max())
    out = np.broadcast_to(padding_rows(1)[0].astype(np.int64), (requests.shape[0], first.shape[1], n, NUM_FIELDS)).copy()
    for b in range(requests.shape[0]):
        for k in range(first.shape[1]):
            out[b, k, : size[b, k]] = requests[b, first[b, k]: first[b, k] + size[b, k]]
    return out.reshape(batch + out.shape[1:])
