"""The artifact engine profile on the driver's floor: the paper's engine is the `slora`
server (vtc_jax/servers/slora.py) on the main engine, the artifact's schedulers registry
policies (`engine_settings`); lanes run through run_traces, their per-request times turned
into the artifact's measures, and the sweep driver's engine adapter (`ARTIFACT_ENGINE`;
docs/ARTIFACT.md). The profile's settings and host-side inputs are
vtc_jax/engines/artifact.py and vtc_jax/engines/artifact_inputs.py.

The artifact's schedulers on the engine: fcfs is `fcfs`; rpm is `rpm` with the limit in
reject mode over the window in microseconds; lcf, vtc (weighted with weights), vtc_oracle
and vtc_predict are `vtc_artifact` (its float32 counter queues: options lift and predict;
an oracle with range r > 0 predicts through the `noisy` estimator).

The sweeps read the engine's settings and trace reader through this module too (`Profile`,
`StepTime`, `IDLE_RULES`, `TRACE_COLUMNS`, `read_trace_csv`, `check_admissible`): one
import gives the whole artifact profile.
"""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction
from typing import Callable, Sequence

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.driver.results import service_difference
from vtc_jax.driver.run import run_traces
from vtc_jax.engines.artifact import DONE, MAX_STEP_US, NONE, POLICIES, REJECTED, Config, Profile
from vtc_jax.engines.artifact_inputs import (TRACE_COLUMNS, LaneTrace, check_admissible, check_columns, make_trace,
                                             never_admitted, slot_bound)
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.workload import MAX_ARRIVAL, Trace
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.servers import slora
# Read by the sweeps through this module (one import: the whole artifact profile).
from vtc_jax.engines.artifact import IDLE_RULES, StepTime  # noqa: F401
from vtc_jax.engines.artifact_inputs import read_trace_csv  # noqa: F401


# ----------------------------------------------------------------------------- lanes on slora

@dataclasses.dataclass(frozen=True)
class Replay:
    """One lane's replay, host numpy, per request in the lane's order (arrival, ties by
    row): outcome int64[N] (NONE, DONE, REJECTED), first_us and finish_us int64[N] (the
    end of its prefill step and of its last step, valid where DONE); steps and prefills
    (the server's steps), events (the engine's); policy_counters: float64[K] the policy's
    own counters at the end (vtc_artifact's float32 counters, in tokens / weight; NaN for
    fcfs and rpm)."""

    outcome: np.ndarray
    first_us: np.ndarray
    finish_us: np.ndarray
    steps: int
    prefills: int
    events: int
    policy_counters: np.ndarray | None = None


def engine_policy(sched, seed: int) -> dict:
    """Settings fields of an artifact scheduler (`Scheduler`) on the engine."""
    if sched.policy == "fcfs":
        return {"policy": "fcfs"}
    if sched.policy == "rpm":
        return {"policy": "rpm", "rpm_limit": sched.rpm_limit, "rpm_mode": "reject",
                "rpm_window": int(round(sched.profile.rpm_window_s * 1e6))}
    predict = {"lcf": "none", "vtc": "none", "vtc_oracle": "exact", "vtc_predict": "average"}[sched.policy]
    extra = {}
    if sched.policy == "vtc_oracle" and sched.oracle_r > 0:
        predict = "estimator"
        extra = {"estimator": "noisy", "estimate_error": Fraction(str(sched.oracle_r)), "estimate_seed": seed}
    return {"policy": "vtc_artifact", "options": (("lift", sched.policy != "lcf"), ("predict", predict)), **extra}


