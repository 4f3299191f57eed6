"""Make the BLIS golden runs in tests/data/blis/ (see tests/data/blis/README.md).

Usage: python benchmarks/blis_golden/make_golden.py --blis /tmp/blis/blis --blis-dir /tmp/blis
(the binary built by build_blis.sh, with blis_step_log.patch applied). Deterministic: the
workloads come from fixed seeds, and BLIS itself is deterministic for a replayed trace.
Needs only the standard library.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent.parent / "tests" / "data" / "blis"
MODEL = "meta-llama/llama-3.1-8b-instruct"
TOTAL_KV_BLOCKS = 26312  # what BLIS auto-derives for this model on an 80 GiB H100 at 0.9
BLOCK = 16
A0 = 15563  # BLIS QueueingTime = int64(alpha0) with the bundled defaults.yaml

TRACE_COLS = ("request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,"
              "prefix_length,streaming,input_tokens,output_tokens,text_tokens,image_tokens,"
              "audio_tokens,video_tokens,reason_ratio,model,deadline_us,server_input_tokens,"
              "arrival_time_us,send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,"
              "status,error_message,finish_reason")
TRACE_HEADER = "trace_version: 3\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"


def loguniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def poisson_arrivals(rng, n, rate, start=0):
    t, out = float(start), []
    for _ in range(n):
        out.append(int(round(t)))
        t += rng.expovariate(rate) * 1e6
    return out


def gen_requests(seed, n, tenants, arrivals, prompt, output, p_out1=0.1):
    """[(arrival_us, tenant, prompt, output)] sorted by arrival (stable)."""
    rng = random.Random(seed)
    reqs = []
    for a in arrivals(rng, n):
        t = rng.choice(tenants)
        p = max(16, min(4000, loguniform(rng, *prompt)))
        o = 1 if rng.random() < p_out1 else max(1, min(300, loguniform(rng, *output)))
        reqs.append((a, t, p, o))
    reqs.sort(key=lambda r: r[0])
    return reqs


WORKLOADS = {
    # name: (requests factory, max_num_batched_tokens, max_num_seqs, long_prefill_threshold)
    "blis_mixed": (lambda: gen_requests(
        11, 40, ["t0", "t1", "t2"], lambda rng, n: poisson_arrivals(rng, n, 15.0),
        (16, 800), (2, 120)), 2048, 16, 0),
    "blis_chunked": (lambda: gen_requests(
        12, 30, ["t0", "t1"], lambda rng, n: poisson_arrivals(rng, n, 4.0),
        (1000, 4000), (2, 60)), 512, 8, 0),
    "blis_threshold": (lambda: gen_requests(
        13, 60, ["t0", "t1", "t2", "t3"], lambda rng, n: poisson_arrivals(rng, n, 10.0),
        (16, 4000), (2, 100)), 1024, 32, 256),
    "blis_bursts": (lambda: gen_requests(
        14, 150, ["t0", "t1", "t2", "t3"], bursty, (16, 2000), (2, 300), p_out1=0.05),
        8192, 64, 0),
    # sparse arrivals, short outputs: requests often reach the queue while the engine runs
    # the last step of the previous request (BLIS then starts an overlapping step)
    "blis_sparse": (lambda: gen_requests(
        17, 60, ["t0", "t1", "t2"], lambda rng, n: poisson_arrivals(rng, n, 40.0),
        (16, 300), (2, 6), p_out1=0.3), 2048, 8, 0),
    # blis_ties: built by make_ties() below on a small base trace
}


def bursty(rng, n):
    """Bursts of 10 requests at ~60/s, 1.5-3 s apart (the engine idles between bursts)."""
    out, t = [], 0
    while len(out) < n:
        out.extend(poisson_arrivals(rng, min(10, n - len(out)), 60.0, start=t))
        t = out[-1] + int(rng.uniform(1.5e6, 3.0e6))
    return out


def run_blis(blis, blis_dir, reqs, mnbt, mns, thr, workdir):
    """Replay reqs through BLIS; returns (results by row, steps, preemptions, metrics, argv)."""
    hdr, data = workdir / "trace.yaml", workdir / "trace.csv"
    hdr.write_text(TRACE_HEADER)
    with data.open("w") as f:
        f.write(TRACE_COLS + "\n")
        for i, (a, t, p, o) in enumerate(reqs):
            f.write(f"{i},c_{t},{t},,,0,,0,false,{p},{o},0,0,0,0,0,,0,0,{a},{a},0,0,0,ok,,\n")
    res, met = workdir / "results.json", workdir / "metrics.json"
    horizon = max(r[0] for r in reqs) + 10**9
    argv = ["blis", "replay", "--trace-header", "trace.yaml", "--trace-data", "trace.csv",
            "--model", MODEL, "--total-kv-blocks", str(TOTAL_KV_BLOCKS),
            "--block-size-in-tokens", str(BLOCK), "--max-num-batched-tokens", str(mnbt),
            "--max-num-seqs", str(mns), "--long-prefill-token-threshold", str(thr),
            "--horizon", str(horizon), "--results-path", "results.json",
            "--metrics-path", "metrics.json"]
    cmd = [blis] + argv[1:] + ["--defaults-filepath", str(Path(blis_dir) / "defaults.yaml")]
    env = dict(os.environ, BLIS_STEP_LOG="1")
    p = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"blis failed: {p.stderr[-3000:]}")
    steps, pre = [], {}
    for line in p.stderr.splitlines():
        if line.startswith("BLISSTEP "):
            parts = line.split()
            ents = []
            for e in parts[3:]:
                rid, new, pi, P, O = e.split(":")
                ents.append((int(rid.split("_")[1]), int(new), int(pi), int(P), int(O)))
            steps.append((int(parts[1]), int(parts[2]), ents))
        elif line.startswith("BLISPREEMPT "):
            rid = int(line.split()[2].split("_")[1])
            pre[rid] = pre.get(rid, 0) + 1
    results = {int(r["request_id"]): r for r in json.loads(res.read_text())}
    metrics = json.loads(met.read_text())
    return results, steps, pre, metrics, argv


def final_steps(steps):
    """Steps after which the engine idles: (start, end) of each step whose requests all finish."""
    # A step is 'final' when no other step starts at its end (the next one starts later).
    starts = {s for s, _, _ in steps}
    return [(s, s + d) for s, d, _ in steps if (s + d) not in starts]


def make_ties(blis, blis_dir, workdir):
    """A small trace plus requests placed on BLIS's own step boundaries (iteratively)."""
    base = gen_requests(15, 14, ["t0", "t1"], lambda rng, n: poisson_arrivals(rng, n, 6.0),
                        (16, 600), (2, 40))
    mnbt, mns, thr = 256, 4, 0
    reqs = list(base)
    # two requests with the same arrival timestamp
    a = reqs[3][0]
    reqs.insert(4, (a, "t1", 77, 5))
    reqs.sort(key=lambda r: r[0])
    # Each rule adds one request whose queue time (arrival + a0) is placed relative to a
    # step of the current schedule strictly after the previous additions.
    rules = ["busy_start", "busy_start_plus1", "busy_start_minus1", "final_inside",
             "final_end", "final_start", "final_end_minus1", "busy_start"]
    last = 0
    rng = random.Random(16)
    for rule in rules:
        res, steps, *_ = run_blis(blis, blis_dir, reqs, mnbt, mns, thr, workdir)
        starts = sorted(s for s, _, _ in steps)
        fins = final_steps(steps)
        q = None
        if rule.startswith("busy_start"):
            # a step start that is itself the end of a previous step (the engine is busy)
            ends = {s + d for s, d, _ in steps}
            cand = [s for s in starts if s in ends and s - A0 > last + 20000]
            if cand:
                q = cand[0] + {"busy_start": 0, "busy_start_plus1": 1, "busy_start_minus1": -1}[rule]
        else:
            cand = [(s, e) for s, e in fins if s - A0 > last + 20000 and e - s > 4]
            if cand:
                s, e = cand[0]
                q = {"final_inside": (s + e) // 2, "final_end": e, "final_start": s,
                     "final_end_minus1": e - 1}[rule]
        if q is None:
            sys.exit(f"ties: no step for rule {rule}")
        arr = q - A0
        reqs.append((arr, rng.choice(["t0", "t1"]), rng.randint(16, 300), rng.randint(1, 30)))
        reqs.sort(key=lambda r: r[0])
        last = arr
    return reqs, mnbt, mns, thr


