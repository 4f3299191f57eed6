"""The seed's KV table in its modern form: vLLM's KV blocks x token budget x policy, on the
vllm server, per tenant: TTFT p99 and drift.

Grid: --blocks (num_gpu_blocks; the pool holds (N - 1) x block_size tokens, the null block
none) x --budgets (max_num_batched_tokens) x --policy, on each of --workloads:

  overload  the seed's two tenants, Poisson --rates (default 1.0 and 0.25 requests per
            step), prompts U[64, 512], outputs U[32, 384] (sweeps/kv_budget.py's workload);
  servegen  Alibaba ServeGen's production tenants (--data, default the shipped m-large
            sample; sweeps/tenants.py), their six hours mapped onto --steps, every rate
            scaled by one factor so that the offered requests are --load (default 1.5) x
            the measured capacity of the grid's largest server (most blocks, largest
            budget): every smaller one is more overloaded. Prompts are clipped so that each
            request fits the smallest pool (M - max_output + 1), outputs at --max-output.

Untimed (default) a step is one vLLM schedule() call and TTFT is in steps: from the arrival
step through the step that samples the first token (a request prefilled in its arrival
step has TTFT 1). Timed (--preset NAME or --step-time FILE.json: servers/step_time.py),
a step of --rates and --steps lasts --step-seconds (default 0.025 s) and arrivals are exact
microseconds; TTFT is in ms, from arrival (the model's a0 included) to the end of the
step that samples the first token, as `vllm bench serve` measures it.

Metrics (per lane; mean and 95% CI over seeds):
  max_drift              max over steps of max_k W_k - min_k W_k (weighted service), as
                         every sweep reports it;
  ttft_p99_t<k>          tenant k's TTFT p99 (exact, numpy's linear interpolation) over its
                         requests that got a first token by the horizon;
  ttft_p99_all           the same over every tenant's requests;
  no_first_token         the fraction of arrived requests without a first token by the horizon
                         (an overloaded queue: those are not in the percentiles);
  offered_over_capacity  requests offered per unit of time over the row's server's capacity,
                         measured on the workload's own length mix by a saturating run
                         (vtc_jax/driver/capacity.py): above 1 the row is overloaded.
Outputs: results.json, results.csv and per workload drift_vs_ttft_<workload>.png (one
point per blocks x budget x policy, 95% CI bars). A setting where some request could never
finish (its peak KV blocks exceed the pool, or with chunked prefill off a budget below its
length) is refused before anything runs.

  python -m sweeps.kv_blocks                     # about a minute on CPU (4 seeds; compiles dominate)
  python -m sweeps.kv_blocks --seeds 4096        # the issue's full run
  python -m sweeps.kv_blocks --preset qwen2.5-7b-h100 --blocks 257,1025 --budgets 512,8192
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import float_arg, int_arg, list_arg
from vtc_jax.cli.server_flags import VLLM_FLAGS
from vtc_jax.cli.sweep_command import add_workload_arguments
from vtc_jax.core.errors import InputError
from vtc_jax.driver import capacity as capacity_mod
from vtc_jax.driver.latency import RequestTimesEngine, lane_ttft
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs import servegen
from vtc_jax.inputs.sources import ServeGenSource, TrafficSource
from vtc_jax.inputs.traffic import overload
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers
from vtc_jax.servers import step_time

RATES = "1.0,0.25"
BLOCKS = [257, 1025]  # M = 4096, 16384 tokens at block size 16
BUDGETS = [512, 2048]
POLICIES = ["fcfs", "vtc"]
WORKLOADS = ("overload", "servegen")
DEFAULT_DATA = Path(__file__).resolve().parent.parent / "data" / "servegen" / "m-large"
STEPS = 1000


def add_arguments(parser):
    parser.set_defaults(seeds=4, server="vllm")
    add_workload_arguments(parser, rates=RATES, kv_budget=False)
    parser.set_defaults(steps=STEPS)
    parser.add_argument("--blocks", type=list_arg(int_arg(2, (1 << 29) - 1), name="blocks", max_items=32),
                        default=BLOCKS, help="vLLM's num_gpu_blocks to sweep (default 257,1025)")
    parser.add_argument("--budgets", type=list_arg(int_arg(1, (1 << 29) - 1), name="budgets", max_items=32),
                        default=BUDGETS, help="vLLM's max_num_batched_tokens to sweep (default 512,2048)")
    parser.add_argument("--policy", type=list_arg(str, name="policies", max_items=64), default=POLICIES,
                        help="policies (default fcfs,vtc)")
    parser.add_argument("--workloads", type=list_arg(str, name="workloads", max_items=2), default=list(WORKLOADS),
                        help="overload, servegen or both (default both)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="servegen: a ServeGen directory "
                                                                        "(default: the shipped m-large sample)")
    parser.add_argument("--load", type=float_arg(1e-3, 1e3), default=1.5,
                        help="servegen: offered requests over the largest server's measured capacity (default 1.5)")
    parser.add_argument("--max-output", type=int_arg(1, 1 << 16), default=1024,
                        help="servegen: outputs clipped to this many tokens (default 1024)")
    parser.add_argument("--preset", default=None, help="timed: a step-time model by name (" + ", ".join(
        step_time.presets()) + "); TTFT in ms")
    parser.add_argument("--step-time", type=Path, default=None, help="timed: your step-time model (JSON)")
    # --step-seconds (timed: seconds one step of --rates and --steps lasts) is the input flags' (sweep_command)


def check_flags(args) -> None:
    if args.server != "vllm":
        raise InputError(f"sweeps.kv_blocks sweeps vLLM's KV blocks and token budget: it runs on --server vllm, "
                         f"not {args.server}")
    for name in ("num_gpu_blocks", "max_num_batched_tokens"):
        if name in dict(args.server_options):
            raise InputError(f"{VLLM_FLAGS[name]}: this sweep's grid sets it (--blocks, --budgets)")
    if args.trace is not None or args.phase_unit != 1:
        raise InputError("--trace: this sweep's workloads are overload and servegen (--workloads)")
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown or len(set(args.workloads)) != len(args.workloads):
        raise InputError(f"--workloads {','.join(args.workloads)}: choose from {', '.join(WORKLOADS)}, each once")
    if len(set(args.blocks)) != len(args.blocks) or len(set(args.budgets)) != len(args.budgets):
        raise InputError("--blocks and --budgets list each value once")
    for p in args.policy:
        registry.get(p)
    if len(set(args.policy)) != len(args.policy):
        raise InputError("--policy lists a policy twice")
    if args.step_seconds is not None and not (args.preset or args.step_time):
        raise InputError("--step-seconds applies to a timed run (--preset or --step-time)")


def model_of(args) -> step_time.StepTime | None:
    if args.preset and args.step_time:
        raise InputError("give --preset or --step-time, not both")
    if args.preset:
        return step_time.preset(args.preset)
    return step_time.read_step_time(args.step_time) if args.step_time else None


def grid_options(args, model) -> list[tuple[int, int, tuple]]:
    """(blocks, budget, server options) per grid point; the step-time model checked at
    each (its longest step must stay exact)."""
    out = []
    base = dict(args.server_options)
    for blocks in args.blocks:
        for budget in args.budgets:
            options = dict(base, num_gpu_blocks=blocks, max_num_batched_tokens=budget)
            if model is not None:
                model.check(budget, options.get("max_num_seqs", 256))
                options.update(model.options())
            servers.get("vllm").validate(options)
            out.append((blocks, budget, tuple(sorted(options.items()))))
    return out


def memory(options) -> int:
    o = dict(options)
    return (o["num_gpu_blocks"] - 1) * o.get("block_size", 16)


def refuse_never_served(grid, prompt: int, output: int, workload: str) -> None:
    """One line for the first grid point where the workload's longest request could never
    finish (vllm's never_served)."""
    for blocks, budget, options in grid:
        why = servers.get("vllm").never_served(dict(options), np.asarray([prompt]), np.asarray([output]),
                                               memory(options))
        if why is not None:
            raise InputError(f"--blocks {blocks} with --budgets {budget}: {workload}'s longest request (prompt "
                             f"{prompt} + output {output} tokens) could never be served ({why.replace('request 0 ', '')})")


def sources(args, grid, unit: int) -> dict:
    """{workload: (source, capacities per grid point)}; `unit` us per step (1 untimed).
    Every capacity (each workload's mix at each grid point) is measured in one run."""
    made, pools = {}, [memory(o) for _, _, o in grid]
    if "overload" in args.workloads:
        refuse_never_served(grid, args.prompt[1], args.output[1], "overload")
        traffic = overload([r / unit for r in args.rates], args.steps * unit, prompt=args.prompt, output=args.output)
        made["overload"] = TrafficSource(traffic)
    if "servegen" in args.workloads:
        if args.max_output >= min(pools):
            raise InputError(f"--max-output {args.max_output} leaves no room for a prompt in the smallest pool "
                             f"({min(pools)} tokens, --blocks {min(args.blocks)}): lower it")
        clip = min(pools) - args.max_output + 1
        refuse_never_served(grid, clip, args.max_output, "servegen")
        if not args.data.is_dir():
            raise InputError(f"--data {str(args.data)[:200]!r} is not a directory")
        data = servegen.read_servegen(str(args.data))

        def plan(rho):
            return servegen.plan(data, load=rho, kv_budget=min(pools), horizon=args.steps * unit,
                                 max_output=args.max_output, max_prompt=clip)

        made["servegen"] = ServeGenSource(plan(1.0))  # RHO = 1: scaled below, once its capacity is known
    lanes = {}
    for workload, source in made.items():
        prompt, output = capacity_mod.source_mix(source, min(pools))
        lanes[workload] = [capacity_mod.saturating_lane(prompt, output, Settings("fcfs", pool, server_options=o))
                           for (_, _, o), pool in zip(grid, pools)]
    measured = iter(capacity_mod.measure_lanes([lane for group in lanes.values() for lane in group], "vllm"))
    out = {workload: (source, [next(measured) for _ in grid]) for workload, source in made.items()}
    if "servegen" in out:
        source, caps = out["servegen"]
        per_rho = source.plan.expected_requests.sum() / (args.steps * unit)  # requests per unit at RHO = 1
        largest = caps[max(range(len(grid)), key=lambda i: (grid[i][0], grid[i][1]))]
        out["servegen"] = (ServeGenSource(plan(args.load * largest.requests_per_unit / per_rho)), caps)
    return out


def metrics(results, rows, *, timed: bool, a0: int):
    out = base_metrics(results, rows)
    k = rows[0].source.num_clients
    ttft = lane_ttft(results, k, a0 if timed else 1, 1e-3 if timed else 1.0)
    for c in range(k):
        out[f"ttft_p99_t{c}"] = ttft["ttft_p99"][:, c]
    out["ttft_p99_all"] = ttft["ttft_p99_all"]
    out["no_first_token"] = ttft["no_first_token_all"]
    arrived = (results.arrival >= 0).sum(axis=1)
    per_unit = arrived / np.maximum(results.horizon, 1)
    out["offered_over_capacity"] = per_unit / np.asarray([r.extra["capacity_per_unit"] for r in rows])
    return out


def build(args) -> Sweep:
    check_flags(args)
    model = model_of(args)
    timed = model is not None
    unit = round((0.025 if args.step_seconds is None else args.step_seconds) * 1e6) if timed else 1
    if timed and args.steps * unit > (1 << 30) - model.a0:
        raise InputError(f"--steps {args.steps} of {unit} us pass the {(1 << 30) / 1e6:.0f} s a timed lane holds: "
                         "fewer steps or a shorter --step-seconds")
    grid = grid_options(args, model)
    made = sources(args, grid, unit)
    rows = []
    for workload, (source, caps) in made.items():
        for (blocks, budget, options), cap in zip(grid, caps):
            for policy in args.policy:
                s = sweep_command.make_settings(args, policy, kv_budget=memory(options), server_options=options)
                rows.append(Row(s, source, f"{workload} N={blocks} T={budget} {policy}",
                                {"workload": workload, "num_gpu_blocks": blocks, "max_num_batched_tokens": budget,
                                 "capacity_per_unit": cap.requests_per_unit}))
    unit_name = "ms" if timed else "steps"
    config = dict(sweep_command.workload_config(args), blocks=args.blocks, budgets=args.budgets, policies=args.policy,
                  workloads=args.workloads, ttft_unit=unit_name,
                  capacity={w: [c.to_json() for c in caps] for w, (_, caps) in made.items()})
    if timed:
        config.update(step_time=model.name, us_per_step=unit, a0_us=model.a0)
    if "servegen" in made:
        config.update(data=str(args.data), load=args.load, max_output=args.max_output)
    notes = [f"capacity ({w}, requests/{'s' if timed else 'step'}): " + ", ".join(
        f"N={b} T={t} {c.per_second:.4g}" for (b, t, _), c in zip(grid, caps)) for w, (_, caps) in made.items()]
    plots = tuple(Plot("scatter", f"drift_vs_ttft_{w}.png", f"{w}: max drift vs TTFT p99 ({unit_name}), per setting",
                       "max_drift", "ttft_p99_all",
                       where=(("workload", w),)) for w in made)
    columns = ("max_drift", "ttft_p99_t0", "ttft_p99_t1", "ttft_p99_all", "no_first_token", "offered_over_capacity")
    return Sweep(name="kv_blocks", config=config, rows=rows,
                 metrics=functools.partial(metrics, timed=timed, a0=model.a0 if timed else 0), columns=columns,
                 plots=plots, engine=RequestTimesEngine(), clients=len(made) == 1 and "overload" in made,
                 notes=tuple(notes))


def main(argv=None) -> int:
    return sweep_command.main("kv_blocks", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
