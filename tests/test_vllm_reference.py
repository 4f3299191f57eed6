"""The literal vLLM V1 reference (vtc_jax/testing/vllm_reference.py) against the real
scheduler's golden schedules, step by step, and on small hand-worked cases of the rules
that surprise (every expected number in the hand cases is derived in the comment above it).

Notation: B = block_size = 16 throughout; `usable` = num_blocks - 1 (block 0 is the null
block); rN is row N; "c" the tokens computed, "g" the tokens generated.
"""

from __future__ import annotations

import pathlib

import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.testing import vllm_reference as vr
from vtc_jax.testing.vllm_goldens import load_golden, read_trace_csv
from vtc_jax.testing.vllm_reference import TraceRequest, simulate

GOLDEN_DIR = pathlib.Path(__file__).parent / "data" / "vllm_golden"
GOLDENS = sorted(p.name[: -len(".csv")] for p in GOLDEN_DIR.glob("g*.csv"))


def test_all_29_goldens_are_present():
    assert len(GOLDENS) == 29
    for name in GOLDENS:
        assert (GOLDEN_DIR / f"{name}.config.json").is_file()
        assert (GOLDEN_DIR / f"{name}.schedule.json").is_file()


MORE_DIR = pathlib.Path(__file__).parent / "data" / "vllm_golden_more"
MORE = sorted(p.name[: -len(".csv")] for p in MORE_DIR.glob("m*.csv"))
ALL_GOLDENS = [(GOLDEN_DIR, n) for n in GOLDENS] + [(MORE_DIR, n) for n in MORE]


def test_the_further_goldens_are_all_there():
    assert len(MORE) == 40


@pytest.mark.parametrize("directory, name", ALL_GOLDENS, ids=[n for _, n in ALL_GOLDENS])
def test_golden_schedule_reproduced_exactly(directory, name):
    requests, config, golden = load_golden(directory, name)
    got = simulate(requests, config)
    assert got["num_steps"] == golden["num_steps"]
    for mine, real in zip(got["steps"], golden["steps"]):
        # A whole-step comparison, also in vLLM's scheduling order (running list first,
        # in admission order, then admissions), so a wrong order is caught too.
        assert mine == real, f"{name}: first differing step {real['step']}"
        assert list(mine["sched"]) == list(real["sched"]), f"{name}: step {real['step']} order"
    assert got["requests"] == golden["requests"]
    assert got == golden


def _config(**kw) -> dict:
    """A server with the goldens' keys; tests override what they are about."""
    base = {"block_size": 16, "num_blocks": 100, "max_num_batched_tokens": 2048, "max_num_seqs": 16,
            "chunked_prefill": True, "policy": "fcfs", "prefix_caching": False, "long_prefill_threshold": 0}
    return {**base, **kw}


def _req(arrival, prompt, output, **kw) -> TraceRequest:
    return TraceRequest(arrival=arrival, client=kw.pop("client", "t0"), prompt=prompt, output=output, **kw)


def _sched(result) -> list[dict]:
    return [s["sched"] for s in result["steps"]]


# Head of line: 10 usable blocks. r0 (96 tokens = 6 blocks, O = 40) is admitted at step 0
# and samples; free 4. r1 (80 = 5 blocks) and r2 (16 = 1 block) arrive at step 1. r0's
# decode takes a 7th block (free 3); head r1 needs 5 > 3 and ends the waiting phase, so r2
# is never tried although 1 block is free. r0 reaches at most c = 96 + 39 = 135 (9
# blocks), so free never reaches 5 before r0 finishes (g = 40 at step 39); both r1 and r2
# are admitted at step 40 and, with O = 1, finish there.
def test_head_of_line_stops_the_waiting_phase():
    result = simulate([_req(0, 96, 40), _req(1, 80, 1), _req(1, 16, 1)], _config(num_blocks=11))
    sched = _sched(result)
    assert sched[0] == {"0": 96}
    assert sched[1:40] == [{"0": 1}] * 39
    assert result["steps"][40] == {"step": 40, "sched": {"1": 80, "2": 16}, "preempted": [], "finished": [1, 2]}
    assert result["requests"]["2"] == {"first_token_step": 40, "finish_step": 40, "preemptions": 0}


