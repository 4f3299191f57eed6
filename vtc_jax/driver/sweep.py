"""The one sweep driver: rows x seeds in chunked compiled calls, aggregation, tables,
results.json/csv and plots, for any engine.

Every `sweeps/NAME.py` only declares a `Sweep` (its rows: settings + workload + label; the
metrics it reads; table columns; plots) and calls `main`. Lane i of a row group is
(row i // seeds, seed i % seeds). Lanes run in chunks of equal size (the last one padded
with repeats of its own lanes, whose results are discarded), all with one static engine
config per group of rows, so a sweep compiles its engine once per group, whatever its size.

An engine is an adapter with three methods (the MODEL.md engine: `MODEL_ENGINE` below;
the artifact profile: artifact_run.ARTIFACT_ENGINE):

  group_key(row)                          rows with equal keys share one config;
  config(rows, record_every, measures)    the static config of a group (one compile);
  run(rows, seeds, config, base_seed, mesh, progress)  one chunk of lanes -> results
  lane_bytes(config)                      device bytes one lane needs (chunk sizing).

Besides each sweep's own metrics, every row reports the load line (offered against served
weighted tokens per step, requests left waiting) and per-client shares and waits.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from vtc_jax.cli.common import CheckFailed, Parser, float_arg, guarded, int_arg, list_arg, number_text
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import run
from vtc_jax.driver.devices import (
    DEFAULT_CACHE_DIR,
    available_bytes,
    enable_compilation_cache,
    gather_lanes,
    init_distributed,
    lane_mesh,
    process_share,
)
from vtc_jax.driver.results import bound_metrics, load_values, overloaded
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs import sources as sources_mod
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.measures.stats import summarize
from vtc_jax.policies import registry

DEFAULT_SEEDS = 4096
MAX_LANES = 1 << 24
PROGRESS_SECONDS = 3.0


# ---- declarations -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Row:
    """One grid point: its scheduler settings, its workload, its label, and setting keys
    beyond those derived from the settings (for example the workload's name)."""

    settings: Any
    source: Any
    label: str
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def setting(self) -> dict:
        """JSON setting keys: policy and kv_budget, every other Settings field that differs
        from its default, then `extra`."""
        return dict(settings_keys(self.settings), **self.extra)


@dataclasses.dataclass(frozen=True)
class Plot:
    """A figure the driver draws from aggregated results.

    kind "metric": metric `y` (mean and 95% CI) against setting key `x` (numeric x: a line,
      log axes when asked; a category x: points with CI bars on a log y axis when values
      span more than a decade, never joined across categories); `extra` names a metric drawn
      dashed (e.g. a bound); result "overlays" whose "plot" is this file are drawn on top.
    kind "scatter": metric `x` against metric `y`, one labelled point per row, CI bars.
    kind "series": time series `y` (mean and 2.5-97.5% band over seeds) per row; a series
      with a client axis draws one line per client (every client, labelled).
    kind "clients": per-client values (means over seeds, `client_values` names) `y` against
      `x`, one panel per row, one point per client, the diagonal y = x dashed.
    kind "client_cdf": the distribution over clients of the per-client value `x`, one line
      per row (clients with no value are left out).
    """

    kind: str
    filename: str
    title: str
    x: str
    y: str
    extra: str | None = None
    xlog: bool = False
    ylog: bool | None = None
    ylabel: str | None = None
    where: tuple = ()  # ((setting key, value), ...): draw only the rows that match


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What a sweep module declares.

    Attributes:
      name: sweep name (results.json "sweep").
      config: its settings, for results.json "config".
      rows: the grid.
      metrics: per-lane metric values from a chunk's results: {name: float64[B]}.
      columns: metrics shown in the printed table, in order.
      measures: measure names its metrics read (measures.NAMES); --measures all adds all.
      paper_values: {row label: {metric: value}} printed beside the cells as the value of
        the VTC paper / seed document, only while `default_workload` holds.
      default_workload: the workload is the one `paper_values` belong to.
      series: per-lane time series from a chunk's results: {name: float64[B, C(, K)]}.
      plots: figures to draw.
      record_every: checkpoint stride for the engine (0: none).
      engine: the engine adapter (default: the MODEL.md engine).
      post: optional hook result -> result (extra aggregation, overlays) before writing.
      clients: report per-client tables (default: when K <= 8).
      notes: lines printed on stderr before the run starts (after every check passed).
    """

    name: str
    config: dict
    rows: Sequence[Row]
    metrics: Callable[[Any, Sequence[Row]], dict]
    columns: Sequence[str]
    measures: Sequence[str] = ()
    paper_values: dict = dataclasses.field(default_factory=dict)
    default_workload: bool = True
    series: Callable | None = None
    plots: Sequence[Plot] = ()
    record_every: int = 0
    engine: Any = None
    post: Callable[[dict], dict] | None = None
    clients: bool | None = None
    notes: Sequence[str] = ()


def settings_keys(s) -> dict:
    """JSON keys of a Settings: policy, kv_budget, then every field that differs from its
    default (Fractions as exact text unless integral)."""
    if not isinstance(s, Settings):
        return dict(getattr(s, "setting_keys", lambda: {})())
    default = Settings()
    out = {"policy": s.policy, "kv_budget": s.kv_budget}
    for f in dataclasses.fields(Settings):
        if f.name in out:
            continue
        value = getattr(s, f.name)
        if value != getattr(default, f.name):
            out[f.name] = _json_value(value)
    return out


def _json_value(v):
    if isinstance(v, Fraction):
        return int(v) if v.denominator == 1 else str(v)
    if isinstance(v, (tuple, list)):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):  # options
            return {str(a): _json_value(b) for a, b in v}
        return [_json_value(x) for x in v]
    return v


# ---- the MODEL.md engine as an adapter ----------------------------------------------

class ModelEngine:
    """The exact MODEL.md engine (engine.py) behind the driver."""

    name = "model"

    @staticmethod
    def group_key(row: Row):
        return sources_mod.signature(row.source)

    @staticmethod
    def config(rows: Sequence[Row], record_every: int, measures: MeasureConfig):
        names = registry.names()
        present = tuple(n for n in names if n in {r.settings.policy for r in rows})
        config = run.source_config([r.source for r in rows], [r.settings for r in rows], record_every,
                                   measures=measures, policies=present)
        run.validate_lanes([r.source for r in rows], [r.settings for r in rows], config)  # before any output
        return config

    @staticmethod
    def run(rows: Sequence[Row], seeds: Sequence[int], config, base_seed: int, mesh, progress):
        return run.simulate_sources([r.source for r in rows], [r.settings for r in rows], list(seeds),
                                    base_seed=base_seed, config=config, mesh=mesh, progress=progress)

    @staticmethod
    def lane_bytes(config) -> int:
        """Device bytes one lane needs while it runs (request blocks and the generator's
        words, calendar, slots, measures, per-request policy tables), x2 for XLA's buffers."""
        k, r = config.num_clients, config.num_rows
        words = 4 * (NUM_WORDS * r + 2 * config.calendar_rows + 6 * config.slots)
        measures = 4 * (3 * config.num_checkpoints * k + 2 * 264 * k + 3 * k * k)
        policy_tables = 16 * r if any(registry.get(p).arrival_rows for p in config.policies) else 0
        return 2 * (words + measures + policy_tables) + 4096

    @staticmethod
    def steps(config, rows) -> int:
        return max(r.source.horizon for r in rows)


NUM_WORDS = 5 + 6  # request row fields + the generator's temporaries per row
MODEL_ENGINE = ModelEngine()


# ---- running ----------------------------------------------------------------------

# On CPU, chunks past a few thousand lanes run no faster (measured: kv_budget at 1024 seeds,
# 5120-lane chunks 21.2 s, 1280-lane chunks 20.3 s) and hold gigabytes more.
CPU_CHUNK_LANES = 2048


def chunk_size(total_lanes: int, lane_bytes: int, requested: int | None, budget_bytes: int,
               multiple: int = 1, platform: str = "cpu") -> int:
    """Lanes per compiled call: `requested`, or as many as half the free memory holds (on
    CPU at most CPU_CHUNK_LANES), rounded up to a multiple of `multiple` (the device count,
    and the rows sharing each seed)."""
    if requested is not None:
        if requested < 1:
            raise InputError(f"--chunk must be >= 1, got {requested}")
        size = min(requested, total_lanes)
    else:
        size = max(1, min(total_lanes, budget_bytes // 2 // lane_bytes))
        if platform == "cpu":
            size = min(size, CPU_CHUNK_LANES)
    if lane_bytes * min(size, 1) > budget_bytes:
        raise InputError(f"one lane needs about {lane_bytes / 2**30:.2f} GiB, more than the "
                         f"{budget_bytes / 2**30:.2f} GiB available: shorten the horizon or use fewer clients")
    return -(-size // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class LaneValues:
    """Per-lane outputs, lane = row * seeds + seed index (rows in declaration order).

    metrics: {name: float64[R * S]}; series: {name: float64[R * S, C(, K)]};
    clients: {name: float64[R * S, K]} per-client values; finished: bool[R * S];
    series_steps: int64[C] or None; chunk: lanes per compiled call."""

    metrics: dict
    series: dict
    clients: dict
    finished: np.ndarray
    series_steps: np.ndarray | None
    chunk: int


def client_values(results) -> dict:
    """Per-client values every sweep reports: float64[B, K] each."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "served_share": results.served_share,
            "offered_share": results.offered_share,
            "served": results.service / np.maximum(results.steps, 1)[:, None],
            "offered": results.offered / np.maximum(results.steps, 1)[:, None],
            "admitted_over_arrived": np.where(results.arrived > 0, results.admitted / np.maximum(results.arrived, 1),
                                              np.nan),
            "wait_p50": results.latency_percentile("wait", 0.5),
            "wait_p90": results.latency_percentile("wait", 0.9),
            "wait_p99": results.latency_percentile("wait", 0.99),
            "waiting_at_end": results.waiting.astype(np.float64),
        }


def load_metrics(results) -> dict:
    """The load line per lane: `results.load_values` (offered and served over the same
    span, the queue when the last request arrived and at the end; MODEL.md)."""
    return load_values(results)


def base_metrics(results, rows: Sequence[Row]) -> dict:
    """Metrics every MODEL.md sweep may report (per lane); those of measures the run did not
    keep are left out."""
    total = results.service.sum(axis=1)
    out = {
        "max_drift": results.max_drift,
        **bound_metrics(results),
        "drift_over_total": np.divide(results.max_drift, total, out=np.full_like(total, np.nan), where=total > 0),
        "throughput": results.throughput,
    }
    for name in ("backlogged_drift", "raw_throughput", "mean_occupancy"):
        value = getattr(results, name)
        if not np.isnan(value).all():
            out[name] = value
    if results.conservation is not None:
        out["conservation_violations"] = np.asarray([len(c) for c in results.conservation], np.float64)
    return out


class Progress:
    """Progress on stderr at least every few seconds: lanes done, rate and time left.

    The rate counts only measured work: time before a chunk's first compiled call returned
    (generating its requests, the compile, often most of a small sweep's time) is left out,
    and so is that call's share of the chunk, known once the chunk ended (its events over
    all the chunk's events). While a chunk runs, its fraction done is its events over those
    of the last completed chunk (over the runner's expected count before one completed).
    `clock` (seconds) is injectable for tests.
    """

    def __init__(self, name: str, total_lanes: int, steps: int, log=None, clock: Callable[[], float] | None = None):
        self.name, self.total, self.steps, self.log = name, total_lanes, steps, log or sys.stderr
        self.clock = clock or time.perf_counter
        self.started = self.clock()
        self.last = self.started
        self.done = 0
        self.measured_lanes, self.measured_seconds = 0.0, 0.0  # completed chunks, first calls left out
        self._events = 0  # events the last completed chunk took: a better count than the runner's guess
        self._lanes, self._first, self._latest, self._first_run_events = 0, None, None, 0

    def chunk(self, lanes: int, size: int):
        """A callback for the runner while a chunk of `lanes` runs."""
        self._lanes, self._first, self._latest, self._first_run_events = lanes, None, None, 0

        def report(spent: int, expected: int, seconds: float):
            now = self.clock()
            if self._first is None:
                self._first = (now, spent)
            elif spent < self._latest[1]:  # the engine ran again (a retry of some lanes)
                self._first_run_events = self._first_run_events or self._latest[1]
            self._latest = (now, spent, expected)
            if now - self.last >= PROGRESS_SECONDS:
                self._print(self.done + lanes * min(1.0, spent / max(self._events or expected, 1)), now)
        return report

    def _rate(self) -> float:
        """Lanes per second of measured work (NaN before any): completed chunks, else the
        running one since its first call."""
        lanes, seconds = self.measured_lanes, self.measured_seconds
        if seconds <= 0 and self._first is not None and not self._first_run_events:
            (t0, s0), (t1, s1, expected) = self._first, self._latest
            lanes, seconds = self._lanes * (s1 - s0) / max(expected, 1), t1 - t0
        return lanes / seconds if seconds > 0 and lanes > 0 else float("nan")

    def finished_chunk(self, lanes: int):
        now = self.clock()
        if self._first is not None:
            events = self._first_run_events or self._latest[1]
            self.measured_lanes += lanes * (1 - self._first[1] / max(events, 1))
            self.measured_seconds += now - self._first[0]
            self._events = events
        self._first = None
        self.done += lanes
        self._print(self.done, now, force=self.done >= self.total)

    def _print(self, done: float, now: float, force: bool = False):
        if not force and now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        elapsed = now - self.started
        rate = self._rate()
        known = math.isfinite(rate)
        left = f"~{(self.total - done) / rate:.0f} s left" if known else "time left not yet known"
        where = f" (process {jax.process_index()}/{jax.process_count()})" if jax.process_count() > 1 else ""
        print(f"[{self.name}] lanes {int(done)}/{self.total}{where} ({100 * done / self.total:.0f}%), "
              f"{f'{rate * self.steps / 1e6:.2f}' if known else 'n/a'} M lane-steps/s, {elapsed:.0f} s elapsed, "
              f"{left}", file=self.log, flush=True)


def evaluate(sweep: Sweep, seeds: Sequence[int], *, base_seed: int = 0, chunk: int | None = None,
             devices: int | None = None, measures: MeasureConfig | None = None, log=None) -> LaneValues:
    """Run every (row, seed) lane in equal chunks, one static config per row group.

    Lanes are sharded over `devices` local devices (default all); with several processes
    (jax.distributed), each runs a contiguous share and every process gets all results.
    """
    log = log or sys.stderr  # looked up now: tests and callers may have replaced it
    seeds = list(seeds)
    rows = list(sweep.rows)
    if len(seeds) < 1:
        raise InputError(f"--seeds must be >= 1, got {len(seeds)}")
    if not rows:
        raise InputError("the sweep has no settings")
    if len(rows) * len(seeds) > MAX_LANES:
        raise InputError(f"{len(rows)} settings x {len(seeds)} seeds = {len(rows) * len(seeds):,} lanes, over the "
                         f"limit of {MAX_LANES:,}: use fewer seeds")
    try:
        mesh = lane_mesh(devices)
    except ValueError as err:
        raise InputError(str(err)) from None
    engine = sweep.engine or MODEL_ENGINE
    wanted = MeasureConfig.of(set(sweep.measures) | {"latency"}) if measures is None else measures
    groups: dict = {}
    for i, row in enumerate(rows):
        groups.setdefault(engine.group_key(row), []).append(i)
    configs = {key: engine.config([rows[i] for i in idx], sweep.record_every, wanted) for key, idx in groups.items()}
    steps = max(engine.steps(configs[key], [rows[i] for i in idx]) for key, idx in groups.items())
    total = len(rows) * len(seeds)
    start, stop = process_share(total)
    up_to = "up to " if any(sources_mod.drains(r.source) for r in rows) else ""
    print(f"[{sweep.name}] {len(rows)} settings x {len(seeds)} seeds = {total:,} lanes of {up_to}{steps:,} steps "
          f"({total * steps:.3g} lane-steps) on {mesh.devices.size} {jax.devices()[0].platform} device(s)",
          file=log, flush=True)
    progress = Progress(sweep.name, stop - start, steps, log)
    max_clients = max(getattr(r.source, "num_clients", 0) for r in rows)
    collected: list[tuple[np.ndarray, dict]] = []
    series_steps, used_chunk = None, 0
    for key, idx in groups.items():
        config = configs[key]
        # Seed-major: a chunk holds whole seeds of every row of the group, so an engine
        # can generate each seed's requests once for all of its settings.
        lanes = [r * len(seeds) + s for s in range(len(seeds)) for r in idx]
        mine = [lane for lane in lanes if start <= lane < stop]
        if not mine:
            continue
        size = chunk_size(len(mine), engine.lane_bytes(config), chunk, available_bytes(mesh),
                          multiple=math.lcm(mesh.devices.size, len(idx)) if chunk is None else mesh.devices.size,
                          platform=mesh.devices.flat[0].platform)
        used_chunk = max(used_chunk, size)
        for first in range(0, len(mine), size):
            batch = [mine[(first + j) % len(mine)] for j in range(size)]  # the last chunk repeats lanes
            keep = min(size, len(mine) - first)
            chunk_rows = [rows[lane // len(seeds)] for lane in batch]
            results = engine.run(chunk_rows, [seeds[lane % len(seeds)] for lane in batch], config, base_seed, mesh,
                                 progress.chunk(keep, size))
            values = {"metrics": sweep.metrics(results, chunk_rows), "finished": results.finished}
            if getattr(results, "offered", None) is not None:
                values["metrics"].update(load_metrics(results))
                # NaN-padded to the sweep's most clients: groups may differ in K
                values["clients"] = {k: np.pad(v, ((0, 0), (0, max_clients - v.shape[1])), constant_values=np.nan)
                                     for k, v in client_values(results).items()}
            if sweep.series is not None:
                values["series"] = sweep.series(results, chunk_rows)
                series_steps = np.asarray(results.checkpoint_steps)
            values = jax.tree_util.tree_map(lambda x, keep=keep: np.asarray(x)[:keep], values)
            collected.append((np.asarray(batch[:keep]) - start, values))
            progress.finished_chunk(keep)

    local = stop - start

    def gathered(getter) -> np.ndarray:
        parts = [(where, np.asarray(getter(v))) for where, v in collected]
        if not parts:
            return gather_lanes(np.zeros(0), total)
        out = np.empty((local,) + parts[0][1].shape[1:], parts[0][1].dtype)
        for where, part in parts:
            out[where] = part
        return gather_lanes(out, total)

    sample = collected[0][1] if collected else {}
    metrics = {k: gathered(lambda v, k=k: v["metrics"][k].astype(np.float64)) for k in sample.get("metrics", {})}
    clients = {k: gathered(lambda v, k=k: v["clients"][k].astype(np.float64)) for k in sample.get("clients", {})}
    series = {k: gathered(lambda v, k=k: v["series"][k].astype(np.float64)) for k in sample.get("series", {})}
    finished = gathered(lambda v: v["finished"].astype(bool))
    return LaneValues(metrics, series, clients, finished, series_steps, used_chunk)


def aggregate(name: str, rows: Sequence[Row], values: LaneValues, seeds: int, log=None):
    """Per row: every metric summarized over its finished seeds (unfinished lanes are
    excluded and counted, with a warning), per-client means, and every series as mean and
    2.5-97.5% band."""
    log = log or sys.stderr
    rows_out, series_out = [], []
    for i, row in enumerate(rows):
        lanes = slice(i * seeds, (i + 1) * seeds)
        ok = values.finished[lanes]
        entry = {"setting": row.setting, "label": row.label,
                 "metrics": {k: summarize(v[lanes][ok]) for k, v in values.metrics.items()}}
        if values.clients:
            k_row = getattr(row.source, "num_clients", 0)
            with np.errstate(all="ignore"), _quiet():
                entry["clients"] = {k: [None if not np.isfinite(x) else float(x)
                                        for x in np.nanmean(v[lanes][ok], axis=0)[:k_row]] if ok.any() else []
                                    for k, v in values.clients.items()}
        if not ok.all():
            entry["unfinished_lanes"] = int((~ok).sum())
            print(f"[{name}] warning: {int((~ok).sum())} lanes of {row.label} did not finish "
                  "(flagged, excluded from every number)", file=log)
        rows_out.append(entry)
        if values.series:
            stacked = {k: v[lanes][ok] for k, v in values.series.items()}
            series_out.append({k: {"mean": v.mean(axis=0).tolist(),
                                   "lo": np.percentile(v, 2.5, axis=0).tolist(),
                                   "hi": np.percentile(v, 97.5, axis=0).tolist()} if len(v) else {}
                               for k, v in stacked.items()})
    return rows_out, series_out


class _quiet:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def run_sweep(sweep: Sweep, seeds: int, *, base_seed: int = 0, chunk: int | None = None,
              devices: int | None = None, measures: MeasureConfig | None = None, log=None) -> dict:
    """Run every (row, seed) lane; returns {"sweep", "config", "rows"[, "series"]}."""
    if seeds < 1:
        raise InputError(f"--seeds must be >= 1, got {seeds}")
    values = evaluate(sweep, range(seeds), base_seed=base_seed, chunk=chunk, devices=devices, measures=measures,
                      log=log)
    rows_out, series_out = aggregate(sweep.name, sweep.rows, values, seeds, log)
    config_out = dict(sweep.config, seeds=seeds, base_seed=base_seed, lanes=len(sweep.rows) * seeds,
                      chunk=values.chunk)
    out = {"sweep": sweep.name, "config": config_out, "rows": rows_out}
    if series_out:
        out["series"] = {"steps": [int(s) for s in values.series_steps], "rows": series_out}
    return sweep.post(out) if sweep.post else out


# ---- reporting ----------------------------------------------------------------------

def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _render(header: list, lines: list) -> str:
    widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
    render = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([render(header), render(["-" * w for w in widths])] + [render(r) for r in lines])


def format_table(sweep: Sweep, result: dict) -> str:
    """Each cell: mean [95% CI]; the paper's (or seed document's) value beside it, only for
    the workload it belongs to."""
    show_paper = sweep.default_workload and bool(sweep.paper_values)
    header = ["setting"] + [c + (" (paper)" if show_paper and any(c in v for v in sweep.paper_values.values())
                                 else "") for c in sweep.columns]
    lines = []
    for entry in result["rows"]:
        cells = [entry["label"]]
        paper = sweep.paper_values.get(entry["label"], {}) if show_paper else {}
        for col in sweep.columns:
            m = entry["metrics"].get(col)
            cell = "n/a" if not m or m["mean"] is None else \
                f"{_fmt(m['mean'])} [{_fmt(m['ci95'][0])}, {_fmt(m['ci95'][1])}]"
            if col in paper:
                cell += f" ({_fmt(paper[col])})"
            cells.append(cell)
        lines.append(cells)
    return _render(header, lines)


def format_load(result: dict) -> str:
    """The load line of every row, and an overload warning where offered exceeds served."""
    lines = []
    for entry in result["rows"]:
        m = entry["metrics"]
        if "offered_per_step" not in m or m["offered_per_step"]["mean"] is None:
            continue
        off, srv = m["offered_per_step"]["mean"], m["served_per_step"]["mean"]
        waiting, queued = m["waiting_at_end"]["mean"], m["waiting_at_span_end"]["mean"]
        ratio = off / srv if srv else float("inf")
        warn = (f"  OVERLOAD: {ratio:.2f}x what was served was offered; queues grow as long as requests "
                "arrive, so drift and shares describe a backlog, not a steady state") if overloaded(ratio, queued) else ""
        lines.append(f"  {entry['label']}: offered {_fmt(off)} vs served {_fmt(srv)} weighted tokens/step over the "
                     f"arrival span ({_fmt(queued)} requests queued when the last arrived), {_fmt(waiting)} requests "
                     f"waiting at the end{warn}")
    return ("load:\n" + "\n".join(lines)) if lines else ""


def format_clients(result: dict, client_names: Sequence[str] | None = None) -> str:
    """Per row, a per-client table: share of service and of demand, admitted/arrived,
    waiting time p50/p90/p99 (steps)."""
    out = []
    for entry in result["rows"]:
        c = entry.get("clients")
        if not c or not c.get("served_share"):
            continue
        k = len(c["served_share"])
        names = client_names or [str(i) for i in range(k)]
        header = ["client", "share of service", "share of demand", "admitted/arrived", "wait p50", "wait p90",
                  "wait p99"]
        lines = [[names[i]] + [_fmt(c[key][i]) for key in ("served_share", "offered_share", "admitted_over_arrived",
                                                           "wait_p50", "wait_p90", "wait_p99")] for i in range(k)]
        out.append(f"{entry['label']}:\n" + _render(header, lines))
    return "\n".join(out)


def output_names(sweep: Sweep, plots: bool = True) -> list[str]:
    """The files `write_outputs` may write in the output directory (for the pre-run check)."""
    names = ["results.json", "results.csv"] + ["series.json"] * (sweep.series is not None)
    return names + ([p.filename for p in sweep.plots] if plots else [])


def write_outputs(sweep: Sweep, result: dict, out_dir: Path, plots: bool = True,
                  extra: Sequence[tuple[Path, Callable]] = ()) -> list[Path]:
    """results.json, results.csv (one row per setting and metric), series.json (time
    series, when the sweep has some), the PNG plots and the caller's `extra` (path,
    writer) pairs, written as one set (temporary files renamed only when all were
    written: a failed plot leaves no results.json behind)."""
    out_dir = Path(out_dir)
    main_keys = {k: v for k, v in result.items() if k not in ("series", "overlays")}
    files = [(out_dir / "results.json", lambda p: p.write_text(json.dumps(main_keys, indent=1, default=_json_default))),
             (out_dir / "results.csv", lambda p: p.write_text(results_csv(result)))]
    if "series" in result:
        files.append((out_dir / "series.json",
                      lambda p: p.write_text(json.dumps(result["series"], default=_json_default))))
    if plots:
        for plot in sweep.plots:
            files.append((out_dir / plot.filename, lambda p, plot=plot: draw(result, plot, p)))
    return fileio.write_outputs_atomically(files + list(extra))


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Fraction):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} as JSON")


def results_csv(result: dict) -> str:
    keys = sorted({k for entry in result["rows"] for k in entry["setting"]})
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(keys + ["metric", "mean", "std", "ci95_lo", "ci95_hi", "min", "max", "n"])
    for entry in result["rows"]:
        for name, m in entry["metrics"].items():
            if not isinstance(m, dict) or "mean" not in m:
                continue
            writer.writerow([json.dumps(entry["setting"].get(k)) if isinstance(entry["setting"].get(k), (dict, list))
                             else entry["setting"].get(k) for k in keys] +
                            [name, m["mean"], m["std"], m["ci95"][0], m["ci95"][1], m["min"], m["max"], m["n"]])
    return buf.getvalue()


def draw(result: dict, plot: Plot, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    match = [all(r["setting"].get(k) == v for k, v in plot.where) for r in result["rows"]]
    if plot.kind == "clients":
        _draw_client_panels(plt, [r for r, ok in zip(result["rows"], match) if ok], plot, path)
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    series_rows = [s for s, ok in zip(result.get("series", {}).get("rows", []), match) if ok]
    rows = [r for r, ok in zip(result["rows"], match)
            if ok and (plot.kind in ("series", "scatter", "client_cdf") or plot.y in r["metrics"])]
    if plot.kind == "metric":
        xs = [r["setting"].get(plot.x, r["label"]) for r in rows]
        mean = np.asarray([r["metrics"][plot.y]["mean"] if r["metrics"][plot.y]["mean"] is not None else np.nan
                           for r in rows], float)
        lo = np.asarray([r["metrics"][plot.y]["ci95"][0] or np.nan for r in rows], float)
        hi = np.asarray([r["metrics"][plot.y]["ci95"][1] or np.nan for r in rows], float)
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
        if numeric:
            order = np.argsort(xs)
            xs_sorted = np.asarray(xs, float)[order]
            ax.plot(xs_sorted, mean[order], "o-", label=f"{plot.y} (mean)")
            ax.fill_between(xs_sorted, lo[order], hi[order], alpha=0.3, label="95% CI")
            if plot.extra:
                ax.plot(xs_sorted, np.asarray([r["metrics"][plot.extra]["mean"] for r in rows], float)[order], "k--",
                        label=plot.extra)
        else:  # categories: points with CI bars, never joined
            pos = np.arange(len(xs))
            ax.errorbar(pos, mean, yerr=[mean - lo, hi - mean], fmt="o", capsize=4, label=f"{plot.y} (mean, 95% CI)")
            ax.set_xticks(pos, [str(x) for x in xs], rotation=30, ha="right")
            if plot.extra:
                ax.plot(pos, [r["metrics"][plot.extra]["mean"] for r in rows], "k_", markersize=20, label=plot.extra)
        for overlay in result.get("overlays", []):
            if overlay["plot"] == plot.filename:
                ax.plot(overlay["x"], overlay["y"], "r.-", alpha=0.7, label=overlay["label"])
        positive = mean[np.isfinite(mean) & (mean > 0)]
        ylog = plot.ylog if plot.ylog is not None else (not numeric and len(positive) > 1
                                                       and positive.max() > 10 * positive.min())
        if ylog:
            ax.set_yscale("log")
        ax.set_xlabel(plot.x)
        ax.legend(fontsize=8)
    elif plot.kind == "scatter":
        labelled = []
        for r in rows:
            mx, my = r["metrics"].get(plot.x), r["metrics"].get(plot.y)
            if not mx or not my or mx["mean"] is None or my["mean"] is None:
                continue
            ax.errorbar(mx["mean"], my["mean"], xerr=[[mx["mean"] - mx["ci95"][0]], [mx["ci95"][1] - mx["mean"]]],
                        yerr=[[my["mean"] - my["ci95"][0]], [my["ci95"][1] - my["mean"]]], fmt="o", capsize=3)
            labelled.append(((mx["mean"], my["mean"]), r["label"]))
        if plot.xlog:
            ax.set_xscale("log")
        if plot.ylog:
            ax.set_yscale("log")
        ax.set_xlabel(plot.x)
    elif plot.kind == "series":
        steps = result["series"]["steps"]
        for r, s in zip(rows, series_rows):
            band = s.get(plot.y)
            if not band:
                continue
            mean, lo, hi = (np.asarray(band[k]) for k in ("mean", "lo", "hi"))
            if mean.ndim == 2:  # one line per client
                for c in range(mean.shape[1]):
                    ax.plot(steps, mean[:, c], label=f"{r['label']} client {c}")
            else:
                ax.plot(steps, mean, label=r["label"])
                ax.fill_between(steps, lo, hi, alpha=0.2)
        ax.set_xlabel("step")
        ax.legend(fontsize=7, ncol=2)
    elif plot.kind == "client_cdf":
        for r in rows:
            v = np.asarray([x for x in r.get("clients", {}).get(plot.x, []) if x is not None], float)
            if len(v):
                ax.step(np.sort(v), np.arange(1, len(v) + 1) / len(v), where="post", label=r["label"])
        if plot.xlog:
            ax.set_xscale("symlog")
        ax.set_xlabel(plot.x)
        ax.legend(fontsize=7, ncol=2)
    else:
        raise ValueError(f"unknown plot kind {plot.kind!r}")
    if plot.xlog and plot.kind == "metric":
        ax.set_xscale("symlog" if any(r["setting"].get(plot.x) == 0 for r in rows) else "log", base=2)
    ax.set_ylabel(plot.ylabel or plot.y)
    ax.set_title(plot.title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if plot.kind == "scatter":  # once the layout is final: the boxes are measured where they are drawn
        place_labels(ax, [p for p, _ in labelled], [t for _, t in labelled])
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


def _label_offsets() -> list[tuple[float, float]]:
    """Offsets (points) to try for a label, nearest first: 8 directions on growing rings."""
    ring = [(1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)]
    return [(r * dx, r * dy) for r in (6, 14, 24, 36, 50, 66, 84) for dx, dy in ring]


def place_labels(ax, points: Sequence[tuple[float, float]], labels: Sequence[str], fontsize: float = 7) -> list:
    """Annotate each point (data coordinates) with its label at the nearest offset where
    the label's box overlaps no label placed before it, stays inside the axes and covers
    no other point's marker; if none is free, where it overlaps fewest labels (then stays
    inside, then covers fewest markers). A thin leader line joins
    a label moved away. Returns the annotations. Call it once the axes' limits, scales and
    layout are final (the boxes are measured in display space)."""
    from matplotlib.text import Text

    renderer = ax.figure.canvas.get_renderer()
    markers = [ax.transData.transform(p) for p in points]
    inside = ax.get_window_extent(renderer)
    placed, out = [], []
    for i, (point, text) in enumerate(zip(points, labels)):
        best = None
        for dx, dy in _label_offsets():
            ann = ax.annotate(text, point, textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                              ha="left" if dx > 0 else "right" if dx < 0 else "center",
                              va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                              arrowprops=None if max(abs(dx), abs(dy)) <= 6 else
                              {"arrowstyle": "-", "linewidth": 0.5, "color": "0.5"})
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer).expanded(1.05, 1.1)  # the text, not its leader line
            score = (sum(box.overlaps(b) for b in placed), not inside.contains(box.x0, box.y0)
                     or not inside.contains(box.x1, box.y1),
                     sum(j != i and box.contains(*m) for j, m in enumerate(markers)))
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, ann, box)
            else:
                ann.remove()
            if not any(score):
                break
        placed.append(best[2])
        out.append(best[1])
    return out


MAX_FIGURE_PIXELS = 4000  # the widest and tallest PNG any plot is
MAX_TENANT_BARS = 60  # tenants drawn one by one in a tenants plot (0.5 in each); the rest summed


def capped_figsize(width: float, height: float, dpi: float) -> tuple[float, float]:
    """(width, height) in inches, each cut to MAX_FIGURE_PIXELS at `dpi`."""
    limit = MAX_FIGURE_PIXELS / dpi
    return min(width, limit), min(height, limit)


def top_tenants(demand: Sequence, limit: int = MAX_TENANT_BARS) -> list[int]:
    """Indices of the `limit` tenants of largest share of demand (None as 0), in tenant order."""
    order = sorted(range(len(demand)), key=lambda k: -(demand[k] or 0))
    return sorted(order[:limit])


def draw_tenants(result: dict, names: Sequence[str], path) -> None:
    """Per tenant and policy: share of service beside share of demand, and wait p99 (symlog
    axis: zero waits drawn too). Up to MAX_TENANT_BARS tenants each (those of most demand); beyond that the rest
    are one "others" group (their shares summed, their largest wait p99), as the title says,
    so the figure stays under MAX_FIGURE_PIXELS whatever the number of tenants."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("clients")]
    demand = rows[0]["clients"]["offered_share"] if rows else [0] * len(names)
    shown = top_tenants(demand) if len(names) > MAX_TENANT_BARS else list(range(len(names)))
    rest = sorted(set(range(len(names))) - set(shown))

    def grouped(values, combine):
        """The shown tenants' values, then the rest's combined (None when they have none)."""
        others = [values[k] for k in rest if values[k] is not None]
        return [values[k] for k in shown] + ([combine(others) if others else None] if rest else [])

    labels = [names[k] for k in shown] + ([f"others ({len(rest)})"] if rest else [])
    k = len(labels)
    dpi = 110
    fig, axes = plt.subplots(2, 1, figsize=capped_figsize(max(6.4, 0.5 * k + 2), 6.4, dpi), dpi=dpi, sharex=True)
    width = 0.8 / (len(rows) + 1)
    x = np.arange(k)
    axes[0].bar(x - 0.4 + width / 2, [d or 0 for d in grouped(demand, sum)], width, color="0.7",
                label="share of demand")
    for i, r in enumerate(rows):
        c = r["clients"]
        axes[0].bar(x - 0.4 + width * (i + 1.5), [v or 0 for v in grouped(c["served_share"], sum)], width,
                    label=r["label"])
        axes[1].plot(x, [np.nan if v is None else v for v in grouped(c["wait_p99"], max)], "o-", label=r["label"])
    axes[0].set_ylabel("share")
    axes[0].legend(fontsize=7)
    axes[1].set_ylabel("wait p99 (steps)")
    # symlog: log above 1 step, linear through 0, so a wait of 0 (a light log) is drawn
    # instead of vanishing from a log axis
    axes[1].set_yscale("symlog", linthresh=1.0)
    axes[1].set_ylim(bottom=0)
    axes[1].set_xticks(x, labels, rotation=45, ha="right", fontsize=7)
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    title = "per tenant: share of service vs demand, and wait p99"
    if rest:
        title += (f"\nthe {len(shown)} of {len(names)} tenants with most demand; the other {len(rest)} as one "
                  "group (shares summed, wait p99 their largest)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


def _draw_client_panels(plt, rows: list, plot: Plot, path: Path) -> None:
    """`Plot` kind "clients": one log-log panel per row, a point per client."""
    n = max(1, len(rows))
    cols = min(4, n)
    grid = -(-n // cols)
    fig, axes = plt.subplots(grid, cols, figsize=capped_figsize(3.2 * cols, 3.0 * grid, 110), dpi=110,
                             squeeze=False, sharex=True, sharey=True)
    values = [(np.asarray([np.nan if v is None else v for v in r.get("clients", {}).get(plot.x, [])], float),
               np.asarray([np.nan if v is None else v for v in r.get("clients", {}).get(plot.y, [])], float))
              for r in rows]
    positive = np.concatenate([np.concatenate([x[x > 0], y[y > 0]]) for x, y in values] or [np.ones(1)])
    lo, hi = (positive.min(), positive.max()) if len(positive) else (1.0, 10.0)
    for ax, r, (x, y) in zip(axes.flat, rows, values):
        ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        ax.loglog(x[ok], y[ok], "o", markersize=3, alpha=0.7)
        ax.loglog([lo, hi], [lo, hi], "k--", linewidth=0.8)
        ax.set_title(r["label"], fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(plot.x, fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel(plot.ylabel or plot.y, fontsize=8)
    fig.suptitle(plot.title, fontsize=10)
    fig.tight_layout()
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


# ---- the command line ----------------------------------------------------------------

def base_parser(name: str, description: str) -> Parser:
    parser = Parser(prog=f"python -m sweeps.{name}", description=description,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int_arg(1, MAX_LANES), default=DEFAULT_SEEDS,
                        help="seeds per setting (default %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("results") / name,
                        help=f"output directory for results.json, results.csv and plots (default results/{name})")
    parser.add_argument("--chunk", type=int_arg(1, MAX_LANES), default=None,
                        help="lanes per compiled call (default: sized from memory)")
    parser.add_argument("--base-seed", type=int_arg(0, 2**31 - 1), default=0, help="base of every lane's random key")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--devices", type=int_arg(1, 4096), default=None, help="use only the first N local devices")
    parser.add_argument("--measures", type=list_arg(str, name="measures"), default=None,
                        help="measures to keep beyond the sweep's own: names from pair_drift, latency, resource, "
                             "ledger, occupancy, demand, share, or all")
    parser.add_argument("--check", action="store_true",
                        help="verify conservation in every lane (keeps the token ledger); exit 1 if violated")
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR),
                        help=f"persistent compilation cache (default {DEFAULT_CACHE_DIR}; env VTC_JAX_CACHE)")
    parser.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")
    parser.add_argument("--coordinator", default=None,
                        help="multi-host: coordinator host:port for jax.distributed (or JAX_COORDINATOR_ADDRESS)")
    parser.add_argument("--num-processes", type=int_arg(1, 4096), default=None, help="multi-host: number of processes")
    parser.add_argument("--process-id", type=int_arg(0, 4095), default=None, help="multi-host: this process's index")
    parser.add_argument("--policy-module", action="append", default=[], metavar="FILE.py",
                        help="load policies defined in your own file (a POLICY or POLICIES attribute) so that "
                             "--policy/--policies accept them")
    return parser


def setup_runtime(args) -> None:
    """Compilation cache and (multi-host) distributed runtime, from the common flags."""
    try:
        init_distributed(args.coordinator, args.num_processes, args.process_id)
        enable_compilation_cache(None if args.no_cache else args.cache_dir)
    except OSError as err:
        raise InputError(f"cannot use the compilation cache {args.cache_dir} ({err.strerror or err})") from None
    except (RuntimeError, ValueError) as err:
        raise InputError(f"cannot start the distributed runtime ({err})") from None


def measure_config(sweep: Sweep, args) -> MeasureConfig:
    names = set(sweep.measures) | {"latency"}
    if args.measures:
        names |= set(args.measures)
    if args.check:
        names.add("ledger")
    try:
        return MeasureConfig.of(names)
    except ValueError as err:
        raise InputError(f"--measures: {err}") from None


def main(name: str, description: str, add_arguments: Callable, build: Callable[[argparse.Namespace], Sweep],
         argv=None) -> int:
    """CLI entry of a sweep module: parse, build the Sweep (every flag validated), check
    the output directory, run, print, write the results as one set."""
    return guarded(f"python -m sweeps.{name}", lambda: _main(name, description, add_arguments, build, argv))


def _main(name, description, add_arguments, build, argv) -> int:
    from vtc_jax.driver.policy_modules import preload_policy_modules

    preload_policy_modules(sys.argv[1:] if argv is None else argv)
    parser = base_parser(name, description)
    add_arguments(parser)
    args = parser.parse_args(argv)
    setup_runtime(args)
    sweep = build(args)
    measures = measure_config(sweep, args)
    if jax.process_index() == 0:
        fileio.check_writable_dir(args.out, output_names(sweep, plots=not args.no_plots))
    try:
        lane_mesh(args.devices)
    except ValueError as err:
        raise InputError(str(err)) from None
    for note in list(getattr(args, "notes", [])) + list(sweep.notes):
        print(note, file=sys.stderr)
    result = run_sweep(sweep, args.seeds, base_seed=args.base_seed, chunk=args.chunk, devices=args.devices,
                       measures=measures)
    if jax.process_index() != 0:  # process 0 reports and writes
        return 0
    if args.check:
        bad = sum(r["metrics"].get("conservation_violations", {}).get("max") or 0 for r in result["rows"])
        if bad:
            raise CheckFailed("conservation violated in some lane (an engine defect: please report it)")
        print("check: conservation holds in every lane")
    print(format_table(sweep, result))
    load = format_load(result)
    if load:
        print(load)
    if sweep.clients or (sweep.clients is None and _num_clients(sweep) <= 8):
        tables = format_clients(result)
        if tables:
            print("per client (means over seeds):\n" + tables)
    written = write_outputs(sweep, result, args.out, plots=not args.no_plots)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def _num_clients(sweep: Sweep) -> int:
    src = getattr(sweep.rows[0], "source", None) if sweep.rows else None
    return getattr(src, "num_clients", 0)


# ---- workload flags shared by the MODEL.md sweeps -------------------------------------

def _range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH integers, got {text[:40]!r}") from None
    if not 1 <= lo <= hi <= 1 << 22:
        raise argparse.ArgumentTypeError(f"expected 1 <= LOW <= HIGH <= {1 << 22}, got {lo},{hi}")
    return lo, hi


DEFAULT_WORKLOAD = {"steps": 6000, "prompt": (64, 512), "output": (32, 384), "kv_budget": 8192, "w_p": "1",
                    "w_q": "2"}


def add_workload_arguments(parser: argparse.ArgumentParser, *, rates: str = "1.0,0.25", kv_budget: bool = True) -> None:
    """Flags of the seed document's overload workload, shared by the sweeps (`kv_budget`
    False: the sweep's grid sets M, so there is no --kv-budget flag)."""
    parser.add_argument("--steps", type=int_arg(1, run.MAX_HORIZON), default=DEFAULT_WORKLOAD["steps"],
                        help="horizon in steps (default %(default)s)")
    parser.add_argument("--rates", type=list_arg(float_arg(0.0, 1e6), name="rates", max_items=4096),
                        default=[float(x) for x in rates.split(",")],
                        help=f"Poisson arrival rates per client, requests per step (default {rates})")
    parser.add_argument("--prompt", type=_range, default=DEFAULT_WORKLOAD["prompt"],
                        help="prompt range LOW,HIGH (default 64,512)")
    parser.add_argument("--output", type=_range, default=DEFAULT_WORKLOAD["output"],
                        help="output range LOW,HIGH (default 32,384)")
    if kv_budget:
        parser.add_argument("--kv-budget", type=int_arg(1, run.MAX_HORIZON), default=DEFAULT_WORKLOAD["kv_budget"],
                            help="KV budget M in tokens (default %(default)s)")
    parser.add_argument("--w-p", type=number_text, default="1", help="prefill token cost (default %(default)s)")
    parser.add_argument("--w-q", type=number_text, default="2", help="decode token cost (default %(default)s)")
    parser.add_argument("--weights", type=list_arg(number_text, name="weights"), default=None,
                        help="client weights w0,w1,... (default all 1; policies that ignore weights refuse it)")
    parser.add_argument("--trace", type=Path, default=None,
                        help="replay this trace CSV (arrival,client,prompt,output[,cached], arrivals in steps) "
                             "instead of the synthetic traffic; --steps is then the horizon")
    parser.add_argument("--phase-unit", type=int_arg(1, 1 << 20), default=1,
                        help="with --trace: each seed > 0 redraws every arrival uniformly inside its own block of "
                             "this many steps (default 1: every seed replays the trace as is)")


def workload_is_default(args, rates: str) -> bool:
    """The workload flags are the defaults (the paper's values apply)."""
    return (args.trace is None and args.weights is None and list(args.rates) == [float(x) for x in rates.split(",")]
            and all(getattr(args, k, v) == v for k, v in DEFAULT_WORKLOAD.items()))


def workload_source(args, traffic):
    """The sweep's workload: the synthetic `traffic`, or the user's --trace."""
    if args.trace is None:
        return sources_mod.TrafficSource(traffic)
    from vtc_jax.inputs.workload import read_trace_csv

    trace = read_trace_csv(args.trace)
    k = max(trace.num_clients, len(args.weights or ()))
    return sources_mod.TraceSource(trace, num_clients=k, horizon=args.steps, phase_unit=args.phase_unit)


def workload_config(args: argparse.Namespace) -> dict:
    out = {"steps": args.steps, "rates": args.rates, "prompt": list(args.prompt), "output": list(args.output),
           "w_p": str(args.w_p), "w_q": str(args.w_q)}
    if getattr(args, "kv_budget", None) is not None:
        out["kv_budget"] = args.kv_budget
    if args.weights:
        out["weights"] = list(args.weights)
    if args.trace:
        out.update(trace=str(args.trace), phase_unit=args.phase_unit)
    return out


def make_settings(args, policy: str, *, baseline: bool = False, **kwargs) -> Settings:
    """Settings of a sweep row from the workload flags. --weights is refused for a policy
    that does not read them, except for a `baseline` row (FCFS or RPM beside weighted
    policies), which then runs unweighted and says so once on stderr."""
    weights = tuple(args.weights) if args.weights else None
    if weights is not None and "weights" not in registry.get(policy).reads:
        why = registry.get(policy).summary.split(":")[0]
        if not baseline:
            raise InputError(f"--weights: policy {policy} ignores client weights (it orders by {why}); "
                             "drop --weights or choose a weighted policy")
        note = f"note: {policy} ignores --weights (it orders by {why}); it runs unweighted as a baseline"
        notes = vars(args).setdefault("notes", [])  # printed by `main` once every flag is validated
        if note not in notes:
            notes.append(note)
        weights = None
    return Settings(policy, kwargs.pop("kv_budget", getattr(args, "kv_budget", None)), w_p=args.w_p, w_q=args.w_q,
                    weights=weights, **kwargs)
