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
per-lane init/step/done; runner.run does the chunked scan, vmap, jit and sharding). This
module is the lane's state machine; artifact_inputs.py encodes and checks its inputs on the
host (traces, settings, the trace CSV); vtc_jax/driver/artifact_run.py runs lanes, measures
them and is the sweep driver's engine adapter (`ARTIFACT_ENGINE`). Every event costs
O(S + K), S the running slots (a proven bound on how many requests can run at once), K the
clients, never O(N):

  * per-client FIFOs are pointers: the accepted requests of client k are appended to its
    block of `queue` (blocks laid out by client, `Trace.start`), head/tail per client;
  * running requests live in a pool of S slots (a free-list stack) and, for the KV check,
    in an array kept sorted by tokens still to come (`left`, descending) with
    V_k = k * left_k + (tokens held by the first k); a decode step leaves V unchanged
    (left - 1, held + 1 for everyone), so LightLLM's need max_k V_k of the running set plus
    a candidate is one masked pass over the slots: no sort;
  * the RPM window test reads one queue entry (the accepted request `limit` places back).

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


from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
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

    def server_options(self) -> tuple:
        """The profile as the slora server's options (Settings.server_options)."""
        st = self.step_time
        options = {"kv_pool": self.kv_pool, "adapter_reserve": self.adapter_reserve, "prefill_cap": self.prefill_cap,
                   "running_cap": self.running_cap, "cadence": self.cadence, "poll_us": int(round(self.poll_s * 1e6)),
                   "idle": self.idle, "extra_finish_charge": self.extra_finish_charge,
                   **{f.name: getattr(st, f.name) for f in dataclasses.fields(st)}}
        return tuple(sorted(options.items()))


DEFAULT_PROFILE = Profile()  # the artifact's engine


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
