"""The approximation study (lra.tools.approx): metric, outputs of --quick, budget trend, bad input."""

import csv
import math

import numpy as np
import pytest
import torch

import attention
from lra.tools import approx


def test_spectral_norm_matches_torch_and_hand_example():
    # [[3, 0], [4, 5]]: A^T A = [[25, 20], [20, 25]], eigenvalues 45 and 5, so ||A||_2 = sqrt(45) = 3 sqrt(5).
    a = torch.tensor([[3.0, 0.0], [4.0, 5.0]])
    assert approx.spectral_norm(a).item() == pytest.approx(3 * math.sqrt(5), rel=1e-12)
    assert approx.spectral_norm(torch.diag(torch.tensor([1.0, -7.0, 2.0]))).item() == pytest.approx(7.0)
    g = torch.Generator().manual_seed(0)
    for shape in [(3, 257, 32), (2, 4, 16, 40), (5, 5)]:  # tall, wide, square; batched
        m = torch.randn(*shape, generator=g, dtype=torch.float64)
        assert torch.allclose(approx.spectral_norm(m), torch.linalg.matrix_norm(m, ord=2), rtol=1e-10)


def test_relative_error_basics():
    x = torch.randn(2, 64, 32)
    assert torch.allclose(approx.relative_error(x, x), torch.zeros(2, dtype=torch.float64))
    assert torch.allclose(approx.relative_error(x, torch.zeros_like(x)), torch.ones(2, dtype=torch.float64))
    assert torch.allclose(approx.relative_error(x, 1.5 * x), torch.full((2,), 0.5, dtype=torch.float64))


def test_gaussian_reference_matches_definition():
    q, k, v = torch.randn(3, 2, 50, 32, dtype=torch.float64).unbind(0)
    c = torch.exp(-(torch.cdist(q, k) ** 2) / (2 * math.sqrt(32)))
    assert torch.allclose(approx.gaussian_attention(q, k, v), c @ v, atol=1e-10)


