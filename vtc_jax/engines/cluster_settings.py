"""The cluster's settings (docs/CLUSTER.md): one lane's host-side ClusterSettings (exact,
validated on construction), the static ClusterConfig (sizes: changing one recompiles) and
the traced ClusterParams (one lane's settings as arrays; driver/cluster_run.py encodes
them). Kept apart from the state machine (cluster.py) so the literal reference and the
sweeps read the rules' constants without the engine."""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from fractions import Fraction

import jax
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.engines.settings import INT32_MAX, Params, Settings, to_fraction
from vtc_jax.policies import registry
from vtc_jax.servers.base import ServerShape
from vtc_jax.servers.registry import DEFAULT_SERVER

COUNTERS = ("per_router", "shared", "delayed")
PER_ROUTER, SHARED, DELAYED = range(3)
SATURATION = ("kv", "queue")
KV, QUEUE = range(2)
CHOICES = ("round_robin", "least_kv", "least_queued", "p2c", "affinity")
ROUND_ROBIN, LEAST_KV, LEAST_QUEUED, P2C, AFFINITY = range(5)
INGRESS_BITS = 24
INGRESS_SALT, P2C_SALT, AFFINITY_SALT = 0x632BE5AB, 0x2545F491, 0x5BD1E995
MAX_REPLICAS, MAX_ROUTERS, MAX_DELAY = 64, 16, 64
MAX_GATEWAY_US = 1 << 30  # the gateway's intervals (scrape, tick, TTL): a timed clock's range


