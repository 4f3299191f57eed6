"""Check the collapsed step-time formula (llama-3.1-8b-h100-physics) against BLIS golden runs.

Usage: python benchmarks/blis_golden/check_formula.py [NAME ...]   (default: every workload)

Three checks per workload in tests/data/blis/:
 1. steps: every BLIS step duration (NAME.steps.csv) against max(1, trunc(S)) with S the
    collapsed formula in exact Fractions; also against a float64 replica of BLIS's own
    TrainedPhysicsModel.StepTime arithmetic (same operation order as the Go source), and
    reports how close S came to an integer (where truncation could flip).
 2. timeline: TTFT/E2E per request from the logged steps with the a0/a1/a2 rules.
 3. resim: an independent re-simulation of BLIS's scheduler from NAME.csv and
    NAME.config.json alone (the semantics listed in tests/data/blis/README.md), compared
    per request with NAME.blis.csv and per step with NAME.steps.csv.
Standard library only.
"""
from __future__ import annotations

import csv
import json
import sys
from fractions import Fraction as F
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "tests" / "data" / "blis"

# The collapsed formula, constants exactly as written in the spec.
C_STEP = F("6830.410804906928")
C_REQ = F("4.41684444")
C_PTOK = F("2.146033906638844")
C_ATTN = F("8.060523988276908e-05")
C_DEC = F("0.0761824781388418")
A0, A1, A2 = 15563, 777, 45


def collapsed(chunks, dec_ctx_sum, nreq):
    """chunks: [(t, P)]; dec_ctx_sum: sum of P+g over decoding requests. Returns S (Fraction)."""
    s = C_STEP + C_REQ * nreq + C_DEC * dec_ctx_sum
    for t, P in chunks:
        s += C_PTOK * t + C_ATTN * t * (P + F(t, 2))
    return s


def step_us(chunks, dec_ctx_sum, nreq):
    s = collapsed(chunks, dec_ctx_sum, nreq)
    return max(1, int(s)), s


# float64 replica of sim/latency/trained_physics_model.go StepTime for this model (dense,
# TP=1, DP=1, bf16), with BLIS's bundled defaults.yaml coefficients; Python floats are
# IEEE doubles and the operations below follow the Go source's order.
BETA = [0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825,
        481.8613888, 0.0, 1.94710771, 0.752037]
