"""The one sweep driver: rows x seeds in chunked compiled calls, and their aggregation, for
any engine. Tables, results.json/csv and plots: sweep_outputs.py; the command line every
`python -m sweeps.NAME` shares: vtc_jax/cli/sweep_command.py.

Every `sweeps/NAME.py` only declares a `Sweep` (its rows: settings + workload + label; the
metrics it reads; table columns; plots) and calls `sweep_command.main`. Lane i of a row group is
(row i // seeds, seed i % seeds). Lanes run in chunks of equal size (the last one padded
with repeats of its own lanes, whose results are discarded), all with one static engine
config per group of rows, so a sweep compiles its engine once per group, whatever its size.

An engine is an adapter with three methods (the MODEL.md engine: `MODEL_ENGINE` below;
the artifact profile: artifact_run.ARTIFACT_ENGINE):

  group_key(row)                          rows with equal keys share one config;
  config(rows, record_every, measures)    the static config of a group (one compile);
  run(rows, seeds, config, base_seed, mesh, progress)  one chunk of lanes -> results
  lane_bytes(config)                      device bytes one lane needs (chunk sizing);
  pass_seeds(config, seeds, rows, chunk, mesh)  optional: seeds per chunk when its
                                          rows run one pass each over them, or None.

Besides each sweep's own metrics, every row reports the load line (offered against served
weighted tokens per step, requests left waiting) and per-client shares and waits.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from fractions import Fraction
from typing import Any, Callable, Sequence

import jax
import numpy as np

from vtc_jax.core import clock
from vtc_jax.core.errors import InputError
from vtc_jax.driver import lane_passes, run
from vtc_jax.driver.devices import available_bytes, gather_lanes, lane_mesh, process_share
from vtc_jax.driver.results import bound_metrics, load_values
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs import sources as sources_mod
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.measures.stats import summarize
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers

MAX_LANES = 1 << 24
PROGRESS_SECONDS = 3.0


# ---- declarations -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Row:
    """One grid point: its scheduler settings, its workload, its label, setting keys
    beyond those derived from the settings (for example the workload's name), and the
    server it runs on (servers.registry; its options are `settings.server_options`)."""

    settings: Any
    source: Any
    label: str
    extra: dict = dataclasses.field(default_factory=dict)
    server: str = servers.DEFAULT_SERVER

    @property
    def setting(self) -> dict:
        """JSON setting keys: policy and kv_budget, every other Settings field that differs
        from its default, the server unless it is the default (`ideal`), then `extra`."""
        server = {} if self.server == servers.DEFAULT_SERVER else {"server": self.server}
        return dict(settings_keys(self.settings), **server, **self.extra)


def with_server(sweep: "Sweep", server: str) -> "Sweep":
    """`sweep` with every row on `server` (a sweep's rows share one server: --server)."""
    if server == servers.DEFAULT_SERVER and all(r.server == servers.DEFAULT_SERVER for r in sweep.rows):
        return sweep
    return dataclasses.replace(sweep, rows=[dataclasses.replace(r, server=server) for r in sweep.rows])


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
        return row.server, sources_mod.signature(row.source)

    @staticmethod
    def config(rows: Sequence[Row], record_every: int, measures: MeasureConfig):
        names = registry.names()
        present = tuple(n for n in names if n in {r.settings.policy for r in rows})
        config = run.source_config([r.source for r in rows], [r.settings for r in rows], record_every,
                                   measures=measures, policies=present, server=rows[0].server)
        run.validate_lanes([r.source for r in rows], [r.settings for r in rows], config)  # before any output
        check_served(rows)
        return config

    @staticmethod
    def run(rows: Sequence[Row], seeds: Sequence[int], config, base_seed: int, mesh, progress):
        return run.simulate_sources([r.source for r in rows], [r.settings for r in rows], list(seeds),
                                    base_seed=base_seed, config=config, mesh=mesh, progress=progress)

    @staticmethod
    def lane_bytes(config) -> int:
        """Device bytes one lane needs while it runs (request blocks and the generator's
        words, the server's state, measures, per-request policy tables), x2 for XLA's
        buffers. The server's state is sized from its own `init` (abstractly: nothing is
        allocated), so a server with per-row tables or a schedule log is counted whole."""
        k, r = config.num_clients, config.num_rows
        with clock.context(config.x64):  # a wide clock's stamps are int64 (and sglang's doubles)
            server = jax.eval_shape(lambda: servers.get(config.server).init(config.server_shape))
        words = 4 * NUM_WORDS * r + sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(server))
        measures = 4 * (3 * config.num_checkpoints * k + 2 * 264 * k + 3 * k * k)
        policy_tables = 16 * r if any(registry.get(p).arrival_rows for p in config.policies) else 0
        return 2 * (words + measures + policy_tables) + 4096

    def pass_seeds(self, config, seeds: int, rows: int, requested: int | None, mesh) -> int | None:
        """Seeds per chunk when a chunk of `rows` rows runs one pass per row over its seeds'
        requests, generated once (driver/lane_passes.py): as many as `chunk_size` gives one
        compiled call of lanes (`requested`: --chunk), and as the host holds the state of
        rows x that many lanes (the run's results); None when passes do not pay
        (lane_passes.worth_passes), and the chunk is sized in lanes instead."""
        budget, lane = available_bytes(mesh), self.lane_bytes(config)
        devices = mesh.devices.size
        size = chunk_size(seeds, lane, requested, budget, multiple=devices, platform=mesh.devices.flat[0].platform)
        state = lane - 2 * 4 * NUM_WORDS * config.num_rows  # a lane's bytes without its requests
        size = min(size, budget // 2 // max(rows * state, 1) // devices * devices)
        return size if lane_passes.worth_passes(size, mesh) else None

    @staticmethod
    def steps(config, rows) -> int:
        return max(r.source.horizon for r in rows)


def check_served(rows: Sequence[Row]) -> None:
    """Refuse rows whose server could never finish the workload's longest request (the
    largest prompt with the largest output: for vllm, more KV blocks than the pool)."""
    for row in rows:
        _, prompt, output = row.source.lengths()
        why = servers.get(row.server).never_served(dict(row.settings.server_options), np.asarray([prompt]),
                                                   np.asarray([output]), row.settings.kv_budget)
        if why is not None:
            raise InputError(f"server {row.server}, {row.label}: the workload's longest request (prompt {prompt} + "
                             f"output {output} tokens; 'request 0' below): {why}")


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
    Lanes that drain (`drains`) run until their requests are served: `steps` and the
    runner's expected events are then bounds, not their length (on a microsecond clock,
    10^9 for a run of a few thousand events), so the rate is in lanes/s and time left is
    given only once a chunk has been measured whole. `clock` (seconds) is injectable for
    tests.
    """

    def __init__(self, name: str, total_lanes: int, steps: int, log=None, clock: Callable[[], float] | None = None,
                 drains: bool = False):
        self.name, self.total, self.steps, self.log, self.drains = name, total_lanes, steps, log or sys.stderr, drains
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
        rate = self._rate() if not self.drains or self.measured_seconds > 0 else float("nan")
        known = math.isfinite(rate)
        left = f"~{(self.total - done) / rate:.0f} s left" if known else "time left not yet known"
        if self.drains:
            speed = f"{rate:.3g} lanes/s" if known else "n/a lanes/s"
        else:
            speed = f"{f'{rate * self.steps / 1e6:.2f}' if known else 'n/a'} M lane-steps/s"
        where = f" (process {jax.process_index()}/{jax.process_count()})" if jax.process_count() > 1 else ""
        print(f"[{self.name}] lanes {int(done)}/{self.total}{where} ({100 * done / self.total:.0f}%), "
              f"{speed}, {elapsed:.0f} s elapsed, {left}", file=self.log, flush=True)


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
    drains = any(sources_mod.drains(r.source) for r in rows)
    length = (f"run until they drain (at most {steps:,} steps of the server's clock)" if drains
              else f"of {steps:,} steps ({total * steps:.3g} lane-steps)")
    print(f"[{sweep.name}] {len(rows)} settings x {len(seeds)} seeds = {total:,} lanes {length} on "
          f"{mesh.devices.size} {jax.devices()[0].platform} device(s)", file=log, flush=True)
    progress = Progress(sweep.name, stop - start, steps, log, drains=drains)
    max_clients = max(getattr(r.source, "num_clients", 0) for r in rows)
    collected: list[tuple[np.ndarray, dict]] = []
    series_steps, used_chunk = None, 0
    for key, idx in groups.items():
        config = configs[key]
        # Seed-major: a chunk holds whole seeds of every row of the group, so an engine
        # can generate each seed's requests once for all of its settings (and, with
        # `pass_seeds`, run each row as a pass of its own over them: lane_passes.py).
        lanes = [r * len(seeds) + s for s in range(len(seeds)) for r in idx]
        mine = [lane for lane in lanes if start <= lane < stop]
        if not mine:
            continue
        size = chunk_size(len(mine), engine.lane_bytes(config), chunk, available_bytes(mesh),
                          multiple=math.lcm(mesh.devices.size, len(idx)) if chunk is None else mesh.devices.size,
                          platform=mesh.devices.flat[0].platform)
        call = size  # lanes per compiled call
        per_pass = getattr(engine, "pass_seeds", None)
        if per_pass is not None and len(idx) > 1:  # the chunk's rows run one pass each over its seeds
            seeds_per_chunk = per_pass(config, -(-len(mine) // len(idx)), len(idx), chunk, mesh)
            if seeds_per_chunk is not None:
                size, call = seeds_per_chunk * len(idx), seeds_per_chunk
        used_chunk = max(used_chunk, call)
        for first in range(0, len(mine), size):
            batch = [mine[(first + j) % len(mine)] for j in range(size)]  # the last chunk repeats lanes
            keep = min(size, len(mine) - first)
            chunk_rows = [rows[lane // len(seeds)] for lane in batch]
            with clock.context(getattr(config, "x64", False)):  # core/clock.py
                results = engine.run(chunk_rows, [seeds[lane % len(seeds)] for lane in batch], config, base_seed,
                                     mesh, progress.chunk(keep, size))
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
