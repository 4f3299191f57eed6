"""vtc-jax: an exact, vectorized simulator of fair-queueing schedulers for LLM serving."""

from vtc_jax.engine import EngineConfig, State
from vtc_jax.results import LaneResults
from vtc_jax.run import replay, replay_lanes, run_traces, simulate_traffic
from vtc_jax.settings import POLICIES, InputError, Params, Settings, encode_settings
from vtc_jax.workload import Trace, Workload, read_trace_csv

__all__ = ["EngineConfig", "State", "LaneResults", "replay", "replay_lanes", "run_traces", "simulate_traffic", "POLICIES",
           "InputError", "Params", "Settings", "encode_settings", "Trace", "Workload", "read_trace_csv"]
