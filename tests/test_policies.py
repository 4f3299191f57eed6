"""Policies as components: the registry is the one list of names, a user's own policy runs
everywhere without a package edit, a batch mixing policies equals single-policy batches,
and hand-worked cases of the post-VTC policies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import python
from vtc_jax.testing import reference as ref
from vtc_jax.testing import check_policy
from vtc_jax.testing.lanes import run_reference, service_matrix
from vtc_jax import InputError, Settings, Trace, replay
from vtc_jax.cli import commands as cli
from vtc_jax.driver import policy_modules
from vtc_jax.policies import registry

ROOT = Path(__file__).resolve().parents[1]
MY_POLICY = ROOT / "examples" / "my_policy.py"


def test_registry_is_the_only_list_of_names(capsys):
    names = registry.names()
    assert {"fcfs", "lcf", "vtc", "rpm", "drr", "wfq", "sfq", "las", "vtc_predict", "vtc_gateway", "rr"} <= set(names)
    parser = cli.build_parser()
    replay_parser = parser._subparsers._group_actions[0].choices["replay"]
    policy_action = next(a for a in replay_parser._actions if a.dest == "policy")
    assert tuple(policy_action.choices) == names
    assert cli.main(["policies"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in names)
    with pytest.raises(InputError, match="unknown policy 'nope'"):
        Settings("nope", 64)


def test_user_policy_file_runs_in_replay_and_in_a_sweep(tmp_path):
    out = tmp_path / "sweep"
    done = python("-m", "sweeps.kv_budget", "--policy-module", MY_POLICY, "--policy", "round_robin", "--seeds", "4",
                  "--steps", "600", "--budgets", "2048,4096", "--out", out, "--no-plots", "--no-cache")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["setting"]["policy"] for r in rows} == {"round_robin"}
    assert all(r["metrics"]["throughput"]["mean"] > 0 for r in rows)
    done = python("-m", "vtc_jax", "replay", ROOT / "examples" / "small_trace.csv", "--policy-module", MY_POLICY,
                  "--policy", "round_robin", "--kv-budget", "4096", "--steps", "500", "--no-cache")
    read, run = done.stdout.split("\n", 1)  # what it read, then the run
    assert done.returncode == 0 and read.startswith("read ") and run.startswith("round_robin: "), done.stderr[-2000:]


def test_user_policy_is_exact_against_its_own_reference():
    name = policy_modules.load_policy_module(MY_POLICY)[0]
    check_policy(name, lanes=48, seed=9, num_clients=3, steps=30)


def test_bad_policy_module_is_one_line(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    for path, words in ((broken, "import failed"), (empty, "defines no POLICY"), (tmp_path / "none.py", "no such")):
        code = cli.main(["replay", str(ROOT / "examples" / "small_trace.csv"), "--policy-module", str(path),
                         "--policy", "vtc", "--kv-budget", "100"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and words in err[0], err


# ---- hand-worked cases ---------------------------------------------------------------

def _admitted_clients(result, steps):
    w = result.checkpoints[0]
    return [int(np.argmax(w[t] - (w[t - 1] if t else 0))) for t in range(steps)]


def test_drr_hand_worked():
    """One request fits per step (prompt 4 = M, output 1), cost = prefill = 4, weights 1:3.

    Quantum 1 (Q = 1, 3): step 0: needs n = (4, 2) quanta, nobody within one: a bulk of
    R = 2 rounds (D = 2, 6), the first in ring order needing 2 is client 1 (D1 = 2,
    cursor 0). Step 1: n = (2, 1): client 0 is visited first (+1: D0 = 3), client 1 pays
    with one quantum (D1 = 5 - 4 = 1). Step 2: n = (1, 1): client 0 (cursor) pays (D0 = 0,
    cursor 1). Step 3: client 1 (cursor) pays (D1 = 0, cursor 0), and the state is the
    first step's again: the pattern 1, 1, 0, 1 repeats, 3:1 as the weights say.

    Quantum 4 (Q = 4, 12, at least the cost): every client can pay on its first visit,
    the cursor alternates, and the split is 1:1 whatever the weights (DRR degenerates to
    round robin when dispatches are paced one at a time: the README's finding)."""
    rows = [(0, 0, 4, 1)] * 12 + [(0, 1, 4, 1)] * 12
    for quantum, pattern in ((1, [1, 1, 0, 1] * 3), (4, [0, 1] * 6)):
        s = Settings("drr", 4, weights=(1, 3), options=(("quantum", quantum), ("cost", "prefill")))
        result = replay(Trace.from_rows(rows), s, steps=12, record_every=1)
        assert _admitted_clients(result, 12) == pattern, quantum
        expect = run_reference([ref.Request(*r) for r in rows], 2, s, 12)
        np.testing.assert_array_equal(result.checkpoints[0], service_matrix(expect))


def test_gateway_vtc_forgets_only_after_gc_steps():
    """llm-d's gateway VTC lifts only a client without a counter: a client silent for less
    than `gc` steps keeps its old (low) counter and bursts; with gc = 0 it is lifted.

    M = 4, every request (4, 1) costs 6 (prefill 4, one decode at 2): one admission per
    step. Steps 0-4 alternate (client 0 first on ties) until client 0's three requests are
    in: counters 18 and 12; client 1 alone for steps 5-9: 42. Client 0 returns at step 10.
    gc = 1000: it keeps 18 and wins steps 10-13 (24, 30, 36, 42: the tie at 42 goes to the
    smaller index), client 1 takes 14, client 0 15: five of six steps. gc = 0: its counter
    was dropped, it is lifted to 42, and the two alternate: three of six."""
    rows = [(0, 0, 4, 1)] * 3 + [(0, 1, 4, 1)] * 20 + [(10, 0, 4, 1)] * 6
    trace = Trace.from_rows(rows)
    burst = replay(trace, Settings("vtc_gateway", 4, options=(("gc", 1000),)), steps=20, record_every=1)
    lifted = replay(trace, Settings("vtc_gateway", 4, options=(("gc", 0),)), steps=20, record_every=1)
    w_burst, w_lift = burst.checkpoints[0], lifted.checkpoints[0]
    after = slice(10, 16)
    gain = lambda w: (w[after.stop - 1] - w[after.start - 1])  # noqa: E731
    assert gain(w_burst)[0] == 5 * 6
    assert gain(w_lift)[0] == 3 * 6
    for s, r in ((Settings("vtc_gateway", 4, options=(("gc", 1000),)), burst),
                 (Settings("vtc_gateway", 4, options=(("gc", 0),)), lifted)):
        expect = run_reference([ref.Request(*x) for x in rows], 2, s, 20)
        np.testing.assert_array_equal(r.checkpoints[0], service_matrix(expect))
