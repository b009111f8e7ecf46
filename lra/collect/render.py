"""Tables to CSV, Markdown and LaTeX (booktabs), and atomic file writes.

Cells read ``mean ± std (n)``: mean and sample standard deviation over seeds, n the number of seeds
with a finite value (one seed: ``mean (1)``); settings such as the batch are printed as their value,
or ``a/b`` when seeds disagree. ``--`` marks a missing cell. The best value of each column among our
rows (highest accuracy or batch; lowest steps, time, memory, accumulation), compared as printed, is
bold in Markdown and LaTeX. With a comparison, each column gains the paper's value and our delta
(ours minus paper, in the table's unit). Nothing time-dependent is printed, so the same runs give
byte-identical files.
"""

from __future__ import annotations

import math
import re
from typing import Callable

import pandas as pd

from lra.collect.tables import METRICS, PAPERS, Built, Cell

MISSING = "--"


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


def delta_text(cell: Cell, metric: str, minus: str = "-") -> str:
    d = cell.delta
    if not math.isfinite(d):
        return MISSING
    s = _fmt(abs(d), METRICS[metric].decimals)
    return ("+" if d >= 0 else minus) + s


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


def _leaves(built: Built) -> list[tuple]:
    """Header path of every printed column (compare adds ours/paper/Δ under each column)."""
    out = []
    for col in built.columns:
        if built.compare:
            out += [col.path + (p,) for p in ("ours", "paper", "Δ")]
        else:
            out.append(col.path)
    return out


def _row_texts(built: Built, pm: str, minus: str, bold: Callable[[str], str]) -> list[list[str]]:
    best = best_rows(built)
    texts = []
    for i, row in enumerate(built.rows):
        cells = []
        for j, (col, cell) in enumerate(zip(built.columns, row.cells)):
            t = ours_text(cell, col.metric, pm)
            if i in best[j]:
                t = bold(t)
            cells.append(t)
            if built.compare:
                cells += [paper_text(cell), delta_text(cell, col.metric, minus)]
        texts.append(cells)
    return texts


def title(built: Built) -> str:
    return f"{built.spec.title}: {built.spec.caption}"


def note(built: Built) -> str:
    s = (f"Preset `{built.preset}`, {built.n_runs} finished runs. Cells: mean ± std over seeds (number of seeds "
         f"with a value); settings (batch, accumulation) as their value, a/b when seeds differ; -- no run.")
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
            if built.compare:
                r[f"{cid}:paper"] = num(cell.paper)
                r[f"{cid}:delta"] = num(cell.delta)
        recs.append(r)
    return pd.DataFrame(recs).to_csv(index=False, lineterminator="\n")


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(built: Built, heading: str = "###") -> str:
    leaves = _leaves(built)
    header = ["Model"] + [" ".join(p for p in path if p) for path in leaves]
    lines = [f"{heading} {title(built)}", "", "| " + " | ".join(_md_escape(h) for h in header) + " |",
             "|:---|" + "---:|" * len(leaves)]
    for row, cells in zip(built.rows, _row_texts(built, "±", "-", lambda t: f"**{t}**" if t != MISSING else t)):
        lines.append("| " + " | ".join(_md_escape(x) for x in [row.name] + cells) + " |")
    lines += ["", note(built), ""]
    return "\n".join(lines)


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def tex_escape(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


def _tex_cell(t: str) -> str:
    return tex_escape(t).replace("±", r"$\pm$")


def _tex_header(leaves: list[tuple]) -> list[str]:
    """Header rows with \\multicolumn spans and \\cmidrule under every span wider than one column."""
    depth = max(len(p) for p in leaves)
    lines = []
    for level in range(depth):
        spans, j = [], 0
        while j < len(leaves):
            key = leaves[j][:level + 1]
            k = j
            while k + 1 < len(leaves) and leaves[k + 1][:level + 1] == key:
                k += 1
            spans.append((j, k, leaves[j][level] if level < len(leaves[j]) else ""))
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
    leaves = _leaves(built)
    spec = built.spec
    caption = tex_escape(f"{spec.caption}. Ours: preset {built.preset}, mean ± std over seeds (seeds with a "
                         f"value); -- no run.").replace("±", r"$\pm$")
    if built.compare:
        caption += tex_escape(f" Paper: {PAPERS[spec.paper]}; Δ = ours - paper.").replace("Δ", r"$\Delta$")
        if not built.preset.endswith("_paper"):
            caption += tex_escape(" Ours without the paper code's semantics (docs/fidelity.md).")
    lines = [f"% {title(built)}", f"% generated by lra.collect from the run records (preset {built.preset}); "
                                  f"do not edit by hand",
             r"\begin{table}[ht]", r"\centering", r"\small", f"\\caption{{{caption}}}",
             f"\\label{{tab:{built.preset}:{spec.key}}}",
             f"\\begin{{tabular}}{{l{'r' * len(leaves)}}}", r"\toprule"]
    lines += _tex_header(leaves)
    lines.append(r"\midrule")
    texts = _row_texts(built, "±", "-", lambda t: f"\\textbf{{{t}}}" if t != MISSING else t)
    first_extra = True
    for row, cells in zip(built.rows, texts):
        if not row.in_paper and first_extra:
            lines.append(r"\midrule")
            first_extra = False
        body = [tex_escape(row.name)]
        for c in cells:
            if c.startswith("\\textbf{"):
                body.append("\\textbf{" + _tex_cell(c[8:-1]) + "}")
            else:
                body.append(_tex_cell(c))
        lines.append(" & ".join(body) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
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
