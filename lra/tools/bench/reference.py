"""Reference mode: each attention module against the module its paper's public code ships, side by side.

``python -m lra.tools.bench --reference --skeinformer DIR [--skyformer DIR] [--nystromformer DIR]`` times one
attention module of ours and its public counterpart (forward + backward) on the same q, k, v, padding mask
(the last quarter of each sample is padding) and incoming gradient: batch 2, 2 heads, head dim 32, float32,
in one process, interleaved call by call (ours, theirs, then theirs, ours), so both sides see the same
machine. The folders are checkouts the user fetched (docs/bench.md, "Against the papers' code"); nothing
else in the harness needs them. Their code is imported and runs in the sandbox :mod:`lra.tools.fidelity` runs it in
(:mod:`lra.tools.their_code`).

Each pair is a row of the fidelity check (:data:`lra.tools.fidelity.ROWS`, the ListOps ones): ours built
with the preset's options, theirs with their ListOps config and the row's ``attn_type``, both at
max_seq_len = n and attention dropout 0. Where no draw is random the outputs are compared too (the real
query rows; the public code zeroes padded queries). Reported: the median of each side's calls and
ours / theirs, with the machine's load.
"""

from __future__ import annotations

import functools
import importlib
import math
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

import attention
from lra.config import load
from lra.devices import device_name
from lra.files import git_commit, write_csv, write_text
from lra.tools.fidelity import ROWS
from lra.tools.meter.timing import Load
from lra.tools.their_code import REPOS, performer_copy, public_code, their_config

LENGTHS = (1024, 2048, 4096)
SHAPE = {"batch": 2, "heads": 2, "head_dim": 32}
MIN_SAMPLE_S = 0.02  # a timed sample repeats a fast module's call to last at least this long
PAD = 0.25  # the share of each sample that is padding, at its end
CSV_COLUMNS = (
    "pair", "preset", "attn", "repo", "theirs", "n", "ours_ms", "theirs_ms", "ratio", "max_abs_diff", "repeats",
    "calls_ours", "calls_theirs",
)  # fmt: skip


@dataclass(frozen=True)
class Pair:
    preset: str
    attn: str  # ours: an attn= config under the preset
    theirs: str  # their attn_type
    impl: str | None = None  # softmax only: the implementation asked of ours (fused / materialized)
    randomized: bool = False

    @property
    def repo(self) -> str:
        return self.preset.removesuffix("_paper")

    @property
    def name(self) -> str:
        suffix = f"[{self.impl}]" if self.impl else ""
        return f"{self.repo}:{self.attn}{suffix}"


def pairs() -> list[Pair]:
    """The fidelity check's ListOps rows (one per preset and backend), softmax in both implementations."""
    out: dict[str, Pair] = {}
    for row in ROWS:
        if row.task != "listops":
            continue
        impls = ("materialized", "fused") if row.attn == "softmax" else (None,)
        for impl in impls:
            p = Pair(row.preset, row.attn, row.theirs, impl, row.randomized)
            out.setdefault(p.name, p)
    return list(out.values())


def _named(pair: Pair, name: str) -> bool:
    """``name`` is the pair's (``skeinformer:softmax[fused]``), without the repository, or its backend."""
    return name in (pair.name, pair.name.partition(":")[2], pair.attn)


def select(names: list[str] | None, roots: dict[str, Path]) -> list[Pair]:
    """The pairs whose repository was given, those named in ``names`` (a pair's name or its backend) only."""
    chosen = [p for p in pairs() if p.repo in roots]
    if names:
        unknown = [n for n in names if not any(_named(p, n) for p in pairs())]
        if unknown:
            raise ValueError(
                f"--backends {unknown[0]!r} has no public counterpart here; the pairs are "
                f"{', '.join(p.name for p in pairs())}"
            )
        chosen = [p for p in chosen if any(_named(p, n) for n in names)]
    if not chosen:
        raise ValueError(
            "no pair to time: pass the checkout of the public code the pairs need (--skeinformer, --skyformer, "
            "--nystromformer)"
        )
    return chosen


@functools.lru_cache(maxsize=None)
def _preset_attention(preset: str, attn: str):
    return load([f"preset={preset}", "task=listops", f"attn={attn}"]).model.attn  # a Hydra compose: once each


