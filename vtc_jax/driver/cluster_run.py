"""Running cluster lanes (docs/CLUSTER.md): plan the static config that fits a batch, encode
each lane's ClusterSettings into traced params, lay the workload out per (router, tenant),
run the lanes through the driver's runner (engines/cluster.py's PROGRAM) and collect the
exact results (ClusterResults)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.rows import OUTPUT
from vtc_jax.core.wide import WIDE
from vtc_jax.driver import tiers
from vtc_jax.driver.devices import lane_mesh
from vtc_jax.driver.results import histogram_quantile
from vtc_jax.driver.run import calendar_rows, check_exact_limits, lane_keys, reject_at_arrival, validate_fits
from vtc_jax.engines.settings import check_time_charges
from vtc_jax.driver.cluster_gateway import encode_gateway, gateway_config
from vtc_jax.engines.cluster import PROGRAM, layout_lanes
from vtc_jax.engines.cluster_replica import table_rows
from vtc_jax.engines.cluster_router import leaf_kinds
from vtc_jax.engines.cluster_settings import (
    CHOICES,
    COUNTERS,
    INGRESS_BITS,
    SATURATION,
    ClusterConfig,
    ClusterParams,
    ClusterSettings,
)
from vtc_jax.engines.cluster_state import (
    POOL_FIELDS,
    REC_DISPATCH,
    REC_REPLICA,
    REC_SEQ,
    ROW_FIELDS,
    TIMELINE_PAD,
    ClusterBatch,
    ClusterState,
)
from vtc_jax.engines.settings import MAX_SETTING, Settings, encode_settings, lane_scales
from vtc_jax.inputs import sources
from vtc_jax.inputs.workload import Trace, Workload, make_workload, requests_per_client
from vtc_jax.measures.online import LATENCY_BINS
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers


# ---- planning and running (host) ---------------------------------------------------------

# Slot tiers (driver/tiers.py) over the replicas' servers: a lane where some replica's
# server (or waiting pool) overflowed a tier reruns with the next.
REPLICA_SERVERS = tiers.Lanes(
    servers=lambda host: host.reps.server,
    with_servers=lambda host, tree: dataclasses.replace(host, reps=dataclasses.replace(host.reps, server=tree)),
    overflowed=lambda host: np.asarray(host.reps.overflow, bool).any(axis=1))

def _tenants(num_clients, lanes: int) -> list[int]:
    out = [int(num_clients)] * lanes if np.ndim(num_clients) == 0 else [int(x) for x in num_clients]
    if len(out) != lanes or min(out) < 1:
        raise InputError(f"need one tenant count >= 1 per lane, got {num_clients}")
    return out


def padded_settings(settings: Settings, tenants: int, num_clients: int) -> Settings:
    """A lane's Settings for K = num_clients tenants when it has `tenants`: the silent ones
    (which never send a request) get weight 1, the largest KV cap and band 0."""
    if tenants == num_clients:
        return settings
    extra, changes = num_clients - tenants, {}
    if settings.weights is not None:
        changes["weights"] = tuple(settings.client_weights(tenants)) + (Fraction(1),) * extra
    if isinstance(settings.kv_cap, tuple):
        changes["kv_cap"] = settings.kv_cap + (MAX_SETTING,) * extra
    if settings.bands is not None:
        changes["bands"] = settings.bands + (0,) * extra
    return dataclasses.replace(settings, **changes) if changes else settings


def encode(clusters: Sequence[ClusterSettings], cfg: ClusterConfig, horizons: Sequence[int],
           tenants: Sequence[int] | None = None) -> ClusterParams:
    """The traced params of lanes (one per cluster settings; lane i has tenants[i] <= K)."""
    k = cfg.num_clients
    tenants = _tenants(k if tenants is None else tenants, len(clusters))
    pad = lambda s, n: padded_settings(s, n, k)  # noqa: E731
    eng, _ = encode_settings([pad(c.engine, n) for c, n in zip(clusters, tenants)], k, cfg.engine_policies, cfg.server)
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
        tenants=jnp.asarray(np.asarray(tenants, np.int32)),
        fleet=None if cfg.picker is None else encode_gateway(clusters, cfg.picker_shape, cfg.server))


def _padded(thresholds, routers: int):
    return [row + [1 << INGRESS_BITS] * (routers - len(row)) for row in thresholds]


def _pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def check_server(name: str):
    """The replicas' server (servers.registry): any registered server; a timed one (slora,
    vllm) runs with a clock per replica, one that preempts (vllm) with a requeue per
    replica (docs/CLUSTER.md). A server whose victims go to the tail of its queue or that
    computes in doubles (sglang) is not a replica yet: refused by name."""
    chosen = servers.get(name)
    if chosen.requeue_to_tail or chosen.refused is not None or chosen.x64:
        raise InputError(f"--server {name} cannot be a fleet's replica yet (--replicas): its retraction to the tail "
                         "of the queue is not in the cluster's replicas; run it as one server")
    return chosen


def plan_config(clusters: Sequence[ClusterSettings], *, num_clients, tenant_rows: int, min_prompt: int,
                max_prompt: int, max_output: int, max_requests: int, horizon: int, arrival_width: int = 4,
                record: bool = False, lane_max_prompts: Sequence[int] | None = None,
                server: str = servers.DEFAULT_SERVER) -> ClusterConfig:
    """The static config that fits every lane (validated: exact int32 arithmetic, prompts
    that fit M, the server's settings). `num_clients`: K, or one tenant count per lane (K is
    then the largest); `server`: the replicas' server (`check_server`)."""
    if not clusters:
        raise InputError("no cluster lanes given")
    chosen = check_server(server)
    options = [dict(e.server_options) for e in dict.fromkeys(c.engine for c in clusters)]
    for o in options:
        chosen.validate(o)
    if not 1 <= horizon <= chosen.max_horizon:  # in the server's time unit (ideal: MAX_HORIZON steps)
        raise InputError(f"horizon must be in [1, {chosen.max_horizon}], got {horizon}")
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
        if c.gateway_rules is not None:  # an endpoint picker: no rule of a replica's room bounds its queue
            waiting = max_requests
            break
        waiting = max(waiting, c.queue_limit if c.saturation == "queue" else (c.kv_limit - 1) // min_prompt + 1)
    running = max(1, min(max(c.engine.kv_budget for c in clusters) // max(min_prompt, 1), max_requests))
    names = registry.names()
    gates = {c.gateway_policy for c in clusters}
    engines = {c.engine.policy for c in clusters}
    delays = [c.delay for c in clusters if c.counters == "delayed"]
    g = max(c.routers for c in clusters)
    return ClusterConfig(
        num_clients=num_clients, replicas=max(c.replicas for c in clusters), routers=g, tenant_rows=tenant_rows,
        calendar_rows=calendar_rows(max_output), slots=_pow2(chosen.plan_slots(options, running, max_requests)),
        wait_slots=_pow2(min(waiting, max_requests)), gateway_policies=tuple(n for n in names if n in gates),
        engine_policies=tuple(n for n in names if n in engines),
        union=any(c.routers > 1 and c.counters != "per_router" for c in clusters),
        ring=max(delays) if delays and g > 1 else 0,
        arrival_width=arrival_width, record=record, server=server,
        rpm=any(c.engine.rpm_delays for c in clusters), kv_cap=any(c.engine.kv_cap is not None for c in clusters),
        bands=any(c.engine.bands is not None for c in clusters),
        server_static=tuple(chosen.static_options(options)) if chosen.static_options is not None else (),
        **gateway_config(clusters, max(c.replicas for c in clusters), server))


def run_lanes(workload: Workload, clusters: Sequence[ClusterSettings], horizons: Sequence[int], cfg: ClusterConfig,
              *, shared: bool, event_budget: int, expected_events: int | None = None, chunk: int | None = None,
              mesh=None, progress: Callable | None = None, tenants: Sequence[int] | None = None,
              server_record: Callable | None = None) -> "ClusterResults":
    """Run lane i (clusters[i], horizons[i], the shared or lane i's client-major
    workload, tenants[i] tenants, default K) to its horizon; returns ClusterResults.
    `server_record` (with cfg.record): the replicas' server's per-request record to keep
    (ClusterResults.request_record)."""
    params = encode(clusters, cfg, horizons, tenants)
    engines = [c.engine for c in clusters]
    workload, rejected, shared = reject_at_arrival(workload, engines, horizons, cfg.num_clients, shared)
    wl = layout_lanes(workload, params, routers=cfg.routers, shared=shared)
    batch = ClusterBatch(params=params, workload=wl)
    host, done = tiers.run_in_tiers(cfg, batch, None, program=PROGRAM, lanes_of=REPLICA_SERVERS,
                                    event_budget=event_budget, chunk=chunk, expected_events=expected_events,
                                    mesh=mesh or lane_mesh(), progress=progress)
    overflow = np.asarray(host.reps.overflow).any(axis=1) | np.asarray(jax.device_get(wl.overflow))
    rows = np.asarray(jax.device_get(wl.requests)) if cfg.record else None
    return ClusterResults.collect(host, done & ~overflow, clusters, cfg, rows, jax.device_get(params),
                                  _tenants(cfg.num_clients if tenants is None else tenants, len(clusters)), rejected,
                                  server_record)


def simulate_traces(traces: Sequence[Trace], clusters: Sequence[ClusterSettings], *, num_clients, steps: int,
                    record: bool = False, chunk: int | None = None, arrival_width: int = 4,
                    server: str = servers.DEFAULT_SERVER, server_record: bool = False) -> "ClusterResults":
    """Run lane i = trace i under clusters[i] for `steps` steps, all lanes in one compiled
    batch. `num_clients`: K, or one tenant count per lane (lanes of different K, R and G
    share the batch). Every request must fit M (prompt <= M); requests with arrival >=
    steps never arrive. `record`: keep each request's dispatch and admission. `server`:
    the replicas' server (`check_server`); `server_record` (with `record`): keep the
    replicas' servers' per-request record (ClusterResults.request_record)."""
    if len(traces) != len(clusters) or not traces:
        raise InputError(f"{len(traces)} traces for {len(clusters)} cluster settings")
    tenants = _tenants(num_clients, len(traces))
    k = max(tenants)
    pad = arrival_width + 2
    chosen = check_server(server)
    for t, n, c in zip(traces, tenants, clusters):
        if len(t) == 0:
            raise InputError("a trace has no requests")
        t.validate(n)
        validate_fits(t, c.engine, n, steps, False)
        never = chosen.never_served(dict(c.engine.server_options), t.prompt, t.output, c.engine.kv_budget)
        if never is not None:
            raise InputError(f"server {server}: {never}")
        check_time_charges(c.engine, server)
    counts = [requests_per_client(t, k) for t in traces]
    rows = _pow2(max(int((c + pad).sum()) for c in counts))  # a bucket: nearby sizes share one program
    cfg = plan_config(clusters, num_clients=tenants, tenant_rows=rows,
                      min_prompt=min(int(t.prompt.min()) for t in traces),
                      max_prompt=max(int(t.prompt.max()) for t in traces),
                      max_output=max(int(t.output.max()) for t in traces), max_requests=max(len(t) for t in traces),
                      horizon=steps, arrival_width=arrival_width, record=record,
                      lane_max_prompts=[int(t.prompt.max()) for t in traces], server=server)
    per_lane = []
    for t, c in zip(traces, counts):
        sizes = c + pad
        sizes[-1] += rows - int(sizes.sum())
        per_lane.append(jax.tree_util.tree_map(np.asarray, make_workload(t, k, pad, steps, sizes)))
    workload = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)), *per_lane)
    most = max(len(t) for t in traces)
    keep = servers.request_record(server)[0] if record and server_record and servers.request_record(server) else None
    return run_lanes(workload, clusters, [steps] * len(clusters), cfg, shared=False,
                     event_budget=event_budget(cfg, steps, most), chunk=chunk, tenants=tenants, server_record=keep)


