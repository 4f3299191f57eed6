"""The cluster (docs/CLUSTER.md) behind the one sweep driver (sweep.py): `ClusterEngine`,
the adapter for rows whose settings are ClusterSettings and whose source is any sources.py
source (sweeps.cluster's Poisson traffic, a user's log in `compare`), and
`simulate_tenants`, the per-tenant results a log's commands print (`compare`, `replay`).

`ClusterEngine()` returns the cluster's own ClusterResults (its sweep's metrics only).
`ClusterEngine(per_tenant=True)` returns `TenantResults`: besides those, what the driver's
per-client tables and load line read (shares of service and demand, waits, the offered
work), so a cluster row reports per tenant exactly as a MODEL.md row does; with
`server_record` also the replicas' per-request record (cluster_latency.py reads it)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.driver.cluster_run import (
    ClusterResults,
    encode,
    event_budget,
    expected_events,
    lane_bytes,
    run_lanes,
    simulate_sources,
    source_config,
)
from vtc_jax.driver.results import ServedShares, histogram_quantile, lane_workload_stats
from vtc_jax.driver.run import lane_keys
from vtc_jax.engines.cluster_settings import ClusterConfig, ClusterSettings
from vtc_jax.inputs import sources
from vtc_jax.policies.estimators import mix32
from vtc_jax.servers.registry import DEFAULT_SERVER


def lane_settings(cs: ClusterSettings, seed: int, base_seed: int) -> ClusterSettings:
    """The row's settings with the lane's own seeds (ingress, p2c, affinity, estimate noise),
    derived from its sweep seed: int seed, base_seed in [0, 2^32)."""
    mixed = int(mix32(jnp.uint32((seed * 0x9E3779B1 + base_seed) & 0xFFFFFFFF)))
    engine = dataclasses.replace(cs.engine, estimate_seed=int(mix32(jnp.uint32(mixed ^ 0x85EBCA6B))))
    return dataclasses.replace(cs, engine=engine, seed=mixed)


@dataclasses.dataclass(frozen=True)
class TenantResults(ServedShares):
    """Per lane (B lanes, K tenants), what a MODEL.md LaneResults gives per tenant, for a
    cluster lane; float64 tokens unless named otherwise.

    cluster: the ClusterResults of the lanes (every exact value, per replica and router).
    steps: int64[B] the horizon run (a cluster lane does not stop at its last completion:
      in drain mode this is the drain bound); finished: bool[B] (drain: every request
      completed); service: [B, K] W_k summed over replicas; arrived, admitted, completed,
      waiting: int64[B, K] (waiting: at a router or a replica, not yet admitted; a fleet
      gateway's shed and rejected requests are not waiting: ClusterResults.shed);
      offered: [B, K] the full cost of the requests that arrived; offered_steps: int64[B]
      the span the load line reads (drain: the last arrival + 1, else `steps`);
      span_service: [B, K] W after that span; span_waiting: int64[B] requests not admitted
      by its end; wait_hist: int64[B, K, H] (admission - router arrival, steps)."""

    cluster: ClusterResults
    steps: np.ndarray
    finished: np.ndarray
    service: np.ndarray
    arrived: np.ndarray
    admitted: np.ndarray
    completed: np.ndarray
    waiting: np.ndarray
    offered: np.ndarray
    offered_steps: np.ndarray
    span_service: np.ndarray
    span_waiting: np.ndarray
    wait_hist: np.ndarray

    def latency_percentile(self, which: str, q: float) -> np.ndarray:
        """float64[B, K] the q-quantile of waits (which == "wait"; the cluster keeps no
        completion-time histogram), as LaneResults.latency_percentile."""
        if which != "wait":
            raise InputError(f"the cluster measures waiting times only, not {which!r}")
        return histogram_quantile(self.wait_hist, q)


def simulate_tenants(srcs, clusters: Sequence[ClusterSettings], seeds: Sequence[int], *, base_seed: int = 0,
                     config: ClusterConfig | None = None, mesh=None, progress: Callable | None = None,
                     server: str = DEFAULT_SERVER, server_record: Callable | None = None) -> TenantResults:
    """Lane i: requests from seeds[i] and srcs[i] (sources.py) under clusters[i] (its seeds
    as given: see `lane_settings`), for the sources' horizon, with the per-tenant values of
    TenantResults. A draining source also runs each lane to its own arrival span (the last
    arrival + 1 steps) in the same batch: a run of horizon T reports the state after step
    T - 1, so that lane's state is the main lane's at the span's end, exactly.
    `server_record` (a config with records): the replicas' per-request record to keep
    (cluster_run.run_lanes)."""
    if not (len(srcs) == len(clusters) == len(seeds)) or not seeds:
        raise InputError(f"{len(srcs)} workloads, {len(clusters)} clusters, {len(seeds)} seeds: need one each per lane")
    cfg = config or source_config(srcs, clusters, server=server)
    uniq = sources.unique(srcs)
    pad = cfg.arrival_width + 2
    lay = sources.layout(uniq, pad)
    extra = cfg.tenant_rows - lay.num_rows
    if extra < 0:
        raise InputError("the given cluster config is too small for these lanes' workloads")
    lay = dataclasses.replace(lay, size=lay.size[:-1] + (lay.size[-1] + extra,))
    horizon, b, k = uniq[0].horizon, len(clusters), cfg.num_clients
    workload = sources.generate_lanes(lane_keys(seeds, base_seed), sources.stack(srcs), kind=uniq[0].kind,
                                      horizon=horizon, lay=lay, pad=pad, num_clients=k,
                                      exact=sources.replays_exactly(seeds))
    costs = encode(clusters, cfg, [horizon] * b).engine  # the replicas' prices: what the offered work costs
    arrived, offered_units, _, _, last = lane_workload_stats(workload, np.full(b, horizon), costs, False, k)
    drain = sources.drains(uniq[0])
    span = np.minimum(last + 1, horizon) if drain else np.full(b, horizon)
    lanes, horizons = (list(clusters) * 2, [horizon] * b + [int(s) for s in span]) if drain else \
        (list(clusters), [horizon] * b)
    if drain:
        workload = jax.tree_util.tree_map(lambda x: jnp.concatenate([x, x]), workload)
    expected = expected_events(uniq, horizon)
    res = run_lanes(workload, lanes, horizons, cfg, shared=False, event_budget=event_budget(cfg, horizon, cfg.tenant_rows),
                    expected_events=expected, mesh=mesh, progress=progress, server_record=server_record)
    main = _lanes(res, slice(0, b))
    ends = _lanes(res, slice(b, 2 * b)) if drain else main
    admitted, completed = main.admitted.sum(axis=1), main.completed.sum(axis=1)
    dropped = main.shed + main.gateway_rejected  # a fleet gateway's flow control: never served, never waiting
    finished = main.finished & ends.finished
    if drain:  # a drained lane counts only once every request completed (or was dropped at the gateway)
        finished &= (completed + dropped).sum(axis=1) == arrived.sum(axis=1)
    scale = np.asarray(main.cost_scale, np.float64)[:, None]
    return TenantResults(
        cluster=main, steps=main.steps, finished=finished, service=main.service.sum(axis=1), arrived=arrived,
        admitted=admitted, completed=completed, waiting=arrived - admitted - dropped, offered=offered_units / scale,
        offered_steps=span.astype(np.int64), span_service=ends.service.sum(axis=1),
        span_waiting=(arrived - ends.admitted.sum(axis=1) - ends.shed - ends.gateway_rejected).sum(axis=1),
        wait_hist=main.wait_hist)


def tenant_metrics(results: TenantResults, rows) -> dict:
    """A log's cluster rows, per lane (float64[B]; docs/CLUSTER.md, "Measures", with the
    warm-up 0): all_backlogged_drift (max over the steps in which EVERY tenant waits of
    max_k - min_k of their service in those steps / weight, tokens per unit weight: the
    cluster's max_drift, not compare's pairwise backlogged drift), all_backlogged_steps (how
    many such steps), wait_p50 and wait_p99 over every admitted request (steps from router
    arrival to admission). The load line and the per-tenant values come from the driver."""
    c = results.cluster
    return {"all_backlogged_drift": c.max_drift, "all_backlogged_steps": c.backlogged_steps.astype(np.float64),
            "wait_p50": c.wait_percentile(0.5), "wait_p99": c.wait_percentile(0.99)}


def _lanes(res: ClusterResults, lanes: slice) -> ClusterResults:
    """Lanes `lanes` of `res` (every per-lane field)."""
    def part(x):
        if isinstance(x, dict):
            return {key: part(v) for key, v in x.items()}
        if isinstance(x, list):
            return x[lanes]
        return None if x is None else np.asarray(x)[lanes]
    return dataclasses.replace(res, **{f.name: part(getattr(res, f.name)) for f in dataclasses.fields(res)})


@dataclasses.dataclass(frozen=True)
class ClusterEngine:
    """The cluster lane behind the sweep driver (vtc_jax.driver.sweep): rows whose settings
    are ClusterSettings; each lane gets its own seeds from its sweep seed (`lane_settings`).
    `per_tenant`: return TenantResults (the driver then adds the load line and per-client
    values; a draining source's lanes also run to their arrival span: twice the lanes).
    `server_record` (with per_tenant): the replicas' server's per-request record (host
    server state -> dict: servers/slora.py request_record), kept per request in
    `TenantResults.cluster.request_record` (the config then keeps each dispatch's replica
    and sequence, which map the one to the other)."""

    per_tenant: bool = False
    server_record: Callable | None = None
    name = "cluster"

    @staticmethod
    def group_key(row):
        return (row.server, row.settings.replicas, row.source.horizon, id(row.source))

    def config(self, rows, record_every: int = 0, measures=None):
        return source_config([r.source for r in rows], [r.settings for r in rows], server=rows[0].server,
                             record=self.server_record is not None)

    def run(self, rows, seeds, config, base_seed: int, mesh, progress):
        clusters = [lane_settings(r.settings, s, base_seed) for r, s in zip(rows, seeds)]
        if self.per_tenant:
            return simulate_tenants([r.source for r in rows], clusters, list(seeds), base_seed=base_seed,
                                    config=config, mesh=mesh, progress=progress, server_record=self.server_record)
        return simulate_sources([r.source for r in rows], clusters, list(seeds), base_seed=base_seed, config=config,
                                mesh=mesh, progress=progress)

    def lane_bytes(self, config) -> int:
        return lane_bytes(config) * (2 if self.per_tenant else 1)

    @staticmethod
    def steps(config, rows) -> int:
        return max(r.source.horizon for r in rows)


__all__ = ["ClusterEngine", "TenantResults", "lane_settings", "simulate_tenants", "tenant_metrics"]
