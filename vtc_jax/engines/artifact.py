"""The artifact engine profile: the OSDI '24 VTC artifact's serving engine (S-LoRA on
LightLLM, Llama-2-7B on an A10G), as a pure JAX state machine beside the exact MODEL.md
engine (engine.py), which stays the default and stays exact. docs/ARTIFACT.md describes
the model, its settings, its measures and how it was validated.

What it models (every item is a named setting of `Profile` or `StepTime`):

  * wall-clock arrivals (`arrival_s`), held as exact microseconds in two int32 words;
  * a step-time model (`StepTime`; defaults: the A10G fit), prefill steps that stall
    decoding (no mixed or chunked prefill), an idle poll when nothing runs (`idle`);
  * the admission cadence: after a prefill, `cadence` decode steps with no admission;
    then admission before every decode step until something is admitted;
  * LightLLM's worst-case KV reservation with a per-client adapter reserve, the per-round
    prefill-token cap and the running cap; the first failing candidate ends the round;
  * candidate ties broken by the clients' first-arrival order;
  * the extra `w_q / weight` charge at steps where a request of the batch finishes;
  * the lift over *other* backlogged clients, without the `last_left` clause;
  * policies fcfs, lcf, vtc (weighted with weights), vtc_oracle (prediction range r),
    vtc_predict (per-client moving average), rpm (rejection at arrival over a sliding
    window of accepted requests, then FCFS).

Layout: one lane is one server replaying one trace of N requests (sorted by arrival; rows
past `Trace.num` are padding). It implements the runner's protocol (`ARTIFACT_PROGRAM`:
per-lane init/step/done; runner.run does the chunked scan, vmap, jit and sharding) and the
sweep driver's engine adapter (`ARTIFACT_ENGINE`). Every event costs O(S + K), S the
running slots (a proven bound on how many requests can run at once), K the clients, never
O(N):

  * per-client FIFOs are pointers: the accepted requests of client k are appended to its
    block of `queue` (blocks laid out by client, `Trace.start`), head/tail per client;
  * running requests live in a pool of S slots (a free-list stack) and, for the KV check,
    in an array kept sorted by tokens still to come (`left`, descending) with
    V_k = k * left_k + (tokens held by the first k); a decode step leaves V unchanged
    (left - 1, held + 1 for everyone), so LightLLM's need max_k V_k of the running set plus
    a candidate is one masked pass over the slots: no sort;
  * the RPM window test reads one queue entry (the accepted request `limit` places back);
  * slots in tiers: runs hold far fewer requests than the bound (the real trace: 51 of
    657), so `run` first gives every lane SLOT_TIER slots and reruns with the bound only
    the lanes that overflow (slots bound capacity only: results are the same).

One event, chosen per lane by masks (no per-lane lax.cond):

  COMPLETE: a request of the last step finished: it leaves (one per event, in request
            order, so vtc_predict's moving averages apply in the artifact's order);
  ARRIVE  : the next request with arrival <= now joins its FIFO (lift, RPM rejection);
  ADMIT   : admission is allowed (nothing runs, or `cadence` decode steps passed since the
            last prefill) and the policy's candidate passes the checks: it joins the
            round (a micro-event: time does not move);
  STEP    : the round's prefill if it admitted anything, else a decode step of the
            running batch, else idle until the next arrival (`idle`: whole polls or a jump).

Time is exact integer microseconds in two int32 words (value = hi * 2^30 + lo), so the
clock never wraps; each step's duration is a sum of float32 terms, each rounded to a
microsecond. Counters are float32 (charges are multiples of 1/weight; integer charges
stay exact below 2^24).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table, read_text
from vtc_jax.driver import runner
from vtc_jax.driver.results import service_difference
from vtc_jax.engines.program import LaneProgram

I32, F32 = jnp.int32, jnp.float32
POLICIES = ("fcfs", "lcf", "vtc", "vtc_oracle", "vtc_predict", "rpm")
IDLE_RULES = ("poll", "jump")
NO_LIMIT = 1 << 30
NONE, DONE, REJECTED = 0, 1, 2  # per-request outcome
WORD = 30
BASE = 1 << WORD  # two-word time: hi * 2^30 + lo, 0 <= lo < 2^30
MAX_TOKENS = 1 << 20  # largest server input or output of one request
MAX_ARRIVAL_S = float(1 << 33)  # about 272 years: arrivals stay exact microseconds (below 2^53)
MAX_STEP_US = 1 << 29  # longest step (about 9 minutes): refused up front beyond
MAX_WINDOW_US = (1 << 29) - 1  # RPM window and idle poll period bound (about 9 minutes)
BIG = (1 << 31) - 1


def _finite_nonneg(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Step-duration model, in seconds (defaults: the A10G fit of the artifact).

    prefill = overhead * (prefill_base + prefill_per_token * sum of the batch's input tokens)
    decode  = overhead * (decode_base + decode_per_request * running
                          + decode_per_context_token * sum over running of (input + generated))

    Every coefficient must be a finite number >= 0 (InputError otherwise).
    """

    prefill_base: float = 0.0
    prefill_per_token: float = 0.214e-3
    decode_base: float = 19.7e-3
    decode_per_request: float = 0.215e-3
    decode_per_context_token: float = 1.71e-6
    overhead: float = 1.08

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _finite_nonneg(f"step time {f.name}", getattr(self, f.name)))

    @classmethod
    def from_dict(cls, data, source: str = "step time") -> "StepTime":
        """From a JSON object (sweeps.calibrate --out): known keys only, finite >= 0."""
        if not isinstance(data, dict):
            names = ", ".join(f.name for f in dataclasses.fields(cls))
            raise InputError(f"{source}: expected a JSON object of {names}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InputError(f"{source}: unknown key {unknown[0]!r} (expected {', '.join(sorted(names))})")
        return cls(**data)

    def coefficients_us(self) -> np.ndarray:
        """float32[5]: overhead * (prefill_base, prefill_per_token, decode_base,
        decode_per_request, decode_per_context_token), in microseconds."""
        return np.asarray([self.overhead * x * 1e6 for x in (self.prefill_base, self.prefill_per_token,
                                                              self.decode_base, self.decode_per_request,
                                                              self.decode_per_context_token)], np.float32)


@dataclasses.dataclass(frozen=True)
class Profile:
    """The engine profile's settings (defaults: the artifact's engine).

    Attributes:
      kv_pool: KV pool in tokens (the artifact: 10,000).
      adapter_reserve: tokens reserved per distinct client among running and candidates
        (LoRA rank 8 x 4 = 32 in the artifact; 0 describes an engine without it).
      prefill_cap: most input tokens admitted in one round (batch_max_tokens, 3,072).
      running_cap: most requests running, round candidates included (1,000).
      cadence: decode steps after a prefill with no admission attempt (max_wait_tokens, 10).
      poll_s: idle poll period when nothing runs (10 ms).
      idle: "poll": after an idle gap the server starts at the first whole poll at or after
        the next arrival (the router's 10 ms sleep loop); "jump": it starts exactly at the
        arrival. Neither is proven to be the real router's (see docs/ARTIFACT.md).
      input_extra: server input length = trace prompt + this (BOS and a trailing token: 2).
      w_p, w_q: counter prices of an input and an output token (1, 2).
      extra_finish_charge: at a step where a request of the batch finishes, charge every
        request of the batch once more (the artifact's final revision: on).
      rpm_window_s: RPM sliding window (60 s, inclusive).
      step_time: the step-duration model.
    """

    kv_pool: int = 10_000
    adapter_reserve: int = 32
    prefill_cap: int = 3072
    running_cap: int = 1000
    cadence: int = 10
    poll_s: float = 0.01
    idle: str = "poll"
    input_extra: int = 2
    w_p: float = 1.0
    w_q: float = 2.0
    extra_finish_charge: bool = True
    rpm_window_s: float = 60.0
    step_time: StepTime = StepTime()

    def __post_init__(self):
        for name, low, high in (("kv_pool", 1, 1 << 30), ("adapter_reserve", 0, 1 << 20), ("prefill_cap", 1, 1 << 30),
                                ("running_cap", 1, 1 << 20), ("cadence", 0, 1 << 30), ("input_extra", 0, MAX_TOKENS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
                raise InputError(f"profile {name} must be an integer in [{low}, {high}], got {value!r}")
        for name in ("w_p", "w_q"):
            object.__setattr__(self, name, _finite_nonneg(f"profile {name}", getattr(self, name)))
        for name in ("poll_s", "rpm_window_s"):
            value = _finite_nonneg(f"profile {name}", getattr(self, name))
            if not 1 <= round(value * 1e6) <= MAX_WINDOW_US:
                raise InputError(f"profile {name} must be in [1e-6, {MAX_WINDOW_US / 1e6:.0f}] s, got {value!r}")
            object.__setattr__(self, name, value)
        if self.idle not in IDLE_RULES:
            raise InputError(f"profile idle must be one of {', '.join(IDLE_RULES)}, got {self.idle!r}")
        if not isinstance(self.step_time, StepTime):
            raise InputError("profile step_time must be a StepTime")

    def replace(self, **changes) -> "Profile":
        return dataclasses.replace(self, **changes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
    """Traced per-lane settings (a batch adds a leading lane axis to every field).

    Attributes:
      by_counter: bool[]  lcf/vtc/oracle/predict pick the least-counter client (else oldest).
      lift: bool[]  apply the lift rule at arrival.
      predict: bool[]  charge the per-client moving-average prediction (vtc_predict).
      oracle: bool[]  charge the per-request prediction `Trace.oracle` (vtc_oracle).
      rpm_limit: int32[]  accepted requests per client per window (NO_LIMIT: no RPM).
      rpm_window_us: int32[]
      weight: float32[K]  client weights.
      w_p, w_q: float32[]
      kv_pool, adapter_reserve, prefill_cap, running_cap, cadence, poll_us: int32[]
      idle_jump: bool[]  Profile.idle == "jump".
      extra_finish_charge: bool[]
      time_coef: float32[5]  StepTime.coefficients_us(). A step's duration is the sum of its
        terms, each one float32 product rounded to a microsecond (half to even): no fused
        multiply-add can change it, so a pure-Python replay reproduces it.
    """

    by_counter: jax.Array
    lift: jax.Array
    predict: jax.Array
    oracle: jax.Array
    rpm_limit: jax.Array
    rpm_window_us: jax.Array
    weight: jax.Array
    w_p: jax.Array
    w_q: jax.Array
    kv_pool: jax.Array
    adapter_reserve: jax.Array
    prefill_cap: jax.Array
    running_cap: jax.Array
    cadence: jax.Array
    poll_us: jax.Array
    idle_jump: jax.Array
    extra_finish_charge: jax.Array
    time_coef: jax.Array


# Fields of a request row (Trace.rows) and of a result row (State.result).
ARR_HI, ARR_LO, CLIENT, INPUT, OUTPUT, ORACLE = range(6)
OUTCOME, FIRST_HI, FIRST_LO, FINISH_HI, FINISH_LO, CHARGED = range(6)
# Fields of a slot of the pool (State.pool).
P_REQ, P_CLIENT, P_INPUT, P_OUTPUT, P_PRED = range(5)


def _bits(x) -> jax.Array:
    """float32 -> its int32 bit pattern (float fields ride in int32 rows)."""
    return jax.lax.bitcast_convert_type(jnp.asarray(x, F32), I32)


def _float(x) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, F32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Trace:
    """One lane's requests, sorted by arrival (ties: trace order), padded to N rows.

    Attributes:
      rows: int32[N, 6]  per request: arrival in microseconds as two words (ARR_HI * 2^30 +
        ARR_LO), CLIENT (numbered by first arrival, ties: lower id first), INPUT (server
        input tokens: prompt + input_extra; charges, KV, prefill time), OUTPUT (>= 1) and
        ORACLE (vtc_oracle's predicted output, float32 bits). One gather reads a request.
      start: int32[K]  first row of client k's block in the lane's `queue`.
      num: int32[]  real rows (the rest is padding).
    """

    rows: jax.Array
    start: jax.Array
    num: jax.Array


@dataclasses.dataclass(frozen=True)
class Config:
    """Static settings (changing one recompiles): num_requests N, num_clients K, slots S
    (running slots: at least the most requests that can hold KV at once, `slot_bound`)."""

    num_requests: int
    num_clients: int
    slots: int


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """One lane's engine state. Per request (N): the queue (client blocks) and the result
    rows; per client (K): FIFO head/tail, requests holding KV, counters, vtc_predict's
    prediction; per slot (S): the pool of running requests and the KV check's sorted view.

    Attributes:
      now_hi, now_lo: int32[]  wall clock (us, two words).
      wait: int32[]  decode steps since the last prefill.
      decodes: int32[]  decode steps so far (D: a running request's left = key - D).
      next_arrival: int32[]  index of the next request to arrive.
      head, tail: int32[K]  client k's FIFO is queue[start_k + head_k : start_k + tail_k];
        queue[start_k : start_k + tail_k] are all its accepted requests, in order.
      members: int32[K]  requests of client k holding KV (running or in the open round).
      counter, client_pred: float32[K]
      queue: int32[N]  request indices (client blocks).
      result: int32[N, 6]  per request: OUTCOME (NONE, DONE, REJECTED), FIRST_HI/LO (end of
        its prefill step), FINISH_HI/LO (end of its last step), CHARGED (the prediction
        charged at admission, float32 bits); written once, at completion or rejection.
      count, pending, round_tokens: int32[]  requests holding KV; of them in the open round;
        the round's input tokens.
      skey, sval, sslot: int32[S]; spend: bool[S]  the sorted view: position j < count holds
        slot sslot_j with left = skey_j - decodes (descending), V_j = (j + 1) * left_j +
        (held by positions <= j), spend_j: in the open round.
      pool: int32[S, 5]  per slot: P_REQ, P_CLIENT, P_INPUT, P_OUTPUT, P_PRED (prediction
        charged at admission, float32 bits).
      pd0: int32[S]  decodes at its prefill (generated = 1 + decodes - pd0).
      pstamp: int32[S, 2]  its first-token time (two words).
      pocc, ppend, pfin: bool[S]  occupied, in the open round, finished at the last step.
      free: int32[S], nfree: int32[]  free slots (a stack).
      finishing: int32[]  requests of the last step still to complete.
      steps, prefills, events: int32[]  engine steps, prefill steps, loop iterations.
      peak: int32[]  the most requests that held KV at once.
      overflow: bool[]  a request passed every check with no free slot (the lane stops and
        is rerun with more slots, or, at the proven bound, reported as not finished).
      done: bool[]
    """

    now_hi: jax.Array
    now_lo: jax.Array
    wait: jax.Array
    decodes: jax.Array
    next_arrival: jax.Array
    head: jax.Array
    tail: jax.Array
    members: jax.Array
    counter: jax.Array
    client_pred: jax.Array
    queue: jax.Array
    result: jax.Array
    count: jax.Array
    pending: jax.Array
    round_tokens: jax.Array
    skey: jax.Array
    sval: jax.Array
    sslot: jax.Array
    spend: jax.Array
    pool: jax.Array
    pd0: jax.Array
    pstamp: jax.Array
    pocc: jax.Array
    ppend: jax.Array
    pfin: jax.Array
    free: jax.Array
    nfree: jax.Array
    finishing: jax.Array
    steps: jax.Array
    prefills: jax.Array
    events: jax.Array
    peak: jax.Array
    overflow: jax.Array
    done: jax.Array


def outcome(state: State) -> np.ndarray:
    """OUTCOME per request (any leading lane axes), host numpy."""
    return np.asarray(state.result)[..., OUTCOME]


def first_us(state: State) -> np.ndarray:
    """First-token time per request in microseconds (int64; valid where DONE)."""
    r = np.asarray(state.result).astype(np.int64)
    return (r[..., FIRST_HI] << WORD) + r[..., FIRST_LO]


def finish_us(state: State) -> np.ndarray:
    """Finish time per request in microseconds (int64; valid where DONE)."""
    r = np.asarray(state.result).astype(np.int64)
    return (r[..., FINISH_HI] << WORD) + r[..., FINISH_LO]


def charged(state: State) -> np.ndarray:
    """The prediction charged at admission per request (float32; valid where DONE)."""
    return np.asarray(state.result)[..., CHARGED].astype(np.int32).view(np.float32)


# ----------------------------------------------------------------------------- host side

def make_params(policy: str, num_clients: int, profile: Profile = Profile(), *, rpm_limit: int | None = None,
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


# ----------------------------------------------------------------------------- the engine

def _le(ah, al, bh, bl):
    """(ah, al) <= (bh, bl) for two-word times."""
    return (ah < bh) | ((ah == bh) & (al <= bl))


def _add(hi, lo, d):
    """(hi, lo) + d for 0 <= d < 2^30 (lo + d stays below 2^31)."""
    s = lo + d
    return hi + (s >> WORD), s & (BASE - 1)


def step_terms(*terms) -> jax.Array:
    """A step's duration: each float32 term rounded to a microsecond, summed. int32[]."""
    return sum(jnp.round(t).astype(I32) for t in terms)


def init_state(config: Config) -> State:
    n, k, s = config.num_requests, config.num_clients, config.slots
    zi = lambda *shape: jnp.zeros(shape, I32)  # noqa: E731
    zb = lambda *shape: jnp.zeros(shape, bool)  # noqa: E731
    return State(now_hi=zi(), now_lo=zi(), wait=zi(), decodes=zi(), next_arrival=zi(), head=zi(k), tail=zi(k),
                 members=zi(k), counter=jnp.zeros(k, F32), client_pred=jnp.zeros(k, F32), queue=zi(n),
                 result=zi(n, 6), count=zi(), pending=zi(), round_tokens=zi(), skey=zi(s), sval=zi(s), sslot=zi(s),
                 spend=zb(s), pool=zi(s, 5), pd0=zi(s), pstamp=zi(s, 2), pocc=zb(s), ppend=zb(s), pfin=zb(s),
                 free=jnp.arange(s - 1, -1, -1, dtype=I32), nfree=jnp.asarray(s, I32), finishing=zi(), steps=zi(),
                 prefills=zi(), events=zi(), peak=zi(), overflow=zb(), done=zb())


def kv_need_with(left, sval, count, c_held, c_left):
    """LightLLM's worst-case need of the members plus a candidate, from the sorted view.

    The members (positions < count) are sorted by tokens still to come `left`, descending,
    with sval_j = (j + 1) * left_j + (tokens held by positions <= j); the candidate holds
    c_held and has c_left to come. It goes after every member with left >= c_left
    (`place`); members before it keep their V, it gets v_new, members after it move one
    place down: V + left + c_held. need = max of all (max over k >= 1 of k * left_k + the
    held of the first k, in the sorted order). Returns (need, place, v_new, v_shift)."""
    jj = jnp.arange(left.shape[-1], dtype=I32)
    valid = jj < count
    place = (valid & (left >= c_left)).sum().astype(I32)
    before = jnp.maximum(place - 1, 0)
    held_before = jnp.where(place > 0, sval[before] - place * left[before], 0)
    v_new = (place + 1) * c_left + held_before + c_held
    v_shift = sval + left + c_held
    need = jnp.maximum(jnp.where(jj < place, sval, jnp.where(valid, v_shift, 0)).max(), v_new)
    return need, place, v_new, v_shift


def sorted_view(held, left) -> tuple[np.ndarray, np.ndarray]:
    """Host reference of the KV check's sorted view: (left sorted descending, V with
    V_j = (j + 1) * left_j + held of positions <= j), int64."""
    held, left = np.asarray(held, np.int64), np.asarray(left, np.int64)
    order = np.argsort(-left, kind="stable")
    lo = left[order]
    return lo, np.arange(1, lo.size + 1) * lo + np.cumsum(held[order])


def _put(x, i, value, mask, size: int):
    """x with x[i] = value where mask: a scatter whose index leaves the array (dropped) when
    the mask is off, so no read of the old value is needed."""
    return x.at[jnp.where(mask, i, size)].set(value, mode="drop")


def _event(s: State, t: Trace, p: Params, config: Config) -> State:
    n, k, slots = config.num_requests, config.num_clients, config.slots
    live = ~s.done
    kk = jnp.arange(k, dtype=I32)
    jj = jnp.arange(slots, dtype=I32)

    # COMPLETE: the finished request of the last step with the smallest index leaves
    completing = live & (s.finishing > 0)
    j = jnp.argmin(jnp.where(s.pfin, s.pool[:, P_REQ], BIG)).astype(I32)
    slot_row, stamp = s.pool[j], s.pstamp[j]
    r, c = slot_row[P_REQ], slot_row[P_CLIENT]
    out_f = slot_row[P_OUTPUT].astype(F32)
    p0 = s.client_pred[c]
    new_pred = jnp.where(p0 == 0, out_f, 0.8 * p0 + 0.2 * out_f)  # the first output, then (4 old + new) / 5
    done_row = jnp.stack([jnp.asarray(DONE, I32), stamp[0], stamp[1], s.now_hi, s.now_lo, slot_row[P_PRED]])
    is_c = (kk == c) & completing
    is_j = (jj == j) & completing
    s = dataclasses.replace(
        s, client_pred=jnp.where(is_c & p.predict, new_pred, s.client_pred), members=s.members - is_c.astype(I32),
        pfin=s.pfin & ~is_j, pocc=s.pocc & ~is_j, free=_put(s.free, s.nfree, j, completing, slots),
        nfree=s.nfree + completing.astype(I32), count=s.count - completing.astype(I32),
        finishing=s.finishing - completing.astype(I32))

    # ARRIVE: RPM rejection over the inclusive sliding window, then the lift
    nxt = jnp.minimum(s.next_arrival, n - 1)
    row = t.rows[nxt]
    more = s.next_arrival < t.num
    arriving = live & ~completing & more & _le(row[ARR_HI], row[ARR_LO], s.now_hi, s.now_lo)
    c = row[CLIENT]
    tail_c = s.tail[c]
    block = t.start[c]
    back = t.rows[s.queue[block + jnp.maximum(tail_c - p.rpm_limit, 0)]]  # the accepted request `limit` back
    back_hi, back_lo = _add(back[ARR_HI], back[ARR_LO], p.rpm_window_us)
    reject = (tail_c >= p.rpm_limit) & _le(row[ARR_HI], row[ARR_LO], back_hi, back_lo)
    backlogged = s.head < s.tail
    is_c = kk == c
    others = backlogged & ~is_c
    floor = jnp.where(others, s.counter, jnp.inf).min()
    lift_now = arriving & ~reject & p.lift & ~(backlogged & is_c).any() & others.any()
    accept = arriving & ~reject
    rejecting = arriving & reject
    reject_row = jnp.asarray([REJECTED, 0, 0, 0, 0, 0], I32)
    s = dataclasses.replace(
        s, counter=jnp.where(is_c & lift_now, jnp.maximum(s.counter, floor), s.counter),
        queue=_put(s.queue, block + tail_c, nxt, accept, n), tail=s.tail + (is_c & accept).astype(I32),
        result=_put(s.result, jnp.where(completing, r, nxt), jnp.where(completing, done_row, reject_row),
                    completing | rejecting, n),
        next_arrival=s.next_arrival + arriving.astype(I32))

    # ADMIT: a micro-event of the admission round
    backlogged = s.head < s.tail
    heads = s.queue[jnp.minimum(t.start + s.head, n - 1)]
    oldest = jnp.argmin(jnp.where(backlogged, heads, BIG))
    least = jnp.argmin(jnp.where(backlogged, s.counter, jnp.inf))  # ties: first arrival (make_trace numbering)
    ca = jnp.where(p.by_counter, least, oldest).astype(I32)
    cand = heads[ca]
    crow = t.rows[cand]
    c_in, c_out = crow[INPUT], crow[OUTPUT]
    c_held, c_left = c_in + 1, c_out - 1
    need, place, v_new, v_shift = kv_need_with(s.skey - s.decodes, s.sval, s.count, c_held, c_left)
    is_ca = kk == ca
    mine = jnp.where(is_ca, s.members, 0).sum()
    clients = (s.members > 0).sum() + (mine == 0)
    passes = ((need < p.kv_pool - p.adapter_reserve * clients) & (s.round_tokens + c_in <= p.prefill_cap)
              & (s.count + 1 <= p.running_cap))
    allowed = (s.count == s.pending) | (s.wait >= p.cadence)
    trying = live & ~completing & ~arriving & allowed & backlogged.any() & passes
    admit = trying & (s.nfree > 0)
    pred = jnp.where(p.oracle, _float(crow[ORACLE]),
                     jnp.where(p.predict, jnp.where(is_ca, s.client_pred, 0.0).sum(), 0.0))
    charge = (p.w_p * c_in.astype(F32) + p.w_q * pred) / jnp.where(is_ca, p.weight, 0.0).sum()
    slot = s.free[jnp.maximum(s.nfree - 1, 0)]

    def insert(x, value, shifted=None):
        shifted = x if shifted is None else shifted
        moved = jnp.where(jj < place, x, jnp.where(jj == place, value, jnp.roll(shifted, 1)))
        return jnp.where(admit, moved, x)

    is_ca = is_ca & admit
    is_slot = (jj == slot) & admit
    s = dataclasses.replace(
        s, counter=jnp.where(is_ca, s.counter + charge, s.counter), head=s.head + is_ca.astype(I32),
        members=s.members + is_ca.astype(I32), count=s.count + admit.astype(I32),
        pending=s.pending + admit.astype(I32), round_tokens=s.round_tokens + jnp.where(admit, c_in, 0),
        skey=insert(s.skey, c_left + s.decodes), sval=insert(s.sval, v_new, v_shift), sslot=insert(s.sslot, slot),
        spend=insert(s.spend, True),
        pool=_put(s.pool, slot, jnp.stack([cand, ca, c_in, c_out, _bits(pred)]), admit, slots),
        peak=jnp.maximum(s.peak, s.count + admit.astype(I32)),
        pocc=s.pocc | is_slot, ppend=s.ppend | is_slot, nfree=s.nfree - admit.astype(I32),
        overflow=s.overflow | (trying & (s.nfree == 0)))

    # STEP: prefill of the round, else decode, else idle until the next arrival
    step = live & ~completing & ~arriving & ~admit
    tc = p.time_coef
    prefill = step & (s.pending > 0)
    decode = step & ~prefill & (s.count > 0)
    stepping = prefill | decode
    idle = step & ~stepping
    pclient, pinput, poutput = s.pool[:, P_CLIENT], s.pool[:, P_INPUT], s.pool[:, P_OUTPUT]
    ppred = _float(s.pool[:, P_PRED])
    dur_p = step_terms(tc[0], tc[1] * s.round_tokens.astype(F32))
    running = s.pocc & ~s.ppend
    gen = 1 + s.decodes - s.pd0
    pre_charge = jnp.where(running & (gen.astype(F32) > ppred), p.w_q, 0.0)
    context = jnp.where(running, pinput + gen, 0).sum()
    dur_d = step_terms(tc[2], tc[3] * s.count.astype(F32), tc[4] * context.astype(F32))
    counter = s.counter + jnp.where(decode, jax.ops.segment_sum(pre_charge, pclient, num_segments=k) / p.weight, 0.0)
    # the step's batch and its tokens after the step
    batch = jnp.where(prefill, s.ppend, running) & stepping
    held_gen = jnp.where(s.ppend, 1, gen + decode.astype(I32))
    finished = batch & (held_gen >= poutput)
    any_finish = finished.any()
    out_f = poutput.astype(F32)
    extra = jnp.where(batch & (held_gen.astype(F32) > ppred) & p.extra_finish_charge & any_finish, p.w_q, 0.0)
    refund = jnp.where(finished & (out_f < ppred), p.w_q * (ppred - out_f), 0.0)
    counter = counter + jax.ops.segment_sum(extra - refund, pclient, num_segments=k) / p.weight
    now_hi, now_lo = _add(s.now_hi, s.now_lo, jnp.where(prefill, dur_p, jnp.where(decode, dur_d, 0)))
    # idle: whole polls (or a jump) to the next arrival; with none left, done
    a_hi, a_lo = row[ARR_HI], row[ARR_LO]
    dh, dl = a_hi - s.now_hi, a_lo - s.now_lo
    gap = jnp.where(dh >= 2, MAX_STEP_US, jnp.where(dh == 1, jnp.minimum(dl + BASE, MAX_STEP_US), jnp.maximum(dl, 0)))
    gap = jnp.where(dh < 0, 0, gap)
    polls = jnp.maximum(1, (gap + p.poll_us - 1) // p.poll_us)
    poll_hi, poll_lo = _add(s.now_hi, s.now_lo, polls * p.poll_us)
    jump = p.idle_jump & ((dh > 0) | ((dh == 0) & (dl > 0)))
    waits = idle & more
    now_hi = jnp.where(waits, jnp.where(jump, a_hi, poll_hi), now_hi)
    now_lo = jnp.where(waits, jnp.where(jump, a_lo, poll_lo), now_lo)
    # the prefilled requests start running: their left drops by one (V by their position)
    shift = prefill & s.spend
    first_now = prefill & s.ppend
    s = dataclasses.replace(
        s, now_hi=now_hi, now_lo=now_lo, counter=jnp.where(stepping, counter, s.counter),
        wait=jnp.where(prefill, 0, s.wait + decode.astype(I32)), decodes=s.decodes + decode.astype(I32),
        skey=s.skey - shift.astype(I32), sval=s.sval - jnp.where(shift, jj + 1, 0), spend=s.spend & ~prefill,
        pstamp=jnp.where(first_now[:, None], jnp.stack([now_hi, now_lo])[None, :], s.pstamp),
        pd0=jnp.where(first_now, s.decodes, s.pd0), ppend=s.ppend & ~prefill,
        pfin=jnp.where(stepping, finished, s.pfin),
        finishing=jnp.where(stepping, finished.sum().astype(I32), s.finishing),
        pending=jnp.where(prefill, 0, s.pending), round_tokens=jnp.where(prefill, 0, s.round_tokens),
        steps=s.steps + stepping.astype(I32), prefills=s.prefills + prefill.astype(I32),
        events=s.events + live.astype(I32), done=s.done | (idle & ~more) | s.overflow)
    return s


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """The runner's per-lane inputs: the lane's trace and settings."""

    trace: Trace
    params: Params


def _program_init(config: Config, batched: Batch, shared) -> State:
    return init_state(config)


def _program_step(state: State, batched: Batch, shared, config: Config) -> State:
    return _event(state, batched.trace, batched.params, config)


def lane_done(state: State) -> jax.Array:
    return state.done


ARTIFACT_PROGRAM = LaneProgram(name="artifact", init=_program_init, step=_program_step, done=lane_done)


def expected_events(lane: LaneTrace, profile: Profile) -> int:
    """About how many events a lane takes (chunk sizing only): arrivals, admissions and
    completions, then its steps (the trace's span and a drain over a small decode step)."""
    st = profile.step_time
    step_s = max(st.overhead * (st.decode_base + 8 * st.decode_per_request), 1e-3)
    span = float(lane.arrival_s[-1]) if lane.arrival_s.size else 0.0
    return int(4 * lane.prompt.size + (1.2 * span + 60.0) / step_s) + 1024


def event_budget(lane: LaneTrace, profile: Profile) -> int:
    """Events after which a lane is given up: every request arrives, is admitted and
    completes (3 events), takes at most one prefill and output - 1 decode steps, and the
    idle time up to the last arrival takes at most last / poll polls."""
    n = lane.prompt.size
    last = float(lane.arrival_s[-1]) if n else 0.0
    return int(3 * n + n + int(lane.output.sum()) + last / profile.poll_s + n + 1024)


SLOT_TIER = 128  # slots of a first try (the real trace never holds KV for more than 51)
SLOT_FIELDS = ("skey", "sval", "sslot", "spend", "pool", "pd0", "pstamp", "pocc", "ppend", "pfin", "free")


def _widen(state: State, slots: int) -> State:
    """A host State with its slot arrays padded to `slots` (zeros: empty slots)."""
    def pad(x):
        width = [(0, 0)] * x.ndim
        width[1] = (0, slots - x.shape[1])
        return np.pad(x, width)

    return dataclasses.replace(state, **{f: pad(np.asarray(getattr(state, f))) for f in SLOT_FIELDS})


def _run_once(lanes, params, config, profiles, mesh, progress, chunk):
    batch = Batch(trace=stack([l.trace for l in lanes]), params=stack(params))
    budget = max(event_budget(l, p) for l, p in zip(lanes, profiles))
    expected = max(expected_events(l, p) for l, p in zip(lanes, profiles))
    carry, done = runner.run(ARTIFACT_PROGRAM, config, batch, None, event_budget=budget, expected_events=expected,
                             chunk=chunk, mesh=mesh, progress=progress)
    return carry, np.asarray(done).copy()


def run(lanes: Sequence[LaneTrace], params: Sequence[Params], config: Config, *,
        profiles: Sequence[Profile] | Profile = Profile(), mesh=None, progress=None, chunk: int | None = None,
        first_slots: int = SLOT_TIER) -> tuple[State, np.ndarray]:
    """Replay `lanes` (each with its Params and Profile) to the end; returns (final State
    with a leading lane axis, host numpy; finished: bool[B]).

    Slots in tiers: config.slots is a proven bound, usually far above what a run needs
    (657 for the real trace, which never holds more than 51), and every event costs O(S).
    So the lanes first run with `first_slots`; a lane that needs more stops at once
    (`overflow`) and is rerun with config.slots. Slots only bound capacity, so a lane that
    did not overflow is exactly what it would have been with more. A lane that is not done
    when the event budget is spent, overflows the proven bound, or ends with a request
    neither served nor rejected (`stranded`) is reported as not finished."""
    if isinstance(profiles, Profile):
        profiles = [profiles] * len(lanes)
    if config.slots <= first_slots:
        state, done = _run_once(lanes, params, config, profiles, mesh, progress, chunk)
        return state, _finished(lanes, state, done)
    state, done = _run_once(lanes, params, dataclasses.replace(config, slots=first_slots), profiles, mesh, progress,
                            chunk)
    state = _widen(state, config.slots)
    redo = np.flatnonzero(np.asarray(state.overflow))
    if redo.size:
        wide, wide_done = _run_once([lanes[i] for i in redo], [params[i] for i in redo], config,
                                    [profiles[i] for i in redo], mesh, progress, chunk)
        state = jax.tree_util.tree_map(lambda a, b: np.concatenate([a, b])[_merge_index(a.shape[0], redo)],
                                       state, wide)
        done[redo] = wide_done
    return state, _finished(lanes, state, done)


def _finished(lanes: Sequence[LaneTrace], state: State, done: np.ndarray) -> np.ndarray:
    """bool[B]: done, within its slots, and nothing stranded."""
    return done & ~np.asarray(state.overflow) & (stranded(lanes, state) == 0)


def stranded(lanes: Sequence[LaneTrace], state: State) -> np.ndarray:
    """int64[B]: per lane, its trace's requests that are neither served nor rejected at the
    end (a lane that stopped early, or a request no round could ever admit)."""
    real = np.arange(state.result.shape[1])[None, :] < np.asarray([l.prompt.size for l in lanes])[:, None]
    return ((outcome(state) == NONE) & real).sum(axis=1)


def _merge_index(lanes: int, redo: np.ndarray) -> np.ndarray:
    """Rows of concatenate([first try, rerun]) in lane order: rerun lanes from the second part."""
    index = np.arange(lanes)
    index[redo] = lanes + np.arange(redo.size)
    return index


def lane_index(tree, i):
    """Lane i of a batched pytree."""
    return jax.tree_util.tree_map(lambda x: x[i], tree)


# ----------------------------------------------------------------------------- measures

def service_rates(start_s, end_s, service, client, ticks_lo, ticks_hi, num_clients: int) -> np.ndarray:
    """Service rate per client and window: a request's `service` spread evenly over
    [start, end] (requests with end < 1 s or end - start < 1e-5 s, e.g. rejected ones, add
    nothing, as visualize.py), the part inside [lo, hi] divided by hi - lo. float64[K, T]
    (numpy float64 on the host: the same numbers on every machine)."""
    start, end = np.asarray(start_s, np.float64)[:, None], np.asarray(end_s, np.float64)[:, None]
    lo, hi = np.asarray(ticks_lo, np.float64)[None, :], np.asarray(ticks_hi, np.float64)[None, :]
    span = end - start
    ok = (end >= 1.0) & (span >= 1e-5)
    overlap = np.maximum(np.minimum(hi, end) - np.maximum(lo, start), 0.0)
    part = np.where(ok, np.asarray(service, np.float64)[:, None] * overlap / np.where(ok, span, 1.0), 0.0)
    out = np.zeros((num_clients, lo.size))
    np.add.at(out, np.asarray(client), part)
    return out / (hi - lo)


def demand_rates(arrival_s, service, client, ticks_lo, ticks_hi, num_clients: int) -> np.ndarray:
    """Demand rate per client and window: service of the requests arriving in [lo, hi]
    (inclusive) over hi - lo. float64[K, T]."""
    arrival = np.asarray(arrival_s, np.float64)[:, None]
    lo, hi = np.asarray(ticks_lo, np.float64)[None, :], np.asarray(ticks_hi, np.float64)[None, :]
    part = np.where((arrival >= lo) & (arrival <= hi), np.asarray(service, np.float64)[:, None], 0.0)
    out = np.zeros((num_clients, lo.size))
    np.add.at(out, np.asarray(client), part)
    return out / (hi - lo)


@dataclasses.dataclass(frozen=True)
class Ticks:
    """The windows of the service difference: x_i = spacing * i, i = 1..count, window
    [x_i, x_i + window]. Default: the artifact's revision tables (plot_revision.py: a
    600 s span, 30 s warm-up, 20 intervals: x_i = 28.5 i, i = 1..19, 60 s windows)."""

    spacing: float = 28.5
    count: int = 19
    window: float = 60.0

    @classmethod
    def revision(cls, span_s: float = 600.0) -> "Ticks":
        """The revision's rule for a span T: x_i = (T - 30) / 20 * i, i = 1..19, 60 s
        windows. The artifact used T = 600 for every suite it tabulated, the 360 s ones
        included, so `for_duration` keeps T = 600 up to 600 s and uses the duration beyond."""
        return cls(spacing=(span_s - 30.0) / 20.0, count=19, window=60.0)

    @classmethod
    def for_duration(cls, duration_s: float) -> "Ticks":
        return cls.revision(max(600.0, float(duration_s)))

    def bounds(self):
        lo = self.spacing * np.arange(1, self.count + 1)
        return lo, lo + self.window


def lane_measures(lane: LaneTrace, state: State, num_clients: int, ticks: Ticks = Ticks(), *,
                  fairness: bool = True) -> dict:
    """The artifact's measures of one finished lane (state: that lane's State, host numpy).

    Returns throughput (tok/s: served prompt + output over the time from t = 0, the
    benchmark's start, to the last completion: the artifact's `total_time`), ttft_median/
    mean/p90/p99 (s, served requests), rejected (count), rejected_per_client [K],
    ttft_per_client_mean [K], unfinished, steps, prefills, events, served_first_arrival
    (served tokens over first arrival .. last completion, this profile's earlier definition)
    and, with `fairness`, avg_diff, max_diff, diff [T], rate [K, T], demand [K, T], with K in
    the lane's renumbered clients.
    """
    n = lane.prompt.size
    arrival, client = np.round(lane.arrival_s * 1e6) / 1e6, lane.client  # the engine's microseconds
    prompt, output = lane.prompt.astype(np.float64), lane.output.astype(np.float64)
    result = outcome(state)[:n]
    served = result == DONE
    first = np.where(served, first_us(state)[:n] / 1e6, arrival)
    end = np.where(served, finish_us(state)[:n] / 1e6, arrival)
    ttft = first[served] - arrival[served]
    tokens = (prompt[served] + output[served]).sum()
    last = end[served].max() if served.any() else np.nan
    rejected = np.bincount(client[result == REJECTED], minlength=num_clients)
    with np.errstate(invalid="ignore"):
        tt_client = np.array([ttft[client[served] == j].mean() if (client[served] == j).any() else np.nan
                              for j in range(num_clients)])
    stat = (lambda f: float(f(ttft))) if ttft.size else (lambda f: float("nan"))
    out = {"throughput": float(tokens / last) if served.any() else float("nan"),
           "served_first_arrival": float(tokens / (last - arrival.min())) if served.any() else float("nan"),
           "ttft_median": stat(np.median), "ttft_mean": stat(np.mean),
           "ttft_p90": stat(lambda x: np.percentile(x, 90)), "ttft_p99": stat(lambda x: np.percentile(x, 99)),
           "rejected": float(rejected.sum()), "rejected_per_client": rejected, "ttft_per_client_mean": tt_client,
           "unfinished": int(n - served.sum() - (result == REJECTED).sum()),
           "steps": int(state.steps), "prefills": int(state.prefills), "events": int(state.events)}
    if fairness:
        service = prompt + 2 * output
        lo, hi = ticks.bounds()
        rate = service_rates(first, end, service, client, lo, hi, num_clients)
        demand = demand_rates(arrival, service, client, lo, hi, num_clients)
        present = np.bincount(client, minlength=num_clients) > 0
        diff = service_difference(rate, demand, present, client_axis=0)
        out.update(avg_diff=float(diff.mean()), max_diff=float(diff.max()), diff=diff, rate=rate, demand=demand)
    return out


# ----------------------------------------------------------------------------- reading traces

TRACE_COLUMNS = ("arrival_s", "client", "prompt", "output")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,3})?$")
_INT = re.compile(r"^[+]?\d{1,10}$")


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


# ----------------------------------------------------------------------------- the sweep driver's engine

@dataclasses.dataclass(frozen=True)
class Scheduler:
    """A row's scheduler and engine settings (the driver's Row.settings).

    Attributes:
      policy: one of POLICIES.
      name: the policy as reported (default: policy; e.g. "vtc_weighted").
      rpm_limit: RPM limit (policy "rpm" only).
      weights: client weights by the workload's own client ids (missing ones: 1).
      profile: the engine profile.
      oracle_r: vtc_oracle's prediction range.
    """

    policy: str
    name: str | None = None
    rpm_limit: int | None = None
    weights: tuple | None = None
    profile: Profile = Profile()
    oracle_r: float = 0.0

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise InputError(f"unknown policy {self.policy!r}; expected one of {', '.join(POLICIES)}")
        if (self.policy == "rpm") != (self.rpm_limit is not None):
            raise InputError("an rpm limit goes with policy rpm, and only with it")

    def setting_keys(self) -> dict:
        return {"policy": self.name or self.policy, "rpm": self.rpm_limit}


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """A row's workload for the artifact profile (the driver's Row.source).

    Attributes:
      name: reported name (e.g. "real", a suite's name, a trace file's stem).
      columns: seed -> {"arrival_s", "client", "prompt", "output"} (the lane's trace).
      num_requests: most requests of any seed; num_clients: client ids are < this.
      bound_prompts: prompt lengths for slot_bound (every seed's, or the smallest
        possible repeated num_requests times).
      max_output: the longest output of any seed.
      ticks: the service difference's windows.
    """

    name: str
    columns: Callable[[int], dict]
    num_requests: int
    num_clients: int
    bound_prompts: np.ndarray
    max_output: int
    ticks: Ticks = Ticks()

    @classmethod
    def fixed(cls, name: str, cols: dict, ticks: Ticks | None = None,
              reseed: Callable[[dict, int], dict] | None = None) -> "Workload":
        """A trace replayed as is at seed 0 and, with `reseed`, transformed for seeds > 0
        (lengths unchanged: the slot bound holds for every seed)."""
        cols = dict(zip(TRACE_COLUMNS, check_columns(*(cols[c] for c in TRACE_COLUMNS), source=name)))
        span = float(cols["arrival_s"].max())
        columns = (lambda seed: cols) if reseed is None else (lambda seed: cols if seed == 0 else reseed(cols, seed))
        return cls(name, columns, int(cols["arrival_s"].size), int(cols["client"].max()) + 1, cols["prompt"],
                   int(cols["output"].max()), ticks or Ticks.for_duration(span))


def _bucket(x: int, floor: int = 16) -> int:
    """x rounded up to a power of two (at least `floor`): nearby shapes share a compile."""
    return max(floor, 1 << max(0, int(x) - 1).bit_length())


def _round_up(x: int, step: int = 32) -> int:
    return max(step, -(-int(x) // step) * step)


class ArtifactEngine:
    """The artifact profile behind the sweep driver (vtc_jax.driver.sweep): rows whose settings
    are a `Scheduler` and whose source is a `Workload`."""

    name = "artifact"

    @staticmethod
    def _slots(row) -> int:
        s = row.source
        return slot_bound(s.bound_prompts, row.settings.profile, s.num_requests)

    def group_key(self, row):
        """Rows share a compile when their client and slot counts round to the same
        powers of two (N only sizes per-request arrays: the group takes its largest)."""
        return (_bucket(row.source.num_clients, 2), _bucket(self._slots(row), 64))

    def config(self, rows, record_every: int = 0, measures=None) -> Config:
        n = max(_bucket(r.source.num_requests, 256) for r in rows)
        k = max(_bucket(r.source.num_clients, 2) for r in rows)
        s = max(_round_up(self._slots(r)) for r in rows)
        for r in rows:
            check_limits(r.source, r.settings.profile, s)
        return Config(n, k, s)

    def lane(self, row, seed: int, base_seed: int, config: Config) -> tuple[LaneTrace, Params]:
        sched, src = row.settings, row.source
        cols = src.columns(base_seed + seed)
        check_admissible(cols, sched.profile, f"{src.name} (seed {base_seed + seed})")
        lane = make_trace(cols["arrival_s"], cols["client"], cols["prompt"], cols["output"],
                          input_extra=sched.profile.input_extra, num_requests=config.num_requests,
                          num_clients=config.num_clients, oracle_r=sched.oracle_r, seed=base_seed + seed)
        weights = None
        if sched.weights is not None:
            weights = np.ones(config.num_clients)
            weights[lane.new_id[:len(sched.weights)]] = sched.weights
        return lane, make_params(sched.policy, config.num_clients, sched.profile, rpm_limit=sched.rpm_limit,
                                 weights=weights)

    def run(self, rows, seeds, config: Config, base_seed: int, mesh, progress) -> "ArtifactResults":
        made = [self.lane(row, seed, base_seed, config) for row, seed in zip(rows, seeds)]
        lanes = [m[0] for m in made]
        state, finished = run(lanes, [m[1] for m in made], config, profiles=[r.settings.profile for r in rows],
                              mesh=mesh, progress=progress)
        return ArtifactResults(rows=list(rows), lanes=lanes, state=state, finished=finished,
                               num_clients=config.num_clients)

    @staticmethod
    def lane_bytes(config: Config) -> int:
        n, k, s = config.num_requests, config.num_clients, config.slots
        return 2 * 4 * (16 * n + 8 * k + 24 * s) + 4096

    @staticmethod
    def steps(config: Config, rows) -> int:
        """Expected events per lane (the driver's progress unit)."""
        best = 0
        for r in rows:
            span = float(r.source.ticks.bounds()[1][-1])
            st = r.settings.profile.step_time
            best = max(best, int(4 * r.source.num_requests + span / max(st.overhead * st.decode_base, 1e-3)))
        return best


def check_limits(source: Workload, profile: Profile, slots: int) -> None:
    """Refuse up front what int32 arithmetic could not hold: the KV check's values
    (slots x (input + output)) and the longest possible step (MAX_STEP_US)."""
    prompts = np.asarray(source.bound_prompts)
    longest = int(prompts.max()) + profile.input_extra + int(source.max_output) + 1
    if (slots + 1) * longest >= 1 << 31:
        raise InputError(f"{source.name}: {slots} running slots x {longest} tokens per request exceed int32; "
                         "use a smaller kv_pool or shorter requests")
    st = profile.step_time
    context = slots * longest
    worst_s = st.overhead * max(st.prefill_base + st.prefill_per_token * profile.prefill_cap,
                                st.decode_base + st.decode_per_request * slots
                                + st.decode_per_context_token * context)
    if worst_s * 1e6 >= MAX_STEP_US:
        raise InputError(f"{source.name}: a step could last {worst_s:.0f} s, over the limit of "
                         f"{MAX_STEP_US / 1e6:.0f} s per step: check the step-time coefficients")


@dataclasses.dataclass
class ArtifactResults:
    """One chunk's lanes (lane i = rows[i] at its seed): final states (host numpy), the
    lanes' traces, finished flags; measures computed on demand and cached."""

    rows: list
    lanes: list
    state: State
    finished: np.ndarray
    num_clients: int

    @functools.cached_property
    def measures(self) -> list[dict]:
        """Per lane: lane_measures with the row's ticks, per-client arrays back in the
        workload's own client ids."""
        out = []
        for i, (row, lane) in enumerate(zip(self.rows, self.lanes)):
            m = lane_measures(lane, lane_index(self.state, i), self.num_clients, row.source.ticks)
            back = lane.new_id  # renumbered id of each original client
            for key in ("rate", "demand", "rejected_per_client", "ttft_per_client_mean"):
                full = np.zeros((self.num_clients,) + np.shape(m[key])[1:], np.asarray(m[key]).dtype)
                full[:back.size] = np.asarray(m[key])[back]
                m[key] = full
            out.append(m)
        return out

    def metric(self, name: str) -> np.ndarray:
        return np.asarray([m[name] for m in self.measures], np.float64)

    @property
    def checkpoint_steps(self) -> np.ndarray:
        """The series' x axis for the driver: tick numbers 1..T (each row's tick times are
        its workload's Ticks)."""
        return np.arange(1, max(r.source.ticks.count for r in self.rows) + 1)


ARTIFACT_ENGINE = ArtifactEngine()
