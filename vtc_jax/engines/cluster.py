"""A whole cluster in one lane: G gateway routers in front of R replicas (docs/CLUSTER.md).

Each replica is a MODEL.md server (KV budget M, its own engine policy, per-tenant FIFO
queues); in front of them G routers each keep a gateway queue per tenant and a policy of
their own (any registered policy whose hooks a gateway can call: not `las` or
`vtc_predict`, which need completions) that picks which tenant's head to dispatch next,
charging the request's estimated cost at dispatch. Step t of the cluster, in this order:

  0. delayed counters: charges other routers made in steps s <= t - d become visible;
  1. router arrivals: requests with arrival t join the gateway queue of their router
     (drawn per request from the ingress matrix P[k, j] by a hash of the lane seed),
     routers in index order, each in trace order (the policies' arrival hooks run here);
  2. dispatch rounds: while some replica has room (the saturation rule), routers in
     round-robin order (continuing from the router after the last one that dispatched,
     across steps; a router with nothing to offer is skipped) each dispatch one request:
     its policy's candidate goes to the replica the choice rule names, joins that
     replica's FIFO (the replica policy's arrival hook) and is charged at the router
     (estimated cost / weight);
  3. replica steps, every replica independently: admission (its engine policy, stopping
     at the first candidate that does not fit M), decode, completion (MODEL.md).

Counter modes: `per_router` (each router its own policy state, seeing only its queues),
`shared` (one state for all routers, and the cluster-wide backlog), `delayed` (each router
its own state plus the other routers' charges d steps late, and the cluster-wide backlog).
With shared knowledge a router holds back a candidate that is not the policy's pick over
the cluster-wide backlog (`holdback`), unless every router would hold back.

The JAX engine follows engine.py's pattern: one event per scan iteration chosen by masks
(DISPATCH one request, ADMIT at every replica that can, FINISH the step for all replicas;
then COMPLETE one request per replica and ARRIVE at the routers), queues as pointers into
request blocks laid out per (router, tenant), replicas as arrays with a replica axis (the
engine policies' hooks are vmapped over it), a completion calendar per replica. Exact
integers throughout (settings.py units; totals in the WIDE format of wide.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core import wide as wide_mod
from vtc_jax.core.errors import InputError
from vtc_jax.core.wide import WIDE
from vtc_jax.driver import runner
from vtc_jax.driver.devices import lane_mesh
from vtc_jax.engines.program import LaneProgram
from vtc_jax.engines.settings import INT32_MAX, Params, Settings, encode_settings, lane_scales, to_fraction
from vtc_jax.inputs.workload import (
    ARRIVAL,
    CACHED,
    NUM_FIELDS,
    ORDER,
    OUTPUT,
    PROMPT,
    Trace,
    Workload,
    make_workload,
    requests_per_client,
)
from vtc_jax.measures.online import LATENCY_BINS, latency_bin
from vtc_jax.policies import estimators, registry
from vtc_jax.policies.base import Admission, Arrivals, Completion, Shape, StepEnd, View, admissible, estimated_cost, onehot
from vtc_jax.servers import completions

I32, U32 = jnp.int32, jnp.uint32
EST = NUM_FIELDS  # a request's output estimate (precomputed per request)
ROW_FIELDS = NUM_FIELDS + 1
ORIG, ROWID = ROW_FIELDS, ROW_FIELDS + 1  # a waiting replica request: its router arrival, its row
POOL_FIELDS = ROW_FIELDS + 2
REC_DISPATCH, REC_REPLICA, REC_SEQ, REC_ADMIT = range(4)  # per-row records (ClusterConfig.record)

COUNTERS = ("per_router", "shared", "delayed")
PER_ROUTER, SHARED, DELAYED = range(3)
SATURATION = ("kv", "queue")
KV, QUEUE = range(2)
CHOICES = ("round_robin", "least_kv", "least_queued", "p2c", "affinity")
ROUND_ROBIN, LEAST_KV, LEAST_QUEUED, P2C, AFFINITY = range(5)
INGRESS_BITS = 24
INGRESS_SALT, P2C_SALT, AFFINITY_SALT = 0x632BE5AB, 0x2545F491, 0x5BD1E995
MAX_REPLICAS, MAX_ROUTERS, MAX_DELAY = 64, 16, 64
TIMELINE_PAD = 64  # entries past the end of a router's timeline: the widest arrival window
# Router-policy leaves that receive the other routers' charges in the delayed mode:
# (leaf, ring): "counter" rings hold estimated cost x counter_mult (counter units), "drr"
# rings the DRR cost (deficit units), subtracted. The router counter (vtc, lcf) always.
LEDGERS = {"vtc_gateway": ("counter", "counter"), "wfq": ("f_tail", "counter"), "sfq": ("f_tail", "counter"),
           "drr": ("deficit", "drr")}


# ---- settings (host) ----------------------------------------------------------------

def _int_in(value, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{name} must be an integer, got {value!r}")
    if not lo <= int(value) <= hi:
        raise InputError(f"{name} must be in [{lo}, {hi}], got {value}")
    return int(value)


def gateway_problem(policy: str) -> str | None:
    """Why `policy` cannot run at a gateway router (None: it can)."""
    pol = registry.get(policy)
    if pol.on_complete is not None:
        return (f"policy {policy} needs completions, which a gateway router does not see in this model "
                "(it charges at dispatch)")
    if policy == "rpm":
        return "policy rpm needs an admission limit, which the cluster does not model"
    return None


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """One cluster lane's settings (host side, exact; validated on construction).

    Attributes:
      engine: the replicas' Settings: engine policy, M (per replica), prices w_p, w_q,
        beta, weights, estimator (exact, fixed or noisy; the same estimate of a request is
        used at its router and at its replica), charge_cached. No rpm limit, KV cap or bands.
      gateway_policy, gateway_options: the routers' policy (registry name) and options;
        prices, weights and estimator are the engine's.
      replicas, routers: R and G.
      skew: ingress: tenant k reaches router j with probability (1 - skew) / G + skew *
        [j == k mod G] (0: uniform, 1: fully skewed), unless `ingress` is given.
      ingress: the matrix P[k][j] (K rows, G columns, rows summing to exactly 1).
      counters: "per_router", "shared" or "delayed" (the router policy state).
      delay: d >= 1 steps (delayed mode): a charge made in step s reaches the other
        routers at the start of step s + d.
      holdback: in the shared and delayed modes, a router dispatches only a candidate that
        is its policy's pick over the cluster-wide backlog (unless every router holds back).
      saturation: "kv" (a replica has room while its running KV + waiting prompts <
        kv_threshold x M) or "queue" (while fewer than queue_limit requests wait there).
      choice: "round_robin" (per router), "least_kv", "least_queued", "p2c" (power of two
        choices, seeded) or "affinity" (the tenant's home replica, a hash of the tenant and
        the seed, else the next one with room).
      seed: the lane's seed for ingress draws, p2c and affinity.
      measure_from: first step of the measures taken while every tenant is backlogged.
    """

    engine: Settings = Settings("fcfs")
    gateway_policy: str = "vtc_gateway"
    gateway_options: tuple = ()
    replicas: int = 1
    routers: int = 1
    skew: Fraction = Fraction(0)
    ingress: tuple | None = None
    counters: str = "per_router"
    delay: int = 1
    holdback: bool = True
    saturation: str = "kv"
    kv_threshold: Fraction = Fraction(1)
    queue_limit: int = 4
    choice: str = "least_kv"
    seed: int = 0
    measure_from: int = 0
    gateway: Settings = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        e = self.engine
        if not isinstance(e, Settings):
            raise InputError("engine must be a vtc_jax.Settings")
        if e.rpm_limit is not None or e.kv_cap is not None or e.bands is not None:
            raise InputError("the cluster does not model rpm limits, KV caps or priority bands at its replicas")
        if e.estimator == "average":
            raise InputError("the cluster supports the exact, fixed and noisy estimators (not average)")
        if e.policy == "rpm":
            raise InputError("engine policy rpm needs an rpm limit, which the cluster does not model")
        problem = gateway_problem(self.gateway_policy)
        if problem:
            raise InputError(problem)
        set_("gateway", dataclasses.replace(e, policy=self.gateway_policy, options=tuple(self.gateway_options)))
        set_("replicas", _int_in(self.replicas, "replicas", 1, MAX_REPLICAS))
        set_("routers", _int_in(self.routers, "routers", 1, MAX_ROUTERS))
        skew = to_fraction(self.skew, "skew")
        if not 0 <= skew <= 1:
            raise InputError(f"skew must be in [0, 1], got {skew}")
        set_("skew", skew)
        if self.ingress is not None:
            rows = tuple(tuple(to_fraction(x, "ingress probability") for x in row) for row in self.ingress)
            for k, row in enumerate(rows):
                if len(row) != self.routers:
                    raise InputError(f"ingress row {k} has {len(row)} entries for {self.routers} routers")
                if any(x < 0 for x in row) or sum(row) != 1:
                    raise InputError(f"ingress row {k} must be probabilities summing to 1, got {row}")
            set_("ingress", rows)
        if self.counters not in COUNTERS:
            raise InputError(f"counters must be one of {', '.join(COUNTERS)}, got {self.counters!r}")
        set_("delay", _int_in(self.delay, "delay", 1, MAX_DELAY))
        if not isinstance(self.holdback, (bool, np.bool_)):
            raise InputError(f"holdback must be True or False, got {self.holdback!r}")
        if self.saturation not in SATURATION:
            raise InputError(f"saturation must be one of {', '.join(SATURATION)}, got {self.saturation!r}")
        theta = to_fraction(self.kv_threshold, "kv threshold")
        if not 0 < theta <= 64:
            raise InputError(f"kv threshold must be in (0, 64], got {theta}")
        set_("kv_threshold", theta)
        set_("queue_limit", _int_in(self.queue_limit, "queue limit", 1, 1 << 16))
        if self.choice not in CHOICES:
            raise InputError(f"replica choice must be one of {', '.join(CHOICES)}, got {self.choice!r}")
        set_("seed", _int_in(self.seed, "cluster seed", 0, 0xFFFFFFFF))
        set_("measure_from", _int_in(self.measure_from, "measure_from", 0, INT32_MAX // 2))
        if self.kv_limit > INT32_MAX // 4:
            raise InputError(f"kv threshold x M = {self.kv_limit} is past the int32 limit")

    @property
    def kv_limit(self) -> int:
        """ceil(kv_threshold x M): a replica has room (kv rule) while KV + waiting prompts < it."""
        return math.ceil(self.kv_threshold * self.engine.kv_budget)

    def probabilities(self, num_clients: int) -> list[list[Fraction]]:
        """P[k][j]: the probability that a request of tenant k reaches router j."""
        g = self.routers
        if self.ingress is not None:
            if len(self.ingress) != num_clients:
                raise InputError(f"the ingress matrix has {len(self.ingress)} rows for {num_clients} tenants")
            return [list(r) for r in self.ingress]
        return [[(1 - self.skew) / g + (self.skew if j == k % g else 0) for j in range(g)] for k in range(num_clients)]

    def thresholds(self, num_clients: int) -> list[list[int]]:
        """Integer ingress thresholds: a request whose 24-bit draw u is < thr[k][0] goes to
        router 0, else < thr[k][1] to router 1, ...; thr[k][j] = floor(2^24 x sum_{i<=j}
        P[k][i]) and thr[k][G-1] = 2^24."""
        out = []
        for row in self.probabilities(num_clients):
            cum, thr = Fraction(0), []
            for x in row:
                cum += x
                thr.append(math.floor(cum * (1 << INGRESS_BITS)))
            thr[-1] = 1 << INGRESS_BITS
            out.append(thr)
        return out

    def setting_keys(self) -> dict:
        """Keys of a sweep row (vtc_jax.driver.sweep.settings_keys)."""
        e = self.engine
        out = {"replicas": self.replicas, "routers": self.routers, "skew": _num(self.skew), "counters": self.counters,
               "estimate_error": _num(e.estimate_error), "gateway_policy": self.gateway_policy,
               "engine_policy": e.policy, "kv_budget": e.kv_budget, "saturation": self.saturation,
               "choice": self.choice, "holdback": bool(self.holdback)}
        if self.counters == "delayed":
            out["delay"] = self.delay
        if self.saturation == "kv":
            out["kv_threshold"] = _num(self.kv_threshold)
        else:
            out["queue_limit"] = self.queue_limit
        return out


def _num(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


# ---- hashes (the reference re-implements them in pure Python) -----------------------

def ingress_router(seed, client, position, thresholds):
    """int32 router of the request at `position` among tenant `client`'s requests:
    u = mix32(mix32(mix32(seed ^ INGRESS_SALT) ^ client) + position) >> 8 (24 bits), then
    the number of thresholds <= u (thresholds: int32[..., G], the last one 2^24)."""
    key = estimators.mix32(estimators.mix32(seed ^ U32(INGRESS_SALT)) ^ client.astype(U32)) + position.astype(U32)
    u = (estimators.mix32(key) >> 8).astype(I32)
    return (thresholds <= u[..., None]).sum(axis=-1, dtype=I32)


# ---- static config, traced params, state ---------------------------------------------

@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Static sizes (changing one recompiles).

    Attributes:
      num_clients: K tenants, replicas: R, routers: G (the most of any lane; a lane's own
        counts are traced, so lanes of different K, R and G share one compiled program).
      tenant_rows: rows of the client-major workload (one router's part of the layout).
      calendar_rows, slots: each replica's completion calendar (engine.py).
      wait_slots: waiting-request slots per replica (the saturation rule bounds them).
      gateway_policies, engine_policies: the policies present (lanes pick by policy_id).
      union: some lane shares knowledge between routers (shared or delayed mode, G > 1).
      ring: slots of the delayed-charge ring (the largest delay; 0: no lane is delayed).
      arrival_width: router arrivals per tenant taken per event (any value is exact).
      record: keep per-request records (dispatch step, replica, sequence, admission step).
    """

    num_clients: int
    replicas: int
    routers: int
    tenant_rows: int
    calendar_rows: int
    slots: int
    wait_slots: int
    gateway_policies: tuple[str, ...]
    engine_policies: tuple[str, ...]
    union: bool = False
    ring: int = 0
    arrival_width: int = 4
    record: bool = False

    @property
    def num_rows(self) -> int:
        return self.routers * self.tenant_rows


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterParams:
    """Traced per-lane settings (a batch adds a leading lane axis).

    engine, gateway: settings.Params of the replicas' and the routers' policies; mode,
    delay, saturation, kv_limit, queue_limit, choice, measure_from, horizon: int32[];
    holdback: bool[]; seed: uint32[]; thresholds: int32[K, G] (ingress; 2^24 for routers past
    the lane's own); replicas, routers, tenants: int32[] the lane's R, G and K (<= the
    config's: the others exist in the arrays but never get a request)."""

    engine: Params
    gateway: Params
    mode: jax.Array
    delay: jax.Array
    holdback: jax.Array
    saturation: jax.Array
    kv_limit: jax.Array
    queue_limit: jax.Array
    choice: jax.Array
    seed: jax.Array
    thresholds: jax.Array
    measure_from: jax.Array
    horizon: jax.Array
    replicas: jax.Array
    routers: jax.Array
    tenants: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterWorkload:
    """A lane's requests laid out in blocks per (router, tenant): block (j, k) holds
    tenant k's requests that reach router j, sorted by (arrival, number), at rows
    [first[j, k], first[j, k] + tenant block size), with a trailing EST field (the
    request's output estimate). requests: int32[G * N, 6]; first: int32[G, K]; timeline:
    int32[G, N + TIMELINE_PAD, 2] (row, tenant) of router j's rows in (arrival, ORDER)
    order, padding last: the order in which requests reach router j."""

    requests: jax.Array
    first: jax.Array
    timeline: jax.Array
    num_requests: jax.Array
    overflow: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Replica:
    """One replica (the cluster state holds these with a leading replica axis R).

    pool: int32[S, POOL_FIELDS] waiting requests (row fields with ARRIVAL = dispatch step
    and ORDER = dispatch sequence, then the router arrival and the cluster row); nxt:
    int32[S] next slot of the same tenant (FIFO lists); free: int32[S] stack of free slots
    (first `top`); fh, ft: int32[K] head and tail slot per tenant (-1: empty); nw: int32[K]
    waiting requests; waitp: int32[] their prompt tokens; counter, service, wsvc:
    int32[K, 2] the MODEL.md counter, W_k and W_k x counter_mult (wide); running,
    context, admitted, completed: int32[K]; last_left: int32[]; calendar; policy;
    overflow: bool[] (a waiting or running pool was full: the lane is not finished)."""

    pool: jax.Array
    nxt: jax.Array
    free: jax.Array
    top: jax.Array
    fh: jax.Array
    ft: jax.Array
    nw: jax.Array
    waitp: jax.Array
    counter: jax.Array
    service: jax.Array
    wsvc: jax.Array
    running: jax.Array
    context: jax.Array
    last_left: jax.Array
    admitted: jax.Array
    completed: jax.Array
    calendar: completions.Calendar
    policy: dict
    overflow: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterState:
    """One lane's state.

    step, done, iterations: as engine.State. Routers: rhead, rarrived: int32[G, K]
    pointers into the (j, k) blocks; rnext: int32[G] position in router j's timeline of the
    next request to arrive; rcounter: int32[G, K, 2] the router counter (charged
    the estimated cost / weight at dispatch; what vtc and lcf read); rlast: int32[G];
    rpolicy: {policy: state} (per-tenant leaves with a leading router axis G, used at
    index 0 in the shared mode; per-row tables without one); cursor: int32[] the router
    after the last one that dispatched (the round-robin pointer, kept across steps);
    dispatched_all: bool[] the step's dispatch phase is over (the replicas' admissions have
    begun); rr: int32[G] round-robin cursors of the replica choice; dseq: int32[]
    dispatches so far; ring_c: int32[D, G, K, 2], ring_d: int32[D, G, K], stamp: int32[D] the
    charges of the last D steps. reps: Replica (leading axis R). Measures: dispatched
    int32[G, R, K]; snap, wsnap: int32[R, K, 2] service at the last step end; bs, bsw:
    int32[K, 2] service (and x counter_mult) in steps where every tenant is backlogged;
    drift: int32[2] max over those steps of max_k bsw - min_k bsw; bsteps: int32[];
    wait_hist: int32[K, LATENCY_BINS]; rec: int32[G * N, 4] or None."""

    step: jax.Array
    done: jax.Array
    iterations: jax.Array
    rhead: jax.Array
    rarrived: jax.Array
    rnext: jax.Array
    rcounter: jax.Array
    rlast: jax.Array
    rpolicy: dict
    cursor: jax.Array
    dispatched_all: jax.Array
    rr: jax.Array
    dseq: jax.Array
    ring_c: jax.Array | None
    ring_d: jax.Array | None
    stamp: jax.Array | None
    reps: Replica
    dispatched: jax.Array
    snap: jax.Array
    wsnap: jax.Array
    bs: jax.Array
    bsw: jax.Array
    drift: jax.Array
    bsteps: jax.Array
    wait_hist: jax.Array
    rec: jax.Array | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterBatch:
    """The runner's per-lane inputs."""

    params: ClusterParams
    workload: ClusterWorkload


