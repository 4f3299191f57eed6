"""The real vLLM scheduler's golden schedules on disk (tests/data/vllm_golden*/): a
golden's trace CSV as the literal reference's requests, its config and its schedule."""

from __future__ import annotations

import json
import os

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table, read_text
from vtc_jax.testing.vllm_reference import TRACE_COLUMNS, TRACE_OPTIONAL, TraceRequest



def int_cell(text: str, source: str, line: int, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(f"{source}: line {line}: {name} must be an integer, got {text[:40]!r}") from None


def read_trace_csv(path) -> list[TraceRequest]:
    """A golden trace CSV (`arrival,client,prompt,output` plus optional `priority`,
    `prefix_id`, `prefix_len` or its alias `cached`) as TraceRequests in file order. As in
    the harness, a prefix_len without a prefix_id shares the prefix within the client."""
    source = os.fspath(path)
    header, records = csv_table(read_text(path, what="trace"), source, TRACE_COLUMNS, TRACE_OPTIONAL)
    out = []
    for line, cells in records:
        cell = dict(zip(header, cells))
        ints = {name: int_cell(cell[name], source, line, name) for name in ("arrival", "prompt", "output")}
        priority = int_cell(cell.get("priority") or "0", source, line, "priority")
        prefix_len = int_cell(cell.get("prefix_len") or cell.get("cached") or "0", source, line, "prefix_len")
        prefix_id = (cell.get("prefix_id") or f"client:{cell['client']}") if prefix_len > 0 else None
        out.append(TraceRequest(client=cell["client"], priority=priority, prefix_id=prefix_id,
                                prefix_len=prefix_len, **ints))
    return out


def _read_json(path) -> object:
    try:
        return json.loads(read_text(path, what="JSON file"))
    except json.JSONDecodeError as err:
        raise InputError(f"{os.fspath(path)}: not valid JSON ({err.msg}, line {err.lineno})") from None


def load_golden(directory, name: str) -> tuple[list[TraceRequest], dict, dict]:
    """Golden `name` in `directory`: (its trace, its config dict, the real scheduler's
    schedule), from NAME.csv, NAME.config.json and NAME.schedule.json."""
    base = os.path.join(os.fspath(directory), name)
    return read_trace_csv(base + ".csv"), _read_json(base + ".config.json"), _read_json(base + ".schedule.json")
