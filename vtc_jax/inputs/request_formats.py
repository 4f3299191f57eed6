"""One row parser per public trace format: text in, columns out (`FileRows`), every problem
one InputError naming the file and line. request_log.py merges files, numbers tenants and
converts times; nothing here knows about other files.

Times stay exact: a decimal timestamp `I.F` is kept as the integer IF scaled by 10^len(F)
(`FileRows.times`, `FileRows.scale`), so no float ever rounds an arrival; azure's wall clock
is kept as integer ns since 0001-01-01 (scale 0, already ns).

Mooncake `hash_ids` (blocks of H = 512 tokens, `hash_block`; equal leading ids = a shared
prefix) are kept exactly (`FileRows.hash_ids`: inputs/prefix_blocks.py derives block ids at
any block size from them) and give two things (512 below is H):
  - `cached` = 512 x the length of the longest prefix of the request's id list that is a
    prefix of an earlier request's list (earlier in time, ties in file order: a trie, O(total
    ids)), capped at prompt - 1: what an unbounded prefix cache would hold;
  - the vllm prefix tables: `prefix_id` = the first two ids joined ("0/14"; one id when the
    list has one) and `prefix_len` = min(prompt, 512 x the most leading ids the request shares
    with ANY other request of the same prefix_id, earlier or later; 0 when it has none).
request_log.prefix_fidelity, the group rule's cached tokens (a request finds the most of its
prefix_len that an earlier request of its group holds) over the trie's: 0.9344 on
data/mooncake_fast25/conversation_trace.jsonl, 1.0008 on synthetic_trace.jsonl (the group
rule may also overstate: two requests of a group that share with different later ones).
Mooncake's ids are chained (an id always follows the same id), so both tables are flat numpy
tables (`chained_blocks`); other ids take the dict tries.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import itertools
import json
import re
from decimal import Decimal, InvalidOperation

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table
from vtc_jax.inputs.workload import INT32_MAX, MAX_LENGTH, Trace

MAX_PRIORITY = 1 << 30
BLOCK_TOKENS = 512  # Mooncake's tokens per hash id
MAX_TIMESTAMP_SECONDS = 10**13
OPTIONAL_COLUMNS = ("cached", "priority", "prefix_id", "prefix_len")
CONTENT_COLUMNS = ("session_id", "hash_ids")  # the content's prefix identity (inputs/prefix_blocks.py)
TRACE_COLUMNS = ("arrival", "client", "prompt", "output")
LOG_COLUMNS = ("timestamp", "tenant", "prompt", "output")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Log Type")
_DIGITS = re.compile(r"(?:\+?\d{1,10}\n)*", re.ASCII)
_SIGNED = re.compile(r"[+-]?\d{1,10}", re.ASCII)
_PLAIN_DECIMALS = re.compile(r"(?:\+?(?:\d+\.?\d*|\.\d+)\n)*", re.ASCII)
_AZURE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?", re.ASCII)
_MAX_FRACTION = 40
_INT_TYPE = frozenset({int})  # bool is not int here: type(), not isinstance


@dataclasses.dataclass
class FileRows:
    """One file's requests in file order. times: list[int] (trace: steps; log, burstgpt,
    mooncake: the timestamp x 10^scale in the file's unit; azure: ns); labels: the tenant
    cell of each row (None: the file has no tenant column, it is one tenant); the int64[N]
    columns; columns: the optional ones present; skipped: (count, reason) pairs; rows:
    int64[N] each request's 0-based data row in the file (records after the header, blank
    lines not counted, rows dropped on purpose still counted: default 0..N-1); data_rows:
    the file's data rows, dropped ones included (default N); hash_ids: per request a tuple
    of ints (empty: none), None when the file has no hash ids; session: per request a
    session label or None, None when the file has no session column."""

    source: str
    times: list
    scale: int
    labels: list | None
    prompt: np.ndarray
    output: np.ndarray
    cached: np.ndarray
    priority: np.ndarray
    prefix_len: np.ndarray
    prefix_id: list
    lines: np.ndarray
    columns: set
    skipped: list = dataclasses.field(default_factory=list)
    rows: np.ndarray | None = None
    data_rows: int | None = None
    hash_ids: list | None = None
    session: list | None = None

    def __post_init__(self):
        if self.rows is None:
            self.rows = np.arange(len(self.lines), dtype=np.int64)
        if self.data_rows is None:
            self.data_rows = len(self.lines)


def _shown(cell) -> str:
    text = str(cell)
    return repr(text if len(text) <= 24 else text[:24] + "...")


def int_column(cells: list, lines, source: str, name: str, low: int, high: int, default: int | None = None) -> np.ndarray:
    """int64[N] of decimal integer cells in [low, high] (an empty cell is `default` when
    given); one regex over the whole column on the fast path, a scan only to name a bad line."""
    if default is not None:
        cells = [c or str(default) for c in cells]
    if low >= 0 and _DIGITS.fullmatch("\n".join(cells) + "\n" if cells else ""):
        values = np.array(list(map(int, cells)), np.int64)
    else:
        for i, cell in enumerate(cells):
            if not _SIGNED.fullmatch(cell) or (low >= 0 and cell.startswith("-")):
                kind = "an integer" if low < 0 else "a non-negative integer"
                raise InputError(f"{source}: line {lines[i]}: {name} must be {kind}, got {_shown(cell)}")
        values = np.array(list(map(int, cells)), np.int64)
    bad = (values < low) | (values > high)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"{source}: line {lines[i]}: {name} {values[i]} outside [{low:,}, {high:,}]")
    return values


def decimal_column(cells: list, lines, source: str, name: str, unit_name: str) -> tuple[list, int]:
    """(values, scale): each cell an exact non-negative finite decimal, value = cell x 10^scale
    as a Python int (scale = the most fraction digits of the column). Plain `12.345` cells
    take the fast path; others (`1e3`) go through Decimal."""
    if not _PLAIN_DECIMALS.fullmatch("\n".join(cells) + "\n" if cells else ""):
        cells = [_plain_decimal(c, lines[i], source, name, unit_name) for i, c in enumerate(cells)]
    parts = [c.lstrip("+").partition(".") for c in cells]
    scale = max((len(p[2]) for p in parts), default=0)
    if scale > _MAX_FRACTION:
        i = next(i for i, p in enumerate(parts) if len(p[2]) > _MAX_FRACTION)
        raise InputError(f"{source}: line {lines[i]}: {name} has over {_MAX_FRACTION} fraction digits")
    values = [int((p[0] or "0") + p[2].ljust(scale, "0")) for p in parts]
    return values, scale


def _plain_decimal(cell: str, line: int, source: str, name: str, unit_name: str) -> str:
    try:
        value = Decimal(cell) if len(cell) <= 40 else Decimal("nan")
    except InvalidOperation:
        value = Decimal("nan")
    if not value.is_finite() or value < 0 or value.adjusted() < -_MAX_FRACTION or value.adjusted() > 30:
        raise InputError(f"{source}: line {line}: {name} must be a finite number of {unit_name} >= 0, "
                         f"got {_shown(cell)}")
    return format(abs(value), "f")


def _table(text: str, source: str, required, optional, tenant_from: str | None, tenant_column: str | None):
    """(header, {column: cells}, lines) of a CSV; `tenant_from` may name a column beyond the
    format's (it is then required, and the format's own tenant column becomes optional)."""
    required = list(required)
    optional = list(optional)
    if tenant_from is not None and tenant_from != tenant_column:
        if tenant_column in required:
            required.remove(tenant_column)
            optional.append(tenant_column)
        if tenant_from in optional:
            optional.remove(tenant_from)
        if tenant_from not in required:
            _require_column(text, source, tenant_from)
            required.append(tenant_from)
    header, records = csv_table(text, source, required, optional)
    cells = {name: [] for name in header}
    lines = []
    columns = [cells[name] for name in header]
    for line, row in records:
        lines.append(line)
        for col, cell in zip(columns, row):
            col.append(cell)
    if not lines:
        raise InputError(f"{source}: no requests (header only)")
    return header, cells, np.asarray(lines, np.int64)


def _require_column(text: str, source: str, column: str) -> None:
    first = next((line for line in text.splitlines() if line.strip()), "")
    header = [h.strip() for h in next(csv.reader(io.StringIO(first)), [])]
    if header and column not in header:
        raise InputError(f"{source}: --tenant-from {column}: no such column (columns: {','.join(header)[:200]})")


def _labels(cells: list, lines, source: str, name: str) -> list:
    for i, cell in enumerate(cells):
        if not cell:
            raise InputError(f"{source}: line {lines[i]}: {name} is empty")
    return cells


def _optional(cells: dict, lines, source: str, prompt: np.ndarray, *, cached_below_prompt: bool):
    """(cached, priority, prefix_len, prefix_id, present) of the optional columns."""
    n = len(lines)
    cached = (int_column(cells["cached"], lines, source, "cached", 0, INT32_MAX) if "cached" in cells
              else np.zeros(n, np.int64))
    if cached_below_prompt and (cached >= prompt).any():
        i = int(np.argmax(cached >= prompt))
        raise InputError(f"{source}: line {lines[i]}: cached {cached[i]} must be < prompt {prompt[i]}")
    priority = (int_column(cells["priority"], lines, source, "priority", -MAX_PRIORITY, MAX_PRIORITY, default=0)
                if "priority" in cells else np.zeros(n, np.int64))
    prefix_len = (int_column(cells["prefix_len"], lines, source, "prefix_len", 0, MAX_LENGTH, default=0)
                  if "prefix_len" in cells else np.zeros(n, np.int64))
    if (prefix_len > prompt).any():
        i = int(np.argmax(prefix_len > prompt))
        raise InputError(f"{source}: line {lines[i]}: prefix_len {prefix_len[i]} outside [0, prompt {prompt[i]}]")
    prefix_id = [c or None for c in cells["prefix_id"]] if "prefix_id" in cells else [None] * n
    return cached, priority, prefix_len, prefix_id, {c for c in OPTIONAL_COLUMNS + CONTENT_COLUMNS if c in cells}


def _content(rows: FileRows, cells: dict, hash_block: int) -> FileRows:
    """`rows` with the CSV's content columns: session_id (any label; empty: no session) and
    hash_ids (ids >= 0 separated by '|' or spaces; empty: none; at most ceil(prompt / H))."""
    if "session_id" in cells:
        rows.session = [c or None for c in cells["session_id"]]
    if "hash_ids" in cells:
        rows.hash_ids = []
        for i, cell in enumerate(cells["hash_ids"]):
            parts = cell.replace("|", " ").split()
            if not all(p.isascii() and p.isdigit() and len(p) <= 18 for p in parts):
                raise InputError(f"{rows.source}: line {rows.lines[i]}: hash_ids must be integers in [0, 10^18) "
                                 f"separated by '|' or spaces, got {_shown(cell)}")
            rows.hash_ids.append(tuple(map(int, parts)))
            _check_chain(len(parts), int(rows.prompt[i]), hash_block, f"{rows.source}: line {rows.lines[i]}")
    return rows


def _check_chain(count: int, prompt: int, hash_block: int, where: str) -> None:
    if count > -(-prompt // hash_block):
        raise InputError(f"{where}: hash_ids has {count} blocks of {hash_block} tokens, more than the prompt "
                         f"{prompt} fills")


def parse_trace(text: str, source: str, tenant_from: str | None = None, hash_block: int = BLOCK_TOKENS) -> FileRows:
    """`arrival,client,prompt,output[,cached][,priority][,prefix_id][,prefix_len]` in steps:
    read_trace_csv's integer rules (cells <= INT32_MAX, then Trace.validate) plus
    read_server_trace's priority and prefix columns, and the content columns (`_content`)."""
    header, cells, lines = _table(text, source, TRACE_COLUMNS, OPTIONAL_COLUMNS + CONTENT_COLUMNS, tenant_from, "client")
    arrival = int_column(cells["arrival"], lines, source, "arrival", 0, INT32_MAX)
    prompt = int_column(cells["prompt"], lines, source, "prompt", 0, INT32_MAX)
    output = int_column(cells["output"], lines, source, "output", 0, INT32_MAX)
    cached, priority, prefix_len, prefix_id, present = _optional(cells, lines, source, prompt,
                                                                 cached_below_prompt=False)
    check = Trace(arrival, np.zeros_like(arrival), prompt, output, cached, lines=lines, source=source)
    check.validate()  # read_trace_csv's messages and limits
    labels = _labels(cells[tenant_from or "client"], lines, source, tenant_from or "client")
    return _content(FileRows(source, arrival.tolist(), 0, labels, prompt, output, cached, priority, prefix_len,
                             prefix_id, lines, present), cells, hash_block)