# ---- small exact helpers ----------------------------------------------------------------

def _wadd(a, b):
    """Wide + wide (both normalized)."""
    low = a[..., 1] + b[..., 1]
    return jnp.stack([a[..., 0] + b[..., 0] + (low >> wide_mod.LOW_BITS), low & wide_mod.LOW_MASK], axis=-1)


def _wsum(a, axis: int):
    """Sum of wide values over value axis `axis` (at most 64 entries: the lows cannot wrap)."""
    low = a[..., 1].sum(axis=axis)
    return jnp.stack([a[..., 0].sum(axis=axis) + (low >> wide_mod.LOW_BITS), low & wide_mod.LOW_MASK], axis=-1)


def _pick(policy_id, values):
    """The lane's policy's value among one value per policy (pytrees of equal structure)."""
    if len(values) == 1:
        return values[0]

    def sel(*xs):
        if all(x is xs[0] for x in xs):
            return xs[0]
        return jnp.select([policy_id == i for i in range(len(xs) - 1)], list(xs[:-1]), xs[-1])
    return jax.tree_util.tree_map(sel, *values)


def _choose(cond, a, b):
    """Pytrees: a where cond else b (a leaf both share is kept as is: no select over it)."""
    return jax.tree_util.tree_map(lambda x, y: x if x is y else jnp.where(cond, x, y), a, b)


