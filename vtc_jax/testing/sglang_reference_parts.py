"""Parts of the literal SGLang reference (vtc_jax/testing/sglang_reference.py): its config
and request types, and SGLang's radix cache at page size 1 (S:mem_cache/radix_cache.py of
sglang 0.5.23) over real token sequences."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

POLICIES = ("fcfs", "lpm")
_OTHER_POLICIES = ("random", "dfs-weight", "lof", "priority", "routing-key", "hrrn", "shortest-prefill-first")

# PrefillAdder verdicts (schedule_policy.py AddReqResult).
CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"

OUTPUT_TOKEN = 1  # the harness's fake model samples token id 1 (never EOS)


@dataclass(frozen=True)
class SglangConfig:
    """One SGLang server's scheduling knobs (the goldens' `config`) and SGLang's env constants
    with their defaults. `max_running_requests` is capped at kv_tokens // 2 as SGLang does."""

    kv_tokens: int
    max_running_requests: int
    chunked_prefill_size: int | None  # <= 0 or None: chunking off
    max_prefill_tokens: int = 16384
    schedule_conservativeness: float = 1.0
    policy: str = "fcfs"
    clip_max_new_tokens: int = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    init_new_token_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    retract_decode_steps: int = 20  # SGLANG_RETRACT_DECODE_STEPS
    in_batch_prefix_check_threshold: int = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
    in_batch_prefix_deprioritize_threshold: int = 32  # IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD
    waiting_queue_prefix_match_max: int = 128  # WAITING_QUEUE_PREFIX_MATCH_MAX
    waiting_prefix_refresh: bool = True  # SGLANG_ENABLE_WAITING_PREFIX_REFRESH
    waiting_prefix_refresh_interval: int = 32  # WAITING_PREFIX_REFRESH_INTERVAL
    # Options SGLang has that this reference does not model: only their defaults (or the
    # non-overlap loop) are accepted.
    disable_overlap_schedule: bool = True
    enable_mixed_chunk: bool = False
    enable_priority_scheduling: bool = False
    retraction_policy: str = "length"
    page_size: int = 1
    disable_radix_cache: bool = False
    max_steps: int = 1_000_000

    def __post_init__(self):
        if not self.disable_overlap_schedule:
            raise ValueError("disable_overlap_schedule=False: the overlap event loop is not supported "
                             "(only event_loop_normal, --disable-overlap-schedule)")
        if self.enable_mixed_chunk:
            raise ValueError("enable_mixed_chunk: mixed chunked prefill is not supported")
        if self.enable_priority_scheduling:
            raise ValueError("enable_priority_scheduling: priority scheduling is not supported")
        if self.retraction_policy != "length":
            raise ValueError(f"retraction_policy={self.retraction_policy!r} is not supported (only 'length')")
        if self.page_size != 1:
            raise ValueError(f"page_size={self.page_size} is not supported (only 1)")
        if self.disable_radix_cache:
            raise ValueError("disable_radix_cache: running without the radix cache is not supported")
        if self.policy in _OTHER_POLICIES:
            raise ValueError(f"policy={self.policy!r} (schedule_policy) is not supported (only fcfs, lpm)")
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is not a schedule_policy (fcfs, lpm)")
        for name in ("kv_tokens", "max_running_requests", "max_prefill_tokens", "clip_max_new_tokens",
                     "new_token_ratio_decay_steps", "waiting_prefix_refresh_interval", "max_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.chunked_prefill_size is not None and (
                not isinstance(self.chunked_prefill_size, int) or isinstance(self.chunked_prefill_size, bool)):
            raise ValueError(f"chunked_prefill_size must be an integer or None, got {self.chunked_prefill_size!r}")
        if not self.schedule_conservativeness > 0:
            raise ValueError(f"schedule_conservativeness must be > 0, got {self.schedule_conservativeness!r}")
        if self.kv_tokens // 2 < 1:
            raise ValueError(f"kv_tokens={self.kv_tokens} leaves no request row (kv_tokens // 2 == 0)")

    @classmethod
    def from_dict(cls, config: dict) -> SglangConfig:
        """A golden's `config` dict (unknown keys are refused)."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown SGLang config key(s): {', '.join(unknown)}")
        return cls(**config)

    @property
    def rows(self) -> int:
        return min(self.max_running_requests, self.kv_tokens // 2)

    @property
    def chunk_size(self) -> int | None:
        c = self.chunked_prefill_size
        return None if c is None or c <= 0 else c

    def ratio_constants(self) -> tuple[float, float, float]:
        """(init, min, decay) of NewTokenRatioTracker.from_config, in doubles."""
        init = min(self.init_new_token_ratio * self.schedule_conservativeness, 1.0)
        low = min(init * self.min_new_token_ratio_factor, 1.0)
        return init, low, (init - low) / self.new_token_ratio_decay_steps


@dataclass(frozen=True)
class SglangRequest:
    """One trace row: the scheduler iteration at whose start it joins the waiting queue, its
    client (SGLang ignores it), prompt and output (max_new_tokens) lengths, and the shared
    prefix group. `tokens` (optional) gives the prompt's token ids outright; `rid` (default
    `r{row}`) is the harness's request id, which orders same-iteration arrivals."""

    arrival: int
    client: str
    prompt: int
    output: int
    prefix_id: str | None = None
    prefix_len: int = 0
    tokens: tuple | None = None
    rid: str | None = None


