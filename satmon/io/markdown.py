"""A markdown report of a replay: a table and PNG plots saved beside it.

Plots (matplotlib, imported only here and only when a report is asked for):

* ``<stem>_saturation.png``: pooled DyT saturation vs step, per-layer curves, the GO threshold line;
* ``<stem>_sigma_min.png``: ``sigma_min(X_l) / sigma_min(X_0)`` by depth, one line per checkpoint;
* ``<stem>_alignment.png``: ``|cos(v*, u_min)|`` (and the null-space projection) of every
  LayerNorm/RMSNorm layer vs step.

A plot with nothing to show (no DyT layer, no LayerNorm...) is left out and the report says why.
Every file is replaced only by a complete one (:mod:`satmon.io.atomic`); :func:`check_report` finds
what would block any of them before any work. :func:`table` also renders the console summaries of
``satmon replay`` and ``satmon report``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from satmon.io.atomic import atomic_open, atomic_write, check_output

__all__ = ["PLOTS", "check_report", "fmt", "report_paths", "require_matplotlib", "table", "write_report"]

MATPLOTLIB_MISSING = (
    "the markdown report's plots need matplotlib: pip install matplotlib (or pip install -e "
    "'.[report]' in satmon's clone)"
)
#: The plots a report may hold, by the suffix of their file name (``<stem>_<plot>.png``).
PLOTS = ("saturation", "sigma_min", "alignment")


def report_paths(path: str | Path) -> list[Path]:
    """Every file :func:`write_report` may write for the report ``path``: the markdown first, then its plots.

    Example:
        >>> [p.name for p in report_paths("out/replay.md")]
        ['replay.md', 'replay_saturation.png', 'replay_sigma_min.png', 'replay_alignment.png']
    """
    path = Path(path)
    stem = path.with_suffix("")
    return [path] + [Path(f"{stem}_{plot}.png") for plot in PLOTS]


def check_report(path: str | Path | None, what: str = "--report") -> list[Path]:
    """Check, before any work, that the report and each of its plots can be written; returns the files.

    Raises:
        satmon.io.atomic.OutputError: the report does not end in ``.md``, or it or a plot's path is
            blocked (a folder, a read-only file...), with the path and what to do.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> (d / "r_saturation.png").mkdir()
        >>> check_report(d / "r.md")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        satmon.io.atomic.OutputError: Expected --report's saturation plot to name a file ending
        in .png, got ... (a folder): ...
    """
    if path is None:
        return []
    check_output(path, what, (".md",))
    files = report_paths(path)
    for plot, png in zip(PLOTS, files[1:]):
        check_output(png, f"{what}'s {plot} plot", (".png",))
    return files


def fmt(value: Any, digits: int = 4) -> str:
    """A table cell: floats with ``digits`` decimals, ``None`` as ``-``.

    Example:
        >>> fmt(0.123456), fmt(None), fmt(12), fmt(float("nan"))
        ('0.1235', '-', '12', 'nan')
    """
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A pipe table, padded so it also reads well on a console.

    Example:
        >>> print(table(["step", "saturation"], [[10, 0.5], [20, None]]))
        | step | saturation |
        |------|------------|
        | 10   | 0.5000     |
        | 20   | -          |
    """
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells])


