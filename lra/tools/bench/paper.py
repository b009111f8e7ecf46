"""Beside the paper: Skeinformer Table 4 (bz, accu) and Table 2's accu set against our micro-batch and
accumulation, cell by cell, and the agreement counted. Both ways of the cost mode use it: ``--predict`` (the
fit's decisions on a CPU, :func:`predict`) and the measured one (:mod:`lra.tools.bench.cost`).

With a checkout of the Skeinformer code, :func:`their_fit` estimates a differing cell again with its attention
block in our model (docs/protocol.md, "Beside Skeinformer Table 4").
"""

from __future__ import annotations

import math
import shlex
import sys
import time
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
from torch import nn

from lra.config import load
from lra.fit import train_step_peak
from lra.tools.bench.fit_table import decision_table
from lra.tools.collect import render
from lra.tools.collect.tables import TABLES, Built, Cell, Row, columns, paper_results
from lra.tools.display import SKEIN_ROWS
from lra.tools.meter import GIB

PAPER_ARGS = ("preset=skeinformer_paper", "hardware=v100_16gb")  # its protocol, under its 16 GB V100 cap
# the collector's notes count finished runs; these cells are predictions
NOT_RUNS = {
    "finished runs.": "decisions of lra.fit (predicted; nothing ran).",
    "the run records": "lra.fit's decisions",
}
# what --skeinformer is recorded as: a checkout's local path means nothing to a reader
CHECKOUT = "<checkout of github.com/pkuzengqi/Skeinformer>"


def paper_verdict(bz, accu, paper_bz, paper_accu, t2_accu) -> str:
    """``equal`` (bz and both tables' accu), ``ours 2x`` / ``ours 1/2x`` (our micro-batch over the paper's bz at
    the same effective batch), ``batch differs`` (effective batches, or the paper's two accus, disagree)."""
    if bz is None or paper_bz is None:
        return "no decision" if bz is None else "no paper value"
    if bz * accu != paper_bz * paper_accu or paper_accu != t2_accu:
        return "batch differs"
    r = bz / paper_bz
    return "equal" if r == 1 else f"ours {r:g}x" if r > 1 else f"ours 1/{1 / r:g}x"


def paper_cells(rows: list[dict], tasks) -> list[dict]:
    """One dict per Skeinformer Table 4 cell (its rows x ``tasks``, in its order) that ``rows`` has a row of: our
    decision (``rows``: dicts with attn, task, micro_batch, accum_steps, capped) beside its bz and accu and
    Table 2's accu, and :func:`paper_verdict`."""
    df = paper_results()
    paper = {(r.table, r.attn, r.task, r.metric): int(r.value) for r in df[df["paper"] == "skeinformer"].itertuples()}
    ours = {(r["attn"], r["task"]): r for r in rows}
    cells = []
    for (attn, name), task in [(row, t) for row in SKEIN_ROWS for t in tasks if row[0] in {a for a, _ in ours}]:
        r = ours.get((attn, task), {})
        c = {"row": name, "attn": attn, "task": task, "micro_batch": r.get("micro_batch")}
        c.update(accum_steps=r.get("accum_steps"), paper_bz=paper.get(("table4", attn, task, "batch")))
        c.update(paper_accu=paper.get(("table4", attn, task, "accum")))
        c.update(paper_t2_accu=paper.get(("table2", attn, task, "accum")))
        c["verdict"] = paper_verdict(*list(c.values())[3:])
        c["capped"] = r.get("capped", False)
        cells.append(c)
    return cells


def agreement(cells: list[dict]) -> dict[str, int]:
    """{verdict: cells}: equal, ours larger by factor, ours smaller, the rest."""

    def order(v: str) -> tuple:
        factor = v.removeprefix("ours ").removeprefix("1/").removesuffix("x")
        return (0, 0) if v == "equal" else (1 + v.startswith("ours 1/"), float(factor)) if v[:5] == "ours " else (3, 0)

    return dict(sorted(Counter(c["verdict"] for c in cells).items(), key=lambda kv: (order(kv[0]), kv[0])))


def agreement_line(cells: list[dict]) -> str:
    """``equal 44, ours 2x 22, ...``: :func:`agreement` as both reports print it."""
    return ", ".join(f"{verdict} {n}" for verdict, n in agreement(cells).items())


