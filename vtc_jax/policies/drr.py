"""`drr`: weighted deficit round robin as NVIDIA Dynamo's router runs it
(lib/kv-router/src/scheduling/policy_queue.rs, `pop_next`, mainline), one class per client.

Rule (docs/POLICIES.md has the source notes):
  * Cost, fixed when the request arrives (enqueue) and never recomputed:
      option cost="estimate" (default): max(1, w_p * (prompt - cached) + w_q * e + beta * ...)
      option cost="prefill"  (Dynamo):  max(1, w_p * (prompt - cached)),
    e = the estimator's output prediction at arrival.
  * Each client has a deficit D (0 at start) and a quantum Q_k = quantum * weight_k tokens
    (option quantum, default 64; see OPTIONS for why it is below a request's cost).
  * A pick: a *carried* client (the last one dispatched in this step, still holding credit)
    goes again if its deficit covers its head. Otherwise the ring is visited from the
    cursor: a client whose deficit covers its head is dispatched without a new quantum;
    otherwise it gets one quantum and is dispatched if that covers the head, else the visit
    moves on. If a whole ring dispatches nobody, every eligible client gets r more quanta,
    r = min over them of ceil((cost - deficit) / quantum) (deficits after the ring's
    quantum), and the first client in ring order that can now pay is dispatched.
  * A dispatch: D -= cost; the cursor moves to the next client; if the client's FIFO is
    now empty its deficit resets to 0, else it is carried when D > 0. The carry lasts for
    the step (Dynamo's drain loop always ends with an empty pick, which clears it). This
    is Dynamo's code (`pop_candidate`); its documentation instead keeps the cursor on a
    class whose next head is affordable (docs/POLICIES.md cites both).
  * A candidate that does not fit M changes nothing (admission stops for the step).
    Clients that are backlogged but not eligible (an rpm limit, a kv cap, a lower band)
    are skipped with their deficit kept and no quantum, as Dynamo skips busy classes.
Ties cannot occur: the ring order from the cursor decides. The pick is computed in closed
form over the clients (O(K), no loop over rounds). Units: 1 / (Q * L) tokens, Q the cost
scale and L the least common multiple of the weights' denominators, so every quantum and
cost is an exact integer.
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax.numpy as jnp
import numpy as np

from vtc_jax.core import over_clients
from vtc_jax.core.errors import InputError
from vtc_jax.policies.base import Choice, Policy, estimated_cost, i32, onehot, prefill_cost, weight_scale

I32 = jnp.int32
BIG = np.int32(1 << 30)
COSTS = ("estimate", "prefill")
MAX_QUANTUM = 1 << 20
# 64 tokens per unit of weight, below a typical request's cost: when admissions are paced
# one at a time by the KV budget (the carry lasts a step), a quantum at or above the cost
# lets every class pay on its first visit and DRR splits by request count, not by weight
# (measured: weights 1:2:3:4 get 0.22:0.25:0.26:0.27 of the service at quantum 1024,
# 0.11:0.21:0.30:0.39 at 64; docs/POLICIES.md).
OPTIONS = {"quantum": 64, "cost": "estimate"}


def validate(settings) -> None:
    if settings.option("cost") not in COSTS:
        raise InputError(f"drr option cost must be one of {', '.join(COSTS)}, got {settings.option('cost')!r}")
    quantum = settings.option("quantum")
    if isinstance(quantum, bool) or not isinstance(quantum, int) or not 1 <= quantum <= MAX_QUANTUM:
        raise InputError(f"drr option quantum must be an integer in [1, {MAX_QUANTUM}], got {quantum!r}")


def encode(settings, ctx) -> dict:
    quantum = OPTIONS["quantum"] if settings is None else settings.option("quantum")
    scale = weight_scale(ctx.weights)
    quanta = [quantum * ctx.cost_scale * w * scale for w in ctx.weights]
    return {"quantum": i32([int(q) for q in quanta]), "scale": np.int32(scale),
            "prefill_only": np.bool_(settings is not None and settings.option("cost") == "prefill")}


def init(params, shape):
    k = shape.num_clients
    return {"deficit": jnp.zeros(k, I32), "cursor": jnp.zeros((), I32), "carry": jnp.full((), -1, I32),
            "cost": jnp.zeros(shape.num_rows, I32), "chosen_cost": jnp.zeros((), I32)}


def request_cost(view_costs, rows, estimates, params):
    """int32: a request's DRR cost in deficit units."""
    cost = jnp.where(params["prefill_only"], jnp.maximum(1, prefill_cost(view_costs, rows)),
                     estimated_cost(view_costs, rows, estimates))
    return cost * params["scale"]


def on_arrival(state, view, arrivals, params):
    cost = request_cost(view.costs, arrivals.rows, arrivals.estimates, params)
    rows = state["cost"].shape[0]
    index = jnp.where(arrivals.joins, arrivals.index, rows)
    return dict(state, cost=state["cost"].at[index].set(cost, mode="drop")), view.counter


