"""Engine speed, this tree against another commit, in one run (A/B, interleaved).

The issue rule "engine speed on `ideal` no lower than the commit before" is checked here:
the other commit is exported (git archive) to a temporary directory, and
`benchmarks.bench_engine` (engine alone, the same workload and lane count) runs
alternately in this tree and in that one, each run a fresh process, `--rounds` times. On
a shared 2-core machine single runs vary by up to 30%; alternating and taking medians
cancels drift in the machine's load.

    python -m benchmarks.ab_engine --against HEAD~1
    python -m benchmarks.ab_engine --against 80de3f1 --lanes 4096 --rounds 5 --json ab.json
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

from vtc_jax.cli.common import Parser, guarded, int_arg
from vtc_jax.core.fileio import check_writable_file, write_text_atomically

ROOT = Path(__file__).resolve().parents[1]


def export(rev: str, into: Path) -> str:
    """Write commit `rev`'s tree into `into`; return its full hash."""
    full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                          capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", full], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return full


def bench_number(tree: Path, argv: list, out: Path) -> float:
    """`python -m ARGV --json out` in `tree` (a fresh process); its rows[0] engine_alone
    (M lane-steps/s)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, "-m", *argv, "--json", str(out)], cwd=tree, env=env, check=True,
                   capture_output=True, text=True)
    return float(json.loads(out.read_text())["rows"][0]["engine_alone"])


def alternate(against: str, rounds: int, argv: list, *, other_first: bool = False):
    """Yield (commit, this tree's number, the other's) per round: `argv` (a benchmark with
    its flags) run in this tree and in commit `against`'s exported tree, alternately."""
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        other.mkdir()
        full = export(against, other)
        for r in range(rounds):
            trees = [(other, "there"), (ROOT, "here")] if other_first else [(ROOT, "here"), (other, "there")]
            got = {name: bench_number(tree, argv, Path(tmp) / f"{name}{r}.json") for tree, name in trees}
            yield full, got["here"], got["there"]


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.ab_engine", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the other commit (e.g. HEAD~1)")
    parser.add_argument("--lanes", type=int_arg(1, 1 << 20), default=4096)
    parser.add_argument("--rounds", type=int_arg(1, 20), default=3)
    parser.add_argument("--repeats", type=int, default=3, help="bench_engine's best-of repeats per run")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.json:
        check_writable_file(args.json)  # before the run's minutes, not after
    argv = ["benchmarks.bench_engine", "--lanes", str(args.lanes), "--repeats", str(args.repeats), "--no-reference"]
    here, there = [], []
    for r, (full, x, y) in enumerate(alternate(args.against, args.rounds, argv)):
        here.append(x)
        there.append(y)
        print(f"round {r + 1}: this tree {x:.3f}, {full[:10]} {y:.3f} M lane-steps/s", flush=True)
    a, b = statistics.median(here), statistics.median(there)
    print(f"engine alone at {args.lanes} lanes, median of {args.rounds}: this tree {a:.3f}, {full[:10]} {b:.3f} "
          f"M lane-steps/s ({a / b:.3f}x)")
    if args.json:
        write_text_atomically(args.json, json.dumps({"against": full, "lanes": args.lanes, "this_tree": here,
                                                     "other": there, "ratio_of_medians": a / b}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded("python -m benchmarks.ab_engine", lambda: main(sys.argv[1:])))
