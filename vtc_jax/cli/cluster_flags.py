"""The cluster's flags on `compare` and `replay` (docs/CLUSTER.md, "On your own log"): G
routers in front of R replicas of --server, the ingress from tenant to router, the gateway
counters and policy, the replica choice and saturation. `--routers` or `--replicas` turns
the cluster on (the other defaults to 1); every other cluster flag without them, or one its
choices make meaningless, is refused in one line."""

from __future__ import annotations

import argparse
import dataclasses
from fractions import Fraction

from vtc_jax.cli.common import int_arg, number_text
from vtc_jax.core.errors import InputError
from vtc_jax.engines.cluster_settings import (
    CHOICES,
    COUNTERS,
    MAX_DELAY,
    MAX_GATEWAY_US,
    MAX_REPLICAS,
    MAX_ROUTERS,
    SATURATION,
    ClusterSettings,
    Gateway,
    gateway_problem,
)
from vtc_jax.engines.settings import Settings, to_fraction
from vtc_jax.pickers import registry as pickers
from vtc_jax.policies import registry

DEFAULTS = {"gateway_policy": "fcfs", "counter": "per_router", "delay": 10, "choice": "least_kv",
            "saturation": "kv", "kv_threshold": "1", "queue_limit": 8}
# flags that shape the cluster beyond its size (None: not given)
SHAPING = ("ingress", "skew", "counter", "delay", "no_holdback", "gateway_policy", "choice", "saturation",
           "kv_threshold", "queue_limit", "picker", "flow_control", "scrape_interval", "queue_depth_threshold",
           "kv_cache_util_threshold", "flow_control_default_request_ttl", "flow_control_band_max_requests")
LEGACY = ("ingress", "skew", "counter", "delay", "no_holdback", "choice", "saturation", "kv_threshold", "queue_limit")
FLEET_DEFAULTS = {"scrape_interval": "0.05", "queue_depth_threshold": 5, "kv_cache_util_threshold": "0.8",
                  "flow_control_default_request_ttl": "60", "flow_control_band_max_requests": 5000}
FLOW_ONLY = ("queue_depth_threshold", "kv_cache_util_threshold", "flow_control_default_request_ttl",
             "flow_control_band_max_requests")  # flags of llm-d's flow control
