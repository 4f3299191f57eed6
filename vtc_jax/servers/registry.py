"""The one list of server names: CLI choices (`--server`), `python -m vtc_jax servers`,
settings validation and the tests read it, so a server added here is offered, validated
and fuzzed against the literal reference without touching anything else."""

from __future__ import annotations

from vtc_jax.core.errors import InputError
from vtc_jax.servers.base import Server
from vtc_jax.servers.ideal import IDEAL, IDEAL_RESERVE
from vtc_jax.servers.slora import SLORA
from vtc_jax.servers.vllm_prefix import VLLM_PREFIX
from vtc_jax.servers.vllm_v1 import VLLM

_REGISTRY: dict[str, Server] = {}


def register(server: Server) -> Server:
    """Add a server under its (new) name."""
    if not isinstance(server, Server):
        raise InputError(f"expected a vtc_jax.servers.base.Server, got {type(server).__name__}")
    if server.name in _REGISTRY and _REGISTRY[server.name] is not server:
        raise InputError(f"a server named {server.name!r} is already registered")
    _REGISTRY[server.name] = server
    return server


def names() -> tuple[str, ...]:
    """Registered server names, the default (`ideal`) first."""
    return tuple(_REGISTRY)


def get(name: str) -> Server:
    """The server called `name` (InputError naming the choices otherwise)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise InputError(f"unknown server {name!r}; choose one of {', '.join(_REGISTRY)}") from None


register(IDEAL)
register(VLLM)
register(IDEAL_RESERVE)
register(VLLM_PREFIX)
register(SLORA)
