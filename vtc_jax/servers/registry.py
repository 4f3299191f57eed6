"""The one list of server names: CLI choices (`--server`), `python -m vtc_jax servers`,
settings validation and the tests read it, so a server added here is offered, validated
and fuzzed against the literal reference without touching anything else."""

from __future__ import annotations

import dataclasses

from vtc_jax.core.registry import Registry
from vtc_jax.servers.base import Server
from vtc_jax.servers.ideal import IDEAL, IDEAL_RESERVE
from vtc_jax.servers.sglang import SGLANG
from vtc_jax.servers.slora import SLORA
from vtc_jax.servers.vllm_prefix import VLLM_PREFIX
from vtc_jax.servers.vllm_v1 import VLLM

SERVERS = Registry("server", Server, "vtc_jax.servers.base.Server")
register, names, get = SERVERS.register, SERVERS.names, SERVERS.get


register(IDEAL)
register(VLLM)
register(IDEAL_RESERVE)
register(VLLM_PREFIX)
register(SLORA)
register(SGLANG)

DEFAULT_SERVER = names()[0]  # the server a run gets when none is named (the first registered: MODEL.md's)


def keeps_time(name: str, options=()) -> bool:
    """Whether server `name`'s lanes under `options` run on a clock of us (its latencies are reported)."""
    return bool(get(name).keeps_time(dict(options)))


def request_record(name: str):
    """(host state -> the per-request record, its index "order" | "row"), or None: the server keeps none."""
    server = get(name)
    return None if server.request_record is None else (server.request_record, server.record_index)


def default_memory(name: str, options=()) -> int | None:
    """The M server `name` holds under `options` when no --kv-budget is given (None: it has none of its own)."""
    return get(name).default_memory(dict(options))


def trace_columns(name: str) -> tuple:
    """The log columns server `name` reads beyond arrival, tenant, prompt and output."""
    return tuple(get(name).trace_columns)


def takes_step_time(name: str) -> bool:
    """Whether server `name` takes a step-time model (--preset / --step-time)."""
    return bool(get(name).step_time_model)


def flags(name: str) -> dict:
    """{setting: flag} of server `name`'s settings that have command-line flags (cli/server_flags.py)."""
    return dict(get(name).flags)


def batch_settings(name: str, settings) -> list:
    """Lanes' Settings (engines/settings.py) with their options for server `name` made to
    share one batch (the server's `batch_options`; unchanged when it has none)."""
    batch = get(name).batch_options
    if batch is None:
        return list(settings)
    distinct = list(dict.fromkeys(settings))
    options = batch([dict(s.server_options) for s in distinct])
    new = {s: dataclasses.replace(s, server_options=tuple(sorted(o.items()))) for s, o in zip(distinct, options)}
    return [new[s] for s in settings]


def all_flags() -> dict:
    """{setting: flag} over every server (a setting shared by servers is one flag)."""
    return {setting: flag for n in names() for setting, flag in get(n).flags}


def with_flag(setting: str) -> tuple[str, ...]:
    """The servers that take the setting `setting`."""
    return tuple(n for n in names() if setting in flags(n))


def prefix_caching(name: str, on: bool) -> str:
    """The server that runs server `name`'s engine with (`on`) or without prefix caching:
    of the servers with `name`'s flags, the one that reads (or does not read) the log's
    shared prefixes (trace column prefix_id); `name` itself when there is none."""
    same = [n for n in names() if flags(n) == flags(name) and ("prefix_id" in trace_columns(n)) == on]
    return name if not same or name in same else same[0]
