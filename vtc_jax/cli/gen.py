"""`python -m vtc_jax gen`: a trace CSV (arrivals in steps) from per-tenant rates, lengths
and patterns (constant, on_off, ramp, silence), Poisson arrivals per step."""

from __future__ import annotations

import argparse
import csv
import io
import re

import numpy as np

from vtc_jax.cli.common import float_arg
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError


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


def command(args) -> int:
    """The gen command: the tenants' phased traffic drawn by the engine's own generator
    (seed --seed), written as a trace CSV sorted by (arrival, client)."""
    from vtc_jax.driver.run import lane_keys
    from vtc_jax.inputs import sources
    from vtc_jax.inputs.traffic import phased
    from vtc_jax.inputs.workload import client_rows

    if args.from_paths:
        return convert(args)
    if not args.tenant:
        raise InputError("give --tenant SPEC (one per tenant), or --from INPUT to convert a log")
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


def _labels(log, labels) -> list[str]:
    """Per request its session_id label ("" for none); with several input files prefixed by
    the file's index, as the readers keep sessions file-local."""
    if labels is None:
        return [""] * len(log)
    many = len(log.sources) > 1
    return ["" if x is None or x == "" else f"{log.file[i]}:{x}" if many else str(x) for i, x in enumerate(labels)]


def _chains(log) -> list[str]:
    """Per request its hash ids joined by '|' (read back with the same --hash-block); with
    several files each (file, id) pair is renumbered densely, as ids are file-local and only
    their equality carries meaning."""
    if log.hash_ids is None:
        return [""] * len(log)
    chains = log.hash_ids
    if len(log.sources) > 1:
        ids: dict = {}
        chains = [[ids.setdefault((int(log.file[i]), h), len(ids)) for h in c] for i, c in enumerate(chains)]
    return ["|".join(map(str, c)) for c in chains]


def convert(args) -> int:
    """gen --from: the reader layer's requests as a trace CSV in steps (arrival,client,
    prompt,output,cached, plus priority,prefix_id,prefix_len,session_id,hash_ids when the
    input has them: its prefix identity kept, hash ids at the input's --hash-block),
    clients numbered as the input's tenants (printed), rows in (arrival, input) order."""
    from vtc_jax.cli import input_flags
    from vtc_jax.inputs import request_log

    if args.tenant:
        raise InputError("--from converts a log; --tenant generates one: give one of them")
    fileio.check_writable_file(args.out)
    log = input_flags.read_input(args, "from")
    trace = log.steps_trace(input_flags.step_seconds_of(args, log))
    extra = [c for c in ("priority", "prefix_id", "prefix_len") if c in log.columns]
    extra += ["session_id"] * (log.session is not None) + ["hash_ids"] * (log.hash_ids is not None)
    order = np.lexsort((np.arange(len(log)), trace.arrival))
    cols = {"priority": log.priority, "prefix_len": log.prefix_len, "prefix_id": [x or "" for x in log.prefix_id],
            "session_id": _labels(log, log.session), "hash_ids": _chains(log)}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")  # a prefix_id holding a comma or quote is quoted, not split
    writer.writerow(["arrival", "client", "prompt", "output", "cached", *extra])
    for i in order:
        row = [trace.arrival[i], trace.client[i], trace.prompt[i], trace.output[i], trace.cached[i]]
        row += [cols[c][i] for c in extra]
        writer.writerow([str(x) for x in row])
    input_flags.announce(args)
    fileio.write_text_atomically(args.out, out.getvalue())
    names = ", ".join(f"{k}={request_log.shown_name(name)}" for k, name in enumerate(log.tenants[:12]))
    names += " ..." if len(log.tenants) > 12 else ""
    print(f"wrote {args.out}: {len(log)} requests from {len(log.tenants)} tenants over {int(trace.arrival.max()) + 1} "
          f"steps" + (f" of {input_flags.step_seconds_of(args, log)} s" if log.timed else "") + f"; clients {names}")
    return 0

