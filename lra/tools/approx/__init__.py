"""Approximation study: how close each attention backend's output is to exact attention.

Reproduces the spectral-norm experiment of Skeinformer (Chen et al., arXiv:2112.05359v1, Sec. 5, Fig. 1) and
Skyformer (Chen et al., NeurIPS 2021, Sec. 5, Fig. 1): for inputs Q, K, V built from real text,

    relative error = ||B V - R||_2 / ||B V||_2,   B = softmax(Q K^T / sqrt(p)),

where R is a method's output and ||.||_2 the spectral norm (largest singular value), one value per
(input draw, head). A method whose registry ``target`` is not softmax is also compared with the
exact attention of that target: Skyformer ("gaussian") with kernelized attention C V, as in the
Skyformer paper; PolySketch with exact polynomial attention; YOSO with YOSO-E. Reformer (shared QK)
is compared with full shared-QK attention (keys q/||q||, no self-attention), its own target.

Deviations from the papers: MiniLM instead of bert-base-cased (not available offline), IMDB instead
of Wikitext-2, head_dim 32 (the LRA model's) instead of BERT's 64, 24-96 trials instead of 768 (CPU
budget); the exact references are computed in fp32, the norms in fp64. docs/approx.md has the results.

* :mod:`lra.tools.approx.methods`: the methods studied (registered backends with a feature budget, the
  budget-free baselines, the ``amm_oracle`` sketch) and how a budget becomes each backend's option.
* :mod:`lra.tools.approx.references`: the exact attentions the methods are compared with, and the metric.
* :mod:`lra.tools.approx.inputs`: the text (IMDB or stdlib docstrings) and the two sources of Q, K, V.
* :mod:`lra.tools.approx.study`: the run over sources, lengths, draws, methods and budgets, and its statistics.
* :mod:`lra.tools.approx.render`: the Markdown tables and the figure.
* :mod:`lra.tools.approx.command`: the command line (``python -m lra.tools.approx``, ``lra-approx``) and its outputs.

The names of each are re-exported here (``approx.run_study``, ``approx.COLUMNS``, ...).
"""

from lra.tools.approx.command import (
    DEFAULT_BUDGETS,
    DEFAULT_LENGTHS,
    DEFAULT_TRIALS_AT_1024,
    EXAMPLES,
    QUICK,
    QUICK_PREFERENCE,
    cli,
    default_trials,
    main,
    parse_args,
)
from lra.tools.approx.inputs import (
    HEAD_DIM,
    SOURCES,
    STDLIB_MODULES,
    PretrainedInputs,
    RandomLRAInputs,
    find_imdb,
    imdb_text,
    load_text,
    make_sources,
    stdlib_text,
)
from lra.tools.approx.methods import (
    BUDGET_FREE,
    BUDGET_OPTIONS,
    BUILTIN,
    GENERIC_BUDGET_OPTIONS,
    NOT_STUDIED,
    ORDER,
    AmmOracle,
    Method,
    budget_option,
    order_key,
    resolve_methods,
    with_quirks,
)
from lra.tools.approx.references import (
    Reference,
    gaussian_attention,
    reference_for,
    relative_error,
    shared_qk_attention,
    softmax_attention,
    spectral_norm,
)
from lra.tools.approx.render import PLOT_YMAX, SKETCH_GROUP, plot, summary_table
from lra.tools.approx.study import (
    COLUMNS,
    HEADS_PER_CALL,
    MIN_DRAWS_FOR_CLUSTER_SE,
    TRIAL_COLUMNS,
    Cell,
    run_study,
)
