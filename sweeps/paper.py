"""The VTC paper's artifact tables, on the paper's engine (the `slora` server with the
artifact's schedulers as registry policies: vtc_jax/driver/artifact_run.py, docs/ARTIFACT.md),
as sweeps on the one driver (vtc_jax.driver.sweep) with engine ARTIFACT_ENGINE.

Parts (--parts, comma-separated; default all):
  real          the real trace (data/vtc_real_trace.csv: 27 clients, 1,500 requests,
                600 s) replayed once per scheduler (vtc, fcfs, lcf, vtc_oracle,
                vtc_predict): Avg Diff, Max Diff, throughput, median time to first token;
  real-seeds    the same over --seeds seeds, each arrival redrawn uniformly inside its own
                second (seed s: numpy default_rng(base seed + s)): mean and 95% CI;
  rpm           the RPM baseline at limits 5, 10, 15, 20, 30 on the real trace, replayed
                once, and with --seeds > 1 also seed-swept: throughput, rejected requests;
  suites        overload, overload-multi (vtc, fcfs, lcf) and overload-weighted (weighted
                vtc with weights 1..4, and vtc) over --seeds traces: Avg/Max Diff,
                throughput, each client's share of the service;
  validation    the artifact's own traces (seed 42) of on_off_overload,
                poisson_short_long, increase and dist_shift (suites the profile was not
                tuned on) replayed once per scheduler (vtc, fcfs, lcf);
  overhead-band on_off_overload (vtc, fcfs, lcf) at step-time overheads --overheads
                (default 1.06 to 1.12) over --seeds traces: where a measure sits on a knife
                edge of the step-time model, its band over the overhead, not one value.

Suite traces: seed s is the artifact's generator (fair_bench/trace.py) seeded 42 + base
seed + s, so seed 0 is exactly the trace the artifact's GPU runs served.

Each cell prints beside the paper's value (or the artifact's committed run), only for the
shipped real trace and the artifact's suites; `--trace OTHER.csv` labels its rows with the
file's name. A request the engine could never admit, even alone (server input over
prefill_cap, or input + output not below kv_pool minus one adapter reserve), is refused
before the run, naming its line; a lane that still leaves requests neither served nor
rejected is flagged NOT FINISHED at the end of its table row and excluded from every number.
Outputs, written as one set: results.json / results.csv in the driver's
format (setting keys workload, policy, rpm[, overhead]; metrics avg_diff, max_diff,
throughput in tokens/s from t = 0 to the last completion as the artifact's total_time,
ttft_median in s, rejected, ... summarized over seeds), each row with its paper values
and relative differences, its clients' service rates per window and rejections; and
service_rate_<workload>.png per workload (the six busiest clients, one panel per scheduler).

  python -m sweeps.paper --parts real,rpm --seeds 1 --out results/paper
  python -m sweeps.paper --parts suites,validation,overhead-band --seeds 4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import float_arg, guarded, int_arg, list_arg
from vtc_jax.cli.server_flags import server_options
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import sweep as driver
from vtc_jax.driver import sweep_outputs
from vtc_jax.driver.sweep import Row, Sweep
from vtc_jax.driver import artifact_run as A
from vtc_jax.inputs import artifact_suites as S
from vtc_jax.servers import registry as servers

ROOT = Path(__file__).resolve().parents[1]
REAL_TRACE = ROOT / "data" / "vtc_real_trace.csv"
PARTS = ("real", "real-seeds", "rpm", "suites", "validation", "overhead-band")
REAL_POLICIES = ("vtc", "fcfs", "lcf", "vtc_oracle", "vtc_predict")
RPM_LIMITS = (5, 10, 15, 20, 30)
SUITE_ROWS = (("overload", ("vtc", "fcfs", "lcf")), ("overload-multi", ("vtc", "fcfs", "lcf")),
              ("overload-weighted", ("vtc_weighted", "vtc")))
VALIDATION_SUITES = ("on_off_overload", "poisson_short_long", "increase", "dist_shift")
VALIDATION_POLICIES = ("vtc", "fcfs", "lcf")
BAND_SUITE = "on_off_overload"
OVERHEADS = (1.06, 1.07, 1.08, 1.09, 1.10, 1.11, 1.12)
COLUMNS = ("avg_diff", "max_diff", "throughput", "ttft_median", "rejected")
METRICS = ("avg_diff", "max_diff", "throughput", "throughput_first_arrival", "ttft_median", "ttft_mean", "ttft_p90",
           "ttft_p99", "rejected", "unfinished", "steps", "prefills", "events")
SHARES = 8  # share_c0 .. share_c7


def _real_values(workload: str) -> dict:
    """The paper's real-trace numbers (recomputed from the artifact's committed results),
    by row label."""
    values = {
        "vtc": {"avg_diff": 251.66, "max_diff": 368, "throughput": 779, "ttft_median": 4.9},
        "fcfs": {"avg_diff": 433.53, "max_diff": 760, "throughput": 777, "ttft_median": 39.1},
        "lcf": {"avg_diff": 323.8, "throughput": 778},
        "vtc_oracle": {"avg_diff": 227.5, "throughput": 781},
        "vtc_predict": {"avg_diff": 240.3, "throughput": 773},
    }
    out = {f"{workload} {p}": v for p, v in values.items()}
    for r, t, j in zip(RPM_LIMITS, (340, 532, 626, 694, 747), (919, 600, 447, 342, 176)):
        out[f"{workload} rpm R={r}"] = {"throughput": t, "rejected": j}
    return out


# The artifact's committed A10G runs of the validation suites (Ying1123/VTC-artifact,
# fair_bench/{VTC,LCF}/all_results_dist_shift.jsonl): 1,889 requests of 256 + 256 tokens,
# none aborted, over total_time 1070.8627 s (VTC) and 1082.2496 s (LCF). The other three
# suites' results are not in that repository (docs/ARTIFACT.md).
ARTIFACT_RUNS = {
    "dist_shift vtc": {"throughput": 1889 * 512 / 1070.862678527832},
    "dist_shift lcf": {"throughput": 1889 * 512 / 1082.2495777606964},
}
PAPER_VALUES = {**_real_values("real"), **_real_values("real-seeds"), **ARTIFACT_RUNS,
                "overload-weighted vtc_weighted": {f"share_c{j}": v for j, v in enumerate((0.1, 0.2, 0.3, 0.4))}}


# ---- rows ---------------------------------------------------------------------------

def resample_phases(cols: dict, seed: int) -> dict:
    """The trace with each arrival redrawn uniformly inside its own second."""
    rng = np.random.default_rng(seed)
    return dict(cols, arrival_s=np.floor(cols["arrival_s"]) + rng.uniform(0, 1, cols["arrival_s"].size))


def real_workloads(cols: dict, name: str) -> tuple[A.Workload, A.Workload]:
    """(the trace as shipped, the trace with phases redrawn per seed)."""
    single = A.Workload.fixed(name, cols)
    swept = A.Workload(f"{name}-seeds", lambda seed: resample_phases(cols, seed), single.num_requests,
                       single.num_clients, single.bound_prompts, single.max_output, single.ticks)
    return single, swept


def suite_workload(name: str) -> A.Workload:
    """Suite `name`; seed s is the artifact's generator seeded 42 + s."""
    spec = S.SUITES[name]
    shortest, longest = S.lengths_bound(name)
    n = spec.max_requests()

    def columns(seed: int) -> dict:
        t = S.generate(name, S.ARTIFACT_SEED + seed)
        return {c: t[c] for c in A.TRACE_COLUMNS}

    return A.Workload(name, columns, n, spec.num_clients, np.full(n, shortest), longest,
                      A.Ticks.for_duration(spec.duration))


