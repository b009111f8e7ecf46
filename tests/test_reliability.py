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
        ["protocol.lr=1e-3"],
        ["trainer.progress=true"],
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
        ["protocol.lr=0.002"],
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
    assert f"{key.replace('protocol.', 'train.')}={value}" in run_tag(other)


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
