"""The worst case: an adversarial search for arrival patterns that maximise the drift
between jointly backlogged clients (the quantity of the VTC paper's 2U bound), per policy,
KV budget M and client count K (vtc_jax/driver/adversary.py: parametrisation, objective, search).

For each setting it reports the worst backlogged drift found, the paper's bound 2U
(U = max(w_p * L_input, w_q * M), L_input the witness's largest prompt; for policies other
than vtc it is VTC's formula, shown for comparison), the lower bound w_q * M that some
arrival pattern forces on any work-conserving non-preemptive schedule, their ratio, the
candidates evaluated, and the witness: a trace CSV in OUT/witnesses/ that

    python -m vtc_jax replay OUT/witnesses/W.csv --policy P --kv-budget M --w-p .. --w-q ..
        --steps T --details out.json

reproduces to the integer (a JSON beside it holds its settings and drift). Every witness
is replayed through the public replay path before anything is written. A VTC witness
above 2U is reported as a counterexample (stderr, results.json "counterexample").

Every search is seeded with one hand-made candidate, the blocked-decode construction
(adversary.blocked_decode; --no-construction searches blind); its drift is reported as
construction_drift, and the best of the random generation 0 as random_best.

It also searches FCFS and LCF (and, for contrast, VTC and the VTC artifact's lift without
MODEL.md's `last_left` clause, "vtc-artifact") over a grid of horizons, requests per client
growing with the horizon (N = 16 T / 256 by default), to show how the worst case grows.

--server NAME runs every candidate on that server (vtc_jax/servers): `ideal` (the default,
MODEL.md's: memory bounds admission only, running requests grow past M), `ideal_reserve`
(admission reserves prompt + output within M: the VTC theorem's assumption) or `vllm`
(vLLM V1's scheduler, with vLLM's engine arguments as on every sweep: --block-size,
--max-num-batched-tokens, --max-num-seqs, ..., and a KV pool of M tokens: num_gpu_blocks =
M // block_size + 1, or --num-gpu-blocks N for M = (N - 1) x block_size). On the bounded servers every
candidate request must fit M alone (the largest prompt + output), or the search is refused.
The witnesses' JSON then name the server and its settings, and their replay command too.

Before any search, each one's memory is checked against what the machine has (the whole
population runs as engine lanes of one call; `search_bytes`), and a search that would not
fit is refused, naming the flags that shrink it. With --w-q 0 the lower bound w_q * M is 0
and its ratio is reported as n/a (None); --w-p 0 with --w-q 0 is refused (2U = 0).

Outputs (written together, atomically): results.json, results.csv, witnesses/*.csv and
*.json, progress.png (best ratio to 2U per generation) and horizon.png.

Default run (about 8 minutes on a 2-core CPU: 18 searches of 81,920 candidates): 9
policies (every registered one but rpm) at K = 2, M = 256, T = 256, N = 16 requests per
client, prompts 8..256, outputs 1..64, w_p = 1, w_q = 2; population 2048 in 4 islands,
40 generations; horizon grid 64, 256, 1024 (N = T / 16) for fcfs, lcf, vtc and
vtc-artifact.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
import zlib
from fractions import Fraction
from pathlib import Path

import jax
import numpy as np

from vtc_jax.cli import server_flags
from vtc_jax.cli.common import CheckFailed, Parser, float_arg, guarded, int_arg, list_arg, number_text
from vtc_jax.cli.server_flags import add_server_flags
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import adversary, devices
from vtc_jax.driver.sweep import MODEL_ENGINE
from vtc_jax.engines.settings import Settings
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers

PROG = "python -m sweeps.adversary"
SKIPPED_POLICIES = ("rpm",)  # needs an rpm limit: not a scheduler of its own to attack
# MODEL.md's named variant: the VTC artifact's lift, without the `last_left` clause.
VARIANTS = {"vtc-artifact": ("vtc", {"lift_last_left": False})}
GROWTH_POLICIES = ("fcfs", "lcf", "vtc", "vtc-artifact")
DEFAULT_GRID = (64, 256, 1024)
MAX_GENERATION_REQUESTS = 1 << 26  # population x K x N: about 5 GiB of genes and noise per generation
# A generation's host arrays per request of a candidate (genes, ES noise, mutation
# temporaries, decoded values, the engine layout); measured peaks are 170-390 bytes
# beside the engine lanes, so this and MODEL_ENGINE.lane_bytes (x2 for XLA's buffers)
# make an estimate about twice what a search holds (K = 2, N = 16 and 64).
HOST_BYTES_PER_REQUEST = 256
VLLM_SERVERS = servers.with_flag("num_gpu_blocks")  # the servers whose settings are vLLM's engine arguments
VLLM_DEFAULTS = {"block_size": 16, "max_num_batched_tokens": 2048, "max_num_seqs": 256}  # vLLM's own
SERVER_HELP = ("the server every candidate runs on (default ideal, MODEL.md's: memory bounds admission only); "
               "ideal_reserve: admission reserves prompt + output within M (the VTC theorem's assumption); vllm: "
               "vLLM V1's scheduler with a KV pool of num_gpu_blocks = M // block_size + 1 blocks (the null block "
               "holds none: M tokens of KV; M must be a multiple of --block-size), or --num-gpu-blocks N for "
               "M = (N - 1) x block_size")
FLAGS_FOR_MEMORY = "lower --population or --requests (or give fewer --clients, smaller --horizon-grid horizons)"


def _pair(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError
    lo, hi = (int_arg(1, 1 << 26)(p) for p in parts)
    if lo > hi:
        raise ValueError
    return lo, hi


def pair_arg(text: str) -> tuple[int, int]:
    """argparse type: LOW,HIGH integers, 1 <= LOW <= HIGH."""
    try:
        return _pair(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH integers with 1 <= LOW <= HIGH, got {text[:40]!r}") \
            from None


def grid_arg(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated horizons, or 'none'."""
    if text.strip().lower() == "none":
        return ()
    return tuple(list_arg(int_arg(8, 1 << 16), name="horizons", max_items=16)(text))


