"""``python -m lra.data`` (make data): its command line goes through lra.cli.Parser, as every command's."""

import ast
import logging

from lra import REPO_ROOT
from lra.data import __main__ as data_main


def test_help_lists_usage_and_examples_and_exits_0(capsys):
    assert data_main.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m lra.data task=<task> [hydra overrides ...]   (make data task=<task>)")
    for needle in (
        "Prepare (generate, tokenise, cache) a task's data under the data root ($LRA_DATA or data/).",
        "python -m lra.data task=listops ",
        "python -m lra.data task=pathfinder preset=quick",
        "IMDB: says where to put aclImdb_v1.tar.gz",
    ):
        assert needle in out, needle


def test_an_unknown_flag_is_one_line_and_exit_2(capsys):
    assert data_main.main(["task=listops", "--bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--bogus" in err and "python -m lra.data --help lists the options" in err


def test_a_bad_task_key_is_one_line_naming_the_valid_keys_and_exit_2(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LRA_DATA", str(tmp_path))
    with caplog.at_level(logging.ERROR):
        assert data_main.main(["task=listops", "preset=quick", "+task.tokenzier=alnum"]) == 2
    assert "task.tokenzier='alnum' is not allowed: not a key of task; valid keys: dirname" in caplog.text
    assert not any(tmp_path.iterdir())  # refused before any work


def test_the_command_line_is_read_by_argparse_not_sys_argv():
    tree = ast.parse((REPO_ROOT / "lra" / "data" / "__main__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "argv"]


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_data_root_that_is_a_file_is_one_line_and_exit_2(tmp_path, monkeypatch, caplog):
    from lra.data.__main__ import main

    (tmp_path / "data").write_text("not a folder")
    monkeypatch.setenv("LRA_DATA", str(tmp_path / "data"))
    with caplog.at_level(logging.INFO):
        assert main(["task=listops", "preset=quick"]) == 2
    assert _errors(caplog) == [
        f"the data root {tmp_path / 'data'} is a file, not a folder: set LRA_DATA (or data_root=) to a folder"
    ]


def test_a_data_root_that_refuses_writes_is_one_line_and_exit_2(tmp_path, monkeypatch, caplog):
    """A read-only (or full) data root: the file system's refusal as one line naming the path, not a traceback.
    Simulated: the tests may run as root, whom a read-only folder does not stop."""
    from lra.data import listops
    from lra.data.__main__ import main

    def refused(target, *a, **k):
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(listops, "write_dataset", refused)
    monkeypatch.setenv("LRA_DATA", str(tmp_path))
    with caplog.at_level(logging.INFO):
        assert main(["task=listops", "preset=quick"]) == 2
    (line,) = _errors(caplog)
    assert line.startswith(f"cannot prepare the data under {tmp_path}: Permission denied: {tmp_path}/generated/")
