"""Every registered policy on real tenants: Alibaba ServeGen's production clients.

The workload is a ServeGen directory (default: the sample in data/servegen/m-large, six
hours of 87 clients of one large model): per client, 600 s windows with a request rate,
an inter-arrival pattern (Gamma or Weibull with the window's CV) and a length
distribution. The six hours are mapped onto --steps steps, and every client's rate is
scaled by one common factor so that the offered load is RHO (--load):

  RHO = E[KV token-steps the generated requests need] / (M * steps),

a request of prompt p and output o needing o * p + o(o+1)/2 token-steps (it holds its
prompt and its growing output for o steps). On --server vllm, RHO is against the server's
measured capacity instead: its requests per step in a saturating run of this length mix
(vtc_jax/driver/capacity.py; one lane of the workload gives the mix), so load 0.8 offers
0.8 of what that server sustains (results.json config: capacity, ideal_rho). The mix between clients stays the real one:
one tenant sends about a quarter of the requests, most send under one percent.

Metrics (per lane; mean and 95% CI over seeds). "Demand" is the full weighted cost
(w_p * prompt + w_q * output) of the requests that arrived; service is what was served.
  throughput             weighted tokens served per step;
  jain                   Jain's index of windowed service among the tenants backlogged in
                         each window (windows of steps/10, stride steps/20), mean;
  small_tenant_p99_wait  p99 of the waits (arrival to admission, steps) of the requests of
                         tenants whose demand is below the median demand of the tenants
                         present in the lane (waits of admitted requests; requests still
                         waiting at the end are in the load line's waiting count);
  heavy_share            the busiest tenant's (largest demand) share of the service;
  heavy_demand           its share of the demand (the two side by side: above 1 to 1 it
                         took more than it asked relative to others, below it was held back);
  offered_over_capacity  (--server vllm) requests that arrived per step over the server's
                         measured capacity (requests per step): the load each lane drew;
  max_slowdown           max over tenants of (served / demanded of the others, pooled) /
                         (its own served / demanded): how much worse the worst-treated
                         tenant fares than everyone else; tenants with under 0.1% of the
                         demand are left out (a single late request makes the ratio noise).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from sweeps.policies import chosen_policies, settings_for
from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import float_arg, int_arg, list_arg, number_text
from vtc_jax.driver import capacity as capacity_mod
from vtc_jax.core.errors import InputError
from vtc_jax.driver.results import histogram_quantile
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs import servegen
from vtc_jax.inputs.sources import ServeGenSource
from vtc_jax.policies import registry
from vtc_jax.policies.estimators import ESTIMATORS
from vtc_jax.servers import registry as servers

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "data" / "servegen" / "m-large"
LOADS = (0.8, 1.0, 1.5, 2.0)
MEASURABLE = 1e-3  # tenants below this share of the demand are left out of max_slowdown


def add_arguments(parser):
    parser.set_defaults(seeds=16)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="a ServeGen directory (chunk-<id>-trace.csv, chunk-<id>-dataset.json; "
                             "default: the shipped m-large sample)")
    parser.add_argument("--load", type=list_arg(float_arg(1e-3, 1e3), name="loads", max_items=16),
                        default=list(LOADS), help="offered loads RHO (default 0.8,1.0,1.5,2.0)")
    parser.add_argument("--policy", type=list_arg(str, name="policies", max_items=64), default=None,
                        help="policies to compare (default: every registered one; rpm left out on --server vllm)")
    parser.add_argument("--steps", type=int_arg(400, 1 << 24), default=20000,
                        help="steps the six hours map onto (default 20000: 1 step = 1.08 s)")
    parser.add_argument("--kv-budget", type=int_arg(512, 1 << 24), default=32768, help="KV budget M (default 32768)")
    parser.add_argument("--max-output", type=int_arg(1, 1 << 16), default=4096,
                        help="outputs are clipped to this many tokens (reported; default 4096)")
    parser.add_argument("--estimator", choices=ESTIMATORS, default=None,
                        help="estimator of every output-predicting policy (default: exact; vtc_gateway fixed 128)")
    parser.add_argument("--estimate-error", type=number_text, default="0", help="--estimator noisy: relative error")


def metrics(results, rows, capacity: capacity_mod.Capacity | None = None):
    """The lane metrics above; with a measured `capacity` also offered_over_capacity: the
    requests that arrived per step over the server's measured requests per step."""
    out = base_metrics(results, rows)
    if capacity is not None:
        out["offered_over_capacity"] = results.arrived.sum(axis=1) / np.maximum(results.steps, 1) / capacity.per_second
    every = results.record_every  # steps / 40
    out["jain"] = results.jain_index(4 * every, 2 * every)[0]
    offered, served = results.offered, results.service
    present = results.arrived > 0
    b = offered.shape[0]
    small_wait = np.full(b, np.nan)
    heavy_share, heavy_demand, slowdown = (np.full(b, np.nan) for _ in range(3))
    for i in range(b):
        if present[i].sum() < 2:
            continue
        demand = offered[i]
        median = np.median(demand[present[i]])
        small = present[i] & (demand < median)
        if small.any() and results.wait_hist is not None:
            small_wait[i] = histogram_quantile(results.wait_hist[i, small].sum(axis=0)[None], 0.99)[0]
        heavy = int(np.argmax(demand))
        heavy_share[i] = served[i, heavy] / max(served[i].sum(), 1e-300)
        heavy_demand[i] = demand[heavy] / demand.sum()
        measurable = demand >= MEASURABLE * demand.sum()
        ratios = []
        for k in np.flatnonzero(measurable):
            others = np.arange(len(demand)) != k
            pooled = served[i, others].sum() / max(demand[others].sum(), 1e-300)
            own = served[i, k] / demand[k]
            ratios.append(pooled / own if own > 0 else np.inf)
        slowdown[i] = max(ratios) if ratios else np.nan
    out.update(small_tenant_p99_wait=small_wait, heavy_share=heavy_share, heavy_demand=heavy_demand,
               max_slowdown=slowdown)
    return out


