"""Prefix caching: client 0's prompts share a cached prefix (a fraction of every prompt),
client 1 always misses. Charging sent tokens (the VTC paper) versus computed tokens (the
model's default): the computed work each client actually receives."""

from __future__ import annotations

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import float_arg, list_arg
from vtc_jax.cli.sweep_command import add_workload_arguments, make_settings, workload_config
from vtc_jax.core.errors import InputError
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.inputs.sources import TrafficSource
from vtc_jax.inputs.traffic import overload
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers


def add_arguments(parser):
    add_workload_arguments(parser, rates="1.0,1.0")
    parser.add_argument("--cached", type=list_arg(float_arg(0.0, 0.999), name="cached fractions", max_items=64),
                        default=[0.25, 0.5, 0.75, 0.9],
                        help="client 0's cached fraction of every prompt (default 0.25,0.5,0.75,0.9)")
    parser.add_argument("--policy", choices=registry.names(), default="vtc", help="scheduler (default vtc)")


def metrics(results, rows):
    out = base_metrics(results, rows)
    computed = results.computed_service
    out["hit_computed_share"] = computed[:, 0] / computed.sum(axis=1)
    out["hit_charged_share"] = results.service[:, 0] / results.service.sum(axis=1)
    out["hit_computed_service"] = computed[:, 0]
    out["miss_computed_service"] = computed[:, 1]
    out["under_service"] = 0.5 - out["hit_computed_share"]  # how far below an equal share
    return out


def build(args) -> Sweep:
    if args.trace is not None:
        raise InputError("--trace does not apply: the sweep varies the cached fraction of synthetic prompts "
                         "(a trace carries its own cached column)")
    if args.server != servers.DEFAULT_SERVER:
        raise InputError(f"--server {args.server} does not model prefix caching (it computes every prompt token), "
                         "so this sweep's cached prefixes would not be what it runs: use --server ideal")
    if len(args.rates) != 2:
        raise InputError(f"--rates needs two rates (cache-hitting client, missing client), got {len(args.rates)}")
    rows = []
    for fraction in args.cached:
        source = TrafficSource(overload(args.rates, args.steps, prompt=args.prompt, output=args.output,
                                        cached_fraction=[fraction, 0.0]))
        for charge in ("sent", "computed"):
            rows.append(Row(make_settings(args, args.policy, charge_cached=charge == "sent"), source,
                            f"{charge} cached={fraction}", {"charge": charge, "cached_fraction": fraction}))
    return Sweep(
        name="prefix_cache", config=dict(workload_config(args), cached=args.cached, policy=args.policy), rows=rows,
        metrics=metrics, measures=("ledger",),
        columns=("hit_computed_share", "hit_charged_share", "hit_computed_service", "miss_computed_service",
                 "throughput"),
        plots=(Plot("scatter", "computed_share.png", "cache-hitting client's share of computed work",
                    "hit_charged_share", "hit_computed_share"),))


def main(argv=None) -> int:
    return sweep_command.main("prefix_cache", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
