"""The command an SGLang user runs reproduces SGLang 0.5.23's own scheduler step for step:

    python -m vtc_jax replay sNNNN.csv --server sglang --policy fcfs \\
        --max-total-tokens KV --max-running-requests S --chunked-prefill-size C \\
        --max-prefill-tokens X --schedule-conservativeness Y --schedule-policy fcfs \\
        --schedule-out OUT.json

OUT.json's steps must equal the golden schedule of every fcfs golden in
tests/data/sglang_golden/ (README.md there): every listed iteration's step number,
scheduled tokens per row, retracted and finished rows, and the number of listed iterations;
each request's finish step and retractions must agree with the golden's lists. The
replay takes same-iteration arrivals in the golden harness's order (request ids as
strings), and bad flags are one line and exit 2 (docs/SGLANG.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vtc_jax.cli.commands import main
from vtc_jax.servers.sglang_state import arrival_order as sglang_arrival_order
from vtc_jax.testing.sglang_goldens import load_golden

GOLDEN_DIR = Path(__file__).resolve().parent / "data" / "sglang_golden"
FCFS = [p.stem for p in sorted(GOLDEN_DIR.glob("s*.json")) if json.loads(p.read_text())["config"]["policy"] == "fcfs"]


def golden_argv(name: str, out: Path) -> list[str]:
    """The README's command for golden `name`, its config in SGLang's flag names."""
    cfg = json.loads((GOLDEN_DIR / f"{name}.json").read_text())["config"]
    chunk = cfg["chunked_prefill_size"]
    return ["replay", str(GOLDEN_DIR / f"{name}.csv"), "--server", "sglang", "--policy", "fcfs",
            "--max-total-tokens", str(cfg["kv_tokens"]), "--max-running-requests", str(cfg["max_running_requests"]),
            "--chunked-prefill-size", str(0 if chunk is None else chunk),
            "--max-prefill-tokens", str(cfg["max_prefill_tokens"]),
            "--schedule-conservativeness", str(cfg["schedule_conservativeness"]),
            "--schedule-policy", cfg["policy"], "--schedule-out", str(out), "--no-cache"]


def test_the_fcfs_goldens_are_here():
    assert FCFS == ["s1000", "s1001", "s1002", "s1003", "s1006", "s1007", "s1008", "s1009", "s1010", "s2002", "s2005"]


@pytest.mark.parametrize("name", FCFS)
def test_cli_reproduces_sglang_scheduler(tmp_path, capsys, name):
    out = tmp_path / "schedule.json"
    assert main(golden_argv(name, out)) == 0, capsys.readouterr().err
    got = json.loads(out.read_text())
    requests, _, golden = load_golden(GOLDEN_DIR / f"{name}.json")
    want = [{"step": g["step"], "sched": {str(row): n for row, n, *_ in g["scheduled"]},
             "retracted": sorted(g["retracted"]), "finished": sorted(g["finished"])} for g in golden]
    for j, (a, b) in enumerate(zip(got["steps"], want)):
        assert a == b, f"{name}: step entry {j} differs:\n ours   {a}\n golden {b}"
    assert len(got["steps"]) == len(want) == got["num_steps"], name
    # Each request (its CSV row): finished at the golden's step, retracted as often as it lists.
    assert sorted(got["requests"], key=int) == [str(row) for row in range(len(requests))]
    for row in range(len(requests)):
        r = got["requests"][str(row)]
        assert r["finish_step"] == max(g["step"] for g in golden if row in g["finished"]), (name, row)
        assert r["retractions"] == sum(g["retracted"].count(row) for g in golden), (name, row)
        assert r["first_token_step"] is not None and r["first_token_step"] <= r["finish_step"], (name, row)
    assert got["total_retractions"] == sum(len(g["retracted"]) for g in golden)
    assert not got["stalled"] and "preempted" not in got["steps"][0]


def test_same_iteration_arrivals_in_request_id_string_order():
    """SGLang's golden harness: arrivals of one iteration join the waiting queue by request
    id as a string (r<row>): r1 < r10 < r8 < r9; later arrivals after, whatever their ids."""
    arrival = [0, 0, 0, 1, 0, 1]
    rows = [8, 9, 10, 2, 1, 11]
    order = sglang_arrival_order(arrival, rows)
    assert [rows[i] for i in order] == [1, 10, 8, 9, 11, 2]
    assert order.dtype == np.int64
    assert sglang_arrival_order([3, 1, 2], [0, 1, 2]).tolist() == [1, 2, 0]  # arrival first
    assert sglang_arrival_order([], []).tolist() == []


def test_tie_rule_reports_file_rows(tmp_path):
    """Rows 8..10 arrive together: the server admits r10 before r8 and r9 (one at a time:
    one running request), and the schedule names each by its CSV row."""
    trace = tmp_path / "t.csv"
    lines = ["arrival,client,prompt,output,prefix_id,prefix_len"] + [f"{i},a,4,1,-1,0" for i in range(8)]
    lines += ["20,a,4,1,-1,0"] * 3
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "s.json"
    argv = ["replay", str(trace), "--server", "sglang", "--policy", "fcfs", "--max-total-tokens", "64",
            "--max-running-requests", "1", "--schedule-out", str(out), "--no-cache"]
    assert main(argv) == 0
    steps = json.loads(out.read_text())["steps"]
    late = [list(s["sched"]) for s in steps if s["step"] >= 20]
    assert late == [["10"], ["8"], ["9"]], late


@pytest.mark.parametrize("argv, words", [
    (["--schedule-policy", "lpm"], "--schedule-policy lpm is not supported by server sglang"),
    (["--max-total-tokens", "0"], "argument --max-total-tokens: must be >= 2"),
    (["--num-gpu-blocks", "64"], "--num-gpu-blocks is a setting of --server vllm"),
    (["--schedule-conservativeness", "0"], "argument --schedule-conservativeness: must be > 0"),
    (["--kv-budget", "100"], "--server sglang takes its own (--max-total-tokens)"),
], ids=["lpm", "no-pool", "vllm-flag", "conservativeness-0", "kv-budget"])
def test_bad_sglang_flags_are_one_line_and_exit_2(tmp_path, capsys, argv, words):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,client,prompt,output\n0,a,30,20\n1,b,30,9\n")
    base = {"--max-total-tokens": "256", "--max-running-requests": "4"}
    for flag in argv[::2]:
        base.pop(flag, None)
    given = [x for kv in base.items() for x in kv]
    assert main(["replay", str(trace), "--server", "sglang", "--policy", "fcfs", "--no-cache",
                 "--schedule-out", str(tmp_path / "s.json"), *given, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "s.json").exists()


def test_sglang_flags_are_refused_on_vllm(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,client,prompt,output\n0,a,30,20\n1,b,30,9\n")
    assert main(["replay", str(trace), "--server", "vllm", "--policy", "fcfs", "--no-cache", "--num-gpu-blocks", "64",
                 "--max-running-requests", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--max-running-requests is a setting of --server sglang" in err, err