def _keep(old, new, mask):
    return jax.tree_util.tree_map(lambda a, b: a if a is b else jnp.where(mask, b, a), old, new)


@functools.lru_cache(maxsize=None)
def _leaf_kinds_cached(name: str, k: int, rows: int, struct):
    pol = registry.get(name)
    tree, specs = struct
    params = jax.tree_util.tree_unflatten(tree, [jax.ShapeDtypeStruct(s, d) for s, d in specs])
    shape = lambda r, num: jax.eval_shape(lambda p: pol.init(p, Shape(k, r, num)), params)  # noqa: E731
    a, b, c = shape(rows, WIDE), shape(rows + 1, WIDE), shape(rows, wide_mod.NARROW)
    return (jax.tree_util.tree_map(lambda x, y: x.shape != y.shape, a, b),
            jax.tree_util.tree_map(lambda x, y: x.ndim != y.ndim, a, c))


def _leaf_kinds(name: str, params, k: int, rows: int):
    """(tables, wides): per leaf of policy `name`'s state, whether it is a per-row table
    (its shape follows the row count; kept once for all routers, whose rows are disjoint)
    and whether it holds exact wide integers. `params`: the policy's params of one lane."""
    leaves, tree = jax.tree_util.tree_flatten(params)
    specs = tuple((tuple(np.shape(x)), np.dtype(x.dtype)) for x in leaves)
    return _leaf_kinds_cached(name, k, rows, (tree, specs))


def table_flags(name: str, params, k: int, rows: int):
    return _leaf_kinds(name, params, k, rows)[0]


def _rslice(state, flags, p):
    """Router-policy state at index p (per-tenant leaves) with the shared tables."""
    return jax.tree_util.tree_map(lambda x, f: x if f else x[p], state, flags)


def _rput(state, flags, p, new, mask):
    """Write a router's policy state back at index p where `mask` (tables: the hooks'
    result, which changes only where they wrote masked rows)."""
    def put(x, n, f):
        if f:
            return n
        if n is x:
            return x
        return x.at[p].set(jnp.where(mask, n, x[p]))
    return jax.tree_util.tree_map(put, state, new, flags)


# ---- the replicas (one replica's functions; vmapped over the replica axis) ---------------

def _rep_heads(rep: Replica):
    """int32[K, POOL_FIELDS]: each tenant's FIFO head record (meaningful where waiting)."""
    return rep.pool[jnp.maximum(rep.fh, 0)]


def _rep_view(rep: Replica, heads, step, costs) -> View:
    return View(num=WIDE, step=step, backlogged=rep.nw > 0, heads=heads, head_index=jnp.maximum(rep.fh, 0),
                waiting=rep.nw, counter=rep.counter, running=rep.running, context=rep.context,
                last_left=rep.last_left, costs=costs, estimates=heads[:, EST])


def _rep_select(rep: Replica, heads, step, eparams: Params, cfg: ClusterConfig):
    """The replica's candidate (client, has, states); `has` only where the policy chose a
    backlogged tenant (base.admissible): any other choice admits nothing and the step ends."""
    view = _rep_view(rep, heads, step, eparams.costs)
    choices = [registry.get(n).select(rep.policy[n], view, view.backlogged, eparams.policy[n])
               for n in cfg.engine_policies]
    client = _pick(eparams.policy_id, [c.client for c in choices]).astype(I32)
    has = _pick(eparams.policy_id, [c.has for c in choices]) & admissible(view.backlogged, client)
    return client, has, {n: c.state for n, c in zip(cfg.engine_policies, choices)}


def _rep_room(rep: Replica, index, params: ClusterParams):
    load = rep.context.sum() + rep.waitp
    queued = rep.nw.sum()
    room = jnp.where(params.saturation == KV, load < params.kv_limit, queued < params.queue_limit)
    return room & (index < params.replicas), load, queued


def _rep_receive(rep: Replica, heads, step, record, client, mask, eparams: Params, cfg: ClusterConfig) -> Replica:
    """A dispatched request joins this replica's FIFO of `client` where `mask`; the engine
    policies' arrival hooks see it as one arrival (MODEL.md phase 1: VTC's lift)."""
    view = _rep_view(rep, heads, step, eparams.costs)
    k, s = cfg.num_clients, cfg.wait_slots
    ok = mask & (rep.top > 0)
    slot = rep.free[jnp.maximum(rep.top - 1, 0)]
    # The write's index depends on the heads read from the pool at the event's start (a
    # data dependency XLA must respect): otherwise XLA may read them after the write and
    # copy the whole pool on every event (see completions.push).
    after = ok & (heads[0, ARRIVAL] >= -1)
    pool = rep.pool.at[jnp.where(after, slot, s)].set(record, mode="drop")
    tail = rep.ft[client]
    link = ok & (rep.nw[client] > 0)
    nxt = rep.nxt.at[jnp.stack([jnp.where(ok, slot, s), jnp.where(link, tail, s)])].set(
        jnp.stack([jnp.asarray(-1, I32), slot]), mode="drop")
    fh = rep.fh.at[client].set(jnp.where(ok & (rep.nw[client] == 0), slot, rep.fh[client]))
    ft = rep.ft.at[client].set(jnp.where(ok, slot, tail))
    joining = onehot(client, k, ok)
    arrivals = Arrivals(joins=ok[None], client=client.astype(I32)[None], index=slot[None],
                        rows=record[None, :ROW_FIELDS], estimates=record[EST][None], joining=joining,
                        newcomer=~view.backlogged & (joining > 0), first=client.astype(I32))
    states, counters = {}, []
    for n in cfg.engine_policies:
        states[n], c = registry.get(n).arrive(rep.policy[n], view, arrivals, eparams.policy[n])
        counters.append(c)
    counter = WIDE.where(ok, _pick(eparams.policy_id, counters), rep.counter)
    return dataclasses.replace(rep, pool=pool, nxt=nxt, fh=fh, ft=ft, nw=rep.nw + joining,
                               waitp=rep.waitp + ok.astype(I32) * record[PROMPT], top=rep.top - ok.astype(I32),
                               counter=counter, policy=states, overflow=rep.overflow | (mask & ~ok))


def _rep_admit(rep: Replica, heads, client, states, mask, step, eparams: Params, cfg: ClusterConfig):
    """Admit the candidate (its FIFO head) where `mask` (MODEL.md phase 2, one request).
    Returns (replica, (router arrival, cluster row) of the request)."""
    view = _rep_view(rep, heads, step, eparams.costs)
    k, s = cfg.num_clients, cfg.wait_slots
    row = view.heads[client]
    slot = view.head_index[client]
    take = onehot(client, k, mask)
    prompt, output = row[PROMPT], row[OUTPUT]
    costs = eparams.costs
    prefill = costs.prefill * jnp.where(costs.charge_cached, prompt, prompt - row[CACHED])
    admission = Admission(client=client, row=row[:ROW_FIELDS], index=slot, estimate=row[EST], prefill=prefill)
    new_states, values = {}, []
    for n in cfg.engine_policies:
        new_states[n], v = registry.get(n).admit(states[n], view, admission, eparams.policy[n])
        values.append(v)
    value = _pick(eparams.policy_id, values)
    entry = jnp.stack([client, prompt, output, value]).astype(I32)
    last = rep.nw[client] == 1
    fh = rep.fh.at[client].set(jnp.where(mask, jnp.where(last, -1, rep.nxt[slot]), rep.fh[client]))
    ft = rep.ft.at[client].set(jnp.where(mask & last, -1, rep.ft[client]))
    free = rep.free.at[jnp.where(mask, rep.top, s)].set(slot, mode="drop")
    charge = take * prefill
    weighted = charge * costs.counter_mult
    rep = dataclasses.replace(
        rep, fh=fh, ft=ft, free=free, top=rep.top + mask.astype(I32), nw=rep.nw - take,
        waitp=rep.waitp - mask.astype(I32) * prompt, running=rep.running + take, context=rep.context + take * prompt,
        service=WIDE.add(rep.service, charge), counter=WIDE.add(rep.counter, weighted),
        wsvc=WIDE.add(rep.wsvc, weighted), admitted=rep.admitted + take,
        last_left=jnp.where(mask, client, rep.last_left),
        calendar=completions.push(rep.calendar, step + output - 1, entry, mask),
        overflow=rep.overflow | (mask & completions.full(rep.calendar)), policy=_keep(rep.policy, new_states, mask))
    return rep, (row[ORIG], row[ROWID])


def _rep_finish(rep: Replica, heads, step, mask, elapsed, eparams: Params, cfg: ClusterConfig) -> Replica:
    """MODEL.md phase 3 (decode) where `mask`, and the policies' step-end hooks."""
    view = _rep_view(rep, heads, step, eparams.costs)
    m = mask.astype(I32)
    costs = eparams.costs
    decode = m * (costs.decode * rep.running + costs.context * rep.context)
    weighted = decode * costs.counter_mult
    step_end = StepEnd(decode=decode, elapsed=elapsed)
    states = {n: registry.get(n).step(rep.policy[n], view, step_end, eparams.policy[n]) for n in cfg.engine_policies}
    return dataclasses.replace(rep, service=WIDE.add(rep.service, decode), counter=WIDE.add(rep.counter, weighted),
                               wsvc=WIDE.add(rep.wsvc, weighted), context=rep.context + m * rep.running,
                               policy=_keep(rep.policy, states, mask))


def _rep_complete(rep: Replica, heads, mask, step, eparams: Params, cfg: ClusterConfig) -> Replica:
    """MODEL.md phase 4 for one request (the next to complete) where `mask`."""
    view = _rep_view(rep, heads, step, eparams.costs)
    calendar, top = completions.pop(rep.calendar, step, mask)
    client, prompt, output, value = top[0], top[1], top[2], top[3]
    take = onehot(client, cfg.num_clients, mask)
    completion = Completion(client=client, prompt=prompt, output=output, estimate=value)
    states = {n: registry.get(n).complete(rep.policy[n], view, completion, eparams.policy[n])
              for n in cfg.engine_policies}
    return dataclasses.replace(rep, running=rep.running - take, context=rep.context - take * (prompt + output),
                               completed=rep.completed + take, calendar=calendar,
                               policy=_keep(rep.policy, states, mask))


