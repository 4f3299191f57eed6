"""The flags of the commands that run a scheduler (replay, compare) and the Settings they
give: a flag the chosen policy would ignore is refused, never silently dropped."""

from __future__ import annotations

import argparse
import dataclasses
import math

from vtc_jax.cli.common import int_arg, list_arg, number_text
from vtc_jax.core.errors import InputError
from vtc_jax.engines.settings import DEFAULT_RPM_WINDOW, RPM_MODES, Settings
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers
from vtc_jax.policies.estimators import ESTIMATORS

# Clients are laid out densely (ids 0..K-1): a stray huge id must not allocate K blocks.
MAX_CLIENTS = 100_000


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


COSTS = ("tokens", "time")
PRICE_DEFAULTS = {"w_p": "1", "w_q": "2", "beta": "0"}


def cost_settings(args, policy: str) -> dict:
    """Settings' prices for --cost: the token prices as given, or under `time` w_time = 1
    (one unit per us of a tenant's share of each step) and no token prices. InputError
    for token prices given with --cost time and for a policy that prices requests by their
    tokens (its `reads` has "prices")."""
    if getattr(args, "cost", "tokens") != "time":
        return dict(w_p=args.w_p, w_q=args.w_q, beta=args.beta)
    given = [f"--{k.replace('_', '-')}" for k, v in PRICE_DEFAULTS.items() if str(getattr(args, k)) != v]
    if given:
        raise InputError(f"{given[0]}: --cost time charges GPU time, not tokens: leave the token prices out")
    if "prices" in registry.get(policy).reads:
        able = ", ".join(n for n in registry.names() if "prices" not in registry.get(n).reads)
        raise InputError(f"--cost time: policy {policy} prices each request by its tokens apart from the steps that "
                         f"run it (GPU time is known only as they run): choose one of {able}")
    return dict(w_p=0, w_q=0, beta=0, w_time=1)


def with_time_shares(settings: Settings, server: str) -> Settings:
    """`settings` asking a timed vllm server to keep each request's share of each step's
    time (step_time.slot_shares: the report's GPU time per tenant, and what --cost time
    charges); InputError where a lane charges GPU time (w_time > 0) on a server that keeps
    no step-time model."""
    options = dict(settings.server_options)
    if not settings.w_time:
        if servers.takes_step_time(server) and servers.keeps_time(server, options):
            return dataclasses.replace(settings, server_options=tuple(sorted({**options, "time_shares": True}.items())))
        return settings
    if not servers.takes_step_time(server):
        raise InputError(f"--cost time needs a timed vllm server (--server vllm with --preset, --step-time or "
                         f"--roofline), not --server {server}")
    if not servers.keeps_time(server, options):
        raise InputError("--cost time needs a step-time model: give --preset, --step-time or --roofline")
    return dataclasses.replace(settings, server_options=tuple(sorted({**options, "time_shares": True}.items())))


def add_scheduler_flags(parser: argparse.ArgumentParser, *, kv_budget_required: bool = True) -> None:
    parser.add_argument("--kv-budget", required=kv_budget_required, type=int_arg(1, 1 << 30), metavar="M",
                        help="KV budget in tokens")
    parser.add_argument("--w-p", default="1", type=number_text, help="cost of a prefill token (exact, default 1)")
    parser.add_argument("--w-q", default="2", type=number_text, help="cost of a decode token (default 2)")
    parser.add_argument("--beta", default="0", type=number_text, help="decode surcharge per context token (default 0)")
    parser.add_argument("--cost", choices=COSTS, default="tokens",
                        help="what service costs: tokens (w_p per prompt token at admission, w_q + beta x context per "
                             "decode token; default) or time: each step charges each tenant its share of the step's "
                             "GPU time in us under the step-time model (a timed vllm server; docs/TIMED.md)")
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
    parser.add_argument("--charge-prefill", choices=("computed", "sent"), default="computed",
                        help="what a fairness counter charges for a prompt at admission: computed (default: the "
                             "tokens the server prefills, less its prefix-cache hits or the log's cached column) "
                             "or sent (every prompt token, the VTC paper's accounting); a recomputation after a "
                             "preemption is never charged (docs/VLLM.md)")
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
    return Settings(policy=policy, kv_budget=args.kv_budget, **cost_settings(args, policy),
                    weights=weights, rpm_limit=args.rpm, rpm_window=args.rpm_window, rpm_mode=args.rpm_mode,
                    kv_cap=args.kv_cap, bands=tuple(args.bands) if args.bands else None,
                    lift_last_left=not (args.no_last_left and "--no-last-left" not in drop),
                    options=tuple((n, v) for n, v in args.option if f"--option {n}" not in drop),
                    share_window=share_window, charge_cached=getattr(args, "charge_prefill", "computed") == "sent",
                    **estimator)

