"""The results page (lra/tools/collect/page.py), read back with the stdlib's html.parser as a browser would."""

import base64
import html
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pytest
from test_collect import make_record

from lra.tools.collect import collect, main, render

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
SCRIPT = "attn.tag=<script>alert(1)</script>"
P = "skeinformer_paper"  # a paper's own preset: the tables compare with the paper


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    @property
    def classes(self):
        return set((self.attrs.get("class") or "").split())

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag=None, cls=None, **attrs):
        return [
            n
            for n in self.iter()
            if (tag is None or n.tag == tag)
            and (cls is None or cls in n.classes)
            and all(n.attrs.get(k) == v for k, v in attrs.items())
        ]

    def find(self, *a, **k):
        found = self.find_all(*a, **k)
        return found[0] if found else None

    def text(self, skip=()):
        """Text content (without the elements of a class in ``skip``)."""
        out = []
        for c in self.children:
            if isinstance(c, str):
                out.append(c)
            elif not (c.classes & set(skip)):
                out.append(c.text(skip))
        return "".join(out)


class Tree(HTMLParser):
    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#document", {})
        self.decl = []
        self.feed(text)
        self.close()

    def handle_decl(self, decl):
        self.decl.append(decl)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        assert n is not None, f"</{tag}> closes nothing"
        assert n is self.cur, f"</{tag}> closes <{n.tag}> while <{self.cur.tag}> is open"
        self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(path: Path) -> Node:
    tree = Tree(path.read_text(encoding="utf-8"))
    assert tree.decl == ["DOCTYPE html"] and tree.cur is tree.root  # HTML5, every element closed
    return tree.root


def by_id(doc: Node) -> dict:
    ids = [n.attrs["id"] for n in doc.iter() if "id" in n.attrs]
    assert len(ids) == len(set(ids)), "duplicate ids"
    return {n.attrs["id"]: n for n in doc.iter() if "id" in n.attrs}


def resolve(page: Path, href: str) -> Path:
    return (page.parent / unquote(href)).resolve()


def markdown_rows(md: str) -> list[list[str]]:
    """The body rows of the first Markdown table in ``md``, cells unescaped."""
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    return [
        [md_plain(re.sub(r"<sup>(\d+)</sup>", r"\1", c)) for c in re.split(r" (?<!\\)\| ", ln[2:-2])]
        for ln in lines[2:]
    ]


def md_plain(cell: str) -> str:
    """The text a Markdown cell shows: backslash escapes and entities undone."""
    return html.unescape(re.sub(r"\\(.)", r"\1", cell))