def _row(workload: A.Workload, policy: str, profile: A.Profile, oracle_r: float, *, rpm: int | None = None,
         overhead: float | None = None) -> Row:
    weights = S.SUITES[workload.name].weights if policy == "vtc_weighted" else None
    engine_policy = "rpm" if rpm else ("vtc" if policy == "vtc_weighted" else policy)
    extra = {"workload": workload.name}
    label = f"{workload.name} {policy}" + (f" R={rpm}" if rpm else "")
    if overhead is not None:
        profile = profile.replace(step_time=A.StepTime(**{**_fields(profile.step_time), "overhead": overhead}))
        extra["overhead"] = overhead
        label += f" overhead={overhead:g}"
    sched = A.Scheduler(engine_policy, name=policy, rpm_limit=rpm, weights=weights, profile=profile,
                        oracle_r=oracle_r)
    return Row(sched, workload, label, extra)


def _fields(obj) -> dict:
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def plan_rows(parts, profile: A.Profile, oracle_r: float, real: dict | None, real_name: str, seeds: int,
              overheads=OVERHEADS) -> tuple[list[Row], list[Row]]:
    """(rows replayed once, rows over --seeds seeds) of the chosen parts."""
    once, swept = [], []
    single, resampled = real_workloads(real, real_name) if real is not None else (None, None)
    if "real" in parts:
        once += [_row(single, p, profile, oracle_r) for p in REAL_POLICIES]
    if "rpm" in parts:
        once += [_row(single, "rpm", profile, oracle_r, rpm=r) for r in RPM_LIMITS]
    if "validation" in parts:
        once += [_row(suite_workload(w), p, profile, oracle_r) for w in VALIDATION_SUITES for p in VALIDATION_POLICIES]
    if "real-seeds" in parts:
        swept += [_row(resampled, p, profile, oracle_r) for p in REAL_POLICIES]
    if "rpm" in parts and seeds > 1:
        swept += [_row(resampled, "rpm", profile, oracle_r, rpm=r) for r in RPM_LIMITS]
    if "suites" in parts:
        swept += [_row(suite_workload(w), p, profile, oracle_r) for w, policies in SUITE_ROWS for p in policies]
    if "overhead-band" in parts:
        band = suite_workload(BAND_SUITE)
        swept += [_row(band, p, profile, oracle_r, overhead=o) for p in VALIDATION_POLICIES for o in overheads]
    return once, swept


