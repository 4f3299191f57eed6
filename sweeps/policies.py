"""Every registered policy on four workloads: which policy to deploy?

  overload   the seed's two clients, Poisson 1.0 and 0.25 requests/step, both far over
             their share (the seed's first experiment);
  return     client 0 quiet (0.02/step), silent from step 2000, back at 4000 with 1.0/step;
             client 1 steady at 1.0 (the seed's second experiment);
  weighted   four clients with weights 1:2:3:4, each at 0.5 requests/step (all overloaded);
  zipf       16 clients with Zipf(1.1) request rates whose total is 1.5x the server's
             capacity (capacity = M / E[o * p + o(o+1)/2] requests per step: the KV
             token-steps a request needs; at the default lengths 0.0943 requests/step).
Lengths: prompts U[64, 512], outputs U[32, 384]; M = 8192, w_p = 1, w_q = 2, 6000 steps.
Policies that predict outputs use the exact output unless --estimator says otherwise,
except vtc_gateway, which uses llm-d's fixed guess of 128 tokens; rpm uses a limit of each
client's fair share of capacity per 2000-step window.

Metrics (per lane; mean and 95% CI over seeds):
  max_drift            max over steps of max_k W_k - min_k W_k;
  backlogged_drift     the same over intervals in which both clients of a pair are
                       backlogged (max over pairs): the quantity of the 2U bound;
  weighted_share_error max over B of |share - weight share|, B = the clients backlogged at
                       every checkpoint of the run's second half, shares of the service in
                       that half among B (0: a perfect weighted split; NaN if |B| < 2);
  returning_share      (return) client 0's share of service in steps [4000, 4600);
  jain                 Jain's index of the windowed service (600-step windows, stride 300)
                       of the clients backlogged in each window, mean over windows;
  throughput           weighted tokens per step;
  p50_wait, p99_wait   steps from arrival to admission, over all requests.
"""

from __future__ import annotations

import numpy as np

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import int_arg, list_arg, number_text
from vtc_jax.core.errors import InputError
from vtc_jax.driver.results import histogram_quantile
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.sources import TrafficSource
from vtc_jax.inputs.traffic import overload, silence_and_return
from vtc_jax.policies import registry
from vtc_jax.policies.estimators import ESTIMATORS
from vtc_jax.servers import registry as servers

WORKLOADS = ("overload", "return", "weighted", "zipf")
PROMPT, OUTPUT = (64, 512), (32, 384)
RECORD = 300  # checkpoint stride: 20 buckets over 6000 steps
RPM_WINDOW = 2000


def capacity(kv_budget: int, prompt=PROMPT, output=OUTPUT) -> float:
    """Requests per step the server can hold: M / E[o * p + o(o+1)/2] (uniform lengths)."""
    p = np.arange(prompt[0], prompt[1] + 1).mean()
    o = np.arange(output[0], output[1] + 1)
    return kv_budget / (o.mean() * p + (np.mean(o * o) + o.mean()) / 2)


def workload(name: str, steps: int, kv_budget: int) -> tuple[TrafficSource, tuple | None, tuple[int, int]]:
    """(source, weights, share window) of a named workload."""
    lengths = dict(prompt=PROMPT, output=OUTPUT)
    if name == "overload":
        return TrafficSource(overload([1.0, 0.25], steps, **lengths)), None, (0, 0)
    if name == "return":
        if steps <= 4600:
            raise InputError(f"workload return needs --steps > 4600 (the return is at 4000), got {steps}")
        traffic = silence_and_return(steps, quiet_rate=0.02, quiet_until=2000, silent_until=4000, return_rate=1.0,
                                     other_rates=[1.0], **lengths)
        return TrafficSource(traffic), None, (4000, 4600)
    if name == "weighted":
        return TrafficSource(overload([0.5] * 4, steps, **lengths)), (1, 2, 3, 4), (0, 0)
    ranks = np.arange(1, 17, dtype=float) ** -1.1
    rates = 1.5 * capacity(kv_budget) * ranks / ranks.sum()
    return TrafficSource(overload(list(rates), steps, **lengths)), None, (0, 0)


def settings_for(policy: str, kv_budget: int, *, capacity: float, num_clients: int, estimator: str | None = None,
                 estimate_error: str = "0", weights=None, window=(0, 0), server_options: tuple = ()) -> Settings:
    """One policy's settings for a comparison: output-predicting policies use `estimator`
    (default exact; vtc_gateway: llm-d's fixed guess of 128 tokens); rpm gets each client's
    fair share of `capacity` (requests per step) per RPM_WINDOW steps; `server_options`:
    --server's settings."""
    spec = registry.get(policy)
    if estimator != "noisy" and estimate_error not in ("0", 0):
        raise InputError("--estimate-error applies to --estimator noisy only")
    extra = {}
    if spec.uses_estimator:
        if estimator:
            extra.update(estimator=estimator, estimate_error=estimate_error)
        elif policy == "vtc_gateway":
            extra.update(estimator="fixed", estimate_guess=128)
    if policy == "rpm":
        extra.update(rpm_limit=max(1, round(capacity * RPM_WINDOW / num_clients)), rpm_window=RPM_WINDOW)
    return Settings(policy, kv_budget, weights=weights, share_window=window, server_options=server_options, **extra)


