"""The harness's one measuring command (``python -m lra.tools.bench``, ``lra-bench``, ``make bench``; docs/bench.md):
the benchmarks of the attention backends below, and after a first word the doctor (``doctor``), the shared-GPU
throughput (``share``) and the memory fit's table (``fit``: :mod:`lra.tools.bench.fit_table`).

* Task mode, what ``make bench`` runs on CUDA: the whole training step and the attention layer at each
  LRA task's real shape (micro-batch from ``lra.fit.plan``), eager and compiled, with ratios to fused
  softmax. :mod:`lra.tools.bench.tasks` measures, :mod:`lra.tools.bench.task_report` writes the tables.
* Layer mode, what ``make bench`` runs on a CPU: one attention layer at batch 2 against n (time, exact
  peak memory, FLOPs, crossover). :mod:`lra.tools.bench.rows` (rows, configuration, ``--set`` options),
  :mod:`lra.tools.bench.measure` (a point, the sweep), :mod:`lra.tools.bench.flops`, :mod:`lra.tools.bench.analyse`
  (ratios, crossover, growth), :mod:`lra.tools.bench.render` (``bench.md``, ``bench.png``) and
  :mod:`lra.tools.bench.layer` (its command line and outputs).
* Cost mode (``--cost skeinformer``): the paper's Tables 4 and 2 (micro-batch x accumulation, minutes per 1k
  steps) measured on a GPU under a V100's memory, beside its values: :mod:`lra.tools.bench.cost`.
* Reference mode: each attention module against the module of the papers' public code (a checkout the user
  fetched), side by side, interleaved: :mod:`lra.tools.bench.reference`.
* :mod:`lra.tools.bench.cli`: the command line of all of them.

The timer and memory meter are :mod:`lra.tools.meter`, the device helpers :mod:`lra.devices`. The layer benchmark's
names are re-exported here (``bench.Config``, ``bench.run``, ...).
"""

from lra.tools.bench.analyse import crossover, growth, loglog_slope, ratios, read_csv
from lra.tools.bench.cli import main, parser
from lra.tools.bench.flops import EXTRA_FLOP_FORMULAS, OpNames, flop_counter
from lra.tools.bench.layer import check_layer_args, config_from_args, run_layer
from lra.tools.bench.measure import _predict, _slope, fwd_bwd, make_inputs, measure_point, run
from lra.tools.bench.render import plot, render_markdown
from lra.tools.bench.rows import (
    BASELINE,
    CSV_COLUMNS,
    DEFAULT_LENGTHS,
    MATERIALIZED,
    QUICK_LENGTHS,
    Config,
    Row,
    all_rows,
    build_module,
    effective_options,
    parse_options,
    select_rows,
)
