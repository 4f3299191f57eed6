"""Slow, literal, exact reference implementation of the serving model.

This module follows ``MODEL.md`` (the contract) phase by phase, with plain Python
lists/dicts and :class:`fractions.Fraction` for every cost and counter, so that its
results are exact. It exists to check the fast JAX engine step by step; clarity and
literalness beat speed. It depends on the standard library only.

Choices made where MODEL.md leaves room (see the report / project docs):

* ``steps=None`` runs until every request has completed; the horizon is then
  ``T = last completion step + 1`` (``T = 0`` for an empty trace). Termination is
  guaranteed because every prompt fits in ``M``: when nothing runs, occupancy is 0 and
  the first candidate is always admitted (for ``rpm``, at the latest in the next window).
* A request with ``prompt > M`` is always rejected with ``ValueError`` (even if its
  arrival lies beyond a finite horizon).
* ``rpm`` counts admissions per client per window ``j = t // window``; when every
  backlogged client is at its limit there is no candidate and admission stops.
* In the lift rule, ``min over backlogged clients`` is taken over the clients whose FIFO
  is non-empty at the moment the arriving request is about to join (the arriving
  client itself is, by the rule's condition, not among them). If ``last_left`` is the
  arriving client itself, the ``last_left`` clause is a no-op.
* ``lift_last_left=False`` is the documented artifact variant: when no client is
  backlogged, the counter is left alone.
* ``w_p``, ``w_q``, ``beta`` must be >= 0; weights must be > 0.
"""

from __future__ import annotations

import operator
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

POLICIES = ("fcfs", "lcf", "vtc", "rpm")


@dataclass(frozen=True)
class Request:
    """One request of a trace (see MODEL.md, Objects)."""

    arrival: int
    client: int
    prompt: int
    output: int
    cached: int = 0


@dataclass
class RefResult:
    """Per-step record of a reference run.

    All per-step lists have length ``steps`` (= T); index ``t`` is "after step t"
    unless stated otherwise. Per-client inner lists have length ``num_clients``.
    """

    steps: int                       # horizon actually run (T)
    service: list[list[Fraction]]    # service[t][k] = W_k after step t
    counters: list[list[Fraction]]   # counters[t][k] = c_k after step t
    backlogged: list[list[bool]]     # FIFO of k non-empty at END of step t
    backlogged_after_arrivals: list[list[bool]]  # ... at end of phase 1 of step t
    occupancy: list[int]             # sum of (prompt + generated) over running, end of step t
    running_count: list[int]         # number of running requests, end of step t
    admit_step: list[int | None]     # per request (trace order): step admitted, or None
    finish_step: list[int | None]    # per request: step it completed (phase 4), or None
    admitted: list[int]              # per client: requests admitted by the end of the run
    completed: list[int]             # per client: requests completed by the end of the run
    decode_charge: list[list[Fraction]]   # decode charge of client k in step t
    prefill_charge: list[list[Fraction]]  # prefill (admission) charge of client k in step t
    held: list[list[int]] = None     # KV tokens held per client after the decode of step t


# ----------------------------------------------------------------------------------
# input conversion / validation
# ----------------------------------------------------------------------------------

def _frac(x, name: str) -> Fraction:
    """Convert int / Fraction / str / float (via its str) to an exact Fraction."""
    if isinstance(x, bool):
        raise ValueError(f"{name} must be a number, got bool")
    if isinstance(x, Fraction):
        return x
    if isinstance(x, float):
        return Fraction(str(x))
    if isinstance(x, (int, str)):
        try:
            return Fraction(x)
        except (ValueError, ZeroDivisionError) as e:
            raise ValueError(f"{name}: cannot convert {x!r} to a Fraction") from e
    try:  # other integer-like objects (e.g. numpy ints)
        return Fraction(operator.index(x))
    except TypeError:
        pass
    try:
        return Fraction(str(x))
    except (ValueError, ZeroDivisionError) as e:
        raise ValueError(f"{name}: cannot convert {x!r} to a Fraction") from e


def _int(x, name: str) -> int:
    """An exact integer (no bools, no floats)."""
    if isinstance(x, bool):
        raise ValueError(f"{name} must be an integer, got bool")
    try:
        return operator.index(x)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {x!r}") from None


