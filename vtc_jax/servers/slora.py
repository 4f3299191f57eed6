"""`slora`: the VTC paper's serving engine (S-LoRA on LightLLM, Llama-2-7B on an A10G;
docs/ARTIFACT.md) as a server component, so every registered policy runs on it.

What it models (every item a named setting, `OPTIONS`; defaults: the artifact's engine):

  * wall-clock time: the lane's clock counts microseconds (arrivals too); a step lasts
    the step-time model's duration, a sum of float32 terms each rounded to a microsecond
    (prefill: overhead * (prefill_base + prefill_per_token * the round's input tokens);
    decode: overhead * (decode_base + decode_per_request * running + decode_per_context_token
    * their context)), as the artifact engine computes it, so its timelines are reproduced;
  * prefill stalls: a round that admitted anything is one prefill step of the new requests
    only (no mixed or chunked prefill); it gives each its first token;
  * the admission cadence: after a prefill, `cadence` decode steps with no admission; then
    admission before every decode step until something is admitted;
  * LightLLM's worst-case KV check: running requests as (held = input + generated, to come
    = output - generated - 1), a candidate as (input + 1, output - 1); sorted by tokens to
    come, need = max_k k * left_k + held of the first k; admit only if need < kv_pool -
    adapter_reserve * distinct clients; at most `prefill_cap` input tokens per round and
    `running_cap` requests; the first candidate that fails ends the round (the engine's
    head of line);
  * the idle poll: a server with nothing to do starts again at the first whole poll
    (`poll_us`) at or after the next arrival (`idle` "jump": at the arrival);
  * charges: `Work.decoded` is what the artifact's `update_counter` charges w_q for: one
    token per running request before every decode step, and, with `extra_finish_charge`,
    one more for every request of a step's batch when one of them finishes.

The prompt the engine sees is the server's input (the artifact's trace prompt plus its
`input_extra`, added by the caller). Completions leave in request order (ORDER), as the
artifact's. Per request, by its number in (arrival, number) order (ORDER: rows an rpm
limit rejects keep theirs), the server keeps its admission, first-token and finish times
(`scheduled`, `first`, `finish`, -1: not yet; `request_record` reads them on the host),
and, given `token_times` T > 0, each output token's time (servers/base.py TokenTimes, its
rows by request number too): the end of the step that sampled it (the prefill gives token
0, each decode step the next token to every running request; the extra finish charge is a
charge, no token). T is static (`static_options`: the most any lane asks for); 0, the
default, keeps no record and costs nothing.

Layout (O(S + K) per call, S slots): running requests in a pool of S slots (a free-list
stack) and, for the KV check, an array sorted by tokens to come with V_j = (j + 1) * left_j +
held by positions <= j; a decode step leaves every V unchanged, so the need with a
candidate is one masked pass (`kv_need_with`), no sort.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.rows import ORDER, OUTPUT, PROMPT
from vtc_jax.servers.base import (Finished, Load, Server, ServerShape, TokenTimes, Work, token_rows, token_stamps,
                                  token_times)

I32, F32 = jnp.int32, jnp.float32
BIG = (1 << 31) - 1
MAX_STEP_US = 1 << 29  # a step longer than ~9 minutes is refused before the run
MAX_HORIZON = BIG - MAX_STEP_US - 1  # the longest drain horizon (~1,610 s): a step past it still fits int32
IDLE_RULES = ("poll", "jump")
TIME_KEYS = ("prefill_base", "prefill_per_token", "decode_base", "decode_per_request", "decode_per_context_token")
OPTIONS = {  # name: default (the artifact's engine)
    "kv_pool": 10_000, "adapter_reserve": 32, "prefill_cap": 3072, "running_cap": 1000, "cadence": 10,
    "poll_us": 10_000, "idle": "poll", "extra_finish_charge": True,
    "slots": 0,  # running slots to plan (0: the proven bound; fewer: a lane that needs more is flagged, for tiers)
    "token_times": 0,  # entries of the per-token time record (a static size: the most of any lane; 0: none)
    # the step-time model in seconds (the artifact's A10G fit), times `overhead`
    "prefill_base": 0.0, "prefill_per_token": 0.214e-3, "decode_base": 19.7e-3, "decode_per_request": 0.215e-3,
    "decode_per_context_token": 1.71e-6, "overhead": 1.08,
}
INT_RANGES = {"kv_pool": (1, 1 << 30), "adapter_reserve": (0, 1 << 20), "prefill_cap": (1, 1 << 30),
              "running_cap": (1, 1 << 20), "cadence": (0, 1 << 30), "poll_us": (1, MAX_STEP_US), "slots": (0, 1 << 20),
              "token_times": (0, 1 << 30)}
STATIC = ("token_times",)  # in the server's shape (static_options), not its traced params
P_INDEX, P_ORDER, P_CLIENT, P_INPUT, P_OUTPUT, P_VALUE = range(6)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SloraState:
    """One lane's server.

    Attributes:
      clock: int32[]  the lane's time at the last admission or step end (us).
      wait: int32[]  decode steps since the last prefill; decodes: int32[] decode steps so
        far (a running request has left = skey - decodes).
      count, pending, round_tokens, finishing: int32[]  requests holding KV; of them in the
        open round; the round's input tokens; requests the last step finished, not yet left.
      members, context: int32[K]  per client: requests holding KV, the tokens they hold.
      skey, sval, sslot: int32[S]; spend: bool[S]  the sorted view: position j < count
        holds slot sslot_j with left = skey_j - decodes (descending), V_j, spend_j: in the
        open round.
      pool: int32[S, 6]  per slot P_INDEX (workload row), P_ORDER, P_CLIENT, P_INPUT,
        P_OUTPUT, P_VALUE (the policy's value); pd0: int32[S] decodes at its prefill.
      pocc, ppend, pfin: bool[S]  occupied, in the open round, finished by the last step.
      free: int32[S], nfree: int32[]  free slots (a stack).
      scheduled, first, finish: int32[R]  per request number (ORDER): its admission (it
        joins the open round), the end of its prefill step, of its last step (-1: not yet).
      peak: int32[]  the most requests that held KV at once.
      steps, prefills: int32[]  steps run (prefill or decode), of them prefills.
      times: TokenTimes  each output token's time, its `offset` per request number (ORDER,
        as `first`), not per workload row (empty arrays: no record, `token_times` 0).
    """

    clock: jax.Array
    wait: jax.Array
    decodes: jax.Array
    count: jax.Array
    pending: jax.Array
    round_tokens: jax.Array
    finishing: jax.Array
    members: jax.Array
    context: jax.Array
    skey: jax.Array
    sval: jax.Array
    sslot: jax.Array
    spend: jax.Array
    pool: jax.Array
    pd0: jax.Array
    pocc: jax.Array
    ppend: jax.Array
    pfin: jax.Array
    free: jax.Array
    nfree: jax.Array
    scheduled: jax.Array
    first: jax.Array
    finish: jax.Array
    peak: jax.Array
    steps: jax.Array
    prefills: jax.Array
    times: TokenTimes


def init(shape: ServerShape) -> SloraState:
    k, s, r = shape.num_clients, shape.slots, max(shape.num_rows, 1)
    zi = lambda *d: jnp.zeros(d, I32)  # noqa: E731
    zb = lambda *d: jnp.zeros(d, bool)  # noqa: E731
    return SloraState(clock=zi(), wait=zi(), decodes=zi(), count=zi(), pending=zi(), round_tokens=zi(), finishing=zi(),
                      members=zi(k), context=zi(k), skey=zi(s), sval=zi(s), sslot=zi(s), spend=zb(s), pool=zi(s, 6),
                      pd0=zi(s), pocc=zb(s), ppend=zb(s), pfin=zb(s), free=jnp.arange(s - 1, -1, -1, dtype=I32),
                      nfree=jnp.asarray(s, I32), scheduled=jnp.full(r, -1, I32), first=jnp.full(r, -1, I32),
                      finish=jnp.full(r, -1, I32), peak=zi(), steps=zi(), prefills=zi(), times=token_times(shape))


def load(state: SloraState) -> Load:
    return Load(running=state.members, context=state.context)


def kv_need_with(left, sval, count, c_held, c_left):
    """LightLLM's worst-case need of the members plus a candidate, from the sorted view.

    The members (positions < count) are sorted by tokens still to come `left`, descending,
    with sval_j = (j + 1) * left_j + (tokens held by positions <= j); the candidate holds
    c_held and has c_left to come. It goes after every member with left >= c_left
    (`place`); members before it keep their V, it gets v_new, members after it move one
    place down: V + left + c_held. need = max of all. Returns (need, place, v_new, v_shift)."""
    jj = jnp.arange(left.shape[-1], dtype=I32)
    valid = jj < count
    place = (valid & (left >= c_left)).sum().astype(I32)
    before = jnp.maximum(place - 1, 0)
    held_before = jnp.where(place > 0, sval[before] - place * left[before], 0)
    v_new = (place + 1) * c_left + held_before + c_held
    v_shift = sval + left + c_held
    need = jnp.maximum(jnp.where(jj < place, sval, jnp.where(valid, v_shift, 0)).max(), v_new)
    return need, place, v_new, v_shift


def step_terms(*terms) -> jax.Array:
    """A step's duration: each float32 term rounded to a microsecond (half to even), summed:
    no fused multiply-add can change it, so a pure-Python replay reproduces it. int32[]."""
    return sum(jnp.round(t).astype(I32) for t in terms)


def coefficients_us(options: dict) -> np.ndarray:
    """float32[5]: overhead * (the five step-time coefficients), in microseconds."""
    s = settings(options)
    return np.asarray([s["overhead"] * s[key] * 1e6 for key in TIME_KEYS], np.float32)


def _candidate(state: SloraState, row, client):
    """The KV check's quantities for a candidate row of `client` (None: a new client)."""
    c_in, c_out = row[PROMPT], row[OUTPUT]
    need, place, v_new, v_shift = kv_need_with(state.skey - state.decodes, state.sval, state.count, c_in + 1, c_out - 1)
    new_client = jnp.ones((), bool) if client is None else state.members[client] == 0
    clients = (state.members > 0).sum() + new_client.astype(I32)
    return c_in, c_out, need, place, v_new, v_shift, clients


