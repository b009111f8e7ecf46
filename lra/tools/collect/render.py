"""Tables to CSV, Markdown and LaTeX (booktabs), and atomic file writes.

Two styles (``Built.style``, lra/tools/collect/tables.py STYLES):

* ``paper`` (the default of a paper's own preset): the cell as the paper prints it, the mean, with the best
  of each column in bold (:func:`best_rows`) and the chance mark; the legend says over how many seeds, and
  that the page and the CSV hold the rest.
* ``full``: ``mean ± std (n) [low, high]`` and marks: mean and sample std over seeds, n the seeds with a
  value, the 95% t-interval of the mean with MIN_SEEDS seeds or more (cut to what the quantity allows).
  One seed prints ``mean (1)``, two ``mean ± std (2)``: the legend says once why there is no interval.

Settings (batch, accumulation) print their value, ``a/b`` when seeds disagree; ``--`` marks a missing
cell. Bold (:func:`best_rows`): the best mean of a column (highest accuracy; lowest steps, time, memory),
only where every cell of the column has as many seeds and Welch's interval separates the best from each,
never a cell at the majority-class rate; a setting's best value (largest batch, fewest accumulation
steps) where the column's values differ. With a comparison, each column gains the paper's value and our
delta (ours minus paper). Marks
(:func:`marks`, :func:`legend`): ``≈`` after a delta, the seeds cannot separate ours from the paper; ``†``
after ours, they cannot separate the row from its baseline (Standard under the same settings); ``?``, not
testable against it; ``‡``, a timing with a run on a shared or busy machine; ``§``, an accuracy whose seeds
ended at the majority-class rate (the records say stuck). A row whose label shortened its overrides carries
a footnote with the full text; the overrides every row shares are one note. A LaTeX table wider than an
article page is scaled to its width (:func:`tabular_width`). The results page and the CSV always carry the
full statistics. Nothing time-dependent is printed, so the same runs give byte-identical files.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pandas as pd

from lra.tools.collect.escape import csv_cell, md, md_inline, tex, tex_comment
from lra.tools.collect.stats import CANNOT_SEPARATE, MIN_SEEDS, NOT_TESTABLE, SEPARATED, verdict, welch_interval
from lra.tools.collect.tables import BASELINE, METRICS, PAPERS, Built, Cell

MISSING = "--"
PAPER_MARK = "≈"  # after a delta: the seeds cannot separate ours from the paper's value
BASELINE_MARK = "†"  # after ours: the seeds cannot separate this row from its baseline (Welch, 95%)
UNTESTED_MARK = "?"  # after ours: not testable against the baseline (too few seeds there)
LOADED_MARK = "‡"  # after a timing: a run of it was timed on a shared or busy machine
CHANCE_MARK = "§"  # after an accuracy: its seeds ended at the majority-class rate (the records say stuck)
TEXT_WIDTH_PT = 345.0  # \textwidth of LaTeX's article class at 10 pt, on A4 or letter paper


NAME_MAX = 96  # a file-name component stays far below the file systems' 255 bytes (with a prefix and suffix)


def safe_name(name: str) -> str:
    """A preset or task name as one folder/file-name component (no separators, no leading dot); a name
    longer than ``NAME_MAX`` is cut and given a digest of the whole, so two long names stay apart."""
    out = re.sub(r"[^A-Za-z0-9_.=+,-]", "_", str(name)).lstrip(".") or "_"
    if len(out) > NAME_MAX:
        digest = hashlib.sha1(str(name).encode("utf-8", "surrogatepass")).hexdigest()[:10]
        out = f"{out[: NAME_MAX - 11]}-{digest}"
    return out


def num(x, decimals: int = 6) -> str:
    """A number for CSV: empty when missing, else rounded (so float noise never changes a file)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return str(x)
    r = round(float(x), decimals)
    return str(int(r)) if r == int(r) and abs(r) < 1e15 else repr(r)


