"""Small hand-worked cases of MODEL.md: every expected integer below was computed by hand.

Each case is tiny (2 clients, M in the tens of tokens or less, < 20 steps). The comment
above each case derives its numbers step by step. Each case is checked twice: against the
engine (`replay`) and against the slow literal reference (`vtc_jax/testing/reference.py`),
so that a wrong hand value is caught as well as a wrong engine.

Notation: a row is (arrival, client, prompt, output[, cached]); rN is the N-th row (trace
order). Unless stated, w_p = 1, w_q = 2, beta = 0, weights 1. "W after t" lists [W_0, W_1].
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from vtc_jax.testing import reference as ref
from vtc_jax.testing.lanes import run_reference
from vtc_jax import Settings, Trace, replay


def _check(rows, settings: Settings, *, W, counters, admit_steps, steps=None, num_clients=2):
    """Run engine and reference; compare both with the hand values.

    W: hand W after every step (list of [W_0, W_1]); its length is the horizon run.
    counters: hand c_k after the last step.
    admit_steps: hand step of admission of each row (None: never admitted in the run).
    """
    W = [[F(x) for x in row] for row in W]
    counters = [F(x) for x in counters]
    admitted = [sum(1 for r, s in zip(rows, admit_steps) if s is not None and r[1] == k)
                for k in range(num_clients)]
    drifts = [max(row) - min(row) for row in W]

    # The reference must agree with the hand computation (catches a wrong hand value).
    expect = run_reference([ref.Request(*r) for r in rows], num_clients, settings, steps)
    assert expect.steps == len(W)
    assert expect.service == W
    assert expect.counters[-1] == counters
    assert expect.admit_step == list(admit_steps)
    assert expect.admitted == admitted

    # The engine must agree with the hand computation.
    got = replay(Trace.from_rows(rows), settings, num_clients=num_clients, steps=steps, record_every=1)
    assert bool(got.finished[0])
    assert int(got.steps[0]) == len(W)
    np.testing.assert_array_equal(got.checkpoints[0], np.asarray([[float(x) for x in row] for row in W]))
    assert list(got.service_exact[0]) == W[-1]
    assert list(got.counters_exact[0]) == counters
    assert list(got.admitted[0]) == admitted
    assert list(got.completed[0]) == expect.completed
    assert got.max_drift_exact[0] == max(drifts)
    assert int(got.max_drift_step[0]) == drifts.index(max(drifts))
    return got, expect


# ---------------------------------------------------------------------------------------
# 1. Lift versus no lift
# ---------------------------------------------------------------------------------------
# M = 4, every request (prompt 4, output 1): admitted at t, charged 4 + 2 = 6 in step t,
# completes in step t; a second admission in the same step would need 4 + 4 > 4, so one
# admission per step. Client 0 floods 6 requests at t=0; client 1 returns at t=3 with 3.
#
# t=0..2 (both policies): client 0 alone, r0, r1, r2; c_0 = W_0 = 6, 12, 18.
# vtc, t=3: client 1 arrives not backlogged, client 0 backlogged with c_0 = 18:
#   c_1 = max(0, 18) = 18. Tie 18/18 -> client 0 (r3, c_0 = 24); t=4: 18 < 24 -> client 1
#   (r6, c_1 = 24); t=5 tie -> client 0 (r4, 30); t=6 -> client 1 (r7, 30); t=7 tie ->
#   client 0 (r5, 36); t=8 -> client 1 (r8, 36). Final c = [36, 36].
# lcf, t=3: no lift, c_1 = 0 < 18: client 1 takes t=3, 4, 5 (c_1 = 6, 12, 18), then
#   client 0 takes t=6, 7, 8 (c_0 = 24, 30, 36). Final c = [36, 18].
# Both end at W = [36, 18]; the interleaving (the checkpoints) differs.
LIFT_ROWS = [(0, 0, 4, 1)] * 6 + [(3, 1, 4, 1)] * 3


def test_lift_versus_no_lift():
    _check(LIFT_ROWS, Settings(policy="vtc", kv_budget=4),
           W=[[6, 0], [12, 0], [18, 0], [24, 0], [24, 6], [30, 6], [30, 12], [36, 12], [36, 18]],
           counters=[36, 36],
           admit_steps=[0, 1, 2, 3, 5, 7, 4, 6, 8])
    _check(LIFT_ROWS, Settings(policy="lcf", kv_budget=4),
           W=[[6, 0], [12, 0], [18, 0], [18, 6], [18, 12], [18, 18], [24, 18], [30, 18], [36, 18]],
           counters=[36, 18],
           admit_steps=[0, 1, 2, 6, 7, 8, 3, 4, 5])


def test_lift_versus_no_lift_fixed_horizon():
    # Cut after t=5 (steps=6): vtc admitted client 0 at t=0,1,2,3,5 and client 1 at t=4;
    # lcf admitted client 0 at t=0,1,2 and client 1 at t=3,4,5.
    _check(LIFT_ROWS, Settings(policy="vtc", kv_budget=4), steps=6,
           W=[[6, 0], [12, 0], [18, 0], [24, 0], [24, 6], [30, 6]],
           counters=[30, 24],
           admit_steps=[0, 1, 2, 3, 5, None, 4, None, None])
    _check(LIFT_ROWS, Settings(policy="lcf", kv_budget=4), steps=6,
           W=[[6, 0], [12, 0], [18, 0], [18, 6], [18, 12], [18, 18]],
           counters=[18, 18],
           admit_steps=[0, 1, 2, None, None, None, 3, 4, 5])


# ---------------------------------------------------------------------------------------
# 2. The last_left clause
# ---------------------------------------------------------------------------------------
# M = 4. r0 = (0,0,4,3): admitted t=0 (c_0 = 4), decodes t=0,1,2 (c_0 = 6, 8, 10),
# occupancy at admission t=1: 5, t=2: 6, so nothing else fits until t=3 (r0 completes at
# t=2). Every later request is (prompt 4, output 1): 6 per request, one per step.
# t=1: client 1 arrives (r1, r2) while no FIFO is non-empty (r0 runs, it does not wait);
#   last_left = 0 (r0), c_0 = 6 after step 0.
#   with the clause: c_1 = max(0, 6) = 6; without: c_1 stays 0.
# t=2: client 0 arrives (r3, r4), client 1 backlogged: c_0 = max(8, c_1) = 8 in both.
# With the clause, from t=3 (c_0 = 10, c_1 = 6):
#   t=3: 6 < 10 -> client 1 (r1, c_1 = 12); t=4: 10 < 12 -> client 0 (r3, c_0 = 16);
#   t=5: 12 < 16 -> client 1 (r2, c_1 = 18); t=6: client 0 (r4, c_0 = 22).
# Without the clause (c_0 = 10, c_1 = 0):
#   t=3: client 1 (r1, c_1 = 6); t=4: 6 < 10 -> client 1 again (r2, c_1 = 12);
#   t=5, 6: client 0 (r3, r4; c_0 = 16, 22).
LAST_LEFT_ROWS = [(0, 0, 4, 3), (1, 1, 4, 1), (1, 1, 4, 1), (2, 0, 4, 1), (2, 0, 4, 1)]


def test_last_left_clause():
    _check(LAST_LEFT_ROWS, Settings(policy="vtc", kv_budget=4),
           W=[[6, 0], [8, 0], [10, 0], [10, 6], [16, 6], [16, 12], [22, 12]],
           counters=[22, 18],
           admit_steps=[0, 3, 5, 4, 6])
    _check(LAST_LEFT_ROWS, Settings(policy="vtc", kv_budget=4, lift_last_left=False),
           W=[[6, 0], [8, 0], [10, 0], [10, 6], [10, 12], [16, 12], [22, 12]],
           counters=[22, 12],
           admit_steps=[0, 3, 4, 5, 6])


def test_last_left_clause_fixed_horizon():
    # Cut after t=4: with the clause each client was admitted once at t>=3 (plus r0);
    # without it client 1 took both t=3 and t=4.
    _check(LAST_LEFT_ROWS, Settings(policy="vtc", kv_budget=4), steps=5,
           W=[[6, 0], [8, 0], [10, 0], [10, 6], [16, 6]],
           counters=[16, 12],
           admit_steps=[0, 3, None, 4, None])
    _check(LAST_LEFT_ROWS, Settings(policy="vtc", kv_budget=4, lift_last_left=False), steps=5,
           W=[[6, 0], [8, 0], [10, 0], [10, 6], [10, 12]],
           counters=[10, 12],
           admit_steps=[0, 3, 4, None, None])


# ---------------------------------------------------------------------------------------
# 3. Head-of-line stop
# ---------------------------------------------------------------------------------------
# M = 10. r0 = (0,1,5,4) runs from t=0 (W_1 = 5 + 2 = 7 after t=0), occupancy at
# admission t=1, 2, 3: 6, 7, 8; it completes at t=3 (W_1 = 9, 11, 13).
# t=1: r1 = (1,0,6,1) and r2 = (1,1,2,1) arrive. Every policy picks r1 first:
#   fcfs/rpm: (1, 1) < (1, 2); lcf: c_0 = 0 < c_1 = 7; vtc: r1 lifts c_0 = c_{last_left=1}
#   = 7, then r2 lifts c_1 = max(7, 7) = 7, tie -> client 0.
#   6 + 6 = 12 > 10: admission stops, although r2 would fit (6 + 2 = 8 <= 10).
#   Same at t=2 (7 + 6 > 10) and t=3 (8 + 6 > 10). W_1 grows only by r0's decode (2/step).
# t=4: occupancy 0: admit r1 (W_0 = 6), then r2 (6 + 2 <= 10, W_1 = 15); decode:
#   W = [8, 17]. Counters: c_0 = 8 (vtc: 7 + 8 = 15), c_1 = 17.
HOL_ROWS = [(0, 1, 5, 4), (1, 0, 6, 1), (1, 1, 2, 1)]
HOL_W = [[0, 7], [0, 9], [0, 11], [0, 13], [8, 17]]


@pytest.mark.parametrize("settings, counters", [
    (Settings(policy="fcfs", kv_budget=10), [8, 17]),
    (Settings(policy="rpm", kv_budget=10, rpm_limit=5, rpm_window=100), [8, 17]),
    (Settings(policy="lcf", kv_budget=10), [8, 17]),
    (Settings(policy="vtc", kv_budget=10), [15, 17]),
], ids=["fcfs", "rpm", "lcf", "vtc"])
def test_head_of_line_stop(settings, counters):
    _check(HOL_ROWS, settings, W=HOL_W, counters=counters, admit_steps=[0, 4, 4])


# ---------------------------------------------------------------------------------------
# 4. rpm window boundary
# ---------------------------------------------------------------------------------------
# rpm(R=2, window=3), M = 40 (everything fits). Every request (prompt 2, output 1) is
# charged 2 + 2 = 4 in the step it is admitted. Rows: r0..r4 client 0 at t=0,
# r5 client 1 at t=0, r6 client 1 at t=1, r7 client 1 at t=2.
# Window 0 = steps 0..2:
#   t=0: r0, r1 (client 0's count 0 -> 1 -> 2: the same step's admissions count), then
#        client 0 is over the limit, so r5 (client 1, count 1); nothing else: W = [8, 4].
#   t=1: r6 (client 1 count 2): W = [8, 8].
#   t=2: client 0 at 2, client 1 at 2 (r7 waits): nothing; W = [8, 8].
# Window 1 = steps 3..5 (reset exactly at t = 3):
#   t=3: fcfs among clients under the limit: r2 (0,2), r3 (0,3) (client 0 count 2), then
#        r7 (client 1 count 1): W = [16, 12]. t=4, 5: r4 waits (client 0 at 2).
# Window 2 starts at t=6: r4: W = [20, 12]. Drain: 7 steps.
RPM_ROWS = [(0, 0, 2, 1)] * 5 + [(0, 1, 2, 1), (1, 1, 2, 1), (2, 1, 2, 1)]


def test_rpm_window_boundary():
    _check(RPM_ROWS, Settings(policy="rpm", kv_budget=40, rpm_limit=2, rpm_window=3),
           W=[[8, 4], [8, 8], [8, 8], [16, 12], [16, 12], [16, 12], [20, 12]],
           counters=[20, 12],
           admit_steps=[0, 0, 3, 3, 6, 0, 1, 3])


# ---------------------------------------------------------------------------------------
# 5. Ties between counters
# ---------------------------------------------------------------------------------------
# M = 4, every request (prompt 4, output 1): 6 per request, one per step. Client 1's rows
# come first in the trace (r0, r1), client 0's after (r2, r3), all at t=0.
# lcf/vtc (vtc lifts nothing: r0 finds nobody backlogged and no last_left, r2 lifts c_0 to
# min c_1 = 0): t=0 tie 0/0 -> client 0 (r2, c_0 = 6); t=1 client 1 (r0, c_1 = 6);
# t=2 tie 6/6 -> client 0 (r3, 12); t=3 client 1 (r1, 12).
# fcfs, for contrast, follows trace order: r0, r1, r2, r3.
TIE_ROWS = [(0, 1, 4, 1), (0, 1, 4, 1), (0, 0, 4, 1), (0, 0, 4, 1)]


@pytest.mark.parametrize("policy", ["lcf", "vtc"])
def test_counter_tie_smallest_client_first(policy):
    _check(TIE_ROWS, Settings(policy=policy, kv_budget=4),
           W=[[6, 0], [6, 6], [12, 6], [12, 12]],
           counters=[12, 12],
           admit_steps=[1, 3, 0, 2])


def test_counter_tie_fcfs_contrast():
    _check(TIE_ROWS, Settings(policy="fcfs", kv_budget=4),
           W=[[0, 6], [0, 12], [6, 12], [12, 12]],
           counters=[12, 12],
           admit_steps=[0, 1, 2, 3])


# ---------------------------------------------------------------------------------------
# 6. Cached prefix
# ---------------------------------------------------------------------------------------
# M = 10, w_p = 3, fcfs. r0 = (0,0,8,2, cached 6), r1 = (0,1,4,1).
# t=0: admit r0: charged w_p * (8 - 6) = 6, but occupancy += 8 (whole prompt).
#      r1: 8 + 4 = 12 > 10: stop (it would fit if occupancy counted 8 - 6 = 2).
#      decode r0: W_0 = 6 + 2 = 8.
# t=1: occupancy 8 + 1 = 9; 9 + 4 > 10: stop. decode: W_0 = 10; r0 completes.
# t=2: admit r1: 3 * 4 = 12, decode 2: W_1 = 14.
def test_cached_prefix():
    _check([(0, 0, 8, 2, 6), (0, 1, 4, 1)], Settings(policy="fcfs", kv_budget=10, w_p=3),
           W=[[8, 0], [10, 0], [10, 14]],
           counters=[10, 14],
           admit_steps=[0, 2])


# ---------------------------------------------------------------------------------------
# 7. Fractional beta and weights
# ---------------------------------------------------------------------------------------
# vtc, M = 3, beta = 1/4, weights (1, 2). Every request (prompt 3, output 2), 3 per client,
# all at t=0 (client 0's rows first; no lift changes anything: all counters are 0).
# A request admitted at t: prefill 3; decode at t: 2 + 1/4 * (3 + 0) = 11/4, so after t
# its client has 23/4; decode at t+1: 2 + 1/4 * (3 + 1) = 3; total a = 35/4. At t+1 the
# occupancy is 3 + 1 = 4, so 4 + 3 > 3: one admission every other step.
# Counters rise by a = 35/4 per request for client 0, by a/2 = 35/8 for client 1:
#   t=0: tie 0/0 -> client 0 (c_0 = a); t=2: 0 < a -> client 1 (c_1 = a/2);
#   t=4: a/2 < a -> client 1 (c_1 = a); t=6: tie a/a -> client 0 (c_0 = 2a);
#   t=8: a < 2a -> client 1 (c_1 = 3a/2, its last); t=10: client 0 (c_0 = 3a).
# W after each step (W rises by 23/4 in the admission step, by 3 in the next):
#   t0 [23/4, 0], t1 [35/4, 0], t2 [35/4, 23/4], t3 [35/4, 35/4], t4 [35/4, 58/4],
#   t5 [35/4, 70/4], t6 [58/4, 70/4], t7 [70/4, 70/4], t8 [70/4, 93/4], t9 [70/4, 105/4],
#   t10 [93/4, 105/4], t11 [105/4, 105/4].
# Final c = [3a, 3a/2] = [105/4, 105/8]. (Unweighted it would alternate 0,1,0,1,0,1.)
def test_fractional_beta_and_weights():
    q = lambda n: F(n, 4)  # noqa: E731
    rows = [(0, 0, 3, 2)] * 3 + [(0, 1, 3, 2)] * 3
    got, _ = _check(
        rows, Settings(policy="vtc", kv_budget=3, beta="1/4", weights=(1, 2)),
        W=[[q(23), 0], [q(35), 0], [q(35), q(23)], [q(35), q(35)], [q(35), q(58)], [q(35), q(70)],
           [q(58), q(70)], [q(70), q(70)], [q(70), q(93)], [q(70), q(105)], [q(93), q(105)],
           [q(105), q(105)]],
        counters=[F(105, 4), F(105, 8)],
        admit_steps=[0, 6, 10, 2, 4, 8])
    assert got.max_drift_exact[0] == F(35, 4) and int(got.max_drift_step[0]) == 1
    # The same with the decimal spelling "0.25" and weights given as text.
    _check(rows, Settings(policy="vtc", kv_budget=3, beta="0.25", weights=("1", "2.0")),
           W=[[q(23), 0], [q(35), 0], [q(35), q(23)], [q(35), q(35)], [q(35), q(58)], [q(35), q(70)],
              [q(58), q(70)], [q(70), q(70)], [q(70), q(93)], [q(70), q(105)], [q(93), q(105)],
              [q(105), q(105)]],
           counters=[F(105, 4), F(105, 8)],
           admit_steps=[0, 6, 10, 2, 4, 8])
