"""The results page: one self-contained ``index.html`` beside the CSV, LaTeX and Markdown tables.

Per preset: every table as the paper lays it out (its rows, its columns, multi-level headers), our
value with its 95% interval as the Markdown table prints it (every text comes from
:mod:`lra.tools.collect.render`), the paper's value and our delta with its interval when compared, the best
value of each column in bold, and the marks (their meaning on hover) with the table's legend; then the
preset's figures, inline as base64 PNG; then the runs behind the cells: a table of task × attention
whose cells link to each run's ``result.json``. Every value cell of a table links to its entry there
(the Average column to the row). Failed or unfinished runs and every problem found in the records close
the page.

The page needs nothing else: CSS is inline, images are ``data:`` URLs, no script, no font, no URL
to the network. The only links leaving the page are relative ones to the run records (and to the
PDF figures beside it); they work where the runs root and the tables folder are shared together.
All text (row names, override tags, run folder names, reasons) is escaped. Nothing time-dependent
is printed: the same runs give the same bytes.
"""

from __future__ import annotations

import base64
import math
import os
import re
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from lra.tools.collect import render
from lra.tools.collect import rows as R
from lra.tools.collect.escape import html_text
from lra.tools.collect.records import Issue, failed_frame, issues_frame
from lra.tools.collect.tables import METRICS, PAPERS, Built

CSS = """
:root { --fg: #1b1f24; --muted: #59636e; --line: #d0d7de; --head: #f3f5f7; --zebra: #fafbfc;
        --best: #0b3d91; --target: #fff3b0; --up: #1a7f37; --down: #b42318; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); margin: 0 auto; padding: 1.2em 2em 4em; max-width: 1500px; }
h1 { font-size: 1.7em; margin: 0.2em 0 0.3em; }
h2 { font-size: 1.35em; margin: 2em 0 0.4em; padding-bottom: 0.2em; border-bottom: 2px solid var(--line); }
h3 { font-size: 1.08em; margin: 1.6em 0 0.4em; }
h4 { font-size: 1em; margin: 1.2em 0 0.3em; }
p, li { max-width: 75em; }
code { font: 0.92em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: var(--head);
       padding: 0 0.25em; border-radius: 3px; }
a { color: #0550ae; }
nav ul { margin: 0.2em 0; padding-left: 1.2em; columns: 2 28em; }
.scroll { overflow-x: auto; width: fit-content; max-width: 100%; margin: 0.3em 0 0.4em; border: 1px solid var(--line);
          border-radius: 4px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 0.28em 0.6em; white-space: nowrap; }
thead th { background: var(--head); text-align: center; font-weight: 600; border-left: 1px solid var(--line); }
thead th:first-child { border-left: 0; }
tbody th { text-align: left; font-weight: 500; white-space: normal; min-width: 18em; max-width: 26em;
           overflow-wrap: anywhere; }
@media (min-width: 1100px) { tbody th { min-width: 24em; } }
td { text-align: right; }
tbody tr:nth-child(even) { background: var(--zebra); }
tbody tr.extra-first > * { border-top: 2px solid #8c959f; }
.model { position: sticky; left: 0; background: #fff; z-index: 1; box-shadow: 1px 0 0 var(--line); }
thead .model { background: var(--head); text-align: left; }
tbody tr:nth-child(even) .model { background: var(--zebra); }
td.ours { border-left: 1px solid var(--line); }
td.paper, td.delta { color: var(--muted); font-size: 0.93em; }
td.delta.better { color: var(--up); }
td.delta.worse { color: var(--down); }
td a { color: inherit; text-decoration: none; border-bottom: 1px dotted #8c959f; }
td a:hover { color: #0550ae; border-bottom-color: #0550ae; }
td.best strong { color: var(--best); }
td.empty { color: #adb5bd; }
.ci { color: var(--muted); font-size: 0.86em; }
.mark { color: #9a6700; font-weight: 700; cursor: help; }
.note, .legend { color: var(--muted); font-size: 0.9em; margin: 0.2em 0 0.6em; }
ul.legend { padding-left: 1.2em; }
details.legend summary { cursor: pointer; }
ul.note { padding-left: 1.2em; }
figure { margin: 1em 0 1.6em; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { color: var(--muted); font-size: 0.9em; margin-top: 0.3em; }
table.runs td { text-align: left; white-space: normal; min-width: 9em; }
table.runs td a { border: 0; text-decoration: underline; margin-right: 0.5em; white-space: nowrap; }
table.report td { text-align: left; white-space: normal; }
table.report td.path { font: 0.85em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; word-break: break-all; }
:target, :target > * { background: var(--target) !important; }
.summary { font-size: 1.02em; }
"""


_e = html_text  # every text on the page: lra/tools/collect/escape.py


