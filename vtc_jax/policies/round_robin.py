"""`rr`: round robin over tenants as llm-d's gateway runs it (the round-robin fairness
policy of its flow control: llm-d/llm-d-router@ebab6879,
pkg/epp/framework/plugins/flowcontrol/fairness/roundrobin/roundrobin.go).

llm-d's rule: the flow keys are sorted; a cursor holds the last flow served; a pick visits
the flows cyclically from the one after it (from the first if none was served) and takes
the first whose queue is not empty; a pick that finds every queue empty clears the cursor.
Here the flows are the tenants (client ids, ascending), so:

  * select: the first eligible client after the last one served, cyclically (the first
    eligible client if none was served, or since the cursor was cleared);
  * on_admit: the admitted client becomes the last one served;
  * on_arrival: a request that joins while no client is backlogged clears the cursor.
    llm-d runs a pick on every enqueue and every 1 ms tick while the pool is not
    saturated, so a band that empties is seen empty by a pick (which clears the cursor)
    before anything joins it again; in steps, a request that finds every queue empty
    comes after such a pick (**choice**: the pick that finds the band empty is placed
    between the step that emptied it and the next arrival).

Our choices where the setting differs (docs/POLICIES.md): llm-d moves the cursor inside
`Pick`, which runs only when the pool has room, so every pick is a dispatch; here the pick
is committed at admission (a blocked candidate changes nothing, as for every policy);
backlogged clients that are not eligible (an rpm limit, a KV cap, a lower band) are
skipped as empty queues are; one cursor for all priority bands (llm-d keeps one per band);
flows are never garbage-collected (llm-d restarts from the first key when the last flow
served was removed, which needs it to sit idle past the flow GC timeout).

The state is one int32: the client a pick starts from (one past the last served, 0 when
none), so a pick is a cyclic distance and an argmin (O(K)). No options, no weights.
"""

from __future__ import annotations

import jax.numpy as jnp

from vtc_jax.core import over_clients
from vtc_jax.policies.base import Choice, Policy, no_params

I32 = jnp.int32
NAME = "rr"  # "round_robin" is taken by examples/my_policy.py, a user's module (same rule, no reset)


def init(params, shape):
    """{"cursor": int32[]}: the client a pick starts from (0: none served yet)."""
    return {"cursor": jnp.zeros((), I32)}


def select(state, view, eligible, params) -> Choice:
    """The first eligible client at or after the cursor, cyclically (eligible: bool[K])."""
    k = eligible.shape[0]
    distance = (jnp.arange(k, dtype=I32) - state["cursor"]) % k
    client = over_clients.first_argmin(jnp.where(eligible, distance, k)).astype(I32)
    return Choice(client, over_clients.any_of(eligible), state)


def on_arrival(state, view, arrivals, params):
    """Clear the cursor when a request joins while no client is backlogged (view.backlogged
    bool[K] is the state before the event; arrivals.joins bool[W])."""
    reset = ~over_clients.any_of(view.backlogged) & arrivals.joins.any()
    return {"cursor": jnp.where(reset, 0, state["cursor"]).astype(I32)}, view.counter


def on_admit(state, view, admission, params):
    """The admitted client (admission.client int32[]) is the last one served."""
    k = view.backlogged.shape[0]
    return {"cursor": ((admission.client + 1) % k).astype(I32)}, admission.estimate


class Reference:
    """llm-d's Pick, literally: sorted keys, start after the last one served, skip empty."""

    def __init__(self, settings, sim):
        self.sim, self.last = sim, None

    def on_arrival(self, n):
        if not any(self.sim.fifo):  # n has not joined yet: every queue is empty
            self.last = None

    def select(self, eligible):
        keys = sorted(range(self.sim.K))
        start = 0 if self.last is None else keys.index(self.last) + 1
        for i in range(len(keys)):
            key = keys[(start + i) % len(keys)]
            if key in eligible:
                return key
        return None

    def on_admit(self, n):
        self.last = self.sim.reqs[n].client
        return self.sim.estimate(n)


RR = Policy(name=NAME, summary="round robin over tenants (llm-d's gateway fairness): the next backlogged after the last served",
            encode=no_params, init=init, select=select, on_arrival=on_arrival, on_admit=on_admit,
            reference=Reference, quiet=True)
