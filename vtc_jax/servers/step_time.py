"""How long a server's step takes: exact integer microseconds from a model of the step.

A step's duration is T = max(1, trunc(S)) us, S the largest of a model's forms (one form,
or two for a roofline: compute and bytes), each a sum of exact decimal coefficients times
the step's FEATURES:

- per_step: 1; per_request: the requests the step schedules;
- per_prefill_token / per_decode_token: the prompt tokens it computes (recomputed ones
  included) / the requests it decodes one token for;
- per_chunk_attention: sum over prefill chunks of t x (P + t/2), a chunk of t tokens of a
  sequence of P tokens (the whole prompt, for every chunk: BLIS's physics model);
- per_decode_context: sum over decoding requests of P + g (the context a decode reads,
  g tokens generated);
- per_prefill_context: sum over prefill chunks of the context each chunk token reads,
  t x c + t (t + 1) / 2 for a chunk starting after c computed tokens (a roofline's KV reads).

A request joins the waiting queue a0 us after it arrives; a delivered token costs a2 us
and a finished request a1 us more (BLIS's counting: TTFT = the end of the step that
computes the last prompt token + a2 - arrival; E2E = the end of the finishing step +
a2 x output + a1 - arrival). Presets are data (`presets/step_time.json`), a user gives
their own in a file of the same keys.

The lane evaluates S exactly, in int32 limbs of base 10^4 (`duration`): every coefficient is
an integer of 10^-24 us, every feature a sum of int32 products, and the truncation reads
the whole limbs: no float rounding (in float32, 7 of BLIS's 37,493 physics steps are 1 us
off). Options (Settings.server_options of a timed server): `time_model`, the model's
canonical text (`StepTime.text`; "": untimed, a step lasts 1).
"""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from importlib import resources
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import read_text

I32 = jnp.int32
INT32_MAX = 2**31 - 1
MAX_STEP_US = 1 << 30  # a step longer than ~18 minutes is refused
MAX_CLOCK_US = INT32_MAX // 2  # a timed lane's longest drain horizon (servers.base.Server.max_horizon)
FEATURES = ("per_step", "per_request", "per_prefill_token", "per_decode_token", "per_chunk_attention",
            "per_decode_context", "per_prefill_context")
DOUBLED = ("per_chunk_attention", "per_prefill_context")  # the lane sums twice these (integers), at half the coefficient
LINEAR = {"b0": "per_step", "b1": "per_prefill_token", "b2": "per_decode_token"}  # the blackbox fits' keys
MAX_FORMS = 2  # a roofline: compute and bytes
BASE = 10_000  # limbs of the exact sum
FRAC_LIMBS = 6  # 24 decimal places of a microsecond
COEF_LIMBS = FRAC_LIMBS + 2  # a coefficient below 10^8 us
FEATURE_LIMBS = 6  # a feature below 10^24
DELAYS = ("a0", "a1", "a2")
Form = tuple  # one Fraction per FEATURES name