def _rep_init(cfg: ClusterConfig, eparams: Params) -> Replica:
    k, s = cfg.num_clients, cfg.wait_slots
    shape = Shape(num_clients=k, num_rows=s, num=WIDE)
    zk = jnp.zeros(k, I32)
    return Replica(pool=jnp.zeros((s, POOL_FIELDS), I32), nxt=jnp.full(s, -1, I32),
                   free=jnp.arange(s - 1, -1, -1, dtype=I32), top=jnp.asarray(s, I32), fh=jnp.full(k, -1, I32),
                   ft=jnp.full(k, -1, I32), nw=zk, waitp=jnp.zeros((), I32), counter=WIDE.zeros((k,)),
                   service=WIDE.zeros((k,)), wsvc=WIDE.zeros((k,)), running=zk, context=zk,
                   last_left=jnp.asarray(-1, I32), admitted=zk, completed=zk,
                   calendar=completions.init(cfg.calendar_rows, cfg.slots),
                   policy={n: registry.get(n).init(eparams.policy[n], shape) for n in cfg.engine_policies},
                   overflow=jnp.zeros((), bool))


# ---- the routers ----------------------------------------------------------------------

def _router_index(params: ClusterParams, j):
    """The policy-state index router j uses (0 for every router in the shared mode)."""
    return jnp.where(params.mode == SHARED, 0, j).astype(I32)


@dataclasses.dataclass(frozen=True)
class _Routers:
    """Per-event router facts, stacked over the router axis G. back: bool[G, K] each
    router's own backlog; any_back: bool[K] the cluster-wide backlog; p: int32[G] the
    policy-state index of each router; backlogged, heads, head_index, waiting: what each
    router's policy sees (its own queues, or the cluster-wide backlog: a tenant it does not
    hold shows the head at the lowest router holding it, and waiting counts every router)."""

    back: jax.Array
    any_back: jax.Array
    p: jax.Array
    backlogged: jax.Array
    heads: jax.Array
    head_index: jax.Array
    waiting: jax.Array


def _router_arrays(state: ClusterState, heads, head_index, params: ClusterParams, cfg: ClusterConfig) -> _Routers:
    g, k = cfg.routers, cfg.num_clients
    back = state.rhead < state.rarrived
    waiting = state.rarrived - state.rhead
    any_back = back.any(axis=0)
    vb, vh, vi, vw = back, heads, head_index, waiting
    if cfg.union:
        union = params.mode != PER_ROUTER
        owner = jnp.argmax(back, axis=0)
        owner_heads = heads[owner, jnp.arange(k)]
        owner_index = head_index[owner, jnp.arange(k)]
        vh = jnp.where(union, jnp.where(back[:, :, None], heads, owner_heads[None]), heads)
        vi = jnp.where(union, jnp.where(back, head_index, owner_index[None]), head_index)
        vb = jnp.where(union, jnp.broadcast_to(any_back, back.shape), back)
        vw = jnp.where(union, jnp.broadcast_to(waiting.sum(axis=0), waiting.shape), waiting)
    return _Routers(back=back, any_back=any_back, p=_router_index(params, jnp.arange(g)), backlogged=vb, heads=vh,
                    head_index=vi, waiting=vw)


def _router_view(step, backlogged, heads, head_index, waiting, counter, last_left, costs) -> View:
    zeros = jnp.zeros(backlogged.shape[0], I32)
    return View(num=WIDE, step=step, backlogged=backlogged, heads=heads, head_index=head_index, waiting=waiting,
                counter=counter, running=zeros, context=zeros, last_left=last_left, costs=costs,
                estimates=heads[:, EST])


def _gathered(rpolicy: dict, flags: dict, p) -> dict:
    """Every policy's state with its per-tenant leaves gathered at p (int32[G]): [G, ...];
    tables as they are."""
    return {n: jax.tree_util.tree_map(lambda x, f: x if f else x[p], rpolicy[n], flags[n]) for n in rpolicy}


def _axes(flags: dict) -> dict:
    """vmap in_axes over routers: tables unbatched."""
    return {n: jax.tree_util.tree_map(lambda f: None if f else 0, flags[n]) for n in flags}


def _strip(states: dict, flags: dict) -> dict:
    """Inside a function vmapped over routers: tables replaced by a dummy (never batched)."""
    return {n: jax.tree_util.tree_map(lambda x, f: jnp.zeros((), I32) if f else x, states[n], flags[n])
            for n in states}


def _restore(states: dict, flags: dict, rpolicy: dict) -> dict:
    return {n: jax.tree_util.tree_map(lambda x, f, orig: orig if f else x, states[n], flags[n], rpolicy[n])
            for n in states}


@dataclasses.dataclass(frozen=True)
class _Offer:
    router: jax.Array  # int32[] the router that dispatches
    client: jax.Array  # int32[] its tenant
    has: jax.Array  # bool[] some router offers a request
    states: dict  # {policy: the dispatching router's choice state}


def _router_offer(state: ClusterState, routers: _Routers, params: ClusterParams, cfg: ClusterConfig,
                  flags: dict) -> _Offer:
    """The next dispatch of the round: each router's candidate (its policy's pick among its
    own backlogged tenants; with holdback in a shared mode, the pick over the cluster-wide
    backlog if this router holds it, else nothing), and the first router in round order
    from the cursor that offers one. If every router with a request would hold back, the
    first in round order dispatches its own pick. The routers' selects run vmapped."""
    g = cfg.routers
    gp = params.gateway
    names = cfg.gateway_policies
    holdback = params.holdback & (params.mode != PER_ROUTER)

    def one(st, back, vb, vh, vi, vw, counter, last):
        view = _router_view(state.step, vb, vh, vi, vw, counter, last, gp.costs)
        loc = [registry.get(n).select(st[n], view, back, gp.policy[n]) for n in names]
        lc = _pick(gp.policy_id, [c.client for c in loc]).astype(I32)
        lh = _pick(gp.policy_id, [c.has for c in loc]) & admissible(back, lc)  # only a tenant it holds
        ls = {n: c.state for n, c in zip(names, loc)}
        if not cfg.union:
            return lc, lh, _strip(ls, flags), lh, lc, _strip(ls, flags)
        uni = [registry.get(n).select(st[n], view, routers.any_back, gp.policy[n]) for n in names]
        uc = _pick(gp.policy_id, [c.client for c in uni]).astype(I32)
        uh = _pick(gp.policy_id, [c.has for c in uni])
        us = {n: c.state for n, c in zip(names, uni)}
        ok = jnp.where(holdback, uh & admissible(back, uc), lh)
        return (lc, lh, _strip(ls, flags), ok, jnp.where(holdback, uc, lc).astype(I32),
                _strip(_choose(holdback, us, ls), flags))

    p = routers.p
    lc, lh, ls, ok, pc, ps = jax.vmap(one, in_axes=(_axes(flags), 0, 0, 0, 0, 0, 0, 0))(
        _gathered(state.rpolicy, flags, p), routers.back, routers.backlogged, routers.heads, routers.head_index,
        routers.waiting, state.rcounter[p], state.rlast[p])
    any_pri = ok.any()
    offering = jnp.where(any_pri, ok, lh)
    distance = (jnp.arange(g, dtype=I32) - state.cursor) % g
    router = jnp.argmin(jnp.where(offering, distance, g)).astype(I32)
    client = jnp.where(any_pri, pc[router], lc[router]).astype(I32)
    chosen = jax.tree_util.tree_map(lambda a, b: jnp.where(any_pri, a[router], b[router]), ps, ls)
    return _Offer(router=router, client=client, has=offering.any(), states=_restore(chosen, flags, state.rpolicy))


def _choose_replica(state: ClusterState, params: ClusterParams, cfg: ClusterConfig, room, load, queued, router,
                    client):
    """The replica a dispatch goes to (among those with room; see docs/CLUSTER.md)."""
    r, n_r = cfg.replicas, params.replicas
    ar = jnp.arange(r, dtype=I32)
    rr = jnp.argmin(jnp.where(room, (ar - state.rr[router]) % n_r, r)).astype(I32)
    least_kv = jnp.argmin(jnp.where(room, load, INT32_MAX)).astype(I32)
    least_queued = jnp.argmin(jnp.where(room, queued, INT32_MAX)).astype(I32)
    n = room.sum(dtype=I32)
    rank = jnp.cumsum(room.astype(I32)) - 1
    h1 = estimators.mix32(estimators.mix32(params.seed ^ U32(P2C_SALT)) + state.dseq.astype(U32))
    h2 = estimators.mix32(h1)
    a = (h1 % jnp.maximum(n, 1).astype(U32)).astype(I32)
    b = jnp.where(n >= 2, (a + 1 + (h2 % jnp.maximum(n - 1, 1).astype(U32)).astype(I32)) % jnp.maximum(n, 1), a)
    ra = jnp.argmax(room & (rank == a)).astype(I32)
    rb = jnp.argmax(room & (rank == b)).astype(I32)
    p2c = jnp.where((load[rb] < load[ra]) | ((load[rb] == load[ra]) & (rb < ra)), rb, ra)
    home = (estimators.mix32(estimators.mix32(params.seed ^ U32(AFFINITY_SALT)) ^ client.astype(U32))
            % n_r.astype(U32)).astype(I32)
    affinity = jnp.argmin(jnp.where(room, (ar - home) % n_r, r)).astype(I32)
    return jnp.select([params.choice == ROUND_ROBIN, params.choice == LEAST_KV, params.choice == LEAST_QUEUED,
                       params.choice == P2C], [rr, least_kv, least_queued, p2c], affinity).astype(I32)


# ---- events ---------------------------------------------------------------------------