def source_config(srcs, clusters: Sequence[ClusterSettings], arrival_width: int = 4,
                  server: str = servers.DEFAULT_SERVER, record: bool = False) -> ClusterConfig:
    """The static config that fits every lane of `srcs` (sources.py) x `clusters` on the
    replicas' `server` (`record`: keep each request's dispatch, ClusterConfig.record)."""
    uniq = sources.unique(srcs)
    lay = sources.layout(uniq, arrival_width + 2)
    k = uniq[0].num_clients
    return plan_config(clusters, num_clients=k, tenant_rows=lay.num_rows,
                       min_prompt=min(s.lengths()[0] for s in uniq), max_prompt=max(s.lengths()[1] for s in uniq),
                       max_output=max(s.lengths()[2] for s in uniq), max_requests=lay.num_rows,
                       horizon=uniq[0].horizon, arrival_width=arrival_width, record=record, server=server)


def simulate_sources(srcs, clusters: Sequence[ClusterSettings], seeds: Sequence[int], *, base_seed: int = 0,
                     config: ClusterConfig | None = None, chunk: int | None = None, mesh=None,
                     progress: Callable | None = None, server: str = servers.DEFAULT_SERVER) -> "ClusterResults":
    """Lane i: requests generated from seeds[i] and srcs[i] (sources.py), run under
    clusters[i] for the sources' horizon, in one compiled batch (`server`: the replicas',
    ignored when `config` is given)."""
    if not (len(srcs) == len(clusters) == len(seeds)) or not seeds:
        raise InputError(f"{len(srcs)} workloads, {len(clusters)} clusters, {len(seeds)} seeds: need one each per lane")
    cfg = config or source_config(srcs, clusters, server=server)
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
    expected = expected_events(uniq, horizon)
    return run_lanes(workload, clusters, [horizon] * len(clusters), cfg, shared=False,
                     event_budget=event_budget(cfg, horizon, cfg.tenant_rows), expected_events=expected, chunk=chunk, mesh=mesh,
                     progress=progress)


