"""The cases of the second reliability pass (issue 19) that live in the run's entry, config and collector,
one test per case, named after it: one configuration has one folder, values that cannot run are one line
before anything is written, the record's precision is what ran, and every exit code tells the truth."""

import json
import os
import subprocess
import sys

import pytest

from lra.config import ConfigError, load
from lra.data import DataError
from lra.naming import run_folder, run_tag
from tests.helpers import TINY

T = [*TINY, "trainer.progress=false"]


def _roots(tmp_path):
    return [f"data_root={tmp_path / 'data'}", f"runs_root={tmp_path / 'runs'}"]


@pytest.mark.parametrize(
    "spelling",
    [
        ["train.lr=1e-3"],
        ["train.lr=0.001"],
        ["trainer.progress=true"],
        # how a run executes or logs, not what it computes (lra.tags.UNTAGGED): the same folder, so a resume finds it
        ["train.compile=true"],
        ["train.ckpt_every_steps=7"],
        ["trainer.num_workers=2", "trainer.log_every_n_steps=3"],
        ["hardware.micro_batch=8"],
        ["logger=[csv,tensorboard]"],
    ],
)
def test_equal_configurations_share_one_folder_whatever_their_spelling(spelling):
    # the quick preset's lr is 1e-3: spelled any way, it is the same run
    assert (
        run_tag(T + spelling)
        == run_tag(T)
        == (
            "task.generator.n_test=64,task.generator.n_train=256,task.generator.n_val=64,train.eval_every=5,"
            "train.max_steps=12"
        )
    )


@pytest.mark.parametrize(
    "change",
    [
        ["train.lr=0.002"],
        ["model.pooling=padded_mean"],
        ["attn=skeinformer", "attn.options.num_features=31"],
        ["train.schedule=onecycle", "train.warmup=3"],
        ["trainer.precision=bf16-mixed"],
    ],
)
def test_different_configurations_never_share_a_folder(change):
    base, other = T + [c for c in change if c.startswith("attn=")], T + change
    assert run_tag(other) != run_tag(base)
    key, value = change[-1].split("=", 1)
    assert f"{key}={value}" in run_tag(other)


def test_run_folder_is_the_preset_levels_then_the_canonical_tag(tmp_path):
    spec = load(T + _roots(tmp_path) + ["seed=3", "train.lr=2e-3"])
    folder = run_folder(spec, run_tag(T + ["seed=3", "train.lr=2e-3"]))
    assert folder.relative_to(tmp_path / "runs").parts[:5] == ("quick", "clean", "listops", "softmax", "seed3")
    assert "train.lr=0.002" in folder.name and "seed" not in folder.name


def test_batch_larger_than_the_training_split_is_one_line_before_any_run_folder(tmp_path):
    from lra.train import check_before_run

    with pytest.raises(ConfigError) as e:
        check_before_run(T + _roots(tmp_path) + ["train.batch_size=1000000000"])
    assert str(e.value) == (
        "train.batch_size=1000000000 is larger than the 256 training examples of listops: set "
        "train.batch_size to at most 256"
    )
    assert not list((tmp_path / "runs").iterdir())  # the data was prepared; no run folder was made


def test_missing_data_is_found_before_any_run_folder(tmp_path):
    from lra.train import check_before_run

    with pytest.raises(DataError):
        check_before_run(["preset=quick", "task=text"] + _roots(tmp_path))
    assert not list((tmp_path / "runs").iterdir())


def test_16_mixed_on_a_cpu_is_recorded_as_the_bf16_it_runs():
    spec = load(["preset=quick", "trainer.accelerator=cpu", "trainer.precision=16-mixed"])
    assert spec.hardware.precision == "bf16-mixed" and spec.hardware.precision_setting == "16-mixed"
    assert load(["preset=quick", "trainer.accelerator=cpu"]).hardware.precision == "32-true"


def test_ctrl_c_before_the_run_starts_is_one_line(monkeypatch, capsys):
    import lra.train

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(lra.train, "check_before_run", interrupted)
    monkeypatch.setattr(sys, "argv", ["lra.train", "preset=quick"])
    with pytest.raises(SystemExit) as e:
        lra.train.main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 130 and err.startswith("interrupted (SIGINT) before the run started") and "\n" not in err


