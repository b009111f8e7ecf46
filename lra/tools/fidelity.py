"""Fidelity check: the ``paper`` presets' classifiers against the public code they reproduce.

Each row builds the public code's classifier from a local checkout (imported at run time; nothing of it is
copied here), copies its weights into the harness's classifier of the preset, forces the random draws equal
and compares the logits on one right-padded batch; the chunk table compares their accumulation chunks with
the memory fit's micro-batches. What each row and column means, the tolerances and the measured table:
docs/fidelity.md, "Equivalence, measured". How their code is imported: :mod:`lra.tools.their_code`.

    python -m lra.tools.fidelity --skeinformer ~/src/Skeinformer --skyformer ~/src/Skyformer \\
        --nystromformer ~/src/Nystromformer [--rows skeinformer_paper:listops:skeinformer ...] [--out t.md]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import operator
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

import attention.skeinformer as skein
from lra.cli import Parser
from lra.config import load
from lra.files import write_text
from lra.fit import plan
from lra.model import build_model
from lra.tasks import TASK_NAMES
from lra.tools.their_code import REPOS, performer_copy, public_code, their_config

SKEIN_NAMES = {"skeinformer", "skein_nopilot", "skein_uniform", "skein_simplenorm", "skein_nonorm"}
LENGTHS = {
    "listops": (2000, 1100, 517),
    "listops-short": (2000, 1100, 150),
    # split as their code splits them; one short sample in the last chunk sets the Skeinformer budget
    "listops-chunks": (2000, 1700, 1200, 600, 2000, 1500, 150, 900),
    "text-chunks": (4000, 3600, 2900, 1800, 4000, 3100, 200, 2500),
}
CHUNKED_BATCH = 8  # samples of a *-chunks row (train.batch_size of ours)
SEED = 7  # before every forward: Skyformer draws its landmarks from torch's global RNG on both sides


@dataclass(frozen=True)
class Row:
    preset: str
    task: str  # listops | listops-short | pathfinder
    attn: str  # our backend
    theirs: str  # their attn_type

    @property
    def key(self) -> str:
        return f"{self.preset}:{self.task}:{self.attn}"

    @property
    def repo(self) -> str:
        return self.preset.removesuffix("_paper")

    @property
    def chunked(self) -> bool:
        return self.task.endswith("-chunks")

    @property
    def randomized(self) -> bool:
        return self.theirs in SKEIN_NAMES | {"skyformer"} or self.theirs.startswith(("performer", "linformer"))


def _rows(preset: str, spec: str) -> list[Row]:
    return [Row(preset, *item.split(":")) for item in spec.split()]


ROWS: list[Row] = (
    _rows(
        "skeinformer_paper",
        "listops:softmax:softmax listops:skeinformer:skeinformer "
        "listops:skeinformer_no_pilot:skein_nopilot listops:skeinformer_uniform:skein_uniform "
        "listops:skeinformer_simple_rownorm:skein_simplenorm listops:skeinformer_no_rownorm:skein_nonorm "
        "listops:vmean:vmean listops-short:skeinformer:skeinformer listops-short:skeinformer_no_rownorm:skein_nonorm "
        "pathfinder:skeinformer:skeinformer listops:performer:performer listops:linformer:linformer "
        "listops:nystrom:nystrom",
    )
    + _rows(
        "skyformer_paper",
        "listops:softmax:softmax listops:skyformer:skyformer listops:kernelized:kernelized "
        "listops:performer:performer listops:linformer:linformer listops:nystrom:nystrom "
        "pathfinder:softmax:softmax pathfinder:skyformer:skyformer",
    )
    + _rows(
        "nystromformer_paper",
        "listops:softmax:softmax listops:nystrom:nystrom-64 "
        "listops:linformer:linformer-256 listops:performer:performer-256",
    )
    + _rows(
        "skeinformer_paper", "text-chunks:skeinformer:skeinformer " "listops-chunks:skeinformer_no_rownorm:skein_nonorm"
    )
    + _rows("nystromformer_paper", "image-chunks:nystrom:nystrom-64")
)
# their attn_type -> our attention config, for the chunk table; their other names are no run of ours
# (Skein/Sky softmaxRBF32 runs plain softmax, docs/fidelity.md E6; Nys nystrom-32/128/256: other budgets)
_SAME = "nystrom linformer performer informer bigbird reformer"  # their name is ours
THEIR_ATTN = {
    "skeinformer": {
        **{a: a for a in f"softmax {_SAME} vmean skeinformer".split()},
        "skein_uniform": "skeinformer_uniform",
        "skein_nonorm": "skeinformer_no_rownorm",
        "skein_simplenorm": "skeinformer_simple_rownorm",
        "skein_nopilot": "skeinformer_no_pilot",
    },
    "skyformer": {a: a for a in f"softmax kernelized skyformer {_SAME}".split()},
    "nystromformer": {
        "softmax": "softmax",
        "nystrom-64": "nystrom",
        "linformer-256": "linformer",
        "performer-256": "performer",
        "reformer-2": "reformer",
        "linear": "linear",
    },
}
CHUNK_ROWS = [
    Row(p, t, "chunks", "") for p in ("skeinformer_paper", "skyformer_paper", "nystromformer_paper") for t in TASK_NAMES
]  # their config's counts against our plan, every attention of theirs we have


def their_model(row: Row, roots: dict[str, Path]) -> nn.Module:
    """Their ModelForSC for the row, configured as their entry points do, on CPU in float32."""
    repo, task = REPOS[row.repo], row.task.split("-")[0]
    with public_code(roots[row.repo] / repo.code, performer_copy(row.repo, roots)):
        model = their_config(row.repo, task, row.theirs)
        model.update(
            attn_type=row.theirs, mixed_precision=False, max_seq_len=2 ** math.ceil(math.log2(model["max_seq_len"]))
        )  # their entry points round up
        if row.repo == "nystromformer":  # attention_nystrom.py reads seq_len, which run_tasks.py never sets
            model.setdefault("seq_len", model["max_seq_len"])
        else:
            model["device"] = "cpu"
        torch.manual_seed(0)
        return importlib.import_module(repo.module).ModelForSC(model).eval()


def their_blocks(root: Path, task: str, attn_type: str, n: int, layers: int, attn_class: str = "", **changes):
    """``layers`` of the Skeinformer code's ``Attention`` block (projections, attention, output projection,
    checkpointed where theirs is) for ``task`` at length ``n``, configured as their entry point does with
    ``changes``; ``attn_class`` ("module.Class") replaces the attention their attn_selector would pick."""
    with public_code(root / REPOS["skeinformer"].code):
        model = their_config("skeinformer", task, attn_type)
        model.update(attn_type=attn_type, max_seq_len=n, device="cpu", **changes)
        blocks = [importlib.import_module("models.attention").Attention(model) for _ in range(layers)]
        if attn_class:
            module, name = attn_class.rsplit(".", 1)
            for b in blocks:
                b.attn = getattr(importlib.import_module(module), name)(model)
        return blocks


def their_logits(theirs: nn.Module, toks: torch.Tensor) -> torch.Tensor:
    """Their forward returns loss and accuracy only: the logits are read off the head."""
    out = {}
    hook = theirs.seq_classifer.register_forward_hook(lambda m, i, o: out.setdefault("logits", o))
    torch.manual_seed(SEED)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs(toks, (toks != 0).float(), torch.zeros(toks.shape[0], dtype=torch.long))
    hook.remove()
    return out["logits"]


def their_chunks(repo: str, task: str, roots: dict[str, Path]) -> tuple[int, dict[str, int]]:
    """Their batch for the task and each attention's accumulation chunks, as their entry point counts them
    (main.py: bz_rate, else 1; run_tasks.py: max(batch // GPUs // gpu_memory, 1), one GPU)."""
    with public_code(roots[repo] / REPOS[repo].code):
        if repo == "nystromformer":
            cfg = importlib.import_module("lra_config").config
            cfg = cfg["pathfinder32" if task == "pathfinder" else task]
            batch = cfg["training"]["batch_size"]
            return batch, {name: max(batch // 1 // mem, 1) for name, mem in cfg["gpu_memory"].items()}
        cfg = importlib.import_module("config").Config["lra-" + task]
        extra = cfg["extra_attn_config"]
        return cfg["training"]["batch_size"], {a: x.get("bz_rate", 1) for a, x in extra.items()}


def compare_chunks(row: Row, roots: dict[str, Path]) -> dict:
    """Their chunk sizes (``torch.chunk`` of their batch) against our micro-batch x accumulation."""
    batch, counts = their_chunks(row.repo, row.task, roots)
    cells, bad, other = [], [], sorted(set(counts) - set(THEIR_ATTN[row.repo]))
    for theirs, ours in THEIR_ATTN[row.repo].items():
        k = counts.get(theirs, 1)
        p = plan(load([f"preset={row.preset}", f"task={row.task}", f"attn={ours}", "hardware=cpu"]))
        sizes = [len(c) for c in torch.arange(batch).chunk(k)]
        if p.effective_batch != batch or [p.micro_batch] * p.accum_steps != sizes:
            bad.append(f"**{ours}: theirs {k} x {sizes[0]}, ours {p.accum_steps} x {p.micro_batch}**")
        elif k > 1:
            cells.append(f"{ours} {k} x {sizes[0]}")
    return {
        "row": row,
        "batch": batch,
        "n": len(THEIR_ATTN[row.repo]),
        "bad": bad,
        "notes": ", ".join(bad + cells) or "1 for every attention",
        "other": ", ".join(other),
    }


# ----------------------------------------------------------------------------- weights
_B, _T = r"encoder\.blocks\.(\d+)\.", "model.transformer_{0}."
WEIGHT_MAP: tuple[tuple[str, tuple[str, ...]], ...] = (  # our state_dict name -> their attribute path(s)
    (r"encoder\.tok\.weight", ("model.embeddings.word_embeddings.weight",)),
    (r"encoder\.pos\.weight", ("model.embeddings.position_embeddings.weight",)),
    (_B + r"ln([12])\.(weight|bias)", (_T + "norm{1}.{2}",)),
    (_B + r"mha\.qkv\.(weight|bias)", tuple(_T + f"mha.W_{x}.{{1}}" for x in "qkv")),  # stacked along rows
    (_B + r"mha\.out\.(weight|bias)", (_T + "mha.ff.{1}",)),
    (_B + r"mlp\.([03])\.(weight|bias)", (_T + "mlpblock.{1}.{2}",)),
    (r"encoder\.ln\.(weight|bias)", ("model.norm.{0}",)),
    (r"head\.([02])\.(weight|bias)", ("seq_classifer.mlpblock.{0}.{1}",)),
    (_B + r"mha\.attn\.(?:inner\.)?conv\.weight", (_T + "mha.attn.conv.weight",)),
    (_B + r"mha\.attn\.(?:inner\.)?E", (_T + "mha.attn.E",)),  # transposed; a class attribute in the Nyström code
    (_B + r"mha\.attn\.(?:inner\.)?omega", (_T + "mha.attn.attn_fn.projection_matrix",)),
)
DRAWN = ("E", "omega")  # random projections: copied only when forcing the draws, and only if the shapes agree


def weight_map(names: list[str]) -> dict[str, tuple[str, ...]]:
    """Their attribute paths for each of our names that has a counterpart (others are left out)."""
    found = {}
    for name in names:
        for pattern, paths in WEIGHT_MAP:
            if m := re.fullmatch(pattern, name):
                found[name] = tuple(p.format(*m.groups()) for p in paths)
                break
    return found


def copy_weights(ours: nn.Module, theirs: nn.Module, *, draws: bool) -> list[str]:
    """Theirs -> ours for every mapped tensor; returns the attention tensors copied (for the notes)."""
    state, notes = ours.state_dict(keep_vars=True), set()
    with torch.no_grad():
        for name, paths in weight_map(list(state)).items():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in DRAWN and not draws:
                continue
            value = torch.cat([operator.attrgetter(p)(theirs).detach() for p in paths])
            value = value.transpose(-1, -2) if leaf == "E" else value
            if name == "encoder.tok.weight":  # their table may have more rows than our vocabulary
                value = value[: state[name].shape[0]]
            if value.shape != state[name].shape:
                if leaf in DRAWN:  # e.g. a clean run shapes its projection otherwise: keeps its own draw
                    continue
                raise ValueError(f"{name}: ours {tuple(state[name].shape)}, theirs {tuple(value.shape)} ({paths[0]})")
            state[name].copy_(value)
            if ".mha.attn." in name:
                notes.add("conv" if leaf == "weight" else leaf)
    return sorted(notes)


# ----------------------------------------------------------------------------- draws
class DrawMismatch(RuntimeError):
    """Our forward asked for other draws than their forward made."""


class DrawReplay:
    """Their torch.rand / torch.multinomial results, recorded in call order, fed to our samplers."""

    def __init__(self, seed: int = 1) -> None:
        self.uniforms: list[torch.Tensor] = []
        self.columns: list[torch.Tensor] = []
        self._gen = torch.Generator().manual_seed(seed)  # real draws, from a generator of our own

    @contextlib.contextmanager
    def recording(self) -> Iterator[DrawReplay]:
        rand, multinomial = torch.rand, torch.multinomial

        def rec_rand(*size, **kw):
            self.uniforms.append(rand(*size, generator=self._gen, **kw))
            return self.uniforms[-1]

        def rec_multinomial(w, num_samples, replacement=False, **kw):
            self.columns.append(multinomial(w, num_samples, replacement, generator=self._gen, **kw))
            return self.columns[-1]

        torch.rand, torch.multinomial = rec_rand, rec_multinomial
        try:
            yield self
        finally:
            torch.rand, torch.multinomial = rand, multinomial

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        """Our pilot_uniforms / gumbel_topk return the recorded draws in order; all must be used."""
        uniforms, columns = list(self.uniforms), list(self.columns)

        def take(queue: list[torch.Tensor], what: str) -> torch.Tensor:
            if not queue:
                raise DrawMismatch(f"our forward asked for more {what} draws than theirs made")
            return queue.pop(0)

        def pilot_uniforms(shape: tuple, device) -> torch.Tensor:
            u = take(uniforms, "torch.rand").reshape(-1)
            if u.numel() > shape[-1]:
                raise DrawMismatch(f"their {u.numel()} pilot uniforms do not fit our {shape[-1]} slots")
            out = torch.zeros(shape, device=device)  # slots past their d are past our d_eff: never valid
            out[..., : u.numel()] = u.to(device)
            return out

        def gumbel_topk(log_w: torch.Tensor, d: int, kth=None) -> tuple[torch.Tensor, torch.Tensor]:
            b, h, n = log_w.shape
            cols = take(columns, "torch.multinomial").to(log_w.device)
            if cols.numel() % (b * h) or cols.numel() // (b * h) > d:
                raise DrawMismatch(f"their columns {tuple(cols.shape)} do not fit our (B, H, d) = ({b}, {h}, {d})")
            # kappa = -inf: only row_norm="exact" with Horvitz-Thompson weights reads it, no paper preset
            return pad_distinct(cols.view(b, h, -1), d, n), log_w.new_full((b, h, 1), -math.inf)

        saved = skein.pilot_uniforms, skein.gumbel_topk
        skein.pilot_uniforms, skein.gumbel_topk = pilot_uniforms, gumbel_topk
        try:
            yield
        finally:
            skein.pilot_uniforms, skein.gumbel_topk = saved
        if uniforms or columns:
            raise DrawMismatch(f"{len(uniforms)} torch.rand and {len(columns)} torch.multinomial draws left unused")


def pad_distinct(cols: torch.Tensor, d: int, n: int) -> torch.Tensor:
    """(b, h, k) distinct positions -> (b, h, d): the extra slots (past d_eff, so invalid) get the
    smallest unused positions, so the columns stay distinct."""
    used = torch.zeros(*cols.shape[:-1], n, dtype=torch.uint8, device=cols.device).scatter(-1, cols, 1)
    return torch.cat([cols, torch.argsort(used, dim=-1, stable=True)[..., : d - cols.shape[-1]]], -1)


# ----------------------------------------------------------------------------- one row
def make_batch(task: str, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if task in LENGTHS:  # right padding, lengths differing across the batch
        toks = torch.zeros(len(LENGTHS[task]), n, dtype=torch.long)
        for i, length in enumerate(LENGTHS[task]):
            toks[i, :length] = torch.randint(1, 257 if task.startswith("text") else 15, (length,), generator=g)
        return toks
    rows = CHUNKED_BATCH if task.endswith("-chunks") else 3
    toks = torch.randint(1, 256, (rows, n), generator=g)  # pixels: many zeros anywhere, and a zero tail
    for i in range(rows):
        toks[i][torch.rand(n, generator=g) < (0.6, 0.85, 0.95)[i % 3]] = 0
    toks[1, -100:] = 0
    return toks


@contextlib.contextmanager
def budgets(out: list[int]) -> Iterator[None]:
    """Our Skeinformer's batch budget d of every forward (``gumbel_topk``'s kth), in call order."""
    inner = skein.gumbel_topk
    skein.gumbel_topk = lambda log_w, d, kth=None: (
        out.append(int(kth)) if kth is not None else None,
        inner(log_w, d, kth),
    )[1]
    try:
        yield
    finally:
        skein.gumbel_topk = inner


def compare(row: Row, roots: dict[str, Path]) -> dict:
    """The row's max |logit diff| per column, their max |logit|, and notes on what was forced; a chunked
    row also runs ours as one micro-batch (train.chunks=1) for its notes."""
    theirs, task = their_model(row, roots), row.task.split("-")[0]
    base = [f"preset={row.preset}", f"task={task}", f"attn={row.attn}"]
    base += [f"train.batch_size={CHUNKED_BATCH}", "hardware=cpu"] if row.chunked else []
    spec = {"paper": load(base), "clean": load([*base, "quirks=none"])}  # the preset's quirks, then none
    spec["one"] = load([*base, "train.chunks=1"])
    toks = make_batch(row.task, spec["paper"].model.seq_len)
    k = their_chunks(row.repo, task, roots)[1].get(row.theirs, 1) if row.chunked else 1
    replay, skein_row = DrawReplay(), row.theirs in SKEIN_NAMES
    with replay.recording() if skein_row else contextlib.nullcontext():
        lt = torch.cat([their_logits(theirs, c) for c in toks.chunk(k)])  # as main.py / run_tasks.py split
    res, ds = {"row": row, "scale": lt.abs().max().item(), "unforced": math.nan}, {}
    columns = [("paper", "paper", True), ("clean", "clean", True), ("unforced", "paper", False)]
    for column, sem, force in columns + ([("one", "one", not row.randomized)] if row.chunked else []):
        if column == "unforced" and not row.randomized:
            continue
        torch.manual_seed(123)
        ours = build_model(spec[sem].model).eval()
        copied = copy_weights(ours, theirs, draws=force)
        # theirs always masks ids != 0; ours: task.mask (pixels: "nonzero" in paper, every pixel in clean)
        every_pixel = task in ("pathfinder", "image") and spec[sem].data.spec.mask != "nonzero"
        mask = torch.ones_like(toks, dtype=torch.bool) if every_pixel else toks != 0
        micro = plan(spec[sem]).micro_batch if row.chunked else len(toks)  # ours: the loader's micro-batches
        torch.manual_seed(SEED if force else SEED + 1)
        forced = replay.replaying() if skein_row and column == "paper" else contextlib.nullcontext()
        with torch.no_grad(), forced, budgets(ds.setdefault(column, [])):
            out = torch.cat([ours(t, m) for t, m in zip(toks.split(micro), mask.split(micro))])
        res[column] = (out - lt).abs().max().item()
        if column == "paper":
            res["notes"] = "; ".join(
                ([f"copied {', '.join(copied)}"] if copied else [])
                + ([f"replayed {len(replay.uniforms)} u + {len(replay.columns)} column draws"] if skein_row else [])
                + ([f"same torch seed ({SEED}) before both forwards"] if row.theirs == "skyformer" else [])
                + ([f"{k} chunks of {len(toks) // k}, ours micro-batch {micro}"] if row.chunked else [])
            )
    if row.chunked:
        their_d = [u.numel() for u in replay.uniforms]
        res["notes"] += (f"; d per forward theirs {their_d}, ours {ds['paper']}" if their_d else "") + (
            f"; one micro-batch (train.chunks=1{', own draws' if row.randomized else ''}):"
            + (f" d {ds['one']}," if ds["one"] else "")
            + f" max |diff| {res.pop('one'):.2e}"
        )
    return res


# ----------------------------------------------------------------------------- table and entry
def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2e}"


def markdown(results: list[dict], skipped: list[str]) -> tuple[str, int]:
    """The tables, and how many paper rows are above their tolerance (or failed) or chunk rows disagree."""
    chunks, results = [r for r in results if "bad" in r], [r for r in results if "bad" not in r]
    lines = [
        "max |logit diff| ours vs theirs, 3 samples, eval, CPU fp32 (python -m lra.tools.fidelity --help)",
        "",
        "| preset | task | attn | their name | paper | clean | unforced | max \\|logit\\| | notes |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    bad = 0
    for r in results:
        row, tol = r["row"], REPOS[r["row"].repo].tolerance
        ok = r["paper"] <= tol  # False for nan: a row that failed
        bad += not ok
        notes = "; ".join(([] if ok else [f"**above {tol:g}**"]) + ([r["notes"]] if r["notes"] else []))
        lines.append(
            f"| {row.preset} | {row.task} | {row.attn} | {row.theirs} | {_num(r['paper'])} | "
            f"{_num(r['clean'])} | {_num(r['unforced'])} | {r['scale']:.3g} | {notes} |"
        )
    lines += [""] + [f"not compared: {s}" for s in skipped]
    if chunks:
        lines += [""] * bool(skipped) + [
            "accumulation chunks, their config vs our plan (the preset's quirks, hardware=cpu)",
            "",
            "| preset | task | their batch | chunks > 1: attention, chunks x size | agree | not ours |",
            "|---|---|---:|---|---:|---|",
        ]
        lines += [
            f"| {r['row'].preset} | {r['row'].task} | {r['batch']} | {r['notes']} | "
            f"{r['n'] - len(r['bad'])}/{r['n']} | {r['other']} |"
            for r in chunks
        ] + [""]
    tolerances = ", ".join(f"{name} code {repo.tolerance:g}" for name, repo in REPOS.items())
    lines.append(
        f"{bad} of {len(results)} paper rows above tolerance ({tolerances})"
        if bad
        else f"all {len(results)} paper rows within tolerance ({tolerances})"
    )
    off = sum(bool(r["bad"]) for r in chunks)
    if chunks:
        lines.append(f"{off} of {len(chunks)} chunk rows disagree" if off else f"all {len(chunks)} chunk rows agree")
    return "\n".join(lines) + "\n", bad + off


EXAMPLES = """examples:
  python -m lra.tools.fidelity --skeinformer ~/src/Skeinformer --skyformer ~/src/Skyformer \\
      --nystromformer ~/src/Nystromformer
  python -m lra.tools.fidelity --skeinformer ~/src/Skeinformer --rows skeinformer_paper:listops:skeinformer \\
      --out t.md"""


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict[str, Path], list[Row], list[str]]:
    """Options, the checkouts by repo, the rows to run, and the rows that cannot run (why)."""
    p = Parser(
        prog="python -m lra.tools.fidelity",
        description=__doc__.split("\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for name, repo in REPOS.items():
        p.add_argument(
            f"--{name}",
            type=lambda s: Path(s).expanduser(),
            metavar="PATH",
            help=f"a checkout of {repo.url} (the repository root)",
        )
    p.add_argument(
        "--rows",
        nargs="+",
        metavar="PRESET:TASK:ATTN",
        help="only these rows (default: every row of the checkouts given)",
    )
    p.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    args = p.parse_args(argv)
    roots = {name: getattr(args, name) for name in REPOS if getattr(args, name) is not None}
    for name, root in roots.items():
        if not (root / REPOS[name].code / REPOS[name].wrapper).is_file():
            p.error(f"--{name} {root}: no {REPOS[name].code}/{REPOS[name].wrapper} there; clone {REPOS[name].url}")
    if not roots:
        p.error("give at least one checkout: --skeinformer, --skyformer or --nystromformer PATH")
    known = {r.key: r for r in ROWS + CHUNK_ROWS}
    for key in args.rows or ():
        if key not in known:
            p.error(f"--rows {key}: no such row; rows: {', '.join(known)}")
        if known[key].repo not in roots:
            p.error(f"--rows {key} needs --{known[key].repo} PATH")
    rows = [known[k] for k in args.rows] if args.rows else [r for r in ROWS + CHUNK_ROWS if r.repo in roots]
    # the Nyström code's performer imports pip performer_pytorch; the Skeinformer repo ships a copy
    no_performer = [
        r
        for r in rows
        if r.repo == "nystromformer"
        and r.theirs.startswith("performer")
        and importlib.util.find_spec("performer_pytorch") is None
        and "skeinformer" not in roots
    ]
    skipped = [f"{r.key} (needs pip performer_pytorch, or --skeinformer PATH for its copy)" for r in no_performer]
    return args, roots, [r for r in rows if r not in no_performer], skipped


def main(argv: list[str] | None = None) -> int:
    args, roots, rows, skipped = parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    results = []
    for i, row in enumerate(rows):
        print(f"[{i + 1}/{len(rows)}] {row.key}", file=sys.stderr, flush=True)
        try:
            results.append((compare_chunks if row.attn == "chunks" else compare)(row, roots))
        except Exception as err:  # a row that cannot run is reported (and fails), not fatal
            why = " ".join(f"{type(err).__name__}: {err}".replace("|", "/").split())  # one table cell
            results.append(
                {
                    "row": row,
                    "paper": math.nan,
                    "clean": math.nan,
                    "unforced": math.nan,
                    "scale": math.nan,
                    "notes": why,
                }
            )
    text, bad = markdown(results, skipped)
    print(text, end="")
    if args.out:
        write_text(args.out, text)
    return 1 if bad else 0


def cli() -> int:
    """``python -m lra.tools.fidelity`` and the console script ``lra-fidelity``: 1 if a paper row is off."""
    return main()


if __name__ == "__main__":
    sys.exit(cli())
