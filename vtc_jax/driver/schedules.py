"""A server's own record of a run, per trace row: the step-by-step schedule and each
request's first token, finish and preemptions, in the layout of the real schedulers'
golden logs (vLLM's: tests/data/vllm_golden/README.md; SGLang's, whose steps name the rows
they RETRACTED: tests/data/sglang_golden/README.md), so a run is compared with the real
scheduler's own.

Reads the host copy of a lane's final server state (`LaneResults.server_state`) for a
server that keeps a `log` (ScheduleLog) and an `out` (Outcome): vllm, vllm_prefix and
sglang (`schedule_servers`); workload rows are mapped back to trace rows with the layout
the driver used.
"""

from __future__ import annotations

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs.workload import Trace, trace_rows


def keeps_schedule(state) -> bool:
    return hasattr(state, "log") and hasattr(state, "out")


def schedule_servers() -> tuple[str, ...]:
    """The registered servers that keep a schedule log (those that preempt: their own memory
    and scheduler, the vllm servers and sglang)."""
    from vtc_jax.servers import registry as servers

    return tuple(n for n in servers.names() if servers.get(n).preempts)


def no_schedule(server: str | None = None) -> InputError:
    """The refusal of --schedule-out on a server that keeps no schedule (one line)."""
    named = f"--server {server} keeps none" if server else "this server keeps none"
    return InputError(f"--schedule-out needs a server that keeps a schedule ({named}; those that do: "
                      f"--server {', '.join(schedule_servers())})")


def logged_steps(result, lane: int = 0) -> int:
    """Steps the server logged in the run (the log may hold fewer: its size is static)."""
    return int(np.asarray(result.server_state.log.count)[lane])


def schedule_report(result, trace: Trace, num_clients: int, pad: int, lane: int = 0, *,
                    retracts: bool = False, names=None) -> dict:
    """{"steps": [{"step", "sched": {row: tokens}, "preempted": [rows], "finished": [rows]}],
    "requests": {row: {"first_token_step", "finish_step", "preemptions"}}, "num_steps",
    "total_preemptions", "stalled"} of lane `lane` (rows are trace rows, as strings in the
    JSON keys). `retracts`: the server requeues to the tail (`Server.requeue_to_tail`,
    SGLang's): its log's evictions are retractions, so the keys read "retracted",
    "retractions" and "total_retractions" (SGLang's word). `names`: int64[N], the row each
    trace row is reported as (default: its index; a replay that reordered its trace gives
    the file's rows). Refused when the server keeps no schedule or its log was too short."""
    state = result.server_state
    if not keeps_schedule(state):
        raise no_schedule()
    evicted, each, total = (("retracted", "retractions", "total_retractions") if retracts
                            else ("preempted", "preemptions", "total_preemptions"))
    log, out = state.log, state.out
    count, capacity = logged_steps(result, lane), np.asarray(log.t).shape[-1]
    if count > capacity:
        raise InputError(f"the schedule log holds {capacity} steps but the run took {count}")
    rows = trace_rows(trace, num_clients, pad)
    if names is not None:
        rows = np.where(rows >= 0, np.asarray(names, np.int64)[np.maximum(rows, 0)], -1)
    index = np.asarray(log.index)[lane]
    tokens = np.asarray(log.tokens)[lane]
    finished = np.asarray(log.finished)[lane]
    preempted = np.asarray(log.preempted)[lane]
    t = np.asarray(log.t)[lane]
    steps = []
    for j in range(count):
        live = index[j] >= 0
        steps.append({"step": int(t[j]),
                      "sched": {str(int(rows[i])): int(n) for i, n in zip(index[j][live], tokens[j][live]) if n > 0},
                      evicted: sorted(int(rows[i]) for i in preempted[j] if i >= 0),
                      "finished": sorted(int(rows[i]) for i, f in zip(index[j][live], finished[j][live]) if f)})
    first, finish = np.asarray(out.first_token)[lane], np.asarray(out.finish)[lane]
    preemptions = np.asarray(out.preemptions)[lane]
    requests = {}
    for i in np.argsort(rows, kind="stable"):
        if rows[i] >= 0:
            requests[str(int(rows[i]))] = {"first_token_step": int(first[i]) if first[i] >= 0 else None,
                                           "finish_step": int(finish[i]) if finish[i] >= 0 else None,
                                           each: int(preemptions[i])}
    stalled = any(r["finish_step"] is None for r in requests.values())
    return {"steps": steps, "requests": requests, "num_steps": len(steps),
            total: int(preemptions.sum()), "stalled": stalled}
