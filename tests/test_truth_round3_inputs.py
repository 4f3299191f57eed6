"""The readers tell the truth (round 3): a request keeps its data row through every filter,
a request that can never fit the server's memory is dropped and counted (not the whole
run refused), one file given twice is refused, a log has one request rate (n / span), and
tenant names that would read ambiguously in a printed list are quoted."""

from __future__ import annotations

import argparse
import csv

import pytest

from vtc_jax.cli import input_flags
from vtc_jax.cli.commands import main
from vtc_jax.core.errors import InputError
from vtc_jax.inputs import request_log as rl
from vtc_jax.inputs.request_log import read_requests, windowed

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
LOG_HEADER = "timestamp,tenant,prompt,output\n"


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{**input_flags.DEFAULTS, **kw})


# ---- item 3: a request's data row survives every filter -----------------------------------

def test_burstgpt_failed_rows_keep_the_other_rows_numbers(tmp_path):
    """Data rows 0 and 2 failed (0 response tokens) and are dropped: the kept requests are
    data rows 1, 3, 4 of the file (the old reader renumbered them 0, 1, 2)."""
    path = _write(tmp_path, "bg.csv", BURST_HEADER + "0,ChatGPT,5,0,5,API log\n1,ChatGPT,6,2,8,API log\n"
                  "2,GPT-4,7,0,7,API log\n3,GPT-4,8,3,11,API log\n\n4,ChatGPT,9,4,13,API log\n")
    log = read_requests([path])
    assert log.prompt.tolist() == [6, 8, 9] and log.lines.tolist() == [3, 5, 7]  # line 6 is blank
    assert input_flags.file_rows(log).tolist() == [1, 3, 4]


def test_time_window_keeps_the_data_rows(tmp_path):
    """Rows in file order at 3, 0, 1, 5, 2 s; the window [1, 3) s keeps the requests at 1 and
    2 s (data rows 2 and 4), re-based to 0 and 1 s; the old reader numbered them 0, 1."""
    path = _write(tmp_path, "l.csv", LOG_HEADER + "3,a,1,1\n0,b,2,1\n1,c,3,1\n5,a,4,1\n2,a,5,1\n")
    log = read_requests([path])
    assert input_flags.file_rows(log).tolist() == [1, 2, 4, 0, 3]  # time order: 0, 1, 2, 3, 5 s
    win = windowed(log, 1, 2)
    assert win.prompt.tolist() == [3, 5] and win.arrival.tolist() == [0, 10**9]
    assert win.tenants == ("c", "a") and win.client.tolist() == [0, 1]
    assert input_flags.file_rows(win).tolist() == [2, 4]
    args = _args(log_paths=[str(path)], log=None, time_window=(1, 2))
    assert input_flags.file_rows(input_flags.read_input(args)).tolist() == [2, 4]


def test_several_files_count_on_with_the_dropped_rows(tmp_path):
    """Two BurstGPT files: the first has 3 data rows (its row 1 failed), so the second's data
    rows are 3 and 4; merged in time order."""
    one = _write(tmp_path, "one.csv", BURST_HEADER + "0,ChatGPT,5,1,6,API log\n1,ChatGPT,6,0,6,API log\n"
                 "4,ChatGPT,7,1,8,API log\n")
    two = _write(tmp_path, "two.csv", BURST_HEADER + "2,GPT-4,8,1,9,API log\n3,GPT-4,9,1,10,API log\n")
    log = read_requests([one, two])
    assert log.prompt.tolist() == [5, 8, 9, 7]
    assert input_flags.file_rows(log).tolist() == [0, 3, 4, 2]


def test_requests_out_row_is_the_files_row_after_window_and_failures(tmp_path, capsys):
    """compare --server vllm --requests-out on a BurstGPT file whose data row 0 failed and
    whose row 1 (at 0 s) falls before --time-window 100,10: the one request run is data row
    2 (at 100.5 s, re-based to 0), and the CSV says row 2 (it said 0). Its times are
    tests/test_timed.py's hand-worked request (prompt 100, output 3 on qwen2.5-7b-h100):
    first token at 13,685 us, finish at 27,839 us."""
    path = _write(tmp_path, "bg.csv", BURST_HEADER + "0,ChatGPT,50,0,50,API log\n0,ChatGPT,100,3,103,API log\n"
                  "100.5,ChatGPT,100,3,103,API log\n")
    out, requests = tmp_path / "out", tmp_path / "requests.csv"
    argv = ["compare", str(path), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--policies", "fcfs", "--out",
            str(out), "--requests-out", str(requests), "--time-window", "100,10", "--no-cache"]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"read {path} (burstgpt): 1 request, 1 tenant (bg 1)")
    assert "skipped 1 failed requests (0 response tokens)" in first
    rows = list(csv.DictReader(requests.open()))
    assert [(r["row"], r["arrival_us"], r["first_token_us"], r["finish_us"]) for r in rows] == [
        ("2", "0", "13685", "27839")]


