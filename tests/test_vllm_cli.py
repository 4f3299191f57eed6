"""The command a vLLM user runs reproduces the real vLLM scheduler step for step:

    python -m vtc_jax replay T.csv --server vllm --policy fcfs --block-size 16 \\
        --num-gpu-blocks N --max-num-batched-tokens B --max-num-seqs S \\
        [--no-enable-chunked-prefill] [--long-prefill-token-threshold L] \\
        [--scheduling-policy priority] [--enable-prefix-caching] --schedule-out OUT.json

OUT.json must equal the golden schedule the real scheduler (vLLM 0.33) produced on that
trace and config, for every golden the server covers (tests/data/vllm_golden*/): every
step's scheduled tokens per row, preempted and finished rows, and each request's first
token step, finish step and preemptions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from vtc_jax.cli.commands import main
from vtc_jax.cli.server_flags import server_options

DATA = Path(__file__).resolve().parent / "data"
FLAGS = {"block_size": "--block-size", "num_blocks": "--num-gpu-blocks", "max_num_batched_tokens":
         "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
         "long_prefill_threshold": "--long-prefill-token-threshold"}


PREFIX_SHARED = ("g010", "g019")


def _goldens():
    """Every shared golden without prefix caching and the two with it whose rule only they
    show (g010 fcfs, g019 priority: a free hit block counts as needed), and every fourth
    of ours without it (each CLI run compiles once: tests/test_vllm_server.py replays all
    69 through the API in batches; all 17 with prefix caching were checked through the CLI
    once, docs/VLLM.md)."""
    out = []
    for directory in ("vllm_golden", "vllm_golden_more"):
        configs = sorted((DATA / directory).glob("*.config.json"))
        for config in configs if directory == "vllm_golden" else configs[::4]:
            cfg = json.loads(config.read_text())
            if cfg.get("victim") or cfg.get("preempted_to"):
                continue  # the fairness options are not the CLI's
            if cfg.get("prefix_caching") and config.name[:4] not in PREFIX_SHARED:
                continue
            out.append(pytest.param(config.parent, config.name[: -len(".config.json")], id=config.name[:4]))
    return out


def golden_argv(directory: Path, name: str, out: Path) -> list[str]:
    cfg = json.loads((directory / f"{name}.config.json").read_text())
    argv = ["replay", str(directory / f"{name}.csv"), "--server", "vllm", "--policy", "fcfs",
            "--schedule-out", str(out), "--no-cache"]
    for key, flag in FLAGS.items():
        if key in cfg:
            argv += [flag, str(cfg[key])]
    if not cfg.get("chunked_prefill", True):
        argv.append("--no-enable-chunked-prefill")
    if cfg.get("policy", "fcfs") == "priority":
        argv += ["--scheduling-policy", "priority"]
    if cfg.get("prefix_caching"):
        argv.append("--enable-prefix-caching")
    return argv


@pytest.mark.parametrize("directory, name", _goldens())
def test_cli_reproduces_the_real_scheduler(tmp_path, capsys, directory, name):
    out = tmp_path / "schedule.json"
    assert main(golden_argv(directory, name, out)) == 0
    got = json.loads(out.read_text())
    golden = json.loads((directory / f"{name}.schedule.json").read_text())
    for j, (a, b) in enumerate(zip(got["steps"], golden["steps"])):
        b = {**b, "preempted": sorted(b["preempted"]), "finished": sorted(b["finished"])}
        assert a == b, f"{name}: step entry {j} differs:\n ours   {a}\n golden {b}"
    assert len(got["steps"]) == len(golden["steps"]), name
    assert got["requests"] == golden["requests"], name
    assert (got["num_steps"], got["total_preemptions"], got["stalled"]) == (
        golden["num_steps"], golden["total_preemptions"], golden["stalled"])


@pytest.mark.parametrize("argv, words", [
    (["--server", "vllm"], "needs num_gpu_blocks"),
    (["--num-gpu-blocks", "64", "--kv-budget", "100"], "is a setting of --server vllm"),
    (["--server", "vllm", "--num-gpu-blocks", "64", "--kv-budget", "100"], "--kv-budget is the ideal server's"),
    (["--server", "vllm", "--num-gpu-blocks", "4"], "could never finish"),
    (["--kv-budget", "5000", "--schedule-out", "{d}/s.json"], "--schedule-out needs a server"),
    (["--enable-prefix-caching", "--kv-budget", "100"], "is a setting of --server vllm"),
    (["--server", "vllm_prefix", "--num-gpu-blocks", "4"], "could never finish"),
])
def test_bad_server_flags_are_one_line_and_exit_2(tmp_path, capsys, argv, words):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,client,prompt,output\n0,a,30,20\n1,b,30,9\n")
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert main(["replay", str(trace), "--policy", "fcfs", "--no-cache", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("server, caching, runs", [
    ("vllm", True, "vllm_prefix"), ("vllm", None, "vllm"), ("vllm_prefix", None, "vllm_prefix"),
    ("vllm_prefix", False, "vllm"), ("vllm", False, "vllm"),
])
def test_enable_prefix_caching_picks_the_server(server, caching, runs):
    """--enable-prefix-caching runs --server vllm as vllm_prefix; --no-enable-prefix-caching
    runs vllm_prefix as vllm; the flag itself is not a server setting."""
    args = argparse.Namespace(server=server, enable_prefix_caching=caching, num_gpu_blocks=8)
    assert server_options(args) == (("num_gpu_blocks", 8),) and args.server == runs
