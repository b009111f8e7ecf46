"""What the collector's figures share: readable row names, colours, units, markers, point labels, saving.

* :func:`readable_names`: the papers' row names (``skeinformer_no_rownorm`` -> "Skeinformer w/o row
  normalization", ``softmax`` -> "Standard"), override tags kept, the key itself for rows no paper has.
* :func:`place_labels`: a label written next to each point of a scatter, placed where it overlaps the
  fewest other labels and markers (a few candidate positions around the point, nearest first).
* :func:`save`: PNG and PDF, each written atomically with fixed metadata (reruns are byte-identical).

Only matplotlib's object API is used (no pyplot state).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from lra.files import write_atomic
from lra.tools.display import GIB, mem_unit, paper_names, readable_names, split_key, task_name  # noqa: F401

PNG_META = {"Software": "lra.tools.collect (matplotlib)"}
PDF_META = {"Creator": "lra.tools.collect", "Producer": "matplotlib", "CreationDate": None, "ModDate": None}
MEASURED, ESTIMATED = "measured", "estimated"
SOFTMAX = "softmax"


def short(name: str, width: int = 34) -> str:
    """A point label: ``name`` with a long override tag cut to fit ``width`` (the legend gives it in full)."""
    if len(name) <= width or " [" not in name:
        return name
    head, tag = name.split(" [", 1)
    room = max(width - len(head) - 4, 8)
    return f"{head} [{tag[:room].rstrip(', ')}…]"


def shorts(names: dict, width: int = 34) -> dict:
    """{key: point label}: each name cut by :func:`short`, but whole where its cut would read like another's."""
    cut = {k: short(v, width) for k, v in names.items()}
    seen = Counter(cut.values())
    return {k: c if seen[c] == 1 else names[k] for k, c in cut.items()}


def label(key: str, width: int = 90) -> str:
    """A legend label: the full row name, wrapped at ``width`` characters (override tags can be long).

    Lines break after a comma or a space (between overrides), inside a word only if it is too long."""
    lines, line = [], ""
    for token in re.split(r"(?<=[, ])", key):
        while len(token) > width:  # one override longer than a line
            lines, line, token = lines + ([line] if line else []) + [token[:width]], "", token[width:]
        if line and len(line) + len(token) > width:
            lines.append(line)
            line = ""
        line += token
    return "\n".join(lines + [line] if line else lines) or key  # "".join(lines) gives the key back


