"""LRA harness: data, model, Lightning training loop, run records, collectors, benchmarks.

Entry points (each ``python -m <module>``):
  lra.train    one run (Hydra; ``make lra``)          lra.data     prepare a task's data (``make data``)
  lra.fit      memory-fitted accumulation (``make fit``)  lra.collect  tables and plots (``make tables``)
  lra.bench    attention micro-benchmark (``make bench``) lra.approx   approximation study (``make approx``)
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