def event_budget(cfg: ClusterConfig, horizon: int, requests: int) -> int:
    """Events that suffice for a lane to reach `horizon`: the server's events per step (a
    BEGIN on a server that preempts) and four per request."""
    return servers.get(cfg.server).events_per_step * horizon + 4 * requests + 2


def expected_events(uniq, horizon: int) -> int:
    """About how many events a lane of these sources takes (for progress and chunk sizes):
    a step per time unit, at most one per generated token (a timed server's horizon counts
    microseconds), and four per request."""
    requests = int(max(s.expected_requests() for s in uniq))
    return min(horizon, requests * max(s.lengths()[2] for s in uniq)) + 4 * requests


def lane_bytes(cfg: ClusterConfig) -> int:
    """Device bytes one lane needs while it runs (x2 for XLA's buffers)."""
    g, k, r = cfg.routers, cfg.num_clients, cfg.replicas
    rows = cfg.num_rows
    words = ROW_FIELDS * rows + (4 * rows if cfg.record else 0) + 11 * cfg.tenant_rows  # + the generator's
    words += rows if cfg.flow_control else 0  # the gateway's per-row status (cluster_shed)
    tables = 4 * rows if any(registry.get(p).arrival_rows for p in cfg.gateway_policies) else 0
    replica = r * ((POOL_FIELDS + 3) * cfg.wait_slots + cfg.calendar_rows + 6 * cfg.slots + 20 * k
                   + (4 * table_rows(cfg) if any(registry.get(p).arrival_rows for p in cfg.engine_policies) else 0))
    other = k * LATENCY_BINS + 3 * g * r * k + 4 * r * k + cfg.ring * g * k * 3
    tokens = r * int(dict(cfg.server_static).get("token_times", 0))  # each replica's per-token record (TokenTimes)
    return 2 * 4 * (words + tables + replica + other + tokens) + 4096


