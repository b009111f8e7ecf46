"""Tables to CSV, Markdown and LaTeX (booktabs), and atomic file writes.

Cells read ``mean ± std (n) [low, high]``: mean and sample standard deviation over seeds, n the number
of seeds with a finite value, and the 95% t-interval of the mean (one seed: ``mean (1) [one seed: no
CI]``); settings such as the batch are printed as their value, or ``a/b`` when seeds disagree. ``--``
marks a missing cell. The best value of each column among our rows (highest accuracy or batch; lowest
steps, time, memory, accumulation), compared as printed, is bold in Markdown and LaTeX. With a
comparison, each column gains the paper's value and our delta (ours minus paper, in the table's unit)
with its interval. Marks (:func:`marks`, :func:`legend`): ``≈`` after a delta, the seeds cannot
separate ours from the paper; ``†`` after ours, they cannot separate the row from the Standard row;
``?``, not testable against Standard. Nothing time-dependent is printed, so the same runs give
byte-identical files.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable

import pandas as pd

from lra.collect.stats import CANNOT_SEPARATE, NOT_TESTABLE
from lra.collect.tables import BASELINE, METRICS, ONE_SEED, PAPERS, Built, Cell

MISSING = "--"
PAPER_MARK = "≈"      # after a delta: the seeds cannot separate ours from the paper's value
BASELINE_MARK = "†"   # after ours: the seeds cannot separate this row from the Standard row (Welch, 95%)
UNTESTED_MARK = "?"   # after ours: not testable against the Standard row (it has fewer than two seeds there)


def safe_name(name: str) -> str:
    """A preset or task name as one folder/file-name component (no separators, no leading dot)."""
    return re.sub(r"[^A-Za-z0-9_.=+,-]", "_", str(name)).lstrip(".") or "_"


def num(x, decimals: int = 6) -> str:
    """A number for CSV: empty when missing, else rounded (so float noise never changes a file)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return str(x)
    r = round(float(x), decimals)
    return str(int(r)) if r == int(r) and abs(r) < 1e15 else repr(r)


def frame_csv(df: pd.DataFrame) -> str:
    out = df.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = [num(v) for v in out[c]]
    return out.to_csv(index=False, lineterminator="\n")