def _dispatch(state: ClusterState, wl: ClusterWorkload, params: ClusterParams, cfg: ClusterConfig, flags,
              routers: _Routers, offer: _Offer, rheads, room, load, queued, mask) -> ClusterState:
    """One dispatch where `mask`: the offering router's candidate leaves its gateway queue,
    is charged there and joins the chosen replica's FIFO."""
    g, r = cfg.routers, cfg.replicas
    j, c = offer.router, offer.client
    t = state.step
    index = wl.first[j, c] + state.rhead[j, c]
    row = wl.requests[index]
    est = row[EST]
    gp = params.gateway
    p = _router_index(params, j)
    view = _router_view(t, routers.backlogged[j], routers.heads[j], routers.head_index[j], routers.waiting[j],
                        state.rcounter[p], state.rlast[p], gp.costs)
    prefill = gp.costs.prefill * jnp.where(gp.costs.charge_cached, row[PROMPT], row[PROMPT] - row[CACHED])
    admission = Admission(client=c, row=row, index=index, estimate=est, prefill=prefill)
    rpolicy = {}
    for n in cfg.gateway_policies:
        new, _ = registry.get(n).admit(offer.states[n], view, admission, gp.policy[n])
        rpolicy[n] = _rput(state.rpolicy[n], flags[n], p, new, mask)
    charge = estimated_cost(gp.costs, row, est) * gp.costs.counter_mult[c]
    rcounter = state.rcounter.at[p, c].set(WIDE.where(mask, WIDE.add(state.rcounter[p, c], charge),
                                                      state.rcounter[p, c]))
    ring_c, ring_d = state.ring_c, state.ring_d
    if cfg.ring:
        slot = t % cfg.ring
        ring_c = ring_c.at[slot, j, c].set(WIDE.where(mask, WIDE.add(ring_c[slot, j, c], charge), ring_c[slot, j, c]))
        if ring_d is not None:
            cost = offer.states["drr"]["chosen_cost"]
            ring_d = ring_d.at[slot, j, c].add(jnp.where(mask, cost, 0))
    target = _choose_replica(state, params, cfg, room, load, queued, j, c)
    record = jnp.concatenate([jnp.stack([t, state.dseq]), row[PROMPT:ROW_FIELDS], jnp.stack([row[ARRIVAL], index])])
    into = mask & (jnp.arange(r) == target)
    reps = jax.vmap(functools.partial(_rep_receive, cfg=cfg), in_axes=(0, 0, None, None, None, 0, None))(
        state.reps, rheads, t, record.astype(I32), c, into, params.engine)
    rec = state.rec
    if rec is not None:
        rows = rec.shape[0]
        rec = rec.at[jnp.where(mask, index, rows)].set(
            jnp.stack([t, target, state.dseq, jnp.asarray(-1, I32)]), mode="drop")
    m = mask.astype(I32)
    return dataclasses.replace(
        state, rhead=state.rhead.at[j, c].add(m), rcounter=rcounter,
        rlast=state.rlast.at[p].set(jnp.where(mask, c, state.rlast[p])), rpolicy=rpolicy,
        cursor=jnp.where(mask, (j + 1) % g, state.cursor).astype(I32),
        rr=state.rr.at[j].set(jnp.where(mask & (params.choice == ROUND_ROBIN), (target + 1) % params.replicas,
                                        state.rr[j])),
        dseq=state.dseq + m, ring_c=ring_c, ring_d=ring_d, reps=reps,
        dispatched=state.dispatched.at[j, target, c].add(m), rec=rec)


def _admit(state: ClusterState, rheads, clients, rstates, admitting, params: ClusterParams,
           cfg: ClusterConfig) -> ClusterState:
    """Every replica where `admitting` admits its candidate."""
    t = state.step
    reps, (orig, rowid) = jax.vmap(functools.partial(_rep_admit, cfg=cfg), in_axes=(0, 0, 0, 0, 0, None, None))(
        state.reps, rheads, clients, rstates, admitting, t, params.engine)
    hist = state.wait_hist.at[clients, latency_bin(t - orig)].add(admitting.astype(I32))
    rec = state.rec
    if rec is not None:
        rec = rec.at[jnp.where(admitting, rowid, rec.shape[0]), REC_ADMIT].set(t, mode="drop")
    return dataclasses.replace(state, reps=reps, wait_hist=hist, rec=rec)


def _finish(state: ClusterState, wl: ClusterWorkload, rheads, routers: _Routers, params: ClusterParams,
            cfg: ClusterConfig, flags, mask, next_arrival) -> ClusterState:
    """Step t ends where `mask`: every replica decodes, step-end hooks run, t moves on (a
    jump over idle steps when nothing runs or waits anywhere), the delayed charges due by
    the new step are applied."""
    t = state.step
    horizon = params.horizon
    waiting = (state.rarrived - state.rhead).sum(axis=0) + state.reps.nw.sum(axis=0)  # [K]
    idle = (state.reps.running.sum() == 0) & (waiting.sum() == 0)
    target = jnp.minimum(next_arrival.min(), horizon)
    next_t = jnp.where(mask, jnp.where(idle, jnp.maximum(t + 1, target), t + 1), t)
    elapsed = next_t - t
    reps = jax.vmap(functools.partial(_rep_finish, cfg=cfg), in_axes=(0, 0, None, None, None, None))(
        state.reps, rheads, t, mask, elapsed, params.engine)
    # measures over steps in which every tenant is backlogged (after the admissions)
    tenant = jnp.arange(cfg.num_clients) < params.tenants
    flag = mask & ((waiting > 0) | ~tenant).all() & (t >= params.measure_from)
    ds = _wsum(WIDE.sub(reps.service, state.snap), 0)
    dw = _wsum(WIDE.sub(reps.wsvc, state.wsnap), 0)
    bs = WIDE.where(flag, _wadd(state.bs, ds), state.bs)
    bsw = WIDE.where(flag, _wadd(state.bsw, dw), state.bsw)
    among = WIDE.where(tenant, bsw, bsw[0])  # the lane's own tenants only
    gap = WIDE.sub(WIDE.max_of(among), WIDE.min_of(among))
    drift = WIDE.where(flag, WIDE.maximum(state.drift, gap), state.drift)
    snap = WIDE.where(mask, reps.service, state.snap)
    wsnap = WIDE.where(mask, reps.wsvc, state.wsnap)
    # the routers' step-end hooks, vmapped over routers (shared mode: once, on the shared state)
    gp = params.gateway
    names = cfg.gateway_policies
    zeros = jnp.zeros(cfg.num_clients, I32)

    def one(st, vb, vh, vi, vw, counter, last):
        view = _router_view(t, vb, vh, vi, vw, counter, last, gp.costs)
        new = {n: registry.get(n).step(st[n], view, StepEnd(decode=zeros, elapsed=elapsed), gp.policy[n])
               for n in names}
        for n in names:
            for f, a, b in zip(jax.tree_util.tree_leaves(flags[n]), jax.tree_util.tree_leaves(st[n]),
                               jax.tree_util.tree_leaves(new[n])):
                if f and a is not b:
                    raise NotImplementedError(f"policy {n}: a router's step hook may not change per-row tables")
        return _strip(new, flags)

    p = routers.p
    new = jax.vmap(one, in_axes=(_axes(flags), 0, 0, 0, 0, 0, 0))(
        _gathered(state.rpolicy, flags, p), routers.backlogged, routers.heads, routers.head_index, routers.waiting,
        state.rcounter[p], state.rlast[p])
    call = mask & ((params.mode != SHARED) | (jnp.arange(cfg.routers) == 0))
    shared = params.mode == SHARED

    def put(old, n_, f):
        if f:
            return old
        c = call.reshape(call.shape + (1,) * (old.ndim - 1))
        return jnp.where(shared, old.at[0].set(jnp.where(mask, n_[0], old[0])), jnp.where(c, n_, old))
    rpolicy = {n: jax.tree_util.tree_map(put, state.rpolicy[n], new[n], flags[n]) for n in names}
    rcounter, ring_c, ring_d, stamp = state.rcounter, state.ring_c, state.ring_d, state.stamp
    if cfg.ring:
        apply = mask & (params.mode == DELAYED)
        # charges visible at the start of a step that is run (< horizon) by the new step
        due = apply & (stamp >= 0) & (stamp + params.delay <= jnp.minimum(next_t, horizon - 1))
        per_router = _wsum(WIDE.where(due[:, None, None], ring_c, WIDE.zeros(ring_c.shape[1:-1])), 0)  # [G, K, 2]
        others = WIDE.sub(_wsum(per_router, 0)[None], per_router)  # the other routers' charges
        rcounter = _wadd(rcounter, others)
        for n in cfg.gateway_policies:
            if n in LEDGERS and LEDGERS[n][1] == "counter":
                leaf = LEDGERS[n][0]
                rpolicy[n] = dict(rpolicy[n], **{leaf: _wadd(rpolicy[n][leaf], others)})
        if ring_d is not None:
            per_d = jnp.where(due[:, None, None], ring_d, 0).sum(axis=0)
            rpolicy["drr"] = dict(rpolicy["drr"], deficit=rpolicy["drr"]["deficit"] - (per_d.sum(axis=0)[None] - per_d))
        slot = next_t % cfg.ring
        fresh = mask & (jnp.arange(cfg.ring) == slot)
        stamp = jnp.where(fresh, next_t, jnp.where(due, -1, stamp))
        ring_c = WIDE.where(fresh[:, None, None], WIDE.zeros(ring_c.shape[1:-1]), ring_c)
        if ring_d is not None:
            ring_d = jnp.where(fresh[:, None, None], 0, ring_d)
    return dataclasses.replace(
        state, step=next_t, reps=reps, bs=bs, bsw=bsw, drift=drift, snap=snap, wsnap=wsnap,
        bsteps=state.bsteps + flag.astype(I32), rpolicy=rpolicy, rcounter=rcounter, ring_c=ring_c, ring_d=ring_d,
        stamp=stamp, dispatched_all=state.dispatched_all & ~mask)


def _complete(state: ClusterState, params: ClusterParams, cfg: ClusterConfig, mask) -> ClusterState:
    t = state.step
    heads = jax.vmap(_rep_heads)(state.reps)
    reps = jax.vmap(functools.partial(_rep_complete, cfg=cfg), in_axes=(0, 0, 0, None, None))(
        state.reps, heads, mask, t, params.engine)
    return dataclasses.replace(state, reps=reps)