def runs_tree(root: Path):
    for task in ("listops", "text"):
        for attn, acc in (("softmax", 0.37), ("nystrom", 0.38), ("performer", 0.18)):
            for seed in range(3):
                make_record(
                    root,
                    attn,
                    seed,
                    task=task,
                    test_acc=acc + 0.01 * seed,
                    preset=P,
                    time_per_1k_steps_s=150.0 + 10 * seed,
                )
    for seed in range(2):
        make_record(root, "softmax", seed, sub="train.lr=0.002", test_acc=0.35, preset=P)
    make_record(root, "softmax", 0, sub=SCRIPT, test_acc=0.3, preset=P)
    make_record(root, "performer", 3, status="failed", reason="OutOfMemoryError <b>boom</b>", test_acc=None, preset=P)
    (root / P / "paper" / "listops" / "bigbird" / "seed0" / ".hydra").mkdir(parents=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("page") / "runs"
    runs_tree(root)
    res = collect(root, compare=("skeinformer",), plots=False, style="full")  # Markdown as full as the page
    return root, res, res.out / "index.html"


def test_cells_equal_the_markdown_and_best_is_bold(page):
    """Value, interval and marks of every cell read as the Markdown table prints them."""
    _, res, html_path = page
    doc, ids = parse(html_path), by_id(parse(html_path))
    assert [k for p, k in res.tables] and all(p == P for p, _ in res.tables)
    for (preset, key), built in res.tables.items():
        section = ids[f"t-0-{key}"]
        assert section.find("h3").text() == render.title(built)
        table = section.find("table")
        page_rows = [
            [c.text().strip() for c in tr.children if isinstance(c, Node)] for tr in table.find("tbody").find_all("tr")
        ]
        md_rows = markdown_rows((res.out / preset / f"{key}.md").read_text())
        assert len(page_rows) == len(md_rows) == len(built.rows)
        for got, want in zip(page_rows, md_rows):
            assert got == [w.replace("**", "") for w in want], key
        for tr, want in zip(table.find("tbody").find_all("tr"), md_rows):
            tds = tr.find_all("td")
            assert [("best" in td.classes) for td in tds] == [w.startswith("**") for w in want[1:]], key
        # the marks carry their meaning (hover), and the table's legend explains them
        for row, tr in zip(built.rows, table.find("tbody").find_all("tr")):
            base = render.baseline_name(built, row)
            for cell, td in zip(row.cells, tr.find_all("td", cls="ours")):
                got = [(m.text(), m.attrs["title"]) for m in td.find_all("span", cls="mark")]
                assert got == render.marks(cell, base, paper=False)
            if built.compare:
                for cell, td in zip(row.cells, tr.find_all("td", cls="delta")):
                    got = [(m.text(), m.attrs["title"]) for m in td.find_all("span", cls="mark")]
                    assert got == render.marks(cell, base, standard=False)
        legend = section.find("ul", cls="legend")
        assert [li.text() for li in legend.find_all("li")] if legend else [] == render.legend(built)
        # the header holds the Markdown's column names, outer level over inner, "ours/paper/Δ" under each
        leaves = len(md_rows[0]) - 1
        span = sum(int(th.attrs.get("colspan", 1)) for th in table.find("thead").find("tr").find_all("th")[1:])
        assert span == leaves
    marks = {m.text() for m in doc.find_all("span", cls="mark")}
    assert {render.BASELINE_MARK, render.PAPER_MARK} <= marks  # the fixture has both kinds
    assert f"{len(res.runs)} run records read: {len(res.runs) - 1} finished" in doc.text()


def test_every_value_links_to_the_records_of_its_runs(page):
    root, res, html_path = page
    doc = parse(html_path)
    ids = by_id(doc)
    runs = res.runs
    ok = runs[runs["usable"] & runs["kept"]]
    checked = 0
    for (preset, key), built in res.tables.items():
        table = ids[f"t-0-{key}"].find("table")
        for row, tr in zip(built.rows, table.find("tbody").find_all("tr")):
            ours = tr.find_all("td", cls="ours")
            assert len(ours) == len(built.columns)
            for col, cell, td in zip(built.columns, row.cells, ours):
                links = td.find_all("a")
                if cell.empty:
                    assert not links
                    continue
                assert len(links) == 1 and links[0].attrs["href"].startswith("#")
                target = ids[links[0].attrs["href"][1:]]
                hrefs = [a.attrs["href"] for a in target.find_all("a")]
                files = [resolve(html_path, h) for h in hrefs]
                assert files and all(f.name == "result.json" and f.is_file() for f in files)
                got = sorted(f.parent.relative_to(root.resolve()).as_posix() for f in files)
                attn, _, variant = row.key.partition(" [")
                sel = ok[(ok["attn"] == attn) & (ok["variant"] == variant.rstrip("]"))]
                if col.task != "average":
                    sel = sel[sel["task"] == col.task]
                    assert got == sorted(sel["path"]), (key, row.key, col.task)
                else:
                    assert set(got) <= set(sel["path"])
                checked += 1
    assert checked > 50
    # the failed run is behind no cell
    assert "performer/seed3" not in "".join(a.attrs["href"] for a in ids["p-0"].find_all("a"))


def test_user_text_is_escaped(page):
    html_path = page[2]
    source = html_path.read_text()
    doc = parse(html_path)
    assert not doc.find_all("script") and not doc.find_all("b")  # best values are <strong>
    assert "<script>" not in source and "<b>boom" not in source
    names = {th.text() for th in doc.find_all("th", cls="model")}
    assert any(n.startswith("Standard [tag=<script>alert(1)</scr...]") for n in names)  # short label ...
    assert any(n.endswith(SCRIPT) for n in names)  # ... and the full text in the runs table
    assert "OutOfMemoryError <b>boom</b>" in by_id(doc)["failed"].text()
    # the run folder of that odd name is linked, percent-encoded, and resolves
    odd = [a.attrs["href"] for a in doc.find_all("a") if "alert" in a.attrs.get("href", "")]
    assert odd and all("<" not in h and resolve(html_path, h).is_file() for h in odd)


def test_failed_runs_and_problems_are_listed(page):
    root, res, html_path = page
    ids = by_id(parse(html_path))
    failed = ids["failed"]
    rows = failed.find("tbody").find_all("tr")
    assert len(rows) == 1 and "failed" in rows[0].text() and "OutOfMemoryError" in rows[0].text()
    link = rows[0].find("a")
    assert link.text() == f"{P}/paper/listops/performer/seed3"
    assert resolve(html_path, link.attrs["href"]) == (root / link.text() / "result.json").resolve()
    problems = ids["problems"].text()
    assert f"{P}/paper/listops/bigbird/seed0" in problems and "no_record" in problems
    issues = pd.read_csv(res.out / "issues.csv")
    assert len(ids["problems"].find("tbody").find_all("tr")) == len(issues)


def test_page_is_self_contained_and_byte_identical(tmp_path):
    root = tmp_path / "runs"
    runs_tree(root)
    res = collect(root, tmp_path / "out", compare=("skeinformer",), formats=("md",))
    html_path = tmp_path / "out" / "index.html"
    first = html_path.read_bytes()
    assert html_path in res.files
    doc = parse(html_path)
    for bad in ("script", "link", "iframe", "object", "embed", "base", "form", "audio", "video", "source"):
        assert not doc.find_all(bad), bad
    text = first.decode()
    assert not re.search(r"(?i)(https?:|ftp:|//[a-z0-9])", re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text))
    assert "@import" not in text and "url(" not in text
    for n in doc.iter():
        for attr in ("src", "href", "srcset", "poster", "action", "data"):
            v = n.attrs.get(attr)
            if v is None:
                continue
            if attr == "src":
                assert n.tag == "img" and v.startswith("data:image/png;base64,")
            else:
                assert attr == "href" and not re.match(r"^[a-z][a-z0-9+.-]*:", v, re.IGNORECASE), v
                assert v.startswith("#") or resolve(html_path, v).exists(), v  # relative, and there
    # every figure plot_preset wrote, inline as a valid PNG (the same bytes)
    pngs = {p.stem: p for p in res.files if p.suffix == ".png"}
    imgs = {img.attrs["alt"]: img for img in doc.find_all("img")}
    assert len(pngs) >= 3 and set(imgs) == set(pngs) and len(doc.find_all("img")) == len(pngs)
    for stem, img in imgs.items():
        data = base64.b64decode(img.attrs["src"].split(",", 1)[1], validate=True)
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and data == pngs[stem].read_bytes()
    # the same runs give the same bytes
    collect(root, tmp_path / "out", compare=("skeinformer",), formats=("md",))
    assert html_path.read_bytes() == first


