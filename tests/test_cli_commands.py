"""Issue 19's command-line cases for the tools: every ``python -m lra.*`` command answers ``--help``
without side effects and refuses an unknown flag with one line (exit 2), in-process (a subprocess per
command would cost seconds of imports each); bench and approx write under ``$LRA_RUNS``; the long
decisions (``lra.tools.bench fit``, ``lra.tools.bench --tasks``) print a line per item with a count and the time."""

from __future__ import annotations

import logging
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import lra
from lra import REPO_ROOT

PACKAGE = Path(lra.__file__).resolve().parent


def entry_points() -> list[str]:
    """Every module ``python -m`` runs as a command: a package's ``__main__.py`` or a module with a
    ``__main__`` guard. Found from the sources, so a new command is checked without editing this file."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            found.add(".".join(parts[:-1]))
        elif parts[-1] != "__init__" and re.search(r"^if __name__ == .__main__.:", path.read_text(), re.M):
            found.add(".".join(parts))
    return sorted(found)


def _tree_stamp(folder: Path) -> dict:
    """Existence and mtimes of a folder and its direct children: a command that writes a file or a folder
    at the top of the checkout's runs/ or data/ changes it (cheap, unlike walking a full runs root)."""
    if not folder.exists():
        return {}
    return {p.name: p.stat().st_mtime_ns for p in [folder, *folder.iterdir()]}


def _no_processes(*args, **kwargs):
    raise AssertionError(f"the command started a process: {args[0] if args else kwargs}")


def _no_libc(*args, **kwargs):
    raise OSError("no libc in tests")


def _loggers() -> list[logging.Logger]:
    return [
        logging.getLogger(),
        *(x for x in logging.root.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]


def _logging_state() -> dict:
    return {x: (x.level, x.disabled, x.propagate, x.handlers[:]) for x in _loggers()}


def _restore_logging(state: dict) -> None:
    """Undo what a command did to logging (basicConfig, Hydra's dictConfig): its handlers write to this
    test's captured stderr, which is closed once the test ends."""
    for x in _loggers():
        level, disabled, propagate, handlers = state.get(x, (logging.NOTSET, False, True, []))
        x.setLevel(level)
        x.disabled, x.propagate, x.handlers[:] = disabled, propagate, handlers


def run_as_main(module: str, argv: list[str], tmp_path: Path, monkeypatch, caplog, capsys) -> tuple[int, str]:
    """``python -m <module> <argv>`` in this process, from an empty folder, with ``LRA_RUNS`` and ``LRA_DATA``
    in ``tmp_path`` and no subprocesses allowed. Returns (exit code, everything it printed or logged);
    asserts that it wrote nothing anywhere."""
    cwd, runs, data = tmp_path / "cwd", tmp_path / "runs", tmp_path / "data"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("LRA_RUNS", str(runs))
    monkeypatch.setenv("LRA_DATA", str(data))
    monkeypatch.setattr(sys, "argv", [module, *argv])
    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, _no_processes)
    monkeypatch.setattr("ctypes.CDLL", _no_libc)  # lra.tools.approx tunes malloc for its own process, not pytest's
    before = {d: _tree_stamp(REPO_ROOT / d) for d in ("runs", "data")}
    caplog.set_level(logging.INFO)
    code, logging_before = 0, _logging_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules" (imported by other tests)
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        finally:
            _restore_logging(logging_before)
    out = capsys.readouterr()
    said = out.out + out.err + "".join(f"{r.getMessage()}\n" for r in caplog.records)
    assert list(cwd.iterdir()) == [], f"{module} {argv} wrote into the current folder"
    assert not runs.exists() and not data.exists(), f"{module} {argv} wrote into LRA_RUNS or LRA_DATA"
    assert {
        d: _tree_stamp(REPO_ROOT / d) for d in ("runs", "data")
    } == before, f"{module} {argv} wrote into the checkout's runs/ or data/"
    return code, said


