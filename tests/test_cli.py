"""`python -m vtc_jax replay`: bad input of any kind ends in one error line naming the problem
and exit status 2 (never a traceback); a good run writes the documented JSON.

Most cases call `cli.main` in-process (no engine compile: every check fires before the run);
a few run the real module in a subprocess; two tiny runs exercise the JSON output.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from vtc_jax.testing import reference as ref
from vtc_jax.cli import commands as cli

ROOT = Path(__file__).resolve().parents[1]
SMALL_TRACE = ROOT / "examples" / "small_trace.csv"
HEADER = "arrival,client,prompt,output"
# Two clients; client 1 arrives at step 2. Hand-computed run (vtc, M=100, defaults):
# client 0: admitted at 0, decodes at 0,1,2 -> W = 10 + 3*2 = 16, done at step 2;
# client 1: admitted at 2, decodes at 2..5 -> W = 5 + 4*2 = 13, done at step 5, so T = 6.
GOOD = f"{HEADER}\n0,0,10,3\n2,1,5,4\n"


def write(tmp_path: Path, content: str | bytes, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def run_main(capsys, args) -> tuple[int, str, str]:
    code = cli.main(["replay", *(str(a) for a in args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error(code: int, out: str, err: str, *words: str) -> str:
    """Exit 2, nothing on stdout but the input's summary line (printed when the run starts,
    before a refusal of the lanes), exactly one `vtc_jax: error:` line naming `words`."""
    assert code == cli.EXIT_BAD_INPUT == 2
    assert out == "" or (out.startswith("read ") and out.count("\n") == 1), out
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("vtc_jax: error: "), line
    assert len(line) < 400, line
    for word in words:
        assert word in line, (word, line)
    return line


# ---------------------------------------------------------------------------------------
# bad trace files
# ---------------------------------------------------------------------------------------

CSV_CASES = {
    # name: (file content, extra args, words the error line must hold)
    "missing column": ("arrival,client,prompt\n0,0,10\n", [], ["missing column 'output'"]),
    "missing column, with cached": ("arrival,client,output,cached\n0,0,3,0\n", [], ["missing column 'prompt'"]),
    "extra column": (f"{HEADER},priority\n0,0,10,3,1\n", [], ["unexpected column 'priority'"]),
    "duplicate column": (f"{HEADER},output\n0,0,10,3,3\n", [], ["duplicate column"]),
    "empty file": ("", [], ["empty file"]),
    "blank lines only": ("\n  \n\n", [], ["empty file"]),
    "header only": (f"{HEADER}\n", [], ["header only"]),
    "header only, blank rows": (f"{HEADER}\n\n,,,\n", [], ["header only"]),
    "too few fields": (f"{HEADER}\n0,0,10,3\n0,0,10\n", [], ["line 3", "3 fields", "header has 4"]),
    "too many fields": (f"{HEADER}\n0,0,10,3,7\n", [], ["line 2", "5 fields"]),
    "non-integer": (f"{HEADER}\n0,0,ten,3\n", [], ["line 2", "prompt", "'ten'"]),
    "decimal point": (f"{HEADER}\n0,0,10,3\n1.5,0,10,3\n", [], ["line 3", "arrival", "'1.5'"]),
    "exponent": (f"{HEADER}\n0,0,1e3,3\n", [], ["line 2", "prompt", "'1e3'"]),
    "negative client": (f"{HEADER}\n0,-1,10,3\n", [], ["line 2", "client", "non-negative", "'-1'"]),
    "negative arrival": (f"{HEADER}\n0,0,10,3\n0,0,10,3\n-4,0,10,3\n", [], ["line 4", "arrival"]),
    "empty cell": (f"{HEADER}\n0,0,,3\n", [], ["line 2", "prompt", "''"]),
    "nan cell": (f"{HEADER}\n0,0,NaN,3\n", [], ["line 2", "prompt", "'NaN'"]),
    "inf cell": (f"{HEADER}\n0,0,10,inf\n", [], ["line 2", "output", "'inf'"]),
    "-inf cell": (f"{HEADER},cached\n0,0,10,3,-inf\n", [], ["line 2", "cached", "'-inf'"]),
    "value past int32": (f"{HEADER}\n0,0,10,3\n0,0,10,2147483648\n", [], ["line 3", "output", "outside [0,"]),
    "thousands of digits": (f"{HEADER}\n0,0,{'9' * 5000},3\n", [], ["line 2", "prompt", "must be a non-negative integer"]),
    "zero prompt": (f"{HEADER}\n0,0,0,3\n", [], ["line 2", "prompt must be >= 1"]),
    "zero output": (f"{HEADER}\n0,0,10,3\n3,1,10,0\n", [], ["line 3", "output must be >= 1"]),
    "cached == prompt": (f"{HEADER},cached\n0,0,10,3,9\n1,0,10,3,10\n", [], ["line 3", "cached must be < prompt"]),
    "cached > prompt": (f"{HEADER},cached\n0,0,10,3,11\n", [], ["line 2", "cached must be < prompt"]),
    "client outside --clients": (f"{HEADER}\n0,0,10,3\n0,4,10,3\n", ["--clients", "2"],
                                 ["line 3", "client", "--clients 2"]),
    "huge client id": (f"{HEADER}\n0,0,10,3\n0,1000000000,10,3\n", [],
                       ["line 3", "client id 1000000000"]),
    "prompt larger than M": (f"{HEADER}\n0,0,300,3\n5,1,301,3\n", ["--kv-budget", "200"],  # every one: nothing to run
                             ["every request's prompt exceeds", "200 tokens", "shortest: 300"]),
    "quoted newline in header": ('"arr\nival",client,prompt,output\n0,0,10,3\n', [], ["missing column 'arrival'"]),
    "unterminated quote": (f'{HEADER}\n0,0,"10,3\n', [], ["line 2"]),
}


@pytest.mark.parametrize("name", list(CSV_CASES))
def test_bad_trace_csv(tmp_path, capsys, name):
    content, extra, words = CSV_CASES[name]
    path = write(tmp_path, content)
    args = [path, "--policy", "vtc", "--kv-budget", "100", *extra]
    line = assert_one_error(*run_main(capsys, args), *words)
    assert str(path) in line  # names the file


@pytest.mark.parametrize("content, words", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xd8", ["not a UTF-8"]),
    (b"arrival,client,prompt,output\n0,0,1\x000,3\n", ["NUL"]),
    (bytes(range(256)) * 4, ["not a UTF-8"]),
], ids=["png", "nul", "all-bytes"])
def test_binary_junk(tmp_path, capsys, content, words):
    path = write(tmp_path, content)
    line = assert_one_error(*run_main(capsys, [path, "--policy", "fcfs", "--kv-budget", "100"]), *words)
    assert str(path) in line


def test_missing_file_and_directory(tmp_path, capsys):
    missing = tmp_path / "nope.csv"
    assert_one_error(*run_main(capsys, [missing, "--policy", "vtc", "--kv-budget", "100"]),
                     str(missing), "cannot read")
    assert_one_error(*run_main(capsys, [tmp_path, "--policy", "vtc", "--kv-budget", "100"]),
                     str(tmp_path), "is a directory")


# ---------------------------------------------------------------------------------------
# bad options (the trace is good)
# ---------------------------------------------------------------------------------------

OPTION_CASES = {
    "unknown policy": (["--policy", "wfq2", "--kv-budget", "100"], ["--policy", "'wfq2'"]),
    "missing policy": (["--kv-budget", "100"], ["--policy"]),
    "missing kv budget": (["--policy", "vtc"], ["--kv-budget"]),
    "rpm without --rpm": (["--policy", "rpm", "--kv-budget", "100"], ["rpm", "--rpm"]),
    "--rpm-mode without --rpm": (["--policy", "vtc", "--kv-budget", "100", "--rpm-mode", "reject"],
                                 ["--rpm-mode", "--rpm"]),
    "--weights with fcfs": (["--policy", "fcfs", "--kv-budget", "100", "--weights", "1,2"],
                            ["--weights", "fcfs", "ignores"]),
    "--estimator with vtc": (["--policy", "vtc", "--kv-budget", "100", "--estimator", "fixed"],
                             ["--estimator", "vtc", "does not predict"]),
    "--rpm 0": (["--policy", "rpm", "--kv-budget", "100", "--rpm", "0"], ["--rpm", ">= 1"]),
    "--rpm-window 0": (["--policy", "rpm", "--kv-budget", "100", "--rpm", "1", "--rpm-window", "0"],
                       ["--rpm-window"]),
    "too many weights": (["--policy", "vtc", "--kv-budget", "100", "--weights", "1,2,3"],
                         ["3 weights", "2 clients"]),
    "too few weights": (["--policy", "vtc", "--kv-budget", "100", "--weights", "1"], ["1 weights", "2 clients"]),
    "zero weight": (["--policy", "vtc", "--kv-budget", "100", "--weights", "1,0"], ["weight 1", "> 0"]),
    "negative weight": (["--policy", "vtc", "--kv-budget", "100", "--weights=-1,2"], ["weight 0", "> 0"]),
    "non-numeric weight": (["--policy", "vtc", "--kv-budget", "100", "--weights", "1,heavy"],
                           ["weight 1", "'heavy'"]),
    "nan weight": (["--policy", "vtc", "--kv-budget", "100", "--weights", "nan,1"], ["weight 0", "finite"]),
    "empty weight": (["--policy", "vtc", "--kv-budget", "100", "--weights", "1,,2"], ["--weights"]),
    "huge weight exponent": (["--policy", "vtc", "--kv-budget", "100", "--weights", "1,1e-5000"], ["--weights"]),
    "nan beta": (["--policy", "vtc", "--kv-budget", "100", "--beta", "nan"], ["beta", "finite"]),
    "inf beta": (["--policy", "vtc", "--kv-budget", "100", "--beta", "inf"], ["beta", "finite"]),
    "-inf beta": (["--policy", "vtc", "--kv-budget", "100", "--beta=-Infinity"], ["beta", "finite"]),
    "negative beta": (["--policy", "vtc", "--kv-budget", "100", "--beta=-0.5"], ["beta", ">= 0"]),
    "huge beta exponent": (["--policy", "vtc", "--kv-budget", "100", "--beta", "1e5000"], ["--beta"]),
    "non-numeric w_p": (["--policy", "lcf", "--kv-budget", "100", "--w-p", "cheap"], ["w_p", "'cheap'"]),
    "inf w_q": (["--policy", "lcf", "--kv-budget", "100", "--w-q", "inf"], ["w_q", "finite"]),
    "--steps 0": (["--policy", "vtc", "--kv-budget", "100", "--steps", "0"], ["--steps", ">= 1"]),
    "--steps text": (["--policy", "vtc", "--kv-budget", "100", "--steps", "ten"], ["--steps", "'ten'"]),
    "negative kv budget": (["--policy", "vtc", "--kv-budget", "-5"], ["--kv-budget", ">= 1", "-5"]),
    "negative kv budget, =": (["--policy", "vtc", "--kv-budget=-5"], ["--kv-budget", "-5"]),
    "zero kv budget": (["--policy", "vtc", "--kv-budget", "0"], ["--kv-budget", ">= 1"]),
    "fractional kv budget": (["--policy", "vtc", "--kv-budget", "1.5"], ["--kv-budget", "'1.5'"]),
    "kv budget past int32": (["--policy", "vtc", "--kv-budget", "99999999999"], ["--kv-budget"]),
    "--clients 0": (["--policy", "vtc", "--kv-budget", "100", "--clients", "0"], ["--clients", ">= 1"]),
    "--clients huge": (["--policy", "vtc", "--kv-budget", "100", "--clients", "1000000000"], ["--clients"]),
    "--record-every 0": (["--policy", "vtc", "--kv-budget", "100", "--record-every", "0"], ["--record-every"]),
    "checkpoints too many": (["--policy", "vtc", "--kv-budget", "100", "--steps", "1000000000",
                              "--record-every", "1"], ["--record-every", "checkpoint"]),
    "unknown option": (["--policy", "vtc", "--kv-budget", "100", "--bogus", "1"], ["--bogus"]),
}


@pytest.mark.parametrize("name", list(OPTION_CASES))
def test_bad_option(tmp_path, capsys, name):
    extra, words = OPTION_CASES[name]
    assert_one_error(*run_main(capsys, [write(tmp_path, GOOD), *extra]), *words)


def test_no_command(capsys):
    for argv in ([], ["serve"]):
        code = cli.main(argv)
        captured = capsys.readouterr()
        assert_one_error(code, captured.out, captured.err)


# ---------------------------------------------------------------------------------------
# the real module, in a subprocess
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, extra, words", [
    ("arrival,client,output\n0,0,3\n", [], ["missing column 'prompt'"]),
    (GOOD, ["--policy", "rpm"], ["--rpm"]),
    (f"{HEADER}\n0,0,500,3\n1,0,500,3\n", ["--policy", "vtc"], ["every request's prompt exceeds", "100 tokens"]),
], ids=["missing-column", "rpm-without-limit", "prompt-over-M"])
def test_module_subprocess(tmp_path, content, extra, words):
    path = write(tmp_path, content)
    extra = extra if "--policy" in extra else ["--policy", "vtc", *extra]
    proc = subprocess.run([sys.executable, "-m", "vtc_jax", "replay", str(path), "--kv-budget", "100", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert_one_error(proc.returncode, proc.stdout, proc.stderr, *words)


# ---------------------------------------------------------------------------------------
# good runs
# ---------------------------------------------------------------------------------------

KEYS = {"steps", "clients", "service", "counters", "admitted", "completed", "max_drift", "max_drift_step",
        "bound_2u", "max_drift_over_2u", "throughput", "checkpoints"}


def test_small_trace_json_matches_reference(tmp_path, capsys):
    """Drain mode on the shipped example: T = last completion step + 1, every request
    completed, and every number equal to the literal reference of MODEL.md."""
    out_path = tmp_path / "out.json"
    code, out, err = run_main(capsys, [SMALL_TRACE, "--policy", "vtc", "--kv-budget", "2000",
                                       "--record-every", "500", "--json", out_path])
    assert code == 0, err
    read, run = out.split("\n", 1)
    assert read.startswith(f"read {SMALL_TRACE} (trace): 348 requests, 3 tenants (0 213, 2 84, 1 51), span 395 steps")
    assert run.startswith("vtc: ")
    data = json.loads(out_path.read_text())
    assert set(data) == KEYS

    with open(SMALL_TRACE) as fh:
        requests = [ref.Request(*(int(row[c]) for c in ("arrival", "client", "prompt", "output", "cached")))
                    for row in csv.DictReader(fh)]
    counts = [sum(r.client == k for r in requests) for k in range(3)]
    expected = ref.simulate(requests, num_clients=3, kv_budget=2000, policy="vtc")
    steps = data["steps"]
    assert steps == max(expected.finish_step) + 1 == expected.steps
    assert data["clients"] == 3
    assert data["completed"] == data["admitted"] == counts == expected.completed
    assert data["service"] == [int(x) for x in expected.service[-1]]
    assert data["counters"] == [int(x) for x in expected.counters[-1]]
    drifts = [max(row) - min(row) for row in expected.service]
    assert data["max_drift"] == max(drifts)
    assert data["max_drift_step"] == drifts.index(max(drifts))
    assert data["bound_2u"] == 2 * max(max(r.prompt for r in requests), 2 * 2000)  # 2 max(w_p L_input, w_q M)
    assert data["max_drift_over_2u"] == pytest.approx(data["max_drift"] / data["bound_2u"])
    assert data["throughput"] == sum(data["service"]) / steps

    ckpt = data["checkpoints"]
    assert set(ckpt) == {"steps", "service"}
    expected_steps = list(range(499, steps, 500))
    if expected_steps[-1] != steps - 1:
        expected_steps.append(steps - 1)
    assert ckpt["steps"] == expected_steps
    assert ckpt["service"] == [[int(x) for x in expected.service[s]] for s in expected_steps]
    assert ckpt["service"][-1] == data["service"]


def test_extra_client_and_exact_numbers(tmp_path, capsys):
    """--clients above the largest id adds a client with no service; the hand-computed
    numbers of GOOD; the last step is kept even off the --record-every grid."""
    out_path = tmp_path / "out.json"
    code, out, err = run_main(capsys, [write(tmp_path, GOOD), "--policy", "vtc", "--kv-budget", "100",
                                       "--clients", "3", "--record-every", "4", "--json", out_path])
    assert code == 0, err
    data = json.loads(out_path.read_text())
    assert set(data) == KEYS
    # Client 1 arrives at step 2 with nobody backlogged: lifted to c_{last_left = 0} = 14.
    assert data == {
        "steps": 6, "clients": 3, "service": [16, 13, 0], "counters": [16, 27, 0],
        "admitted": [1, 1, 0], "completed": [1, 1, 0], "max_drift": 16, "max_drift_step": 2,
        "bound_2u": 400, "max_drift_over_2u": 16 / 400,  # 2U = 2 max(w_p 10, w_q 100)
        "throughput": 29 / 6, "checkpoints": {"steps": [3, 5], "service": [[16, 9, 0], [16, 13, 0]]},
    }
    assert data["throughput"] == float(Fraction(sum(data["service"]), data["steps"]))
    assert "     2              0              0         0         0" in out

    # The same run, but the JSON cannot be written: one error line, exit 2.
    bad = tmp_path / "no_such_dir" / "out.json"
    assert_one_error(*run_main(capsys, [write(tmp_path, GOOD), "--policy", "vtc", "--kv-budget", "100",
                                        "--clients", "3", "--record-every", "4", "--json", bad]),
                     "cannot write", str(bad))


def test_replay_drops_a_prompt_over_m_and_replays_the_rest(tmp_path, capsys):
    """A prompt past M was a refusal of the whole replay; it is dropped and counted (one
    note) and client 0's request replays alone (client 1 had only that request: the trace's
    clients are now 0 alone, 16 tokens served)."""
    path = write(tmp_path, f"{HEADER}\n0,0,10,3\n5,1,300,3\n")
    code, out, err = run_main(capsys, [path, "--policy", "vtc", "--kv-budget", "200"])
    assert code == 0, err
    assert "note: dropped 1 of 2 requests whose prompt exceeds the server's memory of 200 tokens (longest: 300)" in err
    assert "vtc: 3 steps, 1 clients" in out and "skipped 1 requests whose prompt exceeds" in out
    assert [line.split()[:2] for line in out.splitlines() if line.lstrip().startswith("0 ")] == [["0", "16"]]