# ---- item 4: a request that can never fit is dropped and counted --------------------------

def test_drop_unservable_hand_made(tmp_path, capsys):
    """Prompts 10, 100, 20, 200, 30 (tenants a, b, a, c, b) against a memory of 50 tokens:
    data rows 1 and 3 are dropped (one note, longest 200), rows 0, 2, 4 run at their own
    times (no re-basing); tenant c has no request left, so the tenants are a, b; the summary
    counts the two."""
    path = _write(tmp_path, "l.csv", LOG_HEADER + "0,a,10,1\n1,b,100,1\n2,a,20,1\n3,c,200,1\n4,b,30,1\n")
    args = _args(log_paths=[str(path)], log=None)
    log = input_flags.read_input(args)
    kept = input_flags.drop_unservable(args, log, 50)
    assert capsys.readouterr().err == ("note: dropped 2 of 5 requests whose prompt exceeds the server's memory of 50 "
                                       "tokens (longest: 200)\n")
    assert kept.prompt.tolist() == [10, 20, 30] and kept.arrival.tolist() == [0, 2 * 10**9, 4 * 10**9]
    assert input_flags.file_rows(kept).tolist() == [0, 2, 4] and kept.lines.tolist() == [2, 4, 6]
    assert kept.tenants == ("a", "b") and kept.client.tolist() == [0, 0, 1]
    assert args.input_log is kept
    input_flags.announce(args)
    assert capsys.readouterr().out == (f"read {path} (log): 3 requests, 2 tenants (a 2, b 1), span 4.0 s, 0.75 requests/s,"
                                       " prompt mean 20, output mean 1, skipped 2 requests whose prompt exceeds the "
                                       "server's memory of 50 tokens\n")


def test_drop_unservable_keeps_rows_after_other_filters(tmp_path, capsys):
    """BurstGPT's failed row 0 and a too-long row 2 both dropped: the kept are data rows 1 and
    3, and the summary counts both reasons."""
    path = _write(tmp_path, "bg.csv", BURST_HEADER + "0,ChatGPT,5,0,5,API log\n1,ChatGPT,6,2,8,API log\n"
                  "2,GPT-4,700,1,701,API log\n3,GPT-4,8,3,11,API log\n")
    args = _args(log_paths=[str(path)], log=None)
    kept = input_flags.drop_unservable(args, input_flags.read_input(args), 699)
    assert input_flags.file_rows(kept).tolist() == [1, 3] and kept.prompt.tolist() == [6, 8]
    assert "dropped 1 of 3 requests whose prompt exceeds the server's memory of 699 tokens (longest: 700)" in \
        capsys.readouterr().err
    assert kept.summary().endswith("skipped 1 failed requests (0 response tokens), skipped 1 requests whose prompt "
                                   "exceeds the server's memory of 699 tokens")


def test_drop_unservable_nothing_to_drop_and_everything(tmp_path, capsys):
    """A prompt equal to the memory fits (no note, the same log back); every prompt over it is
    one line of refusal naming the file, the limit and the shortest prompt."""
    path = _write(tmp_path, "l.csv", LOG_HEADER + "0,a,50,1\n1,b,60,1\n")
    args = _args(log_paths=[str(path)], log=None)
    log = input_flags.read_input(args)
    assert input_flags.drop_unservable(args, log, 60) is log and capsys.readouterr().err == ""
    with pytest.raises(InputError) as err:
        input_flags.drop_unservable(args, log, 49)
    assert str(err.value) == (f"{path}: every request's prompt exceeds the server's memory of 49 tokens (shortest: 50):"
                              " nothing to run")
    assert capsys.readouterr().err == ""


def test_servable_trace_keeps_client_ids(tmp_path):
    """A trace's integer clients are ids: dropping client 0's only request keeps 1 as 1."""
    path = _write(tmp_path, "t.csv", "arrival,client,prompt,output\n0,0,900,1\n1,1,5,1\n")
    kept, dropped = rl.servable(read_requests([path]), 512)
    assert dropped == 1 and kept.client.tolist() == [1] and kept.tenants == ("0", "1")
    assert kept.steps_trace().client.tolist() == [1] and input_flags.file_rows(kept).tolist() == [1]


