"""Every attention backend inside the classifier under torch.compile (docs/facts.md §10: 2-3x faster steps).

Each registered name, in a small classifier (n = seq_len = 64, as the harness pads every batch to
seq_len), with options small enough that the sub-quadratic path runs (blocks, landmarks, features
below n), plus option VARIANTS (fixed vs per-call draws, causal, ...), is checked for:
  * one graph (so no graph break) and no recompile when the padding pattern changes (end, middle,
    none, per-sample lengths, an all-padding sample; same shapes); eval mode costs one more graph;
  * compiled (``aot_eager``: dynamo + AOT autograd, no code generation) equal to eager, loss and every
    gradient, with torch's RNG seeded identically before each: dropout and the randomized backends'
    draws run in the same order under aot_eager, so they draw the same numbers (a different seed
    moves the loss by ~1e-2, far beyond the tolerance). Default suite: FAST_EQUALITY; rest slow.
A backend that declares ``compiles=False`` must still break or recompile, so the declaration cannot
go stale, and a planted data-dependent backend shows the check can fail. The counting backend
compiles nothing, so the graph checks take about a second per backend on a CPU.
"""

import pytest
import torch
import torch._dynamo

import attention
from attention import registry
from lra.config import compose
from lra.model import LRAClassifier, loss_and_correct

N, BATCH = 64, 3

# options that put every method on its real path at n = 64 (defaults such as 256 landmarks or
# 64-token blocks would make several of them exact or single-block there)
SMALL = {
    "bigbird": {"block_size": 8},
    "informer": {"num_features": 8},
    "informer_mask": {"num_features": 8},
    "linformer": {"k": 8},
    "linformer_jlt": {"k": 8},
    "longformer": {"window": 8, "num_global": 2},
    "nystrom": {"landmarks": 8},
    "performer": {"features": 8},
    "polysketch": {"sketch_size": 4},
    "reformer": {"bucket_size": 8},
    "skyformer": {"num_landmarks": 8},
    "yoso": {"num_hashes": 4},
    "yoso_conv": {"num_hashes": 4},
    **{name: {"num_features": 8} for name in attention.available() if name.startswith("skeinformer")},
}

# other code paths behind options: fixed vs per-call draws, materialised softmax, causal, ...
VARIANTS = [
    ("bigbird", {"redraw": "per_call"}),
    ("reformer", {"redraw": "fixed"}),
    ("skyformer", {"redraw": "fixed"}),
    ("skyformer", {"redraw": "fixed", "replacement": True}),
    ("skyformer", {"replacement": True}),
    ("performer", {"redraw": "per_call"}),
    ("linformer_jlt", {"redraw": "fixed"}),
    ("softmax", {"impl": "materialized"}),
    ("softmax", {"causal": True}),
    ("polynomial", {"causal": True}),
    ("polysketch", {"redraw": "per_call", "causal": True, "block_size": 16}),
    ("yoso", {"redraw": "fixed"}),
    ("yoso_e", {"backward": "exact"}),
    ("skeinformer", {"pilot_sampling": "with_replacement"}),
    ("nystrom", {"conv_kernel": 3}),
]


def paper_variants():
    """The public code's quirks of each backend (quirks=<code>, conf/quirks/), which the paper
    presets compile on CUDA; their feature budgets stay the SMALL ones."""
    budgets = {"k", "landmarks", "features", "num_features", "num_landmarks"}
    out = {}
    for code in ("skeinformer", "skyformer", "nystromformer"):
        for name, opts in compose([f"quirks={code}"]).quirks.attn_options.items():
            opts = {k: v for k, v in opts.items() if k not in budgets}
            if opts and name in attention.available():
                out[(name, tuple(sorted(opts.items())))] = (name, opts)
    return list(out.values())


VARIANTS += paper_variants()


# the compiled-vs-eager comparison in the default suite (the rest is marked slow): fused SDPA with
# dropout, fixed-pattern buffers, sampling with scatter, a custom autograd.Function
FAST_EQUALITY = {"softmax", "bigbird", "skeinformer", "yoso"}


def cases(fast=None):
    """Every registered name with SMALL options, then the VARIANTS; names outside ``fast`` marked slow."""

    def param(name, opts, id_):
        marks = [pytest.mark.slow] if fast is not None and (name not in fast or id_ != name) else []
        return pytest.param(name, opts, id=id_, marks=marks)

    return [param(name, SMALL.get(name, {}), name) for name in attention.available()] + [
        param(name, {**SMALL.get(name, {}), **opts}, name + "-" + "-".join(f"{k}={v}" for k, v in opts.items()))
        for name, opts in VARIANTS
    ]


def make_model(name, opts):
    torch.manual_seed(0)
    return LRAClassifier(
        vocab_size=16,
        seq_len=N,
        num_classes=4,
        attn_name=name,
        attn_options=opts,
        dim=32,
        hidden=64,
        num_layers=2,
        num_heads=2,
        head_dim=16,
        head_hidden=32,
    )


