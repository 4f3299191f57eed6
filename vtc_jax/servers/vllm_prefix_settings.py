"""`vllm_prefix`'s settings (servers/vllm_prefix.py): vllm's, the trace's content
(`prefix_blocks`, a PrefixTable: inputs/prefix_blocks.py) and the sizes its tables are
padded to; their validation, encoding and the batch's static sizes."""

from __future__ import annotations

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs import prefix_blocks
from vtc_jax.inputs.prefix_blocks import ContentIdentity, PrefixTable, prefix_table
from vtc_jax.servers import step_time, vllm_v1
from vtc_jax.servers.vllm_v1 import LIMIT

PREFIX_OPTIONS = ("prefix_blocks", "prefix_capacity")
VICTIMS = ("newest", "priority")  # vllm's victim rules offered here (its `counter` is not)
MIN_TABLE = 64


def _split(options: dict) -> tuple[dict, dict]:
    base = {k: v for k, v in options.items() if k not in PREFIX_OPTIONS}
    return base, {k: options[k] for k in PREFIX_OPTIONS if k in options}


def validate(options: dict) -> None:
    """vllm's settings (vllm_v1.validate), the victim `newest` or `priority`, the trace's
    content `prefix_blocks` (a PrefixTable; required by the run, `_table`) and
    `prefix_capacity` (rows, ids): the sizes its tables are padded to, optional."""
    base, prefix = _split(options)
    try:
        vllm_v1.validate(base)
    except InputError as err:
        raise InputError(str(err).replace("server vllm ", "server vllm_prefix ")) from None
    victim = vllm_v1.settings(base)["victim"]
    if victim not in VICTIMS:
        raise InputError(f"victim must be one of {', '.join(VICTIMS)} with prefix caching, got {victim!r}")
    if not isinstance(prefix.get("prefix_blocks"), (PrefixTable, type(None))):
        raise InputError("prefix_blocks must be a PrefixTable (vtc_jax.servers.vllm_prefix.prefix_options)")
    cap = prefix.get("prefix_capacity", (0, 0))
    if not (isinstance(cap, tuple) and len(cap) == 2 and all(type(v) is int and 0 <= v <= LIMIT for v in cap)):
        raise InputError(f"prefix_capacity must be a pair of integers in [0, {LIMIT}] (rows, ids)")


def _table(options: dict) -> PrefixTable:
    table = options.get("prefix_blocks")
    if table is None:
        raise InputError("server vllm_prefix needs the trace's content (which tokens requests share): a log with "
                         "hash_ids, session_id or prefix_id/prefix_len columns, or the setting prefix_blocks")
    return table


def _pow2(n: int) -> int:
    return max(MIN_TABLE, 1 << max(int(n) - 1, 0).bit_length())