# ---- item 5: one file twice, one rate, quoted names ---------------------------------------

def test_the_same_file_twice_is_refused(tmp_path):
    path = _write(tmp_path, "l.csv", LOG_HEADER + "0,a,1,1\n1,a,1,1\n")
    (tmp_path / "link.csv").symlink_to(path)
    with pytest.raises(InputError) as err:
        read_requests([path, path])
    assert str(err.value) == f"{path}: given twice: each of its requests would be read twice; give it once"
    with pytest.raises(InputError, match=r"link.csv: given twice \(the same file as .*l.csv\)"):
        read_requests([path, tmp_path / "link.csv"])
    other = _write(tmp_path, "m.csv", LOG_HEADER + "0,b,1,1\n")
    assert len(read_requests([path, other])) == 3  # two files with one content each are fine


@pytest.mark.parametrize("command", [["gen", "--from", "L", "L", "--out", "OUT/t.csv"],
                                     ["compare", "L", "L", "--kv-budget", "1000", "--out", "OUT", "--no-plots", "--no-cache"]])
def test_the_same_file_twice_through_the_commands(tmp_path, capsys, command):
    """gen --from l.csv l.csv and compare l.csv l.csv: one line, exit 2, nothing written."""
    path = _write(tmp_path, "l.csv", LOG_HEADER + "0,a,1,1\n1,a,1,1\n")
    (tmp_path / "o").mkdir()
    argv = [str(path) if x == "L" else x.replace("OUT", str(tmp_path / "o")) for x in command]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and f"{path}: given twice" in captured.err
    assert list((tmp_path / "o").iterdir()) == []


def test_one_request_rate(tmp_path):
    """10 requests over 2 s: 5.00 requests/s (n / span, vllm bench serve's request rate and
    compare's load line), not (n - 1) / span = 4.50; a trace's 4 requests over 8 steps: 0.50
    requests/step."""
    path = _write(tmp_path, "l.csv", LOG_HEADER + "".join(f"{i * 2 / 9:.10f},a,1,1\n" for i in range(10)))
    assert ", span 2.0 s, 5.00 requests/s," in read_requests([path]).summary()
    trace = _write(tmp_path, "t.csv", "arrival,client,prompt,output\n0,0,1,1\n2,0,1,1\n5,0,1,1\n8,0,1,1\n")
    assert ", span 8 steps, 0.50 requests/step," in read_requests([trace]).summary()
    one = _write(tmp_path, "one.csv", LOG_HEADER + "7,a,1,1\n")
    assert ", span 0.0 s, prompt mean 1" in read_requests([one]).summary()
    assert rl.request_rate(10, 2.0) == 5.0 and rl.request_rate(1, 0.0) is None and rl.request_rate(3, 0) is None


def test_the_unit_check_reads_the_same_rate(tmp_path):
    """100 requests 61 s apart (span 6,039 s): 100 / 6,039 = 0.01656 requests/s, under 1 per
    minute, refused as implausible seconds with that rate."""
    slower = _write(tmp_path, "slower.csv", LOG_HEADER + "".join(f"{i * 61},a,1,1\n" for i in range(100)))
    with pytest.raises(InputError, match=r"spans 6,039.0 s at 0.01656 requests/s, implausible"):
        read_requests([slower])


def test_shown_name():
    assert [rl.shown_name(x) for x in ("a", "GPT-4", "a,b", "x=y", "p q", "", 'say "hi"', "tab\there")] == [
        "a", "GPT-4", '"a,b"', '"x=y"', '"p q"', '""', '"say ""hi"""', '"tab\there"']


