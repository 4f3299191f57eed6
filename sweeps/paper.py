"""The VTC paper's artifact tables, under the artifact engine profile (vtc_jax/artifact.py).

Parts (--parts, comma-separated; default all):
  real       the real trace (27 clients, 1,500 requests, 600 s) replayed once per scheduler
             (vtc, fcfs, lcf, vtc_oracle, vtc_predict): Avg Diff, Max Diff, throughput,
             median time to first token;
  real-seeds the same with arrival phases resampled per seed (each request's arrival
             redrawn uniformly inside its own second, then re-sorted): mean and 95% CI;
  rpm        the RPM baseline at limits 5, 10, 15, 20, 30 on the real trace (single replay
             and seed-swept): throughput and rejected requests;
  suites     overload, overload-multi (vtc, fcfs, lcf) and overload-weighted (weighted vtc
             with weights 1..4, and unweighted vtc) over --seeds seeds: Avg/Max Diff,
             throughput, each client's share of the service.

Each row is printed beside the paper's value (ENGINE_ARTIFACT.md) with the relative
difference, and written in the sweep driver's format: results.json / results.csv with
setting keys workload, policy, rpm and metrics avg_diff, max_diff, throughput (tokens/s),
ttft_median (s), rejected, plus plots of each client's service rate over time per scheduler.

  python -m sweeps.paper --parts real,rpm --seeds 8 --out results/paper
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from vtc_jax import artifact as A
from vtc_jax import artifact_suites as S
from vtc_jax.settings import InputError
from vtc_jax.stats import summarize
from vtc_jax.sweep import Sweep, _fail, write_outputs

_ROOT = Path(__file__).resolve().parents[1]
REAL_TRACE = next((p for p in (_ROOT / "shared" / "data" / "vtc_real_trace.csv",
                               _ROOT.parent / "shared" / "data" / "vtc_real_trace.csv") if p.exists()),
                  _ROOT / "shared" / "data" / "vtc_real_trace.csv")
PARTS = ("real", "real-seeds", "rpm", "suites")
REAL_POLICIES = ("vtc", "fcfs", "lcf", "vtc_oracle", "vtc_predict")
RPM_LIMITS = (5, 10, 15, 20, 30)
PAPER = {  # ENGINE_ARTIFACT.md "Results to reproduce"
    ("real", "vtc", None): {"avg_diff": 251.66, "max_diff": 368, "throughput": 779, "ttft_median": 4.9},
    ("real", "fcfs", None): {"avg_diff": 433.53, "max_diff": 760, "throughput": 777, "ttft_median": 39.1},
    ("real", "lcf", None): {"avg_diff": 323.8, "throughput": 778},
    ("real", "vtc_oracle", None): {"avg_diff": 227.5, "throughput": 781},
    ("real", "vtc_predict", None): {"avg_diff": 240.3, "throughput": 773},
    **{("real", "rpm", r): {"throughput": t, "rejected": j}
       for r, t, j in zip(RPM_LIMITS, (340, 532, 626, 694, 747), (919, 600, 447, 342, 176))},
    ("overload-weighted", "vtc_weighted", None): {"share_c0": 0.1, "share_c1": 0.2, "share_c2": 0.3,
                                                   "share_c3": 0.4},
}
COLUMNS = ("avg_diff", "max_diff", "throughput", "ttft_median", "rejected")


@dataclasses.dataclass(frozen=True)
class Lane:
    workload: str
    policy: str
    rpm: int | None
    seed: int
    columns: dict  # trace columns
    weights: tuple | None = None

    @property
    def key(self):
        return (self.workload.replace("-seeds", ""), "rpm" if self.rpm else self.policy, self.rpm)

    @property
    def label(self):
        return f"{self.workload} {self.policy}" + (f" R={self.rpm}" if self.rpm else "")


def resample_phases(cols: dict, seed: int) -> dict:
    """The real trace with each arrival redrawn uniformly inside its own second."""
    rng = np.random.default_rng(seed)
    a = np.floor(cols["arrival_s"]) + rng.uniform(0, 1, cols["arrival_s"].size)
    return dict(cols, arrival_s=a)


def ticks_for(workload: str) -> A.Ticks:
    if workload.startswith("real"):
        return A.Ticks()  # the revision's 28.5 * i, i = 1..19, 60 s windows
    duration = S.SUITES[workload].duration
    return A.Ticks(spacing=(duration - 60) / 20, count=19, window=60.0)


def run(lanes: list[Lane], profile: A.Profile, oracle_r: float, chunk: int, log=sys.stderr) -> list[dict]:
    """Replay the lanes in chunks sharing one static config; per-lane measures."""
    if not lanes:
        return []
    n = max(len(l.columns["arrival_s"]) for l in lanes)
    k = max(int(np.max(l.columns["client"])) + 1 for l in lanes)
    config = A.Config(n, k, track_prediction=any(l.policy == "vtc_predict" for l in lanes))
    out = []
    started = time.perf_counter()
    chunk = -(-len(lanes) // -(-len(lanes) // chunk))  # equal chunks of at most `chunk` lanes
    for first in range(0, len(lanes), chunk):
        group = lanes[first:first + chunk]
        group = group + [group[-1]] * (chunk - len(group)) if len(lanes) > chunk else group
        traces, params, ids = [], [], []
        for lane in group:
            c = lane.columns
            trace, new_id = A.make_trace(c["arrival_s"], c["client"], c["prompt"], c["output"],
                                         input_extra=profile.input_extra, num_requests=n, num_clients=k,
                                         oracle_r=oracle_r, seed=lane.seed)
            w = None
            if lane.weights is not None:
                w = np.ones(k)
                w[new_id[:len(lane.weights)]] = lane.weights
            traces.append(trace)
            ids.append(new_id)
            policy = "rpm" if lane.rpm else ("vtc" if lane.policy == "vtc_weighted" else lane.policy)
            params.append(A.make_params(policy, k, profile, rpm_limit=lane.rpm,
                                        weights=w))
        state = A.run_lanes(A.stack(traces), A.stack(params), config)
        for i, lane in enumerate(lanes[first:first + chunk]):
            m = A.lane_measures(traces[i], A.lane_index(state, i), k, ticks_for(lane.workload))
            new_id = ids[i]  # back to the workload's own client ids for the per-client measures
            m["rate"] = m["rate"][new_id]
            m["rejected_per_client"] = m["rejected_per_client"][new_id]
            total = m["rate"].mean(axis=1)
            for j in range(min(k, 8)):
                m[f"share_c{j}"] = float(total[j] / total.sum()) if total.sum() > 0 else float("nan")
            m["events"] = int(state.events[i])
            out.append(m)
        print(f"[paper] lanes {min(first + chunk, len(lanes))}/{len(lanes)}, "
              f"{time.perf_counter() - started:.1f} s", file=log, flush=True)
    return out


def build_lanes(parts, seeds: int, real: dict) -> list[Lane]:
    lanes = []
    if "real" in parts:
        lanes += [Lane("real", p, None, 0, real) for p in REAL_POLICIES]
    if "rpm" in parts:
        lanes += [Lane("real", "rpm", r, 0, real) for r in RPM_LIMITS]
    if "real-seeds" in parts:
        lanes += [Lane("real-seeds", p, None, s, resample_phases(real, s)) for p in REAL_POLICIES for s in range(seeds)]
    if "rpm" in parts and seeds > 1:
        lanes += [Lane("real-seeds", "rpm", r, s, resample_phases(real, s)) for r in RPM_LIMITS for s in range(seeds)]
    return lanes


def suite_lanes(seeds: int) -> list[Lane]:
    lanes = []
    for name, policies in (("overload", ("vtc", "fcfs", "lcf")), ("overload-multi", ("vtc", "fcfs", "lcf")),
                           ("overload-weighted", ("vtc_weighted", "vtc"))):
        for s in range(seeds):
            t = S.generate(name, seed=s)
            cols = {k: t[k] for k in ("arrival_s", "client", "prompt", "output")}
            for p in policies:
                lanes.append(Lane(name, p, None, s, cols, tuple(t["weights"]) if p == "vtc_weighted" else None))
    return lanes


def group(lanes: list[Lane], measures: list[dict]) -> list[dict]:
    """Rows in the sweep driver's format: setting, label, metrics summarized over seeds."""
    rows, seen = [], {}
    for lane, m in zip(lanes, measures):
        key = (lane.workload, lane.policy, lane.rpm)
        seen.setdefault(key, []).append((lane, m))
    for (workload, policy, rpm), items in seen.items():
        metric_names = ["avg_diff", "max_diff", "throughput", "ttft_median", "ttft_mean", "ttft_p90", "ttft_p99",
                        "rejected", "unfinished", "steps", "prefills"] + [k for k in items[0][1] if k.startswith("share_")]
        metrics = {k: summarize([m[k] for _, m in items]) for k in metric_names}
        lane = items[0][0]
        entry = {"setting": {"workload": workload, "policy": policy, "rpm": rpm}, "label": lane.label,
                 "metrics": metrics,
                 "rejected_per_client": np.mean([m["rejected_per_client"] for _, m in items], axis=0).tolist(),
                 "service_rate": {"ticks_s": (ticks_for(workload).bounds()[0]).tolist(),
                                  "mean": np.mean([m["rate"] for _, m in items], axis=0).tolist()}}
        paper = PAPER.get(lane.key)
        if paper:
            entry["paper"] = paper
        rows.append(entry)
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        cols = []
        paper = r.get("paper", {})
        names = list(COLUMNS) + [k for k in r["metrics"] if k.startswith("share_") and k in paper]
        for c in names:
            m = r["metrics"][c]
            if m["mean"] is None:
                continue
            cell = f"{c} {m['mean']:.4g}"
            if m["n"] > 1:
                cell += f" [{m['ci95'][0]:.4g}, {m['ci95'][1]:.4g}]"
            if c in paper:
                cell += f" (paper {paper[c]:g}, {100 * (m['mean'] / paper[c] - 1):+.1f}%)"
            cols.append(cell)
        lines.append(f"{r['label']:<32} " + "  ".join(cols))
    return "\n".join(lines)


