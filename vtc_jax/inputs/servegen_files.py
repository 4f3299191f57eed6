"""ServeGen directories read on the host: per-client trace rows and length PMFs, every
malformed input refused with the file and line named (servegen.py plans and generates).

Reading (`read_servegen`, host). The native layout: `chunk-<id>-trace.csv` (no header, CRLF
or LF, 6 columns `timestamp,rate,cv,pattern,arg1,arg2`) and `chunk-<id>-dataset.json` (an
object keyed by window-start timestamps; each value holds "input_tokens" and
"output_tokens", strings with Python dict literals {tokens: probability}, never `eval`ed:
a plain `{int: number, ...}` is split by a strict regular expression, anything else goes
to `ast.literal_eval`, and the result's types are checked). Rules, each violation one `InputError` naming the
file and the 1-based line (traces) or the key (datasets), nothing dropped silently:
  - a trace row has 6 fields; timestamp an integer in [0, 2^32); rate, cv, arg1, arg2 finite
    decimals; 0 <= rate <= MAX_RATE (1e6 requests/s) and cv >= 0; pattern "Gamma", "Weibull"
    or empty; rate > 0 needs a pattern and arg1 > 0, arg2 > 0 (shape and scale: scipy's
    `gamma(a=arg1, scale=arg2)`, `weibull_min(c=arg1, scale=arg2)`), the shape in
    SHAPE_RANGE [1e-9, 1e9] (drawn in float32); rows are exactly 600 s apart and every
    client has the same timestamps (ServeGen's own pool validation requires this too);
  - one client id, one trace file and one dataset file: `chunk-01-...` beside `chunk-1-...`
    is refused, naming both;
  - a PMF's keys are ints >= 0 (not bools) and at most 2^29 - 1, its probabilities
    finite int/float >= 0 summing to 1 within 1e-6 (ServeGen's tolerance), no duplicate key
    (in the dict literal or in the JSON object);
  - an empty PMF `{}` (full ServeGen checkouts have them, e.g. a client's "0" window before
    its first request): the whole dataset window is skipped, exactly as ServeGen's loader
    does, so the previous window stays in force; it is listed in `ServeGenData.skipped`;
  - the dataset window in force for a trace row is the latest (non-skipped) key <= the row's
    timestamp; a row with rate > 0 and none in force is an error;
  - zero-length prompts or outputs (key 0; none in the shipped sample, whose smallest keys
    are 9 and 1) are raised to length 1, since every request has prompt >= 1 and output >= 1
    in our model; the raised mass is reported per client by `plan`;
  - fields other than "input_tokens"/"output_tokens" (e.g. "reason_ratio" in ServeGen's
    reasoning data) are not modelled; they are listed in `ServeGenData.skipped`;
  - every file is read by `fileio.read_bytes`: refused above 256 MiB (`MAX_FILE_BYTES`)
    before it is read (a non-regular input as soon as it passes that), and refused when it
    holds NUL bytes; then decoded as UTF-8 (a BOM is dropped).
`trace-only/` (optional subfolder): clients with trace rows and no dataset file. With
`include_trace_only=True` they get the substitute length PMFs: the request-weighted pooled
PMF of all clients with a dataset (weights rate x 600 of every row of the directory, each
row's PMF the one in force) and are marked `substituted`. Client ids are ServeGen's own
(not contiguous), kept and sorted ascending; client index k is the position in that order.
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import json
import math
import os
import re
from typing import Sequence

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import read_bytes
from vtc_jax.inputs.workload import INT32_MAX

WINDOW_SECONDS = 600
MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_TOKENS = INT32_MAX // 4  # largest PMF key accepted (as for trace CSV lengths)
PMF_TOLERANCE = 1e-6
MAX_RATE = 1e6  # requests per second of one client-row (the sample's largest is 395.5)
SHAPE_RANGE = (1e-9, 1e9)  # Gamma / Weibull shapes drawn in float32 (the sample's: 0.017 to 39)
PATTERNS = {"": 0, "Gamma": 1, "Weibull": 2}
IDLE, GAMMA, WEIBULL = 0, 1, 2
FIELDS = ("input_tokens", "output_tokens")
_CHUNK_RE = re.compile(r"^chunk-(\d+)-(trace\.csv|dataset\.json)$")
_INT_RE = re.compile(r"^\d+$")
_PAIR = r"(?:0|[1-9]\d*)\s*:\s*[-+0-9.eE]+\s*"
_PLAIN_DICT = re.compile(r"\{\s*(?:" + _PAIR + r",\s*)*(?:" + _PAIR + r")?\}")
_STAMP_LIMIT = 1 << 32  # timestamps become uint32 key words (servegen_device)


# ---- host data --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LengthPMF:
    """One dataset window's length distributions (host, float64 probabilities summing to 1).

    Attributes:
      source: where it came from, e.g. 'chunk-61-dataset.json, key "842400"' or 'substitute'.
      prompt_values, output_values: int64[n] distinct lengths >= 1 (zero already raised).
      prompt_probs, output_probs: float64[n] their probabilities.
      prompt_raised, output_raised: probability mass that was at length 0 (now at 1).
    """

    source: str
    prompt_values: np.ndarray
    prompt_probs: np.ndarray
    output_values: np.ndarray
    output_probs: np.ndarray
    prompt_raised: float = 0.0
    output_raised: float = 0.0


@dataclasses.dataclass(frozen=True)
class ServeGenData:
    """A ServeGen directory as read (host). K clients (sorted ids), W rows of 600 s.

    Attributes:
      directory: the directory read.
      client_ids: int64[K] ServeGen client ids, ascending.
      timestamps: int64[W] row starts (seconds since trace start), 600 apart.
      rate: float64[K, W] requests per second; rate * 600 is the row's request count.
      cv: float64[K, W] the row's inter-arrival CV (as given; not used for generation).
      pattern: int8[K, W] IDLE (0), GAMMA (1) or WEIBULL (2).
      shape, scale: float64[K, W] arg1 and arg2 of the row's distribution (0 when idle).
      lengths: int64[K, W] index into `pmfs` of the dataset window in force; -1 where none
        (allowed only where rate is 0).
      pmfs: the distinct dataset windows (plus the substitute, last, when one is used).
      substituted: bool[K] clients from trace-only/ given the substitute PMF.
      trace_files: per client, the trace file read (for messages).
      skipped: one line per skipped dataset window (empty PMF) or ignored PMF field.
    """

    directory: str
    client_ids: np.ndarray
    timestamps: np.ndarray
    rate: np.ndarray
    cv: np.ndarray
    pattern: np.ndarray
    shape: np.ndarray
    scale: np.ndarray
    lengths: np.ndarray
    pmfs: tuple[LengthPMF, ...]
    substituted: np.ndarray
    trace_files: tuple[str, ...]
    skipped: tuple[str, ...] = ()

    @property
    def num_clients(self) -> int:
        return int(self.client_ids.shape[0])

    @property
    def num_windows(self) -> int:
        return int(self.timestamps.shape[0])

    def requests(self) -> np.ndarray:
        """float64[K]: the data's request count per client, sum over rows of rate * 600."""
        return (self.rate * WINDOW_SECONDS).sum(axis=1)


