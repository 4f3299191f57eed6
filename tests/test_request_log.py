"""The one reader layer (inputs/request_log.py, request_formats.py): every public format read
exactly (hand-worked cases and the shipped files' measured counts and spans), the old
readers' results reproduced, and hostile files refused with one line naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.inputs import request_formats as rf
from vtc_jax.inputs.request_log import (FORMATS, MAX_TENANTS, TIME_UNITS, detect_format, parse_split, prefix_fidelity,
                                        read_requests)
from tests.legacy_readers import read_server_trace
from vtc_jax.inputs.workload import read_trace_csv

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "data" / "azure_llm_2023"
MOONCAKE = ROOT / "data" / "mooncake_fast25"
CONV, CODE = AZURE / "AzureLLMInferenceTrace_conv.csv", AZURE / "AzureLLMInferenceTrace_code.csv"
TENANT_LOG = ROOT / "examples" / "tenant_log.csv"
BURSTGPT = ROOT / "examples" / "burstgpt_sample.csv"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(tmp_path, name: str, text, mode: str = "w") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def same_trace(a, b) -> bool:
    """Every column and the file lines equal."""
    names = ("arrival", "client", "prompt", "output", "cached", "lines")
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in names) and a.source == b.source


def refused(paths, match: str, **kw) -> str:
    with pytest.raises(InputError, match=match) as err:
        read_requests(paths if isinstance(paths, list) else [paths], **kw)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_registry():
    assert FORMATS == ("trace", "log", "azure", "mooncake", "burstgpt", "servegen")
    assert TIME_UNITS == {"s": 10**9, "ms": 10**6, "us": 10**3}


# ---- the shipped public files: counts and spans measured by hand on the files ------------

def test_azure_shipped_files():
    conv, code = read_requests([CONV]), read_requests([CODE])
    assert (len(conv), len(code)) == (19_366, 8_819)
    # 19:14:08.4025270 - 18:15:46.6805900 and 19:14:19.9280160 - 18:17:03.9799600
    assert int(conv.arrival.max()) == 3_501_721_937_000 and int(code.arrival.max()) == 3_435_948_056_000
    assert conv.tenants == ("conv",) and conv.unit is None and conv.timed
    assert (int(conv.prompt[0]), int(conv.output[0])) == (374, 44) and int(conv.lines[0]) == 2
    both = read_requests([CONV, CODE])
    assert both.tenants == ("conv", "code") and np.bincount(both.client).tolist() == [19_366, 8_819]
    assert int(both.arrival.max()) == 3_513_247_426_000  # 19:14:19.9280160 - 18:15:46.6805900
    code_rows = both.file == 1
    assert int(both.arrival[code_rows].min()) == 77_299_370_000  # 18:17:03.9799600 - 18:15:46.6805900
    assert both.summary() == ("read " + f"{CONV}, {CODE}" + " (azure): 28,185 requests, 2 tenants (conv 19,366, code "
                              "8,819), span 3,513.2 s, 8.02 requests/s, prompt mean 1,434, output mean 154")


def test_mooncake_shipped_files():
    conv = read_requests([MOONCAKE / "conversation_trace.jsonl"])
    syn = read_requests([MOONCAKE / "synthetic_trace.jsonl"])
    assert (len(conv), len(syn)) == (12_031, 3_993)
    assert int(conv.arrival.max()) == 3_536_999_000_000 and int(syn.arrival.max()) == 1_022_025_000_000
    assert conv.unit == "ms" and conv.tenants == ("conversation_trace",)
    assert conv.columns == frozenset({"cached", "prefix_id", "prefix_len"})
    # the shared README: 37.4 % of prompt tokens in leading blocks already seen (unbounded cache)
    assert int(conv.cached.sum()) == 54_098_293 and int(conv.prompt.sum()) == 144_793_823
    assert len(set(conv.prefix_id)) == 7_373  # the README's prefix groups
    assert conv.prefix_id[0] == "0/1" and int(conv.prefix_len[0]) == 0  # group 0/1 has one request
    assert int(syn.cached.sum()) == 39_852_448
    assert prefix_fidelity(conv) == pytest.approx(0.9344, abs=1e-4)
    assert prefix_fidelity(syn) == pytest.approx(1.0008, abs=1e-4)


# ---- the old readers' results, reproduced ------------------------------------------------

def _random_log(rng, path) -> None:
    """A timestamped log with decimals of 0-9 fractional digits, ties, unsorted rows and
    tenants in any order."""
    rows = []
    for _ in range(rng.randint(1, 40)):
        t = f"{rng.randint(0, 5000)}" + (f".{rng.randint(0, 10**9 - 1):09d}"[:rng.randint(1, 10)] if rng.random() < 0.7
                                         else "")
        rows.append(f"{t},{rng.choice('abcde')},{rng.randint(1, 900)},{rng.randint(1, 300)}")
    if rng.random() < 0.3:
        rows += rows[: rng.randint(1, len(rows))]  # equal timestamps: the file's order decides
    path.write_text("timestamp,tenant,prompt,output\n" + "\n".join(rows) + "\n")


def test_steps_and_microseconds_equal_the_old_readers(tmp_path):
    """The layer reads what the commands' own readers read (tests/legacy_readers.py, kept
    verbatim), to the same integers: steps for every step length, microseconds, tenants."""
    import random

    from tests.legacy_readers import read_log, read_timed_log

    rng = random.Random(23)
    paths = [TENANT_LOG]
    for i in range(60):
        paths.append(tmp_path / f"r{i}.csv")
        _random_log(rng, paths[-1])
    for i, path in enumerate(paths):
        log = read_requests([path], time_unit="s")
        for step in (0.025, 0.001, 0.5, 1e-06, 3.0)[: 5 if i < 3 else 2]:
            try:
                old, names, _ = read_log(path, step)
            except InputError as err:  # both refuse a span past 2^30 steps
                assert "use a larger --step-seconds" in str(err)
                with pytest.raises(InputError, match="use a larger --step-seconds"):
                    log.steps_trace(step)
                continue
            assert same_trace(log.steps_trace(step), old) and list(log.tenants) == names, (path, step)
        us, tenant, names2, prompt, output, rows = read_timed_log(path)
        assert (log.arrival_us() == us).all() and (log.client == tenant).all() and list(log.tenants) == names2
        assert (log.prompt == prompt).all() and (log.output == output).all()
    assert (read_requests([TENANT_LOG]).steps_trace("0.025").arrival == read_log(TENANT_LOG, 0.025)[0].arrival).all()


def _trace_files():
    witnesses = sorted((ROOT / "docs" / "results").rglob("witnesses/*.csv"))[:6]
    return [ROOT / "examples" / "small_trace.csv"] + witnesses


@pytest.mark.parametrize("path", _trace_files(), ids=lambda p: p.name)
def test_trace_format_equals_read_trace_csv(path):
    log = read_requests([path])
    old = read_trace_csv(path)
    assert log.format == "trace" and not log.timed and log.unit is None
    assert same_trace(log.steps_trace(), old)
    assert log.tenants == tuple(str(k) for k in range(old.num_clients))
    assert log.span_seconds() is None


GOLDEN = sorted((ROOT / "tests" / "data").glob("vllm_golden*/[gm]0[01]*.csv"))


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_trace_format_equals_read_server_trace(path):
    log, old = read_requests([path]), read_server_trace(path)
    assert log.tenants == old.tenants and (log.client == old.tenant).all() and (log.arrival == old.arrival).all()
    assert (log.priority == old.priority).all() and (log.prefix_len == old.prefix_len).all()
    assert log.prefix_id == old.prefix_id and (log.lines == old.lines).all()


# ---- hand-worked cases per format --------------------------------------------------------

def test_log_hand_worked(tmp_path):
    path = write(tmp_path, "a.csv", "timestamp,tenant,prompt,output,cached\n"
                 "10.5,b,5,2,1\n\n10.25,a,3,4,0\n10.25,b,7,1,6\n11,c,2,2,0\n")
    log = read_requests([path])
    # time order, ties in file order; tenants by first appearance in time
    assert log.arrival.tolist() == [0, 0, 250_000_000, 750_000_000]
    assert log.tenants == ("a", "b", "c") and log.client.tolist() == [0, 1, 1, 2]
    assert log.prompt.tolist() == [3, 7, 5, 2] and log.cached.tolist() == [0, 6, 1, 0]
    assert log.lines.tolist() == [4, 5, 2, 6] and log.columns == frozenset({"cached"})
    assert log.steps_trace(0.25).arrival.tolist() == [0, 0, 1, 3]
    assert log.steps_trace("0.3").arrival.tolist() == [0, 0, 0, 2]
    assert log.arrival_us().tolist() == [0, 0, 250_000, 750_000]
    assert log.summary() == (f"read {path} (log): 4 requests, 3 tenants (b 2, a 1, c 1), span 0.8 s, 5.33 "
                             "requests/s, prompt mean 4, output mean 2")


def test_log_exact_decimals_and_units(tmp_path):
    # 0.1 + 0.2 is not 0.3 in floats; here every digit is kept
    path = write(tmp_path, "t.csv", "timestamp,tenant,prompt,output\n0.1,a,1,1\n0.3,a,1,1\n1e1,a,1,1\n"
                 "0.0000000019,a,1,1\n")
    log = read_requests([path])
    assert log.arrival.tolist() == [0, 99_999_998, 299_999_998, 9_999_999_998]
    ms = read_requests([path], time_unit="ms")
    assert ms.arrival.tolist() == [0, 99_999, 299_999, 9_999_999] and ms.unit == "ms" and ms.warning is None
    us = read_requests([path], time_unit="us")
    assert us.arrival.tolist() == [0, 99, 299, 9_999]


def test_log_priority_prefix_columns_and_tenant_from(tmp_path):
    path = write(tmp_path, "p.csv", "timestamp,tenant,user,prompt,output,priority,prefix_id,prefix_len\n"
                 "0,x,u1,10,1,-3,sys,4\n1,y,u2,10,1,,,\n2,x,u2,10,1,5,sys,10\n")
    with pytest.raises(InputError, match="unexpected column 'user'"):
        read_requests([path])
    log = read_requests([path], tenant_from="user")
    assert log.tenants == ("u1", "u2") and log.client.tolist() == [0, 1, 1]
    assert log.priority.tolist() == [-3, 0, 5] and log.prefix_len.tolist() == [4, 0, 10]
    assert log.prefix_id == ("sys", None, "sys")
    assert log.columns == frozenset({"priority", "prefix_id", "prefix_len"})
    refused(path, r"--tenant-from nope: no such column \(columns: timestamp,tenant,user", tenant_from="nope")
    no_user = write(tmp_path, "q.csv", "timestamp,prompt,output,prefix_id\n0,1,1,g\n1,1,1,\n")
    refused(no_user, "line 3: prefix_id is empty", tenant_from="prefix_id")


def test_several_traces_merge_on_steps(tmp_path):
    a = write(tmp_path, "a.csv", "arrival,client,prompt,output\n3,0,1,1\n1,1,1,1\n")
    b = write(tmp_path, "b.csv", "arrival,client,prompt,output\n1,2,5,5\n0,0,5,5\n")
    log = read_requests([a, b])
    assert log.arrival.tolist() == [0, 1, 1, 3] and log.file.tolist() == [1, 0, 1, 0]
    assert log.client.tolist() == [0, 1, 2, 0] and log.tenants == ("0", "1", "2")


def test_trace_labels_and_integer_clients(tmp_path):
    path = write(tmp_path, "t.csv", "arrival,client,prompt,output\n5,3,1,1\n0,1,2,2\n")
    log = read_requests([path])
    assert log.tenants == ("0", "1", "2", "3") and log.client.tolist() == [3, 1]  # file order kept
    assert log.arrival.tolist() == [5, 0]
    labels = write(tmp_path, "l.csv", "arrival,client,prompt,output,priority\n5,bob,1,1,2\n0,ann,2,2,\n0,bob,1,1,1\n")
    log = read_requests([labels])
    assert log.tenants == ("bob", "ann") and log.client.tolist() == [0, 1, 0] and log.priority.tolist() == [2, 0, 1]
    refused(path, "a trace is in steps", time_unit="s")
    with pytest.raises(InputError, match="a trace is in steps already"):
        log.steps_trace(0.025)
    refused(write(tmp_path, "big.csv", "arrival,client,prompt,output\n0,100000,1,1\n"), "client id 100000 over the limit")


def test_azure_hand_worked(tmp_path):
    path = write(tmp_path, "Trace_chat.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-02-28 23:59:59.999999999,4,2\n2024-02-29 00:00:00,3,1\n2024-02-28 23:59:59.5,1,1\n")
    log = read_requests([path])
    assert log.tenants == ("chat",) and log.arrival.tolist() == [0, 499_999_999, 500_000_000]
    assert log.prompt.tolist() == [1, 4, 3] and log.lines.tolist() == [4, 2, 3]
    refused(path, "azure timestamps are wall-clock times", time_unit="s")
    assert read_requests([write(tmp_path, "plain.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                "2023-01-01 00:00:00,1,1\n")]).tenants == ("plain",)


def test_mooncake_hash_ids_hand_worked(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 7]},
        {"timestamp": 1000, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 2500, "input_length": 600, "output_length": 5, "hash_ids": [0, 9]},
        {"timestamp": 3000, "input_length": 100, "output_length": 5, "hash_ids": [5]},
        {"timestamp": 3000, "input_length": 300, "output_length": 5, "hash_ids": [5]},
        {"timestamp": 4000, "input_length": 50, "output_length": 5},
    ]
    path = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    log = read_requests([path])
    assert log.arrival.tolist() == [0, 10**9, 10**9, 2_500_000_000, 3 * 10**9, 3 * 10**9, 4 * 10**9]
    # cached: leading ids seen earlier x 512, capped at prompt - 1
    assert log.cached.tolist() == [0, 1024, 1023, 512, 0, 299, 0]
    assert log.prefix_id == ("0/1", "0/1", "0/1", "0/9", "5", "5", None)
    # prefix_len: the most leading ids shared with another of the same group (earlier or later)
    assert log.prefix_len.tolist() == [1024, 1024, 1024, 0, 100, 300, 0]
    assert log.lines.tolist() == [1, 2, 3, 4, 5, 6, 7]
    # group rule: 1024 (row 2), 1023 (row 3), 0 (group 0/9 alone), 100 (row 6: what row 5 of group 5 holds),
    # over the trie's 1024 + 1023 + 512 + 299
    assert prefix_fidelity(log) == pytest.approx((1024 + 1023 + 100) / (1024 + 1023 + 512 + 299))
    seconds = read_requests([path], time_unit="s", tenant_from=None)
    assert seconds.arrival.tolist()[1] == 1000 * 10**9 and seconds.warning is None


def test_mooncake_tenant_field_and_line_numbers(tmp_path):
    rows = ['{"timestamp": 5, "input_length": 3, "output_length": 1, "user": "u\u2028x", "hash_ids": [4]}', "",
            '{"timestamp": 2.5, "input_length": 3, "output_length": 2, "user": 7, "hash_ids": [4]}']
    path = write(tmp_path, "t.jsonl", "\r\n".join(rows))
    log = read_requests([path], tenant_from="user")
    assert log.tenants == ("7", "u\u2028x") and log.lines.tolist() == [3, 1] and log.arrival.tolist() == [0, 2_500_000]
    assert log.cached.tolist() == [0, 2] and log.prefix_len.tolist() == [3, 3]
    refused(path, "line 1: --tenant-from team: no such field", tenant_from="team")
    two = read_requests([path, write(tmp_path, "u.jsonl", rows[0])])
    assert two.prefix_id == ("0:4", "0:4", "1:4") and two.cached.tolist() == [0, 2, 0]


def test_chained_tables_equal_the_tries():
    rng = np.random.default_rng(7)
    for _ in range(200):
        names: dict = {}
        lists = []
        for _ in range(int(rng.integers(1, 25))):
            path = [int(x) for x in rng.integers(0, 3, int(rng.integers(0, 6)))]
            lists.append([names.setdefault(tuple(path[: j + 1]), len(names)) for j in range(len(path))])
        chained = rf.chained_blocks(lists)
        assert chained is not None
        assert (chained[0] == rf.trie_cached(lists)).all() and (chained[1] == rf.group_prefix_blocks(lists)).all()
    assert rf.chained_blocks([[0, 1], [2, 1]]) is None  # id 1 after two parents: the dict tries
    assert rf.trie_cached([[0, 1], [2, 1], [0, 1, 3]]).tolist() == [0, 0, 2]
    assert rf.group_prefix_blocks([[0, 1], [2, 1], [0, 1, 3], [7]]).tolist() == [2, 0, 2, 0]


def test_burstgpt_sample_and_tenants(tmp_path):
    log = read_requests([BURSTGPT])
    assert len(log) == 192 and log.skipped == ((8, "failed requests (0 response tokens)"),)
    assert log.tenants == ("burstgpt_sample",) and log.unit == "s" and (log.output >= 1).all()
    assert "skipped 8 failed requests (0 response tokens)" in log.summary()
    by_model = read_requests([BURSTGPT], tenant_from="Model")
    assert by_model.tenants == ("ChatGPT", "GPT-4") and np.bincount(by_model.client).tolist() == [146, 46]
    assert read_requests([BURSTGPT], tenant_from="Log Type").tenants == ("Conversation log", "API log")
    path = write(tmp_path, "b.csv", "Timestamp, Model ,Request tokens,Response tokens,Log Type\n"
                 "1.5,GPT-4,10,0,API log\n0.5,ChatGPT,3,4,Conversation log\n")
    small = read_requests([path])
    assert len(small) == 1 and small.lines.tolist() == [3] and small.prompt.tolist() == [3]
    refused(write(tmp_path, "z.csv", BURST_HEADER + "0,ChatGPT,0,5,5,API log\n"), "line 2: Request tokens 0 outside")
    refused(write(tmp_path, "f.csv", BURST_HEADER + "0,ChatGPT,4,0,4,API log\n"), "all 1 rows have 0 response tokens")


def test_servegen_directory():
    log = read_requests([ROOT / "data" / "servegen" / "m-large"], split_seed=3)
    assert log.format == "servegen" and log.timed and int(log.arrival.min()) == 0
    assert int(log.arrival.max()) < 600 * 10**9 and (np.diff(log.arrival) >= 0).all()
    assert 50_000 < len(log) < 200_000 and 40 <= len(log.tenants) <= 87
    assert all(name.isdigit() for name in log.tenants)
    assert (log.arrival % rf.servegen_step_ns(1, 87) == 0).all()
    with pytest.raises(InputError, match="multiples of 600 s"):
        read_requests([ROOT / "data" / "servegen" / "m-large"], servegen_window=(0, 300))


# ---- detection, merge, tenants, plausibility ---------------------------------------------

def test_detect_format(tmp_path):
    assert detect_format(CONV) == "azure" and detect_format(BURSTGPT) == "burstgpt"
    assert detect_format(TENANT_LOG) == "log" and detect_format(ROOT / "examples" / "small_trace.csv") == "trace"
    assert detect_format(MOONCAKE / "synthetic_trace.jsonl") == "mooncake"
    assert detect_format(ROOT / "data" / "servegen" / "m-large") == "servegen"
    assert detect_format(write(tmp_path, "bom.csv", "\ufeff\n\n  {\"timestamp\": 1}")) == "mooncake"
    with pytest.raises(InputError, match=r"cannot tell the format from the header 'a,b'.*trace, log, azure"):
        detect_format(write(tmp_path, "x.csv", "a,b\n1,2\n"))
    with pytest.raises(InputError, match="empty file"):
        detect_format(write(tmp_path, "e.csv", "\n \n"))
    with pytest.raises(InputError, match="cannot read file"):
        detect_format(tmp_path / "missing.csv")
    refused([TENANT_LOG, CONV], "is log but .* is azure: give files of one format")
    assert read_requests([CONV], format="azure").format == "azure"


def test_merge_two_logs(tmp_path):
    a = write(tmp_path, "one.csv", "timestamp,tenant,prompt,output\n5,x,1,1\n7,y,1,1\n")
    b = write(tmp_path, "two.csv", "timestamp,tenant,prompt,output\n5.0,z,2,2\n6,x,2,2\n")
    log = read_requests([a, b])
    assert log.arrival.tolist() == [0, 0, 10**9, 2 * 10**9] and log.file.tolist() == [0, 1, 1, 0]
    assert log.tenants == ("x", "z", "y") and log.client.tolist() == [0, 1, 0, 2]
    assert log.sources == (str(a), str(b))
    m1 = write(tmp_path, "m1.jsonl", '{"timestamp": 0, "input_length": 9, "output_length": 1}\n')
    m2 = write(tmp_path, "m2.jsonl", '{"timestamp": 1.5, "input_length": 9, "output_length": 1}\n')
    both = read_requests([m1, m2])
    assert both.tenants == ("m1", "m2") and both.arrival.tolist() == [0, 1_500_000]
    dup = tmp_path / "d"
    dup.mkdir()
    refused([m1, write(dup, "m1.jsonl", m1.read_text())], "two files give the tenant name 'm1'")


def test_tenant_split(tmp_path):
    log = read_requests([TENANT_LOG], tenants="a:0.6,b:0.3,c:0.1", split_seed=5)
    draws = np.random.default_rng(5).choice(3, size=len(log), p=[0.6, 0.3, 0.1])
    names = ("a", "b", "c")
    assert [log.tenants[c] for c in log.client] == [names[d] for d in draws]
    again = read_requests([TENANT_LOG], tenants="a:6,b:3,c:1", split_seed=5)
    assert (again.client == log.client).all()
    assert not (read_requests([TENANT_LOG], tenants="a:0.6,b:0.3,c:0.1", split_seed=6).client == log.client).all()
    assert parse_split("a:1e308,b:1e308")[1].tolist() == [0.5, 0.5]  # no overflow in the sum
    for bad in ("a:0.5,a:0.5", "a:0", "a:-1", "a:nan", "a:inf", ":1", "a", "a:1,b:"):
        with pytest.raises(InputError, match="--tenants"):
            parse_split(bad)
    refused(TENANT_LOG, "not both", tenants="a:1", tenant_from="tenant")
    assert MAX_TENANTS == 100_000


def test_plausibility_ms_read_as_seconds(tmp_path):
    rows = TENANT_LOG.read_text().splitlines()
    scaled = [rows[0]] + [f"{int(round(float(r.split(',')[0]) * 1000))}," + r.split(",", 1)[1] for r in rows[1:]]
    path = write(tmp_path, "ms.csv", "\n".join(scaled) + "\n")
    message = refused(path, r"read as seconds the log spans 6.9 days at .* requests/s, implausible \(timestamps in "
                            r"ms\?\): give --time-unit ms, or --time-unit s to run it as read")
    assert message.startswith(f"{path}: ")
    as_read = read_requests([path], time_unit="s")
    assert as_read.warning is not None and "running it as read" in as_read.warning
    ms = read_requests([path], time_unit="ms")
    assert ms.warning is None and abs(ms.span_seconds() - read_requests([TENANT_LOG]).span_seconds()) < 1e-3
    fast = write(tmp_path, "fast.jsonl", "".join(f'{{"timestamp": {i / 1000}, "input_length": 1, "output_length": 1}}\n'
                                                  for i in range(200)))
    refused(fast, r"read as milliseconds the log spans 0.0 s at 1.005e\+06 requests/s, implausible \(timestamps in s\?\): "
                  r"give --time-unit s, or --time-unit ms")
    assert "implausible" in read_requests([fast], time_unit="ms").warning
    slow = write(tmp_path, "slow.csv", LOG_HEADER + "".join(f"{i * 59},a,1,1\n" for i in range(100)))
    assert read_requests([slow]).span_seconds() == 5841.0  # 100 requests, 1 per 59 s: plausible
    refused(write(tmp_path, "slower.csv", LOG_HEADER + "".join(f"{i * 61},a,1,1\n" for i in range(100))),
            r"at 0.01656 requests/s, implausible \(timestamps in ms\?\)")
    tiny = write(tmp_path, "us.csv", LOG_HEADER + "".join(f"{i * 10**6},a,1,1\n" for i in range(3)))
    refused(tiny, r"read as seconds the log spans 23.1 days .* \(timestamps in ms\?\)")
    assert read_requests([tiny], time_unit="ms").warning is None


# ---- hostile files, every format ---------------------------------------------------------

LOG_HEADER = "timestamp,tenant,prompt,output\n"
TRACE_HEADER = "arrival,client,prompt,output\n"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"

HOSTILE = [
    ("log", LOG_HEADER + "nan,a,1,1\n", "line 2: timestamp must be a finite number of seconds"),
    ("log", LOG_HEADER + "inf,a,1,1\n", "line 2: timestamp must be a finite"),
    ("log", LOG_HEADER + "-1,a,1,1\n", "line 2: timestamp must be a finite number of seconds >= 0"),
    ("log", LOG_HEADER + "1e13,a,1,1\n", "line 2: timestamp must be under 1e13 s"),
    ("log", LOG_HEADER + "1,a,0,1\n", "line 2: prompt 0 outside"),
    ("log", LOG_HEADER + "1,a,1,0\n", "line 2: output 0 outside"),
    ("log", LOG_HEADER + "1,a,1.5,1\n", "line 2: prompt must be a non-negative integer"),
    ("log", LOG_HEADER + "1,,1,1\n", "line 2: tenant is empty"),
    ("log", "timestamp,tenant,prompt,output,cached\n1,a,4,1,4\n", "line 2: cached 4 must be < prompt 4"),
    ("log", "timestamp,tenant,prompt\n1,a,4\n", "missing column 'output'"),
    ("log", LOG_HEADER + "1,a,1\n", "line 2: 3 fields, header has 4"),
    ("log", LOG_HEADER, "no requests"),
    ("log", "", "empty file"),
    ("log", b"timestamp,tenant,prompt,output\n1,\xff,1,1\n", "not a UTF-8 text"),
    ("log", b"\xef\xbb\xbf" + LOG_HEADER.encode() + b"1,a,1,1\n", None),
    ("log", LOG_HEADER + "1,a,1,1\x00\n", "NUL"),
    ("trace", TRACE_HEADER + "0,0,1,0\n", "line 2: output must be >= 1"),
    ("trace", TRACE_HEADER + "-1,0,1,1\n", "line 2: arrival must be a non-negative integer"),
    ("trace", TRACE_HEADER + "0,0,nan,1\n", "line 2: prompt must be a non-negative integer"),
    ("trace", TRACE_HEADER + "0,,1,1\n", "line 2: client is empty"),
    ("trace", "arrival,client,prompt,output,prefix_len\n0,a,3,1,4\n", "line 2: prefix_len 4 outside"),
    ("trace", "arrival,client,prompt,output,priority\n0,a,3,1,1073741825\n", "line 2: priority 1073741825 outside"),
    ("trace", TRACE_HEADER, "no requests"),
    ("azure", AZURE_HEADER + "2023-02-30 00:00:00,1,1\n", "line 2: TIMESTAMP must be a time"),
    ("azure", AZURE_HEADER + "2023-01-01 24:00:00,1,1\n", "line 2: TIMESTAMP must be a time"),
    ("azure", AZURE_HEADER + "2023-01-01 00:00:00.1234567890,1,1\n", "line 2: TIMESTAMP must be a time"),
    ("azure", AZURE_HEADER + "2023-01-01 00:00:00+01:00,1,1\n", "line 2: TIMESTAMP must be a time"),
    ("azure", AZURE_HEADER + "2023-01-01 00:00:00,0,1\n", "line 2: ContextTokens 0 outside"),
    ("azure", AZURE_HEADER + "2023-01-01 00:00:00,1,-1\n", "line 2: GeneratedTokens must be a non-negative"),
    ("azure", "TIMESTAMP,ContextTokens\n2023-01-01 00:00:00,1\n", "missing column"),
    ("azure", AZURE_HEADER, "no requests"),
    ("mooncake", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 1, "inp', "line 2: invalid JSON"),
    ("mooncake", '{"timestamp": NaN, "input_length": 1, "output_length": 1}\n', "line 1: NaN is not a number"),
    ("mooncake", '{"timestamp": Infinity, "input_length": 1, "output_length": 1}\n', "line 1: Infinity is not"),
    ("mooncake", '{"timestamp": -5, "input_length": 1, "output_length": 1}\n', "line 1: timestamp must be >= 0"),
    ("mooncake", '{"timestamp": true, "input_length": 1, "output_length": 1}\n', "line 1: timestamp must be a number"),
    ("mooncake", '{"timestamp": "1", "input_length": 1, "output_length": 1}\n', "line 1: timestamp must be a number"),
    ("mooncake", '{"timestamp": 0, "input_length": 1.0, "output_length": 1}\n', "line 1: input_length must be an int"),
    ("mooncake", '{"timestamp": 0, "input_length": 1, "output_length": 0}\n', "line 1: output_length 0 outside"),
    ("mooncake", '{"timestamp": 0, "input_length": 1}\n', "line 1: missing field 'output_length'"),
    ("mooncake", '[1, 2]\n', "line 1: expected a JSON object"),
    ("mooncake", '{"timestamp": 0, "input_length": 1, "output_length": 1} {"timestamp": 1}\n',
     "line 1: invalid JSON \\(extra data after the object at column 56\\)"),
    ("mooncake", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 1, "input_length": 1, '
                 '"output_length": 1, "hash_ids": [0, 1]}\n', "line 2: hash_ids has 2 blocks"),
    ("mooncake", '{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1, 2, 3]}\n',
     "line 1: hash_ids has 3 blocks"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-1]}\n',
     "line 1: hash_ids must be a list of integers >= 0"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [true]}\n', "hash_ids must"),
    ("mooncake", "\n\n", "empty file"),
    ("burstgpt", BURST_HEADER + "x,ChatGPT,1,1,2,API log\n", "line 2: Timestamp must be a finite number of seconds"),
    ("burstgpt", BURST_HEADER + "1,ChatGPT,1,-1,2,API log\n", "line 2: Response tokens must be a non-negative"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\n1,a,1,1\n", "missing column 'Log Type'"),
    ("burstgpt", BURST_HEADER, "no requests"),
]


@pytest.mark.parametrize("fmt,text,match", HOSTILE, ids=[f"{h[0]}-{i}" for i, h in enumerate(HOSTILE)])
def test_hostile_files(tmp_path, fmt, text, match):
    name = {"mooncake": "bad.jsonl"}.get(fmt, "bad.csv")
    path = write(tmp_path, name, text)
    if match is None:
        assert len(read_requests([path], format=fmt)) == 1
        return
    message = refused(path, match, format=fmt)
    assert message.startswith(str(path))


ONE_ROW = {
    "trace": TRACE_HEADER + "0,a,1,1\n",
    "log": LOG_HEADER + "0,a,1,1\n",
    "azure": AZURE_HEADER + "2023-11-16 18:15:46.6805900,1,1\n",
    "mooncake": '{"timestamp": 0, "input_length": 1, "output_length": 1}\n',
    "burstgpt": BURST_HEADER + "0,ChatGPT,1,1,2,API log\n",
}


@pytest.mark.parametrize("fmt", sorted(ONE_ROW))
def test_bom_non_utf8_and_empty_every_format(tmp_path, fmt):
    text = ONE_ROW[fmt].encode()
    bom = write(tmp_path, "bom.txt", b"\xef\xbb\xbf" + text)
    assert detect_format(bom) == fmt and len(read_requests([bom])) == 1
    latin = write(tmp_path, "latin.txt", text.replace(b"1", b"\xe9", 1))
    assert refused(latin, "not a UTF-8 text", format=fmt).startswith(str(latin))
    refused(write(tmp_path, "empty.txt", b""), "empty file", format=fmt)
    refused(write(tmp_path, "nul.txt", text + b"\x00"), "NUL", format=fmt)


def test_steps_trace_limits(tmp_path):
    log = read_requests([write(tmp_path, "s.csv", LOG_HEADER + "0,a,1,1\n100000000,a,1,1\n")], time_unit="s")
    assert "1,157.4 days" in log.warning
    with pytest.raises(InputError, match=r"the log spans 4,000,000,000 steps of 0.025 s, over the limit of "
                                         r"1,073,741,824: use a larger --step-seconds"):
        log.steps_trace(0.025)
    for bad in ("1e-10", "0", "-1", "x", 1e-10):
        with pytest.raises(InputError, match="whole number of nanoseconds"):
            log.steps_trace(bad)
    with pytest.raises(InputError, match="needs a step length"):
        log.steps_trace()
    assert log.steps_trace(1).arrival.tolist() == [0, 100_000_000]


def test_int_column_fast_and_slow_paths():
    lines = [2, 3, 4]
    assert rf.int_column(["1", "+2", "007"], lines, "f", "x", 0, 10).tolist() == [1, 2, 7]
    assert rf.int_column(["-1", "", "3"], lines, "f", "x", -5, 5, default=0).tolist() == [-1, 0, 3]
    with pytest.raises(InputError, match="f: line 3: x must be a non-negative integer, got '1_0'"):
        rf.int_column(["1", "1_0", "3"], lines, "f", "x", 0, 10)
    with pytest.raises(InputError, match="f: line 4: x 11 outside"):
        rf.int_column(["1", "2", "11"], lines, "f", "x", 0, 10)
    with pytest.raises(InputError, match="line 2: x must be a non-negative integer, got '\u0661'"):
        rf.int_column(["\u0661"], lines, "f", "x", 0, 10)  # an Arabic-Indic digit is not a decimal cell


def test_a_pipe_is_read_once_and_detected(tmp_path):
    """`compare <(zcat log.csv.gz)`: a FIFO is read whole once, its format detected from
    what was read (a regular file is sniffed, then parsed)."""
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    text = TENANT_LOG.read_text()
    writer = threading.Thread(target=lambda: fifo.write_text(text))
    writer.start()
    log = read_requests([fifo])
    writer.join()
    file = read_requests([TENANT_LOG])
    assert log.format == "log" and log.tenants == file.tenants
    for name in ("arrival", "client", "prompt", "output", "lines"):
        assert (getattr(log, name) == getattr(file, name)).all(), name
