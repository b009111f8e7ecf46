"""The design contracts of lra/ (docs/design.md): imports point one way, no cycles, an entry point a
newcomer reads in one screen."""

import ast
from pathlib import Path

import pytest

from lra import REPO_ROOT

LAYERS = [
    "lra.config",
    "lra.model",
    "lra.fit",
    "lra.module",
    "lra.loop",
    "lra.train",
]  # each may import only those before it


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every lra module -> the lra modules it imports, at top level or inside functions."""
    modules = {_module_name(p): p for p in (REPO_ROOT / "lra").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            # a submodule importing from its own package (``from lra.data import listops`` in lra.data.x) is not
            # a dependency on the package's __init__ worth a cycle: Python initialises packages first
            found |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
        graph[name] = found
    return graph


def _cycle(graph):
    state = {}

    def visit(n, path):
        state[n] = "open"
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                return path + [n, m]
            if m not in state and (c := visit(m, path + [n])):
                return c
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n, [])):
            return c
    return None


def test_no_import_cycle_among_lra_modules():
    graph = _imports()
    assert len(graph) > 20
    cycle = _cycle({n: {m for m in deps if m != "lra"} for n, deps in graph.items()})
    assert cycle is None, " -> ".join(cycle)


def test_layers_import_one_way():
    graph = _imports()
    for i, name in enumerate(LAYERS):
        later = set(LAYERS[i + 1 :])
        assert not graph[name] & later, f"{name} imports {sorted(graph[name] & later)}, a later layer"
    for name, deps in graph.items():
        if name != "lra.train":
            assert "lra.train" not in deps, f"{name} imports the entry point"


@pytest.mark.parametrize("path,limit", [("lra/train.py", 60)])
def test_entry_point_functions_are_short(path, limit):
    tree = ast.parse((REPO_ROOT / path).read_text())
    lengths = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    longest = max(lengths, key=lengths.get)
    assert lengths[longest] <= limit, f"{path}:{longest} has {lengths[longest]} lines"
    assert lengths["run"] <= 50


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _under(names: set[str], *packages: str) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in packages))


# What sits above a run: the tools that launch runs or read their records. A run imports none of them.
ABOVE_THE_RUN = ("lra.tools",)


def test_the_library_never_imports_the_tools():
    """The run library (every lra module outside lra.tools) imports nothing of lra.tools, directly or not: a
    reader of the library reads only the run."""
    graph = _imports()
    library = [n for n in graph if not _under({n}, "lra.tools")]
    assert len(library) > 20
    found = {n: _under(_closure(graph, n) | graph[n], "lra.tools") for n in library}
    assert {n: f for n, f in found.items() if f} == {}


def test_a_run_knows_nothing_of_sweeps_or_results():
    """Everything ``python -m lra.train`` imports, directly or not: no sweep (a trial's pruning and a shared GPU's
    memory cap reach the run as a callback and a setting), no collector, no tool."""
    graph = _imports()
    found = _under(_closure(graph, "lra.train"), *ABOVE_THE_RUN)
    assert found == [], f"lra.train imports {found}"


def test_the_config_imports_no_data_package():
    """The config layer resolves and checks a run (task specs included) without the data readers."""
    found = _under(_closure(_imports(), "lra.config") | {"lra.config"}, "lra.data")
    assert found == [], f"lra.config imports {found}"


def test_results_import_one_way():
    """The collector draws with its plots; the plots and tables never import the collector's entry."""
    graph = _imports()
    for name in _under(set(graph), "lra.tools.collect"):
        if name != "lra.tools.collect":
            assert "lra.tools.collect" not in graph[name], f"{name} imports the collector's entry lra.tools.collect"
    assert not _under(
        _closure(graph, "lra.tools.collect"), "lra.tools.sweep", "lra.train", "lra.loop", "lra.tools.doctor"
    )


MAX_LINES = 600  # lines as ruff formats them (a long call is one argument per line)


def test_no_module_is_a_house_of_many_rooms():
    """No file in lra/ over MAX_LINES lines: one that grows past it holds more than one job (docs/architecture.md)."""
    sizes = {str(p.relative_to(REPO_ROOT)): len(p.read_text().splitlines()) for p in (REPO_ROOT / "lra").rglob("*.py")}
    assert sizes and {p: n for p, n in sizes.items() if n > MAX_LINES} == {}


RUN_LIBRARY_BUDGET = 10_350  # lines of lra/ less lra/tools/ (what a run imports); lower it as cuts land


def test_the_run_library_keeps_within_its_line_budget():
    """The run library (lra/ less lra/tools/) stays within RUN_LIBRARY_BUDGET lines: adding to it means taking
    something out (or lowering the budget when a cut lands; never raising it to fit an addition)."""
    files = [p for p in (REPO_ROOT / "lra").rglob("*.py") if "tools" not in p.relative_to(REPO_ROOT / "lra").parts]
    total = sum(len(p.read_text().splitlines()) for p in files)
    assert files and total <= RUN_LIBRARY_BUDGET, f"the run library has {total} lines, its budget {RUN_LIBRARY_BUDGET}"


def test_only_lra_cli_reads_the_command_line():
    """sys.argv is read (or set, for Hydra) in lra/cli.py alone: every command parses through it."""
    offenders = []
    for path in (REPO_ROOT / "lra").rglob("*.py"):
        if path.relative_to(REPO_ROOT).as_posix() == "lra/cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "argv" and getattr(node.value, "id", None) == "sys":
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert offenders == []