def _read_text(path: str, what: str) -> str:
    """The file as text: `fileio.read_bytes` (refused over MAX_FILE_BYTES before it is read,
    or as soon as a non-regular input passes it; NUL bytes refused), then UTF-8 (a BOM is
    dropped) with the failing line named."""
    raw = read_bytes(path, limit=MAX_FILE_BYTES, what=what)
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise InputError(f"{path}, line {line}: not UTF-8 text") from None
    if "\x00" in text:
        raise InputError(f"{path}: not a text {what} (contains NUL bytes)")
    return text


def _number(text: str, path: str, line: int, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{path}, line {line}: {name} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"{path}, line {line}: {name} {text!r} is not finite")
    return value


def read_trace(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One `chunk-<id>-trace.csv`: (timestamp int64[W], rate, cv float64[W], pattern int8[W],
    shape, scale float64[W]). Raises InputError naming the file and 1-based line."""
    text = _read_text(path, "ServeGen trace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise InputError(f"{path}: no rows")
    cols: list[list] = [[] for _ in range(6)]
    for n, line in enumerate(lines, start=1):
        if line.endswith("\r"):
            line = line[:-1]
        fields = line.split(",")
        if len(fields) != 6:
            raise InputError(f"{path}, line {n}: expected 6 fields (timestamp,rate,cv,pattern,arg1,arg2), "
                             f"got {len(fields)}")
        ts, rate, cv, pat, arg1, arg2 = (f.strip() for f in fields)
        if not _INT_RE.match(ts) or len(ts) > 10 or int(ts) >= _STAMP_LIMIT:
            raise InputError(f"{path}, line {n}: timestamp {ts!r} is not an integer in [0, 2^32)")
        t = int(ts)
        r = _number(rate, path, n, "rate")
        c = _number(cv, path, n, "cv")
        a1 = _number(arg1, path, n, "arg1")
        a2 = _number(arg2, path, n, "arg2")
        if r < 0:
            raise InputError(f"{path}, line {n}: rate {rate} is negative")
        if r > MAX_RATE:  # rate x 600 x the load's factor sizes the blocks: bounded before any float overflows
            raise InputError(f"{path}, line {n}: rate {rate} is over the limit of {MAX_RATE:g} requests/s")
        if c < 0:
            raise InputError(f"{path}, line {n}: cv {cv} is negative")
        if pat not in PATTERNS:
            raise InputError(f"{path}, line {n}: unknown pattern {pat!r} (expected Gamma, Weibull or empty)")
        if r > 0:
            if not pat:
                raise InputError(f"{path}, line {n}: rate {rate} > 0 but no pattern (Gamma or Weibull)")
            if a1 <= 0 or a2 <= 0:
                raise InputError(f"{path}, line {n}: {pat} needs shape arg1 > 0 and scale arg2 > 0, "
                                 f"got {arg1}, {arg2}")
            if not SHAPE_RANGE[0] <= a1 <= SHAPE_RANGE[1]:  # drawn in float32: 0 or inf there gives NaN gaps
                raise InputError(f"{path}, line {n}: {pat} shape arg1 {arg1} is outside "
                                 f"[{SHAPE_RANGE[0]:g}, {SHAPE_RANGE[1]:g}]")
        if cols[0] and t != cols[0][-1] + WINDOW_SECONDS:
            raise InputError(f"{path}, line {n}: timestamp {t} is not {WINDOW_SECONDS} s after the "
                             f"previous row's {cols[0][-1]}")
        pattern = PATTERNS[pat] if r > 0 else IDLE
        for col, v in zip(cols, (t, r, c, pattern, a1 if r > 0 else 0.0, a2 if r > 0 else 0.0)):
            col.append(v)
    return (np.asarray(cols[0], np.int64), np.asarray(cols[1], np.float64), np.asarray(cols[2], np.float64),
            np.asarray(cols[3], np.int8), np.asarray(cols[4], np.float64), np.asarray(cols[5], np.float64))


def _dict_items(text: str, where: str) -> list[tuple]:
    """The (key, value) pairs of a dict literal, without evaluating code: a plain
    `{int: number, ...}` is split directly (7x faster than the AST on 60 kB strings);
    anything else goes through `ast.literal_eval`, which only builds literals."""
    text = text.strip()
    if _PLAIN_DICT.fullmatch(text):
        try:
            items = [(int(k), float(v)) for k, v in
                     (part.split(":") for part in text[1:-1].split(",") if part.strip())]
        except ValueError:
            items = None  # e.g. "1.2.3": let literal_eval word the error
        if items is not None:
            if len({k for k, _ in items}) != len(items):
                raise InputError(f"{where}: duplicate token counts in the dict literal")
            return items
    try:
        tree = ast.parse(text, mode="eval")
        if not isinstance(tree.body, ast.Dict):
            raise InputError(f"{where}: not a dict literal {{tokens: probability, ...}}")
        pmf = ast.literal_eval(tree.body)
    except InputError:
        raise
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise InputError(f"{where}: unparsable dict literal {_clip_text(text)}") from None
    if len(pmf) != len(tree.body.keys):
        raise InputError(f"{where}: duplicate token counts in the dict literal")
    return list(pmf.items())


def parse_pmf(text, where: str) -> tuple[np.ndarray, np.ndarray, float] | None:
    """A PMF string -> (values int64[n] >= 1, probs float64[n], mass raised from 0 to 1), or
    None for an empty dict. Never evaluates code; `where` names the file and key."""
    if not isinstance(text, str):
        raise InputError(f"{where}: expected a string holding a dict literal, got {type(text).__name__}")
    items = _dict_items(text, where)
    if not items:
        return None
    values, probs = [], []
    for key, p in items:
        if isinstance(key, bool) or not isinstance(key, int) or key < 0 or key > MAX_TOKENS:
            raise InputError(f"{where}: key {key!r} is not a token count (an int in [0, {MAX_TOKENS}])")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
            raise InputError(f"{where}: probability {p!r} of {key} is not a finite number >= 0")
        values.append(key)
        probs.append(float(p))
    total = math.fsum(probs)
    if abs(total - 1.0) > PMF_TOLERANCE:
        raise InputError(f"{where}: probabilities sum to {total!r}, not 1 (tolerance {PMF_TOLERANCE:g})")
    values, probs = np.asarray(values, np.int64), np.asarray(probs, np.float64) / total
    raised = float(probs[values == 0].sum())
    return (*merge_pmf(np.maximum(values, 1), probs), raised)


def _clip_text(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def merge_pmf(values: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum probabilities of equal values; drop zero-probability entries. Sorted ascending."""
    keep = probs > 0
    uniq, inv = np.unique(values[keep], return_inverse=True)
    return uniq.astype(np.int64), np.bincount(inv, weights=probs[keep], minlength=uniq.size)


def _reject_duplicates(where: str):
    def hook(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise InputError(f"{where}: duplicate key {k!r}")
            seen.add(k)
        return dict(pairs)
    return hook


def read_dataset(path: str) -> tuple[list[tuple[int, LengthPMF | None]], list[str]]:
    """One `chunk-<id>-dataset.json`: [(window start, LengthPMF or None when skipped)] in
    ascending order, and notes on skipped windows / ignored fields."""
    text = _read_text(path, "ServeGen dataset")
    try:
        obj = json.loads(text, object_pairs_hook=_reject_duplicates(path))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}, line {e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict) or not obj:
        raise InputError(f"{path}: expected a non-empty JSON object keyed by window start timestamps")
    windows, notes = [], []
    name = os.path.basename(path)
    for key in obj:
        if not _INT_RE.match(key) or len(key) > 10:
            raise InputError(f'{path}, key "{key}": not a window start timestamp (a non-negative integer)')
    for key, value in sorted(obj.items(), key=lambda kv: int(kv[0])):
        where = f'{path}, key "{key}"'
        if not isinstance(value, dict):
            raise InputError(f"{where}: expected an object with {FIELDS[0]!r} and {FIELDS[1]!r}")
        for field in FIELDS:
            if field not in value:
                raise InputError(f"{where}: missing {field!r}")
        for field in sorted(set(value) - set(FIELDS)):
            notes.append(f'{name}, key "{key}": field {field!r} ignored (not modelled)')
        parsed = [parse_pmf(value[f], f"{where}, {f}") for f in FIELDS]
        if any(p is None for p in parsed):
            notes.append(f'{name}, key "{key}": empty PMF, window skipped (as ServeGen does)')
            windows.append((int(key), None))
            continue
        (pv, pp, pr), (ov, op, orr) = parsed
        windows.append((int(key), LengthPMF(f'{name}, key "{key}"', pv, pp, ov, op, pr, orr)))
    return windows, notes


def _scan(directory: str) -> dict[int, dict[str, str]]:
    found: dict[int, dict[str, str]] = {}
    for entry in sorted(os.listdir(directory)):
        m = _CHUNK_RE.match(entry)
        if m and os.path.isfile(os.path.join(directory, entry)):
            if len(m.group(1)) > 9:
                raise InputError(f"{os.path.join(directory, entry)}: client id {m.group(1)} is over 10^9")
            files = found.setdefault(int(m.group(1)), {})
            path = os.path.join(directory, entry)
            if m.group(2) in files:  # e.g. chunk-01-... and chunk-1-...: one client id, two files
                raise InputError(f"{files[m.group(2)]} and {path}: two files for client {int(m.group(1))}; "
                                 "keep one")
            files[m.group(2)] = path
    return found


def _pooled(pmfs: Sequence[LengthPMF], weights: np.ndarray) -> LengthPMF:
    def pool(vals, probs):
        v = np.concatenate([x for x, w in zip(vals, weights) if w > 0])
        p = np.concatenate([q * w for q, w in zip(probs, weights) if w > 0])
        v, p = merge_pmf(v, p)
        return v, p / p.sum()
    pv, pp = pool([p.prompt_values for p in pmfs], [p.prompt_probs for p in pmfs])
    ov, op = pool([p.output_values for p in pmfs], [p.output_probs for p in pmfs])
    w = weights / weights.sum()
    return LengthPMF("substitute (request-weighted pool of the clients with a dataset)", pv, pp, ov, op,
                     float(np.dot(w, [p.prompt_raised for p in pmfs])),
                     float(np.dot(w, [p.output_raised for p in pmfs])))


def read_servegen(directory: str, *, include_trace_only: bool = True) -> ServeGenData:
    """Read a ServeGen model directory (e.g. `data/servegen/m-large`); see the module doc.

    Clients with both files are read from `directory`; with `include_trace_only`, clients in
    `directory/trace-only/` (trace files only) are added with the substitute PMF.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise InputError(f"{directory}: not a directory")
    main = _scan(directory)
    extra: dict[int, dict[str, str]] = {}
    sub = os.path.join(directory, "trace-only")
    if include_trace_only and os.path.isdir(sub):
        extra = _scan(sub)
        for cid, files in extra.items():
            if "dataset.json" in files:
                raise InputError(f"{files['dataset.json']}: a dataset file in trace-only/; move client "
                                 f"{cid}'s files to {directory}")
            if cid in main:
                raise InputError(f"{files['trace.csv']}: client {cid} is also in {directory}")
    for cid, files in main.items():
        if "trace.csv" not in files:
            raise InputError(f"{files['dataset.json']}: no chunk-{cid}-trace.csv beside it")
        if "dataset.json" not in files:
            raise InputError(f"{files['trace.csv']}: no chunk-{cid}-dataset.json beside it (a client "
                             "without lengths belongs in trace-only/, which gets the substitute PMF)")
    ids = sorted(set(main) | set(extra))
    if not ids:
        raise InputError(f"{directory}: no chunk-<id>-trace.csv files")

    traces, files = [], []
    for cid in ids:
        path = (main.get(cid) or extra[cid])["trace.csv"]
        traces.append(read_trace(path))
        files.append(path)
    # The reference rows: the (start, count) most clients have, so the odd file is named.
    spans = [(int(t[0][0]), len(t[0])) for t in traces]
    common = max(set(spans), key=lambda sp: (spans.count(sp), -spans.index(sp)))
    ref_ts, ref_path = traces[spans.index(common)][0], files[spans.index(common)]
    for (ts, *_), path in zip(traces, files):
        if ts.shape != ref_ts.shape or ts[0] != ref_ts[0]:
            n = int(np.argmax(ts != ref_ts[0])) + 1 if ts[0] != ref_ts[0] else min(len(ts), len(ref_ts)) + 1
            raise InputError(f"{path}, line {n}: rows differ from {os.path.basename(ref_path)} "
                             f"({len(ts)} rows from {ts[0]}, expected {len(ref_ts)} rows from {ref_ts[0]}): "
                             "every client must have the same timestamps")
    k, w = len(ids), len(ref_ts)
    stack = lambda i: np.stack([t[i] for t in traces])  # noqa: E731
    rate, cv, pattern, shape, scale = (stack(i) for i in range(1, 6))

    pmfs: list[LengthPMF] = []
    lengths = np.full((k, w), -1, np.int64)
    skipped: list[str] = []
    for i, cid in enumerate(ids):
        if cid not in main:
            continue
        windows, notes = read_dataset(main[cid]["dataset.json"])
        skipped += notes
        live = [(start, pmf) for start, pmf in windows if pmf is not None]
        starts = np.asarray([s for s, _ in live], np.int64)
        pos = np.searchsorted(starts, ref_ts, side="right") - 1  # latest start <= timestamp
        lengths[i] = np.where(pos >= 0, pos + len(pmfs), -1)
        bad = (pos < 0) & (rate[i] > 0)
        if bad.any():
            n = int(np.argmax(bad))
            raise InputError(f"{files[i]}, line {n + 1}: rate {rate[i, n]} > 0 at {ref_ts[n]} but "
                             f"{os.path.basename(main[cid]['dataset.json'])} has no (non-empty) window "
                             f"starting at or before it")
        pmfs += [pmf for _, pmf in live]

    substituted = np.asarray([cid not in main for cid in ids])
    if substituted.any():
        have = lengths >= 0
        weights = np.bincount(lengths[have], weights=(rate * WINDOW_SECONDS)[have], minlength=len(pmfs))
        if not pmfs or weights.sum() <= 0:
            n = int(np.argmax(substituted))
            raise InputError(f"{files[n]}: client {ids[n]} has no dataset and no substitute is possible "
                             "(no client with a dataset sends requests)")
        lengths[substituted] = len(pmfs)
        pmfs.append(_pooled(pmfs, weights))
    return ServeGenData(directory, np.asarray(ids, np.int64), ref_ts, rate, cv, pattern.astype(np.int8),
                        shape, scale, lengths, tuple(pmfs), substituted, tuple(files), tuple(skipped))
