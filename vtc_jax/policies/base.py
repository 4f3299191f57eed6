"""The policy component: what a scheduling policy is, in the style of optax's
`GradientTransformation` (a named bundle of small pure functions over a state of its own).

A policy decides which client's FIFO head is the admission candidate. The engine
(engine.py) owns everything MODEL.md fixes (queues, KV budget, charging W_k and the
MODEL.md counter c_k, completions, measures) and calls the policy's hooks at fixed points
of a step. Every hook is a pure function of one lane; the engine vmaps lanes.

  init(params, shape)                          -> state
  select(state, view, eligible, params)        -> Choice(client, has, state)
  on_arrival(state, view, arrivals, params)    -> (state, counter)
  on_admit(state, view, admission, params)     -> (state, estimate)
  on_step(state, view, step_end, params)       -> state
  on_complete(state, view, completion, params) -> state

`encode(settings, ctx)` (host) turns a lane's `Settings` into the traced params (a dict
of numpy arrays, one lane; the engine stacks lanes). `reference` is a slow, literal,
pure-Python version of the same rule (vtc_jax/testing/reference.py drives it), so that every policy
in the registry is fuzzed against its own reference. See docs/POLICIES.md.

Integer units (settings.py): a charge of x tokens is x * Q cost units (Q = the lane's cost
scale); the MODEL.md counter holds charges / weight in units of 1 / (Q * D), so a charge of
u cost units adds u * counter_mult[k]. Exact counters and tags are wide integers (wide.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients, wide
from vtc_jax.core.rows import ARRIVAL

I32 = jnp.int32


class Shape(NamedTuple):
    """Static facts a policy state may depend on: K clients, R workload rows, and `num`,
    the run's exact number format (wide.WIDE or wide.NARROW: make exact counters and tags
    with num.zeros and update them with num.add, num.maximum, ...), and `clock`, the dtype
    of the lane's clock (View.step; int32, or int64 for a wide clock, core/clock.py): a
    policy that keeps a time keeps it as `clock`."""

    num_clients: int
    num_rows: int
    num: Any = None
    clock: Any = jnp.int32


class Costs(NamedTuple):
    """A lane's exact prices. prefill, decode, context, time: int32[] (w_p, w_q, beta,
    w_time in cost units); counter_mult: int32[K] (D / omega_k); charge_cached: bool[]."""

    prefill: jax.Array
    decode: jax.Array
    context: jax.Array
    time: jax.Array
    counter_mult: jax.Array
    charge_cached: jax.Array


def step_charge(costs: Costs, work) -> jax.Array:
    """int32[K]: what a step charges each client (servers/base.py Work): w_q x decoded +
    beta x attended, plus w_time x its share of the step's time where the server keeps it
    (Work.time)."""
    charge = costs.decode * work.decoded + costs.context * work.attended
    return charge if work.time is None else charge + costs.time * work.time


class View(NamedTuple):
    """What a hook may read of the engine's state (one lane, read-only).

    num: the run's exact number format (wide.py); step: int32[] the step in progress; backlogged: bool[K] FIFO not empty;
    heads: int32[K, 5] each FIFO's head row (fields of workload.py; meaningful where
    backlogged); head_index: int32[K] the head's row in `Workload.requests`;
    counter: int32[K(, 2)] the MODEL.md counter c_k; running, context: int32[K]
    requests running and their KV tokens; last_left: int32[] (-1: none); costs: Costs;
    estimates: int32[K] the cost estimator's output prediction for each head;
    arrivals: the heads' arrival times, of the clock's dtype [K], where a wide clock's do not
    fit the rows' int32 ARRIVAL field (None: read heads[:, ARRIVAL]; `head_arrivals`);
    order: int32[K, 2] each head's place in the server's one waiting queue, compared as
    core/wide.WIDE pairs, where a server requeues preempted requests at its tail
    (engines/requeue.order_keys; None: ORDER, heads[:, ORDER]).
    """

    num: Any
    step: jax.Array
    backlogged: jax.Array
    heads: jax.Array
    head_index: jax.Array
    waiting: jax.Array
    counter: jax.Array
    running: jax.Array
    context: jax.Array
    last_left: jax.Array
    costs: Costs
    estimates: jax.Array
    arrivals: Any = None
    order: Any = None


def head_arrivals(view: View) -> jax.Array:
    """int32[K] (int64 with a wide clock): each head's arrival time."""
    return view.heads[:, ARRIVAL] if view.arrivals is None else view.arrivals


