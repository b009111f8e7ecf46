"""The notebooks in notebooks/ run headless (nbclient) on collector and approximation-study output.

Fast: synthetic records / a synthetic approx.csv, and missing input (a clear message, no error).
Slow: real quick runs made here (softmax and none x 2 seeds, tiny ListOps) and a real
``python -m lra.tools.approx --quick`` study.
"""

import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient

from lra.tools.collect import collect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_collect import make_record  # noqa: E402


def execute(name: str) -> nbformat.NotebookNode:
    """Run a notebook in a fresh kernel (which inherits os.environ); raises on any cell error."""
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb


def text_of(nb) -> str:
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            if o.output_type == "stream":
                out.append(o.text)
            elif o.output_type in ("display_data", "execute_result"):
                out += [str(o.data.get(k, "")) for k in ("text/markdown", "text/plain", "text/html")]
    return "\n".join(out)


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def own_figure(nb):
    """The outputs of the cell that draws its own figure from runs.csv (not a rendered file)."""
    cell = next(
        c
        for c in nb.cells
        if c.cell_type == "code" and 'pd.read_csv(TABLES / "runs.csv")' in c.source and "plt.subplots" in c.source
    )
    return cell.get("outputs", [])


def test_notebooks_are_stored_without_outputs():
    for name in ("results.ipynb", "approx.ipynb"):
        nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        nbformat.validate(nb)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), name


def test_results_notebook_on_synthetic_records(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for attn in ("softmax", "none"):
        for seed in (0, 1):
            make_record(runs, attn, seed, test_acc=0.3 + 0.1 * (attn == "softmax") + 0.01 * seed)
    make_record(runs, "softmax", 2, status="failed", reason="OutOfMemoryError: CUDA out of memory", test_acc=None)
    collect(runs, tmp_path / "tables", compare=("yoso",))
    monkeypatch.setenv("LRA_TABLES", str(tmp_path / "tables"))
    nb = execute("results.ipynb")
    text = text_of(nb)
    assert "4 finished and counted; presets: quick" in text
    assert (
        "Skeinformer Table 1" in text and "YOSO Table 3" in text and "| 40.50 ± 0.71 (2) |" in text
    )  # 2 seeds: no bold
    assert "OutOfMemoryError" in text
    # rendered: curves and efficiency for listops, the LRA chart; plus the figure drawn from runs.csv
    assert images(nb) == 4
    own = own_figure(nb)
    assert "figure from runs.csv: 4 runs, test_acc per task x attention" in text
    assert sum("image/png" in o.get("data", {}) for o in own) == 1


def test_results_notebook_without_collector_output(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_TABLES", str(tmp_path / "not_there"))
    nb = execute("results.ipynb")
    text = text_of(nb)
    assert f"No collector output at {tmp_path / 'not_there'}" in text and "make tables" in text
    assert images(nb) == 0 and not own_figure(nb)


def _synthetic_approx(path: Path):
    from lra.tools.approx import COLUMNS

    rows = []
    for method, base in (("skeinformer", 0.5), ("vmean", 0.6)):
        for budget in (8, 16, 32):
            err = base / (budget**0.5 if method != "vmean" else 1)
            rows.append(
                dict(
                    method=method,
                    reference="softmax",
                    source="pretrained",
                    n=256,
                    budget=budget,
                    trials=24,
                    draws=2,
                    mean=err,
                    median=err,
                    stderr=0.01,
                    std=0.05,
                    min=err / 2,
                    max=err * 2,
                    sec_per_call=0.001,
                    failures=0,
                    error_message=None,
                )
            )
    rows.append(
        dict(
            rows[0],
            method="performer",
            failures=24,
            mean=None,
            median=None,
            stderr=None,
            error_message="RuntimeError: boom",
        )
    )
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)


def test_approx_notebook_on_synthetic_study(tmp_path, monkeypatch):
    _synthetic_approx(tmp_path / "approx.csv")
    monkeypatch.setenv("LRA_APPROX", str(tmp_path))
    nb = execute("approx.ipynb")
    text = text_of(nb)
    assert "methods performer, skeinformer, vmean" in text and "source `pretrained`, n = 256" in text
    assert "RuntimeError: boom" in text
    assert images(nb) == 1


def test_approx_notebook_without_output_or_with_a_foreign_csv(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_APPROX", str(tmp_path / "nothing"))
    text = text_of(execute("approx.ipynb"))
    assert "No approximation-study output found" in text and "lra.tools.approx --quick --out" in text
    (tmp_path / "approx.csv").write_text("a,b\n1,2\n")
    monkeypatch.setenv("LRA_APPROX", str(tmp_path / "approx.csv"))
    text = text_of(execute("approx.ipynb"))
    assert "lacks the columns" in text


@pytest.mark.slow
def test_results_notebook_on_real_quick_runs(quick_run, tmp_path, monkeypatch):
    # one process, four runs (Hydra multirun): quick preset, softmax and none, seeds 0 and 1
    quick_run("attn=softmax,none", "seed=0,1", "--multirun")
    res = collect(tmp_path / "runs", tmp_path / "tables", compare=("skeinformer", "yoso"))
    ok = res.runs[res.runs["usable"] & res.runs["kept"]]
    assert sorted(zip(ok["attn"], ok["seed"])) == [("none", 0), ("none", 1), ("softmax", 0), ("softmax", 1)]
    assert not [i for i in res.issues if i.kind != "plot"], res.issues
    # TINY's extra overrides name a sub-folder, so these rows read "softmax [task...]", after the paper's
    t1 = res.tables[("quick", "skeinformer_table1")]
    std = next(r for r in t1.rows if r.key.startswith("softmax [task.generator.n_test=64,"))
    assert not std.in_paper and std.name == "Standard"  # the overrides every row shares: in the note, once
    assert "Every row: " in (tmp_path / "tables" / "quick" / "skeinformer_table1.md").read_text()
    assert "softmax" not in [r.key for r in t1.rows] and not t1.compare  # no empty paper row; quick: no paper
    j = next(i for i, c in enumerate(t1.columns) if c.task == "listops")
    assert std.cells[j].n == 2 and 0 <= std.cells[j].mean <= 100
    md = (tmp_path / "tables" / "quick" / "skeinformer_table4.md").read_text()
    none = next(ln for ln in md.splitlines() if ln.startswith("| none (no attention) |")).strip("| ").split(" | ")
    assert none[1:3] == ["--"] * 2 and none[3:5] == ["32", "1"]  # Text, then ListOps: bz, accu; as every row: no bold
    monkeypatch.setenv("LRA_TABLES", str(tmp_path / "tables"))
    nb = execute("results.ipynb")
    text = text_of(nb)
    assert "4 run records, 4 finished and counted; presets: quick" in text and "Skeinformer Table 4" in text
    assert images(nb) == 4 and "figure from runs.csv: 4 runs" in text


@pytest.mark.slow
def test_approx_notebook_on_real_quick_study(tmp_path, monkeypatch):
    proc = subprocess.run(
        [sys.executable, "-m", "lra.tools.approx", "--quick", "--out", str(tmp_path / "approx")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.setenv("LRA_APPROX", str(tmp_path / "approx"))
    nb = execute("approx.ipynb")
    assert "rows: methods" in text_of(nb) and images(nb) == 1
