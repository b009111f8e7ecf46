"""results/ (the reference results the repository ships): small files only, laid out as the collector reads them,
each under the device its record names, and the tables beside them exactly what the collector makes of them now."""

import json
from pathlib import Path

import pytest

from lra import REPO_ROOT
from lra.tools.carry import SMALL
from lra.tools.collect import main as collect
from lra.tools.sweep.base import FINISHED
from lra.tools.sweep.cost import device_slug

RESULTS = REPO_ROOT / "results"
DEVICES = sorted(p for p in RESULTS.iterdir() if p.is_dir()) if RESULTS.is_dir() else []
TABLES = (".md", ".csv", ".tex")


def runs(device: Path) -> list[Path]:
    return sorted(p.parent for p in device.rglob("result.json") if "tables" not in p.relative_to(device).parts)


def test_results_hold_finished_runs_small_files_under_their_records_device():
    assert DEVICES, "results/ has no device folder"
    for device in DEVICES:
        assert runs(device), f"{device} holds no run"
        for run in runs(device):
            rec = json.loads((run / "result.json").read_text())
            assert rec["status"] in FINISHED, run
            assert device.name == device_slug(rec["device"]), (run, rec["device"])
            files = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()}
            assert files <= set(SMALL), (run, files - set(SMALL))  # never a checkpoint
    too_big = [p for p in RESULTS.rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]
    assert not too_big


@pytest.mark.parametrize("device", DEVICES, ids=lambda p: p.name)
def test_the_tables_beside_the_runs_are_what_the_collector_makes_of_them(device, tmp_path, capsys):
    """Regenerated from the runs alone; a table edited by hand, or runs added without their tables, fails."""
    assert collect(["--runs", str(device), "--out", str(tmp_path), "--no-plots", "--no-html"]) == 0
    capsys.readouterr()
    made = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.suffix in TABLES}
    kept = {p.relative_to(device / "tables").as_posix() for p in (device / "tables").rglob("*") if p.suffix in TABLES}
    assert made == kept
    for name in made:
        assert (tmp_path / name).read_text() == (device / "tables" / name).read_text(), name
