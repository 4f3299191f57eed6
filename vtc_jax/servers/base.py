"""The server component: what one simulated server does with the requests a policy admits.

A server is a small bundle of pure functions with its own per-lane state (a pytree of fixed
shape), as a policy is (policies/base.py) and as optax's GradientTransformation is. The
engine (engines/engine.py) owns the queues, the clock, the policy and the measures; it asks
the server only these questions, each for ONE lane (vmap adds the lane axis):

  init(shape) -> state                            an empty server;
  load(state) -> Load                             per client: requests running and the
                                                  context they hold (what policies and
                                                  routers see);
  fits(state, params, row, *, generated) -> bool[]
                                                  would admitting this request row now
                                                  respect the server's memory and limits?
                                                  (`generated`: as in `admit`)
  admit(state, params, row, client, value, step, mask, *, index, generated)
        -> (state, overflow)                      start the request where `mask`; `value`
                                                  is the policy's per-request int32 (given
                                                  back at completion), `index` its row in
                                                  the workload, `generated` the tokens it
                                                  had generated before a preemption (0 for
                                                  a new request); overflow: a fixed
                                                  structure was full (the lane is flagged);
  end_step(state, params, mask) -> (state, Work)  the step's computation where `mask`: the
                                                  tokens it computed, per client, for the
                                                  engine to charge, and how long it took;
  busy(state) -> bool[]                           something runs (or is about to be reported
                                                  finished): the clock may not jump;
  due(state, step) -> bool[]                      a request finished by the end of step
                                                  `step - 1` has not left yet;
  complete(state, step, mask) -> (state, Finished)  the next such request leaves;
  census(host_state, num_clients) -> int64[B, K]  host side, after a run: the requests each
                                                  lane's structure holds per client (the
                                                  conservation check counts them there, not
                                                  from the counters it checks).

A server that preempts (`preempts=True`) also has

  begin_step(state, params, view, step, mask) -> (state, Requeue)
                                                  the step's start, after arrivals and
                                                  before admissions: the running requests'
                                                  work is scheduled and victims leave; the
                                                  engine puts each back at the front of its
                                                  client's queue (engines/requeue.py).

Host side, each server also has

  validate(options: dict) -> None                 InputError for settings it cannot run
                                                  (`Settings.server_options`);
  encode(options: dict) -> dict                   its traced params (`Params.server`);
  plan_slots(options: list[dict], bound, requests) -> int
                                                  running slots it needs, given the
                                                  driver's bound on requests running when
                                                  each holds its whole prompt, and the most
                                                  requests of a lane;
  never_served(options, prompt, output, kv_budget) -> str | None
                                                  why some request could never finish here
                                                  (the run is refused), or None;
  drain_steps(options, arrival, prompt, output, limit) -> int
                                                  steps that surely drain such a trace;
  fuzz_options(rng, prompt, output) -> dict       random valid settings for such a trace
                                                  (random.Random; the registry-wide tests
                                                  fuzz every policy on every server with it).

Optional: `fits_client=True` (the engine passes the candidate's client to `fits` as
`client=`), `wake(params, now, next_arrival) -> int32[]` (when a server with nothing to do
starts again; default: at the next arrival), `max_horizon` (the longest drain horizon the
driver may plan, in the lane's time unit; default 2^30 - 1), `wide_clock` (True: every
stamp it keeps is of ServerShape.clock's dtype, so it runs a wide clock's arrivals, past
2^30, core/clock.py) and `Work.detail` (facts of a step its policies may read, as
StepEnd.detail).

Optionally, `request_times(host_state) -> (first, finish)`: host side, the first-token and
finish times the server keeps per request number (ORDER), int arrays [..., R] (-1: not
yet); the cluster reports them per request (its replicas number requests by dispatch).

Optionally, quiet steps, so that the engine runs a stretch of steps in which nothing is
admitted or completes in one event (a step whose only news is decode):

  quiet_steps(state, params, step, smallest_prompt, limit: int) -> int32[]
                                                  right after step `step`'s end_step: the
                                                  n in [0, limit] steps after it in which no
                                                  request finishes (none at the end of steps
                                                  `step` .. `step + n - 1`) and no request
                                                  of at least `smallest_prompt` prompt
                                                  tokens would fit;
  run_quiet(state, params, steps) -> (state, Work)
                                                  `steps` (int32[] >= 0) such steps at once:
                                                  the state and Work (summed) after them, as
                                                  `steps` calls of end_step would leave them.

Optionally, `slot_tiers(slots) -> tuple[int, ...]`: smaller slot counts to try first. A
server whose events cost O(slots) and whose runs hold far fewer requests than its proven
bound gives them: the driver runs every lane with the first, then reruns with the next
only the lanes that overflowed (`admit`'s flag), so a server that offers tiers must keep
a lane that never overflowed exactly as it would be with more slots, its unused slots
as its `init` leaves them (the driver widens the smaller state with them).

Optionally, `static_options(options: list[dict]) -> tuple`: hashable (name, value) pairs
that hold for every lane of a batch (ServerShape.static, so its `init` can keep them as
static fields): what no lane uses can then be left out of the compiled program.

`events_per_step` (int) is how many events a step takes besides its admissions, arrivals
and completions (the driver sizes its event budget with it).

`params` is the lane's engine Params (engines/settings.py): a server reads the settings it
needs from it (the ideal server: `kv_budget`). The engine charges `Work` with the lane's
costs, so servers know nothing about fairness. The registry (servers/registry.py) is the
one list of server names. docs/SERVERS.md has the contract and a worked example.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from vtc_jax.core import clock


@dataclasses.dataclass(frozen=True)
class ServerShape:
    """Static sizes of one server (changing one recompiles).

    Attributes:
      num_clients: K.
      calendar_rows: rows of a completion calendar (the longest output + 1).
      slots: running-request slots (>= the most requests that can run at once).
      num_rows: R, rows of the workload (a server may keep a table per request).
      log_steps: steps of schedule a server keeps a log of (0: none).
      static: the server's static settings, (name, value) pairs from its `static_options`
        of every lane's options (empty: none given, the server assumes any lane); a server
        that keeps each token's time (`TokenTimes`) reads its size T there, `token_times`.
      wide_clock: the lane's clock is int64 (core/clock.py): a server keeps its stamps as
        `clock` (its counts stay int32).
    """

    num_clients: int
    calendar_rows: int
    slots: int
    num_rows: int = 0
    log_steps: int = 0
    static: tuple = ()
    wide_clock: bool = False

    @property
    def clock(self):
        """The dtype of the server's stamps (int32, or int64 for a wide clock)."""
        return clock.dtype(self.wide_clock)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Load:
    """running: int32[K] requests running per client; context: int32[K] the tokens they
    hold (prompt + generated so far)."""

    running: jax.Array
    context: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Work:
    """What one step computed, per client: decoded: int32[K] tokens decoded; attended:
    int32[K] the context tokens those decodes read (the engine charges w_q * decoded +
    beta * attended); elapsed: int32[] the step's duration in the lane's time unit (the
    ideal server: 1 step); detail: optional server-specific facts of the step that a
    policy may read (StepEnd.detail; None: none); time: int32[K] each client's share of the
    step's time in us (--cost time: step_time.slot_shares; None: not kept); emptied: bool[]
    the step finished every request it ran, on a server that then frees the engine from the
    step's start (BLIS's event order, the vllm servers' `blis_engine` option; None: never);
    requeue: a Requeue of the requests the step retracted, which go to the TAIL of the waiting
    queue in its order (a server with `requeue_to_tail`, SGLang's; None: none); overflow:
    bool[] the step could not run as the modelled engine would (out of memory, a fixed
    structure full): the lane is flagged as not finished (None: never)."""

    decoded: jax.Array
    attended: jax.Array
    elapsed: jax.Array
    detail: Any = None
    time: Any = None
    emptied: Any = None
    requeue: Any = None
    overflow: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Requeue:
    """Requests a step preempted, in the order they go back (the last one is served first
    again), over the server's S slots: mask bool[S]; client, index (workload row),
    generated (tokens generated before the preemption) int32[S]. (The request's row is
    the workload's row `index`: the engine reads it there, so no server carries rows.)"""

    mask: jax.Array
    client: jax.Array
    index: jax.Array
    generated: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Finished:
    """A request that left: client, prompt, output and the policy's value (int32[] each)."""

    client: jax.Array
    prompt: jax.Array
    output: jax.Array
    value: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenTimes:
    """Each output token's time, a per-token record a server may keep (the vLLM servers
    do) when its shape asks for it: ("token_times", T) in ServerShape.static, T > 0; else
    its arrays are empty and nothing is written, so a run without it pays nothing.
    at: int32[T], workload row r's token g (0-based) at at[offset[r] + g], the server's
    stamp of the step that sampled it (-1: not yet); offset: int32[R] each row's first
    entry, handed out at its first admission (-1: not yet); used: int32[] entries handed
    out, saturating at T (a row whose offset + output passes T keeps only the tokens that
    fit: the host reads only whole records, and nothing wraps)."""

    at: jax.Array
    offset: jax.Array
    used: jax.Array