def test_gen_quotes_names_that_would_read_ambiguously(tmp_path, capsys):
    """Tenants `a,b`, `c` and `x=y`: gen --from prints clients 0="a,b", 1=c, 2="x=y" (it
    printed 0=a,b, 1=c, 2=x=y), and the summary line quotes them the same way."""
    path = _write(tmp_path, "l.csv", LOG_HEADER + '0,"a,b",1,1\n1,c,1,1\n2,x=y,1,1\n3,"a,b",1,1\n')
    out = tmp_path / "t.csv"
    assert main(["gen", "--from", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f'read {path} (log): 4 requests, 3 tenants ("a,b" 2, c 1, "x=y" 1)')
    assert printed[1].endswith('; clients 0="a,b", 1=c, 2="x=y"')
    assert [r["client"] for r in csv.DictReader(out.open())] == ["0", "1", "2", "0"]


def test_gen_quotes_a_prefix_id_cell_that_holds_a_comma(tmp_path, capsys):
    """A log's prefix_id `p,1` (quoted in its CSV) is written quoted in gen's trace (it was
    written bare, so the row had one field too many and the trace could not be read back):
    the trace reads back with the same prefix ids."""
    path = _write(tmp_path, "l.csv", 'timestamp,tenant,prompt,output,prefix_id,prefix_len\n0,a,8,1,"p,1",4\n'
                  '1,b,9,1,"say ""x""",0\n')
    out = tmp_path / "t.csv"
    assert main(["gen", "--from", str(path), "--out", str(out), "--step-seconds", "1"]) == 0
    assert out.read_text() == ('arrival,client,prompt,output,cached,prefix_id,prefix_len\n0,0,8,1,0,"p,1",4\n'
                               '1,1,9,1,0,"say ""x""",0\n')
    assert read_requests([out]).prefix_id == ("p,1", 'say "x"')


def test_servable_labelled_trace_renumbers_its_tenants(tmp_path):
    """A trace with named clients (x, y, x): dropping y's only request leaves one tenant, x."""
    path = _write(tmp_path, "t.csv", "arrival,client,prompt,output\n0,x,5,1\n1,y,900,1\n2,x,6,1\n")
    kept, dropped = rl.servable(read_requests([path]), 512)
    assert dropped == 1 and kept.tenants == ("x",) and kept.client.tolist() == [0, 0]
    assert input_flags.file_rows(kept).tolist() == [0, 2]


def test_gen_keeps_sessions_and_hash_chains(tmp_path, capsys):
    """gen --from writes a log's session_id and hash_ids columns (it dropped them, so the
    converted trace lost its prefix identity); two files' sessions and chains stay apart
    (both files use session s and hash id 7: file 1's become 1:s and a new dense id)."""
    a = _write(tmp_path, "a.csv", "timestamp,tenant,prompt,output,session_id\n0,t,10,5,s\n1,t,20,5,s\n")
    b = _write(tmp_path, "b.csv", "timestamp,tenant,prompt,output,session_id\n0.5,u,10,5,s\n")
    out = tmp_path / "t.csv"
    assert main(["gen", "--from", str(a), "--out", str(out), "--step-seconds", "1"]) == 0
    assert out.read_text() == "arrival,client,prompt,output,cached,session_id\n0,0,10,5,0,s\n1,0,20,5,0,s\n"
    assert main(["gen", "--from", str(a), str(b), "--out", str(out), "--step-seconds", "1"]) == 0
    assert [r["session_id"] for r in csv.DictReader(out.open())] == ["0:s", "1:s", "0:s"]
    c = _write(tmp_path, "c.csv", "timestamp,tenant,prompt,output,hash_ids\n0,t,8,1,7|9\n1,t,8,1,7\n")
    d = _write(tmp_path, "d.csv", "timestamp,tenant,prompt,output,hash_ids\n0.5,t,8,1,7|9\n")
    assert main(["gen", "--from", str(c), "--out", str(out), "--step-seconds", "1", "--hash-block", "4"]) == 0
    assert [r["hash_ids"] for r in csv.DictReader(out.open())] == ["7|9", "7"]
    assert read_requests([out], hash_block=4).hash_ids == ((7, 9), (7,))
    assert main(["gen", "--from", str(c), str(d), "--out", str(out), "--step-seconds", "1", "--hash-block", "4"]) == 0
    assert [r["hash_ids"] for r in csv.DictReader(out.open())] == ["0|1", "2|3", "0"]
    capsys.readouterr()


def test_a_server_without_prefix_cache_runs_a_trace_with_sessions(tmp_path, capsys):
    """A trace in steps with a session_id column on the ideal server: it runs, with a note
    that the prefix identity is not read (it was refused as an 'unexpected column ... read by
    --server vllm')."""
    path = _write(tmp_path, "t.csv", "arrival,client,prompt,output,session_id\n0,0,10,5,s\n3,0,20,5,s\n")
    assert main(["compare", str(path), "--kv-budget", "100", "--policies", "fcfs", "--out", str(tmp_path / "o"),
                 "--no-plots"]) == 0
    assert "session_id column(s) (prefix identity) are not read by this run" in capsys.readouterr().err