@pytest.mark.slow  # ~19 s of a subprocess run: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_failed_run_exits_1_with_one_line_and_a_failed_record(tmp_path):
    env = {
        **os.environ,
        "LRA_DATA": str(tmp_path / "data"),
        "LRA_RUNS": str(tmp_path / "runs"),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lra.train",
            *T,
            "train.lr=1e10",
            "train.max_steps=6",
            "hardware=cpu",
            "train.eval_every=3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    rec = json.loads(next((tmp_path / "runs").rglob("result.json")).read_text())
    out = proc.stdout + proc.stderr
    assert rec["status"] == "failed" and proc.returncode == 1, out[-3000:]
    assert "the run failed:" in out and "Traceback" not in out


def test_collect_into_a_read_only_root_is_one_line(tmp_path, monkeypatch, capsys):
    from lra.tools import collect

    (tmp_path / "runs").mkdir()
    real = os.access
    monkeypatch.setattr(
        collect.os, "access", lambda p, mode: False if str(p) == str(tmp_path / "runs") else real(p, mode)
    )
    assert collect.main(["--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot be written; pass --out DIR" in err and "\n" not in err
    assert not (tmp_path / "runs" / "tables").exists()


def test_collect_that_cannot_write_midway_is_one_line(tmp_path, monkeypatch, capsys):
    from lra.tools import collect

    (tmp_path / "runs").mkdir()

    def read_only(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(collect, "write_text", read_only)
    assert collect.main(["--runs", str(tmp_path / "runs"), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot write into" in err and "Read-only file system" in err and "\n" not in err


# --- the fourth pass (issue 39): a runs folder stays data, a record the harness cannot read is never trained over


@pytest.mark.parametrize("label", ["../../../../tmp/x", "a/b", "..", ".hidden", "x" * 65, "two words"])
def test_a_label_is_a_label_never_a_path(label):
    # attn.label=../../x wrote the run outside the runs root, and force=true deleted <there>/checkpoints
    with pytest.raises(ConfigError) as e:
        load([*T, f"attn.label={label}"])
    assert str(e.value).startswith("attn.label=") and "letters, digits" in str(e.value)


def test_labels_the_harness_ships_are_still_labels():
    assert load([*T, "attn=softmax_nodrop"]).attn.label == "softmax_nodrop"
    assert load([*T, "attn.label=mine-2.b+c"]).attn.label == "mine-2.b+c"


def test_a_run_folder_outside_the_runs_root_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from lra.train import check_before_run

    monkeypatch.setattr("lra.train.checked_splits", lambda *a: pytest.fail("the data was read"))
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(ConfigError) as e:
        check_before_run([*T, *_roots(tmp_path), f"hydra.run.dir={elsewhere}"])
    assert "outside runs_root" in str(e.value) and not elsewhere.exists()


def _folder_with_record(tmp_path, record) -> tuple[list, object]:
    args = [*T, *_roots(tmp_path)]
    run_dir = run_folder(load(args), run_tag(args))
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "best.ckpt").write_bytes(b"weights")
    (run_dir / "result.json").write_text(record if isinstance(record, str) else json.dumps(record))
    return args, run_dir


@pytest.mark.parametrize(
    "record",
    [
        {"status": "COMPLETED", "task": "listops", "attn": "softmax", "seed": 0, "test_acc": 0.4},
        {"task": "listops", "attn": "softmax", "seed": 0},  # no status at all
        {"status": "completed", "task": "text", "attn": "softmax", "seed": 0},  # another run's record
        "{not json",
    ],
    ids=["unknown status", "no status", "foreign", "unreadable"],
)
def test_a_record_the_harness_cannot_read_is_never_trained_over(tmp_path, monkeypatch, record):
    """A status this version does not know (a later version's) used to be retrained from scratch, replacing
    best.ckpt and result.json. Now: one line, exit 2, before the data is read; force=true still replaces it."""
    from lra.protocol import RunError
    from lra.train import check_before_run

    args, run_dir = _folder_with_record(tmp_path, record)
    before = (run_dir / "result.json").read_text()
    monkeypatch.setattr("lra.train.checked_splits", lambda *a: pytest.fail("the data was read"))
    with pytest.raises(RunError) as e:
        check_before_run(args)
    assert "force=true" in str(e.value) and "\n" not in str(e.value)
    assert (run_dir / "result.json").read_text() == before and (run_dir / "checkpoints" / "best.ckpt").exists()
    monkeypatch.setattr("lra.train.checked_splits", lambda *a: {"splits": "read"})
    assert check_before_run([*args, "force=true"])[2] == {"splits": "read"}


def test_a_record_refused_before_the_run_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import lra.train

    args, _ = _folder_with_record(tmp_path, {"status": "COMPLETED", "task": "listops", "attn": "softmax", "seed": 0})
    monkeypatch.setattr(sys, "argv", ["lra.train", *args])
    with pytest.raises(SystemExit) as e:
        lra.train.main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "status 'COMPLETED'" in err and "\n" not in err, err


def test_a_misspelt_record_field_is_an_error_however_it_is_set():
    from lra.record import Record

    rec = Record()
    with pytest.raises(AttributeError):
        rec.set(tset_acc=0.5)
    with pytest.raises(AttributeError):
        rec.tset_acc = 0.5  # kept off the record, silently, before
    rec.set(test_acc=0.5)
    assert rec.to_json() == {"test_acc": 0.5}


def test_within_one_options_table_the_labelled_variant_refines_its_backend():
    base = [*T, "attn=softmax_nodrop"]
    table = "+attn_options"
    spec = load([*base, f"{table}.softmax.dropout=0.3", f"{table}.softmax_nodrop.dropout=0.2"])
    assert spec.attn.options["dropout"] == 0.2
    assert load([*base, f"{table}.softmax.dropout=0.3"]).attn.options["dropout"] == 0.3


@pytest.mark.parametrize("step", [40, None])
def test_an_interrupted_run_says_what_it_kept(tmp_path, step):
    import torch

    from lra.ending import ending
    from lra.interrupts import Interrupted

    last = tmp_path / "last.ckpt"
    if step is not None:
        torch.save({"global_step": step, "state_dict": {}}, last)
    end = ending(Interrupted(15), "python -m lra.train preset=quick", last)
    assert end.code == 143 and end.line == (
        f"interrupted (SIGTERM), keeping {'last.ckpt at step 40' if step else 'no last.ckpt: the run starts over'}: "
        "resume with the same command: python -m lra.train preset=quick"
    )


def test_a_finished_record_with_a_field_of_another_type_is_reported_not_a_traceback(tmp_path):
    from lra.train import _finished_record

    args, run_dir = _folder_with_record(
        tmp_path, {"status": "completed", "task": "listops", "attn": "softmax", "seed": 0, "test_acc": "0.5"}
    )
    assert _finished_record(load(args, run_dir=run_dir)).get("test_acc") == "0.5"  # skipped, as it stands


def test_name_relabels_a_finished_run_and_nothing_else(tmp_path):
    """name= on a finished run used to exit 0 without applying it: relabelling cost a retrain."""
    from lra.record import REQUIRED, Record, write_record
    from lra.train import _finished_record

    args, run_dir = _folder_with_record(tmp_path, {})
    rec = Record(**{k: 1 for k in REQUIRED})
    rec.set(task="listops", attn="softmax", seed=0, status="completed", name="first")
    write_record(run_dir, rec)
    before = json.loads((run_dir / "result.json").read_text())
    spec = load([*args, "name=second"], run_dir=run_dir)
    assert _finished_record(spec).get("name") == "second"
    assert json.loads((run_dir / "result.json").read_text()) == {**before, "name": "second"}
    assert (run_dir / "checkpoints" / "best.ckpt").read_bytes() == b"weights"
    _finished_record(load(args, run_dir=run_dir))  # no name= given: the record keeps "second"
    assert json.loads((run_dir / "result.json").read_text())["name"] == "second"


def test_a_record_nested_past_pythons_depth_is_unreadable_not_a_recursion_error(tmp_path):
    from lra.record import read_record

    (tmp_path / "result.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested deeper"):
        read_record(tmp_path)