# engine Settings fields a gateway policy may read where the engine policy does not
SHARED_FIELDS = ("weights", "estimator", "estimate_guess", "estimate_error", "lift_last_left")
REPLAY_OMITS = ("on a cluster, --json omits counters, max_drift, max_drift_step, bound_2u, max_drift_over_2u, "
                "throughput and checkpoints (it gives service and counters per replica, dispatches per router, "
                "replica and tenant, and the drift while every tenant waits), its steps are the horizon run (the "
                "drain bound unless --steps: a cluster does not stop at its last completion), and --details omits "
                "rejected, wait_mean, backlogged_drift, bound_2u and backlogged_drift_over_2u")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def add_cluster_flags(parser: argparse.ArgumentParser, *, replay: bool = False) -> None:
    g = parser.add_argument_group("cluster (docs/CLUSTER.md): G routers in front of R replicas of --server")
    g.add_argument("--routers", type=int_arg(1, MAX_ROUTERS), default=None, metavar="G",
                   help="run on a cluster of G routers (default 1 once --replicas is given)"
                        + (f"; {REPLAY_OMITS}" if replay else ""))
    g.add_argument("--replicas", type=int_arg(1, MAX_REPLICAS), default=None, metavar="R",
                   help="run on a cluster of R replicas, each with M = --kv-budget (default 1 once --routers is given)")
    g.add_argument("--ingress", default=None, metavar="TENANT:ROUTER,...",
                   help="the router (0..G-1) each named tenant always enters through; tenants not named enter "
                        "uniformly (default: --skew)")
    g.add_argument("--skew", type=number_text, default=None, metavar="S",
                   help="ingress skew in [0, 1] (default 0, uniform): the k-th tenant (file order: first "
                        "appearance) enters router k mod G with probability S + (1 - S)/G, others (1 - S)/G")
    g.add_argument("--counter", choices=COUNTERS, default=None,
                   help="what the routers know: per_router (default), shared, or delayed (others' charges "
                        "--delay steps late)")
    g.add_argument("--delay", type=int_arg(1, MAX_DELAY), default=None, metavar="D",
                   help=f"--counter delayed: D steps (default {DEFAULTS['delay']})")
    g.add_argument("--no-holdback", action="store_true", default=None,
                   help="--counter shared/delayed: a router offers its own pick (no hold-back)")
    g.add_argument("--gateway-policy", default=None, metavar="P",
                   help="the routers' policy (default fcfs); the listed policies run at the replicas")
    g.add_argument("--choice", choices=CHOICES, default=None, help="replica choice (default least_kv)")
    g.add_argument("--saturation", choices=SATURATION, default=None,
                   help="when a replica has room: kv (default; KV + waiting prompts < --kv-threshold x M) or "
                        "queue (fewer than --queue-limit requests wait there)")
    g.add_argument("--kv-threshold", type=number_text, default=None, metavar="X",
                   help="--saturation kv: X in (0, 64] (default 1)")
    g.add_argument("--queue-limit", type=int_arg(1, 1 << 16), default=None, metavar="Q",
                   help=f"--saturation queue: Q (default {DEFAULTS['queue_limit']})")
    f = parser.add_argument_group("fleet gateway (docs/FLEET.md): an endpoint picker and llm-d's flow control "
                                  "in front of --replicas R")
    f.add_argument("--picker", choices=pickers.names(), default=None,
                   help="the gateway's endpoint picker: llm-d (its default scorer: queue 2, KV 2, prefix 3), dynamo "
                        "(Dynamo's KV router cost), round-robin, least-loaded; replaces --choice and --saturation")
    f.add_argument("--flow-control", action="store_true", default=None,
                   help="llm-d's flow control: requests wait in per-tenant queues at the gateway and --policies "
                        "are the gateway's fairness policies (each replica runs vLLM's own fcfs order); without "
                        "it every request is routed at its arrival and --policies run at the replicas")
    f.add_argument("--scrape-interval", type=number_text, default=None, metavar="S",
                   help="seconds between the replicas' metrics scrapes (W, KV) the picker and the saturation "
                        f"detector read (default {FLEET_DEFAULTS['scrape_interval']}; 0: live)")
    f.add_argument("--queue-depth-threshold", type=int_arg(1, 256), default=None, metavar="Q",
                   help="--flow-control: llm-d's saturation detector queueDepthThreshold (default 5)")
    f.add_argument("--kv-cache-util-threshold", type=number_text, default=None, metavar="X",
                   help="--flow-control: llm-d's saturation detector kvCacheUtilThreshold in (0, 1] (default 0.8)")
    f.add_argument("--flow-control-default-request-ttl", type=number_text, default=None, metavar="S",
                   help="--flow-control: seconds a request may wait at the gateway; one still queued S s after its "
                        "enqueue is shed at the next TTL sweep (every 1 s) and counted, never served (llm-d's "
                        "FlowControlConfig defaultRequestTTL; default 60; 0: never shed)")
    f.add_argument("--flow-control-band-max-requests", type=int_arg(0, MAX_GATEWAY_US), default=None, metavar="N",
                   help="--flow-control: requests the gateway's priority band may hold; an arrival that finds N "
                        "queued is rejected and counted, never served (llm-d's PriorityBandConfig maxRequests; "
                        "default 5000; 0: no limit; one band: every tenant's queue counts)")


def given(args) -> bool:
    """Whether the command runs on a cluster; refuses a cluster flag without one, and
    --server a replica cannot run."""
    on = args.routers is not None or args.replicas is not None
    if not on:
        for dest in SHAPING:
            if getattr(args, dest) is not None:
                raise InputError(f"{_flag(dest)} applies to a cluster: give --routers G and/or --replicas R")
        return False
    from vtc_jax.driver.cluster_run import check_server

    check_server(args.server)
    return True


def gateway_policy(args) -> str:
    """The routers' policy (registry name), refused if a gateway cannot run it."""
    name = args.gateway_policy or DEFAULTS["gateway_policy"]
    registry.get(name)  # names the choices if unknown
    problem = gateway_problem(name)
    if problem:
        raise InputError(f"--gateway-policy: {problem}")
    return name


def _value(args, dest: str):
    value = getattr(args, dest)
    return DEFAULTS[dest] if value is None else value


