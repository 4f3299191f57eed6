"""`python -m sweeps.NAME`: the command line every sweep module shares (the common flags,
--server and its settings, the workload flags of the MODEL.md sweeps, and `main`: parse,
build the Sweep, run it on the driver (vtc_jax/driver/sweep.py), print its tables and
write its outputs)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable

import jax

from vtc_jax.cli import input_flags
from vtc_jax.cli.common import CheckFailed, Parser, float_arg, guarded, int_arg, list_arg, number_text
from vtc_jax.cli.server_flags import add_server_flags, server_options
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import run
from vtc_jax.driver.devices import DEFAULT_CACHE_DIR, enable_compilation_cache, init_distributed, lane_mesh
from vtc_jax.driver.sweep import MAX_LANES, Sweep, run_sweep, with_server
from vtc_jax.driver.sweep_outputs import format_clients, format_load, format_table, output_names, write_outputs
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs import sources as sources_mod
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers

DEFAULT_SEEDS = 4096
_UNSET = object()  # --kv-budget before parsing: was it given?


def base_parser(name: str, description: str) -> Parser:
    parser = Parser(prog=f"python -m sweeps.{name}", description=description,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int_arg(1, MAX_LANES), default=DEFAULT_SEEDS,
                        help="seeds per setting (default %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("results") / name,
                        help=f"output directory for results.json, results.csv and plots (default results/{name})")
    parser.add_argument("--chunk", type=int_arg(1, MAX_LANES), default=None,
                        help="lanes per compiled call (default: sized from memory)")
    parser.add_argument("--base-seed", type=int_arg(0, 2**31 - 1), default=0, help="base of every lane's random key")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--devices", type=int_arg(1, 4096), default=None, help="use only the first N local devices")
    parser.add_argument("--measures", type=list_arg(str, name="measures"), default=None,
                        help="measures to keep beyond the sweep's own: names from pair_drift, latency, resource, "
                             "ledger, occupancy, demand, share, or all")
    parser.add_argument("--check", action="store_true",
                        help="verify conservation in every lane (keeps the token ledger); exit 1 if violated")
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR),
                        help=f"persistent compilation cache (default {DEFAULT_CACHE_DIR}; env VTC_JAX_CACHE)")
    parser.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")
    parser.add_argument("--coordinator", default=None,
                        help="multi-host: coordinator host:port for jax.distributed (or JAX_COORDINATOR_ADDRESS)")
    parser.add_argument("--num-processes", type=int_arg(1, 4096), default=None, help="multi-host: number of processes")
    parser.add_argument("--process-id", type=int_arg(0, 4095), default=None, help="multi-host: this process's index")
    parser.add_argument("--policy-module", action="append", default=[], metavar="FILE.py",
                        help="load policies defined in your own file (a POLICY or POLICIES attribute) so that "
                             "--policy/--policies accept them")
    add_server_flags(parser)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse, then apply --server (`apply_server`), knowing whether --kv-budget was given
    (argparse leaves a value already in the namespace unless the flag sets it)."""
    budget = next((a for a in parser._actions if a.dest == "kv_budget"), None)
    if budget is None:
        args = parser.parse_args(argv)
    else:
        args = parser.parse_args(argv, namespace=argparse.Namespace(kv_budget=_UNSET))
    given = budget is not None and args.kv_budget is not _UNSET
    if budget is not None and not given:
        args.kv_budget = budget.default
    apply_server(args, has_kv_budget=budget is not None, kv_budget_given=given)
    return args


def apply_server(args, *, has_kv_budget: bool, kv_budget_given: bool) -> None:
    """Sets args.server_options (every row's Settings.server_options; a flag of another
    server is refused). On a server with a memory of its own (vllm) that memory is M
    (args.kv_budget: the 2U bound, the load line), so --kv-budget is refused; a sweep
    without --kv-budget (its grid sets M) maps each M itself."""
    args.server_options = server_options(args)
    if args.server == servers.DEFAULT_SERVER:
        return
    if has_kv_budget:
        servers.get(args.server).validate(dict(args.server_options))
    own = servers.default_memory(args.server, args.server_options)
    if own is None and not servers.flags(args.server):  # no memory of its own (ideal_reserve): --kv-budget is its M
        return
    if kv_budget_given:
        raise InputError(f"--kv-budget is the ideal server's memory; --server {args.server} takes its own"
                         + (" (--num-gpu-blocks x --block-size)" if servers.flags(args.server) else ""))
    if has_kv_budget:
        args.kv_budget = own


def setup_runtime(args) -> None:
    """Compilation cache and (multi-host) distributed runtime, from the common flags."""
    try:
        init_distributed(args.coordinator, args.num_processes, args.process_id)
        enable_compilation_cache(None if args.no_cache else args.cache_dir)
    except OSError as err:
        raise InputError(f"cannot use the compilation cache {args.cache_dir} ({err.strerror or err})") from None
    except (RuntimeError, ValueError) as err:
        raise InputError(f"cannot start the distributed runtime ({err})") from None


