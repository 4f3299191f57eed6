"""The artifact engine's inputs, encoded and checked on the host: a lane's traced settings
(`make_params`) and trace (`make_trace`: sorted, clients renumbered by first arrival,
padded), the running-slot bound (`slot_bound`), the requests no round could ever admit
(`never_admitted`, `check_admissible`) and the wall-clock trace CSV (`read_trace_csv`).
Every refusal is one InputError line naming the problem (artifact.py: the engine).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Sequence

import jax
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table, read_text
from vtc_jax.engines.artifact import (ARR_HI, ARR_LO, BASE, BIG, CLIENT, DEFAULT_PROFILE, INPUT, MAX_ARRIVAL_S,
                                      MAX_TOKENS, NO_LIMIT, ORACLE, OUTPUT, POLICIES, WORD, Params, Profile, Trace)

TRACE_COLUMNS = ("arrival_s", "client", "prompt", "output")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,3})?$")
_INT = re.compile(r"^[+]?\d{1,10}$")


def make_params(policy: str, num_clients: int, profile: Profile = DEFAULT_PROFILE, *, rpm_limit: int | None = None,
                weights: Sequence[float] | None = None) -> Params:
    """Traced Params of one lane (numpy leaves) from a policy name and a Profile."""
    if policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if policy == "rpm" and (rpm_limit is None or not 1 <= rpm_limit < NO_LIMIT):
        raise InputError(f"policy rpm needs an rpm limit in [1, {NO_LIMIT - 1}]")
    w = np.ones(num_clients, np.float32) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (num_clients,) or not np.isfinite(w).all() or (w <= 0).any():
        raise InputError(f"weights must be {num_clients} finite positive numbers")
    b = lambda x: np.asarray(x, bool)  # noqa: E731
    i = lambda x: np.asarray(x, np.int32)  # noqa: E731
    f = lambda x: np.asarray(x, np.float32)  # noqa: E731
    return Params(
        by_counter=b(policy not in ("fcfs", "rpm")), lift=b(policy in ("vtc", "vtc_oracle", "vtc_predict")),
        predict=b(policy == "vtc_predict"), oracle=b(policy == "vtc_oracle"),
        rpm_limit=i(rpm_limit if policy == "rpm" else NO_LIMIT), rpm_window_us=i(round(profile.rpm_window_s * 1e6)),
        weight=f(w), w_p=f(profile.w_p), w_q=f(profile.w_q), kv_pool=i(profile.kv_pool),
        adapter_reserve=i(profile.adapter_reserve), prefill_cap=i(profile.prefill_cap),
        running_cap=i(profile.running_cap), cadence=i(profile.cadence), poll_us=i(round(profile.poll_s * 1e6)),
        idle_jump=b(profile.idle == "jump"), extra_finish_charge=b(profile.extra_finish_charge),
        time_coef=profile.step_time.coefficients_us())


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
    """A lane's trace on the host: the device `Trace` plus the sorted columns the measures
    read (arrival_s, client renumbered, prompt, output, float64/int64[n]) and the client
    renumbering new_id[old client] (int64[K])."""

    trace: Trace
    arrival_s: np.ndarray
    client: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    new_id: np.ndarray


def make_trace(arrival_s, client, prompt, output, *, input_extra: int = 2, num_requests: int | None = None,
               num_clients: int | None = None, oracle_r: float = 0.0, seed: int = 0) -> LaneTrace:
    """Host-side trace from columns (any order; sorted here by arrival, ties by row).

    Clients are renumbered by first arrival (ties: lower id) so that argmin's smallest
    index is the artifact's tie-break. `oracle_r`: vtc_oracle predictions
    uniform(L(1-r), L(1+r)) (seeded); r = 0: exact. Padded to `num_requests` rows and
    `num_clients` clients.
    """
    arrival_s, client, prompt, output = check_columns(arrival_s, client, prompt, output)
    if not 0 <= input_extra <= MAX_TOKENS:
        raise InputError(f"input_extra must be in [0, {MAX_TOKENS}], got {input_extra}")
    if not (math.isfinite(oracle_r) and 0 <= oracle_r < 1):
        raise InputError(f"oracle range r must be in [0, 1), got {oracle_r}")
    n = arrival_s.size
    order = np.lexsort((np.arange(n), arrival_s))
    k = max(int(client.max()) + 1, num_clients or 0)
    first = np.full(k, np.inf)
    np.minimum.at(first, client, np.argsort(order).astype(np.float64))
    new_id = np.empty(k, np.int64)
    new_id[np.lexsort((np.arange(k), first))] = np.arange(k)
    size = num_requests or n
    if size < n:
        raise InputError(f"num_requests {size} < trace length {n}")
    a = arrival_s[order]
    c = new_id[client[order]]
    p, o = prompt[order], output[order]
    rng = np.random.default_rng(seed)
    pred = o * rng.uniform(1 - oracle_r, 1 + oracle_r, n) if oracle_r > 0 else o.astype(np.float64)
    us = np.round(a * 1e6).astype(np.int64)
    counts = np.bincount(c, minlength=k)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rows = np.zeros((size, 6), np.int32)
    rows[:, ARR_HI] = BIG
    rows[:, INPUT] = rows[:, OUTPUT] = 1
    rows[:n, ARR_HI] = us >> WORD
    rows[:n, ARR_LO] = us & (BASE - 1)
    rows[:n, CLIENT] = c
    rows[:n, INPUT] = p + input_extra
    rows[:n, OUTPUT] = o
    rows[:n, ORACLE] = pred.astype(np.float32).view(np.int32)
    trace = Trace(rows=rows, start=start.astype(np.int32), num=np.asarray(n, np.int32))
    return LaneTrace(trace, a, c, p, o, new_id)


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


def stack(items):
    """Stack pytrees (Trace or Params) along a new leading lane axis, on the host."""
    return jax.tree_util.tree_map(lambda *x: np.stack([np.asarray(v) for v in x]), *items)


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