# ---- metrics, series, post-processing -------------------------------------------------

def lane_metrics(results: A.ArtifactResults, rows) -> dict:
    out = {name: results.metric("served_first_arrival" if name == "throughput_first_arrival" else name)
           for name in METRICS}
    shares = np.full((len(rows), SHARES), np.nan)
    for i, (row, m) in enumerate(zip(rows, results.measures)):
        total = m["rate"][:row.source.num_clients].mean(axis=1)
        k = min(row.source.num_clients, SHARES)
        if total.sum() > 0:
            shares[i, :k] = total[:k] / total.sum()
    out.update({f"share_c{j}": shares[:, j] for j in range(SHARES)})
    return out


def lane_series(num_clients: int):
    """Per lane: each client's service rate per window [T, K] and rejections [1, K], K
    padded to the sweep's widest workload (series shapes must agree across chunks)."""
    def series(results: A.ArtifactResults, rows) -> dict:
        count = max(row.source.ticks.count for row in rows)
        rate = np.zeros((len(rows), count, num_clients))
        rejected = np.zeros((len(rows), 1, num_clients))
        for i, m in enumerate(results.measures):
            k = min(num_clients, m["rate"].shape[0])
            rate[i, :m["rate"].shape[1], :k] = m["rate"][:k].T
            rejected[i, 0, :k] = m["rejected_per_client"][:k]
        return {"service_rate": rate, "rejected_per_client": rejected}
    return series


def relative(value, reference):
    return None if value is None or not reference else float(value / reference - 1)


