"""The artifact engine profile: the OSDI '24 VTC artifact's serving engine (S-LoRA on
LightLLM, Llama-2-7B on an A10G), as a pure JAX state machine beside the exact MODEL.md
engine (engine.py), which stays the default and stays exact.

What it models (shared/ENGINE_ARTIFACT.md; every item is a named setting of `Profile` or
`Params`, so another engine can be described too):

  * wall-clock arrivals (`arrival_s`, held as int32 microseconds);
  * a step-time model (`StepTime`; defaults: the A10G fit), prefill steps that stall
    decoding (no mixed or chunked prefill), an idle poll when nothing runs;
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

Layout. One lane is one server replaying one trace of N requests (sorted by arrival; the
padding rows have `valid = False`). State is per request (status, tokens generated, the
prediction charged at admission, first-token and finish times), so a "slot array" of N
rows; K clients. The loop is a `lax.while_loop` (under vmap: until every lane is done) whose
iteration is one *event*, chosen per lane by masks (no per-lane lax.cond):

  ARRIVE: the next request with arrival <= now joins its FIFO (lift, RPM rejection);
  ADMIT : otherwise, admission is allowed (nothing runs, or `cadence` decode steps passed
          since the last prefill) and the policy's candidate passes the checks: it joins
          the round (a micro-event: time does not move);
  STEP  : otherwise one engine step: the round's prefill if it admitted anything, else a
          decode step of the running batch, else an idle poll up to the next arrival.

Time is int32 microseconds (each step's duration is rounded to a microsecond; 2^31 us is
35 minutes). Counters are float32 (charges are multiples of 1/weight; the real trace's
counters stay below 2^24, where float32 is exact for integer charges).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.results import service_difference
from vtc_jax.settings import InputError

I32, F32 = jnp.int32, jnp.float32
POLICIES = ("fcfs", "lcf", "vtc", "vtc_oracle", "vtc_predict", "rpm")
NO_LIMIT = 1 << 30
FUTURE, WAITING, RUNNING, DONE, REJECTED = 0, 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Step-duration model, in seconds (defaults: the A10G fit of ENGINE_ARTIFACT.md).

    prefill = overhead * (prefill_base + prefill_per_token * sum of the batch's input tokens)
    decode  = overhead * (decode_base + decode_per_request * running
                          + decode_per_context_token * sum over running of (input + generated))
    """

    prefill_base: float = 0.0
    prefill_per_token: float = 0.214e-3
    decode_base: float = 19.7e-3
    decode_per_request: float = 0.215e-3
    decode_per_context_token: float = 1.71e-6
    overhead: float = 1.08


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
      input_extra: server input length = trace prompt + this (BOS and a trailing token: 2).
      w_p, w_q: counter prices of an input and an output token (1, 2).
      extra_finish_charge: at a step where a request of the batch finishes, charge every
        request of the batch once more (the artifact's final revision: on).
      lift: the lift rule over other backlogged clients, no last_left clause (vtc: on).
      rpm_window_s: RPM sliding window (60 s, inclusive).
      step_time: the step-duration model.
    """

    kv_pool: int = 10_000
    adapter_reserve: int = 32
    prefill_cap: int = 3072
    running_cap: int = 1000
    cadence: int = 10
    poll_s: float = 0.01
    input_extra: int = 2
    w_p: float = 1.0
    w_q: float = 2.0
    extra_finish_charge: bool = True
    rpm_window_s: float = 60.0
    step_time: StepTime = StepTime()


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
      extra_finish_charge: bool[]
      time_coef: float32[5]  overhead * (prefill_base, prefill_per_token, decode_base,
        decode_per_request, decode_per_context_token), in microseconds. A step's duration is
        the sum of its terms, each one float32 product rounded to a microsecond (half to
        even): no fused multiply-add can change it, so a pure-Python replay reproduces it.
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
    extra_finish_charge: jax.Array
    time_coef: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Trace:
    """One lane's requests, sorted by arrival (ties: trace order), padded to N rows.

    Attributes:
      arrival_us: int32[N]  arrival in microseconds.
      client: int32[N]  client id in 0..K-1, numbered by first arrival (ties: lower id first).
      prompt: int32[N]  trace prompt tokens (the measures' prompt_len).
      input: int32[N]  server input tokens (prompt + input_extra): charges, KV, prefill time.
      output: int32[N]  output tokens (>= 1).
      oracle: float32[N]  vtc_oracle's predicted output length.
      valid: bool[N]  real row (padding rows never arrive).
    """

    arrival_us: jax.Array
    client: jax.Array
    prompt: jax.Array
    input: jax.Array
    output: jax.Array
    oracle: jax.Array
    valid: jax.Array


@dataclasses.dataclass(frozen=True)
class Config:
    """Static settings (changing one recompiles): num_requests N, num_clients K,
    max_events (a safety bound on loop iterations), track_prediction (vtc_predict lanes
    present: the O(N*K) moving-average update runs only then)."""

    num_requests: int
    num_clients: int
    max_events: int = 2_000_000
    track_prediction: bool = False


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """One lane's engine state.

    Attributes:
      now: int32[]  wall clock (us).
      wait: int32[]  decode steps since the last prefill.
      next_arrival: int32[]  index of the next request to arrive.
      status: int32[N]  FUTURE, WAITING, RUNNING, DONE or REJECTED.
      pending: bool[N]  admitted in the open round (its prefill has not run yet).
      generated: int32[N]  output tokens held (1 from admission: the prefill's token).
      charged_pred: float32[N]  prediction charged at admission (0 for plain vtc).
      first_token_us, finish_us: int32[N]  end of the prefill step; end of the last step (-1: none).
      counter: float32[K]  virtual token counters.
      client_pred: float32[K]  vtc_predict's per-client prediction.
      steps, prefills, events: int32[]  engine steps, prefill steps, loop iterations.
      done: bool[]
    """

    now: jax.Array
    wait: jax.Array
    next_arrival: jax.Array
    status: jax.Array
    pending: jax.Array
    generated: jax.Array
    charged_pred: jax.Array
    first_token_us: jax.Array
    finish_us: jax.Array
    counter: jax.Array
    client_pred: jax.Array
    steps: jax.Array
    prefills: jax.Array
    events: jax.Array
    done: jax.Array


def make_params(policy: str, num_clients: int, profile: Profile = Profile(), *, rpm_limit: int | None = None,
                weights: Sequence[float] | None = None) -> Params:
    """Traced Params of one lane from a policy name and a Profile."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")
    if policy == "rpm" and (rpm_limit is None or rpm_limit < 1):
        raise ValueError("policy rpm needs rpm_limit >= 1")
    w = np.ones(num_clients, np.float32) if weights is None else np.asarray(weights, np.float32)
    if w.shape != (num_clients,) or (w <= 0).any():
        raise ValueError(f"weights must be {num_clients} positive numbers")
    st = profile.step_time
    coef = [st.overhead * x * 1e6 for x in (st.prefill_base, st.prefill_per_token, st.decode_base,
                                             st.decode_per_request, st.decode_per_context_token)]
    b = lambda x: jnp.asarray(x, bool)  # noqa: E731
    i = lambda x: jnp.asarray(x, I32)  # noqa: E731
    f = lambda x: jnp.asarray(x, F32)  # noqa: E731
    return Params(
        by_counter=b(policy not in ("fcfs", "rpm")), lift=b(policy in ("vtc", "vtc_oracle", "vtc_predict")),
        predict=b(policy == "vtc_predict"), oracle=b(policy == "vtc_oracle"),
        rpm_limit=i(rpm_limit if policy == "rpm" else NO_LIMIT), rpm_window_us=i(round(profile.rpm_window_s * 1e6)),
        weight=f(w), w_p=f(profile.w_p), w_q=f(profile.w_q), kv_pool=i(profile.kv_pool),
        adapter_reserve=i(profile.adapter_reserve), prefill_cap=i(profile.prefill_cap),
        running_cap=i(profile.running_cap), cadence=i(profile.cadence), poll_us=i(round(profile.poll_s * 1e6)),
        extra_finish_charge=b(profile.extra_finish_charge), time_coef=f(coef))


def make_trace(arrival_s, client, prompt, output, *, input_extra: int = 2, num_requests: int | None = None,
               num_clients: int | None = None, oracle_r: float = 0.0, seed: int = 0) -> tuple[Trace, np.ndarray]:
    """Host-side Trace from columns (any order; sorted here by arrival, ties by row).

    Clients are renumbered by first arrival (ties: lower id) so that argmin's smallest
    index is the artifact's tie-break; returns (trace, new_id_of_old_client int64[K]).
    `oracle_r`: vtc_oracle predictions uniform(L(1-r), L(1+r)) (seeded); r = 0: exact.
    """
    arrival_s = np.asarray(arrival_s, np.float64)
    client = np.asarray(client, np.int64)
    prompt = np.asarray(prompt, np.int64)
    output = np.asarray(output, np.int64)
    n = arrival_s.size
    if not (client.shape == prompt.shape == output.shape == (n,)):
        raise ValueError("trace columns differ in length")
    if n and ((output < 1).any() or (prompt < 1).any() or (client < 0).any() or (arrival_s < 0).any()
              or not np.isfinite(arrival_s).all()):
        raise ValueError("trace needs arrival_s >= 0, client >= 0, prompt >= 1, output >= 1")
    if n and arrival_s.max() * 1e6 > 2**31 - 1 - 10**9:
        raise ValueError("arrivals beyond ~1,100 s do not fit int32 microseconds")
    order = np.lexsort((np.arange(n), arrival_s))
    k_in = int(client.max()) + 1 if n else 1
    k = max(k_in, num_clients or 0)
    first = np.full(k, np.inf)
    np.minimum.at(first, client, np.arange(n, dtype=np.float64)[np.argsort(order)])
    rank_order = np.lexsort((np.arange(k), first))
    new_id = np.empty(k, np.int64)
    new_id[rank_order] = np.arange(k)
    size = num_requests or n
    if size < n:
        raise ValueError(f"num_requests {size} < trace length {n}")
    rng = np.random.default_rng(seed)
    out_sorted = output[order]
    pred = out_sorted * rng.uniform(1 - oracle_r, 1 + oracle_r, n) if oracle_r > 0 else out_sorted.astype(float)

    def pad(x, fill, dtype):
        y = np.full(size, fill, dtype)
        y[:n] = x
        return y

    trace = Trace(arrival_us=pad(np.round(arrival_s[order] * 1e6), 2**31 - 1, np.int32),
                  client=pad(new_id[client[order]], 0, np.int32), prompt=pad(prompt[order], 1, np.int32),
                  input=pad(prompt[order] + input_extra, 1, np.int32), output=pad(out_sorted, 1, np.int32),
                  oracle=pad(pred, 0, np.float32), valid=pad(np.ones(n, bool), False, bool))
    return trace, new_id


def init_state(config: Config) -> State:
    n, k = config.num_requests, config.num_clients
    return State(now=jnp.zeros((), I32), wait=jnp.zeros((), I32), next_arrival=jnp.zeros((), I32),
                 status=jnp.zeros(n, I32), pending=jnp.zeros(n, bool), generated=jnp.zeros(n, I32),
                 charged_pred=jnp.zeros(n, F32), first_token_us=jnp.full(n, -1, I32), finish_us=jnp.full(n, -1, I32),
                 counter=jnp.zeros(k, F32), client_pred=jnp.zeros(k, F32), steps=jnp.zeros((), I32),
                 prefills=jnp.zeros((), I32), events=jnp.zeros((), I32), done=jnp.zeros((), bool))


def kv_need(held: jax.Array, left: jax.Array, member: jax.Array) -> jax.Array:
    """LightLLM's worst-case KV need of a set: sort members by tokens still to come (left)
    descending; need = max over k >= 1 of k * left_k + sum_{j <= k} held_j. int32[]."""
    key = jnp.where(member, left, -1)
    h = jnp.where(member, held, 0)
    neg_sorted, h_sorted = jax.lax.sort((-key, h), num_keys=1)
    k = jnp.arange(1, key.shape[0] + 1, dtype=I32)
    value = jnp.where(neg_sorted <= 0, -neg_sorted * k + jnp.cumsum(h_sorted), 0)
    return value.max()


def _candidate(state: State, trace: Trace, params: Params, config: Config):
    """(has_candidate bool[], index int32[]) of the policy's candidate."""
    n, k = config.num_requests, config.num_clients
    idx = jnp.arange(n, dtype=I32)
    waiting = state.status == WAITING
    head = jax.ops.segment_min(jnp.where(waiting, idx, n), trace.client, num_segments=k)
    backlogged = head < n
    oldest = jnp.where(waiting, idx, n).min()
    least = jnp.where(backlogged, state.counter, jnp.inf)
    client = jnp.argmin(least)  # ties: smallest id = first arrival (make_trace numbering)
    pick = jnp.where(params.by_counter, head[client], oldest)
    return backlogged.any(), jnp.minimum(pick, n - 1).astype(I32)


def _passes(state: State, trace: Trace, params: Params, cand: jax.Array, config: Config) -> jax.Array:
    """The candidate passes the KV reservation, the prefill cap and the running cap."""
    n, k = config.num_requests, config.num_clients
    is_cand = jnp.arange(n) == cand
    running = state.status == RUNNING
    member = running | is_cand
    fresh = is_cand | state.pending  # this round's candidates: (input + 1, output - 1)
    held = jnp.where(fresh, trace.input + 1, trace.input + state.generated)
    left = jnp.where(fresh, trace.output - 1, trace.output - state.generated - 1)
    need = kv_need(held, left, member)
    clients = jax.ops.segment_max(member.astype(I32), trace.client, num_segments=k).sum()
    kv_ok = need < params.kv_pool - params.adapter_reserve * clients
    round_tokens = jnp.where(state.pending, trace.input, 0).sum()
    cap_ok = round_tokens + trace.input[cand] <= params.prefill_cap
    run_ok = member.sum() <= params.running_cap
    return kv_ok & cap_ok & run_ok


def _settle(state: State, trace: Trace, params: Params, batch: jax.Array, finishing: jax.Array, mask, config):
    """After a step of `batch` where some of it finishes: the extra charge, refunds,
    completions and (vtc_predict) prediction updates. Returns (counter, client_pred)."""
    k = config.num_clients
    any_finish = (finishing.any() & mask)
    beyond = batch & (state.generated.astype(F32) > state.charged_pred)
    extra = jnp.where(beyond & params.extra_finish_charge & any_finish, params.w_q, 0.0)
    refund = jnp.where(finishing & mask & (trace.output.astype(F32) < state.charged_pred),
                       params.w_q * (state.charged_pred - trace.output.astype(F32)), 0.0)
    delta = jax.ops.segment_sum(extra - refund, trace.client, num_segments=k) / params.weight
    counter = state.counter + delta
    client_pred = state.client_pred
    if config.track_prediction:
        fin = finishing & mask
        onehot = (trace.client[:, None] == jnp.arange(k)[None, :]) & fin[:, None]  # [N, K]
        rank = jnp.cumsum(onehot.astype(I32), axis=0)  # 1-based order within client
        m = rank[-1]  # finishers per client
        r_i = jnp.take_along_axis(rank, trace.client[:, None], axis=1)[:, 0]
        m_i = m[trace.client]
        p0_i = state.client_pred[trace.client]
        first_sets = (p0_i == 0) & (r_i == 1)
        w_i = jnp.where(first_sets, 0.8 ** (m_i - 1).astype(F32), 0.2 * 0.8 ** (m_i - r_i).astype(F32))
        contrib = jax.ops.segment_sum(jnp.where(fin, w_i * trace.output.astype(F32), 0.0), trace.client,
                                      num_segments=k)
        new = 0.8 ** m.astype(F32) * state.client_pred + contrib
        client_pred = jnp.where(params.predict & (m > 0), new, state.client_pred)
    return counter, client_pred


def step_terms(*terms) -> jax.Array:
    """A step's duration: each float32 term rounded to a microsecond, summed. int32[]."""
    return sum(jnp.round(t).astype(I32) for t in terms)


def _event(state: State, trace: Trace, params: Params, config: Config) -> State:
    n, k = config.num_requests, config.num_clients
    idx = jnp.arange(n, dtype=I32)
    live = ~state.done
    nxt = jnp.minimum(state.next_arrival, n - 1)
    arriving = live & (state.next_arrival < n) & trace.valid[nxt] & (trace.arrival_us[nxt] <= state.now)

    # ARRIVE: RPM rejection over the inclusive sliding window, then the lift
    c = trace.client[nxt]
    t_arr = trace.arrival_us[nxt]
    same = trace.client == c
    accepted = (state.status == WAITING) | (state.status == RUNNING) | (state.status == DONE)
    recent = (same & accepted & (trace.arrival_us >= t_arr - params.rpm_window_us) & (idx < nxt)).sum()
    reject = recent >= params.rpm_limit
    waiting = state.status == WAITING
    backlogged = jax.ops.segment_max(waiting.astype(I32), trace.client, num_segments=k) > 0
    others = backlogged & (jnp.arange(k) != c)
    floor = jnp.where(others, state.counter, jnp.inf).min()
    lift_now = arriving & ~reject & params.lift & ~backlogged[c] & others.any()
    counter = state.counter.at[c].set(jnp.where(lift_now, jnp.maximum(state.counter[c], floor), state.counter[c]))
    status = state.status.at[nxt].set(jnp.where(arriving, jnp.where(reject, REJECTED, WAITING), state.status[nxt]))
    state = dataclasses.replace(state, counter=counter, status=status,
                                next_arrival=state.next_arrival + arriving.astype(I32))

    # ADMIT: a micro-event of the admission round
    running = (state.status == RUNNING) & ~state.pending
    allowed = (running.sum() == 0) | (state.wait >= params.cadence)
    has, cand = _candidate(state, trace, params, config)
    admit = live & ~arriving & allowed & has & _passes(state, trace, params, cand, config)
    ca = trace.client[cand]
    pred = jnp.where(params.oracle, trace.oracle[cand], jnp.where(params.predict, state.client_pred[ca], 0.0))
    charge = (params.w_p * trace.input[cand].astype(F32) + params.w_q * pred) / params.weight[ca]
    is_cand = (idx == cand) & admit
    state = dataclasses.replace(
        state, status=jnp.where(is_cand, RUNNING, state.status), pending=state.pending | is_cand,
        generated=jnp.where(is_cand, 1, state.generated), charged_pred=jnp.where(is_cand, pred, state.charged_pred),
        counter=state.counter.at[ca].add(jnp.where(admit, charge, 0.0)))

    # STEP: prefill of the round, else decode, else idle poll
    step = live & ~arriving & ~admit
    tc = params.time_coef
    prefill = step & state.pending.any()
    decode = step & ~prefill & running.any()
    idle = step & ~prefill & ~decode
    # prefill
    tokens = jnp.where(state.pending, trace.input, 0).sum().astype(F32)
    dur_p = step_terms(tc[0], tc[1] * tokens)
    # decode: charge before the step (tokens beyond the charged prediction), then run it
    gen_f = state.generated.astype(F32)
    pre_charge = jnp.where(running & (gen_f > state.charged_pred), params.w_q, 0.0)
    context = jnp.where(running, trace.input + state.generated, 0).sum().astype(F32)
    dur_d = step_terms(tc[2], tc[3] * running.sum().astype(F32), tc[4] * context)
    counter = state.counter + jnp.where(decode, jax.ops.segment_sum(pre_charge, trace.client, num_segments=k)
                                        / params.weight, 0.0)
    generated = state.generated + jnp.where(decode & running, 1, 0)
    batch = jnp.where(prefill, state.pending, running) & (prefill | decode)
    finishing = batch & (generated >= trace.output)
    now_step = state.now + jnp.where(prefill, dur_p, jnp.where(decode, dur_d, 0))
    settled = dataclasses.replace(state, counter=counter, generated=generated)
    counter, client_pred = _settle(settled, trace, params, batch, finishing, prefill | decode, config)
    # idle: poll every poll_us until the next arrival; with none left (or nothing admissible), done
    more = (state.next_arrival < n) & trace.valid[nxt]
    gap = jnp.maximum(trace.arrival_us[nxt] - state.now, 0)
    polls = jnp.maximum(1, (gap + params.poll_us - 1) // params.poll_us)
    now = jnp.where(idle & more, state.now + polls * params.poll_us, now_step)
    first_token = jnp.where(prefill & state.pending, now, state.first_token_us)
    status = jnp.where(finishing, DONE, state.status)
    state = dataclasses.replace(
        state, now=now, wait=jnp.where(prefill, 0, state.wait + decode.astype(I32)),
        pending=state.pending & ~prefill, generated=generated, status=status, counter=counter,
        client_pred=client_pred, first_token_us=first_token, finish_us=jnp.where(finishing, now, state.finish_us),
        steps=state.steps + (prefill | decode).astype(I32), prefills=state.prefills + prefill.astype(I32),
        events=state.events + live.astype(I32), done=state.done | (idle & ~more))
    return state


def run_lane(trace: Trace, params: Params, config: Config) -> State:
    """Replay one lane until every request completed or was rejected."""
    def cond(s):
        return ~s.done & (s.events < config.max_events)

    return jax.lax.while_loop(cond, lambda s: _event(s, trace, params, config), init_state(config))


@functools.partial(jax.jit, static_argnames=("config",))
def run_lanes(trace: Trace, params: Params, config: Config) -> State:
    """vmap of run_lane over a leading lane axis of `trace` and `params`."""
    return jax.vmap(lambda t, p: run_lane(t, p, config))(trace, params)


def stack(items):
    """Stack pytrees (Trace or Params) along a new leading lane axis, on the host (a
    device-side jnp.stack of many lanes compiles one op per lane count)."""
    return jax.tree_util.tree_map(lambda *x: jnp.asarray(np.stack([np.asarray(v) for v in x])), *items)


# ----------------------------------------------------------------------------- measures

def service_rates(start_s, end_s, service, client, ticks_lo, ticks_hi, num_clients: int):
    """Service rate per client and window: a request's `service` spread evenly over
    [start, end] (requests with end < 1 s or end - start < 1e-5 s, e.g. rejected ones, add
    nothing, as visualize.py), the part inside [lo, hi] divided by hi - lo. float[K, T]."""
    start, end = start_s[:, None], end_s[:, None]
    span = end - start
    ok = (end >= 1.0) & (span >= 1e-5)
    overlap = jnp.maximum(jnp.minimum(ticks_hi[None, :], end) - jnp.maximum(ticks_lo[None, :], start), 0.0)
    part = jnp.where(ok, service[:, None] * overlap / jnp.where(ok, span, 1.0), 0.0)
    return jax.ops.segment_sum(part, client, num_segments=num_clients) / (ticks_hi - ticks_lo)[None, :]


def demand_rates(arrival_s, service, client, ticks_lo, ticks_hi, num_clients: int):
    """Demand rate per client and window: service of the requests arriving in [lo, hi]
    (inclusive) over hi - lo. float[K, T]."""
    inside = (arrival_s[:, None] >= ticks_lo[None, :]) & (arrival_s[:, None] <= ticks_hi[None, :])
    part = jnp.where(inside, service[:, None], 0.0)
    return jax.ops.segment_sum(part, client, num_segments=num_clients) / (ticks_hi - ticks_lo)[None, :]


@dataclasses.dataclass(frozen=True)
class Ticks:
    """The revision tables' ticks: x_i = spacing * i, i = 1..count, window [x_i, x_i + window]."""

    spacing: float = 28.5
    count: int = 19
    window: float = 60.0

    def bounds(self):
        lo = self.spacing * np.arange(1, self.count + 1)
        return lo, lo + self.window


def lane_measures(trace: Trace, state: State, num_clients: int, ticks: Ticks = Ticks()) -> dict:
    """The artifact's measures of one finished lane, on the host (float64).

    Returns avg_diff, max_diff, throughput (tok/s over first arrival .. last completion),
    ttft_median/mean/p90/p99 (s, served requests), rejected (count), rejected_per_client
    [K], ttft_per_client_mean [K], diff [T], rate [K, T], demand [K, T], unfinished.
    """
    v = np.asarray(trace.valid)
    arrival = np.asarray(trace.arrival_us)[v] / 1e6
    client = np.asarray(trace.client)[v]
    prompt = np.asarray(trace.prompt)[v].astype(np.float64)
    output = np.asarray(trace.output)[v].astype(np.float64)
    status = np.asarray(state.status)[v]
    served = status == DONE
    first = np.where(served, np.asarray(state.first_token_us)[v] / 1e6, arrival)
    end = np.where(served, np.asarray(state.finish_us)[v] / 1e6, arrival)
    service = prompt + 2 * output
    lo, hi = ticks.bounds()
    f = lambda x: jnp.asarray(x, F32)  # noqa: E731
    rate = np.asarray(service_rates(f(first), f(end), f(service), jnp.asarray(client), f(lo), f(hi), num_clients),
                      np.float64)
    demand = np.asarray(demand_rates(f(arrival), f(service), jnp.asarray(client), f(lo), f(hi), num_clients),
                        np.float64)
    present = np.bincount(client, minlength=num_clients) > 0
    diff = service_difference(rate, demand, present, client_axis=0)
    ttft = first[served] - arrival[served]
    span = end[served].max() - arrival.min() if served.any() else np.nan
    rejected = np.bincount(client[status == REJECTED], minlength=num_clients)
    tt_client = np.array([ttft[client[served] == j].mean() if (client[served] == j).any() else np.nan
                          for j in range(num_clients)])
    return {"avg_diff": float(diff.mean()), "max_diff": float(diff.max()),
            "throughput": float((prompt[served] + output[served]).sum() / span),
            "ttft_median": float(np.median(ttft)), "ttft_mean": float(ttft.mean()),
            "ttft_p90": float(np.percentile(ttft, 90)), "ttft_p99": float(np.percentile(ttft, 99)),
            "rejected": float(rejected.sum()), "rejected_per_client": rejected, "ttft_per_client_mean": tt_client,
            "diff": diff, "rate": rate, "demand": demand,
            "unfinished": int(((status == WAITING) | (status == RUNNING) | (status == FUTURE)).sum()),
            "steps": int(state.steps), "prefills": int(state.prefills)}


def lane_index(tree, i):
    """Lane i of a batched pytree."""
    return jax.tree_util.tree_map(lambda x: x[i], tree)


TRACE_COLUMNS = ("arrival_s", "client", "prompt", "output")


def read_trace_csv(path) -> dict:
    """The real trace's columns: {"arrival_s", "client", "prompt", "output"} numpy arrays.

    Raises InputError naming the file and the problem: a missing column, a value that is
    not a number, a negative or non-finite arrival, a non-integer or out-of-range id or
    length (client >= 0, prompt >= 1, output >= 1)."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = np.atleast_1d(np.genfromtxt(path, delimiter=",", names=True, invalid_raise=True))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read trace ({err})") from None
    names = data.dtype.names or ()
    for col in TRACE_COLUMNS:
        if col not in names:
            raise InputError(f"{path}: missing column {col!r} (header: {','.join(names)})")
    if data.size == 0:
        raise InputError(f"{path}: no requests")
    cols = {c: np.asarray(data[c], np.float64) for c in TRACE_COLUMNS}
    checks = [("arrival_s", ~np.isfinite(cols["arrival_s"]) | (cols["arrival_s"] < 0), "a finite number >= 0")]
    for col, low in (("client", 0), ("prompt", 1), ("output", 1)):
        v = cols[col]
        checks.append((col, ~np.isfinite(v) | (v != np.round(v)) | (v < low) | (v > 2**31 - 1),
                       f"an integer >= {low}"))
    for col, bad, what in checks:
        if bad.any():
            row = int(np.argmax(bad))
            raise InputError(f"{path}: line {row + 2}: {col} must be {what}")
    return {"arrival_s": cols["arrival_s"], "client": cols["client"].astype(np.int64),
            "prompt": cols["prompt"].astype(np.int64), "output": cols["output"].astype(np.int64)}
