"""Fairness in GPU time (`--cost time`): each step charges each tenant its share of the
step's time under the step-time model (servers/step_time.py slot_shares), worked by hand;
the shares against exact Fractions on random steps; the refusals."""

from __future__ import annotations

import csv
import json
from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.cli.commands import main
from vtc_jax.servers import step_time

MODEL = '{"b0": "1000", "b1": "10", "b2": "100", "a0": 0}'  # steps of 1000 + 10 x prefill + 100 x decode us
LOG = "timestamp,tenant,prompt,output\n0,a,10,2\n0,b,30,2\n"


def _files(tmp_path):
    model, log = tmp_path / "m.json", tmp_path / "ab.csv"
    model.write_text(MODEL)
    log.write_text(LOG)
    return model, log


def test_two_tenants_charged_in_gpu_time_worked_by_hand(tmp_path):
    """A (prompt 10) and B (prompt 30), both of output 2, arrive together. Step 1 prefills
    both: 1000 + 10 x 40 = 1400 us; each pays its own 10 us per prompt token and half of the
    1000 us a step costs: A 100 + 500 = 600, B 300 + 500 = 800. Step 2 decodes both: 1000 +
    2 x 100 = 1200 us; 100 + 500 = 600 each, and both finish. VTC's counters (charged in us):
    A 1200, B 1400; shares of GPU time 1200/2600 and 1400/2600."""
    model, log = _files(tmp_path)
    out, requests = tmp_path / "run.json", tmp_path / "requests.csv"
    assert main(["replay", str(log), "--policy", "vtc", "--server", "vllm", "--step-time", str(model),
                 "--num-gpu-blocks", "100", "--max-num-seqs", "2", "--cost", "time", "--json", str(out),
                 "--requests-out", str(requests), "--no-cache"]) == 0
    rows = {r["tenant"]: r for r in csv.DictReader(requests.open())}
    assert (int(rows["a"]["gpu_time_us"]), int(rows["b"]["gpu_time_us"])) == (1200, 1400)
    assert (int(rows["a"]["e2e_us"]), int(rows["b"]["e2e_us"])) == (2600, 2600)
    result = json.loads(out.read_text())
    service = result["service"] if "service" in result else result["clients"]["service"]
    assert [round(float(x)) for x in service] == [1200, 1400]


def test_gpu_share_in_the_timed_report_whatever_the_cost(tmp_path):
    """Under --cost tokens too, the report carries each tenant's share of GPU time: the
    same steps, so the same 1200 and 1400 us (fcfs admits both at once either way)."""
    model, log = _files(tmp_path)
    for cost in ("tokens", "time"):
        out = tmp_path / cost
        assert main(["compare", str(log), "--server", "vllm", "--step-time", str(model), "--num-gpu-blocks", "100",
                     "--max-num-seqs", "2", "--policies", "fcfs", "--cost", cost, "--out", str(out), "--no-plots",
                     "--no-cache"]) == 0
        rows = json.loads((out / "results.json").read_text())["rows"]
        metrics = rows[0]["metrics"]
        assert metrics["gpu_share[a]"]["mean"] == pytest.approx(1200 / 2600)
        assert metrics["gpu_share[b]"]["mean"] == pytest.approx(1400 / 2600)


