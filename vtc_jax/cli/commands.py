"""`python -m vtc_jax COMMAND`: replay a trace, compare policies on your own log, generate a
trace, list the policies.

  replay TRACE.csv --policy P --kv-budget M ...   one policy on one trace, exact numbers
  compare LOG --policies a,b,... --kv-budget M    per tenant and policy: shares, waits, load
  gen --out TRACE.csv --tenant SPEC ...            a trace from per-tenant rates and lengths
  policies                                         the registered policies and their options
  servers                                          the registered servers (--server NAME)

Bad input of any kind ends in one line `vtc_jax: error: ...` on stderr and exit status 2;
Ctrl-C ends in one line and 130; a closed output pipe in one line and 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vtc_jax.cli import compare, gen, input_flags, replay
from vtc_jax.cli.cluster_flags import add_cluster_flags
from vtc_jax.cli.common import EXIT_BAD_INPUT, Parser, float_arg, guarded, int_arg, list_arg
from vtc_jax.cli.input_flags import DEFAULT_STEP_SECONDS
from vtc_jax.cli.scheduler_flags import MAX_CLIENTS, add_policy_module_flag, add_scheduler_flags
from vtc_jax.cli.server_flags import add_server_flags
from vtc_jax.core.errors import InputError
from vtc_jax.driver import policy_modules
from vtc_jax.driver.devices import DEFAULT_CACHE_DIR, enable_compilation_cache
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers
from vtc_jax.servers import roofline, step_time

PROG = "vtc_jax"
__all__ = ["main", "EXIT_BAD_INPUT"]


def _cache_flags(parser) -> None:
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR),
                        help=f"persistent compilation cache (default {DEFAULT_CACHE_DIR}; env VTC_JAX_CACHE)")
    parser.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")


def _share_window(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START,END steps, got {text[:40]!r}") from None
    if not 0 <= a < b <= 1 << 30:
        raise argparse.ArgumentTypeError(f"need 0 <= START < END, got {a},{b}")
    return a, b


def _roofline_flags(parser) -> None:
    """--roofline and its GPU, TP and efficiencies (servers/roofline.py, docs/ROOFLINE.md)."""
    parser.add_argument("--roofline", default=None, metavar="MODEL",
                        help="server vllm: a roofline step-time model of MODEL, a preset (" + ", ".join(
                            roofline.model_presets()) + ") or a Hugging Face config.json, on --gpu")
    parser.add_argument("--gpu", default=None, metavar="NAME|FILE.json",
                        help="--roofline's GPU: " + ", ".join(roofline.gpu_presets()) + " (default H100), or a JSON "
                             "file of peak_flops, hbm_bytes_per_s, memory_bytes")
    parser.add_argument("--tensor-parallel-size", type=int_arg(1, 64), default=None, metavar="N",
                        help="--roofline: GPUs the model is split across (default 1; no communication modelled)")
    parser.add_argument("--roofline-efficiency", default=None, metavar="COMPUTE,MEMORY",
                        help="--roofline: fractions of the peak FLOP/s and bandwidth reached (default 1,1; fit them "
                             "with sweeps.calibrate --server vllm --roofline)")
    parser.add_argument("--gpu-memory-utilization", default=None, metavar="U",
                        help="--roofline: the fraction of GPU memory for weights and KV (default 0.9), which sizes "
                             "num_gpu_blocks")


# ---- the parser -----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Exact fair-queueing simulator for LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    names = registry.names()

    rp = sub.add_parser("replay", help="replay a trace CSV under one scheduler",
                        description="Replay TRACE.csv under one scheduler (header arrival,client,prompt,output"
                                    "[,cached]; with --server vllm arrival,client,prompt,output[,priority][,prefix_id]"
                                    "[,prefix_len], with --server sglang arrival,client,prompt,output[,prefix_id]"
                                    "[,prefix_len], any client labels; arrival in steps).")
    rp.add_argument("trace_paths", nargs="+", metavar="TRACE",
                    help="the input: a trace CSV in steps, or any format of --format (several files: one tenant each "
                         "when the format has no tenant column), timed ones converted with --step-seconds")
    rp.add_argument("--policy", required=True, choices=names, help="scheduler: " + ", ".join(names))
    add_scheduler_flags(rp, kv_budget_required=False)
    add_server_flags(rp)
    rp.add_argument("--schedule-out", metavar="OUT.json",
                    help="servers vllm, vllm_prefix, sglang: write the step-by-step schedule and per-request "
                         "first-token/finish steps in the layout of the real vLLM (SGLang) scheduler's golden logs")
    rp.add_argument("--preset", default=None, help="a server with a step-time model (vllm): a timed replay with "
                    "the preset's step durations (" + ", ".join(step_time.presets()) + "), arrivals from the log's "
                    "timestamps in us")
    rp.add_argument("--step-time", default=None, metavar="FILE.json",
                    help="a timed replay with your own step-time model (keys b0, b1, b2, a0: us; see docs/VLLM.md)")
    _roofline_flags(rp)
    rp.add_argument("--requests-out", default=None, metavar="FILE.csv",
                    help="a timed replay: one row per request (arrival, first token, finish, TTFT, TPOT, E2E in us, "
                         "output, preemptions), as compare writes it")
    rp.add_argument("--clients", type=int_arg(1, MAX_CLIENTS), metavar="K",
                    help="number of clients (default: largest id + 1)")
    rp.add_argument("--steps", type=int_arg(1, (1 << 30) - 1), metavar="T",
                    help="horizon in steps (default: until every request completed)")
    rp.add_argument("--record-every", type=int_arg(1, 1 << 30), default=1000, metavar="N",
                    help="service checkpoint every N steps (default 1000; the last step is always kept)")
    rp.add_argument("--share-window", type=_share_window, default=None, metavar="START,END",
                    help="also report each client's share of the service in steps [START, END)")
    rp.add_argument("--json", metavar="OUT.json", help="write the run's numbers as JSON (the documented keys)")
    rp.add_argument("--details", metavar="OUT.json",
                    help="write the per-client report as JSON: shares, waits, load, backlogged drift")
    rp.add_argument("--check", action="store_true",
                    help="verify conservation (requests and charges) and fail with exit 1 if it does not hold")
    input_flags.add(rp)
    add_cluster_flags(rp, replay=True)
    _cache_flags(rp)

    cp = sub.add_parser("compare", help="compare policies on your own log: per tenant shares, waits, load",
                        description="Run several policies on LOG and print, per tenant and policy: share of "
                                    "service and of demand, admitted/arrived, waiting time p50/p90/p99, the "
                                    "backlogged drift, and the load line. LOG is a trace CSV in steps "
                                    "(arrival,client,prompt,output[,cached]) or a timestamped log "
                                    "(timestamp,tenant,prompt,output: seconds, any tenant names), converted "
                                    "with --step-seconds.")
    cp.add_argument("log_paths", nargs="+", metavar="LOG",
                    help="the input: a trace CSV (steps), a timestamped log (seconds, tenant names), or any format of "
                         "--format; several files are merged on their timestamps (one tenant each when the format "
                         "has no tenant column)")
    cp.add_argument("--policies", type=list_arg(str, name="policies", max_items=64), default=["fcfs", "vtc"],
                    help="comma-separated policies (default fcfs,vtc): " + ", ".join(names))
    add_scheduler_flags(cp, kv_budget_required=False)
    add_server_flags(cp)
    cp.add_argument("--preset", default=None, help="server vllm: a step-time model by name (" + ", ".join(
        step_time.presets()) + "): step durations in us, arrivals from the log's timestamps")
    cp.add_argument("--step-time", default=None, metavar="FILE.json",
                    help="server vllm: your own step-time model (keys b0, b1, b2, a0: us; see docs/VLLM.md)")
    _roofline_flags(cp)
    cp.add_argument("--goodput", nargs="+", default=None, metavar="[TENANT:]NAME:MS",
                    help="a timed server (vllm with a step-time model, slora): SLOs for goodput, vLLM's form (e.g. "
                         "ttft:500 tpot:50; NAME ttft, tpot, e2el), or per tenant (chat:ttft:500 batch:e2el:120000, "
                         "the unnamed ones for every other tenant)")
    cp.add_argument("--requests-out", default=None, metavar="FILE.csv",
                    help="server vllm, or slora on one server: one row per request and policy (arrival, first token, "
                         "finish, TTFT, TPOT, E2E in us, output, preemptions)")
    cp.add_argument("--step-seconds", type=float_arg(1e-6, 3600.0), default=None,
                    help=f"seconds per step for a timestamped log (default {DEFAULT_STEP_SECONDS}: a 25 ms decode "
                         "step; use your engine's mean decode iteration time; --server slora: its own clock, 1 us)")
    cp.add_argument("--steps", type=int_arg(1, (1 << 30) - 1), default=None,
                    help="horizon in steps (default: the last arrival + the sum of outputs, enough to drain)")
    cp.add_argument("--seeds", type=int_arg(1, 1 << 16), default=1,
                    help="seeds: seed 0 replays the log; others redraw each arrival inside its own second "
                         "(timestamped logs) or --phase-unit steps (default 1), never past the log's last arrival")
    cp.add_argument("--phase-unit", type=int_arg(1, 1 << 20), default=None,
                    help="steps inside which --seeds redraws arrivals (default: one second for a timestamped "
                         "log, 1 step for a trace in steps)")
    cp.add_argument("--out", type=Path, default=Path("results") / "compare",
                    help="output directory for results.json, results.csv and plots (default results/compare)")
    cp.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    input_flags.add(cp, step_seconds=False)
    add_cluster_flags(cp)
    _cache_flags(cp)

    gp = sub.add_parser("gen", help="write a trace from per-tenant rates, lengths and patterns",
                        description="Generate a trace CSV (arrivals in steps) from per-tenant specifications, "
                                    "one --tenant each: comma-separated KEY=VALUE with rate=R (requests per step, "
                                    "required), prompt=LO:HI, output=LO:HI (tokens, default 64:512 and 32:384), "
                                    "cached=F (fraction of every prompt cached, default 0), and a pattern: "
                                    "pattern=constant (default), on_off:PERIOD (silent every other PERIOD steps), "
                                    "ramp:END_RATE (rate ramps linearly to END_RATE), or silence:FROM:TO (silent "
                                    "in steps [FROM, TO)); PERIOD, FROM and TO are whole steps (a fraction is "
                                    "refused). Arrivals are Poisson per step.")
    gp.add_argument("--out", required=True, type=Path, help="trace CSV to write")
    gp.add_argument("--from", dest="from_paths", nargs="+", default=None, metavar="INPUT",
                    help="convert this input (any format of --format; several files merge as tenants) to a trace "
                         "CSV in steps of --step-seconds instead of generating one (no --tenant)")
    input_flags.add(gp)
    gp.add_argument("--tenant", action="append", default=[], metavar="SPEC",
                    help="one tenant: rate=R[,prompt=LO:HI][,output=LO:HI][,cached=F][,pattern=constant|on_off:PERIOD|"
                         "ramp:END_RATE|silence:FROM:TO] (PERIOD, FROM, TO: whole steps)")
    gp.add_argument("--steps", type=int_arg(1, 1 << 26), default=6000, help="horizon in steps (default 6000)")
    gp.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0, help="random seed (default 0)")

    pp = sub.add_parser("policies", help="list the registered policies, what they read and their options",
                        description="List the registered policies, and those of every --policy-module file.")
    add_policy_module_flag(pp)
    sub.add_parser("servers", help="list the registered servers (--server NAME)",
                   description="List the registered servers, the default first, and what each models.")
    return parser


def _servers(args) -> int:
    width = max(len(name) for name in servers.names())
    for name in servers.names():
        server = servers.get(name)
        print(f"{name:{width}s} {server.description}" + (" (the default)" if name == servers.names()[0] else ""))
    return 0


def _policies(args) -> int:
    origin = {name: path for path in args.policy_module for name in policy_modules.load_policy_module(path)}
    for name in registry.names():
        p = registry.get(name)
        options = ", ".join(f"{k}={v}" for k, v in p.options.items()) or "none"
        reads = ", ".join(p.reads) or "nothing beyond M and the prices"
        print(f"{name:12s} {p.summary}\n{'':12s} reads: {reads}; options: {options}"
              + ("; estimates outputs (--estimator)" if p.uses_estimator else "")
              + (f"; from {origin[name]}" if name in origin else ""))
    return 0


# ---- entry ------------------------------------------------------------------------------

def _main(argv) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    policy_modules.preload_policy_modules(argv)
    args = build_parser().parse_args(argv)
    for name in ("trace", "log"):  # several input files: named in messages and results by their joined paths
        if hasattr(args, name + "_paths"):
            setattr(args, name, "+".join(getattr(args, name + "_paths")))
    if args.command in ("replay", "compare"):
        try:
            enable_compilation_cache(None if args.no_cache else args.cache_dir)
        except OSError as err:
            raise InputError(f"cannot use the compilation cache {args.cache_dir} ({err.strerror})") from None
    commands = {"replay": replay.command, "compare": compare.command, "gen": gen.command, "policies": _policies,
                "servers": _servers}
    return commands[args.command](args)


def run(argv) -> int:
    """A command's body without main's guard (a caller that guards itself: the sweeps that
    run studies); bad input raises InputError."""
    return _main(argv)


def main(argv=None) -> int:
    return guarded(PROG, lambda: _main(argv))
