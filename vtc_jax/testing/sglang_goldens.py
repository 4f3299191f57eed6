"""The real SGLang scheduler's golden schedules on disk (tests/data/sglang_golden/): a trace
CSV as the literal reference's requests, a golden JSON (config, trace, steps; the hand-read
g*.json carry their trace inline with the prompt token ids), and a step-for-step compare."""

from __future__ import annotations

import json
import os

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table, read_text
from vtc_jax.testing.sglang_reference import SglangConfig, SglangRequest, SglangRun
from vtc_jax.testing.vllm_goldens import int_cell  # one reader of a golden CSV's integer cell

TRACE_COLUMNS = ("arrival", "client", "prompt", "output")
TRACE_OPTIONAL = ("prefix_id", "prefix_len")
RATIO_DIGITS = 6  # the harness prints new_token_ratio rounded to 6 digits


def read_trace_csv(path) -> list[SglangRequest]:
    """A golden trace CSV (`arrival,client,prompt,output[,prefix_id,prefix_len]`) as
    SglangRequests in file order (row = request id rROW). A prefix_id of -1 or blank, or a
    prefix_len of 0, is no shared prefix."""
    source = os.fspath(path)
    header, records = csv_table(read_text(path, what="trace"), source, TRACE_COLUMNS, TRACE_OPTIONAL)
    out = []
    for line, cells in records:
        cell = dict(zip(header, cells))
        ints = {name: int_cell(cell[name], source, line, name) for name in ("arrival", "prompt", "output")}
        prefix_len = int_cell(cell.get("prefix_len") or "0", source, line, "prefix_len")
        prefix_id = cell.get("prefix_id") or None
        if prefix_id in (None, "-1") or prefix_len <= 0:
            prefix_id, prefix_len = None, 0
        if not 0 <= prefix_len <= ints["prompt"]:
            raise InputError(f"{source}: line {line}: prefix_len {prefix_len} outside 0..prompt")
        out.append(SglangRequest(client=cell["client"], prefix_id=prefix_id, prefix_len=prefix_len,
                                 rid=f"r{len(out)}", **ints))
    return out


def _read_json(path) -> dict:
    try:
        doc = json.loads(read_text(path, what="JSON file"))
    except json.JSONDecodeError as err:
        raise InputError(f"{os.fspath(path)}: not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict) or not isinstance(doc.get("steps"), list):
        raise InputError(f"{os.fspath(path)}: not an SGLang golden (needs `config` and `steps`)")
    return doc


def _row(rid: str) -> int:
    if not (isinstance(rid, str) and rid.startswith("r") and rid[1:].isdigit()):
        raise InputError(f"golden request id {rid!r} is not rNNN")
    return int(rid[1:])


def trace_from_json(doc: dict) -> list[SglangRequest]:
    """A golden JSON's inline `trace` as SglangRequests, row = NNN of rid rNNN. Entries with
    `prompt_tokens` (the hand-read g*.json) keep their token ids; the s*.json trace carries
    lengths only, so its CSV (read_trace_csv) gives the prefix groups."""
    trace = doc.get("trace")
    if not isinstance(trace, list):
        raise InputError("golden JSON has no `trace` list")
    by_row = {}
    for t in trace:
        row = _row(t["rid"])
        tokens = t.get("prompt_tokens")
        by_row[row] = SglangRequest(arrival=int(t["arrival_step"]), client="", prompt=int(t["prompt"]),
                                    output=int(t["max_new_tokens"]), rid=t["rid"],
                                    tokens=tuple(tokens) if tokens is not None else None)
    if sorted(by_row) != list(range(len(by_row))):
        raise InputError("golden trace rids are not r0..rN-1")
    return [by_row[i] for i in range(len(by_row))]


def load_golden(path) -> tuple[list[SglangRequest], SglangConfig, list[dict]]:
    """Golden NAME.json: (its trace, its config, its steps with rows for rids). The trace is
    NAME.csv beside it when there is one, else the JSON's inline trace (it must then carry
    prompt token ids whenever requests share a prefix: the g*.json do)."""
    path = os.fspath(path)
    doc = _read_json(path)
    csv_path = path[:-len(".json")] + ".csv" if path.endswith(".json") else None
    if csv_path and os.path.exists(csv_path):
        requests = read_trace_csv(csv_path)
    else:
        requests = trace_from_json(doc)
    return requests, SglangConfig.from_dict(doc["config"]), golden_steps(doc)


def golden_steps(doc: dict) -> list[dict]:
    """The golden's steps with rows (ints) for rids: scheduled entries become
    (row, tokens, kind, prefix_len or None)."""
    out = []
    for s in doc["steps"]:
        sched = []
        for e in s["scheduled"]:
            sched.append((_row(e[0]), int(e[1]), e[2], int(e[3]) if len(e) > 3 else None))
        out.append({"step": s["step"], "kind": s["kind"], "scheduled": sched,
                    "retracted": [_row(r) for r in s["retracted"]], "finished": [_row(r) for r in s["finished"]],
                    "new_token_ratio": s["new_token_ratio"], "kv_free": s["kv_free"],
                    "kv_evictable": s["kv_evictable"]})
    return out


FIELDS = ("step", "kind", "scheduled", "retracted", "finished", "new_token_ratio", "kv_free", "kv_evictable")


def compare(golden: list[dict], run: SglangRun | list[dict]) -> tuple[int, str, object, object] | None:
    """The first difference between a golden's steps and a run's: (index in the step list,
    field, golden value, run value), or None when they agree step for step. The ratio is
    compared at the golden's printed precision (6 digits)."""
    steps = run.steps if isinstance(run, SglangRun) else run
    for i, (g, r) in enumerate(zip(golden, steps)):
        for name in FIELDS:
            gv, rv = g[name], r[name]
            if name == "new_token_ratio":
                rv = round(rv, RATIO_DIGITS)
            elif name == "scheduled":
                gv, rv = [tuple(e) for e in gv], [tuple(e) for e in rv]
            if gv != rv:
                return i, name, gv, rv
    if len(golden) != len(steps):
        i = min(len(golden), len(steps))
        return i, "length", len(golden), len(steps)
    return None
