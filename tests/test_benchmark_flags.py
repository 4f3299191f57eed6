"""Every benchmark command reads its flags as the CLIs do: a bad flag is one line and exit 2."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from vtc_jax.cli.common import guarded

BENCHMARKS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py")
                    if p.stem != "__init__" and "def main(" in p.read_text())


def test_every_benchmark_is_found():
    assert {"bench_engine", "bench_native", "bench_vllm", "long_horizon"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_bad_flag_is_one_line_and_exit_2(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    prog = f"python -m benchmarks.{name}"
    assert f'guarded("{prog}"' in Path(module.__file__).read_text()  # what `python -m` runs
    assert guarded(prog, lambda: module.main(["--no-such-flag"])) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error:"), err