class Arrivals(NamedTuple):
    """One arrival event: the next W requests to arrive (in trace order, any clients);
    those with `joins` join their FIFO now. The hook is called on every event: `joins` is
    all False when nothing joins, and the hook must then leave its state unchanged (the
    engine does not mask its result).

    joins: bool[W]; client: int32[W]; index: int32[W] their workload rows; rows:
    int32[W, 5] and estimates: int32[W] output predictions at arrival (both only for
    policies with `arrival_rows`, else None); joining: int32[K] requests joining per
    client; newcomer: bool[K] the client was not backlogged before (only its first joining
    request can find it so); first: int32[] the newcomer whose first request comes first
    in trace order (valid if newcomer.any())."""

    joins: jax.Array
    client: jax.Array
    index: jax.Array
    rows: jax.Array | None
    estimates: jax.Array | None
    joining: jax.Array
    newcomer: jax.Array
    first: jax.Array


class Admission(NamedTuple):
    """An admitted request: client int32[], row int32[5], index int32[] (workload row),
    estimate int32[] (the estimator's output prediction now), prefill int32[] (its
    prefill charge in cost units)."""

    client: jax.Array
    row: jax.Array
    index: jax.Array
    estimate: jax.Array
    prefill: jax.Array


class StepEnd(NamedTuple):
    """The end of a step: decode: int32[K] each client's decode charge (cost units) in
    this step; elapsed: int32[] steps that passed (1, or more after an idle jump, during
    which nothing ran); detail: the server's Work.detail of the step (None unless the
    server gives one, e.g. slora's artifact charges)."""

    decode: jax.Array
    elapsed: jax.Array
    detail: Any = None


class Completion(NamedTuple):
    """A completed request: client, prompt, output, estimate (the value `on_admit`
    returned for it): int32[] each."""

    client: jax.Array
    prompt: jax.Array
    output: jax.Array
    estimate: jax.Array


class Choice(NamedTuple):
    """The candidate: client int32[], has bool[]; state: the policy state to admit from
    (a scan such as DRR's may change it; a blocked candidate keeps the old state). Values a
    later hook needs from the choice (for example the head's tag) belong in `state`:
    reading them again from a large table in `on_admit` could make XLA copy the table."""

    client: jax.Array
    has: jax.Array
    state: Any


@dataclasses.dataclass(frozen=True)
class EncodeContext:
    """Host-side facts `encode` may need for one lane: K, the cost scale Q, the weights
    (exact Fractions), counter_mult (D / omega_k ints) and its D."""

    num_clients: int
    cost_scale: int
    weights: tuple
    counter_mult: tuple
    counter_scale: int


@dataclasses.dataclass(frozen=True)
class Policy:
    """A scheduling policy (see the module docstring for each function's signature).

    Attributes:
      name: registry name (CLI choice, Settings.policy, results key).
      summary: one line for --help.
      reads: Settings fields the policy uses beyond M and the prices (for example
        "weights", "estimator", "lift_last_left", "options"); the CLIs refuse flags a
        policy would ignore. "prices": it prices a request by its tokens (w_p, w_q, beta)
        before or apart from the steps that run it, so it cannot charge GPU time
        (--cost time, Settings.w_time: known only as the steps run).
      options: {name: default} policy-specific options (Settings.options).
      uses_estimator: the policy predicts outputs (the estimator settings apply).
      counters: if the policy keeps a virtual counter of its own, `counters(state)`
        returns it (int32[K, 2], counter units; reported as `policy_counters`).
      validate: `validate(settings)` raises InputError for bad options.
      fuzz_options: `fuzz_options(rng) -> dict` random options for the random-lane tests
        (random.Random), so a new policy is fuzzed over its options too.
      arrival_rows: `on_arrival` reads the arriving requests' rows and estimates
        (Arrivals.rows, Arrivals.estimates); otherwise they are not gathered.
      quiet: a step in which nothing is admitted or completes and every arrival joins a
        client that is already backlogged changes neither the policy's state nor the
        engine's counters (no `on_step`; `on_arrival` ignores such joins): the engine may
        then run a stretch of such steps in one event (servers/base.py, quiet steps)
        without calling the hooks for them. False (the default) for any other policy.
    """

    name: str
    summary: str
    encode: Callable[..., dict]
    init: Callable[..., Any]
    select: Callable[..., Choice]
    on_arrival: Callable[..., tuple] | None = None
    on_admit: Callable[..., tuple] | None = None
    on_step: Callable[..., Any] | None = None
    on_complete: Callable[..., Any] | None = None
    reference: type | None = None
    reads: tuple[str, ...] = ()
    options: dict = dataclasses.field(default_factory=dict)
    uses_estimator: bool = False
    counters: Callable[[Any], jax.Array] | None = None
    validate: Callable[..., None] | None = None
    fuzz_options: Callable[..., dict] | None = None
    arrival_rows: bool = False
    quiet: bool = False

    # Defaults: a hook a policy does not define leaves its state alone.
    def arrive(self, state, view, arrivals, params):
        return (state, view.counter) if self.on_arrival is None else self.on_arrival(state, view, arrivals, params)

    def admit(self, state, view, admission, params):
        return (state, admission.estimate) if self.on_admit is None else self.on_admit(state, view, admission, params)

    def step(self, state, view, step_end, params):
        return state if self.on_step is None else self.on_step(state, view, step_end, params)

    def complete(self, state, view, completion, params):
        return state if self.on_complete is None else self.on_complete(state, view, completion, params)