def _arrive(state: ClusterState, wl: ClusterWorkload, heads, head_index, params: ClusterParams, cfg: ClusterConfig,
            flags, mask, entries, warr) -> ClusterState:
    """Router arrivals at step t where `mask`: routers in index order (a loop over the
    router axis), each taking the next `arrival_width` requests of its timeline that arrive
    at t (in trace order) in one go; router j goes only once every router before it has
    taken all of its arrivals of the step. entries: int32[G, W + 1, 2] the next timeline
    entries (row, tenant) of every router; warr: int32[G, W + 1] their arrival steps."""
    g, k, w = cfg.routers, cfg.num_clients, cfg.arrival_width
    t = state.step
    gp = params.gateway
    union = params.mode != PER_ROUTER
    arrival_rows = any(registry.get(n).arrival_rows for n in cfg.gateway_policies)

    def body(j, carry):
        rarrived, rnext, rcounter, rpolicy, prior = carry
        ent, wa = entries[j], warr[j]
        pending = wa[0] <= t
        go = mask & pending & prior
        rest = wa[w] <= t
        prior = prior & (~pending | (go & ~rest))
        joins = go & (wa[:w] <= t)  # in arrival order: a prefix of the window
        index, client = ent[:w, 0], ent[:w, 1]
        mine = (client[:, None] == jnp.arange(k)[None, :]) & joins[:, None]  # [W, K]
        joining = mine.sum(axis=0, dtype=I32)
        back = state.rhead < rarrived
        backlogged = jnp.where(union, back.any(axis=0), back[j]) if cfg.union else back[j]
        newcomer = ~backlogged & (joining > 0)
        opens = mine & (jnp.cumsum(mine, axis=0) == 1) & newcomer[None, :]
        first = client[jnp.argmax(opens.any(axis=1))]
        rows = estimates = None
        if arrival_rows:
            rows = wl.requests[index]
            estimates = rows[:, EST]
        p = _router_index(params, j)
        view = _router_view(t, backlogged, heads[j], head_index[j], rarrived[j] - state.rhead[j], rcounter[p],
                            state.rlast[p], gp.costs)
        arrivals = Arrivals(joins=joins, client=client, index=index, rows=rows, estimates=estimates, joining=joining,
                            newcomer=newcomer, first=first)
        counters, rpolicy = [], dict(rpolicy)
        for n in cfg.gateway_policies:
            st = _rslice(rpolicy[n], flags[n], p)
            new, counter = registry.get(n).arrive(st, view, arrivals, gp.policy[n])
            counters.append(counter)
            rpolicy[n] = _rput(rpolicy[n], flags[n], p, new, go)
        counter = _pick(gp.policy_id, counters)
        rcounter = rcounter.at[p].set(WIDE.where(go, counter, rcounter[p]))
        return (rarrived.at[j].add(joining), rnext.at[j].add(joins.sum(dtype=I32)), rcounter, rpolicy, prior)

    carry = (state.rarrived, state.rnext, state.rcounter, dict(state.rpolicy), jnp.asarray(True))
    carry = body(0, carry) if g == 1 else jax.lax.fori_loop(0, g, body, carry)
    rarrived, rnext, rcounter, rpolicy, _ = carry
    return dataclasses.replace(state, rarrived=rarrived, rnext=rnext, rcounter=rcounter, rpolicy=rpolicy)


def _flags(params: ClusterParams, cfg: ClusterConfig) -> dict:
    return {n: table_flags(n, params.gateway.policy[n], cfg.num_clients, cfg.num_rows) for n in cfg.gateway_policies}


def step_lane(state: ClusterState, params: ClusterParams, wl: ClusterWorkload, cfg: ClusterConfig) -> ClusterState:
    """One event of one cluster lane (see the module docstring)."""
    r, w = cfg.replicas, cfg.arrival_width
    flags = _flags(params, cfg)
    t = state.step
    active = ~state.done
    in_horizon = t < params.horizon
    # replicas
    rheads = jax.vmap(_rep_heads)(state.reps)
    due = jax.vmap(completions.due, in_axes=(0, None))(state.reps.calendar, t)
    room, load, queued = jax.vmap(_rep_room, in_axes=(0, 0, None))(state.reps, jnp.arange(r, dtype=I32), params)
    # routers
    at = state.rnext[:, None] + jnp.arange(w + 1, dtype=I32)[None, :]  # [G, W + 1]
    entries = jnp.take_along_axis(wl.timeline, at[:, :, None], axis=1)  # [G, W + 1, 2]
    warr = wl.requests[entries[:, :, 0], ARRIVAL]
    next_arrival = warr[:, 0]
    pending = in_horizon & (next_arrival <= t).any()
    head_index = wl.first + state.rhead
    heads = wl.requests[head_index]
    routers = _router_arrays(state, heads, head_index, params, cfg)
    offer = _router_offer(state, routers, params, cfg, flags)
    ready = active & in_horizon & ~due.any() & ~pending
    dispatching = ready & ~state.dispatched_all & room.any() & offer.has
    clients, has, rstates = jax.vmap(functools.partial(_rep_select, cfg=cfg), in_axes=(0, 0, None, None))(
        state.reps, rheads, t, params.engine)
    prompts = jnp.take_along_axis(rheads[:, :, PROMPT], clients[:, None], axis=1)[:, 0]
    fits = state.reps.context.sum(axis=1) + prompts <= params.engine.kv_budget
    settled = ready & ~dispatching
    admitting = settled & has & fits
    finishing = settled & ~admitting.any()

    state = _dispatch(state, wl, params, cfg, flags, routers, offer, rheads, room, load, queued, dispatching)
    state = dataclasses.replace(state, dispatched_all=state.dispatched_all | settled)
    state = _admit(state, rheads, clients, rstates, admitting, params, cfg)
    state = _finish(state, wl, rheads, routers, params, cfg, flags, finishing, next_arrival)
    completing = active & jax.vmap(completions.due, in_axes=(0, None))(state.reps.calendar, state.step)
    state = _complete(state, params, cfg, completing)
    settled_now = ~jax.vmap(completions.due, in_axes=(0, None))(state.reps.calendar, state.step).any()
    arriving = active & (state.step < params.horizon) & settled_now & (next_arrival <= state.step).any()
    state = _arrive(state, wl, heads, head_index, params, cfg, flags, arriving, entries, warr)
    finished = (state.step >= params.horizon) & settled_now
    return dataclasses.replace(state, done=state.done | (active & finished),
                               iterations=state.iterations + active.astype(I32))


def init_state(cfg: ClusterConfig, params: ClusterParams, wl: ClusterWorkload) -> ClusterState:
    g, k, r = cfg.routers, cfg.num_clients, cfg.replicas
    flags = _flags(params, cfg)
    shape = Shape(num_clients=k, num_rows=cfg.num_rows, num=WIDE)
    rpolicy = {}
    for n in cfg.gateway_policies:
        s = registry.get(n).init(params.gateway.policy[n], shape)
        rpolicy[n] = jax.tree_util.tree_map(lambda x, f: x if f else jnp.broadcast_to(x, (g,) + x.shape), s, flags[n])
    rep = _rep_init(cfg, params.engine)
    reps = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (r,) + x.shape), rep)
    ring_c = ring_d = stamp = None
    if cfg.ring:
        ring_c = WIDE.zeros((cfg.ring, g, k))
        if "drr" in cfg.gateway_policies:
            ring_d = jnp.zeros((cfg.ring, g, k), I32)
        stamp = jnp.full(cfg.ring, -1, I32).at[0].set(0)
    zgk = jnp.zeros((g, k), I32)
    rec = jnp.full((cfg.num_rows, 4), -1, I32) if cfg.record else None
    return ClusterState(
        step=jnp.zeros((), I32), done=params.horizon <= 0, iterations=jnp.zeros((), I32), rhead=zgk, rarrived=zgk,
        rnext=jnp.zeros(g, I32),
        rcounter=WIDE.zeros((g, k)), rlast=jnp.full(g, -1, I32), rpolicy=rpolicy, cursor=jnp.zeros((), I32),
        dispatched_all=jnp.zeros((), bool),
        rr=jnp.zeros(g, I32), dseq=jnp.zeros((), I32), ring_c=ring_c, ring_d=ring_d, stamp=stamp, reps=reps,
        dispatched=jnp.zeros((g, r, k), I32), snap=WIDE.zeros((r, k)), wsnap=WIDE.zeros((r, k)),
        bs=WIDE.zeros((k,)), bsw=WIDE.zeros((k,)), drift=WIDE.zeros(), bsteps=jnp.zeros((), I32),
        wait_hist=jnp.zeros((k, LATENCY_BINS), I32), rec=rec)


def _program_init(cfg: ClusterConfig, batched: ClusterBatch, shared) -> ClusterState:
    return init_state(cfg, batched.params, batched.workload)


def _program_step(state: ClusterState, batched: ClusterBatch, shared, cfg: ClusterConfig) -> ClusterState:
    return step_lane(state, batched.params, batched.workload, cfg)


PROGRAM = LaneProgram(name="cluster", init=_program_init, step=_program_step, done=lambda s: s.done)


# ---- layout: client-major requests -> (router, tenant) blocks ----------------------------

def layout_lane(wl: Workload, params: ClusterParams, *, routers: int) -> ClusterWorkload:
    """One lane's requests in (router, tenant) blocks (see ClusterWorkload). The router of
    the request at position p of tenant k's block is `ingress_router(seed, k, p, P)`; its
    estimate is the estimator's prediction for (k, p) (estimators.py, one value per request)."""
    rows = wl.requests
    n = rows.shape[0]
    k = wl.first.shape[0]
    g = routers
    idx = jnp.arange(n, dtype=I32)
    tenant = (jnp.searchsorted(wl.first, idx, side="right") - 1).astype(I32)
    position = idx - wl.first[tenant]
    real = rows[:, ARRIVAL] < INT32_MAX
    router = ingress_router(params.seed, tenant, position, params.thresholds[tenant])
    est = estimators.estimate(estimators.init(k), params.engine.estimator, tenant, rows[:, OUTPUT], position)
    hot = ((router[:, None] == jnp.arange(g)) & real[:, None]).astype(I32)  # [N, G]
    before = jnp.cumsum(hot, axis=0) - hot
    rank = jnp.take_along_axis(before - before[wl.first[tenant]], router[:, None], axis=1)[:, 0]
    dest = jnp.where(real, router * n + wl.first[tenant] + rank, g * n)
    pad = np.zeros(ROW_FIELDS, np.int32)
    pad[ARRIVAL] = pad[ORDER] = INT32_MAX
    pad[PROMPT] = pad[OUTPUT] = pad[EST] = 1
    out = jnp.broadcast_to(jnp.asarray(pad), (g * n, ROW_FIELDS))
    out = out.at[dest].set(jnp.concatenate([rows, est[:, None]], axis=1), mode="drop")
    first = (jnp.arange(g, dtype=I32)[:, None] * n + wl.first[None, :]).astype(I32)
    lines = []
    for j in range(g):  # router j's rows in (ORDER, row) order; padding (ORDER = INT32_MAX) last
        order = jax.lax.sort((out[j * n:(j + 1) * n, ORDER], idx), num_keys=1, is_stable=True)[1]
        lines.append(jnp.stack([j * n + order, tenant[order]], axis=1))
    timeline = jnp.stack(lines)
    timeline = jnp.concatenate([timeline, jnp.broadcast_to(timeline[:, -1:], (g, TIMELINE_PAD, 2))], axis=1)
    return ClusterWorkload(requests=out, first=first, timeline=timeline.astype(I32), num_requests=wl.num_requests,
                           overflow=wl.overflow)


