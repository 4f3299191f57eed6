"""One reader for every request log a command takes: `read_requests(paths)` detects the
format of each file (`detect_format`), parses it (request_formats.py), merges several files
on their timestamps, numbers the tenants and checks that the times are plausible in their
unit. The result, a `RequestLog`, converts to the engine's step `Trace` (`steps_trace`) or to
exact microseconds for a timed server (`arrival_us`).

Formats (FORMATS): `trace` (integer steps, vtc-jax's own), `log` (timestamped CSV, any
tenant names), `azure` (Azure LLM inference 2023), `mooncake` (Mooncake FAST'25 JSONL),
`burstgpt` (BurstGPT CSV), `servegen` (a ServeGen directory, requests generated at the
data's own rates: request_formats.servegen_requests).

Times are exact: ns = floor((t - t_min) * ns_per_unit) over every file's timestamps, with
integer arithmetic (no float rounds an arrival). Tenants: a file's tenant column (trace
`client`, log `tenant`, or `tenant_from=COLUMN`), else one tenant per file named by
`default_tenant`; `tenants="a:0.6,b:0.4"` replaces them by a seeded split. Tenants are
numbered by first appearance in time order (ties in file order, files in the order given);
a trace's integer clients keep their ids. The content's prefix identity is kept exactly:
Mooncake's or a CSV's `hash_ids` and a CSV's `session_id` (inputs/prefix_blocks.py).

Speed (2-core machine, cyclic GC paused while parsing): a generated 1M-row `log` reads in
about 4 s, a 1M-line Mooncake file with 4.5M hash ids in about 6.5 s.
"""

from __future__ import annotations

import csv
import dataclasses
import gc
import glob
import io
import os
import stat
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.inputs import prefix_blocks as pb
from vtc_jax.inputs import request_formats as rf
from vtc_jax.inputs.workload import Trace

