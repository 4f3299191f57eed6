"""Host-side readers of the per-request records the vLLM servers keep (their `Outcome`,
servers/vllm_v1.py) and the declarations they share (`keeps_time`, `default_memory`): what
a study (driver/study.py) reads to report latencies, by workload row."""

from __future__ import annotations

import numpy as np

VLLM_FLAGS = {  # setting -> vLLM's engine-argument flag (cli/server_flags.py adds them)
    "num_gpu_blocks": "--num-gpu-blocks", "block_size": "--block-size",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
    "enable_chunked_prefill": "--enable-chunked-prefill", "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "scheduling_policy": "--scheduling-policy", "enable_prefix_caching": "--enable-prefix-caching",
    "async_scheduling": "--async-scheduling",  # vLLM's flag (and --no-async-scheduling): docs/VLLM_ASYNC.md
}


def outcome_record(host) -> dict:
    """{"scheduled", "first", "finish", "preemptions": int64[B, R] by workload row (-1: not
    yet; on a timed lane the server's us), "gpu" (where kept: each request's share of the
    steps' time, us), "token_at": int64[B, T], "token_offset":
    int64[B, R]: the per-token record (T 0: none kept)} of a vLLM server's host state."""
    out = host.out
    record = {"scheduled": out.scheduled, "first": out.first_token, "finish": out.finish, "preemptions": out.preemptions}
    if getattr(out, "gpu_us", None) is not None:
        record["gpu"] = out.gpu_us
    record = {name: np.asarray(values, np.int64) for name, values in record.items()}
    times = getattr(out, "times", None)
    if times is None:
        shape = record["first"].shape
        return dict(record, token_at=np.zeros(shape[:-1] + (0,), np.int64), token_offset=np.full(shape, -1, np.int64))
    return dict(record, token_at=np.asarray(times.at, np.int64), token_offset=np.asarray(times.offset, np.int64))


def timed_by_options(options: dict) -> bool:
    """A vLLM lane keeps time when its step-time model is set (`time_model`: us)."""
    return bool(dict(options).get("time_model", ""))


def vllm_memory(options: dict) -> int | None:
    """The KV tokens a vLLM server holds, (num_gpu_blocks - 1) x block_size (the null
    block holds none): the M of VTC's bound and of the load line; None without a pool."""
    options = dict(options)
    if "num_gpu_blocks" not in options:
        return None
    return (int(options["num_gpu_blocks"]) - 1) * int(options.get("block_size", 16))
