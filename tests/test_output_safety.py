"""Outputs and signals: what the writer refuses, the files it leaves, how a stopped
command ends, the runner's bounded calls, and the sweep's progress line and plots.

Each test reproduces a defect the code once had (named in its docstring)."""

from __future__ import annotations

import errno
import itertools
import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vtc_jax.core import fileio
from vtc_jax.core.errors import InputError

ROOT = Path(__file__).resolve().parent.parent


def _text_writer(text: str):
    return lambda p: Path(p).write_text(text)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".vtc"))


# ---- 1. targets that are not regular files ---------------------------------------------

def _special_targets(tmp_path: Path) -> dict:
    """Targets that are neither a regular file nor a stream (a FIFO, a character device
    and `-` are streams now: tests/test_truth_round3_cli.py writes them)."""
    sock = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    (tmp_path / "dir").mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    os.symlink(tmp_path / "sock", tmp_path / "to_sock")
    return {"socket": (sock, "socket"), "dir": (tmp_path / "dir", "directory"),
            "dangling": (tmp_path / "dangling", "dangling"), "to_sock": (tmp_path / "to_sock", "socket")}, server


def test_writer_and_checks_refuse_targets_that_are_not_regular_files(tmp_path):
    """The writer renamed over anything: a socket or a directory's place became a regular
    file. (It once refused FIFOs and /dev/null too; those are streams now, written as such.)"""
    targets, server = _special_targets(tmp_path)
    try:
        for name, (path, words) in targets.items():
            before = os.lstat(path)
            for check in (fileio.check_writable_file, fileio.check_target,
                          lambda p: fileio.write_text_atomically(p, "x"),
                          lambda p: fileio.check_writable_dir(p.parent, [p.name])):
                with pytest.raises(InputError, match=words) as err:
                    check(path)
                assert str(path) in str(err.value), name
            after = os.lstat(path)
            assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino), name
        assert not (tmp_path / "nowhere").exists()  # a dangling link is never followed
        assert _leftovers(tmp_path) == []
    finally:
        server.close()