def read_data(path: Path) -> servegen.ServeGenData:
    if not path.is_dir():
        raise InputError(f"--data {str(path)[:200]!r} is not a directory")
    return servegen.read_servegen(str(path))


def max_prompt(args) -> int | None:
    """The prompt clip: M (the plan's default) on the ideal servers; on a server that
    preempts (vllm) M - max_output + 1, so that every request's peak KV (prompt + output - 1
    tokens) fits its pool and it can finish."""
    if not servers.get(args.server).preempts:
        return None
    if args.max_output >= args.kv_budget:
        raise InputError(f"--max-output {args.max_output} leaves no room for a prompt in the pool of "
                         f"{args.kv_budget} tokens (--num-gpu-blocks x --block-size): lower it")
    return args.kv_budget - args.max_output + 1


def measured_capacity(args, data) -> tuple[capacity_mod.Capacity | None, float | None]:
    """On a server that preempts (vllm): its capacity, measured on the ServeGen length mix
    (one lane of the workload at RHO = 1, seed 0) by a saturating run (driver/capacity.py),
    in requests per step, and the requests per step the ideal model's RHO = 1 offers;
    (None, None) on the ideal servers (RHO is their capacity)."""
    if not servers.get(args.server).preempts:
        return None, None
    plan = servegen.plan(data, load=1.0, kv_budget=args.kv_budget, horizon=args.steps, max_output=args.max_output,
                         max_prompt=max_prompt(args))
    prompt, output = capacity_mod.source_mix(ServeGenSource(plan), args.kv_budget)
    found = capacity_mod.measure(prompt, output, Settings("fcfs", args.kv_budget, server_options=args.server_options),
                                 args.server)
    return found, float(plan.expected_requests.sum()) / args.steps


def build(args) -> Sweep:
    policies = chosen_policies(args)
    for p in policies:
        registry.get(p)
    data = read_data(args.data)
    rows, plans = [], {}
    measured, per_rho = measured_capacity(args, data)
    for load in args.load:
        rho = load if measured is None else load * measured.per_second / per_rho  # the ideal model's RHO
        plan = servegen.plan(data, load=rho, kv_budget=args.kv_budget, horizon=args.steps,
                             max_output=args.max_output, max_prompt=max_prompt(args))
        plans[load] = plan
        source = ServeGenSource(plan)
        capacity = plan.expected_requests.sum() / args.steps / load  # requests per step at load 1
        for p in policies:
            s = settings_for(p, args.kv_budget, capacity=capacity, num_clients=plan.num_clients,
                             estimator=args.estimator, estimate_error=args.estimate_error,
                             server_options=args.server_options)
            rows.append(Row(s, source, f"load {load:g} {p}", {"load": load}))
    first = plans[args.load[0]]
    notes = [first.summary()]
    if first.output_clipped.max() > 0 or first.prompt_clipped.max() > 0:
        notes.append(f"lengths clipped: prompts at {'' if measured else 'M = '}{first.max_prompt} (largest clipped mass "
                     f"of a tenant {first.prompt_clipped.max():.3g}), outputs at {first.max_output} "
                     f"({first.output_clipped.max():.3g})")
    if first.substituted.any():
        notes.append(f"{int(first.substituted.sum())} tenants have no length data: they use the pooled "
                     "distribution of the others")
    plots = []
    for load in args.load:
        plots.append(Plot("clients", f"service_vs_demand_load{load:g}.png",
                          f"load {load:g}: per-tenant service vs demand (weighted tokens/step, means over seeds)",
                          "offered", "served", ylabel="served", where=(("load", load),)))
        plots.append(Plot("client_cdf", f"p99_wait_cdf_load{load:g}.png",
                          f"load {load:g}: CDF over tenants of their p99 wait (steps)", "wait_p99",
                          "fraction of tenants", xlog=True, where=(("load", load),)))
    if measured is not None:
        notes.append(f"loads are against --server {args.server}'s capacity measured on this length mix, "
                     f"{measured.describe()} (a saturating run, driver/capacity.py); load 1 is the ideal model's "
                     f"RHO = {measured.per_second / per_rho:.3g}")
    config = {"data": str(args.data), "policies": policies, "loads": args.load, "steps": args.steps,
              "kv_budget": args.kv_budget, "max_output": args.max_output, "estimator": args.estimator,
              "seconds_per_step": first.seconds_per_step, "client_ids": [int(c) for c in first.client_ids],
              "substituted": [int(c) for c in first.client_ids[first.substituted]],
              "expected_requests_per_lane": {str(l): float(p.expected_requests.sum()) for l, p in plans.items()}}
    if measured is not None:
        config.update(loads_against="measured capacity", capacity=measured.to_json(),
                      ideal_rho={str(l): float(p.load) for l, p in plans.items()})
    columns = ("throughput", "jain", "small_tenant_p99_wait", "heavy_share", "heavy_demand", "max_slowdown")
    lane_metrics = metrics
    if measured is not None:
        columns += ("offered_over_capacity",)
        lane_metrics = functools.partial(metrics, capacity=measured)
    return Sweep(name="tenants", config=config, rows=rows, metrics=lane_metrics, columns=columns,
                 measures=("demand", "latency"), record_every=max(1, args.steps // 40), plots=tuple(plots),
                 clients=False, notes=tuple(notes))


def main(argv=None) -> int:
    return sweep_command.main("tenants", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
