"""Scale-out: sharding over 8 forced host devices, two processes with jax.distributed, and
the compilation cache. Each case runs in fresh Python processes (device count and the
distributed runtime are fixed when JAX starts)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import python

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["-m", "sweeps.kv_budget", "--seeds", "6", "--steps", "300", "--budgets", "2048,4096,8192", "--no-plots",
         "--no-cache"]


def _env(devices: int = 1) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return env


def _rows(out: Path) -> list:
    with open(out / "results.json") as fh:
        return json.load(fh)["rows"]


def test_sharded_engine_equals_one_device():
    script = """
import numpy as np, random
from vtc_jax.testing.lanes import random_lanes
from vtc_jax import run_traces, POLICIES
from vtc_jax.driver.devices import lane_mesh
import jax
assert jax.device_count() == 8
traces, settings, _ = random_lanes(random.Random(5), 13, num_clients=3, policies=POLICIES)
one = run_traces(traces, settings, num_clients=3, steps=40, record_every=1, mesh=lane_mesh(1))
eight = run_traces(traces, settings, num_clients=3, steps=40, record_every=1, mesh=lane_mesh(8))
assert len(eight.steps) == 13
for name in ("checkpoints", "counters", "admitted", "completed", "max_drift", "pair_drift", "wait_hist"):
    np.testing.assert_array_equal(getattr(one, name), getattr(eight, name), err_msg=name)
print("OK")
"""
    done = python("-c", script, env=_env(8))
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-2000:]


def test_sweep_over_8_devices_equals_1(tmp_path):
    for devices in (1, 8):
        done = python(*SWEEP, "--out", tmp_path / str(devices), "--devices", devices, env=_env(8))
        assert done.returncode == 0, done.stderr[-2000:]
    assert _rows(tmp_path / "1") == _rows(tmp_path / "8")


def test_two_processes_merge_to_the_one_process_result(tmp_path):
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, *SWEEP, "--out", str(tmp_path / f"p{i}"), "--coordinator",
                               f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)],
                              cwd=ROOT, env=_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    assert "process 1/2" in outputs[1][1]
    assert not (tmp_path / "p1" / "results.json").exists()  # process 0 writes
    single = python(*SWEEP, "--out", tmp_path / "single", env=_env(1))
    assert single.returncode == 0, single.stderr[-2000:]
    assert _rows(tmp_path / "p0") == _rows(tmp_path / "single")


def test_compilation_cache_is_written_and_reused(tmp_path):
    """A first run fills the cache directory; a second identical run compiles nothing new
    (the set of cache entries is unchanged), whatever JAX names its files."""
    cache = tmp_path / "cache"
    argv = [a for a in SWEEP if a != "--no-cache"] + ["--cache-dir", str(cache)]
    entries = []
    for run in range(2):
        done = python(*argv, "--out", tmp_path / f"o{run}", env=_env(1))
        assert done.returncode == 0, done.stderr[-2000:]
        entries.append(sorted(p.name for p in cache.rglob("*") if p.is_file()))
    assert entries[0], "the first run wrote no cache entry"
    assert entries[1] == entries[0]
    assert _rows(tmp_path / "o0") == _rows(tmp_path / "o1")


def _python(script: str, env: dict) -> str:
    done = python("-c", script, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_command_runs_one_cpu_device_per_core_unless_told():
    """use_every_core (called by every command): one XLA:CPU device per core, except when the
    user chose (JAX_NUM_CPU_DEVICES, XLA_FLAGS) or JAX has already started its backends."""
    script = """
from vtc_jax.driver.devices import use_every_core, host_cores
import jax
print(use_every_core(), jax.device_count(), host_cores())
"""
    plain = {k: v for k, v in _env().items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    got, devices, cores = _python(script, plain).split()
    assert got == devices == cores
    assert _python(script, dict(plain, JAX_NUM_CPU_DEVICES="3")).split()[:2] == ["None", "3"]
    assert _python(script, _env(5)).split()[:2] == ["None", "5"]
    started = "import jax, jax.numpy as jnp\njnp.ones(1)\n" + script
    assert _python(started, plain).split()[:2] == ["None", "1"]


def test_workloads_generated_sharded_equal_one_device():
    """Lanes generated where the runner runs them (sharded over 8 devices; seeds shared by
    several settings, their distinct count padded to the device count) are the one-device
    workloads, and their runs the same results."""
    script = """
