"""Issue 47 ("Every number tells the truth, round 3"), items 5-7: flags whose values start
with '-', integers out of range, the adversary's vLLM flags, stream outputs (`-`, FIFOs,
/dev/null), Ctrl-C in a policy module's import, a step-time model whose log cannot drain
within the timed clock, and the run budget (memory and time said before a run).

Each test names the defect the code had."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from vtc_jax.cli.common import Parser, int_arg
from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError
from vtc_jax.driver import run_budget
from vtc_jax.servers import step_time

ROOT = Path(__file__).resolve().parent.parent


def _one_error_line(err: str, prog: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


# ---- 5. flags ------------------------------------------------------------------------------

def test_a_value_starting_with_minus_goes_to_its_flag():
    """`--time-window -1,5` answered argparse's "expected one argument" (it took "-1,5" for
    an option); the value now reaches the flag, whose own check answers."""
    parser = Parser(prog="p")
    parser.add_argument("--time-window")
    parser.add_argument("--shift", type=float)
    parser.add_argument("--n", type=int_arg(0, 10))
    args = parser.parse_args(["--time-window", "-1,5", "--shift", "-.5"])
    assert (args.time_window, args.shift) == ("-1,5", -0.5)
    with pytest.raises(InputError, match=r"argument --n: must be >= 0 \(range 0 to 10\), got -3"):
        parser.parse_args(["--n", "-3"])
    with pytest.raises(InputError, match="unrecognized arguments: --bogus"):  # options are still options
        parser.parse_args(["--bogus"])


def test_time_window_minus_one_is_answered_by_its_own_check(tmp_path, capsys):
    from vtc_jax.cli import commands

    log = tmp_path / "log.csv"
    log.write_text("timestamp,tenant,prompt,output\n0.0,a,10,5\n1.0,b,20,3\n")
    assert commands.main(["compare", str(log), "--time-window", "-1,5", "--out", str(tmp_path / "o")]) == 2
    line = _one_error_line(capsys.readouterr().err, "vtc_jax")
    assert "--time-window" in line and "need 0 <= START" in line and "expected one argument" not in line, line
    assert not (tmp_path / "o").exists()


def test_a_too_large_integer_is_out_of_range_not_not_an_integer():
    """int_arg said "must be an integer" of any text over 12 characters (99999999999999),
    and with no maximum took 3000000000, which wraps in an int32 lane."""
    with pytest.raises(argparse.ArgumentTypeError, match=r"^out of range: must be 0 to 1073741824, got 99999999999999$"):
        int_arg(0, 1 << 30)("99999999999999")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^out of range: must be 1 to 2147483647, got 3000000000$"):
        int_arg(1)("3000000000")
    with pytest.raises(argparse.ArgumentTypeError, match=r"out of range: must be 1 to 2147483647, got 9{12}\.\.\. "
                                                         r"\(5000 digits\)"):
        int_arg(1)("9" * 5000)
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer, got '1e3'"):
        int_arg(1)("1e3")
    assert int_arg(1)("2147483647") == 2**31 - 1 and int_arg(-5, 5)("-5") == -5 and int_arg(0, 9)("+7") == 7


def test_calibrate_a0_too_large_names_the_range(tmp_path, capsys):
    from sweeps import calibrate

    profile = tmp_path / "p.csv"
    profile.write_text("x\n")
    assert calibrate.main([str(profile), "--server", "vllm", "--a0", "99999999999999"]) == 2
    line = _one_error_line(capsys.readouterr().err, "python -m sweeps.calibrate")
    assert line.endswith("argument --a0: out of range: must be 0 to 1073741824, got 99999999999999"), line


# ---- 5. the adversary takes vLLM's engine arguments -------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--num-gpu-blocks", "5"], "--num-gpu-blocks is a setting of --server vllm"),
    (["--server", "vllm", "--num-gpu-blocks", "5", "--kv-budget", "100"],
     "--num-gpu-blocks 5 sets M = (5 - 1) x 16 = 64 tokens, and --kv-budget says 100: give one of them"),
    (["--server", "vllm", "--num-gpu-blocks", "99999999999999"], "out of range"),
])
def test_adversary_vllm_flags_are_checked(tmp_path, capsys, args, words):
    from sweeps import adversary as sweep

    assert sweep.main(["--out", str(tmp_path / "never"), *args]) == 2
    assert words in _one_error_line(capsys.readouterr().err, sweep.PROG)
    assert not (tmp_path / "never").exists()


def test_adversary_takes_num_gpu_blocks(tmp_path, capsys):
    """`sweeps.adversary --server vllm --num-gpu-blocks N` answered "unrecognized arguments"
    (the README promises vLLM's flags on every sweep). N = 5 blocks of 16 is M = (5 - 1) x 16
    = 64 tokens: the run of tests/test_adversary.py's `--kv-budget 64`, the same pool."""
    from sweeps import adversary as sweep

    out = tmp_path / "adv"
    args = ["--policy", "vtc", "--generations", "1", "--population", "48", "--restarts", "2", "--horizon", "24",
            "--requests", "3", "--prompt", "4,40", "--output", "1,16", "--num-gpu-blocks", "5",
            "--horizon-grid", "none", "--quiet", "--no-plots", "--server", "vllm"]
    assert sweep.main(["--out", str(out), *args]) == 0, capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())
    (row,) = result["rows"]
    assert row["label"] == "vtc M=64 K=2 T=24 on vllm" and result["config"]["kv_budgets"] == [64]
    meta = json.loads((out / row["metrics"]["witness"]).with_suffix(".json").read_text())
    assert meta["server_options"] == {"num_gpu_blocks": 5, "block_size": 16, "max_num_batched_tokens": 2048,
                                      "max_num_seqs": 256}
    assert " --block-size 16 --max-num-batched-tokens 2048 --max-num-seqs 256 --num-gpu-blocks 5 " in meta["replay"]