def build_parser() -> Parser:
    policies = [p for p in registry.names() if p not in SKIPPED_POLICIES]
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results") / "adversary",
                        help="output directory (default results/adversary)")
    parser.add_argument("--policy", type=list_arg(str, name="policies", max_items=64), default=policies,
                        help=f"policies to attack (default: {','.join(policies)}; also vtc-artifact)")
    parser.add_argument("--kv-budget", type=list_arg(int_arg(1, 1 << 20), name="KV budgets", max_items=16),
                        default=None, help="KV budgets M (default 256; on --server vllm --num-gpu-blocks N sets "
                                           "M = (N - 1) x block_size)")
    parser.add_argument("--clients", type=list_arg(int_arg(2, adversary.MAX_CLIENTS), name="client counts",
                                                   max_items=3), default=[2], help="client counts K, 2..4 (default 2)")
    parser.add_argument("--generations", type=int_arg(1, 1 << 16), default=40, help="generations (default 40)")
    parser.add_argument("--population", type=int_arg(3, 1 << 22), default=2048,
                        help="candidates per generation, one engine call (default 2048)")
    parser.add_argument("--restarts", type=int_arg(1, 1024), default=4,
                        help="islands: independent ES streams, each restarted from random when it stalls (default 4)")
    parser.add_argument("--horizon", type=int_arg(8, 1 << 16), default=256, help="horizon T in steps (default 256)")
    parser.add_argument("--requests", type=int_arg(1, 4096), default=16,
                        help="requests per client N at --horizon (default 16)")
    parser.add_argument("--prompt", type=pair_arg, default=(8, 256), help="prompt range LOW,HIGH (default 8,256)")
    parser.add_argument("--output", type=pair_arg, default=(1, 64), help="output range LOW,HIGH (default 1,64)")
    parser.add_argument("--w-p", default="1", type=number_text, help="prefill token cost (default 1)")
    parser.add_argument("--w-q", default="2", type=number_text, help="decode token cost (default 2)")
    parser.add_argument("--beta", default="0", type=number_text, help="decode cost per context token (default 0)")
    parser.add_argument("--kv-cap", type=int_arg(1, 1 << 30), default=None, metavar="C",
                        help="per-client cap on reserved KV (prompt + output of running requests; default none)")
    parser.add_argument("--horizon-grid", type=grid_arg, default=DEFAULT_GRID,
                        help="horizons of the growth search, N scaled with T (default 64,256,1024; 'none': skip)")
    parser.add_argument("--growth-policy", type=list_arg(str, name="policies", max_items=16),
                        default=list(GROWTH_POLICIES),
                        help="policies of the growth search (default fcfs,lcf,vtc,vtc-artifact; vtc-artifact: vtc "
                             "without the lift's last_left clause, the VTC artifact's variant)")
    add_server_flags(parser)  # --server and vLLM's engine arguments, as on every sweep
    for action in parser._actions:
        if action.dest == "server":
            action.help = SERVER_HELP
    parser.add_argument("--sigma", type=float_arg(1e-3, 10.0), default=0.6, help="ES sample scale (default 0.6)")
    parser.add_argument("--no-construction", action="store_true",
                        help="do not seed the search with the blocked-decode construction (adversary.blocked_decode)")
    parser.add_argument("--seed", type=int_arg(0, 2**31 - 1), default=0, help="random seed (default 0)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--quiet", action="store_true", help="no per-generation progress on stderr")
    return parser


