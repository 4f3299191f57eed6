"""ServeGen's production clients: reading, malformed files, the plan (both counting rules),
and generated traffic."""

from __future__ import annotations

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vtc_jax.core.errors import InputError
from vtc_jax.inputs import servegen as sg
from vtc_jax.inputs import servegen_device, servegen_files
from vtc_jax.inputs.servegen_files import GAMMA, WEIBULL
from vtc_jax.inputs.workload import ARRIVAL, CACHED, INT32_MAX, ORDER, OUTPUT, PROMPT, padding_rows

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "servegen", "m-large")
TRACE_ONLY = {15, 21, 41, 44, 66, 72, 73, 82, 89, 100, 112, 120, 142, 148, 156}
SMALL = (1, 6, 102)  # full clients with small dataset files, for the malformed copies


@pytest.fixture(scope="module")
def data():
    return sg.read_servegen(DATA)


def _keys(n: int, base: int = 0) -> jax.Array:
    return jax.vmap(lambda s: jax.random.fold_in(jax.random.key(base), s))(jnp.arange(n, dtype=jnp.uint32))


@functools.lru_cache(maxsize=None)
def _generator(layout: sg.ServeGenLayout):
    return jax.jit(jax.vmap(functools.partial(sg.generate, layout=layout), in_axes=(0, None)))


def _generate(p: sg.ServeGenPlan, keys) -> tuple[np.ndarray, np.ndarray]:
    """(rows int64[L, R, 5], real requests int64[L])."""
    rows, num = _generator(p.layout)(keys, p.params)
    return np.asarray(rows).astype(np.int64), np.asarray(num).astype(np.int64)


# ---- reading ----------------------------------------------------------------------------

def test_sample_loads_with_and_without_trace_only(data):
    """87 clients (15 substituted), 36 rows, README's request totals, busiest client 61."""
    assert data.num_clients == 87 and data.num_windows == 36
    assert list(data.client_ids) == sorted(data.client_ids)
    assert set(data.client_ids[data.substituted]) == TRACE_ONLY
    assert data.timestamps[0] == 842400 and (np.diff(data.timestamps) == 600).all()
    req = data.requests()
    assert round(req.sum()) == 6_508_227
    assert round(req[~data.substituted].sum()) == 5_357_298
    assert data.client_ids[np.argmax(req)] == 61 and round(req.max()) == 1_646_163
    assert (data.lengths >= 0).all() and data.skipped == ()
    assert len(data.pmfs) == 73 and data.pmfs[-1].source.startswith("substitute")
    full = sg.read_servegen(DATA, include_trace_only=False)
    assert full.num_clients == 72 and round(full.requests().sum()) == 5_357_298
    assert not full.substituted.any() and len(full.pmfs) == 72
    # The substitute is the request-weighted pool: its mean prompt is README's 659.0.
    sub = data.pmfs[-1]
    assert sub.prompt_probs.sum() == pytest.approx(1)
    assert sub.prompt_probs @ sub.prompt_values == pytest.approx(659.0, abs=0.05)
    assert sub.output_probs @ sub.output_values == pytest.approx(151.9, abs=0.05)
    # The mean input/output of client 61's PMF match README's table.
    pmf = data.pmfs[data.lengths[list(data.client_ids).index(61), 0]]
    assert round(pmf.prompt_probs @ pmf.prompt_values) == 495
    assert round(pmf.output_probs @ pmf.output_values) == 317


def _copy(tmp_path, clients=SMALL, trace_only=(73,)):
    d = tmp_path / "m"
    d.mkdir(parents=True)
    for c in clients:
        for suffix in ("trace.csv", "dataset.json"):
            shutil.copy(os.path.join(DATA, f"chunk-{c}-{suffix}"), d)
    if trace_only:
        (d / "trace-only").mkdir()
        for c in trace_only:
            shutil.copy(os.path.join(DATA, "trace-only", f"chunk-{c}-trace.csv"), d / "trace-only")
    return d


def _edit_line(path, n, edit):
    lines = path.read_bytes().split(b"\r\n")
    lines[n - 1] = edit(lines[n - 1].decode()).encode()
    path.write_bytes(b"\r\n".join(lines))


def _edit_json(path, edit):
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj, indent=2))


def _first_active(path) -> int:
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if float(line.split(",")[1]) > 0:
            return n
    raise AssertionError


def _set_field(i, value):
    def edit(line):
        f = line.split(",")
        f[i] = value
        return ",".join(f)
    return edit


def _pmf_edit(field, text):
    def edit(obj):
        obj["842400"][field] = text
    return edit


