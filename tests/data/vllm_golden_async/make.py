"""Make tests/data/vllm_golden_async: every golden trace of tests/data/vllm_golden (gNNN)
and tests/data/vllm_golden_more (mNNN) rerun under vLLM's AsyncScheduler, reduced to the
goldens' compact layout.

  VENV/bin/python make.py run [NAME ...]    # harness.py --scheduler async, all in one process

`run` needs a venv holding vllm==0.33.0 (outside the repository; the project never imports
vLLM). Each case is harness.py's run() on the source golden's CSV with the source golden's
settings (its config.json) plus `--scheduler async`, seed 0 and everything else at the
harness's defaults, exactly as `VENV/bin/python harness.py NAME.csv ARGS --scheduler async
--out LOG.json` would run it; the full log is reduced by `reduce_log` (below) and not kept.
"""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
SOURCES = ("vllm_golden", "vllm_golden_more")


def onoff(flag: bool) -> str:
    return "on" if flag else "off"


def harness_args(config: dict) -> list:
    """A source golden's config.json as harness.py's arguments (async added)."""
    return ["--block-size", str(config["block_size"]), "--num-blocks", str(config["num_blocks"]),
            "--max-num-batched-tokens", str(config["max_num_batched_tokens"]),
            "--max-num-seqs", str(config["max_num_seqs"]), "--chunked-prefill", onoff(config["chunked_prefill"]),
            "--policy", config["policy"], "--prefix-caching", onoff(config["prefix_caching"]),
            "--long-prefill-threshold", str(config["long_prefill_threshold"]), "--scheduler", "async"]


def cases() -> list:
    """(source folder, name) of every source golden, in name order."""
    out = []
    for source in SOURCES:
        folder = os.path.join(DATA, source)
        out += [(folder, f[: -len(".config.json")]) for f in sorted(os.listdir(folder)) if f.endswith(".config.json")]
    return out


def reduce_log(log: dict) -> tuple:
    """The harness's full async log -> (schedule, config) in the goldens' layout, one
    record per schedule() call. The harness also writes a record without a schedule
    (`no_schedule`) when nothing is left to schedule but one batch's output is still in
    the queue: it only processes that output (an empty schedule's: nothing is sampled, so
    nothing finishes) and is dropped here. A record's `finished` are the requests whose
    stop the update processed right after that schedule call (`update_of_step`: always
    the previous schedule call's step; a call made while nothing was in the queue has no
    update: []), so they finish one call after the step that sampled their last token;
    `requests[row].finish_step` is that sampling step (the harness's `finish_step`)."""
    steps, previous = [], None
    for s in log["steps"]:
        if s.get("no_schedule"):
            assert not s["sched"] and not s["finished"], s
            previous = None  # the queue is empty after it
            continue
        if "update_of_step" in s:
            assert s["update_of_step"] == previous, (s["step"], s["update_of_step"], previous)
        steps.append({"step": s["step"], "sched": {str(int(k)): v for k, v in s["sched"].items()},
                      "preempted": [int(r) for r in s["preempted"]],
                      "finished": [int(r) for r in s.get("finished", [])]})
        previous = s["step"]
    reqs = {str(int(r["id"])): {"first_token_step": r["first_token_step"], "finish_step": r["finish_step"],
                                "preemptions": r["preemptions"]} for r in log["requests"]}
    schedule = {"steps": steps, "requests": reqs, "num_steps": len(steps),
                "total_preemptions": log["total_preemptions"], "stalled": log["stalled"]}
    a = log["args"]
    config = {"block_size": a["block_size"], "num_blocks": a["num_blocks"],
              "max_num_batched_tokens": a["max_num_batched_tokens"], "max_num_seqs": a["max_num_seqs"],
              "chunked_prefill": a["chunked_prefill"], "policy": a["policy"], "prefix_caching": a["prefix_caching"],
              "long_prefill_threshold": a["long_prefill_threshold"], "async_scheduling": a["scheduler"] == "async",
              "vllm_version": log["vllm_version"], "effective": log["effective_config"]}
    return schedule, config


def write(name: str, log: dict) -> dict:
    schedule, config = reduce_log(log)
    with open(os.path.join(HERE, name + ".schedule.json"), "w") as f:
        json.dump(schedule, f, separators=(",", ":"))
    with open(os.path.join(HERE, name + ".config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return {"case": name, "steps": schedule["num_steps"], "records": log["num_steps"],
            "preemptions": log["total_preemptions"], "stalled": log["stalled"], "finished": log["num_finished"],
            "requests": log["num_requests"], "wall_s": log["wall_s"]}


def cmd_run(names: list) -> None:
    sys.path.insert(0, os.path.join(DATA, "vllm_golden_more"))
    import harness  # the shared harness, unchanged; sets vLLM's environment before importing it
    import tempfile
    tmp = tempfile.mkdtemp()
    try:
        for folder, name in cases():
            if names and name not in names:
                continue
            with open(os.path.join(folder, name + ".config.json")) as f:
                config = json.load(f)
            shutil.copyfile(os.path.join(folder, name + ".csv"), os.path.join(HERE, name + ".csv"))
            out = os.path.join(tmp, name + ".json")
            harness.run(harness.parse_args([os.path.join(HERE, name + ".csv"), *harness_args(config), "--quiet",
                                            "--out", out]))
            with open(out) as f:
                print(json.dumps(write(name, json.load(f))), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        cmd_run(sys.argv[2:])
    else:
        sys.exit(__doc__)