FORMATS = ("trace", "log", "azure", "mooncake", "burstgpt", "servegen")
TIME_UNITS = {"s": 10**9, "ms": 10**6, "us": 10**3}
UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}
DEFAULT_UNITS = {"log": "s", "burstgpt": "s", "mooncake": "ms"}
MAX_TENANTS = 100_000  # the CLI's MAX_CLIENTS (cli/scheduler_flags.py): one limit on tenants per lane
MAX_STEPS = 1 << 30
_NS_LIMIT = (1 << 63) - 1
_SNIFF_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class RequestLog:
    """Requests of one or more files, merged; int64[N] columns (see the module docstring).
    Timed formats are in time order (stable); a single trace file keeps its row order."""

    format: str
    timed: bool
    arrival: np.ndarray
    client: np.ndarray
    tenants: tuple
    prompt: np.ndarray
    output: np.ndarray
    cached: np.ndarray
    priority: np.ndarray
    prefix_len: np.ndarray
    prefix_id: tuple
    lines: np.ndarray
    file: np.ndarray
    rows: np.ndarray  # int64[N]: each request's 0-based data row over the files in order (`data_rows`)
    sources: tuple
    columns: frozenset
    unit: str | None
    skipped: tuple = ()
    warning: str | None = None
    window: tuple | None = None  # (start, seconds) of `windowed`, for the summary
    hash_ids: tuple | None = None  # per request a tuple of ids (empty: none); None: the input has none
    session: tuple | None = None  # per request a session label or None; None: the input has no session_id
    hash_block: int = rf.BLOCK_TOKENS  # tokens per hash id

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    def span_seconds(self) -> float | None:
        """Timed: (last - first arrival) in seconds; trace: None."""
        if not self.timed:
            return None
        return (int(self.arrival.max()) - int(self.arrival.min())) / 1e9

    def _name(self) -> str:
        return ", ".join(self.sources) if len(self.sources) <= 3 else f"{self.sources[0]} and {len(self.sources) - 1} more"

    def summary(self) -> str:
        """One line: files, format, requests, tenants by count, span, rate, mean lengths."""
        n = len(self)
        counts = np.bincount(self.client, minlength=len(self.tenants))
        ranked = sorted(range(len(self.tenants)), key=lambda k: (-counts[k], k))
        shown = ", ".join(f"{shown_name(self.tenants[k])} {counts[k]:,}" for k in ranked[:6])
        more = f", +{len(ranked) - 6} more" if len(ranked) > 6 else ""
        k = len(self.tenants)
        parts = [f"read {self._name()} ({self.format}): {n:,} request{'s' * (n != 1)}",
                 f"{k:,} tenant{'s' * (k != 1)} ({shown}{more})"]
        if self.timed:
            span, rate = self.span_seconds(), request_rate(n, self.span_seconds())
            parts.append(f"span {span:,.1f} s" + (f", {rate:,.2f} requests/s" if rate is not None else ""))
        else:
            span = int(self.arrival.max() - self.arrival.min())
            rate = request_rate(n, span)
            parts.append(f"span {span:,} steps" + (f", {rate:,.2f} requests/step" if rate is not None else ""))
        if self.window is not None:
            parts.append(f"window [{self.window[0]:g}, {self.window[0] + self.window[1]:g}) s of the input")
        parts.append(f"prompt mean {self.prompt.mean():,.0f}, output mean {self.output.mean():,.0f}")
        parts += [f"skipped {count:,} {reason}" for count, reason in self.skipped]
        return ", ".join(parts)

    def steps_trace(self, step_seconds: str | float | None = None) -> Trace:
        """The engine's Trace: a trace's rows as they are (no step_seconds), a timed log's
        arrivals as step floor(ns / step_ns) (step_ns the exact ns of `step_seconds`)."""
        if not self.timed:
            if step_seconds is not None:
                raise InputError(f"{self._name()}: a trace is in steps already (no --step-seconds)")
            steps = self.arrival
        else:
            if step_seconds is None:
                raise InputError(f"{self._name()}: a timed log needs a step length (--step-seconds)")
            step_ns = _step_ns(step_seconds)
            steps = self.arrival // step_ns
            if len(self) and int(steps.max()) > MAX_STEPS:
                raise InputError(f"{self._name()}: the log spans {int(steps.max()):,} steps of {step_seconds} s, over "
                                 f"the limit of {MAX_STEPS:,}: use a larger --step-seconds")
        trace = Trace(steps, self.client, self.prompt, self.output, self.cached, lines=self.lines,
                      source=self.sources[0])
        trace.validate()
        return trace

    def arrival_us(self) -> np.ndarray:
        """Timed: int64[N] arrivals in whole microseconds (floor) from the earliest."""
        if not self.timed:
            raise InputError(f"{self._name()}: a trace is in steps, not timed")
        return self.arrival // 1000


def _step_ns(step_seconds) -> int:
    text = step_seconds if isinstance(step_seconds, str) else repr(float(step_seconds))
    try:
        ns = rf.whole_ns(Decimal(text.strip()))
    except InvalidOperation:
        ns = None
    if ns is None:
        raise InputError(f"--step-seconds {step_seconds}: must be a positive whole number of nanoseconds")
    return ns


