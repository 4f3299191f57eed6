"""Real tenants: ServeGen's per-client production traces, read, planned and generated on device.

ServeGen (Xiang et al., NSDI '26; github.com/alibaba/ServeGen) publishes, per client
(tenant), one row per 600 s window (arrival rate, inter-arrival CV and a fitted Gamma or
Weibull) and, per 21600 s dataset window, the PMFs of prompt and output length. This module
turns such a directory into client-major request streams for the engine.

Modules: servegen_files.py reads a directory (`read_servegen`: the native layout and its
rules), this one plans (`plan`: the span, the load, the counts, the length tables),
servegen_device.py generates on device (`generate`: arrivals, lengths, the blocks). Users
import all three entry points from here.

Time (`plan`, host). W consecutive 600 s rows (default all) map linearly onto integer steps
[0, horizon): row w covers steps [b_w, b_{w+1}) with b_w = floor(w * horizon / W), so a
time x seconds into row w (0 <= x < 600) is step b_w + floor(x / 600 * (b_{w+1} - b_w))
(clamped into the row). On average one step is 600 * W / horizon seconds
(`seconds_per_step`). Needs horizon >= W, horizon / W <= 2^24 and horizon * K < 2^31.

Load. A request with prompt p and output o holds p + g KV tokens at its g-th decode step
(g = 1..o): demand(p, o) = o*p + o*(o+1)/2 token-steps. The server offers M = kv_budget
token-steps per step. One common factor s scales every client's rate so that
    sum_{k,w} x_kw * E_kw[demand] / horizon = load * M,   x_kw = s * rate_kw * 600,
where E_kw is the mean demand under client k's clipped prompt and output PMFs of the dataset
window in force at row w, prompt and output drawn independently:
E[demand] = E[o] E[p] + (E[o^2] + E[o]) / 2. `scale` is s; `native_load` is the load at
s = 1 (the data's own rates); `target` is x.

Counting (`counting=`): how many arrivals n_kw row w of client k gets from its x_kw.
  - "unbiased" (default): n_kw = floor(x) + Bernoulli(frac(x)), the Bernoulli drawn on device
    per client-row (its own key, below), so E[n_kw] = x_kw and every client with traffic
    appears in proportion, however much time is compressed. frac(x) is quantized to a
    multiple of 2^-32 (a uint32 threshold; error <= 2^-33 per row, and every reported
    expectation uses the quantized value), so expected_load = load (to ~1e-9). A row's
    capacity, the most it can get, is floor(x) + 1 (floor(x) when x is an integer, 0 when
    rate = 0). `match_load` is moot: the load equation is already exact in expectation.
  - "servegen": ServeGen's own rule (below), n_kw = max(ceil(x) - 1, 0), exact: capacity = n.
    Every active row gets x - ceil(x) + 1 in (0, 1] requests fewer than x, so the requests
    offer `expected_load` < `load`: close when rows hold many requests, far when s is
    small. vtc-jax compresses time (the whole sample on 20000 steps at M = 8192 and load 1:
    s = 1.5e-4, under one request per active row): expected_load 0.72, and the 76 of 87
    clients whose rows each get x < 1 send nothing; the unbiased rule there gives load 1
    and all 87 clients (about 52 of them present in a lane). With `match_load=True`, s is
    instead chosen (bisection) so that the servegen counts offer `load` as closely as
    integer counts allow.
`plan` reports per client `expected_requests` (E[n], exact), `max_requests` (capacity),
`appear` (P[n >= 1]), and `clients_expected` (clients with E[n] >= 1), `clients_possible`
(E[n] > 0), `expected_clients` (sum of `appear`), `expected_load`; `summary()` prints them.

Arrivals, as ServeGen's `servegen/construct.py` (`_sample_iats`, `generate_workload`) places
them: a row with n >= 1 arrivals draws n + 1 gaps, Gamma(shape=arg1, scale=arg2) or
Weibull(shape=arg1, scale=arg2); rescales them so all n + 1 sum to the window; places the
arrivals at the window start plus the first n running sums (the (n + 1)-th sum is the end
itself: ServeGen's "drop the last"; ServeGen decides it by float rounding, here it is always
dropped). Under "servegen" counting n + 1 = ceil(x) (an x within 1e-6 above an integer counts
as that integer, so that s = 1 gives exactly the rate x 600 of the data despite float
noise); a row with n = 0 draws nothing. Positions become steps by floor, as above.

Where this differs from ServeGen's construct.py (read at alibaba/ServeGen): (0) the default
count is "unbiased" (ServeGen's is "servegen"); (1) one common s for all rows (ServeGen's
`rate_fn` may give every row its own aggregate target; a common s is the special case
rate_fn[t] = s * sum_k rate_kt); (2) the last arrival is always dropped (ServeGen compares
float64 sums with the end, so it is kept when rounding puts it below);
(3) ceil tolerates float noise (ServeGen's ceil(rate * 600) is one more than the data's
count in 88 of the sample's rows, where rate * 600 = n + 2e-13; with the drop, ServeGen
then emits exactly n there and n - 1 elsewhere); (4) prompt and output take independent
uniforms (ServeGen's `_sample_data_batch` feeds the same uniform to every field's inverse
CDF, which makes prompt and output comonotone); (5) rate > 0 without a pattern, a trace
without dataset and unreadable PMFs are errors (ServeGen skips or fails later); (6) ServeGen
loads PMF strings with `eval`.

Lengths. Prompts are clipped to `max_prompt` (default kv_budget: a longer prompt could never
be admitted) and outputs to `max_output` (default 16384, twice the longest output in the
shipped sample, 8192); the clipped probability mass per client is reported (request-
weighted over its rows). PMFs are sampled by inverse CDF: each is stored as thresholds
round(CDF * 2^32) (uint32) and a uniform 32-bit word picks the first entry whose threshold
exceeds it, so probabilities are multiples of 2^-32, and every mean the plan reports is
computed with these quantized probabilities (exact for the generator).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs.servegen_device import ServeGenLayout, ServeGenParams, check_lane_bytes
from vtc_jax.inputs.servegen_files import WINDOW_SECONDS, ServeGenData, merge_pmf
from vtc_jax.inputs.workload import INT32_MAX
# The reader and the generator: users import them from here (module doc).
from vtc_jax.inputs.servegen_device import generate  # noqa: F401
from vtc_jax.inputs.servegen_files import read_servegen  # noqa: F401

I32, U32, F32 = jnp.int32, jnp.uint32, jnp.float32

DEFAULT_MAX_OUTPUT = 16384
COUNT_TOLERANCE = 1e-6
MAX_WINDOW_STEPS = 1 << 24
_TWO32 = 1 << 32


# ---- plan ---------------------------------------------------------------------------------

COUNTINGS = ("unbiased", "servegen")


@dataclasses.dataclass(frozen=True)
class ServeGenPlan:
    """What `plan` decided (host). K clients (data order), W rows of the chosen span.

    Attributes:
      client_ids: int64[K];  substituted: bool[K].
      counting: "unbiased" or "servegen" (the module doc's counting rules).
      load, kv_budget, horizon, max_prompt, max_output, pad: as requested (defaults filled).
      rows: (first, stop) row indices of the span;  timestamps: int64[W] its row starts.
      scale: the common rate factor s;  seconds_per_step: 600 * W / horizon.
      native_load: the load at s = 1 (the data's own rates: rate_kw * 600 requests per row).
      bounds: int64[W + 1] step boundaries b_w.
      target: float64[K, W] x_kw = s * rate_kw * 600, the load equation's requests per row.
      base: int64[K, W] arrivals certain in the row (unbiased: floor(x); servegen:
        max(ceil(x) - 1, 0));  extra: float64[K, W] the probability of one more (unbiased:
        frac(x) quantized to a multiple of 2^-32; servegen: 0);  capacity: int64[K, W]
        the most arrivals the row can get, base + (extra > 0).
      expected_requests: float64[K] E[requests] per client, sum_w base + extra (exact).
      max_requests: int64[K] its capacity, sum_w capacity (its block holds this + pad rows).
      appear: float64[K] probability that the client sends at least one request in a lane.
      demand: float64[K, W] E_kw[demand] (token-steps; 0 where idle).
      expected_load: the expected offered demand of the generated requests / (M * horizon),
        exact (unbiased: `load` up to the 2^-32 quantization of `extra`).
      mean_prompt, mean_output: float64[K] the mean length per generated request (pooled
        over lanes: expected requests per row as weights; exact);  var_prompt, var_output:
        float64[K, W] per row.
      prompt_clipped, output_clipped: float64[K] PMF mass above the caps, request-weighted
        over the client's rows (weights x); zero_raised: float64[K] likewise for length-0
        mass raised to 1 (prompt and output added).
      params: the device inputs;  layout: the static layout.
    """

    client_ids: np.ndarray
    substituted: np.ndarray
    counting: str
    load: float
    kv_budget: int
    horizon: int
    max_prompt: int
    max_output: int
    pad: int
    rows: tuple[int, int]
    timestamps: np.ndarray
    scale: float
    native_load: float
    seconds_per_step: float
    bounds: np.ndarray
    target: np.ndarray
    base: np.ndarray
    extra: np.ndarray
    capacity: np.ndarray
    expected_requests: np.ndarray
    max_requests: np.ndarray
    appear: np.ndarray
    demand: np.ndarray
    expected_load: float
    mean_prompt: np.ndarray
    mean_output: np.ndarray
    var_prompt: np.ndarray
    var_output: np.ndarray
    prompt_clipped: np.ndarray
    output_clipped: np.ndarray
    zero_raised: np.ndarray
    params: ServeGenParams
    layout: ServeGenLayout

    @property
    def num_clients(self) -> int:
        return int(self.client_ids.shape[0])

    @property
    def num_rows(self) -> int:
        """Rows of a lane's output, real requests and padding."""
        return self.layout.num_rows

    @property
    def clients_expected(self) -> int:
        """Clients with at least one expected request (expected_requests >= 1)."""
        return int((self.expected_requests >= 1).sum())

    @property
    def clients_possible(self) -> int:
        """Clients that can send a request at all (expected_requests > 0)."""
        return int((self.expected_requests > 0).sum())

    @property
    def expected_clients(self) -> float:
        """Expected number of clients with at least one request in a lane (sum of `appear`)."""
        return float(self.appear.sum())

    def summary(self) -> str:
        """A few lines on the counts and the load, for logs."""
        e = self.expected_requests
        return (f"ServeGen plan ({self.counting} counting): {self.num_clients} clients, rows {self.rows[0]}.."
                f"{self.rows[1] - 1} on {self.horizon} steps (1 step = {self.seconds_per_step:.4g} s), "
                f"s = {self.scale:.4g}\n"
                f"  expected requests {e.sum():.1f} per lane (capacity {int(self.max_requests.sum())}); "
                f"clients with >= 1 expected request: {self.clients_expected}, with any: {self.clients_possible}, "
                f"expected present per lane: {self.expected_clients:.1f}\n"
                f"  expected requests per client: min {e.min():.3g}, median {np.median(e):.3g}, max {e.max():.4g}\n"
                f"  offered load: expected {self.expected_load:.6g} (target {self.load:g}, native {self.native_load:.4g})")


def _table(values: np.ndarray, probs: np.ndarray, cap: int):
    """Clip at `cap`, merge, quantize: (values int64[n], thresholds uint32[n], quantized
    probabilities float64[n], clipped mass)."""
    clipped = float(probs[values > cap].sum())
    v, p = merge_pmf(np.minimum(values, cap), probs)
    cum = np.cumsum(p)
    cum = cum / cum[-1]
    c = np.minimum(np.rint(cum * _TWO32), _TWO32 - 1).astype(np.int64)
    c[-1] = _TWO32 - 1
    edges = np.concatenate([[0], c[:-1], [_TWO32]]).astype(np.float64)
    q = np.diff(edges) / _TWO32
    return v, c.astype(np.uint32), q, clipped


def _moments(v: np.ndarray, q: np.ndarray) -> tuple[float, float, float]:
    v = v.astype(np.float64)
    return float(q @ v), float(q @ v ** 2), float(q @ v ** 3)


def block_layout(plan: ServeGenPlan) -> tuple[np.ndarray, np.ndarray]:
    """(first int32[K], size int32[K]): client k's rows are [first_k, first_k + size_k),
    its real requests first (sorted by arrival), then at least `pad` padding rows."""
    size = np.asarray(plan.layout.sizes, np.int64)
    first = np.concatenate([[0], np.cumsum(size)[:-1]])
    return first.astype(np.int32), size.astype(np.int32)


def _servegen_counts(x: np.ndarray, active: np.ndarray) -> np.ndarray:
    """int64: ServeGen's arrivals per row, ceil(x) - 1 (at least 0), x within COUNT_TOLERANCE
    above an integer counting as that integer."""
    return np.maximum(np.where(active, np.ceil(x - COUNT_TOLERANCE), 0) - 1, 0).astype(np.int64)


def _unbiased_counts(x: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(base int64, extra uint32 threshold): floor(x) + Bernoulli(threshold / 2^32), the
    threshold round(frac(x) * 2^32); one that rounds to 2^32 becomes a certain arrival."""
    x = np.where(active, x, 0.0)
    base = np.floor(x)
    thr = np.rint((x - base) * _TWO32).astype(np.int64)
    base = base.astype(np.int64) + (thr >= _TWO32)
    thr = np.where(thr >= _TWO32, 0, thr)
    return base, thr.astype(np.uint32)


def _match_load(offered, load: float, s0: float) -> float:
    """The s whose offered(s) (nondecreasing step function) is closest to `load`."""
    lo, hi = 0.0, s0
    for _ in range(200):
        if offered(hi) >= load:
            break
        lo, hi = hi, hi * 2
    else:
        raise InputError(f"load {load} cannot be reached by scaling the rates")
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if offered(mid) < load else (lo, mid)
    return hi if abs(offered(hi) - load) <= abs(offered(lo) - load) else lo


def _positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def plan(data: ServeGenData, *, load: float, kv_budget: int, horizon: int,
         windows: tuple[int, int] | None = None, max_prompt: int | None = None,
         max_output: int | None = None, match_load: bool = False, counting: str = "unbiased",
         pad: int = 0) -> ServeGenPlan:
    """Scale, count and encode a span of `data` for the device; see the module doc.

    Args:
      load: RHO > 0, offered KV demand over capacity (the factor s is set from it).
      kv_budget: M, KV tokens (token-steps per step).
      horizon: steps the span maps onto.
      windows: (first, stop) row indices, half-open; default all rows.
      max_prompt: prompt cap (default kv_budget);  max_output: output cap (default 16384).
      match_load: only matters for counting="servegen": False (default) takes s from the
        load equation of the module doc, so the generated requests offer `expected_load`
        <= about `load`; True makes `expected_load` as close to `load` as the integer counts
        allow (bisection on s; the residual is at most one row's mean demand /
        (M * horizon)). Under "unbiased" counting the load equation's s already gives
        expected_load = load, so it is used either way.
      counting: "unbiased" (default): floor(x) + Bernoulli(frac(x)) arrivals per row, E = x;
        "servegen": ServeGen's ceil(x) - 1.
      pad: padding rows every client's block ends in, at least (the engine reads up to
        arrival_width + 1 rows past a client's last arrived row; callers pass that).
    """
    m = _positive_int(kv_budget, "kv_budget")
    h = _positive_int(horizon, "horizon")
    pad = _positive_int(pad, "pad", minimum=0)
    cap_p = m if max_prompt is None else _positive_int(max_prompt, "max_prompt")
    cap_o = DEFAULT_MAX_OUTPUT if max_output is None else _positive_int(max_output, "max_output")
    if counting not in COUNTINGS:
        raise InputError(f"counting must be one of {', '.join(COUNTINGS)}, got {counting!r}")
    if isinstance(load, bool) or not isinstance(load, (int, float, np.floating, np.integer)) \
            or not math.isfinite(load) or load <= 0:
        raise InputError(f"load must be a finite number > 0, got {load!r}")
    load = float(load)
    first, stop = (0, data.num_windows) if windows is None else tuple(windows)
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (first, stop)) \
            or not 0 <= first < stop <= data.num_windows:
        raise InputError(f"windows must be (first, stop) with 0 <= first < stop <= {data.num_windows}, "
                         f"got {windows!r}")
    first, stop = int(first), int(stop)
    k, w = data.num_clients, stop - first
    if h < w:
        raise InputError(f"horizon {h} is shorter than the {w} rows it must hold (one step per row at least)")
    if -(-h // w) > MAX_WINDOW_STEPS:
        raise InputError(f"horizon {h} gives over {MAX_WINDOW_STEPS} steps per 600 s row (float32 positions)")
    if h * k > INT32_MAX:
        raise InputError(f"horizon x clients = {h * k} overflows the arrival * K + k sort key (int32)")
    rate = data.rate[:, first:stop]
    lengths = data.lengths[:, first:stop]
    active = rate > 0

    # Per dataset window in use: clipped, quantized tables and their moments.
    used = sorted(set(int(x) for x in lengths[active]))
    tables, stats = [], {}
    for p in used:
        pmf = data.pmfs[p]
        pv, pc, pq, p_clip = _table(pmf.prompt_values, pmf.prompt_probs, cap_p)
        ov, oc, oq, o_clip = _table(pmf.output_values, pmf.output_probs, cap_o)
        tables += [(pv, pc), (ov, oc)]
        (e_p, e_p2, _), (e_o, e_o2, _) = _moments(pv, pq), _moments(ov, oq)
        stats[p] = dict(e_p=e_p, v_p=e_p2 - e_p ** 2, e_o=e_o, v_o=e_o2 - e_o ** 2,
                        demand=e_o * e_p + (e_o2 + e_o) / 2, p_clip=p_clip, o_clip=o_clip,
                        raised=pmf.prompt_raised + pmf.output_raised)

    def per_row(name):
        lut = np.zeros(len(data.pmfs))
        for p_, st in stats.items():
            lut[p_] = st[name]
        return np.where(active, lut[np.maximum(lengths, 0)], 0.0)

    demand = per_row("demand")
    native = rate * WINDOW_SECONDS
    total = float((native * demand).sum())
    if total <= 0:
        raise InputError(f"rows {first}..{stop - 1} hold no requests: nothing to scale to load {load}")
    s = load * m * h / total
    if counting == "servegen" and match_load:
        s = _match_load(lambda s_: (_servegen_counts(s_ * native, active) * demand).sum() / (m * h), load, s)
    x = s * native
    check_lane_bytes(float(np.ceil(x).sum()) + pad * k)  # the most rows, before counts become integers
    if counting == "servegen":
        base, thr = _servegen_counts(x, active), np.zeros(x.shape, np.uint32)
    else:
        base, thr = _unbiased_counts(x, active)
    extra = thr.astype(np.float64) / _TWO32
    capacity = base + (thr > 0)
    max_requests = capacity.sum(axis=1)
    sizes = max_requests + pad
    check_lane_bytes(int(sizes.sum()))
    num_gaps = int(np.where(capacity > 0, capacity + 1, 0).sum())
    if num_gaps > INT32_MAX // 2:
        raise InputError(f"{num_gaps} gaps to draw: over the int32 index limit")
    mean_n = base + extra
    appear = np.where(base.sum(axis=1) > 0, 1.0, 1.0 - np.prod(1.0 - extra, axis=1))

    def weighted(values, weights):
        tot = weights.sum(axis=1)
        return np.where(tot > 0, (values * weights).sum(axis=1) / np.where(tot > 0, tot, 1), 0.0)

    bounds = (np.arange(w + 1, dtype=np.int64) * h) // w
    lut = np.zeros(len(data.pmfs), np.int32)
    lut[used] = 2 * np.arange(len(used))
    pt = np.where(active, lut[np.maximum(lengths, 0)], 0).astype(np.int32)
    ot = np.where(active, pt + 1, 0).astype(np.int32)
    table_sizes = np.asarray([len(v) for v, _ in tables] or [1], np.int64)
    starts = np.concatenate([[0], np.cumsum(table_sizes)[:-1]])
    flat_v = np.concatenate([v for v, _ in tables]) if tables else np.ones(1, np.int64)
    flat_c = np.concatenate([c for _, c in tables]) if tables else np.full(1, _TWO32 - 1, np.uint32)
    pattern = data.pattern[:, first:stop].astype(np.int32)
    params = ServeGenParams(
        base=jnp.asarray(base, I32), extra=jnp.asarray(thr, U32),
        client_id=jnp.asarray(data.client_ids.astype(np.uint32)),
        stamp=jnp.asarray(data.timestamps[first:stop].astype(np.uint32)),
        start=jnp.asarray(bounds[:-1], I32), length=jnp.asarray(np.diff(bounds), I32),
        pattern=jnp.asarray(pattern), shape=jnp.asarray(np.where(active, data.shape[:, first:stop], 1.0), F32),
        log_scale=jnp.asarray(np.log(np.where(active, data.scale[:, first:stop], 1.0)), F32),
        prompt_table=jnp.asarray(pt), output_table=jnp.asarray(ot),
        table_start=jnp.asarray(starts, I32), table_size=jnp.asarray(table_sizes, I32),
        thresholds=jnp.asarray(flat_c.astype(np.uint32)), values=jnp.asarray(flat_v, I32))
    layout = ServeGenLayout(k, w, int(capacity.sum()), num_gaps, tuple(int(r) for r in sizes), pad,
                            int(table_sizes.max()).bit_length() + 1, h)
    return ServeGenPlan(
        client_ids=data.client_ids.copy(), substituted=data.substituted.copy(), counting=counting, load=load,
        kv_budget=m, horizon=h, max_prompt=cap_p, max_output=cap_o, pad=pad, rows=(first, stop),
        timestamps=data.timestamps[first:stop].copy(), scale=s, native_load=total / (m * h),
        seconds_per_step=WINDOW_SECONDS * w / h, bounds=bounds, target=x, base=base, extra=extra,
        capacity=capacity, expected_requests=mean_n.sum(axis=1), max_requests=max_requests, appear=appear,
        demand=demand, expected_load=float((mean_n * demand).sum()) / (m * h),
        mean_prompt=weighted(per_row("e_p"), mean_n), mean_output=weighted(per_row("e_o"), mean_n),
        var_prompt=per_row("v_p"), var_output=per_row("v_o"),
        prompt_clipped=weighted(per_row("p_clip"), x), output_clipped=weighted(per_row("o_clip"), x),
        zero_raised=weighted(per_row("raised"), x), params=params, layout=layout)
