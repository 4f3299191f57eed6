"""Make the vllm_golden_more test data: traces, harness runs, reduced schedules.

Subcommands (see make.sh for the exact calls that made every file here):

  gen OUT.csv --n N --seed S --tenants K [--prompt LO:HI] [--output LO:HI] [--log-len]
      [--mean-gap G] [--priorities P0,P1,..] [--prefix-groups G --prefix-len LO:HI
      --prefix-frac F] [--late-tenants K2 --late-start T]
      A random trace, sorted by arrival (so a request's id is its 0-based row), with the
      shared goldens' columns: arrival,client,prompt,output[,priority][,prefix_id,prefix_len].
  run TRACE.csv HARNESS_ARGS... --out LOG.json --victims VICTIMS.json
  run --many FILE   (one such argument line per run, all in one process)
      harness.py's run() unchanged, with a read-only observer on vLLM's
      Scheduler._preempt_request recording, per preemption, the victim, the running
      request whose allocation failed (the caller's local `request`), and whether the victim
      had already been scheduled in this step. Needs the vLLM venv's python.
  reduce LOG.json TRACE_BASENAME OUT_PREFIX
      The harness's full log -> OUT_PREFIX.schedule.json and OUT_PREFIX.config.json with
      exactly the fields and layout of the goldens in tests/data/vllm_golden.

Plain python3 (no vLLM) is enough for gen and reduce.
"""

import argparse
import csv
import json
import math
import os
import random
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def span(text):
    """'LO:HI' -> (lo, hi) ints, lo <= hi."""
    lo, hi = (int(x) for x in text.split(":"))
    if lo > hi:
        raise argparse.ArgumentTypeError(f"{text}: LO > HI")
    return lo, hi


def draw(rng, lo_hi, log):
    """One int in [lo, hi]: uniform, or log-uniform (many short, some long) when log."""
    lo, hi = lo_hi
    if not log or lo == hi:
        return rng.randint(lo, hi)
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


def gen_rows(a):
    """The trace rows (dicts), sorted by arrival; same-step arrivals keep draw order."""
    rng = random.Random(a.seed)
    weights = [rng.uniform(0.5, 2.0) for _ in range(a.tenants)]
    prio = [int(p) for p in a.priorities.split(",")] if a.priorities else None
    if prio is not None and len(prio) != a.tenants:
        sys.exit("--priorities needs one value per tenant")
    plens = [draw(rng, a.prefix_len, False) for _ in range(a.prefix_groups)]
    early = list(range(a.tenants - a.late_tenants))
    late = list(range(a.tenants - a.late_tenants, a.tenants))
    rows, t = [], 0.0
    for _ in range(a.n):
        pool = late if late and t >= a.late_start else early
        ten = rng.choices(pool, weights=[weights[i] for i in pool])[0]
        row = {"arrival": int(t), "client": f"t{ten}",
               "prompt": draw(rng, a.prompt, a.log_len),
               "output": draw(rng, a.output, a.log_len)}
        if prio is not None:
            row["priority"] = prio[ten]
        if a.prefix_groups:
            row["prefix_id"], row["prefix_len"] = "", 0
            if rng.random() < a.prefix_frac:
                g = rng.randrange(a.prefix_groups)
                row["prefix_id"], row["prefix_len"] = f"sys{g}", plens[g]
                # The shared prefix must leave at least one token of its own.
                row["prompt"] = max(row["prompt"], plens[g] + 1 + rng.randrange(64))
        rows.append(row)
        t += rng.expovariate(1.0 / a.mean_gap) if a.mean_gap > 0 else 0.0
    rows.sort(key=lambda r: r["arrival"])
    return rows


def cmd_gen(argv):
    p = argparse.ArgumentParser(prog="tool.py gen")
    p.add_argument("out")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--tenants", type=int, default=2)
    p.add_argument("--prompt", type=span, default=(16, 700))
    p.add_argument("--output", type=span, default=(1, 200))
    p.add_argument("--log-len", action="store_true",
                   help="log-uniform prompt/output lengths instead of uniform")
    p.add_argument("--mean-gap", type=float, default=3.0,
                   help="mean inter-arrival in steps (0: all at step 0)")
    p.add_argument("--priorities", default="", help="per-tenant priority, e.g. 0,1,2")
    p.add_argument("--prefix-groups", type=int, default=0)
    p.add_argument("--prefix-len", type=span, default=(32, 256))
    p.add_argument("--prefix-frac", type=float, default=0.8)
    p.add_argument("--late-tenants", type=int, default=0,
                   help="the last K tenants send only from --late-start on, the others "
                        "only before it")
    p.add_argument("--late-start", type=float, default=0.0)
    a = p.parse_args(argv)
    rows = gen_rows(a)
    cols = ["arrival", "client", "prompt", "output"]
    if a.priorities:
        cols.append("priority")
    if a.prefix_groups:
        cols += ["prefix_id", "prefix_len"]
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([r[c] for c in cols])


