"""The artifact profile's inputs, checked on the host: a lane's trace (`make_trace`:
sorted, clients renumbered by first arrival), the running-slot bound (`slot_bound`), the
requests no round could ever admit (`never_admitted`, `check_admissible`) and the
wall-clock trace CSV (`read_trace_csv`). Every refusal is one InputError line naming the
problem (artifact.py: the settings; the engine is the slora server).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table, read_text
from vtc_jax.engines.artifact import MAX_ARRIVAL_S, MAX_TOKENS, Profile

TRACE_COLUMNS = ("arrival_s", "client", "prompt", "output")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,3})?$")
_INT = re.compile(r"^[+]?\d{1,10}$")


def check_columns(arrival_s, client, prompt, output, source: str = "trace") -> tuple:
    """Validated columns (float64, int64 x 3), InputError naming the problem otherwise."""
    arrival_s = np.asarray(arrival_s, np.float64)
    cols = [np.asarray(c) for c in (client, prompt, output)]
    n = arrival_s.size
    if arrival_s.ndim != 1 or any(c.shape != (n,) for c in cols):
        raise InputError(f"{source}: columns must be 1-D and of equal length")
    if n == 0:
        raise InputError(f"{source}: no requests")
    if not np.isfinite(arrival_s).all() or (arrival_s < 0).any() or (arrival_s > MAX_ARRIVAL_S).any():
        raise InputError(f"{source}: arrivals must be finite, >= 0 and <= {MAX_ARRIVAL_S:.0f} s")
    out = []
    for name, c, low in zip(("client", "prompt", "output"), cols, (0, 1, 1)):
        c64 = c.astype(np.float64)
        if not np.isfinite(c64).all() or (c64 != np.round(c64)).any() or (c64 < low).any() or (c64 > MAX_TOKENS).any():
            raise InputError(f"{source}: {name} must hold integers in [{low}, {MAX_TOKENS}]")
        out.append(c64.astype(np.int64))
    if out[0].max() >= 1 << 16:
        raise InputError(f"{source}: client ids must be < {1 << 16}")
    return (arrival_s, *out)


@dataclasses.dataclass(frozen=True)
class LaneTrace:
    """A lane's trace on the host, sorted by arrival (ties: row): arrival_s, client
    (renumbered by first arrival), prompt, output (float64/int64[n]) and the client
    renumbering new_id[old client] (int64[K])."""

    arrival_s: np.ndarray
    client: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    new_id: np.ndarray


def make_trace(arrival_s, client, prompt, output, *, input_extra: int = 2, num_clients: int | None = None) -> LaneTrace:
    """Host-side trace from columns (any order; sorted here by arrival, ties by row).

    Clients are renumbered by first arrival (ties: lower id) so that the least index is
    the artifact's tie-break; `num_clients` pads the renumbering. `input_extra` is checked
    (the server's input is prompt + input_extra).
    """
    arrival_s, client, prompt, output = check_columns(arrival_s, client, prompt, output)
    if not 0 <= input_extra <= MAX_TOKENS:
        raise InputError(f"input_extra must be in [0, {MAX_TOKENS}], got {input_extra}")
    n = arrival_s.size
    order = np.lexsort((np.arange(n), arrival_s))
    k = max(int(client.max()) + 1, num_clients or 0)
    first = np.full(k, np.inf)
    np.minimum.at(first, client, np.argsort(order).astype(np.float64))
    new_id = np.empty(k, np.int64)
    new_id[np.lexsort((np.arange(k), first))] = np.arange(k)
    return LaneTrace(arrival_s[order], new_id[client[order]], prompt[order], output[order], new_id)


def slot_bound(prompts, profile: Profile, num_requests: int) -> int:
    """Most requests that can hold KV at once: each holds >= input + 1 tokens, the set's
    need (LightLLM's) is at least their sum, and it must stay below the pool minus one
    adapter reserve; also <= running_cap and <= N. `prompts`: every prompt length a lane
    may hold (for traces whose lengths vary by seed: the smallest possible, repeated)."""
    held = np.sort(np.asarray(prompts, np.int64) + profile.input_extra + 1)
    room = profile.kv_pool - profile.adapter_reserve
    fits = int(np.searchsorted(np.cumsum(held), room, side="left"))
    return max(1, min(fits, profile.running_cap, num_requests))


def never_admitted(prompt, output, profile: Profile) -> np.ndarray:
    """bool[n]: requests the engine can never admit, not even alone on an idle server.

    Alone, a request's server input (prompt + input_extra) must fit the round's
    prefill_cap, and LightLLM's worst-case need of it (held input + 1 plus output - 1 to
    come = input + output) must stay below the pool minus one adapter reserve. A request
    that passes both is admitted once nothing runs (the cadence allows admission then), so
    these are exactly the requests that would stay queued for ever, and, under FCFS or at
    the head of a client's FIFO, keep every request behind them queued too."""
    server = np.asarray(prompt, np.int64) + profile.input_extra
    need = server + np.asarray(output, np.int64)
    return (server > profile.prefill_cap) | (need >= profile.kv_pool - profile.adapter_reserve)


def check_admissible(cols: dict, profile: Profile, source: str, lines=None) -> None:
    """Refuse (InputError, one line) the first request of `cols` that `never_admitted`:
    naming `source`, the request (its file line from `lines`, int[n], else its row), its
    prompt and the profile limit it exceeds."""
    prompt, output = np.asarray(cols["prompt"], np.int64), np.asarray(cols["output"], np.int64)
    bad = np.flatnonzero(never_admitted(prompt, output, profile))
    if not bad.size:
        return
    i = int(bad[0])
    where = f"line {int(lines[i])}" if lines is not None else f"request {i}"
    p, o, extra = int(prompt[i]), int(output[i]), profile.input_extra
    if p + extra > profile.prefill_cap:
        limit = (f"server input {p + extra} tokens (prompt {p} + input_extra {extra}) exceeds the profile's "
                 f"prefill_cap {profile.prefill_cap}")
    else:
        limit = (f"prompt {p} + input_extra {extra} + output {o} = {p + extra + o} KV tokens is not below the "
                 f"kv_pool {profile.kv_pool} minus one adapter_reserve {profile.adapter_reserve}")
    more = f" ({bad.size - 1} more such requests)" if bad.size > 1 else ""
    raise InputError(f"{source}: {where}: {limit}; the engine could never admit it{more}")


def read_trace_csv(path) -> dict:
    """A wall-clock trace CSV with header arrival_s,client,prompt,output (any column order,
    no others): {"arrival_s": float64[n], "client", "prompt", "output": int64[n], "line":
    int64[n] (each request's line in the file, for messages such as `check_admissible`'s)}.

    Raises InputError with one line naming the file, the line and the problem: a missing,
    unknown or repeated column, a row with the wrong number of fields, an arrival that is
    not a finite number >= 0 (below 2^33 s), a client, prompt or output that is not a
    decimal integer in range (client < 65,536; 1 <= prompt, output <= 2^20), no rows. A `#`
    is an ordinary character (never a comment); the file size is bounded (fileio).
    """
    source = os.fspath(path)
    text = read_text(path, what="trace")
    header, records = csv_table(text, source, TRACE_COLUMNS)
    cols = {name: [] for name in TRACE_COLUMNS}
    lines = []
    limits = {"client": (0, (1 << 16) - 1), "prompt": (1, MAX_TOKENS), "output": (1, MAX_TOKENS)}
    for line, row in records:
        lines.append(line)
        for name, cell in zip(header, row):
            shown = cell if len(cell) <= 24 else cell[:24] + "..."
            if name == "arrival_s":
                value = float(cell) if _NUMBER.match(cell) else math.nan
                if not (math.isfinite(value) and 0 <= value <= MAX_ARRIVAL_S):
                    raise InputError(f"{source}: line {line}: arrival_s must be a finite number in "
                                     f"[0, {MAX_ARRIVAL_S:.0f}], got {shown!r}")
                cols[name].append(value)
            else:
                low, high = limits[name]
                if not _INT.match(cell) or not low <= int(cell) <= high:
                    raise InputError(f"{source}: line {line}: {name} must be an integer in [{low}, {high}], "
                                     f"got {shown!r}")
                cols[name].append(int(cell))
    if not cols["arrival_s"]:
        raise InputError(f"{source}: no requests (only a header)")
    return {"arrival_s": np.asarray(cols["arrival_s"], np.float64),
            **{c: np.asarray(cols[c], np.int64) for c in ("client", "prompt", "output")},
            "line": np.asarray(lines, np.int64)}