def test_quick_writes_csv_and_plot(tmp_path):
    res = approx.main(["--quick", "--out", str(tmp_path)])
    with open(tmp_path / "approx.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == approx.COLUMNS
        rows = list(reader)
    assert rows and len(rows) == len(res["rows"])
    assert {"method", "source", "n", "budget", "mean", "median", "stderr"} <= set(rows[0])
    assert {r["n"] for r in rows} == {"256"}
    assert {int(r["budget"]) for r in rows} == {8, 16, 32}
    for r in rows:
        assert int(r["trials"]) > 0 and int(r["failures"]) == 0, r
        for key in ("mean", "median", "stderr"):
            assert np.isfinite(float(r[key])), r
        if r["reference"].startswith("softmax"):
            assert 0.0 <= float(r["median"]) <= 2.5, r
    assert (tmp_path / "approx.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("approx_trials.csv", "summary.md", "meta.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp files left behind"


def _sampling_method() -> str:
    have = attention.available()
    for name in ("skeinformer", "informer", "nystrom"):
        if name in have:
            methods, skipped = approx.resolve_methods([name])
            if methods:
                return name
    return "amm_oracle"  # the built-in column-sampling sketch B S S^T V


def test_error_decreases_with_budget():
    name = _sampling_method()
    methods, _ = approx.resolve_methods([name])
    text, _ = approx.load_text(min_chars=20_000)
    sources, skipped = approx.make_sources(["pretrained"], text)
    if not sources:  # MiniLM package missing: the random LRA model still gives real attention
        sources, _ = approx.make_sources(["random"], text)
    rows, _, _ = approx.run_study(methods, sources, lengths=[512], budgets=[8, 128], trials=24, seed=0)
    err = {r["budget"]: r["mean"] for r in rows if r["reference"] == "softmax"}
    assert err[128] < err[8], (name, err)


def test_unknown_method_lists_available():
    with pytest.raises(ValueError) as info:
        approx.resolve_methods(["no_such_attention"])
    msg = str(info.value)
    assert "no_such_attention" in msg and "available" in msg and "softmax" in msg and "amm_oracle" in msg
    with pytest.raises(ValueError, match="available"):
        approx.main(["--quick", "--methods", "no_such_attention", "--out", "/nonexistent/never"])


def test_every_registered_backend_is_studied_or_skipped_with_reason():
    methods, skipped = approx.resolve_methods(None)
    names = {m.name for m in methods}
    assert names | set(skipped) == set(attention.available())
    assert all(reason for reason in skipped.values())
    for m in methods:  # a budget option that exists and builds at a small budget
        if m.budget_option is not None:
            assert m.budget_option in attention.option_defaults(m.name)
            m.build(16, 256, 2)


@pytest.mark.parametrize(
    "backend, options, reference",
    [
        ("kernelized", {"dropout": 0.0}, "gaussian_attention"),
        ("reformer", {"bucket_size": 128}, "shared_qk_attention"),  # one bucket: exact shared-QK attention
    ],
)
def test_own_references_match_the_backends_exact_limits(backend, options, reference):
    if backend not in attention.available():
        pytest.skip(f"{backend} not registered")
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 128, 32).unbind(0)
    out = attention.build(backend, num_heads=2, head_dim=32, max_len=128, **options).eval()(q[None], k[None], v[None])[
        0
    ]
    err = approx.relative_error(getattr(approx, reference)(q, k, v), out)
    assert (err < 1e-5).all(), err


def test_quirks_twin_builds_the_public_code_options_at_the_study_budget():
    methods, _ = approx.resolve_methods(["skyformer", "skeinformer", "linformer_jlt"])
    twins = {m.name: m for m in approx.with_quirks(methods, "skyformer")}
    assert set(twins) == {"skyformer[skyformer]"}  # the Skyformer code has no Skeinformer or JLT quirks
    mod = twins["skyformer[skyformer]"].build(16, 64, 2)
    assert (mod.options.num_landmarks, mod.options.ns_init, mod.options.landmark_split) == (
        16,
        "colsum_batch",
        "halves",
    )
    twin = {m.name: m for m in approx.with_quirks(methods, "skeinformer")}["skeinformer[skeinformer]"]
    assert twin.build(8, 64, 2).options.pilot_batch == "shared" and twin.budget_option == "num_features"


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """``python -m lra.tools.approx`` with an unknown method or a zero count: one line, exit 2 (bad input, as
    the README says; it was exit 1, and ``--lengths 0`` a ZeroDivisionError traceback), nothing written."""
    monkeypatch.setattr(
        "lra.tools.approx.command._keep_freed_memory", lambda: None
    )  # process-wide: not in the test process
    monkeypatch.setenv("LRA_RUNS", str(tmp_path / "runs"))
    for argv, words in (
        (["--methods", "no_such_attention"], ("no_such_attention", "available", "vmean")),
        (["--trials", "0"], ("--trials 0", ">= 1")),
        (["--lengths", "0"], ("--lengths 0", ">= 1")),
    ):
        monkeypatch.setattr("sys.argv", ["lra.tools.approx", "--quick", "--sources", "random", *argv])
        try:
            code = approx.cli()
        except SystemExit as stop:  # the argument parser's own errors
            code = stop.code
        assert code == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "runs").exists()


def test_figure_reads_like_the_papers_and_rerenders_byte_identical(tmp_path):
    from matplotlib.text import Text

    from lra.tools.approx import render

    rows = []
    for method, ref, base in (
        ("vmean", "softmax", 0.4),
        ("skeinformer_no_rownorm", "softmax", 0.3),
        ("amm_oracle", "softmax", 0.9),
        ("skyformer", "kernelized", 0.2),
        ("skyformer", "softmax", 30.0),
        ("nystrom[skyformer]", "softmax", 0.25),
    ):
        for budget in (8, 16, 32):
            err = base * (8 / budget) ** 0.5
            rows.append(
                dict(
                    method=method,
                    reference=ref,
                    source="random",
                    n=256,
                    budget=budget,
                    trials=24,
                    mean=err,
                    median=err,
                    stderr=0.01,
                )
            )
    fig = render.figure(rows)
    fig.draw_without_rendering()
    texts = [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    joined = "\n".join(texts)
    for code in ("skeinformer_no_rownorm", "amm_oracle", "nystrom[", "vmean", "×10", "$\\mathdefault"):
        assert code not in joined, code
    assert {
        "V-mean",
        "Skeinformer w/o row normalization",
        "Skyformer vs exact Gaussian kernel",
        "Nyströmformer (quirks of the Skyformer code)",
    } <= set(texts)
    assert "feature budget d (log scale)" in texts and "relative error (log scale)" in texts
    assert {"8", "16", "32"} <= set(texts)  # budgets as numbers, not 2^3
    assert "mean ± standard error over 24 trials" in joined
    assert "off the top" in joined and "Skyformer (15–30)" in joined.replace("\n", " ")  # the clipped line is named
    render.plot(tmp_path / "a.png", rows)
    render.plot(tmp_path / "b.png", rows)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