def test_every_command_is_found():
    """The discovery the next two tests rely on finds every command the README names."""
    assert {
        "lra.train",
        "lra.data",
        "lra.fit",
        "lra.tools.collect",
        "lra.tools.sweep",
        "lra.tools.bench",
        "lra.tools.approx",
        "lra.tools.fidelity",
    } <= set(entry_points()), entry_points()


def test_every_command_has_a_console_script():
    """``python -m lra.<name>`` is also ``lra-<name>`` once installed (the collector's is ``lra-tables``), and no
    module but a command's own entry point is runnable (one command, one entry)."""
    import tomllib

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    expected = {
        m: "lra-tables" if m == "lra.tools.collect" else "lra-" + m.split(".")[-1].replace("_", "-")
        for m in entry_points()
    }
    assert {m: s for m, s in expected.items() if s not in scripts} == {}
    assert len(expected) == len(scripts), sorted(set(scripts) - set(expected.values()))


@pytest.mark.parametrize("module", entry_points())
def test_every_command_answers_help_without_side_effects(module, tmp_path, monkeypatch, caplog, capsys):
    code, said = run_as_main(module, ["--help"], tmp_path, monkeypatch, caplog, capsys)
    assert code == 0, said[-2000:]
    assert "Traceback" not in said
    usage = re.search(r"^usage: (python -m lra[\w.]*)", said, re.I | re.M)
    assert usage, said[:1000]
    # an example: an indented, complete command line of the command as its usage names it
    assert re.search(rf"^\s+{re.escape(usage.group(1))} \S", said, re.M), f"no example in:\n{said[:1500]}"


@pytest.mark.parametrize("module", entry_points())
def test_every_command_refuses_an_unknown_flag_in_one_line(module, tmp_path, monkeypatch, caplog, capsys):
    code, said = run_as_main(module, ["--no-such-flag"], tmp_path, monkeypatch, caplog, capsys)
    lines = [ln for ln in said.splitlines() if ln.strip()]
    assert code == 2, said[-2000:]
    assert len(lines) == 1 and "--no-such-flag" in lines[0] and "--help" in lines[0], lines[:20]


# ----------------------------------------------------------------------------- LRA_RUNS
def test_lra_runs_moves_the_outputs_of_bench_and_approx(tmp_path, monkeypatch):
    """Issue 19: bench and approx wrote into the checkout's runs/ or the current folder whatever LRA_RUNS
    said. Now their default output folders are under the runs root; an explicit --out still wins."""
    from lra.tools import approx, bench
    from lra.tools.bench import cli as bench_cli

    cwd, runs = tmp_path / "cwd", tmp_path / "runs"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("LRA_RUNS", str(runs))
    before = _tree_stamp(REPO_ROOT / "runs")
    layer = ["--layer", "--device", "cpu", "--backends", "none", "--lengths", "64", "--repeats", "1", "--threads", "1"]
    bench.main(layer)
    study = [
        "--quick",
        "--methods",
        "vmean",
        "--sources",
        "random",
        "--lengths",
        "64",
        "--budgets",
        "8",
        "--trials",
        "2",
    ]
    approx.main(study)
    assert sorted(p.name for p in (runs / "bench").iterdir()) == ["bench.csv", "bench.md", "bench.png"]
    assert {"approx.csv", "summary.md", "meta.json"} <= {p.name for p in (runs / "approx_quick").iterdir()}
    assert sorted(p.name for p in runs.iterdir()) == ["approx_quick", "bench"]
    assert list(cwd.iterdir()) == [] and _tree_stamp(REPO_ROOT / "runs") == before

    # --out wins over the runs root (the benchmark's folder as handed to it: it ran above)
    handed = []
    monkeypatch.setattr(bench_cli.layer, "run_layer", lambda cfg, rows, out: handed.append(out))
    bench.main([*layer, "--out", str(tmp_path / "b")])
    approx.main([*study, "--out", str(tmp_path / "a")])
    assert handed == [tmp_path / "b"] and (tmp_path / "a" / "approx.csv").is_file()
    assert sorted(p.name for p in runs.iterdir()) == ["approx_quick", "bench"]


