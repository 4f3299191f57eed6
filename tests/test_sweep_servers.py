"""`--server` on the sweeps and the cluster: a sweep runs on vllm (M = its pool), bad server
flags are one line and exit 2, and the default server leaves every result as it was."""

from __future__ import annotations


import pytest

from sweeps import cluster, kv_budget, paper, policies, prefix_cache, rpm, schedulers
from tests.helpers import sweep_result
from vtc_jax.cli import sweep_command
from vtc_jax.core.errors import InputError
from vtc_jax.driver import cluster_run
from vtc_jax.engines.cluster_settings import ClusterSettings
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.sources import TrafficSource
from vtc_jax.inputs.traffic import overload

SMALL = ["--seeds", "2", "--steps", "300", "--no-plots"]


def _result(module, out, *args) -> dict:
    return sweep_result(module.main, out, *SMALL, *args)


def test_a_sweep_runs_on_vllm_with_its_pool_as_m(tmp_path):
    # 257 blocks of 32 tokens: the null block holds none, so M = 256 x 32 = 8192
    result = _result(schedulers, tmp_path / "v", "--server", "vllm", "--num-gpu-blocks", "257", "--block-size", "32")
    assert result["config"]["server"] == "vllm" and result["config"]["kv_budget"] == 8192
    assert result["config"]["server_options"] == {"block_size": 32, "num_gpu_blocks": 257}
    assert (tmp_path / "v" / "results.csv").exists()
    for row in result["rows"]:
        assert row["setting"]["server"] == "vllm" and row["setting"]["kv_budget"] == 8192
        assert "unfinished_lanes" not in row and row["metrics"]["max_drift"]["n"] == 2
        # the 2U bound is on M = the pool: U = max(w_p * largest prompt, w_q * M) = 2 * 8192
        ratio, drift = row["metrics"]["max_drift_over_2u"]["mean"], row["metrics"]["max_drift"]["mean"]
        assert ratio == pytest.approx(drift / (2 * 2 * 8192))
    ideal = _result(schedulers, tmp_path / "i")
    assert [r["metrics"]["throughput"] for r in ideal["rows"]] != [r["metrics"]["throughput"] for r in result["rows"]]


def test_default_server_is_unchanged(tmp_path):
    omitted, given = tmp_path / "omitted", tmp_path / "given"
    _result(schedulers, omitted)
    _result(schedulers, given, "--server", "ideal")
    for name in ("results.json", "results.csv", "series.json"):
        assert (omitted / name).read_bytes() == (given / name).read_bytes()


def _args(module, *argv):
    parser = sweep_command.base_parser(module.__name__.split(".")[-1], module.__doc__)
    module.add_arguments(parser)
    return sweep_command.parse_args(parser, list(argv))


def test_kv_budget_maps_each_m_to_blocks():
    args = _args(kv_budget, "--server", "vllm", "--budgets", "2048,4096", "--block-size", "32")
    sweep = sweep_command.on_server(kv_budget.build(args), args)
    assert [dict(r.settings.server_options) for r in sweep.rows] == [
        {"block_size": 32, "num_gpu_blocks": 65}, {"block_size": 32, "num_gpu_blocks": 129}]
    assert [r.settings.kv_budget for r in sweep.rows] == [2048, 4096]
    assert {r.server for r in sweep.rows} == {"vllm"}
    ideal = _args(kv_budget, "--budgets", "2048")
    assert kv_budget.build(ideal).rows[0].settings.server_options == ()


def test_policies_leave_rpm_out_on_a_preempting_server():
    args = _args(policies, "--server", "vllm", "--num-gpu-blocks", "513")
    assert "rpm" not in policies.chosen_policies(args) and any("rpm" in n for n in args.notes)
    assert "rpm" in policies.chosen_policies(_args(policies))


@pytest.mark.parametrize("module, argv, message", [
    (schedulers, ["--num-gpu-blocks", "64"], "--num-gpu-blocks is a setting of --server vllm"),
    (schedulers, ["--server", "ideal", "--block-size", "8"], "--block-size is a setting of --server vllm"),
    (schedulers, ["--server", "vllm"], "needs num_gpu_blocks"),
    (schedulers, ["--server", "vllm", "--num-gpu-blocks", "513", "--kv-budget", "8192"],
     "--kv-budget is the ideal server's memory"),
    (schedulers, ["--server", "vllm", "--num-gpu-blocks", "40"], "could never finish"),
    (rpm, ["--server", "vllm", "--num-gpu-blocks", "513"], "--rpm limits are not defined"),
    (kv_budget, ["--server", "vllm", "--num-gpu-blocks", "513"], "sets it from each M of --budgets"),
    (kv_budget, ["--server", "vllm", "--budgets", "1000"], "not a multiple of --block-size 16"),
    (kv_budget, ["--max-num-seqs", "4"], "--max-num-seqs is a setting of --server vllm"),
    (prefix_cache, ["--server", "vllm", "--num-gpu-blocks", "513"], "does not model prefix caching"),
    (paper, ["--server", "vllm"], "artifact profile"),
    (paper, ["--num-gpu-blocks", "64"], "--num-gpu-blocks is a setting of --server vllm"),
    (cluster, ["--num-gpu-blocks", "64"], "--num-gpu-blocks is a setting of --server vllm"),
])
def test_bad_server_flags_are_one_line_exit_2(tmp_path, capsys, module, argv, message):
    out = tmp_path / "out"
    assert module.main(["--out", str(out), "--no-plots", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists() or not any(out.iterdir())  # nothing written


def test_cluster_config_carries_its_server():
    src = TrafficSource(overload([0.5, 0.5], 100, prompt=(16, 64), output=(8, 32)))
    lane = ClusterSettings(engine=Settings("fcfs", 1024), gateway_policy="vtc_gateway", replicas=2, routers=1)
    assert cluster_run.source_config([src], [lane]).server == "ideal"
    assert cluster_run.source_config([src], [lane], server="ideal").server == "ideal"
    with pytest.raises(InputError, match="unknown server"):
        cluster_run.source_config([src], [lane], server="nope")
