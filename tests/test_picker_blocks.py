"""The endpoint picker's block ids (vtc_jax/inputs/picker_blocks.py): llm-d's chunks of B
tokens with the trailing partial chunk, capped at max_tokens // B, against a literal
reference (a chunk is the tuple of every token from the first through its last, interned:
equal tuples = equal chains of xxhashes) on random small cases of each content kind,
hand-worked cases, and llm-d's own block-count tests ported as assertions."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_prefix_blocks import identity, random_case, ref_tokens
from vtc_jax.core.errors import InputError
from vtc_jax.inputs import picker_blocks as pk
from vtc_jax.inputs import prefix_blocks as pb


def ref_picker_ids(kind, data, prompt, output, B, max_tokens=pk.MAX_PREFIX_TOKENS):
    """(offsets, ids): chunk j of r is the tuple of r's prompt tokens 0 .. min((j+1)B, P) - 1."""
    seqs = ref_tokens(kind, data, prompt, output, "prompt")
    table: dict = {}
    ids, offsets = [], [0]
    for toks in seqs:
        n = -(-len(toks) // B)
        if max_tokens is not None:
            n = min(n, max_tokens // B)
        for j in range(n):
            ids.append(table.setdefault(tuple(toks[: min((j + 1) * B, len(toks))]), len(table)))
        offsets.append(len(ids))
    return np.asarray(offsets, np.int64), np.asarray(ids, np.int64)


def picker_case(kind, rng):
    """test_prefix_blocks' random case, plus (groups, chains) a few copies of earlier
    requests whose whole prompt is shared content, so that partial chunks are shared too."""
    prompt, output, data = random_case(kind, rng)
    for _ in range(int(rng.integers(0, 3)) if kind != "sessions" else 0):
        r = int(rng.integers(0, len(prompt)))
        prompt.append(prompt[r])
        output.append(output[r])
        if kind == "groups":
            data["prefix_id"][r] = data["prefix_id"][r] or "c"
            data["prefix_len"][r] = prompt[r]
            for field in ("prefix_id", "prefix_len", "tenant"):
                data[field].append(data[field][r])
        else:
            data["ids"].append(list(data["ids"][r]))
            data["file"].append(data["file"][r])
    return prompt, output, data


def ragged(ident, prompt, B, **kw):
    offsets, ids = pk.picker_block_ids(ident, np.asarray(prompt), B, **kw)
    return [ids[offsets[r]:offsets[r + 1]].tolist() for r in range(len(prompt))]


@pytest.mark.parametrize("kind", pb.KINDS)
def test_picker_ids_match_the_literal_reference(kind):
    rng = np.random.default_rng({"groups": 11, "chains": 12, "sessions": 13}[kind])
    for case in range(150):
        prompt, output, data = picker_case(kind, rng)
        ident = identity(kind, data, prompt, output)
        for B in (1, 3, 4, 16, 64):
            for cap in (None, pk.MAX_PREFIX_TOKENS, 7):
                want = ref_picker_ids(kind, data, prompt, output, B, cap)
                got = pk.picker_block_ids(ident, np.asarray(prompt), B, max_tokens=cap)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (case, B, cap, data)


def test_random_cases_share_partial_chunks():
    """The random cases are not vacuous: at B = 3 many trailing partial chunks are shared."""
    rng = np.random.default_rng(5)
    shared = 0
    for kind in ("groups", "chains"):
        for _ in range(60):
            prompt, output, data = picker_case(kind, rng)
            offsets, ids = pk.picker_block_ids(identity(kind, data, prompt, output), np.asarray(prompt), 3)
            partial = ids[offsets[1:][np.asarray(prompt) % 3 != 0] - 1]
            shared += len(partial) - len(np.unique(partial))
    assert shared > 20


def test_groups_by_hand_at_4_tokens():
    """B = 4. r0: group a, prefix_len 8, prompt 10: chunks end at tokens 3, 7, 9: (a, 3) -> 0,
    (a, 7) -> 1, the partial chunk 8-9 is past the prefix: its own -> 2. r1: group a,
    prefix_len 6, prompt 9: (a, 3) -> 0; the chunk ending at 7 is past 6: own -> 3; the
    partial chunk (token 8) own -> 4. r2: group a, prefix_len 10, prompt 10: (a, 3) -> 0,
    (a, 7) -> 1, and its partial chunk (tokens 8-9) is r0's exactly when r0's is the
    group's too: here r0's prefix ends at 8, so r2's is new -> 5. r3: a copy of r2 (prompt
    10, prefix 10): all three shared with r2 -> 0, 1, 5. r4: prompt 9, prefix 10 (clipped):
    0, 1, then a partial chunk of ONE token (8): another length than r2's -> 6."""
    prompt = [10, 9, 10, 10, 9]
    ident = pb.groups(["a", "a", "a", "a", "a"], [8, 6, 10, 10, 10], [0] * 5)
    assert ragged(ident, prompt, 4) == [[0, 1, 2], [0, 3, 4], [0, 1, 5], [0, 1, 5], [0, 1, 6]]
    assert ragged(ident, prompt, 4, max_tokens=8) == [[0, 1], [0, 2], [0, 1], [0, 1], [0, 1]]


def test_chains_by_hand_at_16_tokens():
    """H = 32, B = 16 (test_prefix_blocks' chains). r0 [7, 9] prompt 64: chunks end at 15,
    31 (node [7]), 47, 63 (node [7, 9]) -> 0, 1, 2, 3. r1 [7, 9, 4] prompt 80: the same four,
    then 79 on [7, 9, 4] -> 4. r2 [7, 5] prompt 50: 0, 1, 47 on [7, 5] -> 5, and a partial
    chunk 48-49 (last token 49 on [7, 5]) -> 6. r3 [7] prompt 100: 0, 1, then chunks ending
    at 47, 63, 79, 95 and the partial 96-99 past its list, its own -> 7 .. 11. r4 [7, 5]
    prompt 50 again: 0, 1, 5, 6 (the partial chunk is shared: same tokens, same length)."""
    ident = pb.chains([[7, 9], [7, 9, 4], [7, 5], [7], [7, 5]], 32)
    assert ragged(ident, [64, 80, 50, 100, 50], 16) == [[0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 5, 6],
                                                        [0, 1, 7, 8, 9, 10, 11], [0, 1, 5, 6]]


def test_sessions_by_hand_at_16_tokens():
    """Session s: r0 prompt 20 + output 30; r2 prompt 70 begins with r0's 50 tokens; r3
    prompt 90 begins with r2's 80. B = 16: r0: (s, 15) -> 0, partial (s, 19) -> 1. r1
    (session t, 40): (t, 15), (t, 31), partial (t, 39) -> 2, 3, 4. r2: (s, 15) -> 0, then
    (s, 31), (s, 47), (s, 63) -> 5, 6, 7, partial (s, 69) -> 8. r3: 0, 5, 6, 7, (s, 79) -> 9,
    partial (s, 89) -> 10. r0's partial chunk (tokens 16-19) is not r2's full chunk 16-31."""
    ident = pb.sessions(["s", "t", "s", "s"], [20, 40, 70, 90], [30, 8, 10, 5])
    assert ragged(ident, [20, 40, 70, 90], 16) == [[0, 1], [2, 3, 4], [0, 5, 6, 7, 8], [0, 5, 6, 7, 9, 10]]


def test_padded_rows():
    offsets, ids = np.array([0, 2, 2, 5]), np.array([0, 1, 2, 3, 4])
    blocks, num = pk.padded(offsets, ids)
    assert blocks.tolist() == [[0, 1, -1], [-1, -1, -1], [2, 3, 4]] and num.tolist() == [2, 0, 3]
    assert pk.padded(offsets, ids, 4)[0].shape == (3, 4)
    with pytest.raises(InputError, match="3 picker blocks, more than the 2 allowed"):
        pk.padded(offsets, ids, 2)
    assert pk.engine_blocks([0, 1, 16, 17], 16).tolist() == [0, 1, 1, 2]


# ---- llm-d's own tests, ported (llm-d/llm-d-router@ebab6879) -------------------------------
# pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/plugin_test.go


def _one(prompt, B, **kw):
    return ragged(pb.groups([None], [0], [0]), [prompt], B, **kw)[0]


def test_llmd_TestProduce_two_tokens_make_two_blocks():
    """plugin_test.go TestProduce: tokens [1, 2] at blockSizeTokens 1 -> 2 blocks."""
    assert len(_one(2, 1)) == 2


def test_llmd_TestPrefixPluginAutoTune_partial_chunk_counts():
    """plugin_test.go TestPrefixPluginAutoTune: 192 tokens at the pod's block size 128 -> 2
    blocks (the trailing 64 tokens are a chunk); 128 >= 64 passes the clamp unchanged."""
    assert pk.picker_block_size(128) == 128
    assert len(_one(192, pk.picker_block_size(128))) == 2


def test_llmd_TestMaxPrefixTokensToMatch_and_both_caps_zero():
    """plugin_test.go TestMaxPrefixTokensToMatch: 4 tokens, B = 1, MaxPrefixTokensToMatch 2 ->
    2 blocks; TestMaxPrefixBothCapsZeroMatchesEverything: no cap -> all 4."""
    assert len(_one(4, 1, max_tokens=2)) == 2
    assert len(_one(4, 1, max_tokens=None)) == 4
    assert len(_one(200_000, 64)) == 131072 // 64  # the default cap, 2,048 blocks


def test_llmd_TestGetBlockSize_clamps():
    """plugin_test.go TestGetBlockSize_AutotuneClampsBelowMinimum (16 -> 64),
    _AutotuneAboveMinimumPassesThrough (128 -> 128), _ManualConfigClampedBelowMinimum
    (32 -> 64), _AutotuneFallbackClampsLowConfig (the default 16 -> 64); the tests'
    disableMinBlockSizeClamp is floor=1."""
    assert [pk.picker_block_size(b) for b in (16, 128, 32)] == [64, 128, 64]
    assert pk.picker_block_size(1, floor=1) == 1


def test_llmd_TestPrefixPluginPrefixGrowth_blocks():
    """plugin_test.go TestPrefixPluginPrefixGrowth: B = 2; tokens 1..6 -> 3 blocks; tokens
    1..12 (extending them) -> 6 blocks whose first 3 are the first request's."""
    first, second = ragged(pb.groups(["p", "p"], [6, 6], [0, 0]), [6, 12], 2)
    assert len(first) == 3 and len(second) == 6 and second[:3] == first and not set(second[3:]) & set(first)
