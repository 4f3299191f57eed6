"""The fleet's gateway inside the cluster lane (ENGINE_FLEET.md): the endpoint picker
(vtc_jax/pickers, reached through its registry: the cluster knows no picker by name), the
metrics it reads (scraped or live), the gateway's own counts (in flight, Dynamo's prefill
and decode blocks) and llm-d's flow control (saturation, one dispatch per cycle, ticks).

Clock and order (our choices where the sources are silent, docs/CLUSTER.md "The fleet"):
- A replica's metrics (W: its waiting requests, preempted ones included; KV: its used
  blocks) are those at the end of its last step: W as its step left the queue (after the
  step's admissions), KV after the step freed its finished requests. A replica's FINISH
  computes the step [t, t + elapsed) at t, so it keeps two snapshots: the one of its
  previous step and the one its current step will have at its end (`stats_at`).
- A scrape at time s reads, per replica, its last step's snapshot with an end before s
  (same-time order: the scrape before the step ends). The cluster takes the scrape lazily,
  at its first event at or after s (nothing happens in between), as of the latest scrape
  time it passed. scrape_us = 0: the picker and the detector read each replica live.
- Flow control: each enqueue and each tick (every tick_us) is one dispatch cycle; a cycle
  dispatches at most one request, none while the pool is saturated (flow_control.py) or
  the queue is empty. The gateway takes one arrival per event and runs its cycle before the
  next arrival of the same microsecond.
- Dynamo's P_r counts the engine blocks of requests routed to r and not yet admitted there
  (their prefill has not begun: our stand-in for "not past the first token"); D_r the
  blocks of requests routed to r and not finished; the overlap is the replica's own prefix
  hit (its server's `prefix_hit`, 0 on a server without a cache) in whole blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vtc_jax.core.lanes import over_replicas
from vtc_jax.core.rows import NUM_FIELDS, ORDER, PROMPT
from vtc_jax.engines import cluster_shed, flow_control
from vtc_jax.engines.cluster_settings import ClusterConfig, ClusterParams
from vtc_jax.engines.cluster_state import choose as choose_leaves
from vtc_jax.engines.cluster_state import wadd
from vtc_jax.pickers import registry as pickers
from vtc_jax.pickers.base import Request, Shape, Snapshot
from vtc_jax.servers import registry as servers

I32 = jnp.int32
INT_MAX = (1 << 31) - 1


def picker_shape(cfg: ClusterConfig) -> Shape:
    return Shape(*cfg.picker_shape)


def init(cfg: ClusterConfig, params: ClusterParams) -> dict:
    """The gateway's fleet state: picker (its state), scraped int32[R, 2] (W, KV used as of
    the last scrape), scrape_at int32[] (the next scrape time), cycles int32[] (the
    enqueues' dispatch cycles not yet run at this time), tick bool[] (this time's tick
    cycle not yet run), prefill, decode int32[R]
    (Dynamo's P_r and D_r in engine blocks); per replica for its report (`account`): busy
    int32[R] the time in steps that ran something, kv_time int32[R, 2] (WIDE) the sum over
    those steps of the KV used they ended with x their duration. Time 0 is a tick. Under
    flow control also the queue's drops (cluster_shed.init: TTL sweeps, band-capacity
    rejections)."""
    r = cfg.replicas
    zr = jnp.zeros(r, I32)
    fp = params.fleet
    drops = cluster_shed.init(cfg.num_rows, cfg.routers, cfg.num_clients, fp) if cfg.flow_control else {}
    return {"picker": pickers.get(cfg.picker).init(picker_shape(cfg), fp.picker),
            "scraped": jnp.zeros((r, 2), I32), "scrape_at": jnp.zeros((), I32), "cycles": jnp.zeros((), I32),
            "tick": jnp.ones((), bool), "prefill": zr, "decode": zr, "busy": zr, "kv_time": jnp.zeros((r, 2), I32),
            **drops}


def kv_used(server_state, eparams, cfg: ClusterConfig):
    """int32[]: a replica's used KV (blocks on a server that declares `kv_blocks`, else the
    context tokens its running requests hold)."""
    chosen = servers.get(cfg.server)
    if chosen.kv_blocks is not None:
        return chosen.kv_blocks(server_state, eparams)[0]
    return chosen.load(server_state).context.sum(dtype=I32)


def live_stats(reps, eparams, cfg: ClusterConfig):
    """int32[R, 2]: each replica's (W, KV used) now."""
    used = over_replicas(lambda s: kv_used(s, eparams, cfg))(reps.server)
    return jnp.stack([reps.nw.sum(axis=1, dtype=I32), used], axis=1)