def csv_text(df: pd.DataFrame) -> str:
    """A frame as CSV, every text cell (and column name) through :func:`escape.csv_cell`: no formulas."""
    out = df.copy()
    for c in out.columns:
        if not pd.api.types.is_numeric_dtype(out[c]):
            out[c] = [csv_cell(v) for v in out[c]]
    out.columns = [csv_cell(str(c)) for c in out.columns]
    return out.to_csv(index=False, lineterminator="\n")


def frame_csv(df: pd.DataFrame) -> str:
    out = df.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = [num(v) for v in out[c]]
    return csv_text(out)


# ----------------------------------------------------------------------------- cells
def _fmt(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def ours_text(cell: Cell, metric: str, pm: str = "±", style: str = "full") -> str:
    m = METRICS[metric]
    if cell.empty:
        return MISSING
    if cell.average or style == "paper" and not m.setting:
        return _fmt(cell.mean, m.decimals)
    if m.setting:
        return "/".join(_fmt(v, m.decimals) for v in cell.values) if cell.values else _fmt(cell.mean, m.decimals)
    if cell.n > 1 and math.isfinite(cell.std):
        return f"{_fmt(cell.mean, m.decimals)} {pm} {_fmt(cell.std, m.decimals)} ({cell.n})"
    return f"{_fmt(cell.mean, m.decimals)} ({cell.n})"


def _signed(x: float, decimals: int, minus: str = "-") -> str:
    return ("+" if x >= 0 else minus) + _fmt(abs(x), decimals)


def delta_text(cell: Cell, metric: str, minus: str = "-") -> str:
    d = cell.delta
    if not math.isfinite(d):
        return MISSING
    return _signed(d, METRICS[metric].decimals, minus)


def interval_text(cell: Cell, metric: str, minus: str = "-") -> str:
    """``[low, high]``: the 95% t-interval of our mean over seeds; "" without one (too few seeds, seeds that
    differ by task, seeds that agree exactly, a setting, an empty cell: the legend says so once)."""
    m = METRICS[metric]
    if cell.empty or m.setting or cell.std == 0 or not cell.has_ci:
        return ""
    lo, hi = (_fmt(x, m.decimals) for x in (cell.ci_low, cell.ci_high))
    return f"[{lo.replace('-', minus)}, {hi.replace('-', minus)}]"


def delta_interval_text(cell: Cell, metric: str, minus: str = "-") -> str:
    """``[low, high]`` of the delta (ours - paper): our interval shifted by the paper's value, which is one
    published number without spread; "" where there is no delta, no interval, or the metric is a setting."""
    m = METRICS[metric]
    if not math.isfinite(cell.delta) or m.setting or cell.std == 0 or not cell.has_ci:
        return ""
    return f"[{_signed(cell.delta_low, m.decimals, minus)}, {_signed(cell.delta_high, m.decimals, minus)}]"


def marks(
    cell: Cell, baseline: str = "Standard", *, paper: bool = True, standard: bool = True
) -> list[tuple[str, str]]:
    """The marks of a cell as (symbol, meaning), the paper's first. ``baseline``: the printed name of the
    row's baseline. Markdown and LaTeX print the paper's mark after the delta (``standard=False``) and the
    other marks after our value (``paper=False``). A cell without an interval of its own gets no test mark."""
    out = []
    if paper and cell.paper_test == CANNOT_SEPARATE:
        why = "the seeds cannot separate ours from the paper: the paper's value lies in our 95% interval"
        out.append((PAPER_MARK, why))
    if standard and cell.base_test == CANNOT_SEPARATE and cell.base_low < cell.base_high:  # no spread: no question
        why = "Welch's 95% interval of the difference of means contains 0"
        out.append((BASELINE_MARK, f"the seeds cannot separate this row from {baseline}: {why}"))
    elif standard and cell.base_test == NOT_TESTABLE and cell.has_ci:
        out.append((UNTESTED_MARK, f"not testable against {baseline}: it has fewer than {MIN_SEEDS} seeds here"))
    if standard and cell.loaded:
        why = "timed with a run on a shared or busy machine (the record's machine field): compare with care"
        out.append((LOADED_MARK, why))
    if standard and cell.stuck:
        some = "its" if cell.stuck >= cell.n else f"{cell.stuck} of its {cell.n}"
        out.append((CHANCE_MARK, f"{some} seeds ended at the majority-class rate (their records say stuck)"))
    return out


def baseline_name(built: Built, row=None) -> str:
    """The printed name of ``row``'s baseline (Standard under the same settings), or of the table's plain
    Standard row."""
    if row is not None and row.base_name:
        return row.base_name
    return next((n for a, n in built.spec.rows if a == BASELINE), "Standard")


def legend(built: Built) -> list[str]:
    """The lines printed under a table that explain its cells and marks (none for settings-only tables)."""
    if all(METRICS[c.metric].setting for c in built.columns):
        return []
    base = baseline_name(built)
    rule = [
        f"Bold: the best mean of a column, only where every cell of the column has the same number of seeds "
        f"({MIN_SEEDS} or more; times from one device) and Welch's 95% interval separates the best from each "
        f"other cell; never a cell marked {CHANCE_MARK}."
    ]
    if any(c.stuck for r in built.rows for c in r.cells):
        rule.append(
            f"{CHANCE_MARK} after our value: its seeds ended at the majority-class rate (their records say stuck): "
            f"the model did not learn the task."
        )
    if any(c.loaded for r in built.rows for c in r.cells):
        rule.append(f"{LOADED_MARK} after a time or memory: a run of it was timed on a shared or busy machine.")
    if built.style == "paper":
        return [
            _seeds_line(built) + " The results page (index.html) and the CSV carry the std, the number of "
            "seeds, the 95% intervals and the comparisons.",
            *rule,
        ]
    lines = [
        f"Cells: mean ± std over seeds (seeds with a value) [95% t-interval of the mean, mean ± t(0.975, "
        f"n-1) * std / sqrt(n), cut to what the quantity allows]. Intervals and tests need {MIN_SEEDS} seeds "
        f"or more: cells with fewer print mean ± std (n) or mean (1), and no mark. Seeds that agree exactly "
        f"(a std of zero) need none."
    ]
    if built.spec.average:
        lines.append(
            f"{built.spec.average}: an interval only when every task has the same seeds (the t-interval "
            f"of the per-seed averages)."
        )
    if built.compare:
        lines.append(
            f"Δ [low, high]: ours - paper, with our interval shifted by the paper's value (the paper "
            f"prints one value without its spread). {PAPER_MARK} after Δ: the seeds cannot separate ours "
            f"from the paper (its value lies in our interval)."
        )
    lines.append(
        f"{BASELINE_MARK} after our value: the seeds cannot separate this row from its baseline, {base} "
        f"run under the same settings and data (Welch's 95% interval of the difference of means contains "
        f"0); times only against a baseline timed on the same device. {UNTESTED_MARK}: not testable "
        f"against it (fewer than {MIN_SEEDS} seeds there). A difference with an interval and no mark is "
        f"separated at 95%; a mark means the seeds cannot tell the values apart, not that they are equal."
    )
    return lines + rule


def _seeds_line(built: Built) -> str:
    ns = sorted({c.n for r in built.rows for c in r.cells if not c.empty and not c.average})
    few = [r.name for r in built.rows if any(0 < c.n < max(ns) for c in r.cells if not c.average)] if ns else []
    s = f"Mean over {max(ns) if ns else 0} seed{'s' if ns and max(ns) > 1 else ''} per cell"
    return s + (f" ({', '.join(few)}: fewer)." if few else ".")


def best_rows(built: Built) -> list[set]:
    """For each column, the indices of our rows in bold. A setting (batch, accumulation; no noise): those holding
    the best printed value. A measurement: the row with the best mean, where every other cell of the column has
    as many seeds, Welch's 95% interval (MIN_SEEDS seeds or more) separates it from each, a time was taken on
    the same device, and its seeds did not end at the majority-class rate; else none."""
    best = []
    for j, col in enumerate(built.columns):
        m = METRICS[col.metric]
        cells = {i: row.cells[j] for i, row in enumerate(built.rows) if not row.cells[j].empty}
        pick = max if m.higher_better else min
        if m.setting:  # bold only where the column's values differ: one value crowns nothing
            vals = {i: round(c.mean, m.decimals) for i, c in cells.items()}
            differ = len(set(vals.values())) > 1
            best.append({i for i, v in vals.items() if differ and v == pick(vals.values())})
            continue
        top = pick(cells, key=lambda i: cells[i].mean, default=None)
        t = cells.get(top)
        ok = len(cells) > 1 and not t.stuck
        for i, c in cells.items() if ok else ():
            if i != top:
                diff = welch_interval(t.mean, t.std, t.n, c.mean, c.std, c.n, min_n=MIN_SEEDS)
                same = c.n == t.n and (not m.timing or c.devices == t.devices)
                ok = ok and same and verdict(diff[1], diff[2], 0.0) == SEPARATED
        best.append({top} if ok else set())
    return best


def leaves(built: Built) -> list[tuple]:
    """Header path of every printed column (compare adds ours/paper/Δ under each column)."""
    out = []
    for col in built.columns:
        if built.compare:
            out += [col.path + (p,) for p in ("ours", "paper", "Δ")]
        else:
            out.append(col.path)
    return out


@dataclass(frozen=True)
class CellText:
    """One cell's printed pieces, as Markdown, LaTeX and the results page all print them: ours (value, bold
    if best, interval, marks) and, with a comparison, the paper's value and Δ (interval, paper mark).
    Marks are (symbol, meaning) pairs (:func:`marks`)."""

    value: str
    best: bool
    ci: str
    marks: tuple = ()
    paper: str = ""
    delta: str = ""
    delta_ci: str = ""
    paper_marks: tuple = ()


def cell_texts(built: Built, minus: str = "-", style: str = "full") -> list[list[CellText]]:
    """The :class:`CellText` of every cell, row by row; ``style="paper"`` keeps the mean and bold only."""
    best = best_rows(built)
    full = style != "paper"
    rows = []
    for i, row in enumerate(built.rows):
        base = baseline_name(built, row)
        texts = []
        for j, (col, cell) in enumerate(zip(built.columns, row.cells)):
            value = ours_text(cell, col.metric, style=style)
            t = CellText(
                value,
                i in best[j] and value != MISSING,
                interval_text(cell, col.metric, minus) if full else "",
                tuple(x for x in marks(cell, base, paper=False) if full or x[0] in (CHANCE_MARK, LOADED_MARK)),
            )
            if built.compare:
                t = replace(
                    t,
                    paper=cell.paper_text or MISSING,
                    delta=delta_text(cell, col.metric, minus),
                    delta_ci=delta_interval_text(cell, col.metric, minus) if full else "",
                    paper_marks=tuple(marks(cell, base, standard=False)) if full else (),
                )
            texts.append(t)
        rows.append(texts)
    return rows


def join(*parts: str) -> str:
    """Pieces of a cell, one space apart, empty ones left out."""
    return " ".join(p for p in parts if p)


def _row_texts(
    built: Built, esc: Callable[[str], str], bold: Callable[[str], str], minus: str = "-"
) -> list[list[str]]:
    """Every printed cell in the table's style, already in the output format: ``esc`` escapes a piece of
    text, ``bold`` wraps an escaped one."""

    def symbols(ms) -> str:
        return esc("".join(m for m, _ in ms))

    out = []
    for row in cell_texts(built, minus, built.style):
        cells = []
        for t in row:
            value = bold(esc(t.value)) if t.best else esc(t.value)
            cells.append(join(value, esc(t.ci), symbols(t.marks)))
            if built.compare:
                cells += [esc(t.paper), join(esc(t.delta), esc(t.delta_ci), symbols(t.paper_marks))]
        out.append(cells)
    return out


def title(built: Built) -> str:
    """The paper's title and caption in the paper's own preset; elsewhere a caption that says what it is."""
    if built.own:
        return f"{built.spec.title}: {built.spec.caption}"
    return f"{built.spec.caption}, preset {built.preset} (laid out as {built.spec.title}; not its protocol)"


def footnotes(built: Built) -> dict:
    """{row key: (number, full override text)} of every row whose label shortened its overrides."""
    return {r.key: (i, r.settings) for i, r in enumerate((r for r in built.rows if r.settings), 1)}


def notes(built: Built) -> list[str]:
    """The lines under a table: what its cells are (protocol, task settings, data), what was not compared and
    why, the rows without a baseline, and the footnotes' full override texts."""
    lines = list(built.about)
    if built.shared:
        lines.append(
            f"Every row: {', '.join(f'{k}={v}' for k, v in built.shared)} (overrides of the preset's configuration, "
            f"as the run records' configs hold them)."
        )
    lines.append(
        f"{built.n_runs} finished run{'' if built.n_runs == 1 else 's'}. "
        "Settings (batch, accumulation) as their value, a/b when seeds differ; -- no run."
    )
    if built.compare:
        s = (
            f"Paper: {PAPERS[built.spec.paper]}, {built.spec.title}, beside the rows that ran its configuration; "
            f"Δ = ours - paper. Compare time and memory only on the paper's hardware."
        )
        if "+" in built.preset:
            s += (
                " These runs do not have the paper code's semantics (the preset's quirks=, docs/fidelity.md): a Δ "
                "mixes the protocol's differences with the harness's corrections."
            )
        lines.append(s)
    if built.refused:
        lines.append(built.refused)
    alone = [r.name for r in built.rows if r.base is None and r.info is not None and r.info.attn != BASELINE]
    if alone:
        lines.append(
            f"No Standard run under the same settings and data, so no comparison with Standard: " f"{', '.join(alone)}."
        )
    if any(not r.in_paper for r in built.rows):
        lines.append("Rows after the paper's: backends, overrides, names or data the paper did not run.")
    names = {r.key: r.name for r in built.rows}
    lines += [f"[{i}] {names[k]}: {text}" for k, (i, text) in footnotes(built).items()]
    return lines


def row_name(built: Built, row, esc: Callable[[str], str], sup: Callable[[str], str]) -> str:
    """The row's printed name, with its footnote's number where its label shortened the overrides."""
    n = footnotes(built).get(row.key)
    return esc(row.name) + (sup(str(n[0])) if n else "")


# ----------------------------------------------------------------------------- formats
def to_csv(built: Built) -> str:
    """Every cell's full statistics, whatever the style: mean, std, n, interval, the comparison with the
    row's baseline (named in ``baseline``) and with the paper."""
    recs = []
    for row in built.rows:
        info = row.info
        r = {
            "row": row.name,
            "attn": info.attn if info else row.key,
            "in_paper": int(row.in_paper),
            "seeds": row.seeds,
            "overrides": info.over if info else "",
            "name": info.name if info else "",
            "data": info.data if info else "",
            "baseline": row.base or "",
        }
        for col, cell in zip(built.columns, row.cells):
            cid = f"{col.task}:{col.metric}"
            r[cid] = num(cell.mean)
            if not cell.average:
                r[f"{cid}:std"] = num(cell.std)
            r[f"{cid}:n"] = cell.n
            measured = not METRICS[col.metric].setting
            if measured:
                r[f"{cid}:ci95_low"], r[f"{cid}:ci95_high"] = num(cell.ci_low), num(cell.ci_high)
                r[f"{cid}:vs_baseline"] = cell.base_test
                r[f"{cid}:vs_baseline_diff"] = num(cell.base_diff)
                r[f"{cid}:vs_baseline_ci95_low"] = num(cell.base_low)
                r[f"{cid}:vs_baseline_ci95_high"] = num(cell.base_high)
                if METRICS[col.metric].timing:
                    r[f"{cid}:loaded"] = int(cell.loaded)
            if built.compare:
                r[f"{cid}:paper"] = num(cell.paper)
                r[f"{cid}:delta"] = num(cell.delta)
                if measured:
                    r[f"{cid}:delta_ci95_low"], r[f"{cid}:delta_ci95_high"] = num(cell.delta_low), num(cell.delta_high)
                    r[f"{cid}:vs_paper"] = cell.paper_test
        recs.append(r)
    return csv_text(pd.DataFrame(recs))


def to_markdown(built: Built, heading: str = "###") -> str:
    heads = leaves(built)
    header = ["Model"] + [" ".join(p for p in path if p) for path in heads]
    lines = [
        f"{heading} {md_inline(title(built))}",
        "",
        "| " + " | ".join(md(h) for h in header) + " |",
        "|:---|" + "---:|" * len(heads),
    ]
    for row, cells in zip(built.rows, _row_texts(built, md, lambda t: f"**{t}**")):
        name = row_name(built, row, md, lambda n: f"<sup>{n}</sup>")
        lines.append("| " + " | ".join([name] + cells) + " |")
    lines += [""] + [f"- {md_inline(x)}" for x in notes(built) + legend(built)] + [""]
    return "\n".join(lines)


_TEX_SYMBOLS = {
    "±": r"$\pm$",
    PAPER_MARK: r"$\approx$",
    BASELINE_MARK: r"\textdagger{}",
    LOADED_MARK: r"\ddag{}",
    CHANCE_MARK: r"\S{}",
    "Δ": r"$\Delta$",
    "—": "---",
    "×": r"$\times$",
    "≥": r"$\geq$",
    "`": "",
}


def _tex_cell(t: str) -> str:
    t = tex(t)
    for k, v in _TEX_SYMBOLS.items():
        t = t.replace(k, v)
    return t


def _spans(heads: list[tuple]) -> list[list[tuple]]:
    """Per header level, its spans (first column, last column, text) over the columns whose paths agree so far."""
    out = []
    for level in range(max(len(p) for p in heads)):
        spans, j = [], 0
        while j < len(heads):
            k = j
            while k + 1 < len(heads) and heads[k + 1][: level + 1] == heads[j][: level + 1]:
                k += 1
            spans.append((j, k, heads[j][level] if level < len(heads[j]) else ""))
            j = k + 1
        out.append(spans)
    return out


def _tex_header(heads: list[tuple]) -> list[str]:
    """Header rows with \\multicolumn spans and \\cmidrule under every span wider than one column."""
    lines, levels = [], _spans(heads)
    for level, spans in enumerate(levels):
        last = level == len(levels) - 1
        cells = ["Model" if last else ""]
        rules = []
        for a, b, text in spans:
            t = r"$\Delta$" if text == "Δ" else tex(text)
            cells.append(t if a == b else f"\\multicolumn{{{b - a + 1}}}{{c}}{{{t}}}")
            if not last and b > a and text:
                rules.append(f"\\cmidrule(lr){{{a + 2}-{b + 2}}}")
        lines.append(" & ".join(cells) + r" \\")
        if rules:
            lines.append(" ".join(rules))
    return lines


@lru_cache(maxsize=1)
def _cmr10():
    from matplotlib import ft2font, get_data_path

    font = ft2font.FT2Font(str(Path(get_data_path()) / "fonts" / "ttf" / "cmr10.ttf"))
    font.set_size(1000, 72)  # 1000 pt: widths to a thousandth of an em, no hinting to whole pixels
    return font


def tex_width(text: str, size: float = 10.0, bold: bool = False) -> float:
    """``text``'s width in pt in Computer Modern Roman at ``size`` pt, from matplotlib's copy of cmr10 (TeX's own
    metrics); a character outside printable ASCII (±, †, ≈, Δ, ö) as wide as "M" (wider than each); bold (cmbx) 15 %
    wider, as its digits are."""
    font = _cmr10()
    font.set_text("".join(c if " " <= c <= "~" else "M" for c in text))
    return font.get_width_height()[0] / 64 / 1000 * size * (1.15 if bold else 1.0)


def tabular_width(built: Built) -> float:
    """The natural width in pt of :func:`to_latex`'s tabular: each column as wide as its widest cell at \\small
    (9 pt: cmr9, whose glyphs are 2.8 % wider per em than cmr10's), a header wider than the columns it spans
    widening the last of them (as TeX does), and \\tabcolsep (6 pt) either side of every column."""
    heads = leaves(built)
    body = [
        [row_name(built, row, str, str), *cells]
        for row, cells in zip(built.rows, _row_texts(built, str, lambda t: "\x01" + t))
    ]
    size = 9 * 1.028
    cols = zip(["Model"] + [""] * len(heads), *body)  # the header's texts: its spans, below
    widths = [max(tex_width(c.replace("\x01", ""), size, "\x01" in c) for c in col) for col in cols]
    for spans in _spans(heads):
        for a, b, text in spans:
            need = tex_width(text, size) - sum(widths[a + 1 : b + 2]) - 12.0 * (b - a)
            widths[b + 1] += max(need, 0.0)
    return sum(widths) + 12.0 * len(widths)


def to_latex(built: Built) -> str:
    """A booktabs table. In the paper style of the paper's own preset the caption is the paper's, so the
    tabular can go under it; the notes and legend follow in small type. A tabular wider than an article page
    (:data:`TEXT_WIDTH_PT`) is scaled to the text width, as papers do (``\\resizebox``: needs graphicx)."""
    heads = leaves(built)
    spec = built.spec
    caption = _tex_cell(spec.caption if built.own else title(built))
    wide = tabular_width(built) > TEXT_WIDTH_PT
    lines = [
        f"% {tex_comment(title(built))}",
        f"% generated by lra.tools.collect from the run records (preset {tex_comment(built.preset)}, "
        f"{built.style} style); do not edit by hand",
        *(["% wider than an article page: scaled to \\textwidth (\\usepackage{graphicx})"] if wide else []),
        r"\begin{table}[ht]",
        r"\centering",
        r"\small",
        f"\\caption{{{caption}}}",
        f"\\label{{tab:{safe_name(built.preset)}:{spec.key}}}",
        *([r"\resizebox{\textwidth}{!}{%"] if wide else []),
        f"\\begin{{tabular}}{{l{'r' * len(heads)}}}",
        r"\toprule",
    ]
    lines += _tex_header(heads)
    lines.append(r"\midrule")
    texts = _row_texts(built, _tex_cell, lambda t: f"\\textbf{{{t}}}")
    first_extra = any(r.in_paper for r in built.rows)  # a rule between the paper's rows and ours, where both are
    for row, cells in zip(built.rows, texts):
        if not row.in_paper and first_extra:
            lines.append(r"\midrule")
            first_extra = False
        name = row_name(built, row, _tex_cell, lambda n: f"\\textsuperscript{{{n}}}")
        lines.append(" & ".join([name] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}" + ("}" if wide else "")]
    below = notes(built) + legend(built)
    if below:
        lines += [r"\par\smallskip\footnotesize\raggedright"] + [_tex_cell(x) + r"\par" for x in below]
    lines += [r"\end{table}", ""]
    return "\n".join(lines)


def frame_markdown(df: pd.DataFrame, heading: str | None = None, empty: str = "(none)") -> str:
    """A small DataFrame as a Markdown table (values printed as strings, escaped); ``heading`` is Markdown
    already (record text in it through lra/tools/collect/escape.py)."""
    lines = [heading, ""] if heading else []
    if df.empty:
        return "\n".join(lines + [empty, ""])
    cols = list(df.columns)
    lines += ["| " + " | ".join(md(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        vals = [md(num(v, 4) if isinstance(v, float) else v) for v in r]  # md: None is ""
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines + [""])
