"""A policy of your own, outside the package: strict round robin over clients.

Load it with `--policy-module examples/my_policy.py` (replay, compare and every sweep):

    python -m vtc_jax replay examples/small_trace.csv --policy-module examples/my_policy.py \\
        --policy round_robin --kv-budget 8192 --steps 2000
    python -m sweeps.kv_budget --policy-module examples/my_policy.py --policy round_robin --seeds 64

Rule: a cursor points at a client; the candidate is the first eligible client at or after
the cursor (cyclically); after an admission the cursor moves past the admitted client. A
blocked candidate (it does not fit M) changes nothing. No weights, no counters.

The file holds everything a policy is (docs/POLICIES.md): `encode` (host: settings -> traced
params), `init` (its per-lane state), `select` (the candidate among the eligible clients),
`on_admit` (state after an admission), and `Reference`, the slow literal version the tests
check the fast one against.
"""

import jax.numpy as jnp

from vtc_jax.policies import Choice, Policy


def encode(settings, ctx):
    return {}  # no parameters


def init(params, shape):
    return {"cursor": jnp.zeros((), jnp.int32)}


def select(state, view, eligible, params):
    k = eligible.shape[0]
    distance = (jnp.arange(k) - state["cursor"]) % k  # 0 for the cursor's client, then onwards
    client = jnp.argmin(jnp.where(eligible, distance, k)).astype(jnp.int32)
    return Choice(client=client, has=eligible.any(), state=state)


def on_admit(state, view, admission, params):
    k = view.backlogged.shape[0]
    return {"cursor": ((admission.client + 1) % k).astype(jnp.int32)}, admission.estimate


class Reference:
    """The same rule, literally."""

    def __init__(self, settings, sim):
        self.sim, self.cursor = sim, 0

    def select(self, eligible):
        for offset in range(self.sim.K):
            k = (self.cursor + offset) % self.sim.K
            if k in eligible:
                return k
        return None

    def on_admit(self, n):
        self.cursor = (self.sim.reqs[n].client + 1) % self.sim.K


POLICY = Policy(name="round_robin", summary="strict round robin over clients (an example policy)",
                encode=encode, init=init, select=select, on_admit=on_admit, reference=Reference)
