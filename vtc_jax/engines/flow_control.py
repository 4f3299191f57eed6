"""The gateway's flow control as pure functions (/work/shared/ENGINE_FLEET.md section 3):
llm-d's utilization saturation detector, decided exactly, and its TTL and band-capacity
rules. Sources: llm-d/llm-d-router@ebab6879,
pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization/{detector,config}.go
and pkg/epp/flowcontrol/controller/internal/processor.go (dispatchCycle, hasCapacity,
isExpired).

Saturation (llm-d `Detector.Saturation`): each replica scores
max(W / queue_depth, KV / kv_threshold), KV = used / usable; the pool's saturation is the
mean over the replicas, 1 when there is none; the dispatch cycle dispatches nothing while
saturation >= 1 (the default band ceiling). A replica with missing or stale metrics scores
exactly 1 (llm-d fails closed). Defaults: queue_depth 5, kv_threshold 0.8.

Exactness. With kv_threshold = a / b (a fraction in lowest terms), U = usable and n
present replicas, multiply every score by D = q a U (q = queue_depth):
    score_r * D = max(a U W_r, q b u_r),    saturated  <=>  sum_r score_r * D >= n D.
Two clamps that cannot change the decision keep the integers small: W_r at n q and u_r at
n U (a replica scoring >= n makes the mean >= 1 alone, before and after its clamp, since
every score is >= 0 and b >= a). With the bounds of `saturation_params` (q, b <= 2^8),
U <= 2^24 and R <= 64 replicas, every product is < 2^46 and the sum < 2^52: they are
computed in two int32 words (value = high * 2^24 + low, the WIDE format of core/wide.py),
exact, no float. The usable KV is one number for the pool (every replica of a cluster lane
has the same M): a mean of fractions over different denominators has no common
denominator that fits fixed-width integers in general, so this module does not take one
per replica.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.wide import LOW_BITS, LOW_MASK, WIDE

I32 = jnp.int32
MAX_REPLICAS = 64
MAX_USABLE = 1 << 24
MAX_THRESHOLD_PART = 1 << 8
LLMD_QUEUE_DEPTH = 5
LLMD_KV_THRESHOLD = Fraction(4, 5)
HALF = 12  # operands are split into 12-bit halves


class SaturationParams(NamedTuple):
    """llm-d's detector thresholds as exact integers (int32[] each, or stacked per lane):
    queue_depth q (queueDepthThreshold, default 5), and the KV threshold kv_num / kv_den
    (kvCacheUtilThreshold in (0, 1], default 0.8 = 4 / 5, lowest terms)."""

    queue_depth: object
    kv_num: object
    kv_den: object


def saturation_params(queue_depth: int = LLMD_QUEUE_DEPTH, kv_threshold=LLMD_KV_THRESHOLD) -> SaturationParams:
    """Validated thresholds (host). queue_depth: an integer in [1, 256]; kv_threshold: a
    Fraction, int or decimal string (a float is read as the decimal it prints as: 0.8 is
    4/5) in (0, 1] whose lowest-terms denominator is at most 256 (llm-d refuses q <= 0 and
    a KV threshold outside (0, 1])."""
    integer = isinstance(queue_depth, (int, np.integer)) and not isinstance(queue_depth, bool)
    if not integer or not 1 <= queue_depth <= MAX_THRESHOLD_PART:
        raise InputError(f"queue depth threshold must be an integer in [1, {MAX_THRESHOLD_PART}], got {queue_depth!r}")
    try:
        kv = Fraction(str(kv_threshold)) if isinstance(kv_threshold, float) else Fraction(kv_threshold)
    except (TypeError, ValueError):
        raise InputError(f"KV threshold must be a fraction in (0, 1], got {kv_threshold!r}") from None
    if not 0 < kv <= 1 or kv.denominator > MAX_THRESHOLD_PART:
        raise InputError(f"KV threshold must be in (0, 1] with a denominator of at most {MAX_THRESHOLD_PART}, got {kv}")
    return SaturationParams(np.int32(queue_depth), np.int32(kv.numerator), np.int32(kv.denominator))


def wide_product(x, y):
    """x * y in two words (WIDE: int32[..., 2], high then low), exact for int32 arrays with
    0 <= x < 2^24, 0 <= y < 2^31 and x * y < 2^55 (each partial product fits int32)."""
    mask = (1 << HALF) - 1
    x1, x0, y1, y0 = x >> HALF, x & mask, y >> HALF, y & mask
    mid_a, mid_b = x1 * y0, x0 * y1  # < 2^24, < 2^31: shifted by 2^12 below
    low = x0 * y0 + ((mid_a & mask) << HALF) + ((mid_b & mask) << HALF)  # < 3 * 2^24
    high = (mid_a >> HALF) + (mid_b >> HALF) + x1 * y1 + (low >> LOW_BITS)
    return jnp.stack([high, low & LOW_MASK], axis=-1)


def saturation(waiting, kv_used, kv_usable, present, params: SaturationParams, stale=None):
    """bool[]: the pool is saturated (llm-d's mean score >= 1; no present replica: True).

    waiting: int32[R] waiting requests per replica (>= 0); kv_used: int32[R] used KV units
    (blocks or tokens, >= 0); kv_usable: int32[] the usable KV units of every replica, in
    [1, 2^24]; present: bool[R] the replicas of the pool; params: SaturationParams;
    stale: bool[R] or None, replicas whose metrics are missing or stale (score exactly 1).
    R <= 64. Exact (two-word integers, see the module docstring)."""
    r = present.shape[-1]
    if r > MAX_REPLICAS:
        raise InputError(f"saturation is exact for at most {MAX_REPLICAS} replicas, got {r}")
    q, a, b = (jnp.asarray(p, I32) for p in params)
    usable = jnp.asarray(kv_usable, I32)
    n = present.sum(axis=-1, dtype=I32)
    w = jnp.clip(waiting, 0, (n * q)[..., None])
    u = jnp.clip(kv_used, 0, (n * usable)[..., None])
    queue_term = wide_product(a[..., None] * w, usable[..., None])  # a U W_r
    kv_term = wide_product((q * b)[..., None], u)  # q b u_r
    score = WIDE.maximum(queue_term, kv_term)
    if stale is not None:
        score = jnp.where(stale[..., None], wide_product((q * a)[..., None], usable[..., None]), score)  # D: score 1
    score = jnp.where(present[..., None], score, 0)
    high, low = score[..., 0].sum(axis=-1), score[..., 1].sum(axis=-1)  # < 2^28, < 2^30
    total = jnp.stack([high + (low >> LOW_BITS), low & LOW_MASK], axis=-1)
    bound = wide_product(n * q * a, usable)  # n D
    return (n == 0) | ~WIDE.less(total, bound)


def shed_due(enqueue_us, now, ttl_us):
    """bool[N]: queued requests a TTL sweep at `now` sheds (llm-d isExpired: not
    now.Before(enqueue + ttl); a TTL <= 0 sheds nothing). enqueue_us: int32[N] enqueue
    times (<= now); now, ttl_us: int32[] microseconds. Written as now - enqueue >= ttl, which
    cannot overflow where enqueue + ttl could. The caller masks the requests still queued."""
    return (ttl_us > 0) & (now - enqueue_us >= ttl_us)


def over_capacity(queued, capacity):
    """bool: an arriving request is rejected because its band already holds `queued`
    requests (llm-d hasCapacity: Len + 1 > capacity; default 5000 per band). queued,
    capacity: int32 (any matching shapes); capacity <= 0: no limit."""
    return (capacity > 0) & (queued >= capacity)
