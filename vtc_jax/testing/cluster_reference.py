"""Slow, literal, exact reference of the cluster model (docs/CLUSTER.md), in pure Python
with Fractions, written from the rules, not from the JAX engine (vtc_jax/engines/cluster.py).

Every router and every replica drives the registry's own literal policy references
(`Policy.reference`, the classes vtc_jax/testing/reference.py drives), each given a small "sim"
object that shows it the queues it may see:

* a router's sim shows its own gateway queues (per-router mode) or the cluster-wide
  backlog (shared and delayed modes: a tenant this router does not hold shows its queue at
  the lowest router that holds it); its counter `c` is the router counter (charged the
  estimated cost / weight at dispatch); in the shared mode every router uses one policy
  object, one counter list and one `last_left`;
* per-request values a policy keeps (DRR costs, WFQ/SFQ tags) are one table for all
  routers, as in the engine: a router's cluster-wide view reads the value the holding
  router gave a head;
* a replica's sim shows its local FIFOs; its requests are numbered by dispatch sequence
  and "arrive" at their dispatch step, so FCFS at a replica is dispatch order;
* a replica drives a literal server object (`IdealServer` here, or slora_reference's
  `SloraServer`) and its own admission limits (slora_reference's `Limits`: KV caps, rpm in
  delay mode, bands); an rpm limit in reject mode refuses requests before the cluster.

Time is event-driven over the cluster's event times (docs/CLUSTER.md, "Replica clocks"):
every replica has its own step boundary; on `ideal` every step lasts one unit and the
replicas step in lockstep, so the run is the untimed cluster's, step by step.

Only the ingress draw, the p2c draw and the affinity home are hashes (the same integer
hash as the JAX engine, written out here with Python ints).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from vtc_jax.engines.cluster_settings import AFFINITY_SALT, INGRESS_BITS, INGRESS_SALT, P2C_SALT, ClusterSettings
from vtc_jax.policies import registry
from vtc_jax.policies.estimators import reference_estimate
from vtc_jax.servers import slora
from vtc_jax.testing.reference import Request as Req  # one request record for both references
from vtc_jax.testing.slora_reference import Limits, SloraServer, StepDone, accepted_positions, rpm_rejected

M32 = 0xFFFFFFFF


def mix32(x: int) -> int:
    """lowbias32 (estimators.mix32) on Python ints."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


@dataclass
class ClusterRef:
    """What the reference reports (per replica r, router j, tenant k).

    service[r][k], counters[r][k]: W_k and c_k of replica r (Fractions); admitted,
    completed: [r][k]; dispatched[j][r][k]; router_counter[p][k] (p = router, or 0 only in
    the shared mode); policies[p]: each router's policy reference object; per request n
    (trace order): router[n], dispatch_step[n], dispatch_replica[n], dispatch_seq[n],
    admit_step[n] (None: not yet), first_token[n], finish[n] (timed servers: the end of its
    prefill step, of its last step, at or before the horizon; None: not reached, or the
    server keeps no times); rejected[k] (rpm reject mode); backlogged[k],
    backlogged_weighted[k] (service / weight) over the events where every tenant was
    backlogged; drift; backlogged_steps (such events); waits (admission - arrival of every
    admitted request)."""

    steps: int
    service: list
    counters: list
    admitted: list
    completed: list
    dispatched: list
    router_counter: list
    policies: list
    router: list
    dispatch_step: list
    dispatch_replica: list
    dispatch_seq: list
    admit_step: list
    backlogged: list
    backlogged_weighted: list
    drift: Fraction
    backlogged_steps: int
    waits: list = field(default_factory=list)
    first_token: list = field(default_factory=list)
    finish: list = field(default_factory=list)
    rejected: list = field(default_factory=list)