# No admission in a step that preempted (priority; 4 usable blocks). Step 0: r0 (16
# tokens, prio 0) and r1 (32, prio 1) admitted: 1 + 2 blocks, free 1; both sample. Step 1:
# r2 (16, O = 1, prio 0) arrives. r0's decode takes the last block (c 16 -> 17). r1 (c =
# 32) needs a 3rd block, none free: victim = the largest (priority, arrival) = r1 itself;
# it frees 2 blocks. r2 would fit (1 block of 2 free) but nothing is admitted this step.
# r1 is re-queued at its (1, 0) place, behind r2 (0, 1). Step 2: r0 decodes; head r2 is
# admitted with 16 tokens and finishes; then r1 needs ceil(33/16) = 3 > 1 free. r0 (peak
# 3 blocks) finishes at step 19 (g = k + 1 at step k), so r1 recomputes its 33 tokens at
# step 20.
def test_no_admission_in_a_step_that_preempted():
    result = simulate([_req(0, 16, 20, priority=0), _req(0, 32, 20, priority=1), _req(1, 16, 1, priority=0)],
                      _config(num_blocks=5, policy="priority"))
    steps = result["steps"]
    assert steps[0]["sched"] == {"0": 16, "1": 32}
    assert steps[1] == {"step": 1, "sched": {"0": 1}, "preempted": [1], "finished": []}
    assert steps[2] == {"step": 2, "sched": {"0": 1, "2": 16}, "preempted": [], "finished": [2]}
    assert steps[19]["finished"] == [0]
    assert steps[20]["sched"] == {"1": 33}
    assert result["requests"]["1"]["preemptions"] == 1


# The null block: num_blocks = 3 leaves 2 usable. Three 16-token prompts (1 block each, O
# = 1) arrive at step 0: r0 and r1 take both blocks and finish in their prefill step; r2
# waits for step 1. With all 3 blocks usable the three would run at step 0.
def test_null_block_leaves_num_blocks_minus_one_usable():
    result = simulate([_req(0, 16, 1)] * 3, _config(num_blocks=3))
    assert result["steps"] == [{"step": 0, "sched": {"0": 16, "1": 16}, "preempted": [], "finished": [0, 1]},
                               {"step": 1, "sched": {"2": 16}, "preempted": [], "finished": [2]}]


# Refused before the run: the peak of a request is ceil((P + O - 1) / B) blocks. With 2
# usable blocks, P = 32, O = 1 (2 blocks) runs; P = 32, O = 2 (33 tokens of KV, 3 blocks)
# and P = 33, O = 1 (3 blocks) could never finish.
@pytest.mark.parametrize("prompt, output, fits", [(32, 1, True), (32, 2, False), (33, 1, False)])
def test_a_request_over_the_usable_blocks_is_refused(prompt, output, fits):
    if fits:
        assert simulate([_req(0, prompt, output)], _config(num_blocks=3))["num_steps"] == 1
    else:
        with pytest.raises(InputError, match="2 usable"):
            simulate([_req(0, prompt, output)], _config(num_blocks=3))


# A prefix hit in the same step (the micro trace logged on the real scheduler): four
# requests share a 200-token prefix "sys". Step 0: r0 computes its 200 tokens; its 12 full
# blocks (192 tokens) are hashed as they are allocated, so r1 (prompt = the prefix) hits
# 192 (at most P - 1 = 199 tokens, whole blocks) and computes 8, and r2 (300 tokens) hits
# 192 and computes 108. All sample; with O = 4 they finish at step 3, where r3 (arrived at
# step 3) hits the 12 blocks still held and computes 8.
def test_prefix_hit_in_the_same_step():
    rows = [_req(0, 200, 4), _req(0, 200, 4), _req(0, 300, 4, client="t1"), _req(3, 200, 4)]
    rows = [TraceRequest(**{**vars(r), "prefix_id": "sys", "prefix_len": 200}) for r in rows]
    result = simulate(rows, _config(prefix_caching=True))
    assert _sched(result) == [{"0": 200, "1": 8, "2": 108}, {"0": 1, "1": 1, "2": 1}, {"0": 1, "1": 1, "2": 1},
                              {"0": 1, "1": 1, "2": 1, "3": 8}, {"3": 1}, {"3": 1}, {"3": 1}]
    assert result["steps"][3]["finished"] == [0, 1, 2]