# ---- helpers shared by policies -------------------------------------------------------

def no_params(settings, ctx) -> dict:
    """`encode` of a policy without parameters."""
    return {}


def no_state(params, shape: Shape):
    """`init` of a stateless policy."""
    return ()


def argmin_choice(key: jax.Array, eligible: jax.Array, state, num=None) -> Choice:
    """The eligible client with the smallest key (ties: smallest index). `key` is int32[K]
    (num None), or exact integers in the number format `num`."""
    client = (num or wide.NARROW).argmin(key, eligible)
    return Choice(client.astype(I32), over_clients.any_of(eligible), state)


def admissible(eligible: jax.Array, client: jax.Array) -> jax.Array:
    """bool[]: `client` (int32[]; or int32[W], giving bool[W]) is in [0, K) and `eligible`
    (bool[K]) lets it through. The engines admit a policy's choice only where this holds
    (a policy cannot bypass limits)."""
    k = eligible.shape[0]
    return (client >= 0) & (client < k) & eligible[jnp.clip(client, 0, k - 1)]


def onehot(client: jax.Array, num_clients: int, mask=True) -> jax.Array:
    """int32[K]: 1 at `client` where `mask`."""
    return ((jnp.arange(num_clients) == client) & mask).astype(I32)


# An event touches a few clients' entries. Below SCATTER_CLIENTS clients a select over all K
# is cheapest (it fuses with its neighbours); from there a scatter, which touches only those
# entries: under vmap over 512 lanes on XLA CPU, setting one row of int32[87, 5] costs 6 us
# by a scatter against 85 us by a select over K (at K = 2: 4 us against 3 us).
SCATTER_CLIENTS = 8


def _entries(x, clients, values, mask):
    """(clients int32[W], values [W, *x.shape[1:]], mask bool[W]) from one entry or W."""
    clients = jnp.asarray(clients, I32)
    one = clients.ndim == 0
    clients = clients.reshape(-1)
    values = jnp.asarray(values, x.dtype)
    values = jnp.broadcast_to(values[None] if one else values, clients.shape + x.shape[1:])
    mask = jnp.broadcast_to(jnp.asarray(mask, bool).reshape(-1), clients.shape)
    return clients, values, mask & (clients >= 0) & (clients < x.shape[0])  # (a scatter wraps negative indices)


def put_at(x: jax.Array, clients, values, mask=True) -> jax.Array:
    """x[K, ...] with x[clients[i]] = values[i] where mask[i] (clients int32[W] or int32[],
    values [W, ...] or one value); the clients where mask holds must be distinct, and a
    client outside [0, K) changes nothing."""
    clients, values, mask = _entries(x, clients, values, mask)
    k = x.shape[0]
    if k >= SCATTER_CLIENTS:
        return x.at[jnp.where(mask, clients, k)].set(values, mode="drop")
    for c, v, m in zip(clients, values, mask):  # W is static and small
        hit = (jnp.arange(k) == c) & m
        x = jnp.where(hit.reshape((k,) + (1,) * (x.ndim - 1)), v[None], x)
    return x