def prefix_sum(x: jax.Array) -> jax.Array:
    """Inclusive prefix sum of int32[..., S] over its last axis as log2(S) shifted adds
    (Hillis-Steele): on XLA CPU a few fused passes, where jnp.cumsum's associative scan is
    many small ops (servers' slot scans, the engine's requeue)."""
    shift = 1
    while shift < x.shape[-1]:
        x = x + jnp.pad(x[..., :-shift], [(0, 0)] * (x.ndim - 1) + [(shift, 0)])
        shift *= 2
    return x


def select_fields(mask, new, old, skip: tuple[str, ...]):
    """`new` where `mask`, else `old` (dataclasses of one type), field by field in field
    order, but for the fields in `skip` (taken from `new` as they are: tables written by
    masked scatters) and those `new` left untouched. (Field order, not a set's: a set's
    order follows Python's hash seed, and the traced program with it, so the compilation
    cache missed in every new process.)"""
    return dataclasses.replace(new, **{f.name: jnp.where(mask, getattr(new, f.name), getattr(old, f.name))
                                       for f in dataclasses.fields(new)
                                       if f.name not in skip and getattr(new, f.name) is not getattr(old, f.name)})


def token_times(shape: ServerShape) -> TokenTimes:
    """An empty record of T = shape.static's `token_times` entries (0: none) for R rows."""
    size = int(dict(shape.static).get("token_times", 0))
    return TokenTimes(at=jnp.full(size, -1, shape.clock), offset=jnp.full(shape.num_rows if size else 0, -1, jnp.int32),
                      used=jnp.zeros((), jnp.int32))