# ---- results (host) -------------------------------------------------------------------------

def _by_row(per_seq, rec: np.ndarray) -> np.ndarray:
    """int64[B, rows]: per cluster row, its replica's entry at its dispatch sequence (a
    replica's server numbers its requests by dispatch sequence: docs/CLUSTER.md,
    "Replicas"), from `per_seq` [B, R, S] and the dispatch records `rec` int64[B, rows, 4];
    -1 for a row never dispatched."""
    per_seq = np.asarray(per_seq, np.int64)
    replica, seq = rec[..., REC_REPLICA], rec[..., REC_SEQ]
    lanes = np.arange(rec.shape[0])[:, None]
    got = per_seq[lanes, np.maximum(replica, 0), np.clip(seq, 0, per_seq.shape[-1] - 1)]
    return np.where(seq >= 0, got, -1)


def _request_times(host: ClusterState, cfg: ClusterConfig, horizon) -> dict:
    """first_token, finish per cluster row (-1: not yet, or in a step still running at the
    lane's horizon), from the replicas' servers' own record (keyed by dispatch sequence,
    written when a step starts) and the dispatch records; None without them."""
    times = _server_times(servers.get(cfg.server))
    if host.rec is None or times is None:
        return {"first_token": None, "finish": None}
    rec = np.asarray(host.rec, np.int64)
    return {name: _reached(_by_row(per_seq, rec), horizon)
            for name, per_seq in zip(("first_token", "finish"), times(host.reps.server))}


