"""docs/GUIDE.md's outputs are what the commands print, and the README stays a short door to it.

`docs/guide.py` reruns the guide's marked command blocks and writes (or, with --check,
compares) their outputs. Here: the fast blocks (a `gen` and small `compare`s, seconds each)
are checked against the real CLI; the script's own rules (progress lines cut, trailing
spaces stripped, one directory shared by every block, head=N, --fast leaving the other
blocks alone, --check naming the block that differs) on a hand-written guide of shell
commands whose output is known; and the structure: every `$ ` command in GUIDE.md is
marked, every README command is in GUIDE.md, the README is at most 200 lines and carries
the two commands (the test command exactly as .ci/run runs it).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "guide.py"
GUIDE = REPO / "docs" / "GUIDE.md"
README = REPO / "README.md"
SETUP = "python3 -m pip install -e . && python3 -m sweeps.schedulers --seeds 64"
TESTS = 'python3 -m pip install -q -e ".[test]" && python3 -m pytest -q'


def _guide_module():
    """docs/guide.py imported by path (docs/ is no package); registered first, as its
    dataclasses look their module up while they are built."""
    if "vtc_docs_guide" not in sys.modules:
        spec = importlib.util.spec_from_file_location("vtc_docs_guide", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["vtc_docs_guide"] = module
        spec.loader.exec_module(module)
    return sys.modules["vtc_docs_guide"]


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _fences(lines: list[str]):
    """(index of the opening fence, language, body lines) of every fenced block."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            yield i, lines[i][3:].strip(), lines[i + 1:end]
            i = end + 1
        else:
            i += 1


def _commands(body: list[str], prompt: bool) -> list[str]:
    """The commands of a block, continuation lines joined and whitespace collapsed: the `$ `
    lines (prompt) or every line of a shell block."""
    out, current = [], None
    for line in body:
        if current is not None:
            current += " " + line
        elif prompt and line.startswith("$ "):
            current = line[2:]
        elif not prompt and line.strip() and not line.lstrip().startswith("#"):
            current = line
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1]
        else:
            out.append(" ".join(current.split()))
            current = None
    return out


def test_fast_blocks_match_the_cli():
    """The guide's fast blocks, rerun now, print exactly what GUIDE.md shows."""
    done = _run("--check", "--fast")
    assert done.returncode == 0, f"docs/guide.py --check --fast:\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "blocks in" in done.stderr


def test_fast_subset_is_real():
    """The fast check is not vacuous: it runs a gen and a compare, and both appear with output."""
    blocks = [b for b in _guide_module().find_blocks(GUIDE.read_text().split("\n")) if b.fast]
    commands = [c.lines[0] for b in blocks for c in b.commands]
    assert any(c.startswith("$ python -m vtc_jax gen ") for c in commands)
    assert any(c.startswith("$ python -m vtc_jax compare ") for c in commands)
    assert all(c.output for b in blocks for c in b.commands if "compare" in c.lines[0])


HAND_GUIDE = """# hand guide

<!-- guide:run fast -->
```
$ printf 'a\\n[compare] lanes 1/2 (50%%), 3 s elapsed\\nb  \\n\\n'
stale
$ printf 'one\\ntwo\\nthree\\n' > f.txt \\
    && echo written
```

<!-- guide:run fast head=2 -->
```
$ cat f.txt
one
two
... (1 more lines)
```

<!-- guide:run -->
```
$ echo slow
not rerun by --fast
```
"""


def test_script_rules_on_a_hand_guide(tmp_path):
    """--check names the block that differs (line 4: its first output is stale) and exits 1;
    a run writes the outputs (progress cut, trailing spaces and blank lines dropped, the file
    written by one block read by the next, head=2 with its count), leaving the slow block
    alone under --fast; then --check passes."""
    path = tmp_path / "g.md"
    path.write_text(HAND_GUIDE)
    check = _run("--check", "--fast", "--guide", str(path), timeout=120)
    assert check.returncode == 1
    assert check.stdout.splitlines() == [f"differs: {path} line 4: $ printf 'a\\n[compare] lanes 1/2 (50%%), 3 s "
                                         "elapsed\\nb  \\n\\n'"]
    write = _run("--fast", "--guide", str(path), timeout=120)
    assert write.returncode == 0, write.stderr
    assert write.stdout.strip() == f"1 of 2 blocks rewritten in {path}"
    assert path.read_text() == HAND_GUIDE.replace("stale\n", "a\nb\n").replace(
        "    && echo written\n", "    && echo written\nwritten\n")
    assert _run("--check", "--fast", "--guide", str(path), timeout=120).returncode == 0


def test_marker_options_are_checked():
    """A typo in a marker is refused, not silently a slow block."""
    module = _guide_module()
    assert module.parse_options(" fast head=12") == (True, 12)
    try:
        module.parse_options(" fats")
    except ValueError as error:
        assert "fats" in str(error)
    else:
        raise AssertionError("an unknown marker option was accepted")


def test_every_guide_command_is_marked():
    """Every fenced block of GUIDE.md holding a `$ ` command has a guide:run marker, so none
    shows an output that docs/guide.py does not regenerate."""
    lines = GUIDE.read_text().split("\n")
    marker = _guide_module().MARKER
    unmarked = [f"line {i + 2}: {body[0]}" for i, _, body in _fences(lines)
                if any(line.startswith("$ ") for line in body) and not (i > 0 and marker.match(lines[i - 1]))]
    assert not unmarked, unmarked
    assert len(_guide_module().find_blocks(lines)) >= 15


def test_readme_commands_are_in_the_guide():
    """Every command of the README's shell blocks appears in GUIDE.md (as a `$ ` command or
    in a shell block), so the README's examples are the guide's checked ones."""
    guide_lines = GUIDE.read_text().split("\n")
    in_guide = set()
    for _, lang, body in _fences(guide_lines):
        in_guide.update(_commands(body, prompt=True))
        if lang in ("bash", "sh"):
            in_guide.update(_commands(body, prompt=False))
    readme = [c for _, lang, body in _fences(README.read_text().split("\n")) if lang in ("bash", "sh")
              for c in _commands(body, prompt=False)]
    assert len(readme) >= 7
    missing = [c for c in readme if c not in in_guide]
    assert not missing, missing


def test_readme_is_short_and_has_the_two_commands():
    """At most 200 lines; the set-up-and-run command and the test command, the latter exactly
    as .ci/run runs it."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert SETUP in text.splitlines() and TESTS in text.splitlines()
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^" + re.escape(TESTS) + r"$", ci, re.M)
    assert "docs/GUIDE.md" in text
