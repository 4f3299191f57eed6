"""The adversarial search (vtc_jax/driver/adversary.py, sweeps/adversary.py): its parametrisation
stays within its limits, its bulk layout is the project's own trace layout, its objective
is the engine's backlogged drift (and the literal reference's, brute force), a tiny
search beats random sampling and its witness replays exactly through the replay CLI, the
sweep CLI writes its files (on every server) and refuses bad flags, and every committed
witness replays to its recorded value on its server (VTC's on `ideal` also through the
literal reference simulator)."""

from __future__ import annotations

import csv
import json
import re
from fractions import Fraction
from pathlib import Path

import jax
import numpy as np
import pytest

from sweeps import adversary as sweep
from vtc_jax.testing import reference as ref
from vtc_jax.cli import commands as cli
from vtc_jax.core.errors import InputError
from vtc_jax.driver import adversary as adv
from vtc_jax.driver.run import run_traces
from vtc_jax.engines.settings import Settings
from vtc_jax.inputs.workload import layout_trace, read_trace_csv, timeline_host

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "results" / "adversary"


# ---- helpers --------------------------------------------------------------------------

def _reference_run(trace, settings: Settings, steps: int, num_clients: int):
    """The literal reference's run of a witness trace."""
    reqs = [ref.Request(int(a), int(c), int(p), int(o))
            for a, c, p, o in zip(trace.arrival, trace.client, trace.prompt, trace.output)]
    return ref.simulate(reqs, num_clients=num_clients, settings=settings, steps=steps)


def reference_backlogged_drift(trace, settings: Settings, steps: int, num_clients: int) -> Fraction:
    """The backlogged drift from the literal reference simulator (vtc_jax/testing/reference.py):
    per pair and per maximal jointly backlogged period [t1, t2], max - min of
    D = W_f - W_g over D(t1 - 1), ..., D(t2) (exact Fractions)."""
    res = _reference_run(trace, settings, steps, num_clients)
    best = Fraction(0)
    for f in range(num_clients):
        for g in range(f + 1, num_clients):
            prev = Fraction(0)  # D(-1) = 0
            lo = hi = None
            for t in range(res.steps):
                d = res.service[t][f] - res.service[t][g]
                if res.backlogged_after_arrivals[t][f] and res.backlogged_after_arrivals[t][g]:
                    if lo is None:
                        lo = hi = prev
                    lo, hi = min(lo, d), max(hi, d)
                    best = max(best, hi - lo)
                else:
                    lo = hi = None
                prev = d
    return best


def strict_backlogged_drift(trace, settings: Settings, steps: int, num_clients: int) -> Fraction:
    """As `reference_backlogged_drift`, over intervals in which both FIFOs are never empty:
    non-empty after the arrivals of every step of [t1, t2] (the engine's measure) and also
    at the end of every step of [t1, t2 - 1], so that no lift can act inside (the
    theorem's "backlogged throughout")."""
    res = _reference_run(trace, settings, steps, num_clients)
    best = Fraction(0)
    for f in range(num_clients):
        for g in range(f + 1, num_clients):
            prev, lo, hi = Fraction(0), None, None
            for t in range(res.steps):
                d = res.service[t][f] - res.service[t][g]
                now = res.backlogged_after_arrivals[t]
                if now[f] and now[g]:
                    if lo is None or not (res.backlogged[t - 1][f] and res.backlogged[t - 1][g]):
                        lo = hi = prev  # a new interval: D(t1 - 1)
                    lo, hi = min(lo, d), max(hi, d)
                    best = max(best, hi - lo)
                else:
                    lo = hi = None
                prev = d
    return best


def brute_force(trace, settings: Settings, steps: int, num_clients: int) -> Fraction:
    """max |D(t2) - D(t1 - 1)| over every jointly backlogged interval, literally (tiny runs)."""
    res = _reference_run(trace, settings, steps, num_clients)
    w = [[Fraction(0)] * num_clients] + res.service  # row t + 1: after step t
    best = Fraction(0)
    for f in range(num_clients):
        for g in range(f + 1, num_clients):
            for t1 in range(res.steps):
                for t2 in range(t1, res.steps):
                    bl = res.backlogged_after_arrivals[t2]
                    if not (bl[f] and bl[g]):
                        break
                    best = max(best, abs((w[t2 + 1][f] - w[t2 + 1][g]) - (w[t1][f] - w[t1][g])))
    return best


