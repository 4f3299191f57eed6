"""The readers the commands used before the one reader layer (inputs/request_log.py), kept
verbatim as literal references: the layer must read every log they read to the same
integers (tests/test_request_log.py)."""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal, InvalidOperation

import numpy as np

from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table
from vtc_jax.inputs.server_trace import ServerTrace
from vtc_jax.inputs.workload import MAX_ARRIVAL, MAX_LENGTH, Trace, read_trace_csv, trace_text

MAX_CLIENTS = 100_000
LOG_COLUMNS = ("timestamp", "tenant", "prompt", "output")
COLUMNS = ("arrival", "client", "prompt", "output")
OPTIONAL = ("priority", "prefix_id", "prefix_len")
MAX_PRIORITY = 1 << 30
_INT = re.compile(r"^[+-]?\d{1,10}$")


def read_log(path, step_seconds: float) -> tuple[Trace, list[str], int]:
    """A trace CSV in steps, or a timestamped log (timestamp,tenant,prompt,output[,cached];
    seconds, any tenant names) converted to steps: step = floor((t - t0) / step_seconds),
    tenants numbered by first appearance. Returns (trace, tenant names, steps per second)."""
    text = fileio.read_text(path, what="log")
    first_line = next((line for line in text.splitlines() if line.strip()), "")
    header = [h.strip() for h in next(csv.reader([first_line]), [])]
    if "timestamp" not in header:
        trace = read_trace_csv(io.StringIO(text), source=str(path))
        return trace, [str(k) for k in range(trace.num_clients)], 1
    # one table reader for every CSV: an unknown column (a typo such as `cachd`, whose
    # values would silently read as 0) or a repeated one is refused, naming it and the file
    header, records = fileio.csv_table(text, str(path), LOG_COLUMNS, ("cached",))
    rows, lines, names = [], [], {}
    for line_no, cells in records:
        cell = dict(zip(header, cells))
        try:  # exact decimals: 100.05 - 100.0 is 2 steps of 0.025 s, not 1.99999
            t = Decimal(cell["timestamp"]) if len(cell["timestamp"]) <= 40 else Decimal("nan")
        except InvalidOperation:
            raise InputError(f"{path}: line {line_no}: timestamp must be a number of seconds, "
                             f"got {cell['timestamp'][:24]!r}") from None
        if not t.is_finite() or t < 0 or t.adjusted() > 12:
            raise InputError(f"{path}: line {line_no}: timestamp must be a finite number of seconds in "
                             f"[0, 1e13), got {cell['timestamp'][:24]!r}")
        tenant = cell["tenant"]
        if not tenant:
            raise InputError(f"{path}: line {line_no}: empty tenant name")
        if tenant not in names and len(names) >= MAX_CLIENTS:
            raise InputError(f"{path}: line {line_no}: more than {MAX_CLIENTS} tenants")
        names.setdefault(tenant, len(names))
        ints = []
        for col in ("prompt", "output") + (("cached",) if "cached" in header else ()):
            if not re.fullmatch(r"\+?\d{1,10}", cell[col]):
                raise InputError(f"{path}: line {line_no}: {col} must be a non-negative integer, "
                                 f"got {cell[col][:24]!r}")
            ints.append(int(cell[col]))
        rows.append((t, tenant, *ints))
        lines.append(line_no)
    if not rows:
        raise InputError(f"{path}: no requests (header only)")
    # Time order (stable: equal timestamps keep the file's order) and tenants numbered by
    # first appearance in time: the order of the file's rows is no input.
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    rows, lines = [rows[i] for i in order], [lines[i] for i in order]
    names = {}
    for r in rows:
        names.setdefault(r[1], len(names))
    t0, step = rows[0][0], Decimal(repr(step_seconds))
    steps = np.asarray([min(int((r[0] - t0) // step), 1 << 31) for r in rows], np.int64)
    if steps.max() > (1 << 30):
        raise InputError(f"{path}: the log spans {steps.max():,} steps of {step_seconds} s, over the limit of "
                         f"{1 << 30:,}: use a larger --step-seconds")
    cached = [r[4] if len(r) > 4 else 0 for r in rows]
    trace = Trace(steps, np.asarray([names[r[1]] for r in rows]), np.asarray([r[2] for r in rows]),
                  np.asarray([r[3] for r in rows]), np.asarray(cached), lines=np.asarray(lines), source=str(path))
    trace.validate()  # names the file: the trace knows its source
    return trace, list(names), max(1, round(1.0 / step_seconds))



def read_timed_log(path):
    """(arrival_us int64[N] from the first timestamp, tenant int64[N], names, prompt, output,
    row int64[N] each request's data row in the file, 0-based), in time order (stable). A
    timestamped log: timestamp (seconds, exact decimals),tenant,prompt,output."""
    text = fileio.read_text(path, what="log")
    header, records = fileio.csv_table(text, str(path), LOG_COLUMNS)
    rows = []
    for number, (line, cells) in enumerate(records):
        cell = dict(zip(header, cells))
        try:
            t = Decimal(cell["timestamp"]) if len(cell["timestamp"]) <= 40 else Decimal("nan")
        except InvalidOperation:
            t = Decimal("nan")
        if not t.is_finite() or t < 0:
            raise InputError(f"{path}: line {line}: timestamp must be a number of seconds >= 0, "
                             f"got {cell['timestamp'][:24]!r}")
        if not cell["tenant"]:
            raise InputError(f"{path}: line {line}: empty tenant name")
        lengths = []
        for col in ("prompt", "output"):
            if not cell[col].isdigit() or len(cell[col]) > 9 or int(cell[col]) < 1:
                raise InputError(f"{path}: line {line}: {col} must be an integer >= 1, got {cell[col][:24]!r}")
            lengths.append(int(cell[col]))
        rows.append((t, cell["tenant"], *lengths, number))
    if not rows:
        raise InputError(f"{path}: no requests (header only)")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    us = [int((r[0] - t0) * 1_000_000) for r in rows]  # exact: truncated to the microsecond
    names: dict = {}
    tenant = [names.setdefault(r[1], len(names)) for r in rows]
    return (np.asarray(us, np.int64), np.asarray(tenant, np.int64), list(names),
            np.asarray([r[2] for r in rows], np.int64), np.asarray([r[3] for r in rows], np.int64),
            np.asarray([r[4] for r in rows], np.int64))


def _int(cell: str, name: str, where: str, low: int, high: int) -> int:
    if not _INT.match(cell):
        raise InputError(f"{where}: {name} must be an integer, got {cell[:24]!r}")
    value = int(cell)
    if not low <= value <= high:
        raise InputError(f"{where}: {name} {value} outside [{low}, {high}]")
    return value


def read_server_trace(path_or_text, *, source: str | None = None) -> ServerTrace:
    """Read the CSV (module docstring); every problem is one InputError naming the file
    and line."""
    text, source = trace_text(path_or_text, source)
    header, records = csv_table(text, source, COLUMNS, OPTIONAL)
    tenants: dict = {}
    cols = {name: [] for name in ("tenant", "arrival", "prompt", "output", "priority", "prefix_id", "prefix_len", "line")}
    for line, row in records:
        cell = dict(zip(header, row))
        where = f"{source}: line {line}"
        label = cell["client"]
        if not label:
            raise InputError(f"{where}: client is empty")
        prompt = _int(cell["prompt"], "prompt", where, 1, MAX_LENGTH)
        cols["tenant"].append(tenants.setdefault(label, len(tenants)))
        cols["arrival"].append(_int(cell["arrival"], "arrival", where, 0, MAX_ARRIVAL))
        cols["prompt"].append(prompt)
        cols["output"].append(_int(cell["output"], "output", where, 1, MAX_LENGTH))
        cols["priority"].append(_int(cell.get("priority") or "0", "priority", where, -MAX_PRIORITY, MAX_PRIORITY))
        prefix = cell.get("prefix_id") or None
        length = _int(cell.get("prefix_len") or "0", "prefix_len", where, 0, prompt)
        cols["prefix_id"].append(prefix)
        cols["prefix_len"].append(length)
        cols["line"].append(line)
    if not cols["arrival"]:
        raise InputError(f"{source}: no requests (header only)")
    arr = {k: np.asarray(v, np.int64) for k, v in cols.items() if k != "prefix_id"}
    return ServerTrace(tenants=tuple(tenants), tenant=arr["tenant"], arrival=arr["arrival"], prompt=arr["prompt"],
                       output=arr["output"], priority=arr["priority"], prefix_id=tuple(cols["prefix_id"]),
                       prefix_len=arr["prefix_len"], lines=arr["line"], source=source)