L, D, NH, DKV, DFF = 32.0, 4096.0, 32, 1024.0, 14336.0
DH = float(4096 // 32)
TP = DPF = 1.0
TPDP = TP * DPF
HPG = NH / TP
FLOPS_US = 989.5 * 1e6
BW_US = 3.35 * 1e6
BPP = 2.0


def go_step(chunks, decode_pis):
    """chunks: [(t, P)], decode_pis: [ProgressIndex] (= P+g-1). Mirrors Go float64 ops."""
    if not chunks and not decode_pis:
        return 1
    tpt = tdt = sumctx = pattn = 0.0
    batch = float(len(chunks) + len(decode_pis))
    for t, P in chunks:
        ti, si = float(t), float(P)
        tpt += ti
        pattn += 4 * HPG * ti * (si + ti / 2) * DH
    for pi in decode_pis:
        tdt += 1
        sumctx += float(pi)
    tpf = 0.0
    if tpt > 0:
        fproj = L * 2 * tpt * D * (2 * D + 2 * DKV) / TPDP
        fattn = L * pattn / DPF
        fffn = 0.0
        fffn += L * tpt * 1 * 6 * D * DFF / TPDP
        tpf = (fproj + fattn + fffn) / FLOPS_US
    tpfkv = 0.0
    if tpt > 0:
        tpfkv = L * 2 * (DKV / TPDP) * tpt * 2.0 / BW_US
    tdc = 0.0
    if tdt > 0:
        fproj = L * 2 * tdt * D * (2 * D + 2 * DKV) / TPDP
        fattn = L * 4 * HPG * sumctx * DH / DPF
        fffn = 0.0
        fffn += L * tdt * 1 * 6 * D * DFF / TPDP
        tdc = (fproj + fattn + fffn) / FLOPS_US
    tdckv = 0.0
    if tdt > 0:
        tdckv = L * 2 * (DKV / TPDP) * 2.0 * (sumctx + tdt) / BW_US
    battn = L * D * (2 * D + 2 * DKV) * BPP / TP
    bffn = 0.0
    bffn += L * 1 * 3 * D * DFF * BPP / TP
    tw = (battn + bffn) / BW_US
    pre = BETA[0] * tpf + BETA[8] * tpfkv
    dec = BETA[1] * tdc + BETA[9] * tdckv
    st = (pre + dec + BETA[2] * tw + BETA[3] * (0.0 + 0.0 + 0.0) + BETA[10] * 0.0
          + BETA[4] * L + BETA[5] * batch + BETA[6] + BETA[7] * 0.0 * 0.0)
    return max(1, int(st))


def load(name):
    reqs = []
    with (DATA / f"{name}.csv").open() as f:
        for r in csv.DictReader(f):
            sec, _, frac = r["timestamp"].partition(".")
            us = int(sec) * 10**6 + int((frac + "000000")[:6])
            reqs.append((us, r["tenant"], int(r["prompt"]), int(r["output"])))
    with (DATA / f"{name}.blis.csv").open() as f:
        blis = [{k: (v if k == "tenant" else int(v)) for k, v in r.items()} for r in csv.DictReader(f)]
    steps = []
    with (DATA / f"{name}.steps.csv").open() as f:
        for r in csv.DictReader(f):
            chunks = []
            if r["prefill_chunks"]:
                for c in r["prefill_chunks"].split(";"):
                    row, pi, t = map(int, c.split(":"))
                    chunks.append((row, pi, t))
            steps.append((int(r["start_us"]), int(r["dur_us"]), int(r["num_reqs"]),
                          int(r["decode_reqs"]), int(r["decode_ctx_sum"]), chunks))
    cfg = json.loads((DATA / f"{name}.config.json").read_text())
    return reqs, blis, steps, cfg


def check_steps(name, reqs, steps):
    bad, margin = 0, None
    for s, d, n, _nd, ctx, chunks in steps:
        ch = [(t, reqs[row][2]) for row, pi, t in chunks]
        mine, S = step_us(ch, ctx, n)
        frac = S - int(S)
        m = min(frac, 1 - frac)
        if margin is None or m < margin[0]:
            margin = (m, s)
        if mine != d:
            bad += 1
            if bad <= 5:
                print(f"  {name}: step at {s}: BLIS {d} us, collapsed formula {mine} (S={float(S):.9f})")
    return bad, margin


def check_timeline(name, reqs, blis, steps):
    """TTFT from the logged steps: end of the step completing the prompt + a2 - arrival.
    (The compact steps file does not name decoding requests; the E2E rule is checked on
    the re-simulation, whose steps are compared with BLIS's.)"""
    first_end = {}
    for s, d, *_, chunks in steps:
        for row, pi, t in chunks:
            if pi + t == reqs[row][2]:
                first_end[row] = s + d
    bad = 0
    for b in blis:
        row = b["row"]
        a = reqs[row][0]
        ttft = first_end[row] + A2 - a
        if ttft != b["ttft_us"]:
            bad += 1
            if bad <= 5:
                print(f"  {name}: row {row}: BLIS ttft {b['ttft_us']}, from steps {ttft}")
    return bad


def resim(reqs, cfg):
    """Re-simulate BLIS's single-instance engine from the trace and config alone. Returns
    (per-row (ttft, e2e), steps [(start, dur, prefill chunks [(row, done, t)], decode
    ProgressIndexes)], per-row end of the request's last step)."""
    mnbt, mns = cfg["max_num_batched_tokens"], cfg["max_num_seqs"]
    thr = cfg["long_prefill_threshold"]
    n = len(reqs)
    qtime = [a + A0 for a, _, _, _ in reqs]           # QueuedEvent time
    order = sorted(range(n), key=lambda i: (qtime[i], i))
    nxt = 0                                           # next request (in order) not yet queued
    waiting, running = [], []
    prog = [0] * n
    ttft, itl, e2e = [None] * n, [0] * n, [None] * n
    last_end = [None] * n
    steps = []
    t = None                                          # time of the pending step, None = idle
    while nxt < n or waiting or running:
        if t is None:                                 # idle: the next queued request starts a step
            t = qtime[order[nxt]]
        while nxt < n and qtime[order[nxt]] <= t:     # Queued (priority 1) before Step (3)
            waiting.append(order[nxt])
            nxt += 1
        budget = mnbt
        new = {}
        for r in running:                             # phase 1: running, in admission order
            if budget <= 0:
                break
            P = reqs[r][2]
            if prog[r] < P:
                k = P - prog[r]
                if 0 < thr < k:
                    k = thr
                k = min(k, budget)
                new[r] = k
                budget -= k
            else:
                new[r] = 1
                budget -= 1
        while len(running) < mns and waiting and budget > 0:   # phase 2: FCFS admission
            r = waiting.pop(0)
            k = reqs[r][2]
            if 0 < thr < k:
                k = thr
            k = min(k, budget)
            running.append(r)
            new[r] = k
            budget -= k
        sched = [r for r in running if new.get(r, 0) > 0]
        chunks = [(new[r], reqs[r][2]) for r in sched if prog[r] < reqs[r][2]]
        dec = [prog[r] for r in sched if prog[r] >= reqs[r][2]]
        dur, _ = step_us(chunks, sum(p + 1 for p in dec), len(sched))
        steps.append((t, dur, [(r, prog[r], new[r]) for r in sched if prog[r] < reqs[r][2]], dec))
        for r in sched:
            a, _, P, O = reqs[r]
            last_end[r] = t + dur
            if prog[r] < P:
                prog[r] += new[r]
            else:
                prog[r] += 1
                itl[r] += dur + A2
            if prog[r] == P and ttft[r] is None:
                ttft[r] = t + dur + A2 - a
        remaining = []
        for r in running:
            a, _, P, O = reqs[r]
            if prog[r] >= P + max(O, 1) - 1:
                e2e[r] = ttft[r] + itl[r] + A1
            else:
                remaining.append(r)
        running = remaining
        # Completions are processed at the step's start: with nothing left running and
        # nothing waiting, the engine is idle from t, and a request queued before t + dur
        # starts its own step at its queue time.
        t = t + dur if (running or waiting) else None
    return list(zip(ttft, e2e)), steps, last_end


def main(names):
    ok = True
    for name in names:
        reqs, blis, steps, cfg = load(name)
        bad_s, margin = check_steps(name, reqs, steps)
        bad_t = check_timeline(name, reqs, blis, steps)
        res, rsteps, last_end = resim(reqs, cfg)
        # the spec's wall-clock rule: E2E = end of the last step + a2*O + a1 - arrival
        bad_w = sum(1 for b in blis if b["e2e_us"] != last_end[b["row"]]
                    + A2 * reqs[b["row"]][3] + A1 - reqs[b["row"]][0])
        bad_r = sum(1 for b in blis if res[b["row"]] != (b["ttft_us"], b["e2e_us"]))
        for b in blis:
            if res[b["row"]] != (b["ttft_us"], b["e2e_us"]):
                print(f"  {name}: row {b['row']}: BLIS ttft/e2e {b['ttft_us']}/{b['e2e_us']}, "
                      f"re-sim {res[b['row']]}")
                break
        same_steps = [(s, d, ch) for s, d, ch, _ in rsteps] == [
            (s, d, chunks) for s, d, n, nd, ctx, chunks in steps]
        print(f"{name}: {len(reqs)} requests, {len(steps)} steps; step durations off: {bad_s}; "
              f"closest S to an integer: {float(margin[0]):.3g} (step at {margin[1]}); "
              f"TTFT off (from steps): {bad_t}; E2E off the wall-clock rule: {bad_w}; "
              f"re-sim rows off: {bad_r}; "
              f"re-sim steps identical: {same_steps}")
        ok = ok and not (bad_s or bad_t or bad_w or bad_r) and same_steps
    return ok


def go_vs_fraction(names):
    """The float64 replica of BLIS's StepTime against the Fractions, on every re-simulated
    step (the compact steps file does not keep each decode's ProgressIndex)."""
    diff = total = 0
    for name in names:
        reqs, blis, steps, cfg = load(name)
        _, rsteps, _ = resim(reqs, cfg)
        for t, dur, chunks, pis in rsteps:
            total += 1
            g = go_step([(k, reqs[r][2]) for r, pi, k in chunks], pis)
            if g != dur:
                diff += 1
                if diff <= 5:
                    print(f"  {name}: step at {t}: Go-float replica {g}, Fractions {dur}")
    print(f"Go-float replica vs collapsed Fractions: {diff} of {total} steps differ")
    return diff == 0


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.name[:-len(".config.json")] for p in DATA.glob("*.config.json"))
    ok = main(names)
    ok = go_vs_fraction(names) and ok
    sys.exit(0 if ok else 1)
