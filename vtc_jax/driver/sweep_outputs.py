"""What a sweep's results become: the printed tables (each cell mean [95% CI]), the load
line, per-client tables, and results.json, results.csv, series.json and the PNG plots,
written as one set (vtc_jax/driver/sweep.py runs the lanes and aggregates them)."""

from __future__ import annotations

import csv
import io
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from vtc_jax.core import fileio
from vtc_jax.driver.results import OVERLOAD, overloaded
from vtc_jax.driver.sweep import Plot, Sweep


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _render(header: list, lines: list) -> str:
    widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
    render = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([render(header), render(["-" * w for w in widths])] + [render(r) for r in lines])


def format_table(sweep: Sweep, result: dict) -> str:
    """Each cell: mean [95% CI]; the paper's (or seed document's) value beside it, only for
    the workload it belongs to."""
    show_paper = sweep.default_workload and bool(sweep.paper_values)
    header = ["setting"] + [c + (" (paper)" if show_paper and any(c in v for v in sweep.paper_values.values())
                                 else "") for c in sweep.columns]
    lines = []
    for entry in result["rows"]:
        cells = [entry["label"]]
        paper = sweep.paper_values.get(entry["label"], {}) if show_paper else {}
        for col in sweep.columns:
            m = entry["metrics"].get(col)
            cell = "n/a" if not m or m["mean"] is None else \
                f"{_fmt(m['mean'])} [{_fmt(m['ci95'][0])}, {_fmt(m['ci95'][1])}]"
            if col in paper:
                cell += f" ({_fmt(paper[col])})"
            cells.append(cell)
        lines.append(cells)
    return _render(header, lines)


def format_load(result: dict) -> str:
    """The load line of every row, and an overload warning where offered exceeds served."""
    lines = []
    for entry in result["rows"]:
        m = entry["metrics"]
        if "offered_per_step" not in m or m["offered_per_step"]["mean"] is None:
            continue
        off, srv = m["offered_per_step"]["mean"], m["served_per_step"]["mean"]
        waiting, queued = m["waiting_at_end"]["mean"], m["waiting_at_span_end"]["mean"]
        ratio = off / srv if srv else float("inf")
        load = (m.get("offered_over_capacity") or {}).get("mean")
        if load is not None:  # a timed server's measured capacity (driver/capacity.py): the load is against it
            warn = f"  offered {load:.2f}x the server's measured capacity" + (
                "  OVERLOAD: queues grow as long as requests arrive" if load > OVERLOAD else "")
        else:
            warn = (f"  OVERLOAD: {ratio:.2f}x what was served was offered; queues grow as long as requests "
                    "arrive, so drift and shares describe a backlog, not a steady state") if overloaded(ratio, queued) else ""
        lines.append(f"  {entry['label']}: offered {_fmt(off)} vs served {_fmt(srv)} weighted tokens/step over the "
                     f"arrival span ({_fmt(queued)} requests queued when the last arrived), {_fmt(waiting)} requests "
                     f"waiting at the end{warn}")
    return ("load:\n" + "\n".join(lines)) if lines else ""


def format_clients(result: dict, client_names: Sequence[str] | None = None) -> str:
    """Per row, a per-client table: share of service and of demand, admitted/arrived,
    waiting time p50/p90/p99 (steps)."""
    out = []
    for entry in result["rows"]:
        c = entry.get("clients")
        if not c or not c.get("served_share"):
            continue
        k = len(c["served_share"])
        names = client_names or [str(i) for i in range(k)]
        header = ["client", "share of service", "share of demand", "admitted/arrived", "wait p50", "wait p90",
                  "wait p99"]
        lines = [[names[i]] + [_fmt(c[key][i]) for key in ("served_share", "offered_share", "admitted_over_arrived",
                                                           "wait_p50", "wait_p90", "wait_p99")] for i in range(k)]
        out.append(f"{entry['label']}:\n" + _render(header, lines))
    return "\n".join(out)


def output_names(sweep: Sweep, plots: bool = True) -> list[str]:
    """The files `write_outputs` may write in the output directory (for the pre-run check)."""
    names = ["results.json", "results.csv"] + ["series.json"] * (sweep.series is not None)
    return names + ([p.filename for p in sweep.plots] if plots else [])