@pytest.mark.parametrize("flags, words", [
    (["--policies", "wfq"], "--cost time: policy wfq prices each request by its tokens"),
    (["--policies", "vtc", "--w-q", "3"], "--w-q: --cost time charges GPU time, not tokens"),
])
def test_cost_time_refusals_are_one_line(tmp_path, capsys, flags, words):
    model, log = _files(tmp_path)
    assert main(["compare", str(log), "--server", "vllm", "--step-time", str(model), "--num-gpu-blocks", "100",
                 "--cost", "time", "--out", str(tmp_path / "o"), "--no-cache", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_cost_time_needs_a_timed_vllm_server(tmp_path, capsys):
    _, log = _files(tmp_path)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,client,prompt,output\n0,0,10,2\n0,1,30,2\n")
    assert main(["replay", str(trace), "--policy", "vtc", "--kv-budget", "100", "--cost", "time", "--no-cache"]) == 2
    assert "--cost time needs a timed vllm server" in capsys.readouterr().err


def test_slot_shares_against_fractions_on_random_steps():
    """Each scheduled slot's share: trunc(the binding form's terms of its own features) +
    trunc(per_step) split evenly, the first remainder slots 1 us more; over two forms (the
    binding one: the first of the largest) and 200 random steps."""
    model = step_time.StepTime(forms=(
        step_time._form({"per_step": Fraction("812.25"), "per_prefill_token": Fraction("1.5"),
                         "per_decode_context": Fraction("0.0125"), "per_request": Fraction("3.3")}),
        step_time._form({"per_step": Fraction("95.5"), "per_chunk_attention": Fraction("0.00021"),
                         "per_decode_token": Fraction("40.125"), "per_prefill_context": Fraction("0.0003")})))
    enc = step_time.encode(model.text)
    rng = np.random.default_rng(7)
    for _ in range(200):
        tok = rng.integers(0, 2000, 6) * (rng.random(6) < 0.8)
        dec = rng.random(6) < 0.5
        tok = np.where(dec, (tok > 0).astype(int), tok)
        length, computed = rng.integers(1, 50000, 6), rng.integers(0, 5000, 6)
        got = np.asarray(step_time.slot_shares(enc, *(jnp.asarray(x, jnp.int32) for x in (tok, dec, length, computed))))

        def feats(s, tok=tok, dec=dec, length=length, computed=computed):
            pre = tok[s] > 0 and not dec[s]
            return dict(per_request=int(tok[s] > 0), per_prefill_token=int(tok[s]) if pre else 0,
                        per_decode_token=int(tok[s]) if dec[s] and tok[s] else 0,
                        per_chunk_attention=Fraction(int(tok[s])) * (int(length[s]) + Fraction(int(tok[s]), 2)) if pre else 0,
                        per_decode_context=int(length[s]) if dec[s] and tok[s] else 0,
                        per_prefill_context=(int(tok[s]) * int(computed[s]) + Fraction(int(tok[s]) * (int(tok[s]) + 1), 2))
                        if pre else 0)

        def form_sum(form, x):
            return sum(c * Fraction(x.get(n, 0)) for n, c in zip(step_time.FEATURES, form))

        whole = {n: sum(Fraction(feats(s)[n]) for s in range(6)) for n in step_time.FEATURES if n != "per_step"}
        sums = [int(form_sum(f, {**whole, "per_step": 1})) for f in model.forms]
        form = model.forms[sums.index(max(sums))]
        on = [s for s in range(6) if tok[s] > 0]
        base = int(form[0])
        want = [0] * 6
        for rank, s in enumerate(on):
            want[s] = int(form_sum(form, feats(s))) + base // len(on) + (rank < base % len(on))
        assert list(got) == want


def test_scaled_integer_steps_equal_the_limbs_and_fall_back_when_they_could_overflow():
    """A linear model (one form over per_step, per_request, per_prefill_token,
    per_decode_token) whose longest step sums below 2^31 once scaled by a power of ten runs
    as one int32 dot (step_time.step_terms leads with SCALED): its durations and slot shares
    equal the exact limbs' (and Fractions') on 300 random steps; a model with other terms,
    too many decimals or a budget whose longest step could pass 2^31 keeps the limbs."""
    text = "per_step=7051.8,per_request=3.25,per_prefill_token=19.54,per_decode_token=25.43"
    assert step_time.scaled_form(text, 8192, 256) == ([705180, 325, 1954, 2543], 100)
    assert step_time.step_terms([(text, 8192, 256), ("", 0, 0)])[0] == step_time.SCALED
    assert step_time.scaled_form(text, 600_000, 256) is None  # 705180 + 325 x 256 + 4497 x 600000 > 2^31
    assert step_time.step_terms([(text, 8192, 256), (text, 600_000, 256)])[0] != step_time.SCALED
    assert step_time.scaled_form("per_step=1.0000000001", 8192, 256) is None  # ten decimals
    assert step_time.scaled_form("per_step=5,per_decode_context=0.5", 8192, 256) is None
    enc = step_time.encode(text, 8192, 256)
    limbs, fast = step_time.used_terms([text]), step_time.step_terms([(text, 8192, 256)])
    rng = np.random.default_rng(11)
    form = step_time.parse_text(text)[0]
    for _ in range(300):
        dec = rng.random(8) < 0.5
        tok = np.where(dec, rng.random(8) < 0.8, rng.integers(0, 1000, 8) * (rng.random(8) < 0.6)).astype(np.int64)
        args = [jnp.asarray(x, jnp.int32) for x in (tok, dec, rng.integers(1, 9000, 8), rng.integers(0, 8000, 8))]
        prefill, decode = int(tok[~dec].sum()), int(tok[dec].sum())
        want = max(1, int(step_time.StepTime(forms=(form,)).step_us(prefill, decode, per_request=int((tok > 0).sum()))))
        assert int(step_time.duration(enc, *args, terms=fast)) == int(step_time.duration(enc, *args, terms=limbs)) == want
        assert (np.asarray(step_time.slot_shares(enc, *args, terms=fast))
                == np.asarray(step_time.slot_shares(enc, *args, terms=limbs))).all()