import numpy as np, jax
from jax.sharding import NamedSharding
from vtc_jax.driver import run as run_mod
from vtc_jax.driver.devices import lane_mesh
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.sources import TrafficSource
from vtc_jax.inputs.traffic import overload
assert jax.device_count() == 8
src = TrafficSource(overload([1.0, 0.25], 300))
for seeds in ([i // 3 for i in range(24)], [i // 4 for i in range(16)], list(range(16)), [0, 1, 2]):
    srcs = [src] * len(seeds)
    settings = [Settings("vtc", 2048 * (1 + i % 3)) for i in range(len(seeds))]
    config = run_mod.source_config(srcs, settings)
    one = run_mod.shared_workloads(srcs, seeds, config)
    eight = run_mod.shared_workloads(srcs, seeds, config, mesh=lane_mesh(8))
    for a, b in zip(jax.tree_util.tree_leaves(one), jax.tree_util.tree_leaves(eight)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    sharded = isinstance(eight.requests.sharding, NamedSharding) and len(eight.requests.sharding.device_set) == 8
    assert sharded == (len(seeds) % 8 == 0), seeds
    r1 = run_mod.simulate_sources(srcs, settings, seeds, mesh=lane_mesh(1))
    r8 = run_mod.simulate_sources(srcs, settings, seeds, mesh=lane_mesh(8))
    for name in ("steps", "service", "max_drift", "admitted", "completed", "events"):
        np.testing.assert_array_equal(getattr(r1, name), getattr(r8, name), err_msg=name)
print("OK")
"""
    assert _python(script, _env(8)).endswith("OK")


def test_regrouped_lanes_gathered_from_sharded_lanes():
    """A mix of policies regrouped from lanes sharded over 2 devices (as the drivers'
    generation leaves them: each sub-batch gathered shard by shard onto its device) gives
    the carry of the same batch on one device, leaf by leaf; and the shard-by-shard gather
    is np.take for lanes sharded, replicated, on one device, on the host or split by
    another axis."""
    script = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from vtc_jax.driver import policy_groups, run as run_mod, tiers
from vtc_jax.driver.devices import lane_mesh, shard
from vtc_jax.engines.engine import EngineBatch, LaneInput
from vtc_jax.engines.settings import Settings, encode_settings
from vtc_jax.inputs.traffic import overload
from vtc_jax.measures.online import MeasureConfig
assert jax.device_count() == 4
rng = np.random.default_rng(3)
x = rng.integers(0, 1 << 30, (12, 8, 3)).astype(np.int32)
tree = {"sharded": shard(jnp.asarray(x), lane_mesh(4)), "replicated": shard(jnp.asarray(x), lane_mesh(4), batched=False),
        "one": jax.device_put(x, jax.devices()[2]), "host": x,
        "by_axis_1": jax.device_put(jnp.asarray(x), NamedSharding(lane_mesh(4), PartitionSpec(None, "lanes")))}
for lanes in ([0], [11], [2, 3, 4, 9], list(range(12)), [5, 6]):
    lanes = np.asarray(lanes)
    out = policy_groups._take_onto(tree, lanes, jax.devices()[1])
    for leaf in jax.tree_util.tree_leaves(out):
        assert leaf.devices() == {jax.devices()[1]}
        np.testing.assert_array_equal(np.asarray(leaf), x[lanes])
settings = [Settings(("vtc", "las", "drr")[(i * 5) % 3], kv_budget=1024) for i in range(12)]
traffic = overload([0.5, 0.25], 80)
config = run_mod.traffic_config([traffic] * 12, settings, measures=MeasureConfig.of(["latency"]))
workload = run_mod.with_timeline(run_mod.generate_workloads(run_mod._traffic_sources([traffic] * 12), range(12), config),
                                 batched=True)
params, _ = encode_settings(settings, 2, config.policies)
batch = EngineBatch(lane=LaneInput(params=params, horizon=jnp.full(12, 80, jnp.int32)), workload=workload)
carries = [policy_groups.run(tiers.run_in_tiers, config, settings, shard(batch, lane_mesh(n)), None, regroup=True,
                             event_budget=4096, mesh=lane_mesh(n)) for n in (2, 1)]
assert carries[0][1].all() and carries[1][1].all()
for a, b in zip(jax.tree_util.tree_leaves(carries[0][0]), jax.tree_util.tree_leaves(carries[1][0])):
    np.testing.assert_array_equal(a, b)
print("OK")
"""
    assert _python(script, _env(4)).endswith("OK")


def test_compiled_programs_do_not_depend_on_pythons_hash_seed(tmp_path):
    """A second process with another PYTHONHASHSEED compiles nothing new (the programs
    were traced in an order that followed the hash seed: every process missed the cache)."""
    cache = tmp_path / "cache"
    log = tmp_path / "shared.csv"  # vllm_prefix needs a log's content (a sweep's generated traffic has none)
    log.write_text("arrival,client,prompt,output,prefix_id,prefix_len\n0,a,64,4,s,48\n3,b,64,4,s,48\n5,a,40,2,,0\n")
    for server in ("vllm", "vllm_prefix"):
        argv = ["-m", "sweeps.kv_budget", "--seeds", "2", "--steps", "150", "--budgets", "2048",
                "--no-plots", "--server", server, "--cache-dir", str(cache)]
        if server == "vllm_prefix":
            argv = ["-m", "vtc_jax", "replay", str(log), "--server", "vllm", "--num-gpu-blocks", "64", "--policy", "vtc",
                    "--cache-dir", str(cache)]
        entries = []
        for seed in ("1", "2"):
            out = ["--out", tmp_path / f"{server}{seed}"] if server == "vllm" else []
            done = python(*argv, *out, env=dict(_env(1), PYTHONHASHSEED=seed))
            assert done.returncode == 0, done.stderr[-2000:]
            entries.append(sorted(p.name for p in cache.rglob("*") if p.is_file()))
        assert entries[1] == entries[0], server
