"""The `vllm` server's speed, this tree against another commit, in one run (A/B, interleaved).

`benchmarks.bench_vllm --servers vllm --no-end-to-end` (the engine alone, slot tiers as the
driver runs them) runs alternately in this tree and in the other commit's (exported by
git archive, as `ab_engine` does), each run a fresh process, `--rounds` times: on a shared
machine only runs this close together compare.

    python -m benchmarks.ab_vllm --against HEAD~3 --lanes 1024 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.ab_engine import ROOT, export


def vllm_alone(tree: Path, lanes: int, out: Path) -> float:
    """M lane-steps/s of the vllm server, engine alone (bench_vllm's number, one repeat), in `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "benchmarks.bench_vllm", "--lanes", str(lanes), "--repeats", "1", "--servers", "vllm",
           "--no-end-to-end", "--reference-steps", "10", "--json", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return float(json.loads(out.read_text())["rows"][0]["engine_alone"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab_vllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the other commit (e.g. HEAD~3)")
    parser.add_argument("--lanes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        other.mkdir()
        full = export(args.against, other)
        here, there = [], []
        for r in range(args.rounds):
            there.append(vllm_alone(other, args.lanes, Path(tmp) / f"there{r}.json"))
            here.append(vllm_alone(ROOT, args.lanes, Path(tmp) / f"here{r}.json"))
            print(f"round {r + 1}: {full[:10]} {there[-1]:.4f}, this tree {here[-1]:.4f} M lane-steps/s "
                  f"({here[-1] / there[-1]:.2f}x)", flush=True)
    a, b = statistics.median(here), statistics.median(there)
    print(f"vllm engine alone at {args.lanes} lanes, median of {args.rounds}: this tree {a:.4f}, {full[:10]} {b:.4f} "
          f"M lane-steps/s ({a / b:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
