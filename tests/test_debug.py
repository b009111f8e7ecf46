"""debug=<name> (conf/debug/): a short check of the pipeline in its own folder tree, re-run every time, never in a
table. Each test runs ``python -m lra.train`` on the quick preset's ListOps, its data shrunk (tests/helpers.py TINY)
and generated once for the module."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from lra.config import ConfigError, load
from lra.tools.collect import collect
from lra.tools.collect.records import load_runs
from tests.helpers import DATA, run_env, run_train
from tests.test_collect import make_record


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One environment for the module: its data generated on first use, each test's runs under its own root."""
    base = tmp_path_factory.mktemp("debug")
    return lambda runs: run_env(base, runs=runs, LRA_DATA=str(base / "data"))


def debug_run(env, runs: str, *overrides: str, check: bool = True):
    e = env(runs)
    proc = run_train(Path(e["LRA_RUNS"]), *DATA, *overrides, "num_threads=1", check=check, env=e)
    return proc, Path(e["LRA_RUNS"])


def only_record(root: Path) -> tuple[Path, dict]:
    (path,) = root.rglob("result.json")
    return path.parent, json.loads(path.read_text())


def train_losses(run_dir: Path) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]


def test_debug_fast_trains_a_few_steps_in_its_own_folder_and_again_when_rerun(env):
    proc, root = debug_run(env, "fast", "debug=fast")
    run_dir, rec = only_record(root)
    assert run_dir.relative_to(root).parts[:4] == ("debug", "fast", "quick", "listops"), run_dir
    assert rec["debug"] == "fast" and rec["status"] == "completed"
    assert rec["steps"] == load([*DATA, "debug=fast"]).train.max_steps == 10
    assert rec["train_time_s"] < 30  # seconds, on a shared CPU
    assert len(train_losses(run_dir)) == 10  # a logged training row every step
    assert "train." not in rec["config"]["run_tag"]  # the debug settings name the folder, not an override tag
    out = proc.stdout + proc.stderr
    assert out.count("effective batch") == 1 and "takes hours" not in out  # said once; seconds, not hours
    again, _ = debug_run(env, "fast", "debug=fast")
    assert "already holds a finished run" not in again.stdout + again.stderr
    assert only_record(root)[1]["steps"] == 10 and "10 steps" in again.stdout + again.stderr


def test_the_collector_skips_debug_records_and_says_so(tmp_path):
    make_record(tmp_path / "runs", "softmax", 0, test_acc=0.4)
    debug = make_record(tmp_path / "runs", "softmax", 1, test_acc=0.99, debug="fast")
    shutil.move(debug, tmp_path / "runs" / "debug")  # where lra.train puts it: runs/debug/...
    runs, issues = load_runs(tmp_path / "runs")
    assert list(runs["seed"]) == [0]
    assert [(i.path, i.kind) for i in issues] == [("debug", "skipped")]
    assert "debug=fast" in issues[0].detail
    res = collect(tmp_path / "runs", tmp_path / "out", formats=("md",), plots=False)
    assert len(res.runs) == 1 and "skipped" in (tmp_path / "out" / "issues.md").read_text()


@pytest.mark.slow  # 13 s; debug=fast keeps the debug path in the main suite
def test_debug_overfit_drives_the_training_loss_far_down(env):
    _, root = debug_run(env, "overfit", "debug=overfit", "train.batch_size=8")  # its 100 steps, on a smaller batch
    run_dir, rec = only_record(root)
    assert rec["debug"] == "overfit" and run_dir.relative_to(root).parts[:2] == ("debug", "overfit")
    losses = train_losses(run_dir)
    assert len(losses) == rec["steps"] == 100
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


@pytest.mark.slow  # 10 s; debug=fast keeps the debug path in the main suite
def test_debug_profile_writes_its_report_into_the_run_folder(env):
    proc, root = debug_run(env, "profile", "debug=profile")
    run_dir, rec = only_record(root)
    assert rec["debug"] == "profile"
    report = run_dir / "fit-profile.txt"
    assert report.is_file() and report.stat().st_size > 0
    assert "run_training_batch" in report.read_text()
    assert str(report) in proc.stdout + proc.stderr  # the log names the file


def test_an_unknown_debug_is_one_line_and_nothing_is_written(env):
    proc, root = debug_run(env, "nope", "debug=nope", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "debug" in lines[0] and "fast overfit profile" in lines[0], proc.stderr
    assert not root.exists()


@pytest.mark.parametrize(
    "override, key",
    [
        ("debug.profiler=nope", "debug.profiler"),
        ("debug.limit_batches=0", "debug.limit_batches"),
        ("debug.overfit_batches=-1", "debug.overfit_batches"),
    ],
)
def test_a_bad_debug_value_names_the_key_and_what_is_allowed(override, key):
    with pytest.raises(ConfigError) as e:
        load(["preset=quick", "debug=fast", override])
    assert str(e.value).startswith(f"{key}=") and "\n" not in str(e.value)


def test_no_debug_run_has_no_debug_spec_and_keeps_the_preset_folder():
    from lra.naming import run_folder

    spec = load(["preset=quick"])
    assert spec.debug is None and "/debug/" not in str(run_folder(spec, ""))
    assert run_folder(load(["preset=quick", "debug=fast"]), "").parts[-6:-4] == ("debug", "fast")


@pytest.mark.parametrize("preset", ["skeinformer_paper", "quick"])
def test_debug_fast_on_a_cpu_reads_a_small_sample_at_the_presets_lengths_in_small_batches(preset):
    """The README's debug=fast line generated the whole 100,000-tree ListOps set first (minutes, hours on a loaded
    CPU), then trained batches of 256 x 2048 tokens on the CPU."""
    full, debug = (
        load([f"preset={preset}", "trainer.accelerator=cpu"]),
        load([f"preset={preset}", "debug=fast", "trainer.accelerator=cpu"]),
    )
    gen = debug.data.spec.generator
    assert (gen.n_train, gen.n_val, gen.n_test) == (256, 64, 64)
    assert (gen.min_length, gen.max_length, debug.model.seq_len) == (
        full.data.spec.generator.min_length,
        full.data.spec.generator.max_length,
        full.model.seq_len,
    )
    assert debug.data.spec != full.data.spec  # its own cache entry
    assert debug.train.batch_size <= 4 and debug.config["train"]["batch_size"] == debug.train.batch_size
    assert load(
        [f"preset={preset}", "debug=fast", "trainer.accelerator=cpu", "debug.cpu_batch=null"]
    ).train.batch_size == (full.train.batch_size)
