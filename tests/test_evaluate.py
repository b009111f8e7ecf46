"""lra.evaluate: a saved run's checkpoint evaluated again gives the accuracy its record holds, writes its own
record under evals/ and nothing else; bad input is one line and exit code 2 (docs/evaluate.md)."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lra.evaluate import main
from tests.helpers import TINY, run_env, run_train


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A finished tiny quick run (its record tested best.ckpt), and the environment it ran in."""
    tmp = tmp_path_factory.mktemp("eval")
    run_train(tmp, *TINY, "task=listops", "attn=softmax")
    (folder,) = {p.parent for p in (tmp / "runs").rglob("result.json")}
    return folder, run_env(tmp)


@pytest.fixture
def run(tiny, monkeypatch):
    """:func:`tiny`, with this process in its environment (the in-process evaluations read its data root)."""
    for k in ("LRA_DATA", "LRA_RUNS"):
        monkeypatch.setenv(k, tiny[1][k])
    return tiny


def _files(folder: Path) -> dict:
    """Every file of the run but its evals/ (name -> sha256)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "evals" not in p.relative_to(folder).parts
    }


def _eval(folder_or_ckpt, *opts, env):
    return subprocess.run(
        [sys.executable, "-m", "lra.evaluate", str(folder_or_ckpt), *opts],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eval_of_a_run_folder_gives_its_recorded_test_acc_and_changes_none_of_its_files(run):
    folder, env = run
    rec = json.loads((folder / "result.json").read_text())
    assert rec["status"] == "completed" and rec["tested_ckpt"] == "best"
    before = _files(folder)
    assert {"result.json", "metrics.csv", "checkpoints/best.ckpt"} <= set(before)
    proc = _eval(folder, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((folder / "evals" / "test-best.json").read_text())
    assert out["acc"] == pytest.approx(rec["test_acc"], abs=1e-6)
    assert out["loss"] == pytest.approx(rec["test_loss"], rel=1e-5)
    assert out["count"] == rec["split_sizes"]["test"]
    assert out["split"] == "test" and out["ckpt"] == "checkpoints/best.ckpt"
    assert out["step"] == rec["steps_to_best"]
    assert out["data"]["id"] == rec["data"]["id"] and out["data_matches_run"] is True
    assert out["record_acc"] == rec["test_acc"]
    assert {"device", "git_commit", "time", "torch_version"} <= set(out)
    lines = proc.stdout.strip().splitlines()
    assert lines == [
        f"{folder}: test acc {rec['test_acc']:.4f} (loss {out['loss']:.4f}, {out['count']} examples) from "
        f"best.ckpt at step {out['step']}; the run's record says {rec['test_acc']:.4f}"
    ]
    assert _files(folder) == before  # the run's own files, byte for byte
    assert sorted(p.name for p in (folder / "evals").iterdir()) == ["test-best.json"]


def test_split_val_of_best_gives_the_best_val_acc_it_was_chosen_for(run, capsys):
    """best.ckpt is saved right after the validation that made it best (step steps_to_best): evaluating it on
    val again measures the same model on the same split, so it gives best_val_acc."""
    folder, _ = run
    rec = json.loads((folder / "result.json").read_text())
    main([str(folder), "split=val"])
    out = json.loads((folder / "evals" / "val-best.json").read_text())
    assert out["step"] == rec["steps_to_best"]
    assert out["acc"] == pytest.approx(rec["best_val_acc"], abs=1e-6)
    assert out["count"] == rec["split_sizes"]["val"]
    assert f"val acc {rec['best_val_acc']:.4f}" in capsys.readouterr().out


def test_a_checkpoint_file_works_as_well_as_its_folder(run, capsys):
    folder, _ = run
    rec = json.loads((folder / "result.json").read_text())
    main([str(folder / "checkpoints" / "best.ckpt"), "split=test"])
    out = json.loads((folder / "evals" / "test-best.json").read_text())
    assert out["acc"] == pytest.approx(rec["test_acc"], abs=1e-6)
    assert out["ckpt"] == "checkpoints/best.ckpt"
    assert capsys.readouterr().out.startswith(f"{folder}: test acc ")


def _bad(tmp_path, folder):
    loose = tmp_path / "loose.ckpt"
    loose.write_bytes((folder / "checkpoints" / "best.ckpt").read_bytes())
    return [
        ([str(tmp_path / "nope")], "no such run folder"),
        ([str(tmp_path)], "not a run folder"),
        ([str(folder), "split=train"], "a split is test or val"),
        ([str(folder), "ckpt=worst"], "a checkpoint is best or last"),
        ([str(folder), "ckpt=last"], "no checkpoint last.ckpt"),
        ([str(folder), "seed=1"], "give one run folder"),
        ([str(folder / "result.json")], "not a checkpoint"),
        ([str(loose)], "its run folder cannot be found"),
        ([str(folder / "checkpoints" / "best.ckpt"), "ckpt=last"], "names another checkpoint"),
    ]


def test_bad_input_is_one_line_exit_2_and_writes_nothing(run, tmp_path, capsys):
    folder, _ = run
    before = _files(folder) | {"evals": sorted(p.name for p in (folder / "evals").glob("*"))}
    for argv, says in _bad(tmp_path, folder):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err and "Traceback" not in err, (argv, err)
    assert _files(folder) | {"evals": sorted(p.name for p in (folder / "evals").glob("*"))} == before


def test_bad_input_from_the_command_line_is_one_line_without_a_traceback(run, tmp_path):
    folder, env = run
    proc = _eval(folder, "split=train", env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["lra.evaluate: error: split='train': a split is test or val"]


def test_a_folder_without_a_record_is_evaluated_from_its_overrides(run, tmp_path, capsys):
    """A run killed before its first record: .hydra/overrides.yaml composes the same run ($LRA_DATA: its data)."""
    import shutil

    folder, _ = run
    rec = json.loads((folder / "result.json").read_text())
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("result.json", "evals"))
    main([str(copy)])
    out = json.loads((copy / "evals" / "test-best.json").read_text())
    assert out["config_from"] == ".hydra/overrides.yaml" and out["record_acc"] is None
    assert out["acc"] == pytest.approx(rec["test_acc"], abs=1e-6)
    assert capsys.readouterr().out.rstrip().endswith("the run's record has no test acc of it")