def engine_trace(lane: LaneTrace, profile: Profile, source: str = "trace") -> Trace:
    """The lane as the engine's trace: arrivals in microseconds, the server's input
    (prompt + input_extra) as the prompt, clients numbered by first arrival."""
    us = np.round(lane.arrival_s * 1e6).astype(np.int64)
    if us.size and us.max() > MAX_ARRIVAL:
        raise InputError(f"{source}: an arrival at {us.max() / 1e6:.0f} s is past the engine's int32 clock "
                         f"(arrivals up to {MAX_ARRIVAL / 1e6:.1f} s of microseconds, runs up to "
                         f"{slora.MAX_HORIZON / 1e6:.0f} s)")
    return Trace(us, lane.client, lane.prompt + profile.input_extra, lane.output, np.zeros_like(us))


def engine_settings(sched, lane: LaneTrace, num_clients: int, seed: int) -> Settings:
    """The engine Settings of an artifact scheduler on `lane` (weights by the lane's
    renumbered clients; the profile as slora's server options)."""
    profile = sched.profile
    weights = None
    if sched.weights is not None:
        w = np.ones(num_clients)
        w[lane.new_id[:len(sched.weights)]] = sched.weights
        weights = tuple(Fraction(str(float(x))) for x in w)
    return Settings(kv_budget=profile.kv_pool - profile.adapter_reserve, w_p=Fraction(str(profile.w_p)),
                    w_q=Fraction(str(profile.w_q)), weights=weights, server_options=profile.server_options(),
                    **engine_policy(sched, seed))


SLOT_TIER = 128  # running slots of a first try (the real trace never holds KV for more than 51)


def run(lanes: Sequence[LaneTrace], scheds: Sequence, num_clients: int, *, seeds: Sequence[int] | None = None,
        mesh=None, progress=None, chunk: int | None = None, first_slots: int = SLOT_TIER) -> tuple[list[Replay], np.ndarray]:
    """Replay `lanes` (each under its Scheduler) to the end on slora, in one batch; returns
    (per lane its Replay, finished: bool[B]). A lane not finished (its drain horizon spent,
    or a structure full) is flagged, never reported.

    Slots in tiers: the proven bound on running requests is far above what a run needs
    (the real trace: 1,000 running_cap against at most 51 holding KV) and every event
    costs O(S), so the lanes first run with `first_slots` slots (slora's `slots`); a lane
    that is not finished then is rerun with the bound. Slots bound capacity only, so a lane
    that finished is exactly what it would have been with more. A lane holding a request
    that no round could ever admit (`never_admitted`; the sweeps refuse such traces before
    the run) is not run: it is reported as not finished."""
    seeds = list(seeds) if seeds is not None else [0] * len(lanes)
    stuck = [bool(never_admitted(lane.prompt, lane.output, s.profile).any()) for lane, s in zip(lanes, scheds)]
    if any(stuck):  # a request no round could ever admit strands its lane: flagged, never run
        keep = [i for i, x in enumerate(stuck) if not x]
        replays = [Replay(np.full(lane.prompt.size, NONE, np.int64), np.full(lane.prompt.size, -1, np.int64),
                          np.full(lane.prompt.size, -1, np.int64), 0, 0, 0) for lane in lanes]
        finished = np.zeros(len(lanes), bool)
        if keep:
            got, done = run([lanes[i] for i in keep], [scheds[i] for i in keep], num_clients,
                            seeds=[seeds[i] for i in keep], mesh=mesh, progress=progress, chunk=chunk,
                            first_slots=first_slots)
            for j, i in enumerate(keep):
                replays[i], finished[i] = got[j], done[j]
        return replays, finished
    traces = [engine_trace(lane, s.profile) for lane, s in zip(lanes, scheds)]
    settings = [engine_settings(s, lane, num_clients, seed) for s, lane, seed in zip(scheds, lanes, seeds)]
    tier = [dataclasses.replace(s, server_options=tuple(sorted({**dict(s.server_options), "slots": first_slots}.items())))
            for s in settings]
    replays, finished = _replays(lanes, traces, tier, num_clients, mesh, progress, chunk)
    redo = np.flatnonzero(~finished)
    if redo.size and first_slots:
        again, done = _replays([lanes[i] for i in redo], [traces[i] for i in redo], [settings[i] for i in redo],
                               num_clients, mesh, progress, chunk)
        for j, i in enumerate(redo):
            replays[i], finished[i] = again[j], done[j]
    return replays, finished


