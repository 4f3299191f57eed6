"""A server's own record of a run, per trace row: the step-by-step schedule and each
request's first token, finish and preemptions, in the layout of the real vLLM scheduler's
golden logs (tests/data/vllm_golden/README.md), so a run is compared with vLLM's own.

Reads the host copy of a lane's final server state (`LaneResults.server_state`) for a
server that keeps a `log` (ScheduleLog) and an `out` (Outcome), such as `vllm`; workload
rows are mapped back to trace rows with the layout the driver used.
"""

from __future__ import annotations

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs.workload import Trace, trace_rows


def keeps_schedule(state) -> bool:
    return hasattr(state, "log") and hasattr(state, "out")


def logged_steps(result, lane: int = 0) -> int:
    """Steps the server logged in the run (the log may hold fewer: its size is static)."""
    return int(np.asarray(result.server_state.log.count)[lane])


def schedule_report(result, trace: Trace, num_clients: int, pad: int, lane: int = 0) -> dict:
    """{"steps": [{"step", "sched": {row: tokens}, "preempted": [rows], "finished": [rows]}],
    "requests": {row: {"first_token_step", "finish_step", "preemptions"}}, "num_steps",
    "total_preemptions", "stalled"} of lane `lane` (rows are trace rows, as strings in the
    JSON keys). Refused when the server keeps no schedule or its log was too short."""
    state = result.server_state
    if not keeps_schedule(state):
        raise InputError("this server keeps no schedule log (--schedule-out needs --server vllm)")
    log, out = state.log, state.out
    count, capacity = logged_steps(result, lane), np.asarray(log.t).shape[-1]
    if count > capacity:
        raise InputError(f"the schedule log holds {capacity} steps but the run took {count}")
    rows = trace_rows(trace, num_clients, pad)
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
                      "preempted": sorted(int(rows[i]) for i in preempted[j] if i >= 0),
                      "finished": sorted(int(rows[i]) for i, f in zip(index[j][live], finished[j][live]) if f)})
    first, finish = np.asarray(out.first_token)[lane], np.asarray(out.finish)[lane]
    preemptions = np.asarray(out.preemptions)[lane]
    requests = {}
    for i in np.argsort(rows, kind="stable"):
        if rows[i] >= 0:
            requests[str(int(rows[i]))] = {"first_token_step": int(first[i]) if first[i] >= 0 else None,
                                           "finish_step": int(finish[i]) if finish[i] >= 0 else None,
                                           "preemptions": int(preemptions[i])}
    stalled = any(r["finish_step"] is None for r in requests.values())
    return {"steps": steps, "requests": requests, "num_steps": len(steps),
            "total_preemptions": int(preemptions.sum()), "stalled": stalled}
