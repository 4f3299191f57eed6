"""vtc_jax/engines/flow_control.py: llm-d's saturation detector, decided exactly, and the
TTL and band-capacity rules (/work/shared/ENGINE_FLEET.md section 3).

* section 7's case: (W, KV) = (2, 0.5), (10, 0.1) with the defaults gives
  (0.625 + 2.0) / 2 = 1.3125 >= 1;
* llm-d's own cases, ported as assertions: pkg/epp/framework/plugins/flowcontrol/
  saturationdetector/utilization/detector_test.go (TestDetector_Saturation,
  TestUtilizationDetectorFactory), llm-d/llm-d-router@ebab6879;
* the decision against a Fraction reference on random inputs, and on inputs placed at the
  exact point where the decision flips (where a float32 mean goes wrong).
"""

from __future__ import annotations

import random
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.engines.flow_control import (
    LLMD_KV_THRESHOLD,
    LLMD_QUEUE_DEPTH,
    MAX_REPLICAS,
    MAX_USABLE,
    over_capacity,
    saturation,
    saturation_params,
    shed_due,
)

R = MAX_REPLICAS


def pool_score(waiting, used, usable, present, q, kv, stale=None) -> Fraction:
    """llm-d's Detector.Saturation in exact rationals: the mean over the present replicas
    of max(W / q, (used / usable) / kv), a stale replica scoring 1; no replica: 1."""
    stale = stale or [False] * len(waiting)
    scores = [Fraction(1) if s else max(Fraction(w, q), Fraction(u, usable) / kv)
              for w, u, p, s in zip(waiting, used, present, stale) if p]
    return sum(scores, Fraction(0)) / len(scores) if scores else Fraction(1)


def _pad(xs, fill=0):
    return list(xs) + [fill] * (R - len(xs))


def decide(waiting, used, usable, present=None, params=None, stale=None) -> bool:
    present = [True] * len(waiting) if present is None else present
    st = None if stale is None else jnp.asarray(_pad(stale, False))
    return bool(saturation(jnp.asarray(_pad(waiting), jnp.int32), jnp.asarray(_pad(used), jnp.int32), jnp.int32(usable),
                           jnp.asarray(_pad(present, False)), params or saturation_params(), stale=st))


def test_section_7_case():
    # (W, KV) = (2, 0.5), (10, 0.1), defaults 5 and 0.8: (0.625 + 2.0) / 2 = 1.3125.
    assert pool_score([2, 10], [5, 1], 10, [True, True], 5, Fraction(4, 5)) == Fraction(21, 16)
    assert decide([2, 10], [5, 1], 10)
    assert not decide([2, 2], [5, 1], 10)  # (0.625 + 0.4) / 2 < 1


def test_defaults_are_llmds():
    # config.go: DefaultQueueDepthThreshold 5, DefaultKVCacheUtilThreshold 0.8;
    # TestUtilizationDetectorFactory "empty config applies defaults".
    assert (LLMD_QUEUE_DEPTH, LLMD_KV_THRESHOLD) == (5, Fraction(4, 5))
    assert tuple(int(x) for x in saturation_params()) == (5, 4, 5)
    assert tuple(int(x) for x in saturation_params(5, 0.9)) == (5, 9, 10)


@pytest.mark.parametrize("kwargs", [{"queue_depth": 0}, {"kv_threshold": 1.5}, {"kv_threshold": 0.0},
                                    {"queue_depth": True}, {"kv_threshold": "x"}, {"kv_threshold": Fraction(1, 257)}])
def test_bad_thresholds_are_refused(kwargs):
    # TestUtilizationDetectorFactory: "invalid queue depth" (0), "invalid kv cache high"
    # (1.5), "invalid kv cache low" (0.0) fail; plus our own bounds.
    with pytest.raises(InputError):
        saturation_params(**kwargs)