@functools.partial(jax.jit, static_argnames=("routers", "shared"))
def _layout(wl: Workload, params: ClusterParams, *, routers: int, shared: bool) -> ClusterWorkload:
    return jax.vmap(functools.partial(layout_lane, routers=routers), in_axes=(None if shared else 0, 0))(wl, params)


# ---- planning and running (host) ---------------------------------------------------------

def _tenants(num_clients, lanes: int) -> list[int]:
    out = [int(num_clients)] * lanes if np.ndim(num_clients) == 0 else [int(x) for x in num_clients]
    if len(out) != lanes or min(out) < 1:
        raise InputError(f"need one tenant count >= 1 per lane, got {num_clients}")
    return out


def padded_settings(settings: Settings, tenants: int, num_clients: int) -> Settings:
    """A lane's Settings for K = num_clients tenants when it has `tenants` (weights 1 for
    the silent ones, which never send a request)."""
    if settings.weights is None or tenants == num_clients:
        return settings
    return dataclasses.replace(settings, weights=tuple(settings.client_weights(tenants))
                               + (Fraction(1),) * (num_clients - tenants))


def encode(clusters: Sequence[ClusterSettings], cfg: ClusterConfig, horizons: Sequence[int],
           tenants: Sequence[int] | None = None) -> ClusterParams:
    """The traced params of lanes (one per cluster settings; lane i has tenants[i] <= K)."""
    k = cfg.num_clients
    tenants = _tenants(k if tenants is None else tenants, len(clusters))
    pad = lambda s, n: padded_settings(s, n, k)  # noqa: E731
    eng, _ = encode_settings([pad(c.engine, n) for c, n in zip(clusters, tenants)], k, cfg.engine_policies)
    gate, _ = encode_settings([pad(c.gateway, n) for c, n in zip(clusters, tenants)], k, cfg.gateway_policies)
    arr = lambda f, dt=np.int32: jnp.asarray(np.asarray([f(c) for c in clusters], dt))  # noqa: E731
    thresholds = [_padded(c.thresholds(n), cfg.routers) + [[1 << INGRESS_BITS] * cfg.routers] * (k - n)
                  for c, n in zip(clusters, tenants)]
    return ClusterParams(
        engine=eng, gateway=gate, mode=arr(lambda c: COUNTERS.index(c.counters)), delay=arr(lambda c: c.delay),
        holdback=arr(lambda c: bool(c.holdback), np.bool_), saturation=arr(lambda c: SATURATION.index(c.saturation)),
        kv_limit=arr(lambda c: c.kv_limit), queue_limit=arr(lambda c: c.queue_limit),
        choice=arr(lambda c: CHOICES.index(c.choice)), seed=arr(lambda c: c.seed, np.uint32),
        thresholds=jnp.asarray(np.asarray(thresholds, np.int32)),
        measure_from=arr(lambda c: c.measure_from), horizon=jnp.asarray(np.asarray(horizons, np.int32)),
        replicas=arr(lambda c: c.replicas), routers=arr(lambda c: c.routers),
        tenants=jnp.asarray(np.asarray(tenants, np.int32)))


def _padded(thresholds, routers: int):
    return [row + [1 << INGRESS_BITS] * (routers - len(row)) for row in thresholds]


def _pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def plan_config(clusters: Sequence[ClusterSettings], *, num_clients, tenant_rows: int, min_prompt: int,
                max_prompt: int, max_output: int, max_requests: int, horizon: int, arrival_width: int = 4,
                record: bool = False, lane_max_prompts: Sequence[int] | None = None) -> ClusterConfig:
    """The static config that fits every lane (validated: exact int32 arithmetic, prompts
    that fit M). `num_clients`: K, or one tenant count per lane (K is then the largest)."""
    from vtc_jax.driver.run import MAX_HORIZON, calendar_rows, check_exact_limits

    if not clusters:
        raise InputError("no cluster lanes given")
    if not 1 <= horizon <= MAX_HORIZON:
        raise InputError(f"horizon must be in [1, {MAX_HORIZON}], got {horizon}")
    if not 1 <= arrival_width < TIMELINE_PAD:
        raise InputError(f"arrival_width must be in [1, {TIMELINE_PAD - 1}]")
    tenants = _tenants(num_clients, len(clusters))
    num_clients = max(tenants)
    for i, c in enumerate(clusters):
        c.thresholds(tenants[i])  # validates the ingress matrix against the lane's K
        c.engine.client_weights(tenants[i])  # and its weights
        longest = max_prompt if lane_max_prompts is None else lane_max_prompts[i]
        if longest > c.engine.kv_budget:
            raise InputError(f"prompts up to {longest} tokens exceed the KV budget M={c.engine.kv_budget}; "
                             "they could never be admitted")
        engine = padded_settings(c.engine, tenants[i], num_clients)
        check_exact_limits(engine, num_clients, min_prompt=min_prompt, max_prompt=max_prompt, max_output=max_output,
                           horizon=horizon, max_requests=max_requests, arrival_width=arrival_width)
        gate = dataclasses.replace(engine, policy="vtc_gateway", options=())
        check_exact_limits(gate, num_clients, min_prompt=min_prompt, max_prompt=max_prompt, max_output=max_output,
                           horizon=horizon, max_requests=max_requests, arrival_width=arrival_width)
    waiting = 1
    for c in clusters:
        waiting = max(waiting, c.queue_limit if c.saturation == "queue" else (c.kv_limit - 1) // min_prompt + 1)
    running = max(1, min(max(c.engine.kv_budget for c in clusters) // max(min_prompt, 1), max_requests))
    names = registry.names()
    gates = {c.gateway_policy for c in clusters}
    engines = {c.engine.policy for c in clusters}
    delays = [c.delay for c in clusters if c.counters == "delayed"]
    g = max(c.routers for c in clusters)
    return ClusterConfig(
        num_clients=num_clients, replicas=max(c.replicas for c in clusters), routers=g, tenant_rows=tenant_rows,
        calendar_rows=calendar_rows(max_output), slots=_pow2(running),
        wait_slots=_pow2(min(waiting, max_requests)), gateway_policies=tuple(n for n in names if n in gates),
        engine_policies=tuple(n for n in names if n in engines),
        union=any(c.routers > 1 and c.counters != "per_router" for c in clusters),
        ring=max(delays) if delays and g > 1 else 0,
        arrival_width=arrival_width, record=record)


def run_lanes(workload: Workload, clusters: Sequence[ClusterSettings], horizons: Sequence[int], cfg: ClusterConfig,
              *, shared: bool, event_budget: int, expected_events: int | None = None, chunk: int | None = None,
              mesh=None, progress: Callable | None = None, tenants: Sequence[int] | None = None) -> "ClusterResults":
    """Run lane i (clusters[i], horizons[i], the shared or lane i's client-major
    workload, tenants[i] tenants, default K) to its horizon; returns ClusterResults."""
    params = encode(clusters, cfg, horizons, tenants)
    wl = _layout(workload, params, routers=cfg.routers, shared=shared)
    batch = ClusterBatch(params=params, workload=wl)
    host, done = runner.run(PROGRAM, cfg, batch, None, event_budget=event_budget, chunk=chunk,
                            expected_events=expected_events, mesh=mesh or lane_mesh(), progress=progress)
    overflow = np.asarray(host.reps.overflow).any(axis=1) | np.asarray(jax.device_get(wl.overflow))
    rows = np.asarray(jax.device_get(wl.requests)) if cfg.record else None
    return ClusterResults.collect(host, done & ~overflow, clusters, cfg, rows, jax.device_get(params),
                                  _tenants(cfg.num_clients if tenants is None else tenants, len(clusters)))


def simulate_traces(traces: Sequence[Trace], clusters: Sequence[ClusterSettings], *, num_clients, steps: int,
                    record: bool = False, chunk: int | None = None, arrival_width: int = 4) -> "ClusterResults":
    """Run lane i = trace i under clusters[i] for `steps` steps, all lanes in one compiled
    batch. `num_clients`: K, or one tenant count per lane (lanes of different K, R and G
    share the batch). Every request must fit M (prompt <= M); requests with arrival >=
    steps never arrive. `record`: keep each request's dispatch and admission."""
    if len(traces) != len(clusters) or not traces:
        raise InputError(f"{len(traces)} traces for {len(clusters)} cluster settings")
    tenants = _tenants(num_clients, len(traces))
    k = max(tenants)
    pad = arrival_width + 2
    for t, n in zip(traces, tenants):
        if len(t) == 0:
            raise InputError("a trace has no requests")
        t.validate(n)
    counts = [requests_per_client(t, k) for t in traces]
    rows = _pow2(max(int((c + pad).sum()) for c in counts))  # a bucket: nearby sizes share one program
    cfg = plan_config(clusters, num_clients=tenants, tenant_rows=rows,
                      min_prompt=min(int(t.prompt.min()) for t in traces),
                      max_prompt=max(int(t.prompt.max()) for t in traces),
                      max_output=max(int(t.output.max()) for t in traces), max_requests=max(len(t) for t in traces),
                      horizon=steps, arrival_width=arrival_width, record=record,
                      lane_max_prompts=[int(t.prompt.max()) for t in traces])
    per_lane = []
    for t, c in zip(traces, counts):
        sizes = c + pad
        sizes[-1] += rows - int(sizes.sum())
        per_lane.append(jax.tree_util.tree_map(np.asarray, make_workload(t, k, pad, steps, sizes)))
    workload = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)), *per_lane)
    most = max(len(t) for t in traces)
    return run_lanes(workload, clusters, [steps] * len(clusters), cfg, shared=False,
                     event_budget=steps + 4 * most + 2, chunk=chunk, tenants=tenants)


