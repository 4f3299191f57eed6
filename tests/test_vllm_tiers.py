"""Slot tiers (driver/tiers.py `run_in_tiers`, servers/vllm_v1.py `slot_tiers`): lanes run
first with fewer slots and only those that overflow rerun with more; every result, the
server's final state and its schedule log included, is the one run with all the slots."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from tests.test_vllm_server import lane_input, random_lane, server_options
from vtc_jax import MeasureConfig, Settings, run_traces
from vtc_jax.servers import vllm_v1


def _run(lanes, monkeypatch, first_tier: int):
    monkeypatch.setattr(vllm_v1, "SLOT_TIER", first_tier)
    inputs = [lane_input(reqs, config) for reqs, config in lanes]
    k = max(t.num_clients for t, _ in inputs)
    settings = [Settings(policy="fcfs", kv_budget=1 << 29, bands=None if b is None else tuple(b + [0] * (k - len(b))),
                         server_options=tuple(server_options(config).items()))
                for (_, b), (_, config) in zip(inputs, lanes)]
    return run_traces([t for t, _ in inputs], settings, num_clients=k, server="vllm", log_steps=64,
                      measures=MeasureConfig.of(["latency", "ledger"]))


def _leaves(result) -> list:
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    return jax.tree_util.tree_leaves_with_path(fields)


def test_tiers_give_the_results_of_one_run_with_every_slot(monkeypatch):
    rng = np.random.default_rng(77)
    lanes = [random_lane(rng, policy) for policy in ("fcfs", "priority") for _ in range(40)]
    lanes = [(reqs, dict(config, max_num_seqs=seats, max_num_batched_tokens=max(config["max_num_batched_tokens"], seats)))
             for (reqs, config), seats in ((lane, int(rng.integers(3, 9))) for lane in lanes)]  # vLLM: budget >= seats
    tiered = _run(lanes, monkeypatch, 1)  # tiers 1 and 4 below the 8 seats: most lanes rerun
    whole = _run(lanes, monkeypatch, 1 << 20)  # no tier below the seats: one run
    assert whole.finished.all()
    nrun_peak = np.asarray(whole.server_state.log.index >= 0).sum(axis=-1).max(axis=-1)
    assert (nrun_peak <= 1).any() and ((nrun_peak > 1) & (nrun_peak <= 4)).any() and (nrun_peak > 4).any()
    a, b = _leaves(tiered), _leaves(whole)
    assert [p for p, _ in a] == [p for p, _ in b]
    for (path, x), (_, y) in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), jax.tree_util.keystr(path)
