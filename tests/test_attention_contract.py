"""Registry contract, run over every registered backend (DESIGN.md, attention section).

Backend-specific oracles (float64 references, error shrinking with features) live in
tests/attention/test_<family>.py; this file checks what every backend owes the model.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attention
from attention.registry import Capabilities
from tests.oracles import padding_shift

NAMES = attention.available()
PAPER_NAMES = {
    "softmax", "none", "vmean", "linformer", "linformer_jlt", "informer", "informer_mask", "skeinformer",
    "skeinformer_uniform", "skeinformer_no_rownorm", "skeinformer_simple_rownorm", "skeinformer_no_pilot",
    "kernelized", "skyformer", "nystrom", "performer", "bigbird", "reformer", "longformer", "linear",
    "yoso_e", "yoso", "yoso_conv", "polysketch",
}
B, H, D, N = 2, 2, 16, 128


def make(name, **opts):
    torch.manual_seed(0)
    m = attention.build(name, num_heads=H, head_dim=D, max_len=N, **opts)
    return m.eval()


def qkv(n=N, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=dtype) for _ in range(3)]


def masks(n=N):
    end = torch.ones(B, n, dtype=torch.bool)
    end[0, n - 37:] = False
    end[1, n - 5:] = False
    middle = torch.ones(B, n, dtype=torch.bool)
    middle[0, 20:57] = False
    middle[1, 60:64] = False
    middle[1, n - 3:] = False
    return {"end": end, "middle": middle}


def test_available_sorted_and_unique():
    assert NAMES == sorted(set(NAMES))
    assert {"softmax", "none"} <= set(NAMES)


def test_unknown_backend_lists_available():
    with pytest.raises(ValueError) as e:
        attention.build("no_such_attention", num_heads=2, head_dim=32, max_len=64)
    for name in NAMES:
        assert name in str(e.value)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_rejected(name):
    with pytest.raises(ValueError, match="no_such_option"):
        attention.build(name, num_heads=H, head_dim=D, max_len=N, no_such_option=1)


@pytest.mark.parametrize("name", NAMES)
def test_describe(name):
    d = attention.describe(name)
    assert d["name"] == name and isinstance(attention.capabilities(name), Capabilities)
    assert d["doc"], f"{name} needs a docstring"
    mod = __import__(d["module"], fromlist=["_"])
    assert mod.__doc__ and len(mod.__doc__) > 80, f"module of {name} needs a docstring (paper, algorithm, complexity)"


@pytest.mark.parametrize("name", NAMES)
def test_shape_finite_and_grads(name):
    m = make(name).train()
    q, k, v = (t.requires_grad_() for t in qkv())
    mask = masks()["middle"]
    torch.manual_seed(3)
    out = m(q, k, v, mask)
    assert out.shape == (B, H, N, D)
    assert torch.isfinite(out).all()
    (out * mask[:, None, :, None]).square().sum().backward()
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in (q, k, v)]
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[2].abs().sum() > 0, "gradient must reach v"
    caps = attention.capabilities(name)
    if caps.uses_qk:
        assert grads[0].abs().sum() > 0, "gradient must reach q"
        if not caps.shared_qk:
            assert grads[1].abs().sum() > 0, "gradient must reach k"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("where", ["end", "middle"])
def test_padding_invariance(name, where):
    caps = attention.capabilities(name)
    m = make(name)
    q, k, v = qkv()
    mask = masks()[where]
    diff = padding_shift(m, q, k, v, mask, scale=10.0, call_seed=5, noise_seed=9)
    if caps.padding_mask:
        assert diff < 1e-4, f"{name}: real outputs moved by {diff} when padded content changed"
    else:  # declared mask-blind (informer): the test must see it
        assert diff > 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_seeded_determinism(name):
    m = make(name)
    q, k, v = qkv()
    mask = masks()["end"]
    torch.manual_seed(11)
    a = m(q, k, v, mask)
    torch.manual_seed(11)
    b = m(q, k, v, mask)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_no_mask_equals_all_true(name):
    m = make(name)
    q, k, v = qkv()
    torch.manual_seed(2)
    a = m(q, k, v, None)
    torch.manual_seed(2)
    b = m(q, k, v, torch.ones(B, N, dtype=torch.bool))
    torch.testing.assert_close(a, b)


def test_every_paper_row_is_registered():
    """Every row of the papers' tables is a registered name (DESIGN.md)."""
    assert sorted(PAPER_NAMES - set(NAMES)) == []


def test_every_registered_name_has_an_attn_config():
    """`attn=<name>` works for every backend: lra/config.py generates its config node."""
    from lra.config import attn_configs, compose

    assert set(NAMES) <= set(attn_configs())
    for name in NAMES:
        assert compose([f"attn={name}"]).attn.name == name


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def largest_tensor(name: str, n: int, d: int = 16) -> int:
    torch.manual_seed(0)
    m = attention.build(name, num_heads=1, head_dim=d, max_len=n)
    q, k, v = (torch.randn(1, 1, n, d, requires_grad=True) for _ in range(3))
    with LargestTensor() as probe:
        m(q, k, v, torch.ones(1, n, dtype=torch.bool)).sum().backward()
    return probe.largest


SUBQUADRATIC = [n for n in NAMES if "n^2" not in attention.capabilities(n).complexity]


@pytest.mark.parametrize("name", SUBQUADRATIC)
def test_subquadratic_backends_do_not_grow_quadratically(name):
    """What a backend declares below O(n^2) keeps its largest tensor, forward and backward, growing
    about linearly with n: doubling n at most ~2.2x (n log n included), where an n x n tensor grows 4x.
    (The benchmark measures the totals.)"""
    small, large = largest_tensor(name, 2048), largest_tensor(name, 4096)
    assert large <= 2.5 * small, f"{name}: largest tensor grew {large / small:.2f}x when n doubled"


def test_largest_tensor_probe_sees_quadratic_backends():
    """The check above can fail: declared O(n^2) backends grow 4x."""
    for name in ("polynomial", "kernelized", "skeinformer_no_rownorm"):
        assert largest_tensor(name, 2048) >= 3.5 * largest_tensor(name, 1024), name