def chosen_policies(args) -> list[str]:
    """--policy, or every registered policy; on a server that preempts (vllm) the default
    leaves out rpm, whose limits are not defined there yet (said once on stderr)."""
    if args.policy:
        return list(args.policy)
    names = list(registry.names())
    if servers.get(args.server).preempts and "rpm" in names:
        names.remove("rpm")
        vars(args).setdefault("notes", []).append(f"note: --server {args.server} preempts requests, where rpm's "
                                                  "limits are not defined yet: rpm is left out")
    return names


def add_arguments(parser):
    parser.set_defaults(seeds=256)
    parser.add_argument("--policy", type=list_arg(str, name="policies", max_items=64), default=None,
                        help="policies to compare (default: every registered one; rpm left out on --server vllm)")
    parser.add_argument("--workloads", type=list_arg(str, name="workloads", max_items=4), default=list(WORKLOADS),
                        help=f"workloads (default {','.join(WORKLOADS)})")
    parser.add_argument("--steps", type=int_arg(1000, 1 << 24), default=6000, help="horizon (default 6000)")
    parser.add_argument("--kv-budget", type=int_arg(512, 1 << 24), default=8192, help="KV budget M (default 8192)")
    parser.add_argument("--estimator", choices=ESTIMATORS, default=None,
                        help="estimator of every output-predicting policy (default: exact; vtc_gateway fixed 128)")
    parser.add_argument("--estimate-error", type=number_text, default="0", help="--estimator noisy: relative error (default 0)")


def weighted_share_error(results, rows) -> np.ndarray:
    """max over B of |share - weight share| in the run's second half (module docstring)."""
    out = np.full(len(rows), np.nan)
    ckpt = results.checkpoints  # [B, C', K]: W after every stride (and the last step)
    half = ckpt.shape[1] // 2
    back = results.backlogged_in[:, half:-1] if results.backlogged_in is not None else None
    for i, row in enumerate(rows):
        if back is None:
            break
        b = back[i].all(axis=0)
        if b.sum() < 2:
            continue
        served = ckpt[i, -1] - ckpt[i, half - 1]
        share = served[b] / served[b].sum()
        w = np.asarray([float(x) for x in row.settings.client_weights(results.service.shape[1])])[b]
        out[i] = np.abs(share - w / w.sum()).max()
    return out


def metrics(results, rows):
    out = base_metrics(results, rows)
    out["weighted_share_error"] = weighted_share_error(results, rows)
    out["returning_share"] = np.where([r.extra["workload"] == "return" for r in rows], results.share[:, 0], np.nan)
    out["jain"] = results.jain_index(600, 300)[0]
    hist = results.wait_hist.sum(axis=1)
    out["p50_wait"] = histogram_quantile(hist, 0.5)
    out["p99_wait"] = histogram_quantile(hist, 0.99)
    return out


def series(results, rows):
    """The weighted service gap over time: max_k W_k / w_k - min_k W_k / w_k."""
    k = results.service.shape[1]
    w = np.stack([[float(x) for x in r.settings.client_weights(k)] for r in rows])
    norm = results.checkpoints / w[:, None, :]
    return {"weighted_gap": norm.max(axis=2) - norm.min(axis=2)}


def build(args) -> Sweep:
    policies = chosen_policies(args)
    for p in policies:
        registry.get(p)
    for w in args.workloads:
        if w not in WORKLOADS:
            raise InputError(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    if args.steps % RECORD:
        raise InputError(f"--steps must be a multiple of {RECORD} (the checkpoint stride)")
    rows = []
    for name in args.workloads:
        source, weights, window = workload(name, args.steps, args.kv_budget)
        for p in policies:
            s = settings_for(p, args.kv_budget, capacity=capacity(args.kv_budget), num_clients=source.num_clients,
                             estimator=args.estimator, estimate_error=args.estimate_error, weights=weights,
                             window=window, server_options=args.server_options)
            rows.append(Row(s, source, f"{name} {p}", {"workload": name}))
    plots = [Plot("series", f"gap_{w}.png", f"{w}: weighted service gap over time (max - min of W_k / w_k)", "step",
                  "weighted_gap", ylabel="weighted tokens", where=(("workload", w),)) for w in args.workloads]
    plots += [Plot("scatter", f"fairness_vs_throughput_{w}.png", f"{w}: drift while backlogged vs throughput",
                   "backlogged_drift", "throughput", xlog=True, where=(("workload", w),)) for w in args.workloads]
    config = {"policies": policies, "workloads": args.workloads, "steps": args.steps, "kv_budget": args.kv_budget,
              "capacity_requests_per_step": capacity(args.kv_budget), "estimator": args.estimator,
              "rpm_window": RPM_WINDOW}
    return Sweep(name="policies", config=config, rows=rows, metrics=metrics,
                 columns=("max_drift", "backlogged_drift", "weighted_share_error", "returning_share", "jain",
                          "throughput", "p50_wait", "p99_wait"),
                 measures=("pair_drift", "demand", "share", "latency"), record_every=RECORD, series=series,
                 plots=tuple(plots), clients=False)


def main(argv=None) -> int:
    return sweep_command.main("policies", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