def check_flags(args) -> None:
    """Refuse cluster flags that the other choices make meaningless (one line each)."""
    counter, saturation = _value(args, "counter"), _value(args, "saturation")
    if args.ingress is not None and args.skew is not None:
        raise InputError("--ingress and --skew both set where tenants enter: give one")
    if args.delay is not None and counter != "delayed":
        raise InputError(f"--delay applies to --counter delayed (the run uses --counter {counter})")
    if args.no_holdback and counter == "per_router":
        raise InputError("--no-holdback applies to --counter shared or delayed (per-router routers never hold back)")
    if args.kv_threshold is not None and saturation != "kv":
        raise InputError(f"--kv-threshold applies to --saturation kv (the run uses --saturation {saturation})")
    if args.queue_limit is not None and saturation != "queue":
        raise InputError(f"--queue-limit applies to --saturation queue (the run uses --saturation {saturation})")
    if args.picker is None:
        for dest in ("flow_control", "scrape_interval"):
            if getattr(args, dest) is not None:
                raise InputError(f"{_flag(dest)} applies to a fleet gateway: give --picker")
    else:
        for dest in LEGACY:
            if getattr(args, dest) is not None:
                raise InputError(f"{_flag(dest)} is a rule of the routers' cluster; with --picker the gateway "
                                 "routes with the picker (and --flow-control)")
        if (args.routers or 1) != 1:
            raise InputError(f"--picker runs at one gateway: leave out --routers (got {args.routers})")
    if not args.flow_control:
        for dest in FLOW_ONLY:
            if getattr(args, dest) is not None:
                raise InputError(f"{_flag(dest)} applies to --flow-control (llm-d's flow control at the gateway)")
        if args.gateway_policy is not None and args.picker is not None:
            raise InputError("--gateway-policy: without --flow-control the gateway routes every request at its "
                             "arrival; with it, --policies are the gateway's")
    if getattr(args, "estimate_seed", None) is not None:
        raise InputError("--estimate-seed: on a cluster each lane's estimate noise is seeded from its sweep seed "
                         "(docs/CLUSTER.md); leave it out")


def ingress_rows(text: str, names: list[str], routers: int) -> tuple:
    """--ingress TENANT:ROUTER,... as the K x G matrix of exact probabilities: a named tenant
    enters its router always, the others uniformly."""
    index = {name: k for k, name in enumerate(names)}
    chosen: dict[int, int] = {}
    for item in text.split(","):
        tenant, sep, router = item.strip().rpartition(":")
        if not sep or not tenant:
            raise InputError(f"--ingress: expected TENANT:ROUTER, got {item.strip()[:40]!r}")
        if tenant not in index:
            known = ", ".join(names[:8]) + ("..." if len(names) > 8 else "")
            raise InputError(f"--ingress: unknown tenant {tenant[:40]!r} (the log's tenants: {known})")
        if index[tenant] in chosen:
            raise InputError(f"--ingress: tenant {tenant[:40]!r} is named twice")
        if not router.strip().isdigit() or int(router) >= routers:
            raise InputError(f"--ingress: tenant {tenant[:40]!r}: router must be an index in 0..{routers - 1} "
                             f"(--routers {routers}), got {router.strip()[:24]!r}")
        chosen[index[tenant]] = int(router)
    uniform = (Fraction(1, routers),) * routers
    return tuple(tuple(Fraction(int(j == chosen[k])) for j in range(routers)) if k in chosen else uniform
                 for k in range(len(names)))


def merged_engine(engine: Settings, gateway: Settings) -> Settings:
    """The replicas' Settings carrying what only the gateway policy reads (its weights,
    estimator): the routers' Settings are the replicas' with the gateway policy."""
    default = Settings()
    taken = {f: getattr(gateway, f) for f in SHARED_FIELDS
             if getattr(engine, f) == getattr(default, f) and getattr(gateway, f) != getattr(default, f)}
    return dataclasses.replace(engine, **taken) if taken else engine


