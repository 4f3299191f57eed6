"""The `vllm` server's speed, this tree against another commit, in one run (A/B, interleaved).

`benchmarks.bench_vllm --servers vllm --no-end-to-end` (the engine alone, slot tiers as the
driver runs them) runs alternately in this tree and in the other commit's (exported by
git archive, as `ab_engine` does), each run a fresh process, `--rounds` times: on a shared
machine only runs this close together compare.

    python -m benchmarks.ab_vllm --against HEAD~3 --lanes 1024 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks.ab_engine import alternate
from vtc_jax.cli.common import Parser, guarded, int_arg


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.ab_vllm", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the other commit (e.g. HEAD~3)")
    parser.add_argument("--lanes", type=int_arg(1, 1 << 20), default=1024)
    parser.add_argument("--rounds", type=int_arg(1, 20), default=2)
    args = parser.parse_args(argv)
    argv = ["benchmarks.bench_vllm", "--lanes", str(args.lanes), "--repeats", "1", "--servers", "vllm",
            "--no-end-to-end", "--reference-steps", "10"]
    here, there = [], []
    for r, (full, x, y) in enumerate(alternate(args.against, args.rounds, argv, other_first=True)):
        here.append(x)
        there.append(y)
        print(f"round {r + 1}: {full[:10]} {y:.4f}, this tree {x:.4f} M lane-steps/s ({x / y:.2f}x)", flush=True)
    a, b = statistics.median(here), statistics.median(there)
    print(f"vllm engine alone at {args.lanes} lanes, median of {args.rounds}: this tree {a:.4f}, {full[:10]} {b:.4f} "
          f"M lane-steps/s ({a / b:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.ab_vllm", lambda: main(sys.argv[1:])))
