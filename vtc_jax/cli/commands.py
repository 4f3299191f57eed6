"""`python -m vtc_jax COMMAND`: replay a trace, compare policies on your own log, generate a
trace, list the policies.

  replay TRACE.csv --policy P --kv-budget M ...   one policy on one trace, exact numbers
  compare LOG --policies a,b,... --kv-budget M    per tenant and policy: shares, waits, load
  gen --out TRACE.csv --tenant SPEC ...            a trace from per-tenant rates and lengths
  policies                                         the registered policies and their options

Bad input of any kind ends in one line `vtc_jax: error: ...` on stderr and exit status 2;
Ctrl-C ends in one line and 130; a closed output pipe in one line and 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

import numpy as np

from vtc_jax.cli.common import EXIT_BAD_INPUT, CheckFailed, Parser, float_arg, guarded, int_arg, list_arg, number_text
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import policy_modules
from vtc_jax.driver.devices import DEFAULT_CACHE_DIR, enable_compilation_cache
from vtc_jax.driver.results import load_values, overloaded
from vtc_jax.engines.settings import DEFAULT_RPM_WINDOW, RPM_MODES, Settings
from vtc_jax.inputs.workload import Trace, read_trace_csv
from vtc_jax.measures.online import PAIR_DRIFT_MAX_CLIENTS, MeasureConfig
from vtc_jax.policies import registry
from vtc_jax.policies.estimators import ESTIMATORS

PROG = "vtc_jax"
# Clients are laid out densely (ids 0..K-1): a stray huge id must not allocate K blocks.
MAX_CLIENTS = 100_000
# Service checkpoints kept on device: horizon // record_every * K values at most.
MAX_CHECKPOINT_VALUES = 1 << 26
DEFAULT_STEP_SECONDS = 0.025
__all__ = ["main", "EXIT_BAD_INPUT"]


# ---- flags shared by the commands that run a scheduler --------------------------------

def _option(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text[:40]!r}")
    value = value.strip()
    for parse in (int, float):
        try:
            number = parse(value)
        except ValueError:
            continue
        if isinstance(number, float) and not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"option {name}: value must be finite, got {value!r}")
        return name.strip(), number
    return name.strip(), value


def add_scheduler_flags(parser: argparse.ArgumentParser, *, kv_budget_required: bool = True) -> None:
    parser.add_argument("--kv-budget", required=kv_budget_required, type=int_arg(1, 1 << 30), metavar="M",
                        help="KV budget in tokens")
    parser.add_argument("--w-p", default="1", type=number_text, help="cost of a prefill token (exact, default 1)")
    parser.add_argument("--w-q", default="2", type=number_text, help="cost of a decode token (default 2)")
    parser.add_argument("--beta", default="0", type=number_text, help="decode surcharge per context token (default 0)")
    parser.add_argument("--weights", type=list_arg(number_text, name="weights", max_items=MAX_CLIENTS),
                        help="client weights w0,w1,... (default all 1; refused by policies that ignore weights)")
    parser.add_argument("--rpm", type=int_arg(1, 1 << 30), metavar="R",
                        help="requests per client per window: a limit that composes with any policy (required by "
                             "policy rpm, which is FCFS + this limit)")
    parser.add_argument("--rpm-window", type=int_arg(1, 1 << 30), default=DEFAULT_RPM_WINDOW, metavar="W",
                        help=f"rpm window in steps (default {DEFAULT_RPM_WINDOW})")
    parser.add_argument("--rpm-mode", choices=RPM_MODES, default="delay",
                        help="delay: over-limit requests wait (default); reject: rejected at arrival over a sliding "
                             "window of accepted requests (the VTC artifact's baseline)")
    parser.add_argument("--kv-cap", type=int_arg(1, 1 << 30), metavar="C",
                        help="per-client cap on the KV its running requests can reach (prompt + output)")
    parser.add_argument("--bands", type=list_arg(int_arg(0, 1 << 20), name="bands", max_items=MAX_CLIENTS),
                        help="priority band per client b0,b1,... (0 first; strict priority between bands)")
    parser.add_argument("--estimator", choices=ESTIMATORS, default=None,
                        help="output-length predictor of policies that charge before the output is known "
                             "(default exact)")
    parser.add_argument("--estimate-guess", type=int_arg(1, 1 << 22), default=None,
                        help="--estimator fixed: the guess (default 128)")
    parser.add_argument("--estimate-error", type=number_text, default=None,
                        help="--estimator noisy: relative error r in [0, 1) (default 0)")
    parser.add_argument("--estimate-seed", type=int_arg(0, 2**32 - 1), default=None,
                        help="--estimator noisy: seed of the errors (default 0)")
    parser.add_argument("--no-last-left", action="store_true",
                        help="the VTC artifact's lift variant: no last_left clause (vtc, vtc_predict)")
    parser.add_argument("--option", type=_option, action="append", default=[], metavar="NAME=VALUE",
                        help="a policy option (see `python -m vtc_jax policies`), repeatable")
    add_policy_module_flag(parser)


def add_policy_module_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy-module", action="append", default=[], metavar="FILE.py",
                        help="load policies defined in your own file (a POLICY or POLICIES attribute), repeatable")


def ignored_flags(args, policy: str) -> list[str]:
    """The flags given that `policy` would ignore, each with why (one line each)."""
    spec = registry.get(policy)
    out = []
    if args.weights is not None and "weights" not in spec.reads:
        out.append(f"--weights: policy {policy} ignores client weights ({spec.summary}); "
                   "choose a weighted policy (lcf, vtc, drr, wfq, sfq, las, vtc_predict, vtc_gateway)")
    estimator_flags = [f for f, v in (("--estimator", args.estimator), ("--estimate-guess", args.estimate_guess),
                                      ("--estimate-error", args.estimate_error),
                                      ("--estimate-seed", args.estimate_seed)) if v is not None]
    if estimator_flags and not spec.uses_estimator:
        out.append(f"{estimator_flags[0]}: policy {policy} does not predict outputs (only "
                   f"{', '.join(n for n in registry.names() if registry.get(n).uses_estimator)} do)")
    if args.no_last_left and "lift_last_left" not in spec.reads:
        out.append(f"--no-last-left: policy {policy} has no lift with a last_left clause")
    known = ", ".join(sorted(spec.options))
    for name in dict(args.option):  # one line per option, so a comparison drops only those a policy lacks
        if name not in spec.options:
            out.append(f"--option {name}: policy {policy} " + (f"has no option {name!r} (its options: {known})"
                                                               if known else "has no options"))
    return out


def settings_from_args(args, policy: str, share_window=(0, 0), *, lenient: bool = False) -> Settings:
    """Settings from the scheduler flags. Flags the policy would ignore are refused, or,
    when `lenient` (a comparison of several policies), left out for this policy."""
    ignored = ignored_flags(args, policy)
    if ignored and not lenient:
        raise InputError(ignored[0])
    drop = {line.split(":")[0] for line in ignored}
    if args.rpm_mode != "delay" and args.rpm is None:
        raise InputError("--rpm-mode needs --rpm")
    if args.rpm is None and policy == "rpm":
        raise InputError("policy rpm needs an rpm limit (--rpm R)")
    estimator = {}
    if not drop & {"--estimator", "--estimate-guess", "--estimate-error", "--estimate-seed"}:
        for flag, key in (("estimator", "estimator"), ("estimate_guess", "estimate_guess"),
                          ("estimate_error", "estimate_error"), ("estimate_seed", "estimate_seed")):
            if getattr(args, flag) is not None:
                estimator[key] = getattr(args, flag)
    weights = tuple(args.weights) if args.weights and "--weights" not in drop else None
    return Settings(policy=policy, kv_budget=args.kv_budget, w_p=args.w_p, w_q=args.w_q, beta=args.beta,
                    weights=weights, rpm_limit=args.rpm, rpm_window=args.rpm_window, rpm_mode=args.rpm_mode,
                    kv_cap=args.kv_cap, bands=tuple(args.bands) if args.bands else None,
                    lift_last_left=not (args.no_last_left and "--no-last-left" not in drop),
                    options=tuple((n, v) for n, v in args.option if f"--option {n}" not in drop),
                    share_window=share_window,
                    **estimator)


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


# ---- the parser -----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Exact fair-queueing simulator for LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    names = registry.names()

    rp = sub.add_parser("replay", help="replay a trace CSV under one scheduler",
                        description="Replay TRACE.csv (header arrival,client,prompt,output[,cached]; arrival in "
                                    "steps) under one scheduler.")
    rp.add_argument("trace", help="trace CSV file")
    rp.add_argument("--policy", required=True, choices=names, help="scheduler: " + ", ".join(names))
    add_scheduler_flags(rp)
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
    _cache_flags(rp)

    cp = sub.add_parser("compare", help="compare policies on your own log: per tenant shares, waits, load",
                        description="Run several policies on LOG and print, per tenant and policy: share of "
                                    "service and of demand, admitted/arrived, waiting time p50/p90/p99, the "
                                    "backlogged drift, and the load line. LOG is a trace CSV in steps "
                                    "(arrival,client,prompt,output[,cached]) or a timestamped log "
                                    "(timestamp,tenant,prompt,output: seconds, any tenant names), converted "
                                    "with --step-seconds.")
    cp.add_argument("log", help="trace CSV (steps) or timestamped log (seconds, tenant names)")
    cp.add_argument("--policies", type=list_arg(str, name="policies", max_items=64), default=["fcfs", "vtc"],
                    help="comma-separated policies (default fcfs,vtc): " + ", ".join(names))
    add_scheduler_flags(cp)
    cp.add_argument("--step-seconds", type=float_arg(1e-6, 3600.0), default=DEFAULT_STEP_SECONDS,
                    help=f"seconds per step for a timestamped log (default {DEFAULT_STEP_SECONDS}: a 25 ms decode "
                         "step; use your engine's mean decode iteration time)")
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
    gp.add_argument("--tenant", required=True, action="append", default=[], metavar="SPEC",
                    help="one tenant: rate=R[,prompt=LO:HI][,output=LO:HI][,cached=F][,pattern=constant|on_off:PERIOD|"
                         "ramp:END_RATE|silence:FROM:TO] (PERIOD, FROM, TO: whole steps)")
    gp.add_argument("--steps", type=int_arg(1, 1 << 26), default=6000, help="horizon in steps (default 6000)")
    gp.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0, help="random seed (default 0)")

    pp = sub.add_parser("policies", help="list the registered policies, what they read and their options",
                        description="List the registered policies, and those of every --policy-module file.")
    add_policy_module_flag(pp)
    return parser


# ---- replay ---------------------------------------------------------------------------

def _number(value: Fraction):
    """Exact integers stay integers in JSON; other values are floats."""
    return int(value) if value.denominator == 1 else float(value)


def _plain(value: float):
    """A float that holds an integer as an int (JSON and the summary print it plainly)."""
    return int(value) if float(value).is_integer() else float(value)


def _in_file(source, err: InputError) -> InputError:
    """`err` with the file it is about named in front (once): a row's problem found after
    reading (a prompt larger than M) names its line, and the line alone does not say where."""
    message = str(err)
    return InputError(message if message.startswith(str(source)) else f"{source}: {message}")


def load_for_replay(args) -> tuple[Trace, int]:
    trace = read_trace_csv(args.trace)
    num_clients = args.clients if args.clients is not None else trace.num_clients
    if num_clients > MAX_CLIENTS:
        row = int(trace.client.argmax())
        raise InputError(f"{args.trace}: {trace.where(row)}: client id {num_clients - 1} needs {num_clients} "
                         f"clients (ids are 0..K-1); at most {MAX_CLIENTS} are supported")
    return trace, num_clients


def replay_command(args) -> tuple[dict, dict, object]:
    from vtc_jax.driver.run import drain_horizon, replay

    trace, num_clients = load_for_replay(args)
    window = args.share_window or (0, 0)
    settings = settings_from_args(args, args.policy, window)
    horizon = args.steps or drain_horizon(trace, args.rpm_window if settings.rpm_delays else 0)
    if horizon // args.record_every * num_clients > MAX_CHECKPOINT_VALUES:
        raise InputError(f"--record-every {args.record_every} over up to {horizon} steps keeps more than "
                         f"{MAX_CHECKPOINT_VALUES} checkpoint values for {num_clients} clients; "
                         "use a larger --record-every")
    pairs = ["pair_drift"] if num_clients <= PAIR_DRIFT_MAX_CLIENTS else []
    measures = pairs + ["latency"] + (["share"] if args.share_window else []) + (["ledger"] if args.check else [])
    try:
        result = replay(trace, settings, num_clients=num_clients, steps=args.steps, record_every=args.record_every,
                        measures=MeasureConfig.of(measures))
    except InputError as err:
        raise _in_file(args.trace, err) from None
    if not result.finished[0]:
        raise InputError("the run did not reach its horizon within the event budget (flagged, not reported)")
    if args.check and result.conservation[0]:
        raise CheckFailed("conservation violated: " + "; ".join(result.conservation[0]))
    steps = int(result.steps[0])
    service = result.service_exact[0]
    out = {
        "steps": steps,
        "clients": num_clients,
        "service": [_number(x) for x in service],
        "counters": [_number(x) for x in result.counters_exact[0]],
        "admitted": [int(x) for x in result.admitted[0]],
        "completed": [int(x) for x in result.completed[0]],
        "max_drift": _number(result.max_drift_exact[0]),
        "max_drift_step": int(result.max_drift_step[0]),
        "bound_2u": _plain(result.bound_2u[0]),
        "max_drift_over_2u": float(result.max_drift_over_2u[0]),
        "throughput": float(sum(service) / steps),
        "checkpoints": {"steps": [int(s) for s in result.checkpoint_steps],
                        "service": [[_number(Fraction(v)) for v in row] for row in result.checkpoints[0]]},
    }
    details = client_report(result, 0)
    drift = result.backlogged_drift_exact[0]
    details["backlogged_drift"] = None if drift is None else _number(drift)
    details["bound_2u"] = out["bound_2u"]
    details["backlogged_drift_over_2u"] = None if drift is None else float(drift) / float(result.bound_2u[0])
    if args.share_window:
        details["share_window"] = list(args.share_window)
        details["window_share"] = [None if not np.isfinite(x) else float(x) for x in result.share[0]]
    if not np.all(np.isnan(result.policy_counters[0])):
        details["policy_counters"] = [float(x) for x in result.policy_counters[0]]
    return out, details, result


def client_report(result, lane: int) -> dict:
    """Per-client shares, waits and the load line of one lane (JSON-ready)."""
    def floats(x):
        return [None if not np.isfinite(v) else float(v) for v in np.asarray(x, np.float64)]

    load = {k: float(v[lane]) for k, v in load_values(result).items()}
    return {
        "share_of_service": floats(result.served_share[lane]),
        "share_of_demand": floats(result.offered_share[lane]),
        "arrived": [int(x) for x in result.arrived[lane]],
        "rejected": [int(x) for x in result.rejected[lane]],
        "waiting_at_end": [int(x) for x in result.waiting[lane]],
        "wait_p50": floats(result.latency_percentile("wait", 0.5)[lane]),
        "wait_p90": floats(result.latency_percentile("wait", 0.9)[lane]),
        "wait_p99": floats(result.latency_percentile("wait", 0.99)[lane]),
        "wait_mean": floats(result.wait_mean[lane]),
        "load": {"offered_per_step": load["offered_per_step"], "served_per_step": load["served_per_step"],
                 "offered_over_served": load["offered_over_served"] if math.isfinite(load["offered_over_served"])
                 else None, "waiting_at_span_end": int(load["waiting_at_span_end"]),
                 "waiting_at_end": int(load["waiting_at_end"])},
    }


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) >= 100):
        return f"{int(x)}"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.1f}"


def load_line(load: dict) -> str:
    """The load line of `client_report`'s "load": offered and served over the arrival span,
    and the overload warning where `results.overloaded` says so."""
    ratio = load["offered_over_served"]
    line = (f"load: offered {load['offered_per_step']:.4g} vs served {load['served_per_step']:.4g} weighted "
            f"tokens/step over the arrival span ({load['waiting_at_span_end']} requests queued when the last "
            f"arrived); {load['waiting_at_end']} requests still waiting")
    if overloaded(ratio, load["waiting_at_span_end"]):
        line += (f"\nOVERLOAD: {ratio:.2f}x the served work was offered: queues grow as long as requests arrive, "
                 "so drift and shares describe a backlog, not a steady state")
    return line


def _summary(out: dict, details: dict, policy: str) -> str:
    lines = [f"{policy}: {out['steps']} steps, {out['clients']} clients, "
             f"throughput {out['throughput']:.2f} weighted tokens/step, "
             f"max drift {out['max_drift']} at step {out['max_drift_step']}, "
             "drift while jointly backlogged " + (
                 f"{details['backlogged_drift']} = {details['backlogged_drift_over_2u']:.3g} x VTC's bound "
                 f"2U = {details['bound_2u']}" if details["backlogged_drift"] is not None
                 else f"not measured (over {PAIR_DRIFT_MAX_CLIENTS} clients: it costs K^2 per event; VTC's bound "
                      f"2U = {details['bound_2u']})"),
             f"{'client':>6} {'service':>14} {'counter':>14} {'admitted':>9} {'completed':>9} {'share':>7} "
             f"{'demand':>7} {'wait p50':>9} {'wait p99':>9}"]
    for k in range(out["clients"]):
        lines.append(f"{k:>6} {out['service'][k]:>14} {out['counters'][k]:>14} "
                     f"{out['admitted'][k]:>9} {out['completed'][k]:>9} {_fmt(details['share_of_service'][k]):>7} "
                     f"{_fmt(details['share_of_demand'][k]):>7} {_fmt(details['wait_p50'][k]):>9} "
                     f"{_fmt(details['wait_p99'][k]):>9}")
    lines.append(load_line(details["load"]))
    if "window_share" in details:
        start, end = details["share_window"]
        lines.append(f"share of service in steps [{start}, {end}): "
                     + ", ".join(_fmt(x) for x in details["window_share"]))
    return "\n".join(lines)


def _replay(args) -> int:
    for path in fileio.check_distinct_outputs([args.json, args.details]):
        fileio.check_writable_file(path)
    out, details, _ = replay_command(args)
    files = []
    if args.json:
        files.append((Path(args.json), lambda p: p.write_text(json.dumps(out, indent=1))))
    if args.details:
        files.append((Path(args.details), lambda p: p.write_text(json.dumps(details, indent=1))))
    if files:
        fileio.write_outputs_atomically(files)
    print(_summary(out, details, args.policy))
    if args.check:
        print("check: conservation holds (requests arrived = waiting + running + completed; "
              "service = charges of processed tokens)")
    return 0


# ---- compare: your log, several policies ------------------------------------------------

LOG_COLUMNS = ("timestamp", "tenant", "prompt", "output")


def read_log(path, step_seconds: float) -> tuple[Trace, list[str], int]:
    """A trace CSV in steps, or a timestamped log (timestamp,tenant,prompt,output[,cached];
    seconds, any tenant names) converted to steps: step = floor((t - t0) / step_seconds),
    tenants numbered by first appearance. Returns (trace, tenant names, steps per second)."""
    text = fileio.read_text(path, what="log")
    first_line = next((line for line in text.splitlines() if line.strip()), "")
    header = [h.strip() for h in next(csv.reader([first_line]), [])]
    if "timestamp" not in header:
        trace = read_trace_csv(io.StringIO(text), source=str(path))
        return trace, [str(k) for k in range(trace.num_clients)], 1
    # one table reader for every CSV: an unknown column (a typo such as `cachd`, whose
    # values would silently read as 0) or a repeated one is refused, naming it and the file
    header, records = fileio.csv_table(text, str(path), LOG_COLUMNS, ("cached",))
    rows, lines, names = [], [], {}
    for line_no, cells in records:
        cell = dict(zip(header, cells))
        try:  # exact decimals: 100.05 - 100.0 is 2 steps of 0.025 s, not 1.99999
            t = Decimal(cell["timestamp"]) if len(cell["timestamp"]) <= 40 else Decimal("nan")
        except InvalidOperation:
            raise InputError(f"{path}: line {line_no}: timestamp must be a number of seconds, "
                             f"got {cell['timestamp'][:24]!r}") from None
        if not t.is_finite() or t < 0 or t.adjusted() > 12:
            raise InputError(f"{path}: line {line_no}: timestamp must be a finite number of seconds in "
                             f"[0, 1e13), got {cell['timestamp'][:24]!r}")
        tenant = cell["tenant"]
        if not tenant:
            raise InputError(f"{path}: line {line_no}: empty tenant name")
        if tenant not in names and len(names) >= MAX_CLIENTS:
            raise InputError(f"{path}: line {line_no}: more than {MAX_CLIENTS} tenants")
        names.setdefault(tenant, len(names))
        ints = []
        for col in ("prompt", "output") + (("cached",) if "cached" in header else ()):
            if not re.fullmatch(r"\+?\d{1,10}", cell[col]):
                raise InputError(f"{path}: line {line_no}: {col} must be a non-negative integer, "
                                 f"got {cell[col][:24]!r}")
            ints.append(int(cell[col]))
        rows.append((t, tenant, *ints))
        lines.append(line_no)
    if not rows:
        raise InputError(f"{path}: no requests (header only)")
    # Time order (stable: equal timestamps keep the file's order) and tenants numbered by
    # first appearance in time: the order of the file's rows is no input.
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    rows, lines = [rows[i] for i in order], [lines[i] for i in order]
    names = {}
    for r in rows:
        names.setdefault(r[1], len(names))
    t0, step = rows[0][0], Decimal(repr(step_seconds))
    steps = np.asarray([min(int((r[0] - t0) // step), 1 << 31) for r in rows], np.int64)
    if steps.max() > (1 << 30):
        raise InputError(f"{path}: the log spans {steps.max():,} steps of {step_seconds} s, over the limit of "
                         f"{1 << 30:,}: use a larger --step-seconds")
    cached = [r[4] if len(r) > 4 else 0 for r in rows]
    trace = Trace(steps, np.asarray([names[r[1]] for r in rows]), np.asarray([r[2] for r in rows]),
                  np.asarray([r[3] for r in rows]), np.asarray(cached), lines=np.asarray(lines), source=str(path))
    trace.validate()  # names the file: the trace knows its source
    return trace, list(names), max(1, round(1.0 / step_seconds))


def _compare(args) -> int:
    from vtc_jax.driver import sweep as sweep_mod
    from vtc_jax.driver.run import MAX_HORIZON, drain_horizon
    from vtc_jax.inputs.sources import TraceSource

    for p in args.policies:
        registry.get(p)
    if len(set(args.policies)) != len(args.policies):
        raise InputError("--policies lists a policy twice")
    trace, names, per_second = read_log(args.log, args.step_seconds)
    k = trace.num_clients
    if args.weights and len(args.weights) != k:
        raise InputError(f"--weights gives {len(args.weights)} weights for the log's {k} tenants "
                         f"({', '.join(names[:8])}{'...' if k > 8 else ''})")
    rows = []
    ignored = {p: ignored_flags(args, p) for p in args.policies}
    for line in ignored[args.policies[0]]:  # a flag no listed policy reads is refused
        flag = line.split(":")[0]
        if all(any(x.split(":")[0] == flag for x in ignored[p]) for p in args.policies):
            raise InputError(line if len(args.policies) == 1 else
                             f"{flag}: none of the policies {', '.join(args.policies)} takes it "
                             f"({line.split(': ', 1)[1]})")
    for p, lines in ignored.items():
        for line in lines:
            print(f"note: {line.split(':')[0]} does not apply to {p}; it runs without it", file=sys.stderr)
    settings = [settings_from_args(args, p, lenient=True) for p in args.policies]
    horizon = args.steps or drain_horizon(trace, max((s.rpm_window for s in settings if s.rpm_delays), default=0))
    if horizon > MAX_HORIZON:  # a cut drain bound would leave requests unserved
        raise InputError(f"{args.log}: draining the log needs up to {horizon:,} steps, past the limit of "
                         f"{MAX_HORIZON:,}: give --steps")
    unit = args.phase_unit or per_second
    source = TraceSource(trace, num_clients=k, horizon=horizon, phase_unit=unit, drain=args.steps is None)
    for s in settings:
        try:
            sweep_mod.run.validate_fits(trace, s, k, source.horizon, False)
        except InputError as err:
            raise _in_file(args.log, err) from None
        rows.append(sweep_mod.Row(s, source, s.policy))
    enable_compilation_cache(None if args.no_cache else args.cache_dir)
    plots = (sweep_mod.Plot("metric", "backlogged_drift.png", "drift while jointly backlogged, per policy",
                            "policy", "backlogged_drift"),)
    sweep = sweep_mod.Sweep(name="compare", config={"log": str(args.log), "tenants": names,
                                                      "step_seconds": args.step_seconds, "horizon": source.horizon,
                                                      "phase_unit": unit, "policies": args.policies},
                            rows=rows, metrics=sweep_mod.base_metrics,
                            measures=("pair_drift",) if k <= PAIR_DRIFT_MAX_CLIENTS else (),
                            columns=("backlogged_drift", "bound_2u", "backlogged_drift_over_2u", "max_drift",
                                     "throughput"), plots=plots, clients=True)
    draw = not args.no_plots
    fileio.check_writable_dir(args.out, sweep_mod.output_names(sweep, plots=draw) + ["tenants.png"] * draw)
    result = sweep_mod.run_sweep(sweep, args.seeds)
    print(sweep_mod.format_table(sweep, result))
    print(sweep_mod.format_load(result))
    print("per tenant (means over seeds; waits in steps"
          + (f", x {args.step_seconds} s" if per_second > 1 else "") + "):")
    print(sweep_mod.format_clients(result, names))
    # results, plots and tenants.png as ONE set: a full disk or a Ctrl-C leaves the previous
    # results, never results without plots
    tenants = [(args.out / "tenants.png", lambda path: sweep_mod.draw_tenants(result, names, path))] * draw
    written = sweep_mod.write_outputs(sweep, result, args.out, plots=draw, extra=tenants)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def parse_tenant(text: str, horizon: int) -> dict:
    spec = {"prompt": (64, 512), "output": (32, 384), "cached": 0.0, "pattern": ("constant",)}
    seen = set()
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in ("rate", "prompt", "output", "cached", "pattern"):
            raise InputError(f"--tenant {text[:60]!r}: expected KEY=VALUE with KEY rate, prompt, output, cached or "
                             f"pattern, got {part[:30]!r}")
        if key in seen:
            raise InputError(f"--tenant {text[:60]!r}: {key} given twice")
        seen.add(key)
        try:
            if key == "rate":
                spec["rate"] = float_arg(0.0, 1e4)(value)
            elif key in ("prompt", "output"):
                lo, hi = (int(x) for x in value.split(":"))
                if not 1 <= lo <= hi <= 1 << 22:
                    raise ValueError
                spec[key] = (lo, hi)
            elif key == "cached":
                spec["cached"] = float_arg(0.0, 0.999)(value)
            else:
                spec["pattern"] = _pattern(value)
        except InputError:
            raise
        except (ValueError, argparse.ArgumentTypeError):
            raise InputError(f"--tenant {text[:60]!r}: bad {key} {value[:30]!r}") from None
    if "rate" not in spec:
        raise InputError(f"--tenant {text[:60]!r}: rate=R (requests per step) is required")
    kind, *nums = spec["pattern"]
    if kind == "on_off" and not 1 <= nums[0] < horizon:
        raise InputError(f"--tenant: on_off period must be in [1, --steps), got {nums[0]}")
    if kind == "ramp" and not 0 <= nums[0] <= 1e4:
        raise InputError(f"--tenant: ramp end rate must be in [0, 1e4], got {nums[0]:g}")
    if kind == "silence" and not 0 <= nums[0] < nums[1] <= horizon:
        raise InputError(f"--tenant: silence needs 0 <= FROM < TO <= --steps, got {nums[0]}:{nums[1]}")
    return spec


def _pattern(value: str) -> tuple:
    """A --tenant pattern: ("constant",), ("on_off", PERIOD), ("ramp", END_RATE) or
    ("silence", FROM, TO). PERIOD, FROM and TO are steps: whole numbers (a fraction such
    as 10.5 has no step to fall on, and was once silently truncated or ignored); END_RATE
    is any rate. ValueError when malformed."""
    kind, *rest = value.split(":")
    if (kind, len(rest)) not in (("constant", 0), ("on_off", 1), ("ramp", 1), ("silence", 2)):
        raise ValueError(value)
    if kind == "ramp":
        return kind, float(rest[0])
    for x in rest:
        if not re.fullmatch(r"\s*\+?\d{1,9}\s*", x):
            raise InputError(f"--tenant pattern {value[:30]!r}: {kind} takes whole steps, got {x.strip()[:20]!r}")
    return (kind, *(int(x) for x in rest))


def tenant_phases(specs, horizon: int) -> list:
    """Phases (start, end, start rates, end rates) that realise every tenant's pattern."""
    cuts = {0, horizon}
    for s in specs:
        kind, *nums = s["pattern"]
        if kind == "on_off":
            cuts |= set(range(0, horizon, nums[0]))
        elif kind == "silence":
            cuts |= {nums[0], nums[1]}
    cuts = sorted(c for c in cuts if 0 <= c <= horizon)
    if len(cuts) > 4097:
        raise InputError(f"the patterns need {len(cuts) - 1} phases, over the limit of 4096: use longer periods")
    phases = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        start, end = [], []
        for s in specs:
            kind, *nums = s["pattern"]
            r = s["rate"]
            if kind == "on_off":
                on = (a // nums[0]) % 2 == 0
                start.append(r if on else 0.0)
                end.append(r if on else 0.0)
            elif kind == "silence":
                off = nums[0] <= a < nums[1]
                start.append(0.0 if off else r)
                end.append(0.0 if off else r)
            elif kind == "ramp":
                start.append(r + (nums[0] - r) * a / horizon)
                end.append(r + (nums[0] - r) * b / horizon)
            else:
                start.append(r)
                end.append(r)
        phases.append((a, b, start, end))
    return phases


def _gen(args) -> int:
    from vtc_jax.driver.run import lane_keys
    from vtc_jax.inputs import sources
    from vtc_jax.inputs.traffic import phased
    from vtc_jax.inputs.workload import client_rows

    specs = [parse_tenant(t, args.steps) for t in args.tenant]
    if len(specs) > 4096:
        raise InputError(f"{len(specs)} tenants, over the limit of 4096")
    fileio.check_writable_file(args.out)
    traffic = phased(tenant_phases(specs, args.steps), prompt=[s["prompt"] for s in specs],
                     output=[s["output"] for s in specs], cached_fraction=[s["cached"] for s in specs])
    expected = traffic.expected_requests().sum()
    if expected > 5_000_000:
        raise InputError(f"the trace would hold about {expected:,.0f} requests, over the limit of 5,000,000")
    src = sources.TrafficSource(traffic)
    lay = sources.layout([src], 5)
    wl = sources.generate_lanes(lane_keys([args.seed]), sources.stack([src]), kind="traffic", horizon=args.steps,
                                lay=lay, pad=5, num_clients=len(specs))
    if bool(np.asarray(wl.overflow)[0]):
        raise InputError("a tenant's arrivals overflowed its block (extremely unlikely): try another --seed")
    rows = client_rows(wl)[0]  # [K, N, 5]
    out = []
    for k in range(len(specs)):
        real = rows[k][rows[k][:, 0] < args.steps]
        out += [(int(r[0]), k, int(r[2]), int(r[3]), int(r[4])) for r in real]
    out.sort(key=lambda r: (r[0], r[1]))
    text = "arrival,client,prompt,output,cached\n" + "".join(f"{a},{c},{p},{o},{h}\n" for a, c, p, o, h in out)
    fileio.write_text_atomically(args.out, text)
    print(f"wrote {args.out}: {len(out)} requests from {len(specs)} tenants over {args.steps} steps "
          f"(expected {expected:.0f})")
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
    if args.command in ("replay", "compare"):
        try:
            enable_compilation_cache(None if args.no_cache else args.cache_dir)
        except OSError as err:
            raise InputError(f"cannot use the compilation cache {args.cache_dir} ({err.strerror})") from None
    return {"replay": _replay, "compare": _compare, "gen": _gen, "policies": _policies}[args.command](args)


def main(argv=None) -> int:
    return guarded(PROG, lambda: _main(argv))
