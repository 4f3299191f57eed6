"""The `vllm` server's running phase under a victim rule other than `newest`: vLLM's walk,
literally, as one `lax.while_loop` (servers/vllm_v1.py has the closed form for `newest`).

vLLM's running loop visits the running list in admission order while budget is left; a
request whose new blocks are not free preempts a victim, again and again, until they are
free or it preempted itself (then it leaves unscheduled and the walk goes on with the next
request: vLLM 0.33, golden m000 step 22). A victim already scheduled in this step gives
its tokens back. The victim rules (`VICTIMS`, int32 codes in `Params.server["victim"]`):

- `newest` (0): the last admitted running request (vLLM fcfs; the closed form's rule);
- `priority` (1): the running request with the largest (priority, arrival order), where
  a request's priority is its client's band `params.band[client]` and its arrival order
  its row's ORDER (vLLM priority: its requests' (priority, arrival_time));
- `counter` (2, a fairness option, not vLLM's): the newest running request of the client
  with the largest counter `view.counter` (ties: the larger client index) among the
  clients with a running request.

The loop is flat: each iteration either schedules the request at the walk's position or
preempts one victim (the victim is removed from the slots, the list shifting down as
vLLM's list does), so a step takes at most 2 S iterations, none without a victim. Under vmap the loop runs as
long as any lane still walks: lanes that do not use it (`run` False) take no iteration.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vtc_jax.servers import block_math

I32 = jnp.int32
VICTIMS = ("newest", "priority", "counter")
NEWEST, PRIORITY, COUNTER = range(3)
FIELDS = ("client", "value", "index", "prompt", "output", "computed", "generated", "tokens", "order")
OUT = ("client", "index", "generated")  # what a victim takes back to its queue (its row: the workload's)


def pick(code, f: dict, nrun, band, counter, num):
    """int32[]: the slot of the victim among slots [0, nrun) of the slot arrays `f`
    (admission order) under rule `code`; `band` int32[K], `counter` per client in the
    number format `num` (core/wide.py)."""
    slots = f["client"].shape[0]
    k = band.shape[0]
    pos = jnp.arange(slots, dtype=I32)
    alive = pos < nrun
    newest = jnp.maximum(nrun - 1, 0)
    b = jnp.where(alive, band[f["client"]], -1)
    top = alive & (b == b.max())
    by_priority = jnp.argmax(jnp.where(top, f["order"], -1)).astype(I32)
    present = jnp.zeros(k, bool).at[jnp.where(alive, f["client"], k)].set(True, mode="drop")
    # argmax with ties to the larger index: the first minimum of -counter, reversed.
    neg = num.sub(num.zeros((k,)), counter)
    richest = k - 1 - num.argmin(neg[::-1], present[::-1]).astype(I32)
    by_counter = jnp.argmax(jnp.where(alive & (f["client"] == richest), pos, -1)).astype(I32)
    return jnp.select([code == PRIORITY, code == COUNTER], [by_priority, by_counter], newest).astype(I32)


def _remove(f: dict, v) -> dict:
    """Slot arrays without slot v: the slots after it move down one."""
    slots = f["client"].shape[0]
    pos = jnp.arange(slots, dtype=I32)
    src = jnp.minimum(pos + (pos >= v), slots - 1)
    return {name: x[src] for name, x in f.items()}


def walk(f: dict, nrun, start, free, budget, out: dict, nvic, cap, block_size, code, band, counter, num, run):
    """vLLM's running phase where `run` (bool[]), from slot `start` on: the slot arrays `f`
    (FIELDS, int32[S] each; `order`: the request's ORDER field; `tokens`: those scheduled before `start`),
    nrun, the free blocks and budget left at `start`, no victim yet (`nvic` 0; `out`, OUT
    fields over S entries, is overwritten from entry 0), the prefill cap (int32[]). The
    caller starts it at the first slot that must preempt (before it, every rule schedules
    alike), so a step without a victim takes no iteration; where `run` is False the
    arguments come back as they are. Returns (f with the survivors first, in admission
    order, and their tokens; nrun; free; budget left; the victims in preemption order
    `out` (entries [0, nvic)); nvic)."""
    slots = f["client"].shape[0]

    def ask(f, j, nrun, budget):
        jj = jnp.minimum(j, slots - 1)
        n = jnp.minimum(jnp.minimum(f["prompt"][jj] + f["generated"][jj] - f["computed"][jj], cap), budget)
        return jnp.where(j < nrun, n, 0)

    def going(carry):
        _, nrun, i, _, budget, _, _, _ = carry
        return run & (i < nrun) & (budget > 0)

    def step(carry):
        f, nrun, i, n, budget, free, out, nvic = carry
        ii = jnp.minimum(i, slots - 1)
        c = f["computed"][ii]
        need = block_math.ceil_div(c + n, block_size) - block_math.ceil_div(c, block_size)
        short = free < need
        # Preempt one victim (its blocks, with any tokens it got this step, come back).
        v = pick(code, f, nrun, band, counter, num)
        back = f["tokens"][v]
        p_out = {name: out[name].at[nvic].set(f[name][v]) for name in OUT}
        p_f, p_nrun, p_i = _remove(f, v), nrun - 1, i - (v < i).astype(I32)
        p_budget, p_free = budget + back, free + block_math.ceil_div(f["computed"][v] + back, block_size)
        # Itself: the walk goes on with the next request (now at i), asked afresh.
        p_n = jnp.where(v == i, ask(p_f, p_i, p_nrun, p_budget), n)
        # Or schedule n tokens for the request at i and move on.
        s_f = dict(f, tokens=f["tokens"].at[ii].set(n))
        s_budget = budget - n
        s_n = ask(s_f, i + 1, nrun, s_budget)
        sel = lambda a, b: jax.tree_util.tree_map(lambda x, y: jnp.where(short, x, y), a, b)  # noqa: E731
        return (sel(p_f, s_f), jnp.where(short, p_nrun, nrun), jnp.where(short, p_i, i + 1), jnp.where(short, p_n, s_n),
                jnp.where(short, p_budget, s_budget), jnp.where(short, p_free, free - need), sel(p_out, out),
                nvic + short.astype(I32))

    carry = (f, nrun, start, ask(f, start, nrun, budget), budget, free, out, nvic)
    f, nrun, _, _, budget, free, out, nvic = jax.lax.while_loop(going, step, carry)
    return f, nrun, free, budget, out, nvic
