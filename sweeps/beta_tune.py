"""Tune beta (the decode surcharge per context token) without gradients.

Objective (lower is better), per candidate beta over a fixed set of seeds:
    mean over seeds of |R_0 - R_1| / (R_0 + R_1)                (resource unfairness)
  + 10 * max(0, (1 - tol) - raw_throughput / raw_throughput(beta=0))  (throughput guard)
on the context_cost workload (a long-context and a short-context client, both backlogged):
the beta that makes token fairness track memory-bandwidth fairness, while keeping raw
tokens per step within `tol` of beta = 0. It is piecewise constant in beta, so the search
is evolution strategies in log2(beta) (antithetic Gaussian perturbations, centered ranks)
feeding optax's Adam, every candidate x seed in one vmapped call per generation. A dense
grid of betas x the same seeds is the check; the tuned beta is re-evaluated on fresh seeds.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import optax

from vtc_jax.settings import InputError, Settings
from vtc_jax.sweep import Plot, Row, Sweep, add_workload_arguments, aggregate, evaluate, format_table, workload_config
from vtc_jax.traffic import overload
from vtc_jax.tune import es_minimize

QUANTUM = 1 << 18  # betas are multiples of 2^-18: exact, and every charge fits int32 at M = 16384
PENALTY = 10.0


def add_arguments(parser):
    add_workload_arguments(parser, rates="1.0,1.0")
    parser.set_defaults(kv_budget=16384, steps=2000, w_p="1/8", seeds=32)
    parser.add_argument("--long-prompt", default="2048,4096", help="client 0 prompt range (default 2048,4096)")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="allowed raw-throughput loss against beta = 0 (default 0.05)")
    parser.add_argument("--grid", type=int, default=160, help="dense-grid betas (default 160)")
    parser.add_argument("--generations", type=int, default=30, help="ES generations (default 30)")
    parser.add_argument("--pairs", type=int, default=8, help="antithetic pairs per generation (default 8)")
    parser.add_argument("--log2-range", default="-14,-5", help="search range of log2(beta) (default -14,-5)")
    parser.add_argument("--fresh-seeds", type=int, default=256, help="seeds for the re-evaluation (default 256)")


def quantize(beta: float) -> Fraction:
    return Fraction(int(round(beta * QUANTUM)), QUANTUM)


def lane_metrics(results, rows):
    r = results.resource
    return {"resource_gap": np.abs(r[:, 0] - r[:, 1]) / r.sum(axis=1),
            "raw_throughput": results.raw_throughput, "throughput": results.throughput,
            "long_resource_share": r[:, 0] / r.sum(axis=1), "max_drift": results.max_drift}


class Objective:
    """Evaluates betas x seeds through the sweep driver (one compile for every call)."""

    def __init__(self, args, traffic, seeds):
        self.args, self.traffic, self.seeds = args, traffic, list(seeds)
        self.calls = 0
        base = self.run([Fraction(0)])
        self.baseline = base.metrics["raw_throughput"].reshape(1, -1).mean()

    def rows(self, betas):
        a = self.args
        return [Row({"policy": "vtc", "kv_budget": a.kv_budget, "rpm": None, "beta": str(b), "beta_value": float(b)},
                    Settings("vtc", a.kv_budget, w_p=a.w_p, w_q=a.w_q, beta=b), self.traffic, f"beta={float(b):.3g}")
                for b in betas]

    def run(self, betas):
        self.calls += 1
        return evaluate("beta_tune", self.rows(betas), self.seeds, lane_metrics, base_seed=self.args.base_seed,
                        chunk=self.args.chunk, devices=self.args.devices)

    def per_lane(self, values, n):
        gap = values.metrics["resource_gap"].reshape(n, -1)
        loss = np.maximum(0.0, (1 - self.args.tolerance) - values.metrics["raw_throughput"].reshape(n, -1).mean(
            axis=1, keepdims=True) / self.baseline)
        return gap + PENALTY * loss

    def __call__(self, thetas):
        betas = [quantize(2.0 ** t) for t in thetas]
        return self.per_lane(self.run(betas), len(betas)).mean(axis=1)


def build_rows(args):
    long_lo, long_hi = (int(x) for x in args.long_prompt.split(","))
    return overload(args.rates, args.steps, prompt=[(long_lo, long_hi), tuple(args.prompt)], output=args.output)


def tune(args) -> dict:
    lo, hi = (float(x) for x in args.log2_range.split(","))
    if not lo < hi:
        raise InputError(f"--log2-range must be LOW,HIGH with LOW < HIGH, got {args.log2_range}")
    if args.seeds < 2 or args.grid < 2 or args.generations < 1 or args.pairs < 1 or args.fresh_seeds < 2:
        raise InputError("--seeds, --grid and --fresh-seeds must be >= 2; --generations and --pairs >= 1")
    traffic = build_rows(args)
    objective = Objective(args, traffic, range(args.seeds))
    es = es_minimize(objective, theta0=(lo + hi) / 2, sigma=0.5, pairs=args.pairs, generations=args.generations,
                     optimizer=optax.adam(0.25), bounds=(lo, hi), seed=args.base_seed)
    tuned = quantize(2.0 ** es.theta)

    grid_betas = [Fraction(0)] + [quantize(2.0 ** t) for t in np.linspace(lo, hi, args.grid)]
    grid_betas = sorted(set(grid_betas) | {tuned})
    grid_values = objective.run(grid_betas)
    per_lane = objective.per_lane(grid_values, len(grid_betas))
    grid_values.metrics["objective"] = per_lane.ravel()
    rows = objective.rows(grid_betas)
    rows_out, _ = aggregate("beta_tune", rows, grid_values, args.seeds)
    means = np.asarray([r["metrics"]["objective"]["mean"] for r in rows_out])
    best = int(np.argmin(means))
    best_ci = rows_out[best]["metrics"]["objective"]["ci95"]
    tuned_row = grid_betas.index(tuned)
    tuned_value = means[tuned_row]
    plausible = [float(b) for b, m in zip(grid_betas, means) if m <= best_ci[1]]

    fresh = Objective(args, traffic, range(10**6, 10**6 + args.fresh_seeds))
    fresh_values = fresh.run([tuned])
    fresh_values.metrics["objective"] = fresh.per_lane(fresh_values, 1).ravel()
    fresh_rows, _ = aggregate("beta_tune", fresh.rows([tuned]), fresh_values, args.fresh_seeds)

    summary = {
        "tuned_beta": float(tuned), "tuned_beta_exact": str(tuned),
        "tuned_objective_grid_seeds": float(tuned_value),
        "grid_min_beta": float(grid_betas[best]), "grid_min_objective": float(means[best]),
        "grid_min_ci95": best_ci, "tuned_within_grid_min_ci": bool(best_ci[0] <= tuned_value <= best_ci[1]),
        "beta_ci95": [min(plausible), max(plausible)],
        "fresh_objective": fresh_rows[0]["metrics"]["objective"],
        "fresh_metrics": fresh_rows[0]["metrics"],
        "baseline_raw_throughput": float(objective.baseline),
        "es_path_log2_beta": es.path.tolist(), "es_fitness_path": es.fitness_path.tolist(),
        "simulator_calls": objective.calls,
    }
    path_betas = [float(quantize(2.0 ** t)) for t in es.path]
    path_objective = np.interp(np.log2(np.maximum(path_betas, 2.0 ** lo)),
                               np.log2(np.maximum([float(b) for b in grid_betas], 2.0 ** (lo - 1))), means)
    config = dict(workload_config(args), long_prompt=args.long_prompt, tolerance=args.tolerance, grid=args.grid,
                  generations=args.generations, pairs=args.pairs, log2_range=[lo, hi], seeds=args.seeds,
                  fresh_seeds=args.fresh_seeds, penalty=PENALTY, tuning=summary)
    return {"sweep": "beta_tune", "config": config, "rows": rows_out,
            "overlays": [{"plot": "objective_vs_beta.png", "x": path_betas, "y": path_objective.tolist(),
                          "label": "ES path (mean of beta)"}]}


def main(argv=None) -> int:
    import jax

    from vtc_jax.sweep import _fail, base_parser, setup_runtime, write_outputs

    parser = base_parser("beta_tune", __doc__)
    add_arguments(parser)
    parser.error = lambda message: _fail(message)
    args = parser.parse_args(argv)
    try:
        setup_runtime(args)
        result = tune(args)
        if jax.process_index() != 0:
            return 0
        sweep = Sweep(name="beta_tune", config=result["config"], rows=(), metrics=lane_metrics,
                      columns=("objective", "resource_gap", "raw_throughput"),
                      plots=(Plot("metric", "objective_vs_beta.png", "objective vs beta (ES path in red)",
                                  "beta_value", "objective", xlog=True),))
        t = result["config"]["tuning"]
        shown = [result["rows"][0], next(r for r in result["rows"] if r["setting"]["beta"] == t["tuned_beta_exact"]),
                 {"label": "tuned, fresh seeds", "metrics": t["fresh_metrics"]}]
        print(format_table(sweep, {"rows": shown}))
        print(f"tuned beta = {t['tuned_beta']:.6g} ({t['tuned_beta_exact']}), plausible range "
              f"[{t['beta_ci95'][0]:.3g}, {t['beta_ci95'][1]:.3g}]; objective {t['tuned_objective_grid_seeds']:.4g} "
              f"vs grid minimum {t['grid_min_objective']:.4g} CI [{t['grid_min_ci95'][0]:.4g}, "
              f"{t['grid_min_ci95'][1]:.4g}] at beta {t['grid_min_beta']:.3g}: "
              f"{'within' if t['tuned_within_grid_min_ci'] else 'OUTSIDE'}; fresh seeds "
              f"{t['fresh_objective']['mean']:.4g}")
        written = write_outputs(sweep, result, args.out, plots=not args.no_plots)
    except InputError as err:
        _fail(str(err))
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