def fmt_ts(us):
    return f"{us // 10**6}.{us % 10**6:06d}"


def write_outputs(name, reqs, mnbt, mns, thr, results, steps, pre, metrics, argv, commit):
    with (OUT / f"{name}.csv").open("w") as f:
        f.write("timestamp,tenant,prompt,output\n")
        for a, t, p, o in reqs:
            f.write(f"{fmt_ts(a)},{t},{p},{o}\n")
    with (OUT / f"{name}.blis.csv").open("w") as f:
        f.write("row,tenant,arrival_us,ttft_us,e2e_us,output,preemptions\n")
        for i, (a, t, p, o) in enumerate(reqs):
            r = results[i]
            assert r["output_tokens"] == o and r["input_tokens"] == p, (name, i, r)
            f.write(f"{i},{t},{a},{r['ttft_us']},{r['e2e_us']},{o},{pre.get(i, 0)}\n")
    with (OUT / f"{name}.steps.csv").open("w") as f:
        # one row per BLIS step, in time order; see README for the columns
        f.write("start_us,dur_us,num_reqs,decode_reqs,decode_ctx_sum,prefill_chunks\n")
        for s, d, ents in steps:
            dec = [e for e in ents if e[2] >= e[3]]
            ctx = sum(e[2] + 1 for e in dec)
            chunks = ";".join(f"{r}:{pi}:{new}" for r, new, pi, P, O in ents if pi < P)
            f.write(f"{s},{d},{len(ents)},{len(dec)},{ctx},{chunks}\n")
    cfg = {
        "source": "BLIS (inference-sim/inference-sim) blis replay, trained-physics latency model",
        "blis_commit": commit,
        "blis_command": " ".join(argv) + " --defaults-filepath <checkout>/defaults.yaml",
        "step_log_patch": "benchmarks/blis_golden/blis_step_log.patch (logging only)",
        "model": MODEL, "hardware": "H100", "tp": 1, "latency_model": "trained-physics",
        "block_size": BLOCK,
        "total_kv_blocks_blis": TOTAL_KV_BLOCKS,
        "num_gpu_blocks": TOTAL_KV_BLOCKS + 1,
        "max_num_batched_tokens": mnbt, "max_num_seqs": mns,
        "chunked_prefill": True,
        "long_prefill_threshold": thr,
        "max_model_len": 131072,
        "prefix_caching": "on in BLIS, but prompts are random distinct token ids: no hits",
        "num_requests": len(reqs),
        "blis_metrics": {k: metrics[k] for k in (
            "completed_requests", "still_queued", "still_running", "preemption_count",
            "dropped_unservable", "length_capped_requests", "timed_out_requests")},
        "num_steps": len(steps),
    }
    (OUT / f"{name}.config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blis", required=True)
    ap.add_argument("--blis-dir", required=True, help="the BLIS checkout (defaults.yaml)")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", args.blis_dir, "rev-parse", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    OUT.mkdir(parents=True, exist_ok=True)
    names = list(WORKLOADS) + ["blis_ties"]
    for name in names:
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as td:
            wd = Path(td)
            if name == "blis_ties":
                reqs, mnbt, mns, thr = make_ties(args.blis, args.blis_dir, wd)
            else:
                fac, mnbt, mns, thr = WORKLOADS[name]
                reqs = fac()
            results, steps, pre, metrics, argv = run_blis(args.blis, args.blis_dir, reqs,
                                                          mnbt, mns, thr, wd)
        assert metrics["completed_requests"] == len(reqs), metrics
        assert metrics["preemption_count"] == 0 and not pre, (name, metrics)
        write_outputs(name, reqs, mnbt, mns, thr, results, steps, pre, metrics, argv, commit)
        print(f"{name}: {len(reqs)} requests, {len(steps)} steps, "
              f"preemptions {metrics['preemption_count']}")


if __name__ == "__main__":
    main()
