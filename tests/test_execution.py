"""``execution=fast`` (docs/protocol.md, "Execution: paper or fast"): the paper execution's function, run fastest.

For every row of the paper grid (conf/sweep/skeinformer_table1.yaml, the only paper grid in conf/sweep/) one
optimizer step of the paper execution with accumulation (micro-batch 2 of 4: two micro-batches) is compared with
the fast execution's (the whole batch on a CPU), from the same seed and batch (padding at the end and in the
middle), dropout off. The step is the harness's (lra.tools.meter.step.TrainStep: the loss over accumulation, then
AdamW) with the model in float64 and the attention in float32, as the harness always runs it (lra/model.py).
Compared: the gradient the step used (AdamW's first moment / (1 - beta1)) relative to its largest entry, which a
loss averaged wrongly over micro-batches moves by O(1), and the weights after the step, which AdamW's first step
moves by lr x g / (|g| + eps): up to 2 lr where a gradient's sign differs (a different draw, a coupled sample).
"""

import dataclasses
import logging

import pytest
import torch

from lra import train as lra_train
from lra.config import ConfigError, load
from lra.fit import plan
from lra.model import MultiHeadAttention, build_model
from lra.naming import run_tag
from lra.record import read_record
from lra.tools.meter.step import TrainStep
from tests.helpers import kill_at, train_here
from tests.test_resume import EPOCHS

N, B = 256, 4  # longer than every feature budget of the preset's quirks (128), so none turns exact
BASE = ["preset=skeinformer_paper", "task=listops", f"task.seq_len={N}", f"train.batch_size={B}", "model.dropout=0"]
GRAD_TOL = 1e-6  # float32 attention and loss: a few roundings of 1.2e-7; measured <= 5e-8 (softmax fused vs n x n)
WEIGHT_TOL = 1e-2  # x lr: a hundredth of one AdamW step; a sign that differs moves a weight by 2 lr

# rows the fast execution runs as they are, or in the variant (overrides) whose draws or couplings do not depend on
# the micro-batch: the preset's quirks off, or the random draw fixed at construction
EXACT = {
    "softmax": [],
    "softmax_nodrop": [],
    "vmean": [],
    "bigbird": [],  # its random blocks are drawn once, at construction (redraw=fixed)
    "nystrom": ["quirks=none"],  # the code's pinv_init=batch_colsum couples the samples of a micro-batch
    "performer": ["quirks=none"],  # the code's key_stabiliser=batch with feature_eps couples them
    "linformer": ["quirks=none"],
    "reformer": ["attn.options.redraw=fixed"],  # per_call draws its hashes per micro-batch
    "linformer_jlt": ["attn.options.redraw=fixed"],
}
# rows that keep the paper execution under fast, and whether their micro-batch changes the step
KEPT = {
    "nystrom": True,
    "performer": True,
    "linformer": False,  # kept because the code's quirks are on; none of Linformer's couples samples
    "reformer": True,
    "linformer_jlt": True,
    "informer": True,  # draws per call, no fixed variant: no exact comparison exists
    "informer_mask": False,  # draws per call too; at initialisation its exact rows are nearly its lazy mean(V)
    "skeinformer": True,  # one pilot draw per micro-batch (pilot_batch=shared): each micro-batch its own
    "skeinformer_uniform": True,
    "skeinformer_no_rownorm": True,
    "skeinformer_simple_rownorm": True,
    "skeinformer_no_pilot": True,
}


def test_the_tables_cover_every_row_of_the_paper_grid(root):
    from omegaconf import OmegaConf

    grid = OmegaConf.load(root / "conf/sweep/skeinformer_table1.yaml").grid.attn
    assert set(grid) == set(EXACT) | set(KEPT)


