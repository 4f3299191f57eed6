"""sweeps.gpu_time: the log it draws, its bad input (one line, exit 2), and a tiny run
whose outputs agree with each other."""

from __future__ import annotations

import csv
import json
from decimal import Decimal

import pytest

from sweeps import gpu_time
from tests.helpers import run_main


def _args(*argv):
    return gpu_time.build_parser().parse_args(list(argv))


def test_log_is_exact_balanced_and_reproducible():
    args = _args("--requests", "400", "--rate", "2", "--log-seed", "3")
    rows = gpu_time.make_log(args)
    assert rows == gpu_time.make_log(args) and len(rows) == 400
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    names = gpu_time.tenants(3)
    assert names == ["rag", "chat-a", "chat-b", "chat-c"] and {r[1] for r in rows} == set(names)
    for _, name, prompt, output in rows:
        lo_p, lo_o = ((8000, 16000), (50, 150)) if name == "rag" else ((100, 800), (100, 400))
        assert lo_p[0] <= prompt <= lo_p[1] and lo_o[0] <= output <= lo_o[1]
    counts = [sum(r[1] == t for r in rows) for t in names]
    assert min(counts) > 60  # 100 each expected: the tenants offer the same rate
    # 400 requests at 4 x 2 requests/s: about 50 s
    assert 40e6 < rows[-1][0] < 60e6
    text = gpu_time.log_text(rows).splitlines()
    assert text[0] == "timestamp,tenant,prompt,output" and len(text) == 401
    assert all(int(Decimal(line.split(",")[0]) * 10**6) == r[0] for line, r in zip(text[1:], rows))


@pytest.mark.parametrize("argv, words", [
    (["--requests", "1"], "--requests"),
    (["--long-prompt", "900:800"], "LO <= HI"),
    (["--short-output", "a:b"], "LO:HI"),
    (["--rate", "nan"], "finite"),
    (["--preset", "no-such-model"], "--preset"),
    (["--num-gpu-blocks", "100"], "does not fit"),
    (["--share-window", "half"], "--share-window"),
    (["--seeds", "0"], "--seeds"),
    (["--turbo"], "unrecognized arguments"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, words):
    code, out, err = run_main(capsys, gpu_time.main, argv + ["--out", str(tmp_path / "out")])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sweeps.gpu_time: error:"), err
    assert words in lines[0] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_unwritable_out_is_refused_before_any_run(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, _, err = run_main(capsys, gpu_time.main, ["--out", str(tmp_path / "file" / "out")])
    assert code == 2 and "cannot write" in err and "[gpu_time] compare" not in err


def test_a_tiny_run_writes_a_consistent_set(tmp_path, capsys):
    """A burst of 40 requests (40 requests/s per tenant: all within about 0.25 s) on 4
    seats, 2 seeds, shares over the drained run (two compares): every file; each row x
    tenant once; every request finished; TTFT p50 <= p99; the shares of GPU time of each
    row that has them add up to 1 (the charged time's truncation: under 1 us a slot a step,
    far below 1e-3 of the total). And rag's median TTFT is lower under VTC charged in GPU
    time than in tokens: in tokens each rag admission charges its 8k-16k prompt tokens, as
    much as a dozen chat requests (prompt + 2 x output, about 1,000), so once every
    tenant is queued rag's next request waits until the chats' counters catch up, nearly
    until they drain; in GPU time a rag request costs about what a chat request costs (its
    prefill is about 2-4 us a token, a decode step's fixed ~6.8 ms is split over the 4
    seats), so rag is served about as often as each chat tenant."""
    out = tmp_path / "out"
    argv = ["--requests", "40", "--rate", "40", "--max-num-seqs", "4", "--seeds", "2"]
    code, stdout, err = run_main(capsys, gpu_time.main, argv + ["--share-window", "all", "--out", str(out)])
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_time.OUTPUTS)
    result = json.loads((out / "results.json").read_text())
    names = result["config"]["tenants"]
    assert [r["row"] for r in result["rows"]] == ["fcfs", "vtc-tokens", "vtc-time"]
    assert sum(result["config"]["requests_per_tenant"].values()) == 40
    with open(out / "results.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [(r["row"], r["tenant"]) for r in table] == [(row, t) for row in ("fcfs", "vtc-tokens", "vtc-time")
                                                        for t in names]
    for r in result["rows"]:
        assert r["unfinished_drained"] == 0
        served = [t for t in names if result["config"]["requests_per_tenant"][t]]
        for t in served:
            v = r["tenants"][t]
            assert v["finished_in_window"] == 1.0
            assert 0 < v["ttft_p50_ms"]["mean"] <= v["ttft_p99_ms"]["mean"]
        shares = [r["tenants"][t]["gpu_share"]["mean"] for t in names]
        if r["gpu_share_source"] == "n/a":
            assert shares == [None] * len(names)
        else:
            assert all(s >= 0 for s in shares) and sum(shares) == pytest.approx(1, abs=1e-3)
    # the time-charged rows report a share today (their charge is GPU time), whatever compare adds
    assert {r["row"]: r["gpu_share_source"] != "n/a" for r in result["rows"]} in (
        {"fcfs": True, "vtc-tokens": False, "vtc-time": True}, {"fcfs": True, "vtc-tokens": True, "vtc-time": True})
    assert "| vtc-time" in stdout and (out / "results.md").read_text().count("| vtc-tokens ") == len(names)
    assert (out / "ttft_gpu_share.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "log.csv").read_text() == gpu_time.log_text(gpu_time.make_log(_args(*argv)))
    rag = {r["row"]: r["tenants"]["rag"]["ttft_p50_ms"]["mean"] for r in result["rows"]}
    assert rag["vtc-time"] < rag["vtc-tokens"]