def select(state, view, eligible, params) -> Choice:
    k = eligible.shape[0]
    deficit, quantum, cursor, carry = state["deficit"], params["quantum"], state["cursor"], state["carry"]
    head_cost = state["cost"][view.head_index]
    need = jnp.where(eligible, (jnp.maximum(head_cost - deficit, 0) + quantum - 1) // quantum, BIG)
    distance = (jnp.arange(k, dtype=I32) - cursor) % k
    carried = (carry >= 0) & eligible[jnp.maximum(carry, 0)] & (need[jnp.maximum(carry, 0)] == 0)
    one_pass = eligible & (need <= 1)
    in_pass = over_clients.any_of(one_pass)
    s_pass = over_clients.first_argmin(jnp.where(one_pass, distance, k))
    rounds = over_clients.smallest(need)
    s_bulk = over_clients.first_argmin(jnp.where(eligible & (need == rounds), distance, k))
    client = jnp.where(carried, carry, jnp.where(in_pass, s_pass, s_bulk)).astype(I32)
    visited = eligible & (distance < distance[s_pass])
    add_pass = jnp.where(visited, quantum, 0) + onehot(s_pass, k) * need[s_pass] * quantum[s_pass]
    add_bulk = jnp.where(eligible, rounds * quantum, 0)
    add = jnp.where(carried, 0, jnp.where(in_pass, add_pass, add_bulk))
    return Choice(client, over_clients.any_of(eligible), dict(state, deficit=deficit + add, chosen_cost=head_cost[client]))


def on_admit(state, view, admission, params):
    k = view.backlogged.shape[0]
    s = admission.client
    cost = state["chosen_cost"]
    deficit = state["deficit"] - onehot(s, k) * cost
    emptied = view.waiting[s] == 1
    left = deficit[s]
    deficit = jnp.where(emptied & (jnp.arange(k) == s), 0, deficit)
    carry = jnp.where(emptied | (left <= 0), -1, s).astype(I32)
    return dict(state, deficit=deficit, cursor=((s + 1) % k).astype(I32), carry=carry), admission.estimate


def on_step(state, view, step_end, params):
    return dict(state, carry=jnp.full((), -1, I32))


class Reference:
    """Literal Dynamo `pop_next` (mainline): carry check, one ring pass, bulk rounds."""

    def __init__(self, settings, sim):
        self.settings, self.sim = settings, sim
        self.quantum = [Fraction(settings.option("quantum")) * w for w in sim.omega]
        self.deficit = [Fraction(0)] * sim.K
        self.cursor, self.carry = 0, None
        self.cost = {}

    def on_arrival(self, n):
        sim, r = self.sim, self.sim.reqs[n]
        prefill = sim.prefill_charge(n)
        if self.settings.option("cost") == "prefill":
            cost = prefill
        else:
            e = sim.estimate(n)
            cost = prefill + sim.w_q * e + sim.beta * (e * r.prompt + e * (e - 1) // 2)
        self.cost[n] = max(cost, sim.cost_unit)  # at least one cost unit (1 / Q tokens)

    def _head_cost(self, k):
        return self.cost[self.sim.fifo[k][0]]

    def _scan(self, eligible):
        """(client, deficits after the scan) of one pick; state is not changed."""
        K, deficit, eligible = self.sim.K, list(self.deficit), set(eligible)
        if not eligible:
            return None, deficit
        g = self.carry
        if g is not None and g in eligible and self._head_cost(g) <= deficit[g]:
            return g, deficit
        for off in range(K):
            i = (self.cursor + off) % K
            if i not in eligible:
                continue
            if self._head_cost(i) <= deficit[i]:
                return i, deficit
            deficit[i] += self.quantum[i]
            if self._head_cost(i) <= deficit[i]:
                return i, deficit
        r = min(math.ceil((self._head_cost(i) - deficit[i]) / self.quantum[i]) for i in eligible)
        for i in eligible:
            deficit[i] += r * self.quantum[i]
        for off in range(K):
            i = (self.cursor + off) % K
            if i in eligible and self._head_cost(i) <= deficit[i]:
                return i, deficit
        raise AssertionError("a bulk round always makes some client able to pay")

    def select(self, eligible):
        self._scanned = self._scan(eligible)  # committed by on_admit if the head is admitted
        return self._scanned[0]

    def on_admit(self, n):
        sim = self.sim
        k = sim.reqs[n].client
        client, deficit = self._scanned
        assert client == k
        deficit[k] -= self.cost[n]
        self.deficit, self.cursor = deficit, (k + 1) % sim.K
        if not sim.fifo[k]:  # admitted: the engine already removed n from the FIFO
            self.deficit[k], self.carry = Fraction(0), None
        else:
            self.carry = k if self.deficit[k] > 0 else None
        return sim.estimate(n)

    def on_step_end(self, elapsed):
        self.carry = None


def fuzz_options(rng) -> dict:
    return {"quantum": rng.choice([1, 3, 10, 40, 1024]), "cost": rng.choice(COSTS)}


DRR = Policy(name="drr", summary="weighted deficit round robin (NVIDIA Dynamo's router): quantum x weight per visit",
             encode=encode, init=init, select=select, on_arrival=on_arrival, on_admit=on_admit, on_step=on_step,
             reference=Reference, reads=("weights", "estimator", "options", "prices"),
             options=dict(OPTIONS), uses_estimator=True, validate=validate,
             fuzz_options=fuzz_options, arrival_rows=True)
