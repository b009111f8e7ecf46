"""Registry contract, run over every registered backend (DESIGN.md, attention section).

Backend-specific oracles (float64 references, error shrinking with features) live in
tests/attention/test_<family>.py; this file checks what every backend owes the model.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attention
from attention import testing
from attention.registry import Capabilities

NAMES = attention.available()
PAPER_NAMES = {
    "softmax", "none", "vmean", "linformer", "linformer_jlt", "informer", "informer_mask", "skeinformer",
    "skeinformer_uniform", "skeinformer_no_rownorm", "skeinformer_simple_rownorm", "skeinformer_no_pilot",
    "kernelized", "skyformer", "nystrom", "performer", "bigbird", "reformer", "longformer", "linear",
    "yoso_e", "yoso", "yoso_conv", "polysketch",
}


def test_available_sorted_and_unique():
    assert NAMES == sorted(set(NAMES))
    assert {"softmax", "none"} <= set(NAMES)


def test_unknown_backend_lists_available():
    with pytest.raises(ValueError) as e:
        attention.build("no_such_attention", num_heads=2, head_dim=32, max_len=64)
    for name in NAMES:
        assert name in str(e.value)


@pytest.mark.parametrize("check", sorted(testing.CHECKS))
@pytest.mark.parametrize("name", NAMES)
def test_contract(name, check):
    """The public contract checks (attention/testing.py), the same ones a user runs on their own backend."""
    testing.CHECKS[check](name)


def test_describe_capabilities():
    for n in NAMES:
        assert attention.describe(n)["name"] == n and isinstance(attention.capabilities(n), Capabilities)


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
