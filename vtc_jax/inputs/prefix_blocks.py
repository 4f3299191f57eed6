"""Prefix identity from the content: which blocks of tokens two requests share, derived on
the host once (numpy, vectorized) from what a trace says about its content.

A trace says it in one of three ways (`ContentIdentity.kind`):
  - "groups" (`prefix_id`, `prefix_len` columns): requests with the same prefix_id agree on
    their first prefix_len prompt tokens; a prefix_len without a prefix_id is shared within
    the request's tenant (as the trace reader documents); every other token is the
    request's own.
  - "chains" (`hash_ids`, one id per H prompt tokens, H the block size they were made at:
    Mooncake's 512): token t of a request is (hash_ids[t // H], t % H). Two requests agree
    through token t exactly when their id lists agree on blocks 0..t // H (ids are compared
    as a list prefix, a trie: Mooncake's ids are chained, an id names its whole prefix, but
    no such assumption is made). A list shorter than ceil(prompt / H) covers its first
    len x H tokens only: the tokens past it are the request's own. A partial last block
    (prompt not a multiple of H) is identified like a full one, token by token: two
    requests with the same id there share the tokens both have. Lists of different files
    are never compared (Mooncake's ids are file-local).
  - "sessions" (`session_id`): turn k of a session (arrival order within the session,
    ties in file order) begins with turn k-1's whole sequence (prompt + output), so
    P_k >= P_{k-1} + O_{k-1}; a turn whose prompt is shorter is refused at read time (one
    line naming it: `session_break`). A session is then one growing string: token t of
    any turn is the session's token t. A request without a session id is its own.
Output tokens are always the request's own (a later turn of its session holds them as
its prompt).

Two blocks of B tokens (block j: tokens jB .. jB + B - 1) are the same block exactly when
the two requests' token sequences agree through the block's last token (vLLM's block hash:
a block's hash chains all tokens before it). `block_ids` gives every request's FULL blocks
(vLLM hashes full blocks only) a dense id at any B: 16 (vLLM), 64 (the fleet's endpoint
picker). `shared_tokens` gives, per request, the most prompt tokens any earlier request
holds at token granularity (an unbounded cache, no block rounding).

Speed (a shared 2-core machine, 2026-12-07): Mooncake's conversation trace (12,031
requests, prompts up to 126,195 tokens, 288,500 hash ids) derives its 9,044,013 16-token
block ids in 1.3 to 8 s depending on the load (the first call of a process is the
slowest: fresh memory; one sort of the blocks dominates), its 64-token ids in under 1 s,
and `shared_tokens` in 0.3 s.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vtc_jax.core.errors import InputError

KINDS = ("groups", "chains", "sessions")
THROUGH = ("prompt", "sequence")
_EMPTY = np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True)
class ContentIdentity:
    """A trace's content identity (module docstring), per request in arrival order.

    kind: one of KINDS. key: int64[N], groups: the request's group (-1: none), sessions: its
    session (-1: none), chains: its file (lists of different files never compared).
    prefix_len: int64[N] (groups; zeros otherwise). offsets: int64[N+1], hashes:
    int64[total] (chains: request r's ids are hashes[offsets[r]:offsets[r+1]]).
    hash_block: H, the tokens per id (chains)."""

    kind: str
    key: np.ndarray
    prefix_len: np.ndarray
    offsets: np.ndarray
    hashes: np.ndarray
    hash_block: int = 512

    def __len__(self) -> int:
        return int(self.key.shape[0])


def _dense(labels) -> np.ndarray:
    """int64[N]: labels numbered by first appearance, None -> -1."""
    ids: dict = {}
    return np.fromiter((-1 if x is None else ids.setdefault(x, len(ids)) for x in labels), np.int64, len(labels))


def groups(prefix_id, prefix_len, tenant) -> ContentIdentity:
    """Groups: prefix_id (label or None per request), prefix_len int64[N], tenant int64[N]
    (the group of a prefix_len > 0 without a prefix_id)."""
    prefix_len = np.asarray(prefix_len, np.int64)
    tenant = np.asarray(tenant, np.int64)
    labels = [("id", g) if g is not None else (("tenant", int(t)) if n > 0 else None)
              for g, n, t in zip(prefix_id, prefix_len.tolist(), tenant.tolist())]
    n = len(labels)
    return ContentIdentity("groups", _dense(labels), prefix_len, np.zeros(n + 1, np.int64), _EMPTY)


def chains(id_lists, hash_block: int = 512, file=None) -> ContentIdentity:
    """Chains: id_lists, a sequence of int sequences (ids >= 0; empty: no ids), H = hash_block;
    file int64[N] (default all 0): lists of different files are never compared."""
    if int(hash_block) < 1:
        raise InputError(f"hash block {hash_block}: must be >= 1 token")
    lengths = np.fromiter(map(len, id_lists), np.int64, len(id_lists))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    hashes = np.fromiter((h for ids in id_lists for h in ids), np.int64, int(offsets[-1]))
    key = np.zeros(len(id_lists), np.int64) if file is None else np.asarray(file, np.int64)
    return ContentIdentity("chains", key, np.zeros(len(id_lists), np.int64), offsets, hashes, int(hash_block))


def sessions(session_id, prompt, output, file=None) -> ContentIdentity:
    """Sessions: session_id (label or None per request, arrival order), checked against
    the rule P_k >= P_{k-1} + O_{k-1} (InputError naming the request's index otherwise);
    file int64[N] (default all 0): sessions of different files are different sessions."""
    key = session_key(session_id, file)
    broken = session_break(key, prompt, output)
    if broken is not None:
        k, prev = broken
        raise InputError(f"request {k}: its prompt {int(prompt[k]):,} is shorter than the previous turn of its session "
                         f"(request {prev}: prompt + output {int(prompt[prev]) + int(output[prev]):,})")
    n = len(key)
    return ContentIdentity("sessions", key, np.zeros(n, np.int64), np.zeros(n + 1, np.int64), _EMPTY)


def session_key(session_id, file=None) -> np.ndarray:
    """int64[N]: each request's session numbered by first appearance (-1: none); a label
    names one session per file (file int64[N], default all 0)."""
    file = np.zeros(len(session_id), np.int64) if file is None else np.asarray(file, np.int64)
    return _dense([None if s is None else (int(f), s) for s, f in zip(session_id, file.tolist())])


def session_break(key, prompt, output) -> tuple[int, int] | None:
    """(k, previous turn) of the first request (index order) whose prompt is shorter than
    the previous turn of its session's prompt + output, None when every turn extends the
    last. key int64[N]: session (-1: none)."""
    key = np.asarray(key, np.int64)
    idx = np.flatnonzero(key >= 0)
    if idx.size < 2:
        return None
    order = idx[np.argsort(key[idx], kind="stable")]  # by session, then index
    same = key[order[1:]] == key[order[:-1]]
    seq = np.asarray(prompt, np.int64)[order[:-1]] + np.asarray(output, np.int64)[order[:-1]]
    bad = same & (np.asarray(prompt, np.int64)[order[1:]] < seq)
    if not bad.any():
        return None
    at = np.flatnonzero(bad)
    first = at[np.argmin(order[1:][at])]
    return int(order[1:][first]), int(order[:-1][first])


def _extent(prompt, output, through: str) -> np.ndarray:
    if through not in THROUGH:
        raise ValueError(f"through={through!r}: one of {THROUGH}")
    prompt = np.asarray(prompt, np.int64)
    return prompt if through == "prompt" else prompt + np.asarray(output, np.int64)


def _intern(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int64[n]: dense ids of the pairs (a[i], b[i]), numbered by first appearance."""
    n = a.shape[0]
    if n == 0:
        return _EMPTY
    a_low, span = int(a.min()), int(b.max()) + 1
    if (int(a.max()) - a_low + 1) * span < 1 << 62:  # one int64 key: a single sort
        _, first, inverse = np.unique((a - a_low) * span + b, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(np.stack([a, b], 1), axis=0, return_index=True, return_inverse=True)
    rank = np.empty(first.shape[0], np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
    return rank[inverse.reshape(-1)]


def _trie_nodes(ident: ContentIdentity) -> np.ndarray:
    """int64[total]: each chain element's trie node (dense, >= 0): two elements have one node
    exactly when their lists (and files) agree up to and including them. One level of the
    trie per pass (Mooncake: about 250 levels)."""
    lengths = np.diff(ident.offsets)
    total = int(ident.offsets[-1])
    nodes = np.empty(total, np.int64)
    if total == 0:
        return nodes
    depth = np.arange(total, dtype=np.int64) - np.repeat(ident.offsets[:-1], lengths)
    row = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
    used = 0
    for d in range(len(bounds) - 1):
        at = by_depth[bounds[d]:bounds[d + 1]]
        parent = -1 - ident.key[row[at]] if d == 0 else nodes[at - 1]
        ids = _intern(parent, ident.hashes[at])
        nodes[at] = ids + used
        used += int(ids.max()) + 1
    return nodes


def token_classes(ident: ContentIdentity, prompt, req, last, position) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) int64[n]: a key pair per (request req[i], its token last[i]) that is equal
    exactly for tokens whose sequences agree through them (module docstring): a shared
    token's group, session or trie node and its place; a token of the request's own is
    (-1 - req, position[i]), the caller's place for it (a block's index; a chunk's last
    token, where a partial chunk's length counts). `_intern` numbers the pairs."""
    own = -1 - req
    if ident.kind == "groups":
        shared = (ident.key[req] >= 0) & (last < ident.prefix_len[req])
        return np.where(shared, ident.key[req], own), position
    if ident.kind == "sessions":
        return np.where(ident.key[req] >= 0, ident.key[req], own), position
    if ident.kind == "chains":
        H = ident.hash_block
        covered = np.minimum(np.diff(ident.offsets) * H, np.asarray(prompt, np.int64))
        shared = last < covered[req]
        nodes = _trie_nodes(ident)
        at = np.where(shared, ident.offsets[req] + last // H, 0)
        # a trie node fixes the depth last // H, so (node, last % H) fixes last
        return np.where(shared, nodes[at] if nodes.size else 0, own), np.where(shared, last % H, position)
    raise ValueError(f"kind {ident.kind!r}: one of {KINDS}")


def block_ids(ident: ContentIdentity, prompt, output, block_size: int, *, through: str = "prompt"):
    """(offsets int64[N+1], ids int64[total]): request r's full blocks of `block_size` tokens
    are ids[offsets[r]:offsets[r+1]], block j first; two blocks have one id exactly when
    the two requests' tokens agree through the block's last token (module docstring). Ids
    are dense, >= 0, numbered by first appearance (request order, then block order).
    through: "prompt" (the prompt's full blocks) or "sequence" (prompt + output: vLLM V1
    caches the blocks decode fills too)."""
    B = int(block_size)
    if B < 1:
        raise ValueError(f"block_size {block_size}: must be >= 1")
    extent = _extent(prompt, output, through)
    count = extent // B
    offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    total = int(offsets[-1])
    req = np.repeat(np.arange(len(count), dtype=np.int64), count)
    j = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], count)
    last = (j + 1) * B - 1  # the block's last token
    return offsets, _intern(*token_classes(ident, prompt, req, last, j))


def _earlier_max(seg: np.ndarray, value: np.ndarray) -> np.ndarray:
    """int64[n]: per element (index order), the largest value of an EARLIER element of the
    same segment (seg int64[n] >= 0), -1 when none. value >= 0."""
    n = seg.shape[0]
    out = np.full(n, -1, np.int64)
    if n == 0:
        return out
    order = np.lexsort((np.arange(n), seg))
    s, v = seg[order], value[order]
    big = int(v.max()) + 2
    run = np.maximum.accumulate((s - int(s.min())) * big + v + 1)  # +1: an empty run is 0
    prev = np.empty(n, np.int64)
    prev[0] = 0
    prev[1:] = run[:-1] - (s[1:] - int(s.min())) * big
    prev[1:][s[1:] != s[:-1]] = 0
    out[order] = prev - 1
    return out


def shared_tokens(ident: ContentIdentity, prompt, output, *, through: str = "prompt") -> np.ndarray:
    """int64[N]: per request, the most of its prompt tokens that any EARLIER request (index
    order: arrival) holds, at token granularity: the longest common prefix of the two token
    sequences, the earlier request's taken through its prompt or its whole sequence
    (`through`). An unbounded cache's hits before vLLM's block rounding and its
    prompt - 1 cap. For groups this is the group rule: min(prefix_len, the largest
    prefix_len of an earlier request of the group)."""
    prompt = np.asarray(prompt, np.int64)
    extent = _extent(prompt, output, through)
    out = np.zeros(len(prompt), np.int64)
    if ident.kind in ("groups", "sessions"):
        mine = ident.prefix_len if ident.kind == "groups" else prompt
        theirs = ident.prefix_len if ident.kind == "groups" else extent
        has = np.flatnonzero(ident.key >= 0)
        best = _earlier_max(ident.key[has], theirs[has])
        out[has] = np.maximum(np.minimum(mine[has], best), 0)
        return out
    if ident.kind != "chains":
        raise ValueError(f"kind {ident.kind!r}: one of {KINDS}")
    H = ident.hash_block
    lengths = np.diff(ident.offsets)
    covered = np.minimum(lengths * H, prompt)
    nodes = _trie_nodes(ident)
    row = np.repeat(np.arange(len(prompt), dtype=np.int64), lengths)
    depth = np.arange(nodes.size, dtype=np.int64) - np.repeat(ident.offsets[:-1], lengths)
    best = _earlier_max(nodes, covered[row])  # the most covered tokens of an earlier request at this node
    value = np.minimum(np.minimum(covered[row], (depth + 1) * H), best)
    np.maximum.at(out, row, np.maximum(value, 0))
    return out


def of_log(log, kind: str | None = None) -> ContentIdentity:
    """The content identity of a request_log.RequestLog: `kind`, or the exactest it has
    (chains when it has hash ids, sessions when it has session ids, else groups)."""
    if kind is None:
        kind = "chains" if log.hash_ids is not None else "sessions" if log.session is not None else "groups"
    if kind == "chains":
        if log.hash_ids is None:
            raise InputError(f"{', '.join(log.sources)}: no hash_ids to take prefix chains from")
        return chains(log.hash_ids, log.hash_block, log.file)
    if kind == "sessions":
        if log.session is None:
            raise InputError(f"{', '.join(log.sources)}: no session_id to take sessions from")
        return sessions(log.session, log.prompt, log.output, log.file)
    if kind == "groups":
        return groups(log.prefix_id, log.prefix_len, log.client)
    raise ValueError(f"kind {kind!r}: one of {KINDS}")


@dataclasses.dataclass(frozen=True, eq=False)
class PrefixTable:
    """A trace's content identity as a server setting (`vllm_prefix`'s `prefix_blocks`):
    hashable by content (a digest), so lanes and settings holding one compare cheaply.

    ident: the identity in the trace's order; prompt, output: int64[N] (trace order);
    order: int64[N], the trace index of each ORDER rank (rank in (arrival, trace row)
    order: the engine's ORDER field). `blocks(B)` gives the block ids by ORDER."""

    ident: ContentIdentity
    prompt: np.ndarray
    output: np.ndarray
    order: np.ndarray
    digest: str

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, PrefixTable) and other.digest == self.digest

    def __len__(self) -> int:
        return int(self.order.shape[0])

    def __repr__(self) -> str:  # settings print their options: no arrays
        return f"PrefixTable({self.ident.kind}, {len(self)} requests)"

    def as_json(self) -> dict:
        return {"content": self.ident.kind, "requests": len(self), "digest": self.digest}

    def blocks(self, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets int64[N+1], ids int64[total]) by ORDER: request of rank r's full blocks
        through its whole sequence (prompt + output: vLLM hashes the blocks decode fills
        too) are ids[offsets[r]:offsets[r+1]]; ids dense from 0 (`block_ids`)."""
        key = (self.digest, int(block_size))
        if key not in _BLOCKS:
            offsets, ids = block_ids(self.ident, self.prompt, self.output, block_size, through="sequence")
            count = np.diff(offsets)[self.order]
            start = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
            at = np.repeat(offsets[:-1][self.order] - start[:-1], count) + np.arange(int(start[-1]), dtype=np.int64)
            if len(_BLOCKS) >= 8:
                _BLOCKS.pop(next(iter(_BLOCKS)))
            _BLOCKS[key] = (start, ids[at])
        return _BLOCKS[key]


_BLOCKS: dict = {}  # (digest, block size) -> PrefixTable.blocks: derived once per process


def prefix_table(ident: ContentIdentity, arrival, prompt, output) -> PrefixTable:
    """The PrefixTable of a trace (arrival, prompt, output per request, trace order)."""
    import hashlib

    arrival = np.asarray(arrival, np.int64)
    prompt, output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    if not len(ident) == len(arrival) == len(prompt) == len(output):
        raise ValueError("identity, arrival, prompt and output differ in length")
    order = np.lexsort((np.arange(len(arrival)), arrival)).astype(np.int64)
    h = hashlib.blake2b(f"{ident.kind}:{ident.hash_block}".encode(), digest_size=16)
    for a in (ident.key, ident.prefix_len, ident.offsets, ident.hashes, prompt, output, order):
        h.update(np.ascontiguousarray(a, np.int64).tobytes())
        h.update(b"|")
    return PrefixTable(ident, prompt, output, order, h.hexdigest())