def measure_config(sweep: Sweep, args) -> MeasureConfig:
    names = set(sweep.measures) | {"latency"}
    if args.measures:
        names |= set(args.measures)
    if args.check:
        names.add("ledger")
    try:
        return MeasureConfig.of(names)
    except ValueError as err:
        raise InputError(f"--measures: {err}") from None


def _check_measure_names(args) -> None:
    try:
        MeasureConfig.of(set(args.measures or ()))
    except ValueError as err:
        raise InputError(f"--measures: {err}") from None


def main(name: str, description: str, add_arguments: Callable, build: Callable[[argparse.Namespace], Sweep],
         argv=None) -> int:
    """CLI entry of a sweep module: parse, build the Sweep (every flag validated), check
    the output directory, run, print, write the results as one set."""
    return guarded(f"python -m sweeps.{name}", lambda: _main(name, description, add_arguments, build, argv))


def _main(name, description, add_arguments, build, argv) -> int:
    from vtc_jax.driver.policy_modules import preload_policy_modules

    preload_policy_modules(sys.argv[1:] if argv is None else argv)
    parser = base_parser(name, description)
    add_arguments(parser)
    args = parse_args(parser, argv)
    setup_runtime(args)
    # What can be checked without the sweep is checked before `build`, which may run
    # (a timed server's capacity is measured there): bad flags cost no compute.
    _check_measure_names(args)
    if jax.process_index() == 0:
        fileio.check_dir_possible(args.out, ["results.json", "results.csv"])
    try:
        lane_mesh(args.devices)
    except ValueError as err:
        raise InputError(str(err)) from None
    sweep = on_server(build(args), args)
    measures = measure_config(sweep, args)
    if jax.process_index() == 0:
        fileio.check_writable_dir(args.out, output_names(sweep, plots=not args.no_plots))
    for note in list(getattr(args, "notes", [])) + list(sweep.notes):
        print(note, file=sys.stderr)
    input_flags.announce(args)
    result = run_sweep(sweep, args.seeds, base_seed=args.base_seed, chunk=args.chunk, devices=args.devices,
                       measures=measures)
    if jax.process_index() != 0:  # process 0 reports and writes
        return 0
    if args.check:
        bad = sum(r["metrics"].get("conservation_violations", {}).get("max") or 0 for r in result["rows"])
        if bad:
            raise CheckFailed("conservation violated in some lane (an engine defect: please report it)")
        print("check: conservation holds in every lane")
    print(format_table(sweep, result))
    load = format_load(result)
    if load:
        print(load)
    if sweep.clients or (sweep.clients is None and _num_clients(sweep) <= 8):
        tables = format_clients(result)
        if tables:
            print("per client (means over seeds):\n" + tables)
    written = write_outputs(sweep, result, args.out, plots=not args.no_plots)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def on_server(sweep: Sweep, args) -> Sweep:
    """The built sweep on --server: every row runs it, and a non-default server is
    recorded in results.json's config (the default leaves every output as it was)."""
    if args.server == servers.DEFAULT_SERVER:
        return sweep
    config = dict(sweep.config, server=args.server, server_options=dict(args.server_options))
    return dataclasses.replace(with_server(sweep, args.server), config=config)


def _num_clients(sweep: Sweep) -> int:
    src = getattr(sweep.rows[0], "source", None) if sweep.rows else None
    return getattr(src, "num_clients", 0)


# ---- workload flags shared by the MODEL.md sweeps -------------------------------------

def range_arg(text: str) -> tuple[int, int]:
    """A LOW,HIGH token range flag: integers, 1 <= LOW <= HIGH <= 2^22."""
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH integers, got {text[:40]!r}") from None
    if not 1 <= lo <= hi <= 1 << 22:
        raise argparse.ArgumentTypeError(f"expected 1 <= LOW <= HIGH <= {1 << 22}, got {lo},{hi}")
    return lo, hi


DEFAULT_WORKLOAD = {"steps": 6000, "prompt": (64, 512), "output": (32, 384), "kv_budget": 8192, "w_p": "1",
                    "w_q": "2"}


