"""`--server NAME` and the settings of servers other than `ideal`, under the names of the
engines they model (vLLM's engine arguments: `--num-gpu-blocks`, `--max-num-seqs`, ...;
SGLang's server arguments: `--max-total-tokens`, `--max-running-requests`, ...).

A flag given for a server that does not read it is refused (one line naming both), so a
run never silently ignores what a user asked for."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from vtc_jax.cli.common import float_arg, int_arg
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
    group.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                       help="vLLM's AsyncScheduler: the next step is scheduled before this one's outputs are "
                            "processed, so a finish frees its blocks a step late (docs/VLLM_ASYNC.md; with or without "
                            "prefix caching; default off here: vLLM 0.33 turns it on on GPU, off on CPU)")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                       help="share KV blocks of common content (the log's hash_ids, session_id or prefix_id/"
                            "prefix_len) and keep freed blocks cached: runs --server vllm as vllm_prefix (default: on "
                            "when the log carries such content, as vLLM V1)")
    group = parser.add_argument_group("server sglang (SGLang's server arguments; docs/SGLANG.md)")
    group.add_argument("--max-total-tokens", type=int_arg(2, LIMIT), metavar="KV",
                       help="the KV pool in tokens (page size 1; required)")
    group.add_argument("--max-running-requests", type=int_arg(1, LIMIT), metavar="S",
                       help="running requests at most (required; capped at KV // 2, as SGLang does)")
    group.add_argument("--chunked-prefill-size", type=int_arg(-LIMIT, LIMIT), metavar="C",
                       help="prefill tokens of one chunk (default 8192; <= 0: chunking off)")
    group.add_argument("--max-prefill-tokens", type=int_arg(1, LIMIT), metavar="X",
                       help="prefill tokens of one step (default 16384)")
    group.add_argument("--schedule-conservativeness", type=float_arg(0.0, open_min=True), metavar="Y",
                       help="scales the new-token ratio's start (default 1.0; > 0)")
    group.add_argument("--schedule-policy", default=None, metavar="POLICY",
                       help="SGLang's waiting order: fcfs (the default; lpm and SGLang's other policies are "
                            "not modelled yet)")


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




def carries_content(log) -> bool:
    """Whether a request log says which tokens its requests share: block-hash chains
    (hash_ids), sessions (session_id) or prefix groups (a prefix_len above 0)."""
    return (log.hash_ids is not None or log.session is not None
            or bool((np.asarray(log.prefix_len, np.int64) > 0).any()))


def prefix_caching_default(args, log) -> str:
    """vLLM V1 turns prefix caching on by default: a server with a prefix-caching variant
    runs it when the log carries its content and neither --enable-prefix-caching nor
    --no-enable-prefix-caching was given (one note). Sets and returns args.server."""
    if getattr(args, "enable_prefix_caching", None) is None and carries_content(log):
        caching = servers.prefix_caching(args.server, True)
        if caching != args.server:
            print("note: prefix caching on, as in vLLM V1 (the log says which tokens its requests share); "
                  "--no-enable-prefix-caching turns it off", file=sys.stderr)
            args.server = caching
    return args.server


def group_options(prefix_id, prefix_len, tenant, arrival, prompt, output) -> dict:
    """--server sglang's `prefix_blocks` setting: the trace's prefix groups (prefix_id,
    prefix_len per request, trace order), read as the SGLang goldens' traces are
    (testing/sglang_goldens.read_trace_csv): a prefix_id of -1 or blank, or a prefix_len of
    0, is no shared prefix; `arrival`: the engine trace's arrivals (its ORDER)."""
    from vtc_jax.inputs import prefix_blocks
    from vtc_jax.servers.vllm_prefix import prefix_options

    length = np.asarray(prefix_len, np.int64)
    none = [g is None or g in ("", "-1") or n <= 0 for g, n in zip(prefix_id, length.tolist())]
    ident = prefix_blocks.groups([None if x else g for g, x in zip(prefix_id, none)],
                                 np.where(none, 0, length), tenant)
    return prefix_options(arrival, prompt, output, ident)


def content_options(args, log, arrival) -> dict:
    """The server's `prefix_blocks` setting (servers/vllm_prefix.py) from the log's content
    (inputs/prefix_blocks.of_log: chains, else sessions, else groups) when --server reads
    it, else {}; `arrival`: the engine trace's arrivals (its ORDER)."""
    if "prefix_id" not in servers.trace_columns(args.server):
        return {}
    from vtc_jax.inputs import prefix_blocks
    from vtc_jax.servers.vllm_prefix import prefix_options

    return prefix_options(arrival, log.prompt, log.output, prefix_blocks.of_log(log))
