"""The operator's path: log conversion, the load line and overload warning, compare, gen."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vtc_jax.cli import commands as cli
from vtc_jax.cli.compare import read_log
from vtc_jax.cli.replay import load_line
from vtc_jax.core.errors import InputError
from vtc_jax.driver import sweep_outputs
from vtc_jax.inputs.workload import read_trace_csv


def _write(path, text):
    path.write_text(text)
    return path


def test_timestamped_log_converts_to_steps(tmp_path):
    log = _write(tmp_path / "log.csv", "timestamp,tenant,prompt,output\n"
                 "100.0,alice,10,5\n100.02,bob,20,6\n\n100.05,alice,30,7\n101.0,carol,40,8\n")
    trace, names, per_second = read_log(log, 0.025)
    assert names == ["alice", "bob", "carol"]  # numbered by first appearance
    assert list(trace.arrival) == [0, 0, 2, 40]  # floor((t - t0) / 0.025)
    assert list(trace.client) == [0, 1, 0, 2]
    assert list(trace.prompt) == [10, 20, 30, 40] and list(trace.output) == [5, 6, 7, 8]
    assert per_second == 40
    assert list(trace.lines) == [2, 3, 5, 6]  # physical lines, the blank one counted


def test_timestamped_log_with_cached_column_and_any_order(tmp_path):
    log = _write(tmp_path / "log.csv", "tenant,output,timestamp,prompt,cached\nx,3,5.5,10,4\ny,2,5.0,8,0\n")
    trace, names, _ = read_log(log, 0.5)
    assert names == ["y", "x"]  # time order: y's request (5.0 s) comes first
    assert list(trace.arrival) == [0, 1] and list(trace.cached) == [0, 4] and list(trace.lines) == [3, 2]


@pytest.mark.parametrize("text, words", [
    ("timestamp,tenant,prompt\n1,a,3\n", "missing column 'output'"),
    ("timestamp,tenant,prompt,output\n1,a,3,4\nx,a,3,4\n", "line 3: timestamp must be a finite number of seconds"),
    ("timestamp,tenant,prompt,output\n1,a,3,4\n\n-1,a,3,4\n", "line 4: timestamp must be a finite number of seconds"),
    ("timestamp,tenant,prompt,output\n1,,3,4\n", "line 2: tenant is empty"),
    ("timestamp,tenant,prompt,output\n1,a,3.5,4\n", "line 2: prompt must be a non-negative integer"),
    ("timestamp,tenant,prompt,output\n1,a,3\n", "line 2: 3 fields, header has 4"),
    ("timestamp,tenant,prompt,output\n", "no requests"),
    ("timestamp,tenant,prompt,output\n0,a,3,4\n1e9,a,3,4\n", "spans 11,574.1 days at 2e-09 requests/s, implausible"),
])
def test_bad_logs_name_the_line(tmp_path, text, words):
    log = _write(tmp_path / "log.csv", text)
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
        read_log(log, 0.025)


def test_load_line_warns_only_past_the_threshold():
    over = load_line({"offered_per_step": 300.0, "served_per_step": 100.0, "offered_over_served": 3.0,
                          "waiting_at_span_end": 20, "waiting_at_end": 17})
    assert "17 requests still waiting" in over and "OVERLOAD: 3.00x" in over
    fine = load_line({"offered_per_step": 100.0, "served_per_step": 100.0, "offered_over_served": 1.0,
                          "waiting_at_span_end": 0, "waiting_at_end": 0})
    assert "OVERLOAD" not in fine and "0 requests still waiting" in fine
    edge = load_line({"offered_per_step": 105.0, "served_per_step": 100.0, "offered_over_served": 1.05,
                          "waiting_at_span_end": 1, "waiting_at_end": 1})
    assert "OVERLOAD" not in edge
    # more offered than served over the span, but nothing queued when the last request
    # arrived: a drain tail (requests still running), not a queue
    tail = load_line({"offered_per_step": 300.0, "served_per_step": 100.0, "offered_over_served": 3.0,
                          "waiting_at_span_end": 0, "waiting_at_end": 0})
    assert "OVERLOAD" not in tail


def test_sweep_load_lines_flag_overloaded_rows():
    def row(label, off, srv, waiting):
        m = {"offered_per_step": {"mean": off}, "served_per_step": {"mean": srv}, "waiting_at_end": {"mean": waiting},
             "waiting_at_span_end": {"mean": waiting}}
        return {"label": label, "metrics": m}
    text = sweep_outputs.format_load({"rows": [row("a", 200.0, 100.0, 40.0), row("b", 90.0, 90.0, 0.0)]})
    lines = text.splitlines()
    assert lines[0] == "load:"
    assert "a: offered 200.0 vs served 100.0" in lines[1] and "OVERLOAD: 2.00x" in lines[1]
    assert "b: offered 90.0 vs served 90.0" in lines[2] and "OVERLOAD" not in lines[2]


def test_replay_reports_load_and_overload(tmp_path, capsys):
    # 40 requests of 200 tokens at step 0 on M = 1000 for 50 steps: most still wait
    rows = "".join(f"0,{i % 2},200,40\n" for i in range(40))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    details = tmp_path / "d.json"
    assert cli.main(["replay", str(trace), "--policy", "vtc", "--kv-budget", "1000", "--steps", "50",
                     "--details", str(details), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "OVERLOAD" in out
    d = json.loads(details.read_text())
    waiting = sum(d["waiting_at_end"])
    assert f"{waiting} requests still waiting" in out and waiting > 20
    assert d["load"]["offered_over_served"] > 1.05
    assert abs(sum(d["share_of_service"]) - 1) < 1e-9 and abs(sum(d["share_of_demand"]) - 1) < 1e-9
    # drained: nothing waits, but the burst (one step of arrivals, ~320 steps to serve) is
    # offered over its arrival span: still an overload
    assert cli.main(["replay", str(trace), "--policy", "vtc", "--kv-budget", "1000", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "OVERLOAD" in out and "0 requests still waiting" in out
    # the same requests spread one per 50 steps are served as they come: no warning
    spread = _write(tmp_path / "s.csv", "arrival,client,prompt,output\n"
                    + "".join(f"{50 * i},{i % 2},200,40\n" for i in range(40)))
    assert cli.main(["replay", str(spread), "--policy", "vtc", "--kv-budget", "1000", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "OVERLOAD" not in out and "0 requests still waiting" in out


def test_compare_answers_the_weight_question(tmp_path, capsys):
    """A weight-2 tenant backlogged beside a weight-1 one gets 2/3 of the service under VTC."""
    rows = "".join(f"0.0,{name},100,50\n" for _ in range(200) for name in ("small", "big"))
    log = _write(tmp_path / "log.csv", "timestamp,tenant,prompt,output\n" + rows)
    out_dir = tmp_path / "out"
    assert cli.main(["compare", str(log), "--policies", "fcfs,vtc", "--kv-budget", "1000", "--weights", "1,2",
                     "--steps", "1500", "--out", str(out_dir), "--no-plots", "--no-cache"]) == 0
    text = capsys.readouterr().out
    assert "small" in text and "big" in text and "share of service" in text and "load:" in text
    result = json.loads((out_dir / "results.json").read_text())
    by = {r["label"]: r["clients"] for r in result["rows"]}
    assert by["vtc"]["served_share"][1] == pytest.approx(2 / 3, abs=0.03)
    assert by["fcfs"]["served_share"][1] == pytest.approx(1 / 2, abs=0.02)  # FCFS alternates the arrivals
    for r in result["rows"]:
        assert sum(r["clients"]["served_share"]) == pytest.approx(1)
        assert r["clients"]["offered_share"] == pytest.approx([0.5, 0.5])


def test_compare_refuses_weights_for_a_policy_that_ignores_them(tmp_path, capsys):
    log = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n0,0,10,5\n0,1,10,5\n")
    assert cli.main(["compare", str(log), "--policies", "fcfs", "--kv-budget", "100", "--weights", "1,2",
                     "--out", str(tmp_path / "o"), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "weights" in err[0]
    assert not (tmp_path / "o" / "results.json").exists()


def test_gen_writes_a_trace_with_the_asked_rates(tmp_path, capsys):
    out = tmp_path / "g.csv"
    assert cli.main(["gen", "--out", str(out), "--steps", "4000", "--seed", "3",
                     "--tenant", "rate=0.5,prompt=10:20,output=5:6",
                     "--tenant", "rate=0.1,pattern=silence:1000:3000"]) == 0
    trace = read_trace_csv(out)
    a, c = trace.arrival, trace.client
    n0, n1 = int((c == 0).sum()), int((c == 1).sum())
    assert abs(n0 - 2000) < 5 * np.sqrt(2000)
    assert abs(n1 - 200) < 5 * np.sqrt(200)
    assert not ((c == 1) & (a >= 1000) & (a < 3000)).any()
    assert trace.prompt[c == 0].min() >= 10 and trace.prompt[c == 0].max() <= 20
    assert set(trace.output[c == 0]) <= {5, 6}
    assert (np.diff(a) >= 0).all() and a.max() < 4000
    # the same seed gives the same trace
    again = tmp_path / "h.csv"
    cli.main(["gen", "--out", str(again), "--steps", "4000", "--seed", "3", "--tenant", "rate=0.5,prompt=10:20,output=5:6",
              "--tenant", "rate=0.1,pattern=silence:1000:3000"])
    assert again.read_text() == out.read_text()
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("spec, words", [
    ("prompt=1:2", "rate=R"), ("rate=-1", "bad rate"), ("rate=1,pattern=on_off", "bad pattern"),
    ("rate=1,prompt=5:2", "bad prompt"), ("rate=1,rate=2", "given twice"), ("speed=1", "expected KEY=VALUE"),
    ("rate=1,pattern=silence:50:10", "silence needs"),
])
def test_gen_refuses_bad_tenants(tmp_path, capsys, spec, words):
    out = tmp_path / "g.csv"
    assert cli.main(["gen", "--out", str(out), "--steps", "100", "--tenant", spec]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
    assert not out.exists()


def test_compare_drains_like_replay(tmp_path, capsys):
    """compare without --steps runs each lane until its log has completed: its throughput
    and load line are replay's (not diluted over the drain bound), and a log served 3x
    slower than it arrives is flagged."""
    rows = "".join(f"{3 * i},{i % 3},300,60\n" for i in range(60))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    details = tmp_path / "d.json"
    assert cli.main(["replay", str(trace), "--policy", "vtc", "--kv-budget", "1000", "--details", str(details),
                     "--no-cache"]) == 0
    replayed = json.loads(details.read_text())["load"]
    capsys.readouterr()
    out_dir = tmp_path / "cmp"
    assert cli.main(["compare", str(trace), "--policies", "vtc", "--kv-budget", "1000", "--out", str(out_dir),
                     "--no-plots", "--no-cache"]) == 0
    out = capsys.readouterr().out
    metrics = json.loads((out_dir / "results.json").read_text())["rows"][0]["metrics"]
    assert metrics["served_per_step"]["mean"] == pytest.approx(replayed["served_per_step"], rel=1e-12)
    assert metrics["offered_per_step"]["mean"] == pytest.approx(replayed["offered_per_step"], rel=1e-12)
    assert replayed["offered_over_served"] > 1.05 and "OVERLOAD" in out


TENANT_LOG = Path(__file__).resolve().parents[1] / "examples" / "tenant_log.csv"


def _compare_rows(tmp_path, log, *flags):
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    assert cli.main(["compare", str(log), "--policies", "fcfs,vtc", "--kv-budget", "4096", "--out", str(out),
                     "--no-plots", "--no-cache", *flags]) == 0
    return [(r["label"], r["metrics"], r["clients"]) for r in json.loads((out / "results.json").read_text())["rows"]]


def test_compare_log_row_order_is_no_input(tmp_path):
    header, *rows = TENANT_LOG.read_text().splitlines()
    by_time = sorted(rows, key=lambda r: float(r.split(",")[0]))
    shuffled = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
    (tmp_path / "sorted.csv").write_text("\n".join([header, *by_time]) + "\n")
    (tmp_path / "shuffled.csv").write_text("\n".join([header, *shuffled]) + "\n")
    want = _compare_rows(tmp_path, tmp_path / "sorted.csv", "--seeds", "2")
    assert _compare_rows(tmp_path, tmp_path / "shuffled.csv", "--seeds", "2") == want
    assert _compare_rows(tmp_path, TENANT_LOG, "--seeds", "2") == want  # the example has 6 rows out of time order


def test_compare_prompt_over_m_is_dropped_and_counted(tmp_path, capsys):
    """A prompt past M was refused with the whole run (issue 47, item 4); an engine's API
    rejects that request and serves the rest: one note counts it, tenant a's request runs
    (b, whose only request it was, is gone from the report)."""
    log = tmp_path / "log.csv"
    log.write_text("timestamp,tenant,prompt,output\n1.0,a,10,5\n2.0,b,5000,5\n")
    assert cli._main(["compare", str(log), "--kv-budget", "4096", "--out", str(tmp_path / "o"), "--no-cache",
                      "--no-plots"]) == 0
    out = capsys.readouterr()
    assert ("note: dropped 1 of 2 requests whose prompt exceeds the server's memory of 4,096 tokens (longest: 5,000)"
            in out.err.splitlines())
    result = json.loads((tmp_path / "o" / "results.json").read_text())
    assert result["config"]["tenants"] == ["a"]