# detector_test.go TestDetector_Saturation: config Queue = 5, KV = 0.90. KV usage is
# used / 100 here. (name, [(W, used, stale)], llm-d's wantSaturation)
DETECTOR_CASES = [
    ("No candidate pods", [], 1.0),
    ("Single pod with good capacity", [(2, 50, False)], 0.5 / 0.9),
    ("Single pod with stale metrics", [(1, 10, True)], 1.0),
    ("Single pod with high queue depth", [(10, 10, False)], 2.0),
    ("Single pod with high KV cache utilization", [(1, 95, False)], 0.95 / 0.90),
    ("Single pod with nil metrics", [(0, 0, True)], 1.0),
    ("Multiple pods, all good capacity", [(1, 10, False), (0, 20, False)], (0.2 + (0.2 / 0.9)) / 2.0),
    ("Multiple pods, one good, one stale", [(1, 10, False), (0, 20, True)], 0.6),
    ("Multiple pods, one good, one bad (high queue)", [(1, 10, False), (15, 20, False)], 1.6),
    ("Multiple pods, all bad capacity", [(1, 10, True), (20, 20, False), (1, 99, False)], (1.0 + 4.0 + 1.1) / 3.0),
    ("Queue depth exactly at threshold", [(5, 10, False)], 1.0),
    ("Metrics age just over staleness threshold", [(1, 10, True)], 1.0),
]


@pytest.mark.parametrize("name, pods, want", DETECTOR_CASES, ids=[c[0] for c in DETECTOR_CASES])
def test_llmd_detector_cases(name, pods, want):
    waiting, used, stale = [p[0] for p in pods], [p[1] for p in pods], [p[2] for p in pods]
    exact = pool_score(waiting, used, 100, [True] * len(pods), 5, Fraction(9, 10), stale)
    assert float(exact) == pytest.approx(want, abs=1e-4)  # llm-d's InDelta(1e-4)
    # the dispatch cycle stops at saturation >= 1 (its default band ceiling)
    assert decide(waiting, used, 100, params=saturation_params(5, Fraction(9, 10)), stale=stale) == (exact >= 1)


def test_absent_replicas_do_not_count():
    # the mean is over the present replicas: an absent one with a huge queue changes nothing
    assert not decide([1, 1000], [10, 100], 100, present=[True, False])
    assert decide([1, 1000], [10, 100], 100, present=[True, True])
    assert decide([7, 7], [0, 0], 100, present=[False, False])  # none present: llm-d's 1.0


def _random_case(rng: random.Random):
    """(waiting, used, usable, present, stale, q, kv) within flow_control's bounds, often
    with huge values (the clamps) and often near the decision."""
    n = rng.randint(1, R)
    q = rng.choice([1, 5, rng.randint(1, 256)])
    kv = rng.choice([Fraction(4, 5), Fraction(9, 10), Fraction(1), Fraction(rng.randint(1, 255), 256),
                     Fraction(rng.randint(1, 97), 97)])
    kv = min(kv, Fraction(1))
    usable = rng.choice([1, 100, rng.randint(1, MAX_USABLE)])
    big = (1 << 31) - 1
    level = rng.choice([Fraction(1, 2), Fraction(1), Fraction(3, 2), Fraction(2)])  # spreads the mean around 1
    waiting = [rng.randint(0, big) if rng.random() < 0.01 else rng.randint(0, int(level * q)) for _ in range(n)]
    used = [rng.randint(0, big) if rng.random() < 0.01 else rng.randint(0, min(usable, int(level * kv * usable)))
            for _ in range(n)]
    present = [rng.random() < 0.9 for _ in range(n)]
    stale = [rng.random() < 0.05 for _ in range(n)]
    return waiting, used, usable, present, stale, q, kv