class RouterSim:
    """What a router's policy reference sees (see the module docstring)."""

    def __init__(self, cl: "_Cluster", j: int, p: int, union: bool):
        self.cl, self.j, self.p, self.union = cl, j, p, union
        self.settings = cl.gateway
        self.K, self.reqs, self.omega = cl.K, cl.reqs, cl.omega
        self.w_p, self.w_q, self.beta = cl.w_p, cl.w_q, cl.beta
        self.cost_unit, self.prefill_units, self.decode_units = cl.cost_unit, cl.prefill_units, cl.decode_units
        self.running, self.generated = [], {}
        self.W = [Fraction(0)] * cl.K

    @property
    def t(self):
        return self.cl.t

    @property
    def c(self):
        return self.cl.rc[self.p]

    @property
    def last_left(self):
        return self.cl.rlast[self.p]

    @property
    def fifo(self):
        own = self.cl.rfifo[self.j]
        if not self.union:
            return own
        out = []
        for k in range(self.K):
            if own[k]:
                out.append(own[k])
            else:
                out.append(next((self.cl.rfifo[i][k] for i in range(self.cl.G) if self.cl.rfifo[i][k]), []))
        return out

    def estimate(self, n):
        return self.cl.est[n]

    def prefill_charge(self, n):
        r = self.reqs[n]
        return self.w_p * (r.prompt if self.cl.engine.charge_cached else r.prompt - r.cached)


class IdealServer:
    """The ideal server (servers/ideal.py) literally, in SloraServer's interface: a request
    fits while the running requests' context plus its prompt is at most M (ideal_reserve:
    their prompt + output plus its own); every step lasts 1 and decodes one token of every
    running request; completions leave last admitted first; it never sleeps."""

    sleeps = False

    def __init__(self, kv_budget: int, reserve: bool):
        self.M, self.reserve, self.gen = kv_budget, reserve, {}

    def fits(self, reqs, running, n) -> bool:
        if self.reserve:
            return sum(reqs[m].prompt + reqs[m].output for m in running + [n]) <= self.M
        return self.held(reqs, running) + reqs[n].prompt <= self.M

    def admit(self, n) -> None:
        self.gen[n] = 0

    def held(self, reqs, running) -> int:
        return sum(reqs[m].prompt + self.gen[m] for m in running)

    def step(self, reqs, running, waiting: bool, value) -> StepDone | None:
        if not running and not waiting:
            return None
        tokens = [(m, reqs[m].prompt + self.gen[m]) for m in running]
        for m in running:
            self.gen[m] += 1
        return StepDone(1, tokens, [], [m for m in running if self.gen[m] == reqs[m].output])

    def leave_order(self, done) -> list:
        return list(reversed(done))

    def leave(self, n) -> None:
        del self.gen[n]


