"""Issue-5 experiments at small seed counts, and the ES tuner."""

from __future__ import annotations

import json

import numpy as np

from sweeps import beta_tune, context_cost, kv_cap, prefix_cache
from tests.helpers import metrics_by_label, sweep_result
from vtc_jax.cli.sweep_command import main
from vtc_jax.driver.tune import centered_ranks, es_minimize


def _run(module, tmp_path, *args):
    name = module.__name__.split(".")[-1]
    command = lambda argv: main(name, module.__doc__, module.add_arguments, module.build, argv)
    return metrics_by_label(sweep_result(command, tmp_path, "--no-plots", *args))


def test_es_finds_the_minimum_of_a_noisy_function():
    rng = np.random.default_rng(1)

    def noisy(thetas):
        return (thetas - 1.3) ** 2 + rng.normal(0, 0.05, size=thetas.shape)

    result = es_minimize(noisy, theta0=-2.0, sigma=0.4, pairs=8, generations=60, seed=3)
    assert abs(result.theta - 1.3) < 0.25
    assert len(result.path) == 61 and result.path[0] == -2.0


def test_centered_ranks():
    np.testing.assert_allclose(centered_ranks(np.array([3.0, 1.0, 2.0])), [0.5, -0.5, 0.0])


def test_beta_tune_lands_in_the_grid_minimum(tmp_path):
    out = tmp_path / "bt"
    assert beta_tune.main(["--seeds", "8", "--steps", "800", "--grid", "24", "--generations", "12",
                           "--fresh-seeds", "16", "--out", str(out)]) == 0
    with open(out / "results.json") as fh:
        config = json.load(fh)["config"]
    tuning = config["tuning"]
    assert tuning["tuned_within_grid_min_ci"]
    # The ES's beta lies among the grid betas whose objective is within the grid minimum's
    # CI (the grid minimum itself always does: asserting that could not fail), and that
    # range is a narrow part of the searched one, so landing in it says something.
    low, high = tuning["beta_ci95"]
    assert low <= tuning["tuned_beta"] <= high
    lo2, hi2 = config["log2_range"]
    assert np.log2(high / low) < (hi2 - lo2) / 4
    assert tuning["fresh_objective"]["n"] == 16
    assert (out / "objective_vs_beta.png").stat().st_size > 1000


def test_context_cost_beta_trades_tokens_for_bytes(tmp_path):
    m = _run(context_cost, tmp_path, "--seeds", "8", "--steps", "2000", "--betas", "0,1/1024,1/128")
    zero, mid, big = m["beta=0"], m["beta=1/1024"], m["beta=1/128"]
    assert abs(zero["long_token_share"]["mean"] - 0.5) < 0.04       # tokens equalized
    assert zero["long_resource_share"]["mean"] > 0.53                # bytes are not
    assert abs(mid["long_resource_share"]["mean"] - 0.5) < 0.04     # some beta equalizes bytes
    assert zero["bound"]["mean"] < mid["bound"]["mean"] < big["bound"]["mean"]
    assert big["max_drift"]["mean"] <= big["bound"]["mean"]


def test_prefix_cache_sent_charging_underserves_the_cache_hitter(tmp_path):
    m = _run(prefix_cache, tmp_path, "--seeds", "8", "--steps", "2000", "--cached", "0.75")
    sent, computed = m["sent cached=0.75"], m["computed cached=0.75"]
    assert sent["hit_computed_share"]["mean"] < 0.45
    assert abs(computed["hit_computed_share"]["mean"] - 0.5) < 0.03
    assert abs(sent["hit_charged_share"]["mean"] - 0.5) < 0.03


def test_kv_cap_buys_drift_with_throughput(tmp_path):
    m = _run(kv_cap, tmp_path, "--seeds", "8", "--steps", "2000", "--caps", "2048,6144")
    assert m["cap 6144"]["max_drift"]["mean"] < m["uncapped"]["max_drift"]["mean"]
    assert m["cap 2048"]["throughput"]["mean"] < 0.5 * m["uncapped"]["throughput"]["mean"]