def require_matplotlib() -> None:
    """Raise ``ImportError`` with the install hint when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(MATPLOTLIB_MISSING) from e


def _figure(width: float = 8.5, height: float = 4.2):
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and depths are integers
    return fig, ax


def _save(fig, out: Path) -> None:
    """``fig`` as a PNG at ``out``, replacing it only once complete."""
    with atomic_open(out, "wb") as f:
        fig.savefig(f, format="png")


def _plot_saturation(records: Sequence[Mapping[str, Any]], threshold: float, out: Path) -> Path | None:
    points = [(r["global_step"], r["_pooled"], r.get("layers") or {}) for r in records if r.get("_pooled") is not None]
    if not points:
        return None
    fig, ax = _figure()
    steps = [p[0] for p in points]
    names = [n for n, v in points[-1][2].items() if isinstance(v, Mapping) and v.get("saturation") is not None]
    for name in names:
        ys = [p[2].get(name, {}).get("saturation") for p in points]
        ax.plot(steps, [math.nan if y is None else y for y in ys], ".--", lw=1, alpha=0.8, label=name)
    ax.plot(steps, [p[1] for p in points], "o-", color="black", lw=2.2, label="pooled")
    ax.axhspan(threshold, 1.0, color="tab:green", alpha=0.07)
    ax.axhspan(0.0, threshold, color="tab:red", alpha=0.05)
    ax.axhline(threshold, ls="--", color="tab:red", lw=1.5, label=f"GO threshold {threshold:g}")
    ax.set(
        xlabel="global step",
        ylabel="saturation  (fraction |alpha x| > level)",
        ylim=(-0.02, 1.02),
        title="DyT saturation per checkpoint (GO above the line)",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, out)
    return out


def _plot_sigma_min(records: Sequence[Mapping[str, Any]], out: Path) -> Path | None:
    series = []
    for r in records:
        sm = r.get("sigma_min") or {}
        ratios = sm.get("ratios")
        if ratios:
            series.append(
                (r["global_step"], [math.nan if v is None else v for v in ratios], list(sm.get("blocks") or []))
            )
    if not series:
        return None
    from matplotlib import cm, colormaps, colors

    fig, ax = _figure()
    steps = [s[0] for s in series]
    norm = colors.Normalize(min(steps), max(steps) if max(steps) > min(steps) else min(steps) + 1)
    cmap = colormaps["viridis"]
    for step, ratios, _ in series:
        ax.plot(range(len(ratios)), ratios, "o-", color=cmap(norm(step)), lw=1.4, ms=3)
    labels = series[-1][2]
    n = len(series[-1][1])
    if len(labels) == n:
        ax.set_xticks(range(n), labels, rotation=30, ha="right", fontsize=7)
    elif len(labels) == n - 1:
        ax.set_xticks(range(n), ["embedding"] + labels, rotation=30, ha="right", fontsize=7)
    ax.axhline(1.0, ls="--", color="tab:red", lw=1.2, label="ratio 1 (no shrinking)")
    finite = [v for _, rs, _ in series for v in rs if math.isfinite(v) and v > 0]
    if finite and max(finite) / min(finite) > 50:
        ax.set_yscale("log")
    ax.set(xlabel="depth", ylabel="sigma_min(X_l) / sigma_min(X_0)", title="Residual-stream sigma_min ratio by depth")
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="global step")
    ax.legend(fontsize=7, loc="best")
    _save(fig, out)
    return out


def _plot_alignment(records: Sequence[Mapping[str, Any]], out: Path) -> Path | None:
    rows = [(r["global_step"], r.get("layers") or {}) for r in records]
    names = list(
        dict.fromkeys(
            n
            for _, layers in rows
            for n, v in layers.items()
            if isinstance(v, Mapping) and v.get("alignment") is not None
        )
    )
    if not names:
        return None
    fig, ax = _figure()
    steps = [s for s, _ in rows]
    for i, name in enumerate(names):
        color = f"C{i % 10}"
        cos = [(layers.get(name) or {}).get("alignment") for _, layers in rows]
        proj = [(layers.get(name) or {}).get("null_projection") for _, layers in rows]
        ax.plot(
            steps, [math.nan if v is None else v for v in cos], "o-", color=color, lw=1.4, ms=3, label=f"{name} |cos|"
        )
        if any(v is not None for v in proj):
            ax.plot(steps, [math.nan if v is None else v for v in proj], ":", color=color, lw=1.2)
    ax.set(
        xlabel="global step",
        ylabel="|cos(v*, u_min)|  (dotted: null-space projection)",
        ylim=(-0.02, 1.05),
        title="gamma^-1 alignment per norm layer",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, out)
    return out


def write_report(
    path: str | Path,
    records: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    *,
    threshold: float,
    intro: Sequence[str] = (),
    last_card: str | None = None,
) -> list[Path]:
    """Write the markdown report and its PNGs; returns the files written (report first).

    Each file is replaced only by a complete one (an interrupt leaves the previous report and plots as
    they were); check the paths first with :func:`check_report`.

    Args:
        path: the ``.md`` file; plots go beside it as ``<stem>_<plot>.png``.
        records: replay records (successful ones carry ``layers``, ``sigma_min``, ``global_step``).
        rows: one summary row per record (``satmon.replaying.loop.summary_row``), same order.
        threshold: the GO threshold drawn on the saturation plot.
        intro: lines written under the title (what was replayed, how).
        last_card: the last checkpoint's verdict card (markdown), appended at the end.
    """
    require_matplotlib()
    path, saturation_png, sigma_png, alignment_png = report_paths(path)
    good = [dict(r, _pooled=row["saturation"]) for r, row in zip(records, rows) if "error" not in r]
    plots = [  # the plots first, the markdown that links them last
        (
            "Saturation vs step",
            _plot_saturation(good, threshold, saturation_png),
            "no DyT layer: saturation does not apply",
        ),
        ("sigma_min ratio by depth", _plot_sigma_min(good, sigma_png), "no residual-stream profile (no blocks found)"),
        (
            "Alignment vs step",
            _plot_alignment(good, alignment_png),
            "no LayerNorm/RMSNorm layer: the gamma^-1 alignment does not apply (DyT has no mean subtraction)",
        ),
    ]
    headers = ["step", "checkpoint", "saturation", "verdict", "margin", "norm type", "min sigma ratio", "min alignment"]
    body = [
        [
            r["step"],
            r["name"],
            r["saturation"],
            r["decision"],
            None if r["margin"] is None else f"{r['margin']:+.4f}",
            r["norm_type"],
            r["min_ratio"],
            r["min_alignment"],
        ]
        for r in rows
        if r["error"] is None
    ]
    lines = ["# satmon replay report", "", *intro, ""]
    if body:
        lines += [table(headers, body), ""]
    for title, png, why_not in plots:
        lines += [f"## {title}", ""]
        lines += [f"![{title}]({png.name})" if png is not None else f"_Not plotted: {why_not}._", ""]
    failed = [[r["name"], r["error"]] for r in rows if r["error"] is not None]
    if failed:
        lines += ["## Skipped checkpoints", "", table(["checkpoint", "error"], failed), ""]
    if last_card:
        lines += ["## Verdict at the last checkpoint", "", last_card, ""]
    atomic_write(path, "\n".join(lines))
    return [path] + [png for _, png, _ in plots if png is not None]