def fits(state: SloraState, params, row, *, generated=None, client=None) -> jax.Array:
    """bool[]: admission is allowed now (nothing runs but the open round, or `cadence`
    decode steps passed since the last prefill) and the candidate passes the KV check, the
    prefill cap and the running cap. `client` None counts the candidate as a new client
    (conservative: the engine passes it, Server.fits_client)."""
    p = params.server
    c_in, _, need, _, _, _, clients = _candidate(state, row, client)
    allowed = (state.count == state.pending) | (state.wait >= p["cadence"])
    return (allowed & (need < p["kv_pool"] - p["adapter_reserve"] * clients)
            & (state.round_tokens + c_in <= p["prefill_cap"]) & (state.count + 1 <= p["running_cap"]))


def _put(x, i, value, mask, size: int):
    """x with x[i] = value where mask (the index leaves the array, dropped, elsewhere)."""
    return x.at[jnp.where(mask, i, size)].set(value, mode="drop")


def admit(state: SloraState, params, row, client, value, step, mask, *, index=None, generated=None):
    """The request joins the open round where `mask` (time does not move); `index` and
    `generated` are not needed (requests are kept by ORDER; nothing is preempted)."""
    slots = state.pocc.shape[0]
    jj = jnp.arange(slots, dtype=I32)
    c_in, c_out, _, place, v_new, v_shift, _ = _candidate(state, row, client)
    admit_ = mask & (state.nfree > 0)
    slot = state.free[jnp.maximum(state.nfree - 1, 0)]
    take = ((jnp.arange(state.members.shape[0]) == client) & admit_).astype(I32)

    def insert(x, new, shifted=None):
        shifted = x if shifted is None else shifted
        moved = jnp.where(jj < place, x, jnp.where(jj == place, new, jnp.roll(shifted, 1)))
        return jnp.where(admit_, moved, x)

    index = jnp.zeros((), I32) if index is None else index
    entry = jnp.stack([index, row[ORDER], client, c_in, c_out, value]).astype(I32)
    is_slot = (jj == slot) & admit_
    out = dataclasses.replace(
        state, clock=jnp.where(mask, step, state.clock), members=state.members + take,
        context=state.context + take * c_in, count=state.count + admit_.astype(I32),
        pending=state.pending + admit_.astype(I32), round_tokens=state.round_tokens + jnp.where(admit_, c_in, 0),
        skey=insert(state.skey, c_out - 1 + state.decodes), sval=insert(state.sval, v_new, v_shift),
        sslot=insert(state.sslot, slot), spend=insert(state.spend, True),
        pool=_put(state.pool, slot, entry, admit_, slots), pocc=state.pocc | is_slot, ppend=state.ppend | is_slot,
        nfree=state.nfree - admit_.astype(I32), peak=jnp.maximum(state.peak, state.count + admit_.astype(I32)),
        scheduled=_put(state.scheduled, row[ORDER], step, admit_, state.scheduled.shape[0]),
        times=token_rows(state.times, row[ORDER], c_out, admit_))
    return out, mask & (state.nfree == 0)


