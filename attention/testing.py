"""The backend contract (docs/design.md) as checks anyone can run on their own backend.

    import attention.testing
    report = attention.testing.check_backend("my_attention")  # raises AssertionError naming what broke
    print(report)   # 7 of 7 contract checks passed for my_attention: unknown_option_rejected, documented, ...

    python -m attention.testing my_attention               # the same, from a shell (prints the line)

Each check takes a registered name and raises ``AssertionError`` with a message; :data:`CHECKS` lists
them, so a test suite can parametrise over (name, check) with :func:`contract_cases`, one test case
per check, as tests/test_attention_contract.py does for every built-in backend. Shapes are small
(batch 2, 2 heads, n=128, head dim 16), fp32, CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from typing import Iterable

import torch

from attention.registry import BackendContractError, build, capabilities, describe, load_external

B, H, D, N = 2, 2, 16, 128


def make(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return build(name, num_heads=H, head_dim=D, max_len=N, **options).eval()


def qkv(n: int = N, seed: int = 1, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=dtype) for _ in range(3)]


def masks(n: int = N) -> dict[str, torch.Tensor]:
    """Padding at the end, and padding in the middle (and at the end) of the sequence."""
    end = torch.ones(B, n, dtype=torch.bool)
    end[0, n - 37 :] = False
    end[1, n - 5 :] = False
    middle = torch.ones(B, n, dtype=torch.bool)
    middle[0, 20:57] = False
    middle[1, 60:64] = False
    middle[1, n - 3 :] = False
    return {"end": end, "middle": middle}


def padding_shift(module, q, k, v, mask, *, scale=10.0, call_seed=1, noise_seed=2) -> torch.Tensor:
    """Largest change of the output at real positions when the padded positions of q, k, v are
    replaced by noise of ``scale`` (same torch seed for both calls, so sampling is identical)."""
    torch.manual_seed(call_seed)
    out1 = module(q, k, v, mask)
    pad = ~mask[:, None, :, None]
    g = torch.Generator().manual_seed(noise_seed)
    q2, k2, v2 = (torch.where(pad, scale * torch.randn(t.shape, generator=g), t) for t in (q, k, v))
    torch.manual_seed(call_seed)
    out2 = module(q2, k2, v2, mask)
    return (out1 - out2)[mask[:, None, :, None].expand_as(out1)].abs().max()


def check_unknown_option_rejected(name: str) -> None:
    try:
        build(name, num_heads=H, head_dim=D, max_len=N, no_such_option=1)
    except ValueError as e:
        assert "no_such_option" in str(e), f"{name}: the error for an unknown option does not name it: {e}"
    else:
        raise AssertionError(f"{name}: an unknown option was accepted")


def check_documented(name: str) -> None:
    """A class docstring for every backend (its first line is the backend's line in ``describe`` and
    the tables); a module docstring (paper, algorithm, complexity) for the built-in ones, the
    documentation of this package, not something a backend in the user's own package owes."""
    d = describe(name)
    assert d["doc"], f"{name}: the class needs a docstring (its first line is the one-line doc)"
    if d["module"].partition(".")[0] == __name__.partition(".")[0]:
        mod = __import__(d["module"], fromlist=["_"])
        assert (
            mod.__doc__ and len(mod.__doc__) > 80
        ), f"{name}: its module needs a docstring (paper, algorithm, complexity)"


def check_shape_finite_and_grads(name: str) -> None:
    m = make(name).train()
    q, k, v = (t.requires_grad_() for t in qkv())
    mask = masks()["middle"]
    torch.manual_seed(3)
    out = m(q, k, v, mask)
    assert out.shape == (B, H, N, D), f"{name}: output shape {tuple(out.shape)}, expected {(B, H, N, D)}"
    assert torch.isfinite(out).all(), f"{name}: non-finite output"
    (out * mask[:, None, :, None]).square().sum().backward()
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in (q, k, v)]
    assert all(torch.isfinite(g).all() for g in grads), f"{name}: non-finite gradients"
    assert grads[2].abs().sum() > 0, f"{name}: gradient must reach v"
    caps = capabilities(name)
    if caps.uses_qk:
        assert grads[0].abs().sum() > 0, f"{name}: gradient must reach q"
        if not caps.shared_qk:
            assert grads[1].abs().sum() > 0, f"{name}: gradient must reach k"


def check_padding_invariance(name: str, where: str = "middle") -> None:
    """Output at real tokens must not depend on padded content, padding at ``where`` (end | middle)."""
    diff = padding_shift(make(name), *qkv(), masks()[where], scale=10.0, call_seed=5, noise_seed=9)
    if capabilities(name).padding_mask:
        assert diff < 1e-4, f"{name}: real outputs moved by {float(diff):.3g} when padded content ({where}) changed"
    else:  # declared mask-blind (informer): the check must see it
        assert diff > 1e-4, f"{name}: declares padding_mask=False but ignores padded content"


def check_seeded_determinism(name: str) -> None:
    m, (q, k, v), mask = make(name), qkv(), masks()["end"]
    torch.manual_seed(11)
    a = m(q, k, v, mask)
    torch.manual_seed(11)
    assert torch.equal(a, m(q, k, v, mask)), f"{name}: torch.manual_seed does not fix the output"