def _lengths(cells: dict, lines, source: str, prompt_col: str, output_col: str):
    prompt = int_column(cells[prompt_col], lines, source, prompt_col, 1, MAX_LENGTH)
    output = int_column(cells[output_col], lines, source, output_col, 1, MAX_LENGTH)
    return prompt, output


def _check_seconds(values: list, scale: int, ns_per_unit: int, lines, source: str, name: str) -> None:
    """Refuse a timestamp of 1e13 s or more (Python ints: exact at any scale)."""
    limit = MAX_TIMESTAMP_SECONDS * 10**9 * 10**scale
    for i, v in enumerate(values):
        if v * ns_per_unit >= limit:
            raise InputError(f"{source}: line {lines[i]}: {name} must be under 1e13 s")


def parse_log(text: str, source: str, ns_per_unit: int, unit_name: str, tenant_from: str | None = None,
              hash_block: int = BLOCK_TOKENS) -> FileRows:
    """`timestamp,tenant,prompt,output[,cached][,priority][,prefix_id][,prefix_len][,session_id][,hash_ids]`:
    timestamp an exact decimal in the unit, prompt and output >= 1, cached < prompt."""
    header, cells, lines = _table(text, source, LOG_COLUMNS, OPTIONAL_COLUMNS + CONTENT_COLUMNS, tenant_from, "tenant")
    times, scale = decimal_column(cells["timestamp"], lines, source, "timestamp", unit_name)
    _check_seconds(times, scale, ns_per_unit, lines, source, "timestamp")
    prompt, output = _lengths(cells, lines, source, "prompt", "output")
    cached, priority, prefix_len, prefix_id, present = _optional(cells, lines, source, prompt, cached_below_prompt=True)
    column = tenant_from or "tenant"
    return _content(FileRows(source, times, scale, _labels(cells[column], lines, source, column), prompt, output,
                             cached, priority, prefix_len, prefix_id, lines, present), cells, hash_block)