# ---- settings (host) ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Gateway:
    """The fleet's gateway (ENGINE_FLEET.md): an endpoint picker in front of the replicas
    and, optionally, llm-d's flow control. Times are in the replicas' clock unit (us on a
    timed server).

    Attributes:
      picker: an endpoint picker (vtc_jax/pickers registry: "llm-d", "dynamo",
        "round-robin", "least-loaded"); it replaces ClusterSettings.choice.
      flow_control: False (llm-d's default): every request is routed at its arrival. True:
        requests wait in the gateway's per-tenant queues; a dispatch cycle runs at each
        enqueue and each tick, dispatches at most one request, and none while the pool is
        saturated (llm-d's utilization detector on the scraped W and KV).
      scrape_us: the metrics scrape interval (W, KV: 50 ms; 0: the picker and the detector
        read the replicas live, BLIS's oracle).
      tick_us: the flow-control tick (1 ms).
      queue_depth, kv_threshold: the saturation detector's thresholds (5, 4/5).
      ties: "random" (seeded from the lane's seed and the request) or "lowest" (tests).
      request_ttl_us: under flow control, a request still queued this long after its
        enqueue is shed at the next TTL sweep (llm-d's FlowControlConfig.defaultRequestTTL,
        60 s; 0: never shed).
      sweep_us: the TTL sweep interval (llm-d's ExpiryCleanupInterval, 1 s).
      band_capacity: under flow control, an arriving request whose priority band already
        holds this many queued requests is rejected (llm-d's PriorityBandConfig.maxRequests,
        5000; 0: no limit). One band: every tenant's queue counts.
    """

    picker: str = "llm-d"
    flow_control: bool = False
    scrape_us: int = 50_000
    tick_us: int = 1000
    queue_depth: int = 5
    kv_threshold: Fraction = Fraction(4, 5)
    ties: str = "random"
    request_ttl_us: int = 60_000_000
    sweep_us: int = 1_000_000
    band_capacity: int = 5000

    def __post_init__(self):
        from vtc_jax.engines import flow_control
        from vtc_jax.pickers import registry as pickers

        if self.picker not in pickers.names():
            raise InputError(f"picker must be one of {', '.join(pickers.names())}, got {self.picker!r}")
        if not isinstance(self.flow_control, (bool, np.bool_)):
            raise InputError(f"flow_control must be True or False, got {self.flow_control!r}")
        _int_in(self.scrape_us, "scrape interval", 0, MAX_GATEWAY_US)
        _int_in(self.tick_us, "flow-control tick", 1, MAX_GATEWAY_US)
        _int_in(self.request_ttl_us, "flow-control request TTL", 0, MAX_GATEWAY_US)
        _int_in(self.sweep_us, "flow-control TTL sweep interval", 1, MAX_GATEWAY_US)
        _int_in(self.band_capacity, "flow-control band capacity", 0, MAX_GATEWAY_US)
        flow_control.saturation_params(self.queue_depth, self.kv_threshold)  # validates
        object.__setattr__(self, "kv_threshold", to_fraction(self.kv_threshold, "KV threshold"))
        if self.ties not in ("random", "lowest"):
            raise InputError(f"picker ties must be random or lowest, got {self.ties!r}")

    def setting_keys(self) -> dict:
        out = {"picker": self.picker, "flow_control": bool(self.flow_control), "scrape_us": self.scrape_us}
        default = Gateway()
        for name in ("request_ttl_us", "band_capacity"):  # named where a run changes llm-d's default
            if self.flow_control and getattr(self, name) != getattr(default, name):
                out[name] = getattr(self, name)
        return out


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
        return "policy rpm is an admission limit; it runs at the replicas (their rpm limit), not at a router"
    return None


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """One cluster lane's settings (host side, exact; validated on construction).

    Attributes:
      engine: the replicas' Settings: engine policy, M (per replica), prices w_p, w_q,
        beta, weights, estimator (exact, fixed or noisy; the same estimate of a request is
        used at its router and at its replica), charge_cached, the replicas' limits (rpm in
        the delay mode, KV caps and bands act at each replica on its own admissions; rpm in
        the reject mode rejects at the cluster's arrival) and the server's options.
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
      seed: the lane's seed for ingress draws, p2c and affinity (and a picker's ties).
      measure_from: first step of the measures taken while every tenant is backlogged.
      gateway_rules: a Gateway (an endpoint picker, flow control) or None (the choice and
        saturation rules above); one router only.
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
    gateway_rules: Gateway | None = None
    gateway: Settings = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        e = self.engine
        if not isinstance(e, Settings):
            raise InputError("engine must be a vtc_jax.Settings")
        if e.estimator == "average":
            raise InputError("the cluster supports the exact, fixed and noisy estimators (not average)")
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
        if self.gateway_rules is not None:
            if not isinstance(self.gateway_rules, Gateway):
                raise InputError("gateway_rules must be a Gateway")
            if self.routers != 1:
                raise InputError(f"an endpoint picker runs at one gateway, got {self.routers} routers")

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
        if self.gateway_rules is not None:
            out.update(self.gateway_rules.setting_keys())
        if self.counters == "delayed":
            out["delay"] = self.delay
        if self.saturation == "kv":
            out["kv_threshold"] = _num(self.kv_threshold)
        else:
            out["queue_limit"] = self.queue_limit
        return out


def _num(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)



# ---- static config, traced params ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Static sizes (changing one recompiles).

    Attributes:
      num_clients: K tenants, replicas: R, routers: G (the most of any lane; a lane's own
        counts are traced, so lanes of different K, R and G share one compiled program).
      tenant_rows: rows of the client-major workload (one router's part of the layout).
      calendar_rows, slots: each replica's server sizes (servers/base.py ServerShape).
      wait_slots: waiting-request slots per replica (the saturation rule bounds them).
      gateway_policies, engine_policies: the policies present (lanes pick by policy_id).
      union: some lane shares knowledge between routers (shared or delayed mode, G > 1).
      ring: slots of the delayed-charge ring (the largest delay; 0: no lane is delayed).
      arrival_width: router arrivals per tenant taken per event (any value is exact).
      record: keep per-request records (dispatch step, replica, sequence, admission step).
      server: the replicas' server, a registry name (servers/registry.py).
      rpm, kv_cap, bands: some lane has an rpm limit that delays admissions, KV caps, bands
        at its replicas (engines/limits.py).
      server_static: the server's static options (ServerShape.static).
      requeue_depth: preempted requests a tenant's stack holds at a replica (servers that
        preempt; engines/requeue.py).
      picker: the lanes' endpoint picker (Gateway.picker; None: the choice rules);
        flow_control: some lane runs llm-d's flow control; picker_shape: the picker's
        static sizes (pickers.base.Shape fields: replicas, blocks, index capacity, ids).
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
    server: str = DEFAULT_SERVER
    rpm: bool = False
    kv_cap: bool = False
    bands: bool = False
    server_static: tuple = ()
    requeue_depth: int = 16
    picker: str | None = None
    flow_control: bool = False
    picker_shape: tuple = ()

    @property
    def num_rows(self) -> int:
        return self.routers * self.tenant_rows

    @property
    def server_shape(self) -> ServerShape:
        """A replica's server: its requests are numbered by dispatch sequence (< num_rows)."""
        return ServerShape(num_clients=self.num_clients, calendar_rows=self.calendar_rows, slots=self.slots,
                           num_rows=self.num_rows, static=self.server_static)


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
    fleet: "FleetParams | None" = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FleetParams:
    """A lane's gateway rules as arrays (Gateway; a batch adds a lane axis). picker: the
    picker's Params (pickers/base.py); saturation: flow_control.SaturationParams; flow:
    bool[] flow control on; scrape_us, tick_us, ttl_us, sweep_us, capacity: int32[] (the
    TTL and the band capacity: Gateway's request_ttl_us and band_capacity); usable: int32[] a
    replica's usable KV (blocks on vLLM: num_gpu_blocks - 1; tokens elsewhere: M); block:
    int32[] the engine's KV block size in tokens (Dynamo's request blocks); blocks, offsets:
    the requests' picker block ids end to end by request number (ORDER): request n's are
    blocks[offsets[n]:offsets[n + 1]] (int32[total + T_MAX], int32[N + 1];
    inputs/picker_blocks.py; none without content)."""

    picker: Any
    saturation: Any
    flow: jax.Array
    scrape_us: jax.Array
    tick_us: jax.Array
    usable: jax.Array
    block: jax.Array
    blocks: jax.Array
    offsets: jax.Array
    ttl_us: jax.Array | None = None
    sweep_us: jax.Array | None = None
    capacity: jax.Array | None = None