def _replays(lanes, traces, settings, num_clients, mesh, progress, chunk) -> tuple[list[Replay], np.ndarray]:
    res = run_traces(traces, settings, num_clients=num_clients, server=slora.SLORA.name, measures=MeasureConfig(), mesh=mesh,
                     progress=progress, chunk=chunk)
    state = res.server_state
    first, finish = np.asarray(state.first, np.int64), np.asarray(state.finish, np.int64)
    steps, prefills = np.asarray(state.steps), np.asarray(state.prefills)
    out = []
    for b, lane in enumerate(lanes):
        n = lane.prompt.size
        served = first[b, :n] >= 0
        outcome = np.where(served, DONE, REJECTED if res.finished[b] else NONE).astype(np.int64)
        out.append(Replay(outcome, first[b, :n], finish[b, :n], int(steps[b]), int(prefills[b]), int(res.events[b]),
                          np.asarray(res.policy_counters[b], np.float64)))
    return out, np.asarray(res.finished, bool).copy()


def stranded(replays: Sequence[Replay]) -> np.ndarray:
    """int64[B]: per lane, its requests neither served nor rejected at the end."""
    return np.asarray([int((r.outcome == NONE).sum()) for r in replays], np.int64)


# ----------------------------------------------------------------------------- measures

def service_rates(start_s, end_s, service, client, ticks_lo, ticks_hi, num_clients: int) -> np.ndarray:
    """Service rate per client and window: a request's `service` spread evenly over
    [start, end] (requests with end < 1 s or end - start < 1e-5 s, e.g. rejected ones, add
    nothing, as visualize.py), the part inside [lo, hi] divided by hi - lo. float64[K, T]
    (numpy float64 on the host: the same numbers on every machine)."""
    start, end = np.asarray(start_s, np.float64)[:, None], np.asarray(end_s, np.float64)[:, None]
    lo, hi = np.asarray(ticks_lo, np.float64)[None, :], np.asarray(ticks_hi, np.float64)[None, :]
    span = end - start
    ok = (end >= 1.0) & (span >= 1e-5)
    overlap = np.maximum(np.minimum(hi, end) - np.maximum(lo, start), 0.0)
    part = np.where(ok, np.asarray(service, np.float64)[:, None] * overlap / np.where(ok, span, 1.0), 0.0)
    out = np.zeros((num_clients, lo.size))
    np.add.at(out, np.asarray(client), part)
    return out / (hi - lo)


def demand_rates(arrival_s, service, client, ticks_lo, ticks_hi, num_clients: int) -> np.ndarray:
    """Demand rate per client and window: service of the requests arriving in [lo, hi]
    (inclusive) over hi - lo. float64[K, T]."""
    arrival = np.asarray(arrival_s, np.float64)[:, None]
    lo, hi = np.asarray(ticks_lo, np.float64)[None, :], np.asarray(ticks_hi, np.float64)[None, :]
    part = np.where((arrival >= lo) & (arrival <= hi), np.asarray(service, np.float64)[:, None], 0.0)
    out = np.zeros((num_clients, lo.size))
    np.add.at(out, np.asarray(client), part)
    return out / (hi - lo)