def parse(argv=None):
    """Parsed and cross-checked flags (InputError: one line, exit 2)."""
    args = build_parser().parse_args(argv)
    for name in list(args.policy) + list(args.growth_policy):
        if name in VARIANTS:
            continue
        registry.get(name)  # InputError naming the choices
        if name in SKIPPED_POLICIES:
            raise InputError(f"policy {name} needs an rpm limit; the adversary searches the other policies")
    args.policy = list(dict.fromkeys(args.policy))
    args.vllm = vllm_flags(args)  # sets args.kv_budget (--num-gpu-blocks or the default)
    args.kv_budget = list(dict.fromkeys(args.kv_budget))
    args.clients = list(dict.fromkeys(args.clients))
    args.growth_policy = list(dict.fromkeys(args.growth_policy))
    if args.prompt[1] > min(args.kv_budget):
        raise InputError(f"--prompt up to {args.prompt[1]} exceeds --kv-budget {min(args.kv_budget)}: "
                         "such a prompt could never be admitted")
    args.search = adversary.SearchConfig(population=args.population, generations=args.generations,
                                         restarts=args.restarts, sigma=args.sigma, seed=args.seed)
    args.settings = {(p, m): make_settings(p, m, args)
                     for p in dict.fromkeys(args.policy + args.growth_policy) for m in args.kv_budget}
    if all(s.w_p == 0 and s.w_q == 0 for s in args.settings.values()):
        # 2U = 2 max(w_p L, w_q M) = 0: there is no bound to measure a drift against
        raise InputError("--w-p and --w-q are both 0: the bound 2U = 2 max(w_p * L, w_q * M) is 0, so no ratio "
                         "to it exists; give one of them a positive price")
    for k in args.clients:  # every limit checked before any search
        for s in args.settings.values():
            _limits(args, k, args.horizon).check(s, args.server)
    for t in args.horizon_grid:
        for p in args.growth_policy:
            _limits(args, 2, t).check(args.settings[(p, args.kv_budget[0])], args.server)
    # One generation holds population x K x N requests (genes, noise, engine lanes):
    # refuse a size that cannot fit before any search starts, not in the middle of one.
    searches = [(k, args.horizon) for k in args.clients] + [(2, t) for t in args.horizon_grid if args.growth_policy]
    for k, t in searches:
        n = _limits(args, k, t).requests
        if args.population * k * n > MAX_GENERATION_REQUESTS:
            raise InputError(f"--population {args.population} x {k} clients x {n} requests = "
                             f"{args.population * k * n:,} requests per generation, over the limit "
                             f"{MAX_GENERATION_REQUESTS:,}: lower --population or --requests")
    check_memory(args, devices.available_bytes(devices.lane_mesh()))
    return args


def search_bytes(objective: adversary.Objective, population: int) -> int:
    """Bytes a search holds at the peak of a generation: the whole population runs as
    engine lanes of ONE call (runner.run holds every lane at once), plus its host arrays."""
    lim = objective.limits
    return population * (MODEL_ENGINE.lane_bytes(objective.config)
                         + HOST_BYTES_PER_REQUEST * lim.clients * lim.requests)


def planned_searches(args) -> list[tuple[str, int, int, int]]:
    """(policy, M, K, T) of every search `run` makes (the main table, then the growth grid)."""
    main = [(p, m, k, args.horizon) for p in args.policy for m in args.kv_budget for k in args.clients]
    return main + [(p, args.kv_budget[0], 2, t) for p in args.growth_policy for t in args.horizon_grid]