def write_outputs(sweep: Sweep, result: dict, out_dir: Path, plots: bool = True,
                  extra: Sequence[tuple[Path, Callable]] = ()) -> list[Path]:
    """results.json, results.csv (one row per setting and metric), series.json (time
    series, when the sweep has some), the PNG plots and the caller's `extra` (path,
    writer) pairs, written as one set (temporary files renamed only when all were
    written: a failed plot leaves no results.json behind)."""
    out_dir = Path(out_dir)
    main_keys = {k: v for k, v in result.items() if k not in ("series", "overlays")}
    files = [(out_dir / "results.json", lambda p: p.write_text(json.dumps(main_keys, indent=1, default=_json_default))),
             (out_dir / "results.csv", lambda p: p.write_text(results_csv(result)))]
    if "series" in result:
        files.append((out_dir / "series.json",
                      lambda p: p.write_text(json.dumps(result["series"], default=_json_default))))
    if plots:
        for plot in sweep.plots:
            files.append((out_dir / plot.filename, lambda p, plot=plot: draw(result, plot, p)))
    return fileio.write_outputs_atomically(files + list(extra))


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Fraction):
        return str(x)
    if hasattr(x, "as_json"):  # a setting that stands for a table (a trace's content): its summary
        return x.as_json()
    raise TypeError(f"cannot write {type(x).__name__} as JSON")


def results_csv(result: dict) -> str:
    keys = sorted({k for entry in result["rows"] for k in entry["setting"]})
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(keys + ["metric", "mean", "std", "ci95_lo", "ci95_hi", "min", "max", "n"])
    for entry in result["rows"]:
        for name, m in entry["metrics"].items():
            if not isinstance(m, dict) or "mean" not in m:
                continue
            cells = [entry["setting"].get(k) for k in keys]
            writer.writerow([json.dumps(v, default=_json_default) if isinstance(v, (dict, list)) else v for v in cells] +
                            [name, m["mean"], m["std"], m["ci95"][0], m["ci95"][1], m["min"], m["max"], m["n"]])
    return buf.getvalue()


