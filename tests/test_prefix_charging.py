"""What a prefix cache serves, charged and reported: `--charge-prefill computed|sent` on
VTC's counters by hand, the hit rate per tenant in the latency table and bench_serve.json."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vtc_jax.cli.commands import main

# r0 (tenant a) at step 0 and r1 (tenant b) at step 5, prompts of 64 tokens sharing their
# first 48 (prefix group s), 2 output tokens each, blocks of 16 tokens.
LOG = "arrival,client,prompt,output,prefix_id,prefix_len\n0,a,64,2,s,48\n5,b,64,2,s,48\n"


@pytest.mark.parametrize(("charge", "service", "counters"), [("computed", [68, 20], [68, 88]),
                                                              ("sent", [68, 68], [68, 136])])
def test_charge_prefill_by_hand(tmp_path, charge, service, counters):
    """r0 prefills all 64 tokens at step 0 and its 4 blocks are hashed then (vLLM hashes a
    block when it is allocated); it finishes at step 1 and its blocks stay cached. r1 at
    step 5 finds its first (64 - 1) // 16 = 3 blocks cached (48 tokens of group s): the
    server computes 16. VTC (w_p 1, w_q 2) charges a: 64 + 2 x 2 = 68 either way; b:
    computed 16 + 4 = 20, sent 64 + 4 = 68. b arrives when nobody waits: its counter is
    lifted to the last one to leave, a's 68, before its charge: 88 or 136."""
    log, out = tmp_path / "hit.csv", tmp_path / "out.json"
    log.write_text(LOG)
    assert main(["replay", str(log), "--server", "vllm", "--policy", "vtc", "--num-gpu-blocks", "64",
                 "--charge-prefill", charge, "--json", str(out), "--no-cache"]) == 0
    got = json.loads(out.read_text())
    assert (got["service"], got["counters"]) == (service, counters)


def test_hit_rates_per_tenant_by_hand(tmp_path, capsys):
    """The same two requests timed (--preset, arrivals 0 and 1 s): a's hit rate 0 % (0 of
    64 prompt tokens), b's 75 % (48 of 64), all 37.5 %; bench_serve.json carries the counts."""
    log = tmp_path / "hit.csv"
    log.write_text("timestamp,tenant,prompt,output,prefix_id,prefix_len\n0,a,64,2,s,48\n1,b,64,2,s,48\n")
    out = tmp_path / "out"
    assert main(["compare", str(log), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--num-gpu-blocks", "64",
                 "--max-num-seqs", "4", "--policies", "fcfs", "--out", str(out), "--no-cache"]) == 0
    text = capsys.readouterr()
    assert "note: prefix caching on, as in vLLM V1" in text.err
    rows = {line.split()[1]: line.split()[-1] for line in text.out.splitlines()
            if line.startswith("fcfs ") and line.endswith("%")}  # the latency table's rows
    assert rows == {"a": "0.0%", "b": "75.0%", "all": "37.5%"}
    bench = json.loads((out / "bench_serve.json").read_text())
    fcfs = bench["policies"]["fcfs"] if "policies" in bench else bench["fcfs"]
    assert (fcfs["cached_tokens"], fcfs["prefix_cache_hit_rate"]) == (48, 0.375)


def _chains_log(rng, n: int, hash_block: int):
    """n requests, 10 s apart (each is done before the next arrives), whose hash_ids
    branch off an earlier request's list (probability 0.7, at a random depth) or start
    anew; prompts cover their lists partly or wholly."""
    lists, rows = [], []
    for i in range(n):
        if lists and rng.random() < 0.7:
            base = lists[int(rng.integers(len(lists)))]
            ids = base[: int(rng.integers(0, len(base) + 1))]
        else:
            ids = []
        ids = ids + [int(x) for x in rng.integers(1000 * (i + 1), 1000 * (i + 2), int(rng.integers(1, 5)))]
        prompt = int(rng.integers(max(1, (len(ids) - 1) * hash_block + 1), len(ids) * hash_block + 1))
        lists.append(ids)
        rows.append((10 * i, f"t{i % 2}", prompt, int(rng.integers(1, 4)), ids))
    return rows


def _literal_hits(rows, hash_block: int, block_size: int) -> list[int]:
    """Per request, the prompt tokens an unbounded prefix cache serves, from the token
    sequences themselves: token t of a request is (hash_ids[t // H], t % H) while its list
    covers t, else its own; the hit is the longest common prefix with any earlier request
    in whole blocks, at most (prompt - 1) // B blocks."""
    def tokens(i):
        _, _, prompt, _, ids = rows[i]
        return [(ids[t // hash_block], t % hash_block) if t // hash_block < len(ids) else ("own", i, t)
                for t in range(prompt)]

    out = []
    for i in range(len(rows)):
        mine, best = tokens(i), 0
        for j in range(i):
            theirs = tokens(j)
            lcp = 0
            while lcp < min(len(mine), len(theirs)) and mine[lcp] == theirs[lcp]:
                lcp += 1
            best = max(best, lcp // block_size)
        out.append(block_size * min(best, (rows[i][2] - 1) // block_size))
    return out


def test_a_pool_that_never_evicts_serves_what_the_token_sequences_share(tmp_path):
    """Random hash-id chains (H = 8 tokens an id, blocks of 4), requests far apart on a
    pool that never evicts: each request's cached_tokens is what a literal comparison of
    the token sequences gives (an independent computation), request by request."""
    import csv

    rng = np.random.default_rng(5)
    rows = _chains_log(rng, 14, 8)
    log = tmp_path / "chains.csv"
    with log.open("w") as f:
        f.write("timestamp,tenant,prompt,output,hash_ids\n")
        for t, who, prompt, output, ids in rows:
            f.write(f'{t},{who},{prompt},{output},"{" ".join(map(str, ids))}"\n')
    want = _literal_hits(rows, 8, 4)
    assert sum(w > 0 for w in want) >= 5  # the case shares
    out, requests = tmp_path / "out", tmp_path / "requests.csv"
    assert main(["compare", str(log), "--server", "vllm", "--preset", "qwen2.5-7b-h100", "--block-size", "4",
                 "--num-gpu-blocks", "4096", "--max-num-seqs", "4", "--hash-block", "8", "--policies", "fcfs",
                 "--out", str(out), "--requests-out", str(requests), "--no-cache"]) == 0
    got = [int(r["cached_tokens"]) for r in csv.DictReader(requests.open())]
    assert got == want
