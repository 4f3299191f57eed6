"""A plain sequential VTC simulator: what one would write without JAX.

The baseline the benchmarks compare the engine with (benchmarks/bench_engine.py), and
checked against it (tests/test_sequential.py): plain Python integers, one loop over the
steps of one lane, per-client FIFOs as deques, completions in a dict keyed by step,
decode in O(clients) from per-client counts of running requests. Unlike vtc_jax/testing/reference.py
it keeps no per-step record and uses no Fractions, so it is as fast as a straightforward
Python implementation gets. It covers the benchmark's case only: policy vtc (lift with the
last-left rule), unit weights, integer w_p and w_q, no limits, a fixed horizon.
"""

from __future__ import annotations

from collections import deque


def simulate_vtc(arrival, client, prompt, output, cached, *, num_clients: int, kv_budget: int, w_p: int, w_q: int,
                 steps: int) -> tuple[list[int], list[int], int]:
    """Run one lane for `steps` steps. Requests are given as equal-length integer
    sequences in trace order. Returns (W_k, c_k, max drift) in tokens (integers)."""
    k_all = range(num_clients)
    order = sorted(range(len(arrival)), key=lambda n: (arrival[n], n))
    fifo = [deque() for _ in k_all]
    counter, service = [0] * num_clients, [0] * num_clients
    running = [0] * num_clients
    leaving: dict[int, list[int]] = {}
    occupancy, last_left, max_drift, cursor = 0, -1, 0, 0
    for t in range(steps):
        # phase 1: arrivals in trace order; a client that was not backlogged is lifted
        while cursor < len(order) and arrival[order[cursor]] == t:
            n = order[cursor]
            cursor += 1
            k = client[n]
            if not fifo[k]:
                backlogged = [counter[j] for j in k_all if fifo[j]]
                if backlogged:
                    counter[k] = max(counter[k], min(backlogged))
                elif last_left >= 0:
                    counter[k] = max(counter[k], counter[last_left])
            fifo[k].append(n)
        # phase 2: admit the least-served backlogged client's head while it fits
        while True:
            best = -1
            for j in k_all:
                if fifo[j] and (best < 0 or counter[j] < counter[best]):
                    best = j
            if best < 0:
                break
            n = fifo[best][0]
            if occupancy + prompt[n] > kv_budget:
                break
            fifo[best].popleft()
            occupancy += prompt[n]
            running[best] += 1
            charge = w_p * (prompt[n] - cached[n])
            service[best] += charge
            counter[best] += charge
            last_left = best
            leaving.setdefault(t + output[n] - 1, []).append(n)
        # phase 3: every running request generates one token
        for j in k_all:
            if running[j]:
                service[j] += w_q * running[j]
                counter[j] += w_q * running[j]
                occupancy += running[j]
        max_drift = max(max_drift, max(service) - min(service))
        # phase 4: completions
        for n in leaving.pop(t, ()):
            running[client[n]] -= 1
            occupancy -= prompt[n] + output[n]
    return service, counter, max_drift