def add_workload_arguments(parser: argparse.ArgumentParser, *, rates: str = "1.0,0.25", kv_budget: bool = True) -> None:
    """Flags of the seed document's overload workload, shared by the sweeps (`kv_budget`
    False: the sweep's grid sets M, so there is no --kv-budget flag)."""
    parser.add_argument("--steps", type=int_arg(1, run.MAX_HORIZON), default=DEFAULT_WORKLOAD["steps"],
                        help="horizon in steps (default %(default)s)")
    parser.add_argument("--rates", type=list_arg(float_arg(0.0, 1e6), name="rates", max_items=4096),
                        default=[float(x) for x in rates.split(",")],
                        help=f"Poisson arrival rates per client, requests per step (default {rates})")
    parser.add_argument("--prompt", type=range_arg, default=DEFAULT_WORKLOAD["prompt"],
                        help="prompt range LOW,HIGH (default 64,512)")
    parser.add_argument("--output", type=range_arg, default=DEFAULT_WORKLOAD["output"],
                        help="output range LOW,HIGH (default 32,384)")
    if kv_budget:
        parser.add_argument("--kv-budget", type=int_arg(1, run.MAX_HORIZON), default=DEFAULT_WORKLOAD["kv_budget"],
                            help="KV budget M in tokens (default %(default)s)")
    parser.add_argument("--w-p", type=number_text, default="1", help="prefill token cost (default %(default)s)")
    parser.add_argument("--w-q", type=number_text, default="2", help="decode token cost (default %(default)s)")
    parser.add_argument("--weights", type=list_arg(number_text, name="weights"), default=None,
                        help="client weights w0,w1,... (default all 1; policies that ignore weights refuse it)")
    parser.add_argument("--trace", type=Path, default=None,
                        help="replay this input (a trace CSV in steps, or any format of --format, timed ones in "
                             "steps of --step-seconds) instead of the synthetic traffic; --steps is then the horizon")
    input_flags.add(parser)
    parser.add_argument("--phase-unit", type=int_arg(1, 1 << 20), default=1,
                        help="with --trace: each seed > 0 redraws every arrival uniformly inside its own block of "
                             "this many steps (default 1: every seed replays the trace as is)")


def workload_is_default(args, rates: str) -> bool:
    """The workload flags are the defaults (the paper's values apply)."""
    return (args.trace is None and args.weights is None and list(args.rates) == [float(x) for x in rates.split(",")]
            and getattr(args, "server", servers.DEFAULT_SERVER) == servers.DEFAULT_SERVER
            and all(getattr(args, k, v) == v for k, v in DEFAULT_WORKLOAD.items()))


def workload_source(args, traffic):
    """The sweep's workload: the synthetic `traffic`, or the user's --trace."""
    if args.trace is None:
        return sources_mod.TrafficSource(traffic)
    log = input_flags.read_input(args, "trace")
    if "priority" in log.columns and bool((log.priority != 0).any()):  # a sweep's rows are per tenant, not per band
        if getattr(args, "scheduling_policy", None) == "priority":
            raise InputError(f"{args.trace}: a sweep does not order requests by the log's priority column: run it "
                             "with compare or replay (--scheduling-policy priority), which do")
        print("note: the log's priority column orders requests only under compare or replay with "
              "--scheduling-policy priority; this sweep serves them by its policies alone", file=sys.stderr)
    trace = input_flags.engine_trace(args, log)
    k = max(trace.num_clients, len(args.weights or ()))
    return sources_mod.TraceSource(trace, num_clients=k, horizon=args.steps, phase_unit=args.phase_unit)


def workload_config(args: argparse.Namespace) -> dict:
    out = {"steps": args.steps, "rates": args.rates, "prompt": list(args.prompt), "output": list(args.output),
           "w_p": str(args.w_p), "w_q": str(args.w_q)}
    if getattr(args, "kv_budget", None) is not None:
        out["kv_budget"] = args.kv_budget
    if args.weights:
        out["weights"] = list(args.weights)
    if args.trace:
        out.update(trace=str(args.trace), phase_unit=args.phase_unit)
    return out


def make_settings(args, policy: str, *, baseline: bool = False, **kwargs) -> Settings:
    """Settings of a sweep row from the workload flags and --server's settings. --weights is
    refused for a policy that does not read them, except for a `baseline` row (FCFS or RPM
    beside weighted policies), which then runs unweighted and says so once on stderr."""
    weights = tuple(args.weights) if args.weights else None
    if weights is not None and "weights" not in registry.get(policy).reads:
        why = registry.get(policy).summary.split(":")[0]
        if not baseline:
            raise InputError(f"--weights: policy {policy} ignores client weights (it orders by {why}); "
                             "drop --weights or choose a weighted policy")
        note = f"note: {policy} ignores --weights (it orders by {why}); it runs unweighted as a baseline"
        notes = vars(args).setdefault("notes", [])  # printed by `main` once every flag is validated
        if note not in notes:
            notes.append(note)
        weights = None
    kwargs.setdefault("server_options", getattr(args, "server_options", ()))
    return Settings(policy, kwargs.pop("kv_budget", getattr(args, "kv_budget", None)), w_p=args.w_p, w_q=args.w_q,
                    weights=weights, **kwargs)
