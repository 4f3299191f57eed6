"""Every number tells the truth: the paper, adversary and tenants commands refuse what
they could not compute honestly, flag what did not finish, and --help states the real
defaults. Small cases only (few lanes, short runs)."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import png_size
from vtc_jax.driver import artifact_run as A

LOG_HEADER = "arrival_s,client,prompt,output\n"


def _log(tmp_path, big_prompt: int, big_output: int = 20):
    """A 12-request log whose 4th request (file line 5) has the given prompt and output."""
    rows = [f"{0.3 * i:.1f},{i % 2},{big_prompt if i == 3 else 40 + i},{big_output if i == 3 else 10}"
            for i in range(12)]
    path = tmp_path / "mylog.csv"
    path.write_text(LOG_HEADER + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("prompt, output, limit", [(3071, 20, "prefill_cap 3072"), (20_000, 20, "prefill_cap 3072"),
                                                   (3000, 7000, "kv_pool 10000")])
def test_paper_refuses_a_request_no_round_could_admit(tmp_path, capsys, prompt, output, limit):
    """Before: exit 0 with every request behind it unserved and zeros printed as results."""
    from sweeps.paper import main

    path = _log(tmp_path, prompt, output)
    out = tmp_path / "out"
    assert main(["--parts", "real", "--trace", str(path), "--seeds", "1", "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: line 5:" in err and f"prompt {prompt}" in err and limit in err
    assert not out.exists()


def test_paper_flags_lanes_that_leave_requests_unserved(tmp_path, capsys, monkeypatch):
    """With the up-front refusal bypassed, the stranded lanes still never count: every row
    is flagged NOT FINISHED in the printed table, its numbers are n/a (not 0), and no plot
    of nothing is written."""
    from sweeps.paper import main

    monkeypatch.setattr(A, "check_admissible", lambda *args, **kwargs: None)
    path = _log(tmp_path, 5000)
    out = tmp_path / "out"
    assert main(["--parts", "real", "--trace", str(path), "--seeds", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = [line for line in printed.splitlines() if line.startswith("mylog ")]
    assert len(table) == 5 and all("NOT FINISHED: 1 of 1 lanes" in line for line in table)
    assert not any(re.search(r"\b0 \[0, 0\]", line) for line in table)
    result = json.loads((out / "results.json").read_text())
    assert all(r["unfinished_lanes"] == 1 and r["metrics"]["avg_diff"]["mean"] is None for r in result["rows"])
    assert sorted(p.name for p in out.iterdir()) == ["results.csv", "results.json"]


# ---- --help states the real defaults ---------------------------------------------------

DEFAULT_IN_HELP = re.compile(r"default:?\s+([-+0-9.,/e]+)")


def _parser(name: str):
    """The full parser of sweeps.NAME, as its main builds it."""
    import importlib

    from vtc_jax.cli import sweep_command

    module = importlib.import_module(f"sweeps.{name}")
    if hasattr(module, "build_parser"):
        return module.build_parser()
    parser = sweep_command.base_parser(name, module.__doc__)
    module.add_arguments(parser)
    return parser


def _numbers(text: str):
    from fractions import Fraction

    try:
        return [Fraction(t) for t in text.strip(",.").split(",")]
    except (ValueError, ZeroDivisionError):
        return None


def help_default_lies(parser) -> list:
    """(flag, what --help says, the real default) for every flag whose help names a
    numeric default that is not the one the parser uses (set_defaults included)."""
    from fractions import Fraction

    formatter = parser._get_formatter()
    out = []
    for action in parser._actions:
        if not action.help or action.default is None:
            continue
        said = DEFAULT_IN_HELP.search(formatter._expand_help(action))
        real = action.default if isinstance(action.default, (list, tuple)) else [action.default]
        try:
            real = [Fraction(str(x)) for x in real]
        except (ValueError, TypeError):
            continue
        if said and _numbers(said.group(1)) not in (None, real):
            out.append((action.option_strings[0], said.group(1), action.default))
    return out


@pytest.mark.parametrize("name", ["tenants", "paper", "adversary"])
def test_help_shows_the_real_defaults(name):
    parser = _parser(name)
    assert help_default_lies(parser) == []
    if name != "adversary":  # the sweeps' --seeds, whose default each sweep sets itself
        seeds = next(a for a in parser._actions if "--seeds" in a.option_strings)
        assert f"(default {seeds.default})" in parser._get_formatter()._expand_help(seeds)
        assert seeds.default == {"tenants": 16, "paper": 4}[name] == parser.parse_args([]).seeds


def test_help_default_check_catches_a_lie():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6000, help="horizon (default 6000)")
    parser.add_argument("--w-p", default="1", help="prefill cost (default %(default)s)")
    assert help_default_lies(parser) == []
    parser.set_defaults(steps=2000, w_p="1/8")
    assert help_default_lies(parser) == [("--steps", "6000", 2000)]


# ---- figure sizes ------------------------------------------------------------------------

@pytest.mark.parametrize("panels, size", [(10, (3600, 320)), (24, (3600, 960)), (3 * 64 + 3, (3600, 1920))])
def test_paper_service_rate_figure_stays_bounded(tmp_path, panels, size):
    """--overheads takes up to 64 values: on_off_overload then has 195 rows, one panel each,
    which drew a 70,200 px wide figure; panels now wrap into rows of 10, at most 6 rows."""
    from sweeps.paper import draw_rates

    ticks = [28.5 * i for i in range(1, 20)]
    rows = [{"setting": {"workload": "w"}, "label": f"w row {i}",
             "service_rate": {"ticks_s": ticks, "mean": [[float(c + i)] * 19 for c in range(3)]}}
            for i in range(panels)]
    path = tmp_path / "rates.png"
    draw_rates(rows, path, "w")
    assert png_size(path) == size


def _sweep_names() -> list[str]:
    from pathlib import Path

    import sweeps

    return sorted(p.stem for p in Path(sweeps.__file__).parent.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", _sweep_names())
def test_every_sweeps_help_shows_its_real_defaults(name):
    """beta_tune and context_cost said --steps 6000, --kv-budget 8192, --w-p 1 where their
    defaults are 2000/4000, 16384 and 1/8 (the shared workload flags hard-coded them)."""
    import importlib

    module = importlib.import_module(f"sweeps.{name}")
    if not (hasattr(module, "build_parser") or hasattr(module, "add_arguments")):
        pytest.skip(f"sweeps.{name} builds its parser inside main")
    assert help_default_lies(_parser(name)) == []