@dataclasses.dataclass(frozen=True)
class Ticks:
    """The windows of the service difference: x_i = spacing * i, i = 1..count, window
    [x_i, x_i + window]. Default: the artifact's revision tables (plot_revision.py: a
    600 s span, 30 s warm-up, 20 intervals: x_i = 28.5 i, i = 1..19, 60 s windows)."""

    spacing: float = 28.5
    count: int = 19
    window: float = 60.0

    @classmethod
    def revision(cls, span_s: float = 600.0) -> "Ticks":
        """The revision's rule for a span T: x_i = (T - 30) / 20 * i, i = 1..19, 60 s
        windows. The artifact used T = 600 for every suite it tabulated, the 360 s ones
        included, so `for_duration` keeps T = 600 up to 600 s and uses the duration beyond."""
        return cls(spacing=(span_s - 30.0) / 20.0, count=19, window=60.0)

    @classmethod
    def for_duration(cls, duration_s: float) -> "Ticks":
        return cls.revision(max(600.0, float(duration_s)))

    def bounds(self):
        lo = self.spacing * np.arange(1, self.count + 1)
        return lo, lo + self.window


def lane_measures(lane: LaneTrace, replay: Replay, num_clients: int, ticks: Ticks = Ticks(), *,
                  fairness: bool = True) -> dict:
    """The artifact's measures of one finished lane (`replay`: its Replay).

    Returns throughput (tok/s: served prompt + output over the time from t = 0, the
    benchmark's start, to the last completion: the artifact's `total_time`), ttft_median/
    mean/p90/p99 (s, served requests), rejected (count), rejected_per_client [K],
    ttft_per_client_mean [K], unfinished, steps, prefills, events, served_first_arrival
    (served tokens over first arrival .. last completion, this profile's earlier definition)
    and, with `fairness`, avg_diff, max_diff, diff [T], rate [K, T], demand [K, T], with K in
    the lane's renumbered clients.
    """
    n = lane.prompt.size
    arrival, client = np.round(lane.arrival_s * 1e6) / 1e6, lane.client  # the engine's microseconds
    prompt, output = lane.prompt.astype(np.float64), lane.output.astype(np.float64)
    result = replay.outcome[:n]
    served = result == DONE
    first = np.where(served, replay.first_us[:n] / 1e6, arrival)
    end = np.where(served, replay.finish_us[:n] / 1e6, arrival)
    ttft = first[served] - arrival[served]
    tokens = (prompt[served] + output[served]).sum()
    last = end[served].max() if served.any() else np.nan
    rejected = np.bincount(client[result == REJECTED], minlength=num_clients)
    with np.errstate(invalid="ignore"):
        tt_client = np.array([ttft[client[served] == j].mean() if (client[served] == j).any() else np.nan
                              for j in range(num_clients)])
    stat = (lambda f: float(f(ttft))) if ttft.size else (lambda f: float("nan"))
    out = {"throughput": float(tokens / last) if served.any() else float("nan"),
           "served_first_arrival": float(tokens / (last - arrival.min())) if served.any() else float("nan"),
           "ttft_median": stat(np.median), "ttft_mean": stat(np.mean),
           "ttft_p90": stat(lambda x: np.percentile(x, 90)), "ttft_p99": stat(lambda x: np.percentile(x, 99)),
           "rejected": float(rejected.sum()), "rejected_per_client": rejected, "ttft_per_client_mean": tt_client,
           "unfinished": int(n - served.sum() - (result == REJECTED).sum()),
           "steps": replay.steps, "prefills": replay.prefills, "events": replay.events}
    if fairness:
        service = prompt + 2 * output
        lo, hi = ticks.bounds()
        rate = service_rates(first, end, service, client, lo, hi, num_clients)
        demand = demand_rates(arrival, service, client, lo, hi, num_clients)
        present = np.bincount(client, minlength=num_clients) > 0
        diff = service_difference(rate, demand, present, client_axis=0)
        out.update(avg_diff=float(diff.mean()), max_diff=float(diff.max()), diff=diff, rate=rate, demand=demand)
    return out


# ----------------------------------------------------------------------------- the sweep driver's engine

