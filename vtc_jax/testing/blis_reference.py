"""A literal reference of BLIS's single-instance engine (inference-sim f90a1e3a) where no
request is preempted, in plain Python: the `blis_engine` rules of the vllm servers on a
step-time model (servers/step_time.py), request by request. Slow and obvious: a test
compares the lanes with it on random small traces (tests/test_blis_physics.py); the
golden runs of BLIS itself are in tests/data/blis/.

BLIS's engine, as its golden runs show it: a request enters the waiting queue a0 after its
arrival (queued at exactly a step's start, it joins that step); each step first gives each
running request, in admission order, its next chunk of prompt (capped by the long-prefill
threshold, every chunk) or one decode token, then admits waiting requests in FCFS order
while seats and budget last; the step lasts the model's duration of what it scheduled; a
request's first token comes with the step that computes its last prompt token. Completions
are handled at the step's start: a step that finishes every request it runs, with none
waiting, leaves the engine idle from its start, so the next queued request starts its own
step at its queue time even before that step ends. TTFT = first token's step end + a2 -
arrival; E2E = last step's end + a2 x output + a1 - arrival.
"""

from __future__ import annotations

from fractions import Fraction

from vtc_jax.servers.step_time import StepTime


def blis_run(requests: list[tuple[int, int, int]], model: StepTime, budget: int, seats: int,
             threshold: int = 0) -> list[tuple[int, int]]:
    """Per request (arrival_us, prompt, output), in order: (ttft_us, e2e_us)."""
    n = len(requests)
    queued = [a + model.a0 for a, _, _ in requests]
    order = sorted(range(n), key=lambda i: (queued[i], i))
    progress, first_end, last_end = [0] * n, [None] * n, [None] * n
    waiting, running, nxt, t = [], [], 0, None
    while nxt < n or waiting or running:
        if t is None:  # idle: the next queued request starts a step at its queue time
            t = queued[order[nxt]]
        while nxt < n and queued[order[nxt]] <= t:
            waiting.append(order[nxt])
            nxt += 1
        left, new = budget, {}

        def chunk(r, left):
            k = requests[r][1] - progress[r]
            return min(threshold if 0 < threshold < k else k, left)

        for r in running:
            if left <= 0:
                break
            new[r] = chunk(r, left) if progress[r] < requests[r][1] else 1
            left -= new[r]
        while len(running) < seats and waiting and left > 0:
            r = waiting.pop(0)
            running.append(r)
            new[r] = chunk(r, left)
            left -= new[r]
        sched = [r for r in running if new.get(r, 0) > 0]
        prefill = [r for r in sched if progress[r] < requests[r][1]]
        decode = [r for r in sched if progress[r] >= requests[r][1]]
        attention = sum(new[r] * (requests[r][1] + Fraction(new[r], 2)) for r in prefill)
        duration = model.step_us(sum(new[r] for r in prefill), len(decode), per_request=len(sched),
                                 per_chunk_attention=attention,
                                 per_decode_context=sum(progress[r] + 1 for r in decode))
        for r in sched:
            progress[r] += new[r]
            last_end[r] = t + duration
            if progress[r] == requests[r][1] and first_end[r] is None:
                first_end[r] = t + duration
        running = [r for r in running if progress[r] < requests[r][1] + max(requests[r][2], 1) - 1]
        t = t + duration if (running or waiting) else None
    return [(first_end[i] + model.a2 - a, last_end[i] + model.a2 * o + model.a1 - a)
            for i, (a, _, o) in enumerate(requests)]
