"""Prefix identity from the content (vtc_jax/inputs/prefix_blocks.py): block ids at any
block size and shared tokens, against a slow literal reference (every token's identity
tuple, block = the tuple of its tokens through its last one, interned) on random small
cases of each kind, hand-worked cases, and the readers that keep chains and sessions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.inputs import prefix_blocks as pb
from vtc_jax.inputs import request_log

# ---- the literal reference -------------------------------------------------------------


def ref_tokens(kind, data, prompt, output, through):
    """Per request, the list of its tokens' identities (a token is who wrote it and where)."""
    n = len(prompt)
    seqs = []
    for r in range(n):
        ext = prompt[r] + (output[r] if through == "sequence" else 0)
        toks = []
        for t in range(ext):
            own = ("own", r, t)
            if t >= prompt[r]:
                toks.append(own)
            elif kind == "groups":
                gid, plen, tenant = data["prefix_id"][r], data["prefix_len"][r], data["tenant"][r]
                group = ("id", gid) if gid is not None else ("tenant", tenant)
                toks.append(("group", group, t) if t < plen else own)
            elif kind == "chains":
                ids, H = data["ids"][r], data["H"]
                toks.append(("hash", data["file"][r], ids[t // H], t % H) if t // H < len(ids) else own)
            else:
                toks.append(own)
        seqs.append(toks)
    if kind == "sessions":  # turn k's first P_{k-1} + O_{k-1} tokens ARE turn k-1's sequence
        full = []
        last: dict = {}
        for r in range(n):
            mine = [("own", r, t) for t in range(prompt[r] + output[r])]
            s = data["session"][r]
            if s is not None and s in last:
                prev = full[last[s]]
                mine[: len(prev)] = prev
            if s is not None:
                last[s] = r
            full.append(mine)
        seqs = [full[r][: prompt[r] + (output[r] if through == "sequence" else 0)] for r in range(n)]
    return seqs


def ref_block_ids(kind, data, prompt, output, B, through="prompt"):
    """(offsets, ids): block j of r is the tuple of r's tokens 0 .. (j+1)B - 1, interned."""
    seqs = ref_tokens(kind, data, prompt, output, through)
    table: dict = {}
    ids, offsets = [], [0]
    for toks in seqs:
        for j in range(len(toks) // B):
            ids.append(table.setdefault(tuple(toks[: (j + 1) * B]), len(table)))
        offsets.append(len(ids))
    return np.asarray(offsets, np.int64), np.asarray(ids, np.int64)


def ref_shared(kind, data, prompt, output, through="prompt"):
    """Per request, the longest common prefix of its prompt with any earlier request's tokens."""
    mine = ref_tokens(kind, data, prompt, output, "prompt")
    theirs = ref_tokens(kind, data, prompt, output, through)
    out = []
    for r, toks in enumerate(mine):
        best = 0
        for q in range(r):
            k = 0
            while k < len(toks) and k < len(theirs[q]) and toks[k] == theirs[q][k]:
                k += 1
            best = max(best, k)
        out.append(best)
    return np.asarray(out, np.int64)


def identity(kind, data, prompt, output):
    if kind == "groups":
        return pb.groups(data["prefix_id"], data["prefix_len"], data["tenant"])
    if kind == "chains":
        return pb.chains(data["ids"], data["H"], data["file"])
    return pb.sessions(data["session"], prompt, output)


# ---- random small cases ----------------------------------------------------------------


def random_case(kind, rng):
    n = int(rng.integers(1, 8))
    prompt = rng.integers(1, 40, n).tolist()
    output = rng.integers(1, 12, n).tolist()
    data: dict = {}
    if kind == "groups":
        data["prefix_id"] = [None if rng.random() < 0.3 else "abc"[rng.integers(0, 3)] for _ in range(n)]
        data["prefix_len"] = [int(rng.integers(0, p + 1)) for p in prompt]
        data["tenant"] = rng.integers(0, 2, n).tolist()
    elif kind == "chains":
        H = int(rng.choice([1, 2, 3, 5, 8]))
        chained = rng.random() < 0.5  # Mooncake-like (an id names its prefix) or arbitrary lists
        ids = []
        for p in prompt:
            full = -(-p // H)
            k = int(rng.integers(0, full + 1)) if rng.random() < 0.4 else full
            lst = []
            for _d in range(k):
                choice = int(rng.integers(0, 2))
                lst.append(hash((tuple(lst), choice)) % 1000 if chained else int(rng.integers(0, 3)))
            ids.append(lst)
        data.update(ids=ids, H=H, file=rng.integers(0, 1 + (rng.random() < 0.3), n).tolist())
    else:
        session = [None if rng.random() < 0.2 else int(rng.integers(0, 3)) for _ in range(n)]
        last: dict = {}
        for r, s in enumerate(session):  # each turn's prompt extends its session's last sequence
            if s is not None and s in last:
                q = last[s]
                prompt[r] = prompt[q] + output[q] + int(rng.integers(0, 6))
            if s is not None:
                last[s] = r
        data["session"] = session
    return prompt, output, data


@pytest.mark.parametrize("kind", pb.KINDS)
def test_block_ids_match_the_literal_reference(kind):
    rng = np.random.default_rng({"groups": 1, "chains": 2, "sessions": 3}[kind])
    for case in range(150):
        prompt, output, data = random_case(kind, rng)
        ident = identity(kind, data, prompt, output)
        for B in (1, 3, 16, 64, 512):
            for through in pb.THROUGH:
                want = ref_block_ids(kind, data, prompt, output, B, through)
                got = pb.block_ids(ident, np.asarray(prompt), np.asarray(output), B, through=through)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (case, B, through, data)
        for through in pb.THROUGH:
            want = ref_shared(kind, data, prompt, output, through)
            got = pb.shared_tokens(ident, np.asarray(prompt), np.asarray(output), through=through)
            assert np.array_equal(got, want), (case, through, data, prompt, output)


def test_random_cases_share_blocks():
    """The random cases are not vacuous: many blocks are shared at B = 3."""
    rng = np.random.default_rng(7)
    shared = 0
    for kind in pb.KINDS:
        for _ in range(40):
            prompt, output, data = random_case(kind, rng)
            _, ids = pb.block_ids(identity(kind, data, prompt, output), prompt, output, 3)
            shared += len(ids) - len(np.unique(ids))
    assert shared > 200


# ---- hand-worked cases -----------------------------------------------------------------


def ragged(ident, prompt, output, B, through="prompt"):
    offsets, ids = pb.block_ids(ident, np.asarray(prompt), np.asarray(output), B, through=through)
    return [ids[offsets[r]:offsets[r + 1]].tolist() for r in range(len(prompt))]


def test_groups_by_hand_at_4_tokens():
    """B = 4. r0: group a, prefix_len 8, prompt 10: blocks 0-3 and 4-7 are the group's
    (their last tokens 3, 7 < 8): (a,0) -> 0, (a,1) -> 1. r1: group a, prefix_len 6, prompt 9:
    block 0 (last 3 < 6) is (a,0) -> 0, block 1 (last 7 >= 6) its own -> 2. r2: no group,
    prompt 8: two blocks of its own -> 3, 4. Shared tokens: r1 holds min(6, 8) = 6 of r0's."""
    prompt, output = [10, 9, 8], [3, 2, 1]
    ident = pb.groups(["a", "a", None], [8, 6, 0], [0, 0, 0])
    assert ragged(ident, prompt, output, 4) == [[0, 1], [0, 2], [3, 4]]
    assert pb.shared_tokens(ident, np.asarray(prompt), np.asarray(output)).tolist() == [0, 6, 0]
    tenant = pb.groups([None, None, None], [4, 4, 4], [0, 1, 0])  # no prefix_id: shared within the tenant
    assert ragged(tenant, prompt, output, 4) == [[0, 1], [2, 3], [0, 4]]


CHAIN_PROMPT, CHAIN_OUTPUT = [64, 80, 50, 100], [10, 5, 20, 1]
CHAIN_IDS = [[7, 9], [7, 9, 4], [7, 5], [7]]  # H = 32


def test_chains_by_hand_at_16_and_64_tokens():
    """H = 32. r0 [7, 9] prompt 64; r1 [7, 9, 4] prompt 80; r2 [7, 5] prompt 50 (its block 5
    is partial: 18 tokens); r3 [7] prompt 100 (the list covers its first 32 tokens only).
    B = 16, ids by the block's last token p as (chain through p // 32, p % 32):
    r0: p 15, 31 on [7] -> 0, 1; p 47, 63 on [7,9] -> 2, 3.
    r1: the same four -> 0, 1, 2, 3; p 79 on [7,9,4] -> 4.
    r2: 50 // 16 = 3 blocks: 0, 1; p 47 on [7,5] -> 5.
    r3: 0, 1; p 47 .. 95 are past its list, its own -> 6, 7, 8, 9.
    B = 64: r0 p 63 -> 0; r1 p 63 -> 0; r2 none (50 < 64); r3 p 63 past its 32 -> 1.
    B = 64 through the sequence: r2 has 70 tokens, p 63 >= its covered 50: own -> 1; r3 -> 2.
    Shared tokens: r1 64 (all of r0), r2 32 (block [7]), r3 32 (its whole list)."""
    ident = pb.chains(CHAIN_IDS, 32)
    assert ragged(ident, CHAIN_PROMPT, CHAIN_OUTPUT, 16) == [[0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 5],
                                                             [0, 1, 6, 7, 8, 9]]
    assert ragged(ident, CHAIN_PROMPT, CHAIN_OUTPUT, 64) == [[0], [0], [], [1]]
    assert ragged(ident, CHAIN_PROMPT, CHAIN_OUTPUT, 64, "sequence") == [[0], [0], [1], [2]]
    assert pb.shared_tokens(ident, np.asarray(CHAIN_PROMPT), np.asarray(CHAIN_OUTPUT)).tolist() == [0, 64, 32, 32]
    other_file = pb.chains(CHAIN_IDS, 32, [0, 1, 0, 0])  # r1's ids are another file's: nothing shared with it
    assert ragged(other_file, CHAIN_PROMPT, CHAIN_OUTPUT, 64) == [[0], [1], [], [2]]


SESSION_PROMPT, SESSION_OUTPUT = [20, 40, 70, 90], [30, 8, 10, 5]
SESSIONS = ["s", "t", "s", "s"]


def test_sessions_by_hand_at_16_and_64_tokens():
    """Session s: r0 prompt 20 + output 30 = 50; r2 prompt 70 >= 50 begins with r0's 50
    tokens; r3 prompt 90 >= 80 begins with r2's. Session t: r1 alone (prompt 40).
    B = 16 over prompts: r0 (s,0) -> 0; r1 (t,0), (t,1) -> 1, 2; r2 (s,0..3) -> 0, 3, 4, 5;
    r3 (s,0..4) -> 0, 3, 4, 5, 6.
    B = 16 through the sequence (vLLM V1 caches decode's blocks): r0's 50 tokens make
    (s,0..2) -> 0, 1, 2 and r2's block 1 (tokens 16-31, r0's output from 20) hits r0's:
    r1 -> 3, 4, 5; r2 -> 0, 1, 2, 6, 7; r3 -> 0, 1, 2, 6, 7.
    B = 64: r2 and r3 share (s,0) -> 0. Shared tokens over prompts: r2 20, r3 70; over
    sequences: r2 50, r3 80."""
    ident = pb.sessions(SESSIONS, SESSION_PROMPT, SESSION_OUTPUT)
    p, o = SESSION_PROMPT, SESSION_OUTPUT
    assert ragged(ident, p, o, 16) == [[0], [1, 2], [0, 3, 4, 5], [0, 3, 4, 5, 6]]
    assert ragged(ident, p, o, 16, "sequence") == [[0, 1, 2], [3, 4, 5], [0, 1, 2, 6, 7], [0, 1, 2, 6, 7]]
    assert ragged(ident, p, o, 64) == [[], [], [0], [0]]
    assert pb.shared_tokens(ident, np.asarray(p), np.asarray(o)).tolist() == [0, 0, 20, 70]
    assert pb.shared_tokens(ident, np.asarray(p), np.asarray(o), through="sequence").tolist() == [0, 0, 50, 80]


def test_a_turn_shorter_than_its_predecessor_is_refused():
    with pytest.raises(InputError, match=r"request 2: its prompt 49 is shorter .* \(request 0: prompt \+ output 50\)"):
        pb.sessions(SESSIONS, [20, 40, 49, 90], SESSION_OUTPUT)


# ---- the readers keep chains and sessions ----------------------------------------------


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_mooncake_reader_keeps_the_chains(tmp_path):
    """The chains hand case scaled by 16 (H = 512, prompts 1,024 .. 1,600: block 256 here is
    block 16 there), lines out of time order: the log is in time order (t 0, 5, 7, 9), each
    request with its own list, so the ids are the hand case's in that order."""
    rows = [(5, 64, 10, [7, 9]), (0, 80, 5, [7, 9, 4]), (9, 50, 20, [7, 5]), (7, 100, 1, [7])]
    text = "".join(json.dumps({"timestamp": t, "input_length": 16 * p, "output_length": o, "hash_ids": h}) + "\n"
                   for t, p, o, h in rows)
    log = request_log.read_requests(write(tmp_path, "m.jsonl", text))
    assert log.hash_ids == ((7, 9, 4), (7, 9), (7,), (7, 5)) and log.hash_block == 512 and log.session is None
    assert log.prefix_id == ("7/9", "7/9", "7", "7/5")  # the group columns as before
    ident = pb.of_log(log)
    assert ident.kind == "chains"
    assert ragged(ident, log.prompt, log.output, 256) == [[0, 1, 2, 3, 4], [0, 1, 2, 3], [0, 1, 5, 6, 7, 8], [0, 1, 9]]
    assert ragged(ident, log.prompt, log.output, 1024) == [[0], [0], [1], []]
    small = write(tmp_path, "small.jsonl", text.replace('"input_length": 1024', '"input_length": 64'))
    assert request_log.read_requests(small, hash_block=32).prompt.tolist() == [1280, 64, 1600, 800]
    with pytest.raises(InputError, match=r"line 1: hash_ids has 2 blocks of 512 tokens, more than input_length 64"):
        request_log.read_requests(small)
    with pytest.raises(InputError, match=r"--hash-block 0: must be"):
        request_log.read_requests(small, hash_block=0)


def test_csv_readers_take_sessions_and_hash_ids(tmp_path):
    log_csv = write(tmp_path, "s.csv", "timestamp,tenant,prompt,output,session_id\n"
                                       "0.0,a,20,30,s\n0.5,b,40,8,t\n1.0,a,70,10,s\n2.0,a,90,5,s\n3.0,a,5,5,\n")
    log = request_log.read_requests(log_csv)
    assert log.session == ("s", "t", "s", "s", None) and log.hash_ids is None
    assert "session_id" in log.columns
    assert ragged(pb.of_log(log), log.prompt, log.output, 16) == [[0], [1, 2], [0, 3, 4, 5], [0, 3, 4, 5, 6], []]
    trace = write(tmp_path, "t.csv", "arrival,client,prompt,output,hash_ids\n"
                                     "0,0,64,10,7|9\n1,1,80,5,7 9 4\n2,0,50,20,7|5\n3,1,100,1,7\n4,0,9,1,\n")
    log = request_log.read_requests(trace, hash_block=32)
    assert log.hash_ids == ((7, 9), (7, 9, 4), (7, 5), (7,), ())
    assert ragged(pb.of_log(log), log.prompt, log.output, 64) == [[0], [0], [], [1], []]


@pytest.mark.parametrize("text, message", [
    ("timestamp,tenant,prompt,output,session_id\n0,a,20,30,s\n1,a,49,1,s\n",
     r"s.csv: line 3: session s: prompt 49 is shorter than the previous turn's prompt \+ output \(20 \+ 30 at "),
    ("arrival,client,prompt,output,hash_ids\n0,0,64,10,7|x\n", r"s.csv: line 2: hash_ids must be integers"),
    ("arrival,client,prompt,output,hash_ids\n0,0,64,10,1|2|3\n",
     r"s.csv: line 2: hash_ids has 3 blocks of 512 tokens, more than the prompt 64 fills"),
    ("arrival,client,prompt,output,hash_ids,session_id\n0,0,64,10,1,s\n", r"give hash_ids or session_id, not both"),
])
def test_bad_content_columns_are_one_line(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        request_log.read_requests(write(tmp_path, "s.csv", text))


def test_filters_keep_the_content_of_each_kept_request(tmp_path):
    """Dropping a middle turn (its prompt over the memory) keeps a valid session: the next
    turn still begins with everything the dropped one held."""
    log = request_log.read_requests(write(tmp_path, "s.csv", "timestamp,tenant,prompt,output,session_id\n"
                                          "0,a,20,30,s\n1,a,70,10,s\n2,a,90,5,s\n"))
    kept, dropped = request_log.servable(log, 75)
    assert dropped == 1 and kept.session == ("s", "s")
    assert ragged(pb.of_log(kept), kept.prompt, kept.output, 16) == [[0], [0, 1, 2, 3]]


def test_mooncake_conversation_group_rule_keeps_93_4_percent():
    """The exact chains' shared prompt tokens on Mooncake's conversation trace (token
    granularity, an unbounded cache) against the group rule's (prefix_id, prefix_len)."""
    log = request_log.read_requests("data/mooncake_fast25/conversation_trace.jsonl")
    exact = pb.shared_tokens(pb.of_log(log), log.prompt, log.output)
    group = pb.shared_tokens(pb.of_log(log, "groups"), log.prompt, log.output)
    assert (int(exact.sum()), int(group.sum())) == (54_098_411, 50_551_432)
    assert round(group.sum() / exact.sum(), 4) == 0.9344
    assert int((group > exact).sum()) == 116  # the group rule also overstates
    assert np.array_equal(np.minimum(exact, log.prompt - 1), log.cached)  # the reader's trie, capped