@dataclasses.dataclass(frozen=True)
class Scheduler:
    """A row's scheduler and engine settings (the driver's Row.settings).

    Attributes:
      policy: one of POLICIES.
      name: the policy as reported (default: policy; e.g. "vtc_weighted").
      rpm_limit: RPM limit (policy "rpm" only).
      weights: client weights by the workload's own client ids (missing ones: 1).
      profile: the engine profile.
      oracle_r: vtc_oracle's prediction range.
    """

    policy: str
    name: str | None = None
    rpm_limit: int | None = None
    weights: tuple | None = None
    profile: Profile = Profile()
    oracle_r: float = 0.0

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise InputError(f"unknown policy {self.policy!r}; expected one of {', '.join(POLICIES)}")
        if (self.policy == "rpm") != (self.rpm_limit is not None):
            raise InputError("an rpm limit goes with policy rpm, and only with it")

    def setting_keys(self) -> dict:
        return {"policy": self.name or self.policy, "rpm": self.rpm_limit}


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """A row's workload for the artifact profile (the driver's Row.source).

    Attributes:
      name: reported name (e.g. "real", a suite's name, a trace file's stem).
      columns: seed -> {"arrival_s", "client", "prompt", "output"} (the lane's trace).
      num_requests: most requests of any seed; num_clients: client ids are < this.
      bound_prompts: prompt lengths for slot_bound (every seed's, or the smallest
        possible repeated num_requests times).
      max_output: the longest output of any seed.
      ticks: the service difference's windows.
    """

    name: str
    columns: Callable[[int], dict]
    num_requests: int
    num_clients: int
    bound_prompts: np.ndarray
    max_output: int
    ticks: Ticks = Ticks()

    @classmethod
    def fixed(cls, name: str, cols: dict, ticks: Ticks | None = None,
              reseed: Callable[[dict, int], dict] | None = None) -> "Workload":
        """A trace replayed as is at seed 0 and, with `reseed`, transformed for seeds > 0
        (lengths unchanged: the slot bound holds for every seed)."""
        cols = dict(zip(TRACE_COLUMNS, check_columns(*(cols[c] for c in TRACE_COLUMNS), source=name)))
        span = float(cols["arrival_s"].max())
        columns = (lambda seed: cols) if reseed is None else (lambda seed: cols if seed == 0 else reseed(cols, seed))
        return cls(name, columns, int(cols["arrival_s"].size), int(cols["client"].max()) + 1, cols["prompt"],
                   int(cols["output"].max()), ticks or Ticks.for_duration(span))


def _bucket(x: int, floor: int = 16) -> int:
    """x rounded up to a power of two (at least `floor`): nearby shapes share a compile."""
    return max(floor, 1 << max(0, int(x) - 1).bit_length())