def add_at(x: jax.Array, clients, amounts, mask=True) -> jax.Array:
    """x[K, ...] plus amounts[i] at clients[i] where mask[i] (clients may repeat; shapes as
    `put_at`). Plain int32 sums only (exact wide counters: `put_at` of num.add)."""
    clients, amounts, mask = _entries(x, clients, amounts, mask)
    k = x.shape[0]
    if k >= SCATTER_CLIENTS:
        return x.at[jnp.where(mask, clients, k)].add(amounts, mode="drop")
    for c, v, m in zip(clients, amounts, mask):
        hit = (jnp.arange(k) == c) & m
        x = x + jnp.where(hit.reshape((k,) + (1,) * (x.ndim - 1)), v[None], 0).astype(x.dtype)
    return x


def lift(counter: jax.Array, backlogged: jax.Array, newcomer: jax.Array, first: jax.Array,
         last_left: jax.Array, use_last_left: jax.Array, num) -> jax.Array:
    """MODEL.md's lift rule over one arrival event, applied request by request in trace
    order, in closed form. If some client is backlogged when the event begins, every
    newcomer (a client that was not backlogged) is lifted to the minimum counter of the
    backlogged clients (each lifted counter is >= that minimum, so it never changes). If
    none is, the first newcomer in trace order is lifted to c_{last_left} (when
    `use_last_left` and last_left exists), and its counter is then the floor of every later
    newcomer. counter: exact int32[K(, 2)] in the number format `num`; returns the lifted
    counter."""
    has_last = use_last_left & (last_left >= 0)
    last_counter = counter[jnp.maximum(last_left, 0)]
    first_floor = num.where(has_last, num.maximum(counter[first], last_counter), counter[first])
    floor = num.where(over_clients.any_of(backlogged), num.min_of(counter, backlogged), first_floor)
    return num.where(newcomer, num.maximum(counter, floor), counter)


def i32(x) -> np.ndarray:
    """A host value as an int32 numpy array (checked: no silent wrap)."""
    a = np.asarray(x, dtype=np.int64)
    if (a > np.iinfo(np.int32).max).any() or (a < np.iinfo(np.int32).min).any():
        from vtc_jax.core.errors import InputError

        raise InputError(f"a setting needs {int(np.abs(a).max())} exact integer units, past the int32 limit")
    return a.astype(np.int32)


def decode_cost(costs: Costs, prompt, tokens):
    """Cost units of decoding `tokens` tokens after a `prompt`: w_q per token plus beta per
    context token (prompt + g for g < tokens)."""
    return costs.decode * tokens + costs.context * (tokens * prompt + tokens * (tokens - 1) // 2)


def prefill_cost(costs: Costs, rows):
    """Cost units of prefilling request rows (int32[..., 5]): w_p per computed prompt token
    (per sent token when Settings.charge_cached)."""
    from vtc_jax.core.rows import CACHED, PROMPT

    charged = jnp.where(costs.charge_cached, rows[..., PROMPT], rows[..., PROMPT] - rows[..., CACHED])
    return costs.prefill * charged


def estimated_cost(costs: Costs, rows, estimate):
    """Cost units of a request if its output were `estimate` tokens (at least 1 unit)."""
    from vtc_jax.core.rows import PROMPT

    return jnp.maximum(1, prefill_cost(costs, rows) + decode_cost(costs, rows[..., PROMPT], estimate))


def power(base: jax.Array, exponent: jax.Array) -> jax.Array:
    """float32 base ** exponent (int32 >= 0) by repeated squaring: multiplications only,
    in a fixed order, so a float32 reference reproduces it bit for bit."""
    result = jnp.ones_like(base)
    for bit in range(31):
        result = jnp.where((exponent >> bit) & 1, result * base, result)
        base = base * base
    return result


def flush_subnormal(x) -> np.float32:
    """x as XLA computes float32 (CPU and GPU flush subnormal results to zero); numpy keeps
    them, so a literal reference flushes where the engine's float32 values can get that small."""
    return np.float32(0) if abs(x) < np.finfo(np.float32).tiny else np.float32(x)


def reference_power(base, exponent: int):
    """Pure-Python (numpy float32) `power`, subnormals flushed as the engine's."""
    base, result = np.float32(base), np.float32(1.0)
    for bit in range(31):
        if (exponent >> bit) & 1:
            result = flush_subnormal(result * base)
        base = flush_subnormal(base * base)
    return result


def weight_scale(weights) -> int:
    """L: the least common multiple of the weights' denominators (L * w_k is an integer)."""
    import math

    out = 1
    for w in weights:
        out = out * w.denominator // math.gcd(out, w.denominator)
    return out