def draw(result: dict, plot: Plot, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    match = [all(r["setting"].get(k) == v for k, v in plot.where) for r in result["rows"]]
    if plot.kind == "clients":
        _draw_client_panels(plt, [r for r, ok in zip(result["rows"], match) if ok], plot, path)
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    series_rows = [s for s, ok in zip(result.get("series", {}).get("rows", []), match) if ok]
    rows = [r for r, ok in zip(result["rows"], match)
            if ok and (plot.kind in ("series", "scatter", "client_cdf") or plot.y in r["metrics"])]
    if plot.kind == "metric":
        xs = [r["setting"].get(plot.x, r["label"]) for r in rows]
        mean = np.asarray([r["metrics"][plot.y]["mean"] if r["metrics"][plot.y]["mean"] is not None else np.nan
                           for r in rows], float)
        lo = np.asarray([r["metrics"][plot.y]["ci95"][0] or np.nan for r in rows], float)
        hi = np.asarray([r["metrics"][plot.y]["ci95"][1] or np.nan for r in rows], float)
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
        if numeric:
            order = np.argsort(xs)
            xs_sorted = np.asarray(xs, float)[order]
            ax.plot(xs_sorted, mean[order], "o-", label=f"{plot.y} (mean)")
            ax.fill_between(xs_sorted, lo[order], hi[order], alpha=0.3, label="95% CI")
            if plot.extra:
                ax.plot(xs_sorted, np.asarray([r["metrics"][plot.extra]["mean"] for r in rows], float)[order], "k--",
                        label=plot.extra)
        else:  # categories: points with CI bars, never joined
            pos = np.arange(len(xs))
            ax.errorbar(pos, mean, yerr=[mean - lo, hi - mean], fmt="o", capsize=4, label=f"{plot.y} (mean, 95% CI)")
            ax.set_xticks(pos, [str(x) for x in xs], rotation=30, ha="right")
            if plot.extra:
                ax.plot(pos, [r["metrics"][plot.extra]["mean"] for r in rows], "k_", markersize=20, label=plot.extra)
        for overlay in result.get("overlays", []):
            if overlay["plot"] == plot.filename:
                ax.plot(overlay["x"], overlay["y"], "r.-", alpha=0.7, label=overlay["label"])
        positive = mean[np.isfinite(mean) & (mean > 0)]
        ylog = plot.ylog if plot.ylog is not None else (not numeric and len(positive) > 1
                                                       and positive.max() > 10 * positive.min())
        if ylog:
            ax.set_yscale("log")
        ax.set_xlabel(plot.x)
        ax.legend(fontsize=8)
    elif plot.kind == "scatter":
        labelled = []
        for r in rows:
            mx, my = r["metrics"].get(plot.x), r["metrics"].get(plot.y)
            if not mx or not my or mx["mean"] is None or my["mean"] is None:
                continue
            ax.errorbar(mx["mean"], my["mean"], xerr=[[mx["mean"] - mx["ci95"][0]], [mx["ci95"][1] - mx["mean"]]],
                        yerr=[[my["mean"] - my["ci95"][0]], [my["ci95"][1] - my["mean"]]], fmt="o", capsize=3)
            labelled.append(((mx["mean"], my["mean"]), r["label"]))
        if plot.xlog:
            ax.set_xscale("log")
        if plot.ylog:
            ax.set_yscale("log")
        ax.set_xlabel(plot.x)
    elif plot.kind == "series":
        steps = result["series"]["steps"]
        for r, s in zip(rows, series_rows):
            band = s.get(plot.y)
            if not band:
                continue
            mean, lo, hi = (np.asarray(band[k]) for k in ("mean", "lo", "hi"))
            if mean.ndim == 2:  # one line per client
                for c in range(mean.shape[1]):
                    ax.plot(steps, mean[:, c], label=f"{r['label']} client {c}")
            else:
                ax.plot(steps, mean, label=r["label"])
                ax.fill_between(steps, lo, hi, alpha=0.2)
        ax.set_xlabel("step")
        ax.legend(fontsize=7, ncol=2)
    elif plot.kind == "client_cdf":
        for r in rows:
            v = np.asarray([x for x in r.get("clients", {}).get(plot.x, []) if x is not None], float)
            if len(v):
                ax.step(np.sort(v), np.arange(1, len(v) + 1) / len(v), where="post", label=r["label"])
        if plot.xlog:
            ax.set_xscale("symlog")
        ax.set_xlabel(plot.x)
        ax.legend(fontsize=7, ncol=2)
    else:
        raise ValueError(f"unknown plot kind {plot.kind!r}")
    if plot.xlog and plot.kind == "metric":
        ax.set_xscale("symlog" if any(r["setting"].get(plot.x) == 0 for r in rows) else "log", base=2)
    ax.set_ylabel(plot.ylabel or plot.y)
    ax.set_title(plot.title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if plot.kind == "scatter":  # once the layout is final: the boxes are measured where they are drawn
        place_labels(ax, [p for p, _ in labelled], [t for _, t in labelled])
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


def _label_offsets() -> list[tuple[float, float]]:
    """Offsets (points) to try for a label, nearest first: 8 directions on growing rings."""
    ring = [(1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)]
    return [(r * dx, r * dy) for r in (6, 14, 24, 36, 50, 66, 84) for dx, dy in ring]


def place_labels(ax, points: Sequence[tuple[float, float]], labels: Sequence[str], fontsize: float = 7) -> list:
    """Annotate each point (data coordinates) with its label at the nearest offset where
    the label's box overlaps no label placed before it, stays inside the axes and covers
    no other point's marker; if none is free, where it overlaps fewest labels (then stays
    inside, then covers fewest markers). A thin leader line joins
    a label moved away. Returns the annotations. Call it once the axes' limits, scales and
    layout are final (the boxes are measured in display space)."""
    from matplotlib.text import Text

    renderer = ax.figure.canvas.get_renderer()
    markers = [ax.transData.transform(p) for p in points]
    inside = ax.get_window_extent(renderer)
    placed, out = [], []
    for i, (point, text) in enumerate(zip(points, labels)):
        best = None
        for dx, dy in _label_offsets():
            ann = ax.annotate(text, point, textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                              ha="left" if dx > 0 else "right" if dx < 0 else "center",
                              va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                              arrowprops=None if max(abs(dx), abs(dy)) <= 6 else
                              {"arrowstyle": "-", "linewidth": 0.5, "color": "0.5"})
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer).expanded(1.05, 1.1)  # the text, not its leader line
            score = (sum(box.overlaps(b) for b in placed), not inside.contains(box.x0, box.y0)
                     or not inside.contains(box.x1, box.y1),
                     sum(j != i and box.contains(*m) for j, m in enumerate(markers)))
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, ann, box)
            else:
                ann.remove()
            if not any(score):
                break
        placed.append(best[2])
        out.append(best[1])
    return out


MAX_FIGURE_PIXELS = 4000  # the widest and tallest PNG any plot is
MAX_TENANT_BARS = 60  # tenants drawn one by one in a tenants plot (0.5 in each); the rest summed


def capped_figsize(width: float, height: float, dpi: float) -> tuple[float, float]:
    """(width, height) in inches, each cut to MAX_FIGURE_PIXELS at `dpi`."""
    limit = MAX_FIGURE_PIXELS / dpi
    return min(width, limit), min(height, limit)


