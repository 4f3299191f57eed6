"""Suite-wide test hygiene."""

from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jax's compiled programs after each test module. One pytest process compiles
    hundreds of programs; on the CPU backend each holds JIT code mappings, and the whole
    suite in one process hit an abort inside XLA's compiler near its end (the programs of
    earlier modules are never reused by later ones, so nothing is lost but memory)."""
    yield
    jax.clear_caches()