CASES = {
    "truncated row": ("chunk-6-trace.csv", 7, lambda l: l.rsplit(",", 1)[0], "line 7: expected 6 fields"),
    "extra field": ("chunk-6-trace.csv", 3, lambda l: l + ",1", "line 3: expected 6 fields"),
    "non-numeric rate": ("chunk-6-trace.csv", 5, _set_field(1, "fast"), "line 5: rate 'fast' is not a number"),
    "nan cv": ("chunk-6-trace.csv", 2, _set_field(2, "nan"), "line 2: cv 'nan' is not finite"),
    "negative rate": ("chunk-6-trace.csv", 4, _set_field(1, "-0.5"), "line 4: rate -0.5 is negative"),
    "negative cv": ("chunk-6-trace.csv", 9, _set_field(2, "-1"), "line 9: cv -1 is negative"),
    "bad timestamp": ("chunk-6-trace.csv", 1, _set_field(0, "8424x0"), "line 1: timestamp '8424x0'"),
    "huge rate": ("chunk-6-trace.csv", 5, _set_field(1, "1e306"), "line 5: rate 1e306 is over the limit of 1e+06"),
    "gap in timestamps": ("chunk-6-trace.csv", 12, _set_field(0, "849601"),
                          "line 12: timestamp 849601 is not 600 s"),
}
ACTIVE_CASES = {  # applied to the first row with rate > 0 of the file
    "unknown pattern": (_set_field(3, "Poisson"), "unknown pattern 'Poisson'"),
    "pattern missing": (_set_field(3, ""), "> 0 but no pattern"),
    "zero shape": (_set_field(4, "0"), "needs shape arg1 > 0"),
    "huge shape": (_set_field(4, "1e300"), "shape arg1 1e300 is outside"),
    "tiny shape": (_set_field(4, "1e-300"), "shape arg1 1e-300 is outside"),
}
PMF_CASES = {
    "unparsable dict": ("input_tokens", "{1: 0.5, 2: 0.5", "unparsable dict literal"),
    "not a dict": ("output_tokens", "[1, 2]", "not a dict literal"),
    "code injection": ("input_tokens", "__import__('os').system('echo pwned')", "not a dict literal"),
    "call inside dict": ("input_tokens", "{1: __import__('os').getpid()}", "unparsable dict literal"),
    "sum not 1": ("output_tokens", "{1: 0.5, 2: 0.4}", "sum to 0.9, not 1"),
    "negative probability": ("input_tokens", "{1: 1.5, 2: -0.5}", "probability -0.5 of 2"),
    "float key": ("input_tokens", "{1.5: 1.0}", "key 1.5 is not a token count"),
    "negative key": ("output_tokens", "{-3: 1.0}", "key -3 is not a token count"),
    "duplicate key": ("output_tokens", "{4: 0.5, 4: 0.5}", "duplicate token counts"),
    "string probability": ("output_tokens", "{4: '1'}", "probability '1' of 4"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_trace_rows(tmp_path, case):
    name, line, edit, message = CASES[case]
    d = _copy(tmp_path)
    _edit_line(d / name, line, edit)
    with pytest.raises(InputError) as err:
        sg.read_servegen(d)
    assert str(d / name) in str(err.value) and message in str(err.value), str(err.value)


@pytest.mark.parametrize("case", sorted(ACTIVE_CASES))
def test_malformed_active_rows(tmp_path, case):
    edit, message = ACTIVE_CASES[case]
    d = _copy(tmp_path)
    n = _first_active(d / "chunk-102-trace.csv")
    _edit_line(d / "chunk-102-trace.csv", n, edit)
    with pytest.raises(InputError, match=f"chunk-102-trace.csv, line {n}: .*{message}"):
        sg.read_servegen(d)


@pytest.mark.parametrize("case", sorted(PMF_CASES))
def test_malformed_pmfs(tmp_path, case):
    field, text, message = PMF_CASES[case]
    d = _copy(tmp_path)
    _edit_json(d / "chunk-1-dataset.json", _pmf_edit(field, text))
    with pytest.raises(InputError) as err:
        sg.read_servegen(d)
    assert f'chunk-1-dataset.json, key "842400", {field}: ' in str(err.value) and message in str(err.value), \
        str(err.value)


def test_malformed_files(tmp_path, monkeypatch):
    """Whole-file problems: one InputError each, naming the file (and line or key)."""
    def fails(d, *parts):
        with pytest.raises(InputError) as err:
            sg.read_servegen(d)
        for part in parts:
            assert part in str(err.value), str(err.value)

    d = _copy(tmp_path / "a")  # rows differ between clients: one trace starts later
    lines = (d / "chunk-6-trace.csv").read_bytes().split(b"\r\n")
    (d / "chunk-6-trace.csv").write_bytes(b"\r\n".join(lines[1:]))
    fails(d, "chunk-6-trace.csv, line 1", "every client must have the same timestamps")

    d = _copy(tmp_path / "b")  # one trace shorter
    (d / "chunk-102-trace.csv").write_bytes(b"\r\n".join(lines[:20]) + b"\r\n")
    fails(d, "chunk-102-trace.csv, line 21", "20 rows")

    d = _copy(tmp_path / "c")  # invalid JSON
    (d / "chunk-6-dataset.json").write_text('{\n  "842400": {\n    "input_tokens": "{1: 1.0}",\n  }\n}')
    fails(d, "chunk-6-dataset.json, line 4: invalid JSON")

    d = _copy(tmp_path / "d")  # duplicate window key in the JSON object
    text = (d / "chunk-6-dataset.json").read_text()
    (d / "chunk-6-dataset.json").write_text(text[:-1] + ',\n  "842400": ' + text[text.index("{", 1):])
    fails(d, "chunk-6-dataset.json", "duplicate key '842400'")

    d = _copy(tmp_path / "e")  # missing field
    _edit_json(d / "chunk-1-dataset.json", lambda o: o["842400"].pop("output_tokens"))
    fails(d, 'chunk-1-dataset.json, key "842400": missing', "output_tokens")

    d = _copy(tmp_path / "f")  # a trace without its dataset in the main folder
    os.remove(d / "chunk-102-dataset.json")
    fails(d, "chunk-102-trace.csv", "no chunk-102-dataset.json", "trace-only/")

    d = _copy(tmp_path / "g", clients=(), trace_only=(73, 156))  # trace-only, nothing to pool
    fails(d, "chunk-73-trace.csv", "no substitute is possible")

    d = _copy(tmp_path / "h")  # the dataset window starts after active rows
    _edit_json(d / "chunk-102-dataset.json", lambda o: o.update({"863400": o.pop("842400")}))
    n = _first_active(d / "chunk-102-trace.csv")
    fails(d, f"chunk-102-trace.csv, line {n}", "no (non-empty) window")

    d = _copy(tmp_path / "i")  # not UTF-8
    raw = (d / "chunk-1-trace.csv").read_bytes().split(b"\r\n")
    raw[3] = b"\xff" + raw[3]
    (d / "chunk-1-trace.csv").write_bytes(b"\r\n".join(raw))
    fails(d, "chunk-1-trace.csv, line 4: not UTF-8")

    d = _copy(tmp_path / "j")  # a client in both folders
    shutil.copy(d / "chunk-6-trace.csv", d / "trace-only")
    fails(d, "trace-only/chunk-6-trace.csv", "client 6 is also in")

    d = _copy(tmp_path / "k")  # size limit, named in the message, checked before reading
    monkeypatch.setattr(servegen_files, "MAX_FILE_BYTES", 1000)
    fails(d, "chunk-6-trace.csv: ServeGen trace is 1,820 bytes, over the limit of 1,000")
    monkeypatch.undo()

    d = _copy(tmp_path / "l")  # binary junk
    (d / "chunk-102-dataset.json").write_bytes(b'{"842400": \x00}')
    fails(d, "chunk-102-dataset.json: not a text ServeGen dataset (contains NUL bytes)")

    fails(tmp_path / "nowhere", "not a directory")


@pytest.mark.parametrize("kind", ["trace.csv", "dataset.json"])
def test_two_files_for_one_client_refused(tmp_path, kind):
    """chunk-01-... beside chunk-1-...: one client id, so one file would be dropped; both named."""
    d = _copy(tmp_path)
    shutil.copy(d / f"chunk-6-{kind}", d / f"chunk-01-{kind}")
    with pytest.raises(InputError) as err:
        sg.read_servegen(d)
    assert str(d / f"chunk-01-{kind}") in str(err.value) and str(d / f"chunk-1-{kind}") in str(err.value), \
        str(err.value)
    assert "two files for client 1" in str(err.value)


def test_native_layout_variants(tmp_path):
    """LF line endings, later dataset windows, empty (skipped) windows, zero lengths."""
    d = _copy(tmp_path)
    (d / "chunk-6-trace.csv").write_bytes((d / "chunk-6-trace.csv").read_bytes().replace(b"\r\n", b"\n"))
    obj = json.loads((d / "chunk-1-dataset.json").read_text())
    obj["853200"] = {"input_tokens": "{}", "output_tokens": "{}"}  # skipped: 842400 stays in force
    obj["856800"] = {"input_tokens": "{0: 0.25, 7: 0.75}", "output_tokens": "{0: 0.5, 3: 0.5}"}
    obj["800000"] = {"input_tokens": "{5: 1.0}", "output_tokens": "{5: 1.0}", "reason_ratio": "{}"}
    (d / "chunk-1-dataset.json").write_text(json.dumps(obj))
    data = sg.read_servegen(d)
    assert list(data.client_ids) == [1, 6, 73, 102] and list(data.substituted) == [False, False, True, False]
    assert len(data.skipped) == 2 and "853200" in data.skipped[1] and "reason_ratio" in data.skipped[0]
    row = data.lengths[0]
    first_window = data.pmfs[row[0]]
    assert first_window.source.endswith('key "842400"')
    assert (row[:(856800 - 842400) // 600] == row[0]).all()
    last = data.pmfs[row[-1]]
    assert list(last.prompt_values) == [1, 7] and last.prompt_raised == 0.25 and last.output_raised == 0.5
    assert list(last.output_values) == [1, 3]
    p = sg.plan(data, load=1.0, kv_budget=4096, horizon=3600)
    # Client 1 and, through the pooled substitute, client 73 carry raised mass.
    assert p.zero_raised[0] > 0 and p.zero_raised[2] > 0 and p.zero_raised[1] == p.zero_raised[3] == 0
    assert int(np.asarray(p.params.values).min()) >= 1


# ---- the plan -----------------------------------------------------------------------------

M, H, PAD = 8192, 20000, 5  # the load-1 setting of the brief: all 36 rows on 20000 steps


def test_plan_definitions(data):
    """The unbiased rule (default): floor(x) + Bernoulli(frac(x)) per row, E = x."""
    p = sg.plan(data, load=1.0, kv_budget=M, horizon=H, pad=PAD)
    assert p.counting == "unbiased" and p.pad == PAD
    native = data.rate * 600
    x = p.scale * native
    # The load equation, the counts and their expectation.
    assert (x * p.demand).sum() / H == pytest.approx(1.0 * M, rel=1e-12)
    assert (p.target == x).all()
    assert (p.base == np.floor(x)).all() and (np.abs(p.base + p.extra - x) <= 2.0 ** -32).all()
    assert ((p.extra * 2.0 ** 32) % 1 == 0).all() and (p.extra < 1).all()
    assert (p.capacity == p.base + (p.extra > 0)).all() and (p.capacity <= np.floor(x) + 1).all()
    assert (p.capacity[data.rate == 0] == 0).all()
    assert p.expected_requests == pytest.approx(x.sum(axis=1), rel=1e-12, abs=1e-9)
    assert (p.max_requests == p.capacity.sum(axis=1)).all()
    assert abs(p.expected_load - 1.0) < 1e-9
    # Every client with traffic can appear; its chance of appearing in a lane is reported.
    assert p.clients_possible == 87 and (p.expected_requests > 0).all()
    assert 40 < p.clients_expected < 87
    only_extra = p.base.sum(axis=1) == 0
    assert (p.appear[~only_extra] == 1).all()
    assert p.appear[only_extra] == pytest.approx(1 - np.prod(1 - p.extra[only_extra], axis=1))
    assert (p.appear <= np.minimum(p.expected_requests, 1) + 1e-12).all()
    assert "clients with >= 1 expected request" in p.summary()
    # The static layout: capacity per client plus pad rows; gap slots capacity + 1 per row.
    lay = p.layout
    assert lay.pad == PAD and lay.sizes == tuple(int(c) + PAD for c in p.max_requests)
    assert lay.num_slots == int(p.capacity.sum()) and p.num_rows == lay.num_rows == lay.num_slots + 87 * PAD
    assert lay.num_gaps == int((p.capacity + 1)[p.capacity > 0].sum())
    assert hash(lay) == hash(sg.plan(data, load=1.0, kv_budget=M, horizon=H, pad=PAD).layout)
    first, size = sg.block_layout(p)
    assert first.dtype == size.dtype == np.int32 and (size == p.max_requests + PAD).all()
    assert first[0] == 0 and (first[1:] == np.cumsum(size)[:-1]).all()
    # match_load changes nothing here: the expectation is already exact.
    assert sg.plan(data, load=1.0, kv_budget=M, horizon=H, match_load=True).scale == p.scale
    # Defaults: prompts clipped at M, outputs at 16384 (the sample's longest output is 8192).
    assert p.max_prompt == M and p.max_output == 16384 and (p.output_clipped == 0).all()
    assert p.prompt_clipped.max() > 0 and (p.prompt_clipped[p.substituted] > 0).all()
    assert int(np.asarray(p.params.values).max()) == M
    assert sg.plan(data, load=1.0, kv_budget=M, horizon=H).pad == 0
    # s = 1 reproduces the data's counts in expectation.
    native_plan = sg.plan(data, load=p.native_load, kv_budget=M, horizon=H)
    assert native_plan.scale == pytest.approx(1.0, rel=1e-12)
    assert native_plan.expected_requests.sum() == pytest.approx(6_508_227, rel=1e-9)
    assert (np.abs(native_plan.base + native_plan.extra - native) < 1e-6).all()
    # A span of rows, and caps.
    q = sg.plan(data, load=2.0, kv_budget=M, horizon=3000, windows=(10, 16), max_prompt=1000, max_output=50)
    assert q.timestamps[0] == data.timestamps[10] and q.base.shape == (87, 6) and q.layout.horizon == 3000
    assert (q.output_clipped > 0).any() and int(np.asarray(q.params.values).max()) == 1000
    assert abs(q.expected_load - 2.0) < 1e-9


def test_plan_servegen_rule(data):
    """ServeGen's own rule: ceil(x) gaps, the last arrival dropped, so ceil(x) - 1 arrivals."""
    p = sg.plan(data, load=1.0, kv_budget=M, horizon=H, counting="servegen", pad=PAD)
    native = data.rate * 600
    x = p.scale * native
    assert p.scale == sg.plan(data, load=1.0, kv_budget=M, horizon=H).scale
    gaps = np.where(data.rate > 0, np.ceil(x - 1e-6), 0)
    assert (p.base == np.maximum(gaps - 1, 0)).all() and (p.extra == 0).all() and (p.capacity == p.base).all()
    assert (p.expected_requests == p.base.sum(axis=1)).all() and (p.max_requests == p.expected_requests).all()
    assert p.layout.num_gaps == int(gaps[gaps >= 2].sum())  # a lone gap emits nothing: not drawn
    assert p.expected_load == pytest.approx((p.base * p.demand).sum() / (M * H))
    assert ((p.appear == 1) == (p.base.sum(axis=1) > 0)).all() and ((p.appear == 0) | (p.appear == 1)).all()
    # The compression problem: at load 1 most clients send nothing and the load falls short.
    assert p.clients_possible == p.clients_expected == 11
    assert 0.6 < p.expected_load < 0.8
    matched = sg.plan(data, load=1.0, kv_budget=M, horizon=H, counting="servegen", match_load=True)
    assert matched.expected_load == pytest.approx(1.0, abs=matched.demand.max() / (M * H))
    # s = 1 reproduces the data: rate * 600 gaps per row, one fewer request.
    native_plan = sg.plan(data, load=p.native_load, kv_budget=M, horizon=H, counting="servegen")
    assert (native_plan.base + (data.rate > 0) == np.rint(native)).all()
    assert native_plan.max_requests.sum() == 6_508_227 - int((data.rate > 0).sum())


@pytest.mark.parametrize("kwargs, message", [
    (dict(load=0.0), "load must be a finite number > 0"),
    (dict(load=float("inf")), "load must be a finite number > 0"),
    (dict(kv_budget=0), "kv_budget must be an integer >= 1"),
    (dict(horizon=20), "shorter than the 36 rows"),
    (dict(horizon=40_000_000), "overflows the arrival * K + k sort key"),
    (dict(windows=(5, 5)), "windows must be (first, stop)"),
    (dict(windows=(0, 37)), "windows must be (first, stop)"),
    (dict(windows=(0.5, 3)), "windows must be (first, stop)"),
    (dict(max_output=0), "max_output must be an integer >= 1"),
    (dict(load=1e6), "over the 1024 MiB limit per lane"),
    (dict(load=1e6, counting="servegen"), "over the 1024 MiB limit per lane"),
    (dict(load=1e300), "over the 1024 MiB limit per lane"),  # checked before counts become int64
    (dict(load=1e300, counting="servegen"), "over the 1024 MiB limit per lane"),
    (dict(counting="poisson"), "counting must be one of unbiased, servegen"),
    (dict(pad=-1), "pad must be an integer >= 0"),
    (dict(pad=True), "pad must be an integer >= 0"),
])
def test_plan_refuses(data, kwargs, message):
    args = dict(load=1.0, kv_budget=M, horizon=H) | kwargs
    with pytest.raises(InputError) as err:
        sg.plan(data, **args)
    assert message in str(err.value), str(err.value)


# ---- generated traffic --------------------------------------------------------------------

def _check_layout(p: sg.ServeGenPlan, rows: np.ndarray, num: np.ndarray) -> np.ndarray:
    """Every lane: each block holds its real requests first, sorted by arrival, then at
    least `pad` padding rows; ORDER is the rank among real rows in (arrival, client,
    position) order; per client-row counts within [base, capacity]. Returns the counts
    int64[L, K, W]."""
    k, w, lanes, r = p.num_clients, p.layout.num_windows, rows.shape[0], p.num_rows
    first, size = sg.block_layout(p)
    assert rows.shape[1:] == (r, 5) and num.shape == (lanes,)
    real = rows[..., ARRIVAL] != INT32_MAX
    assert (real.sum(axis=1) == num).all()
    assert (rows[~real] == padding_rows(1)[0]).all()
    live = rows[real]
    assert (live[:, CACHED] == 0).all() and (live[:, PROMPT] >= 1).all() and (live[:, OUTPUT] >= 1).all()
    assert (live[:, PROMPT] <= p.max_prompt).all() and (live[:, OUTPUT] <= p.max_output).all()
    assert (live[:, ARRIVAL] >= 0).all() and (live[:, ARRIVAL] < p.horizon).all()
    client = np.repeat(np.arange(k), size)
    position = np.arange(r) - first[client]
    n = np.stack([real[:, first[c]:first[c] + size[c]].sum(axis=1) for c in range(k)], axis=1)  # [L, K]
    assert (real == (position < n[:, client])).all()  # real rows first, then padding
    assert (size - n >= p.pad).all() and (n <= p.max_requests).all()
    arrival = np.where(real, rows[..., ARRIVAL], p.horizon)
    same_block = client[1:] == client[:-1]
    assert (np.diff(arrival, axis=1)[:, same_block] >= 0).all()  # sorted; padding after
    for lane in range(lanes):
        rank = np.empty(r, np.int64)
        rank[np.lexsort((position, client, arrival[lane]))] = np.arange(r)
        assert (rows[lane, real[lane], ORDER] == rank[real[lane]]).all()
    window = np.minimum(np.searchsorted(p.bounds, arrival, side="right") - 1, w)
    cell = np.where(real, client * (w + 1) + window, k * (w + 1))
    counts = np.stack([np.bincount(c, minlength=k * (w + 1) + 1)[:-1] for c in cell]).reshape(lanes, k, w + 1)
    assert (counts[..., w] == 0).all()
    counts = counts[..., :w]
    assert (counts >= p.base).all() and (counts <= p.capacity).all()
    return counts


@pytest.fixture(scope="module")
def full_span(data):
    """The load-1 plan over all 36 rows (M = 8192, 20000 steps, pad 5), 256 lanes."""
    p = sg.plan(data, load=1.0, kv_budget=M, horizon=H, pad=PAD)
    rows, num = _generate(p, _keys(256))
    return p, rows, num, _check_layout(p, rows, num)


def test_generated_layout_and_determinism(full_span):
    p, rows, num, _ = full_span
    keys = _keys(256)
    again, num_again = _generate(p, keys[::-1])  # the same keys in another batch order
    assert (again[::-1] == rows).all() and (num_again[::-1] == num).all()
    one, n = jax.jit(functools.partial(sg.generate, layout=p.layout))(keys[7], p.params)
    assert (np.asarray(one) == rows[7]).all() and int(n) == num[7]
    assert one.dtype == n.dtype == jnp.int32 and n.shape == ()
    assert not (rows[0] == rows[1]).all() and len(set(num.tolist())) > 1


def test_unbiased_counts(full_span):
    """Per client, the mean count over 256 lanes matches E = sum_w x (5 standard errors,
    sqrt(sum_w p (1 - p) / L)); rows without a fractional part are exact; every client has
    traffic; the share of lanes a client appears in matches `appear`."""
    p, rows, num, counts = full_span
    lanes = len(rows)
    assert ((counts == p.capacity) | (counts == p.base)).all()
    assert (counts[:, p.extra == 0] == p.base[p.extra == 0]).all()
    per_client = counts.sum(axis=2)
    se = np.sqrt((p.extra * (1 - p.extra)).sum(axis=1) / lanes)
    assert (np.abs(per_client.mean(axis=0) - p.expected_requests) <= 5 * se + 1e-9).all()
    row_se = np.sqrt(p.extra * (1 - p.extra) / lanes)
    assert (np.abs(counts.mean(axis=0) - (p.base + p.extra)) <= 6 * row_se + 1e-9).all()
    shown = (per_client > 0).mean(axis=0)
    assert (np.abs(shown - p.appear) <= 5 * np.sqrt(p.appear * (1 - p.appear) / lanes) + 1e-9).all()
    assert (per_client > 0).any(axis=0).sum() >= 80  # most clients show up in some lane
    assert abs(num.mean() - p.expected_requests.sum()) < 5 * np.sqrt((p.extra * (1 - p.extra)).sum() / lanes)


def test_unbiased_positions(full_span):
    """The n arrivals of a row are the first n of n + 1 exchangeable gaps rescaled to the
    row, so the j-th sits on average at j / (n + 1) of it (whatever the gap law). Checked
    over all arrivals (steps' midpoints), standard error from lane totals."""
    p, rows, num, counts = full_span
    k, w = p.num_clients, p.layout.num_windows
    first, size = sg.block_layout(p)
    client = np.repeat(np.arange(k), size)
    real = rows[..., ARRIVAL] != INT32_MAX
    lane = np.broadcast_to(np.arange(len(rows))[:, None], real.shape)[real]
    arrival, c = rows[..., ARRIVAL][real], np.broadcast_to(client, real.shape)[real]
    win = np.searchsorted(p.bounds, arrival, side="right") - 1
    group = (lane * k + c) * w + win  # nondecreasing in this flattened order
    _, start, n = np.unique(group, return_index=True, return_counts=True)
    j = np.arange(len(group)) - np.repeat(start, n) + 1
    n = np.repeat(n, n)
    length = np.diff(p.bounds)[win]
    d = (arrival - p.bounds[win] + 0.5) / length - j / (n + 1)
    total, count = np.bincount(lane, weights=d), np.bincount(lane)
    ratio = total.sum() / count.sum()
    se = (total - ratio * count).std(ddof=1) / np.sqrt(len(rows)) / count.mean()
    assert abs(ratio) < 5 * se, (ratio, se)
    assert (n > 1).sum() > 10_000  # rows with several arrivals are well represented


def _demand(rows):
    o, q = rows[..., OUTPUT].astype(np.float64), rows[..., PROMPT].astype(np.float64)
    real = rows[..., ARRIVAL] != INT32_MAX
    return np.where(real, o * q + o * (o + 1) / 2, 0.0).sum(axis=-1)


def test_offered_load_and_lengths(full_span):
    """Realized demand / (M * horizon) matches expected_load = 1 (4 standard errors over 256
    lanes); per-client mean lengths match the clipped PMF means (5 standard errors each,
    clients with at least 30 requests over the lanes; in this sample a client's rows share
    one length table, so the pooled variance is the per-row one)."""
    p, rows, num, counts = full_span
    load = _demand(rows) / (p.kv_budget * p.horizon)
    assert abs(p.expected_load - 1.0) < 1e-9
    assert abs(load.mean() - p.expected_load) < 4 * load.std(ddof=1) / np.sqrt(len(load))
    first, size = sg.block_layout(p)
    tables = np.asarray(p.params.prompt_table)
    checked = 0
    for c in range(p.num_clients):
        seen = counts[:, c].sum()
        if seen < 30:
            continue
        assert len(set(tables[c][p.capacity[c] > 0])) == 1
        block = rows[:, first[c]:first[c] + size[c]]
        real = block[..., ARRIVAL] != INT32_MAX
        for field, mean, var in ((PROMPT, p.mean_prompt, p.var_prompt), (OUTPUT, p.mean_output, p.var_output)):
            v = var[c][p.capacity[c] > 0][0]
            se = np.sqrt(v / seen)
            assert abs(block[..., field][real].mean() - mean[c]) <= 5 * se + 1e-9, (p.client_ids[c], field)
        checked += 1
    assert checked >= 40


@pytest.fixture(scope="module")
def busy_rows(data):
    """ServeGen's rule on rows 8 and 9 only, scaled so client 57 draws 3000 gaps in row 8
    (Gamma, shape 0.73) and about 1950 in row 9 (Weibull, shape 0.25), on 2^24 steps (2^23
    per row), pad 2, 64 lanes."""
    h = 1 << 24
    base = sg.plan(data, load=1.0, kv_budget=M, horizon=h, windows=(8, 10), counting="servegen")
    c57 = list(data.client_ids).index(57)
    s = 3000 / (data.rate[c57, 8] * 600)
    p = sg.plan(data, load=s * base.native_load, kv_budget=M, horizon=h, windows=(8, 10), counting="servegen",
                pad=2)
    rows, num = _generate(p, _keys(64, base=11))
    return p, rows, num


def _sample_cv(gaps):
    return gaps.std(axis=-1) / gaps.mean(axis=-1)


def test_interarrival_cv(data, busy_rows):
    """Sample CV of a client-row's gaps (window start to first arrival, then between
    arrivals: the n - 1 observable gaps) against the same statistic of n - 1 iid draws of
    the row's distribution in numpy (2000 repetitions). Rescaling all n gaps by one factor
    leaves this CV unchanged, but the sample CV of n draws is biased low for small n and
    heavy tails (Gamma shape 0.06: about 3.75 vs 4.08 at n = 124), so the data's cv is only
    the target up to that bias; floor() to steps adds a 1/12 step^2 variance, negligible
    against gaps of thousands of steps. Tolerance: 5 standard errors of the difference."""
    p, rows, _ = busy_rows
    first, size = sg.block_layout(p)
    rng = np.random.default_rng(0)
    checked = {GAMMA: 0, WEIBULL: 0}
    for w in range(2):
        col = p.rows[0] + w
        for c in np.argsort(-p.base[:, w])[:4]:
            n = int(p.base[c, w]) + 1
            block = rows[:, first[c]:first[c] + size[c], ARRIVAL]
            inside = (block >= p.bounds[w]) & (block < p.bounds[w + 1])
            arrivals = block[inside].reshape(len(rows), n - 1).astype(np.float64)
            gaps = np.diff(np.concatenate([np.full((len(rows), 1), float(p.bounds[w])), arrivals], axis=1))
            cv = _sample_cv(gaps)
            shape, pattern = data.shape[c, col], data.pattern[c, col]
            draws = rng.gamma(shape, size=(2000, n)) if pattern == GAMMA else rng.weibull(shape, size=(2000, n))
            ref = _sample_cv(draws[:, :n - 1])
            se = np.sqrt(ref.var() / len(rows) + ref.var() / len(ref))
            assert abs(cv.mean() - ref.mean()) < 5 * se, (data.client_ids[c], col, cv.mean(), ref.mean())
            if pattern == GAMMA:  # method-of-moments fits: the data's cv is 1/sqrt(shape)
                assert data.cv[c, col] == pytest.approx(1 / np.sqrt(shape), rel=1e-6)
                assert abs(cv.mean() - data.cv[c, col]) < 5 * se + abs(ref.mean() - data.cv[c, col])
            checked[pattern] += 1
    assert checked[GAMMA] >= 3 and checked[WEIBULL] >= 1


def test_busy_rows_layout_and_load(busy_rows):
    p, rows, num = busy_rows
    counts = _check_layout(p, rows, num)
    assert (counts == p.base).all() and (num == p.max_requests.sum()).all()  # exact under this rule
    load = _demand(rows) / (p.kv_budget * p.horizon)
    assert abs(load.mean() - p.expected_load) < 4 * load.std(ddof=1) / np.sqrt(len(load))
    # Each active row offers x - ceil(x) + 1 in (0, 1] requests' demand less than the load.
    active_demand = p.demand[p.target > 0].sum() / (p.kv_budget * p.horizon)
    assert p.load - active_demand <= p.expected_load < p.load


def test_empty_and_lane_size_limits(data, monkeypatch):
    for pad in (0, 3):
        p = sg.plan(data, load=1e-6, kv_budget=M, horizon=H, counting="servegen", pad=pad)
        assert p.max_requests.sum() == 0 and p.layout.num_slots == 0
        rows, num = sg.generate(jax.random.key(0), p.params, layout=p.layout)
        assert rows.shape == (87 * pad, 5) and int(num) == 0
        assert (np.asarray(rows) == padding_rows(87 * pad)).all()
    # Unbiased at a tiny load: every active row may get one arrival, so each has capacity 1.
    q = sg.plan(data, load=1e-6, kv_budget=M, horizon=H)
    assert (q.capacity == (data.rate > 0)).all() and q.expected_requests.sum() < 1e-2
    big = sg.plan(data, load=1.0, kv_budget=M, horizon=H)
    monkeypatch.setattr(servegen_device, "MAX_LANE_BYTES", 1000)
    with pytest.raises(InputError, match=r"one lane would hold \d+ request rows"):
        sg.generate(jax.random.key(0), big.params, layout=big.layout)
