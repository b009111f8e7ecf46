"""Optuna search through Hydra's sweeper plugin (lra.sweep grid=search_quick): two trials on tiny
ListOps, objective = the run's best validation accuracy, a persistent SQLite study that a second
invocation continues."""

import json
import warnings

import pytest

from test_sweep import TINY, run_sweep

optuna = pytest.importorskip("optuna")
pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")


def _study(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.load_study(study_name="search_quick-quick-listops-skeinformer",
                                 storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}")


def test_plugin_pins_work_together():
    """hydra-optuna-sweeper 1.3.0 needs optuna < 3; optuna 2.x's RDB storage needs SQLAlchemy < 2."""
    import sqlalchemy

    assert optuna.__version__.startswith("2.") and int(sqlalchemy.__version__.split(".")[0]) < 2, (
        f"optuna {optuna.__version__} / SQLAlchemy {sqlalchemy.__version__}: pin sqlalchemy<2 (see docs/sweeps.md)")


def test_optuna_search_two_trials_then_continue(tmp_path):
    args = ["grid=search_quick", "hydra/launcher=basic", *TINY]
    out = run_sweep(tmp_path, *args, "n_trials=2").stdout
    assert "0/2 trials complete; running 2 more" in out
    study = _study(tmp_path)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == 2
    m = json.loads((tmp_path / "runs" / "quick" / "sweeps" / "search_quick" / "manifest.json").read_text())
    assert m["kind"] == "search" and len(m["trials"]) == 2 and m["best"]["value"] == study.best_value
    for t, row in zip(study.trials, m["trials"]):
        assert set(t.params) == {"train.lr", "train.warmup", "model.dropout", "++attn.options.num_features"}
        rec = json.loads((tmp_path / "runs" / row["run_dir"] / "result.json").read_text())
        assert rec["status"] == "completed" and rec["best_val_acc"] == pytest.approx(t.value)
        cfg = rec["config"]
        assert cfg["train"]["lr"] == pytest.approx(t.params["train.lr"]) and cfg["train"]["warmup"] == t.params["train.warmup"]
        assert cfg["model"]["dropout"] == pytest.approx(t.params["model.dropout"])
        assert cfg["attn"]["options"]["num_features"] == t.params["++attn.options.num_features"]
        assert row["run_dir"].startswith("quick/listops/skeinformer/seed0/")

    # the same search again with a larger target: the study continues, only the missing trial runs
    out = run_sweep(tmp_path, *args, "n_trials=3").stdout
    assert "2/3 trials complete; running 1 more" in out
    study = _study(tmp_path)
    params = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(study.trials) == 3 and all(t.state.name == "COMPLETE" for t in study.trials)
    assert len(set(params)) == 3, "a continued study drew the same parameters again"