def make_post(rows: list[Row], paper_values: dict, show_paper: bool):
    """The post-processing hook: per row its paper values and relative differences, its
    clients' service rates per window and rejections (means over seeds, the workload's own
    clients), and the overhead band of the band rows."""
    def post(result: dict) -> dict:
        series_rows = result.get("series", {}).get("rows", [{}] * len(rows))
        for entry, row, series in zip(result["rows"], rows, series_rows):
            k = row.source.num_clients
            rate = series.get("service_rate", {}).get("mean")
            if rate is not None:
                entry["service_rate"] = {"ticks_s": row.source.ticks.bounds()[0].tolist(),
                                         "mean": np.asarray(rate)[:, :k].T.tolist()}
            rejected = series.get("rejected_per_client", {}).get("mean")
            if rejected is not None:
                entry["rejected_per_client"] = np.asarray(rejected)[0, :k].tolist()
            paper = paper_values.get(entry["label"]) if show_paper else None
            if paper:
                entry["paper"] = {m: {"value": v, "relative": relative(entry["metrics"].get(m, {}).get("mean"), v)}
                                  for m, v in paper.items()}
        band = {}
        for entry in result["rows"]:
            o = entry["setting"].get("overhead")
            if o is not None:
                item = band.setdefault(entry["setting"]["policy"], {
                    "workload": entry["setting"]["workload"], "overhead": [], "avg_diff": [], "max_diff": [],
                    "avg_diff_seed_min": [], "avg_diff_seed_max": []})
                item["overhead"].append(o)
                for m in ("avg_diff", "max_diff"):
                    item[m].append(entry["metrics"][m]["mean"])
                item["avg_diff_seed_min"].append(entry["metrics"]["avg_diff"]["min"])
                item["avg_diff_seed_max"].append(entry["metrics"]["avg_diff"]["max"])
        if band:
            for item in band.values():
                for m in ("avg_diff", "max_diff"):
                    finite = [v for v in item[m] if v is not None]
                    item[f"{m}_band"] = [min(finite), max(finite)] if finite else [None, None]
                lows = [v for v in item["avg_diff_seed_min"] if v is not None]
                highs = [v for v in item["avg_diff_seed_max"] if v is not None]
                item["avg_diff_band_every_seed"] = [min(lows), max(highs)] if lows else [None, None]
            result["overhead_band"] = band
        result.pop("series", None)
        return result
    return post


def declare(name: str, rows: list[Row], config: dict, show_paper: bool) -> Sweep:
    """One Sweep on the driver for the given rows."""
    width = max(row.source.num_clients for row in rows)
    return Sweep(name=name, config=config, rows=rows, metrics=lane_metrics, columns=COLUMNS,
                 paper_values=PAPER_VALUES if show_paper else {}, default_workload=show_paper,
                 series=lane_series(width), engine=A.ARTIFACT_ENGINE, post=make_post(rows, PAPER_VALUES, show_paper),
                 clients=False)


# ---- reporting ------------------------------------------------------------------------

def format_table(sweep: Sweep, result: dict, seeds: int) -> str:
    """The driver's table, each row whose lanes did not all finish flagged at its end: its
    numbers come from the finished lanes only (n/a when none finished)."""
    lines = sweep_outputs.format_table(sweep, result).split("\n")
    for i, entry in enumerate(result["rows"]):
        missing = entry.get("unfinished_lanes", 0)
        if missing:
            lines[i + 2] += (f"  NOT FINISHED: {missing} of {seeds} lanes left requests unserved "
                             "(excluded from every number)")
    return "\n".join(lines)


def format_relative(result: dict) -> str:
    lines = []
    for entry in result["rows"]:
        paper = entry.get("paper")
        if not paper:
            continue
        cells = [f"{m} {p['relative'] * 100:+.1f}%" for m, p in paper.items() if p["relative"] is not None]
        if cells:
            lines.append(f"  {entry['label']}: " + ", ".join(cells))
    return ("relative to the paper / the artifact's run:\n" + "\n".join(lines)) if lines else ""