# Hand-made candidates: (K, N) arrays of arrival, prompt, output.
# Blocked decode (M = 256): client 0 runs 15 short-prompt long-output requests and waits
# with a 256-token prompt; client 1 arrives at step 1 with 256-token prompts. Nothing fits
# until step 63 while client 0 is charged 15 x 2 per step: 30 x 63 = 1,890 > 2U = 1,024.
BLOCKED = (np.array([[0] * 16, [1] * 16]), np.array([[8] * 15 + [256], [256] * 16]),
           np.array([[64] * 15 + [1], [64] * 16]))
LIMITS_BLOCKED = adv.Limits(clients=2, requests=16, horizon=256, prompt=(8, 256), output=(1, 64))
SMALL = adv.Limits(clients=3, requests=3, horizon=24, prompt=(2, 16), output=(1, 6))
SMALL_CASES = [  # K = 3, M = 16: staggered arrivals, a head that does not fit, a quiet client
    (np.array([[0, 0, 5], [1, 2, 3], [9, 9, 9]]), np.array([[4, 16, 2], [8, 8, 3], [16, 2, 2]]),
     np.array([[6, 1, 3], [2, 5, 1], [3, 3, 6]])),
    (np.array([[0, 1, 2], [0, 0, 0], [4, 12, 20]]), np.array([[2, 2, 2], [16, 16, 16], [5, 9, 2]]),
     np.array([[6, 6, 6], [1, 2, 3], [6, 1, 4]])),
]


# ---- parametrisation ------------------------------------------------------------------

@pytest.mark.parametrize("limits", [adv.Limits(), SMALL, adv.Limits(clients=4, requests=5, horizon=1000,
                                                                     prompt=(1, 1), output=(7, 300))])
