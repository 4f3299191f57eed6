"""Quiet steps: a stretch of steps that only decode, run in one engine event.

When no waiting request fits and none will before a completion, the steps up to the next
completion admit nothing and complete nothing; a request that arrives in them and joins a
client that is already backlogged changes no head, no lift and no choice. On a server that
can run such steps at once (servers/base.py: quiet_steps, run_quiet) and with only `quiet`
policies (policies/base.py), the engine's FINISH event for step t also runs the n quiet
steps t + 1 .. t + n (engine.finish): their joins in bulk (read from the timeline's next
entries), their decode charged at once, the measures at the stretch's two ends (W is
linear in between when beta = 0, so every drift's extremes are there). Same integers as
one event per step; on the seed workload 0.15 events per step instead of 1.05 (with the
admissions that end their step, engine.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from vtc_jax.core import over_clients
from vtc_jax.core.once import once_for
from vtc_jax.inputs.workload import TIMELINE_PAD
from vtc_jax.policies import registry
from vtc_jax.policies.base import SCATTER_CLIENTS, add_at, admissible
from vtc_jax.servers import registry as servers

I32 = jnp.int32
WINDOW = 32  # default EngineConfig.quiet_window: timeline entries a FINISH reads ahead


def window(config) -> int:
    """Quiet steps a FINISH event may run for this EngineConfig (0: none; static): only on
    a server with quiet steps, with every policy of the batch `quiet`, and without what
    acts per step (the estimator, policies that read arriving rows, the ledger, occupancy,
    demand, share and resource measures). Checkpoints of W (`record_every`) end stretches
    (`stretch`). Limits (rpm, KV caps, bands)
    only make fewer clients eligible, which cannot make a request fit."""
    server, m = servers.get(config.server), config.measures
    if not 0 <= config.quiet_window <= TIMELINE_PAD:
        raise ValueError(f"quiet_window must be in [0, {TIMELINE_PAD}] (the timeline's padding)")
    per_step = (config.estimator or config.arrival_rows or m.ledger or m.occupancy or m.demand or m.share
                or m.resource)
    quiet = all(registry.get(n).quiet and registry.get(n).on_step is None for n in config.policies)
    if server.quiet_steps is None or per_step or not quiet:
        return 0
    return config.quiet_window


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stretch:
    """Quiet steps after a step t: steps int32[] (n, 0: none); server: the server's state
    after them; work: their Work, summed; joined: int32[K] requests that joined in them;
    taken: int32[] those requests (timeline entries consumed); since_arrival: int32[] the
    last of those steps with an arrival, minus t (0: none)."""

    steps: jax.Array
    server: Any
    work: Any
    joined: jax.Array
    taken: jax.Array
    since_arrival: jax.Array


def stretch(config, params, step, horizon, backlogged, prompts, server_state, decode, mask, ahead,
            candidate=None) -> Stretch:
    """Where `mask` (step t = `step` has ended, not by an idle jump; `server_state` after
    it; `decode` int32[K] its charges; `backlogged` bool[K] and `prompts` int32[K], each
    client's head's prompt, as the step's admissions left them): the n quiet steps
    t + 1 .. t + n, which need
      - no request to fit at any of them and none to complete at the end of t .. t + n - 1
        (the server's quiet_steps, for the smallest prompt at a backlogged head; or, with
        `candidate` = (client int32[], prompt int32[], choose), for the prompt of the
        candidate that did not fit at t, where `choose(s)` is the policy's choice s steps
        later and equals it at the stretch's last step: a quiet policy's choice is then
        the same throughout);
      - every request arriving at them to join a backlogged client and to be in `ahead`
        (int32[J, 3], the timeline's entries from `next`: all arrive after t), its last
        entry excluded (what follows it is unknown); and t + n < `horizon`;
      - with checkpoints (config.record_every), t not a checkpoint's step and no
        checkpoint's step before t + n (the event records W after t + n);
      - beta = 0 (the drift is then linear over the stretch) and a step's charges small
        enough that J + 1 of them stay below 2^31.
    """
    width = ahead.shape[0]
    server = servers.get(config.server)
    entry_client, entry_arrival = ahead[:, 1], ahead[:, 2]
    prompts = jnp.where(backlogged, prompts, jnp.iinfo(I32).max)
    k = config.num_clients
    once = once_for(k)  # the buffers pay below ONCE_CLIENTS clients only (never at SCATTER_CLIENTS or more)
    if k < SCATTER_CLIENTS:
        # [J, K] one-hot reductions rather than per-entry gathers: XLA computes a reduction
        # once, where it would fuse a chain of selects into each of its many consumers.
        is_client = entry_client[:, None] == jnp.arange(k, dtype=I32)
        joinable = over_clients.any_of(is_client & backlogged)
    else:  # [J, K] would be 2,784 compares per event at K = 87: gather each entry's client
        joinable = admissible(backlogged, entry_client)  # in [0, K) and backlogged
    joinable = joinable & (jnp.arange(width) < width - 1)
    stop = entry_arrival[over_clients.smallest(jnp.where(joinable, width - 1, jnp.arange(width, dtype=I32)))]
    bound = (jnp.iinfo(I32).max - 1) // (width + 1)
    allowed = (mask & over_clients.any_of(backlogged) & (params.costs.context == 0)
               & (over_clients.largest(decode) <= bound)
               & (over_clients.largest(decode * params.costs.counter_mult) <= bound))
    reach = jnp.minimum(jnp.minimum(stop - step - 1, horizon - step - 1), width)
    if config.record_every:  # checkpoints hold W after steps (i + 1) * every - 1; an event records one
        every = config.record_every
        left = every - (step + 1) % every  # steps from t to the next checkpoint (every: t is one)
        reach = jnp.where(left == every, 0, jnp.minimum(reach, left))  # end on it, never pass it
    smallest = over_clients.smallest(prompts)
    if candidate is not None:
        client, prompt, choose = candidate
        smallest = jnp.where(choose(reach) == client, prompt, smallest)
    n = jnp.minimum(server.quiet_steps(server_state, params, step, smallest, width), reach)
    n = once(jnp.where(allowed, n, 0))
    after, work = server.run_quiet(server_state, params, n)
    joins = mask & (entry_arrival <= step + n)  # a prefix of `ahead`, every one joinable
    taken = once(joins.sum(dtype=I32))
    last = entry_arrival[jnp.maximum(taken - 1, 0)]
    if k < SCATTER_CLIENTS:
        joined = (is_client & joins[:, None]).sum(axis=0, dtype=I32)
    else:
        joined = add_at(jnp.zeros(k, I32), entry_client, 1, joins)
    return Stretch(steps=n, server=after, work=work, joined=joined,
                   taken=taken, since_arrival=jnp.where(taken > 0, last - step, 0))
