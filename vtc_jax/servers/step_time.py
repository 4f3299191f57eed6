"""How long a server's step takes: a linear model in exact integer microseconds.

A step that computes `prefill` prompt tokens (recomputed ones included) and `decode`
decode tokens lasts T = max(1, trunc(b0 + b1 * prefill + b2 * decode)) us, and a request
joins the waiting queue a0 us after it arrives (the API server's and tokenizer's share of
the latency). The coefficients are exact decimals: each is scaled by a common power of ten
to an integer, so T is exact integer arithmetic in int32 (a model whose largest step could
wrap is refused before the run, naming the limit). Presets are data
(`presets/step_time.json`: BLIS's fits of vLLM on an H100), and a user gives their own in
a file of the same keys.

Options (Settings.server_options of a timed server): time_b0, time_b1, time_b2 (scaled
integers) and time_scale (the power of ten; 0: untimed, a step lasts 1).
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
KEYS = ("b0", "b1", "b2", "a0")


@dataclasses.dataclass(frozen=True)
class StepTime:
    """b0 (us per step), b1 (us per prefill token), b2 (us per decode token): exact
    Fractions; a0: int us from arrival to the waiting queue; num_gpu_blocks: the KV pool the
    fit was measured with (None if not given); name: where it came from."""

    b0: Fraction
    b1: Fraction
    b2: Fraction
    a0: int
    num_gpu_blocks: int | None = None
    name: str = "custom"

    def options(self) -> tuple:
        """The server options that encode it (scaled integers, exact)."""
        scale = 1
        for b in (self.b0, self.b1, self.b2):
            while (b * scale).denominator != 1:
                scale *= 10
        return (("time_b0", int(self.b0 * scale)), ("time_b1", int(self.b1 * scale)),
                ("time_b2", int(self.b2 * scale)), ("time_scale", scale))

    def check(self, budget: int, seats: int) -> None:
        """InputError if the longest step (a full budget of prefill, every seat decoding)
        could pass int32 arithmetic or MAX_STEP_US."""
        _, b0, _, b1, _, b2, _, scale = (x for pair in self.options() for x in pair)
        worst = b0 + b1 * budget + b2 * seats
        if worst > INT32_MAX or worst // scale > MAX_STEP_US:
            raise InputError(f"step-time model {self.name}: its longest step ({budget} prefill tokens, {seats} "
                             f"decoding) is {float(worst / scale):.4g} us in units of 1/{scale} us, past exact int32 "
                             "arithmetic: give fewer decimals or smaller coefficients")


    def step_us(self, prefill: int, decode: int) -> int:
        """The duration in us of a step computing `prefill` prompt and `decode` decode
        tokens, as the lane computes it: max(1, trunc(b0 + b1 prefill + b2 decode))."""
        return max(1, int(self.b0 + self.b1 * prefill + self.b2 * decode))

    def longest_step(self, budget: int, seats: int) -> int:
        """The longest step in us: a full token budget of prefill with every seat decoding."""
        return self.step_us(budget, seats)

    def drain_floor(self, arrival_us, prompt, output, budget: int, cached=None) -> int:
        """A lower bound in us on the clock when the log has drained (every request
        finished), whatever the schedule: the larger of

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

    def check_drain(self, arrival_us, prompt, output, budget: int, limit: int = MAX_CLOCK_US, cached=None) -> None:
        """InputError, one line, before the run, if the log cannot drain within `limit` us
        of the lane's clock whatever the schedule (`drain_floor`): such a run would spend its
        time only to end with every lane flagged as not finished."""
        floor = self.drain_floor(arrival_us, prompt, output, budget, cached)
        if floor > limit:
            raise InputError(f"step-time model {self.name}: this log needs at least {floor:,} us ({floor / 6e7:,.1f} "
                             f"minutes) of the server's clock to drain, past the {limit:,} us a timed run's "
                             "clock holds: give smaller coefficients (a0, b0, b1, b2) or a shorter log (--time-window)")


def _decimal(value, key: str, source: str) -> Fraction:
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise InputError(f"{source}: {key} must be a number, got {str(value)[:24]!r}") from None
    if not d.is_finite() or d < 0 or len(str(value)) > 24:
        raise InputError(f"{source}: {key} must be a finite number >= 0 with at most 24 characters, got {value!r}")
    return Fraction(d)


def from_dict(data: dict, name: str, source: str) -> StepTime:
    if not isinstance(data, dict):
        raise InputError(f"{source}: a step-time model is an object with keys {', '.join(KEYS)}")
    unknown = sorted(set(data) - set(KEYS) - {"num_gpu_blocks", "source"})
    if unknown:
        raise InputError(f"{source}: unknown key {unknown[0]!r} (keys: {', '.join(KEYS)}, num_gpu_blocks, source)")
    missing = [k for k in KEYS if k not in data]
    if missing:
        raise InputError(f"{source}: missing key {missing[0]!r}")
    a0 = data["a0"]
    if type(a0) is not int or not 0 <= a0 <= MAX_STEP_US:
        raise InputError(f"{source}: a0 must be an integer number of us in [0, {MAX_STEP_US}], got {a0!r}")
    blocks = data.get("num_gpu_blocks")
    if blocks is not None and (type(blocks) is not int or not 2 <= blocks <= INT32_MAX // 4):
        raise InputError(f"{source}: num_gpu_blocks must be an integer >= 2, got {blocks!r}")
    return StepTime(*(_decimal(data[k], k, source) for k in ("b0", "b1", "b2")), a0=a0, num_gpu_blocks=blocks,
                    name=name)


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
    """A user's model: a JSON object with b0, b1, b2 (us, decimals) and a0 (int us)."""
    text = read_text(path, what="step-time model")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    return from_dict(data, Path(path).name, str(path))


def duration(p: dict, prefill, decode):
    """int32[]: the step's duration in us (1 when the lane is untimed: time_scale 0)."""
    scale = jnp.maximum(p["time_scale"], 1)
    total = p["time_b0"] + p["time_b1"] * prefill + p["time_b2"] * decode
    return jnp.where(p["time_scale"] > 0, jnp.maximum(total // scale, 1), 1).astype(I32)