class ReplicaSim:
    """One replica: a server whose requests are numbered by dispatch sequence, its engine
    policy, its limits, its clock: b (step boundary), asleep (the time it fell asleep, or
    None), woken (a dispatch set b to its wake), leaving (its last step's finished)."""

    def __init__(self, cl: "_Cluster", r: int):
        self.cl, self.r = cl, r
        self.settings = cl.engine
        self.K, self.omega = cl.K, cl.omega
        self.w_p, self.w_q, self.beta = cl.w_p, cl.w_q, cl.beta
        self.cost_unit, self.prefill_units, self.decode_units = cl.cost_unit, cl.prefill_units, cl.decode_units
        self.reqs: dict[int, Req] = {}
        self.orig: dict[int, int] = {}
        self.fifo = [[] for _ in range(cl.K)]
        self.running: list[int] = []
        self.c = [Fraction(0)] * cl.K
        self.W = [Fraction(0)] * cl.K
        self.last_left = None
        self.value: dict[int, object] = {}
        self.server = cl.new_server()
        self.limits = Limits(cl.engine, cl.K)
        self.b, self.asleep, self.woken, self.leaving, self.detail = 0, None, False, [], None
        self.pol = registry.get(cl.engine.policy).reference(cl.engine, self)

    @property
    def t(self):
        return self.cl.t

    @property
    def generated(self):
        return self.server.gen

    def estimate(self, m):
        return self.cl.est[self.orig[m]]

    def prefill_charge(self, m):
        r = self.reqs[m]
        return self.w_p * (r.prompt if self.settings.charge_cached else r.prompt - r.cached)

    def occupancy(self):
        return self.server.held(self.reqs, self.running)

    def waiting_prompts(self):
        return sum(self.reqs[m].prompt for f in self.fifo for m in f)

    def queued(self):
        return sum(len(f) for f in self.fifo)

    def charge(self, k, x, step_service) -> None:
        self.W[k] += x
        self.c[k] += x / self.omega[k]
        step_service[k] += x

    def receive(self, t: int) -> None:
        """A dispatch at t: a replica asleep since s acts again at wake(s, t)."""
        if self.asleep is not None and not self.woken:
            self.b, self.woken = self.server.wake(self.asleep, t), True

    def complete(self, res) -> None:
        """Phase 1: the last step's finished requests leave, in the server's order."""
        for m in self.server.leave_order(self.leaving):
            self.running.remove(m)
            self.server.leave(m)
            res.completed[self.r][self.reqs[m].client] += 1
            _call(self.pol, "on_complete", m, self.value.pop(m))
        self.leaving = []

    def act(self, res, step_service) -> StepDone | None:
        """Phase 4 at a boundary: admissions, then the server's step (None: it idles or
        falls asleep)."""
        t, cl = self.cl.t, self.cl
        self.asleep, self.woken = None, False
        while True:
            eligible = self.limits.eligible(self, t)
            k = self.pol.select(eligible) if eligible else None
            if k is None or not self.server.fits(self.reqs, self.running, self.fifo[k][0]):
                break
            m = self.fifo[k].pop(0)
            self.running.append(m)
            self.server.admit(m)
            self.last_left = k
            self.charge(k, self.prefill_charge(m), step_service)
            res.admitted[self.r][k] += 1
            self.limits.admitted(k, t)
            n = self.orig[m]
            res.admit_step[n] = t
            res.waits.append(t - cl.reqs[n].arrival)
            self.value[m] = _call(self.pol, "on_admit", m, default=self.estimate(m))
        step = self.server.step(self.reqs, self.running, any(self.fifo), self.value)
        if step is None:
            self.asleep = t if self.server.sleeps else None
            return None
        for m, context in step.tokens:
            self.charge(self.reqs[m].client, self.w_q + (0 if context is None else self.beta * context), step_service)
        end = t + step.elapsed
        if end <= res.steps:  # reached by the horizon
            for m in step.first:
                res.first_token[self.orig[m]] = end
            for m in step.done:
                res.finish[self.orig[m]] = end
        self.leaving, self.b, self.detail = step.done, end, step.detail
        return step


def _call(obj, name, *args, default=None):
    fn = getattr(obj, name, None)
    return default if fn is None else fn(*args)