def check_memory(args, available: int) -> None:
    """Refuse (InputError, one line) before any search one that would not fit `available`
    bytes."""
    for policy, m, k, t in dict.fromkeys(planned_searches(args)):
        limits = _limits(args, k, t)
        need = search_bytes(adversary.Objective(args.settings[(policy, m)], limits, server=args.server),
                            args.search.population)
        if need > available:
            raise InputError(f"the search {policy} M={m} K={k} T={t} needs about {need / 2**30:.1f} GiB "
                             f"(--population {args.search.population:,} candidates of {k} x {limits.requests} "
                             f"requests, all run at once), more than the {available / 2**30:.1f} GiB "
                             f"available: {FLAGS_FOR_MEMORY}")


def within_memory(body):
    """body(), with running out of memory mid-search (the up-front estimate is an
    estimate) reported as one line naming this command's own flags (InputError)."""
    try:
        return body()
    except (MemoryError, jax.errors.JaxRuntimeError) as err:
        if not out_of_memory(err):
            raise  # an engine defect, not memory: the generic handler reports it
        raise InputError(f"out of memory during the search: {FLAGS_FOR_MEMORY}") from None


def out_of_memory(err: BaseException) -> bool:
    """Python's MemoryError or XLA's RESOURCE_EXHAUSTED (a JaxRuntimeError)."""
    return isinstance(err, MemoryError) or (isinstance(err, jax.errors.JaxRuntimeError)
                                             and "RESOURCE_EXHAUSTED" in str(err))


def vllm_flags(args) -> dict:
    """The vllm server's flags (vLLM's engine arguments, cli/server_flags.py) with vLLM's
    defaults, empty on another server (which refuses them, one line naming both). Sets
    args.kv_budget: --num-gpu-blocks N means M = (N - 1) x block_size (the null block holds
    none), refused beside a --kv-budget that says otherwise; every M is checked to be a whole
    number of blocks. `--enable-prefix-caching` runs the search on vllm_prefix."""
    given = dict(server_flags.server_options(args))  # refuses a vLLM flag on another server
    if args.server not in VLLM_SERVERS:
        if given:
            raise InputError(f"{server_flags.VLLM_FLAGS[next(iter(given))]}: the search takes server settings on "
                             f"--server {' or '.join(VLLM_SERVERS)} only (it runs on --server {args.server})")
        args.kv_budget = args.kv_budget or [256]
        return {}
    blocks = given.pop("num_gpu_blocks", None)
    flags = {**VLLM_DEFAULTS, **given}
    if blocks is not None:
        pool = (blocks - 1) * flags["block_size"]
        if args.kv_budget not in (None, [pool]):
            raise InputError(f"--num-gpu-blocks {blocks} sets M = ({blocks} - 1) x {flags['block_size']} = {pool} "
                             f"tokens, and --kv-budget says {','.join(map(str, args.kv_budget))}: give one of them")
        args.kv_budget = [pool]
    args.kv_budget = args.kv_budget or [256]
    for m in args.kv_budget:
        if m % flags["block_size"] or m < flags["block_size"]:
            raise InputError(f"--kv-budget {m} is not a whole number of --block-size {flags['block_size']} blocks: "
                             "on --server vllm the KV pool is M / block_size blocks (+ the null block)")
    return flags


