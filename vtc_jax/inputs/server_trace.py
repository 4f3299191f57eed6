"""A trace for a real engine's scheduler: tenant labels, per-request priority and shared
prefixes (the columns vLLM's scheduler reads beside the request's lengths). The reader
layer (inputs/request_log.py, format `trace`) reads it; `ServerTrace` is its form for the
vllm servers (cli/input_flags.server_trace).

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

import numpy as np

from vtc_jax.inputs.workload import Trace


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

    def reordered(self, order: np.ndarray) -> ServerTrace:
        """The trace with its rows in `order` (int64[N], a permutation of its row indices),
        every per-row column taken along (tenant ids and labels unchanged)."""
        order = np.asarray(order, np.int64)
        return dataclasses.replace(self, tenant=self.tenant[order], arrival=self.arrival[order],
                                   prompt=self.prompt[order], output=self.output[order],
                                   priority=self.priority[order], prefix_id=tuple(self.prefix_id[i] for i in order),
                                   prefix_len=self.prefix_len[order], lines=self.lines[order])

    def engine_trace(self, queue: np.ndarray) -> Trace:
        """The engine's Trace with `queue` as client ids (file lines kept for messages)."""
        return Trace(self.arrival, queue, self.prompt, self.output, np.zeros(len(self), np.int64), lines=self.lines,
                     source=self.source)
