"""Traces and their device layout: per-client request streams.

A `Trace` is a host-side table of requests (numpy int64 columns, trace order). The engine
never keeps a waiting buffer: each client's requests are laid out once, sorted by
(arrival, number), as rows of `Workload.requests[k, i, :]`; the waiting FIFO of client k is
then the index range `[head_k, arrived_k)` (see engine.py).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.settings import INT32_MAX, InputError

# Fields of a request row in `Workload.requests[..., field]`.
ARRIVAL, ORDER, PROMPT, OUTPUT, CACHED = range(5)
NUM_FIELDS = 5
REQUIRED_COLUMNS = ("arrival", "client", "prompt", "output")
OPTIONAL_COLUMNS = ("cached",)
_INT_RE = re.compile(r"^[+]?\d+$")


@dataclasses.dataclass(frozen=True)
class Trace:
    """Requests in trace order (row i is request number i). All columns int64[N]."""

    arrival: np.ndarray
    client: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    cached: np.ndarray

    def __post_init__(self):
        cols = [np.asarray(getattr(self, f.name), dtype=np.int64) for f in dataclasses.fields(self)]
        for f, col in zip(dataclasses.fields(self), cols):
            object.__setattr__(self, f.name, col)
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

    def validate(self, num_clients: int | None = None) -> None:
        """Raise InputError naming the first bad row (1-based data row, as in the CSV)."""
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
        for col, name in ((self.arrival, "arrival"), (self.prompt, "prompt"), (self.output, "output")):
            checks.append((col > INT32_MAX // 4, f"{name} too large (limit {INT32_MAX // 4})"))
        for bad, message in checks:
            if bad.any():
                row = int(np.argmax(bad))
                raise InputError(f"row {row + 1}: {message} ({self._describe(row)})")

    def _describe(self, row: int) -> str:
        return (f"arrival={self.arrival[row]}, client={self.client[row]}, prompt={self.prompt[row]}, "
                f"output={self.output[row]}, cached={self.cached[row]}")


def read_trace_csv(path_or_text, *, source: str | None = None) -> Trace:
    """Read a trace CSV with header `arrival,client,prompt,output[,cached]`.

    Every value must be a non-negative decimal integer. Raises InputError naming the file,
    the row and the problem. `path_or_text` is a path, or an io.StringIO.
    """
    if isinstance(path_or_text, io.StringIO):
        text, source = path_or_text.getvalue(), source or "<text>"
    else:
        source = source or str(path_or_text)
        try:
            with open(path_or_text, "rb") as fh:
                raw = fh.read()
        except OSError as err:
            raise InputError(f"{source}: cannot read trace ({err.strerror})") from None
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise InputError(f"{source}: not a UTF-8 text file") from None
    if "\x00" in text:
        raise InputError(f"{source}: not a text CSV (contains NUL bytes)")
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
        while not any(cell.strip() for cell in header):  # blank lines before the header
            header = next(reader)
    except StopIteration:
        raise InputError(f"{source}: empty file (expected header {','.join(REQUIRED_COLUMNS)}[,cached])") from None
    except csv.Error as err:
        raise InputError(f"{source}: malformed CSV header ({err})") from None
    header = [h.strip() for h in header]
    for col in REQUIRED_COLUMNS:
        if col not in header:
            raise InputError(f"{source}: missing column {col!r} (header: {','.join(header)})")
    allowed = set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS)
    for col in header:
        if col not in allowed:
            raise InputError(f"{source}: unexpected column {col!r} (allowed: {','.join(REQUIRED_COLUMNS)},cached)")
    if len(set(header)) != len(header):
        raise InputError(f"{source}: duplicate column in header {','.join(header)}")
    columns = {name: [] for name in header}
    try:
        for line_no, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise InputError(f"{source}: line {line_no}: {len(row)} fields, header has {len(header)}")
            for name, cell in zip(header, row):
                cell = cell.strip()
                if not _INT_RE.match(cell):
                    raise InputError(f"{source}: line {line_no}: {name} must be a non-negative integer, got {cell!r}")
                digits = cell.lstrip("+").lstrip("0") or "0"
                if len(digits) > len(str(INT32_MAX)) or int(digits) > INT32_MAX:  # no int() of huge text
                    shown = digits if len(digits) <= 24 else digits[:24] + "..."
                    raise InputError(f"{source}: line {line_no}: {name} {shown} exceeds {INT32_MAX}")
                value = int(digits)
                columns[name].append(value)
    except csv.Error as err:
        raise InputError(f"{source}: malformed CSV ({err})") from None
    n = len(columns["arrival"])
    if n == 0:
        raise InputError(f"{source}: no requests (header only)")
    cached = columns.get("cached", [0] * n)
    trace = Trace(np.array(columns["arrival"]), np.array(columns["client"]), np.array(columns["prompt"]),
                  np.array(columns["output"]), np.array(cached))
    try:
        trace.validate()
    except InputError as err:
        # Data row r is file line r + 1 (the header is line 1).
        message = str(err)
        match = re.match(r"row (\d+): (.*)", message)
        if match:
            message = f"line {int(match.group(1)) + 1}: {match.group(2)}"
        raise InputError(f"{source}: {message}") from None
    return trace


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Workload:
    """A lane's request streams on device.

    Attributes:
      requests: int32[K, N, 5] per client k, its requests sorted by (arrival, number), fields
        (ARRIVAL, ORDER, PROMPT, OUTPUT, CACHED). ORDER is the request's rank in the global
        (arrival, number) order: FCFS picks the smallest. Rows past a client's last request
        are padding with ARRIVAL = ORDER = INT32_MAX (they never arrive).
      num_requests: int32[] requests that arrive before the horizon (drain mode waits for
        all of them to complete).
      overflow: bool[] a generated stream had more arrivals than rows: the lane is flagged
        as not finished (never silently shortened).
    """

    requests: jax.Array
    num_requests: jax.Array
    overflow: jax.Array


def pad_rows(count: int, arrival_width: int) -> int:
    """Stream length for `count` requests: room for the arrival look-ahead past the end."""
    return count + arrival_width + 1


def layout_streams(trace: Trace, num_clients: int, stream_len: int) -> np.ndarray:
    """Per-client sorted request rows, int32[K, stream_len, 5] (numpy)."""
    rows = np.zeros((num_clients, stream_len, NUM_FIELDS), dtype=np.int64)
    rows[:, :, ARRIVAL] = INT32_MAX
    rows[:, :, ORDER] = INT32_MAX
    rows[:, :, OUTPUT] = 1
    order = np.lexsort((np.arange(len(trace)), trace.arrival))  # FCFS order: (arrival, number)
    rank = np.empty(len(trace), dtype=np.int64)
    rank[order] = np.arange(len(trace))
    for k in range(num_clients):
        idx = order[trace.client[order] == k]
        if len(idx) + 1 > stream_len:
            raise InputError(f"client {k} has {len(idx)} requests; stream length {stream_len} too small")
        rows[k, : len(idx)] = np.stack(
            [trace.arrival[idx], rank[idx], trace.prompt[idx], trace.output[idx], trace.cached[idx]], axis=1)
    return rows.astype(np.int32)


def requests_per_client(trace: Trace, num_clients: int) -> np.ndarray:
    return np.bincount(trace.client, minlength=num_clients)


def make_workload(trace: Trace, num_clients: int, stream_len: int, horizon: int | None) -> Workload:
    """Device layout of one trace. `horizon=None` counts every request (drain mode)."""
    arrives = trace.arrival < horizon if horizon is not None else np.ones(len(trace), bool)
    return Workload(requests=jnp.asarray(layout_streams(trace, num_clients, stream_len)),
                    num_requests=jnp.asarray(int(arrives.sum()), dtype=jnp.int32),
                    overflow=jnp.asarray(False))