def step_stats(rep_stats, rep_at, live, stepped, next_t):
    """A FINISH's update of the replicas' two snapshots (int32[R, 2, 2]: previous step's,
    this step's) and their end times int32[R]: where a replica `stepped` (bool[R]), this
    step's snapshot becomes the previous one and `live` (after end_step) the new one, ending
    at `next_t` int32[R]."""
    new = jnp.stack([rep_stats[:, 1], live], axis=1)
    return jnp.where(stepped[:, None, None], new, rep_stats), jnp.where(stepped, next_t, rep_at)


def account(fleet: dict, live, stepped, elapsed) -> dict:
    """The replicas' report after a FINISH: where a replica `stepped` (bool[R]: its step ran
    something), its step's `elapsed` int32[R] joins its busy time and the KV its step ended
    with (`live` int32[R, 2], (W, KV used)) x elapsed its KV time (exact for KV used below
    2^24 units, the saturation detector's bound too; clamped there)."""
    used = jnp.where(stepped, jnp.minimum(live[:, 1], flow_control.MAX_USABLE - 1), 0)
    return dict(fleet, busy=fleet["busy"] + jnp.where(stepped, elapsed, 0),
                kv_time=wadd(fleet["kv_time"], flow_control.wide_product(used, jnp.where(stepped, elapsed, 0))))


def scrape(fleet: dict, rep_stats, rep_at, now, fp) -> dict:
    """The scrape where its time has come (`now` >= scrape_at): per replica its last step's
    snapshot ending before the latest scrape time <= now; the next scrape after now."""
    every = jnp.maximum(fp.scrape_us, 1)
    due = (fp.scrape_us > 0) & (now >= fleet["scrape_at"])
    passed = (now - fleet["scrape_at"]) // every
    at = fleet["scrape_at"] + passed * every  # the latest scrape time <= now
    seen = jnp.where((rep_at < at)[:, None], rep_stats[:, 1], rep_stats[:, 0])
    return dict(fleet, scraped=jnp.where(due, seen, fleet["scraped"]),
                scrape_at=jnp.where(due, at + every, fleet["scrape_at"]))


def metrics(fleet: dict, live, fp):
    """int32[R, 2]: what the picker and the detector read: the scrape, or live (scrape_us 0)."""
    return jnp.where(fp.scrape_us > 0, fleet["scraped"], live)


def saturated(fleet: dict, live, present, fp):
    """bool[]: llm-d's detector says the pool is saturated (flow control holds dispatches)."""
    seen = metrics(fleet, live, fp)
    return flow_control.saturation(seen[:, 0], seen[:, 1], fp.usable, present, fp.saturation)


def engine_blocks(prompt, fp):
    return (prompt + fp.block - 1) // fp.block