def server_options(args, kv_budget: int) -> tuple:
    """Settings.server_options of the search's server at M = kv_budget (vllm: its flags and
    num_gpu_blocks = M // block_size + 1; the other servers take none)."""
    if not args.vllm:
        return ()
    return tuple(sorted({**args.vllm, "num_gpu_blocks": kv_budget // args.vllm["block_size"] + 1}.items()))


def make_settings(name: str, kv_budget: int, args) -> Settings:
    """A policy name or a VARIANTS name at M = kv_budget, the flags' prices and the
    server's options."""
    policy, extra = VARIANTS.get(name, (name, {}))
    return Settings(policy, kv_budget, w_p=args.w_p, w_q=args.w_q, beta=args.beta, kv_cap=args.kv_cap,
                    server_options=server_options(args, kv_budget), **extra)


def _limits(args, clients: int, horizon: int) -> adversary.Limits:
    """Limits at a horizon; N scales with it (N = requests x T / horizon, at least 1)."""
    requests = max(1, round(args.requests * horizon / args.horizon))
    return adversary.Limits(clients=clients, requests=requests, horizon=horizon, prompt=tuple(args.prompt),
                            output=tuple(args.output))


def _seed(base: int, label: str) -> int:
    """A row's search seed: from the base seed and the row's label only (order-independent)."""
    return int(np.random.SeedSequence([base, zlib.crc32(label.encode())]).generate_state(1)[0])


def _number(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


def _ratio(value: Fraction, bound: Fraction) -> float | None:
    """value / bound, or None where the bound is 0 (w_q = 0 makes w_q * M = 0: no ratio)."""
    return float(value / bound) if bound else None


def _cell(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _witness_name(policy: str, m: int, k: int, t: int) -> str:
    return f"witnesses/{policy}_M{m}_K{k}_T{t}.csv"


def search_row(args, policy: str, m: int, limits: adversary.Limits, log) -> dict:
    """One search; its witness verified by a fresh replay. Returns the row (with the
    witness trace under "_trace", removed before JSON)."""
    settings = args.settings[(policy, m)]
    base = f"{policy} M={m} K={limits.clients} T={limits.horizon}"
    label = base if args.server == servers.DEFAULT_SERVER else f"{base} on {args.server}"
    # The seed is the setting's on every server: the servers' searches are paired.
    config = adversary.SearchConfig(**{**args.search.__dict__, "seed": _seed(args.seed, base)})
    objective = adversary.Objective(settings, limits, server=args.server)
    say = None if args.quiet else (lambda line: log(f"[adversary] {label}: {line}"))
    try:
        initial = None if args.no_construction else adversary.to_genes(*adversary.blocked_decode(limits), limits)
        result = adversary.search(objective, limits, config, initial=initial, log=say)
        exact = adversary.replay_drift(result.trace, settings, limits.horizon, limits.clients, server=args.server)
    except RuntimeError as err:  # a lane that did not finish: an engine defect, never bad input
        if out_of_memory(err):  # XLA's out of memory is a RuntimeError too: `within_memory` reports it
            raise
        raise CheckFailed(f"{label}: {err}") from None
    if float(exact) != result.best_drift:
        # The batched search and a fresh single-lane replay disagree: an engine defect.
        raise CheckFailed(f"{label}: the search found {result.best_drift} but its witness replays to {exact}")
    bound = 2 * adversary.bound_u(settings, int(result.trace.prompt.max()))
    lower = adversary.lower_bound(settings)
    witness = _witness_name(policy, m, limits.clients, limits.horizon)
    metrics = {"worst_drift": _number(exact), "bound_2u": _number(bound), "lower_bound": _number(lower),
               "ratio_to_2u": _ratio(exact, bound), "ratio_to_lower_bound": _ratio(exact, lower),
               "candidates_evaluated": result.candidates, "random_best": result.random_best,
               "construction_drift": result.initial_drift,
               "seconds": round(result.seconds, 2), "island_restarts": result.restarts, "witness": witness}
    log(f"[adversary] {label}: worst {float(exact):,.6g} = {_cell(_ratio(exact, bound))} x 2U "
        f"({result.candidates:,} candidates, {result.seconds:.1f} s)")
    return {"setting": {"policy": policy, "kv_budget": m, "clients": limits.clients, "horizon": limits.horizon,
                        "requests": limits.requests, "lift_last_left": settings.lift_last_left,
                        **({"server": args.server} if args.server != servers.DEFAULT_SERVER else {})},
            "label": label, "metrics": metrics, "progress": [float(x) for x in result.progress],
            "_trace": result.trace, "_settings": settings, "_limits": limits}


def _flag_text(name: str, value) -> str:
    """A server option as its replay flag: `--block-size 16`, a switch `--enable-x` / `--no-enable-x`."""
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{flag}" if value else f"--no-{flag}"
    return f"--{flag} {value}"


def witness_json(row: dict, args) -> dict:
    """The small JSON beside a witness: its settings, limits, drift and the replay command."""
    s, lim, m = row["_settings"], row["_limits"], row["metrics"]
    options = dict(s.server_options)
    memory = (" ".join(_flag_text(k, v) for k, v in options.items()) if options
              else f"--kv-budget {s.kv_budget}")  # vllm's M is its pool: (num_gpu_blocks - 1) x block_size
    command = (f"python -m vtc_jax replay {Path(m['witness']).name} --policy {s.policy}"
               + ("" if args.server == servers.DEFAULT_SERVER else f" --server {args.server}") + f" {memory} "
               f"--w-p {s.w_p} --w-q {s.w_q}" + (f" --beta {s.beta}" if s.beta else "")
               + ("" if s.lift_last_left else " --no-last-left") + (f" --kv-cap {s.kv_cap}" if s.kv_cap else "")
               + f" --steps {lim.horizon} --details out.json")
    return {"witness": Path(m["witness"]).name, "policy": s.policy, "kv_budget": s.kv_budget,
            "lift_last_left": s.lift_last_left, "kv_cap": s.kv_cap,
            "clients": lim.clients, "steps": lim.horizon, "w_p": str(s.w_p), "w_q": str(s.w_q), "beta": str(s.beta),
            "backlogged_drift": m["worst_drift"], "bound_2u": m["bound_2u"], "lower_bound": m["lower_bound"],
            "ratio_to_2u": m["ratio_to_2u"],
            "limits": {"requests_per_client": lim.requests, "prompt": list(lim.prompt), "output": list(lim.output),
                       "arrival": [0, lim.horizon - 1]},
            "replay": command,
            **({"server": args.server, "server_options": options} if args.server != servers.DEFAULT_SERVER else {})}


def counterexamples(rows: list[dict]) -> list[dict]:
    """VTC rows whose worst drift exceeds 2U."""
    return [{"label": r["label"], "policy": r["setting"]["policy"], "kv_budget": r["setting"]["kv_budget"],
             "clients": r["setting"]["clients"], "horizon": r["setting"]["horizon"],
             "worst_drift": r["metrics"]["worst_drift"], "bound_2u": r["metrics"]["bound_2u"],
             "ratio_to_2u": r["metrics"]["ratio_to_2u"], "witness": r["metrics"]["witness"]}
            for r in rows if r["_settings"].policy == "vtc" and r["metrics"]["worst_drift"] > r["metrics"]["bound_2u"]]


CSV_COLUMNS = ("part", "policy", "kv_budget", "clients", "horizon", "requests", "lift_last_left", "worst_drift",
               "bound_2u", "lower_bound", "ratio_to_2u", "ratio_to_lower_bound", "candidates_evaluated", "random_best",
               "construction_drift", "seconds", "witness")


def results_csv(rows: list[dict], growth: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for part, entries in (("main", rows), ("horizon", growth)):
        for r in entries:
            values = {**r["setting"], **r["metrics"], "part": part}
            writer.writerow([values.get(c) for c in CSV_COLUMNS])
    return out.getvalue()


def format_table(rows: list[dict], title: str) -> str:
    header = ["setting", "worst_drift", "2U", "w_q*M", "ratio_to_2U", "candidates", "seconds"]
    lines = [[r["label"], f"{r['metrics']['worst_drift']:,}", f"{r['metrics']['bound_2u']:,}",
              f"{r['metrics']['lower_bound']:,}", _cell(r["metrics"]["ratio_to_2u"]),
              f"{r['metrics']['candidates_evaluated']:,}", f"{r['metrics']['seconds']:.1f}"] for r in rows]
    widths = [max(len(x[i]) for x in [header] + lines) for i in range(len(header))]
    render = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([title, render(header), render(["-" * w for w in widths])] + [render(x) for x in lines])


def draw_progress(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.4), dpi=110)
    for r in rows:
        ratio = np.asarray(r["progress"]) / r["metrics"]["bound_2u"]
        ax.plot(np.arange(1, len(ratio) + 1), ratio, label=r["label"].rsplit(" T=", 1)[0])
    ax.axhline(1.0, color="k", ls="--", lw=1, label="2U (VTC bound)")
    ax.set_xlabel("generation")
    ax.set_ylabel("best backlogged drift / 2U")
    ax.set_title("adversarial search: worst drift found so far")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, format="png")  # the atomic writer hands a temporary name
    plt.close(fig)


def draw_growth(growth: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for policy in dict.fromkeys(r["setting"]["policy"] for r in growth):
        mine = [r for r in growth if r["setting"]["policy"] == policy]
        ax.plot([r["setting"]["horizon"] for r in mine], [r["metrics"]["worst_drift"] for r in mine], "o-",
                label=policy)
    for key, style, label in (("bound_2u", "k--", "2U (VTC bound)"), ("lower_bound", "k:", "w_q M (lower bound)")):
        points = sorted({(r["setting"]["horizon"], r["metrics"][key]) for r in growth if r["metrics"][key] > 0})
        ax.plot([t for t, _ in points], [v for _, v in points], style, lw=1, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("horizon T (steps; requests per client grow with T)")
    ax.set_ylabel("worst backlogged drift found")
    ax.set_title("worst case vs horizon")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")  # the atomic writer hands a temporary name
    plt.close(fig)


def run(args, log=None) -> int:
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    out = fileio.check_writable_dir(args.out)
    fileio.check_writable_dir(out / "witnesses")
    started = time.perf_counter()
    rows = [search_row(args, p, m, _limits(args, k, args.horizon), log)
            for p in args.policy for m in args.kv_budget for k in args.clients]
    growth = []
    for p in args.growth_policy:
        for t in args.horizon_grid:
            limits = _limits(args, 2, t)
            same = [r for r in rows if r["_limits"] == limits and r["setting"]["policy"] == p
                    and r["setting"]["kv_budget"] == args.kv_budget[0]]
            growth.append(same[0] if same else search_row(args, p, args.kv_budget[0], limits, log))
    seconds = time.perf_counter() - started
    searched = {id(r): r for r in rows + growth}.values()
    candidates = sum(r["metrics"]["candidates_evaluated"] for r in searched)
    search_seconds = sum(r["metrics"]["seconds"] for r in searched)
    bad = counterexamples(list({id(r): r for r in rows + growth}.values()))
    print(format_table(rows, "worst backlogged drift found (one search per setting)"))
    if growth:
        print()
        print(format_table(growth, "worst case vs horizon (requests per client grow with T)"))
    print(f"\n{candidates:,} candidates in {seconds:.1f} s ({candidates / max(search_seconds, 1e-9):,.0f} "
          f"candidates/s in the searches)")
    for c in bad:
        line = (f"COUNTEREXAMPLE: {c['policy']} reaches a backlogged drift of {c['worst_drift']:,} > 2U = "
                f"{c['bound_2u']:,} (M={c['kv_budget']}, K={c['clients']}, T={c['horizon']}); witness {c['witness']}")
        log(f"{PROG}: {line}")
    config = {"policies": args.policy, "kv_budgets": args.kv_budget, "clients": args.clients,
              "horizon": args.horizon, "requests_per_client": args.requests, "prompt": list(args.prompt),
              "output": list(args.output), "w_p": str(args.w_p), "w_q": str(args.w_q), "beta": str(args.beta),
              "kv_cap": args.kv_cap,
              **({"server": args.server, "server_options": args.vllm} if args.server != servers.DEFAULT_SERVER else {}),
              "horizon_grid": list(args.horizon_grid),
              "growth_policies": args.growth_policy if args.horizon_grid else [],
              "search": {k: (list(v) if isinstance(v, tuple) else v) for k, v in args.search.__dict__.items()},
              "seeded_with_construction": not args.no_construction,
              "objective": "LaneResults.backlogged_drift (measure pair_drift): max over client pairs and intervals "
                           "in which both are backlogged at every step of |W_f(t1..t2) - W_g(t1..t2)|"}
    public = lambda r: {k: v for k, v in r.items() if not k.startswith("_")}  # noqa: E731
    result = {"sweep": "adversary", "config": config, "rows": [public(r) for r in rows],
              "horizon_growth": [public(r) for r in growth],
              "counterexample": bad or None,
              "timing": {"seconds": round(seconds, 1), "candidates": candidates,
                         "candidates_per_second": round(candidates / max(search_seconds, 1e-9))}}
    files = [(out / "results.json", lambda p: p.write_text(json.dumps(result, indent=1) + "\n")),
             (out / "results.csv", lambda p: p.write_text(results_csv(rows, growth)))]
    for r in {id(r): r for r in rows + growth}.values():
        name = out / r["metrics"]["witness"]
        files.append((name, lambda p, t=r["_trace"]: adversary.write_witness_csv(p, t)))
        files.append((name.with_suffix(".json"),
                      lambda p, r=r: p.write_text(json.dumps(witness_json(r, args), indent=1) + "\n")))
    if not args.no_plots:
        files.append((out / "progress.png", lambda p: draw_progress(rows, p)))
        if growth:
            files.append((out / "horizon.png", lambda p: draw_growth(growth, p)))
    written = fileio.write_outputs_atomically(files)
    print(f"wrote {len(written)} files to {out}")
    return 0


def main(argv=None) -> int:
    return guarded(PROG, lambda: within_memory(lambda: run(parse(argv))))


if __name__ == "__main__":
    raise SystemExit(main())