# ----------------------------------------------------------------------------- progress of long decisions
COUNTED = r"\[(\d+)/(\d+), \d+ s\]$"  # which item of how many, and the seconds since the start


def test_fit_table_shows_a_line_per_decision_then_the_table(tmp_path, capsys):
    """Issue 19: the fit table ran minutes without a word (a newcomer reads a hang). Now (``lra-bench fit``, the
    bench's fit mode): a first line says how many decisions, each decision is one line on stderr with its count
    and the time so far, and the table comes on stdout at the end."""
    import lra.fit
    from lra.tools import bench

    level = lra.fit.log.level
    try:
        with pytest.raises(SystemExit) as exc:
            bench.main(
                ["fit", "task=listops", "attn=none,vmean", "hardware=cpu", "preset=quick", f"runs_root={tmp_path}"]
            )
    finally:
        lra.fit.log.setLevel(level)
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("lra-bench fit: 3 decisions (3 attention configs x 1 tasks)"), lines
    progress = [re.search(COUNTED, ln) for ln in lines[1:]]
    assert [(m.group(1), m.group(2)) for m in progress] == [("1", "3"), ("2", "3"), ("3", "3")], lines
    assert lines[1].startswith("fit listops/none: micro-batch 32 x 1 (") and lines[3].startswith(
        "fit listops/softmax_fused"
    )
    assert out.splitlines()[0] == "| attention | listops |" and "| vmean | 32 (x1) |" in out


@pytest.mark.parametrize(
    "script,argv,said",
    [
        ("doctor", ["--checks", "nope"], "python -m lra.tools.doctor: error: argument --checks"),
        ("share_bench", ["ks=0"], "lra.tools.share_bench: ks=0: give whole numbers >= 1"),
        ("bench", ["share", "--dry"], "python -m lra.tools.share_bench: error: unknown argument '--dry'"),
        ("bench", ["fit", "hardware=no_such_gpu"], "error: "),  # a code returned, not raised, is still the exit code
    ],
)
def test_doctor_and_share_bench_are_the_benchs_measurements_with_their_own_exit_codes(
    script, argv, said, monkeypatch, capsys
):
    """``lra-doctor`` and ``lra-share-bench`` are ``lra-bench doctor`` and ``lra-bench share``: the console script
    exits with the measurement's own code (2: bad input, one line) before any work."""
    from lra.tools import scripts

    monkeypatch.setattr(sys, "argv", [f"lra-{script}", *argv])
    with pytest.raises(SystemExit) as exc:
        getattr(scripts, script)()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith(said), err


def test_bench_tasks_shows_a_line_per_item_then_the_table(tmp_path, capsys):
    """Issue 19: `make bench ARGS='--tasks --quick'` looked hung. Now every fit and every measurement is a
    line on stderr ending in ``[i/N, elapsed]`` (N = tasks x backends), and the ratio tables and the files
    written come on stdout at the end."""
    from lra.tools import bench

    bench.main(
        [
            "--tasks",
            "listops",
            "--quick",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--repeats",
            "1",
            "--backends",
            "none",
            "--max-batch",
            "1",
            "--override",
            "hardware=cpu",
            "--out",
            str(tmp_path),
        ]
    )
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert "= 2 items" in lines[0], lines[0]
    counted = [(ln, re.search(COUNTED, ln)) for ln in lines[1:]]
    assert all(m for _, m in counted), lines
    # per item: its fit, then step and attention (eager); softmax (the baseline) first
    assert [(ln.split(" ")[0] + " " + ln.split(" ")[1], m.group(1)) for ln, m in counted] == [
        ("fit listops/softmax:", "1"),
        ("listops/softmax step", "1"),
        ("listops/softmax attention", "1"),
        ("fit listops/none:", "2"),
        ("listops/none step", "2"),
        ("listops/none attention", "2"),
    ], lines
    assert {m.group(2) for _, m in counted} == {"2"}
    assert "## Whole training step: time ratio to fused softmax" in out and "| none |" in out
    assert out.strip().splitlines()[-1].startswith("lra.tools.bench: done in") and "bench_tasks.csv" in out