def _round_up(x: int, step: int = 32) -> int:
    return max(step, -(-int(x) // step) * step)


class ArtifactEngine:
    """The artifact profile behind the sweep driver (vtc_jax.driver.sweep): rows whose settings
    are a `Scheduler` and whose source is a `Workload`."""

    name = "artifact"

    @staticmethod
    def _slots(row) -> int:
        s = row.source
        return slot_bound(s.bound_prompts, row.settings.profile, s.num_requests)

    def group_key(self, row):
        """Rows share a compile when their client and slot counts round to the same
        powers of two (N only sizes per-request arrays: the group takes its largest)."""
        return (_bucket(row.source.num_clients, 2), _bucket(self._slots(row), 64))

    def config(self, rows, record_every: int = 0, measures=None) -> Config:
        n = max(_bucket(r.source.num_requests, 256) for r in rows)
        k = max(_bucket(r.source.num_clients, 2) for r in rows)
        s = max(_round_up(self._slots(r)) for r in rows)
        for r in rows:
            check_limits(r.source, r.settings.profile, s)
        return Config(n, k, s)

    def lane(self, row, seed: int, base_seed: int, config: Config) -> LaneTrace:
        sched, src = row.settings, row.source
        cols = src.columns(base_seed + seed)
        check_admissible(cols, sched.profile, f"{src.name} (seed {base_seed + seed})")
        return make_trace(cols["arrival_s"], cols["client"], cols["prompt"], cols["output"],
                          input_extra=sched.profile.input_extra, num_clients=config.num_clients)

    def run(self, rows, seeds, config: Config, base_seed: int, mesh, progress) -> "ArtifactResults":
        lanes = [self.lane(row, seed, base_seed, config) for row, seed in zip(rows, seeds)]
        replays, finished = run(lanes, [r.settings for r in rows], config.num_clients,
                                seeds=[base_seed + s for s in seeds], mesh=mesh, progress=progress)
        return ArtifactResults(rows=list(rows), lanes=lanes, replays=replays, finished=finished & (stranded(replays) == 0),
                               num_clients=config.num_clients)

    @staticmethod
    def lane_bytes(config: Config) -> int:
        n, k, s = config.num_requests, config.num_clients, config.slots
        return 2 * 4 * (16 * n + 8 * k + 24 * s) + 4096

    @staticmethod
    def steps(config: Config, rows) -> int:
        """Expected events per lane (the driver's progress unit)."""
        best = 0
        for r in rows:
            span = float(r.source.ticks.bounds()[1][-1])
            st = r.settings.profile.step_time
            best = max(best, int(4 * r.source.num_requests + span / max(st.overhead * st.decode_base, 1e-3)))
        return best


def check_limits(source: Workload, profile: Profile, slots: int) -> None:
    """Refuse up front what int32 arithmetic could not hold: the KV check's values
    (slots x (input + output)) and the longest possible step (MAX_STEP_US)."""
    prompts = np.asarray(source.bound_prompts)
    longest = int(prompts.max()) + profile.input_extra + int(source.max_output) + 1
    if (slots + 1) * longest >= 1 << 31:
        raise InputError(f"{source.name}: {slots} running slots x {longest} tokens per request exceed int32; "
                         "use a smaller kv_pool or shorter requests")
    st = profile.step_time
    context = slots * longest
    worst_s = st.overhead * max(st.prefill_base + st.prefill_per_token * profile.prefill_cap,
                                st.decode_base + st.decode_per_request * slots
                                + st.decode_per_context_token * context)
    if worst_s * 1e6 >= MAX_STEP_US:
        raise InputError(f"{source.name}: a step could last {worst_s:.0f} s, over the limit of "
                         f"{MAX_STEP_US / 1e6:.0f} s per step: check the step-time coefficients")


@dataclasses.dataclass
class ArtifactResults:
    """One chunk's lanes (lane i = rows[i] at its seed): their replays, the lanes' traces,
    finished flags; measures computed on demand and cached."""

    rows: list
    lanes: list
    replays: list
    finished: np.ndarray
    num_clients: int

    @functools.cached_property
    def measures(self) -> list[dict]:
        """Per lane: lane_measures with the row's ticks, per-client arrays back in the
        workload's own client ids."""
        out = []
        for i, (row, lane) in enumerate(zip(self.rows, self.lanes)):
            m = lane_measures(lane, self.replays[i], self.num_clients, row.source.ticks)
            back = lane.new_id  # renumbered id of each original client
            for key in ("rate", "demand", "rejected_per_client", "ttft_per_client_mean"):
                full = np.zeros((self.num_clients,) + np.shape(m[key])[1:], np.asarray(m[key]).dtype)
                full[:back.size] = np.asarray(m[key])[back]
                m[key] = full
            out.append(m)
        return out

    def metric(self, name: str) -> np.ndarray:
        return np.asarray([m[name] for m in self.measures], np.float64)

    @property
    def checkpoint_steps(self) -> np.ndarray:
        """The series' x axis for the driver: tick numbers 1..T (each row's tick times are
        its workload's Ticks)."""
        return np.arange(1, max(r.source.ticks.count for r in self.rows) + 1)


ARTIFACT_ENGINE = ArtifactEngine()