def source_config(srcs, clusters: Sequence[ClusterSettings], arrival_width: int = 4) -> ClusterConfig:
    """The static config that fits every lane of `srcs` (sources.py) x `clusters`."""
    from vtc_jax.inputs import sources

    uniq = sources.unique(srcs)
    lay = sources.layout(uniq, arrival_width + 2)
    k = uniq[0].num_clients
    return plan_config(clusters, num_clients=k, tenant_rows=lay.num_rows,
                       min_prompt=min(s.lengths()[0] for s in uniq), max_prompt=max(s.lengths()[1] for s in uniq),
                       max_output=max(s.lengths()[2] for s in uniq), max_requests=lay.num_rows,
                       horizon=uniq[0].horizon, arrival_width=arrival_width)


def simulate_sources(srcs, clusters: Sequence[ClusterSettings], seeds: Sequence[int], *, base_seed: int = 0,
                     config: ClusterConfig | None = None, chunk: int | None = None, mesh=None,
                     progress: Callable | None = None) -> "ClusterResults":
    """Lane i: requests generated from seeds[i] and srcs[i] (sources.py), run under
    clusters[i] for the sources' horizon, in one compiled batch."""
    from vtc_jax.driver.run import lane_keys
    from vtc_jax.inputs import sources

    if not (len(srcs) == len(clusters) == len(seeds)) or not seeds:
        raise InputError(f"{len(srcs)} workloads, {len(clusters)} clusters, {len(seeds)} seeds: need one each per lane")
    cfg = config or source_config(srcs, clusters)
    sources.check_batch(srcs)
    uniq = sources.unique(srcs)
    lay = sources.layout(uniq, cfg.arrival_width + 2)
    extra = cfg.tenant_rows - lay.num_rows
    if extra < 0:
        raise InputError("the given cluster config is too small for these lanes' workloads")
    lay = dataclasses.replace(lay, size=lay.size[:-1] + (lay.size[-1] + extra,))
    horizon = uniq[0].horizon
    workload = sources.generate_lanes(lane_keys(seeds, base_seed), sources.stack(srcs), kind=uniq[0].kind,
                                      horizon=horizon, lay=lay, pad=cfg.arrival_width + 2,
                                      num_clients=cfg.num_clients, exact=sources.replays_exactly(seeds))
    expected = horizon + int(4 * max(s.expected_requests() for s in uniq))
    return run_lanes(workload, clusters, [horizon] * len(clusters), cfg, shared=False,
                     event_budget=horizon + 4 * cfg.tenant_rows + 2, expected_events=expected, chunk=chunk, mesh=mesh,
                     progress=progress)


def lane_bytes(cfg: ClusterConfig) -> int:
    """Device bytes one lane needs while it runs (x2 for XLA's buffers)."""
    g, k, r = cfg.routers, cfg.num_clients, cfg.replicas
    rows = cfg.num_rows
    words = ROW_FIELDS * rows + (4 * rows if cfg.record else 0) + 11 * cfg.tenant_rows  # + the generator's
    tables = 4 * rows if any(registry.get(p).arrival_rows for p in cfg.gateway_policies) else 0
    replica = r * ((POOL_FIELDS + 3) * cfg.wait_slots + cfg.calendar_rows + 6 * cfg.slots + 20 * k
                   + (4 * cfg.wait_slots if any(registry.get(p).arrival_rows for p in cfg.engine_policies) else 0))
    other = k * LATENCY_BINS + 3 * g * r * k + 4 * r * k + cfg.ring * g * k * 3
    return 2 * 4 * (words + tables + replica + other) + 4096


# ---- results (host) -------------------------------------------------------------------------

def _exact(a) -> np.ndarray:
    return WIDE.to_int(a)


@dataclasses.dataclass(frozen=True)
class ClusterResults:
    """Per lane (B lanes; exact integers in settings.py units where named `_units`).

    steps: int64[B] steps run; finished: bool[B]; cost_scale, counter_scale: object[B] (Q
    and D of each lane: service units / Q = tokens, counter units / (Q D) = tokens / weight);
    weights: per lane, K Fractions; tenants: int64[B] each lane's own tenant count (the
    rest of the K tenant slots are silent);
    service_units, counter_units: object[B, R, K] replicas' W_k and c_k; admitted,
    completed: int64[B, R, K]; dispatched: int64[B, G, R, K]; router_counter_units:
    object[B, G, K] (index 0 only in the shared mode); policy_state: {policy: {leaf: array
    [B, G, ...]}} the routers' per-tenant policy leaves (wide leaves as exact ints);
    backlogged_units, backlogged_weighted_units: object[B, K] service while every tenant
    is backlogged (and x D / omega_k); drift_units: object[B] max over those steps of
    max_k - min_k of the weighted one; backlogged_steps: int64[B]; wait_hist: int64[B, K,
    H] waiting time (admission - router arrival) histograms; records: int64[B, G * N, 4]
    or None (dispatch step, replica, dispatch sequence, admission step per cluster row;
    -1: not yet) with rows: int64[B, G * N, 6] the cluster rows; iterations: int64[B]."""

    steps: np.ndarray
    finished: np.ndarray
    cost_scale: np.ndarray
    counter_scale: np.ndarray
    weights: list
    tenants: np.ndarray
    service_units: np.ndarray
    counter_units: np.ndarray
    admitted: np.ndarray
    completed: np.ndarray
    dispatched: np.ndarray
    router_counter_units: np.ndarray
    policy_state: dict
    backlogged_units: np.ndarray
    backlogged_weighted_units: np.ndarray
    drift_units: np.ndarray
    backlogged_steps: np.ndarray
    wait_hist: np.ndarray
    records: np.ndarray | None
    rows: np.ndarray | None
    iterations: np.ndarray

    @classmethod
    def collect(cls, host: ClusterState, finished, clusters, cfg: ClusterConfig, rows,
                host_params: ClusterParams, tenants: Sequence[int]) -> "ClusterResults":
        k = cfg.num_clients
        engines = [padded_settings(c.engine, n, k) for c, n in zip(clusters, tenants)]
        scales = [lane_scales(e, k) for e in engines]
        policy_state = {}
        for n in cfg.gateway_policies:  # the per-router leaves (tables left out)
            lane0 = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], host_params.gateway.policy[n])
            tables, wides = (jax.tree_util.tree_leaves(x) for x in _leaf_kinds(n, lane0, cfg.num_clients,
                                                                                  cfg.num_rows))
            out = {}
            for (path, value), table, wide in zip(jax.tree_util.tree_leaves_with_path(host.rpolicy[n]), tables, wides):
                if not table:
                    value = np.asarray(value)
                    out[jax.tree_util.keystr(path).strip("[]'\"")] = (
                        _exact(value) if wide else value.astype(np.int64) if value.dtype.kind in "iub" else value)
            policy_state[n] = out
        return cls(
            steps=np.asarray(host.step, np.int64), finished=np.asarray(finished, bool),
            cost_scale=np.asarray([s[0] for s in scales], dtype=object),
            counter_scale=np.asarray([s[1] for s in scales], dtype=object),
            weights=[e.client_weights(k) for e in engines], tenants=np.asarray(tenants, np.int64),
            service_units=_exact(host.reps.service), counter_units=_exact(host.reps.counter),
            admitted=np.asarray(host.reps.admitted, np.int64), completed=np.asarray(host.reps.completed, np.int64),
            dispatched=np.asarray(host.dispatched, np.int64), router_counter_units=_exact(host.rcounter),
            policy_state=policy_state, backlogged_units=_exact(host.bs), backlogged_weighted_units=_exact(host.bsw),
            drift_units=_exact(host.drift), backlogged_steps=np.asarray(host.bsteps, np.int64),
            wait_hist=np.asarray(host.wait_hist, np.int64),
            records=None if host.rec is None else np.asarray(host.rec, np.int64),
            rows=None if rows is None else np.asarray(rows, np.int64), iterations=np.asarray(host.iterations, np.int64))

    # ---- derived measures (float64) ----

    @property
    def service(self) -> np.ndarray:
        """float64[B, R, K] W_k per replica, tokens."""
        return np.asarray(self.service_units, np.float64) / np.asarray(self.cost_scale, np.float64)[:, None, None]

    @property
    def throughput(self) -> np.ndarray:
        """float64[B] sum over replicas and tenants of W_k / steps (weighted tokens per step)."""
        return self.service.sum(axis=(1, 2)) / np.maximum(self.steps, 1)

    @property
    def backlogged_service(self) -> np.ndarray:
        """float64[B, K] service received in steps where every tenant was backlogged."""
        return np.asarray(self.backlogged_units, np.float64) / np.asarray(self.cost_scale, np.float64)[:, None]

    @property
    def weight_ratio(self) -> np.ndarray:
        """float64[B] backlogged service of tenant 0 over tenant 1 (NaN if tenant 1 got none)."""
        s = self.backlogged_service
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(s[:, 1] > 0, s[:, 0] / np.where(s[:, 1] > 0, s[:, 1], 1), np.nan)

    @property
    def weighted_share_error(self) -> np.ndarray:
        """float64[B] max over tenants of |backlogged share - weight share|."""
        own = np.arange(self.backlogged_units.shape[1])[None, :] < self.tenants[:, None]
        s = np.where(own, self.backlogged_service, 0.0)
        total = s.sum(axis=1, keepdims=True)
        w = np.where(own, np.asarray([[float(x) for x in ws] for ws in self.weights]), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(total > 0, s / np.where(total > 0, total, 1), np.nan)
        return np.where(own, np.abs(share - w / w.sum(axis=1, keepdims=True)), 0.0).max(axis=1)

    @property
    def max_drift(self) -> np.ndarray:
        """float64[B] max over steps where every tenant was backlogged of max_k - min_k of
        (backlogged service / weight), tokens per unit weight."""
        return (np.asarray(self.drift_units, np.float64)
                / (np.asarray(self.cost_scale, np.float64) * np.asarray(self.counter_scale, np.float64)))

    def wait_percentile(self, q: float) -> np.ndarray:
        """float64[B] the q-quantile of waiting time (admission - router arrival, steps) over
        every admitted request (exact below 64 steps, within 1/8 octave above)."""
        from vtc_jax.driver.results import histogram_quantile

        return histogram_quantile(self.wait_hist.sum(axis=1), q)


__all__ = ["ClusterSettings", "ClusterConfig", "ClusterResults", "simulate_traces", "simulate_sources",
           "source_config", "plan_config", "run_lanes", "lane_bytes", "PROGRAM", "COUNTERS", "SATURATION", "CHOICES"]
