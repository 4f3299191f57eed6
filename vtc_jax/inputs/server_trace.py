"""A trace for a real engine's scheduler: tenant labels, per-request priority and shared
prefixes (the columns vLLM's scheduler reads beside the request's lengths).

CSV header `arrival,client,prompt,output[,priority][,prefix_id][,prefix_len]`: arrival a
step (int >= 0), client any label (a tenant's name or number; ids are given by first
appearance), prompt and output ints >= 1, priority an int in [-2^30, 2^30] (lower first,
vLLM's `priority`; default 0), prefix_id any label or empty (requests with the same
prefix_id share their first prefix_len prompt tokens; a prefix_len without a prefix_id is
shared within the client, as the real scheduler's goldens were made), prefix_len an int in
[0, prompt].

A server that orders by priority runs each (tenant, priority) pair as its own engine
client with that priority as its band (`queues`): strict priority between bands, the
policy inside one, exactly the order (priority, arrival, row) of vLLM's waiting queue.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.core.fileio import csv_table
from vtc_jax.inputs.workload import MAX_ARRIVAL, MAX_LENGTH, Trace, trace_text

COLUMNS = ("arrival", "client", "prompt", "output")
OPTIONAL = ("priority", "prefix_id", "prefix_len")
MAX_PRIORITY = 1 << 30
_INT = re.compile(r"^[+-]?\d{1,10}$")


@dataclasses.dataclass(frozen=True)
class ServerTrace:
    """tenants: str labels by first appearance; tenant: int64[N] each row's tenant id;
    priority, prefix_len: int64[N]; prefix_id: list of str or None per row; arrival,
    prompt, output: int64[N]; lines: int64[N] file lines; source: the file."""

    tenants: tuple
    tenant: np.ndarray
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    priority: np.ndarray
    prefix_id: tuple
    prefix_len: np.ndarray
    lines: np.ndarray
    source: str

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    def queues(self, by_priority: bool):
        """(queue int64[N], band per queue, tenant id per queue): one engine client per
        (tenant, priority) pair when `by_priority` (numbered by first appearance; its band
        is the rank of its priority among the trace's, 0 served first), else one per
        tenant with band 0."""
        if not by_priority:
            return self.tenant.copy(), [0] * len(self.tenants), list(range(len(self.tenants)))
        ids: dict = {}
        queue = np.array([ids.setdefault((int(t), int(p)), len(ids)) for t, p in zip(self.tenant, self.priority)],
                         np.int64)
        pairs = sorted(ids, key=ids.get)
        rank = {p: r for r, p in enumerate(sorted({p for _, p in pairs}))}  # bands keep the order, in range
        return queue, [rank[p] for _, p in pairs], [t for t, _ in pairs]

    def engine_trace(self, queue: np.ndarray) -> Trace:
        """The engine's Trace with `queue` as client ids (file lines kept for messages)."""
        return Trace(self.arrival, queue, self.prompt, self.output, np.zeros(len(self), np.int64), lines=self.lines,
                     source=self.source)


def _int(cell: str, name: str, where: str, low: int, high: int) -> int:
    if not _INT.match(cell):
        raise InputError(f"{where}: {name} must be an integer, got {cell[:24]!r}")
    value = int(cell)
    if not low <= value <= high:
        raise InputError(f"{where}: {name} {value} outside [{low}, {high}]")
    return value


def read_server_trace(path_or_text, *, source: str | None = None) -> ServerTrace:
    """Read the CSV (module docstring); every problem is one InputError naming the file
    and line."""
    text, source = trace_text(path_or_text, source)
    header, records = csv_table(text, source, COLUMNS, OPTIONAL)
    tenants: dict = {}
    cols = {name: [] for name in ("tenant", "arrival", "prompt", "output", "priority", "prefix_id", "prefix_len", "line")}
    for line, row in records:
        cell = dict(zip(header, row))
        where = f"{source}: line {line}"
        label = cell["client"]
        if not label:
            raise InputError(f"{where}: client is empty")
        prompt = _int(cell["prompt"], "prompt", where, 1, MAX_LENGTH)
        cols["tenant"].append(tenants.setdefault(label, len(tenants)))
        cols["arrival"].append(_int(cell["arrival"], "arrival", where, 0, MAX_ARRIVAL))
        cols["prompt"].append(prompt)
        cols["output"].append(_int(cell["output"], "output", where, 1, MAX_LENGTH))
        cols["priority"].append(_int(cell.get("priority") or "0", "priority", where, -MAX_PRIORITY, MAX_PRIORITY))
        prefix = cell.get("prefix_id") or None
        length = _int(cell.get("prefix_len") or "0", "prefix_len", where, 0, prompt)
        cols["prefix_id"].append(prefix)
        cols["prefix_len"].append(length)
        cols["line"].append(line)
    if not cols["arrival"]:
        raise InputError(f"{source}: no requests (header only)")
    arr = {k: np.asarray(v, np.int64) for k, v in cols.items() if k != "prefix_id"}
    return ServerTrace(tenants=tuple(tenants), tenant=arr["tenant"], arrival=arr["arrival"], prompt=arr["prompt"],
                       output=arr["output"], priority=arr["priority"], prefix_id=tuple(cols["prefix_id"]),
                       prefix_len=arr["prefix_len"], lines=arr["line"], source=source)
