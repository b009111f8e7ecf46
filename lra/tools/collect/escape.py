"""Text from the run records, escaped for the format it is written into: one helper per format.

A record is data from wherever a runs folder came from: a backend name, an exception text, a folder name or
a preset may hold ``<script>``, ``|``, ``{``, ``=HYPERLINK(...)`` or a line break. Every writer of the
collector passes such text through these helpers at the point of writing, so the text is shown, never run:

* :func:`md`, :func:`md_code` and :func:`md_inline` (Markdown: no raw HTML, no table break, no link);
* :func:`tex` and :func:`tex_comment` (LaTeX: the ten special characters, line breaks);
* :func:`csv_cell` (CSV opened in a spreadsheet: no formula; numbers stay numbers);
* :func:`html_text` (the results page; lra/tools/collect/page.py);
* :func:`console` (the lines the command prints: no terminal control sequences).
"""

from __future__ import annotations

import html
import re

_LINE_BREAKS = re.compile(r"[\r\n\v\f\x85\u2028\u2029]+")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _one_line(s) -> str:
    """``s`` as text on one line without control characters (each break one space)."""
    return _CONTROL.sub("", _LINE_BREAKS.sub(" ", "" if s is None else str(s)).replace("\t", " "))


# ----------------------------------------------------------------------------- Markdown
_MD = {"\\": "\\\\", "`": "\\`", "|": "\\|", "<": "&lt;", ">": "&gt;", "&": "&amp;"}
_LINK = re.compile(r"\](?=[(\[])|^(\s*\[[^\]]*)\](?=:)")  # ](url), ][ref]; [ref]: url (a definition)


def md(s) -> str:
    """Plain text in Markdown (a table cell, a heading, a list item): raw HTML and autolinks become
    entities, ``|`` (a table's cell break), backticks and backslashes are escaped, a ``]`` that would close
    a link is escaped, a line break is a space. Emphasis (``*``, ``_``) is left: it cannot run anything."""
    return _LINK.sub(lambda m: (m.group(1) or "") + "\\]", "".join(_MD.get(ch, ch) for ch in _one_line(s)))


def md_code(s) -> str:
    """Text as one Markdown code span (shown verbatim): the fence is longer than any run of backticks in
    it; ``|`` is escaped, which GFM tables need even inside code."""
    s = _one_line(s).replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith(("`", " ")) or s.endswith(("`", " ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_inline(s) -> str:
    """A note the collector wrote, whose `code` spans hold record text (``Preset `quick`: ...``): the text
    outside the spans escaped as :func:`md`, each span as :func:`md_code`."""
    parts = _one_line(s).split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: no spans to trust, all of it plain text
        return md(s)
    return "".join(md_code(p) if i % 2 else md(p) for i, p in enumerate(parts))


# ----------------------------------------------------------------------------- LaTeX
_TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
}


def tex(s) -> str:
    """Plain text in LaTeX: the special characters as their commands, a line break (which would end a
    paragraph inside a tabular) as a space."""
    return "".join(_TEX.get(ch, ch) for ch in _one_line(s))


def tex_comment(s) -> str:
    """Text after ``%`` on one comment line: a line break would end the comment and run the rest."""
    return _one_line(s)


# ----------------------------------------------------------------------------- CSV
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v):
    """A CSV cell that a spreadsheet shows as text, never runs: text starting with ``= + - @``, a tab or a
    carriage return gets a leading apostrophe. Numbers (``-0.5`` too, as a number or its text) and
    anything that is not text are returned as they are."""
    if not isinstance(v, str) or not v.startswith(_FORMULA):
        return v
    try:
        float(v)
        return v  # a number written as text (render.num): the spreadsheet reads a number
    except ValueError:
        return "'" + v


# ----------------------------------------------------------------------------- HTML, console
def html_text(s) -> str:
    """Text in HTML, attribute values included (quotes escaped)."""
    return html.escape(str(s), quote=True)


def console(s) -> str:
    """Text on one printed line: no terminal control sequences (escape, carriage return ...)."""
    return _one_line(s)