def check_no_mask_equals_all_true(name: str) -> None:
    m, (q, k, v) = make(name), qkv()
    torch.manual_seed(2)
    a = m(q, k, v, None)
    torch.manual_seed(2)
    torch.testing.assert_close(
        a,
        m(q, k, v, torch.ones(B, N, dtype=torch.bool)),
        msg=lambda s: f"{name}: mask=None differs from an all-True mask: {s}",
    )


def _as_assertion(check):
    """The output check every built module carries (attention.registry.OutputContract) raises
    BackendContractError; a contract check reports it, like any other failure, as AssertionError."""

    @functools.wraps(check)
    def run(name: str) -> None:
        try:
            check(name)
        except BackendContractError as e:
            raise AssertionError(str(e)) from None

    return run


CHECKS = {
    name: _as_assertion(check)
    for name, check in {
        "unknown_option_rejected": check_unknown_option_rejected,
        "documented": check_documented,
        "shape_finite_and_grads": check_shape_finite_and_grads,
        "padding_at_end": lambda name: check_padding_invariance(name, "end"),
        "padding_in_middle": lambda name: check_padding_invariance(name, "middle"),
        "seeded_determinism": check_seeded_determinism,
        "no_mask_equals_all_true": check_no_mask_equals_all_true,
    }.items()
}


@dataclasses.dataclass(frozen=True)
class ContractReport:
    """What :func:`check_backend` checked: the backend and the checks it passed (all of :data:`CHECKS`,
    in order, or check_backend raises). ``str()`` is the one line to show."""

    backend: str
    passed: list[str]

    def __str__(self) -> str:
        return (
            f"{len(self.passed)} of {len(CHECKS)} contract checks passed for {self.backend}: {', '.join(self.passed)}"
        )


def check_backend(name: str) -> ContractReport:
    """Every contract check (:data:`CHECKS`) on backend ``name``: against an exact float64 reference or its
    own limit, padding at the end and in the middle, seeded determinism, no mask = all-true mask.

    Args:
        name: a registered name, yours included (register it first: ``@attention.register``, an entry
            point, or ``attention.load_external("my_pkg.attn:Mine")``).

    Returns:
        A :class:`ContractReport`; ``print`` it for the line ``7 of 7 contract checks passed for mine: ...``.
        It prints nothing itself. Every check runs; if any fails, one ``AssertionError`` names each failing
        check and what broke (``2 of 7 contract checks failed for mine: padding_at_end: ...; ...``).

    Example::

        import attention.testing
        report = attention.testing.check_backend("mine")   # in your test suite, or once at a prompt
        print(report)                                      # 7 of 7 contract checks passed for mine: ...
    """
    passed, failed = [], {}  # failed: message -> the checks that gave it (a NaN fails several alike: said once)
    for check_name, check in CHECKS.items():
        try:
            check(name)
        except AssertionError as e:
            failed.setdefault(str(e), []).append(check_name)
        else:
            passed.append(check_name)
    if failed:
        said = "; ".join(f"{', '.join(checks)}: {message}" for message, checks in failed.items())
        n = sum(map(len, failed.values()))
        raise AssertionError(f"{n} of {len(CHECKS)} contract checks failed for {name}: {said}")
    return ContractReport(name, passed)


def contract_cases(names: Iterable[str]) -> list:
    """pytest parameters ``(name, check)``, one per backend and contract check, so each check of each of
    your backends is its own test case (its id ``<name>-<check>``), and a failure names both.

    Args:
        names: registered backend names (register them before pytest collects the test: at import of
            your test module, e.g. ``attention.load_external(...)`` or importing your package).

    Returns:
        A list of ``pytest.param(name, check)``, ``check`` a callable of :data:`CHECKS` taking the name.

    Example::

        import pytest
        import attention.testing
        import my_pkg.attn  # registers "mine" and "yours"

        @pytest.mark.parametrize("name, check", attention.testing.contract_cases(["mine", "yours"]))
        def test_contract(name, check):
            check(name)
    """
    import pytest  # only where it is used: this package needs torch alone

    return [pytest.param(n, check, id=f"{n}-{c}") for n in names for c, check in CHECKS.items()]


def main(argv: list[str] | None = None) -> int:
    """``python -m attention.testing NAME [NAME ...]``: the contract checks, one line per backend."""
    p = argparse.ArgumentParser(
        prog="python -m attention.testing",
        description="Run the attention backend contract checks and print one line per backend.",
        epilog="examples:\n  python -m attention.testing softmax performer\n"
        "  python -m attention.testing my_pkg.attn:TempSoftmax     # a class: loaded first (attn.target's form)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("names", nargs="+", metavar="NAME", help="a registered backend, or package.module:ClassName")
    args = p.parse_args(argv)
    failed = 0
    for name in args.names:
        try:
            print(check_backend(load_external(name) if ":" in name else name), flush=True)
        except AssertionError as e:
            print(f"FAILED {e}", flush=True)
            failed += 1
        except ValueError as e:  # an unknown name or target: one line naming what exists
            print(f"error: {e}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