def gateway_rules(args, per_second: int) -> Gateway | None:
    """The fleet gateway of --picker (None without), its times on the clock of `per_second`
    ticks a second (the replicas': us on a timed server)."""
    if args.picker is None:
        return None
    scrape = to_fraction(args.scrape_interval or FLEET_DEFAULTS["scrape_interval"], "--scrape-interval")
    if not 0 <= scrape <= 60:
        raise InputError(f"--scrape-interval must be in [0, 60] seconds, got {args.scrape_interval}")
    ttl = to_fraction(args.flow_control_default_request_ttl or FLEET_DEFAULTS["flow_control_default_request_ttl"],
                      "--flow-control-default-request-ttl")
    if not 0 <= ttl * per_second <= MAX_GATEWAY_US:
        raise InputError(f"--flow-control-default-request-ttl must be in [0, {MAX_GATEWAY_US // per_second}] seconds, "
                         f"got {args.flow_control_default_request_ttl}")
    capacity = args.flow_control_band_max_requests
    return Gateway(picker=args.picker, flow_control=bool(args.flow_control), scrape_us=round(scrape * per_second),
                   tick_us=max(1, per_second // 1000), request_ttl_us=round(ttl * per_second), sweep_us=per_second,
                   band_capacity=FLEET_DEFAULTS["flow_control_band_max_requests"] if capacity is None else capacity,
                   queue_depth=args.queue_depth_threshold or FLEET_DEFAULTS["queue_depth_threshold"],
                   kv_threshold=to_fraction(args.kv_cache_util_threshold or FLEET_DEFAULTS["kv_cache_util_threshold"],
                                            "--kv-cache-util-threshold"))


def cluster_settings(args, engine: Settings, gateway: Settings, names: list[str],
                     per_second: int = 1_000_000) -> ClusterSettings:
    """One row's ClusterSettings: `engine` (the replicas' policy and prices, from the
    scheduler flags) and `gateway` (the same flags read for the gateway policy). With
    --picker: the fleet gateway; under --flow-control the row's policy is the gateway's and
    the replicas run fcfs (vLLM's own order)."""
    rules = gateway_rules(args, per_second)
    if rules is not None:
        if rules.flow_control:
            problem = gateway_problem(engine.policy)
            if problem:
                raise InputError(f"--flow-control: {problem}")
            gateway, engine = engine, dataclasses.replace(engine, policy="fcfs", options=())
        return ClusterSettings(engine=merged_engine(engine, gateway), gateway_policy=gateway.policy,
                               gateway_options=gateway.options, replicas=args.replicas or 1, gateway_rules=rules)
    g = args.routers or 1
    skew = to_fraction(args.skew or "0", "--skew")
    if not 0 <= skew <= 1:
        raise InputError(f"--skew must be in [0, 1], got {args.skew}")
    counter = _value(args, "counter")
    return ClusterSettings(
        engine=merged_engine(engine, gateway), gateway_policy=gateway.policy, gateway_options=gateway.options,
        replicas=args.replicas or 1, routers=g, skew=skew,
        ingress=ingress_rows(args.ingress, names, g) if args.ingress is not None else None,
        counters=counter, delay=_value(args, "delay") if counter == "delayed" else 1,
        holdback=not args.no_holdback, saturation=_value(args, "saturation"),
        kv_threshold=to_fraction(_value(args, "kv_threshold"), "--kv-threshold"),
        queue_limit=_value(args, "queue_limit"), choice=_value(args, "choice"))


def describe(args, gateway: str) -> dict:
    """The cluster's settings for results.json "config" (what every row shares)."""
    if args.picker is not None:
        return {"routers": 1, "replicas": args.replicas or 1, "picker": args.picker,
                "flow_control": bool(args.flow_control),
                "gateway_policy": "the row's policy" if args.flow_control else "none (routed at arrival)",
                "scrape_interval_s": str(args.scrape_interval or FLEET_DEFAULTS["scrape_interval"]),
                **({"request_ttl_s": str(args.flow_control_default_request_ttl
                                         or FLEET_DEFAULTS["flow_control_default_request_ttl"]),
                    "band_max_requests": FLEET_DEFAULTS["flow_control_band_max_requests"]
                    if args.flow_control_band_max_requests is None else args.flow_control_band_max_requests}
                   if args.flow_control else {}),
                "counters": "per_router"}
    counter = _value(args, "counter")
    out = {"routers": args.routers or 1, "replicas": args.replicas or 1, "gateway_policy": gateway,
           "counters": counter, "choice": _value(args, "choice"), "saturation": _value(args, "saturation")}
    if args.ingress is not None:
        out["ingress"] = args.ingress
    else:
        out["skew"] = args.skew or "0"
    if counter == "delayed":
        out["delay"] = _value(args, "delay")
    if counter != "per_router":
        out["holdback"] = not args.no_holdback
    key = "kv_threshold" if out["saturation"] == "kv" else "queue_limit"
    out[key] = _value(args, key)
    return out