class _Cluster:
    def __init__(self, requests, num_clients: int, cs: ClusterSettings, steps: int, server: str):
        self.cs = cs
        self.engine, self.gateway = cs.engine, cs.gateway
        self.K, self.G, self.R = num_clients, cs.routers, cs.replicas
        self.reqs = [Req(*r) if not isinstance(r, Req) else r for r in requests]
        self.server = server
        self.omega = list(cs.engine.client_weights(num_clients))
        self.w_p, self.w_q, self.beta = cs.engine.w_p, cs.engine.w_q, cs.engine.beta
        q = math.lcm(*(x.denominator for x in (self.w_p, self.w_q, self.beta)))
        self.cost_unit = Fraction(1, q)
        self.prefill_units, self.decode_units = int(self.w_p * q), int(self.w_q * q)
        self.t = 0
        # rejections (rpm reject mode, before the cluster), positions, estimates, routers
        self.rejected = rpm_rejected(self.reqs, cs.engine, self.K, horizon=steps)
        order = sorted(range(len(self.reqs)), key=lambda n: (self.reqs[n].arrival, n))
        seen = [0] * self.K
        self.position = {}
        for n in order:
            k = self.reqs[n].client
            self.position[n] = seen[k]
            seen[k] += 1
        if self.rejected:
            self.position.update(accepted_positions(self.reqs, self.K, self.rejected))
        e = cs.engine
        self.est = {n: reference_estimate(e.estimator, r.output, r.client, self.position[n], guess=e.estimate_guess,
                                          error=e.estimate_error, seed=e.estimate_seed, average=0)
                    for n, r in enumerate(self.reqs)}
        thr = cs.thresholds(self.K)
        self.router = []
        for n, r in enumerate(self.reqs):
            u = mix32((mix32(mix32(cs.seed ^ INGRESS_SALT) ^ r.client) + self.position[n]) & M32) >> 8
            assert u < 1 << INGRESS_BITS
            self.router.append(None if n in self.rejected else sum(1 for x in thr[r.client] if x <= u))
        # routers
        self.mode = cs.counters
        self.rfifo = [[[] for _ in range(self.K)] for _ in range(self.G)]
        copies = 1 if self.mode == "shared" else self.G
        self.rc = [[Fraction(0)] * self.K for _ in range(copies)]
        self.rlast = [None] * copies
        union = self.mode != "per_router" and self.G > 1
        cls = registry.get(cs.gateway_policy).reference
        if self.mode == "shared":
            self.shared_sim = RouterSim(self, 0, 0, union)
            self.rpols = [cls(self.gateway, self.shared_sim)]
        else:
            self.rsims = [RouterSim(self, j, j, union) for j in range(self.G)]
            self.rpols = [cls(self.gateway, self.rsims[j]) for j in range(self.G)]
            # Per-request values (DRR costs, WFQ/SFQ tags: dicts keyed by request number)
            # are one table for all routers: each request is set by the router it reaches,
            # and a router's cluster-wide view reads the value of a head another router holds.
            for name, value in vars(self.rpols[0]).items():
                if isinstance(value, dict):
                    for pol in self.rpols[1:]:
                        setattr(pol, name, value)
        self.union = union
        self.rr = [0] * self.G
        self.cursor = 0
        self.dseq = 0
        self.pending = []  # (due step, source router, tenant, counter charge, drr cost)
        # replicas
        self.reps = [ReplicaSim(self, r) for r in range(self.R)]

    def new_server(self):
        """A replica's literal server (its requests are numbered in dispatch order)."""
        if self.server == "slora":
            return SloraServer(dict(self.engine.server_options), self.K, rank=lambda m: m)
        if self.server in ("ideal", "ideal_reserve"):
            return IdealServer(self.engine.kv_budget, reserve=self.server == "ideal_reserve")
        raise ValueError(f"the cluster reference has no literal server {self.server!r}")

    # ---- routers ----
    def router_policy(self, j):
        """(policy, sim) of router j (the shared object pointed at router j)."""
        if self.mode == "shared":
            self.shared_sim.j = j
            return self.rpols[0], self.shared_sim
        return self.rpols[j], self.rsims[j]

    def p(self, j):
        return 0 if self.mode == "shared" else j

    def est_cost(self, n) -> Fraction:
        r = self.reqs[n]
        e = self.est[n]
        prefill = self.w_p * (r.prompt if self.engine.charge_cached else r.prompt - r.cached)
        return max(prefill + self.w_q * e + self.beta * (e * r.prompt + e * (e - 1) // 2), self.cost_unit)

    def apply_pending(self, now: int):
        """Delayed charges due by `now` reach the other routers."""
        keep = []
        for due, src, k, charge, cost in self.pending:
            if due > now:
                keep.append((due, src, k, charge, cost))
                continue
            for j in range(self.G):
                if j == src:
                    continue
                self.rc[j][k] += charge
                pol = self.rpols[j]
                name = self.cs.gateway_policy
                if name == "vtc_gateway":
                    pol.v[k] += charge
                elif name in ("wfq", "sfq"):
                    pol.f_tail[k] += charge
                elif name == "drr":
                    pol.deficit[k] -= cost
        self.pending = keep

    def has_room(self, r) -> bool:
        rep = self.reps[r]
        if self.cs.saturation == "kv":
            return rep.occupancy() + rep.waiting_prompts() < self.cs.kv_limit
        return rep.queued() < self.cs.queue_limit

    def load(self, r) -> int:
        return self.reps[r].occupancy() + self.reps[r].waiting_prompts()

    def choose_replica(self, j, k) -> int:
        R, room = self.R, [self.has_room(r) for r in range(self.R)]
        choice = self.cs.choice
        if choice == "round_robin":
            r = next((self.rr[j] + i) % R for i in range(R) if room[(self.rr[j] + i) % R])
            self.rr[j] = (r + 1) % R
            return r
        if choice == "least_kv":
            return min((self.load(r), r) for r in range(R) if room[r])[1]
        if choice == "least_queued":
            return min((self.reps[r].queued(), r) for r in range(R) if room[r])[1]
        if choice == "p2c":
            cands = [r for r in range(R) if room[r]]
            n = len(cands)
            h1 = mix32((mix32(self.cs.seed ^ P2C_SALT) + self.dseq) & M32)
            h2 = mix32(h1)
            a = h1 % n
            b = (a + 1 + h2 % (n - 1)) % n if n >= 2 else a
            return min((self.load(r), r) for r in (cands[a], cands[b]))[1]
        home = mix32(mix32(self.cs.seed ^ AFFINITY_SALT) ^ k) % R
        return next((home + i) % R for i in range(R) if room[(home + i) % R])

    def dispatch_phase(self, rec):
        G, K = self.G, self.K
        hold = self.cs.holdback and self.union
        while any(self.has_room(r) for r in range(self.R)):
            any_back = [k for k in range(K) if any(self.rfifo[j][k] for j in range(G))]
            primary, fallback = {}, {}
            for j in range(G):
                local = [k for k in range(K) if self.rfifo[j][k]]
                if not local:
                    continue
                pol, _ = self.router_policy(j)
                fallback[j] = pol.select(local)
                if hold:
                    u = pol.select(any_back)
                    if u is not None and self.rfifo[j][u]:
                        primary[j] = u
                else:
                    primary[j] = fallback[j]
            offers, union_pick = (primary, hold) if primary else (fallback, False)
            if not offers:
                break
            j = next((self.cursor + i) % G for i in range(G) if (self.cursor + i) % G in offers)
            k = offers[j]
            pol, _ = self.router_policy(j)
            eligible = any_back if union_pick else [i for i in range(K) if self.rfifo[j][i]]
            assert pol.select(eligible) == k  # the committed scan is this router's
            n = self.rfifo[j][k].pop(0)
            p = self.p(j)
            charge = self.est_cost(n) / self.omega[k]
            self.rc[p][k] += charge
            self.rlast[p] = k
            _call(pol, "on_admit", n)
            if self.mode == "delayed" and G > 1:
                cost = pol.cost[n] if self.cs.gateway_policy == "drr" else None
                self.pending.append((self.t + self.cs.delay, j, k, charge, cost))
            r = self.choose_replica(j, k)
            rep = self.reps[r]
            rep.receive(self.t)
            m = self.dseq
            self.dseq += 1
            rq = self.reqs[n]
            rep.reqs[m] = Req(self.t, k, rq.prompt, rq.output, rq.cached)
            rep.orig[m] = n
            _call(rep.pol, "on_arrival", m)
            rep.fifo[k].append(m)
            rec.dispatch_step[n], rec.dispatch_replica[n], rec.dispatch_seq[n] = self.t, r, m
            rec.dispatched[j][r][k] += 1
            self.cursor = (j + 1) % G  # the round-robin pointer persists across steps


def _check(cl: _Cluster) -> None:
    """A request the server can never serve is refused (as the engine's driver refuses it)."""
    e = cl.engine
    if cl.server == "slora":
        why = slora.never_served(dict(e.server_options), [r.prompt for r in cl.reqs], [r.output for r in cl.reqs],
                                 e.kv_budget)
        if why:
            raise ValueError(why)
        return
    for r in cl.reqs:
        if r.prompt + (r.output if cl.server == "ideal_reserve" else 0) > e.kv_budget:
            raise ValueError("a prompt larger than M can never be admitted")


def _next_time(cl: _Cluster, t: int, horizon: int, arrival_times: list) -> int:
    """Phase 5: the earliest boundary ahead, router arrival or the horizon, at least t + 1
    (t + 1 when no boundary is ahead but requests wait at a router)."""
    ahead = [rep.b for rep in cl.reps if rep.b > t]
    if not ahead and any(f for fifos in cl.rfifo for f in fifos):
        return t + 1
    later = next((a for a in arrival_times if a > t), horizon)
    return max(t + 1, min(ahead + [later, horizon]))


def _step_ends(cl: _Cluster, stepped: dict, t: int, nxt: int) -> None:
    """Step-end hooks: a replica that stepped sees its step's duration, an idle or sleeping
    one and every router the time to the next event; a replica inside a step sees none."""
    for r, rep in enumerate(cl.reps):
        if r in stepped:
            elapsed = stepped[r].elapsed
        elif rep.asleep is not None or rep.b <= t:
            elapsed = nxt - t
            if cl.server == "slora":  # the server's facts of a step that does nothing
                rep.detail = {"charge": [np.float32(0)] * cl.K, "settle": [np.float32(0)] * cl.K}
        else:
            continue
        _call(rep.pol, "on_step_end", elapsed)
    for j in range(1 if cl.mode == "shared" else cl.G):
        pol, _ = cl.router_policy(j)
        _call(pol, "on_step_end", nxt - t)


def simulate(requests, num_clients: int, cs: ClusterSettings, steps: int, *, server: str | None = None) -> ClusterRef:
    """Run the cluster to the horizon `steps` (steps on `ideal`, microseconds on `slora`)
    and report the state then (see ClusterRef). `server`: the replicas' server (default:
    `cs.server` if the settings name one, else ideal)."""
    server = server or getattr(cs, "server", None) or "ideal"
    cl = _Cluster(requests, num_clients, cs, steps, server)
    K, G, R = cl.K, cl.G, cl.R
    N = len(cl.reqs)
    _check(cl)
    res = ClusterRef(steps=steps, service=None, counters=None, admitted=[[0] * K for _ in range(R)],
                     completed=[[0] * K for _ in range(R)], dispatched=[[[0] * K for _ in range(R)] for _ in range(G)],
                     router_counter=None, policies=None, router=list(cl.router), dispatch_step=[None] * N,
                     dispatch_replica=[None] * N, dispatch_seq=[None] * N, admit_step=[None] * N,
                     backlogged=[Fraction(0)] * K, backlogged_weighted=[Fraction(0)] * K, drift=Fraction(0),
                     backlogged_steps=0, first_token=[None] * N, finish=[None] * N, rejected=[0] * K)
    arrivals_at: dict[int, list[int]] = {}
    for n, r in enumerate(cl.reqs):
        arrivals_at.setdefault(r.arrival, []).append(n)
    arrival_times = sorted({r.arrival for n, r in enumerate(cl.reqs) if n not in cl.rejected})  # router arrivals
    for n in cl.rejected:  # decided at arrival (before the horizon), counted for the run
        res.rejected[cl.reqs[n].client] += 1
    t = 0
    while True:
        cl.apply_pending(min(t, steps - 1))  # 0. delayed charges due (a charge due at the horizon is not)
        cl.t = t - 1  # 1. completions of the steps that ended by t; their hooks see the step's last unit
        for rep in cl.reps:
            if rep.b <= t:
                rep.complete(res)
        cl.t = t
        if t >= steps:
            break
        # 2. router arrivals: routers in index order, each in trace order (rejected ones never reach one)
        for j in range(G):
            for n in arrivals_at.get(t, []):
                if cl.router[n] != j:
                    continue
                pol, _ = cl.router_policy(j)
                _call(pol, "on_arrival", n)
                cl.rfifo[j][cl.reqs[n].client].append(n)
        # 3. dispatch rounds
        cl.dispatch_phase(res)
        # 4. every replica at a boundary and awake: admissions, then its step
        step_service = [Fraction(0)] * K
        stepped = {}
        for r, rep in enumerate(cl.reps):
            if rep.b <= t and (rep.asleep is None or rep.woken):
                step = rep.act(res, step_service)
                if step is not None:
                    stepped[r] = step
        # measures: every tenant has a request waiting somewhere (after the admissions)
        waiting = [sum(len(cl.rfifo[j][k]) for j in range(G)) + sum(len(rp.fifo[k]) for rp in cl.reps)
                   for k in range(K)]
        if all(w > 0 for w in waiting) and t >= cs.measure_from:
            res.backlogged_steps += 1
            for k in range(K):
                res.backlogged[k] += step_service[k]
                res.backlogged_weighted[k] += step_service[k] / cl.omega[k]
            res.drift = max(res.drift, max(res.backlogged_weighted) - min(res.backlogged_weighted))
        # 5. the next event; step-end hooks
        nxt = _next_time(cl, t, steps, arrival_times)
        _step_ends(cl, stepped, t, nxt)
        t = nxt
    res.service = [list(rep.W) for rep in cl.reps]
    res.counters = [list(rep.c) for rep in cl.reps]
    res.router_counter = [list(c) for c in cl.rc]
    res.policies = cl.rpols
    return res
