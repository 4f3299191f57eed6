"""Helpers the test files share: writing input files, running a command (in this process or
as one), reading a sweep's results, and the size of a PNG. Each was copied across test files
before; a test file imports what it needs (`from tests.helpers import ...`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]


def write(directory: Path, content: str | bytes, name: str = "trace.csv") -> Path:
    """`content` written to `directory / name` (bytes as bytes, text as text); its path."""
    path = Path(directory) / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def exit_code(main: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """`main(argv)`'s exit status: its return value, or the code of the SystemExit it raised
    (argparse exits through there)."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as exit_:
        return exit_.code


def run_main(capsys, main: Callable[[list[str]], int], argv: Sequence[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `main(argv)` run in this process; `capsys` is
    pytest's fixture (what was captured before the call is dropped)."""
    capsys.readouterr()
    code = exit_code(main, argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(err: str) -> list[str]:
    """The non-blank lines of a command's stderr."""
    return [line for line in err.splitlines() if line.strip()]


def one_error_line(err: str) -> str:
    """The one `vtc_jax: error: ...` line of stderr (the CLI's bad-input contract): exactly
    one non-blank line, and no traceback."""
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("vtc_jax: error:") and "Traceback" not in err, err
    return lines[0]


def python(*args: str, env: dict | None = None, timeout: float = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python3 *args` as a process in the repository root (text stdout and stderr captured),
    e.g. `python("-m", "vtc_jax", "replay", path)`."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def sweep_result(main: Callable[[list[str]], int], out: Path, *argv: str) -> dict:
    """Runs a sweep command's `main([*argv, "--out", out])`, which must exit 0, and returns
    its results.json."""
    assert main([*map(str, argv), "--out", str(out)]) == 0
    return json.loads((Path(out) / "results.json").read_text())


def metrics_by_label(result: dict) -> dict:
    """A sweep's results.json as {row label: its metrics}."""
    return {row["label"]: row["metrics"] for row in result["rows"]}


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels of a PNG file, read from its IHDR chunk."""
    head = Path(path).read_bytes()[:24]
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