def _zeros(n: int) -> np.ndarray:
    return np.zeros(n, np.int64)


def parse_burstgpt(text: str, source: str, ns_per_unit: int, unit_name: str, tenant_from: str | None = None) -> FileRows:
    """BurstGPT `Timestamp,Model,Request tokens,Response tokens[,Total tokens],Log Type`:
    rows with 0 response tokens (failed requests) are dropped and counted."""
    header, cells, lines = _table(text, source, BURSTGPT_COLUMNS, ("Total tokens",), tenant_from, None)
    response = int_column(cells["Response tokens"], lines, source, "Response tokens", 0, MAX_LENGTH)
    keep = response > 0
    failed = int((~keep).sum())
    if failed == len(lines):
        raise InputError(f"{source}: no requests (all {failed:,} rows have 0 response tokens: failed requests)")
    data_rows, rows = len(lines), np.flatnonzero(keep).astype(np.int64)  # a kept request keeps its data row
    if failed:
        cells = {k: [v[i] for i in rows] for k, v in cells.items()}
        lines = lines[rows]
    times, scale = decimal_column(cells["Timestamp"], lines, source, "Timestamp", unit_name)
    _check_seconds(times, scale, ns_per_unit, lines, source, "Timestamp")
    prompt, output = _lengths(cells, lines, source, "Request tokens", "Response tokens")
    if "Total tokens" in cells:
        int_column(cells["Total tokens"], lines, source, "Total tokens", 0, 2 * MAX_LENGTH)
    labels = _labels(cells[tenant_from], lines, source, tenant_from) if tenant_from else None
    n = len(lines)
    skipped = [(failed, "failed requests (0 response tokens)")] if failed else []
    return FileRows(source, times, scale, labels, prompt, output, _zeros(n), _zeros(n), _zeros(n), [None] * n,
                    lines, set(), skipped, rows=rows, data_rows=data_rows)