def top_tenants(demand: Sequence, limit: int = MAX_TENANT_BARS) -> list[int]:
    """Indices of the `limit` tenants of largest share of demand (None as 0), in tenant order."""
    order = sorted(range(len(demand)), key=lambda k: -(demand[k] or 0))
    return sorted(order[:limit])


def draw_tenants(result: dict, names: Sequence[str], path) -> None:
    """Per tenant and policy: share of service beside share of demand, and wait p99 (symlog
    axis: zero waits drawn too). Up to MAX_TENANT_BARS tenants each (those of most demand); beyond that the rest
    are one "others" group (their shares summed, their largest wait p99), as the title says,
    so the figure stays under MAX_FIGURE_PIXELS whatever the number of tenants."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # rows with per-tenant values (a row none of whose lanes finished has none to draw)
    rows = [r for r in result["rows"] if len((r.get("clients") or {}).get("offered_share") or ()) == len(names)]
    demand = rows[0]["clients"]["offered_share"] if rows else [0] * len(names)
    shown = top_tenants(demand) if len(names) > MAX_TENANT_BARS else list(range(len(names)))
    rest = sorted(set(range(len(names))) - set(shown))

    def grouped(values, combine):
        """The shown tenants' values, then the rest's combined (None when they have none)."""
        others = [values[k] for k in rest if values[k] is not None]
        return [values[k] for k in shown] + ([combine(others) if others else None] if rest else [])

    labels = [names[k] for k in shown] + ([f"others ({len(rest)})"] if rest else [])
    k = len(labels)
    dpi = 110
    fig, axes = plt.subplots(2, 1, figsize=capped_figsize(max(6.4, 0.5 * k + 2), 6.4, dpi), dpi=dpi, sharex=True)
    width = 0.8 / (len(rows) + 1)
    x = np.arange(k)
    axes[0].bar(x - 0.4 + width / 2, [d or 0 for d in grouped(demand, sum)], width, color="0.7",
                label="share of demand")
    for i, r in enumerate(rows):
        c = r["clients"]
        axes[0].bar(x - 0.4 + width * (i + 1.5), [v or 0 for v in grouped(c["served_share"], sum)], width,
                    label=r["label"])
        axes[1].plot(x, [np.nan if v is None else v for v in grouped(c["wait_p99"], max)], "o-", label=r["label"])
    axes[0].set_ylabel("share")
    axes[0].legend(fontsize=7)
    axes[1].set_ylabel("wait p99 (steps)")
    # symlog: log above 1 step, linear through 0, so a wait of 0 (a light log) is drawn
    # instead of vanishing from a log axis
    axes[1].set_yscale("symlog", linthresh=1.0)
    axes[1].set_ylim(bottom=0)
    axes[1].set_xticks(x, labels, rotation=45, ha="right", fontsize=7)
    if rows:
        axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    title = "per tenant: share of service vs demand, and wait p99"
    if rest:
        title += (f"\nthe {len(shown)} of {len(names)} tenants with most demand; the other {len(rest)} as one "
                  "group (shares summed, wait p99 their largest)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


def _draw_client_panels(plt, rows: list, plot: Plot, path: Path) -> None:
    """`Plot` kind "clients": one log-log panel per row, a point per client."""
    n = max(1, len(rows))
    cols = min(4, n)
    grid = -(-n // cols)
    fig, axes = plt.subplots(grid, cols, figsize=capped_figsize(3.2 * cols, 3.0 * grid, 110), dpi=110,
                             squeeze=False, sharex=True, sharey=True)
    values = [(np.asarray([np.nan if v is None else v for v in r.get("clients", {}).get(plot.x, [])], float),
               np.asarray([np.nan if v is None else v for v in r.get("clients", {}).get(plot.y, [])], float))
              for r in rows]
    positive = np.concatenate([np.concatenate([x[x > 0], y[y > 0]]) for x, y in values] or [np.ones(1)])
    lo, hi = (positive.min(), positive.max()) if len(positive) else (1.0, 10.0)
    for ax, r, (x, y) in zip(axes.flat, rows, values):
        ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        ax.loglog(x[ok], y[ok], "o", markersize=3, alpha=0.7)
        ax.loglog([lo, hi], [lo, hi], "k--", linewidth=0.8)
        ax.set_title(r["label"], fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(plot.x, fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel(plot.ylabel or plot.y, fontsize=8)
    fig.suptitle(plot.title, fontsize=10)
    fig.tight_layout()
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)