# ----------------------------------------------------------------------------- cells
def _fmt(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def ours_text(cell: Cell, metric: str, pm: str = "±") -> str:
    m = METRICS[metric]
    if cell.empty:
        return MISSING
    if cell.average:
        return _fmt(cell.mean, m.decimals)
    if m.setting:
        return "/".join(_fmt(v, m.decimals) for v in cell.values) if cell.values else _fmt(cell.mean, m.decimals)
    if cell.n > 1 and math.isfinite(cell.std):
        return f"{_fmt(cell.mean, m.decimals)} {pm} {_fmt(cell.std, m.decimals)} ({cell.n})"
    return f"{_fmt(cell.mean, m.decimals)} ({cell.n})"


def paper_text(cell: Cell) -> str:
    return cell.paper_text if cell.paper_text else MISSING


def _signed(x: float, decimals: int, minus: str = "-") -> str:
    return ("+" if x >= 0 else minus) + _fmt(abs(x), decimals)


def delta_text(cell: Cell, metric: str, minus: str = "-") -> str:
    d = cell.delta
    if not math.isfinite(d):
        return MISSING
    return _signed(d, METRICS[metric].decimals, minus)


def _no_ci(cell: Cell) -> str:
    return "[one seed: no CI]" if cell.ci_note == ONE_SEED else f"[CI n/a: {cell.ci_note}]"


def interval_text(cell: Cell, metric: str, minus: str = "-") -> str:
    """``[low, high]``: the 95% t-interval of our mean over seeds; ``[one seed: no CI]`` (or ``[CI n/a:
    why]``) without one; "" for a setting or an empty cell."""
    m = METRICS[metric]
    if cell.empty or m.setting or cell.std == 0:  # seeds that agree exactly: ± 0.00 says it all
        return ""
    if not cell.has_ci:
        return _no_ci(cell)
    lo, hi = (_fmt(x, m.decimals) for x in (cell.ci_low, cell.ci_high))
    return f"[{lo.replace('-', minus)}, {hi.replace('-', minus)}]"


def delta_interval_text(cell: Cell, metric: str, minus: str = "-") -> str:
    """``[low, high]`` of the delta (ours - paper): our interval shifted by the paper's value, which is one
    published number without spread; "" where there is no delta or the metric is a setting."""
    m = METRICS[metric]
    if not math.isfinite(cell.delta) or m.setting or cell.std == 0:
        return ""
    if not cell.has_ci:
        return _no_ci(cell)
    return f"[{_signed(cell.delta_low, m.decimals, minus)}, {_signed(cell.delta_high, m.decimals, minus)}]"


def marks(cell: Cell, baseline: str = "Standard", *, paper: bool = True,
          standard: bool = True) -> list[tuple[str, str]]:
    """The marks of a cell as (symbol, meaning), the paper's first. ``baseline``: the printed name of the
    table's Standard row (:func:`baseline_name`). Markdown and LaTeX print the paper's mark after the
    delta (``standard=False``) and the Standard marks after our value (``paper=False``). A cell without
    an interval of its own (one seed) gets none: its interval text says so."""
    out = []
    if paper and cell.paper_test == CANNOT_SEPARATE:
        out.append((PAPER_MARK, ("the seeds cannot separate ours from the paper: the paper's value lies in "
                                 "our 95% interval")))
    if standard and cell.base_test == CANNOT_SEPARATE and cell.base_low < cell.base_high:  # no spread: no question
        out.append((BASELINE_MARK, (f"the seeds cannot separate this row from {baseline}: Welch's 95% "
                                    f"interval of the difference of means contains 0")))
    elif standard and cell.base_test == NOT_TESTABLE and cell.has_ci:
        out.append((UNTESTED_MARK, f"not testable against {baseline}: it has fewer than two seeds here"))
    return out


def baseline_name(built: Built) -> str:
    """The printed name of the table's Standard row (``softmax``: Standard / Self-Attention / softmax)."""
    return next((r.name for r in built.rows if r.key == BASELINE), "Standard")


def legend(built: Built) -> list[str]:
    """The lines printed under a table that explain its intervals and marks (none for settings-only tables)."""
    if all(METRICS[c.metric].setting for c in built.columns):
        return []
    base = baseline_name(built)
    lines = [("95% intervals: [low, high] after our value is the t-interval of the mean over seeds, "
              "mean ± t(0.975, n-1) * std / sqrt(n). One seed has none: [one seed: no CI], and no mark. Seeds "
              "that agree exactly (a std of zero) need none.")]
    if built.spec.average:
        lines.append(f"{built.spec.average}: an interval only when every task has the same seeds (the t-interval "
                     f"of the per-seed averages); otherwise [CI n/a: seeds differ by task].")
    if built.compare:
        lines.append(f"Δ [low, high]: ours - paper, with our interval shifted by the paper's value (the paper "
                     f"prints one value without its spread). {PAPER_MARK} after Δ: the seeds cannot separate ours "
                     f"from the paper (its value lies in our interval).")
    lines.append(f"{BASELINE_MARK} after our value: the seeds cannot separate this row from {base} (Welch's 95% "
                 f"interval of the difference of means contains 0). {UNTESTED_MARK}: not testable against {base} "
                 f"(fewer than two seeds there). A difference with an interval and no mark is separated at 95%; "
                 f"a mark means the seeds cannot tell the values apart, not that they are equal.")
    return lines


def best_rows(built: Built) -> list[set]:
    """For each column, the indices of our rows holding the best printed value."""
    best = []
    for j, col in enumerate(built.columns):
        m = METRICS[col.metric]
        vals = {}
        for i, row in enumerate(built.rows):
            c = row.cells[j]
            if not c.empty:
                vals[i] = round(c.mean, m.decimals)
        if not vals:
            best.append(set())
            continue
        target = max(vals.values()) if m.higher_better else min(vals.values())
        best.append({i for i, v in vals.items() if v == target})
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
    if best, interval, Standard marks) and, with a comparison, the paper's value and Δ (interval, paper mark).
    Marks are (symbol, meaning) pairs (:func:`marks`)."""

    value: str
    best: bool
    ci: str
    marks: tuple = ()
    paper: str = ""
    delta: str = ""
    delta_ci: str = ""
    paper_marks: tuple = ()


def cell_texts(built: Built, minus: str = "-") -> list[list[CellText]]:
    """The :class:`CellText` of every cell, row by row."""
    best = best_rows(built)
    base = baseline_name(built)
    rows = []
    for i, row in enumerate(built.rows):
        texts = []
        for j, (col, cell) in enumerate(zip(built.columns, row.cells)):
            value = ours_text(cell, col.metric)
            t = CellText(value, i in best[j] and value != MISSING, interval_text(cell, col.metric, minus),
                         tuple(marks(cell, base, paper=False)))
            if built.compare:
                t = replace(t, paper=paper_text(cell), delta=delta_text(cell, col.metric, minus),
                            delta_ci=delta_interval_text(cell, col.metric, minus),
                            paper_marks=tuple(marks(cell, base, standard=False)))
            texts.append(t)
        rows.append(texts)
    return rows


def join(*parts: str) -> str:
    """Pieces of a cell, one space apart, empty ones left out."""
    return " ".join(p for p in parts if p)


def _row_texts(built: Built, esc: Callable[[str], str], bold: Callable[[str], str], minus: str = "-") \
        -> list[list[str]]:
    """Every printed cell, already in the output format: ``esc`` escapes a piece of text, ``bold`` wraps
    an escaped one. Ours: value (bold if best), interval, Standard marks; Δ: delta, interval, paper mark."""
    def symbols(ms) -> str:
        return esc("".join(m for m, _ in ms))

    out = []
    for row in cell_texts(built, minus):
        cells = []
        for t in row:
            value = bold(esc(t.value)) if t.best else esc(t.value)
            cells.append(join(value, esc(t.ci), symbols(t.marks)))
            if built.compare:
                cells += [esc(t.paper), join(esc(t.delta), esc(t.delta_ci), symbols(t.paper_marks))]
        out.append(cells)
    return out


def title(built: Built) -> str:
    return f"{built.spec.title}: {built.spec.caption}"


def note(built: Built) -> str:
    s = (f"Preset `{built.preset}`, {built.n_runs} finished runs. Cells: mean ± std over seeds (number of seeds "
         f"with a value) [95% interval of the mean]; settings (batch, accumulation) as their value, a/b when "
         f"seeds differ; -- no run.")
    if built.compare:
        s += (f" paper: {PAPERS[built.spec.paper]}, {built.spec.title}; Δ = ours - paper. Compare time and "
              f"memory only on the paper's hardware and protocol.")
        if not built.preset.endswith("_paper"):  # quick, or skeinformer_paper+clean (lra.collect.records.table_set)
            s += (" These runs do not have the paper code's semantics (semantics=paper, docs/fidelity.md): a Δ "
                  "mixes the protocol's differences with the harness's corrections.")
    if any(not r.in_paper for r in built.rows):
        s += " Rows after the paper's: backends or overrides the paper did not run."
    return s


# ----------------------------------------------------------------------------- formats
def to_csv(built: Built) -> str:
    recs = []
    for row in built.rows:
        r = {"row": row.name, "attn": row.key, "in_paper": int(row.in_paper), "seeds": row.seeds}
        for col, cell in zip(built.columns, row.cells):
            cid = f"{col.task}:{col.metric}"
            r[cid] = num(cell.mean)
            if not cell.average:
                r[f"{cid}:std"] = num(cell.std)
            r[f"{cid}:n"] = cell.n
            measured = not METRICS[col.metric].setting
            if measured:
                r[f"{cid}:ci95_low"], r[f"{cid}:ci95_high"] = num(cell.ci_low), num(cell.ci_high)
                r[f"{cid}:vs_{BASELINE}"] = cell.base_test
                r[f"{cid}:vs_{BASELINE}_diff"] = num(cell.base_diff)
                r[f"{cid}:vs_{BASELINE}_ci95_low"] = num(cell.base_low)
                r[f"{cid}:vs_{BASELINE}_ci95_high"] = num(cell.base_high)
            if built.compare:
                r[f"{cid}:paper"] = num(cell.paper)
                r[f"{cid}:delta"] = num(cell.delta)
                if measured:
                    r[f"{cid}:delta_ci95_low"], r[f"{cid}:delta_ci95_high"] = num(cell.delta_low), num(cell.delta_high)
                    r[f"{cid}:vs_paper"] = cell.paper_test
        recs.append(r)
    return pd.DataFrame(recs).to_csv(index=False, lineterminator="\n")


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(built: Built, heading: str = "###") -> str:
    heads = leaves(built)
    header = ["Model"] + [" ".join(p for p in path if p) for path in heads]
    lines = [f"{heading} {title(built)}", "", "| " + " | ".join(_md_escape(h) for h in header) + " |",
             "|:---|" + "---:|" * len(heads)]
    for row, cells in zip(built.rows, _row_texts(built, _md_escape, lambda t: f"**{t}**")):
        lines.append("| " + " | ".join([_md_escape(row.name)] + cells) + " |")
    lines += ["", note(built), ""]
    legend_lines = legend(built)
    if legend_lines:
        lines += [f"- {x}" for x in legend_lines] + [""]
    return "\n".join(lines)


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def tex_escape(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


_TEX_SYMBOLS = {"±": r"$\pm$", PAPER_MARK: r"$\approx$", BASELINE_MARK: r"\textdagger{}", "Δ": r"$\Delta$"}


def _tex_cell(t: str) -> str:
    t = tex_escape(t)
    for k, v in _TEX_SYMBOLS.items():
        t = t.replace(k, v)
    return t


def _tex_header(heads: list[tuple]) -> list[str]:
    """Header rows with \\multicolumn spans and \\cmidrule under every span wider than one column."""
    depth = max(len(p) for p in heads)
    lines = []
    for level in range(depth):
        spans, j = [], 0
        while j < len(heads):
            key = heads[j][:level + 1]
            k = j
            while k + 1 < len(heads) and heads[k + 1][:level + 1] == key:
                k += 1
            spans.append((j, k, heads[j][level] if level < len(heads[j]) else ""))
            j = k + 1
        last = level == depth - 1
        cells = ["Model" if last else ""]
        rules = []
        for a, b, text in spans:
            t = text.replace("Δ", r"$\Delta$") if text == "Δ" else tex_escape(text)
            cells.append(t if a == b else f"\\multicolumn{{{b - a + 1}}}{{c}}{{{t}}}")
            if not last and b > a and text:
                rules.append(f"\\cmidrule(lr){{{a + 2}-{b + 2}}}")
        lines.append(" & ".join(cells) + r" \\")
        if rules:
            lines.append(" ".join(rules))
    return lines


def to_latex(built: Built) -> str:
    heads = leaves(built)
    spec = built.spec
    caption = _tex_cell(f"{spec.caption}. Ours: preset {built.preset}, mean ± std over seeds (seeds with a "
                        f"value) [95% interval of the mean]; -- no run.")
    if built.compare:
        caption += tex_escape(f" Paper: {PAPERS[spec.paper]}; Δ = ours - paper.").replace("Δ", r"$\Delta$")
        if not built.preset.endswith("_paper"):
            caption += tex_escape(" Ours without the paper code's semantics (docs/fidelity.md).")
    lines = [f"% {title(built)}", f"% generated by lra.collect from the run records (preset {built.preset}); "
                                  f"do not edit by hand",
             r"\begin{table}[ht]", r"\centering", r"\small", f"\\caption{{{caption}}}",
             f"\\label{{tab:{built.preset}:{spec.key}}}",
             f"\\begin{{tabular}}{{l{'r' * len(heads)}}}", r"\toprule"]
    lines += _tex_header(heads)
    lines.append(r"\midrule")
    texts = _row_texts(built, _tex_cell, lambda t: f"\\textbf{{{t}}}")
    first_extra = True
    for row, cells in zip(built.rows, texts):
        if not row.in_paper and first_extra:
            lines.append(r"\midrule")
            first_extra = False
        lines.append(" & ".join([tex_escape(row.name)] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    legend_lines = legend(built)
    if legend_lines:
        lines += [r"\par\smallskip\footnotesize"] + [_tex_cell(x) + r"\par" for x in legend_lines]
    lines += [r"\end{table}", ""]
    return "\n".join(lines)


def frame_markdown(df: pd.DataFrame, heading: str | None = None, empty: str = "(none)") -> str:
    """A small DataFrame as a Markdown table (values printed as strings)."""
    lines = [heading, ""] if heading else []
    if df.empty:
        return "\n".join(lines + [empty, ""])
    cols = list(df.columns)
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        vals = []
        for v in r:
            if isinstance(v, float):
                v = num(v, 4)
            vals.append(_md_escape(str("" if v is None else v)).replace("\n", " "))
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines + [""])
