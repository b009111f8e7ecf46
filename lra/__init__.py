"""LRA harness, the run library: config, data, model, memory fit, Lightning module and protocol, run record.

Entry points (each ``python -m <module>``, or the console script in brackets after ``pip install``):
  lra.train    one run (Hydra; ``make lra``) [lra-train]
  lra.data     prepare a task's data [lra-data]
  lra.fit      memory-fitted accumulation: one decision [lra-fit] (every task x attention: ``lra-bench fit``)
  lra.evaluate a saved run's checkpoint evaluated again [lra-evaluate]
The tools built on runs (sweeps, tables, measurements: ``lra-bench``, the doctor, fidelity, the approximation
study) are the package :mod:`lra.tools`, which the library never imports.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent

# A checkout (plain or `pip install -e`) has pyproject.toml and conf/ beside the package; a wheel install
# has neither, and carries conf/ inside the package as lra/conf (pyproject maps it there).
IN_CHECKOUT = (_HERE.parent / "pyproject.toml").is_file() and (_HERE.parent / "conf" / "config.yaml").is_file()

# Where data/ and runs/ default to (conf/config.yaml: ${lra.repo:}/data, /runs): the checkout, or, when
# installed, the directory the command is started from, so `lra-train ...` writes ./runs and ./data.
REPO_ROOT = _HERE.parent if IN_CHECKOUT else Path.cwd().resolve()
CONF_DIR = _HERE.parent / "conf" if IN_CHECKOUT else _HERE / "conf"
