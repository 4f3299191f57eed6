"""Fuzz check_formula.resim against BLIS on many random small ample-KV traces.

Usage: python benchmarks/blis_golden/fuzz_resim.py --blis /tmp/blis/blis --blis-dir /tmp/blis [--n 300]
Writes nothing to the repository; prints the first mismatches, if any.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_formula as cf  # noqa: E402
import make_golden as mg  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blis", required=True)
    ap.add_argument("--blis-dir", required=True)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    bad = 0
    steps_total = 0
    for k in range(args.n):
        mns = rng.choice([1, 2, 3, 4, 8, 16, 64])
        mnbt = max(mns, rng.choice([16, 64, 100, 256, 512, 1000, 2048, 8192]))
        thr = rng.choice([0, 0, 16, 50, 256, 1000])
        n = rng.randint(2, 40)
        rate = rng.choice([2.0, 20.0, 100.0, 1000.0])
        arr = sorted(mg.poisson_arrivals(rng, n, rate))
        if rng.random() < 0.3:  # some identical timestamps
            arr = sorted(rng.choice(arr) if rng.random() < 0.3 else a for a in arr)
        reqs = [(a, rng.choice(["t0", "t1", "t2"]), rng.randint(1, 4000) if rng.random() < 0.3
                 else rng.randint(1, 300), rng.randint(1, 60)) for a in arr]
        with tempfile.TemporaryDirectory() as td:
            results, steps, pre, metrics, _ = mg.run_blis(args.blis, args.blis_dir, reqs,
                                                          mnbt, mns, thr, Path(td))
        assert not pre and metrics["completed_requests"] == n
        cfg = {"max_num_batched_tokens": mnbt, "max_num_seqs": mns, "long_prefill_threshold": thr}
        res, rsteps, _ = cf.resim(reqs, cfg)
        steps_total += len(steps)
        got = [(results[i]["ttft_us"], results[i]["e2e_us"]) for i in range(n)]
        bsteps = [(s, d) for s, d, _ in steps]
        if got != res or bsteps != [(t, d) for t, d, _, _ in rsteps]:
            bad += 1
            if bad <= 3:
                print(f"case {k}: mnbt={mnbt} mns={mns} thr={thr} n={n}: mismatch")
                for i in range(n):
                    if got[i] != res[i]:
                        print(f"  row {i} {reqs[i]}: BLIS {got[i]} re-sim {res[i]}")
                        break
    print(f"{args.n} random traces, {steps_total} BLIS steps: {bad} mismatching traces")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
