"""The endpoint picker's block ids (llm-d's approximate prefix index, vtc_jax/pickers), from
a trace's content identity (prefix_blocks.ContentIdentity: groups, chains or sessions).

llm-d hashes a request's prompt in chunks of B = max(64, engine block size) tokens
(`llm-d/llm-d-router@ebab6879`, dataproducer/approximateprefix/plugin.go `GetBlockSize`:
the 64 floor is its `minBlockSizeTokens`), the trailing partial chunk INCLUDED
(prefixhash/hashing.go `getKVCacheBlocksFromTokens`), at most 131072 / B chunks
(`defaultMaxPrefixTokens` / B), each chunk's hash chained on the one before. So two chunks
are the same exactly when the two requests' tokens agree from the first token through the
chunk's last token and the chunk ends at the same token: a trailing partial chunk equals
another request's only when both agree on all its tokens and it has the same length (and a
partial chunk never equals a full one). Here a chunk is identified by its last token p and
the class of token sequences agreeing through p (prefix_blocks' rule), so both follow.
"""

from __future__ import annotations

import numpy as np

from vtc_jax.core.errors import InputError
from vtc_jax.inputs.prefix_blocks import ContentIdentity, _intern, token_classes

MIN_BLOCK_TOKENS = 64  # llm-d's minBlockSizeTokens (issue #1158)
MAX_PREFIX_TOKENS = 131072  # llm-d's defaultMaxPrefixTokens


def picker_block_size(engine_block_size: int, floor: int = MIN_BLOCK_TOKENS) -> int:
    """B: llm-d's picker block size for replicas of `engine_block_size` tokens per KV block
    (its auto-tune reads the replica's block size, then clamps it up to `floor`)."""
    return max(int(floor), int(engine_block_size))


def engine_blocks(prompt, block_size: int) -> np.ndarray:
    """int64[N]: ceil(prompt / block_size), Dynamo's request blocks."""
    return -(-np.asarray(prompt, np.int64) // int(block_size))


def picker_block_ids(ident: ContentIdentity, prompt, block_size: int, *, max_tokens: int | None = MAX_PREFIX_TOKENS):
    """(offsets int64[N+1], ids int64[total]): request r's picker blocks are
    ids[offsets[r]:offsets[r+1]], chunk 0 first: its ceil(prompt / B) chunks of B tokens,
    the last one partial when B does not divide the prompt, at most max_tokens // B of them
    (None: no cap). Two chunks have one id exactly when they are the same chunk (module
    docstring). Ids are dense, >= 0, numbered by first appearance (request order, then
    chunk order)."""
    B = int(block_size)
    if B < 1:
        raise ValueError(f"block_size {block_size}: must be >= 1")
    prompt = np.asarray(prompt, np.int64)
    if len(prompt) != len(ident):
        raise ValueError("identity and prompt differ in length")
    count = -(-prompt // B)
    if max_tokens is not None:
        count = np.minimum(count, int(max_tokens) // B)
    offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    total = int(offsets[-1])
    req = np.repeat(np.arange(len(count), dtype=np.int64), count)
    j = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], count)
    last = np.minimum((j + 1) * B, prompt[req]) - 1  # the chunk's last token: fixes its start and length
    return offsets, _intern(*token_classes(ident, prompt, req, last, last))


def padded(offsets, ids, max_blocks: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(blocks int32[N, T_MAX], num_blocks int32[N]): the ragged ids as the pickers' fixed
    rows, -1 past each request's T (T_MAX = max_blocks, default the largest T, at least 1).
    InputError if an id or a T does not fit (int32 ids; T <= max_blocks)."""
    offsets, ids = np.asarray(offsets, np.int64), np.asarray(ids, np.int64)
    count = np.diff(offsets)
    width = max(int(count.max(initial=0)), 1) if max_blocks is None else int(max_blocks)
    if count.size and int(count.max()) > width:
        raise InputError(f"a request has {int(count.max())} picker blocks, more than the {width} allowed")
    if ids.size and int(ids.max()) > np.iinfo(np.int32).max:
        raise InputError(f"{int(ids.max()) + 1:,} distinct picker blocks: past the int32 ids the pickers hold")
    out = np.full((len(count), width), -1, np.int32)
    row = np.repeat(np.arange(len(count)), count)
    col = np.arange(ids.size) - np.repeat(offsets[:-1], count)
    out[row, col] = ids
    return out, count.astype(np.int32)