def end_step(state: SloraState, params, mask):
    """The round's prefill step if it admitted anything, else a decode step of the running
    batch, else one idle poll (something waits that no round admitted)."""
    p = params.server
    k = state.members.shape[0]
    rows = state.first.shape[0]
    jj = jnp.arange(state.pocc.shape[0], dtype=I32)
    tc = p["time_coef"]
    prefill = mask & (state.pending > 0)
    decode = mask & ~prefill & (state.count > 0)
    stepping = prefill | decode
    pclient, pinput, poutput = state.pool[:, P_CLIENT], state.pool[:, P_INPUT], state.pool[:, P_OUTPUT]
    running = state.pocc & ~state.ppend
    gen = 1 + state.decodes - state.pd0
    context = jnp.where(running, pinput + gen, 0)
    dur_p = step_terms(tc[0], tc[1] * state.round_tokens.astype(F32))
    dur_d = step_terms(tc[2], tc[3] * state.count.astype(F32), tc[4] * context.sum().astype(F32))
    elapsed = jnp.maximum(1, jnp.where(prefill, dur_p, jnp.where(decode, dur_d, p["poll_us"])))
    clock = state.clock + jnp.where(mask, elapsed, 0)
    batch = jnp.where(prefill, state.ppend, running) & stepping
    held_gen = jnp.where(state.ppend, 1, gen + decode.astype(I32))
    finished = batch & (held_gen >= poutput)
    extra = batch & finished.any() & p["extra_finish_charge"]
    per_client = lambda x: jax.ops.segment_sum(x.astype(I32), pclient, num_segments=k)  # noqa: E731
    decoding = running & decode
    decoded = per_client(decoding) + per_client(extra)
    attended = per_client(jnp.where(decoding, context, 0))
    shift = prefill & state.spend
    first_now = prefill & state.ppend
    detail = _artifact_charges(state, decoding, held_gen, finished, extra)
    out = dataclasses.replace(
        state, clock=clock, wait=jnp.where(prefill, 0, state.wait + decode.astype(I32)),
        decodes=state.decodes + decode.astype(I32), context=state.context + per_client(batch),
        skey=state.skey - shift.astype(I32), sval=state.sval - jnp.where(shift, jj + 1, 0),
        spend=state.spend & ~prefill, pd0=jnp.where(first_now, state.decodes, state.pd0),
        ppend=state.ppend & ~prefill, pfin=jnp.where(stepping, finished, state.pfin),
        finishing=jnp.where(stepping, finished.sum().astype(I32), state.finishing),
        pending=jnp.where(prefill, 0, state.pending), round_tokens=jnp.where(prefill, 0, state.round_tokens),
        first=_put(state.first, state.pool[:, P_ORDER], clock, first_now, rows),
        finish=_put(state.finish, state.pool[:, P_ORDER], clock, finished, rows),
        steps=state.steps + stepping.astype(I32), prefills=state.prefills + prefill.astype(I32),
        times=token_stamps(state.times, state.pool[:, P_ORDER], held_gen - 1, clock, batch))  # the step's tokens
    return out, Work(decoded=decoded, attended=attended, elapsed=elapsed, detail=detail)


