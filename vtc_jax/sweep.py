"""The one sweep driver: grid x seeds in chunked compiled calls, aggregation, tables,
JSON/CSV output and plots. Every `sweeps/NAME.py` module only declares its workload, its
settings grid and its table/plot layout as a `Sweep`, and calls `main`.

Lane i of a sweep is (grid row i // seeds, seed i % seeds). Lanes run in chunks of equal
size (the last one padded with repeats of its own lanes, whose results are discarded), all
with one static engine config, so a sweep compiles its engine once whatever its size.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np

from vtc_jax.devices import (DEFAULT_CACHE_DIR, available_bytes, enable_compilation_cache, gather_lanes,
                             init_distributed, lane_mesh, process_share)
from vtc_jax.results import LaneResults
from vtc_jax.run import simulate_traffic, traffic_config
from vtc_jax.settings import InputError, Settings
from vtc_jax.stats import summarize
from vtc_jax.traffic import Traffic

DEFAULT_SEEDS = 4096


@dataclasses.dataclass(frozen=True)
class Row:
    """One grid point: its JSON setting keys, its scheduler settings and its traffic."""

    setting: dict
    settings: Settings
    traffic: Traffic
    label: str


@dataclasses.dataclass(frozen=True)
class Plot:
    """A figure the driver draws from aggregated results.

    kind "metric": metric `y` (mean and 95% CI) against setting key `x`, one point per row;
      `extra` names a metric drawn as a dashed line (for example the bound); the result's
      "overlays" whose "plot" is this filename are drawn on top (for example a search path).
    kind "scatter": metric `x` against metric `y`, one labelled point per row, CI bars.
    kind "series": time series `y` (mean and 2.5-97.5% band over seeds) per row.
    """

    kind: str
    filename: str
    title: str
    x: str
    y: str
    extra: str | None = None
    xlog: bool = False
    ylabel: str | None = None


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What a sweep module declares.

    Attributes:
      name: sweep name (results.json "sweep").
      config: its settings, for results.json "config".
      rows: the grid.
      metrics: per-lane metric values from a chunk's results: {name: float64[B]}.
      columns: metrics shown in the printed table, in order.
      seed_values: {row label: {metric: the seed document's printed value}}.
      series: per-lane time series from a chunk's results: {name: float64[B, C]}, with
        `series_steps(results)` giving their steps.
      plots: figures to draw.
      record_every: checkpoint stride for the engine (0: none).
    """

    name: str
    config: dict
    rows: Sequence[Row]
    metrics: Callable[[LaneResults, Sequence[Row]], dict]
    columns: Sequence[str]
    seed_values: dict = dataclasses.field(default_factory=dict)
    series: Callable[[LaneResults, Sequence[Row]], dict] | None = None
    plots: Sequence[Plot] = ()
    record_every: int = 0


def base_metrics(results: LaneResults, rows: Sequence[Row]) -> dict:
    """Metrics every sweep reports (per lane)."""
    total = results.service.sum(axis=1)
    return {
        "conservation_violations": np.asarray([len(c) for c in results.conservation], np.float64),
        "max_drift": results.max_drift,
        "drift_over_2u": results.drift_over_2u,
        "drift_over_total": np.divide(results.max_drift, total, out=np.full_like(total, np.nan), where=total > 0),
        "backlogged_drift": results.backlogged_drift,
        "throughput": results.throughput,
        "raw_throughput": results.raw_throughput,
        "mean_occupancy": results.mean_occupancy,
    }


def lane_bytes(config) -> int:
    """Device bytes one lane needs while it runs (streams, calendar, time series, and the
    generator's temporaries), with a 2x allowance for XLA's buffers."""
    k, n = config.num_clients, config.stream_len
    streams = k * n * (5 * 4 + 3 * 4 + 8)  # rows, random words, float temporaries
    calendar = 2 * config.calendar_len * k * 4
    series = 3 * config.num_checkpoints * k * 4
    return 2 * (streams + calendar + series) + 4096