def test_decode_stays_within_limits(limits):
    rng = np.random.default_rng(0)
    genes = np.concatenate([adv.random_genes(rng, 256, limits, scale=4.0),
                            np.full((1,) + limits.shape, np.inf), np.full((1,) + limits.shape, -np.inf),
                            np.full((1,) + limits.shape, np.nan), np.full((1,) + limits.shape, 1e30),
                            np.zeros((1,) + limits.shape)])
    arrival, prompt, output = adv.decode(genes, limits)
    for values, (lo, hi) in zip((arrival, prompt, output), limits.ranges()):
        assert values.shape == genes.shape[:-1]
        assert values.min() >= lo and values.max() <= hi
    assert arrival.max() == limits.horizon - 1 and arrival.min() == 0  # both ends are reachable
    # to_genes is the inverse on every value of a range
    for lo, hi in ((0, 0), (3, 9), (1, 300)):
        x = np.arange(lo, hi + 1)
        assert (adv.squash(adv.unsquash(x, lo, hi), lo, hi) == x).all()
    back = adv.decode(adv.to_genes(arrival, prompt, output, limits), limits)
    for a, b in zip(back, (arrival, prompt, output)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("limits", [adv.Limits(), SMALL, adv.Limits(clients=4, requests=1, horizon=1)])
def test_the_construction_is_a_candidate(limits):
    values = adv.blocked_decode(limits)
    back = adv.decode(adv.to_genes(*values, limits), limits)  # within the limits: to_genes checks
    for a, b in zip(back, values):
        np.testing.assert_array_equal(a, b)


def test_limits_refuse_what_cannot_run():
    with pytest.raises(InputError, match="clients"):
        adv.Limits(clients=5)
    with pytest.raises(InputError, match="prompt"):
        adv.Limits(prompt=(9, 3))
    with pytest.raises(InputError, match="KV budget"):
        adv.Objective(Settings("vtc", 100), adv.Limits())


def test_bulk_layout_is_the_trace_layout():
    """Every candidate's block rows equal the project's layout of its witness trace, so the
    witness replays what was searched (same FIFO order, same FCFS ranks, same tie-breaks)."""
    rng = np.random.default_rng(1)
    limits = adv.Limits(clients=3, requests=7, horizon=6, prompt=(1, 9), output=(1, 4))  # many same-step ties
    values = adv.decode(adv.random_genes(rng, 64, limits), limits)
    bulk = adv.layout_candidates(*values, pad=5)
    for b in range(64):
        trace = adv.candidate_trace(*(v[b] for v in values))
        rows = layout_trace(trace, 3, 5)
        np.testing.assert_array_equal(bulk.requests[b], rows)
        np.testing.assert_array_equal(bulk.timeline[b], timeline_host(rows, bulk.first[b]))


# ---- the objective --------------------------------------------------------------------

def test_objective_is_the_engines_and_the_references_backlogged_drift():
    """The batched objective, a replay of each witness trace (one mixed-policy run) and the
    literal reference, brute force over every interval, agree exactly (K = 3)."""
    policies = ("vtc", "fcfs", "lcf")
    traces = [adv.candidate_trace(*case) for case in SMALL_CASES]
    lanes = [(t, Settings(p, 16)) for p in policies for t in traces]
    replayed = run_traces([t for t, _ in lanes], [s for _, s in lanes], num_clients=3, steps=SMALL.horizon,
                          measures=adv.MEASURES).backlogged_drift_exact
    batch = tuple(np.stack([case[i] for case in SMALL_CASES]) for i in range(3))
    found = np.concatenate([adv.Objective(Settings(p, 16), SMALL).values(*batch) for p in policies])
    for (trace, s), engine, value in zip(lanes, replayed, found):
        assert value == float(engine), (s.policy, value, engine)
        assert engine == brute_force(trace, s, SMALL.horizon, 3), s.policy
    assert len(set(found)) > 2  # the cases tell the policies apart


def test_blocked_decode_passes_2u_in_engine_and_reference():
    """The hand-made counterexample (see BLOCKED): 30 per step for 63 steps = 1,890 > 2U."""
    vtc = adv.Objective(Settings("vtc", 256), LIMITS_BLOCKED)
    assert vtc.values(*(x[None] for x in BLOCKED))[0] == 1890 > 2 * adv.bound_u(vtc.settings, 256) == 1024
    trace = adv.candidate_trace(*BLOCKED)
    assert reference_backlogged_drift(trace, vtc.settings, 256, 2) == 1890


def test_last_left_clause_stops_a_stale_counter():
    """Return after silence (M = 256): client 0 is served alone (one request every 16 steps,
    admitted at once, so its FIFO is empty between them) until step 384; client 1 arrives
    at step 400, when nobody is backlogged; client 0 bursts at 401. Without the `last_left`
    clause (the artifact's lift) client 1 keeps its counter 0 and is served until it has
    caught up client 0's whole past service, exactly as under LCF; MODEL.md's lift raises
    it to client 0's counter (the client last admitted)."""
    n = 64
    arrival = np.stack([np.array([16 * i for i in range(25)] + [401] * 39), np.full(n, 400)])
    trace = adv.candidate_trace(arrival, np.full((2, n), 8), np.full((2, n), 64))
    settings = [Settings("vtc", 256), Settings("vtc", 256, lift_last_left=False), Settings("lcf", 256)]
    vtc, artifact, lcf = run_traces([trace] * 3, settings, num_clients=2, steps=1024,
                                    measures=adv.MEASURES).backlogged_drift
    assert artifact == lcf == 6308 and vtc == 4432


# ---- the search -----------------------------------------------------------------------

def test_tiny_search_beats_random_and_its_witness_replays(tmp_path, capsys):
    limits = adv.Limits(clients=2, requests=6, horizon=48, prompt=(4, 64), output=(1, 16))
    settings = Settings("vtc", 64)
    objective = adv.Objective(settings, limits)
    config = adv.SearchConfig(population=256, generations=8, restarts=2, seed=3)
    found = adv.search(objective, limits, config)
    assert found.candidates == 8 * 256 and len(found.progress) == 8
    assert (np.diff(found.progress) >= 0).all() and found.progress[0] == found.random_best
    random = adv.random_search(objective, limits, found.candidates, batch=256, seed=11)
    assert found.best_drift > found.random_best and found.best_drift > random
    # the witness, through the replay CLI and the reference simulator
    path = tmp_path / "witness.csv"
    adv.write_witness_csv(path, found.trace)
    back = read_trace_csv(path)
    for col in ("arrival", "client", "prompt", "output", "cached"):
        np.testing.assert_array_equal(getattr(back, col), getattr(found.trace, col))
    j, d = tmp_path / "out.json", tmp_path / "details.json"
    code = cli.main(["replay", str(path), "--policy", "vtc", "--kv-budget", "64", "--w-p", "1", "--w-q", "2",
                     "--steps", "48", "--json", str(j), "--details", str(d)])
    assert code == 0, capsys.readouterr().err
    reported = {**json.loads(d.read_text()), **json.loads(j.read_text())}
    if "backlogged_drift" in reported:
        assert reported["backlogged_drift"] == found.best_drift
    else:  # the replay JSON does not carry it (yet): the same replay through the API
        assert adv.replay_drift(found.trace, settings, 48) == found.best_drift
    assert reference_backlogged_drift(found.trace, settings, 48, 2) == found.best_drift


def test_search_keeps_a_seeded_elite():
    limits = LIMITS_BLOCKED
    objective = adv.Objective(Settings("vtc", 256), limits)
    found = adv.search(objective, limits, adv.SearchConfig(population=64, generations=1, restarts=1),
                       initial=adv.to_genes(*BLOCKED, limits))
    assert found.best_drift >= 1890


def test_centered_ranks_share_ties():
    r = adv.centered_ranks(np.array([3.0, 1.0, 3.0, 2.0]))
    np.testing.assert_allclose(r, [(2.5 / 3) - 0.5, -0.5, (2.5 / 3) - 0.5, (1 / 3) - 0.5])


# ---- the sweep CLI --------------------------------------------------------------------

TINY = ["--policy", "vtc,fcfs", "--generations", "2", "--population", "96", "--restarts", "2", "--horizon", "32",
        "--requests", "4", "--prompt", "4,64", "--output", "1,16", "--kv-budget", "64", "--horizon-grid", "16,32",
        "--growth-policy", "fcfs", "--quiet"]


def test_sweep_cli_writes_its_files(tmp_path, capsys):
    out = tmp_path / "adv"
    assert sweep.main(["--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "worst_drift" in printed and "candidates/s" in printed
    result = json.loads((out / "results.json").read_text())
    assert result["sweep"] == "adversary" and {"config", "rows", "horizon_growth", "counterexample"} <= set(result)
    assert [r["label"] for r in result["rows"]] == ["vtc M=64 K=2 T=32", "fcfs M=64 K=2 T=32"]
    assert [r["setting"]["horizon"] for r in result["horizon_growth"]] == [16, 32]
    witnesses = {}
    for row in result["rows"] + result["horizon_growth"]:
        m = row["metrics"]
        assert set(row["setting"]) >= {"policy", "kv_budget", "clients"}
        assert {"worst_drift", "bound_2u", "lower_bound", "ratio_to_2u", "candidates_evaluated", "witness"} <= set(m)
        assert m["bound_2u"] <= 2 * max(64, 2 * 64) and m["lower_bound"] == 128
        assert m["ratio_to_2u"] == pytest.approx(m["worst_drift"] / m["bound_2u"])
        assert m["worst_drift"] >= m["construction_drift"]  # the search is seeded with it
        meta = json.loads((out / m["witness"]).with_suffix(".json").read_text())
        assert meta["backlogged_drift"] == m["worst_drift"] and meta["steps"] == row["setting"]["horizon"]
        witnesses[m["witness"]] = meta
    assert len(witnesses) == 3  # fcfs at T = 32 is one search, reported in both tables
    at_32 = [(read_trace_csv(out / w), Settings(meta["policy"], 64), meta["backlogged_drift"])
             for w, meta in witnesses.items() if meta["steps"] == 32]
    again = run_traces([t for t, _, _ in at_32], [s for _, s, _ in at_32], num_clients=2, steps=32,
                       measures=adv.MEASURES).backlogged_drift_exact
    assert [float(x) for x in again] == [d for _, _, d in at_32]
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["part"] for r in rows] == ["main", "main", "horizon", "horizon"]
    assert (out / "progress.png").stat().st_size > 1000 and (out / "horizon.png").stat().st_size > 1000
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("args, words", [
    (["--policy", "nope"], "unknown policy"), (["--policy", "rpm"], "rpm"), (["--clients", "5"], "--clients"),
    (["--clients", "1,2"], "--clients"), (["--population", "2"], "--population"),
    (["--population", "5", "--restarts", "2"], "population"), (["--generations", "0"], "--generations"),
    (["--prompt", "9,3"], "--prompt"), (["--kv-budget", "100"], "--kv-budget"),
    (["--horizon-grid", "x"], "--horizon-grid"),
    (["--bogus"], "unrecognized"), (["--w-q", "abc"], "w_q"), (["--output", "1,2,3"], "--output"),
    (["--seed", "-1"], "--seed"), (["--kv-cap", "100"], "KV cap"),
    (["--server", "nope"], "--server"), (["--server", "ideal_reserve"], "ideal_reserve"),
    (["--block-size", "8"], "--server vllm"),
    (["--server", "vllm", "--kv-budget", "250", "--prompt", "8,100"], "--block-size"),
    (["--server", "vllm", "--kv-cap", "400", "--prompt", "8,192"], "preempts"),
])
def test_sweep_cli_refuses_bad_flags(tmp_path, capsys, args, words):
    out = tmp_path / "never"
    assert sweep.main(["--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{sweep.PROG}: error: ") and words in lines[0], captured.err
    assert "Traceback" not in captured.err and not out.exists()


@pytest.mark.parametrize("server", ["ideal_reserve", "vllm"])
def test_sweep_cli_runs_on_a_bounded_server(tmp_path, capsys, server):
    """--server ideal_reserve / vllm: the search runs there (vllm's pool: M / 16 + 1 = 5
    blocks), writes its files, and its witness replays to its drift on that server from
    what its JSON records (vllm's also through its replay command, the CLI)."""
    out = tmp_path / "adv"
    args = ["--policy", "vtc", "--generations", "1", "--population", "48", "--restarts", "2", "--horizon", "24",
            "--requests", "3", "--prompt", "4,40", "--output", "1,16", "--kv-budget", "64", "--horizon-grid", "none",
            "--quiet", "--no-plots", "--server", server]
    assert sweep.main(["--out", str(out), *args]) == 0, capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())
    (row,) = result["rows"]
    assert row["label"] == f"vtc M=64 K=2 T=24 on {server}" and row["setting"]["server"] == server
    assert result["config"]["server"] == server
    meta = json.loads((out / row["metrics"]["witness"]).with_suffix(".json").read_text())
    options = {"num_gpu_blocks": 5, "block_size": 16, "max_num_batched_tokens": 2048, "max_num_seqs": 256}
    assert meta["server"] == server and meta["server_options"] == (options if server == "vllm" else {})
    assert f"--server {server}" in meta["replay"] and meta["backlogged_drift"] == row["metrics"]["worst_drift"]
    trace = read_trace_csv(out / row["metrics"]["witness"])
    settings = Settings("vtc", 64, w_p=1, w_q=2, server_options=tuple(meta["server_options"].items()))
    again = run_traces([trace], [settings], num_clients=2, steps=24, measures=adv.MEASURES, server=server)
    assert float(again.backlogged_drift_exact[0]) == meta["backlogged_drift"]
    if server == "vllm":
        command = meta["replay"].split()[3:]  # after "python -m vtc_jax"
        details = tmp_path / "details.json"
        command[command.index("--details") + 1] = str(details)
        command[1] = str(out / row["metrics"]["witness"])
        assert cli.main(command) == 0, capsys.readouterr().err
        assert json.loads(details.read_text())["backlogged_drift"] == meta["backlogged_drift"]


def test_sweep_cli_w_q_zero_has_no_ratio_to_a_zero_lower_bound(tmp_path, capsys):
    """w_q = 0 makes the lower bound w_q * M = 0: its ratio is None (was a ZeroDivisionError
    after the search); the ratio to 2U = 2 w_p L stays exact."""
    out = tmp_path / "adv"
    args = [a for a in TINY if a != "vtc,fcfs"]
    args[args.index("--policy") + 1:args.index("--policy") + 1] = ["vtc"]
    assert sweep.main(["--out", str(out), *args, "--w-q", "0", "--horizon-grid", "none", "--no-plots"]) == 0
    result = json.loads((out / "results.json").read_text())
    (m,) = [r["metrics"] for r in result["rows"]]
    assert m["lower_bound"] == 0 and m["ratio_to_lower_bound"] is None and m["bound_2u"] > 0
    assert m["ratio_to_2u"] == pytest.approx(m["worst_drift"] / m["bound_2u"])
    with open(out / "results.csv") as fh:
        assert next(csv.DictReader(fh))["ratio_to_lower_bound"] == ""


def test_sweep_cli_refuses_zero_prices_before_searching(tmp_path, capsys, monkeypatch):
    def searched(*args, **kwargs):
        raise AssertionError("searched")

    monkeypatch.setattr(sweep.adversary, "search", searched)
    assert sweep.main(["--out", str(tmp_path / "adv"), *TINY, "--w-p", "0", "--w-q", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--w-p and --w-q are both 0" in err[0]


def test_sweep_cli_refuses_a_search_over_memory_before_it_starts(tmp_path, capsys, monkeypatch):
    """The whole search's memory (every candidate an engine lane of one call, and its
    genes) is checked before the first search; the message names only this command's
    flags."""
    def searched(*args, **kwargs):
        raise AssertionError("searched")

    monkeypatch.setattr(sweep.adversary, "search", searched)
    monkeypatch.setattr(sweep.devices, "available_bytes", lambda mesh: 16 << 20)
    args = TINY + ["--population", "4096"]
    assert sweep.main(["--out", str(tmp_path / "adv"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GiB" in err[0] and "--population 4,096" in err[0], err
    flags = set(re.findall(r"--[a-z-]+", err[0]))
    known = {o for a in sweep.build_parser()._actions for o in a.option_strings}
    assert flags <= known and "--requests" in flags, flags
    small = sweep.search_bytes(adversary_objective(), 96)
    assert small < 16 << 20 < sweep.search_bytes(adversary_objective(), 4096)


def adversary_objective():
    return adv.Objective(Settings("vtc", 64), adv.Limits(clients=2, requests=4, horizon=32, prompt=(4, 64),
                                                         output=(1, 16)))


@pytest.mark.parametrize("error", [MemoryError, "RESOURCE_EXHAUSTED: Out of memory while trying to allocate"])
def test_sweep_cli_out_of_memory_mid_search_names_its_own_flags(tmp_path, capsys, monkeypatch, error):
    def exhausted(*args, **kwargs):
        raise jax.errors.JaxRuntimeError(error) if isinstance(error, str) else error

    monkeypatch.setattr(sweep.adversary, "search", exhausted)
    assert sweep.main(["--out", str(tmp_path / "adv"), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out of memory" in err[0] and "--population" in err[0]
    assert "--seeds" not in err[0] and "--chunk" not in err[0]


def test_sweep_cli_ctrl_c_writes_nothing(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep.adversary, "search", interrupted)
    out = tmp_path / "adv"
    assert sweep.main(["--out", str(out), *TINY]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0]
    assert not (out / "results.json").exists()


def test_sweep_cli_refuses_an_unwritable_out_before_searching(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert sweep.main(["--out", str(blocker / "sub"), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0]


# ---- the committed witnesses ----------------------------------------------------------

def _committed():
    return sorted(COMMITTED.glob("**/witnesses/*.json")) if COMMITTED.exists() else []


@pytest.mark.skipif(not _committed(), reason="no committed witnesses")
def test_committed_witnesses_replay_exactly():
    """Every witness in docs/results/adversary replays to its recorded drift (lanes of one
    (K, T) in one run); VTC's also through the literal reference simulator, so a VTC drift
    above 2U is the model's, not an engine defect."""
    groups = {}
    for meta_path in _committed():
        meta = json.loads(meta_path.read_text())
        server = (meta.get("server", "ideal"), tuple(sorted(meta.get("server_options", {}).items())))
        groups.setdefault((meta["clients"], meta["steps"], server), []).append(
            (meta, read_trace_csv(meta_path.with_suffix(".csv"))))
    for (k, steps, (server, options)), entries in groups.items():
        settings = [Settings(m["policy"], m["kv_budget"], w_p=m["w_p"], w_q=m["w_q"], beta=m["beta"],
                             lift_last_left=m.get("lift_last_left", True), kv_cap=m.get("kv_cap"),
                             server_options=options)
                    for m, _ in entries]
        result = run_traces([t for _, t in entries], settings, num_clients=k, steps=steps, measures=adv.MEASURES,
                            server=server)
        for (meta, trace), s, drift in zip(entries, settings, result.backlogged_drift_exact):
            assert drift == Fraction(meta["backlogged_drift"]), meta["witness"]
            assert int(trace.prompt.max()) <= meta["limits"]["prompt"][1] and len(trace) == k * \
                meta["limits"]["requests_per_client"]
            if s.policy == "vtc" and steps <= 256 and server == "ideal":  # the reference is MODEL.md's server
                assert reference_backlogged_drift(trace, s, steps, k) == drift, meta["witness"]


@pytest.mark.skipif(not (COMMITTED / "witnesses" / "vtc_M256_K2_T256.json").exists(), reason="no committed run")
def test_committed_vtc_witness_passes_2u_while_backlogged_throughout():
    """The default run's VTC witness exceeds 2U also when both clients' FIFOs are never
    empty in the interval (no lift can act inside it): the excess comes from the decode
    owed to running requests, not from the lift or the measure's per-step sampling."""
    meta = json.loads((COMMITTED / "witnesses" / "vtc_M256_K2_T256.json").read_text())
    trace = read_trace_csv(COMMITTED / "witnesses" / "vtc_M256_K2_T256.csv")
    strict = strict_backlogged_drift(trace, Settings("vtc", 256), 256, 2)
    assert strict > meta["bound_2u"] and strict <= meta["backlogged_drift"]