def _inline(text: str) -> str:
    """Escaped text with Markdown's `code` spans as <code> (the tables' notes use them)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


def _href(target: Path, page_dir: Path) -> str:
    """A link from the page's folder to ``target``: relative (posix, percent-encoded), so the runs root
    and the tables folder can be moved and shared together."""
    try:
        rel = os.path.relpath(target, page_dir)
    except ValueError:  # another drive (Windows): no relative path exists
        return Path(target).resolve().as_uri()
    return quote(Path(rel).as_posix(), safe="/")


def _anchor(*parts) -> str:
    return "-".join(str(p) for p in parts)


# ----------------------------------------------------------------------------- marks (lra.tools.collect.render)
def _marks_html(marks: list[tuple[str, str]]) -> str:
    """The marks of a cell as render.marks gives them: each symbol, its meaning on hover."""
    return "".join(f'<span class="mark" title="{_e(meaning)}">{_e(sym)}</span>' for sym, meaning in marks)


def _ci_html(text: str) -> str:
    return f'<span class="ci">{_e(text)}</span>' if text else ""


def _legend(built: Built) -> str:
    lines = render.legend(built)
    if not lines:
        return ""
    return (
        '<details class="legend"><summary>How to read the cells and marks</summary><ul class="legend">'
        f'{"".join(f"<li>{_inline(x)}</li>" for x in lines)}</ul></details>'
    )


# ----------------------------------------------------------------------------- tables
def _header(built: Built) -> list[str]:
    """<tr>s of a multi-level header: spans over equal prefixes, rowspans where deeper levels are empty."""
    leaves = render.leaves(built)
    depth = max(len(p) for p in leaves)
    leaves = [tuple(p) + ("",) * (depth - len(p)) for p in leaves]

    def used(p):  # levels up to the last non-empty one (at least one)
        return max([k + 1 for k, x in enumerate(p) if x] or [1])

    rows = []
    for level in range(depth):
        cells = [f'<th class="model" rowspan="{depth}">Model</th>'] if level == 0 else []
        j = 0
        while j < len(leaves):
            if level >= used(leaves[j]):
                j += 1
                continue
            k = j
            while (
                k + 1 < len(leaves)
                and level < used(leaves[k + 1])
                and leaves[k + 1][: level + 1] == leaves[j][: level + 1]
            ):
                k += 1
            span = f' colspan="{k - j + 1}"' if k > j else ""
            down = depth - level if k == j and used(leaves[j]) == level + 1 and level + 1 < depth else 1
            span += f' rowspan="{down}"' if down > 1 else ""
            cells.append(f'<th scope="col"{span}>{_e(leaves[j][level])}</th>')
            j = k + 1
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return rows


def _delta_class(cell, metric: str, paper_marks: list) -> str:
    """Green where ours is better than the paper, red where worse; no colour where the seeds cannot tell
    (a paper mark, no interval) or for a setting."""
    m = METRICS[metric]
    if not math.isfinite(cell.delta) or m.setting or paper_marks or not cell.has_ci:
        return ""
    return " better" if (cell.delta > 0) == m.higher_better else " worse"


def _table(built: Built, pid: int, run_ids: dict, row_ids: dict) -> str:
    """One paper table: each cell as the Markdown prints it (value, interval, marks), the value linking to
    the runs behind it."""
    body, first_extra = [], any(r.in_paper for r in built.rows)  # a rule between the paper's rows and ours
    for row, texts in zip(built.rows, render.cell_texts(built)):
        cls = ""
        if not row.in_paper and first_extra:
            cls, first_extra = ' class="extra-first"', False
        name = render.row_name(built, row, _e, lambda n: f'<sup title="{_e(row.settings)}">{n}</sup>')
        cells = [f'<th class="model" scope="row">{name}</th>']
        for col, cell, t in zip(built.columns, row.cells, texts):
            if cell.empty:
                cells.append(f'<td class="ours empty">{_e(t.value)}</td>')
            else:
                target = row_ids.get(row.key) if col.task == "average" else run_ids.get((col.task, row.key))
                value = (
                    f'<a href="#{target}" title="the runs behind this value">{_e(t.value)}</a>'
                    if target
                    else _e(t.value)
                )
                cells.append(
                    f'<td class="ours{" best" if t.best else ""}">'
                    + render.join(
                        f"<strong>{value}</strong>" if t.best else value, _ci_html(t.ci), _marks_html(t.marks)
                    )
                    + "</td>"
                )
            if built.compare:
                cells.append(f'<td class="paper">{_e(t.paper)}</td>')
                cells.append(
                    f'<td class="delta{_delta_class(cell, col.metric, t.paper_marks)}">'
                    + render.join(_e(t.delta), _ci_html(t.delta_ci), _marks_html(t.paper_marks))
                    + "</td>"
                )
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    sid = _anchor("t", pid, built.spec.key)
    return "\n".join(
        [
            f'<section id="{sid}">',
            f"<h3>{_e(render.title(built))}</h3>",
            '<div class="scroll"><table class="paper-table">',
            "<thead>",
            *_header(built),
            "</thead>",
            "<tbody>",
            *body,
            "</tbody>",
            "</table></div>",
            '<ul class="note">'
            + "".join(f"<li>{_inline(x)}</li>" for x in render.notes(built))
            + "<li>Click a value for the runs behind it.</li></ul>",
            _legend(built),
            "</section>",
        ]
    )


# ----------------------------------------------------------------------------- runs behind the cells
def _runs_table(
    runs: pd.DataFrame, preset: str, order: list[str], pid: int, runs_root: Path, page_dir: Path, trials: bool = False
):
    """(html, {(task, row key): anchor}, {row key: anchor}): task × row, each cell linking the runs."""
    ok, infos = R.assign(runs[runs["preset"] == preset], trials=trials)
    if ok.empty:
        return "<p>No finished runs.</p>", {}, {}
    label, settings = R.labels(infos)
    present = set(ok["row"])
    rows = [k for k in order if k in present] + sorted(present - set(order))
    tasks = sorted(set(ok["task"]))
    run_ids, row_ids = {}, {}
    out = [
        '<div class="scroll"><table class="runs">',
        "<thead><tr>",
        '<th class="model">Row (overrides)</th>',
        *[f'<th scope="col">{_e(t)}</th>' for t in tasks],
        "</tr></thead>",
        "<tbody>",
    ]
    for r, key in enumerate(rows):
        row_ids[key] = _anchor("r", pid, r)
        full = infos[key].over
        text = _e(label[key]) + (f"<br><code>{_e(full)}</code>" if full else "")
        cells = [f'<th class="model" scope="row" id="{row_ids[key]}">{text}</th>']
        for c, task in enumerate(tasks):
            g = ok[(ok["task"] == task) & (ok["row"] == key)].sort_values(["seed", "path"], kind="stable")
            if g.empty:
                cells.append("<td></td>")
                continue
            run_ids[(task, key)] = aid = _anchor("r", pid, r, c)
            links = [
                f'<a href="{_e(_href(runs_root / p / "result.json", page_dir))}" title="{_e(p)}">'
                f'seed {_e(_seed(s))}</a>'
                for p, s in zip(g["path"], g["seed"])
            ]
            cells.append(f'<td id="{aid}">{" ".join(links)}</td>')
        out.append(f"<tr>{''.join(cells)}</tr>")
    out += ["</tbody></table></div>"]
    return "\n".join(out), run_ids, row_ids


def _seed(s) -> str:
    return str(int(s)) if isinstance(s, float) and math.isfinite(s) and s == int(s) else str(s)


# ----------------------------------------------------------------------------- figures, reports
def _figures(paths: list[Path], page_dir: Path) -> str:
    out = []
    for p in paths:
        p = Path(p)
        if p.suffix.lower() != ".png" or not p.is_file():
            continue
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        pdf = p.with_suffix(".pdf")
        also = f' (<a href="{_e(_href(pdf, page_dir))}">PDF</a>)' if pdf.is_file() else ""
        out.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{_e(p.stem)}">'
            f"<figcaption><code>{_e(p.stem)}</code>{also}</figcaption></figure>"
        )
    return "\n".join(out)


def _report(df: pd.DataFrame, runs_root: Path, page_dir: Path, record: bool, link_text: str | None = None) -> str:
    """A small frame as a table; its ``path`` column links to the run's result.json (``record``) or folder,
    showing ``link_text`` instead of the path where given (a long folder name, its full path on hover)."""
    head = "".join(f'<th scope="col">{_e(c)}</th>' for c in df.columns)
    rows = []
    for r in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, r):
            text = _seed(v) if c == "seed" else render.num(v, 4) if isinstance(v, float) else ("" if v is None else v)
            if c == "path":
                target = runs_root / str(v) / ("result.json" if record else "")
                shown = link_text or v
                if target.exists():
                    text = f'<a href="{_e(_href(target, page_dir))}" title="{_e(v)}">{_e(shown)}</a>'
                else:
                    text = _e(shown)
                cells.append(f'<td class="path">{text}</td>')
            else:
                cells.append(f"<td>{_e(text)}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return "\n".join(
        [
            '<div class="scroll"><table class="report">',
            f"<thead><tr>{head}</tr></thead>",
            "<tbody>",
            *rows,
            "</tbody></table></div>",
        ]
    )


def page_html(
    tables: dict,
    runs: pd.DataFrame,
    issues: list[Issue],
    runs_root: Path,
    page_dir: Path,
    figures: dict | None = None,
    compare=(),
    trials: bool = False,
    searches: pd.DataFrame | None = None,
) -> str:
    """The results page (one HTML5 document, self-contained) for the tables ``collect`` built.

    Args:
        tables: {(preset, table key): Built}, in the order to print.
        runs: the runs frame (lra.tools.collect.records.load_runs).
        issues: every problem found (records, plots).
        runs_root: where the run folders are (``runs["path"]`` is relative to it).
        page_dir: the folder the page is written to (links are relative to it).
        figures: {preset: [figure files]} as ``plot_preset`` returned them; PNGs are inlined.
        compare: the papers compared with (keys of ``PAPERS``).
        trials: search trials are rows of the tables (``lra.tools.collect --trials``).
        searches: one row per search (:func:`lra.tools.collect.rows.searches`), shown per preset.
    """
    runs_root, page_dir, figures = Path(runs_root), Path(page_dir), figures or {}
    presets = list(dict.fromkeys(p for p, _ in tables))
    ok = runs["usable"] & runs["kept"]
    kinds = pd.Series([i.kind for i in issues], dtype=str).value_counts().sort_index()
    failed, iss = failed_frame(runs), issues_frame(issues)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>LRA results</title>",
        f"<style>{CSS}</style>",
        "</head>",
        "<body>",
        "<header>",
        "<h1>LRA results</h1>",
        (
            f'<p class="summary">{len(runs)} run records read: {int(ok.sum())} finished and counted, '
            f"{int((~runs['usable']).sum())} not finished, {int((runs['usable'] & ~runs['kept']).sum())} "
            f"superseded duplicates. Problems: "
            f"{_e(', '.join(f'{k} {v}' for k, v in kinds.items()) or 'none')}.</p>"
        ),
    ]
    if compare:
        parts.append(f"<p>Compared with: {_e(', '.join(PAPERS[c] for c in compare))}.</p>")
    nav = []
    for pid, preset in enumerate(presets):
        sub = "".join(
            f'<li><a href="#{_anchor("t", pid, k)}">{_e(render.title(tables[(p, k)]))}</a></li>'
            for p, k in tables
            if p == preset
        )
        nav.append(f'<li><a href="#{_anchor("p", pid)}">Preset <code>{_e(preset)}</code></a><ul>{sub}</ul></li>')
    nav += [
        f'<li><a href="#failed">Failed or unfinished runs ({len(failed)})</a></li>',
        f'<li><a href="#problems">Problems found in the records ({len(iss)})</a></li>',
    ]
    parts += ["<nav><ul>", *nav, "</ul></nav>", "</header>", "<main>"]
    for pid, preset in enumerate(presets):
        built = [tables[(p, k)] for p, k in tables if p == preset]
        order = list(dict.fromkeys(r.key for b in built for r in b.rows))
        runs_html, run_ids, row_ids = _runs_table(runs, preset, order, pid, runs_root, page_dir, trials)
        parts += [f'<section id="{_anchor("p", pid)}">', f"<h2>Preset <code>{_e(preset)}</code></h2>"]
        parts += [_table(b, pid, run_ids, row_ids) for b in built]
        found = searches[searches["preset"] == preset] if searches is not None else pd.DataFrame()
        if len(found):
            parts += [
                f'<h3 id="{_anchor("s", pid)}">Searches</h3>',
                (
                    '<p class="note">Each search\'s trials are left out of the tables above (<code>--trials</code> '
                    "shows them); its best trial by the search's objective, and that trial's record:</p>"
                ),
                _report(
                    found.drop(columns=["preset", "best_params"]).rename(columns={"best_path": "path"}),
                    runs_root,
                    page_dir,
                    True,
                    link_text="result.json",
                ),
            ]
        figs = _figures(figures.get(preset, []), page_dir)
        if figs:
            parts += [f'<h3 id="{_anchor("f", pid)}">Figures</h3>', figs]
        parts += [
            f'<h3 id="{_anchor("runs", pid)}">Runs behind the cells</h3>',
            (
                '<p class="note">Finished runs counted in the means, per task × row; each link opens the '
                "run's <code>result.json</code> (relative to this page: share the runs folder with it).</p>"
            ),
            runs_html,
            "</section>",
        ]
    parts += [
        '<section id="failed">',
        "<h2>Failed or unfinished runs (never in a mean)</h2>",
        _report(failed, runs_root, page_dir, True) if len(failed) else "<p>No failed runs.</p>",
        "</section>",
        '<section id="problems">',
        "<h2>Problems found in the records</h2>",
        _report(iss, runs_root, page_dir, False) if len(iss) else "<p>No problems found.</p>",
        "</section>",
        "</main>",
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)
