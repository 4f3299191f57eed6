"""vtc-jax: an exact, vectorized simulator of fair-queueing schedulers for LLM serving."""

# ruff: noqa: E402  (the signal handlers go in before the imports, which take seconds)

from vtc_jax.core import fileio as _fileio

_fileio.stop_early_on_signals()  # a command's Ctrl-C during the imports below (jax: seconds): one line, not a traceback

from vtc_jax.core.errors import InputError
from vtc_jax.driver.results import LaneResults
from vtc_jax.driver.run import replay, replay_lanes, run_traces, simulate_traffic
from vtc_jax.engines.engine import State
from vtc_jax.engines.engine_config import EngineConfig
from vtc_jax.engines.settings import Params, Settings, encode_settings
from vtc_jax.inputs.workload import Trace, Workload, read_trace_csv
from vtc_jax.measures.online import MeasureConfig
from vtc_jax.policies import registry

POLICIES = registry.names()

__all__ = ["EngineConfig", "State", "LaneResults", "MeasureConfig", "replay", "replay_lanes", "run_traces",
           "simulate_traffic", "POLICIES", "InputError", "Params", "Settings", "encode_settings", "Trace", "Workload",
           "read_trace_csv", "registry"]