# ----------------------------------------------------------------------------------------
# The radix cache (radix_cache.py), page size 1.


class _Node:
    __slots__ = ("children", "parent", "key", "lock_ref", "last_access_time", "nid")

    def __init__(self, now: int, nid: int):
        self.children: dict = {}
        self.parent: _Node | None = None
        self.key: tuple = ()
        self.lock_ref = 0
        self.last_access_time = now
        self.nid = nid


class RadixTree:
    """SGLang's RadixCache at page size 1: token tuples as keys, a node's value is its
    token count. `clock` stands for time.monotonic(): every read is a new, later tick."""

    def __init__(self, clock: Callable[[], int] | None = None):
        self._ticks = 0
        self.clock = clock or self._tick
        self._nids = 0
        self.root = self._new_node()
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.evictable_leaves: set[_Node] = set()

    def _tick(self) -> int:
        self._ticks += 1
        return self._ticks

    def _new_node(self) -> _Node:
        self._nids += 1
        return _Node(self.clock(), self._nids)

    @staticmethod
    def _common(a: Sequence, b: Sequence) -> int:
        n = min(len(a), len(b))
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i

    def match(self, tokens: Sequence, limit: int | None = None) -> tuple[int, _Node]:
        """match_prefix: (matched length, last node); refreshes the path's access time and
        splits the node the match ends inside. An empty key touches nothing."""
        key = tuple(tokens[:limit] if limit is not None and limit < len(tokens) else tokens)
        if not key:
            return 0, self.root
        node = self.root
        access = self.clock()
        node.last_access_time = access
        matched = 0
        while key and key[0] in node.children:
            child = node.children[key[0]]
            child.last_access_time = access
            plen = self._common(child.key, key)
            if plen < len(child.key):
                node = self._split(child, plen)
                matched += plen
                break
            matched += plen
            node = child
            key = key[plen:]
        return matched, node

    def _split(self, child: _Node, split_len: int) -> _Node:
        new = self._new_node()
        new.children = {child.key[split_len]: child}
        new.parent = child.parent
        new.lock_ref = child.lock_ref
        new.key = child.key[:split_len]
        child.parent = new
        child.key = child.key[split_len:]
        new.parent.children[new.key[0]] = new
        return new

    def insert(self, tokens: Sequence) -> tuple[int, _Node]:
        """insert: (length already in the tree, last node); the rest becomes a new leaf."""
        key = tuple(tokens)
        node = self.root
        access = self.clock()
        node.last_access_time = access
        if not key:
            return 0, node
        total = 0
        while key and key[0] in node.children:
            node = node.children[key[0]]
            node.last_access_time = access
            plen = self._common(node.key, key)
            total += plen
            key = key[plen:]
            if plen < len(node.key):
                node = self._split(node, plen)
        if key:
            leaf = self._new_node()
            leaf.parent = node
            leaf.key = key
            node.children[key[0]] = leaf
            self.evictable_size += len(key)
            self._update_leaf_status(node)
            self._update_leaf_status(leaf)
            node = leaf
        return total, node

    def _update_leaf_status(self, node: _Node) -> None:
        if node.lock_ref > 0 or node.children:
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)

    def inc_lock_ref(self, node: _Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            node = node.parent

    def dec_lock_ref(self, node: _Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            self._update_leaf_status(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Unlocked leaves, least recently used first, until `num_tokens` are evicted (whole
        leaves, so it may evict more); a parent left childless and unlocked joins the heap.
        Returns the tokens evicted (their KV slots are freed)."""
        heap = [(n.last_access_time, n.nid, n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            evicted += len(x.key)
            parent = x.parent
            del parent.children[x.key[0]]
            self.evictable_size -= len(x.key)
            self.evictable_leaves.discard(x)
            self._update_leaf_status(parent)
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, parent.nid, parent))
        return evicted

    def total_size(self) -> int:
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += len(node.key)
            stack.extend(node.children.values())
        return total


def _prompt_tokens(req: SglangRequest, row: int) -> tuple:
    """The harness's token sequences: the shared prefix's tokens for the group's first
    `prefix_len` positions (one token space per prefix_id), then tokens only this row has.
    Token ids are distinct from the output token 1; only equality matters to the tree."""
    if req.tokens is not None:
        if len(req.tokens) != req.prompt:
            raise ValueError(f"row {row}: {len(req.tokens)} prompt tokens for prompt length {req.prompt}")
        return tuple(req.tokens)
    shared = req.prefix_len if req.prefix_id is not None else 0
    group = tuple(("prefix", req.prefix_id, j) for j in range(shared))
    own = tuple(("row", row, j) for j in range(req.prompt - shared))
    return group + own


def check_requests(requests: Sequence[SglangRequest]) -> None:
    for row, r in enumerate(requests):
        if r.prompt < 1 or r.output < 1 or r.arrival < 0:
            raise ValueError(f"row {row}: prompt and output must be >= 1 and arrival >= 0 "
                             f"(got prompt={r.prompt}, output={r.output}, arrival={r.arrival})")
        if not 0 <= r.prefix_len <= r.prompt:
            raise ValueError(f"row {row}: prefix_len {r.prefix_len} outside 0..prompt ({r.prompt})")
