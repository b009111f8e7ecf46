"""The ``callbacks=`` config group: a user's Lightning callbacks (a built-in one and one of their own) run
beside the protocol's, with their arguments; a bad one is one line before anything is written."""

import csv
import json
from pathlib import Path

import pytest

from lra.config import ConfigError, load
from lra.loop import check_callbacks, user_callbacks

TESTS = Path(__file__).resolve().parent  # user_callbacks.py: the user's module, on the run's PYTHONPATH
# quick_run's tiny run (tests/helpers.py TINY) with these
RUN = [
    "task=listops",
    "attn=softmax",
    "train.eval_every=4",
    "train.warmup=4",
    "train.batch_size=32",
    "hardware.micro_batch=16",
    "trainer.progress=false",
    "trainer.log_every_n_steps=1",
]


def test_a_built_in_and_a_user_callback_run_with_their_arguments(tmp_path, quick_run, run_env):
    """callbacks=lr_monitor (Lightning's LearningRateMonitor) logs the schedule to metrics.csv; the user's
    StepCounter sees every optimizer step (2 micro-batches each) and every evaluation, and adds to the record."""
    out = tmp_path / "counter.json"
    quick_run(
        *RUN,
        "callbacks=lr_monitor",
        "+callbacks.counter._target_=user_callbacks.StepCounter",
        f"+callbacks.counter.out={out}",
        "+callbacks.counter.label=mine",
        env=run_env(pythonpath=TESTS),
    )
    seen = json.loads(out.read_text())
    assert seen == {"label": "mine", "steps": 12, "validations": 3, "global_step": 12}
    (rec_path,) = (tmp_path / "runs").rglob("result.json")
    rec = json.loads(rec_path.read_text())
    assert rec["status"] == "completed" and rec["user_callback_steps"] == 12
    assert rec["config"]["callbacks"]["counter"]["label"] == "mine"
    rows = list(csv.DictReader((rec_path.parent / "metrics.csv").open()))
    lr = {int(r["step"]): float(r["lr-AdamW"]) for r in rows if r.get("lr-AdamW")}
    assert len(lr) >= 10, sorted(lr)
    peak = max(lr.values())
    assert peak == pytest.approx(rec["config"]["train"]["lr"], rel=0.3)  # warmup to the preset's lr ...
    assert lr[min(lr)] < peak and lr[max(lr)] < peak  # ... from below, then decayed


def test_no_user_callbacks_leaves_the_record_as_before():
    spec = load(["preset=quick"])
    assert spec.callbacks == {} and "callbacks" not in spec.config and user_callbacks(spec) == []


@pytest.mark.parametrize(
    "override,says",
    [
        ("+callbacks.x._target_=no_such_module.Thing", "cannot be imported"),
        ("+callbacks.x._target_=collections.OrderedDict", "is not a Lightning callback"),
        ("+callbacks.x=3", "_target_"),
    ],
)
def test_a_bad_callback_is_one_line_naming_it(override, says):
    with pytest.raises(ConfigError, match=says) as e:
        check_callbacks(load(["preset=quick", override]))
    assert "callbacks.x" in str(e.value) and "\n" not in str(e.value)


def test_bad_callback_arguments_are_one_line(tmp_path):
    spec = load(["preset=quick", "callbacks=lr_monitor", "+callbacks.lr_monitor.no_such_arg=1"])
    check_callbacks(spec)  # the class is fine; its arguments are checked when it is built
    with pytest.raises(ConfigError, match=r"callbacks.lr_monitor: .*LearningRateMonitor.*no_such_arg") as e:
        user_callbacks(spec)
    assert "\n" not in str(e.value)


def test_a_bad_callback_stops_the_run_before_its_folder_exists(tmp_path, quick_run, run_env):
    proc = quick_run(*RUN, "+callbacks.x._target_=no_such_module.Thing", check=False, env=run_env(pythonpath=TESTS))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "callbacks.x._target_" in lines[0], proc.stderr[-2000:]
    assert not list((tmp_path / "runs").rglob("*"))
