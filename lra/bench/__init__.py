"""Benchmarks of the attention backends (``python -m lra.bench``, ``make bench``; docs/bench.md).

* :mod:`lra.bench.tasks`: the whole training step and the attention layer at each LRA task's real
  shape (micro-batch from ``lra.fit.plan``), eager and compiled, with ratios to fused softmax;
  what ``make bench`` runs on CUDA.
* :mod:`lra.bench.layer`: one attention layer at batch 2 against n (time, exact peak memory, FLOPs,
  crossover); what ``make bench`` runs on a CPU.
* :mod:`lra.bench.cli`: the command line of both.

The layer benchmark's names are re-exported here (``bench.Config``, ``bench.run``, ...).
"""

from lra.bench.layer import *  # noqa: F401,F403 - the layer benchmark's API, as before the split
from lra.bench.layer import (BASELINE, CSV_COLUMNS, DEFAULT_LENGTHS, EXTRA_FLOP_FORMULAS,  # noqa: F401
                             MATERIALIZED, QUICK_LENGTHS, _is_oom, _predict, _slope)
from lra.bench.cli import main, parser  # noqa: F401
