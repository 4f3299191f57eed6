"""The public formats through the commands a user runs (docs/FORMATS.md): the shipped
Azure, Mooncake and BurstGPT files go through compare, replay and gen --from as they are
published, and what the command says it read is what it ran."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from vtc_jax.cli.commands import main
from vtc_jax.inputs.request_log import read_requests

ROOT = Path(__file__).resolve().parents[1]
AZURE = [str(ROOT / "data" / "azure_llm_2023" / f"AzureLLMInferenceTrace_{s}.csv") for s in ("conv", "code")]
MOONCAKE = str(ROOT / "data" / "mooncake_fast25" / "synthetic_trace.jsonl")
BURSTGPT = str(ROOT / "examples" / "burstgpt_sample.csv")


def test_azure_two_services_are_two_tenants_in_replay(tmp_path, capsys):
    """Azure's code service starts 77.3 s after the conversation one: a window from 70 s
    holds both, on one clock."""
    out = tmp_path / "r.json"
    argv = ["replay", *AZURE, "--policy", "vtc", "--kv-budget", "65536", "--time-window", "70,20", "--json", str(out),
            "--no-cache"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    log = read_requests(AZURE)
    t = (log.arrival - log.arrival.min()) / 1e9
    inside = (t >= 70) & (t < 90)
    counts = {name: int(((log.client == k) & inside).sum()) for k, name in enumerate(log.tenants)}
    assert counts["conv"] > 0 and counts["code"] > 0
    assert lines[0].startswith(f"read {AZURE[0]}, {AZURE[1]} (azure): {int(inside.sum())} requests, 2 tenants")
    result = json.loads(out.read_text())
    assert sum(result["completed"]) == int(inside.sum()) and result["clients"] == 2


def test_mooncake_split_into_tenants_through_compare(tmp_path, capsys):
    """A seeded --tenants split of Mooncake's synthetic trace (timestamps in ms): the
    per-tenant counts compare prints are the split's, reproducibly."""
    argv = ["compare", MOONCAKE, "--policies", "fcfs,vtc", "--kv-budget", "200000", "--time-window", "0,20",
            "--tenants", "x:0.7,y:0.3", "--split-seed", "3", "--out", str(tmp_path / "out"), "--no-plots", "--no-cache"]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    log = read_requests([MOONCAKE], tenants="x:0.7,y:0.3", split_seed=3)
    t = log.arrival / 1e9
    inside = t < 20
    n = {name: int(((log.client == k) & inside).sum()) for k, name in enumerate(log.tenants)}
    assert first.startswith(f"read {MOONCAKE} (mooncake): {int(inside.sum())} requests, 2 tenants")
    assert f"x {n['x']}" in first and f"y {n['y']}" in first
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert [r["setting"]["policy"] for r in rows] == ["fcfs", "vtc"]


def test_gen_from_burstgpt_replays_as_the_file(tmp_path, capsys):
    """gen --from writes the trace in steps the commands run: replaying it equals
    replaying the BurstGPT file itself (tenants by model)."""
    trace = tmp_path / "bg.csv"
    assert main(["gen", "--from", BURSTGPT, "--tenant-from", "Model", "--out", str(trace)]) == 0
    rows = list(csv.DictReader(trace.open()))
    assert len(rows) == 192 and {r["client"] for r in rows} == {"0", "1"}
    results = []
    for argv in (["replay", str(trace)], ["replay", BURSTGPT, "--tenant-from", "Model"]):
        out = tmp_path / f"r{len(results)}.json"
        assert main(argv + ["--policy", "vtc", "--kv-budget", "16384", "--json", str(out), "--no-cache"]) == 0
        results.append(json.loads(out.read_text()))
    assert results[0] == results[1]


def test_a_timed_input_goes_on_the_servers_own_clock():
    """slora's step is 1 us: a timed log's arrivals go on that clock unless --step-seconds
    is given; other servers take steps of 0.025 s by default."""
    import argparse

    from vtc_jax.cli.input_flags import resolved_step_seconds

    def step(**kw):
        return resolved_step_seconds(argparse.Namespace(**kw))

    assert step(server="slora", step_seconds=None) == 1e-6 and step(server="ideal", step_seconds=None) == 0.025
    assert step(server="slora", step_seconds=0.5) == 0.5 and step(step_seconds=None) == 0.025
    log = read_requests([BURSTGPT])
    assert (log.steps_trace(1e-6).arrival == log.arrival // 1000).all()  # whole microseconds


def test_the_readers_defaults_are_the_flags_defaults():
    """compare.read_log without a command line reads as the flags' defaults would."""
    import argparse

    from vtc_jax.cli import input_flags

    parser = argparse.ArgumentParser()
    input_flags.add(parser, step_seconds=False)
    assert vars(parser.parse_args([])) == input_flags.DEFAULTS
