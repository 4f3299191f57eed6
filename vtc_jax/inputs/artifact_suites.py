"""Workload suites of the VTC artifact (fair_bench/exp_suite.py and fair_bench/trace.py),
named as in the artifact, as host-side trace generators for the artifact profile.

Each generator follows trace.py draw for draw with numpy's legacy generator
(`np.random.RandomState(seed)`, as the artifact's `np.random.seed(seed)`), so seed 42 (the
default of the artifact's run_exp.py) gives exactly the trace the artifact's GPU runs
served: same arrival times to the last bit, same lengths, same order. Other seeds give
other traces of the same suite.

  uniform   per client, int(rate * duration) requests: a random phase uniform in
            [0, 1/rate), then one request every 1/rate s (time accumulated by repeated
            addition, as trace.py), the first one phase + 1/rate; "on/off": client 0's
            requests in odd minutes are dropped;
  increase  client 0 every 1/rate s from 0; client 1's rate ramps linearly from 0.2 to its
            rate over the duration (int(0.5 (0.2 + rate) duration) requests), no randomness;
  poisson   int(total rate * duration) requests with exponential gaps at the total rate,
            each client 1 with probability rate_1 / total (short_long: client 0's lengths
            are a quarter; short_long_2: client 0's prompt and output are swapped);
  dist_shift three phases of duration / 3, each uniform (phase 1 with client 0 on/off).

Lengths are `randint(a, b)` (b exclusive: [256, 257] is exactly 256). Arrivals are not cut
at the duration: the last uniform request comes up to 1/rate after it, Poisson ones end
near it. The 360 s durations of overload, overload-multi and overload-weighted are those
of the artifact's revision runs (its final exp_suite.py lists overload at 600 s).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vtc_jax.core.errors import InputError

ARTIFACT_SEED = 42  # run_exp.py's default --seed: the traces of the artifact's own runs


@dataclasses.dataclass(frozen=True)
class Suite:
    """A suite as exp_suite.py declares it.

    Attributes:
      mode: "uniform", "increase", "poisson-short-long", "poisson-short-long-2", "dist_shift".
      rates: requests/s per client (dist_shift: unused, its phases are fixed).
      duration: seconds.
      input_range, output_range: randint bounds [a, b) of the lengths.
      on_off: client 0 silent in odd periods of this many seconds (None: never).
      weights: client weights of the weighted rows (None: all 1).
    """

    mode: str
    rates: tuple
    duration: float
    input_range: tuple = (256, 257)
    output_range: tuple = (256, 257)
    on_off: float | None = None
    weights: tuple | None = None

    @property
    def num_clients(self) -> int:
        return len(self.rates)

    def lengths(self, client: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """((prompt low, high), (output low, high)) of a client's requests (inclusive)."""
        (a, b), (c, d) = self.input_range, self.output_range
        if self.mode == "poisson-short-long" and client == 0:
            return (a // 4, (b - 1) // 4), (c // 4, (d - 1) // 4)
        if self.mode == "poisson-short-long-2" and client == 0:
            return (c, d - 1), (a, b - 1)
        return (a, b - 1), (c, d - 1)

    def max_requests(self) -> int:
        """Most requests one trace can hold."""
        if self.mode.startswith("poisson"):
            return int(sum(self.rates) * self.duration)
        if self.mode == "increase":
            return int(self.rates[0] * self.duration) + int(0.5 * (0.2 + self.rates[1]) * self.duration)
        if self.mode == "dist_shift":
            return sum(int(r * self.duration / 3) for phase in DIST_SHIFT_PHASES for r in phase[0])
        return sum(int(r * self.duration) for r in self.rates)


DIST_SHIFT_PHASES = (((0.5, 2.0), 60.0), ((1.0, 1.0), None), ((0.5, 1.5), None))  # (rates, on_off) per third

SUITES = {
    "overload": Suite("uniform", (1.5, 3.0), 360),
    "overload-multi": Suite("uniform", (0.4,) * 3 + (0.6,) * 5, 360),
    "overload-weighted": Suite("uniform", (0.8, 0.8, 1.2, 1.6), 360, weights=(1.0, 2.0, 3.0, 4.0)),
    "proportional": Suite("uniform", (0.25, 0.5, 1.5), 600),
    "on_off_less": Suite("uniform", (0.5, 2.0), 600, on_off=60),
    "on_off_overload": Suite("uniform", (2.0, 3.0), 600, on_off=60),
    "poisson_short_long": Suite("poisson-short-long", (8.0, 1.5), 600),
    "poisson_short_long_2": Suite("poisson-short-long-2", (8.0, 1.5), 600, input_range=(32, 33),
                                  output_range=(512, 513)),
    "increase": Suite("increase", (0.5, 2.0), 600),
    "dist_shift": Suite("dist_shift", (-1.0, -1.0), 900),
}


def _uniform(rs, rates, duration, input_range, output_range, on_off):
    """generate_requests_uniform: (client, prompt, output, t) tuples."""
    return _phase(rs, rates, duration, input_range, output_range, on_off, 0.0)


def _increase(rs, rates, duration, input_range, output_range):
    out = []
    total = int(rates[0] * duration)
    prompts = rs.randint(input_range[0], input_range[1], total)
    outputs = rs.randint(output_range[0], output_range[1], total)
    tic = 0.0
    for i in range(total):
        tic += 1 / rates[0]
        out.append((0, int(prompts[i]), int(outputs[i]), tic))
    start_rate, end_rate = 0.2, rates[1]
    total = int(0.5 * (start_rate + end_rate) * duration)
    prompts = rs.randint(input_range[0], input_range[1], total)
    outputs = rs.randint(output_range[0], output_range[1], total)
    tic = 0.0
    for i in range(total):
        current = start_rate + (end_rate - start_rate) * tic / duration
        tic += 1 / current
        out.append((1, int(prompts[i]), int(outputs[i]), tic))
    return out


def _poisson(rs, rates, duration, input_range, output_range, swap: bool):
    total = int(sum(rates) * duration)
    client = (rs.rand(total) > (rates[0] / (rates[0] + rates[1]))).astype(int)
    prompts = rs.randint(input_range[0], input_range[1], total)
    outputs = rs.randint(output_range[0], output_range[1], total)
    gaps = rs.gamma(1.0, 1.0 / sum(rates), total)  # cv = 1: shape 1, scale 1 / rate
    out, tic = [], 0.0
    for i in range(total):
        tic += gaps[i]
        if client[i] == 0:
            p, o = (int(outputs[i]), int(prompts[i])) if swap else (int(prompts[i]) // 4, int(outputs[i]) // 4)
        else:
            p, o = int(prompts[i]), int(outputs[i])
        out.append((int(client[i]), p, o, tic))
    return out


def generate(name: str, seed: int = ARTIFACT_SEED) -> dict:
    """One trace of suite `name` (seed 42: the artifact's own): {"arrival_s", "client",
    "prompt", "output"} in the artifact's order (sorted by time; ties keep generation
    order), plus "weights" (float[K]) and "num_clients"."""
    if name not in SUITES:
        raise InputError(f"unknown suite {name!r}; expected one of {', '.join(sorted(SUITES))}")
    if not 0 <= seed < 2**32:
        raise InputError(f"suite seed must be in [0, 2^32), got {seed}")
    s = SUITES[name]
    rs = np.random.RandomState(seed)
    if s.mode == "uniform":
        reqs = _uniform(rs, s.rates, s.duration, s.input_range, s.output_range, s.on_off)
    elif s.mode == "increase":
        reqs = _increase(rs, s.rates, s.duration, s.input_range, s.output_range)
    elif s.mode.startswith("poisson"):
        reqs = _poisson(rs, s.rates, s.duration, s.input_range, s.output_range, swap=s.mode.endswith("-2"))
    else:  # dist_shift
        reqs = []
        third = s.duration / 3
        for phase, (rates, on_off) in enumerate(DIST_SHIFT_PHASES):
            reqs += _phase(rs, rates, third, s.input_range, s.output_range, on_off, third * phase)
    if s.mode != "poisson-short-long" and s.mode != "poisson-short-long-2":
        reqs = sorted(reqs, key=lambda r: r[3])  # trace.py: sorted(requests) by req_time (stable)
    cols = np.asarray([r[:3] for r in reqs], np.int64).reshape(-1, 3)
    return {"arrival_s": np.asarray([r[3] for r in reqs], np.float64), "client": cols[:, 0], "prompt": cols[:, 1],
            "output": cols[:, 2], "weights": np.asarray(s.weights or (1.0,) * s.num_clients),
            "num_clients": s.num_clients}


def _phase(rs, rates, length, input_range, output_range, on_off, start):
    """int(rate * length) requests per client from `start` + a random phase, then every
    1/rate s (generate_requests_uniform, and each third of dist_shift)."""
    out = []
    for i, rate in enumerate(rates):
        total = int(rate * length)
        prompts = rs.randint(input_range[0], input_range[1], total)
        outputs = rs.randint(output_range[0], output_range[1], total)
        tic = start + rs.rand() * 1 / rate
        for j in range(total):
            tic += 1 / rate
            if on_off is not None and i == 0 and int(tic // on_off) & 1 == 1:
                continue
            out.append((i, int(prompts[j]), int(outputs[j]), tic))
    return out


def expected_requests(name: str, client: int) -> tuple[float, float]:
    """(expected number of requests of `client`, tolerance) in one trace of suite `name`."""
    s = SUITES[name]
    if s.mode.startswith("poisson"):
        total = int(sum(s.rates) * s.duration)
        p = s.rates[client] / sum(s.rates)
        return total * p, 5 * np.sqrt(total * p * (1 - p)) + 1
    if s.mode == "increase":
        return (float(int(s.rates[0] * s.duration)) if client == 0
                else float(int(0.5 * (0.2 + s.rates[1]) * s.duration))), 0.01
    phases = [(s.rates, s.on_off, 0.0, s.duration)] if s.mode == "uniform" else \
        [(r, o, i * s.duration / 3, s.duration / 3) for i, (r, o) in enumerate(DIST_SHIFT_PHASES)]
    total, tol = 0.0, 0.01
    for rates, on_off, start, length in phases:
        count = int(rates[client] * length)
        if on_off is not None and client == 0:  # only the even periods are heard
            edges = np.arange(start, start + length + on_off, on_off)
            lo, hi = np.maximum(edges[:-1], start), np.minimum(edges[1:], start + length)
            heard = sum(h - l for l, h in zip(lo, hi) if int(l // on_off) % 2 == 0 and h > l)
            count *= heard / length
            tol += 2
        total += count
    return total, tol


def lengths_bound(name: str) -> tuple[int, int]:
    """(smallest prompt, longest output) of any trace of suite `name`."""
    s = SUITES[name]
    ranges = [s.lengths(c) for c in range(s.num_clients)]
    return min(p[0] for p, _ in ranges), max(o[1] for _, o in ranges)
