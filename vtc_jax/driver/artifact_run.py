"""The artifact engine profile on the driver's floor: lanes run through the runner, final
states turned into the artifact's measures, and the sweep driver's engine adapter
(`ARTIFACT_ENGINE`; docs/ARTIFACT.md). The engine itself is vtc_jax/engines/artifact.py,
its host-side inputs vtc_jax/engines/artifact_inputs.py.

Slots in tiers: runs hold far fewer requests than the proven slot bound (the real trace:
51 of 657) and every event costs O(S), so `run` first gives every lane SLOT_TIER slots and
reruns with the bound only the lanes that overflow (slots bound capacity only: results
are the same).

The sweeps read the engine's settings and trace reader through this module too (`Profile`,
`StepTime`, `IDLE_RULES`, `TRACE_COLUMNS`, `read_trace_csv`, `check_admissible`): one
import gives the whole artifact profile.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.driver import runner
from vtc_jax.driver.results import service_difference
from vtc_jax.engines.artifact import (ARTIFACT_PROGRAM, CHARGED, DEFAULT_PROFILE, DONE, FINISH_HI, FINISH_LO,
                                      FIRST_HI, FIRST_LO, MAX_STEP_US, NONE, OUTCOME, POLICIES, REJECTED, WORD, Batch,
                                      Config, Params, Profile, State)
from vtc_jax.engines.artifact_inputs import (TRACE_COLUMNS, LaneTrace, check_admissible, check_columns, make_params,
                                             make_trace, slot_bound, stack)
# Read by the sweeps through this module (one import: the whole artifact profile).
from vtc_jax.engines.artifact import IDLE_RULES, StepTime  # noqa: F401
from vtc_jax.engines.artifact_inputs import read_trace_csv  # noqa: F401


# ----------------------------------------------------------------------------- results of a state

def outcome(state: State) -> np.ndarray:
    """OUTCOME per request (any leading lane axes), host numpy."""
    return np.asarray(state.result)[..., OUTCOME]


def first_us(state: State) -> np.ndarray:
    """First-token time per request in microseconds (int64; valid where DONE)."""
    r = np.asarray(state.result).astype(np.int64)
    return (r[..., FIRST_HI] << WORD) + r[..., FIRST_LO]


def finish_us(state: State) -> np.ndarray:
    """Finish time per request in microseconds (int64; valid where DONE)."""
    r = np.asarray(state.result).astype(np.int64)
    return (r[..., FINISH_HI] << WORD) + r[..., FINISH_LO]


def charged(state: State) -> np.ndarray:
    """The prediction charged at admission per request (float32; valid where DONE)."""
    return np.asarray(state.result)[..., CHARGED].astype(np.int32).view(np.float32)


# ----------------------------------------------------------------------------- runs

def expected_events(lane: LaneTrace, profile: Profile) -> int:
    """About how many events a lane takes (chunk sizing only): arrivals, admissions and
    completions, then its steps (the trace's span and a drain over a small decode step)."""
    st = profile.step_time
    step_s = max(st.overhead * (st.decode_base + 8 * st.decode_per_request), 1e-3)
    span = float(lane.arrival_s[-1]) if lane.arrival_s.size else 0.0
    return int(4 * lane.prompt.size + (1.2 * span + 60.0) / step_s) + 1024


def event_budget(lane: LaneTrace, profile: Profile) -> int:
    """Events after which a lane is given up: every request arrives, is admitted and
    completes (3 events), takes at most one prefill and output - 1 decode steps, and the
    idle time up to the last arrival takes at most last / poll polls."""
    n = lane.prompt.size
    last = float(lane.arrival_s[-1]) if n else 0.0
    return int(3 * n + n + int(lane.output.sum()) + last / profile.poll_s + n + 1024)


SLOT_TIER = 128  # slots of a first try (the real trace never holds KV for more than 51)
SLOT_FIELDS = ("skey", "sval", "sslot", "spend", "pool", "pd0", "pstamp", "pocc", "ppend", "pfin", "free")


def _widen(state: State, slots: int) -> State:
    """A host State with its slot arrays padded to `slots` (zeros: empty slots)."""
    def pad(x):
        width = [(0, 0)] * x.ndim
        width[1] = (0, slots - x.shape[1])
        return np.pad(x, width)

    return dataclasses.replace(state, **{f: pad(np.asarray(getattr(state, f))) for f in SLOT_FIELDS})


def _run_once(lanes, params, config, profiles, mesh, progress, chunk):
    batch = Batch(trace=stack([l.trace for l in lanes]), params=stack(params))
    budget = max(event_budget(l, p) for l, p in zip(lanes, profiles))
    expected = max(expected_events(l, p) for l, p in zip(lanes, profiles))
    carry, done = runner.run(ARTIFACT_PROGRAM, config, batch, None, event_budget=budget, expected_events=expected,
                             chunk=chunk, mesh=mesh, progress=progress)
    return carry, np.asarray(done).copy()


def run(lanes: Sequence[LaneTrace], params: Sequence[Params], config: Config, *,
        profiles: Sequence[Profile] | Profile = DEFAULT_PROFILE, mesh=None, progress=None, chunk: int | None = None,
        first_slots: int = SLOT_TIER) -> tuple[State, np.ndarray]:
    """Replay `lanes` (each with its Params and Profile) to the end; returns (final State
    with a leading lane axis, host numpy; finished: bool[B]).

    Slots in tiers: config.slots is a proven bound, usually far above what a run needs
    (657 for the real trace, which never holds more than 51), and every event costs O(S).
    So the lanes first run with `first_slots`; a lane that needs more stops at once
    (`overflow`) and is rerun with config.slots. Slots only bound capacity, so a lane that
    did not overflow is exactly what it would have been with more. A lane that is not done
    when the event budget is spent, overflows the proven bound, or ends with a request
    neither served nor rejected (`stranded`) is reported as not finished."""
    if isinstance(profiles, Profile):
        profiles = [profiles] * len(lanes)
    if config.slots <= first_slots:
        state, done = _run_once(lanes, params, config, profiles, mesh, progress, chunk)
        return state, _finished(lanes, state, done)
    state, done = _run_once(lanes, params, dataclasses.replace(config, slots=first_slots), profiles, mesh, progress,
                            chunk)
    state = _widen(state, config.slots)
    redo = np.flatnonzero(np.asarray(state.overflow))
    if redo.size:
        wide, wide_done = _run_once([lanes[i] for i in redo], [params[i] for i in redo], config,
                                    [profiles[i] for i in redo], mesh, progress, chunk)
        state = jax.tree_util.tree_map(lambda a, b: np.concatenate([a, b])[_merge_index(a.shape[0], redo)],
                                       state, wide)
        done[redo] = wide_done
    return state, _finished(lanes, state, done)


def _finished(lanes: Sequence[LaneTrace], state: State, done: np.ndarray) -> np.ndarray:
    """bool[B]: done, within its slots, and nothing stranded."""
    return done & ~np.asarray(state.overflow) & (stranded(lanes, state) == 0)


def stranded(lanes: Sequence[LaneTrace], state: State) -> np.ndarray:
    """int64[B]: per lane, its trace's requests that are neither served nor rejected at the
    end (a lane that stopped early, or a request no round could ever admit)."""
    real = np.arange(state.result.shape[1])[None, :] < np.asarray([l.prompt.size for l in lanes])[:, None]
    return ((outcome(state) == NONE) & real).sum(axis=1)


def _merge_index(lanes: int, redo: np.ndarray) -> np.ndarray:
    """Rows of concatenate([first try, rerun]) in lane order: rerun lanes from the second part."""
    index = np.arange(lanes)
    index[redo] = lanes + np.arange(redo.size)
    return index


def lane_index(tree, i):
    """Lane i of a batched pytree."""
    return jax.tree_util.tree_map(lambda x: x[i], tree)


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


def lane_measures(lane: LaneTrace, state: State, num_clients: int, ticks: Ticks = Ticks(), *,
                  fairness: bool = True) -> dict:
    """The artifact's measures of one finished lane (state: that lane's State, host numpy).

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
    result = outcome(state)[:n]
    served = result == DONE
    first = np.where(served, first_us(state)[:n] / 1e6, arrival)
    end = np.where(served, finish_us(state)[:n] / 1e6, arrival)
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
           "steps": int(state.steps), "prefills": int(state.prefills), "events": int(state.events)}
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

    def lane(self, row, seed: int, base_seed: int, config: Config) -> tuple[LaneTrace, Params]:
        sched, src = row.settings, row.source
        cols = src.columns(base_seed + seed)
        check_admissible(cols, sched.profile, f"{src.name} (seed {base_seed + seed})")
        lane = make_trace(cols["arrival_s"], cols["client"], cols["prompt"], cols["output"],
                          input_extra=sched.profile.input_extra, num_requests=config.num_requests,
                          num_clients=config.num_clients, oracle_r=sched.oracle_r, seed=base_seed + seed)
        weights = None
        if sched.weights is not None:
            weights = np.ones(config.num_clients)
            weights[lane.new_id[:len(sched.weights)]] = sched.weights
        return lane, make_params(sched.policy, config.num_clients, sched.profile, rpm_limit=sched.rpm_limit,
                                 weights=weights)

    def run(self, rows, seeds, config: Config, base_seed: int, mesh, progress) -> "ArtifactResults":
        made = [self.lane(row, seed, base_seed, config) for row, seed in zip(rows, seeds)]
        lanes = [m[0] for m in made]
        state, finished = run(lanes, [m[1] for m in made], config, profiles=[r.settings.profile for r in rows],
                              mesh=mesh, progress=progress)
        return ArtifactResults(rows=list(rows), lanes=lanes, state=state, finished=finished,
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
    """One chunk's lanes (lane i = rows[i] at its seed): final states (host numpy), the
    lanes' traces, finished flags; measures computed on demand and cached."""

    rows: list
    lanes: list
    state: State
    finished: np.ndarray
    num_clients: int

    @functools.cached_property
    def measures(self) -> list[dict]:
        """Per lane: lane_measures with the row's ticks, per-client arrays back in the
        workload's own client ids."""
        out = []
        for i, (row, lane) in enumerate(zip(self.rows, self.lanes)):
            m = lane_measures(lane, lane_index(self.state, i), self.num_clients, row.source.ticks)
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
