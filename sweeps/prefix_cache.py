"""Prefix caching: client 0's prompts share a cached prefix (a fraction of every prompt),
client 1 always misses. Charging sent tokens (the VTC paper) versus computed tokens
(MODEL.md): the computed work each client actually receives."""

from __future__ import annotations


from vtc_jax.settings import Settings
from vtc_jax.sweep import Plot, Row, Sweep, add_workload_arguments, base_metrics, main, workload_config
from vtc_jax.traffic import overload


def _fractions(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def add_arguments(parser):
    add_workload_arguments(parser, rates="1.0,1.0")
    parser.add_argument("--cached", type=_fractions, default=[0.25, 0.5, 0.75, 0.9],
                        help="client 0's cached fraction of every prompt (default 0.25,0.5,0.75,0.9)")
    parser.add_argument("--policy", default="vtc", help="scheduler (default vtc)")


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
    rows = []
    for fraction in args.cached:
        traffic = overload(args.rates, args.steps, prompt=args.prompt, output=args.output,
                           cached_fraction=[fraction, 0.0])
        for charge in ("sent", "computed"):
            rows.append(Row({"policy": args.policy, "kv_budget": args.kv_budget, "rpm": None, "charge": charge,
                             "cached_fraction": fraction},
                            Settings(args.policy, args.kv_budget, w_p=args.w_p, w_q=args.w_q,
                                     charge_cached=charge == "sent"), traffic, f"{charge} cached={fraction}"))
    return Sweep(
        name="prefix_cache", config=dict(workload_config(args), cached=args.cached), rows=rows, metrics=metrics,
        columns=("hit_computed_share", "hit_charged_share", "hit_computed_service", "miss_computed_service",
                 "throughput"),
        plots=(Plot("scatter", "computed_share.png", "cache-hitting client's share of computed work",
                    "hit_charged_share", "hit_computed_share"),))


if __name__ == "__main__":
    raise SystemExit(main("prefix_cache", __doc__, add_arguments, build))