# Hits are at most P + g - 1 tokens: r1's 192-token prompt equals r0's (prefix "p" of 192),
# and arrives after r0 finished (O = 1, step 0). Its hit is capped at 191 tokens, i.e. 11
# whole blocks = 176, so it recomputes its whole last block: 16 tokens. (Step 1 is the
# empty schedule call vLLM makes after a step in which a request finished.)
def test_a_fully_cached_prompt_recomputes_its_last_block():
    rows = [_req(0, 192, 1, prefix_id="p", prefix_len=192), _req(5, 192, 1, prefix_id="p", prefix_len=192)]
    result = simulate(rows, _config(prefix_caching=True))
    assert result["steps"][1:] == [{"step": 1, "sched": {}, "preempted": [], "finished": []},
                                   {"step": 5, "sched": {"1": 16}, "preempted": [], "finished": [1]}]


# O = 1 finishes in its prefill step: P = 40 with a budget of 32 takes 32 tokens at step 0
# (mid-prefill: no token), then 8 at step 1, which computes the last prompt token, samples
# the one output token and finishes. The idle clock jump: r1 arrives at step 9; step 2 is
# one empty schedule call (vLLM still counts the request that finished in step 1 as a
# request until it is reported), then the clock jumps from 3 to 9.
def test_output_one_finishes_in_its_prefill_step():
    result = simulate([_req(0, 40, 1), _req(9, 16, 2)], _config(max_num_batched_tokens=32, max_num_seqs=4))
    assert result["steps"][:2] == [{"step": 0, "sched": {"0": 32}, "preempted": [], "finished": []},
                                   {"step": 1, "sched": {"0": 8}, "preempted": [], "finished": [0]}]
    assert result["requests"]["0"] == {"first_token_step": 1, "finish_step": 1, "preemptions": 0}
    assert [s["step"] for s in result["steps"][2:]] == [2, 9, 10]
    assert result["steps"][2]["sched"] == {}


# Chunking off: the whole P + g must fit the budget. Budget 64; r0 (40), r1 (48), r2 (8)
# arrive at step 0. Off: r0 takes 40, head r1 needs 48 > 24 left: stop (r2 is not tried).
# Step 1: r0's decode (1), r1 (48), r2 (8) all fit: 57 of 64. On: r1 takes the 24 left as
# a first chunk at step 0.
def test_chunking_off_needs_the_whole_prompt_in_the_budget():
    rows = [_req(0, 40, 8), _req(0, 48, 2), _req(0, 8, 1)]
    off = simulate(rows, _config(max_num_batched_tokens=64, chunked_prefill=False))
    assert _sched(off)[:2] == [{"0": 40}, {"0": 1, "1": 48, "2": 8}]
    on = simulate(rows, _config(max_num_batched_tokens=64, chunked_prefill=True))
    assert _sched(on)[0] == {"0": 40, "1": 24}


def test_chunking_off_refuses_a_budget_below_max_model_len():
    # max_model_len = the longest P + O (40 + 30 = 70) rounded up to a block: 80 > 64.
    with pytest.raises(InputError, match="max_model_len"):
        simulate([_req(0, 40, 30)], _config(max_num_batched_tokens=64, chunked_prefill=False))