def test_a_link_to_a_regular_file_is_written_through(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    os.symlink(real, link)
    fileio.check_writable_file(link)
    fileio.write_text_atomically(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


# ---- 2. one path twice in a set -----------------------------------------------------------

def test_the_same_path_twice_in_one_set_is_refused(tmp_path):
    """`--json X --details X` kept one of the two silently."""
    out = tmp_path / "out.json"
    (tmp_path / "sub").mkdir()
    same = tmp_path / "sub" / ".." / "out.json"
    with pytest.raises(InputError, match="same output file"):
        fileio.write_outputs_atomically([(out, _text_writer("a")), (same, _text_writer("b"))])
    assert not out.exists() and _leftovers(tmp_path) == []
    with pytest.raises(InputError, match="same output file"):
        fileio.check_distinct_outputs([out, None, same])
    assert fileio.check_distinct_outputs([out, None, tmp_path / "other.json"]) == [out, tmp_path / "other.json"]
    os.symlink(out, tmp_path / "alias.json")
    with pytest.raises(InputError, match="same output file"):
        fileio.check_distinct_outputs([out, tmp_path / "alias.json"])


# ---- 3. the umask --------------------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_outputs_honour_the_umask(tmp_path, umask):
    """Every output was mode 0600 (mkstemp's) whatever the umask."""
    old = os.umask(umask)
    try:
        path = fileio.write_text_atomically(tmp_path / f"out{umask:o}.txt", "x")
        plain = tmp_path / f"plain{umask:o}.txt"
        with open(plain, "w") as fh:
            fh.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask == stat.S_IMODE(os.stat(plain).st_mode)


# ---- full disk --------------------------------------------------------------------------------

def test_a_full_disk_mid_set_leaves_nothing(tmp_path):
    (tmp_path / "a.json").write_text("previous")

    def full(p):
        Path(p).write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(InputError, match=r"b\.csv \(No space left on device\)"):
        fileio.write_outputs_atomically([(tmp_path / "a.json", _text_writer("new")), (tmp_path / "b.csv", full),
                                         (tmp_path / "c.png", _text_writer("never"))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    assert (tmp_path / "a.json").read_text() == "previous"


# ---- 5, 6. signals in a command process ------------------------------------------------------

_COMMAND = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from vtc_jax.cli import common as cli_common
    from vtc_jax.core import fileio
    cli_common._is_command = lambda: True   # as under `python -m sweeps.X`
    out = Path(sys.argv[1])
    how = sys.argv[2]

    def writer(p):
        Path(p).write_text("partial")
        if how == "swallowed":   # a KeyboardInterrupt raised inside a callback that eats it
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)
            except KeyboardInterrupt:
                pass
        else:
            os.kill(os.getpid(), getattr(signal, how))
            time.sleep(0.5)

    def body():
        if how == "caller":   # the body itself swallows the interrupt and returns 0
            try:
                fileio.write_outputs_atomically([(out / "a.json", lambda p: writer_caller(p))])
            except KeyboardInterrupt:
                pass
            return 0
        fileio.write_outputs_atomically([(out / "a.json", lambda p: Path(p).write_text("a")), (out / "b.json", writer)])
        print("wrote")
        return 0

    def writer_caller(p):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)

    sys.exit(cli_common.guarded("cmd", body))
""")


@pytest.mark.parametrize("how, status, name", [("SIGTERM", 143, "SIGTERM"), ("SIGHUP", 129, "SIGHUP"),
                                               ("SIGINT", 130, "Ctrl-C"), ("swallowed", 130, "Ctrl-C"),
                                               ("caller", 130, "Ctrl-C")])
def test_a_signal_while_writing_leaves_nothing_and_is_one_line(tmp_path, how, status, name):
    """SIGTERM/SIGHUP killed the process and left .tmp files; a Ctrl-C whose exception was
    swallowed (in a callback, or by the body) was lost and the command exited 0."""
    proc = subprocess.run([sys.executable, "-c", _COMMAND, str(tmp_path), how], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines() == [f"cmd: error: interrupted ({name}); no results were written"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_interrupt_during_the_renames_waits_for_the_whole_set(tmp_path, monkeypatch):
    """A signal between two renames must not leave half a set: the handler only records it
    then, and the writer stops once the set is whole."""
    renamed = []
    real_replace = os.replace

    def replace(src, dst):
        if renamed:  # the handler runs between the first and the second rename
            assert fileio.renaming()
            fileio.record_interrupt(15)
        renamed.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(fileio, "_interrupt", [0])
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        fileio.write_outputs_atomically([(tmp_path / n, _text_writer(n)) for n in ("a", "b", "c")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]
    assert fileio.pending_interrupt() == 15 and not fileio.renaming()


# ---- 8. the progress line's time left ----------------------------------------------------------

def _drive_progress(progress, clock, chunks: int, lanes: int, calls: int, events: int, expected: int,
                    compile_s: float) -> float:
    """Drive `progress` as sweep.evaluate and runner.run do: `chunks` chunks of `lanes`
    lanes, each `calls` calls of `events` events taking 1 s on the fake `clock` (the very
    first call also `compile_s`); returns the clock at the end."""
    for c in range(chunks):
        report = progress.chunk(lanes, lanes)
        for i in range(1, calls + 1):
            clock[0] += 1 + (compile_s if c == 0 and i == 1 else 0)
            report(i * events, max(expected, i * events), clock[0])
        progress.finished_chunk(lanes)
    return clock[0]


def test_the_time_left_tracks_measured_progress():
    """The estimate counted the compile as work: ~45x too pessimistic on a small sweep.
    Here (compile 200 s, then 4 chunks of 32 one-second calls) it must stay within the bias
    of the runner's expected event count (x1.25) in the first chunk, and within 10% once a
    chunk has been measured whole."""
    import io
    import re

    from vtc_jax.driver.sweep import Progress

    clock, prints = [0.0], []

    class Log(io.StringIO):
        def write(self, text):
            if text.strip():
                prints.append((clock[0], text))
            return len(text)

    calls, compile_s = 32, 200.0
    progress = Progress("t", 4 * 100, 6000, Log(), clock=lambda: clock[0])
    end = _drive_progress(progress, clock, chunks=4, lanes=100, calls=calls, events=256,
                          expected=int(1.25 * calls * 256), compile_s=compile_s)
    checked = 0
    for at, text in prints:
        truth = end - at
        if at <= compile_s + 1 or truth <= 0:  # before a measured call there is nothing to go by
            continue
        left = re.search(r"~(\d+) s left", text)
        assert left, text
        tolerance = 1.5 if at < compile_s + calls else 1.1
        assert truth / tolerance - 1 <= float(left.group(1)) <= tolerance * truth + 1, (at, truth, text)
        checked += 1
    assert checked >= 20


def test_drained_lanes_report_lanes_per_second_and_no_guess():
    """A one-server slora compare printed '~2628170 s left' and '156.25 M lane-steps/s': its
    lanes drain, so its steps (10^9 us) and the runner's expected events are bounds, not
    their length. Drained: lanes/s, and time left only once a chunk was measured whole. Here
    2 chunks of 10 lanes, 8 calls of 4 events, 1 s each: the first chunk's measured work is
    its 7 s after the first call, 10 x 28/32 = 8.75 lanes, 1.25 lanes/s; at 9 s the second
    chunk is 4/32 done (11.25 lanes): 8.75 / 1.25 = 7 s left."""
    import io

    from vtc_jax.driver.sweep import Progress

    clock, prints = [0.0], []

    class Log(io.StringIO):
        def write(self, text):
            if text.strip():
                prints.append(text)
            return len(text)

    progress = Progress("t", 2 * 10, 1_610_612_734, Log(), clock=lambda: clock[0], drains=True)
    _drive_progress(progress, clock, chunks=2, lanes=10, calls=8, events=4, expected=1_610_612_734, compile_s=0)
    assert prints and not any("lane-steps" in line for line in prints)
    first_chunk = [line for line in prints if "lanes 0/20" in line]
    assert first_chunk and all("n/a lanes/s" in line and "time left not yet known" in line for line in first_chunk)
    after = next(line for line in prints if "lanes 11/20" in line)
    assert "1.25 lanes/s" in after and "~7 s left" in after, after


# ---- 7. the runner's calls are short ------------------------------------------------------------

def _slow_program():
    """A lane that is never done and whose event costs a 160x160 matmul (~1 ms on CPU)."""
    import jax.numpy as jnp

    from vtc_jax.driver import runner

    def init(config, batched, shared):
        return {"x": jnp.full((160, 160), 0.01, jnp.float32) * batched, "n": jnp.zeros((), jnp.int32)}

    def step(carry, batched, shared, config):
        return {"x": jnp.tanh(carry["x"] @ carry["x"]), "n": carry["n"] + 1}

    return runner.LaneProgram("slow", init, step, lambda carry: carry["n"] < 0)


def test_no_compiled_call_runs_for_long():
    """One compiled call ran `chunk` events whatever they cost (8,192 in a dense replay:
    minutes), and a signal handler runs only between calls, so Ctrl-C was ignored."""
    import time

    import jax.numpy as jnp

    from vtc_jax.driver import runner

    marks = [time.perf_counter()]
    host, done = runner.run(_slow_program(), None, jnp.ones(2), None, event_budget=8192, chunk=8192,
                            progress=lambda spent, expected, seconds: marks.append(time.perf_counter()))
    marks.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    assert int(host["n"][0]) == 8192 and not done.any()
    # a few seconds of work in all on this CPU (one call before); the first gap also holds
    # the compile, which a second test worker on the same cores can slow past any bound
    assert max(gaps[1:]) < 2.0, gaps
    assert len(gaps) > 4, gaps  # split in several calls, however fast the machine


def test_call_sizes_do_not_change_results(monkeypatch):
    """Whatever the calls' sizes, a lane runs whole chunks: here a budget of 100 in chunks
    of 64 runs 128 events in 1-event calls as in 64-event calls, and lanes done early stop."""
    import jax.numpy as jnp
    import numpy as np

    from vtc_jax.driver import runner

    def init(config, batched, shared):
        return {"n": jnp.zeros((), jnp.int32), "stop": batched}

    def step(carry, batched, shared, config):
        return {"n": carry["n"] + (carry["n"] < carry["stop"]), "stop": carry["stop"]}

    program = runner.LaneProgram("count", init, step, lambda carry: carry["n"] >= carry["stop"])
    results = []
    for seconds in (1e-12, 1e12):  # every call shrinks to 1 event / every call is a whole chunk
        monkeypatch.setattr(runner, "CALL_SECONDS", seconds)
        host, done = runner.run(program, None, jnp.asarray([5, 77, 10_000], jnp.int32), None, event_budget=100,
                                chunk=64)
        results.append((np.asarray(host["n"]).tolist(), np.asarray(done).tolist()))
    assert results[0] == results[1] == ([5, 77, 128], [True, True, False])


# ---- 9, 10. plots ---------------------------------------------------------------------------------

def _metric(mean: float) -> dict:
    return {"mean": mean, "ci95": [mean * 0.999, mean * 1.001]}


def test_scatter_labels_do_not_overlap(tmp_path, monkeypatch):
    """Labels were all put 5 points up-right of their point: close points' labels overlapped."""
    import matplotlib.figure
    from matplotlib.text import Text

    from vtc_jax.driver import sweep, sweep_outputs

    boxes = []
    original = matplotlib.figure.Figure.savefig

    def recording(fig, *args, **kwargs):
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            for t in ax.texts:
                t.update_positions(renderer)  # where it is drawn
                boxes.append(Text.get_window_extent(t, renderer))  # the text, not its leader line
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", recording)
    points = [(1.0, 10.0), (1.001, 10.01), (1.002, 10.0), (1.0, 10.02), (1.5, 12.0), (1.501, 12.0), (2.0, 11.0),
              (1.0015, 10.015)]
    result = {"rows": [{"label": f"policy-{i} cap={i * 7}", "setting": {},
                        "metrics": {"throughput": _metric(x), "max_drift": _metric(y)}}
                       for i, (x, y) in enumerate(points)]}
    plot = sweep.Plot("scatter", "f.png", "close points", "throughput", "max_drift")
    sweep_outputs.draw(result, plot, tmp_path / "f.png")
    assert len(boxes) == len(points)
    overlapping = [(i, j) for i in range(len(boxes)) for j in range(i) if boxes[i].overlaps(boxes[j])]
    assert not overlapping, overlapping
    assert (tmp_path / "f.png").stat().st_size > 0


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_a_tenants_plot_of_5000_tenants_stays_small(tmp_path):
    """The figure was 0.5 in per tenant: 275,220 px wide for 5,000 tenants."""
    from vtc_jax.driver import sweep_outputs

    k = 5000
    demand = [(k - i) / (k * (k + 1) / 2) for i in range(k)]  # tenant 0 demands most
    rows = [{"label": p, "setting": {}, "metrics": {},
             "clients": {"offered_share": demand, "served_share": demand, "wait_p99": [float(i + 1) for i in range(k)]}}
            for p in ("vtc", "fcfs")]
    path = tmp_path / "tenants.png"
    sweep_outputs.draw_tenants({"rows": rows}, [f"t{i}" for i in range(k)], path)
    width, height = _png_size(path)
    assert width <= sweep_outputs.MAX_FIGURE_PIXELS and height <= sweep_outputs.MAX_FIGURE_PIXELS, (width, height)
    top = sweep_outputs.top_tenants(demand)
    assert top[:3] == [0, 1, 2] and len(top) == sweep_outputs.MAX_TENANT_BARS
    few = tmp_path / "few.png"
    sweep_outputs.draw_tenants({"rows": [dict(r, clients={n: v[:3] for n, v in r["clients"].items()}) for r in rows]},
                       ["a", "b", "c"], few)
    assert _png_size(few)[0] < width


def test_a_full_disk_in_a_command_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from vtc_jax.cli import commands as cli

    trace = tmp_path / "t.csv"
    trace.write_text("arrival,client,prompt,output\n0,0,10,5\n1,1,20,3\n")
    real_write = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.endswith(".tmp") and "details" in self.name:  # the second file of the set
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    status = cli.main(["replay", str(trace), "--policy", "vtc", "--kv-budget", "100", "--no-cache",
                       "--json", str(tmp_path / "out.json"), "--details", str(tmp_path / "details.json")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == 2 and len(err) == 1 and "No space left on device" in err[0] and "details.json" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
