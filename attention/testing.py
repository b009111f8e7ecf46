"""The backend contract (docs/design.md) as checks anyone can run on their own backend.

    import attention.testing
    attention.testing.check_backend("my_attention")        # raises AssertionError naming what broke

Each check takes a registered name and raises ``AssertionError`` with a message; :data:`CHECKS` lists
them, so a test suite can parametrise over (name, check) as tests/test_attention_contract.py does for
every built-in backend. Shapes are small (batch 2, 2 heads, n=128, head dim 16), fp32, CPU.
"""

from __future__ import annotations

import functools

import torch

from attention.registry import BackendContractError, build, capabilities, describe

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


def check_backend(name: str) -> None:
    """Every contract check (:data:`CHECKS`) on backend ``name``: against an exact float64 reference or its
    own limit, padding at the end and in the middle, seeded determinism, no mask = all-true mask.

    Args:
        name: a registered name, yours included (register it first: ``@attention.register``).

    Returns:
        None; the first failing check raises ``AssertionError`` saying what broke.

    Example::

        import attention.testing
        attention.testing.check_backend("mine")   # in your test suite, or once at a prompt
    """
    for check in CHECKS.values():
        check(name)
