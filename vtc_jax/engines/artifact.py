"""The artifact engine profile's settings: the OSDI '24 VTC artifact's serving engine
(S-LoRA on LightLLM, Llama-2-7B on an A10G) described by named fields (`Profile`,
`StepTime`; defaults: the artifact's engine). The engine itself is the `slora` server
(vtc_jax/servers/slora.py) on the main engine (engine.py); `Profile.server_options()` gives
its options, and vtc_jax/driver/artifact_run.py maps the artifact's schedulers (`POLICIES`)
to registry policies. docs/ARTIFACT.md describes the model, its settings, its measures and
how it was validated.
"""

from __future__ import annotations


from __future__ import annotations

import dataclasses
import math

import numpy as np

from vtc_jax.core.errors import InputError

POLICIES = ("fcfs", "lcf", "vtc", "vtc_oracle", "vtc_predict", "rpm")
IDLE_RULES = ("poll", "jump")
NO_LIMIT = 1 << 30
NONE, DONE, REJECTED = 0, 1, 2  # per-request outcome
MAX_TOKENS = 1 << 20  # largest server input or output of one request
MAX_ARRIVAL_S = float(1 << 33)  # arrivals a trace may hold (the engine's clock refuses past ~1,074 s)
MAX_STEP_US = 1 << 29  # longest step (about 9 minutes): refused up front beyond (slora.MAX_STEP_US)
MAX_WINDOW_US = (1 << 29) - 1  # RPM window and idle poll period bound (about 9 minutes)


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


@dataclasses.dataclass(frozen=True)
class Config:
    """Static sizes of a group of lanes (the sweep driver's compile groups): num_requests
    N, num_clients K, slots S (a proven bound on requests holding KV at once, `slot_bound`)."""

    num_requests: int
    num_clients: int
    slots: int