def padding_patterns():
    """Masks of one shape, (BATCH, N), True = real: the padding moves, the shapes do not."""
    end = torch.ones(BATCH, N, dtype=torch.bool)
    end[:, 50:] = False
    middle = torch.ones(BATCH, N, dtype=torch.bool)
    middle[0, 40:] = False
    middle[1, 20:30] = False
    lengths = torch.arange(N)[None, :] < torch.tensor([[5], [63], [33]])
    front = torch.ones(BATCH, N, dtype=torch.bool)
    front[2, :10] = False
    empty = torch.ones(BATCH, N, dtype=torch.bool)
    empty[0] = False  # a sample without real tokens
    return [end, torch.ones(BATCH, N, dtype=torch.bool), middle, lengths, front, empty]


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(1, 16, (BATCH, N), generator=g), torch.tensor([0, 1, 3])


def loss_fn(model):
    def step(tokens, mask, labels):
        return loss_and_correct(model(tokens, mask), labels)[0]

    return step


@pytest.fixture(autouse=True)
def fresh_dynamo():
    yield
    torch._dynamo.reset()  # drop the cached graphs (and the models they hold) for later tests


class CountingBackend:
    """A dynamo backend that runs the captured graph as is and counts the graphs it is handed."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def break_reasons(step, mask):
    tokens, labels = batch()
    return [str(r.reason).split("\n")[0] for r in torch._dynamo.explain(step)(tokens, mask, labels).break_reasons]


def check_compile_declaration(name, opts):
    """One graph in train mode and one more in eval over every padding pattern when the backend
    declares ``compiles``, otherwise several graphs. A graph break splits the step into several
    graphs and a recompile adds one, so counting graphs catches both. (Not ``fullgraph=True``: it
    lets dynamo capture ``int(tensor)`` as an unbacked size instead of breaking.)"""
    torch._dynamo.reset()  # a fresh cache (and recompile budget) per model
    model = make_model(name, opts)
    tokens, labels = batch()
    counter = CountingBackend()
    step = torch.compile(loss_fn(model), backend=counter)
    for mask in padding_patterns():
        loss = step(tokens, mask, labels)
        loss.backward()
        assert torch.isfinite(loss)
    if not attention.capabilities(name).compiles:  # the declaration must not go stale
        assert counter.graphs > 1, f"{name} is declared compiles=False but traces as one graph"
        return
    if counter.graphs != 1:
        torch._dynamo.reset()
        reasons = break_reasons(loss_fn(model), padding_patterns()[0])
        raise AssertionError(
            f"{name}: {counter.graphs} graphs over {len(padding_patterns())} padding patterns; "
            f"graph breaks: {reasons}"
        )
    model.eval()
    with torch.no_grad():
        for mask in padding_patterns():
            step(tokens, mask, labels)
    assert counter.graphs == 2, "eval mode should cost exactly one more graph"


@pytest.mark.parametrize("name,opts", cases())
def test_one_graph_and_no_recompile_when_padding_changes(name, opts):
    check_compile_declaration(name, opts)


class TruncatedSoftmax(attention.AttentionBackend):
    """Softmax over the first (longest real length) keys: an output size read off the data."""

    capabilities = attention.Capabilities(compiles=False)

    def forward(self, q, k, v, mask=None):
        m = int(mask.sum(-1).max())  # data to a Python int: a graph break, and a value per length
        return torch.softmax(q @ k[:, :, :m].transpose(-1, -2), -1) @ v[:, :, :m]


def test_the_check_catches_a_data_dependent_backend(monkeypatch):
    """The planted backend is caught both ways: declared compilable it fails the check (so the check
    can fail); declared compiles=False it passes (so the compiles=False branch works)."""
    attention.available()  # load the real registry first
    monkeypatch.setitem(registry._REGISTRY, "truncated", registry._Entry("truncated", TruncatedSoftmax))
    check_compile_declaration("truncated", {})
    monkeypatch.setitem(
        registry._REGISTRY,
        "truncated",
        registry._Entry("truncated", TruncatedSoftmax, capabilities=attention.Capabilities(compiles=True)),
    )
    with pytest.raises(AssertionError, match="graph breaks: .*item"):
        check_compile_declaration("truncated", {})


def run(step, model, seed):
    """Loss and gradients of one step on every padding pattern, torch's RNG seeded before each."""
    out = []
    for i, mask in enumerate(padding_patterns()[::2]):  # end, middle, front: the graph is the same for all
        model.zero_grad(set_to_none=True)
        tokens, labels = batch()
        torch.manual_seed(seed + i)
        loss = step(tokens, mask, labels)
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    return out


@pytest.mark.parametrize("name,opts", cases(fast=FAST_EQUALITY))
def test_compiled_equals_eager_loss_and_gradients(name, opts):
    if not attention.capabilities(name).compiles:
        pytest.skip(f"{name} declares compiles=False: the harness runs it eager")
    torch._dynamo.reset()
    model = make_model(name, opts)  # train mode: dropout 0.1 and the randomized draws are on
    eager = run(loss_fn(model), model, seed=10)
    compiled = run(torch.compile(loss_fn(model), backend="aot_eager"), model, seed=10)
    for (le, ge), (lc, gc) in zip(eager, compiled):
        torch.testing.assert_close(lc, le, atol=1e-5, rtol=1e-4)
        assert ge.keys() == gc.keys()
        for key in ge:
            torch.testing.assert_close(gc[key], ge[key], atol=1e-5, rtol=1e-4, msg=lambda m: f"{key}: {m}")
