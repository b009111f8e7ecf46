"""The task registry: every task registers itself in its own module, with the typed spec it reads
(lra/tasks.py); the registry knows no task."""

import ast
import inspect

import numpy as np
import pytest

import lra.data
from lra import tasks
from lra.data import image, listops, pathfinder_gen, registry
from lra.tasks import TASK_SPECS, ImageSpec, ListOpsSpec


def test_each_task_is_registered_by_its_own_module():
    owners = {name: fn.__module__ for name, fn in registry.LOADERS.items()}
    assert owners == {
        "listops": "lra.data.listops",
        "text": "lra.data.text",
        "retrieval": "lra.data.retrieval",
        "pathfinder": "lra.data.pathfinder",
        "image": "lra.data.image",
    }
    assert lra.data.available_tasks() == sorted(owners)


def test_each_reader_declares_the_spec_the_config_checks():
    assert {name: fn.spec for name, fn in registry.LOADERS.items()} == TASK_SPECS


def test_the_specs_choices_are_the_readers_own():
    """The config layer cannot import the readers: the values it allows are checked against theirs here."""
    assert tasks.PATHFINDER_DIFFICULTIES == tuple(pathfinder_gen.DIFFICULTIES)
    assert set(pathfinder_gen.STYLES) < set(tasks.PATHFINDER_RESOLUTIONS)  # 256: official images only
    assert tuple(listops.VOCABS) == tasks.LISTOPS_TOKENIZERS and listops.GeneratorParams is tasks.ListOpsGenerator
    for method in tasks.GRAYSCALES:
        image.to_gray(np.zeros((1, 3), np.uint8), method)


def test_registry_imports_no_task_module():
    tree = ast.parse(inspect.getsource(registry))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    # provenance: the origin of a seeded subset (no task module either)
    assert {m for m in imported if m and m.startswith("lra.")} == {"lra.data.base", "lra.data.provenance", "lra.tasks"}


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_task("listops", spec=ListOpsSpec)(lambda spec, root: {})
    assert registry.LOADERS["listops"].__module__ == "lra.data.listops"


def test_a_reader_taking_another_spec_than_its_task_registers_is_refused():
    with pytest.raises(ValueError, match="the reader takes ImageSpec, but lra.tasks.TASK_SPECS registers ListOpsSpec"):
        registry.register_task("listops", spec=ImageSpec)
    with pytest.raises(ValueError, match="registers no spec for it"):
        registry.register_task("mnist", spec=ImageSpec)


def test_unknown_task_names_the_available_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'nope'; available: image, listops"):
        lra.data.load_task({"name": "nope"}, tmp_path)