def format_band(result: dict) -> str:
    band = result.get("overhead_band")
    if not band:
        return ""
    lines = ["overhead band (Avg Diff per overhead: mean over seeds, with the seeds' range when there are several):"]
    for policy, item in band.items():
        cells = ", ".join(
            "n/a" if v is None else f"{o:g}: {v:.1f}" + (f" ({lo:.1f}-{hi:.1f})" if hi is not None and hi > lo else "")
            for o, v, lo, hi in zip(item["overhead"], item["avg_diff"], item["avg_diff_seed_min"],
                                    item["avg_diff_seed_max"]))
        lo, hi = item["avg_diff_band"]
        every = item["avg_diff_band_every_seed"]
        tail = f"  -> band of the means [{lo:.1f}, {hi:.1f}]" if lo is not None else "  -> n/a"
        if every[0] is not None and (every[0] < lo or every[1] > hi):
            tail += f", of every seed [{every[0]:.1f}, {every[1]:.1f}]"
        lines.append(f"  {item['workload']} {policy} Avg Diff {cells}{tail}")
    return "\n".join(lines)


PANELS_PER_ROW = 10  # the real trace's ten schedulers stay one row (3,600 px at 100 dpi)
MAX_PANEL_ROWS = 6  # at most 60 panels (3,600 x 1,920 px): --overheads takes up to 64 values per policy


def draw_rates(rows: list[dict], path: Path, workload: str) -> None:
    """One figure per workload: each scheduler's panel shows its busiest clients' rates;
    panels wrap into rows, and beyond MAX_PANEL_ROWS rows the figure says how many of the
    rows it shows (results.json holds every row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["setting"]["workload"] == workload and "service_rate" in r]
    shown = mine[:PANELS_PER_ROW * MAX_PANEL_ROWS]
    cols = min(PANELS_PER_ROW, len(shown))
    grid = -(-len(shown) // cols)
    fig, axes = plt.subplots(grid, cols, figsize=(3.6 * cols, 3.2 * grid), dpi=100, squeeze=False, sharey=True)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    if len(shown) < len(mine):
        fig.suptitle(f"{workload}: the first {len(shown)} of {len(mine)} rows (results.json has all)", fontsize=9)
    for ax, r in zip(axes.flat, shown):
        rate = np.asarray(r["service_rate"]["mean"])
        ticks = np.asarray(r["service_rate"]["ticks_s"])
        for j in [j for j in np.argsort(-rate.sum(axis=1))[:6] if rate[j].sum() > 0]:
            ax.plot(ticks, rate[j], label=f"client {j}")
        ax.set_title(r["label"], fontsize=8)
        ax.set_xlabel("window start (s)")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("service rate (tokens/s)")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


def _json_default(x):
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"cannot write {type(x).__name__} as JSON")


def write(result: dict, out: Path, plots: bool) -> list[Path]:
    """results.json, results.csv and the service-rate plots, as one set."""
    files = [(out / "results.json", lambda p: p.write_text(json.dumps(result, indent=1, default=_json_default))),
             (out / "results.csv", lambda p: p.write_text(sweep_outputs.results_csv(result)))]
    if plots:
        for workload in dict.fromkeys(r["setting"]["workload"] for r in result["rows"] if "service_rate" in r):
            files.append((out / f"service_rate_{workload}.png",
                          lambda p, w=workload: draw_rates(result["rows"], p, w)))
    return fileio.write_outputs_atomically(files)


# ---- the command line ------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.set_defaults(seeds=4)
    parser.add_argument("--parts", type=list_arg(str, name="parts"), default=list(PARTS),
                        help=f"comma-separated of {', '.join(PARTS)} (default all)")
    parser.add_argument("--trace", type=Path, default=REAL_TRACE,
                        help="the real-trace parts' CSV (arrival_s,client,prompt,output; default the shipped "
                             "data/vtc_real_trace.csv); another file's rows carry its name")
    parser.add_argument("--oracle-r", type=float_arg(0.0, 0.999), default=0.0,
                        help="vtc_oracle's prediction range r (default 0: exact)")
    parser.add_argument("--input-extra", type=int_arg(0, 4096), default=2,
                        help="server input = prompt + this (default 2)")
    parser.add_argument("--step-time", type=Path, default=None, help="JSON of StepTime (sweeps.calibrate --out)")
    parser.add_argument("--idle", choices=A.IDLE_RULES, default="poll",
                        help="after an idle gap: whole 10 ms polls (poll, default) or a jump to the arrival")
    parser.add_argument("--overheads", type=list_arg(float_arg(0.5, 2.0), name="overheads", max_items=64),
                        default=list(OVERHEADS), help="step-time overheads of the overhead-band part")


def build(args) -> tuple[list[tuple[Sweep, int]], dict]:
    """The sweeps to run ((Sweep, seeds) pairs: rows replayed once, rows over --seeds) and
    the run's config. Every flag is validated here (InputError)."""
    for flag in ("measures", "check", "policy_module"):
        if getattr(args, flag, None):
            raise InputError(f"--{flag.replace('_', '-')} is not supported by the artifact profile")
    if args.server != servers.DEFAULT_SERVER:
        raise InputError(f"--server {args.server}: the paper's tables run on the artifact profile, an engine of its "
                         "own (docs/ARTIFACT.md), not on a server")
    server_options(args)  # a server's flag without its --server is one line
    parts = list(dict.fromkeys(args.parts))
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise InputError(f"--parts: unknown {', '.join(repr(p) for p in bad)}; expected some of {', '.join(PARTS)}")
    step_time = A.StepTime()
    if args.step_time is not None:
        text = fileio.read_text(args.step_time, limit=1 << 16, what="step-time JSON")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"{args.step_time}: not JSON ({err.msg} at line {err.lineno})") from None
        step_time = A.StepTime.from_dict(data, source=str(args.step_time))
    profile = A.Profile(input_extra=args.input_extra, step_time=step_time, idle=args.idle)
    real, real_name = None, "real"
    if any(p in parts for p in ("real", "real-seeds", "rpm")):
        real = A.read_trace_csv(args.trace)
        A.check_admissible(real, profile, str(args.trace), real["line"])  # before any run, naming the line
        same = args.trace.resolve() == REAL_TRACE.resolve() if args.trace.exists() else False
        real_name = "real" if same else _name(args.trace)
    show_paper = real_name == "real"
    once, swept = plan_rows(parts, profile, args.oracle_r, real, real_name, args.seeds, tuple(args.overheads))
    config = {"parts": parts, "trace": str(args.trace) if real is not None else None, "oracle_r": args.oracle_r,
              "profile": _profile_json(profile), "overheads": list(args.overheads)}
    plans = []
    if once:
        plans.append((declare("paper", once, dict(config, replay="once"), show_paper), 1))
    if swept:
        plans.append((declare("paper", swept, dict(config, replay="seeds"), show_paper), args.seeds))
    return plans, config