def colours(keys) -> dict:
    """A fixed colour per row key (sorted order), so a backend keeps its colour across figures."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(keys) <= 10 else "tab20"]
    return {k: cmap(i % cmap.N) for i, k in enumerate(sorted(keys))}


def preset_rows(frame: pd.DataFrame, preset: str, trials: bool = False) -> set:
    """Every row key of ``preset`` in a runs frame (usable, kept runs) or a summary, so that :func:`colours`
    gives a row the same colour in every figure of the preset, whichever rows a figure shows."""
    from lra.tools.collect.rows import assign

    f = frame[frame["preset"] == preset]
    if "row" in f:
        return set(f["row"])
    return set(assign(f, trials=trials)[0]["row"])


def save(fig: Figure, stem: Path) -> list[Path]:
    """``stem``.png and ``stem``.pdf, each written atomically."""
    paths = []
    for ext, meta in (("png", PNG_META), ("pdf", PDF_META)):
        path = Path(f"{stem}.{ext}")
        write_atomic(path, lambda tmp, ext=ext, meta=meta: fig.savefig(tmp, format=ext, metadata=meta, dpi=120))
        paths.append(path)
    return paths


def time_unit(seconds: float) -> tuple[float, str]:
    """(divisor, name) so that the largest time reads in s, min or h."""
    return (3600.0, "h") if seconds > 2 * 3600 else (60.0, "min") if seconds > 120 else (1.0, "s")


def legend_below(fig: Figure, handles, labels, title: str):
    """A legend under the axes: full labels in as many columns as fit the figure's width."""
    longest = max((max(len(line) for line in lab.split("\n")) for lab in labels), default=1)
    ncol = max(1, min(len(labels), int(fig.get_figwidth() * 11 // max(longest + 4, 1))))
    fig.legend(
        handles, labels, loc="outside lower center", ncol=ncol, fontsize=8, title=title, title_fontsize=8, frameon=False
    )


def full_names_legend(fig: Figure, keys, names: dict, col: dict, width: int = 34):
    """Under the axes, the full names of the rows whose point label had to be cut (long override tags)."""
    points = shorts({k: names[k] for k in keys}, width)
    cut = [k for k in keys if points[k] != names[k]]
    if cut:
        legend_below(
            fig,
            [Line2D([], [], ls="", marker="o", ms=7, color=col[k]) for k in cut],
            [label(names[k]) for k in cut],
            "rows whose label is cut above, in full",
        )


def memory(frame: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Per summary row: (peak memory in bytes, its source). The measured mean where there is one,
    else the estimate's mean (``measured`` / ``estimated``); NaN and ``""`` where neither."""
    meas = frame["peak_mem_bytes_mean"].to_numpy(dtype=float)
    est = frame["peak_mem_estimate_bytes_mean"].to_numpy(dtype=float)
    value = np.where(np.isfinite(meas), meas, est)
    source = [MEASURED if math.isfinite(m) else ESTIMATED if math.isfinite(e) else "" for m, e in zip(meas, est)]
    return value, source


def scatter_by_source(ax, x, y, colours_, sources, sizes=None):
    """Filled markers for measured memory, hollow for estimated (or unknown) memory."""
    for src, filled in ((MEASURED, True), (ESTIMATED, False), ("", False)):
        idx = [i for i, s in enumerate(sources) if s == src]
        if not idx:
            continue
        c = [colours_[i] for i in idx]
        s = None if sizes is None else np.asarray(sizes)[idx]
        if filled:
            ax.scatter(x[idx], y[idx], s=s, c=c, edgecolors="0.2", linewidths=0.6, alpha=0.85, zorder=3)
        else:
            ax.scatter(x[idx], y[idx], s=s, facecolors="none", edgecolors=c, linewidths=1.8, zorder=3)


def source_handles(sources) -> list:
    """Legend entries that explain filled (measured) and hollow (estimated) markers, for those present."""
    out = []
    if MEASURED in sources:
        out.append(Line2D([], [], ls="", marker="o", ms=8, mfc="0.5", mec="0.2", label="filled: peak memory measured"))
    if ESTIMATED in sources:
        out.append(
            Line2D(
                [],
                [],
                ls="",
                marker="o",
                ms=8,
                mfc="none",
                mec="0.3",
                label="hollow: peak memory estimated\n(no measurement, e.g. a CPU run)",
            )
        )
    return out


# candidate label positions around a point: (dx, dy) direction, horizontal and vertical alignment
_SPOTS = (
    (1, 0, "left", "center"),
    (-1, 0, "right", "center"),
    (0, 1, "center", "bottom"),
    (0, -1, "center", "top"),
    (0.75, 0.75, "left", "bottom"),
    (-0.75, 0.75, "right", "bottom"),
    (0.75, -0.75, "left", "top"),
    (-0.75, -0.75, "right", "top"),
)


def _overlap(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _gap(box: Bbox, p, r: float) -> float:
    """Distance from the edge of a marker (centre p, radius r) to ``box``; 0 where they touch."""
    dx = max(box.x0 - p[0], 0.0, p[0] - box.x1)
    dy = max(box.y0 - p[1], 0.0, p[1] - box.y1)
    return max(math.hypot(dx, dy) - r, 0.0)


def place_labels(ax, x, y, texts, sizes=None, edge=None, fontsize: float = 8.0) -> list:
    """Write ``texts[i]`` next to the point (x[i], y[i]) of ``ax``; returns the annotations.

    ``sizes``: the points' marker areas (pt², as ``scatter``'s ``s``), so a label clears a big bubble;
    ``edge``: a colour per point for the label's frame, which ties it to its marker. The figure is laid
    out first; each label then takes, of eight spots around its point at three distances, the one that
    covers the fewest placed labels and markers, stays inside the axes and is nearer its own point than
    any other (a leader line joins a label set off from its point). Deterministic."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ax.figure
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72.0
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    sizes = np.full(len(x), 36.0) if sizes is None else np.asarray(sizes, dtype=float)
    radii = px * np.sqrt(sizes) / 2
    pts = ax.transData.transform(np.column_stack([x, y])) if len(x) else np.zeros((0, 2))
    frame = ax.get_window_extent(renderer)
    markers = [Bbox.from_extents(p[0] - r, p[1] - r, p[0] + r, p[1] + r) for p, r in zip(pts, radii)]
    placed, out = [], []
    for i in sorted(range(len(x)), key=lambda i: (-pts[i][1], pts[i][0], texts[i])):
        probe = ax.text(0, 0, texts[i], fontsize=fontsize)
        ext = probe.get_window_extent(renderer)
        probe.remove()
        w, h = ext.width + 2 * px, ext.height + 2 * px  # with the frame's padding
        best = None
        for level, gap in enumerate((3.0, 12.0, 24.0)):
            for dx, dy, ha, va in _SPOTS:
                ox, oy = dx * (radii[i] + gap * px), dy * (radii[i] + gap * px)
                ax0 = pts[i][0] + ox - {"left": 0, "center": w / 2, "right": w}[ha]
                ay0 = pts[i][1] + oy - {"bottom": 0, "center": h / 2, "top": h}[va]
                box = Bbox.from_bounds(ax0, ay0, w, h)
                own = _gap(box, pts[i], radii[i])
                closer = sum(_gap(box, pts[j], radii[j]) < own for j in range(len(x)) if j != i)
                cost = (
                    3 * sum(_overlap(box, b) for b in placed)
                    + sum(_overlap(box, m) for j, m in enumerate(markers) if j != i)
                    + 4 * (w * h - _overlap(box, frame))
                    + (0.5 * closer + 0.05 * level) * w * h
                )
                if best is None or cost < best[0] - 1e-6:
                    best = (cost, box, ox, oy, ha, va, level)
        _, box, ox, oy, ha, va, level = best
        placed.append(box)
        arrow = (
            {"arrowstyle": "-", "color": "0.3", "lw": 0.8, "shrinkA": 0, "shrinkB": radii[i] / px} if level else None
        )
        ec = "none" if edge is None else edge[i]
        ann = ax.annotate(
            texts[i],
            (x[i], y[i]),
            xytext=(ox / px, oy / px),
            textcoords="offset points",
            ha=ha,
            va=va,
            fontsize=fontsize,
            color="0.1",
            arrowprops=arrow,
            zorder=5,
            bbox={"boxstyle": "round,pad=0.15", "fc": (1, 1, 1, 0.75), "ec": ec, "lw": 1.0},
        )
        ann.set_in_layout(False)  # placed for this layout: keep it
        out.append(ann)
    return out
