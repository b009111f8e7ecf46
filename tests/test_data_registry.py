"""The task registry: every task registers itself in its own module; the registry knows no task."""

import ast
import inspect

import pytest

import lra.data
from lra.data import registry


def test_each_task_is_registered_by_its_own_module():
    owners = {name: fn.__module__ for name, fn in registry.LOADERS.items()}
    assert owners == {"listops": "lra.data.listops", "text": "lra.data.text", "retrieval": "lra.data.retrieval",
                      "pathfinder": "lra.data.pathfinder", "image": "lra.data.image"}
    assert lra.data.available_tasks() == sorted(owners)


def test_registry_imports_no_task_module():
    tree = ast.parse(inspect.getsource(registry))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.startswith("lra.")} == {"lra.data.base"}


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_task("listops")(lambda cfg, root: {})
    assert registry.LOADERS["listops"].__module__ == "lra.data.listops"


def test_unknown_task_names_the_available_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'nope'; available: image, listops"):
        lra.data.load_task({"name": "nope"}, tmp_path)
