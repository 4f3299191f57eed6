"""Suite-wide test hygiene."""

from __future__ import annotations

import os
import shutil
import tempfile

import jax
import pytest

# One persistent compilation cache for the whole session, fresh and private to it (never
# the user's): a program compiled once is read back, not compiled again, by a later module
# (after the clear below), by a new jit of the same program, and by the CLI subprocesses,
# which inherit the two variables. Results do not change: the cache holds the executables
# XLA built. Commands given --cache-dir still use theirs (it is set before their first
# compile); --no-cache only leaves the setting as it finds it.
_SESSION_CACHE = tempfile.mkdtemp(prefix="vtc_jax_test_xla_")
os.environ["JAX_COMPILATION_CACHE_DIR"] = _SESSION_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
jax.config.update("jax_compilation_cache_dir", _SESSION_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jax's compiled programs after each test module. One pytest process compiles
    hundreds of programs; on the CPU backend each holds JIT code mappings, and the whole
    suite in one process hit an abort inside XLA's compiler near its end (the programs of
    earlier modules are never reused by later ones, so nothing is lost but memory)."""
    yield
    jax.clear_caches()