def _server_times(chosen) -> Callable | None:
    """The server's host-side (first token, finish) by request: its `request_times`, or
    read from its `request_record` (vLLM's outcome record); None if it keeps neither."""
    if chosen.request_times is not None or chosen.request_record is None:
        return chosen.request_times

    def times(host):
        got = chosen.request_record(host)
        return got["first"], got["finish"]
    return times


def _reached(times: np.ndarray, horizon) -> np.ndarray:
    """int64[B, rows] `times`, -1 past each lane's horizon (int[B]: a step still running
    at the horizon has not ended)."""
    return np.where(times <= np.asarray(horizon, np.int64)[:, None], times, -1)


PER_REQUEST_COUNTS = ("preemptions", "cached", "recomputed")  # a server record's counts, kept per cluster row


def _request_record(host: ClusterState, horizon, rows, server_record: Callable | None) -> dict | None:
    """The replicas' servers' per-request record per cluster row, or None without the
    dispatch records or a `server_record` (host server state -> {"scheduled", "first",
    "finish": int64[B, R, S] by dispatch sequence, "token_at": int64[B, R, T],
    "token_offset": int64[B, R, S or 0]}: servers/slora.py request_record). Returns
    scheduled, first, finish int64[B, rows] (-1: never dispatched, not yet, or in a step
    still running at the lane's horizon, as `_request_times`); the server's counts
    (PER_REQUEST_COUNTS, where it keeps them) and the dispatch (replica, dispatched: its
    replica and the time it left the gateway, -1: never) int64[B, rows]; token_at int64[B, R * T]:
    the replicas' per-token records end to end; token_offset int64[B, rows]: where each
    row's tokens start in it (-1: no whole record: one that ran past its replica's T
    entries must not read the next replica's); under flow control "status" int64[B, rows]
    (cluster_shed: SHED, REJECTED at the gateway, 0 otherwise)."""
    if host.rec is None or server_record is None:
        return None
    rec = np.asarray(host.rec, np.int64)
    got = server_record(host.reps.server)
    out = {name: _reached(_by_row(got[name], rec), horizon) for name in ("scheduled", "first", "finish")}
    out.update({name: _by_row(got[name], rec) for name in PER_REQUEST_COUNTS if name in got})
    dispatched = rec[..., REC_SEQ] >= 0
    out["replica"] = np.where(dispatched, rec[..., REC_REPLICA], -1)
    out["dispatched"] = np.where(dispatched, rec[..., REC_DISPATCH], -1)
    if host.fleet is not None and "status" in host.fleet:
        out["status"] = np.asarray(host.fleet["status"], np.int64)
    at = np.asarray(got["token_at"], np.int64)
    b, r, t = at.shape
    out["token_at"] = at.reshape(b, r * t)
    if t == 0:
        out["token_offset"] = np.full(rec.shape[:2], -1, np.int64)
        return out
    offset = _by_row(got["token_offset"], rec)
    whole = (offset >= 0) & (offset + np.asarray(rows, np.int64)[..., OUTPUT] <= t)
    out["token_offset"] = np.where(whole, np.maximum(rec[..., REC_REPLICA], 0) * t + offset, -1)
    return out