def _artifact_charges(state: SloraState, decoding, held_gen, finished, extra) -> dict:
    """The artifact's `update_counter` charges of the step, in w_q units (float32[K] each),
    for a policy whose value is a float32 prediction p (its bits; the artifact's vtc_oracle
    and vtc_predict: policies/vtc_artifact.py): "charge" counts the decoding requests that
    generated more than p; "settle" the extra finish charges (requests of the batch past p)
    less the unused predictions (p - output) of the requests that finished. The sums run
    over the slots in slot order, as the artifact's."""
    k = state.members.shape[0]
    pclient, poutput = state.pool[:, P_CLIENT], state.pool[:, P_OUTPUT]
    pred = jax.lax.bitcast_convert_type(state.pool[:, P_VALUE], F32)
    gen = 1 + state.decodes - state.pd0
    f_sum = lambda x: jax.ops.segment_sum(x, pclient, num_segments=k)  # noqa: E731
    charge = f_sum(jnp.where(decoding & (gen.astype(F32) > pred), 1.0, 0.0).astype(F32))
    out_f = poutput.astype(F32)
    late = jnp.where(extra & (held_gen.astype(F32) > pred), 1.0, 0.0).astype(F32)
    refund = jnp.where(finished & (out_f < pred), pred - out_f, 0.0).astype(F32)
    return {"charge": charge, "settle": f_sum(late - refund)}


