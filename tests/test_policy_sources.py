"""Rules taken from the policies' sources (docs/POLICIES.md): tiny hand-worked traces where
our earlier rule and the source's rule admit in a different order. Each case is checked on
the engine and on the literal reference (tests/test_hand_cases.py's `_check`: W after every
step, final counters, the step each request was admitted).

Notation as in tests/test_hand_cases.py: a row is (arrival, client, prompt, output); rN is
the N-th row; w_p = 1, w_q = 2, beta = 0 unless stated.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_hand_cases import _check
from vtc_jax import Settings, Trace, replay
from vtc_jax.testing import reference as ref
from vtc_jax.testing.lanes import run_reference, service_matrix

# ---------------------------------------------------------------------------------------
# las: llm-d forgets a program with nothing in flight and no completion within the TTL,
# even while its requests wait (plugin.go evictIdle); forget="idle" is our former rule.
# ---------------------------------------------------------------------------------------
# M = 4, every request (4, 1): one admission per step, completed in the step it is
# admitted, charged 4 + 2 = 6 in W and in LAS's X. weights (1, 3), half_life 0 (no decay),
# wait_weight 0 (service only), idle_ttl 1. Rows: r0, r1 client 0; r2..r5 client 1; all
# at t=0.
# t=0: X/weight = [0, 0], tie -> client 0 (r0; completes: X_0 = 6, last completion 0).
# t=1: [6, 0] -> client 1 (r2; X_1 = 6). Step end: 1 - 0 = 1, not > 1: nothing forgotten.
# t=2: [6, 2] -> client 1 (r3; X_1 = 12). Step end (before r3 completes): client 0 runs
#   nothing and 2 - 0 = 2 > 1:
#   llmd: X_0 = 0 although r1 waits;   idle: client 0 waits, so it is kept (X_0 = 6).
# t=3: llmd: [0, 4] -> client 0 (r1); t=4, 5: client 1 (r4, r5).
#      idle: [6, 4] -> client 1 (r4); t=4: [6, 6] tie -> client 0 (r1); t=5: r5.
LAS_ROWS = [(0, 0, 4, 1)] * 2 + [(0, 1, 4, 1)] * 4
LAS_OPTIONS = (("half_life", 0), ("wait_weight", 0.0), ("idle_ttl", 1))
LAS_LLMD = {"W": [[6, 0], [6, 6], [6, 12], [12, 12], [12, 18], [12, 24]], "counters": [12, 8],
            "admit_steps": [0, 3, 1, 2, 4, 5]}
LAS_IDLE = {"W": [[6, 0], [6, 6], [6, 12], [6, 18], [12, 18], [12, 24]], "counters": [12, 8],
            "admit_steps": [0, 4, 1, 2, 3, 5]}


@pytest.mark.parametrize("forget, expect", [(None, LAS_LLMD), ("llmd", LAS_LLMD), ("idle", LAS_IDLE)],
                         ids=["default", "llmd", "idle"])
def test_las_forgets_a_waiting_program_as_llmd_does(forget, expect):
    options = LAS_OPTIONS + ((("forget", forget),) if forget else ())
    _check(LAS_ROWS, Settings("las", 4, weights=(1, 3), options=options), **expect)


# ---------------------------------------------------------------------------------------
# wfq, sfq: equal tags are served by the head's arrival, then the client id (vLLM PR
# 31909: Request.__lt__ falls back to arrival_time when virtual_finish_time is equal).
# ---------------------------------------------------------------------------------------
# M = 4, three clients. r0 = (0, 2, 4, 2): admitted at t=0, holds 5 > 4 - 4 tokens at
# t=1, completes at t=1 (W_2 = 4 + 2 + 2 = 8). Its tags: S = 0, F = 8 (cost 4 + 2 * 2).
# End of t=0: nobody waits, so V = max(V, F_max) = 8.
# t=1: r1 = (1, 1, 4, 1) arrives: S = max(8, F_tail[1] = 0) = 8, F = 8 + 6 = 14; it does
#   not fit (5 + 4 > 4) and waits, so V stays 8.
# t=2: r2 = (2, 0, 4, 1) arrives: S = max(8, 0) = 8, F = 14: both tags equal r1's.
#   Arrival first: r1 (arrival 1) at t=2, r2 at t=3. (Smallest client first, the old
#   rule, took r2 at t=2.)
FQ_ROWS = [(0, 2, 4, 2), (1, 1, 4, 1), (2, 0, 4, 1)]


@pytest.mark.parametrize("policy", ["wfq", "sfq"])
def test_fair_queueing_ties_go_to_the_earlier_arrival(policy):
    _check(FQ_ROWS, Settings(policy, 4), num_clients=3,
           W=[[0, 0, 6], [0, 0, 8], [0, 6, 8], [6, 6, 8]], counters=[6, 6, 8], admit_steps=[0, 2, 3])


@pytest.mark.parametrize("policy", ["wfq", "sfq"])
def test_fair_queueing_equal_tags_and_arrivals_go_to_the_smaller_client(policy):
    # The same with r1 and r2 both arriving at t=1 (S = 8 each): the client id decides,
    # client 0 (r2) at t=2, client 1 (r1) at t=3.
    rows = [(0, 2, 4, 2), (1, 1, 4, 1), (1, 0, 4, 1)]
    _check(rows, Settings(policy, 4), num_clients=3,
           W=[[0, 0, 6], [0, 0, 8], [6, 0, 8], [6, 6, 8]], counters=[6, 6, 8], admit_steps=[0, 3, 2])


# ---------------------------------------------------------------------------------------
# drr: Dynamo's code (policy_queue.rs pop_candidate) always moves the cursor past the
# dispatched class; its documentation says the cursor stays on a class whose next head is
# affordable. We follow the code: the carry lasts one drain of the queue (one step here).
# ---------------------------------------------------------------------------------------
# M = 4, every request (4, 1), cost = prefill = 4, quantum 10 (weights 1): one admission
# per step. Client 0 has r0, r1 at t=0; client 1 has r2, r3 at t=0.
# t=0: cursor 0: client 0 gets 10, pays 4 (D_0 = 6, cursor 1, carried). The next pick
#   (carry: 6 >= 4) does not fit M: admission stops, the step ends, the carry is dropped.
# t=1: the ring starts at the cursor, client 1: +10, pays (D_1 = 6, cursor 0).
# t=2: client 0 pays from its credit (D_0 = 2); t=3: client 1 (D_1 = 2).
# Order 0, 1, 0, 1. Under the documented rule the cursor would have stayed on client 0
# (its next head was affordable) and client 0 would have taken t=0 and t=1.
def test_drr_cursor_moves_on_as_dynamo_code_does():
    rows = [(0, 0, 4, 1)] * 2 + [(0, 1, 4, 1)] * 2
    s = Settings("drr", 4, options=(("quantum", 10), ("cost", "prefill")))
    got = replay(Trace.from_rows(rows), s, num_clients=2, record_every=1)
    expect = run_reference([ref.Request(*r) for r in rows], 2, s, None)
    assert expect.admit_step == [0, 2, 1, 3]
    np.testing.assert_array_equal(got.checkpoints[0], service_matrix(expect))
    np.testing.assert_array_equal(got.checkpoints[0], [[6, 0], [6, 6], [12, 6], [12, 12]])
