"""`--server NAME` and the settings of servers other than `ideal`, under the names of the
engines they model (vLLM's engine arguments: `--num-gpu-blocks`, `--max-num-seqs`, ...).

A flag given for a server that does not read it is refused (one line naming both), so a
run never silently ignores what a user asked for."""

from __future__ import annotations

import argparse

from vtc_jax.cli.common import int_arg
from vtc_jax.core.errors import InputError
from vtc_jax.servers import registry as servers

# setting -> flag, every server's (servers/registry.py: each declares its own, under the names of the engine it models)
VLLM_FLAGS = SERVER_FLAGS = servers.all_flags()
LIMIT = (1 << 29) - 1


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    names = servers.names()
    parser.add_argument("--server", choices=names, default=servers.DEFAULT_SERVER,
                        help=f"the server every lane runs (default {servers.DEFAULT_SERVER}, MODEL.md's): "
                             + "; ".join(f"{n}: {servers.get(n).description}" for n in names))
    group = parser.add_argument_group("servers vllm, vllm_prefix (vLLM V1's engine arguments)")
    group.add_argument("--num-gpu-blocks", type=int_arg(2, LIMIT), metavar="N", help="KV blocks (the null block included)")
    group.add_argument("--block-size", type=int_arg(1, LIMIT), metavar="B", help="tokens per KV block (default 16)")
    group.add_argument("--max-num-batched-tokens", type=int_arg(1, LIMIT), metavar="T",
                       help="token budget of one step (default 2048)")
    group.add_argument("--max-num-seqs", type=int_arg(1, LIMIT), metavar="S", help="running requests at most (default 256)")
    group.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                       help="split long prefills over steps (default on)")
    group.add_argument("--long-prefill-token-threshold", type=int_arg(0, LIMIT), metavar="L",
                       help="prefill tokens of one request per step when several run or wait (default 0: no cap)")
    group.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default=None,
                       help="vLLM's waiting order: fcfs (default) or priority (the trace's priority column, "
                            "lower first; the --policy orders requests of equal priority)")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                       help="share KV blocks of common prefixes (trace columns prefix_id, prefix_len) and keep "
                            "freed blocks cached: runs --server vllm as vllm_prefix (default off)")


def server_options(args) -> tuple:
    """The server settings the user gave, as ((name, value), ...); a flag of another
    server is refused. `--enable-prefix-caching` runs the engine with prefix caching: it
    turns `--server vllm` into `vllm_prefix` (servers.registry.prefix_caching; args.server
    is set to the server that runs, so every command calls this before it reads
    args.server for the run), and `--no-enable-prefix-caching` turns `vllm_prefix` into
    `vllm`."""
    given = {name: getattr(args, name) for name in SERVER_FLAGS if getattr(args, name, None) is not None}
    own = servers.flags(args.server)
    for name in given:
        if name not in own:
            raise InputError(f"{SERVER_FLAGS[name]} is a setting of --server {', '.join(servers.with_flag(name))} "
                             f"(the run uses --server {args.server})")
    caching = given.pop("enable_prefix_caching", None)
    if caching is not None:
        args.server = servers.prefix_caching(args.server, caching)
    if given.get("scheduling_policy") == "fcfs":
        given.pop("scheduling_policy")
    return tuple(sorted(given.items()))