def parse_azure(text: str, source: str, tenant_from: str | None = None) -> FileRows:
    """Azure LLM inference `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP
    `YYYY-MM-DD HH:MM:SS[.fraction]` (<= 9 fraction digits, no zone) as exact ns."""
    header, cells, lines = _table(text, source, AZURE_COLUMNS, (), tenant_from, None)
    days: dict = {}
    times = []
    for i, cell in enumerate(cells["TIMESTAMP"]):
        m = _AZURE_TIME.fullmatch(cell)
        hms = m and (int(m[4]), int(m[5]), int(m[6]))
        day = m and days.get(cell[:10])
        if m and day is None:
            try:
                day = days[cell[:10]] = datetime.date(int(m[1]), int(m[2]), int(m[3])).toordinal()
            except ValueError:
                day = None
        if not m or day is None or hms[0] > 23 or hms[1] > 59 or hms[2] > 59:
            raise InputError(f"{source}: line {lines[i]}: TIMESTAMP must be a time YYYY-MM-DD HH:MM:SS[.fraction] "
                             f"(at most 9 fraction digits, no time zone), got {_shown(cell)}")
        seconds = ((day * 24 + hms[0]) * 60 + hms[1]) * 60 + hms[2]
        times.append(seconds * 10**9 + int((m[7] or "").ljust(9, "0")))
    prompt, output = _lengths(cells, lines, source, "ContextTokens", "GeneratedTokens")
    labels = _labels(cells[tenant_from], lines, source, tenant_from) if tenant_from else None
    n = len(lines)
    return FileRows(source, times, 0, labels, prompt, output, _zeros(n), _zeros(n), _zeros(n), [None] * n, lines,
                    set())


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number")