def draw_rates(rows: list[dict], out_dir: Path) -> list[Path]:
    """One figure per workload: each scheduler's panel shows the clients' service rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for workload in dict.fromkeys(r["setting"]["workload"] for r in rows):
        mine = [r for r in rows if r["setting"]["workload"] == workload]
        fig, axes = plt.subplots(1, len(mine), figsize=(3.6 * len(mine), 3.2), dpi=100, squeeze=False, sharey=True)
        for ax, r in zip(axes[0], mine):
            rate = np.asarray(r["service_rate"]["mean"])
            ticks = np.asarray(r["service_rate"]["ticks_s"])
            top = [j for j in np.argsort(-rate.sum(axis=1))[:6] if rate[j].sum() > 0]
            for j in top:
                ax.plot(ticks, rate[j], label=f"client {j}")
            ax.set_title(r["label"], fontsize=8)
            ax.set_xlabel("window start (s)")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("service rate (tokens/s)")
        axes[0][0].legend(fontsize=6)
        fig.tight_layout()
        path = out_dir / f"service_rate_{workload}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.paper", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {', '.join(PARTS)}")
    parser.add_argument("--seeds", type=int, default=8, help="seeds for the seed-swept parts (default 8)")
    parser.add_argument("--trace", type=Path, default=REAL_TRACE, help="the real trace CSV")
    parser.add_argument("--out", type=Path, default=Path("results") / "paper")
    parser.add_argument("--chunk", type=int, default=16, help="lanes per compiled call (default 16)")
    parser.add_argument("--oracle-r", type=float, default=0.0, help="vtc_oracle prediction range r (default 0)")
    parser.add_argument("--input-extra", type=int, default=2, help="server input = prompt + this (default 2)")
    parser.add_argument("--step-time", type=Path, default=None, help="JSON of StepTime (sweeps.calibrate --out)")
    parser.add_argument("--no-plots", action="store_true")
    parser.error = lambda message: _fail(message)
    args = parser.parse_args(argv)
    try:
        parts = [p.strip() for p in args.parts.split(",") if p.strip()]
        bad = [p for p in parts if p not in PARTS]
        if bad or not parts:
            raise InputError(f"--parts: unknown {bad}; expected some of {PARTS}")
        if args.seeds < 1 or args.chunk < 1 or not 0 <= args.oracle_r < 1 or args.input_extra < 0:
            raise InputError("--seeds and --chunk must be >= 1, --oracle-r in [0, 1), --input-extra >= 0")
        step_time = A.StepTime()
        if args.step_time:
            import json

            step_time = A.StepTime(**json.loads(args.step_time.read_text()))
        profile = A.Profile(input_extra=args.input_extra, step_time=step_time)
        real = A.read_trace_csv(args.trace)
        rows = []
        lanes = build_lanes(parts, args.seeds, real)
        rows += group(lanes, run(lanes, profile, args.oracle_r, args.chunk))
        if "suites" in parts:
            lanes = suite_lanes(args.seeds)
            rows += group(lanes, run(lanes, profile, args.oracle_r, args.chunk))
    except (InputError, OSError, ValueError, TypeError) as err:
        _fail(str(err))
    print(format_rows(rows))
    config = {"parts": parts, "seeds": args.seeds, "oracle_r": args.oracle_r, "trace": str(args.trace),
              "profile": dataclasses.asdict(profile)}
    result = {"sweep": "paper", "config": config, "rows": rows}
    sweep = Sweep(name="paper", config=config, rows=(), metrics=lambda r, rows: {}, columns=COLUMNS)
    try:
        written = write_outputs(sweep, result, args.out, plots=False)
        if not args.no_plots:
            written += draw_rates(rows, args.out)
    except OSError as err:
        _fail(f"cannot write results ({err})")
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
