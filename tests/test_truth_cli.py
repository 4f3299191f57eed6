"""The CLI's numbers and flags tell the truth: the load line, the 2U bound, the log reader,
gen's patterns, compare's options and outputs (issue "Every number tells the truth")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vtc_jax.cli import commands as cli
from vtc_jax.cli.compare import read_log
from vtc_jax.core.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def _write(path, text):
    path.write_text(text)
    return path


def _replay(capsys, *args):
    code = cli.main(["replay", *(str(a) for a in args), "--no-cache"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_light_log_with_a_long_last_request_is_not_overloaded(tmp_path, capsys):
    # one request every 100 steps, each served at once (waits 0); the last one decodes 400
    # steps, so served per step over the drained run is ~1.4x below offered over the span
    rows = "".join(f"{100 * i},{i % 2},20,{400 if i == 9 else 30}\n" for i in range(10))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    details = tmp_path / "d.json"
    code, out, _ = _replay(capsys, trace, "--policy", "vtc", "--kv-budget", "4096", "--details", details)
    assert code == 0 and "OVERLOAD" not in out
    load = json.loads(details.read_text())["load"]
    assert load["waiting_at_span_end"] == 0 and load["waiting_at_end"] == 0
    # served over the span is the service of steps [0, 901): the same run stopped there
    code, _, _ = _replay(capsys, trace, "--policy", "vtc", "--kv-budget", "4096", "--steps", "901",
                         "--details", tmp_path / "s.json")
    stopped = json.loads((tmp_path / "s.json").read_text())["load"]
    assert load["served_per_step"] == pytest.approx(stopped["served_per_step"], rel=1e-12)
    assert load["offered_per_step"] == pytest.approx(stopped["offered_per_step"], rel=1e-12)


def test_a_burst_that_queues_is_still_overloaded(tmp_path, capsys):
    # 40 requests at step 0 on M = 1000: most queue behind the first few
    rows = "".join(f"0,{i % 2},200,40\n" for i in range(40))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    details = tmp_path / "d.json"
    code, out, _ = _replay(capsys, trace, "--policy", "fcfs", "--kv-budget", "1000", "--details", details)
    load = json.loads(details.read_text())["load"]
    assert code == 0 and "OVERLOAD" in out
    assert load["waiting_at_span_end"] == 35 and load["offered_over_served"] > 3


def test_replay_prints_2u_and_the_guarantee_ratio(tmp_path, capsys):
    # two clients both backlogged from step 0; M = 300, prompts 100: U = max(1 * 100, 2 * 300)
    rows = "".join(f"0,{i % 2},100,{20 + 10 * (i % 2)}\n" for i in range(12))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    out_json, details = tmp_path / "o.json", tmp_path / "d.json"
    code, out, _ = _replay(capsys, trace, "--policy", "vtc", "--kv-budget", "300", "--json", out_json,
                           "--details", details)
    assert code == 0
    o, d = json.loads(out_json.read_text()), json.loads(details.read_text())
    assert o["bound_2u"] == d["bound_2u"] == 1200
    assert o["max_drift_over_2u"] == pytest.approx(o["max_drift"] / 1200)
    assert d["backlogged_drift_over_2u"] == pytest.approx(d["backlogged_drift"] / 1200)
    assert "drift_over_2u" not in o  # the ambiguous name is gone
    assert "x VTC's bound 2U = 1200" in out


def test_compare_reports_2u_and_both_ratios_by_explicit_names(tmp_path, capsys):
    rows = "".join(f"0,{i % 2},100,{20 + 10 * (i % 2)}\n" for i in range(12))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    code = cli.main(["compare", str(trace), "--policies", "fcfs,vtc", "--kv-budget", "300", "--out",
                     str(tmp_path / "out"), "--no-plots", "--no-cache"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"read {trace} (trace): 12 requests, 2 tenants")
    assert "bound_2u" in lines[1] and "backlogged_drift_over_2u" in out
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    for row in result["rows"]:
        m = {k: v["mean"] for k, v in row["metrics"].items()}
        assert m["bound_2u"] == 1200 and "drift_over_2u" not in m
        assert m["backlogged_drift_over_2u"] == pytest.approx(m["backlogged_drift"] / 1200)
        assert m["max_drift_over_2u"] == pytest.approx(m["max_drift"] / 1200)


def test_drift_over_2u_is_not_reported_with_unequal_weights(tmp_path, capsys):
    """With weights 1,2 VTC bounds W_k / w_k; the raw drifts measured are not bounded, and a
    ratio to 2U read as VTC at 3.95x its bound on the README's weighted example."""
    rows = "".join(f"0,{i % 2},100,{20 + 10 * (i % 2)}\n" for i in range(12))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    code = cli.main(["compare", str(trace), "--policies", "vtc", "--kv-budget", "300", "--weights", "1,2",
                     "--out", str(tmp_path / "out"), "--no-plots", "--no-cache"])
    capsys.readouterr()
    assert code == 0
    m = json.loads((tmp_path / "out" / "results.json").read_text())["rows"][0]["metrics"]
    assert m["bound_2u"]["mean"] == 1200 and m["backlogged_drift"]["mean"] > 0
    assert m["backlogged_drift_over_2u"]["mean"] is None and m["max_drift_over_2u"]["mean"] is None


