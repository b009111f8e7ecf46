"""Registry contract, run over every registered backend (docs/design.md, "Attention backends").

Backend-specific oracles (float64 references, error shrinking with features) live in
tests/attention/test_<family>.py; this file checks what every backend owes the model.
"""

import math
import re
import typing

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attention
from attention import testing
from attention.registry import Capabilities

NAMES = attention.available()
PAPER_NAMES = {
    "softmax",
    "none",
    "vmean",
    "linformer",
    "linformer_jlt",
    "informer",
    "informer_mask",
    "skeinformer",
    "skeinformer_uniform",
    "skeinformer_no_rownorm",
    "skeinformer_simple_rownorm",
    "skeinformer_no_pilot",
    "kernelized",
    "skyformer",
    "nystrom",
    "performer",
    "bigbird",
    "reformer",
    "longformer",
    "linear",
    "yoso_e",
    "yoso",
    "yoso_conv",
    "polysketch",
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
    """Every row of the papers' tables is a registered name (docs/design.md)."""
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


# ------------------------------------------------------------------- issue 19: NaN and infinity in options
def float_options() -> list[tuple[str, str]]:
    """(backend, option) for every option typed float (or float | None) of every registered backend."""
    out = []
    for name in NAMES:
        hints = typing.get_type_hints(attention.options_class(name))
        out += [(name, opt) for opt, tp in hints.items() if tp is float or float in typing.get_args(tp)]
    return out


FLOAT_OPTIONS = float_options()


def test_the_registry_has_float_options_to_check():
    assert ("softmax", "dropout") in FLOAT_OPTIONS and len(FLOAT_OPTIONS) >= 5


@pytest.mark.parametrize("name,option", FLOAT_OPTIONS)
def test_attn_options_nan_is_refused_for_every_float_option(name, option):
    """Before: `attn.options.dropout=nan` passed validation (NaN passes every comparison), then a
    PyTorch traceback. Now NaN is refused in one line naming the option, the value and the range."""
    allowed = attention.option_info(name)[option]["range"]
    with pytest.raises(attention.InvalidOption, match=rf"'{option}'=nan .*{re.escape(allowed)}"):
        attention.make_options(name, **{option: float("nan")})
    if allowed.endswith(("inf)", "inf]")):  # no finite upper bound: infinity passes only an explicit one
        ok = allowed.endswith("inf]")
        try:
            attention.make_options(name, **{option: math.inf})
        except attention.InvalidOption:
            assert not ok, f"{name}.{option}: infinity refused though its range is {allowed}"
        else:
            assert ok, f"{name}.{option}: infinity accepted though its range is {allowed}"


def test_check_range_refuses_nan_everywhere_and_infinity_unless_the_bound_says_so():
    for bounds in [(None, None), (0.0, None), (0.0, 1.0), (None, math.inf), (-math.inf, math.inf)]:
        with pytest.raises(attention.InvalidOption, match="'x'=nan is not a number"):
            attention.check_range("x", math.nan, *bounds)
    with pytest.raises(attention.InvalidOption, match=r"'x'=inf out of range \[0\.0, inf\)"):
        attention.check_range("x", math.inf, 0.0)
    with pytest.raises(attention.InvalidOption, match=r"'x'=-inf out of range \(-inf, 1\.0\]"):
        attention.check_range("x", -math.inf, None, 1.0)
    with pytest.raises(attention.InvalidOption, match=r"'x'=inf out of range \[0\.0, inf\)"):
        attention.check_range("x", math.inf, 0.0, math.inf, hi_open=True)
    attention.check_range("x", math.inf, 0.0, math.inf)  # a bound explicitly open to infinity
    attention.check_range("x", 10**400, 0, None, integer=True)  # a huge integer is finite


def test_attn_options_dropout_nan_is_one_line_before_any_work():
    """The command line's path: `attn.options.dropout=nan` is a ConfigError (exit 2), not a traceback."""
    from lra.config import ConfigError, load

    with pytest.raises(ConfigError, match=r"'dropout'=nan is not a number; allowed: \[0\.0, 1\.0\)") as e:
        load(["preset=quick", "attn=softmax", "attn.options.dropout=nan"])
    assert "\n" not in str(e.value)