def _json_int(obj: dict, key: str, where: str, low: int, high: int) -> int:
    if key not in obj:
        raise InputError(f"{where}: missing field {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: {key} must be an integer, got {_shown(json.dumps(value, default=str))}")
    if not low <= value <= high:
        raise InputError(f"{where}: {key} {value} outside [{low:,}, {high:,}]")
    return value


def _json_time(obj: dict, where: str, unit_name: str):
    if "timestamp" not in obj:
        raise InputError(f"{where}: missing field 'timestamp'")
    value = obj["timestamp"]
    number = isinstance(value, Decimal) or (isinstance(value, int) and not isinstance(value, bool))
    if not number or (isinstance(value, Decimal) and (not value.is_finite() or abs(value.adjusted()) > 30)):
        raise InputError(f"{where}: timestamp must be a number of {unit_name}, got "
                         f"{_shown(json.dumps(value, default=str))}")
    if value < 0:
        raise InputError(f"{where}: timestamp must be >= 0, got {value}")
    return value


def parse_mooncake(text: str, source: str, ns_per_unit: int, unit_name: str, tenant_from: str | None = None,
                   hash_block: int = BLOCK_TOKENS) -> FileRows:
    """Mooncake JSONL: one object per non-blank line with timestamp (number, in the unit),
    input_length, output_length (>= 1) and optional hash_ids of `hash_block` tokens each
    (module docstring), kept exactly as `FileRows.hash_ids`."""
    stamps, prompt, output, ids, labels, lines = [], [], [], [], [], []
    any_ids = False
    decoder = json.JSONDecoder(parse_float=Decimal, parse_constant=_refuse_constant)
    for number, raw in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit in a JSON string
        if not raw.strip():
            continue
        where = f"{source}: line {number}"
        try:
            body = raw.strip()
            obj, end = decoder.raw_decode(body)
            if end != len(body):
                raise ValueError(f"extra data after the object at column {end + 1}")
        except (ValueError, RecursionError) as err:
            reason = str(err) if "not a number" in str(err) else f"invalid JSON ({str(err)[:80]})"
            raise InputError(f"{where}: {reason}") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, got {_shown(raw.strip())}")
        t, p, o = obj.get("timestamp"), obj.get("input_length"), obj.get("output_length")
        if not (type(t) is int and t >= 0 and type(p) is int and type(o) is int and 0 < p <= MAX_LENGTH
                and 0 < o <= MAX_LENGTH):  # the common case in one test; the checks below name the problem
            t = _json_time(obj, where, unit_name)
            p = _json_int(obj, "input_length", where, 1, MAX_LENGTH)
            o = _json_int(obj, "output_length", where, 1, MAX_LENGTH)
        stamps.append(t)
        prompt.append(p)
        output.append(o)
        hashes = obj.get("hash_ids")
        if hashes is not None:
            any_ids = True
            if type(hashes) is not list or (hashes and (not _INT_TYPE.issuperset(map(type, hashes)) or min(hashes) < 0)):
                raise InputError(f"{where}: hash_ids must be a list of integers >= 0")
            if len(hashes) > -(-p // hash_block):
                raise InputError(f"{where}: hash_ids has {len(hashes)} blocks of {hash_block} tokens, more than "
                                 f"input_length {p} fills")
        ids.append(hashes or ())
        if tenant_from is not None:
            labels.append(_json_label(obj, tenant_from, where))
        lines.append(number)
    if not lines:
        raise InputError(f"{source}: empty file (expected one JSON object per line)")
    if _INT_TYPE.issuperset(map(type, stamps)):  # integer timestamps (Mooncake's): exact as they are
        times, scale = stamps, 0
    else:
        cells = [format(s, "f") if isinstance(s, Decimal) else str(s) for s in stamps]
        times, scale = decimal_column(cells, lines, source, "timestamp", unit_name)
    _check_seconds(times, scale, ns_per_unit, lines, source, "timestamp")
    prompt = np.asarray(prompt, np.int64)
    n = len(lines)
    cached, prefix_len, prefix_id = _zeros(n), _zeros(n), [None] * n
    if any_ids:
        order = sorted(range(n), key=times.__getitem__)  # stable: ties keep file order
        ranked = [ids[i] for i in order]
        chained = chained_blocks(ranked)
        seen, shared = chained if chained is not None else (trie_cached(ranked), group_prefix_blocks(ranked))
        back = np.argsort(order)
        cached = np.minimum(seen[back] * hash_block, prompt - 1)
        prefix_id = [(f"{h[0]}/{h[1]}" if len(h) > 1 else str(h[0])) if h else None for h in ids]
        prefix_len = np.minimum(shared[back] * hash_block, prompt)
    present = {"cached", "prefix_id", "prefix_len"} if any_ids else set()
    return FileRows(source, times, scale, labels if tenant_from is not None else None, prompt,
                    np.asarray(output, np.int64), cached, _zeros(n), prefix_len, prefix_id,
                    np.asarray(lines, np.int64), present, hash_ids=[tuple(h) for h in ids] if any_ids else None)


def _json_label(obj: dict, field: str, where: str) -> str:
    if field not in obj:
        raise InputError(f"{where}: --tenant-from {field}: no such field (fields: {', '.join(map(str, obj))[:200]})")
    value = obj[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"{where}: {field} must be a string or an integer to name a tenant")
    if value == "":
        raise InputError(f"{where}: {field} is empty")
    return str(value)


def chained_blocks(id_lists: list) -> tuple[np.ndarray, np.ndarray] | None:
    """(trie_cached, group_prefix_blocks) of `id_lists` in numpy when the ids are chained
    (every id always follows the same id at the same depth, as Mooncake's prefix hashes
    are): an id then names its whole prefix, so the tries are flat tables. None otherwise."""
    lengths = np.fromiter(map(len, id_lists), np.int64, len(id_lists))
    try:
        flat = np.fromiter(itertools.chain.from_iterable(id_lists), np.int64, int(lengths.sum()))
    except OverflowError:
        return None
    n, total = len(id_lists), int(lengths.sum())
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    starts = np.cumsum(lengths) - lengths
    depth = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    parent = np.where(depth > 0, np.roll(flat, 1), -1)
    ids, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if ((parent != parent[first][inverse]) | (depth != depth[first][inverse])).any():
        return None
    passes = np.bincount(inverse, minlength=len(ids))  # one id per list at most: its depth is fixed
    first_row = row[first]
    seen = np.bincount(row, weights=first_row[inverse] < row, minlength=n).astype(np.int64)
    shared = np.bincount(row, weights=passes[inverse] >= 2, minlength=n).astype(np.int64)
    single = lengths == 1
    shared[~single & (shared < 2)] = 0
    if single.any():  # lists of one id: their group is the lists that are exactly that id
        alone = np.bincount(inverse[starts[single]], minlength=len(ids))
        shared[single] = (alone[inverse[starts[single]]] >= 2).astype(np.int64)
    return seen, shared


def trie_cached(id_lists: list) -> np.ndarray:
    """int64[N]: the longest prefix (in ids) of each list that is a prefix of an earlier list."""
    root: dict = {}
    out = np.zeros(len(id_lists), np.int64)
    for i, hashes in enumerate(id_lists):
        node, depth = root, 0
        for h in hashes:
            child = node.get(h)
            if child is None:
                break
            node, depth = child, depth + 1
        out[i] = depth
        for h in hashes[depth:]:
            node = node.setdefault(h, {})
    return out


def group_prefix_blocks(id_lists: list) -> np.ndarray:
    """int64[N]: the most leading ids each list shares with another list of the same first
    two ids (a trie with pass counts; the deepest node on its path that two lists pass)."""
    root: dict = {}
    for hashes in id_lists:
        node = root
        for h in hashes:
            entry = node.get(h)
            if entry is None:
                entry = node[h] = [0, {}, 0]
            entry[0] += 1
            node = entry[1]
        if len(hashes) == 1:
            entry[2] += 1  # lists of one id form their own groups
    out = np.zeros(len(id_lists), np.int64)
    for i, hashes in enumerate(id_lists):
        if len(hashes) == 1:
            out[i] = int(root[hashes[0]][2] >= 2)
            continue
        node, depth = root, 0
        for h in hashes:
            count, node, _ = node[h]
            if count < 2:
                break
            depth += 1
        out[i] = depth if depth >= 2 else 0
    return out


def group_cached(prefix_id: list, prefix_len: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """int64[N] (rows in time order): what a request finds cached under the group rule: the
    most of its prefix_len that an earlier request of its prefix_id holds, capped at prompt - 1."""
    best: dict = {}
    out = np.zeros(len(prefix_id), np.int64)
    for i, (group, length) in enumerate(zip(prefix_id, prefix_len.tolist())):
        if group is None:
            continue
        out[i] = min(length, best.get(group, 0), int(prompt[i]) - 1)
        best[group] = max(best.get(group, 0), length)
    return out


def whole_ns(value: Decimal) -> int | None:
    """The ns of a step in seconds when a whole number (> 0), else None."""
    ns = value * 10**9
    return int(ns) if ns.is_finite() and ns > 0 and ns == ns.to_integral_value() else None



def servegen_step_ns(rows: int, clients: int) -> int:
    """The finest step (ns, a divisor of 600 s) the ServeGen generator can place arrivals on
    for `rows` 600 s rows of `clients` clients (<= 2^24 steps per row, horizon x K < 2^31)."""
    window_ns = 600 * 10**9
    steps = sorted(window_ns // (2**a * 3**b * 5**c) for a in range(12) for b in range(2) for c in range(12))
    for per_row in reversed(steps):
        if per_row <= 1 << 24 and rows * per_row * clients <= INT32_MAX:
            return window_ns // per_row
    raise InputError(f"{rows} rows of {clients} ServeGen clients: too many to place on int32 steps")


def servegen_requests(directory: str, *, seed: int = 0, window=None) -> dict:
    """Requests generated from a ServeGen directory at the data's own rates (no load
    scaling: the plan's s = 1), over `window` = (start_s, duration_s) from the data's first
    row, both multiples of 600 s (default (0, 600): the first row), by the existing one-lane
    generator (servegen.generate, key jax.random.PRNGKey(seed)). Arrivals are whole steps of
    `servegen_step_ns` (40 us for one row of 87 clients) as ns from the first; lengths are not clipped
    (caps MAX_LENGTH); `lines` is each request's number in time order (1-based: there is no
    file line), `rows` the same 0-based. Returns the columns request_log._assemble takes."""
    import jax

    from vtc_jax.inputs import servegen

    data = servegen.read_servegen(directory)
    start, duration = (0, 600) if window is None else window
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v % 600 for v in (start, duration)) \
            or start < 0 or duration <= 0 or (start + duration) // 600 > data.num_windows:
        raise InputError(f"{directory}: servegen window {window!r} must be (start_s, duration_s), multiples of "
                         f"600 s inside the data's {data.num_windows * 600:,} s")
    rows = (int(start) // 600, int(start + duration) // 600)
    step_ns = servegen_step_ns(rows[1] - rows[0], data.num_clients)
    horizon = (rows[1] - rows[0]) * (600 * 10**9 // step_ns)
    kw = dict(kv_budget=1 << 20, horizon=horizon, windows=rows, max_prompt=MAX_LENGTH, max_output=MAX_LENGTH)
    native = servegen.plan(data, load=1.0, **kw).native_load
    plan = servegen.plan(data, load=native, **kw)
    out, count = jax.jit(lambda key: servegen.generate(key, plan.params, layout=plan.layout))(
        jax.random.PRNGKey(int(seed)))
    out = np.asarray(out, np.int64)
    block = np.repeat(np.arange(data.num_clients), np.asarray(plan.layout.sizes))
    real = out[:, 0] < INT32_MAX
    if int(real.sum()) != int(count):
        raise InputError(f"{directory}: the generator placed {int(real.sum())} of {int(count)} requests")
    if not real.any():
        raise InputError(f"{directory}: rows {rows[0]}..{rows[1] - 1} generate no requests")
    out, block = out[real], block[real]
    order = np.lexsort((out[:, 1], out[:, 0]))  # (arrival, ORDER): the generator's FCFS order
    out, block = out[order], block[order]
    n = len(out)
    labels = [str(c) for c in data.client_ids[block].tolist()]
    return {"arrival": (out[:, 0] - out[0, 0]) * step_ns, "labels": labels, "prompt": out[:, 2], "output": out[:, 3],
            "cached": _zeros(n), "priority": _zeros(n), "prefix_len": _zeros(n), "prefix_id": [None] * n,
            "lines": np.arange(1, n + 1, dtype=np.int64), "rows": np.arange(n, dtype=np.int64), "file": _zeros(n),
            "columns": set(), "skipped": []}
