"""lra.evaluate: a saved run's checkpoint evaluated again gives the accuracy its record holds, writes its own
record under evals/ and nothing else; bad input is one line and exit code 2 (docs/evaluate.md)."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    assert out["data"]["id"] == rec["data"]["id"]
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


def _case(folder: Path, copy: Path, edit=None) -> Path:
    """The tiny run copied to ``copy`` (without its evals/), ``edit(record, copy)`` applied to its record."""
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("evals"))
    rec = json.loads((copy / "result.json").read_text())
    (edit or (lambda r, c: None))(rec, copy)
    (copy / "result.json").write_text(json.dumps(rec))
    return copy


def _config(**nodes):
    """An edit of the record's config: its top-level ``nodes`` replaced, or updated where a dict updates one."""
    return lambda r, c: [
        r["config"][k].update(v) if isinstance(v, dict) and k in r["config"] else r["config"].update({k: v})
        for k, v in nodes.items()
    ]


def _step(rec, copy):  # a checkpoint whose optimizer step is no number
    saved = torch.load(copy / "checkpoints" / "best.ckpt", weights_only=True)
    torch.save({**saved, "global_step": "abc"}, copy / "checkpoints" / "best.ckpt")


def _bad(tmp_path, folder):
    loose = tmp_path / "loose.ckpt"
    loose.write_bytes((folder / "checkpoints" / "best.ckpt").read_bytes())
    (tmp_path / "outside").mkdir()
    no_record = _case(folder, tmp_path / "no_record")
    (no_record / "result.json").unlink()  # only its .hydra/overrides.yaml says what ran

    def c(name, edit):  # the run copied, its record (or files) edited
        return str(_case(folder, tmp_path / name, edit))

    return [
        ([str(tmp_path / "nope")], "no such run folder"),
        ([str(tmp_path)], "not a run folder"),
        ([str(folder), "split=train"], "a split is test or val"),
        ([str(folder), "ckpt=worst"], "a checkpoint is best or last"),
        ([str(folder), "ckpt=last"], "evaluate best.ckpt instead"),
        ([str(folder), "seed=1"], "give one run folder"),
        ([str(folder / "result.json")], "not a checkpoint"),
        ([str(loose)], "its run folder cannot be found"),
        ([str(folder / "checkpoints" / "best.ckpt"), "ckpt=last"], "names another checkpoint"),
        ([str(no_record)], "no result.json"),
        # another run's best.ckpt (run seed 0's, in the folder of a run seed 1): its resume key is not this run's
        ([c("other_run", _config(seed=1))], "is not the checkpoint of this run"),
        ([c("model_target", _config(model={"_target_": "evilmod_eval.M"}))], "add model._target_=evilmod_eval.M"),
        ([str(folder), "attn.target=evilmod_eval:X"], "the run's record names no such code"),
        ([c("micro_batch", lambda r, _: r.update(micro_batch="abc"))], "micro_batch='abc'"),
        ([c("data", lambda r, _: r.update(data="x"))], "data='x'"),
        ([c("interpolation", _config(attn={"label": "${oc.env:HOME}"}))], "attn.label='${oc.env:HOME}'"),
        ([c("dirname", _config(task={"dirname": "../../escaped"}))], "task.dirname='../../escaped'"),
        ([c("evals_link", lambda r, d: (d / "evals").symlink_to(tmp_path / "outside"))], "evals is a link"),
        ([c("step", _step)], "global_step"),
    ]


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
    return err


def test_bad_input_is_one_line_exit_2_and_writes_nothing(run, tmp_path, capsys):
    folder, _ = run
    before = _files(folder) | {"evals": sorted(p.name for p in (folder / "evals").glob("*"))}
    for argv, says in _bad(tmp_path, folder):
        err = _refused(argv, capsys)
        assert says in err, (argv, err)
    assert _files(folder) | {"evals": sorted(p.name for p in (folder / "evals").glob("*"))} == before
    assert not list(tmp_path.glob("*/evals/*")) and not list((tmp_path / "outside").iterdir())


