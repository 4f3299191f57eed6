"""vtc-jax: an exact, vectorized simulator of fair-queueing schedulers for LLM serving."""

from vtc_jax.engine import EngineConfig, State
from vtc_jax.errors import InputError
from vtc_jax.measures import MeasureConfig
from vtc_jax.policies import registry
from vtc_jax.results import LaneResults
from vtc_jax.run import replay, replay_lanes, run_traces, simulate_traffic
from vtc_jax.settings import Params, Settings, encode_settings
from vtc_jax.workload import Trace, Workload, read_trace_csv

POLICIES = registry.names()

__all__ = ["EngineConfig", "State", "LaneResults", "MeasureConfig", "replay", "replay_lanes", "run_traces",
           "simulate_traffic", "POLICIES", "InputError", "Params", "Settings", "encode_settings", "Trace", "Workload",
           "read_trace_csv", "registry"]
