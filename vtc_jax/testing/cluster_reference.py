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
  and "arrive" at their dispatch step, so FCFS at a replica is dispatch order.

Only the ingress draw, the p2c draw and the affinity home are hashes (the same integer
hash as the JAX engine, written out here with Python ints).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from vtc_jax.engines.cluster_settings import AFFINITY_SALT, INGRESS_BITS, INGRESS_SALT, P2C_SALT, ClusterSettings
from vtc_jax.testing.reference import Request as Req  # one request record for both references
from vtc_jax.policies import registry
from vtc_jax.policies.estimators import reference_estimate

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
    admit_step[n] (None: not yet); backlogged[k], backlogged_weighted[k] (service / weight)
    over steps where every tenant was backlogged; drift; backlogged_steps; waits (admission
    - arrival of every admitted request)."""

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


class ReplicaSim:
    """One replica: a MODEL.md server whose requests are numbered by dispatch sequence."""

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
        self.generated: dict[int, int] = {}
        self.c = [Fraction(0)] * cl.K
        self.W = [Fraction(0)] * cl.K
        self.last_left = None
        self.value: dict[int, object] = {}
        self.pol = registry.get(cl.engine.policy).reference(cl.engine, self)

    @property
    def t(self):
        return self.cl.t

    def estimate(self, m):
        return self.cl.est[self.orig[m]]

    def prefill_charge(self, m):
        r = self.reqs[m]
        return self.w_p * (r.prompt if self.settings.charge_cached else r.prompt - r.cached)

    def occupancy(self):
        return sum(self.reqs[m].prompt + self.generated[m] for m in self.running)

    def waiting_prompts(self):
        return sum(self.reqs[m].prompt for f in self.fifo for m in f)

    def queued(self):
        return sum(len(f) for f in self.fifo)


def _call(obj, name, *args, default=None):
    fn = getattr(obj, name, None)
    return default if fn is None else fn(*args)


class _Cluster:
    def __init__(self, requests, num_clients: int, cs: ClusterSettings):
        self.cs = cs
        self.engine, self.gateway = cs.engine, cs.gateway
        self.K, self.G, self.R = num_clients, cs.routers, cs.replicas
        self.reqs = [Req(*r) if not isinstance(r, Req) else r for r in requests]
        self.omega = list(cs.engine.client_weights(num_clients))
        self.w_p, self.w_q, self.beta = cs.engine.w_p, cs.engine.w_q, cs.engine.beta
        q = math.lcm(*(x.denominator for x in (self.w_p, self.w_q, self.beta)))
        self.cost_unit = Fraction(1, q)
        self.prefill_units, self.decode_units = int(self.w_p * q), int(self.w_q * q)
        self.t = 0
        # positions, estimates, routers
        order = sorted(range(len(self.reqs)), key=lambda n: (self.reqs[n].arrival, n))
        seen = [0] * self.K
        self.position = {}
        for n in order:
            k = self.reqs[n].client
            self.position[n] = seen[k]
            seen[k] += 1
        e = cs.engine
        self.est = {n: reference_estimate(e.estimator, r.output, r.client, self.position[n], guess=e.estimate_guess,
                                          error=e.estimate_error, seed=e.estimate_seed, average=0)
                    for n, r in enumerate(self.reqs)}
        thr = cs.thresholds(self.K)
        self.router = []
        for n, r in enumerate(self.reqs):
            u = mix32((mix32(mix32(cs.seed ^ INGRESS_SALT) ^ r.client) + self.position[n]) & M32) >> 8
            assert u < 1 << INGRESS_BITS
            self.router.append(sum(1 for x in thr[r.client] if x <= u))
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

    def apply_pending(self):
        keep = []
        for due, src, k, charge, cost in self.pending:
            if due > self.t:
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


def simulate(requests, num_clients: int, cs: ClusterSettings, steps: int) -> ClusterRef:
    """Run the cluster for `steps` steps (t = 0..steps-1) and report (see ClusterRef)."""
    cl = _Cluster(requests, num_clients, cs)
    K, G, R = cl.K, cl.G, cl.R
    N = len(cl.reqs)
    for r in cl.reqs:
        if r.prompt > cs.engine.kv_budget:
            raise ValueError("a prompt larger than M can never be admitted")
    res = ClusterRef(steps=steps, service=None, counters=None, admitted=[[0] * K for _ in range(R)],
                     completed=[[0] * K for _ in range(R)], dispatched=[[[0] * K for _ in range(R)] for _ in range(G)],
                     router_counter=None, policies=None, router=list(cl.router), dispatch_step=[None] * N,
                     dispatch_replica=[None] * N, dispatch_seq=[None] * N, admit_step=[None] * N,
                     backlogged=[Fraction(0)] * K, backlogged_weighted=[Fraction(0)] * K, drift=Fraction(0),
                     backlogged_steps=0)
    arrivals_at: dict[int, list[int]] = {}
    for n, r in enumerate(cl.reqs):
        arrivals_at.setdefault(r.arrival, []).append(n)
    arrival_steps = sorted(arrivals_at)
    skip_until = 0
    M = cs.engine.kv_budget
    for t in range(steps):
        cl.t = t
        # 0. delayed charges that are due
        cl.apply_pending()
        # 1. router arrivals: routers in index order, each in trace order
        for j in range(G):
            for n in arrivals_at.get(t, []):
                if cl.router[n] != j:
                    continue
                pol, _ = cl.router_policy(j)
                _call(pol, "on_arrival", n)
                cl.rfifo[j][cl.reqs[n].client].append(n)
        # 2. dispatch rounds
        cl.dispatch_phase(res)
        # 3. every replica: admission
        step_service = [Fraction(0)] * K
        for r, rep in enumerate(cl.reps):
            occupancy = rep.occupancy()
            while True:
                eligible = [k for k in range(K) if rep.fifo[k]]
                k = rep.pol.select(eligible) if eligible else None
                if k is None:
                    break
                m = rep.fifo[k][0]
                q = rep.reqs[m]
                if occupancy + q.prompt > M:
                    break
                rep.fifo[k].pop(0)
                rep.running.append(m)
                rep.generated[m] = 0
                occupancy += q.prompt
                rep.last_left = k
                x = rep.prefill_charge(m)
                rep.W[k] += x
                rep.c[k] += x / cl.omega[k]
                step_service[k] += x
                res.admitted[r][k] += 1
                n = rep.orig[m]
                res.admit_step[n] = t
                res.waits.append(t - cl.reqs[n].arrival)
                rep.value[m] = _call(rep.pol, "on_admit", m, default=rep.estimate(m))
        # measure flag: every tenant has a request waiting somewhere (after the admissions)
        waiting = [sum(len(cl.rfifo[j][k]) for j in range(G)) + sum(len(rp.fifo[k]) for rp in cl.reps)
                   for k in range(K)]
        flag = all(w > 0 for w in waiting) and t >= cs.measure_from
        # decode
        ran = any(rep.running for rep in cl.reps)
        for rep in cl.reps:
            for m in rep.running:
                q = rep.reqs[m]
                x = cl.w_q + cl.beta * (q.prompt + rep.generated[m])
                rep.W[q.client] += x
                rep.c[q.client] += x / cl.omega[q.client]
                step_service[q.client] += x
                rep.generated[m] += 1
        # step-end hooks (skipped inside an idle stretch the engine jumps over)
        if t >= skip_until:
            elapsed = 1
            if not ran and not any(waiting):
                later = [a for a in arrival_steps if a > t]
                target = min(later[0] if later else steps, steps)
                elapsed = max(1, target - t)
            skip_until = t + elapsed
            for rep in cl.reps:
                _call(rep.pol, "on_step_end", elapsed)
            if cl.mode == "shared":
                pol, _ = cl.router_policy(0)
                _call(pol, "on_step_end", elapsed)
            else:
                for j in range(G):
                    pol, _ = cl.router_policy(j)
                    _call(pol, "on_step_end", elapsed)
        if flag:
            res.backlogged_steps += 1
            for k in range(K):
                res.backlogged[k] += step_service[k]
                res.backlogged_weighted[k] += step_service[k] / cl.omega[k]
            res.drift = max(res.drift, max(res.backlogged_weighted) - min(res.backlogged_weighted))
        # 4. completions (each replica: last admitted first)
        for r, rep in enumerate(cl.reps):
            leaving = [m for m in rep.running if rep.generated[m] == rep.reqs[m].output]
            rep.running = [m for m in rep.running if rep.generated[m] != rep.reqs[m].output]
            for m in reversed(leaving):
                k = rep.reqs[m].client
                res.completed[r][k] += 1
                del rep.generated[m]
                _call(rep.pol, "on_complete", m, rep.value.pop(m))
    res.service = [list(rep.W) for rep in cl.reps]
    res.counters = [list(rep.c) for rep in cl.reps]
    res.router_counter = [list(c) for c in cl.rc]
    res.policies = cl.rpols
    return res