def test_bad_input_from_the_command_line_is_one_line_without_a_traceback(run, tmp_path):
    folder, env = run
    proc = _eval(folder, "split=train", env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["lra.evaluate: error: split='train': a split is test or val"]


def test_code_a_record_names_is_imported_only_when_this_command_line_names_it(run, tmp_path, capsys, monkeypatch):
    """A received runs folder whose record says attn.target=evilmod_eval:X, the module beside it (on the path, as
    `python -m` puts the working folder first): evaluating it imports nothing until the user names the same
    target on the command line."""
    folder, _ = run
    copy = _case(folder, tmp_path / "copy", _config(attn={"name": "external", "target": "evilmod_eval:X"}))
    (tmp_path / "evilmod_eval.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for argv in ([str(copy)], [str(copy), "attn.target=evilmod_eval:Y"]):
        assert "add attn.target=evilmod_eval:X to this command line to allow it" in _refused(argv, capsys)
    assert not (tmp_path / "ran").exists() and "evilmod_eval" not in sys.modules
    err = _refused([str(copy), "attn.target=evilmod_eval:X"], capsys)  # the user's choice: imported
    assert (tmp_path / "ran").exists() and "attn.target='evilmod_eval:X' cannot be imported" in err
    sys.modules.pop("evilmod_eval", None)


def test_the_accuracy_is_printed_before_it_is_saved_and_a_field_it_cannot_compare_is_a_note(run, tmp_path, capsys):
    """A record whose test_acc is no number, in a run folder whose evals/ cannot be written (a file there): the
    accuracy is printed, the record's field is noted as not compared, and one line says it was not saved."""
    folder, _ = run
    copy = _case(folder, tmp_path / "copy", lambda r, c: (r.update(test_acc="abc"), (c / "evals").write_text("")))
    with pytest.raises(SystemExit) as e:
        main([str(copy)])
    out, err = capsys.readouterr()
    assert e.value.code == 1
    assert out.startswith(f"{copy}: test acc 0.") and out.rstrip().endswith(
        "the run's record's test_acc 'abc' is not a number: not compared"
    )
    assert err.strip().splitlines() == [
        f"lra.evaluate: error: the accuracy above was not saved: {copy / 'evals' / 'test-best.json'} cannot be "
        f"written ([Errno 17] File exists: '{copy / 'evals'}')"
    ]


def test_a_checkpoint_is_compared_only_with_the_accuracy_the_record_measured_of_it(run, tmp_path, capsys):
    """A run that tested the model at stop (test_ckpt: last, step 12) and keeps a last.ckpt of step 5: its
    record's test_acc is neither that checkpoint's nor best.ckpt's, so there is nothing to compare with."""
    folder, _ = run

    def tested_last(rec, copy):
        rec["tested_ckpt"] = "last"  # as train.test_ckpt=last records it (the key keeps the run's: best)
        shutil.copy(copy / "checkpoints" / "best.ckpt", copy / "checkpoints" / "last.ckpt")

    copy = _case(folder, tmp_path / "copy", tested_last)
    for name in ("last", "best"):
        main([str(copy), f"ckpt={name}"])
        assert json.loads((copy / "evals" / f"test-{name}.json").read_text())["record_acc"] is None
        said = capsys.readouterr().out.rstrip()
        assert said.endswith(f"the run's record has no test acc of {name}.ckpt at step 5: nothing to compare with")


def test_a_run_from_another_machine_is_evaluated_with_this_machines_data_root_and_its_own_key(
    run, tmp_path, monkeypatch
):
    """A record naming a data root elsewhere, a logger and a callback, from a machine where trainer.devices=auto
    counted 1 device (here: 2): the data is read from the user's data root (no $LRA_DATA: the default, <repo>/data,
    here the run's data), nothing is written elsewhere, neither node is built (evaluating builds no logger nor
    callback), and the resume key takes the devices the run had."""
    folder, env = run
    monkeypatch.delenv("LRA_DATA")
    monkeypatch.setattr("lra.files.REPO_ROOT", tmp_path)
    monkeypatch.setattr("lra.config.device_count", lambda devices: 2)
    (tmp_path / "data").symlink_to(env["LRA_DATA"])
    rec = json.loads((folder / "result.json").read_text())
    (tmp_path / "elsewhere").mkdir()
    nodes = dict(
        data_root=str(tmp_path / "elsewhere"),
        logger={"wandb": {"_target_": "lra.loggers.wandb_logger"}},
        callbacks={"mine": {"_target_": "evilmod_eval.Callback"}},
        trainer={"devices": "auto"},
    )
    copy = _case(folder, tmp_path / "copy", _config(**nodes))
    main([str(copy)])
    out = json.loads((copy / "evals" / "test-best.json").read_text())
    assert out["acc"] == pytest.approx(rec["test_acc"], abs=1e-6) and out["data_root"] == str(tmp_path / "data")
    assert not list((tmp_path / "elsewhere").iterdir()) and "evilmod_eval" not in sys.modules