def due(state: SloraState, step) -> jax.Array:
    return state.finishing > 0


def complete(state: SloraState, step, mask):
    """The finished request with the smallest ORDER leaves where `mask`. The finished
    requests hold the last places of the sorted view (they have the fewest tokens to come,
    -1), and all leave before the next admission: the view just shrinks."""
    slots = state.pocc.shape[0]
    j = jnp.argmin(jnp.where(state.pfin, state.pool[:, P_ORDER], BIG)).astype(I32)
    entry = state.pool[j]
    client = entry[P_CLIENT]
    take = ((jnp.arange(state.members.shape[0]) == client) & mask).astype(I32)
    is_j = (jnp.arange(slots) == j) & mask
    m = mask.astype(I32)
    out = dataclasses.replace(
        state, members=state.members - take, context=state.context - take * (entry[P_INPUT] + entry[P_OUTPUT]),
        pfin=state.pfin & ~is_j, pocc=state.pocc & ~is_j, free=_put(state.free, state.nfree, j, mask, slots),
        nfree=state.nfree + m, count=state.count - m, finishing=state.finishing - m)
    return out, Finished(client=client, prompt=entry[P_INPUT], output=entry[P_OUTPUT], value=entry[P_VALUE])


def busy(state: SloraState) -> jax.Array:
    return state.count > 0


def wake(params, now, next_arrival) -> jax.Array:
    """When a server with nothing to do looks at its queue again: the first whole poll at or
    after the next arrival (the router's sleep loop), or the arrival itself (`idle` jump)."""
    poll = params.server["poll_us"]
    gap = jnp.maximum(next_arrival - now, 1)
    late = (poll - gap % poll) % poll  # to the next whole poll
    polled = jnp.where(next_arrival > BIG - poll, next_arrival, next_arrival + late)
    return jnp.where(params.server["idle_jump"], next_arrival, polled).astype(I32)


# ----------------------------------------------------------------------------- host side

def settings(options: dict) -> dict:
    return {**OPTIONS, **options}


