"""Issue 27, rows people can read: a run's display name (``name=``) is a label on its record, not a setting
(neither in the run folder nor in the resume key), checked like every value, and kept by a finished run.
(A search trial's ``search`` field: tests/test_optuna.py; one external class, one ``attn``:
tests/test_external_attention.py.)"""

import json

import pytest

from lra.config import ConfigError, load
from lra.hydra_glue import Composer
from lra.naming import run_tag
from lra.record import new_record
from tests.helpers import TINY


def test_name_changes_neither_the_run_folder_nor_the_resume_key():
    """Bug caught: name= entering the folder's tag (a renamed command would retrain in a new folder instead
    of finding its finished run) or the resume key (a run resumed under a name refusing its checkpoint)."""
    plain, named = load(TINY), load([*TINY, "name=my variant"])
    assert (plain.name, named.name) == (None, "my variant")
    assert run_tag([*TINY, "train.lr=0.002", "name=x"]) == run_tag([*TINY, "train.lr=0.002"])
    assert "name" not in run_tag([*TINY, "name=x"])
    assert named.resume_key(8, 4, "data") == plain.resume_key(8, 4, "data")
    with Composer() as c:  # a bare `python -m lra.train -m` names folders by hydra's override_dirname
        primary = c.primary(TINY)
        assert c.job(primary, [*TINY, "name=x"])[1] == c.job(primary, TINY)[1]
    assert (new_record(named)["name"], new_record(plain)["name"]) == ("my variant", None)
    assert new_record(plain)["search"] is None  # a plain run is no search trial


@pytest.mark.parametrize("bad", ["a/b", "x" * 41, "2", "true", "{a: 1}"])
def test_a_bad_name_is_refused_naming_the_key_and_what_is_allowed(bad):
    """Bug caught: a name a table or file cannot hold (a slash, a paragraph, a number Hydra read as one)
    reaching the record unchecked."""
    with pytest.raises(ConfigError, match=r"^name=.* is not allowed: 1-40 letters, digits, spaces and -_\.\+"):
        load([*TINY, f"name={bad}"])


def test_a_bad_name_is_one_line_exit_2_and_no_folder(quick_run, tmp_path):
    """Bug caught: a bad name found only after Hydra made the run folder, or as a traceback."""
    proc = quick_run("name=a/b", check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: name='a/b' is not allowed: 1-40 letters")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # 20-30 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_a_finished_run_is_relabelled_without_retraining(quick_run, tmp_path):
    """Bug caught: the same run under another name retrained (the name in its folder), or the new name not
    applied, so relabelling a row cost a retrain (force=true)."""
    quick_run("trainer.progress=false", "name=first")
    (path,) = (tmp_path / "runs").rglob("result.json")
    rec = json.loads(path.read_text())
    assert path.parent.relative_to(tmp_path / "runs").parts[:5] == ("quick", "clean", "listops", "softmax", "seed0")
    assert path.parent.name == run_tag(TINY) and "first" not in str(path)
    assert rec["status"] == "completed" and rec["name"] == "first" and rec["search"] is None
    again = quick_run("trainer.progress=false", "name=second")
    out = again.stdout + again.stderr
    assert "already holds a finished run" in out
    assert "relabelled name='second' (was 'first'), its training untouched" in out
    assert json.loads(path.read_text()) == {**rec, "name": "second"}
