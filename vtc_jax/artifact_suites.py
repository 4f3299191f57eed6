"""Workload suites of the VTC artifact (fair_bench/exp_suite.py), named as in
shared/ENGINE_ARTIFACT.md, as host-side trace generators for the artifact profile.

"uniform" arrivals: deterministic, every 1/rate seconds per client after a random phase
uniform in [0, 1/rate). Lengths [a, b] are numpy randint(a, b) (b exclusive: [256, 257] is
exactly 256). "on/off": client 0 is silent in every odd minute (its arrivals there are
dropped). A ramp (suite "increase") places arrivals where the integrated rate crosses
phase + j. Poisson suites draw exponential gaps at the total rate and assign client 0 with
the given probability.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Segment:
    """Client arrivals over [start, end): uniform at `rate` (or a ramp rate -> rate_end),
    with client 0 silent in odd minutes when `on_off`."""

    start: float
    end: float
    rates: tuple
    on_off: bool = False
    ramp_to: tuple | None = None


@dataclasses.dataclass(frozen=True)
class Suite:
    num_clients: int
    duration: float
    segments: tuple  # of Segment (uniform suites)
    prompt: tuple  # per client (a, b)
    output: tuple
    weights: tuple | None = None
    poisson: tuple | None = None  # (total rate, probability of client 0)


def _same(n, r=(256, 257)):
    return tuple([r] * n)


SUITES = {
    "overload": Suite(2, 360, (Segment(0, 360, (1.5, 3.0)),), _same(2), _same(2)),
    "overload-multi": Suite(8, 360, (Segment(0, 360, (0.4,) * 3 + (0.6,) * 5),), _same(8), _same(8)),
    "overload-weighted": Suite(4, 360, (Segment(0, 360, (0.8, 0.8, 1.2, 1.6)),), _same(4), _same(4),
                               weights=(1.0, 2.0, 3.0, 4.0)),
    "proportional": Suite(3, 600, (Segment(0, 600, (0.25, 0.5, 1.5)),), _same(3), _same(3)),
    "on_off_less": Suite(2, 600, (Segment(0, 600, (0.5, 2.0), on_off=True),), _same(2), _same(2)),
    "on_off_overload": Suite(2, 600, (Segment(0, 600, (2.0, 3.0), on_off=True),), _same(2), _same(2)),
    "poisson_short_long": Suite(2, 600, (), ((64, 65), (256, 257)), ((64, 65), (256, 257)),
                                poisson=(9.5, 8 / 9.5)),
    "poisson_short_long_2": Suite(2, 600, (), ((512, 513), (32, 33)), ((32, 33), (512, 513)),
                                  poisson=(9.5, 8 / 9.5)),
    "increase": Suite(2, 600, (Segment(0, 600, (0.5, 0.2), ramp_to=(0.5, 2.0)),), _same(2), _same(2)),
    "dist_shift": Suite(2, 900, (Segment(0, 300, (0.5, 2.0), on_off=True), Segment(300, 600, (1.0, 1.0)),
                                 Segment(600, 900, (0.5, 1.5))), _same(2), _same(2)),
}


def _segment_arrivals(seg: Segment, client: int, rng) -> np.ndarray:
    r0 = seg.rates[client]
    r1 = seg.ramp_to[client] if seg.ramp_to else r0
    length = seg.end - seg.start
    total = (r0 + r1) / 2 * length  # integrated rate
    phase = rng.uniform(0, 1)
    counts = phase + np.arange(int(np.ceil(total)) + 1)
    counts = counts[counts < total]
    if r1 == r0:
        t = counts / r0
    else:  # solve r0 t + (r1 - r0) t^2 / (2 length) = c
        a = (r1 - r0) / (2 * length)
        t = (-r0 + np.sqrt(r0 * r0 + 4 * a * counts)) / (2 * a)
    t = seg.start + t
    if seg.on_off and client == 0:
        t = t[(t // 60) % 2 == 0]
    return t


def generate(name: str, seed: int = 0) -> dict:
    """One trace of suite `name`: {"arrival_s", "client", "prompt", "output"} sorted by
    arrival, plus "weights" (float[K]) and "num_clients"."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; expected one of {sorted(SUITES)}")
    s = SUITES[name]
    rng = np.random.default_rng(seed)
    if s.poisson:
        rate, p0 = s.poisson
        gaps = rng.exponential(1 / rate, int(rate * s.duration * 1.5) + 100)
        arrival = np.cumsum(gaps)
        arrival = arrival[arrival < s.duration]
        client = np.where(rng.random(arrival.size) < p0, 0, 1)
    else:
        parts = [(_segment_arrivals(seg, c, rng), c) for seg in s.segments for c in range(s.num_clients)]
        arrival = np.concatenate([a for a, _ in parts])
        client = np.concatenate([np.full(a.size, c) for a, c in parts])
    order = np.lexsort((client, arrival))
    arrival, client = arrival[order], client[order]
    prompt = np.empty(arrival.size, np.int64)
    output = np.empty(arrival.size, np.int64)
    for c in range(s.num_clients):
        mine = client == c
        prompt[mine] = rng.integers(*s.prompt[c], mine.sum())
        output[mine] = rng.integers(*s.output[c], mine.sum())
    return {"arrival_s": arrival, "client": client, "prompt": prompt, "output": output,
            "weights": np.asarray(s.weights or (1.0,) * s.num_clients), "num_clients": s.num_clients}


def expected_requests(name: str, client: int) -> tuple[float, float]:
    """(expected number of requests of `client`, tolerance) in one trace of suite `name`."""
    s = SUITES[name]
    if s.poisson:
        rate, p0 = s.poisson
        mean = rate * s.duration * (p0 if client == 0 else 1 - p0)
        return mean, 5 * np.sqrt(mean) + 1
    total, tol = 0.0, 0.0
    for seg in s.segments:
        r0 = seg.rates[client]
        r1 = seg.ramp_to[client] if seg.ramp_to else r0
        if seg.on_off and client == 0:
            minutes = [m for m in range(int(seg.start // 60), int(np.ceil(seg.end / 60))) if m % 2 == 0]
            total += sum(r0 * (min(seg.end, 60 * m + 60) - max(seg.start, 60 * m)) for m in minutes)
            tol += len(minutes)
        else:
            total += (r0 + r1) / 2 * (seg.end - seg.start)
            tol += 1
    return total, tol + 0.01
