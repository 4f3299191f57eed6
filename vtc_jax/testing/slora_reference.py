"""The `slora` server (vtc_jax/servers/slora.py) literally, as a small class both literal
references drive: the one-server engine on slora (`literal_slora`, what tests/test_slora.py
checks every policy against) and the cluster of slora replicas (cluster_reference.py).
Beside it, the admission limits that compose with any policy and any server (per-client KV
caps, the rpm limit in both modes, priority bands), written once for both, with the rules
of vtc_jax/testing/reference.py.

Written from the server's docstring and the artifact's router loop, not from the JAX code:
a step's duration is a sum of float32 terms each rounded to a microsecond; an admission
round is one prefill step of the new requests only; `cadence` decode steps pass after a
prefill before the next admission; LightLLM's worst-case KV check; the idle poll; the
extra finish charge; completions in request order; running requests in slots handed out
by a free-list stack (the artifact's charge sums run in slot order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vtc_jax.engines.settings import Settings
from vtc_jax.policies import registry
from vtc_jax.servers import slora
from vtc_jax.testing import reference as ref


# ---------------------------------------------------------------- limits (any server)

def rpm_rejected(reqs, settings: Settings, num_clients: int, horizon=None) -> set:
    """The requests the rpm limit in reject mode refuses at arrival: those whose client had
    R requests accepted within [arrival - W, arrival] (arrival order, trace order within a
    time; arrivals at or past `horizon` never arrive). Empty without a reject limit."""
    if not settings.rpm_rejects:
        return set()
    out, accepted = set(), [[] for _ in range(num_clients)]
    for n in sorted(range(len(reqs)), key=lambda n: (reqs[n].arrival, n)):
        r = reqs[n]
        if horizon is not None and r.arrival >= horizon:
            continue
        if sum(1 for a in accepted[r.client] if a >= r.arrival - settings.rpm_window) >= settings.rpm_limit:
            out.add(n)
        else:
            accepted[r.client].append(r.arrival)
    return out


def accepted_positions(reqs, num_clients: int, rejected: set) -> dict:
    """Each accepted request's position among its client's accepted ones, (arrival, number)
    order: what the estimators (and the cluster's ingress draw) number."""
    seen, out = [0] * num_clients, {}
    for n in sorted(range(len(reqs)), key=lambda n: (reqs[n].arrival, n)):
        if n not in rejected:
            k = reqs[n].client
            out[n], seen[k] = seen[k], seen[k] + 1
    return out


class Limits:
    """One server's admission limits (reference.py's rules): a client is eligible while its
    FIFO has a head whose prompt + output, with the prompt + output of its running
    requests, stays within its KV cap; under an rpm limit in delay mode, while it had
    fewer than R admissions in the window t // W; with bands, only the best band's."""

    def __init__(self, settings: Settings, num_clients: int):
        self.s, self.K = settings, num_clients
        self.caps, self.bands = list(settings.client_caps(num_clients)), list(settings.client_bands(num_clients))
        self.counts: dict[tuple[int, int], int] = {}

    def eligible(self, sim, t: int) -> list[int]:
        """`sim`: fifo, running, reqs (request numbers into reqs)."""
        reqs, s = sim.reqs, self.s

        def under_cap(k):
            held = sum(reqs[n].prompt + reqs[n].output for n in sim.running if reqs[n].client == k)
            head = reqs[sim.fifo[k][0]]
            return held + head.prompt + head.output <= self.caps[k]

        ok = [k for k in range(self.K) if sim.fifo[k] and under_cap(k)]
        if s.rpm_delays:
            ok = [k for k in ok if self.counts.get((t // s.rpm_window, k), 0) < s.rpm_limit]
        if ok and s.bands is not None:
            ok = [k for k in ok if self.bands[k] == min(self.bands[j] for j in ok)]
        return ok

    def admitted(self, k: int, t: int) -> None:
        if self.s.rpm_delays:
            key = (t // self.s.rpm_window, k)
            self.counts[key] = self.counts.get(key, 0) + 1


# ---------------------------------------------------------------- the slora server

@dataclass
class StepDone:
    """A server step: `elapsed` (its duration), `tokens` [(request, context)]: each a charge
    of w_q + beta x context (context None: w_q alone, the extra finish charge); `first`:
    requests whose first token it gives; `done`: requests it finishes; `detail`: the
    server's facts for the policies (slora: artifact_charges; None elsewhere); `sampled`:
    requests it gives a token, each one (slora: the round at a prefill, every decoder at a
    decode; an extra finish charge is no token)."""

    elapsed: int
    tokens: list
    first: list
    done: list
    detail: dict | None = None
    sampled: list = field(default_factory=list)


class SloraServer:
    """slora's rules for one server. `running` (request numbers, admission order, the open
    round included) is the caller's list; requests are numbers into `reqs`; `rank(n)` is a
    request's place in request order (completions leave in it)."""

    sleeps = True  # with nothing running or waiting it waits for the next arrival (wake)

    def __init__(self, options: dict, num_clients: int, rank):
        self.o = slora.settings(dict(options))
        self.tc = slora.coefficients_us(self.o)
        self.K, self.rank = num_clients, rank
        self.round, self.gen, self.wait = [], {}, 0
        self.slot, self.free, self.fresh = {}, [], 0  # slots as the server's free-list stack hands them out

    def fits(self, reqs, running, n) -> bool:
        o, rnd = self.o, self.round
        items = [(reqs[m].prompt + self.gen[m], reqs[m].output - self.gen[m] - 1) for m in running if m not in rnd]
        items += [(reqs[m].prompt + 1, reqs[m].output - 1) for m in rnd + [n]]
        items.sort(key=lambda x: -x[1])
        need = max(j * left + sum(h for h, _ in items[:j]) for j, (_, left) in enumerate(items, 1))
        clients = len({reqs[m].client for m in running + [n]})
        allowed = len(running) == len(rnd) or self.wait >= o["cadence"]
        return (allowed and need < o["kv_pool"] - o["adapter_reserve"] * clients and len(running) + 1 <= o["running_cap"]
                and sum(reqs[m].prompt for m in rnd) + reqs[n].prompt <= o["prefill_cap"])

    def admit(self, n) -> None:
        if self.free:
            self.slot[n] = self.free.pop()
        else:
            self.slot[n], self.fresh = self.fresh, self.fresh + 1
        self.round.append(n)

    def held(self, reqs, running) -> int:
        """KV tokens the running requests hold (prompt + tokens given, the step under way's too)."""
        return sum(reqs[m].prompt + self.gen.get(m, 0) for m in running)

    def _terms(self, *xs) -> int:
        return max(1, sum(int(np.round(np.float32(x))) for x in xs))

    def step(self, reqs, running, waiting: bool, value) -> StepDone | None:
        """The round's prefill, else a decode step, else one poll (something waits that no
        round admitted); None: nothing runs or waits (the server sleeps)."""
        tc, gen = self.tc, self.gen
        if self.round:
            elapsed = self._terms(tc[0], tc[1] * np.float32(sum(reqs[n].prompt for n in self.round)))
            batch, decoders, first = self.round, [], list(self.round)
            for n in batch:
                gen[n] = 1
            self.wait = 0
        elif running:
            decoders = list(running)
            context = sum(reqs[n].prompt + gen[n] for n in decoders)
            elapsed = self._terms(tc[2], tc[3] * np.float32(len(decoders)), tc[4] * np.float32(context))
            batch, first = decoders, []
            self.wait += 1
        elif waiting:
            elapsed, batch, decoders, first = self.o["poll_us"], [], [], []
        else:
            return None
        detail = artifact_charges(reqs, self.K, batch, decoders, gen, value, self.slot, self.o["extra_finish_charge"])
        tokens = []
        for n in decoders:
            tokens.append((n, reqs[n].prompt + gen[n]))
            gen[n] += 1
        done = [n for n in batch if gen[n] >= reqs[n].output]
        if done and self.o["extra_finish_charge"]:
            tokens += [(n, None) for n in batch]
        self.round = []
        return StepDone(elapsed, tokens, first, done, detail, sampled=first + decoders)

    def leave_order(self, done) -> list:
        return sorted(done, key=self.rank)

    def leave(self, n) -> None:
        self.free.append(self.slot.pop(n))

    def wake(self, since: int, arrival: int) -> int:
        """When a server asleep since `since` acts on an arrival at `arrival` (> since): at
        the arrival (idle jump), else at the first whole poll counted from `since`."""
        if self.o["idle"] == "jump":
            return arrival
        return since + -(-(arrival - since) // self.o["poll_us"]) * self.o["poll_us"]


def artifact_charges(reqs, num_clients, batch, decoders, gen, value, slot, extra_on) -> dict:
    """slora's Work.detail of a step, literally: per client, in float32 summed in slot
    order, the decoders past their prediction (the value's float32 bits) and the extra
    finish charges past it less the unused predictions of the finishing requests."""
    f = np.float32
    pred = {n: value[n] if isinstance(value[n], np.floating) else np.asarray(int(value[n] or 0), np.int32).view(f)
            for n in batch}  # only vtc_artifact reads these (its values are float32 predictions)
    charge, settle = [f(0)] * num_clients, [f(0)] * num_clients
    after = {n: gen[n] + (n in decoders) for n in batch}
    finishing = any(after[n] >= reqs[n].output for n in batch)
    for n in sorted(batch, key=slot.get):
        k, out = reqs[n].client, f(reqs[n].output)
        if n in decoders and f(gen[n]) > pred[n]:
            charge[k] = f(charge[k] + f(1))
        late = f(1) if extra_on and finishing and f(after[n]) > pred[n] else f(0)
        refund = f(pred[n] - out) if after[n] >= reqs[n].output and out < pred[n] else f(0)
        settle[k] = f(settle[k] + f(late - refund))
    return {"charge": charge, "settle": settle}


# ---------------------------------------------------------------- one server

def literal_slora(requests, settings: Settings, num_clients: int):
    """`literal_slora_run` as a tuple: (W, c, admitted, completed, rejected per client;
    first, finish per request)."""
    r = literal_slora_run(requests, settings, num_clients)
    return r["W"], r["c"], r["admitted"], r["completed"], r["rejected"], r["first"], r["finish"]


def literal_slora_run(requests, settings: Settings, num_clients: int) -> dict:
    """The engine with the slora server, literally: events in MODEL.md's order (the last
    step's completions, in request order, their hooks at t - 1 as on ideal; arrivals; admissions while the policy's candidate
    passes slora's checks; the step: the round's prefill, else a decode step, else a poll,
    or an idle wait to the next whole poll), the policy's own literal reference driven by
    its hooks (vtc_jax.testing.reference's conventions), exact Fractions for W and c.
    Returns {"W", "c", "admitted", "completed", "rejected"}: per client; {"scheduled",
    "first", "finish"}: per request, the time of its admission, of its first token and of
    its last (-1: never); "tokens": per request, the time of each token it was given, in
    order (the end of the step that sampled it; [] never admitted)."""
    reqs = list(requests)
    K, s = num_clients, settings
    sim = ref._Sim(reqs, s, K)
    pol = registry.get(s.policy).reference(s, sim)
    call = lambda name, *a, default=None: getattr(pol, name)(*a) if hasattr(pol, name) else default  # noqa: E731
    n_req = len(reqs)
    order = sorted(range(n_req), key=lambda n: (reqs[n].arrival, n))
    rank = {n: i for i, n in enumerate(order)}
    server, limits = SloraServer(dict(s.server_options), K, rank.get), Limits(s, K)
    rejected_set, rejected = rpm_rejected(reqs, s, K), [0] * K
    if s.rpm_rejects:
        sim.position.update(accepted_positions(reqs, K, rejected_set))
    admitted, completed, value = [0] * K, [0] * K, {}
    scheduled, first, finish = [-1] * n_req, [-1] * n_req, [-1] * n_req
    tokens = [[] for _ in range(n_req)]
    leaving, nxt, t = [], 0, 0

    def charge(k, x):
        sim.W[k] += x
        sim.c[k] += x / sim.omega[k]

    for n in rejected_set:  # decided at arrival, counted for the run
        rejected[reqs[n].client] += 1
    while True:
        sim.t = t - 1  # completion hooks see the last unit of the step that finished them (las: view.step - 1)
        for n in server.leave_order(leaving):  # the last step's completions, in request order
            sim.running.remove(n)
            server.leave(n)
            completed[reqs[n].client] += 1
            call("on_complete", n, value.pop(n))
            sim.observe(n)
        leaving = []
        sim.t = t
        if sum(completed) == n_req - len(rejected_set):
            break
        while nxt < n_req and reqs[order[nxt]].arrival <= t:  # arrivals
            n = order[nxt]
            nxt += 1
            if n in rejected_set:
                continue
            call("on_arrival", n)
            sim.fifo[reqs[n].client].append(n)
        while True:  # admissions
            eligible = limits.eligible(sim, t)
            k = pol.select(eligible) if eligible else None
            if k is None or not server.fits(reqs, sim.running, sim.fifo[k][0]):
                break
            n = sim.fifo[k].pop(0)
            sim.running.append(n)
            server.admit(n)
            scheduled[n] = t
            sim.last_left = k
            charge(k, sim.prefill_charge(n))
            admitted[k] += 1
            limits.admitted(k, t)
            value[n] = call("on_admit", n, default=sim.estimate(n))
        step = server.step(reqs, sim.running, any(sim.fifo), value)
        if step is None:  # idle: to the next whole poll at or after the next arrival (or the arrival)
            step = StepDone(max(1, server.wake(t, reqs[order[nxt]].arrival) - t), [], [], [],
                            artifact_charges(reqs, K, [], [], {}, value, {}, False))
        sim.detail = step.detail
        for n, context in step.tokens:
            charge(reqs[n].client, sim.w_q + (0 if context is None else sim.beta * context))
        for n in step.first:
            first[n] = t + step.elapsed
        for n in step.done:
            finish[n] = t + step.elapsed
        for n in step.sampled:
            tokens[n].append(t + step.elapsed)
        sim.generated = {n: server.gen[n] for n in sim.running}
        call("on_step_end", step.elapsed)
        leaving, t = step.done, t + step.elapsed
    return {"W": sim.W, "c": sim.c, "admitted": admitted, "completed": completed, "rejected": rejected,
            "scheduled": scheduled, "first": first, "finish": finish, "tokens": tokens}