def ours(pair: Pair, n: int) -> torch.nn.Module:
    """Our attention module for the pair, with the preset's options, at length n, dropout 0."""
    spec = _preset_attention(pair.preset, pair.attn)
    options = dict(spec.options)
    if "dropout" in options:
        options["dropout"] = 0.0
    if pair.impl:
        options["impl"] = pair.impl
    return attention.build(spec.name, num_heads=SHAPE["heads"], head_dim=SHAPE["head_dim"], max_len=n, **options)


def theirs(pair: Pair, n: int, roots: dict[str, Path]) -> torch.nn.Module:
    """Their attention module (the ``attn`` of their ``Attention`` block), configured as their entry points
    configure ListOps with the pair's ``attn_type``, at max_seq_len = n and attention dropout 0."""
    with public_code(roots[pair.repo] / REPOS[pair.repo].code, performer_copy(pair.repo, roots)):
        block = importlib.import_module("attention" if pair.repo == "nystromformer" else "models.attention").Attention
        model = their_config(pair.repo, "listops", pair.theirs)
        model.update(
            attn_type=pair.theirs,
            max_seq_len=n,
            seq_len=n,
            num_head=SHAPE["heads"],
            head_dim=SHAPE["head_dim"],
            attention_dropout=0.0,
            attention_grad_checkpointing=False,
            mixed_precision=False,
            device="cpu",
        )
        torch.manual_seed(0)
        return block(model).attn.train()


def inputs(n: int, seed: int):
    g = torch.Generator().manual_seed(seed * 100003 + n)
    shape = (SHAPE["batch"], SHAPE["heads"], n, SHAPE["head_dim"])
    q, k, v, dout = (torch.randn(shape, generator=g) for _ in range(4))
    real = n - int(PAD * n)
    keep = torch.zeros(SHAPE["batch"], n, dtype=torch.bool)
    keep[:, :real] = True
    return q, k, v, keep, dout, real


def share_parameters(ours_: torch.nn.Module, theirs_: torch.nn.Module) -> bool:
    """Copy their parameters into ours where both hold the same shapes in the same order (Nyström's
    convolution): then outputs can be compared. False where they cannot be paired."""
    mine, their = list(ours_.parameters()), list(theirs_.parameters())
    if len(mine) != len(their) or any(a.shape != b.shape for a, b in zip(mine, their)):
        return False
    with torch.no_grad():
        for a, b in zip(mine, their):
            a.copy_(b)
    return True


def _call(module, q, k, v, mask, dout, seed: int) -> tuple[float, torch.Tensor]:
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    torch.manual_seed(seed)  # the same draws' seed on both sides (equal draws only where both draw alike)
    t0 = time.perf_counter()
    out = module(q, k, v, mask)
    out.backward(dout)
    return time.perf_counter() - t0, out.detach()


def measure(pair: Pair, n: int, roots: dict[str, Path], repeats: int, warmup: int, seed: int) -> dict:
    """Medians of ``repeats`` interleaved fwd+bwd calls of ours and theirs (after ``warmup`` of each)."""
    q, k, v, keep, dout, real = inputs(n, seed)
    sides = {"ours": (ours(pair, n), keep), "theirs": (theirs(pair, n, roots), keep.float())}
    comparable = not pair.randomized and share_parameters(sides["ours"][0], sides["theirs"][0])
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    outs: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():  # their code's deprecation warnings are not ours to fix
        warnings.simplefilter("ignore")
        first = {}
        for side in ("ours", "theirs"):  # first calls: the outputs, and how long one call takes
            module, mask = sides[side]
            first[side], outs[side] = _call(module, q, k, v, mask, dout, seed)
        # a sample lasts at least MIN_SAMPLE_S (several calls of a fast module): the clock's and the
        # scheduler's jitter are then a small part of it
        calls = {side: max(1, math.ceil(MIN_SAMPLE_S / max(t, 1e-6))) for side, t in first.items()}
        for i in range(warmup + repeats):
            order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
            for side in order:
                module, mask = sides[side]
                c = calls[side]
                t = sum(_call(module, q, k, v, mask, dout, seed + i)[0] for _ in range(c)) / c
                if i >= warmup:
                    times[side].append(t)
    a, b = statistics.median(times["ours"]), statistics.median(times["theirs"])
    diff = None if not comparable else float((outs["ours"] - outs["theirs"])[:, :, :real].abs().max())
    return {
        "pair": pair.name,
        "preset": pair.preset,
        "attn": pair.attn,
        "repo": pair.repo,
        "theirs": pair.theirs,
        "n": n,
        "ours_ms": a * 1e3,
        "theirs_ms": b * 1e3,
        "ratio": a / b,
        "max_abs_diff": diff,
        "repeats": repeats,
        "calls_ours": calls["ours"],
        "calls_theirs": calls["theirs"],
    }