def _drops(host: ClusterState, lanes: int, k: int) -> dict:
    """shed, gateway_rejected int64[B, K] (cluster_shed's counts; zeros without flow control)."""
    fleet = host.fleet if host.fleet is not None and "shed" in host.fleet else None
    return {name: np.zeros((lanes, k), np.int64) if fleet is None else np.asarray(fleet[key], np.int64)
            for name, key in (("shed", "shed"), ("gateway_rejected", "rejected"))}


def _replica_use(host: ClusterState, host_params: ClusterParams) -> dict | None:
    """ClusterResults.replica_use (cluster_fleet.account's sums), None without a picker."""
    if host.fleet is None:
        return None
    return {"busy": np.asarray(host.fleet["busy"], np.int64),
            "kv_time": WIDE.to_int(host.fleet["kv_time"]).astype(np.int64),
            "usable": np.asarray(host_params.fleet.usable, np.int64),
            "replicas": np.asarray(host_params.replicas, np.int64)}


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
    -1: not yet) with rows: int64[B, G * N, 6] the cluster rows; first_token, finish:
    int64[B, G * N] or None (with records, on a server that keeps request times: per cluster
    row, -1 not yet); rejected: int64[B, K] (rpm reject mode); iterations: int64[B];
    request_record: the replicas' servers' per-request record per cluster row (admission,
    first token, finish, each token's time: `_request_record`), or None (kept with records
    when the run asked for it: run_lanes' `server_record`); shed, gateway_rejected:
    int64[B, K] the requests the fleet gateway's flow control shed at its TTL and rejected
    at its band capacity (zeros without flow control: cluster_shed.py); replica_use: behind
    an endpoint picker, per replica "busy" int64[B, R] (time in steps that ran something),
    "kv_time" int64[B, R] (the KV used each such step ended with x its duration, summed;
    exact), "usable" int64[B] (a replica's usable KV) and "replicas" int64[B] (the lane's R),
    else None."""

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
    first_token: np.ndarray | None = None
    finish: np.ndarray | None = None
    rejected: np.ndarray | None = None
    request_record: dict | None = None
    shed: np.ndarray | None = None
    gateway_rejected: np.ndarray | None = None
    replica_use: dict | None = None

    @classmethod
    def collect(cls, host: ClusterState, finished, clusters, cfg: ClusterConfig, rows,
                host_params: ClusterParams, tenants: Sequence[int], rejected=None,
                server_record: Callable | None = None) -> "ClusterResults":
        k = cfg.num_clients
        engines = [padded_settings(c.engine, n, k) for c, n in zip(clusters, tenants)]
        scales = [lane_scales(e, k) for e in engines]
        policy_state = {}
        for n in cfg.gateway_policies:  # the per-router leaves (tables left out)
            lane0 = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], host_params.gateway.policy[n])
            tables, wides = (jax.tree_util.tree_leaves(x) for x in leaf_kinds(n, lane0, cfg.num_clients,
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
            rows=None if rows is None else np.asarray(rows, np.int64), iterations=np.asarray(host.iterations, np.int64),
            **_request_times(host, cfg, host_params.horizon),
            rejected=np.zeros((len(tenants), k), np.int64) if rejected is None else np.asarray(rejected, np.int64),
            request_record=_request_record(host, host_params.horizon, rows, server_record),
            **_drops(host, len(tenants), k), replica_use=_replica_use(host, host_params))

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
        return histogram_quantile(self.wait_hist.sum(axis=1), q)


__all__ = ["ClusterSettings", "ClusterResults", "simulate_traces", "simulate_sources", "source_config", "plan_config",
           "run_lanes", "encode", "lane_bytes", "check_server", "expected_events"]
