"""Does a clean ``pip install`` of this checkout resolve only releases inside pyproject.toml's ranges?

    python tools/check_install.py            # the core and '.[dev]'   (make check-install)

Makes a throw-away virtual environment, asks pip what it would install (``--dry-run --report``, nothing
is installed, wheels are only fetched for their metadata) and checks every resolved distribution that
pyproject.toml names against its declared range. Needs the package index; exit 1 if one lies outside.
docs/dependencies.md says why the ranges are what they are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def declared_ranges() -> dict:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    return {
        canonicalize_name(r.name): r.specifier
        for reqs in groups.values()
        for r in map(Requirement, reqs)
        if canonicalize_name(r.name) != canonicalize_name(project["name"])
    }


def resolve(pip: Path, target: str, report: Path) -> dict[str, str]:
    proc = subprocess.run(
        [str(pip), "install", "-q", "--dry-run", "--ignore-installed", "--report", str(report), target],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"pip could not resolve {target}:\n{proc.stderr[-3000:]}")
    return {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }


def main() -> int:
    ranges, outside = declared_ranges(), []
    with tempfile.TemporaryDirectory(prefix="lra-check-install-") as tmp:
        venv.create(tmp, with_pip=True)
        pip = Path(tmp) / "bin" / "pip"
        for target in (".", ".[dev]"):
            got = resolve(pip, target, Path(tmp) / "report.json")
            named = {n: v for n, v in sorted(got.items()) if n in ranges}
            bad = [
                f"{n} {v} (declared {ranges[n]})"
                for n, v in named.items()
                if not ranges[n].contains(Version(v), prereleases=True)
            ]
            outside += bad
            print(
                f"pip install {target}: {len(got)} distributions, {len(named)} named by pyproject.toml, "
                f"{len(bad)} outside the declared range"
            )
            for n, v in named.items():
                print(f"  {n:28s} {v:16s} {ranges[n]}")
    if outside:
        print("outside the declared range: " + "; ".join(outside), file=sys.stderr)
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