@pytest.mark.parametrize("header, words", [
    ("timestamp,tenant,prompt,output,cachd", "unexpected column 'cachd'"),  # a typo: hits would read as 0
    ("timestamp,tenant,prompt,output,prompt", "duplicate column"),  # which prompt?
])
def test_log_reader_refuses_unknown_and_repeated_columns(tmp_path, header, words):
    log = _write(tmp_path / "log.csv", f"{header}\n1.0,a,30,4,7\n")
    with pytest.raises(InputError) as err:
        read_log(log, 0.025)
    line = str(err.value)
    assert line.startswith(f"{log}: ") and words in line and header.split(",")[-1] in line
    assert "\n" not in line


@pytest.mark.parametrize("pattern, bad", [("silence:1:10.5", "10.5"), ("silence:0.5:10.7", "0.5"),
                                          ("on_off:2.5", "2.5")])
def test_gen_refuses_fractional_steps_in_patterns(tmp_path, capsys, pattern, bad):
    # these once ran as something else: all 6000 steps silent, no silence at all, period 2
    code = cli.main(["gen", "--out", str(tmp_path / "g.csv"), "--tenant", f"rate=0.1,pattern={pattern}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "whole steps" in err and repr(bad) in err and pattern in err
    assert not (tmp_path / "g.csv").exists()


def test_gen_help_says_pattern_steps_are_whole(capsys):
    with pytest.raises(SystemExit):
        cli.main(["gen", "--help"])
    assert "whole steps" in " ".join(capsys.readouterr().out.split())


def test_gen_silence_covers_exactly_its_steps(tmp_path, capsys):
    out = tmp_path / "g.csv"
    assert cli.main(["gen", "--out", str(out), "--steps", "300", "--tenant", "rate=2,pattern=silence:100:200"]) == 0
    arrivals = [int(line.split(",")[0]) for line in out.read_text().splitlines()[1:]]
    assert not any(100 <= a < 200 for a in arrivals)
    assert any(a < 100 for a in arrivals) and any(a >= 200 for a in arrivals)


def test_policies_lists_a_policy_module(capsys):
    module = ROOT / "examples" / "my_policy.py"
    assert cli.main(["policies", "--policy-module", str(module)]) == 0
    out = capsys.readouterr().out
    assert "round_robin" in out and f"from {module}" in out and "vtc " in out  # built-ins listed too


def test_compare_applies_an_option_to_the_policies_that_have_it(tmp_path, capsys):
    rows = "".join(f"{3 * i},{i % 2},50,{10 + i % 3}\n" for i in range(10))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    base = ["compare", str(trace), "--policies", "drr,las", "--kv-budget", "200", "--no-plots", "--no-cache"]
    assert cli.main(base + ["--option", "quantum=8", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "note: --option quantum does not apply to las" in err
    result = json.loads((tmp_path / "a" / "results.json").read_text())
    options = {r["label"]: r["setting"].get("options") for r in result["rows"]}
    assert "quantum" in str(options["drr"]) and "quantum" not in str(options["las"])
    # an option no listed policy has is refused before the run, naming it
    code = cli.main(base + ["--option", "quantumm=8", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--option quantumm" in err and "drr, las" in err
    assert not (tmp_path / "b" / "results.json").exists()


def test_compare_writes_results_and_plots_as_one_set(tmp_path, capsys, monkeypatch):
    rows = "".join(f"{3 * i},{i % 2},50,{10 + i % 3}\n" for i in range(10))
    trace = _write(tmp_path / "t.csv", "arrival,client,prompt,output\n" + rows)
    out = tmp_path / "out"

    def full_disk(result, names, path):
        raise OSError(28, "No space left on device")

    from vtc_jax.driver import sweep_outputs

    monkeypatch.setattr(sweep_outputs, "draw_tenants", full_disk)
    code = cli.main(["compare", str(trace), "--policies", "fcfs,vtc", "--kv-budget", "200", "--out", str(out),
                     "--no-cache"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "tenants.png" in err and "No space left" in err
    assert sorted(p.name for p in out.iterdir()) == []  # no results without plots, no temporaries


def test_replay_refuses_json_and_details_on_one_file(tmp_path, capsys, monkeypatch):
    _write(tmp_path / "t.csv", "arrival,client,prompt,output\n0,0,10,3\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = _replay(capsys, "t.csv", "--policy", "vtc", "--kv-budget", "100", "--json", "x.json",
                             "--details", f"../{tmp_path.name}/x.json")  # the same file, spelled two ways
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "same output file" in err
    assert not (tmp_path / "x.json").exists()


def test_tenant_wait_panel_draws_zero_waits(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    closed = []
    monkeypatch.setattr(plt, "close", lambda fig=None: closed.append(fig))
    clients = {"served_share": [0.5, 0.5], "offered_share": [0.5, 0.5], "wait_p99": [0.0, 0.0]}
    result = {"rows": [{"label": "vtc", "clients": clients}]}
    from vtc_jax.driver import sweep_outputs

    sweep_outputs.draw_tenants(result, ["a", "b"], tmp_path / "t.png")
    waits = closed[0].axes[1]
    y = waits.lines[0].get_ydata()
    assert list(y) == [0.0, 0.0]  # drawn, not NaN
    low, high = waits.get_ylim()
    assert low <= 0 <= high  # and inside the visible range
    assert (tmp_path / "t.png").stat().st_size > 0


@pytest.mark.parametrize("text", ["arrival,client,prompt,output\n0,0,10,3\n1,1,500,3\n",
                                  "timestamp,tenant,prompt,output\n0,a,10,3\n1,b,500,3\n"])
def test_prompt_larger_than_m_is_dropped_with_a_note(tmp_path, capsys, text):
    """A prompt past M is rejected and counted (one note), the rest served (issue 47, item 4:
    the whole run was refused for it); a log of only such prompts is refused in one line."""
    log = _write(tmp_path / "log.csv", text)
    code = cli.main(["compare", str(log), "--policies", "vtc", "--kv-budget", "100", "--out", str(tmp_path / "o"),
                     "--no-cache", "--no-plots"])
    err = capsys.readouterr().err
    assert code == 0
    assert "note: dropped 1 of 2 requests whose prompt exceeds the server's memory of 100 tokens (longest: 500)" in err
    only = _write(tmp_path / "only.csv", text.splitlines()[0] + "\n" + text.splitlines()[2] + "\n")
    code = cli.main(["compare", str(only), "--policies", "vtc", "--kv-budget", "100", "--out", str(tmp_path / "o"),
                     "--no-cache"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"vtc_jax: error: {only}: every request's prompt exceeds the server's memory of 100 tokens")