def choose(state, fleet: dict, reps, row, live, present, params: ClusterParams, cfg: ClusterConfig, mask):
    """(replica int32[], picker state): the picker's choice for the request `row` (a cluster
    row, int32[ROW_FIELDS]) and its state after routing it there where `mask` (else as it
    was); ties from the lane's seed and the dispatch sequence."""
    fp = params.fleet
    picker = pickers.get(cfg.picker)
    seen = metrics(fleet, live, fp)
    in_flight = state.dispatched.sum(axis=(0, 2), dtype=I32) - reps.completed.sum(axis=1, dtype=I32)
    overlap = jnp.zeros(cfg.replicas, I32)
    hit = servers.get(cfg.server).prefix_hit
    if "overlap" in picker.reads and hit is not None:
        cached = over_replicas(lambda s: hit(s, params.engine, row[:NUM_FIELDS], generated=jnp.zeros((), I32)))(reps.server)
        overlap = cached // fp.block
    snapshot = Snapshot(waiting=seen[:, 0], kv_used=seen[:, 1], kv_usable=jnp.broadcast_to(fp.usable, present.shape),
                        in_flight=in_flight, prefill_blocks=fleet["prefill"], decode_blocks=fleet["decode"],
                        overlap=overlap, present=present)
    number = jnp.clip(row[ORDER], 0, fp.offsets.shape[0] - 2)
    start, count = fp.offsets[number], fp.offsets[number + 1] - fp.offsets[number]
    most = picker_shape(cfg).max_blocks
    window = jax.lax.dynamic_slice_in_dim(fp.blocks, start, most)
    request = Request(blocks=jnp.where(jnp.arange(most) < count, window, -1), num_blocks=count, prompt=row[PROMPT],
                      engine_blocks=engine_blocks(row[PROMPT], fp))
    key = jax.random.fold_in(jax.random.PRNGKey(params.seed.astype(jnp.uint32)), state.dseq)
    target, picked = picker.pick(fleet["picker"], snapshot, request, key, fp.picker)
    # Masked inside `routed` (replica -1: nothing routed), not by a select over its result:
    # a select kept the state's old copy alive, so XLA copied llm-d's index (O(R x blocks))
    # at every event. A leaf `pick` returned as it was needs no select either.
    picked = choose_leaves(mask, picked, fleet["picker"])
    return target, picker.routed(picked, jnp.where(mask, target, -1), request, fp.picker)


def routed(fleet: dict, picked, target, prompt, mask, fp) -> dict:
    """The gateway's counts after a dispatch of a `prompt`-token request to `target` where
    `mask`: the picker's state (`choose`'s, already masked), P_r and D_r."""
    blocks = jnp.where(mask, engine_blocks(prompt, fp), 0)
    at = jnp.arange(fleet["prefill"].shape[0]) == target
    return dict(fleet, picker=picked, prefill=fleet["prefill"] + jnp.where(at, blocks, 0),
                decode=fleet["decode"] + jnp.where(at, blocks, 0))


def started(fleet: dict, prompts, first, fp) -> dict:
    """P_r after each replica's first admission of a request (first bool[R], prompts int32[R])."""
    return dict(fleet, prefill=fleet["prefill"] - jnp.where(first, engine_blocks(prompts, fp), 0))


def finished(fleet: dict, prompts, done, fp) -> dict:
    """D_r after each replica's completion of a request (done bool[R], prompts int32[R])."""
    return dict(fleet, decode=fleet["decode"] - jnp.where(done, engine_blocks(prompts, fp), 0))


def next_event(t, queued, fp):
    """int32[]: the next tick or TTL sweep after t when requests wait at the gateway under
    flow control (ticks at multiples of tick_us), else INT_MAX (a tick with nothing queued
    does nothing)."""
    tick = jnp.where(fp.flow & queued, (t // fp.tick_us + 1) * fp.tick_us, INT_MAX)
    return jnp.minimum(tick, cluster_shed.next_sweep(t, queued, fp))


def cycles_now(fleet: dict, pending):
    """int32[]: dispatch cycles open now: the enqueues' not yet run, and the tick's once no
    arrival of this time is left to enqueue (same-time order: arrivals, then the tick)."""
    return fleet["cycles"] + (fleet["tick"] & ~pending).astype(I32)


def spend(fleet: dict, pending, evaluated, dispatched) -> dict:
    """The cycles after this event. A dispatch spends one open cycle (an enqueue's first,
    else the tick's); where a cycle ran (`evaluated`) and dispatched nothing (saturated,
    nothing queued), every open cycle is spent: nothing changes before the next arrival,
    which brings its own."""
    enq, tick = fleet["cycles"], fleet["tick"]
    open_tick = tick & ~pending
    idle = evaluated & ~dispatched
    used_tick = dispatched & (enq <= 0) & open_tick
    enq = jnp.where(idle, 0, enq - (dispatched & (enq > 0)).astype(I32))
    return dict(fleet, cycles=enq, tick=tick & ~used_tick & ~(idle & open_tick))


def new_time(fleet: dict, t, next_t, fp) -> dict:
    """When the clock moves from t to next_t, the cycles left at t lapse and a tick at
    next_t opens one (after next_t's arrivals)."""
    moving = next_t > t
    return dict(fleet, cycles=jnp.where(moving, 0, fleet["cycles"]),
                tick=jnp.where(moving, next_t % fp.tick_us == 0, fleet["tick"]))
