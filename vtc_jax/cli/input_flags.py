"""How a command reads its requests: the flags of the one reader layer
(inputs/request_log.py) that `replay`, `compare`, `gen --from` and every sweep's `--trace`
share, and `read_input`, which reads the files through it and prints what it read.

The line it prints (requests, tenants, span, rate) goes to stdout before the run, so that a
refusal later on stays the one line on stderr."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from vtc_jax.cli.common import float_arg, int_arg
from vtc_jax.core.errors import InputError
from vtc_jax.inputs import request_formats, request_log
from vtc_jax.inputs.server_trace import ServerTrace
from vtc_jax.servers import registry as servers

MAX_WINDOW_S = 1e10  # seconds (317 years): a window's bounds stay exact in int64 ns
DEFAULT_STEP_SECONDS = 0.025  # a 25 ms decode step, the steps of a timestamped log by default


def add(parser: argparse.ArgumentParser, *, step_seconds: bool = True) -> None:
    """--format, --time-unit, --tenant-from, --tenants, --split-seed, --time-window, --hash-block and
    (unless the command has its own) --step-seconds; their defaults are DEFAULTS."""
    g = parser.add_argument_group("reading the input (any public format; docs/FORMATS.md)")
    g.add_argument("--format", choices=request_log.FORMATS, default=None,
                   help="the input's format (default: detected from the file): " + ", ".join(request_log.FORMATS))
    g.add_argument("--time-unit", choices=tuple(request_log.TIME_UNITS), default=None,
                   help="unit of the timestamps (default: the format's own: s for log and burstgpt, ms for mooncake); "
                        "a span or rate implausible for the default unit is refused")
    g.add_argument("--tenant-from", default=None, metavar="COLUMN",
                   help="the column (CSV) or field (JSONL) that names each request's tenant, e.g. BurstGPT's Model")
    g.add_argument("--tenants", default=None, metavar="NAME:WEIGHT,...", dest="tenant_split",
                   help="a seeded synthetic split into tenants with these weights (e.g. a:0.6,b:0.3,c:0.1), for a "
                        "trace with no usable tenant column")
    g.add_argument("--split-seed", type=int_arg(0, 2**31 - 1), default=0,
                   help="seed of --tenants' split and of the requests generated from a ServeGen directory (default 0)")
    g.add_argument("--time-window", type=_window, default=None, metavar="START,SECONDS",
                   help="timed input: only the requests that arrive in [START, START + SECONDS) s after its first "
                        "(re-based to 0); a ServeGen directory: the span of its traffic to generate (default its "
                        "first 600 s)")
    g.add_argument("--load-scale", type=float_arg(1e-3, 1e6), default=None, metavar="X",
                   help="offer X times the log's load: every arrival's time since the first divided by X (1.5: "
                        "half as much again; after --time-window)")
    g.add_argument("--hash-block", type=int_arg(1, 1 << 20), default=request_log.rf.BLOCK_TOKENS, metavar="TOKENS",
                   help="tokens per id of the input's hash_ids (Mooncake's JSONL or a CSV's hash_ids column; "
                        f"default {request_log.rf.BLOCK_TOKENS}, Mooncake's)")
    if step_seconds:
        g.add_argument("--step-seconds", type=float_arg(1e-6, 3600.0), default=None,
                       help=f"seconds one step lasts: timed input is converted to steps of it, and a sweep's timed "
                            f"run (--preset) reads --rates and --steps in it (default {DEFAULT_STEP_SECONDS}: a 25 ms "
                            "decode step)")


# `add`'s flags as the reader's defaults, for callers without a command line
DEFAULTS = {"format": None, "time_unit": None, "tenant_from": None, "tenant_split": None, "split_seed": 0,
            "time_window": None, "hash_block": request_log.rf.BLOCK_TOKENS, "load_scale": None}


def _window(text: str) -> tuple[float, float]:
    try:
        start, seconds = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START,SECONDS, got {text[:40]!r}") from None
    if not (np.isfinite(start) and np.isfinite(seconds) and 0 <= start <= MAX_WINDOW_S and 0 < seconds <= MAX_WINDOW_S):
        raise argparse.ArgumentTypeError(f"need 0 <= START <= {MAX_WINDOW_S:.0e} and 0 < SECONDS <= {MAX_WINDOW_S:.0e} "
                                         f"(seconds), got {text[:40]!r}")
    return tuple(int(x) if x.is_integer() else x for x in (start, seconds))  # whole seconds stay exact


def paths_of(args, name: str) -> list[str]:
    """The input path(s) of `args.<name>_paths` (several positional files) or `args.<name>`."""
    value = getattr(args, name + "_paths", None) or getattr(args, name)
    return [str(p) for p in (value if isinstance(value, (list, tuple)) else [value])]


def read_input(args, name: str = "log") -> request_log.RequestLog:
    """The requests of the file(s) in `args.<name>`, read with the input flags."""
    log = request_log.read_requests(paths_of(args, name), format=args.format, time_unit=args.time_unit,
                                    tenant_from=args.tenant_from, tenants=args.tenant_split,
                                    split_seed=args.split_seed, servegen_window=args.time_window,
                                    hash_block=getattr(args, "hash_block", request_log.rf.BLOCK_TOKENS))
    if args.time_window is not None and log.format != "servegen":
        log = request_log.windowed(log, *args.time_window)
    if getattr(args, "load_scale", None) is not None:
        log = request_log.load_scaled(log, args.load_scale)
    args.input_log = log  # announced when the run starts (`announce`), after every flag is checked
    return log


def announce(args) -> None:
    """Print what the command read (the summary line, stdout; a unit warning, stderr), once,
    just before its run: a refusal before then stays the only line."""
    log = getattr(args, "input_log", None)
    if log is None or getattr(args, "input_announced", False):
        return
    args.input_announced = True
    print(log.summary(), flush=True)
    if log.warning:
        print(f"warning: {log.warning}", file=sys.stderr, flush=True)


ENGINE_TRACE_COLUMNS = "arrival,client,prompt,output[,cached]"


def engine_trace(args, log: request_log.RequestLog):
    """The engine's Trace of an input for the servers without settings of their own (ideal,
    slora): a trace in steps takes integer client ids 0..K-1 and the cached column only (the
    priority and prefix columns are the vllm servers'), a timed input is converted with
    --step-seconds."""
    content = sorted(log.columns & set(request_formats.CONTENT_COLUMNS))
    if content:  # content identity (inputs/prefix_blocks.py): no server here has a prefix cache that reads it
        print(f"note: the input's {', '.join(content)} column(s) (prefix identity) are not read by this run",
              file=sys.stderr)
    if log.format == "trace":
        extra = sorted(log.columns - {"cached"} - set(content))
        if extra:
            raise InputError(f"{display_name(log)}: unexpected column {extra[0]!r} (expected {ENGINE_TRACE_COLUMNS}; "
                             "priority and prefix columns are read by --server vllm)")
        bad = [k for k, name in enumerate(log.tenants) if not (name.isascii() and name.lstrip("+").isdigit())]
        if bad:
            i = int(np.flatnonzero(np.isin(log.client, bad))[0])  # the first such row
            raise InputError(f"{log.sources[log.file[i]]}: line {log.lines[i]}: client must be a non-negative "
                             f"integer id, got {log.tenants[log.client[i]][:24]!r}")
    return log.steps_trace(step_seconds_of(args, log))


def display_name(log: request_log.RequestLog) -> str:
    """The input named in messages and results: its file, or its files joined by '+'."""
    return "+".join(log.sources)


def step_seconds_of(args, log: request_log.RequestLog):
    """The step of a timed input, None for a trace in steps (it is in steps already: a
    --step-seconds given is not read)."""
    if not log.timed:
        return None
    return resolved_step_seconds(args)


def resolved_step_seconds(args) -> float:
    """--step-seconds as given, else the server's own clock (slora: 1 us), else 0.025 s."""
    given = getattr(args, "step_seconds", None)
    if given is not None:
        return given
    clock = servers.get(getattr(args, "server", servers.DEFAULT_SERVER)).clock_seconds
    return DEFAULT_STEP_SECONDS if clock is None else clock


def steps_per_second(log: request_log.RequestLog, step_seconds) -> int:
    return 1 if step_seconds is None else max(1, round(1.0 / float(step_seconds)))


def file_rows(log: request_log.RequestLog) -> np.ndarray:
    """int64[N]: each request's data row as read, 0-based (0: the first record after the
    header, blank lines not counted; several files count on in the order given), kept
    through every filter (--time-window, BurstGPT's failed requests, `drop_unservable`): the
    row that `pandas.read_csv(file)` gives the request, the `row` of --requests-out."""
    return np.array(log.rows, np.int64)


def drop_unservable(args, log: request_log.RequestLog, max_prompt: int) -> request_log.RequestLog:
    """The log without its requests whose prompt exceeds `max_prompt` tokens (the server's
    memory: such a request can never be admitted, and a server's API rejects it and serves
    the rest), with one note on stderr naming how many and the limit; each kept request
    keeps its data row (`file_rows`). The summary line `announce` prints, when still to come,
    counts them (`args.input_log` becomes the returned log). InputError (one line) when every
    request would be dropped."""
    kept, dropped = request_log.servable(log, max_prompt)
    if dropped:
        longest = int(log.prompt.max())
        print(f"note: dropped {dropped:,} of {len(log):,} requests whose prompt exceeds the "
              f"server's memory of {int(max_prompt):,} tokens (longest: {longest:,})", file=sys.stderr, flush=True)
    if getattr(args, "input_log", None) is log:
        args.input_log = kept
    return kept


def server_trace(log: request_log.RequestLog, step_seconds) -> ServerTrace:
    """The vllm servers' trace (inputs/server_trace.py) of a log: arrivals in steps, tenants
    renumbered by first appearance in the file's row order (as that reader numbers labels)."""
    trace = log.steps_trace(step_seconds)
    order = np.argsort(file_rows(log), kind="stable")
    first: dict = {}
    for i in order:
        first.setdefault(int(log.client[i]), len(first))
    tenant = np.asarray([first[int(c)] for c in log.client], np.int64)
    names = tuple(log.tenants[c] for c in sorted(first, key=first.get))
    return ServerTrace(tenants=names, tenant=tenant, arrival=np.asarray(trace.arrival, np.int64), prompt=log.prompt,
                       output=log.output, priority=log.priority, prefix_id=tuple(log.prefix_id),
                       prefix_len=log.prefix_len, lines=log.lines, source=display_name(log))
