"""The package's floors: imports run one way only, top to bottom (DEVELOPING.md), and no
module grows past the size a reader can hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vtc_jax"
# Top to bottom. `testing` (the literal references and lane builders) sits beside the CLI:
# it may use everything and nothing in the package uses it.
FLOORS = ("cli", "testing", "driver", "engines", "pickers", "servers", "policies", "measures", "inputs", "core")
RANK = {"cli": 0, "testing": 0, "driver": 1, "engines": 2, "pickers": 2.5, "servers": 3, "policies": 4, "measures": 5,
        "inputs": 6, "core": 7}
MAX_LINES = 600


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def _floor(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "vtc_jax" and parts[1] in RANK else None


def _imports(path: Path):
    """(line, dotted module) of every vtc_jax import in the file, lazy ones included."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "vtc_jax":
                for alias in node.names:
                    yield node.lineno, f"vtc_jax.{alias.name}"
            else:
                yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_every_module_sits_on_a_floor():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside the floors: {loose}"
    assert {p.parent.name for p in _modules()} <= set(RANK)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_downward(path):
    mine = RANK[path.parent.name]
    upward = [f"line {line}: {mod}" for line, mod in _imports(path)
              if _floor(mod) is not None and RANK[_floor(mod)] < mine]
    top = [f"line {line}: {mod}" for line, mod in _imports(path) if mod == "vtc_jax"]
    assert not upward and not top, f"{path.relative_to(PACKAGE)} imports upward: {upward + top}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_size(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines (> {MAX_LINES})"
