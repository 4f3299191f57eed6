"""Hostile input across every command: one line naming the problem, the exit status, and
no files left behind.

Each case runs a command in-process (its `main(argv)`) on a prepared directory and
asserts: the exit status (2 for bad input), stderr is exactly one line that names the
problem (the expected words), no traceback, and no output file was written. The CSV
reader of `replay` has its own cases in test_cli.py; the closed pipe and Ctrl-C run real
processes at the end.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import exit_code

ROOT = Path(__file__).resolve().parent.parent

FILES = {
    "ok.csv": "arrival,client,prompt,output\n0,0,10,5\n1,1,20,3\n",
    "big_prompt.csv": "arrival,client,prompt,output\n0,0,5000,5\n",
    "neg.csv": "arrival,client,prompt,output\n-1,0,10,5\n",
    "header_only.csv": "arrival,client,prompt,output\n",
    "empty.csv": "",
    "log.csv": "timestamp,tenant,prompt,output\n0.0,a,10,5\n0.5,b,20,3\n",
    "bad_log.csv": "timestamp,tenant,prompt,output\n0.0,a,10,5\nsoon,b,20,3\n",
    "bad_policy.py": "def broken(:\n",
    "no_policy.py": "x = 1\n",
    "raises_policy.py": "raise RuntimeError('boom')\n",
    # the artifact profile's inputs (sweeps.paper, sweeps.calibrate)
    "art.csv": "arrival_s,client,prompt,output\n0.0,0,10,5\n0.5,1,20,3\n",
    "art_bad.csv": "arrival_s,client,prompt,output\n0.0,0,10,5\nlater,1,20,3\n",
    "art_nan.csv": "arrival_s,client,prompt,output\nnan,0,10,5\n",
    "art_client.csv": "arrival_s,client,prompt,output\n0.0,-1,10,5\n",
    "art_prompt.csv": "arrival_s,client,prompt,output\n0.0,0,0,5\n",
    "art_late.csv": "arrival_s,client,prompt,output\n1e30,0,10,5\n",
    "art_wide.csv": "arrival_s,client,prompt,output\n0.0,99999999999,10,5\n",
    "art_long.csv": "arrival_s,client,prompt,output\n0.0,0,99999999999,5\n",
    "step.json": '{"prefill_per_token": 0.0001, "speed": 3}',
    "step_neg.json": '{"decode_base": -1}',
    "step_list.json": "[1, 2]",
    "not_json.json": "{prefill",
    "profile_neg.csv": "batch_size,context_tokens,prompt_tokens,step_time_s\n-1,0,0,0.01\n",
    "profile_nan.csv": "batch_size,context_tokens,prompt_tokens,step_time_s\n1,10,0,nan\n",
    "profile_zero.csv": "batch_size,context_tokens,prompt_tokens,step_time_s\n1,10,0,0\n",
    "profile_fields.csv": "batch_size,context_tokens,prompt_tokens,step_time_s\n1,10,0\n",
    "profile_quote.csv": 'batch_size,context_tokens,prompt_tokens,step_time_s\n1,10,"0\n',
    "profile_big.csv": "batch_size,context_tokens,prompt_tokens,step_time_s\n" + "1" * 30 + ",10,0,0.01\n",
    "profile_few.csv": "batch_size,context_tokens,prompt_tokens,step_time_s\n1,10,0,0.01\n1,10,5,0.02\n",
    "profile_flat.csv": "batch_size,context_tokens,prompt_tokens,step_time_s\n"
                        "1,10,0,0.01\n1,10,0,0.01\n1,10,0,0.01\n1,10,5,0.02\n",
    "profile_header.csv": "batch_size,context_tokens,prompt_tokens,step_time_s\n",
    "profile_extra.csv": "batch_size,context_tokens,prompt_tokens,step_time_s,gpu\n1,10,0,0.01,a\n",
    "profile_missing.csv": "batch_size,context_tokens,step_time_s\n1,10,0.01\n",
    # public formats (the reader layer): each one's hostile files
    "az_ok.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n",
    "az_date.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:15:46.68,374,44\n",
    "az_zero.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,0\n",
    "az_neg.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,-3,4\n",
    "az_missing.csv": "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n",
    "mc_cut.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": 3000, "input_len',
    "mc_field.jsonl": '{"timestamp": 0, "input_length": 10}\n',
    "mc_nan.jsonl": '{"timestamp": NaN, "input_length": 10, "output_length": 5}\n',
    "mc_neg.jsonl": '{"timestamp": -5, "input_length": 10, "output_length": 5}\n',
    "mc_zero.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": 0}\n',
    "mc_float.jsonl": '{"timestamp": 0, "input_length": 10.5, "output_length": 5}\n',
    "bg_ok.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,300,20,320,Conversation log\n",
    "bg_zero.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,0,20,20,API log\n",
    "bg_nan.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nnan,ChatGPT,3,20,23,API log\n",
    "bg_neg.csv": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n-1,ChatGPT,3,20,23,API log\n",
    "log_bom_bad.csv": "\ufefftimestamp,tenant,prompt,output\n0,a,10,x\n",
    "log_ms.csv": "timestamp,tenant,prompt,output\n" + "".join(f"{1764460800000 + 6000 * i},a,10,5\n" for i in range(150)),
}
BINARY = {"junk.bin": bytes(range(256)) * 8, "nul.csv": b"arrival,client,prompt,output\n0,0,\x00,5\n",
          "nul.json": b'{"decode_base": \x00}'}

CLI = "vtc_jax.cli.commands"
# (id, module, argv, exit status, words of the one line). {d} is the case directory.
CASES = [
    # ---- replay --------------------------------------------------------------------
    ("replay-missing-file", CLI, ["replay", "{d}/nope.csv", "--policy", "vtc", "--kv-budget", "100"], 2, "nope.csv"),
    ("replay-directory", CLI, ["replay", "{d}", "--policy", "vtc", "--kv-budget", "100"], 2, "is a directory"),
    ("replay-binary", CLI, ["replay", "{d}/junk.bin", "--policy", "vtc", "--kv-budget", "100"], 2, "UTF-8"),
    ("replay-nul", CLI, ["replay", "{d}/nul.csv", "--policy", "vtc", "--kv-budget", "100"], 2, "NUL"),
    ("replay-dev-zero", CLI, ["replay", "/dev/zero", "--policy", "vtc", "--kv-budget", "100"], 2, "NUL"),
    ("replay-empty", CLI, ["replay", "{d}/empty.csv", "--policy", "vtc", "--kv-budget", "100"], 2, "empty"),
    ("replay-header-only", CLI, ["replay", "{d}/header_only.csv", "--policy", "vtc", "--kv-budget", "100"], 2,
     "no requests"),
    ("replay-negative-arrival", CLI, ["replay", "{d}/neg.csv", "--policy", "vtc", "--kv-budget", "100"], 2,
     "line 2: arrival must be a non-negative integer"),
    ("replay-prompt-over-m", CLI, ["replay", "{d}/big_prompt.csv", "--policy", "vtc", "--kv-budget", "100"], 2,
     "every request's prompt exceeds the server's memory of 100 tokens"),
    ("replay-unknown-policy", CLI, ["replay", "{d}/ok.csv", "--policy", "nope", "--kv-budget", "100"], 2,
     "invalid choice"),
    ("replay-no-budget", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc"], 2, "--kv-budget"),
    ("replay-zero-budget", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "0"], 2, "must be >= 1"),
    ("replay-huge-budget", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "99999999999"], 2,
     "--kv-budget"),
    ("replay-w-p-division", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--w-p", "1/0"],
     2, "w_p"),
    ("replay-w-q-negative", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--w-q", "-2"], 2,
     "w_q"),
    ("replay-beta-nan", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--beta", "nan"], 2,
     "beta"),
    ("replay-weights-zero", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--weights", "1,0"],
     2, "weight"),
    ("replay-weights-count", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--weights",
                                   "1,2,3"], 2, "weights"),
    ("replay-weights-fcfs", CLI, ["replay", "{d}/ok.csv", "--policy", "fcfs", "--kv-budget", "100", "--weights", "1,2"],
     2, "ignores client weights"),
    ("replay-rpm-without-limit", CLI, ["replay", "{d}/ok.csv", "--policy", "rpm", "--kv-budget", "100"], 2, "--rpm"),
    ("replay-rpm-zero", CLI, ["replay", "{d}/ok.csv", "--policy", "rpm", "--kv-budget", "100", "--rpm", "0"], 2,
     "must be >= 1"),
    ("replay-rpm-mode-alone", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--rpm-mode",
                                    "reject"], 2, "--rpm-mode needs --rpm"),
    ("replay-estimator-vtc", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--estimator",
                                   "fixed"], 2, "does not predict outputs"),
    ("replay-option-vtc", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--option", "x=1"],
     2, "no options"),
    ("replay-option-unknown", CLI, ["replay", "{d}/ok.csv", "--policy", "drr", "--kv-budget", "100", "--option",
                                    "speed=1"], 2, "speed"),
    ("replay-no-last-left-fcfs", CLI, ["replay", "{d}/ok.csv", "--policy", "fcfs", "--kv-budget", "100",
                                       "--no-last-left"], 2, "no lift"),
    ("replay-steps-zero", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--steps", "0"], 2,
     "must be >= 1"),
    ("replay-steps-2-31", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--steps",
                                "2147483647"], 2, "--steps"),
    ("replay-record-every-tiny", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--steps",
                                       "1000000000", "--record-every", "1"], 2, "--record-every"),
    ("replay-clients-too-few", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--clients",
                                     "1"], 2, "client id outside --clients 1"),
    ("replay-share-window-bad", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100",
                                      "--share-window", "5,2"], 2, "--share-window"),
    ("replay-json-in-missing-dir", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--json",
                                         "{d}/no/such/dir/out.json"], 2, "cannot write"),
    ("replay-json-is-dir", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--json", "{d}"],
     2, "cannot write"),
    ("replay-policy-module-missing", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100",
                                           "--policy-module", "{d}/none.py"], 2, "no such file"),
    ("replay-policy-module-syntax", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100",
                                          "--policy-module", "{d}/bad_policy.py"], 2, "SyntaxError"),
    ("replay-policy-module-raises", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100",
                                          "--policy-module", "{d}/raises_policy.py"], 2, "boom"),
    ("replay-unknown-flag", CLI, ["replay", "{d}/ok.csv", "--policy", "vtc", "--kv-budget", "100", "--fast"], 2,
     "unrecognized arguments"),
    ("no-command", CLI, [], 2, "command"),
    ("unknown-command", CLI, ["frobnicate"], 2, "invalid choice"),
    # ---- compare -------------------------------------------------------------------
    ("compare-missing", CLI, ["compare", "{d}/nope.csv", "--kv-budget", "100", "--out", "{d}/out"], 2, "nope.csv"),
    ("compare-bad-log", CLI, ["compare", "{d}/bad_log.csv", "--kv-budget", "100", "--out", "{d}/out"], 2,
     "line 3: timestamp"),
    ("compare-unknown-policy", CLI, ["compare", "{d}/ok.csv", "--policies", "vtc,nope", "--kv-budget", "100",
                                     "--out", "{d}/out"], 2, "unknown policy 'nope'"),
    ("compare-duplicate-policy", CLI, ["compare", "{d}/ok.csv", "--policies", "vtc,vtc", "--kv-budget", "100",
                                       "--out", "{d}/out"], 2, "twice"),
    ("compare-weights-count", CLI, ["compare", "{d}/log.csv", "--policies", "vtc", "--kv-budget", "100",
                                    "--weights", "1,2,3", "--out", "{d}/out"], 2, "3 weights for the log's 2 tenants"),
    ("compare-weights-unread", CLI, ["compare", "{d}/ok.csv", "--policies", "fcfs,rpm", "--rpm", "5",
                                     "--kv-budget", "100", "--weights", "1,2", "--out", "{d}/out"], 2,
     "ignores client weights"),
    ("compare-step-seconds-zero", CLI, ["compare", "{d}/log.csv", "--kv-budget", "100", "--step-seconds", "0",
                                        "--out", "{d}/out"], 2, "--step-seconds"),
    ("compare-seeds-zero", CLI, ["compare", "{d}/log.csv", "--kv-budget", "100", "--seeds", "0", "--out",
                                 "{d}/out"], 2, "--seeds"),
    ("compare-prompt-over-m", CLI, ["compare", "{d}/big_prompt.csv", "--kv-budget", "100", "--out", "{d}/out"], 2,
     "every request's prompt exceeds the server's memory of 100 tokens"),
    ("compare-out-is-file", CLI, ["compare", "{d}/ok.csv", "--kv-budget", "100", "--out", "{d}/ok.csv"], 2,
     "cannot write"),
    ("compare-dev-zero", CLI, ["compare", "/dev/zero", "--kv-budget", "100", "--out", "{d}/out"], 2, "NUL"),
    # ---- gen -----------------------------------------------------------------------
    ("gen-no-tenant", CLI, ["gen", "--out", "{d}/g.csv"], 2, "--tenant"),
    ("gen-no-rate", CLI, ["gen", "--out", "{d}/g.csv", "--tenant", "prompt=1:2"], 2, "rate=R"),
    ("gen-negative-rate", CLI, ["gen", "--out", "{d}/g.csv", "--tenant", "rate=-1"], 2, "bad rate"),
    ("gen-bad-pattern", CLI, ["gen", "--out", "{d}/g.csv", "--tenant", "rate=1,pattern=wave"], 2, "bad pattern"),
    ("gen-too-many-requests", CLI, ["gen", "--out", "{d}/g.csv", "--steps", "60000000", "--tenant", "rate=1000"], 2,
     "over the limit"),
    ("gen-out-in-missing-dir", CLI, ["gen", "--out", "{d}/no/dir/g.csv", "--tenant", "rate=1"], 2, "cannot write"),
    ("gen-steps-zero", CLI, ["gen", "--out", "{d}/g.csv", "--tenant", "rate=1", "--steps", "0"], 2, "must be >= 1"),
    ("gen-on-off-period", CLI, ["gen", "--out", "{d}/g.csv", "--tenant", "rate=1,pattern=on_off:0"], 2,
     "on_off period"),
    ("policies-extra-argument", CLI, ["policies", "vtc"], 2, "unrecognized arguments"),
]

SWEEP_COMMON = [  # (suffix, argv, words): flags every sweep shares
    ("seeds-zero", ["--seeds", "0"], "--seeds"),
    ("seeds-text", ["--seeds", "many"], "must be an integer"),
    ("seeds-1e12", ["--seeds", "1000000000000"], "--seeds"),
    ("chunk-zero", ["--chunk", "0"], "--chunk"),
    ("base-seed-negative", ["--base-seed", "-1"], "--base-seed"),
    ("devices-zero", ["--devices", "0"], "--devices"),
    ("devices-too-many", ["--seeds", "2", "--devices", "4096"], "--devices"),
    ("measures-unknown", ["--seeds", "2", "--measures", "speed"], "unknown measure"),
    ("out-under-file", ["--seeds", "2", "--out", "{d}/ok.csv/out"], "cannot write"),
    ("out-is-file", ["--seeds", "2", "--out", "{d}/ok.csv"], "cannot write"),
    ("out-csv-is-dir", ["--seeds", "2", "--out", "{d}/csvdir"], "results.csv: it is a directory"),
    ("cache-dir-under-file", ["--seeds", "2", "--cache-dir", "{d}/ok.csv/cache"], "compilation cache"),
    ("policy-module-missing", ["--seeds", "2", "--policy-module", "{d}/none.py"], "no such file"),
    ("policy-module-empty", ["--seeds", "2", "--policy-module", "{d}/no_policy.py"], "defines no POLICY"),
    ("unknown-flag", ["--seeds", "2", "--turbo"], "unrecognized arguments"),
]
SWEEPS = ["schedulers", "return_after_silence", "kv_budget", "rpm", "kv_cap", "prefix_cache", "context_cost",
          "beta_tune", "policies", "tenants", "kv_blocks"]
for _name in SWEEPS:
    for _suffix, _argv, _words in SWEEP_COMMON:
        CASES.append((f"{_name}-{_suffix}", f"sweeps.{_name}", _argv + ["--out", "{d}/out"] * ("--out" not in _argv),
                      2, _words))

WORKLOAD = [  # the seed workload's flags (sweeps with add_workload_arguments)
    ("rates-negative", ["--rates", "-1,1"], "--rates"),
    ("rates-nan", ["--rates", "nan,1"], "finite"),
    ("rates-empty-item", ["--rates", "1,,2"], "comma-separated"),
    ("steps-2-31", ["--steps", "2147483648"], "--steps"),
    ("prompt-reversed", ["--prompt", "512,64"], "LOW <= HIGH"),
    ("output-zero", ["--output", "0,3"], "LOW <= HIGH"),
    ("w-p-division", ["--seeds", "1", "--w-p", "1/0"], "w_p"),
    ("w-q-huge-exponent", ["--w-q", "1e999"], "exponent"),
    ("weights-zero", ["--seeds", "1", "--weights", "1,0"], "weight"),
    ("trace-missing", ["--seeds", "1", "--trace", "{d}/none.csv"], "none.csv"),
    ("trace-binary", ["--seeds", "1", "--trace", "{d}/junk.bin"], "UTF-8"),
    ("trace-dev-zero", ["--seeds", "1", "--trace", "/dev/zero"], "NUL"),
]
for _name in ("schedulers", "kv_budget", "rpm", "kv_cap", "context_cost"):
    for _suffix, _argv, _words in WORKLOAD:
        if _name == "context_cost" and _suffix.startswith("trace"):
            continue
        CASES.append((f"{_name}-{_suffix}", f"sweeps.{_name}", _argv + ["--out", "{d}/out"], 2, _words))

CASES += [
    ("return-one-rate", "sweeps.return_after_silence", ["--rates", "1", "--out", "{d}/out"], 2, "two rates"),
    ("kv-budget-zero-budget", "sweeps.kv_budget", ["--budgets", "0,1024", "--out", "{d}/out"], 2, "--budgets"),
    ("kv-budget-has-no-kv-budget", "sweeps.kv_budget", ["--kv-budget", "100", "--out", "{d}/out"], 2,
     "unrecognized arguments"),
    ("rpm-limit-zero", "sweeps.rpm", ["--limits", "0", "--out", "{d}/out"], 2, "--limits"),
    ("rpm-mode-unknown", "sweeps.rpm", ["--rpm-mode", "drop", "--out", "{d}/out"], 2, "--rpm-mode"),
    ("kv-cap-zero", "sweeps.kv_cap", ["--caps", "0", "--out", "{d}/out"], 2, "--caps"),
    ("prefix-cache-fraction", "sweeps.prefix_cache", ["--cached", "2", "--out", "{d}/out"], 2, "--cached"),
    ("context-cost-trace-refused", "sweeps.context_cost", ["--trace", "{d}/ok.csv", "--out", "{d}/out"], 2,
     "--trace does not apply"),
    ("context-cost-beta-division", "sweeps.context_cost", ["--seeds", "1", "--betas", "1/0", "--out", "{d}/out"], 2,
     "beta"),
    ("context-cost-beta-negative", "sweeps.context_cost", ["--seeds", "1", "--betas", "-1", "--out", "{d}/out"], 2,
     "beta"),
    ("policies-unknown-policy", "sweeps.policies", ["--policy", "nope", "--out", "{d}/out"], 2, "unknown policy"),
    ("policies-unknown-workload", "sweeps.policies", ["--workloads", "storm", "--out", "{d}/out"], 2,
     "unknown workload"),
    ("policies-steps-stride", "sweeps.policies", ["--steps", "1001", "--out", "{d}/out"], 2, "multiple of 300"),
    ("policies-error-without-noisy", "sweeps.policies", ["--estimate-error", "1/2", "--out", "{d}/out"], 2,
     "--estimator noisy"),
    ("tenants-no-data", "sweeps.tenants", ["--data", "{d}/none", "--out", "{d}/out"], 2, "not a directory"),
    ("tenants-empty-data", "sweeps.tenants", ["--data", "{d}/emptydir", "--out", "{d}/out"], 2, "emptydir"),
    ("tenants-load-zero", "sweeps.tenants", ["--load", "0", "--out", "{d}/out"], 2, "--load"),
    ("tenants-load-nan", "sweeps.tenants", ["--load", "nan", "--out", "{d}/out"], 2, "finite"),
    ("tenants-unknown-policy", "sweeps.tenants", ["--policy", "nope", "--out", "{d}/out"], 2, "unknown policy"),
]


HUGE = str(10**30)
P, CAL, CLU, ADV = "sweeps.paper", "sweeps.calibrate", "sweeps.cluster", "sweeps.adversary"
_CMP = ["compare", "--kv-budget", "100000", "--out", "{d}/out", "--no-plots"]
CASES += [
    # ---- the public formats through compare and replay (the reader layer) ------------
    ("format-azure-date", CLI, _CMP + ["{d}/az_date.csv"], 2, "az_date.csv: line 2"),
    ("format-azure-zero-output", CLI, _CMP + ["{d}/az_zero.csv"], 2, "GeneratedTokens"),
    ("format-azure-negative", CLI, _CMP + ["{d}/az_neg.csv"], 2, "ContextTokens"),
    ("format-azure-missing-column", CLI, _CMP + ["{d}/az_missing.csv", "--format", "azure"], 2, "GeneratedTokens"),
    ("format-azure-time-unit", CLI, _CMP + ["{d}/az_ok.csv", "--time-unit", "ms"], 2, "wall-clock"),
    ("format-mooncake-truncated", CLI, _CMP + ["{d}/mc_cut.jsonl"], 2, "mc_cut.jsonl: line 2"),
    ("format-mooncake-missing-field", CLI, _CMP + ["{d}/mc_field.jsonl"], 2, "output_length"),
    ("format-mooncake-nan", CLI, _CMP + ["{d}/mc_nan.jsonl"], 2, "line 1: NaN is not a number"),
    ("format-mooncake-negative", CLI, _CMP + ["{d}/mc_neg.jsonl"], 2, "timestamp"),
    ("format-mooncake-zero-output", CLI, _CMP + ["{d}/mc_zero.jsonl"], 2, "output_length"),
    ("format-mooncake-float-length", CLI, _CMP + ["{d}/mc_float.jsonl"], 2, "input_length"),
    ("format-burstgpt-zero-request", CLI, _CMP + ["{d}/bg_zero.csv"], 2, "Request tokens"),
    ("format-burstgpt-nan", CLI, _CMP + ["{d}/bg_nan.csv"], 2, "Timestamp"),
    ("format-burstgpt-negative", CLI, _CMP + ["{d}/bg_neg.csv"], 2, "Timestamp"),
    ("format-burstgpt-tenant-column", CLI, _CMP + ["{d}/bg_ok.csv", "--tenant-from", "Region"], 2, "Region"),
    ("format-log-bom-bad-output", CLI, _CMP + ["{d}/log_bom_bad.csv"], 2, "line 2: output"),
    ("format-ms-read-as-seconds", CLI, _CMP + ["{d}/log_ms.csv"], 2, "--time-unit ms"),
    ("format-mixed-formats", CLI, _CMP + ["{d}/az_ok.csv", "{d}/bg_ok.csv"], 2, "give files of one format"),
    ("format-unknown-format", CLI, _CMP + ["{d}/az_ok.csv", "--format", "parquet"], 2, "invalid choice"),
    ("format-tenants-bad-split", CLI, _CMP + ["{d}/az_ok.csv", "--tenants", "a:0"], 2, "--tenants"),
    ("format-window-empty", CLI, _CMP + ["{d}/az_ok.csv", "--time-window", "100,5"], 2, "no request arrives"),
    ("format-window-huge", CLI, _CMP + ["{d}/az_ok.csv", "--time-window", "1e300,5"], 2, "--time-window"),
    ("format-window-long", CLI, _CMP + ["{d}/az_ok.csv", "--time-window", "0,1e300"], 2, "--time-window"),
    ("format-window-trace", CLI, _CMP + ["{d}/ok.csv", "--time-window", "0,5"], 2, "a trace is in steps"),
    ("format-replay-mooncake-truncated", CLI, ["replay", "{d}/mc_cut.jsonl", "--policy", "vtc", "--kv-budget", "100"],
     2, "mc_cut.jsonl: line 2"),
    ("format-replay-vllm-trace-timed", CLI, ["compare", "{d}/ok.csv", "--server", "vllm", "--preset",
                                             "qwen2.5-7b-h100", "--out", "{d}/out"], 2, "has no times"),
]
CASES += [
    # ---- sweeps.paper (the artifact profile) -------------------------------------------------
    ("paper-parts-unknown", P, ["--parts", "real,bogus", "--out", "{d}/out"], 2, "unknown 'bogus'"),
    ("paper-parts-empty", P, ["--parts", "", "--out", "{d}/out"], 2, "comma-separated"),
    ("paper-seeds-zero", P, ["--seeds", "0", "--out", "{d}/out"], 2, "--seeds"),
    ("paper-seeds-negative", P, ["--seeds", "-3", "--out", "{d}/out"], 2, "--seeds"),
    ("paper-seeds-huge", P, ["--seeds", HUGE, "--out", "{d}/out"], 2, "--seeds"),
    ("paper-seeds-text", P, ["--seeds", "abc", "--out", "{d}/out"], 2, "must be an integer"),
    ("paper-oracle-r-nan", P, ["--oracle-r", "nan", "--out", "{d}/out"], 2, "finite"),
    ("paper-oracle-r-one", P, ["--oracle-r", "1", "--out", "{d}/out"], 2, "--oracle-r"),
    ("paper-oracle-r-negative", P, ["--oracle-r", "-0.5", "--out", "{d}/out"], 2, "--oracle-r"),
    ("paper-input-extra-negative", P, ["--input-extra", "-1", "--out", "{d}/out"], 2, "--input-extra"),
    ("paper-input-extra-huge", P, ["--input-extra", HUGE, "--out", "{d}/out"], 2, "--input-extra"),
    ("paper-overheads-text", P, ["--overheads", "abc", "--out", "{d}/out"], 2, "must be a number"),
    ("paper-overheads-empty", P, ["--overheads", "", "--out", "{d}/out"], 2, "comma-separated"),
    ("paper-overheads-zero", P, ["--overheads", "0", "--out", "{d}/out"], 2, "--overheads"),
    ("paper-overheads-inf", P, ["--overheads", "1.1,inf", "--out", "{d}/out"], 2, "finite"),
    ("paper-idle-unknown", P, ["--idle", "sleep", "--out", "{d}/out"], 2, "--idle"),
    ("paper-measures", P, ["--measures", "drift", "--out", "{d}/out"], 2, "not supported"),
    ("paper-policy-module", P, ["--policy-module", "{d}/no_policy.py", "--out", "{d}/out"], 2, "not supported"),
    ("paper-trace-missing", P, ["--parts", "real", "--trace", "{d}/nope.csv", "--out", "{d}/out"], 2, "nope.csv"),
    ("paper-trace-directory", P, ["--parts", "real", "--trace", "{d}", "--out", "{d}/out"], 2, "directory"),
    ("paper-trace-binary", P, ["--parts", "real", "--trace", "{d}/junk.bin", "--out", "{d}/out"], 2, "UTF-8"),
    ("paper-trace-nul", P, ["--parts", "rpm", "--trace", "{d}/nul.csv", "--out", "{d}/out"], 2, "NUL"),
    ("paper-trace-dev-zero", P, ["--parts", "real", "--trace", "/dev/zero", "--out", "{d}/out"], 2, "NUL"),
    ("paper-trace-empty", P, ["--parts", "real", "--trace", "{d}/empty.csv", "--out", "{d}/out"], 2, "empty"),
    ("paper-trace-header-only", P, ["--parts", "real", "--trace", "{d}/header_only.csv", "--out", "{d}/out"], 2,
     "arrival_s"),
    ("paper-trace-wrong-columns", P, ["--parts", "real", "--trace", "{d}/ok.csv", "--out", "{d}/out"], 2,
     "arrival"),
    ("paper-trace-bad-value", P, ["--parts", "real-seeds", "--trace", "{d}/art_bad.csv", "--out", "{d}/out"], 2,
     "line 3"),
    ("paper-trace-nan", P, ["--parts", "real", "--trace", "{d}/art_nan.csv", "--out", "{d}/out"], 2, "line 2"),
    ("paper-trace-negative-client", P, ["--parts", "real", "--trace", "{d}/art_client.csv", "--out", "{d}/out"],
     2, "line 2"),
    ("paper-trace-zero-prompt", P, ["--parts", "real", "--trace", "{d}/art_prompt.csv", "--out", "{d}/out"], 2,
     "line 2"),
    ("paper-trace-huge-arrival", P, ["--parts", "real", "--trace", "{d}/art_late.csv", "--out", "{d}/out"], 2,
     "line 2"),
    ("paper-trace-huge-client", P, ["--parts", "real", "--trace", "{d}/art_wide.csv", "--out", "{d}/out"], 2,
     "line 2"),
    ("paper-trace-huge-prompt", P, ["--parts", "real", "--trace", "{d}/art_long.csv", "--out", "{d}/out"], 2,
     "line 2"),
    ("paper-overheads-too-many", P, ["--overheads", ",".join(["1.1"] * 65), "--out", "{d}/out"], 2, "65 given"),
    ("paper-step-time-missing", P, ["--parts", "validation", "--step-time", "{d}/none.json", "--out", "{d}/out"],
     2, "none.json"),
    ("paper-step-time-directory", P, ["--parts", "validation", "--step-time", "{d}", "--out", "{d}/out"], 2,
     "directory"),
    ("paper-step-time-not-json", P, ["--parts", "validation", "--step-time", "{d}/not_json.json", "--out",
                                     "{d}/out"], 2, "not JSON"),
    ("paper-step-time-empty", P, ["--parts", "validation", "--step-time", "{d}/empty.csv", "--out", "{d}/out"], 2,
     "empty.csv"),
    ("paper-step-time-nul", P, ["--parts", "validation", "--step-time", "{d}/nul.json", "--out", "{d}/out"], 2,
     "NUL"),
    ("paper-step-time-unknown-key", P, ["--parts", "validation", "--step-time", "{d}/step.json", "--out",
                                        "{d}/out"], 2, "unknown key 'speed'"),
    ("paper-step-time-negative", P, ["--parts", "validation", "--step-time", "{d}/step_neg.json", "--out",
                                     "{d}/out"], 2, "decode_base"),
    ("paper-step-time-list", P, ["--parts", "validation", "--step-time", "{d}/step_list.json", "--out",
                                 "{d}/out"], 2, "JSON object"),
    ("paper-out-is-file", P, ["--parts", "validation", "--seeds", "1", "--out", "{d}/ok.csv"], 2, "cannot write"),
    ("paper-out-under-file", P, ["--parts", "validation", "--seeds", "1", "--out", "{d}/ok.csv/out"], 2,
     "cannot write"),
    ("paper-unknown-flag", P, ["--turbo", "--out", "{d}/out"], 2, "unrecognized arguments"),
    # ---- sweeps.calibrate ----------------------------------------------------------------
    ("calibrate-no-file", CAL, [], 2, "profile"),
    ("calibrate-missing", CAL, ["{d}/nope.csv"], 2, "nope.csv"),
    ("calibrate-directory", CAL, ["{d}"], 2, "directory"),
    ("calibrate-binary", CAL, ["{d}/junk.bin"], 2, "UTF-8"),
    ("calibrate-nul", CAL, ["{d}/nul.csv"], 2, "NUL"),
    ("calibrate-dev-zero", CAL, ["/dev/zero"], 2, "NUL"),
    ("calibrate-empty", CAL, ["{d}/empty.csv"], 2, "empty file"),
    ("calibrate-header-only", CAL, ["{d}/profile_header.csv"], 2, "no rows"),
    ("calibrate-wrong-header", CAL, ["{d}/ok.csv"], 2, "unexpected column 'arrival'"),
    ("calibrate-extra-column", CAL, ["{d}/profile_extra.csv"], 2, "unexpected column 'gpu'"),
    ("calibrate-missing-column", CAL, ["{d}/profile_missing.csv"], 2, "missing column 'prompt_tokens'"),
    ("calibrate-negative-count", CAL, ["{d}/profile_neg.csv"], 2, "line 2: batch_size"),
    ("calibrate-huge-count", CAL, ["{d}/profile_big.csv"], 2, "line 2: batch_size"),
    ("calibrate-nan-time", CAL, ["{d}/profile_nan.csv"], 2, "line 2: step_time_s"),
    ("calibrate-zero-time", CAL, ["{d}/profile_zero.csv"], 2, "line 2: step_time_s"),
    ("calibrate-short-row", CAL, ["{d}/profile_fields.csv"], 2, "line 2: 3 fields"),
    ("calibrate-open-quote", CAL, ["{d}/profile_quote.csv"], 2, "line 2: 3 fields"),
    ("calibrate-too-few-rows", CAL, ["{d}/profile_few.csv"], 2, "need >= 3 decode rows"),
    ("calibrate-rank", CAL, ["{d}/profile_flat.csv"], 2, "do not vary enough"),
    ("calibrate-overhead-zero", CAL, ["{d}/profile_flat.csv", "--overhead", "0"], 2, "--overhead"),
    ("calibrate-overhead-nan", CAL, ["{d}/profile_flat.csv", "--overhead", "nan"], 2, "finite"),
    ("calibrate-overhead-text", CAL, ["{d}/profile_flat.csv", "--overhead", "abc"], 2, "must be a number"),
    ("calibrate-overhead-huge", CAL, ["{d}/profile_flat.csv", "--overhead", HUGE], 2, "--overhead"),
    ("calibrate-out-is-dir", CAL, ["{d}/profile_flat.csv", "--out", "{d}"], 2, "cannot write"),
    ("calibrate-out-under-file", CAL, ["{d}/profile_flat.csv", "--out", "{d}/ok.csv/s.json"], 2, "cannot write"),
    ("calibrate-unknown-flag", CAL, ["{d}/profile_flat.csv", "--fast"], 2, "unrecognized arguments"),
    # ---- sweeps.cluster ------------------------------------------------------------------
    ("cluster-replicas-zero", CLU, ["--replicas", "0", "--out", "{d}/out"], 2, "--replicas"),
    ("cluster-replicas-empty", CLU, ["--replicas", "", "--out", "{d}/out"], 2, "comma-separated"),
    ("cluster-replicas-huge", CLU, ["--replicas", HUGE, "--out", "{d}/out"], 2, "--replicas"),
    ("cluster-routers-negative", CLU, ["--routers", "-2", "--out", "{d}/out"], 2, "--routers"),
    ("cluster-skew-nan", CLU, ["--skew", "nan", "--out", "{d}/out"], 2, "skew"),
    ("cluster-skew-text", CLU, ["--skew", "abc", "--out", "{d}/out"], 2, "skew"),
    ("cluster-skew-above-one", CLU, ["--skew", "2", "--out", "{d}/out"], 2, "skew"),
    ("cluster-skew-negative", CLU, ["--skew", "-1/2", "--out", "{d}/out"], 2, "skew"),
    ("cluster-counters-unknown", CLU, ["--counters", "global", "--out", "{d}/out"], 2, "unknown mode 'global'"),
    ("cluster-estimate-error-nan", CLU, ["--estimate-error", "nan", "--out", "{d}/out"], 2, "estimate"),
    ("cluster-estimate-error-two", CLU, ["--estimate-error", "2", "--out", "{d}/out"], 2, "estimate"),
    ("cluster-gateway-unknown", CLU, ["--gateway-policy", "nope", "--out", "{d}/out"], 2, "unknown policy 'nope'"),
    ("cluster-engine-unknown", CLU, ["--engine-policy", "nope", "--out", "{d}/out"], 2, "unknown policy 'nope'"),
    ("cluster-delay-zero", CLU, ["--delay", "0", "--out", "{d}/out"], 2, "--delay"),
    ("cluster-skew-huge-exponent", CLU, ["--skew", "1e999", "--out", "{d}/out"], 2, "exponent"),
    ("cluster-warmup-huge", CLU, ["--warmup", HUGE, "--out", "{d}/out"], 2, "--warmup"),
    ("cluster-full-and-seeds-huge", CLU, ["--full", "--seeds", HUGE, "--out", "{d}/out"], 2, "--seeds"),
    ("cluster-kv-threshold-nan", CLU, ["--kv-threshold", "nan", "--out", "{d}/out"], 2, "threshold"),
    ("cluster-kv-threshold-zero", CLU, ["--kv-threshold", "0", "--out", "{d}/out"], 2, "threshold"),
    ("cluster-queue-limit-zero", CLU, ["--queue-limit", "0", "--out", "{d}/out"], 2, "--queue-limit"),
    ("cluster-choice-unknown", CLU, ["--choice", "random", "--out", "{d}/out"], 2, "--choice"),
    ("cluster-saturation-unknown", CLU, ["--saturation", "never", "--out", "{d}/out"], 2, "--saturation"),
    ("cluster-steps-small", CLU, ["--steps", "10", "--out", "{d}/out"], 2, "--steps"),
    ("cluster-steps-huge", CLU, ["--steps", HUGE, "--out", "{d}/out"], 2, "--steps"),
    ("cluster-warmup-past-steps", CLU, ["--steps", "100", "--warmup", "100", "--out", "{d}/out"], 2, "--warmup"),
    ("cluster-rate-zero", CLU, ["--rate", "0", "--out", "{d}/out"], 2, "--rate"),
    ("cluster-rate-nan", CLU, ["--rate", "nan", "--out", "{d}/out"], 2, "finite"),
    ("cluster-prompt-reversed", CLU, ["--prompt", "128,16", "--out", "{d}/out"], 2, "LOW <= HIGH"),
    ("cluster-prompt-over-m", CLU, ["--prompt", "16,4096", "--out", "{d}/out"], 2, "exceed the KV budget"),
    ("cluster-kv-budget-zero", CLU, ["--kv-budget", "0", "--out", "{d}/out"], 2, "--kv-budget"),
    ("cluster-weights-one", CLU, ["--weights", "4", "--out", "{d}/out"], 2, "weights"),
    ("cluster-weights-zero", CLU, ["--weights", "4,0", "--out", "{d}/out"], 2, "weight"),
    ("cluster-weights-nan", CLU, ["--weights", "4,nan", "--out", "{d}/out"], 2, "weight"),
    ("cluster-w-p-division", CLU, ["--w-p", "1/0", "--out", "{d}/out"], 2, "w_p"),
    ("cluster-w-q-negative", CLU, ["--w-q", "-2", "--out", "{d}/out"], 2, "w_q"),
    ("cluster-seeds-zero", CLU, ["--seeds", "0", "--out", "{d}/out"], 2, "--seeds"),
    ("cluster-measures", CLU, ["--measures", "drift", "--out", "{d}/out"], 2, "--measures"),
    ("cluster-out-is-file", CLU, ["--seeds", "1", "--steps", "50", "--replicas", "1", "--routers", "1",
                                  "--no-compare", "--out", "{d}/ok.csv"], 2, "cannot write"),
    ("cluster-unknown-flag", CLU, ["--turbo", "--out", "{d}/out"], 2, "unrecognized arguments"),
    # ---- sweeps.adversary ----------------------------------------------------------------
    ("adversary-policy-unknown", ADV, ["--policy", "vtc,nope", "--out", "{d}/out"], 2, "unknown policy 'nope'"),
    ("adversary-policy-rpm", ADV, ["--policy", "rpm", "--out", "{d}/out"], 2, "needs an rpm limit"),
    ("adversary-policy-empty", ADV, ["--policy", "", "--out", "{d}/out"], 2, "comma-separated"),
    ("adversary-growth-unknown", ADV, ["--growth-policy", "nope", "--out", "{d}/out"], 2, "unknown policy 'nope'"),
    ("adversary-kv-budget-zero", ADV, ["--kv-budget", "0", "--out", "{d}/out"], 2, "--kv-budget"),
    ("adversary-kv-budget-huge", ADV, ["--kv-budget", HUGE, "--out", "{d}/out"], 2, "--kv-budget"),
    ("adversary-kv-budget-text", ADV, ["--kv-budget", "abc", "--out", "{d}/out"], 2, "must be an integer"),
    ("adversary-clients-one", ADV, ["--clients", "1", "--out", "{d}/out"], 2, "--clients"),
    ("adversary-clients-many", ADV, ["--clients", "87", "--out", "{d}/out"], 2, "--clients"),
    ("adversary-clients-too-many-items", ADV, ["--clients", "2,3,4,2", "--out", "{d}/out"], 2, "4 given"),
    ("adversary-kv-budget-one", ADV, ["--kv-budget", "1", "--out", "{d}/out"], 2, "exceeds --kv-budget 1"),
    ("adversary-lanes-too-big", ADV, ["--horizon", "65536", "--requests", "4096", "--population", "4194304",
                                      "--out", "{d}/out"], 2, "requests per generation"),
    ("adversary-generations-zero", ADV, ["--generations", "0", "--out", "{d}/out"], 2, "--generations"),
    ("adversary-population-two", ADV, ["--population", "2", "--out", "{d}/out"], 2, "--population"),
    ("adversary-restarts-negative", ADV, ["--restarts", "-1", "--out", "{d}/out"], 2, "--restarts"),
    ("adversary-horizon-small", ADV, ["--horizon", "7", "--out", "{d}/out"], 2, "--horizon"),
    ("adversary-requests-zero", ADV, ["--requests", "0", "--out", "{d}/out"], 2, "--requests"),
    ("adversary-prompt-reversed", ADV, ["--prompt", "50,8", "--out", "{d}/out"], 2, "LOW <= HIGH"),
    ("adversary-prompt-text", ADV, ["--prompt", "abc", "--out", "{d}/out"], 2, "LOW <= HIGH"),
    ("adversary-prompt-over-m", ADV, ["--prompt", "8,300", "--out", "{d}/out"], 2, "exceeds --kv-budget 256"),
    ("adversary-output-zero", ADV, ["--output", "0,4", "--out", "{d}/out"], 2, "LOW <= HIGH"),
    ("adversary-w-p-division", ADV, ["--w-p", "1/0", "--out", "{d}/out"], 2, "w_p"),
    ("adversary-w-q-negative", ADV, ["--w-q", "-2", "--out", "{d}/out"], 2, "w_q"),
    ("adversary-beta-nan", ADV, ["--beta", "nan", "--out", "{d}/out"], 2, "beta"),
    ("adversary-beta-huge-exponent", ADV, ["--beta", "1e999", "--out", "{d}/out"], 2, "exponent"),
    ("adversary-kv-cap-zero", ADV, ["--kv-cap", "0", "--out", "{d}/out"], 2, "--kv-cap"),
    ("adversary-sigma-nan", ADV, ["--sigma", "nan", "--out", "{d}/out"], 2, "finite"),
    ("adversary-sigma-zero", ADV, ["--sigma", "0", "--out", "{d}/out"], 2, "--sigma"),
    ("adversary-grid-small", ADV, ["--horizon-grid", "4", "--out", "{d}/out"], 2, "--horizon-grid"),
    ("adversary-grid-empty", ADV, ["--horizon-grid", "", "--out", "{d}/out"], 2, "comma-separated"),
    ("adversary-seed-negative", ADV, ["--seed", "-1", "--out", "{d}/out"], 2, "--seed"),
    ("adversary-out-is-file", ADV, ["--policy", "vtc", "--horizon-grid", "none", "--generations", "1",
                                    "--population", "3", "--restarts", "1", "--out", "{d}/ok.csv"], 2, "cannot write"),
    ("adversary-out-under-file", ADV, ["--policy", "vtc", "--horizon-grid", "none", "--generations", "1",
                                       "--population", "3", "--restarts", "1", "--out", "{d}/ok.csv/out"], 2,
     "cannot write"),
    ("adversary-unknown-flag", ADV, ["--turbo", "--out", "{d}/out"], 2, "unrecognized arguments"),
]


@pytest.fixture
def case_dir(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    for name, data in BINARY.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "csvdir" / "results.csv").mkdir(parents=True)  # an output target that is a directory
    return tmp_path


def _listing(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("name, module, argv, status, words", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(case_dir, capsys, name, module, argv, status, words):
    before = _listing(case_dir)
    argv = [a.replace("{d}", str(case_dir)) for a in argv]
    assert exit_code(importlib.import_module(module).main, argv) == status
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert words in err[0], err[0]
    assert "Traceback" not in err[0]
    left = _listing(case_dir) - before
    assert not [p for p in left if Path(p).suffix in (".json", ".csv", ".png")], left


def test_at_least_a_hundred_cases():
    assert len(CASES) >= 100 and len({c[0] for c in CASES}) == len(CASES)


# ---- real processes: a closed pipe and Ctrl-C --------------------------------------------

def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


def test_closed_pipe_is_one_line_not_a_traceback(tmp_path):
    """`replay ... | head -2` on 1,000 clients (a line each): the reader leaves after the
    input's summary and the first line."""
    trace = tmp_path / "wide.csv"
    trace.write_text("arrival,client,prompt,output\n" + "".join(f"0,{k},10,2\n" for k in range(1000)))
    proc = subprocess.Popen([sys.executable, "-m", "vtc_jax", "replay", str(trace), "--policy", "vtc",
                             "--kv-budget", "100000", "--no-cache"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    read = proc.stdout.readline().decode()  # the input's summary line, then the run's
    first = proc.stdout.readline().decode()
    proc.stdout.close()  # like `head -2`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 2
    assert read.startswith("read ") and first.startswith("vtc: 2 steps, 1000 clients")
    assert err.strip().splitlines() == ["vtc_jax: error: output pipe closed; stopped"], err


def test_ctrl_c_is_one_line_and_no_results(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.schedulers", "--seeds", "4096", "--out", str(out),
                             "--no-cache"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stderr.readline().decode()  # the run's first line: it has started
    assert "lanes" in first
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read().decode()
    status = proc.wait(timeout=120)
    assert status == 130
    lines = [line for line in rest.splitlines() if line.strip() and not line.startswith("[schedulers]")]
    assert len(lines) == 1 and "interrupted" in lines[0], rest
    assert "Traceback" not in rest
    assert not (out / "results.json").exists()
