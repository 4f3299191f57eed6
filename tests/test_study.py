"""One study, one report: `compare` runs every server through one path (cli/study_plan.py,
driver/study.py). results.json has one top-level schema on every server (the sweep's
fairness rows always, "latency" where the server keeps time); on a timed vLLM server the
log's priority column is honoured, --seeds redraws arrivals and every latency figure gets a
95% CI over the seeds, a horizon that cuts the run flags and counts what did not finish;
servers declare what they are, and nothing above vtc_jax/servers/ names one.

Hand-worked numbers use the preset qwen2.5-7b-h100: b0 7051.8 us per step, b1 19.54 us per
prefill token, b2 25.43 us per decoding request, a0 4,680 us from arrival to the queue
(tests/test_timed.py works the same steps)."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest

from vtc_jax.cli.commands import main
from vtc_jax.servers import registry as servers

pytestmark = pytest.mark.usefixtures("capacity_once_per_mix")

PRESET = "qwen2.5-7b-h100"
PRIORITY_LOG = "timestamp,tenant,prompt,output,priority\n0,tenant-number-one,100,3,5\n0,tenant-number-two,100,3,1\n"
ROOT = Path(__file__).resolve().parents[1]
ONE_SEAT = ("--max-num-seqs", "1")


def _run(tmp_path, log: str, *flags, out=None, requests=True, fresh=False):
    """Run compare on `log` (--requests-out into --out, which exists unless `fresh`):
    (the requests CSV's rows, results.json, the --out directory)."""
    path = tmp_path / "log.csv"
    path.write_text(log)
    out = out or tmp_path / "out"
    if not fresh:
        out.mkdir(parents=True, exist_ok=True)
    argv = ["compare", str(path), "--policies", "fcfs", "--out", str(out), "--no-cache", *flags]
    if requests:
        argv += ["--requests-out", str(out / "requests.csv")]
    assert main(argv) == 0
    rows = list(csv.DictReader((out / "requests.csv").open())) if requests else None
    return rows, json.loads((out / "results.json").read_text()), out


def test_priority_column_orders_a_timed_vllm_run(tmp_path):
    """Two requests at t = 0, prompt 100 and output 3 each, one seat, priorities 5 (first
    row) and 1. vLLM's priority policy serves the lower value first: that request's prefill
    step (100 tokens) lasts trunc(7051.8 + 19.54 x 100) = 9,005 us after its a0 = 4,680 us,
    TTFT 13,685 us; its two decode steps of 7,077 us end it at 27,839 us. The other then
    prefills: 27,839 + 9,005 = 36,844 us (TTFT 36,844)."""
    rows, result, _ = _run(tmp_path, PRIORITY_LOG, "--server", "vllm", "--preset", PRESET, *ONE_SEAT,
                           "--scheduling-policy", "priority")
    assert [(r["tenant"], r["ttft_us"]) for r in rows] == [("tenant-number-one", "36844"), ("tenant-number-two", "13685")]
    tenants = result["latency"]["policies"]["fcfs"]["tenants"]
    assert tenants["tenant-number-two"]["ttft"]["p99"] == pytest.approx(13.685)
    assert tenants["tenant-number-one"]["ttft"]["p99"] == pytest.approx(36.844)
    # the fairness side runs each (tenant, priority) pair as an engine client, named so
    assert result["config"]["tenants"] == ["tenant-number-one/priority 5", "tenant-number-two/priority 1"]


def test_requests_out_into_an_out_directory_not_made_yet(tmp_path):
    """--requests-out inside an --out directory that does not exist yet: --out is made
    first. Without --scheduling-policy priority (fcfs) the first row goes first."""
    out = tmp_path / "fresh" / "out"
    rows, _, _ = _run(tmp_path, PRIORITY_LOG, "--server", "vllm", "--preset", PRESET, *ONE_SEAT, out=out, fresh=True)
    assert [r["ttft_us"] for r in rows] == ["13685", "36844"]


def _group(requests: int, finished: int, ttft_p99: float) -> dict:
    stats = {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}
    return {"requests": requests, "finished": finished, "ttft": dict(stats, p99=ttft_p99), "tpot": stats, "itl": stats,
            "e2el": stats, "queue": stats, "output_tokens_per_s": 10.0, "goodput": None, "preemptions": 0}


def test_the_latency_table_prints_whole_tenant_names():
    """Two tenants equal in their first 14 characters print as two names (the column is as
    wide as the longest), and a tenant with requests left reads "F of N"."""
    from vtc_jax.cli.timed_compare import format_report

    names = ["tenant-number-one", "tenant-number-two"]
    summary = {"tenants": {names[0]: _group(3, 3, 2.0), names[1]: _group(4, 1, 3.0)}, "overall": _group(7, 4, 3.0),
               "finished_all": False, "slos_ms": {}}
    text = format_report({"server": "s", "step_time": "t", "settings": {}, "policies": {"fcfs": summary}}, names)
    lines = text.splitlines()
    assert any(line.split()[:3] == ["fcfs", "tenant-number-one", "3"] for line in lines), text
    assert any(line.split()[:5] == ["fcfs", "tenant-number-two", "1", "of", "4"] for line in lines), text
    assert "fcfs: NOT FINISHED: tenant-number-two 1 of 4 finished" in text


def test_a_cut_horizon_flags_and_counts_unfinished_requests(tmp_path, capsys):
    """Ten requests of tenant a at t = 0 (prompt 100, output 3), one seat: each takes 9,005
    + 2 x 7,077 = 23,159 us after the first joins at 4,680 us, so they finish at 27,839,
    50,998, 74,157, ... us. --steps 60000 (us) cuts the run after two: the table says
    "2 of 10" and NOT FINISHED, bench_serve.json and results.json finished_all false, 8
    unfinished counted, never averaged in (TTFT p99 over the two: 13,685 and 36,844 us)."""
    log = "timestamp,tenant,prompt,output\n" + "0,a,100,3\n" * 10
    rows, result, out = _run(tmp_path, log, "--server", "vllm", "--preset", PRESET, *ONE_SEAT, "--steps", "60000")
    assert [r["finish_us"] for r in rows[:3]] == ["27839", "50998", ""]
    bench = json.loads((out / "bench_serve.json").read_text())["fcfs"]
    assert bench["finished_all"] is False and (bench["completed"], bench["failed"]) == (2, 8)
    text = capsys.readouterr().out
    assert " 2 of 10 " in text and "fcfs: NOT FINISHED: a 2 of 10 finished" in text
    fcfs = result["latency"]["policies"]["fcfs"]
    assert fcfs["finished_all"] is False
    assert (fcfs["tenants"]["a"]["requests"], fcfs["tenants"]["a"]["finished"], fcfs["tenants"]["a"]["unfinished"]) == (
        10, 2, 8)
    assert fcfs["tenants"]["a"]["ttft"]["p99"] == pytest.approx((13685 + 0.99 * (36844 - 13685)) / 1000)


def test_seeds_give_every_timed_figure_a_ci(tmp_path):
    """--seeds 3 on a timed vllm run: each arrival is redrawn within its second (seed 0:
    the log). Two tenants with one request each, 100 s apart (the server is idle when each
    arrives), so every seed gives each the same TTFT, 13,685 us (a0 4,680 + a 100-token
    prefill of 9,005): the mean over 3 seeds is 13.685 ms and its 95% CI has zero width.
    The TTFT picture is drawn; the figures are also the sweep row's metrics (results.csv)."""
    log = "timestamp,tenant,prompt,output\n0.5,a,100,3\n100.5,b,100,3\n"
    _, result, out = _run(tmp_path, log, "--server", "vllm", "--preset", PRESET, *ONE_SEAT, "--seeds", "3",
                          requests=False)
    spread = result["latency"]["over_seeds"]["fcfs"]
    for tenant in ("a", "b"):
        p99 = spread["tenants"][tenant]["ttft"]["p99"]
        assert p99["n"] == 3 and p99["mean"] == pytest.approx(13.685)
        assert p99["ci95"] == pytest.approx([13.685, 13.685])
    assert result["config"]["seeds"] == 3 and (out / "ttft_cdf.png").stat().st_size > 0
    # the same figures as the row's metrics: results.json's rows and results.csv, as every sweep metric
    metric = result["rows"][0]["metrics"]["ttft_p99_ms[b]"]
    assert metric["n"] == 3 and metric["mean"] == pytest.approx(13.685) and metric["std"] == pytest.approx(0)
    assert "ttft_p99_ms[b]" in (out / "results.csv").read_text()


def test_results_json_has_one_schema_on_every_server(tmp_path):
    """ideal (with --kv-budget), slora and vllm write results.json with the same top-level
    keys; fairness (drift, bound, shares) on each; latency on the timed ones only."""
    log = "timestamp,tenant,prompt,output\n0,a,100,3\n0.01,b,50,2\n"
    runs = {
        "ideal": ("--kv-budget", "1000"),
        "slora": ("--server", "slora"),
        "vllm": ("--server", "vllm", "--preset", PRESET, *ONE_SEAT),
    }
    keys = {}
    for server, flags in runs.items():
        _, result, _ = _run(tmp_path, log, *flags, out=tmp_path / server, requests=False)
        keys[server] = set(result)
        row = result["rows"][0]
        assert {"backlogged_drift", "bound_2u"} <= set(row["metrics"]) and "served_share" in row["clients"]
        assert (result["latency"] is not None) == (server != "ideal")
    assert keys["ideal"] == keys["slora"] == keys["vllm"] == {"sweep", "config", "rows", "latency"}


@pytest.mark.parametrize("command", ["compare", "replay"])
def test_a_token_budget_below_the_seats_is_refused(tmp_path, capsys, command):
    """vLLM refuses max_num_batched_tokens < max_num_seqs (SchedulerConfig); so does the
    vllm server's validate, on every command: one line, exit 2."""
    path = tmp_path / "log.csv"
    path.write_text("timestamp,tenant,prompt,output\n0,a,100,3\n")
    flags = ["--server", "vllm", "--max-num-seqs", "9000", "--max-num-batched-tokens", "100"]
    if command == "compare":
        argv = ["compare", str(path), "--policies", "fcfs", "--preset", PRESET, "--out", str(tmp_path / "o"), *flags]
    else:
        argv = ["replay", str(path), "--policy", "fcfs", "--num-gpu-blocks", "64", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "max_num_batched_tokens (100) is below max_num_seqs (9000)" in err, err


def test_servers_declare_what_they_are():
    """The registry's declarations: the default server first; which keep time (vllm only
    with a step-time model), their per-request records, memory and trace columns."""
    assert servers.DEFAULT_SERVER == servers.names()[0] == "ideal"
    assert not servers.keeps_time("ideal") and servers.keeps_time("slora")
    assert servers.keeps_time("vllm", {"time_model": "per_step=1"}) and not servers.keeps_time("vllm", {})
    assert servers.request_record("ideal") is None and servers.request_record("vllm")[1] == "row"
    assert servers.request_record("slora")[1] == "order"
    assert servers.default_memory("vllm", {"num_gpu_blocks": 5, "block_size": 16}) == 64
    assert servers.default_memory("slora") == 9968 and servers.default_memory("ideal") is None
    assert servers.trace_columns("vllm") == ("priority",) and "prefix_id" in servers.trace_columns("vllm_prefix")
    assert servers.prefix_caching("vllm", True) == "vllm_prefix" and servers.prefix_caching("vllm_prefix", False) == "vllm"
    assert servers.flags("vllm")["max_num_seqs"] == "--max-num-seqs" and servers.flags("ideal") == {}


FLOORS = ("cli", "driver", "engines", "measures", "inputs", "policies", "core")
MINE = {"vtc_jax/cli/compare.py", "vtc_jax/cli/timed_compare.py", "vtc_jax/cli/slora_compare.py",
        "vtc_jax/cli/replay.py", "vtc_jax/cli/server_replay.py", "vtc_jax/cli/server_flags.py",
        "vtc_jax/cli/commands.py", "vtc_jax/cli/cluster_flags.py", "vtc_jax/cli/study_plan.py",
        "vtc_jax/driver/latency.py", "vtc_jax/driver/server_latency.py", "vtc_jax/driver/cluster_latency.py",
        "vtc_jax/driver/sweep.py", "vtc_jax/driver/sweep_outputs.py", "vtc_jax/driver/results.py",
        "vtc_jax/driver/capacity.py", "vtc_jax/driver/study.py"}


def server_literals() -> list[str]:
    """`path:line: 'name'` for every string literal, above vtc_jax/servers/, equal to a
    registered server's name."""
    names = set(servers.names())
    hits = []
    for floor in FLOORS:
        for path in sorted((ROOT / "vtc_jax" / floor).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                    hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return hits


def test_the_study_path_names_no_server():
    """The modules of the study path (compare, replay, their flags, the latency and sweep
    drivers) hold no string literal equal to a server's name: a server is what it declares."""
    hits = [h for h in server_literals() if h.split(":")[0] in MINE]
    assert hits == []


def test_nothing_above_the_servers_names_a_server():
    """No string literal above vtc_jax/servers/ equals a registered server's name."""
    assert server_literals() == []


def test_per_tenant_goodput_slos():
    """--goodput chat:ttft:500 ttft:1000: chat's requests meet TTFT <= 500 ms, every other
    tenant's TTFT <= 1,000 ms. Three requests at 0: chat's first tokens at 400 and 600 ms,
    batch's at 900 ms; they finish at 1, 1 and 2 s (duration 2 s). chat meets its SLO once
    (0.5 requests/s), batch once under the default (0.5/s), 1.0/s overall; under the plain
    `ttft:500` batch would not (0.5/s overall)."""
    import numpy as np

    from vtc_jax.driver.latency import outcome_table, parse_goodput, summarize

    stamps = {"first_token_us": np.array([400_000, 600_000, 900_000]), "finish_us": np.array([1_000_000, 1_000_000,
                                                                                             2_000_000]),
              "scheduled_us": np.zeros(3, np.int64), "preemptions": np.zeros(3, np.int64)}
    table = outcome_table(stamps, np.zeros(3, np.int64), np.array([2, 2, 2]), None)
    tenant, prompt = np.array([0, 0, 1]), np.array([10, 10, 10])
    slos = parse_goodput(["chat:ttft:500", "ttft:1000"])
    assert slos == {"chat": {"ttft": 500.0}, "*": {"ttft": 1000.0}}
    got = summarize(table, tenant, ["chat", "batch"], prompt, slos)
    assert (got["tenants"]["chat"]["goodput"], got["tenants"]["batch"]["goodput"], got["overall"]["goodput"]) == (
        0.5, 0.5, 1.0)
    assert summarize(table, tenant, ["chat", "batch"], prompt, parse_goodput(["ttft:500"]))["overall"]["goodput"] == 0.5


def test_a_goodput_slo_for_a_tenant_the_log_lacks_is_one_line(tmp_path, capsys):
    path = tmp_path / "log.csv"
    path.write_text("timestamp,tenant,prompt,output\n0,a,100,3\n")
    argv = ["compare", str(path), "--policies", "fcfs", "--server", "vllm", "--preset", PRESET, "--out",
            str(tmp_path / "o"), "--goodput", "chat:ttft:500"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--goodput names tenant 'chat', which the log does not have" in err, err


def test_replay_on_slora_takes_its_own_memory(tmp_path, capsys):
    """`replay --server slora` without --kv-budget runs on slora's own pool (M = 10,000 -
    32 = 9,968), as compare does: the bound 2U = 2 x w_q x M = 39,872 (w_q 2)."""
    path = tmp_path / "t.csv"
    path.write_text("arrival,client,prompt,output\n0,0,100,3\n")
    out = tmp_path / "run.json"
    assert main(["replay", str(path), "--policy", "fcfs", "--server", "slora", "--no-cache", "--json", str(out)]) == 0
    run = json.loads(out.read_text())
    assert run["bound_2u"] == 39872, run  # 2U, U = max(w_p x prompt, w_q x M) = 2 x 9,968 (w_q = 2)


def test_a_timed_replay_honours_priority_and_writes_requests(tmp_path):
    """`replay --server vllm --preset P --requests-out` is the timed run compare makes, on
    one policy: the priority-1 request first (TTFT 13,685 us), the priority-5 one after it
    (36,844 us), as worked in test_priority_column_orders_a_timed_vllm_run."""
    path, out = tmp_path / "log.csv", tmp_path / "requests.csv"
    path.write_text(PRIORITY_LOG)
    assert main(["replay", str(path), "--policy", "fcfs", "--server", "vllm", "--preset", PRESET, *ONE_SEAT,
                 "--scheduling-policy", "priority", "--requests-out", str(out), "--no-cache"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["tenant"], r["scheduled_us"], r["ttft_us"], r["finish_us"]) for r in rows] == [
        ("tenant-number-one", "27839", "36844", "50998"), ("tenant-number-two", "4680", "13685", "27839")]


def test_a_server_with_its_own_clock_declares_what_its_report_prints():
    """slora's latency report names its step times and prints its settings (the unified
    path printed 'step time the server's own clock;' and nothing after it)."""
    clock, shown = servers.get("slora").own_clock({})
    assert clock == "the artifact's A10G fit (docs/ARTIFACT.md)"
    assert shown == {"kv_pool": 10000, "adapter_reserve": 32, "prefill_cap": 3072, "running_cap": 1000, "cadence": 10,
                     "poll_us": 10000, "idle": "poll", "extra_finish_charge": True}
    assert servers.get("vllm").own_clock is None  # its step times are a step-time model's


def test_a_sweep_refuses_to_drop_the_priority_column(tmp_path, capsys):
    """A sweep on a log with priorities under --scheduling-policy priority served by arrival
    (the priority column was read and dropped); it is refused in one line, naming the
    commands that honour it."""
    from sweeps import kv_budget

    log = tmp_path / "l.csv"
    log.write_text("timestamp,tenant,prompt,output,priority\n0,a,10,5,5\n0,b,10,5,1\n")
    code = kv_budget.main(["--trace", str(log), "--server", "vllm", "--num-gpu-blocks", "64",
                           "--scheduling-policy", "priority", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "does not order requests by the log's priority column" in err[0], err


def test_a_load_line_that_cannot_be_measured_says_so_and_the_study_stands(tmp_path, capsys):
    """Two requests of 600 + 8,000 tokens on the preset: the load line's saturated run (125
    held at once, 8,000 decode steps each round) passes the int32 us clock and cannot
    finish; the command still reports the study, exit 0, and the line says why."""
    log = tmp_path / "long.csv"
    log.write_text("timestamp,tenant,prompt,output\n0,a,600,8000\n1,b,600,8000\n")
    assert main(["compare", str(log), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--policies", "fcfs",
                 "--out", str(tmp_path / "out"), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert ("load: the log (2 requests over 1 s) offers 2 requests/s; the server's capacity on this mix was not "
            "measured (capacity: the saturated run did not finish every request)") in out
    assert json.loads((tmp_path / "out" / "results.json").read_text())["latency"]["load"]["capacity"] is None
