"""The repository cites only what a reader of it can follow.

A citation may name a doc this repository contains (``docs/<name>.md``, with ``§n`` only for a
numbered section that doc has), a paper (title, table, page) or a public URL. No text file may hold
an absolute local path (a home or work directory), point into the machine's shared folder
(``shared/docs``, ``shared/papers``, ``shared/data``), or cite the notes the harness was first built
from, which the repository does not contain (their content now lives in docs/facts.md and
docs/design.md). Every text file git knows of (tracked, or new and not ignored) is checked.
"""

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The names are split so this file does not match its own patterns.
RULES = [
    (
        "absolute local path",  # a home or work directory; /tmp/out, /dev/null pass
        re.compile(r"(?<![\w.:/~-])/(?:work|home|Users|root)/"),
    ),
    ("document in a temporary folder", re.compile(r"(?<![\w.:/~-])/tmp/\S*\.(?:md|txt|pdf|rst)\b")),
    ("path into the shared folder", re.compile(r"(?<![\w-])" + "shared" + r"/(?:docs|papers|data)\b")),
    (
        "cites notes the repository does not contain",
        re.compile(
            "|".join(
                [
                    "LRA_" + "FACTS",
                    "GPU_" + "NOTES",
                    "seed" + "_code",
                    r"(?<![\w/])" + "DES" + r"IGN\.md",  # docs/design.md (lower case) is the in-tree one
                    r"(?<![\w-])" + "research" + r"/[\w.-]+\.md",  # the research notes
                    r"\b" + "peers" + r"(?:\.md|\s§)",
                ]
            )
        ),
    ),
]
DOC_CITATION = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)((?:\s*(?:,|;|/|and|or)?\s*§\s?\d+(?:\.\d+)*)*)")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)


def text_files() -> list[Path]:
    """Every file git knows of (tracked, or new and not ignored), but this one: it spells out the rules."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing to list")
    files = []
    for name in sorted(set(out.decode().split("\0")) - {""}):
        path = ROOT / name
        if path.is_file() and not path.is_symlink() and path != Path(__file__).resolve():
            files.append(path)
    return files


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@lru_cache(maxsize=None)
def sections(doc: str) -> frozenset:
    """The numbered sections of docs/<doc> (``## 3. ...`` -> "3", ``### 3.2 ...`` -> "3.2")."""
    return frozenset(HEADING.findall((ROOT / "docs" / doc).read_text(encoding="utf-8")))


def problems(rel: str, text: str) -> list[str]:
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{lineno}"
        for reason, pattern in RULES:
            for m in pattern.finditer(line):
                found.append(f"{where}: {reason}: {m.group(0)!r}")
        for m in DOC_CITATION.finditer(line):
            doc = m.group(1)
            if not (ROOT / "docs" / doc).is_file():
                found.append(f"{where}: cites docs/{doc}, which does not exist")
                continue
            for sec in SECTION.findall(m.group(2)):
                if sec not in sections(doc):
                    found.append(f"{where}: cites docs/{doc} §{sec}, a section it does not have")
    return found


def test_rules_catch_what_they_should_and_nothing_else():
    bad = [
        "see /work/" + "shared/docs/x.md",
        'Path("/home/me/notes")',
        "(" + "shared" + "/docs/GPU.md)",
        "LRA_" + "FACTS §3",
        "research" + "/data.md Q2b",
        "peers" + " §5.4",
        "DES" + "IGN.md",
        "docs/nosuch.md",
        "docs/facts.md §99",
        "docs/facts.md §3, §42",
        "/tmp/notes.md",
    ]
    for line in bad:
        assert problems("x", line), line
    good = [
        "--out /tmp/tables",
        "> /dev/null",
        "!/data/README.md",
        "--runs /scratch/runs",
        "https://github.com/pkuzengqi/Skeinformer/blob/main/README.md",
        "docs/facts.md §3 and docs/design.md",
        "docs/facts.md §6.2, §6.3",
        "LRA_DATA=/shared/lra/data",
        "https://huggingface.co/docs/transformers/model_doc/yoso",
        "google-research/long-range-arena",
    ]
    for line in good:
        assert problems("x", line) == [], line


def test_no_file_cites_what_the_repository_does_not_contain():
    found = []
    for path in text_files():
        text = read_text(path)
        if text is not None:
            found += problems(path.relative_to(ROOT).as_posix(), text)
    assert not found, f"{len(found)} citation(s) a reader cannot follow:\n" + "\n".join(found)
