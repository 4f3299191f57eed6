"""A server's measured capacity on a request-length mix, and the offered load against it.

The load line of a timed server (or any server that records per-request times, such as
vllm) states the offered load against what the configured server sustains, not against
the ideal model's memory bound: a log at 0.8 of capacity is not called overloaded.

Capacity is measured by a saturating run: the mix's requests (the log's own lengths, in
their order; repeated, or every k-th taken, so the run holds n requests, n between N and
2N, N = max(MIN_REQUESTS, HOLDS x H), H the most requests the server can hold at once:
min(max_num_seqs, M // the mix's mean prompt + output)) all arrive at time 0 as one
client, on the configured server under FCFS, so the waiting queue is never empty until
the last request is first scheduled (time T). Capacity = requests completed per unit of
time in the saturated window, from the H-th completion t_H (the warm-up, in which the
first batch is admitted together and finishes together, is left out) to T:
(completions in (t_H, T]) / (T - t_H). (Measured on the qwen2.5-7b-h100 preset, 256
seats, prompts 64-512, outputs 32-384: 58.8 requests/s at n = 4H, 58.7 at 8H and 40H;
starting at the first completion instead gives 55.5 at 4H.) The unit is the lane's
clock: microseconds on a timed server (reported per second), steps untimed. Tokens per
unit follow from the mix (the same requests), so a load in requests is the load in tokens.
Exact from the per-request record; deterministic (no seeds).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.driver.results import OVERLOAD
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.workload import Trace, trace_rows
from vtc_jax.measures.online import MeasureConfig

MIN_REQUESTS = 256
HOLDS = 4  # the saturating run holds this many times what the server holds at once
DEFAULT_SEATS = 256  # vLLM's max_num_seqs when the options do not give it


@dataclasses.dataclass(frozen=True)
class Capacity:
    """requests_per_unit: completions per clock unit in the saturated window; tokens
    likewise (prompt + output, and output only, of the mix's mean request); timed: the
    clock is us (else steps); requests: in the saturated run; window: (start, end) in
    clock units; completions: inside it."""

    requests_per_unit: float
    mean_prompt: float
    mean_output: float
    timed: bool
    requests: int
    window: tuple[int, int]
    completions: int

    @property
    def per_second(self) -> float:
        """Requests per second (timed), or per step."""
        return self.requests_per_unit * (1e6 if self.timed else 1.0)

    @property
    def unit(self) -> str:
        return "s" if self.timed else "step"

    def describe(self) -> str:
        tokens = self.per_second * (self.mean_prompt + self.mean_output)
        return (f"{self.per_second:.4g} requests/{self.unit} ({tokens:.4g} tokens/{self.unit}, "
                f"{self.per_second * self.mean_output:.4g} output tokens/{self.unit})")

    def to_json(self) -> dict:
        return {f"requests_per_{self.unit}": self.per_second, "mean_prompt": self.mean_prompt,
                "mean_output": self.mean_output, "saturated_requests": self.requests,
                "window": list(self.window), "completions": self.completions}


def mix(prompt, output, min_requests: int = MIN_REQUESTS) -> tuple[np.ndarray, np.ndarray]:
    """The saturating run's lengths (int64[n] each): the mix repeated up to at least
    `min_requests`, or every k-th request (k = len // min_requests) of a larger one, in
    the mix's order."""
    prompt, output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    if prompt.shape != output.shape or prompt.ndim != 1 or len(prompt) == 0:
        raise InputError("capacity: need one or more (prompt, output) pairs")
    n = len(prompt)
    if n < min_requests:
        index = np.arange(-(-min_requests // n) * n) % n
    else:
        index = np.arange(0, n, n // min_requests)
    return prompt[index], output[index]


def saturated_trace(prompt, output) -> Trace:
    """Every request at time 0, one client, in the mix's order."""
    prompt, output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    zeros = np.zeros_like(prompt)
    return Trace(zeros, zeros, prompt, output, zeros, source="capacity: saturated mix")


def holds(prompt, output, settings: Settings) -> int:
    """H: the most requests of the mix's mean size the server holds at once (>= 1)."""
    seats = dict(settings.server_options).get("max_num_seqs", DEFAULT_SEATS)
    size = float(np.mean(np.asarray(prompt, np.float64) + np.asarray(output, np.float64)))
    return max(1, min(int(seats), int(settings.kv_budget // size)))


def saturated_rate(finish, scheduled, hold: int) -> tuple[float, tuple[int, int], int]:
    """(completions per unit, window, completions) in (`hold`-th completion, last first
    scheduling] from the per-request record (int64[N] each, -1: never)."""
    finish, scheduled = np.asarray(finish, np.int64), np.asarray(scheduled, np.int64)
    if (finish < 0).any() or (scheduled < 0).any():
        raise InputError("capacity: the saturated run did not finish every request")
    start, end = int(np.sort(finish)[min(hold, len(finish)) - 1]), int(scheduled.max())
    inside = int(((finish > start) & (finish <= end)).sum())
    if end <= start or inside < 1:
        raise InputError("capacity: the queue emptied before the saturated window began: too few requests in the "
                         "saturating run to measure a rate")
    return inside / (end - start), (start, end), inside


@dataclasses.dataclass(frozen=True)
class SaturatingLane:
    """The saturating run as one lane: its trace, its settings (fcfs, the server's
    options), H. Beside lanes of lighter traces it would size their running slots (the
    most it holds): run it alone or with other saturating lanes (`measure_many`)."""

    trace: Trace
    settings: Settings
    hold: int

    def capacity(self, result, lane: int, num_clients: int = 1) -> Capacity:
        """The capacity from lane `lane` of `result` (a run of this lane's trace with
        `num_clients` clients)."""
        from vtc_jax.driver.run import workload_pad

        out = getattr(result.server_state, "out", None)
        if out is None:
            raise InputError("capacity: this server records no per-request times")
        rows = trace_rows(self.trace, num_clients, workload_pad())  # the trace row of each workload row (-1: padding)
        live = rows >= 0
        finish = np.asarray(out.finish, np.int64)[lane][:len(rows)][live]
        scheduled = np.asarray(out.scheduled, np.int64)[lane][:len(rows)][live]
        timed = bool(dict(self.settings.server_options).get("time_model", ""))
        if not timed:  # untimed stamps are a step's index, the start of it; the step ends one later
            finish = finish + 1
        rate, window, inside = saturated_rate(finish, scheduled, self.hold)
        return Capacity(rate, float(self.trace.prompt.mean()), float(self.trace.output.mean()), timed,
                        len(self.trace), window, inside)


def saturating_lane(prompt, output, settings: Settings, *, min_requests: int = MIN_REQUESTS) -> SaturatingLane:
    """The lane that measures the capacity of the server `settings` describe (its
    server_options: KV pool, budget, seats, step-time model; the policy becomes fcfs)
    on the mix `prompt`, `output`."""
    hold = holds(prompt, output, settings)
    p, o = mix(prompt, output, max(min_requests, HOLDS * hold))
    return SaturatingLane(saturated_trace(p, o), Settings("fcfs", settings.kv_budget,
                                                          server_options=tuple(settings.server_options)), hold)


def measure(prompt, output, settings: Settings, server: str, *, min_requests: int = MIN_REQUESTS) -> Capacity:
    """The capacity of `server` under `settings` on the mix `prompt`, `output`, in a run
    of its own."""
    return measure_many(prompt, output, [settings], server, min_requests=min_requests)[0]


def measure_many(prompt, output, settings: list[Settings], server: str, *,
                 min_requests: int = MIN_REQUESTS) -> list[Capacity]:
    """The capacity under each of `settings` on one mix, as lanes of one run (one
    compile): every lane replays the same saturating trace, sized for the largest H."""
    lanes = [saturating_lane(prompt, output, s, min_requests=min_requests) for s in settings]
    longest = max(lanes, key=lambda lane: len(lane.trace)).trace
    return measure_lanes([dataclasses.replace(lane, trace=longest) for lane in lanes], server)


def measure_lanes(lanes: list[SaturatingLane], server: str) -> list[Capacity]:
    """Each saturating lane's capacity, all in one run (one compile; the lanes may hold
    different mixes)."""
    from vtc_jax.driver.run import run_traces

    result = run_traces([lane.trace for lane in lanes], [lane.settings for lane in lanes], num_clients=1,
                        server=server, measures=MeasureConfig())
    return [lane.capacity(result, i) for i, lane in enumerate(lanes)]


MIX_REQUESTS = 1024  # a length mix is sampled to at least this many requests (heavy tails need many)
MAX_MIX_LANES = 16


def source_mix(source, kv_budget: int, min_requests: int = MIX_REQUESTS) -> tuple[np.ndarray, np.ndarray]:
    """A sample of the length mix of a generated workload `source` (inputs.sources): the
    request lengths (int64[n] prompt, output) of its lanes 0, 1, ... (as many as its
    expected requests need to reach `min_requests`, at most MAX_MIX_LANES), each in arrival
    order, lane after lane."""
    from vtc_jax.core.rows import ARRIVAL, ORDER, OUTPUT, PROMPT
    from vtc_jax.driver.run import generate_workloads, source_config

    lanes = int(min(MAX_MIX_LANES, max(1, np.ceil(min_requests / max(source.expected_requests(), 1e-9)))))
    config = source_config([source] * lanes, [Settings("fcfs", kv_budget)] * lanes, measures=MeasureConfig())
    requests = np.asarray(generate_workloads([source] * lanes, list(range(lanes)), config).requests, np.int64)
    prompt, output = [], []
    for lane in requests:
        live = lane[lane[:, ARRIVAL] < source.horizon]
        live = live[np.lexsort((live[:, ORDER], live[:, ARRIVAL]))]
        prompt.append(live[:, PROMPT])
        output.append(live[:, OUTPUT])
    prompt, output = np.concatenate(prompt), np.concatenate(output)
    if len(prompt) == 0:
        raise InputError("capacity: the workload's lanes have no requests to take the length mix from")
    return prompt, output


def offered_load(offered_per_unit: float, capacity: Capacity) -> float:
    """The offered rate (requests per second timed, per step untimed) over the capacity."""
    return offered_per_unit / capacity.per_second


def offered_line(offered_per_second: float, capacity: Capacity, what: str, whose: str = "the server's",
                 basis: str = "measured capacity on this mix") -> str:
    """One line: the offered rate against the measured capacity, and whether it overloads.
    `whose` and `basis` name the capacity (a cluster's: R replicas x one server's)."""
    load = offered_load(offered_per_second, capacity)
    verdict = (f"OVERLOAD: {load:.2f}x {whose} capacity was offered; queues grow as long as requests arrive"
               if load > OVERLOAD else f"under {whose} capacity" if load < 1 else f"at {whose} capacity")
    return (f"load: {what} offers {offered_per_second:.4g} requests/{capacity.unit} against {whose} {basis}, "
            f"{capacity.describe()}: offered load {load:.2f} ({verdict})")
