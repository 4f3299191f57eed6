"""`python -m vtc_jax replay TRACE.csv ...`: replay a trace under one policy.

Bad input of any kind ends in one line `vtc_jax: error: ...` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from fractions import Fraction

from vtc_jax.devices import DEFAULT_CACHE_DIR, enable_compilation_cache
from vtc_jax.run import drain_horizon, replay
from vtc_jax.settings import DEFAULT_RPM_WINDOW, POLICIES, InputError, Settings
from vtc_jax.workload import read_trace_csv

EXIT_BAD_INPUT = 2
# Clients are laid out densely (ids 0..K-1): a stray huge id must not allocate K streams.
MAX_CLIENTS = 100_000
# Service checkpoints kept on device: horizon // record_every * K int32 values at most.
MAX_CHECKPOINT_VALUES = 1 << 26


class ConservationError(RuntimeError):
    """--check found a conservation law violated (an engine bug, never bad input): exit 1."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (no usage block) and exit 2."""

    def error(self, message):
        raise InputError(message)


def _number_text(text: str) -> str:
    """An exact number as typed (settings.to_fraction parses it). Refuses texts whose exact
    value would take long to build or print: a usable cost or weight fits int32 units, so
    64 characters and a 2-digit exponent always suffice."""
    exponent = re.search(r"[eE][+-]?0*(\d*)$", text.strip())
    if len(text) > 64 or (exponent and len(exponent.group(1)) > 2):
        shown = text if len(text) <= 24 else text[:24] + "..."
        raise argparse.ArgumentTypeError(f"number too long or exponent out of range, got {shown!r}")
    return text


def _weights(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(","))
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"weights must be comma-separated numbers, got {text!r}")
    return tuple(_number_text(p) for p in parts)


def _int_arg(minimum: int, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vtc_jax", description="Exact fair-queueing simulator for LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    rp = sub.add_parser("replay", help="replay a trace CSV under one scheduler",
                        description="Replay TRACE.csv (header arrival,client,prompt,output[,cached]; "
                                    "arrival in steps) under one scheduler of MODEL.md.")
    rp.add_argument("trace", help="trace CSV file")
    rp.add_argument("--policy", required=True, choices=POLICIES, help="scheduler")
    rp.add_argument("--kv-budget", required=True, type=_int_arg(1), metavar="M", help="KV budget in tokens")
    rp.add_argument("--w-p", default="1", type=_number_text,
                    help="cost of a prefill token (exact decimal, default 1)")
    rp.add_argument("--w-q", default="2", type=_number_text,
                    help="cost of a decode token (default 2)")
    rp.add_argument("--beta", default="0", type=_number_text,
                    help="decode surcharge per context token (default 0)")
    rp.add_argument("--weights", type=_weights, help="client weights w0,w1,... (default all 1)")
    rp.add_argument("--rpm", type=_int_arg(1), metavar="R", help="admissions per client per window (policy rpm)")
    rp.add_argument("--rpm-window", type=_int_arg(1), default=DEFAULT_RPM_WINDOW, metavar="W",
                    help=f"rpm window in steps (default {DEFAULT_RPM_WINDOW})")
    rp.add_argument("--clients", type=_int_arg(1, MAX_CLIENTS), metavar="K",
                    help="number of clients (default: largest id + 1)")
    rp.add_argument("--steps", type=_int_arg(1), metavar="T",
                    help="horizon in steps (default: until every request completed)")
    rp.add_argument("--record-every", type=_int_arg(1), default=1000, metavar="N",
                    help="service checkpoint every N steps (default 1000; the last step is always kept)")
    rp.add_argument("--json", metavar="OUT.json", help="write the results as JSON")
    rp.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR),
                    help=f"persistent compilation cache (default {DEFAULT_CACHE_DIR}; env VTC_JAX_CACHE)")
    rp.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")
    rp.add_argument("--check", action="store_true",
                    help="verify conservation (requests and charges) and fail with exit 1 if it does not hold")
    return parser


def _number(value: Fraction):
    """Exact integers stay integers in JSON; other values are floats."""
    return int(value) if value.denominator == 1 else float(value)


def replay_command(args) -> dict:
    trace = read_trace_csv(args.trace)
    settings = Settings(policy=args.policy, kv_budget=args.kv_budget, w_p=args.w_p, w_q=args.w_q,
                        beta=args.beta, weights=args.weights, rpm_limit=args.rpm,
                        rpm_window=args.rpm_window)
    num_clients = args.clients if args.clients is not None else trace.num_clients
    if num_clients > MAX_CLIENTS:
        line = int(trace.client.argmax()) + 2  # data row r is file line r + 1
        raise InputError(f"{args.trace}: line {line}: client id {num_clients - 1} needs {num_clients} clients "
                         f"(ids are 0..K-1); at most {MAX_CLIENTS} are supported")
    horizon = args.steps or drain_horizon(trace, args.rpm_window if args.policy == "rpm" else 0)
    if horizon // args.record_every * num_clients > MAX_CHECKPOINT_VALUES:
        raise InputError(f"--record-every {args.record_every} over up to {horizon} steps keeps more than "
                         f"{MAX_CHECKPOINT_VALUES} checkpoint values for {num_clients} clients; "
                         "use a larger --record-every")
    try:
        result = replay(trace, settings, num_clients=num_clients, steps=args.steps,
                        record_every=args.record_every)
    except InputError as err:
        # The trace checks name data row r; the CSV reader names file line r + 1.
        match = re.match(r"row (\d+): (.*)", str(err), re.S)
        if match:
            raise InputError(f"{args.trace}: line {int(match.group(1)) + 1}: {match.group(2)}") from None
        raise
    if not result.finished[0]:
        raise InputError("the run did not reach its horizon within the event budget (flagged, not reported)")
    if args.check and result.conservation[0]:
        raise ConservationError("; ".join(result.conservation[0]))
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
        "throughput": float(sum(service) / steps),
        "checkpoints": {"steps": [int(s) for s in result.checkpoint_steps],
                        "service": [[_number(Fraction(v)) for v in row] for row in result.checkpoints[0]]},
    }
    return out


def _summary(out: dict, policy: str) -> str:
    lines = [f"{policy}: {out['steps']} steps, {out['clients']} clients, "
             f"throughput {out['throughput']:.2f} weighted tokens/step, "
             f"max drift {out['max_drift']} at step {out['max_drift_step']}",
             f"{'client':>6} {'service':>14} {'counter':>14} {'admitted':>9} {'completed':>9}"]
    for k in range(out["clients"]):
        lines.append(f"{k:>6} {out['service'][k]:>14} {out['counters'][k]:>14} "
                     f"{out['admitted'][k]:>9} {out['completed'][k]:>9}")
    return "\n".join(lines)


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        try:
            enable_compilation_cache(None if args.no_cache else args.cache_dir)
        except OSError as err:
            raise InputError(f"cannot use the compilation cache {args.cache_dir} ({err.strerror})") from None
        out = replay_command(args)
        if args.json:
            try:
                with open(args.json, "w") as fh:
                    json.dump(out, fh, indent=1)
            except OSError as err:
                raise InputError(f"cannot write {args.json} ({err.strerror})") from None
    except InputError as err:
        message = str(err).replace("\r", "\\r").replace("\n", "\\n")  # always one line
        print(f"vtc_jax: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ConservationError as err:
        print(f"vtc_jax: error: conservation violated: {err}", file=sys.stderr)
        return 1
    print(_summary(out, args.policy))
    if args.check:
        print("check: conservation holds (requests arrived = waiting + running + completed; "
              "service = charges of processed tokens)")
    return 0
