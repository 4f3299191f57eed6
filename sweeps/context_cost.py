"""Context-aware decode cost: a long-context client against a short-context one, both
backlogged, for a grid of beta (surcharge per context token). Token drift, resource
(bytes moved) drift and each client's share of resource service, beside the loosened bound."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import list_arg, number_text
from vtc_jax.cli.sweep_command import add_workload_arguments, make_settings, range_arg, workload_config
from vtc_jax.core.errors import InputError
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.inputs.sources import TrafficSource
from vtc_jax.inputs.traffic import overload
from vtc_jax.policies import registry

BETAS = ["0", "1/4096", "1/2048", "3/4096", "1/1024", "3/2048", "1/512", "1/256", "1/128"]


def add_arguments(parser):
    add_workload_arguments(parser, rates="1.0,1.0")
    # Prefill priced at 1/16 of decode (w_p = 1/8, w_q = 2): with w_p = 1 the prefill charge
    # of long prompts alone already over-charges the long client in bytes (see docs/results/context_cost/).
    parser.set_defaults(kv_budget=16384, steps=4000, w_p="1/8")
    parser.add_argument("--long-prompt", type=range_arg, default=(2048, 4096),
                        help="client 0 prompt range (default 2048,4096)")
    parser.add_argument("--betas", type=list_arg(number_text, name="betas", max_items=256), default=BETAS,
                        help="beta grid, exact fractions or decimals (default: nine values, 0 to 1/128)")
    parser.add_argument("--policy", choices=registry.names(), default="vtc", help="scheduler (default vtc)")


def metrics(results, rows):
    out = base_metrics(results, rows)
    r = results.resource
    w = results.service
    out["resource_drift_gb"] = results.resource_max_drift
    out["long_resource_share"] = r[:, 0] / r.sum(axis=1)
    out["long_token_share"] = w[:, 0] / w.sum(axis=1)
    out["resource_gap"] = np.abs(r[:, 0] - r[:, 1]) / r.sum(axis=1)
    beta = np.asarray([float(row.settings.beta) for row in rows])
    w_q = np.asarray([float(row.settings.w_q) for row in rows])
    w_p = np.asarray([float(row.settings.w_p) for row in rows])
    largest_context = np.asarray([sum(row.source.lengths()[1:]) - 1 for row in rows])
    # The per-token decode charge reaches w_q + beta * (largest context): the bound's
    # w_q * M term scales with it.
    u = np.maximum(w_p * results.max_prompt, (w_q + beta * largest_context) * results.kv_budget)
    out["bound"] = 2 * u
    out["drift_over_bound"] = results.max_drift / (2 * u)
    return out


def long_short_source(args) -> TrafficSource:
    """The workload of this sweep and of beta_tune: a long- and a short-context client
    (--rates, --long-prompt and --prompt; no --trace)."""
    if args.trace is not None:
        raise InputError("--trace does not apply: this workload is a long- and a short-context client")
    if len(args.rates) != 2:
        raise InputError(f"--rates needs two rates (long-context client, short-context client), got {len(args.rates)}")
    return TrafficSource(overload(args.rates, args.steps, prompt=[tuple(args.long_prompt), tuple(args.prompt)],
                                  output=args.output))


def build(args) -> Sweep:
    source = long_short_source(args)
    rows = [Row(make_settings(args, args.policy, beta=b), source, f"beta={b}",
                {"beta_value": float(Fraction(b))}) for b in args.betas]
    return Sweep(
        name="context_cost", config=dict(workload_config(args), long_prompt=list(args.long_prompt), betas=args.betas,
                                         policy=args.policy), rows=rows, metrics=metrics, measures=("resource",),
        columns=("long_token_share", "long_resource_share", "max_drift", "resource_drift_gb", "bound",
                 "throughput"),
        plots=(Plot("metric", "resource_share_vs_beta.png", "long-context client's share of bytes moved",
                    "beta_value", "long_resource_share", ylabel="share of resource service"),
               Plot("metric", "token_share_vs_beta.png", "long-context client's share of token service",
                    "beta_value", "long_token_share", ylabel="share of token service"),
               Plot("metric", "drift_vs_beta.png", "token drift vs beta (bound 2U_beta dashed)", "beta_value",
                    "max_drift", extra="bound")))


def main(argv=None) -> int:
    return sweep_command.main("context_cost", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