class PreemptionObserver:
    """Wraps vLLM's Scheduler.schedule, Scheduler._preempt_request and
    KVCacheManager.allocate_slots to record, per preemption,
    [schedule_call_index, victim_id, requester_id, victim_already_scheduled] in .events.
    Observation only: the wrapped methods get the same arguments and return the same.
    "Already scheduled" = the victim got its slots earlier in the same schedule() call
    (vLLM hands its tokens back before _preempt_request, so it cannot be read there)."""

    def __init__(self):
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.sched.scheduler import Scheduler
        self.reset()
        obs = self
        orig_schedule, orig_preempt = Scheduler.schedule, Scheduler._preempt_request
        orig_allocate = KVCacheManager.allocate_slots

        def schedule(self, *args, **kw):
            obs.calls += 1
            obs.allocated.clear()
            return orig_schedule(self, *args, **kw)

        def allocate_slots(self, request, *args, **kw):
            blocks = orig_allocate(self, request, *args, **kw)
            if blocks is not None:
                obs.allocated.add(request.request_id)
            return blocks

        def preempt(self, request, *args, **kw):
            # The running-phase loop variable `request` is the one whose allocation failed.
            by = sys._getframe(1).f_locals.get("request")
            obs.events.append([obs.calls, request.request_id,
                               None if by is None else by.request_id,
                               request.request_id in obs.allocated])
            return orig_preempt(self, request, *args, **kw)

        Scheduler.schedule, Scheduler._preempt_request = schedule, preempt
        KVCacheManager.allocate_slots = allocate_slots

    def reset(self):
        self.calls = -1        # index of the current schedule() call in this run
        self.allocated = set()  # request ids that got slots in the current call
        self.events = []


def split_victims(argv):
    """(harness argv, victims path) from a run's argv."""
    if "--victims" not in argv:
        sys.exit("run needs --victims PATH")
    i = argv.index("--victims")
    return argv[:i] + argv[i + 2:], argv[i + 1]


def run_one(harness, observer, argv):
    """harness.run on argv (plus --victims PATH); writes the victims list there."""
    argv, victims_path = split_victims(argv)
    observer.reset()
    result = harness.run(harness.parse_args(argv))
    # Map schedule-call index -> the harness's step clock (sync: one record per call).
    clock = [s["step"] for s in result["steps"]]
    out = [{"step": clock[c], "victim": int(v), "by": None if b is None else int(b),
            "victim_already_scheduled": sch} for c, v, b, sch in observer.events]
    with open(victims_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))


def cmd_run(argv):
    """run ARGS... (one run) or run --many FILE (one run per line of FILE, one process:
    vLLM's import costs more than most runs)."""
    sys.path.insert(0, HERE)
    import harness  # sets vLLM's environment variables before vllm is imported
    observer = PreemptionObserver()
    if argv[:1] == ["--many"]:
        with open(argv[1]) as f:
            runs = [shlex.split(line) for line in f if line.strip()]
    else:
        runs = [argv]
    for run_argv in runs:
        run_one(harness, observer, run_argv)


def reduce_log(log):
    """Full harness log -> (schedule, config) dicts in the shared goldens' layout.
    Request ids are the zero-padded rows; the goldens key by the plain row number."""
    def row(rid):
        return str(int(rid))
    steps = [{"step": s["step"],
              "sched": {row(k): v for k, v in s["sched"].items()},
              "preempted": [int(r) for r in s["preempted"]],
              "finished": [int(r) for r in s["finished"]]} for s in log["steps"]]
    reqs = {row(r["id"]): {"first_token_step": r["first_token_step"],
                           "finish_step": r["finish_step"],
                           "preemptions": r["preemptions"]} for r in log["requests"]}
    schedule = {"steps": steps, "requests": reqs, "num_steps": log["num_steps"],
                "total_preemptions": log["total_preemptions"], "stalled": log["stalled"]}
    a = log["args"]
    config = {"block_size": a["block_size"], "num_blocks": a["num_blocks"],
              "max_num_batched_tokens": a["max_num_batched_tokens"],
              "max_num_seqs": a["max_num_seqs"], "chunked_prefill": a["chunked_prefill"],
              "policy": a["policy"], "prefix_caching": a["prefix_caching"],
              "long_prefill_threshold": a["long_prefill_threshold"],
              "vllm_version": log["vllm_version"], "effective": log["effective_config"]}
    return schedule, config


def cmd_reduce(argv):
    p = argparse.ArgumentParser(prog="tool.py reduce")
    p.add_argument("log")
    p.add_argument("out_prefix")
    a = p.parse_args(argv)
    with open(a.log) as f:
        log = json.load(f)
    if log["args"]["scheduler"] != "sync":
        sys.exit("the goldens are sync-scheduler runs")
    schedule, config = reduce_log(log)
    with open(a.out_prefix + ".schedule.json", "w") as f:
        json.dump(schedule, f, separators=(",", ":"))
    with open(a.out_prefix + ".config.json", "w") as f:
        json.dump(config, f, indent=1)


def self_preemptions(events):
    """Steps at which a running request preempted itself (victim == requester)."""
    return [e["step"] for e in events if e["victim"] == e["by"]]