def _specs(row: str, *variant: str):
    """(paper with micro-batch 2, fast) of one command: fast's ``other`` is its paper execution."""
    fast = load(
        [*BASE, f"attn={row}", *(["attn.options.dropout=0"] if row == "softmax" else []), *variant, "execution=fast"]
    )
    paper = fast.other if fast.execution == "fast" else fast
    assert paper.execution == "paper" and paper.attn.options.get("dropout", 0.0) == 0.0
    return dataclasses.replace(paper, hardware=dataclasses.replace(paper.hardware, micro_batch=2)), fast


def _batch(spec):
    """4 sequences: full, padded at the end, padded in the middle, both."""
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 200:] = False
    mask[2, 40:120] = False
    mask[3, 60:90] = mask[3, 230:] = False
    tokens = torch.randint(1, spec.model.vocab_size, (B, N), generator=g).masked_fill(~mask, 0)
    return tokens, mask, torch.randint(0, spec.model.num_classes, (B,), generator=g)


def _step(spec, micro: int | None = None):
    """(micro-batch, accumulation), gradient and weights after one optimizer step of ``spec`` (``micro``: forced)."""
    p = plan(spec)
    micro = micro or p.micro_batch
    torch.manual_seed(0)
    model = build_model(spec.model).double().train()
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.attn.float()  # what the harness runs in float32 (lra/model.py), its buffers included
    step = TrainStep(model, spec, B // micro, "64-true", "cpu")
    step(model, list(zip(*(t.split(micro) for t in _batch(spec)))))
    grads = [s["exp_avg"] / (1 - 0.9) for s in step.opt.state.values()]
    return (micro, B // micro), grads, [p.detach().clone() for p in step.params]


def _differences(a, b) -> tuple[float, float]:
    """(max gradient difference / largest gradient, max weight difference / lr) of two steps."""
    (_, ga, wa), (_, gb, wb) = a, b
    top = max(g.abs().max().item() for g in ga)
    grad = max((x - y).abs().max().item() for x, y in zip(ga, gb)) / top
    return grad, max((x - y).abs().max().item() for x, y in zip(wa, wb))


@pytest.mark.parametrize("row", sorted(EXACT))
def test_one_fast_step_equals_the_paper_step_with_accumulation(row):
    paper, fast = _specs(row, *EXACT[row])
    assert fast.execution == "fast" and fast.execution_note is None
    assert not fast.attn.checkpointing and fast.attn.options.get("impl") in (None, "fused")
    a, b = _step(paper), _step(fast)
    assert (a[0], b[0]) == ((2, 2), (B, 1))
    grad, weight = _differences(a, b)
    assert grad <= GRAD_TOL and weight <= WEIGHT_TOL * paper.train.lr, (grad, weight)


@pytest.mark.parametrize("row", sorted(KEPT))
def test_a_row_whose_micro_batch_is_semantics_keeps_the_paper_execution(row):
    """Under the preset (the Skeinformer code's quirks) fast runs these rows exactly as paper, and says why; the
    step with another micro-batch shows why (another draw, or coupled samples), except for Linformer's."""
    paper, fast = _specs(row)
    assert fast.execution == "paper" and fast.execution_note.startswith(f"execution=fast runs {row} as paper: ")
    assert (fast.hardware, fast.model) == (fast.other.hardware, fast.other.model)
    grad, weight = _differences(_step(paper), _step(paper, micro=B))
    assert (grad > 10 * GRAD_TOL) == KEPT[row], grad


def test_fast_keeps_the_public_codes_chunks_and_a_forced_micro_batch():
    """Nyströmformer's code runs Image in 2 chunks of 128 for every attention, softmax included: fast fuses the
    softmax, recomputes nothing, and keeps the chunk; a forced micro-batch stays the user's."""
    spec = load(["preset=nystromformer_paper", "task=image", "attn=softmax", "execution=fast"])
    assert (spec.execution, spec.attn.options["impl"], spec.attn.checkpointing) == ("fast", "fused", False)
    assert (spec.train.chunks, plan(spec).micro_batch, plan(spec).accum_steps) == (2, 128, 2)
    forced = load(["task=listops", "attn=softmax", "execution=fast", "hardware.micro_batch=64"])
    assert (plan(forced).micro_batch, plan(forced).accum_steps, forced.hardware.name) == (64, 4, "auto")


def test_one_coupling_option_set_by_hand_keeps_the_paper_execution():
    """Every quirk is also an option of its own: Nyström's batch-global pseudo-inverse start alone, clean otherwise."""
    spec = load(
        ["task=listops", "attn=nystrom", "quirks=none", "attn.options.pinv_init=batch_colsum", "execution=fast"]
    )
    assert spec.execution == "paper" and "pinv_init=batch_colsum" in spec.execution_note
    assert load(["task=listops", "attn=nystrom", "quirks=none", "execution=fast"]).execution == "fast"


def test_the_command_lines_impl_stays_and_a_shared_gpu_keeps_its_share(monkeypatch):
    spec = load(["attn=softmax", "attn.options.impl=materialized", "execution=fast"])
    assert (spec.attn.options["impl"], spec.attn.checkpointing) == ("materialized", False)
    monkeypatch.setenv("LRA_MEMORY_LIMIT_GIB", "15.02")  # a sweep's jobs_per_gpu: the share it gave this run
    assert load(["attn=softmax", "execution=fast"]).hardware.name == "v100_16gb"


def test_execution_names_no_folder_and_a_bad_value_is_one_line():
    args = ["task=listops", "attn=softmax"]
    paper, fast = load(args), load([*args, "execution=fast"])
    assert run_tag(args, paper) == run_tag([*args, "execution=fast"], fast) == ""
    assert "execution" not in fast.config and fast.config == paper.config  # the same function: one folder, one row
    assert paper.resume_key(8, 32, "d") != fast.resume_key(8, 32, "d")  # nor one checkpoint
    with pytest.raises(ConfigError, match=r"^execution='Fast' is not allowed: one of paper, fast$"):
        load([*args, "execution=Fast"])


# ---------------------------------------------------------------------------------------------
# Resume: an unfinished run continues under the execution it started with; the record says which ran

RUN = [o for o in EPOCHS if not o.startswith("logger=")] + ["attn_checkpointing=[softmax]"]  # keys differ by it


def test_a_paper_run_resumed_with_execution_fast_continues_as_paper(tmp_path, caplog):
    """Runs already under way (a GPU window's carried ones) finish under the plan they started with: one warning
    line, and the record says paper and why."""
    train_here(tmp_path, *RUN, callbacks=[kill_at(5)])
    assert read_record(tmp_path / "runs" / "run")["execution"] == "paper"
    with caplog.at_level(logging.WARNING, logger="lra.train"):
        train_here(tmp_path, *RUN, "execution=fast")
        rec = read_record(tmp_path / "runs" / "run")
    assert rec["status"] == "completed" and rec["resumed_from_step"] == 4
    assert (rec["execution"], rec["attn_checkpointing"]) == ("paper", True)
    said = f"execution=fast: {tmp_path / 'runs' / 'run' / 'checkpoints' / 'last.ckpt'} continues under execution=paper"
    assert rec["execution_note"].startswith(said) and said in caplog.text


def test_a_fast_run_resumed_without_execution_fast_is_refused_in_one_line(tmp_path):
    train_here(tmp_path, *RUN, "execution=fast", callbacks=[kill_at(5)])
    assert read_record(tmp_path / "runs" / "run")["execution"] == "fast"
    with pytest.raises(lra_train.RunError) as e:
        train_here(tmp_path, *RUN)
    end = lra_train.ending(e.value, "python -m lra.train ...")
    assert end.code == 2 and "\n" not in end.line and "add execution=fast to resume it" in end.line
    assert read_record(tmp_path / "runs" / "run")["execution"] == "fast"  # the record of the run, untouched