def is_stream(path) -> bool:
    """A pipe, FIFO or device (not a regular file nor a directory): it can be read once only."""
    try:
        mode = os.stat(os.fspath(path)).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def detect_format(path, text: str | None = None) -> str:
    """The format of `path` from its first bytes (module docstring; a directory is servegen),
    or of `text`, a stream's whole content already read."""
    path = os.fspath(path)
    if text is not None:
        return _format_of_head(path, text.encode("utf-8")[:_SNIFF_BYTES])
    if os.path.isdir(path):
        if not glob.glob(os.path.join(glob.escape(path), "chunk-*-trace.csv")):
            raise InputError(f"{path}: is a directory, not a ServeGen directory (no chunk-<id>-trace.csv files)")
        return "servegen"
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as err:
        raise InputError(f"{path}: cannot read file ({err.strerror or err})") from None
    if not regular:  # a stream is read whole once (read_requests), never sniffed
        raise InputError(f"{path}: a pipe or device: read it with read_requests (or give --format)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError as err:
        raise InputError(f"{path}: cannot read file ({err.strerror or err})") from None
    return _format_of_head(path, head)


def _format_of_head(path: str, head: bytes) -> str:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:  # not a character cut by the sniff's end
            raise InputError(f"{path}: not a UTF-8 text file") from None
    if b"\x00" in head:
        raise InputError(f"{path}: not a text file (contains NUL bytes)")
    text = head.decode("utf-8-sig", errors="replace").lstrip("\ufeff")
    stripped = text.lstrip()
    if not stripped:
        raise InputError(f"{path}: empty file (no header to tell its format from)")
    if stripped[0] == "{":
        return "mooncake"
    try:  # the first record (a quoted newline stays inside its cell)
        cells = next(csv.reader(io.StringIO(stripped, newline="")), [])
    except csv.Error:
        cells = stripped.splitlines()[:1]
    first = ",".join(cells)
    header = {h.strip() for h in cells}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    if "timestamp" in header:
        return "log"
    if "arrival" in header or "client" in header:  # the trace reader names a missing column
        return "trace"
    if "tenant" in header:
        return "log"
    raise InputError(f"{path}: cannot tell the format from the header {first[:80]!r}: give --format "
                     f"(one of {', '.join(FORMATS)})")


def default_tenant(path, fmt: str) -> str:
    """A file's tenant when it has no tenant column: azure the name's part after the last
    `_` (AzureLLMInferenceTrace_conv.csv -> conv), else the file's stem."""
    stem = Path(path).stem or Path(path).name
    if fmt == "azure" and "_" in stem and stem.rsplit("_", 1)[1]:
        return stem.rsplit("_", 1)[1]
    return stem


def parse_split(text: str) -> tuple[tuple, np.ndarray]:
    """(names, probabilities float64[K]) of `tenants="a:0.6,b:0.4"`."""
    names, weights = [], []
    for item in text.split(","):
        name, sep, weight = item.strip().partition(":")
        name = name.strip()
        try:
            w = float(weight)
        except ValueError:
            w = float("nan")
        if not sep or not name or not np.isfinite(w) or w <= 0:
            raise InputError(f"--tenants {text}: each item must be NAME:WEIGHT with a positive finite weight, "
                             f"got {item.strip()!r}")
        if name in names:
            raise InputError(f"--tenants {text}: tenant {name!r} is named twice")
        names.append(name)
        weights.append(w)
    if len(names) > MAX_TENANTS:
        raise InputError(f"--tenants: {len(names):,} tenants, over the limit of {MAX_TENANTS:,}")
    weights = np.asarray(weights, np.float64)
    weights = weights / weights.max()  # relative: weights near the float limit do not overflow the sum
    return tuple(names), weights / weights.sum()


def _parse_file(path: str, fmt: str, unit: str | None, tenant_from: str | None, text: str | None = None,
                hash_block: int = rf.BLOCK_TOKENS) -> rf.FileRows:
    """One file parsed with the cyclic garbage collector paused: a million rows make
    millions of small lists and dicts, no cycles, and each collection pass would walk them all."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_text(path, fmt, unit, tenant_from, text, hash_block)
    finally:
        if enabled:
            gc.enable()


def _parse_text(path: str, fmt: str, unit: str | None, tenant_from: str | None, text: str | None = None,
                hash_block: int = rf.BLOCK_TOKENS) -> rf.FileRows:
    if text is None:
        text = fileio.read_text(path, what="log" if fmt != "trace" else "trace")
    if fmt == "trace":
        return rf.parse_trace(text, path, tenant_from, hash_block)
    if fmt == "azure":
        return rf.parse_azure(text, path, tenant_from)
    if fmt == "burstgpt":
        return rf.parse_burstgpt(text, path, TIME_UNITS[unit], UNIT_NAMES[unit], tenant_from)
    parser = {"log": rf.parse_log, "mooncake": rf.parse_mooncake}[fmt]
    return parser(text, path, TIME_UNITS[unit], UNIT_NAMES[unit], tenant_from, hash_block)


def _ns(parts: list, ns_per_unit: int) -> np.ndarray:
    """int64[N] exact ns from the earliest of the files' scaled times."""
    top = max(p.scale for p in parts)
    scaled = []
    for p in parts:
        factor = ns_per_unit * 10 ** (top - p.scale)
        scaled.extend([v * factor for v in p.times] if factor != 1 else p.times)
    low = min(scaled)
    div = 10**top
    if (max(scaled) - low) // div > _NS_LIMIT:
        raise InputError(f"{parts[0].source}: the log spans over 292 years")
    try:
        diff = np.asarray(scaled, np.int64) - np.int64(low)
        if div == 1:
            return diff
        return diff // np.int64(div) if div <= _NS_LIMIT else np.asarray([(v - low) // div for v in scaled], np.int64)
    except OverflowError:
        return np.asarray([(v - low) // div for v in scaled], np.int64)


def _number(labels: list) -> tuple[np.ndarray, tuple]:
    ids: dict = {}
    client = np.fromiter((ids.setdefault(x, len(ids)) for x in labels), np.int64, len(labels))
    return client, tuple(ids)


def request_rate(n: int, span) -> float | None:
    """The one request rate of a log: n requests over the span of their arrivals (n / span,
    in requests per the span's unit; what `vllm bench serve` calls the request rate, requests
    over the duration), None when the span is 0 (one instant has no rate). The summary line
    and the unit check use it, so every rate of a log agrees."""
    span = float(span) if span is not None else 0.0
    return n / span if span > 0 else None


_PLAIN_NAME = frozenset(",=\"")


def shown_name(name: str) -> str:
    """A tenant's name as printed in lists (`0=a, 1=b`; `a 3, b 2`): quoted, CSV-style
    ("a,b"; an inner quote doubled), when it holds a comma, '=', a quote or white space, or
    is empty, so that the list reads back unambiguously; else as it is."""
    text = str(name)
    if text and not any(c in _PLAIN_NAME or c.isspace() for c in text):
        return text
    return '"' + text.replace('"', '""') + '"'


def _integer_clients(labels: list) -> bool:
    return all(x.isascii() and x.lstrip("+").isdigit() for x in labels)


def _plausibility(name: str, ns: np.ndarray, unit: str, given: bool) -> str | None:
    """The warning for an implausible span or rate (None when plausible)."""
    n = len(ns)
    span = (int(ns.max()) - int(ns.min())) / 1e9 if n else 0.0
    if span <= 0:
        return None
    rate = request_rate(n, span)
    slow = span > 2 * 86400 or (n >= 100 and rate < 1 / 60)
    if not slow and rate <= 100_000:
        return None
    order = list(TIME_UNITS)
    guess = order[min(order.index(unit) + 1, 2)] if slow else order[max(order.index(unit) - 1, 0)]
    shown = f"{span / 86400:,.1f} days" if span > 2 * 86400 else f"{span:,.1f} s"
    said = f"{name}: read as {UNIT_NAMES[unit]} the log spans {shown} at {rate:,.4g} requests/s, implausible"
    if given:
        return f"{said}; running it as read (--time-unit {unit})"
    if guess == unit:
        return f"{said}: give --time-unit {unit} to run it as read"
    return f"{said} (timestamps in {guess}?): give --time-unit {guess}, or --time-unit {unit} to run it as read"


def read_requests(paths, *, format=None, time_unit=None, tenant_from=None, tenants=None, split_seed=0,
                  servegen_window=None, hash_block=rf.BLOCK_TOKENS) -> RequestLog:
    """Read one or more request files of one format into a RequestLog (module docstring);
    every problem is one InputError naming the file (and line). hash_block: the tokens per
    hash id (Mooncake's 512; a CSV's hash_ids column)."""
    if isinstance(hash_block, bool) or not isinstance(hash_block, (int, np.integer)) or not 1 <= hash_block <= 1 << 20:
        raise InputError(f"--hash-block {hash_block}: must be a whole number of tokens in [1, {1 << 20:,}]")
    paths = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    if not paths:
        raise InputError("no input file given")
    if format is not None and format not in FORMATS:
        raise InputError(f"--format {format}: unknown (one of {', '.join(FORMATS)})")
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise InputError(f"--time-unit {time_unit}: unknown (one of {', '.join(TIME_UNITS)})")
    if tenant_from is not None and tenants is not None:
        raise InputError("give --tenant-from or --tenants, not both")
    split = parse_split(tenants) if tenants is not None else None
    _refuse_repeated(paths)
    streams = {p: fileio.read_text(p, what="input") for p in paths if is_stream(p)}  # a pipe is read once
    formats = [format or detect_format(p, streams.get(p)) for p in paths]
    for p, f in zip(paths, formats):
        if f != formats[0]:
            raise InputError(f"{paths[0]} is {formats[0]} but {p} is {f}: give files of one format")
    fmt = formats[0]
    if fmt == "servegen":
        if len(paths) > 1:
            raise InputError(f"{paths[1]}: give one ServeGen directory")
        if time_unit is not None:
            raise InputError(f"--time-unit: {paths[0]} is a ServeGen directory (its times are seconds)")
        if tenant_from is not None:
            raise InputError(f"--tenant-from: {paths[0]} is a ServeGen directory (its tenants are its clients)")
        cols = rf.servegen_requests(paths[0], seed=split_seed, window=servegen_window)
        return _assemble("servegen", [paths[0]], cols, split, split_seed, None, None)
    if fmt == "trace" and time_unit is not None:
        raise InputError(f"--time-unit {time_unit}: {paths[0]} is a trace (a trace is in steps)")
    if fmt == "azure" and time_unit is not None:
        raise InputError(f"--time-unit {time_unit}: {paths[0]}: azure timestamps are wall-clock times")
    unit = time_unit or DEFAULT_UNITS.get(fmt)
    parts = [_parse_file(p, fmt, unit, tenant_from, streams.get(p), int(hash_block)) for p in paths]
    labels = []
    for p, path in zip(parts, paths):
        labels.extend(p.labels if p.labels is not None else [default_tenant(path, fmt)] * len(p.lines))
    if split is None and len(paths) > 1 and all(p.labels is None for p in parts):
        names = [default_tenant(p, fmt) for p in paths]
        dup = next((x for x in names if names.count(x) > 1), None)
        if dup is not None:
            raise InputError(f"two files give the tenant name {dup!r} ({', '.join(paths)}): rename one or give --tenants")
    timed = fmt != "trace"
    arrival = _ns(parts, TIME_UNITS[unit] if unit else 1) if timed else np.asarray(
        [t for p in parts for t in p.times], np.int64)
    cols = {
        "arrival": arrival,
        "labels": labels,
        "prompt": np.concatenate([p.prompt for p in parts]),
        "output": np.concatenate([p.output for p in parts]),
        "cached": np.concatenate([p.cached for p in parts]),
        "priority": np.concatenate([p.priority for p in parts]),
        "prefix_len": np.concatenate([p.prefix_len for p in parts]),
        "prefix_id": _prefix_ids(parts, fmt),
        "lines": np.concatenate([p.lines for p in parts]),
        "rows": _data_rows(parts),
        "file": np.concatenate([np.full(len(p.lines), i, np.int64) for i, p in enumerate(parts)]),
        "columns": set().union(*(p.columns for p in parts)),
        "skipped": _merge_skipped(parts),
        "integer_clients": fmt == "trace" and tenant_from in (None, "client") and _integer_clients(labels),
        "hash_ids": _content_column(parts, "hash_ids", ()),
        "session": _content_column(parts, "session", None),
        "hash_block": int(hash_block),
    }
    return _checked_sessions(_assemble(fmt, paths, cols, split, split_seed, unit, time_unit))


def _content_column(parts, name: str, missing) -> list | None:
    """The files' `name` content column (hash_ids, session), `missing` for a file without
    it, None when no file has it."""
    if all(getattr(p, name) is None for p in parts):
        return None
    return [x for p in parts for x in (getattr(p, name) if getattr(p, name) is not None else [missing] * len(p.lines))]


def _checked_sessions(log: RequestLog) -> RequestLog:
    """The log, when each turn of a session (arrival order, a session being file-local)
    begins with the previous turn's whole sequence: P_k >= P_{k-1} + O_{k-1}; else one
    InputError naming both lines. Hash ids and sessions together are refused (one content
    identity per input)."""
    if log.session is None:
        return log
    if log.hash_ids is not None:
        raise InputError(f"{log._name()}: give hash_ids or session_id, not both (one prefix identity per input)")
    broken = pb.session_break(pb.session_key(log.session, log.file), log.prompt, log.output)
    if broken is not None:
        k, q = broken
        raise InputError(f"{log.sources[log.file[k]]}: line {log.lines[k]}: session {shown_name(log.session[k])}: "
                         f"prompt {log.prompt[k]:,} is shorter than the previous turn's prompt + output "
                         f"({log.prompt[q]:,} + {log.output[q]:,} at {log.sources[log.file[q]]} line {log.lines[q]}): "
                         f"a turn begins with the last turn's whole sequence")
    return log


def _refuse_repeated(paths: list) -> None:
    """One file given twice (by any path: os.path.samefile's test, device and inode) would
    read every request of it twice: refused, naming it. A path that cannot be stat'ed is
    left to the reader, which names the problem."""
    seen: dict = {}
    for i, path in enumerate(paths):
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            continue
        first = paths[seen.setdefault((st.st_dev, st.st_ino), i)]
        if seen[(st.st_dev, st.st_ino)] != i:
            same = "" if first == path else f" (the same file as {first})"
            raise InputError(f"{path}: given twice{same}: each of its requests would be read twice; give it once")


def _data_rows(parts) -> np.ndarray:
    """int64[N]: each request's 0-based data row over the files in the order given (a file's
    rows follow the previous file's last data row, dropped rows counted)."""
    starts = np.cumsum([0] + [p.data_rows for p in parts[:-1]])
    return np.concatenate([p.rows + start for p, start in zip(parts, starts)])


def _prefix_ids(parts, fmt: str) -> list:
    """The files' prefix ids; Mooncake's hash ids are file-local, so several files' groups
    are told apart by the file's index ("1:0/14")."""
    local = fmt == "mooncake" and len(parts) > 1
    return [g if g is None or not local else f"{i}:{g}" for i, p in enumerate(parts) for g in p.prefix_id]


def _merge_skipped(parts) -> tuple:
    totals: dict = {}
    for p in parts:
        for count, reason in p.skipped:
            totals[reason] = totals.get(reason, 0) + count
    return tuple((count, reason) for reason, count in totals.items())


def _assemble(fmt: str, paths: list, cols: dict, split, split_seed: int, unit, given_unit) -> RequestLog:
    """Order (timed: stable by time; several traces: stable by step), tenants, plausibility."""
    arrival = cols["arrival"]
    timed = fmt != "trace"
    if timed or len(paths) > 1:
        order = np.argsort(arrival, kind="stable")
    else:
        order = np.arange(len(arrival))
    labels = cols["labels"]
    time_order = np.argsort(arrival, kind="stable")
    if split is not None:
        names, probs = split
        draws = np.random.default_rng(split_seed).choice(len(names), size=len(arrival), p=probs)
        drawn = np.empty(len(arrival), np.int64)
        drawn[time_order] = draws
        labels = [names[d] for d in drawn]
    if split is None and cols.get("integer_clients"):
        ids = np.asarray([int(x) for x in labels], np.int64)
        if int(ids.max()) >= MAX_TENANTS:
            i = int(np.argmax(ids >= MAX_TENANTS))
            raise InputError(f"{paths[int(cols['file'][i])]}: line {cols['lines'][i]}: client id {ids[i]} over the "
                             f"limit of {MAX_TENANTS:,} tenants")
        client, tenants = ids[order], tuple(str(k) for k in range(int(ids.max()) + 1))
    else:
        client, tenants = _number([labels[i] for i in order])
    if len(tenants) > MAX_TENANTS:
        raise InputError(f"{paths[0]}: {len(tenants):,} tenants, over the limit of {MAX_TENANTS:,}")
    warning = _plausibility(", ".join(paths), arrival, unit, given_unit is not None) if timed and unit else None
    if warning and given_unit is None:
        raise InputError(warning)
    take = {k: cols[k][order] for k in ("prompt", "output", "cached", "priority", "prefix_len", "lines", "file", "rows")}
    content = {k: None if cols.get(k) is None else tuple(cols[k][i] for i in order) for k in ("hash_ids", "session")}
    return RequestLog(format=fmt, timed=timed, arrival=arrival[order], client=client, tenants=tenants,
                      prefix_id=tuple(cols["prefix_id"][i] for i in order), sources=tuple(paths),
                      columns=frozenset(cols["columns"]), unit=unit, skipped=tuple(cols["skipped"]), warning=warning,
                      hash_block=cols.get("hash_block", rf.BLOCK_TOKENS), **content, **take)


def prefix_fidelity(log: RequestLog) -> float:
    """Cached tokens under the vllm prefix tables' group rule over those under the exact
    trie (log.cached): how much of Mooncake's sharing the (prefix_id, prefix_len) columns keep."""
    exact = int(log.cached.sum())
    if exact == 0:
        return 1.0
    order = np.argsort(log.arrival, kind="stable")
    group = rf.group_cached([log.prefix_id[i] for i in order], log.prefix_len[order], log.prompt[order])
    return int(group.sum()) / exact


_PER_REQUEST = ("prompt", "output", "cached", "priority", "prefix_len", "lines", "file", "rows")


def _subset(log: RequestLog, keep: np.ndarray, **changes) -> RequestLog:
    """The requests `keep` (int64[n] indices, in order) of `log`, each with its columns,
    file line and data row as read; tenants renumbered by first appearance (a tenant left
    with no request is gone), except a trace's integer client ids, which are kept (ids)."""
    client, tenants = log.client[keep], log.tenants
    if log.timed or tenants != tuple(str(k) for k in range(len(tenants))):
        ids: dict = {}
        client = np.asarray([ids.setdefault(int(c), len(ids)) for c in client], np.int64)
        tenants = tuple(log.tenants[c] for c in ids)
    columns = {name: getattr(log, name)[keep] for name in _PER_REQUEST + ("arrival",)}
    columns.update(client=client, tenants=tenants, prefix_id=tuple(log.prefix_id[i] for i in keep))
    for name in ("hash_ids", "session"):  # the content identity: a kept turn still extends its kept predecessor
        if getattr(log, name) is not None:
            columns[name] = tuple(getattr(log, name)[i] for i in keep)
    return dataclasses.replace(log, **{**columns, **changes})


def windowed(log: RequestLog, start_s: float, seconds: float) -> RequestLog:
    """A timed log's requests arriving in [start, start + seconds) s after its first, re-based
    (the earliest kept at 0), tenants renumbered by first appearance, data rows as read;
    columns derived from the whole log as read (Mooncake's `cached`, `prefix_len`)."""
    if not log.timed:
        raise InputError(f"{log._name()}: --window is in seconds, and a trace is in steps (use --steps)")
    lo = int(round(start_s * 1e9))
    hi = lo + int(round(seconds * 1e9))
    keep = np.flatnonzero((log.arrival >= lo) & (log.arrival < hi))
    if keep.size == 0:
        raise InputError(f"{log._name()}: no request arrives in the window [{start_s:g}, {start_s + seconds:g}) s "
                         f"(the input spans {log.span_seconds():,.1f} s)")
    return _subset(log, keep, arrival=log.arrival[keep] - log.arrival[keep].min(), window=(start_s, seconds))


def load_scaled(log: RequestLog, factor: float) -> RequestLog:
    """`factor` times the log's load: each arrival's time since the first divided by it (ns)."""
    if not log.timed:
        raise InputError(f"{log._name()}: --load-scale needs arrival times (a trace is in steps)")
    first = log.arrival.min()
    scaled = first + np.round((log.arrival - first) / float(factor)).astype(np.int64)
    return _subset(log, np.arange(len(log.arrival)), arrival=scaled)


def servable(log: RequestLog, max_prompt: int) -> tuple[RequestLog, int]:
    """(the log without its requests whose prompt exceeds `max_prompt` tokens, how many were
    dropped), as a server's API rejects a request that can never fit and serves the rest:
    the kept keep their arrival, file line and data row (and Mooncake's `cached`,
    `prefix_len`); `skipped` counts the dropped. InputError when none would be left."""
    max_prompt = int(max_prompt)
    over = log.prompt > max_prompt
    dropped = int(over.sum())
    if dropped == 0:
        return log, 0
    if dropped == len(log):
        raise InputError(f"{log._name()}: every request's prompt exceeds the server's memory of {max_prompt:,} tokens "
                         f"(shortest: {int(log.prompt.min()):,}): nothing to run")
    reason = f"requests whose prompt exceeds the server's memory of {max_prompt:,} tokens"
    return _subset(log, np.flatnonzero(~over), skipped=tuple(log.skipped) + ((dropped, reason),)), dropped