# The long-prefill threshold L = 16 applies only when more than one request is running or
# waiting at the step's start. Budget 64. Step 0: r0 (P = 100) is alone: no cap, it takes
# min(100, 64) = 64. Step 1: r1 (P = 20, O = 1) arrives, 2 busy: r0 16 (c = 80), r1 16.
# Step 2: r0 16 (c = 96), r1 the 4 left: it samples and finishes. Step 3: r0 alone takes
# its last 4 (no cap needed), samples; step 4: its second token.
def test_long_prefill_threshold_only_with_more_than_one_request():
    rows = [_req(0, 100, 2), _req(1, 20, 1)]
    result = simulate(rows, _config(max_num_batched_tokens=64, long_prefill_threshold=16))
    assert _sched(result) == [{"0": 64}, {"0": 16, "1": 16}, {"0": 16, "1": 4}, {"0": 4}, {"0": 1}]


# FCFS preemption: the newest admitted request is the victim and goes to the front.
# 4 usable blocks; r0 and r1 (32 tokens = 2 blocks each, O = 10) fill them at step 0. r2
# (16 tokens, O = 1) arrives at step 1 and waits. Step 1: r0 (c = 32) needs a 3rd block:
# victim = running[-1] = r1, which frees 2; r0 is scheduled; no admission. r1, now ahead of
# r2, needs ceil(33/16) = 3 blocks (prompt + 1 generated) while r0 holds 3, so r2 (1 block,
# 1 free) waits behind it until r0 finishes at step 9 (g = 10). Step 10: r1 recomputes its
# 33 tokens (3 blocks), r2 takes the last block; r1 then has g = 2 and finishes at step 18.
def test_fcfs_victim_is_the_newest_and_resumes_at_the_front():
    result = simulate([_req(0, 32, 10), _req(0, 32, 10), _req(1, 16, 1)], _config(num_blocks=5))
    steps = result["steps"]
    assert steps[1] == {"step": 1, "sched": {"0": 1}, "preempted": [1], "finished": []}
    assert _sched(result)[2:10] == [{"0": 1}] * 8
    assert steps[9]["finished"] == [0]
    assert steps[10] == {"step": 10, "sched": {"1": 33, "2": 16}, "preempted": [], "finished": [2]}
    assert result["requests"]["1"] == {"first_token_step": 0, "finish_step": 18, "preemptions": 1}


# Priority victim = the largest (priority, arrival) anywhere in the running list, not the
# newest. 4 usable blocks. Step 0: r0 (16 tokens, prio 1) admitted, 1 block. Step 1: r1 (32,
# prio 0) arrives; r0's decode takes a 2nd block, r1 takes 2: free 0. Step 2: r0 (c = 17) is
# scheduled without a new block; r1 (c = 32) needs a 3rd: the victim is r0 (prio 1), already
# scheduled this step, so its token goes back to the budget and only r1 is scheduled. The
# newest admitted (r1 itself) would have been the fcfs victim.
def test_priority_victim_is_the_largest_priority_arrival():
    rows = [_req(0, 16, 30, priority=1), _req(1, 32, 30, priority=0)]
    result = simulate(rows, _config(num_blocks=5, policy="priority"))
    assert result["steps"][2] == {"step": 2, "sched": {"1": 1}, "preempted": [0], "finished": []}
    newest = simulate(rows, _config(num_blocks=5, policy="priority", victim="newest"))
    assert newest["steps"][2] == {"step": 2, "sched": {"0": 1}, "preempted": [1], "finished": []}