def test_no_html_and_no_plots(tmp_path, capsys):
    root = tmp_path / "runs"
    make_record(root, "softmax", 0)
    collect(root, tmp_path / "a", html=False, plots=False)
    assert (tmp_path / "a" / "index.md").is_file() and not (tmp_path / "a" / "index.html").exists()
    assert main(["--runs", str(root), "--out", str(tmp_path / "b"), "--no-html", "--no-plots"]) == 0
    assert not (tmp_path / "b" / "index.html").exists() and (tmp_path / "b" / "runs.csv").is_file()
    assert main(["--runs", str(root), "--out", str(tmp_path / "c"), "--no-plots"]) == 0
    assert "start at " + str(tmp_path / "c" / "index.html") in capsys.readouterr().out
    doc = parse(tmp_path / "c" / "index.html")
    assert not doc.find_all("img") and doc.find_all("table", cls="paper-table")


def test_a_delta_is_coloured_better_by_the_metrics_direction_not_its_sign(tmp_path):
    """Fewer steps and less time than the paper are better (a negative Δ); more accuracy is better (a
    positive Δ). A page that coloured Δ by its sign alone would call the faster row worse."""
    root = tmp_path / "runs"
    for seed in range(3):  # Standard: more accurate, fewer steps, faster than the paper (38.15 %, 9k, 22 min)
        make_record(root, "softmax", seed, preset=P, test_acc=0.50 + 0.01 * seed, steps=3000 + 100 * seed,
                    time_per_1k_steps_s=600.0 + 10 * seed)  # fmt: skip
        # w/o dropout: less accurate, more steps, slower than the paper (its 6k steps, 20 min)
        make_record(root, "softmax_nodrop", seed, preset=P, test_acc=0.10 + 0.01 * seed, steps=30000 + 100 * seed,
                    time_per_1k_steps_s=3000.0 + 10 * seed)  # fmt: skip
    res = collect(root, compare=("skeinformer",), plots=False, style="full", formats=("md",))
    ids = by_id(parse(res.out / "index.html"))
    colours = {}
    for key, wanted in (("skeinformer_table1", ("acc",)), ("skeinformer_table2", ("steps_k", "min_per_1k"))):
        built = res.tables[(P, key)]
        table = ids[f"t-0-{key}"].find("tbody")
        for row, tr in zip(built.rows, table.find_all("tr")):
            for col, td in zip(built.columns, tr.find_all("td", cls="delta")):
                if col.task == "listops" and col.metric in wanted:
                    colours[(row.name, col.metric)] = td.classes & {"better", "worse"}
    assert colours == {
        ("Standard", "acc"): {"better"},
        ("Standard", "steps_k"): {"better"},  # Δ < 0: fewer steps than the paper
        ("Standard", "min_per_1k"): {"better"},  # Δ < 0: faster
        ("Standard w/o dropout", "acc"): {"worse"},
        ("Standard w/o dropout", "steps_k"): {"worse"},  # Δ > 0
        ("Standard w/o dropout", "min_per_1k"): {"worse"},
    }