def _tables(options: dict) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int32[R'], ids int32[I']) of a lane, padded (offsets with their last value,
    ids with 0) to powers of two (at least 64), or to `prefix_capacity` when larger."""
    base, prefix = _split(options)
    offsets, ids = _table(options).blocks(vllm_v1.settings(base)["block_size"])
    rows, size = prefix.get("prefix_capacity", (0, 0))
    if int(ids.max(initial=0)) > LIMIT or offsets[-1] > LIMIT:
        raise InputError(f"the trace's content has {int(offsets[-1]):,} blocks: more than {LIMIT:,}")
    out_off = np.full(max(_pow2(len(offsets)), rows), offsets[-1], np.int32)
    out_off[: len(offsets)] = offsets
    out_ids = np.zeros(max(_pow2(len(ids)), size), np.int32)
    out_ids[: len(ids)] = ids
    return out_off, out_ids


def encode(options: dict) -> dict:
    """The traced settings (from vllm_v1.settings, vLLM's names; the victim as its index
    in VICTIMS) and the content tables `block_offsets` int32[R'] and `block_ids` int32[I']
    (`_tables`)."""
    base, _ = _split(options)
    s = vllm_v1.settings(base)
    offsets, ids = _tables(options)
    return {"block_size": np.int32(s["block_size"]), "num_blocks": np.int32(s["num_gpu_blocks"]),
            "budget": np.int32(s["max_num_batched_tokens"]), "seats": np.int32(s["max_num_seqs"]),
            "long_cap": np.int32(s["long_prefill_token_threshold"]), "chunked": np.bool_(s["enable_chunked_prefill"]),
            "victim": np.int32(VICTIMS.index(s["victim"])), "async": np.bool_(s["async_scheduling"]),
            "block_offsets": offsets, "block_ids": ids, "blis_engine": np.bool_(s["blis_engine"]),
            **step_time.encode(*vllm_v1.time_model(s))}


def prefix_options(arrival, prompt, output, ident: ContentIdentity) -> dict:
    """The setting `prefix_blocks` of a trace (per request in trace order: arrival, prompt,
    output; `ident` its content identity, inputs/prefix_blocks.py: groups, chains or
    sessions)."""
    return {"prefix_blocks": prefix_table(ident, arrival, prompt, output)}


def common_capacity(options: list) -> list:
    """Lanes' options with one `prefix_capacity`, the largest padded table sizes among
    them, so that lanes of different traces share one batch."""
    sizes = [tuple(len(t) for t in _tables(o)) for o in options]
    cap = (max(s[0] for s in sizes), max(s[1] for s in sizes))
    return [dict(o, prefix_capacity=cap) for o in options]


def _static_sizes(options: dict) -> tuple[int, int]:
    """(W, U) of a lane: the most blocks a request can hold, the distinct contents."""
    base, prefix = _split(options)
    table = _table(options)
    bs = vllm_v1.settings(base)["block_size"]
    width = int(vllm_v1.peak_blocks(table.prompt, table.output, bs).max(initial=1))
    _, ids = table.blocks(bs)
    return max(width, 1), int(ids.max(initial=-1)) + 1


def plan_slots(options: list, bound: int, requests: int) -> int:
    """vllm's running slots (the seats). Refused: lanes whose content tables differ in
    padded size (give them `common_capacity`)."""
    sizes = {tuple(len(t) for t in _tables(o)) for o in options}
    if len(sizes) > 1:
        raise InputError("the lanes' prefix tables differ in size: give them one prefix_capacity (common_capacity)")
    return vllm_v1.plan_slots([_split(o)[0] for o in options], bound, requests)


def static_options(options: list) -> tuple:
    """(("token_times", vllm's), ("pool_blocks", P), ("table_width", W), ("contents", U)):
    the batch's largest pool, request and content count (U a power of two); and
    ("async_scheduling", True) when some lane schedules async (else servers/
    vllm_prefix_async.py is left out of the program)."""
    sizes = [_static_sizes(o) for o in options]
    vllm = dict(vllm_v1.static_options([_split(o)[0] for o in options]))
    return (("token_times", vllm["token_times"]),
            ("pool_blocks", max(vllm_v1.settings(_split(o)[0])["num_gpu_blocks"] for o in options)),
            ("table_width", max(w for w, _ in sizes)), ("contents", _pow2(max(u for _, u in sizes))),
            *((("async_scheduling", True),) if vllm["async_scheduling"] else ()),
            *((("time_shares", True),) if vllm["time_shares"] else ()),
            *((("time_terms", vllm["time_terms"]),) if vllm["time_terms"] else ()))


def never_served(options: dict, prompt, output, kv_budget: int) -> str | None:
    return vllm_v1.never_served(_split(options)[0], prompt, output, kv_budget)


def drain_steps(options: dict, arrival, prompt, output, limit: int = vllm_v1.INT_MAX // 2) -> int:
    """vllm's horizon: a prefix hit only takes work away, and the first running request is
    still never the newest victim."""
    return vllm_v1.drain_steps(_split(options)[0], arrival, prompt, output, limit)


def fuzz_options(rng, prompt, output) -> dict:
    """vllm's random settings (victim newest or priority) and random prefix groups: a
    request joins one of 3 groups with probability 0.6, with a prefix of up to its prompt
    (arrival order is taken as the trace order)."""
    out = vllm_v1.fuzz_options(rng, prompt, output)
    if out.get("victim") not in (None, *VICTIMS):
        out["victim"] = rng.choice(VICTIMS)
    lengths = [int(p) for p in prompt]
    group = [rng.randrange(3) if rng.random() < 0.6 else None for _ in lengths]
    prefix = [rng.randint(0, p) if g is not None else 0 for g, p in zip(group, lengths)]
    ident = prefix_blocks.groups(group, prefix, np.zeros(len(lengths), np.int64))
    out.update(prefix_options(np.arange(len(lengths)), prompt, output, ident))
    return out