def token_rows(times: TokenTimes, index, output, mask) -> TokenTimes:
    """Where `mask` and row `index` (int32[]) has no entries yet: its `output` entries,
    the next ones (a readmission after a preemption keeps its first ones)."""
    size, rows = times.at.shape[0], times.offset.shape[0]
    if size == 0:
        return times
    new = mask & (times.offset[jnp.clip(index, 0, rows - 1)] < 0)
    return TokenTimes(at=times.at, offset=times.offset.at[jnp.where(new, index, rows)].set(times.used, mode="drop"),
                      used=jnp.where(new, jnp.minimum(times.used + output, size), times.used))


def token_stamps(times: TokenTimes, index, generated, stamp, mask) -> TokenTimes:
    """Per slot (int32[S] index: workload row, generated: tokens before this one) where
    `mask` (bool[S]: the slot samples): its token `generated` gets `stamp` (int32[])."""
    size, rows = times.at.shape[0], times.offset.shape[0]
    if size == 0:
        return times
    first = times.offset[jnp.clip(index, 0, rows - 1)]
    at = jnp.where(mask & (first >= 0), first + generated, size)  # past T: dropped
    return dataclasses.replace(times, at=times.at.at[at].set(stamp, mode="drop"))


@dataclasses.dataclass(frozen=True)
class Server:
    """A server component (see the module docstring for each function's contract)."""

    name: str
    description: str
    init: Callable[[ServerShape], Any]
    load: Callable[[Any], Load]
    fits: Callable[..., jax.Array]
    admit: Callable[..., tuple[Any, jax.Array]]
    end_step: Callable[..., tuple[Any, Work]]
    due: Callable[[Any, jax.Array], jax.Array]
    complete: Callable[..., tuple[Any, Finished]]
    census: Callable[[Any, int], Any]
    busy: Callable[[Any], jax.Array]
    validate: Callable[[dict], None]
    encode: Callable[[dict], dict]
    plan_slots: Callable[[list, int], int]
    never_served: Callable[..., str | None]
    drain_steps: Callable[..., int]
    events_per_step: int = 1
    fuzz_options: Callable[..., dict] | None = None
    preempts: bool = False
    begin_step: Callable[..., tuple[Any, Requeue]] | None = None
    # SGLang's retraction: its victims leave at the step's end (Work.requeue) for the TAIL of the waiting queue
    # (engines/requeue.Tails), where vLLM's go back to the front at the step's start
    requeue_to_tail: bool = False
    # refused(state, params, row, *, generated, mask) -> state: the step's admissions end because this candidate
    # did not fit (a server that remembers a refusal, SGLang's sticky batch_is_full); None: nothing to tell
    refused: Callable[..., Any] | None = None
    # model_options(model: step_time.StepTime, options) -> options: its settings filled in from a step-time model
    # (the KV pool the model names, the GPU's defaults) and the model checked against them; None: vLLM's rule
    # (cli/timed_compare.server_settings: num_gpu_blocks and the H100 defaults)
    model_options: Callable[..., dict] | None = None
    # arrival_order(arrival, rows) -> int64[N]: a replay's trace rows in the order the server's queue takes
    # same-step arrivals (SGLang's golden harness: request ids as strings), for a server whose replays read
    # iteration traces with prefix groups; None: the file's order
    arrival_order: Callable[..., Any] | None = None
    # its lanes run under JAX's 64-bit mode (SGLang's new-token ratio and budgets are doubles); counts stay int32
    x64: bool = False
    fits_client: bool = False  # `fits` reads the candidate's client (keyword `client`)
    wake: Callable[..., jax.Array] | None = None  # wake(params, now, next_arrival): when an idle server starts again
    max_horizon: int = (2**31 - 1) // 2  # the longest drain horizon in its time unit (a step past it must not wrap)
    wide_clock: bool = False  # it keeps its stamps as ServerShape.clock: it runs arrivals past 2^30 (core/clock.py)
    # host side: (first token, finish) times per request number (ORDER), arrays [..., R] (-1: not yet), or None
    request_times: Callable[[Any], tuple] | None = None
    # a server whose step is a unit of time (slora: 1 us): a timed input's arrivals go on that clock unless
    # --step-seconds says otherwise; None: steps of the command's default (0.025 s)
    clock_seconds: float | None = None
    slot_tiers: Callable[[int], tuple] | None = None
    static_options: Callable[[list], tuple] | None = None
    # quiet steps (see the module docstring): quiet_steps(state, params, step, smallest_prompt, limit) and
    # run_quiet(state, params, steps); None: the engine runs every step in events of its own
    quiet_steps: Callable[..., jax.Array] | None = None
    run_quiet: Callable[..., tuple[Any, Work]] | None = None
    # What the server is, for a study (compare, replay: driver/study.py), so that nothing above this floor names a
    # server: keeps_time(options): its lane's clock is time in us under these options (latencies are reported);
    # request_record(host state) -> {"scheduled", "first", "finish"[, "preemptions"]: int64[B, R], "token_at":
    # int64[B, T], "token_offset": int64[B, R]} per `record_index` ("order": request number, "row": workload row);
    # default_memory(options): the M it holds when no --kv-budget is given (None: it has no memory of its own);
    # trace_columns: the log's columns it reads beyond arrival, tenant and lengths; step_time_model: it takes a
    # step-time model (--preset / --step-time: servers/step_time.py) into its time_* options; flags: its settings'
    # command-line flags, under the names of the engine it models ((setting, flag), ...); own_clock(options):
    # a server with a clock of its own, (what its step times are, the settings a latency report prints).
    keeps_time: Callable[[dict], bool] = lambda options: False
    request_record: Callable[[Any], dict] | None = None
    record_index: str = "order"
    default_memory: Callable[[dict], int | None] = lambda options: None
    trace_columns: tuple = ()
    step_time_model: bool = False
    flags: tuple = ()
    own_clock: Callable[[dict], tuple[str, dict]] | None = None
    # batch_options(options of every distinct lane) -> the same, made to share one batch's shapes (a server whose
    # encoded settings hold per-lane tables pads them to one size); None: lanes share shapes as they are
    batch_options: Callable[[list], list] | None = None
    # prefix_hit(state, params, row, *, generated) -> int32[]: the prompt tokens the server would serve from its
    # cache were the request admitted now (what `computed` prefill charging leaves out); None: the row's CACHED
    prefix_hit: Callable[..., jax.Array] | None = None
    # kv_blocks(state, params) -> (used, usable) int32[]: its KV pool's blocks in use (cached-but-free ones count
    # as free) and usable (vLLM's `kv_cache_usage_perc` = used / usable: what a fleet's picker scrapes); None:
    # the context its running requests hold, in tokens
    kv_blocks: Callable[..., tuple] | None = None