def went_on(log, events):
    """Steps of events whose victim had running requests behind it (in the running order
    at the step's start) that were still scheduled in that step: the running phase went
    on past the victim. Running at a step's start = the previous step's running list
    (after its schedule) less the requests it finished."""
    by_step = {s["step"]: (i, s) for i, s in enumerate(log["steps"])}
    width = max(4, len(str(log["num_requests"])))  # harness.py's zero-padded request ids
    out = []
    for e in events:
        i, s = by_step[e["step"]]
        if i == 0:
            continue
        prev = log["steps"][i - 1]
        start = [r for r in prev["running"] if r not in prev["finished"]]
        victim = str(e["victim"]).zfill(width)
        if victim in start and any(r in s["sched"] for r in start[start.index(victim) + 1:]):
            out.append(e["step"])
    return out


def case_stats(log, events):
    """One README table row's numbers for one run (full log + victims list)."""
    a, bs = log["args"], log["args"]["block_size"]
    reqs = {int(r["id"]): r for r in log["requests"]}
    # Re-admissions after a preemption: [row, step, hit tokens, shared-prefix tokens].
    resumed = [[int(r["id"]), step, hit, r["prefix_len"]] for r in reqs.values()
               for step, hit in zip(r["admissions"][1:], r["prefix_hit_tokens"][1:])]
    # Hits beyond the shared prefix's full blocks can only be the request's own blocks.
    own = [x for x in resumed if x[2] > (x[3] // bs) * bs]
    # A first admission hitting less than its group's full shared blocks although another
    # member had got its first token earlier (so all the shared blocks had been computed and
    # hashed): they had been evicted (reused, LRU) in between. [row, step, hit, shared]
    done = {}  # prefix_id -> earliest first_token_step of a member
    for r in reqs.values():
        if r["prefix_id"] is not None and r["first_token_step"] is not None:
            done[r["prefix_id"]] = min(done.get(r["prefix_id"], r["first_token_step"]),
                                       r["first_token_step"])
    evicted = []
    for s in log["steps"]:
        for rid in s["admitted"]:
            r = reqs[int(rid)]
            if r["prefix_id"] is None or s["step"] != r["admissions"][0]:
                continue
            shared = (min(r["prefix_len"], r["prompt"] - 1) // bs) * bs
            if done[r["prefix_id"]] < s["step"] and s["prefix_hit"][rid] < shared:
                evicted.append([int(rid), s["step"], s["prefix_hit"][rid], shared])
    lpt = a["long_prefill_threshold"]
    capped = max((sum(1 for v in s["sched"].values() if v == lpt) for s in log["steps"]),
                 default=0) if lpt else 0
    return {
        "requests": log["num_requests"],
        "tenants": len({r["client"] for r in reqs.values()}),
        "steps": log["num_steps"], "preemptions": log["total_preemptions"],
        "self": self_preemptions(events),
        "self_went_on": went_on(log, [e for e in events if e["victim"] == e["by"]]),
        "giveback": [e["step"] for e in events if e["victim_already_scheduled"]],
        "giveback_mid": went_on(log, [e for e in events if e["victim_already_scheduled"]]),
        "resumed_hits": sum(1 for x in resumed if x[2] > 0),
        "resumed_own_blocks": len(own), "resumed_own_example": own[:1],
        "evicted_prefix_admissions": len(evicted), "evicted_example": evicted[:1],
        "max_capped_chunks": capped, "stalled": log["stalled"],
    }


def cmd_finish(argv):
    """finish TMP DEST NAME...: reduce TMP/NAME.json into DEST, write DEST/victims.json
    (every preemption of every case), keep TMP/NAME.json as DEST/NAME.full.json where a
    priority run preempted a request by itself and the log is under 2 MB, and print one
    JSON line of case_stats per case (for the README)."""
    tmp, dest, names = argv[0], argv[1], argv[2:]
    victims = {}
    for name in names:
        with open(os.path.join(tmp, name + ".json")) as f:
            log = json.load(f)
        with open(os.path.join(tmp, name + ".victims.json")) as f:
            victims[name] = json.load(f)
        schedule, config = reduce_log(log)
        prefix = os.path.join(dest, name)
        with open(prefix + ".schedule.json", "w") as f:
            json.dump(schedule, f, separators=(",", ":"))
        with open(prefix + ".config.json", "w") as f:
            json.dump(config, f, indent=1)
        if (log["args"]["policy"] == "priority" and self_preemptions(victims[name])
                and os.path.getsize(os.path.join(tmp, name + ".json")) < 2_000_000):
            # Paths relative to this folder, so only wall_s differs between reruns.
            log["args"].update(trace=name + ".csv", out=name + ".full.json")
            with open(prefix + ".full.json", "w") as f:
                json.dump(log, f, separators=(",", ":"))
        print(json.dumps({"case": name, **case_stats(log, victims[name])}))
    with open(os.path.join(dest, "victims.json"), "w") as f:
        json.dump(victims, f, separators=(",", ":"))


if __name__ == "__main__":
    cmds = {"gen": cmd_gen, "run": cmd_run, "reduce": cmd_reduce, "finish": cmd_finish}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])
