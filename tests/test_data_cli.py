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


# ------------------------------------------------------------------------------ issue 39: one line, before any work
QUICK_SMALL = ["task=listops", "attn=softmax", "preset=quick"] + [
    f"task.generator.{k}={v}" for k, v in (("n_train", 300), ("n_val", 10), ("n_test", 10))
]


def _train_ending(args):
    """What ``python -m lra.train <args>`` ends with before its run starts: (exit code, the one line)."""
    from lra import train

    try:
        train.check_before_run(args)
    except BaseException as e:  # as train.main() takes it
        end = train.ending(e)
        return end.code, end.line
    return 0, None


def test_a_read_only_data_root_under_lra_train_is_one_line_and_exit_2_before_generating(tmp_path, monkeypatch):
    """Bug caught (issue 39): the set was generated (minutes for the paper's) and only then written, where a
    read-only root ended in an OSError traceback. Simulated: the tests may run as root, whom modes do not stop."""
    import errno
    import os

    from lra.data import listops

    root, real_mkdir, drawn = tmp_path / "ro", os.mkdir, []

    def read_only(path, *a, **k):
        if str(path).startswith(str(root)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", read_only)
    monkeypatch.setattr(listops, "generate", lambda *a, **k: drawn.append(1))
    monkeypatch.setenv("LRA_DATA", str(root))
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    code, line = _train_ending(QUICK_SMALL)
    assert (code, drawn) == (2, [])
    assert line.startswith(f"error: cannot prepare the data under {root}: Read-only file system: {root}")
    assert line.endswith("make the data root a writable folder with free space, or set LRA_DATA (or data_root=) to one")


def test_a_task_path_too_long_for_the_system_is_one_line_not_an_os_error(tmp_path):
    """Bug caught (issue 39): ``task.path=<a name over 255 bytes>`` ended in "OSError: File name too long" from the
    reader's existence check. (Under lra.train the config's own check of task.path raises it first: lra/config.py.)"""
    import pytest

    from lra.config import ConfigError
    from lra.data import load_task

    node = {"name": "listops", "path": f"{tmp_path}/{'a' * 300}"}
    with pytest.raises(ConfigError) as e:
        load_task(node, tmp_path / "data")
    assert str(e.value).startswith("task.path ") and "(a name of 300 bytes in it, at most 255)" in str(e.value)
    assert len(str(e.value).splitlines()) == 1 and not (tmp_path / "data").exists()


def test_text_keeping_more_bytes_than_its_seq_len_is_one_line_before_reading(tmp_path):
    """Bug caught (issue 39): task.max_length above task.seq_len (Text, Retrieval) was a ValueError traceback
    from the byte encoder, after every review was read."""
    import pytest

    from lra.data import DataError, load_task
    from tests.test_data_text import cfg, write_acl

    write_acl(tmp_path)
    with pytest.raises(DataError) as e:
        load_task(cfg(max_length=100, seq_len=64), tmp_path)
    assert str(e.value).startswith("task.max_length=100 is more than task.seq_len=64: ")
    assert not (tmp_path / "cache").exists()