def _validate_requests(requests, num_clients: int, kv_budget: int) -> list[Request]:
    out = []
    for n, r in enumerate(requests):
        arrival = _int(r.arrival, f"request {n}: arrival")
        client = _int(r.client, f"request {n}: client")
        prompt = _int(r.prompt, f"request {n}: prompt")
        output = _int(r.output, f"request {n}: output")
        cached = _int(r.cached, f"request {n}: cached")
        if arrival < 0:
            raise ValueError(f"request {n}: arrival {arrival} < 0")
        if not 0 <= client < num_clients:
            raise ValueError(f"request {n}: client {client} not in [0, {num_clients})")
        if prompt < 1:
            raise ValueError(f"request {n}: prompt {prompt} < 1")
        if output < 1:
            raise ValueError(f"request {n}: output {output} < 1")
        if not 0 <= cached < prompt:
            raise ValueError(f"request {n}: cached {cached} not in [0, prompt={prompt})")
        if prompt > kv_budget:
            raise ValueError(
                f"request {n}: prompt {prompt} > kv_budget {kv_budget}: it can never be admitted"
            )
        out.append(Request(arrival, client, prompt, output, cached))
    return out


# ----------------------------------------------------------------------------------
# the simulator
# ----------------------------------------------------------------------------------

def simulate(requests: list[Request], *, num_clients: int, kv_budget: int, policy: str,
             w_p=1, w_q=2, beta=0, weights=None, rpm_limit=None, rpm_window=2000,
             steps: int | None = None, lift_last_left: bool = True, kv_cap=None,
             charge_cached: bool = False) -> RefResult:
    """Run the serving model of MODEL.md literally and record every step.

    Args:
      requests: the trace; requests are numbered in list order (trace order). Need not
        be sorted by arrival.
      num_clients: K >= 1; client ids must lie in [0, K).
      kv_budget: M >= 1 tokens.
      policy: "fcfs", "lcf", "vtc" or "rpm".
      w_p, w_q, beta: cost weights (int, Fraction, str, or float via str), >= 0.
      weights: per-client omega_k > 0 (length K), default all 1.
      rpm_limit: R >= 1, required for policy "rpm" (ignored otherwise).
      rpm_window: window length in steps (>= 1), default 2000.
      steps: horizon T (runs t = 0..T-1), or None to run until every request completed.
      lift_last_left: False gives the VTC-artifact variant without the last_left clause.
      kv_cap: extension (issue 5), None for the contract: per-client caps (list) or one int;
        a client is a candidate only while sum over its running requests of (prompt +
        output) plus its head's prompt + output stays within its cap.
      charge_cached: extension (issue 5): charge w_p * prompt (sent tokens) at admission.

    Returns:
      RefResult.

    Raises:
      ValueError on an unknown policy or invalid input.
    """
    # ---- parameters ---------------------------------------------------------------
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")
    K = _int(num_clients, "num_clients")
    if K < 1:
        raise ValueError(f"num_clients must be >= 1, got {K}")
    M = _int(kv_budget, "kv_budget")
    if M < 1:
        raise ValueError(f"kv_budget must be >= 1, got {M}")
    w_p = _frac(w_p, "w_p")
    w_q = _frac(w_q, "w_q")
    beta = _frac(beta, "beta")
    for name, v in (("w_p", w_p), ("w_q", w_q), ("beta", beta)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    if weights is None:
        omega = [Fraction(1)] * K
    else:
        omega = [_frac(w, f"weights[{i}]") for i, w in enumerate(weights)]
        if len(omega) != K:
            raise ValueError(f"weights has length {len(omega)}, expected {K}")
        for i, w in enumerate(omega):
            if w <= 0:
                raise ValueError(f"weights[{i}] must be > 0, got {w}")
    if policy == "rpm":
        if rpm_limit is None:
            raise ValueError("policy 'rpm' requires rpm_limit")
        R = _int(rpm_limit, "rpm_limit")
        if R < 1:
            raise ValueError(f"rpm_limit must be >= 1, got {R}")
        window = _int(rpm_window, "rpm_window")
        if window < 1:
            raise ValueError(f"rpm_window must be >= 1, got {window}")
    else:
        R = window = None
    if steps is not None:
        T_fixed = _int(steps, "steps")
        if T_fixed < 0:
            raise ValueError(f"steps must be >= 0, got {T_fixed}")
    else:
        T_fixed = None
    reqs = _validate_requests(requests, K, M)
    N = len(reqs)

    # arrivals by step, each list in trace order
    arrivals_at: dict[int, list[int]] = {}
    for n, r in enumerate(reqs):
        arrivals_at.setdefault(r.arrival, []).append(n)

    # ---- state (MODEL.md, State) -------------------------------------------------
    fifo: list[list[int]] = [[] for _ in range(K)]   # request numbers, (arrival, number) order
    running: list[int] = []                          # request numbers
    generated: dict[int, int] = {}                   # per running request
    c = [Fraction(0)] * K                            # counters
    W = [Fraction(0)] * K                            # service totals
    last_left: int | None = None
    rpm_counts: dict[tuple[int, int], int] = {}      # (window j, client) -> admissions

    admit_step: list[int | None] = [None] * N
    finish_step: list[int | None] = [None] * N
    admitted = [0] * K
    completed = [0] * K
    n_completed = 0

    res = RefResult(steps=0, service=[], counters=[], backlogged=[],
                    backlogged_after_arrivals=[], occupancy=[], running_count=[],
                    admit_step=admit_step, finish_step=finish_step,
                    admitted=admitted, completed=completed,
                    decode_charge=[], prefill_charge=[], held=[])

    def charge(k: int, x: Fraction, bucket: list[Fraction]) -> None:
        W[k] += x
        c[k] += x / omega[k]
        bucket[k] += x

    def is_backlogged(k: int) -> bool:
        return len(fifo[k]) > 0

    caps = None if kv_cap is None else (list(kv_cap) if isinstance(kv_cap, (list, tuple)) else [kv_cap] * K)

    def under_cap(k: int) -> bool:
        if caps is None:
            return True
        reserved = sum(reqs[n].prompt + reqs[n].output for n in running if reqs[n].client == k)
        head = reqs[fifo[k][0]]
        return reserved + head.prompt + head.output <= caps[k]

    def candidate(t: int) -> int | None:
        """The request number the policy picks now, or None."""
        backlogged = [k for k in range(K) if is_backlogged(k) and under_cap(k)]
        if policy == "rpm":
            j = t // window
            backlogged = [k for k in backlogged if rpm_counts.get((j, k), 0) < R]
        if not backlogged:
            return None
        if policy in ("fcfs", "rpm"):
            # smallest FIFO head by (arrival, number)
            best = None
            for k in backlogged:
                h = fifo[k][0]
                key = (reqs[h].arrival, h)
                if best is None or key < best[0]:
                    best = (key, h)
            return best[1]
        # lcf / vtc: backlogged client with smallest c_k, ties smallest k
        best_k = None
        for k in backlogged:  # ascending k, strict < keeps the smallest k on ties
            if best_k is None or c[k] < c[best_k]:
                best_k = k
        return fifo[best_k][0]

    t = 0
    while True:
        if T_fixed is not None:
            if t >= T_fixed:
                break
        elif n_completed == N:
            break

        prefill_t = [Fraction(0)] * K
        decode_t = [Fraction(0)] * K

        # ---- phase 1: arrivals ---------------------------------------------------
        for n in arrivals_at.get(t, []):
            k = reqs[n].client
            if policy == "vtc" and not is_backlogged(k):
                bl = [i for i in range(K) if is_backlogged(i)]
                if bl:
                    c[k] = max(c[k], min(c[i] for i in bl))
                elif lift_last_left and last_left is not None:
                    c[k] = max(c[k], c[last_left])
            fifo[k].append(n)
        res.backlogged_after_arrivals.append([is_backlogged(k) for k in range(K)])

        # ---- phase 2: admission ----------------------------------------------------
        occupancy = sum(reqs[n].prompt + generated[n] for n in running)
        while True:
            n = candidate(t)
            if n is None:
                break
            r = reqs[n]
            if occupancy + r.prompt > M:
                break  # head-of-line: no skipping to another client
            k = r.client
            assert fifo[k][0] == n
            fifo[k].pop(0)
            running.append(n)
            generated[n] = 0
            occupancy += r.prompt
            last_left = k
            charge(k, w_p * (r.prompt if charge_cached else r.prompt - r.cached), prefill_t)
            admit_step[n] = t
            admitted[k] += 1
            if policy == "rpm":
                j = t // window
                rpm_counts[(j, k)] = rpm_counts.get((j, k), 0) + 1

        # ---- phase 3: decode -------------------------------------------------------
        for n in running:
            r = reqs[n]
            charge(r.client, w_q + beta * (r.prompt + generated[n]), decode_t)
            generated[n] += 1

        held_t = [0] * K
        for n in running:
            held_t[reqs[n].client] += reqs[n].prompt + generated[n]
        res.held.append(held_t)

        # ---- phase 4: completion ---------------------------------------------------
        still = []
        for n in running:
            if generated[n] == reqs[n].output:
                finish_step[n] = t
                completed[reqs[n].client] += 1
                n_completed += 1
                del generated[n]
            else:
                still.append(n)
        running = still

        # ---- record ----------------------------------------------------------------
        res.service.append(list(W))
        res.counters.append(list(c))
        res.backlogged.append([is_backlogged(k) for k in range(K)])
        res.occupancy.append(sum(reqs[n].prompt + generated[n] for n in running))
        res.running_count.append(len(running))
        res.decode_charge.append(decode_t)
        res.prefill_charge.append(prefill_t)
        t += 1

    res.steps = t
    return res


# ----------------------------------------------------------------------------------
# measures (MODEL.md, Horizon and measures)
# ----------------------------------------------------------------------------------

def throughput(res: RefResult) -> Fraction:
    """sum_k W_k(T-1) / T (0 for T = 0)."""
    if res.steps == 0:
        return Fraction(0)
    return sum(res.service[-1], Fraction(0)) / res.steps


def drift(res: RefResult) -> Fraction:
    """max over t of (max_k W_k(t) - min_k W_k(t)) (0 for T = 0)."""
    return max((max(w) - min(w) for w in res.service), default=Fraction(0))


# ----------------------------------------------------------------------------------
# random traces for tests
# ----------------------------------------------------------------------------------

class RandomTrace(NamedTuple):
    requests: list[Request]
    num_clients: int
    kv_budget: int


def random_trace(rng: random.Random, *, num_clients: int | None = None,
                 kv_budget: int | None = None, num_requests: int | None = None,
                 max_arrival: int = 40, max_output: int = 12,
                 cached_prob: float = 0.3) -> RandomTrace:
    """A small random, valid trace; unpack as ``reqs, K, M = random_trace(rng)``.

    Args:
      rng: the source of randomness (``random.Random(seed)``), the only one used.
      num_clients: K; default drawn uniformly from 1..5.
      kv_budget: M; default drawn uniformly from 4..64.
      num_requests: number of rows; default drawn uniformly from 0..30.
      max_arrival: arrivals are drawn uniformly from [0, max_arrival).
      max_output: outputs are drawn uniformly from [1, max_output].
      cached_prob: probability that a request with prompt >= 2 gets a cached prefix,
        drawn uniformly from [1, prompt - 1].

    Prompts are drawn from [1, M] (half the time from [1, max(1, M // 4)] so that many
    requests run together). Clients are drawn with skewed probabilities so that some are
    heavy and some rare. The rows are shuffled, so they are deliberately not sorted by
    arrival; some arrivals coincide (same step, several clients).
    """
    K = num_clients if num_clients is not None else rng.randint(1, 5)
    M = kv_budget if kv_budget is not None else rng.randint(4, 64)
    n = num_requests if num_requests is not None else rng.randint(0, 30)
    client_w = [rng.choice((1, 1, 2, 5)) for _ in range(K)]
    reqs = []
    for _ in range(n):
        arrival = rng.randrange(max_arrival)
        client = rng.choices(range(K), weights=client_w)[0]
        if rng.random() < 0.5:
            prompt = rng.randint(1, max(1, M // 4))
        else:
            prompt = rng.randint(1, M)
        output = rng.randint(1, max_output)
        cached = 0
        if prompt >= 2 and rng.random() < cached_prob:
            cached = rng.randint(1, prompt - 1)
        reqs.append(Request(arrival, client, prompt, output, cached))
    rng.shuffle(reqs)
    return RandomTrace(reqs, K, M)


# ----------------------------------------------------------------------------------
# self-check
# ----------------------------------------------------------------------------------

if __name__ == "__main__":
    # Client 0 floods from step 0; client 1 arrives at step 3 after silence.
    trace = [Request(0, 0, 4, 3) for _ in range(6)] + [Request(3, 1, 4, 3, cached=1),
                                                      Request(3, 1, 4, 3)]
    for pol in ("fcfs", "lcf", "vtc"):
        r = simulate(trace, num_clients=2, kv_budget=8, policy=pol)
        print(f"{pol}: T={r.steps} admit={r.admit_step} finish={r.finish_step}")
        print(f"   W(T-1)={[str(x) for x in r.service[-1]]} "
              f"c(T-1)={[str(x) for x in r.counters[-1]]} drift={drift(r)} "
              f"throughput={throughput(r)}")
    r = simulate(trace, num_clients=2, kv_budget=8, policy="rpm", rpm_limit=2, rpm_window=4)
    print(f"rpm(2,4): T={r.steps} admit={r.admit_step}")
    r = simulate(trace, num_clients=2, kv_budget=8, policy="vtc", weights=[1, "1/2"], beta="1/4")
    print(f"weighted vtc, beta=1/4: admit={r.admit_step} "
          f"W={[str(x) for x in r.service[-1]]} c={[str(x) for x in r.counters[-1]]}")