def validate(options: dict) -> None:
    """InputError naming the first setting that is unknown or out of range."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InputError(f"server slora has no setting {unknown[0]!r} (its settings: {', '.join(OPTIONS)})")
    s = settings(options)
    for name, (low, high) in INT_RANGES.items():
        value = s[name]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
            raise InputError(f"slora {name} must be an integer in [{low}, {high}], got {value!r}")
    if s["idle"] not in IDLE_RULES:
        raise InputError(f"slora idle must be one of {', '.join(IDLE_RULES)}, got {s['idle']!r}")
    if type(s["extra_finish_charge"]) not in (bool, np.bool_):
        raise InputError(f"slora extra_finish_charge must be true or false, got {s['extra_finish_charge']!r}")
    for name in (*TIME_KEYS, "overhead"):
        value = s[name]
        try:
            ok = not isinstance(value, bool) and math.isfinite(float(value)) and float(value) >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise InputError(f"slora step time {name} must be a finite number >= 0, got {value!r}")
    longest = longest_step_us(s, s["running_cap"], s["kv_pool"])
    if longest > MAX_STEP_US:
        raise InputError(f"slora's longest step ({s['prefill_cap']} prefill tokens, or {s['running_cap']} running "
                         f"over a full pool) lasts {longest} us, past the limit {MAX_STEP_US} us")


def longest_step_us(s: dict, running: int, context: int) -> int:
    """Most microseconds one step can last: a full prefill cap, or `running` requests
    decoding over `context` tokens (each term rounded up, plus one)."""
    tc = coefficients_us(s).astype(np.float64)
    return int(max(math.ceil(tc[0]) + math.ceil(tc[1] * s["prefill_cap"]),
                   math.ceil(tc[2]) + math.ceil(tc[3] * running) + math.ceil(tc[4] * context), s["poll_us"])) + 3


def encode(options: dict) -> dict:
    s = settings(options)
    traced = {name: np.int32(s[name]) for name in INT_RANGES if name not in STATIC}
    return {**traced, "idle_jump": np.bool_(s["idle"] == "jump"),
            "extra_finish_charge": np.bool_(s["extra_finish_charge"]), "time_coef": coefficients_us(s)}


def static_options(options: list) -> tuple:
    """(("token_times", the most entries any lane asks for: 0, no record),): the record's
    size T is a shape (servers/base.py token_times)."""
    return (("token_times", max(settings(o)["token_times"] for o in options)),)


def plan_slots(options: list, bound: int, requests: int) -> int:
    """A running request holds at least its prompt + 1 and the need is at least the sum of
    what they hold, below the pool: `bound` (requests holding their whole prompt in M) and
    the running cap bound the running set. Option `slots` > 0 in every lane plans at most
    that many (a lane that would need more is flagged: the caller reruns it, as
    driver/artifact_run.py's slot tiers do; slots bound capacity only)."""
    planned = max(1, min(bound, requests, max(settings(o)["running_cap"] for o in options)))
    asked = [settings(o)["slots"] for o in options]
    return planned if 0 in asked else max(1, min(planned, max(asked)))


def never_served(options: dict, prompt, output, kv_budget: int) -> str | None:
    """A request over the prefill cap, or whose prompt + output alone is not below the pool
    minus one adapter reserve, is never admitted."""
    s = settings(options)
    prompt, output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    if prompt.size and prompt.max() > s["prefill_cap"]:
        worst = int(np.argmax(prompt))
        return f"request {worst}'s input, {int(prompt[worst])} tokens, is over prefill_cap={s['prefill_cap']}"
    alone = prompt + output
    if alone.size and alone.max() >= s["kv_pool"] - s["adapter_reserve"]:
        worst = int(np.argmax(alone))
        return (f"request {worst} needs {int(alone[worst])} KV tokens alone, not below kv_pool - adapter_reserve = "
                f"{s['kv_pool'] - s['adapter_reserve']}: it could never be admitted")
    return None


def drain_steps(options: dict, arrival, prompt, output, limit: int = MAX_HORIZON) -> int:
    """Microseconds that surely drain such a trace: the last arrival, one poll per request
    (an idle wait ends at most a poll after an arrival), and one step of the longest kind
    per token (every step gives some request a token), capped at MAX_HORIZON (2^31 - 2^29
    - 2 us, about 1,610 s: the int32 clock; a lane past it is flagged as not finished,
    never reported; the artifact's poisson_short_long_2 under VTC or LCF needs more)."""
    s = settings(options)
    running = min(len(prompt), s["running_cap"])
    worst = longest_step_us(s, running, int(np.sum(prompt)) + int(np.sum(output)))
    total = int(np.max(arrival)) + len(prompt) * s["poll_us"] + int(np.sum(output)) * worst + 1
    return min(total, limit)


def fuzz_options(rng, prompt, output) -> dict:
    """Random valid settings for requests of these lengths: a pool holding the largest
    request and a little more, small caps and cadence, either idle rule, small steps."""
    reserve = rng.choice((0, 0, 1, 4))
    alone = int((np.asarray(prompt) + np.asarray(output)).max())
    out = {"adapter_reserve": reserve, "kv_pool": alone + 4 * reserve + 1 + rng.randint(0, 2 * alone),
           "prefill_cap": int(np.max(prompt)) + rng.choice((0, 0, rng.randint(0, 20))),
           "running_cap": rng.randint(1, 6), "cadence": rng.randint(0, 3), "poll_us": rng.randint(1, 9),
           "idle": rng.choice(IDLE_RULES), "extra_finish_charge": rng.random() < 0.7,
           "overhead": rng.choice((1.0, 1.08))}
    for key, scale in zip(TIME_KEYS, (3e-6, 1e-6, 5e-6, 1e-6, 0.1e-6)):
        out[key] = rng.choice((0.0, scale * rng.randint(1, 4)))
    return out


def census(host: SloraState, num_clients: int) -> np.ndarray:
    """int64[B, K]: requests holding a slot in each lane, per client (host side)."""
    pool, occ = np.asarray(host.pool, np.int64), np.asarray(host.pocc, bool)
    out = np.zeros((pool.shape[0], num_clients), np.int64)
    for b in range(pool.shape[0]):
        out[b] = np.bincount(pool[b, occ[b], P_CLIENT], minlength=num_clients)[:num_clients]
    return out


def request_record(host: SloraState) -> dict:
    """Host side: {"scheduled", "first", "finish"}: int64[..., R] each, per request number
    (ORDER), in us (-1: not yet); "token_at" int64[..., T], "token_offset" int64[..., R or
    0]: the per-token record (TokenTimes; T 0: none kept), its offsets by request number;
    what a latency report reads (driver/server_latency.py)."""
    out = {name: np.asarray(getattr(host, name), np.int64) for name in ("scheduled", "first", "finish")}
    return dict(out, token_at=np.asarray(host.times.at, np.int64), token_offset=np.asarray(host.times.offset, np.int64))


def default_memory(options: dict) -> int:
    """M when no --kv-budget is given: the pool less one adapter reserve (the most KV
    tokens its requests can hold, the artifact's M)."""
    s = settings(dict(options))
    return s["kv_pool"] - s["adapter_reserve"]


def own_clock(options: dict) -> tuple[str, dict]:
    """(its step times, the settings a latency report prints: the filled options less the
    step-time coefficients and the run's static sizes)."""
    shown = {key: value for key, value in settings(dict(options)).items()
             if key not in (*TIME_KEYS, *STATIC, "overhead", "slots")}
    return "the artifact's A10G fit (docs/ARTIFACT.md)", shown


SLORA = Server(name="slora", description="the VTC paper's engine (S-LoRA on LightLLM): wall-clock microseconds, "
               "prefill stalls, the admission cadence, LightLLM's worst-case KV check (docs/ARTIFACT.md)",
               init=init, load=load, fits=fits, admit=admit, end_step=end_step, due=due, complete=complete,
               census=census, busy=busy, validate=validate, encode=encode, plan_slots=plan_slots,
               never_served=never_served, drain_steps=drain_steps, fuzz_options=fuzz_options, fits_client=True,
               wake=wake, max_horizon=MAX_HORIZON, clock_seconds=1e-6, static_options=static_options,
               request_times=lambda host: (np.asarray(host.first, np.int64), np.asarray(host.finish, np.int64)),
               keeps_time=lambda options: True, request_record=request_record, default_memory=default_memory,
               own_clock=own_clock)