# ---- 6. stream outputs ----------------------------------------------------------------------------

def _read_fifo(path: Path, into: list):
    def reader():
        with open(path, "rb") as fh:
            into.append(fh.read())
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread


def test_streams_are_written_as_streams_after_the_regular_files(tmp_path, capsysbinary):
    """A FIFO, /dev/null and `-` were refused ("not a regular file"). Now each is opened and
    written once, after the set's regular files are in place, and nothing is created beside
    a stream (no temporary, no probe)."""
    fifo_dir = tmp_path / "fifo_dir"
    fifo_dir.mkdir()
    fifo = fifo_dir / "pipe.json"
    os.mkfifo(fifo)
    got: list = []
    regular = tmp_path / "results.json"
    seen_regular = []

    def fifo_writer(p):
        Path(p).write_text("to the fifo")
        seen_regular.append(regular.exists())  # the writer runs before placement: not there yet

    for path in (fifo, Path(os.devnull), "-"):
        assert fileio.check_writable_file(path) == Path(path)
    assert os.listdir(fifo_dir) == ["pipe.json"]  # no probe beside the FIFO
    thread = _read_fifo(fifo, got)
    written = fileio.write_outputs_atomically([(regular, lambda p: p.write_text("regular")), (fifo, fifo_writer),
                                               (Path(os.devnull), lambda p: p.write_text("nothing")),
                                               (Path("-"), lambda p: p.write_bytes(b"to stdout\n"))])
    thread.join(10)
    assert written == [regular, fifo, Path(os.devnull), Path("-")]
    assert got == [b"to the fifo"] and regular.read_text() == "regular" and seen_regular == [False]
    assert capsysbinary.readouterr().out == b"to stdout\n"
    assert os.listdir(fifo_dir) == ["pipe.json"] and Path(os.devnull).is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo_dir", "results.json"]