def _at_the_flip(rng: random.Random):
    """A case moved to the exact point where the decision flips: the last present replica's
    KV used is the least that saturates the pool (or W when the KV term cannot), so one
    unit less does not."""
    while True:
        waiting, used, usable, present, stale, q, kv = _random_case(rng)
        present[-1], stale[-1], waiting[-1] = True, False, 0
        lo, hi = 0, usable * len(waiting)
        used[-1] = hi
        if pool_score(waiting, used, usable, present, q, kv, stale) < 1:
            continue
        while lo < hi:  # the least used[-1] that saturates
            mid = (lo + hi) // 2
            used[-1] = mid
            lo, hi = (mid + 1, hi) if pool_score(waiting, used, usable, present, q, kv, stale) < 1 else (lo, mid)
        used[-1] = lo
        if lo > 0:
            return waiting, used, usable, present, stale, q, kv


def _batch(cases):
    cols = list(zip(*cases))
    waiting = np.asarray([_pad(w) for w in cols[0]], np.int32)
    used = np.asarray([_pad(u) for u in cols[1]], np.int32)
    usable = np.asarray(cols[2], np.int32)
    present = np.asarray([_pad(p, False) for p in cols[3]])
    stale = np.asarray([_pad(s, False) for s in cols[4]])
    params = [saturation_params(q, kv) for q, kv in zip(cols[5], cols[6])]
    stacked = type(params[0])(*(np.asarray(x, np.int32) for x in zip(*params)))
    run = jax.jit(jax.vmap(saturation, in_axes=(0, 0, 0, 0, 0, 0)))
    return np.asarray(run(waiting, used, usable, present, stacked, stale))


def test_exact_against_fractions_on_random_inputs():
    rng = random.Random(7)
    cases = [_random_case(rng) for _ in range(1500)]
    flips = []
    for _ in range(300):
        case = _at_the_flip(rng)
        flips.append(case)
        below = list(case)
        below[1] = case[1][:-1] + [case[1][-1] - 1]
        flips.append(tuple(below))
    cases += flips
    got = _batch(cases)
    want = [pool_score(w, u, us, p, q, kv, s) >= 1 for w, u, us, p, s, q, kv in cases]
    assert got.tolist() == want
    assert 200 < sum(want[:1500]) < 1300  # both outcomes, plenty of each, on the random part
    # The flips are sharp: a float32 mean gets some of them wrong (the test would catch it).
    wrong = 0
    for w, u, us, p, s, q, kv in flips:
        f32 = np.float32
        scores = [f32(1) if st else max(f32(a) / f32(q), (f32(b) / f32(us)) / f32(float(kv)))
                  for a, b, pr, st in zip(w, u, p, s) if pr]
        wrong += bool(f32(sum(scores, f32(0))) / f32(len(scores)) >= 1) != (pool_score(w, u, us, p, q, kv, s) >= 1)
    assert wrong > 0


def test_shed_due():
    # processor.go isExpired: expired when !now.Before(enqueue + ttl); a budget <= 0 never
    # expires. TTL 60 s in microseconds.
    ttl = jnp.int32(60_000_000)
    enq = jnp.asarray([0, 1, 5_000_000, 0], jnp.int32)
    assert shed_due(enq, jnp.int32(60_000_000), ttl).tolist() == [True, False, False, True]
    assert not shed_due(enq, jnp.int32(60_000_000), jnp.int32(0)).any()
    # Near the int32 limit, where enqueue + ttl would wrap around.
    top = (1 << 31) - 1
    late = jnp.asarray([top - 10, top - 4], jnp.int32)
    assert shed_due(late, jnp.int32(top), jnp.int32(5)).tolist() == [True, False]


def test_over_capacity():
    # processor.go hasCapacity: rejected when Len + 1 > capacity (5000 per band by default).
    queued = jnp.asarray([0, 4999, 5000, 7000], jnp.int32)
    assert over_capacity(queued, jnp.int32(5000)).tolist() == [False, False, True, True]
    assert not over_capacity(queued, jnp.int32(0)).any()  # no limit