@dataclass(frozen=True)
class ReferenceConfig:
    roots: dict  # repo name -> checkout folder
    pairs: tuple
    lengths: tuple = LENGTHS
    repeats: int = 7
    warmup: int = 1
    threads: int = 1
    seed: int = 0


def check_roots(roots: dict[str, Path]) -> None:
    """Each given folder holds the public code it was given as (one line naming what is missing)."""
    for name, root in roots.items():
        wrapper = root / REPOS[name].code / REPOS[name].wrapper
        if not wrapper.is_file():
            raise ValueError(
                f"--{name} {root}: no {REPOS[name].code}/{REPOS[name].wrapper} there; pass a checkout of "
                f"{REPOS[name].url}"
            )


def render(rows: list[dict], meta: dict) -> str:
    lengths = sorted({r["n"] for r in rows})
    head = "| pair (ours vs theirs) | " + " | ".join(f"n={n}: ours / theirs ms, ratio" for n in lengths) + " |"
    lines = [
        "# Attention modules against the papers' public code",
        "",
        f"{meta['device']} · torch {meta['torch']} · {meta['threads']} thread(s) · batch {SHAPE['batch']}, "
        f"{SHAPE['heads']} heads, head dim {SHAPE['head_dim']}, last {PAD:.0%} padding · forward + backward · "
        f"median of {meta['repeats']} interleaved samples each (a sample: at least {MIN_SAMPLE_S * 1e3:.0f} ms of "
        f"calls) · commit {meta['commit']}",
        "",
        f"{meta['load_line']}",
        "",
        head,
        "|---|" + "---|" * len(lengths),
    ]
    for name in dict.fromkeys(r["pair"] for r in rows):
        cells = []
        for n in lengths:
            r = next((r for r in rows if r["pair"] == name and r["n"] == n), None)
            cells.append("–" if r is None else f"{r['ours_ms']:.1f} / {r['theirs_ms']:.1f}, **{r['ratio']:.2f}**")
        theirs_ = next(r["theirs"] for r in rows if r["pair"] == name)
        lines.append(f"| {name} vs {theirs_} | " + " | ".join(cells) + " |")
    worst = max(rows, key=lambda r: r["ratio"])
    lines += ["", f"Slowest relative to theirs: {worst['pair']} at n={worst['n']}, {worst['ratio']:.2f}."]
    diffs = [r for r in rows if r["max_abs_diff"] is not None]
    if diffs:
        d = max(diffs, key=lambda r: r["max_abs_diff"])
        lines.append(
            f"Outputs of the pairs without random draws agree to {d['max_abs_diff']:.1e} (largest |Δ| over real "
            f"query rows: {d['pair']} at n={d['n']})."
        )
    if meta.get("load_warning"):
        lines += ["", f"**{meta['load_warning']}**"]
    return "\n".join(lines) + "\n"


def run_reference(cfg: ReferenceConfig, out: Path) -> list[dict]:
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, out)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: ReferenceConfig, out: Path) -> list[dict]:
    load_ = Load(threads=cfg.threads)
    rows = []
    for pair in cfg.pairs:
        for n in cfg.lengths:
            r = measure(pair, n, cfg.roots, cfg.repeats, cfg.warmup, cfg.seed)
            print(
                f"{r['pair']:<34} n={n:<5} ours {r['ours_ms']:8.1f} ms  theirs {r['theirs_ms']:8.1f} ms  "
                f"ratio {r['ratio']:.2f}",
                flush=True,
            )
            rows.append(r)
    load_.stop()
    meta = {
        "device": device_name("cpu"),
        "torch": torch.__version__,
        "threads": cfg.threads,
        "repeats": cfg.repeats,
        "commit": git_commit(short=True) or "unknown",
        "load_line": load_.line(),
        "load_warning": load_.warning(),
    }
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "reference.csv", rows, CSV_COLUMNS)
    write_text(out / "reference.md", render(rows, meta))
    print(meta["load_line"])
    if meta["load_warning"]:
        print(meta["load_warning"])
    print(f"wrote {out / 'reference.md'} and reference.csv")
    return rows
