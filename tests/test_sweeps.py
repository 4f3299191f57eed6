"""Each seed experiment as a sweep CLI, at a small seed count, checking what the seed claims."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from sweeps import kv_budget, return_after_silence, rpm, schedulers
from tests.helpers import metrics_by_label, sweep_result

SEEDS = "12"


def _run(module, tmp_path, *args, plots=False):
    out = tmp_path / module.__name__.split(".")[-1]
    result = sweep_result(module.main, out, "--seeds", SEEDS, *args, *([] if plots else ["--no-plots"]))
    return metrics_by_label(result), result, out


def test_schedulers_fcfs_grows_vtc_bounded(tmp_path, capsys):
    short, _, _ = _run(schedulers, tmp_path / "a", "--steps", "1500")
    long, result, out = _run(schedulers, tmp_path / "b", "--steps", "3000", plots=True)
    assert long["fcfs"]["max_drift"]["mean"] > 1.6 * short["fcfs"]["max_drift"]["mean"]
    bound = 2 * max(1 * 512, 2 * 8192)
    for m in (short, long):
        assert m["vtc"]["max_drift"]["max"] <= bound
        assert m["fcfs"]["max_drift"]["mean"] > 5 * m["vtc"]["max_drift"]["mean"]
        # VTC's drift while both are backlogged is below LCF's (LCF repays the head start)
        assert m["vtc"]["backlogged_drift"]["mean"] < m["lcf"]["backlogged_drift"]["mean"]
    assert abs(long["vtc"]["throughput"]["mean"] - long["fcfs"]["throughput"]["mean"]) < 2
    assert set(result) == {"sweep", "config", "rows"} and result["sweep"] == "schedulers"
    for metrics in long.values():
        for m in metrics.values():
            assert set(m) >= {"mean", "std", "ci95", "min", "max"}
            assert m["n"] == int(SEEDS)
            half = m["ci95"][1] - m["mean"]  # the t-interval of 12 seeds: 2.201 standard errors
            assert half == pytest.approx(2.201 * m["std"] / np.sqrt(int(SEEDS)), rel=1e-6, abs=1e-9)
    assert (out / "gap_over_time.png").stat().st_size > 1000 and (out / "drift.png").exists()
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["policy"] for r in rows} == {"fcfs", "lcf", "vtc"}
    printed = capsys.readouterr().out
    assert "max_drift (paper)" not in printed  # not the seed document's workload: no paper column
    assert "OVERLOAD" in printed  # 1.25 requests per step, far over capacity, is flagged
    assert "share of service" in printed  # the per-client table


def test_paper_column_only_for_the_default_workload(tmp_path, capsys):
    _run(schedulers, tmp_path, "--steps", "6000", "--seeds", "2")
    printed = capsys.readouterr().out
    assert "max_drift (paper)" in printed and "(248,796)" in printed


def test_return_after_silence_shares(tmp_path):
    m, _, out = _run(return_after_silence, tmp_path, plots=True)
    assert 0.4 < m["vtc"]["returning_share"]["mean"] < 0.6
    assert m["lcf"]["returning_share"]["mean"] > 0.75
    assert m["fcfs"]["returning_share"]["mean"] < 0.1
    assert m["lcf"]["steady_service"]["mean"] < m["vtc"]["steady_service"]["mean"] < m["fcfs"]["steady_service"]["mean"]
    assert (out / "returning_share_over_time.png").exists()


def test_kv_budget_drift_rises_and_stays_bounded(tmp_path):
    m, result, _ = _run(kv_budget, tmp_path, "--budgets", "2048,8192,32768", "--steps", "3000")
    means = [m[f"M={b}"]["max_drift"]["mean"] for b in (2048, 8192, 32768)]
    assert means[0] < means[1] < means[2]
    for b in (2048, 8192, 32768):
        assert m[f"M={b}"]["max_drift"]["max"] <= 2 * 2 * b
    assert [r["setting"]["kv_budget"] for r in result["rows"]] == [2048, 8192, 32768]
    assert "kv_budget" not in result["config"]  # the grid is --budgets; there is no --kv-budget flag


def test_rpm_throughput_rises_with_the_limit(tmp_path):
    m, result, _ = _run(rpm, tmp_path, "--limits", "5,20,80", "--steps", "4000", "--with-vtc")
    tput = [m[label]["throughput"]["mean"] for label in ("rpm 5", "rpm 20", "rpm 80", "rpm unlimited")]
    assert tput == sorted(tput) and tput[0] < 0.2 * tput[-1]
    assert m["vtc"]["throughput"]["mean"] > 0.95 * m["rpm unlimited"]["throughput"]["mean"]
    # RPM + VTC: the same cap, and VTC's order inside it: no less fair than FCFS under the cap
    assert m["vtc + rpm 80"]["backlogged_drift"]["mean"] <= m["rpm 80"]["backlogged_drift"]["mean"]
    assert {r["setting"].get("rpm_limit") for r in result["rows"]} == {5, 20, 80, None}


def test_chunking_does_not_change_results(tmp_path):
    _, whole, _ = _run(kv_budget, tmp_path / "whole", "--budgets", "2048,4096", "--steps", "800")
    _, chunked, _ = _run(kv_budget, tmp_path / "chunked", "--budgets", "2048,4096", "--steps", "800", "--chunk", "5")
    assert whole["rows"] == chunked["rows"]


@pytest.mark.parametrize("args, message", [
    (["--seeds", "0"], "--seeds"), (["--chunk", "0"], "--chunk"), (["--budgets", "100"], "KV budget"),
    (["--budgets", "1/0"], "--budgets"), (["--weights", "1,2"], "ignores client weights"),
])
def test_bad_sweep_input_is_one_line_exit_2(tmp_path, capsys, args, message):
    policy = ["--policy", "fcfs"] if "--weights" in args else []
    code = kv_budget.main(["--out", str(tmp_path), "--steps", "200", *policy, *args])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "results.json").exists()


def test_tenants_on_vllm_loads_are_against_measured_capacity():
    """sweeps.tenants --server vllm: the loads are against the server's capacity measured on
    the ServeGen length mix (a saturating run), not the ideal model's RHO: each row's
    expected requests per step is load x that capacity; on the ideal server they stay RHO."""
    from sweeps import tenants
    from vtc_jax.cli import sweep_command
    from vtc_jax.driver import capacity
    from vtc_jax.engines.settings import Settings

    def declared(*flags):
        parser = sweep_command.base_parser("tenants", "")
        tenants.add_arguments(parser)
        return tenants.build(sweep_command.parse_args(parser, ["--steps", "400", "--policy", "fcfs", *flags]))

    sweep = declared("--server", "vllm", "--num-gpu-blocks", "8193", "--max-num-seqs", "32", "--load", "0.8,1.5")
    measured = sweep.config["capacity"]["requests_per_step"]
    for row in sweep.rows:
        offered = row.source.plan.expected_requests.sum() / 400
        assert offered == pytest.approx(row.extra["load"] * measured, rel=1e-6)
    plan = sweep.rows[0].source.plan
    prompt, output = capacity.source_mix(type(sweep.rows[0].source)(tenants.servegen.plan(
        tenants.read_data(tenants.DEFAULT_DATA), load=1.0, kv_budget=131072, horizon=400, max_output=4096,
        max_prompt=131072 - 4096 + 1)), 131072)
    options = (("max_num_seqs", 32), ("num_gpu_blocks", 8193))
    direct = capacity.measure(prompt, output, Settings("fcfs", 131072, server_options=options), "vllm")
    assert direct.per_second == measured and plan.max_prompt == 131072 - 4096 + 1
    ideal = declared("--load", "0.8")
    assert "capacity" not in ideal.config and ideal.rows[0].source.plan.load == 0.8