def chunk_size(total_lanes: int, config, requested: int | None, budget_bytes: int, multiple: int = 1) -> int:
    """Lanes per compiled call: `requested`, or as many as half the free memory holds,
    rounded to a multiple of the device count (the mesh needs equal shares)."""
    if requested is not None:
        if requested < 1:
            raise InputError(f"--chunk must be >= 1, got {requested}")
        size = min(requested, total_lanes)
    else:
        size = max(1, min(total_lanes, budget_bytes // 2 // lane_bytes(config)))
    return -(-size // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class LaneValues:
    """Per-lane outputs of `evaluate`, lane = row * seeds + seed index.

    metrics: {name: float64[R * S]}; series: {name: float64[R * S, C]}; finished: bool[R * S];
    series_steps: int64[C] or None; chunk: lanes per compiled call."""

    metrics: dict
    series: dict
    finished: np.ndarray
    series_steps: np.ndarray | None
    chunk: int


def evaluate(name: str, rows: Sequence[Row], seeds: Sequence[int], metrics: Callable, *,
             series: Callable | None = None, record_every: int = 0, base_seed: int = 0,
             chunk: int | None = None, devices: int | None = None, log=sys.stderr) -> LaneValues:
    """Run every (row, seed) lane in equal chunks with one static config (one compile).

    Lanes are sharded over `devices` local devices (default all); with several processes
    (jax.distributed), each runs a contiguous share and every process gets all results.
    """
    seeds = list(seeds)
    if len(seeds) < 1:
        raise InputError(f"--seeds must be >= 1, got {len(seeds)}")
    if not rows:
        raise InputError("the sweep has no settings")
    try:
        mesh = lane_mesh(devices)
    except ValueError as err:
        raise InputError(str(err)) from None
    config = traffic_config([r.traffic for r in rows], record_every)
    total = len(rows) * len(seeds)
    start, stop = process_share(total)
    local = stop - start
    size = chunk_size(max(local, 1), config, chunk, available_bytes(mesh), multiple=mesh.devices.size)
    metric_parts, series_parts, finished_parts = [], [], []
    steps = None
    started = time.perf_counter()
    for first in range(0, local, size):
        lanes = start + np.arange(first, first + size) % local  # the last chunk repeats lanes: discarded
        keep = min(size, local - first)
        chunk_rows = [rows[r] for r in lanes // len(seeds)]
        results = simulate_traffic([r.traffic for r in chunk_rows], [r.settings for r in chunk_rows],
                                   [seeds[i] for i in lanes % len(seeds)], base_seed=base_seed, config=config,
                                   mesh=mesh)
        metric_parts.append({k: np.asarray(v)[:keep] for k, v in metrics(results, chunk_rows).items()})
        if series is not None:
            series_parts.append({k: np.asarray(v)[:keep] for k, v in series(results, chunk_rows).items()})
            steps = results.checkpoint_steps
        finished_parts.append(results.finished[:keep])
        done = first + keep
        where = f" (process {jax.process_index()}/{jax.process_count()})" if jax.process_count() > 1 else ""
        print(f"[{name}] lanes {done}/{local}{where} ({100 * done / local:.0f}%), chunk of {size} on "
              f"{mesh.devices.size} device(s), {time.perf_counter() - started:.1f} s", file=log, flush=True)

    def join(parts):
        return {k: gather_lanes(np.concatenate([p[k] for p in parts]), total) for k in parts[0]} if parts else {}

    finished = gather_lanes(np.concatenate(finished_parts), total)
    return LaneValues(join(metric_parts), join(series_parts), finished, steps, size)


def aggregate(name: str, rows: Sequence[Row], values: LaneValues, seeds: int, log=sys.stderr):
    """Per row: every metric summarized over its finished seeds (unfinished lanes are
    excluded and counted), and every series as mean and 2.5-97.5% band."""
    rows_out, series_out = [], []
    for i, row in enumerate(rows):
        lanes = slice(i * seeds, (i + 1) * seeds)
        ok = values.finished[lanes]
        entry = {"setting": row.setting, "label": row.label,
                 "metrics": {k: summarize(v[lanes][ok]) for k, v in values.metrics.items()}}
        if not ok.all():
            entry["unfinished_lanes"] = int((~ok).sum())
            print(f"[{name}] warning: {int((~ok).sum())} lanes of {row.label} did not finish "
                  "and are excluded", file=log)
        rows_out.append(entry)
        if values.series:
            stacked = {k: v[lanes][ok] for k, v in values.series.items()}
            series_out.append({k: {"mean": v.mean(axis=0).tolist(),
                                   "lo": np.percentile(v, 2.5, axis=0).tolist(),
                                   "hi": np.percentile(v, 97.5, axis=0).tolist()} for k, v in stacked.items()})
    return rows_out, series_out


def run_sweep(sweep: Sweep, seeds: int, *, base_seed: int = 0, chunk: int | None = None,
              devices: int | None = None, log=sys.stderr) -> dict:
    """Run every (row, seed) lane; returns {"sweep", "config", "rows"[, "series"]}."""
    if seeds < 1:
        raise InputError(f"--seeds must be >= 1, got {seeds}")
    values = evaluate(sweep.name, sweep.rows, range(seeds), sweep.metrics, series=sweep.series,
                      record_every=sweep.record_every, base_seed=base_seed, chunk=chunk,
                      devices=devices, log=log)
    rows_out, series_out = aggregate(sweep.name, sweep.rows, values, seeds, log)
    config_out = dict(sweep.config, seeds=seeds, base_seed=base_seed, lanes=len(sweep.rows) * seeds,
                      chunk=values.chunk)
    out = {"sweep": sweep.name, "config": config_out, "rows": rows_out}
    if series_out:
        out["series"] = {"steps": [int(s) for s in values.series_steps], "rows": series_out}
    return out


def format_table(sweep: Sweep, result: dict) -> str:
    """Each cell: mean [95% CI]; the seed document's value beside it where it has one."""
    header = ["setting"] + list(sweep.columns)
    lines = []
    for entry in result["rows"]:
        cells = [entry["label"]]
        seed = sweep.seed_values.get(entry["label"], {})
        for col in sweep.columns:
            m = entry["metrics"][col]
            if m["mean"] is None:
                cell = "n/a"
            else:
                cell = f"{_fmt(m['mean'])} [{_fmt(m['ci95'][0])}, {_fmt(m['ci95'][1])}]"
            if col in seed:
                cell += f" (seed {_fmt(seed[col])})"
            cells.append(cell)
        lines.append(cells)
    widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
    render = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([render(header), render(["-" * w for w in widths])] + [render(r) for r in lines])


def _fmt(x: float) -> str:
    if x is None:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def write_outputs(sweep: Sweep, result: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    """results.json, results.csv (one row per setting and metric) and the PNG plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json", out_dir / "results.csv"]
    with open(written[0], "w") as fh:
        json.dump({k: result[k] for k in ("sweep", "config", "rows")}, fh, indent=1)
    keys = sorted({k for entry in result["rows"] for k in entry["setting"]})
    with open(written[1], "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(keys + ["metric", "mean", "std", "ci95_lo", "ci95_hi", "min", "max", "n"])
        for entry in result["rows"]:
            for name, m in entry["metrics"].items():
                writer.writerow([entry["setting"].get(k) for k in keys] +
                                [name, m["mean"], m["std"], m["ci95"][0], m["ci95"][1], m["min"], m["max"], m["n"]])
    if plots:
        written += [draw(sweep, result, p, out_dir) for p in sweep.plots]
    return written


def draw(sweep: Sweep, result: dict, plot: Plot, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    rows = result["rows"]
    if plot.kind == "metric":
        xs = [r["setting"][plot.x] for r in rows]
        mean = [r["metrics"][plot.y]["mean"] for r in rows]
        lo = [r["metrics"][plot.y]["ci95"][0] for r in rows]
        hi = [r["metrics"][plot.y]["ci95"][1] for r in rows]
        ax.plot(xs, mean, "o-", label=f"{plot.y} (mean)")
        ax.fill_between(xs, lo, hi, alpha=0.3, label="95% CI")
        if plot.extra:
            ax.plot(xs, [r["metrics"][plot.extra]["mean"] for r in rows], "k--", label=plot.extra)
        for overlay in result.get("overlays", []):
            if overlay["plot"] == plot.filename:
                ax.plot(overlay["x"], overlay["y"], "r.-", alpha=0.7, label=overlay["label"])
        ax.set_xlabel(plot.x)
        ax.legend()
    elif plot.kind == "scatter":
        for r in rows:
            mx, my = r["metrics"][plot.x], r["metrics"][plot.y]
            ax.errorbar(mx["mean"], my["mean"], xerr=[[mx["mean"] - mx["ci95"][0]], [mx["ci95"][1] - mx["mean"]]],
                        yerr=[[my["mean"] - my["ci95"][0]], [my["ci95"][1] - my["mean"]]], fmt="o", capsize=3)
            ax.annotate(r["label"], (mx["mean"], my["mean"]), textcoords="offset points", xytext=(5, 5))
        ax.set_xlabel(plot.x)
    elif plot.kind == "series":
        steps = result["series"]["steps"]
        for r, s in zip(rows, result["series"]["rows"]):
            band = s[plot.y]
            ax.plot(steps, band["mean"], label=r["label"])
            ax.fill_between(steps, band["lo"], band["hi"], alpha=0.2)
        ax.set_xlabel("step")
        ax.legend()
    else:
        raise ValueError(f"unknown plot kind {plot.kind!r}")
    if plot.xlog:
        xs = [r["setting"].get(plot.x) for r in rows] if plot.kind == "metric" else []
        positive = [x for x in xs if isinstance(x, (int, float)) and x > 0]
        if positive and len(positive) < len(xs):  # a zero setting (beta = 0): linear near 0
            ax.set_xscale("symlog", base=2, linthresh=min(positive) / 2)
        else:
            ax.set_xscale("log", base=2)
    ax.set_ylabel(plot.ylabel or plot.y)
    ax.set_title(plot.title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out_dir / plot.filename
    fig.savefig(path)
    plt.close(fig)
    return path


def base_parser(name: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m sweeps.{name}", description=description)
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                        help=f"seeds per setting (default {DEFAULT_SEEDS})")
    parser.add_argument("--out", type=Path, default=Path("results") / name,
                        help="output directory for results.json, results.csv and plots "
                             f"(default results/{name})")
    parser.add_argument("--chunk", type=int, default=None,
                        help="lanes per compiled call (default: sized from memory)")
    parser.add_argument("--base-seed", type=int, default=0, help="base of every lane's random key")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--devices", type=int, default=None, help="use only the first N local devices")
    parser.add_argument("--check", action="store_true",
                        help="verify conservation in every lane; exit 1 if any lane violates it")
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR),
                        help=f"persistent compilation cache (default {DEFAULT_CACHE_DIR}; env VTC_JAX_CACHE)")
    parser.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")
    parser.add_argument("--coordinator", default=None,
                        help="multi-host: coordinator host:port for jax.distributed (or JAX_COORDINATOR_ADDRESS)")
    parser.add_argument("--num-processes", type=int, default=None, help="multi-host: number of processes")
    parser.add_argument("--process-id", type=int, default=None, help="multi-host: this process's index")
    return parser


def setup_runtime(args) -> None:
    """Compilation cache and (multi-host) distributed runtime, from the common flags."""
    init_distributed(args.coordinator, args.num_processes, args.process_id)
    enable_compilation_cache(None if args.no_cache else args.cache_dir)


def main(name: str, description: str, add_arguments: Callable, build: Callable[[argparse.Namespace], Sweep],
         argv=None) -> int:
    """CLI entry of a sweep module: parse, build the Sweep, run, print, write."""
    parser = base_parser(name, description)
    add_arguments(parser)
    parser.error = lambda message: _fail(f"{message}")  # one line, exit 2
    args = parser.parse_args(argv)
    try:
        if args.base_seed < 0:
            raise InputError(f"--base-seed must be >= 0, got {args.base_seed}")
        setup_runtime(args)
        sweep = build(args)
        result = run_sweep(sweep, args.seeds, base_seed=args.base_seed, chunk=args.chunk, devices=args.devices)
        if jax.process_index() != 0:  # process 0 reports and writes
            return 0
        if args.check:
            bad = sum(r["metrics"].get("conservation_violations", {}).get("max") or 0 for r in result["rows"])
            print(f"check: {'conservation holds in every lane' if bad == 0 else 'CONSERVATION VIOLATED'}")
            if bad:
                raise SystemExit(1)
        print(format_table(sweep, result))
        written = write_outputs(sweep, result, args.out, plots=not args.no_plots)
    except InputError as err:
        _fail(str(err))
    except OSError as err:
        _fail(f"cannot write results ({err})")
    print(f"wrote {', '.join(os.fspath(p) for p in written)}")
    return 0


def _fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH integers, got {text!r}") from None
    return lo, hi


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def add_workload_arguments(parser: argparse.ArgumentParser, *, rates: str = "1.0,0.25") -> None:
    """Flags of the seed document's overload workload, shared by the sweeps."""
    parser.add_argument("--steps", type=int, default=6000, help="horizon in steps (default 6000)")
    parser.add_argument("--rates", type=_floats, default=_floats(rates),
                        help=f"Poisson arrival rates per client, requests per step (default {rates})")
    parser.add_argument("--prompt", type=_range, default=(64, 512), help="prompt range LOW,HIGH (default 64,512)")
    parser.add_argument("--output", type=_range, default=(32, 384), help="output range LOW,HIGH (default 32,384)")
    parser.add_argument("--kv-budget", type=int, default=8192, help="KV budget M in tokens (default 8192)")
    parser.add_argument("--w-p", default="1", help="prefill token cost (default 1)")
    parser.add_argument("--w-q", default="2", help="decode token cost (default 2)")


def workload_config(args: argparse.Namespace) -> dict:
    return {"steps": args.steps, "rates": args.rates, "prompt": list(args.prompt), "output": list(args.output),
            "kv_budget": args.kv_budget, "w_p": str(args.w_p), "w_q": str(args.w_q)}