def test_a_stream_gets_nothing_when_a_regular_file_of_its_set_fails(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def fails(p):
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match=r"cannot write .*b\.json \(No space left on device\)"):
        fileio.write_outputs_atomically([(fifo, lambda p: p.write_text("never")), (tmp_path / "b.json", fails)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # and the FIFO was never opened (no reader: no hang)


def test_a_directory_output_stays_a_directory(tmp_path):
    for bad in (os.devnull, "-"):
        with pytest.raises(InputError, match="not a directory"):
            fileio.check_writable_dir(bad, ["results.json"])
    with pytest.raises(InputError, match="not a directory"):
        fileio.check_dir_possible("-")


def test_replay_writes_json_to_stdout_and_dev_null(tmp_path):
    """`replay --json - --details /dev/null` was refused ("not a regular file"): now the
    input's line, the JSON on stdout, then the summary; nothing beside /dev/null (the run of
    test_output_safety's full-disk test, compiled once)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,client,prompt,output\n0,0,10,5\n1,1,20,3\n")
    proc = subprocess.run([sys.executable, "-m", "vtc_jax", "replay", str(trace), "--policy", "vtc", "--kv-budget",
                           "100", "--no-cache", "--json", "-", "--details", os.devnull], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    first, rest = proc.stdout.split("\n", 1)
    assert first.startswith("read ") and rest.startswith("{"), proc.stdout
    out, end = json.JSONDecoder().raw_decode(rest)
    assert out["clients"] == 2 and out["completed"] == [1, 1], out
    assert rest[end:].strip().startswith("vtc:"), rest[end:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


# ---- 6. Ctrl-C in a policy module's slow import ------------------------------------------------------

_SLOW_MODULE = textwrap.dedent("""
    import pathlib, sys, time
    pathlib.Path(sys.argv[0] if False else {marker!r}).write_text("importing")
    try:  # an import runs bytecode between its C calls: short sleeps
        for _ in range(1200):
            time.sleep(0.05)
    except BaseException as err:   # as C extensions do (jaxlib: "error while initializing the extension")
        raise ImportError("the extension failed to initialize") from err
""")

def _default_signals():
    """In the child before exec: Ctrl-C, SIGTERM and SIGHUP at their defaults, as a shell
    starts a command. An ignored signal is inherited across exec, and the command rightly
    leaves it ignored (fileio.stop_early_on_signals): a test worker whose SIGINT some other
    test left ignored made these tests wait out their subprocess (CI, two stops)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


_IN_PROCESS = textwrap.dedent("""
    import sys
    from vtc_jax.cli import commands
    sys.exit(commands.main(["policies", "--policy-module", sys.argv[1]]))
""")


@pytest.mark.parametrize("how", ["in_process", "command"])
def test_ctrl_c_in_a_policy_modules_import_is_one_line_and_130(tmp_path, how):
    """Ctrl-C while a --policy-module's top level ran: where the import turned the
    KeyboardInterrupt into another error (as C extensions do), it was reported as a broken
    file ("import failed (ImportError ...)", exit 2) instead of an interrupt."""
    marker = tmp_path / "marker"
    module = tmp_path / "slow_policy.py"
    module.write_text(_SLOW_MODULE.format(marker=str(marker)))
    command = ([sys.executable, "-c", _IN_PROCESS, str(module)] if how == "in_process"
               else [sys.executable, "-m", "vtc_jax", "policies", "--policy-module", str(module)])
    proc = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), proc.communicate()
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines() == ["vtc_jax: error: interrupted (Ctrl-C); no results were written"], err


_EARLY = textwrap.dedent("""
    import sys, time
    from vtc_jax.core import fileio
    print(fileio.stop_early_on_signals(["python3", "-m", "sweeps.rpm", "--seeds", "4"]), flush=True)
    for _ in range(1200):   # the imports a command makes before its own handler (jax: seconds): bytecode
        time.sleep(0.05)    # between C calls
""")


def test_command_prog_reads_the_interpreters_command_line():
    assert fileio.command_prog(["python3", "-m", "vtc_jax", "replay", "t.csv"]) == "vtc_jax"
    assert fileio.command_prog(["python", "-m", "sweeps.rpm"]) == "python -m sweeps.rpm"
    assert fileio.command_prog(["python", "-X", "dev", "-u", "-m", "benchmarks.bench_vllm", "-m", "x"]) == \
        "python -m benchmarks.bench_vllm"
    for argv in (["python3", "-m", "pytest", "-q"], ["python3", "script.py", "-m", "vtc_jax"], ["python3", "-c", "x"],
                 ["python3", "-m"], []):
        assert fileio.command_prog(argv) is None, argv
    assert fileio.stop_early_on_signals(["python3", "-m", "pytest"]) is False  # a caller's process: untouched


@pytest.mark.parametrize("signum, status, name", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_during_a_commands_imports_is_one_line(signum, status, name):
    """Ctrl-C while `python -m vtc_jax ...` (or a sweep) was still importing jax, before
    `guarded` installed its handler, printed a KeyboardInterrupt traceback of 30-45 lines
    (or an ImportError from jaxlib, or was lost in jax's gc callback). The package now
    installs the handler first thing (fileio.stop_early_on_signals; vtc_jax/__init__.py
    calls it): one line and 128 + signal."""
    proc = subprocess.Popen([sys.executable, "-c", _EARLY], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    try:
        assert proc.stdout.readline().strip() == "True"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == status, (proc.returncode, err)
    assert err.strip().splitlines() == [f"python -m sweeps.rpm: error: interrupted ({name}); no results were written"]


# ---- 7. a step-time model whose log cannot drain within the clock ---------------------------------------

def _model(**values) -> step_time.StepTime:
    data = {"b0": "1000", "b1": "10", "b2": "100", "a0": 500, **values}
    return step_time.from_dict(data, "m", "m")


def test_drain_floor_worked_by_hand():
    """b0 = 1000, b1 = 10, b2 = 100 us, a0 = 500, budget 128.
    Log A: arrivals 0, 2000 us; prompts 300, 50; outputs 4, 3. The last request joins at
    2000 + 500 = 2500, prefills its 50 tokens in ceil(50/128) = 1 step of at least
    1000 + 500 - 1 = 1499 us, then decodes 3 - 1 = 2 steps of at least trunc(1000 + 100) =
    1100 us: 2500 + 1499 + 2200 = 6199. The whole log's work from 0 + 500: 10 x 350 +
    100 x (3 + 2) = 4000, 4500 < 6199.
    Log B: ten requests at 0 of prompt 100, output 10: alone 500 + 1999 + 9 x 1100 = 12399;
    the work 10 x 1000 + 100 x 90 = 19000, from 500: 19500.
    With b0 = 0.5 (< 1: a step's truncation is no longer covered) log B's work counts half:
    500 + 9500 = 10000, and alone is 500 + max(1, trunc(0.5 + 1000) - 1) + 9 x 100 = 2399."""
    model = _model()
    assert model.step_us(0, 1) == 1100 and model.longest_step(2048, 256) == 1000 + 20480 + 25600
    assert model.drain_floor([0, 2000], [300, 50], [4, 3], 128) == 6199
    assert model.drain_floor([0] * 10, [100] * 10, [10] * 10, 2048) == 19500
    assert _model(b0="0.5").drain_floor([0] * 10, [100] * 10, [10] * 10, 2048) == 10000
    # a prefix cache may hold 90 of each prompt: 10 tokens each are prefilled. Alone: 500 +
    # (1000 + 10 x 10 - 1) + 9 x 1100 = 11499; the work: 500 + 10 x 100 + 100 x 90 = 10500
    assert model.drain_floor([0] * 10, [100] * 10, [10] * 10, 2048, cached=[90] * 10) == 11499


def test_a_huge_step_time_model_is_refused_before_the_run(tmp_path):
    """A step-time JSON with huge a0/b coefficients passed its longest-step check and ran
    (55 s on a 3-request log) only to flag every lane as not finished: its log cannot drain
    within the 2^30 - 1 us of a timed lane's int32 clock. From the first arrival + a0 =
    1,000,000,000 us, the log's 350 prompt tokens take at least 200,000 us each and its
    49 + 79 + 19 = 147 decode tokens 50,000,000 us each: 1,000,000,000 + 70,000,000 +
    7,350,000,000 = 8,420,000,000 us (the last request alone: 1,001,000,000 + 10,999,999 +
    19 x 51,000,000 = 1,980,999,999)."""
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({"b0": "1000000", "b1": "200000", "b2": "50000000", "a0": 1_000_000_000,
                                "num_gpu_blocks": 100}))
    model = step_time.read_step_time(path)
    model.check(2048, 2)  # each step alone fits int32 (the old check)
    arrival, prompt, output = [0, 500_000, 1_000_000], [100, 200, 50], [50, 80, 20]
    assert model.drain_floor(arrival, prompt, output, 2048) == 8_420_000_000
    with pytest.raises(InputError) as err:
        model.check_drain(arrival, prompt, output, 2048)
    assert str(err.value) == ("step-time model huge.json: this log needs at least 8,420,000,000 us (140.3 minutes) of "
                              "the server's clock to drain, past the 1,073,741,823 us a timed run's clock holds: "
                              "give smaller coefficients (a0, b0, b1, b2) or a shorter log (--time-window)")
    step_time.preset("qwen2.5-7b-h100").check_drain(arrival, prompt, output, 2048)  # a real model: fine


# ---- 7. the run budget ----------------------------------------------------------------------------------

def test_run_budget_estimate_by_hand():
    """2 lanes of 5 rows, 4 slots, a 1000-block prefix pool (W 8, U 100, 120 content ids,
    2 running, 50 blocks taken and hashed), 100 events, 1 device. The pool: 24 x 1000 +
    4 x ring_size(1000, 8) = 2048 + 8 x 128 (U padded) + 4 x 128 (ids padded) + 4 x 4 x
    (8 + 2) = 33,888 bytes; a lane 2 x (44 x 5 + 160 x 4 + 33,888 + 65,536) = 200,568. Its
    time: 100 x (2e-4 + 1e-7 x 4) + 100 x (3e-5 + 2e-6 x 2 + 2e-7 x ceil(8 / 64)) + 2e-6 x
    50 + 5e-9 x 2 x 5 x 8 = 0.0235604 s, 2 lanes on one device: 0.0471208 s. Without prefix caching, on 2
    devices (a lane each): 2 x (220 + 640 + 65536) = 132,792 bytes a lane; an event
    2e-4 + 4e-7 + 1.1e-8 x 1000 = 2.114e-4 s, x 100: 0.02114 s."""
    shape = run_budget.RunShape(lanes=2, slots=4, pool_blocks=1000, rows=5, events=100, prefix_caching=True,
                                table_width=8, contents=100, content_ids=120, running=2, block_ops=50)
    assert run_budget.ring_size(1000, 8) == 2048 and run_budget.pool_bytes(shape) == 33_888
    est = run_budget.estimate(shape)
    assert est.bytes == 2 * 200_568 and est.seconds == pytest.approx(0.0471208, rel=1e-12)
    plain = run_budget.estimate(run_budget.RunShape(lanes=2, slots=4, pool_blocks=1000, rows=5, events=100,
                                                    devices=2))
    assert plain.bytes == 2 * 132_792 and plain.seconds == pytest.approx(0.02114, rel=1e-12)
    with pytest.raises(ValueError, match="lanes"):
        run_budget.estimate(run_budget.RunShape(lanes=0, slots=1, pool_blocks=0, rows=1, events=1))
    with pytest.raises(ValueError, match="table_width"):
        run_budget.estimate(dataclasses.replace(shape, table_width=-1))


def test_run_budget_ring_matches_the_pool():
    """run_budget's copy of vllm_blocks.ring_size (the driver floor imports no server) is
    the pool's, and its memory model is the pool's own arrays' bytes at a real size."""
    from vtc_jax.servers import vllm_blocks

    for p, w in [(2, 1), (1000, 8), (67_660, 56), (67_660, 7_888), (1 << 20, 3)]:
        assert run_budget.ring_size(p, w) == vllm_blocks.ring_size(p, w)
    import jax

    pool = vllm_blocks.pool_init(67_660, 4, 56, 4096)
    arrays = [x for x in jax.tree_util.tree_leaves(pool) if x.ndim > 0]  # the scalars aside
    shape = run_budget.RunShape(lanes=1, slots=4, pool_blocks=67_660, rows=1, events=1, prefix_caching=True,
                                table_width=56, contents=4096)
    content_table = 4 * 4096  # the lane's block ids (in its settings, not the pool)
    assert run_budget.pool_bytes(shape) - content_table == sum(x.size * x.dtype.itemsize for x in arrays)


def test_run_budget_refuses_past_memory_and_warns_past_time():
    """The issue's run (2 requests of 600 + 8,000 tokens sharing 512, 2 lanes on 2 devices,
    the preset's 67,660-block pool) is quick on the new pool: 8,006 events x (2e-4 +
    1e-7 x 2 + 3e-5 + 2e-6 x 2 + 2e-7 x ceil(538 / 64)) + 2e-6 x 2,150 blocks + 5e-9 x 2 x
    2 x 538 = 1.894 s, no warning (the old model said 18.1 minutes; the old server ran 16). Memory: 24 x 67,660
    + 4 x 262,144 (the ring) + 8 x 2,048 + 4 x 2,048 + 4 x 2 x 540 = 2,701,312 bytes of
    pool; 2 x 2 x (88 + 320 + 2,701,312 + 65,536) = 11,069,024 in all. 32 lanes (16 seeds
    x 2 policies) of Mooncake's first 1,000 s (3,035 requests, W 7,888, 150,505 events, 8
    running, 5.3 M blocks) warn: 16 x (150,505 x (2e-4 + 1.024e-4 + 3e-5 + 1.6e-5 + 2e-7 x
    124) + 10.6 + 5e-9 x 2 x 3,035 x 7,888) = 1,072.1 s, 17.9 minutes. 4096 lanes of the whole
    trace (12,031 rows, 9,044,013 content ids, 4 M contents) hold 1,040.7 GiB: refused."""
    shape = run_budget.RunShape(lanes=2, slots=2, pool_blocks=67_660, rows=2, events=8006, prefix_caching=True,
                                devices=2, table_width=538, contents=1042, content_ids=1074, running=2, block_ops=2150)
    warned = []
    est = run_budget.check(shape, available=64 << 30, warn=warned.append)
    assert est.bytes == 11_069_024 and est.seconds == pytest.approx(1.89372676, rel=1e-12) and warned == []
    long = run_budget.RunShape(lanes=32, slots=1024, pool_blocks=67_660, rows=3035, events=150_505, prefix_caching=True,
                               devices=2, table_width=7888, contents=1_500_000, content_ids=2_600_000, running=8,
                               block_ops=5_300_000)
    est = run_budget.check(long, available=64 << 30, warn=warned.append)
    assert est.seconds == pytest.approx(1072.1258688, rel=1e-12)
    assert warned == ["warning: this run needs about 4.1 GiB / about 17.9 minutes to run (32 lane(s) x 150,505 events "
                      "over a 67,660-block prefix-caching pool); for a quicker answer give fewer lanes (policies x "
                      "seeds), a smaller --num-gpu-blocks or a shorter log"]
    big = run_budget.RunShape(lanes=4096, slots=1024, pool_blocks=67_660, rows=12_031, events=10, prefix_caching=True,
                              devices=2, table_width=7888, contents=4_000_000, content_ids=9_044_013, running=8,
                              block_ops=18_000_000)
    with pytest.raises(InputError) as err:
        run_budget.check(big, available=64 << 30, warn=warned.append)
    assert str(err.value) == ("this run needs about 1,040.7 GiB / about 1,261.3 minutes (4096 lane(s) of 12,031 rows, "
                              "1,024 slots, 67,660 pool blocks), more than the 64.0 GiB of memory free: give fewer lanes "
                              "(policies x seeds), a smaller --num-gpu-blocks or a shorter log")
    assert len(warned) == 1


def test_compare_refuses_a_log_the_step_model_cannot_drain(tmp_path, capsys):
    """Through the command: compare on a timed vllm server with the huge model above
    refuses before the run, one line (it ran, then flagged every lane unfinished)."""
    from vtc_jax.cli.commands import main

    model = tmp_path / "huge.json"
    model.write_text(json.dumps({"b0": "1000000", "b1": "200000", "b2": "50000000", "a0": 1_000_000_000,
                                 "num_gpu_blocks": 100}))
    log = tmp_path / "l.csv"
    log.write_text("timestamp,tenant,prompt,output\n0,a,100,50\n0.5,b,200,80\n1,a,50,20\n")
    code = main(["compare", str(log), "--server", "vllm", "--step-time", str(model), "--max-num-seqs", "2",
                 "--policies", "fcfs", "--out", str(tmp_path / "out")])  # 2 seats: each step alone fits int32
    err = capsys.readouterr().err
    assert code == 2 and "this log needs at least 8,420,000,000 us" in err
    assert not (tmp_path / "out").exists()


def test_compare_sizes_a_prefix_caching_run_from_its_pool(tmp_path, capsys, monkeypatch):
    """compare --enable-prefix-caching on the preset's 67,660-block pool: two requests of
    8,000 output tokens sharing a 512-token prefix (a 2-request log the old server ran for
    16 minutes, which the old size check then put at 14.5 minutes) run with no warning
    (8,150 events of 0.63 ms: 5.2 s a lane, 10.3 s for 2 lanes on one device); the same log
    under 256 seeds (512 lanes: 22 minutes on 2 devices, 44 on one) warns in one line. The test stops after the plan."""
    from vtc_jax.cli import study_plan
    from vtc_jax.cli.commands import main

    def stop(*_args, **_kw):
        raise KeyboardInterrupt  # the run itself is not wanted here

    monkeypatch.setattr(study_plan, "plan", _planned_then(study_plan.plan, stop))
    log = tmp_path / "l.csv"
    log.write_text("timestamp,tenant,prompt,output,prefix_id,prefix_len\n0,a,600,8000,p,512\n1,b,600,8000,p,512\n")
    flags = ["compare", str(log), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--enable-prefix-caching",
             "--policies", "fcfs,vtc", "--out", str(tmp_path / "out")]
    assert main(flags) == 130  # stopped after the plan
    assert "warning: this run needs" not in capsys.readouterr().err
    assert main(flags + ["--seeds", "256"]) == 130
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: this run needs")]
    assert len(warned) == 1 and "(512 lane(s) x 8,150 events over a 67,660-block prefix-caching pool)" in warned[0], \
        warned


def _planned_then(plan, then):
    def planned(*args, **kw):
        result = plan(*args, **kw)
        then()
        return result
    return planned


def test_replay_prints_whole_tenant_names(tmp_path, capsys):
    """replay's client column held 14 characters: tenant-number-one and tenant-number-two
    both printed as `tenant-number-`. Both now stand whole, right-aligned in one column."""
    from vtc_jax.cli.commands import main

    log = tmp_path / "l.csv"
    log.write_text("timestamp,tenant,prompt,output\n0,tenant-number-one,10,5\n1,tenant-number-two,10,5\n")
    assert main(["replay", str(log), "--policy", "fcfs", "--kv-budget", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index(next(x for x in lines if x.lstrip().startswith("client "))):]
    assert table[0].startswith("           client ")
    assert table[1].startswith("tenant-number-one ") and table[2].startswith("tenant-number-two ")


@pytest.mark.parametrize("server", ["ideal_reserve", "slora"])
def test_a_sweep_runs_on_a_server_without_vllm_blocks(tmp_path, capsys, server):
    """`sweeps.schedulers --server ideal_reserve|slora` ended in 'internal error: KeyError:
    num_gpu_blocks' (the sweep took every non-default server's memory from vLLM's blocks):
    ideal_reserve takes --kv-budget as the default server does, slora its own pool."""
    from sweeps import schedulers

    out = tmp_path / "o"
    assert schedulers.main(["--server", server, "--seeds", "2", "--steps", "300", "--out", str(out), "--no-plots"]) == 0
    assert (out / "results.json").exists()
    capsys.readouterr()