@dataclasses.dataclass(frozen=True)
class StepTime:
    """forms: tuple of 1 or MAX_FORMS forms, each a tuple of exact Fractions (us per unit
    of each FEATURES name; a step lasts the largest form's sum); a0, a1, a2: int us (queue
    entry after arrival; per finished request; per delivered token); num_gpu_blocks: the KV
    pool the model was measured with (None if not given); blis_engine: the model is BLIS's,
    run on BLIS's engine where it departs from vLLM's (the vllm server option of that name:
    its idle rule and long-prefill cap); name: where it came from."""

    forms: tuple
    a0: int = 0
    a1: int = 0
    a2: int = 0
    num_gpu_blocks: int | None = None
    blis_engine: bool = False
    name: str = "custom"

    @classmethod
    def linear(cls, b0, b1, b2, a0: int = 0, **kw) -> "StepTime":
        """The blackbox fit T = trunc(b0 + b1 x prefill + b2 x decode)."""
        return cls(forms=(_form({"per_step": b0, "per_prefill_token": b1, "per_decode_token": b2}),), a0=a0, **kw)

    @property
    def b0(self) -> Fraction:
        return self.forms[0][FEATURES.index("per_step")]

    @property
    def b1(self) -> Fraction:
        return self.forms[0][FEATURES.index("per_prefill_token")]

    @property
    def b2(self) -> Fraction:
        return self.forms[0][FEATURES.index("per_decode_token")]

    @property
    def text(self) -> str:
        """The canonical text (the `time_model` option): forms joined by ';', each
        `name=decimal,...` of its nonzero terms in FEATURES order."""
        return ";".join(",".join(f"{n}={_exact_decimal(c)}" for n, c in zip(FEATURES, form) if c)
                        or "per_step=0" for form in self.forms)

    def options(self) -> tuple:
        """The server options that encode it."""
        return (("time_model", self.text),) + ((("blis_engine", True),) if self.blis_engine else ())

    def step_us(self, prefill: int = 0, decode: int = 0, **features) -> int:
        """The duration in us of a step of these features (prefill / decode tokens and any
        other FEATURES by name, their true values, not doubled), as the lane computes it:
        max(1, trunc(largest form))."""
        x = {"per_step": 1, "per_prefill_token": prefill, "per_decode_token": decode, **features}
        unknown = sorted(set(x) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown step feature {unknown[0]!r}")
        return max(1, max(int(sum(c * Fraction(x.get(n, 0)) for n, c in zip(FEATURES, form))) for form in self.forms))

    def longest_step(self, budget: int, seats: int, longest: int = 0) -> int:
        """An upper bound in us on any step: a full token budget of prefill (chunks of
        sequences of up to `longest` tokens) with every seat scheduled and decoding."""
        return self.step_us(budget, seats, per_request=seats, per_chunk_attention=budget * (longest + budget),
                            per_decode_context=seats * longest, per_prefill_context=budget * (longest + budget))

    def check(self, budget: int, seats: int, longest: int = 0) -> None:
        """InputError if the longest step could pass MAX_STEP_US (the lane's exact sum then
        no longer fits its int32 clock arithmetic)."""
        worst = self.longest_step(budget, seats, longest)
        if worst > MAX_STEP_US:
            raise InputError(f"step-time model {self.name}: its longest step ({budget} prefill tokens, {seats} "
                             f"decoding, sequences of {longest} tokens) is {worst:,} us, past the {MAX_STEP_US:,} us "
                             "a step may take: give smaller coefficients or a smaller budget")

    def _linear_floor(self, form) -> "StepTime":
        """The form's per-step, per-prefill-token and per-decode-token terms alone: a
        lower bound on it (every other term is >= 0)."""
        keep = [n in LINEAR.values() for n in FEATURES]
        return dataclasses.replace(self, forms=(tuple(c if k else Fraction(0) for c, k in zip(form, keep)),))

    def drain_floor(self, arrival_us, prompt, output, budget: int, cached=None) -> int:
        """A lower bound in us on the clock when the log has drained (every request
        finished), whatever the schedule; for a model of several forms or terms beyond
        b0, b1, b2, the largest bound of each form's linear part (every other term is >= 0).
        For the linear part b0 + b1 p + b2 d, the larger of

        - the last request alone: it joins at max(arrival) + a0, then its prompt needs
          ceil(prompt / budget) steps that prefill it (together at least
          b0 x steps + b1 x prompt - steps, truncation losing < 1 us a step) and its
          output - 1 decode steps of at least max(1, trunc(b0 + b2)) us each;
        - the whole log's work: from min(arrival) + a0, every prompt token prefilled once
          and every output token after the first decoded once, so the steps last together
          at least b1 P + b2 D (P, D the totals) less 1 us of truncation a step, which the
          step's b0 covers when b0 >= 1; when b0 < 1, half that (max(1, trunc(x)) >= x / 2).

        arrival_us, prompt, output: int arrays [n] (the log in us, before a0); cached: int
        array [n] of prompt tokens a prefix cache may hold (vllm_prefix: prefix_len), not
        counted as prefilled (at least one token of each prompt is)."""
        if len(self.forms) > 1 or any(c for n, c in zip(FEATURES, self.forms[0]) if n not in LINEAR.values()):
            return max(self._linear_floor(f).drain_floor(arrival_us, prompt, output, budget, cached) for f in self.forms)
        arrival = np.asarray(arrival_us, np.int64)
        prompt, output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
        if cached is not None:
            prompt = np.maximum(prompt - np.asarray(cached, np.int64), 1)
        last = int(np.argmax(arrival))
        steps = -(-int(prompt[last]) // budget)
        prefill = max(steps, int(self.b0 * steps + self.b1 * int(prompt[last])) - steps)
        alone = int(arrival[last]) + self.a0 + prefill + (int(output[last]) - 1) * self.step_us(0, 1)
        work = self.b1 * int(prompt.sum()) + self.b2 * int(np.maximum(output - 1, 0).sum())
        whole = int(arrival.min()) + self.a0 + int(work if self.b0 >= 1 else work / 2)
        return max(alone, whole)

    def check_drain(self, arrival_us, prompt, output, budget: int, limit: int = MAX_CLOCK_US, cached=None,
                    seats: int = 256) -> None:
        """InputError, one line, before the run, if a step could pass MAX_STEP_US (`check`,
        sequences as long as the log's) or the log cannot drain within `limit` us of the
        lane's clock whatever the schedule (`drain_floor`): such a run would spend its time
        only to end with every lane flagged as not finished."""
        floor = self.drain_floor(arrival_us, prompt, output, budget, cached)
        if floor > limit:
            raise InputError(f"step-time model {self.name}: this log needs at least {floor:,} us ({floor / 6e7:,.1f} "
                             f"minutes) of the server's clock to drain, past the {limit:,} us a timed run's "
                             "clock holds: give smaller coefficients (a0, b0, b1, b2) or a shorter log (--time-window)")
        self.check(budget, seats, int(np.max(np.asarray(prompt, np.int64) + np.asarray(output, np.int64))))


def _form(terms: dict) -> Form:
    return tuple(Fraction(terms.get(n, 0)) for n in FEATURES)


def _exact_decimal(value: Fraction) -> str:
    """A Fraction whose denominator divides a power of ten, as a plain decimal."""
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    text = str(int(value * 10**digits)).rjust(digits + 1, "0")
    return text if digits == 0 else f"{text[:-digits]}.{text[-digits:]}"


def parse_text(text: str) -> tuple:
    """The forms of a canonical text (StepTime.text); InputError if malformed."""
    forms = []
    for part in str(text).split(";"):
        terms = {}
        for item in part.split(","):
            name, _, value = item.partition("=")
            if name not in FEATURES or name in terms:
                raise InputError(f"time_model: unknown or repeated term {name!r} (terms: {', '.join(FEATURES)})")
            terms[name] = _decimal(value, name, "time_model")
        forms.append(_form(terms))
    if not 1 <= len(forms) <= MAX_FORMS:
        raise InputError(f"time_model: 1 to {MAX_FORMS} forms, got {len(forms)}")
    return tuple(forms)


def model_of_options(options: dict) -> StepTime | None:
    """The step-time model a server's options carry (None: untimed)."""
    text = dict(options).get("time_model", "")
    return StepTime(forms=parse_text(text), name="time_model") if text else None


def _coef_limbs(c: Fraction) -> list[int]:
    scaled = c * BASE**FRAC_LIMBS
    if scaled.denominator != 1 or not 0 <= scaled < BASE**COEF_LIMBS:
        raise InputError(f"time_model: coefficient {float(c)!r} needs more than {4 * FRAC_LIMBS} decimals or is "
                         f"past {BASE ** (COEF_LIMBS - FRAC_LIMBS):,} us")
    n = int(scaled)
    return [(n // BASE**j) % BASE for j in range(COEF_LIMBS)]


def encode(text: str, budget: int = 0, seats: int = 0) -> dict:
    """The traced form of a `time_model` option: `time_coef` int32[MAX_FORMS, F,
    COEF_LIMBS] (each coefficient x 10^24 in base-10^4 limbs, least first; the doubled
    features' halved; an absent form 0), `timed` bool, and the model as scaled integers
    (`scaled_form` for steps of at most `budget` tokens and `seats` requests):
    `time_scaled` int32[len(SCALAR)] and `time_scale` int32[] (0 and 1 where it is not)."""
    coef = np.zeros((MAX_FORMS, len(FEATURES), COEF_LIMBS), np.int32)
    if text:
        for f, form in enumerate(parse_text(text)):
            for i, (name, c) in enumerate(zip(FEATURES, form)):
                coef[f, i] = _coef_limbs(c / 2 if name in DOUBLED else c)
    scaled = scaled_form(text, budget, seats)
    ints, scale = scaled if scaled is not None else ([0] * len(SCALAR), 1)
    return {"time_coef": coef, "timed": np.bool_(bool(text)), "time_scaled": np.asarray(ints, np.int32),
            "time_scale": np.int32(scale)}


def scaled_form(text: str, budget: int, seats: int) -> tuple[list[int], int] | None:
    """(C, s): the model as integers over SCALAR's features with s a power of ten, so
    that a step lasts (C . x) // s exactly (and a slot's own part likewise), when it is
    one form over SCALAR's terms only whose every step of at most `budget` tokens and
    `seats` requests sums below 2^31 (the blackbox fits are); else None. A batch whose
    every timed lane has one computes its steps in one int32 dot, not in limbs (`step_terms`)."""
    if not text:
        return None
    forms = parse_text(text)
    if len(forms) != 1 or any(c for n, c in zip(FEATURES, forms[0]) if n not in SCALAR):
        return None
    cs = [forms[0][FEATURES.index(n)] for n in SCALAR]
    digits = next((d for d in range(10) if all((c * 10**d).denominator == 1 for c in cs)), None)
    if digits is None:
        return None
    ints = [int(c * 10**digits) for c in cs]  # per_step, per_request, per_prefill_token, per_decode_token
    longest = ints[0] + ints[1] * seats + (ints[2] + ints[3]) * budget
    return (ints, 10**digits) if longest <= INT32_MAX else None


def step_terms(models) -> tuple:
    """The static `time_terms` of a batch whose lanes' models are `models` (time_model
    text, token budget, seats): `used_terms` of the texts, led by SCALED when every timed
    lane's model has a `scaled_form` (its steps then cost one int32 dot: the limbs made a
    timed vllm_prefix run on Mooncake's log 2.3x slower, benchmarks/HISTORY.md 2026-12-07)."""
    models = list(models)
    terms = used_terms(text for text, _, _ in models)
    fast = terms and all(scaled_form(text, budget, seats) is not None for text, budget, seats in models if text)
    return ((SCALED,) + terms) if fast else terms


def _limbs(x, n: int):
    """int32[..., n]: x (int32[...] >= 0) in base-10^4 limbs, least first."""
    return jnp.stack([(x // BASE**j) % BASE if j < 3 else jnp.zeros_like(x) for j in range(n)], -1)


def _carry(v):
    """int32[..., n]: the same number with every limb but the last below BASE."""
    out, c = [], jnp.zeros_like(v[..., 0])
    for j in range(v.shape[-1] - 1):
        s = v[..., j] + c
        out.append(s % BASE)
        c = s // BASE
    return jnp.stack(out + [v[..., -1] + c], -1)


def _mul(a, b):
    """int32[..., n + m - 1]: the limb product of a int32[..., n] and b int32[..., m]
    (each position a sum of at most min(n, m) products below 10^8: no carry)."""
    n, m = a.shape[-1], b.shape[-1]
    return jnp.stack([sum(a[..., j] * b[..., p - j] for j in range(max(0, p - m + 1), min(n, p + 1)))
                      for p in range(n + m - 1)], -1)


def _pad(v, n: int):
    return jnp.concatenate([v, jnp.zeros(v.shape[:-1] + (n - v.shape[-1],), v.dtype)], -1)


SCALAR = ("per_step", "per_request", "per_prefill_token", "per_decode_token")  # sums that fit int32
SCALED = "scaled"  # leads a batch's time_terms when its steps are computed as scaled integers (`step_terms`)


def used_terms(texts) -> tuple:
    """The FEATURES any of these `time_model` texts uses (a nonzero coefficient), in
    FEATURES order: the static `time_terms` of a batch, so that a lane's program computes
    only those ("": untimed, none)."""
    used = set()
    for text in texts:
        if text:
            used |= {n for form in parse_text(text) for n, c in zip(FEATURES, form) if c}
    return tuple(n for n in FEATURES if n in used)


def _slot_features(tokens, decoding, length, computed, terms):
    """int32[S, len(terms), FEATURE_LIMBS]: each slot's own FEATURES named in `terms`, in
    limbs (the doubled ones twice; per_step 0: the step's, not a slot's): tokens int32[S]
    scheduled (0: none), decoding bool[S], length int32[S] (prompt + generated: the sequence
    a chunk prefills, the context a decode reads), computed int32[S] (tokens computed before
    the step)."""
    on = tokens > 0
    dec = on & decoding
    t = jnp.where(on & ~decoding, tokens, 0)
    lt = _limbs(t, 3)
    rows = {"per_step": lambda: _limbs(jnp.zeros_like(t), 5), "per_request": lambda: _limbs(on.astype(I32), 5),
            "per_prefill_token": lambda: _limbs(t, 5), "per_decode_token": lambda: _limbs(jnp.where(dec, tokens, 0), 5),
            "per_chunk_attention": lambda: _mul(lt, _limbs(length, 3) * 2 + lt),  # t (2 P + t)
            "per_decode_context": lambda: _limbs(jnp.where(dec, length, 0), 5),
            "per_prefill_context": lambda: _mul(lt, _limbs(computed, 3) * 2 + lt + (jnp.arange(3) == 0))}  # t (2c+t+1)
    return _pad(_carry(jnp.stack([rows[n]() for n in terms], 1)), FEATURE_LIMBS)


def _features(tokens, decoding, length, computed, terms, slots=None):
    """int32[len(terms), FEATURE_LIMBS]: the step's FEATURES named in `terms` (per_step 1):
    the scalar ones from their int32 sums, the others from the slots' limbs (`slots`:
    `_slot_features` of all `terms` where the caller has them, else those computed here)."""
    sums = dict(zip(SCALAR, _scalar_features(tokens, decoding)))
    summed = [n for n in terms if n not in SCALAR]
    if slots is not None:
        total = _carry(slots.sum(0))
        return jnp.stack([_limbs(sums[n], FEATURE_LIMBS) if n in SCALAR else total[terms.index(n)] for n in terms])
    total = _carry(_slot_features(tokens, decoding, length, computed, tuple(summed)).sum(0)) if summed else None
    return jnp.stack([_limbs(sums[n], FEATURE_LIMBS) if n in SCALAR else total[summed.index(n)] for n in terms])


def _scalar_slots(tokens, decoding):
    """int32[len(SCALAR), S]: each slot's own SCALAR features (per_step 0: the step's)."""
    on = tokens > 0
    return jnp.stack([jnp.zeros_like(tokens), on.astype(I32), jnp.where(on & ~decoding, tokens, 0),
                      jnp.where(on & decoding, tokens, 0)])


def _scalar_features(tokens, decoding):
    """int32[len(SCALAR)]: the step's SCALAR features (per_step 1)."""
    return _scalar_slots(tokens, decoding).sum(-1, dtype=I32).at[0].set(1)


def exact_us(coef, features):
    """int32[..., MAX_FORMS]: each form's trunc(sum of coefficient x feature) in us, exact
    (saturating at MAX_STEP_US: `StepTime.check` refuses a model that could reach it).
    coef int32[..., MAX_FORMS, F', COEF_LIMBS]; features int32[..., F', FEATURE_LIMBS]."""
    total = _carry(_carry(_mul(coef, features[..., None, :, :])).sum(-2))  # [..., MAX_FORMS, limbs]
    whole = total[..., FRAC_LIMBS:]
    over = (whole[..., 3:] != 0).any(-1) | (whole[..., 2] > MAX_STEP_US // BASE**2)
    us = whole[..., 0] + whole[..., 1] * BASE + whole[..., 2] * BASE**2
    return jnp.where(over, MAX_STEP_US, jnp.minimum(us, MAX_STEP_US)).astype(I32)


def _coef(p: dict, terms):
    """int32[MAX_FORMS, len(terms), COEF_LIMBS]: the lane's coefficients of `terms`."""
    return jnp.asarray(p["time_coef"])[:, [FEATURES.index(n) for n in terms]]


def duration(p: dict, tokens, decoding, length, computed, terms: tuple = FEATURES):
    """int32[]: the step's duration in us (1 when the lane is untimed); the slots as in
    `_slot_features`; `terms`: the features any lane of the batch uses (static:
    `used_terms`), the only ones computed."""
    if not terms:
        return jnp.ones((), I32)
    if terms[0] == SCALED:
        us = (jnp.asarray(p["time_scaled"]) * _scalar_features(tokens, decoding)).sum(dtype=I32) // p["time_scale"]
        return jnp.where(p["timed"], jnp.maximum(us, 1), 1).astype(I32)
    us = exact_us(_coef(p, terms), _features(tokens, decoding, length, computed, terms)).max()
    return jnp.where(p["timed"], jnp.maximum(us, 1), 1).astype(I32)


def slot_shares(p: dict, tokens, decoding, length, computed, terms: tuple = FEATURES):
    """int32[S]: each slot's share of the step's time in us (--cost time), under the form
    that sets the step's duration (the first of the largest): trunc(the form's terms of the
    slot's own features), plus trunc(the form's per_step term) split evenly over the
    scheduled slots (the first `remainder` of them in slot order 1 us more). 0 where the
    slot is not scheduled or the lane untimed. The shares add up to the step's duration
    less each slot's truncation (under 1 us a slot). `terms` as in `duration`."""
    if not terms:
        return jnp.zeros(tokens.shape, I32)
    on = tokens > 0
    rank = jnp.cumsum(on.astype(I32)) - 1
    n = jnp.maximum(on.sum(dtype=I32), 1)
    if terms[0] == SCALED:
        c = jnp.asarray(p["time_scaled"])
        own = (c[:, None] * _scalar_slots(tokens, decoding)).sum(0, dtype=I32) // p["time_scale"]
        base = c[0] // p["time_scale"]
        split = base // n + (rank < base % n).astype(I32)
        return jnp.where(on & p["timed"], own + split, 0).astype(I32)
    coefs = _coef(p, terms)
    slots = _slot_features(tokens, decoding, length, computed, terms)  # once: the step's sums and the slots' shares
    whole = exact_us(coefs, _features(tokens, decoding, length, computed, terms, slots))  # [MAX_FORMS]
    coef = coefs[jnp.argmax(whole)]  # [F', COEF_LIMBS]
    step_row = (jnp.asarray([n == "per_step" for n in terms]))[:, None]
    own = exact_us(jnp.where(step_row, 0, coef)[None], slots)[:, 0]
    base = exact_us(coef[None], jnp.where(step_row, _limbs(jnp.ones((), I32), FEATURE_LIMBS), 0))[0]
    split = base // n + (rank < base % n).astype(I32)
    return jnp.where(on & p["timed"], own + split, 0).astype(I32)


def _decimal(value, key: str, source: str) -> Fraction:
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise InputError(f"{source}: {key} must be a number, got {str(value)[:24]!r}") from None
    if not d.is_finite() or d < 0 or len(str(value)) > 24:
        raise InputError(f"{source}: {key} must be a finite number >= 0 with at most 24 characters, got {value!r}")
    return Fraction(d)


def _terms(data, source: str) -> Form:
    if not isinstance(data, dict) or not data:
        raise InputError(f"{source}: a form is an object of terms ({', '.join(FEATURES)}: us per unit)")
    unknown = sorted(set(data) - set(FEATURES))
    if unknown:
        raise InputError(f"{source}: unknown term {unknown[0]!r} (terms: {', '.join(FEATURES)})")
    return _form({n: _decimal(v, n, source) for n, v in data.items()})


def from_dict(data: dict, name: str, source: str) -> StepTime:
    """A model from its JSON object: the linear keys b0, b1, b2, or `terms` (one form:
    {FEATURES name: decimal us}), or `max_of` (a list of MAX_FORMS forms: the step lasts the
    largest); a0 (int us, required), a1, a2 (int us, default 0), num_gpu_blocks, blis_engine
    (bool, default false), source."""
    shapes = ("b0, b1, b2", "terms", "max_of")
    if not isinstance(data, dict):
        raise InputError(f"{source}: a step-time model is an object with a0 and one of: {'; '.join(shapes)}")
    known = {*LINEAR, "terms", "max_of", *DELAYS, "num_gpu_blocks", "blis_engine", "source"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"{source}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(known))})")
    given = [s for s, keys in zip(shapes, (set(LINEAR), {"terms"}, {"max_of"})) if keys & set(data)]
    if len(given) != 1:
        raise InputError(f"{source}: give exactly one of: {'; '.join(shapes)}")
    if given[0] == "b0, b1, b2":
        missing = [k for k in LINEAR if k not in data]
        if missing:
            raise InputError(f"{source}: missing key {missing[0]!r}")
        forms = (_form({LINEAR[k]: _decimal(data[k], k, source) for k in LINEAR}),)
    elif given[0] == "terms":
        forms = (_terms(data["terms"], f"{source}: terms"),)
    else:
        if not isinstance(data["max_of"], list) or not 1 <= len(data["max_of"]) <= MAX_FORMS:
            raise InputError(f"{source}: max_of is a list of 1 to {MAX_FORMS} forms")
        forms = tuple(_terms(f, f"{source}: max_of[{i}]") for i, f in enumerate(data["max_of"]))
    if "a0" not in data:
        raise InputError(f"{source}: missing key 'a0'")
    delays = {}
    for key in DELAYS:
        v = data.get(key, 0)
        if type(v) is not int or not 0 <= v <= MAX_STEP_US:
            raise InputError(f"{source}: {key} must be an integer number of us in [0, {MAX_STEP_US}], got {v!r}")
        delays[key] = v
    blocks = data.get("num_gpu_blocks")
    if blocks is not None and (type(blocks) is not int or not 2 <= blocks <= INT32_MAX // 4):
        raise InputError(f"{source}: num_gpu_blocks must be an integer >= 2, got {blocks!r}")
    if type(data.get("blis_engine", False)) is not bool:
        raise InputError(f"{source}: blis_engine must be true or false")
    for form in forms:
        for c in form:
            _coef_limbs(c / 2)  # every coefficient fits the lane's exact sum (one more place for the halved ones)
    return StepTime(forms=forms, **delays, num_gpu_blocks=blocks, blis_engine=data.get("blis_engine", False), name=name)


def presets() -> dict[str, StepTime]:
    """The packaged presets by name."""
    text = resources.files("vtc_jax.servers").joinpath("presets/step_time.json").read_text()
    return {name: from_dict(v, name, "presets/step_time.json") for name, v in json.loads(text).items()
            if not name.startswith("_")}


def preset(name: str) -> StepTime:
    known = presets()
    if name not in known:
        raise InputError(f"unknown --preset {name!r}; choose one of {', '.join(known)}")
    return known[name]


def read_step_time(path) -> StepTime:
    """A user's model: a JSON object as `from_dict` reads."""
    text = read_text(path, what="step-time model")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    return from_dict(data, Path(path).name, str(path))