def _name(path: Path) -> str:
    """A workload name from a file name: its stem, letters, digits and -_. only."""
    import re

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem)[:40] or "trace"
    return stem if stem not in ("real", "real-seeds") else f"{stem}-file"


def _profile_json(profile: A.Profile) -> dict:
    out = _fields(profile)
    out["step_time"] = _fields(profile.step_time)
    return out


def main(argv=None) -> int:
    return guarded("python -m sweeps.paper", lambda: _main(argv))


def _main(argv) -> int:
    parser = sweep_command.base_parser("paper", __doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    plans, config = build(args)
    sweep_command.setup_runtime(args)
    if jax.process_index() == 0:
        fileio.check_writable_dir(args.out, ["results.json", "results.csv"])
    results = [driver.run_sweep(s, seeds, base_seed=args.base_seed, chunk=args.chunk, devices=args.devices,
                                log=sys.stderr) for s, seeds in plans]
    if jax.process_index() != 0:
        return 0
    merged = {"sweep": "paper", "config": dict(config, seeds=args.seeds, base_seed=args.base_seed), "rows": []}
    for (s, seeds), result in zip(plans, results):
        merged["rows"] += result["rows"]
        if "overhead_band" in result:
            merged["overhead_band"] = result["overhead_band"]
        print(f"{'replayed once' if seeds == 1 else f'over {seeds} seeds'}:")
        print(format_table(s, result, seeds))
    for text in (format_relative(merged), format_band(merged)):
        if text:
            print(text)
    written = write(merged, args.out, plots=not args.no_plots)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
