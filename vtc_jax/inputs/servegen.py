"""Real tenants: ServeGen's per-client production traces, read, planned and generated on device.

ServeGen (Xiang et al., NSDI '26; github.com/alibaba/ServeGen) publishes, per client
(tenant), one row per 600 s window (arrival rate, inter-arrival CV and a fitted Gamma or
Weibull) and, per 21600 s dataset window, the PMFs of prompt and output length. This module
turns such a directory into client-major request streams for the engine.

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

Time (`plan`, host). W consecutive 600 s rows (default all) map linearly onto integer steps
[0, horizon): row w covers steps [b_w, b_{w+1}) with b_w = floor(w * horizon / W), so a
time x seconds into row w (0 <= x < 600) is step b_w + floor(x / 600 * (b_{w+1} - b_w))
(clamped into the row). On average one step is 600 * W / horizon seconds
(`seconds_per_step`). Needs horizon >= W, horizon / W <= 2^24 and horizon * K < 2^31.

Load. A request with prompt p and output o holds p + g KV tokens at its g-th decode step
(g = 1..o): demand(p, o) = o*p + o*(o+1)/2 token-steps. The server offers M = kv_budget
token-steps per step. One common factor s scales every client's rate so that
    sum_{k,w} x_kw * E_kw[demand] / horizon = load * M,   x_kw = s * rate_kw * 600,
where E_kw is the mean demand under client k's clipped prompt and output PMFs of the dataset
window in force at row w, prompt and output drawn independently:
E[demand] = E[o] E[p] + (E[o^2] + E[o]) / 2. `scale` is s; `native_load` is the load at
s = 1 (the data's own rates); `target` is x.

Counting (`counting=`): how many arrivals n_kw row w of client k gets from its x_kw.
  - "unbiased" (default): n_kw = floor(x) + Bernoulli(frac(x)), the Bernoulli drawn on device
    per client-row (its own key, below), so E[n_kw] = x_kw and every client with traffic
    appears in proportion, however much time is compressed. frac(x) is quantized to a
    multiple of 2^-32 (a uint32 threshold; error <= 2^-33 per row, and every reported
    expectation uses the quantized value), so expected_load = load (to ~1e-9). A row's
    capacity, the most it can get, is floor(x) + 1 (floor(x) when x is an integer, 0 when
    rate = 0). `match_load` is moot: the load equation is already exact in expectation.
  - "servegen": ServeGen's own rule (below), n_kw = max(ceil(x) - 1, 0), exact: capacity = n.
    Every active row gets x - ceil(x) + 1 in (0, 1] requests fewer than x, so the requests
    offer `expected_load` < `load`: close when rows hold many requests, far when s is
    small. vtc-jax compresses time (the whole sample on 20000 steps at M = 8192 and load 1:
    s = 1.5e-4, under one request per active row): expected_load 0.72, and the 76 of 87
    clients whose rows each get x < 1 send nothing; the unbiased rule there gives load 1
    and all 87 clients (about 52 of them present in a lane). With `match_load=True`, s is
    instead chosen (bisection) so that the servegen counts offer `load` as closely as
    integer counts allow.
`plan` reports per client `expected_requests` (E[n], exact), `max_requests` (capacity),
`appear` (P[n >= 1]), and `clients_expected` (clients with E[n] >= 1), `clients_possible`
(E[n] > 0), `expected_clients` (sum of `appear`), `expected_load`; `summary()` prints them.

Arrivals, as ServeGen's `servegen/construct.py` (`_sample_iats`, `generate_workload`) places
them: a row with n >= 1 arrivals draws n + 1 gaps, Gamma(shape=arg1, scale=arg2) or
Weibull(shape=arg1, scale=arg2); rescales them so all n + 1 sum to the window; places the
arrivals at the window start plus the first n running sums (the (n + 1)-th sum is the end
itself: ServeGen's "drop the last"; ServeGen decides it by float rounding, here it is always
dropped). Under "servegen" counting n + 1 = ceil(x) (an x within 1e-6 above an integer counts
as that integer, so that s = 1 gives exactly the rate x 600 of the data despite float
noise); a row with n = 0 draws nothing. Positions become steps by floor, as above.

Where this differs from ServeGen's construct.py (read at alibaba/ServeGen): (0) the default
count is "unbiased" (ServeGen's is "servegen"); (1) one common s for all rows (ServeGen's
`rate_fn` may give every row its own aggregate target; a common s is the special case
rate_fn[t] = s * sum_k rate_kt); (2) the last arrival is always dropped (ServeGen compares
float64 sums with the end, so it is kept when rounding puts it below);
(3) ceil tolerates float noise (ServeGen's ceil(rate * 600) is one more than the data's
count in 88 of the sample's rows, where rate * 600 = n + 2e-13; with the drop, ServeGen
then emits exactly n there and n - 1 elsewhere); (4) prompt and output take independent
uniforms (ServeGen's `_sample_data_batch` feeds the same uniform to every field's inverse
CDF, which makes prompt and output comonotone); (5) rate > 0 without a pattern, a trace
without dataset and unreadable PMFs are errors (ServeGen skips or fails later); (6) ServeGen
loads PMF strings with `eval`.

Lengths. Prompts are clipped to `max_prompt` (default kv_budget: a longer prompt could never
be admitted) and outputs to `max_output` (default 16384, twice the longest output in the
shipped sample, 8192); the clipped probability mass per client is reported (request-
weighted over its rows). PMFs are sampled by inverse CDF: each is stored as thresholds
round(CDF * 2^32) (uint32) and a uniform 32-bit word picks the first entry whose threshold
exceeds it, so probabilities are multiples of 2^-32, and every mean the plan reports is
computed with these quantized probabilities (exact for the generator).

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

import ast
import codecs
import dataclasses
import json
import math
import os
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import read_bytes
from vtc_jax.inputs.workload import ARRIVAL, CACHED, INT32_MAX, NUM_FIELDS, ORDER, OUTPUT, PROMPT, padding_rows

I32, U32, F32 = jnp.int32, jnp.uint32, jnp.float32

WINDOW_SECONDS = 600
MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_LANE_BYTES = 1 << 30
MAX_TOKENS = INT32_MAX // 4  # largest PMF key accepted (as for trace CSV lengths)
DEFAULT_MAX_OUTPUT = 16384
PMF_TOLERANCE = 1e-6
COUNT_TOLERANCE = 1e-6
MAX_RATE = 1e6  # requests per second of one client-row (the sample's largest is 395.5)
SHAPE_RANGE = (1e-9, 1e9)  # Gamma / Weibull shapes drawn in float32 (the sample's: 0.017 to 39)
MAX_WINDOW_STEPS = 1 << 24
PATTERNS = {"": 0, "Gamma": 1, "Weibull": 2}
IDLE, GAMMA, WEIBULL = 0, 1, 2
FIELDS = ("input_tokens", "output_tokens")
_CHUNK_RE = re.compile(r"^chunk-(\d+)-(trace\.csv|dataset\.json)$")
_INT_RE = re.compile(r"^\d+$")
_PAIR = r"(?:0|[1-9]\d*)\s*:\s*[-+0-9.eE]+\s*"
_PLAIN_DICT = re.compile(r"\{\s*(?:" + _PAIR + r",\s*)*(?:" + _PAIR + r")?\}")
_TWO32 = 1 << 32


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
        if not _INT_RE.match(ts) or len(ts) > 10 or int(ts) >= _TWO32:
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
    return (*_merge(np.maximum(values, 1), probs), raised)


def _clip_text(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def _merge(values: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        v, p = _merge(v, p)
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


# ---- plan ---------------------------------------------------------------------------------

COUNTINGS = ("unbiased", "servegen")


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


@dataclasses.dataclass(frozen=True)
class ServeGenPlan:
    """What `plan` decided (host). K clients (data order), W rows of the chosen span.

    Attributes:
      client_ids: int64[K];  substituted: bool[K].
      counting: "unbiased" or "servegen" (the module doc's counting rules).
      load, kv_budget, horizon, max_prompt, max_output, pad: as requested (defaults filled).
      rows: (first, stop) row indices of the span;  timestamps: int64[W] its row starts.
      scale: the common rate factor s;  seconds_per_step: 600 * W / horizon.
      native_load: the load at s = 1 (the data's own rates: rate_kw * 600 requests per row).
      bounds: int64[W + 1] step boundaries b_w.
      target: float64[K, W] x_kw = s * rate_kw * 600, the load equation's requests per row.
      base: int64[K, W] arrivals certain in the row (unbiased: floor(x); servegen:
        max(ceil(x) - 1, 0));  extra: float64[K, W] the probability of one more (unbiased:
        frac(x) quantized to a multiple of 2^-32; servegen: 0);  capacity: int64[K, W]
        the most arrivals the row can get, base + (extra > 0).
      expected_requests: float64[K] E[requests] per client, sum_w base + extra (exact).
      max_requests: int64[K] its capacity, sum_w capacity (its block holds this + pad rows).
      appear: float64[K] probability that the client sends at least one request in a lane.
      demand: float64[K, W] E_kw[demand] (token-steps; 0 where idle).
      expected_load: the expected offered demand of the generated requests / (M * horizon),
        exact (unbiased: `load` up to the 2^-32 quantization of `extra`).
      mean_prompt, mean_output: float64[K] the mean length per generated request (pooled
        over lanes: expected requests per row as weights; exact);  var_prompt, var_output:
        float64[K, W] per row.
      prompt_clipped, output_clipped: float64[K] PMF mass above the caps, request-weighted
        over the client's rows (weights x); zero_raised: float64[K] likewise for length-0
        mass raised to 1 (prompt and output added).
      params: the device inputs;  layout: the static layout.
    """

    client_ids: np.ndarray
    substituted: np.ndarray
    counting: str
    load: float
    kv_budget: int
    horizon: int
    max_prompt: int
    max_output: int
    pad: int
    rows: tuple[int, int]
    timestamps: np.ndarray
    scale: float
    native_load: float
    seconds_per_step: float
    bounds: np.ndarray
    target: np.ndarray
    base: np.ndarray
    extra: np.ndarray
    capacity: np.ndarray
    expected_requests: np.ndarray
    max_requests: np.ndarray
    appear: np.ndarray
    demand: np.ndarray
    expected_load: float
    mean_prompt: np.ndarray
    mean_output: np.ndarray
    var_prompt: np.ndarray
    var_output: np.ndarray
    prompt_clipped: np.ndarray
    output_clipped: np.ndarray
    zero_raised: np.ndarray
    params: ServeGenParams
    layout: ServeGenLayout

    @property
    def num_clients(self) -> int:
        return int(self.client_ids.shape[0])

    @property
    def num_rows(self) -> int:
        """Rows of a lane's output, real requests and padding."""
        return self.layout.num_rows

    @property
    def clients_expected(self) -> int:
        """Clients with at least one expected request (expected_requests >= 1)."""
        return int((self.expected_requests >= 1).sum())

    @property
    def clients_possible(self) -> int:
        """Clients that can send a request at all (expected_requests > 0)."""
        return int((self.expected_requests > 0).sum())

    @property
    def expected_clients(self) -> float:
        """Expected number of clients with at least one request in a lane (sum of `appear`)."""
        return float(self.appear.sum())

    def summary(self) -> str:
        """A few lines on the counts and the load, for logs."""
        e = self.expected_requests
        return (f"ServeGen plan ({self.counting} counting): {self.num_clients} clients, rows {self.rows[0]}.."
                f"{self.rows[1] - 1} on {self.horizon} steps (1 step = {self.seconds_per_step:.4g} s), "
                f"s = {self.scale:.4g}\n"
                f"  expected requests {e.sum():.1f} per lane (capacity {int(self.max_requests.sum())}); "
                f"clients with >= 1 expected request: {self.clients_expected}, with any: {self.clients_possible}, "
                f"expected present per lane: {self.expected_clients:.1f}\n"
                f"  expected requests per client: min {e.min():.3g}, median {np.median(e):.3g}, max {e.max():.4g}\n"
                f"  offered load: expected {self.expected_load:.6g} (target {self.load:g}, native {self.native_load:.4g})")


def _table(values: np.ndarray, probs: np.ndarray, cap: int):
    """Clip at `cap`, merge, quantize: (values int64[n], thresholds uint32[n], quantized
    probabilities float64[n], clipped mass)."""
    clipped = float(probs[values > cap].sum())
    v, p = _merge(np.minimum(values, cap), probs)
    cum = np.cumsum(p)
    cum = cum / cum[-1]
    c = np.minimum(np.rint(cum * _TWO32), _TWO32 - 1).astype(np.int64)
    c[-1] = _TWO32 - 1
    edges = np.concatenate([[0], c[:-1], [_TWO32]]).astype(np.float64)
    q = np.diff(edges) / _TWO32
    return v, c.astype(np.uint32), q, clipped


def _moments(v: np.ndarray, q: np.ndarray) -> tuple[float, float, float]:
    v = v.astype(np.float64)
    return float(q @ v), float(q @ v ** 2), float(q @ v ** 3)


def block_layout(plan: ServeGenPlan) -> tuple[np.ndarray, np.ndarray]:
    """(first int32[K], size int32[K]): client k's rows are [first_k, first_k + size_k),
    its real requests first (sorted by arrival), then at least `pad` padding rows."""
    size = np.asarray(plan.layout.sizes, np.int64)
    first = np.concatenate([[0], np.cumsum(size)[:-1]])
    return first.astype(np.int32), size.astype(np.int32)


def _check_lane_bytes(rows: float) -> None:
    """Refuse a lane of `rows` request rows over MAX_LANE_BYTES; a float count (inf too)
    is checked before it becomes an integer, so no count wraps."""
    est = float(rows) * NUM_FIELDS * 4
    if not est <= MAX_LANE_BYTES:
        def shown(x):
            return f"{x:.0f}" if x < 1e15 else f"{x:.3g}"
        raise InputError(f"one lane would hold {shown(rows)} request rows ({shown(est / (1 << 20))} MiB of "
                         "int32[R, 5]), "
                         f"over the {MAX_LANE_BYTES >> 20} MiB limit per lane: lower the load or the horizon")


def _servegen_counts(x: np.ndarray, active: np.ndarray) -> np.ndarray:
    """int64: ServeGen's arrivals per row, ceil(x) - 1 (at least 0), x within COUNT_TOLERANCE
    above an integer counting as that integer."""
    return np.maximum(np.where(active, np.ceil(x - COUNT_TOLERANCE), 0) - 1, 0).astype(np.int64)


def _unbiased_counts(x: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(base int64, extra uint32 threshold): floor(x) + Bernoulli(threshold / 2^32), the
    threshold round(frac(x) * 2^32); one that rounds to 2^32 becomes a certain arrival."""
    x = np.where(active, x, 0.0)
    base = np.floor(x)
    thr = np.rint((x - base) * _TWO32).astype(np.int64)
    base = base.astype(np.int64) + (thr >= _TWO32)
    thr = np.where(thr >= _TWO32, 0, thr)
    return base, thr.astype(np.uint32)


def _match_load(offered, load: float, s0: float) -> float:
    """The s whose offered(s) (nondecreasing step function) is closest to `load`."""
    lo, hi = 0.0, s0
    for _ in range(200):
        if offered(hi) >= load:
            break
        lo, hi = hi, hi * 2
    else:
        raise InputError(f"load {load} cannot be reached by scaling the rates")
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if offered(mid) < load else (lo, mid)
    return hi if abs(offered(hi) - load) <= abs(offered(lo) - load) else lo


def _positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def plan(data: ServeGenData, *, load: float, kv_budget: int, horizon: int,
         windows: tuple[int, int] | None = None, max_prompt: int | None = None,
         max_output: int | None = None, match_load: bool = False, counting: str = "unbiased",
         pad: int = 0) -> ServeGenPlan:
    """Scale, count and encode a span of `data` for the device; see the module doc.

    Args:
      load: RHO > 0, offered KV demand over capacity (the factor s is set from it).
      kv_budget: M, KV tokens (token-steps per step).
      horizon: steps the span maps onto.
      windows: (first, stop) row indices, half-open; default all rows.
      max_prompt: prompt cap (default kv_budget);  max_output: output cap (default 16384).
      match_load: only matters for counting="servegen": False (default) takes s from the
        load equation of the module doc, so the generated requests offer `expected_load`
        <= about `load`; True makes `expected_load` as close to `load` as the integer counts
        allow (bisection on s; the residual is at most one row's mean demand /
        (M * horizon)). Under "unbiased" counting the load equation's s already gives
        expected_load = load, so it is used either way.
      counting: "unbiased" (default): floor(x) + Bernoulli(frac(x)) arrivals per row, E = x;
        "servegen": ServeGen's ceil(x) - 1.
      pad: padding rows every client's block ends in, at least (the engine reads up to
        arrival_width + 1 rows past a client's last arrived row; callers pass that).
    """
    m = _positive_int(kv_budget, "kv_budget")
    h = _positive_int(horizon, "horizon")
    pad = _positive_int(pad, "pad", minimum=0)
    cap_p = m if max_prompt is None else _positive_int(max_prompt, "max_prompt")
    cap_o = DEFAULT_MAX_OUTPUT if max_output is None else _positive_int(max_output, "max_output")
    if counting not in COUNTINGS:
        raise InputError(f"counting must be one of {', '.join(COUNTINGS)}, got {counting!r}")
    if isinstance(load, bool) or not isinstance(load, (int, float, np.floating, np.integer)) \
            or not math.isfinite(load) or load <= 0:
        raise InputError(f"load must be a finite number > 0, got {load!r}")
    load = float(load)
    first, stop = (0, data.num_windows) if windows is None else tuple(windows)
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (first, stop)) \
            or not 0 <= first < stop <= data.num_windows:
        raise InputError(f"windows must be (first, stop) with 0 <= first < stop <= {data.num_windows}, "
                         f"got {windows!r}")
    first, stop = int(first), int(stop)
    k, w = data.num_clients, stop - first
    if h < w:
        raise InputError(f"horizon {h} is shorter than the {w} rows it must hold (one step per row at least)")
    if -(-h // w) > MAX_WINDOW_STEPS:
        raise InputError(f"horizon {h} gives over {MAX_WINDOW_STEPS} steps per 600 s row (float32 positions)")
    if h * k > INT32_MAX:
        raise InputError(f"horizon x clients = {h * k} overflows the arrival * K + k sort key (int32)")
    rate = data.rate[:, first:stop]
    lengths = data.lengths[:, first:stop]
    active = rate > 0

    # Per dataset window in use: clipped, quantized tables and their moments.
    used = sorted(set(int(x) for x in lengths[active]))
    tables, stats = [], {}
    for p in used:
        pmf = data.pmfs[p]
        pv, pc, pq, p_clip = _table(pmf.prompt_values, pmf.prompt_probs, cap_p)
        ov, oc, oq, o_clip = _table(pmf.output_values, pmf.output_probs, cap_o)
        tables += [(pv, pc), (ov, oc)]
        (e_p, e_p2, _), (e_o, e_o2, _) = _moments(pv, pq), _moments(ov, oq)
        stats[p] = dict(e_p=e_p, v_p=e_p2 - e_p ** 2, e_o=e_o, v_o=e_o2 - e_o ** 2,
                        demand=e_o * e_p + (e_o2 + e_o) / 2, p_clip=p_clip, o_clip=o_clip,
                        raised=pmf.prompt_raised + pmf.output_raised)

    def per_row(name):
        lut = np.zeros(len(data.pmfs))
        for p_, st in stats.items():
            lut[p_] = st[name]
        return np.where(active, lut[np.maximum(lengths, 0)], 0.0)

    demand = per_row("demand")
    native = rate * WINDOW_SECONDS
    total = float((native * demand).sum())
    if total <= 0:
        raise InputError(f"rows {first}..{stop - 1} hold no requests: nothing to scale to load {load}")
    s = load * m * h / total
    if counting == "servegen" and match_load:
        s = _match_load(lambda s_: (_servegen_counts(s_ * native, active) * demand).sum() / (m * h), load, s)
    x = s * native
    _check_lane_bytes(float(np.ceil(x).sum()) + pad * k)  # the most rows, before counts become integers
    if counting == "servegen":
        base, thr = _servegen_counts(x, active), np.zeros(x.shape, np.uint32)
    else:
        base, thr = _unbiased_counts(x, active)
    extra = thr.astype(np.float64) / _TWO32
    capacity = base + (thr > 0)
    max_requests = capacity.sum(axis=1)
    sizes = max_requests + pad
    _check_lane_bytes(int(sizes.sum()))
    num_gaps = int(np.where(capacity > 0, capacity + 1, 0).sum())
    if num_gaps > INT32_MAX // 2:
        raise InputError(f"{num_gaps} gaps to draw: over the int32 index limit")
    mean_n = base + extra
    appear = np.where(base.sum(axis=1) > 0, 1.0, 1.0 - np.prod(1.0 - extra, axis=1))

    def weighted(values, weights):
        tot = weights.sum(axis=1)
        return np.where(tot > 0, (values * weights).sum(axis=1) / np.where(tot > 0, tot, 1), 0.0)

    bounds = (np.arange(w + 1, dtype=np.int64) * h) // w
    lut = np.zeros(len(data.pmfs), np.int32)
    lut[used] = 2 * np.arange(len(used))
    pt = np.where(active, lut[np.maximum(lengths, 0)], 0).astype(np.int32)
    ot = np.where(active, pt + 1, 0).astype(np.int32)
    table_sizes = np.asarray([len(v) for v, _ in tables] or [1], np.int64)
    starts = np.concatenate([[0], np.cumsum(table_sizes)[:-1]])
    flat_v = np.concatenate([v for v, _ in tables]) if tables else np.ones(1, np.int64)
    flat_c = np.concatenate([c for _, c in tables]) if tables else np.full(1, _TWO32 - 1, np.uint32)
    pattern = data.pattern[:, first:stop].astype(np.int32)
    params = ServeGenParams(
        base=jnp.asarray(base, I32), extra=jnp.asarray(thr, U32),
        client_id=jnp.asarray(data.client_ids.astype(np.uint32)),
        stamp=jnp.asarray(data.timestamps[first:stop].astype(np.uint32)),
        start=jnp.asarray(bounds[:-1], I32), length=jnp.asarray(np.diff(bounds), I32),
        pattern=jnp.asarray(pattern), shape=jnp.asarray(np.where(active, data.shape[:, first:stop], 1.0), F32),
        log_scale=jnp.asarray(np.log(np.where(active, data.scale[:, first:stop], 1.0)), F32),
        prompt_table=jnp.asarray(pt), output_table=jnp.asarray(ot),
        table_start=jnp.asarray(starts, I32), table_size=jnp.asarray(table_sizes, I32),
        thresholds=jnp.asarray(flat_c.astype(np.uint32)), values=jnp.asarray(flat_v, I32))
    layout = ServeGenLayout(k, w, int(capacity.sum()), num_gaps, tuple(int(r) for r in sizes), pad,
                            int(table_sizes.max()).bit_length() + 1, h)
    return ServeGenPlan(
        client_ids=data.client_ids.copy(), substituted=data.substituted.copy(), counting=counting, load=load,
        kv_budget=m, horizon=h, max_prompt=cap_p, max_output=cap_o, pad=pad, rows=(first, stop),
        timestamps=data.timestamps[first:stop].copy(), scale=s, native_load=total / (m * h),
        seconds_per_step=WINDOW_SECONDS * w / h, bounds=bounds, target=x, base=base, extra=extra,
        capacity=capacity, expected_requests=mean_n.sum(axis=1), max_requests=max_requests, appear=appear,
        demand=demand, expected_load=float((mean_n * demand).sum()) / (m * h),
        mean_prompt=weighted(per_row("e_p"), mean_n), mean_output=weighted(per_row("e_o"), mean_n),
        var_prompt=per_row("v_p"), var_output=per_row("v_o"),
        prompt_clipped=weighted(per_row("p_clip"), x), output_clipped=weighted(per_row("o_clip"), x),
        zero_raised=weighted(per_row("raised"), x), params=params, layout=layout)


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
    _check_lane_bytes(layout.num_rows)
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