def _paper_built(table: str, cells: list[dict], about: list[str]) -> Built:
    """The collector's ``Built`` of Skeinformer ``table`` (table4; table2 = its accu column) with our
    decisions as the cells and the paper's values beside them: its renderers print it."""
    by = {(c["attn"], c["task"]): c for c in cells}
    spec = next(t for t in TABLES if t.key == f"skeinformer_{table}")
    spec = replace(spec, tasks=tuple(t for t in spec.tasks if any(c["task"] == t[0] for c in cells)))
    if table == "table2":  # steps and times are no fit's
        spec = replace(spec, caption="Batch accumulation steps (accu)", metrics=(("accum", "accu"),))
    of = {
        "batch": ("micro_batch", "paper_bz"),
        "accum": ("accum_steps", "paper_t2_accu" if table == "table2" else "paper_accu"),
    }
    cols, rows = columns(spec, []), []
    for attn, name in [r for r in spec.rows if r[0] in {a for a, _ in by}]:
        row = Row(attn, name, True)
        for col in cols:
            ours, paper = (by.get((attn, col.task), {}).get(k) for k in of[col.metric])
            cell = Cell(paper=math.nan if paper is None else paper, paper_text=None if paper is None else str(paper))
            if ours is not None:
                cell.mean, cell.n, cell.values = float(ours), 1, (float(ours),)
            row.cells.append(cell)
        rows.append(row)
    return Built(spec, PAPER_ARGS[0][7:], cols, rows, True, len(cells), "paper", True, about)


def _collector(text: str) -> str:
    for k, v in NOT_RUNS.items():
        text = text.replace(k, v)
    return text


# our attention config -> the Skeinformer code's attn_type and config changes, one per variant compared.
# "w/o dropout" is no config of theirs: their softmax at dropout 0, run as "softmax" (their Attention
# checkpoints attn_type == "softmax" only) or under another name (not checkpointed); Informer w/ padding
# mask is attention_informermask.py, which their attn_selector never picks (factor = 256 as ours)
THEIR_VARIANTS = {
    "softmax_nodrop": (("softmax", {"attention_dropout": 0.0}), ("softmax_nodrop", {"attention_dropout": 0.0})),
    "informer_mask": tuple(
        ("informer", {"attn_class": "models.attention_informermask.ProbAttention", "in_nb_features": k})
        for k in (256, 128)  # the paper's features; their config's Informer value
    ),
}
THEIR_TASKS = ("listops", "text")  # where their code is compared: 2-10 of their estimates a cell, a minute or more


