"""Suite-wide test hygiene."""

from __future__ import annotations

import os
import shutil
import tempfile

import jax
import numpy as np
import pytest

# The suite is compile-bound (XLA's compile of a test's program takes 5-10x its run), so
# its programs are built with LLVM's cheap pipeline: about 40% less compile time, slower
# code. Results cannot change: the engine's quantities are integers, and XLA:CPU does not
# reassociate floating point at any level. The CLI subprocesses inherit the flags.
# (VTC_JAX_TEST_FAST_COMPILE=0 tests the default pipeline.)
if os.environ.get("VTC_JAX_TEST_FAST_COMPILE") != "0":
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0",
                                                     "--xla_llvm_disable_expensive_passes=true"]))

# One persistent compilation cache for the whole session, fresh and private to it (never
# the user's): a program compiled once is read back, not compiled again, by a later module
# (after the clear below), by a new jit of the same program, and by the CLI subprocesses,
# which inherit the two variables. Results do not change: the cache holds the executables
# XLA built. Commands given --cache-dir still use theirs (it is set before their first
# compile); --no-cache only leaves the setting as it finds it.
# (VTC_JAX_TEST_CACHE=0 runs without it, to time the difference.)
_SESSION_CACHE = None if os.environ.get("VTC_JAX_TEST_CACHE") == "0" else tempfile.mkdtemp(prefix="vtc_jax_test_xla_")
if _SESSION_CACHE:
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_SESSION_CACHE, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    jax.config.update("jax_compilation_cache_dir", _SESSION_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_sessionfinish(session, exitstatus):
    if _SESSION_CACHE:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jax's compiled programs after each test module. One pytest process compiles
    hundreds of programs; on the CPU backend each holds JIT code mappings, and the whole
    suite in one process hit an abort inside XLA's compiler near its end (the programs of
    earlier modules are never reused by later ones, so nothing is lost but memory)."""
    yield
    jax.clear_caches()


@pytest.fixture(scope="module")
def capacity_once_per_mix():
    """capacity.measure, remembered within a module: the measure is deterministic (every
    request at time 0, fcfs, no seeds), so a `compare --server vllm` whose length mix and
    server were measured earlier in the module reuses that capacity (a saturating run of
    hundreds of seats costs a minute or more on 2 cores). The first call of each is the
    real run."""
    from vtc_jax.driver import capacity

    original, seen = capacity.measure, {}

    def measure(prompt, output, settings, server, **kwargs):
        key = (tuple(np.asarray(prompt).tolist()), tuple(np.asarray(output).tolist()), settings, server,
               tuple(sorted(kwargs.items())))
        if key not in seen:
            seen[key] = original(prompt, output, settings, server, **kwargs)
        return seen[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity, "measure", measure)
        yield