# A request that must preempt itself leaves the running list and the walk goes on with the
# next request (vLLM 0.33's scheduler.py `continue`; the real scheduler does this in golden
# m000 step 22, tests/data/vllm_golden_more). 5 usable blocks. Step 0: r0 (32 tokens,
# prio 1): 2 blocks. Step 1: r0's decode takes a 3rd; r1 (16, prio 0) takes 1: free 1.
# Step 2: r1 (c = 16) takes the last. At step k >= 1, r0 has c = 31 + k before the step and
# r1 c = 15 + k; at step 17 r0 (c = 48) needs a 4th block, none free, and the victim
# (largest key) is r0 itself: it frees its 3 blocks, and r1 (c = 32, needing a 3rd block)
# is scheduled from them; nothing is admitted (a preemption happened).
def test_self_preemption_goes_on_with_the_next_request_under_priority():
    rows = [_req(0, 32, 30, priority=1), _req(1, 16, 30, priority=0)]
    result = simulate(rows, _config(num_blocks=6, policy="priority"))
    assert all(s["sched"] == {"0": 1, "1": 1} for s in result["steps"][2:17])
    assert result["steps"][17] == {"step": 17, "sched": {"1": 1}, "preempted": [0], "finished": []}


class _ShortestPromptFirst(vr.WaitingOrder):
    """A pluggable order for the test: the shortest prompt is the head."""

    def __init__(self):
        self._items = []

    def add(self, req):
        self._items.append(req)
        self._items.sort(key=lambda r: (r.spec.prompt, r.row))

    push_front = requeue = add

    def peek(self):
        return self._items[0]

    def pop(self):
        return self._items.pop(0)

    def __len__(self):
        return len(self._items)

    def victim(self, running):
        return max(running, key=lambda r: r.spec.prompt)


# One seat (max_num_seqs 1), three O = 1 requests at step 0: fcfs serves them in trace
# order, the pluggable order shortest prompt first.
def test_waiting_order_is_pluggable():
    rows = [_req(0, 48, 1), _req(0, 16, 1), _req(0, 32, 1)]
    config = _config(max_num_seqs=1)
    assert _sched(simulate(rows, config)) == [{"0": 48}, {"1": 16}, {"2": 32}]
    assert _sched(simulate(rows, config, order=_ShortestPromptFirst)) == [{"1": 16}, {"2": 32}, {"0": 48}]


def test_fcfs_requeue_by_arrival_and_priority_front():
    states = [vr.RequestState(row, _req(arrival, 16, 1, priority=prio))
              for row, (arrival, prio) in enumerate([(0, 1), (1, 0), (2, 0)])]
    fcfs = vr.FcfsOrder()
    fcfs.add(states[0])
    fcfs.add(states[2])
    fcfs.requeue(states[1])  # its arrival place: between r0 and r2
    assert [fcfs.pop().row for _ in range(3)] == [0, 1, 2]
    prio = vr.PriorityOrder()
    prio.add(states[1])
    prio.add(states[2])
    prio.push_front(states[0])  # ahead of the heap despite its priority 1
    assert [prio.pop().row for _ in range(3)] == [0, 1, 2]


@pytest.mark.parametrize("change, message", [
    ({"colour": 1}, "unknown key 'colour'"),
    ({"num_blocks": 1}, "num_blocks must be an integer >= 2"),
    ({"max_num_seqs": 2.5}, "max_num_seqs must be an integer"),
    ({"chunked_prefill": "yes"}, "chunked_prefill must be true or false"),
    ({"policy": "lifo"}, "policy must be one of"),
    ({"victim": "oldest"}, "victim must be one of"),
    ({"max_num_batched_tokens": 8}, "below max_num_seqs"),
])
def test_bad_config_is_one_input_error(change, message):
    with pytest.raises(InputError, match=message):
        simulate([_req(0, 16, 1)], _config(**change))


def test_a_run_over_max_steps_is_refused():
    with pytest.raises(InputError, match="max_steps = 3"):
        simulate([_req(0, 16, 10)], _config(max_steps=3))


def test_read_trace_csv_prefix_group_defaults_to_the_client(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival,client,prompt,output,cached\n0,a,40,2,32\n1,b,20,1,0\n")
    assert read_trace_csv(path) == [TraceRequest(0, "a", 40, 2, 0, "client:a", 32), TraceRequest(1, "b", 20, 1)]


def test_read_trace_csv_names_a_bad_cell(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival,client,prompt,output\n0,a,forty,2\n")
    with pytest.raises(InputError, match="line 2: prompt must be an integer"):
        read_trace_csv(path)