class _TheirBlock(nn.Module):
    """Their attention block in our encoder's place: the mask as their float, and their
    ``torch.cuda.amp.autocast`` as the CPU autocast the estimate runs (their attention stays fp32, as
    on their GPU)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x, mask):
        amp = torch.cuda.amp.autocast
        torch.cuda.amp.autocast = lambda enabled=True, **_: torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)
        try:
            with warnings.catch_warnings():  # their checkpoint() call's deprecation warning is not ours to fix
                warnings.simplefilter("ignore")
                return self.block(x, mask.float())
        finally:
            torch.cuda.amp.autocast = amp


def their_fit(cell: dict, root: Path) -> list[dict]:
    """For a cell of :func:`paper_cells`, per variant of the Skeinformer code's attention (``root``: its
    checkout) swapped into our model: the estimate at the paper's and our micro-batch, and the largest
    micro-batch from ours down to the paper's that it fits (``their_bz``; None: not even the paper's)."""
    from lra.tools.fidelity import THEIR_ATTN, their_blocks  # late: only --skeinformer imports the public code

    task, attn, ours, paper = cell["task"], cell["attn"], cell["micro_batch"], cell["paper_bz"]
    spec = load([*PAPER_ARGS, f"task={task}", f"attn={attn}"])
    budget, n = spec.hardware.budget_bytes, spec.model.seq_len

    def peak(m: int, swap=None) -> int:
        hw = spec.hardware.planned_precision
        return train_step_peak(spec.model, m, precision=hw, lr=spec.train.lr, eps=spec.train.eps, swap=swap)

    def swap(attn_type: str, changes: dict) -> Callable:
        def to_theirs(model: nn.Module) -> None:
            blocks = model.encoder.blocks
            for blk, theirs in zip(blocks, their_blocks(root, task, attn_type, n, len(blocks), **changes)):
                blk.mha = _TheirBlock(theirs)

        return to_theirs

    variants = THEIR_VARIANTS.get(attn) or [(t, {}) for t, a in THEIR_ATTN["skeinformer"].items() if a == attn]
    out, ours_at = [], {m: peak(m) for m in {ours, paper}}
    batch = spec.train.batch_size
    cands = sorted((d for d in range(1, batch + 1) if batch % d == 0 and min(ours, paper) <= d <= max(ours, paper)))
    cands.reverse()
    for attn_type, changes in variants:
        what = ", ".join([attn_type] + [f"{k}={v}" for k, v in changes.items()]).replace("models.", "")
        r = {"row": cell["row"], "task": task, "theirs": what, "paper_bz": paper, "ours_bz": ours}
        at = {}
        try:
            for m in cands:  # from the larger down: the first that fits is their micro-batch
                at[m] = peak(m, swap(attn_type, changes))
                if at[m] <= budget:
                    break
            at.setdefault(paper, peak(paper, swap(attn_type, changes)))
        except Exception as e:  # e.g. their Reformer needs pip transformers: said, not fatal
            out.append({**r, "explains": f"no estimate ({type(e).__name__}: {str(e).splitlines()[0][:80]})"})
            continue
        their_bz = next((m for m in cands if at.get(m, budget + 1) <= budget), None)
        r["budget_gib"] = budget / GIB
        for who, v in (("ours", ours_at), ("theirs", at)):
            r.update({f"{who}_at_{k}_gib": v.get(m, math.nan) / GIB for k, m in (("paper", paper), ("ours", ours))})
        r["their_bz"] = their_bz
        r["explains"] = (
            "their code"
            if their_bz == paper
            else "not their code"
            if their_bz == ours
            else "their code needs more than the paper's bz"
            if their_bz is None
            else f"their code in part (fits {their_bz})"
        )
        out.append(r)
    return out


def paper_report(cells: list[dict], command: str, theirs: list[dict] | None = None) -> dict[str, str]:
    """{suffix: text} of the predicted comparison: ``.md`` (the command, the agreement, a verdict grid, the two
    tables, their modules' estimates), ``.csv`` (a line per cell), ``.tex`` (the two tables), ``.theirs.csv``."""
    about = [
        f"Predicted by `{command}` on a CPU (fake tensors; nothing trained): lra.fit's micro-batch and "
        "accumulation under the paper's 16 GB V100 (hardware=v100_16gb) and protocol (preset=skeinformer_paper)."
    ]
    built = [_paper_built(t, cells, about) for t in ("table4", "table2")]
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    grid = pd.DataFrame(
        [
            [name]
            + [
                f"{c['micro_batch']}x{c['accum_steps']}{'*' * c['capped']} / {c['paper_bz']}x{c['paper_accu']}: "
                + c["verdict"]
                for c in cells
                if c["row"] == name
            ]
            for name in dict.fromkeys(c["row"] for c in cells)
        ],
        columns=["Model"] + tasks,
    )
    md = [
        "# Skeinformer Table 4 (bz, accu) and Table 2 (accu) beside lra.fit's prediction",
        "",
        "```",
        command,
        "```",
        "",
        f"Agreement, cells (equal: bz and both accus): {agreement_line(cells)} of {len(cells)}.",
        "",
        render.frame_markdown(grid, "## Cells: ours bz x accu / paper bz x accu"),
        "\\* capped by `train.chunks`: the public code's accumulation (its config.py bz_rate, "
        "conf/quirks/skeinformer.yaml), which the fit keeps where it fits.",
        "",
        *(_collector(render.to_markdown(b, "##")) for b in built),
    ]
    if theirs is not None:
        md.append(
            render.frame_markdown(
                pd.DataFrame(theirs), "## The Skeinformer code's attention in our model, same estimate (GiB)"
            )
        )
    return {
        ".md": "\n".join(md),
        ".csv": render.csv_text(pd.DataFrame(cells)),
        ".tex": "\n".join(_collector(render.to_latex(b)) for b in built),
        **({".theirs.csv": render.frame_csv(pd.DataFrame(theirs))} if theirs else {}),
    }


def recorded(argv: list[str]) -> str:
    """The command as typed (``argv``: its arguments), the --skeinformer checkout as :data:`CHECKOUT`."""
    words = ["python", "-m", "lra.tools.bench"]
    for prev, a in zip([None, *argv], argv):
        if prev == "--skeinformer":
            words.append(CHECKOUT)
        else:
            words.append("--skeinformer=" + CHECKOUT if a.startswith("--skeinformer=") else shlex.quote(a))
    return " ".join(words)


def predict(rows_asked, tasks, overrides: list[str], root: Path | None, command: str) -> dict[str, str]:
    """The fit's decisions for ``rows_asked`` x ``tasks`` under ``overrides`` (:data:`PAPER_ARGS` where not given)
    beside the paper (:func:`paper_report`); ``root``: a Skeinformer checkout for :func:`their_fit`."""
    t0 = time.perf_counter()
    given = {o.split("=", 1)[0] for o in overrides}
    args = [*(a for a in PAPER_ARGS if a.split("=", 1)[0] not in given), *overrides]
    rows = decision_table(args, tasks=tasks, attns=list(rows_asked), extra=[])
    print(f"\n{len(rows)} decisions in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    cells, t0 = paper_cells(rows, tasks), time.perf_counter()
    differ = [c for c in cells if c["verdict"].startswith("ours ") and c["task"] in THEIR_TASKS]
    theirs = [r for c in differ for r in their_fit(c, root)] if root else None
    if root:
        print(f"{len(differ)} cells with their code's attention in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return paper_report(cells, command, theirs)
