"""A policy's drift (VTC's by default) against the KV budget M, beside the bound 2 * w_q * M
(the seed document's third experiment).

With --server vllm the grid still sets M: each M of --budgets becomes num_gpu_blocks =
M // block_size + 1 (the null block holds none, so the pool holds exactly M tokens; M must
be a multiple of --block-size, and --num-gpu-blocks is not given)."""

from __future__ import annotations

from vtc_jax.cli import sweep_command
from vtc_jax.cli.common import int_arg, list_arg
from vtc_jax.cli.server_flags import VLLM_FLAGS
from vtc_jax.cli.sweep_command import add_workload_arguments, make_settings, workload_config, workload_is_default, workload_source
from vtc_jax.core.errors import InputError
from vtc_jax.driver.sweep import Plot, Row, Sweep, base_metrics
from vtc_jax.inputs.traffic import overload
from vtc_jax.policies import registry
from vtc_jax.servers import registry as servers

RATES = "1.0,0.25"
BUDGETS = [2048, 4096, 8192, 16384, 32768]
PAPER_VALUES = {
    "M=2048": {"max_drift": 2299, "bound": 8192, "drift_over_total": 0.023},
    "M=4096": {"max_drift": 3268, "bound": 16384, "drift_over_total": 0.017},
    "M=8192": {"max_drift": 6782, "bound": 32768, "drift_over_total": 0.017},
    "M=16384": {"max_drift": 17753, "bound": 65536, "drift_over_total": 0.022},
    "M=32768": {"max_drift": 36014, "bound": 131072, "drift_over_total": 0.023},
}


def add_arguments(parser):
    add_workload_arguments(parser, rates=RATES, kv_budget=False)  # M is the grid: --budgets
    parser.add_argument("--budgets", type=list_arg(int_arg(1, 1 << 30), name="budgets", max_items=64),
                        default=BUDGETS, help="KV budgets M to sweep (default 2048,4096,8192,16384,32768; "
                                              "--server vllm: num_gpu_blocks = M // block_size + 1 each)")
    parser.add_argument("--policy", choices=registry.names(), default="vtc", help="scheduler (default vtc)")


def metrics(results, rows):
    out = base_metrics(results, rows)
    out["bound"] = 2 * results.kv_budget * float(rows[0].settings.w_q)
    return out


def server_options(args, m: int) -> tuple:
    """Row M's server settings: --server vllm's with num_gpu_blocks = M // block_size + 1
    (its pool then holds M tokens); the ideal server's memory is M itself."""
    options = dict(args.server_options)
    if args.server == servers.DEFAULT_SERVER:
        return ()
    if "num_gpu_blocks" in options:
        raise InputError(f"{VLLM_FLAGS['num_gpu_blocks']}: this sweep sets it from each M of --budgets "
                         "(num_gpu_blocks = M // block_size + 1)")
    block = options.get("block_size", 16)
    if m % block:
        raise InputError(f"--budgets: M={m} is not a multiple of --block-size {block} (on --server {args.server} "
                         "M = (num_gpu_blocks - 1) x block_size)")
    return tuple(sorted(dict(options, num_gpu_blocks=m // block + 1).items()))


def build(args) -> Sweep:
    source = workload_source(args, overload(args.rates, args.steps, prompt=args.prompt, output=args.output))
    rows = [Row(make_settings(args, args.policy, kv_budget=m, server_options=server_options(args, m)), source,
                f"M={m}") for m in args.budgets]
    config = dict(workload_config(args), budgets=args.budgets, policy=args.policy)
    return Sweep(
        name="kv_budget", config=config, rows=rows, metrics=metrics,
        columns=("max_drift", "bound", "drift_over_total", "max_drift_over_2u", "throughput"),
        paper_values=PAPER_VALUES, default_workload=workload_is_default(args, RATES) and args.policy == "vtc",
        plots=(Plot("metric", "drift_vs_kv_budget.png", "max drift vs KV budget (bound 2 w_q M dashed)",
                    "kv_budget", "max_drift", extra="bound", xlog=True),))


def main(argv=None) -> int:
    return sweep_command.main("kv_budget", __doc__, add_arguments, build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
