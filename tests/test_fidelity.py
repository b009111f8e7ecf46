"""quirks=none|<code> (docs/fidelity.md): what each switch does, checked from first principles.

The backend quirks have their own tests (tests/attention/test_*_paper.py); here: the switch itself,
the model's pooling, the ListOps tokens, the pixel mask, the record and the run folder, and a float64
re-derivation of the public code's classifier that the paper presets must equal.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attention
from lra.config import ConfigError, compose, load
from lra.data import load_task
from lra.data.base import Split
from lra.data.listops import tokenize
from lra.data.module import SplitDataset
from lra.data.registry import LOADERS
from lra.fit import plan
from lra.model import build_model, pool
from lra.record import new_record

PRESETS = ("skeinformer_paper", "skyformer_paper", "nystromformer_paper")
TASKS = ("listops", "text", "retrieval", "image", "pathfinder")


def test_presets_default_to_paper_and_quick_to_clean():
    # the must-show command: no argument but the preset, and the record says which semantics ran
    spec = load(["task=listops", "attn=skeinformer", "preset=skeinformer_paper"])
    rec = new_record(spec)
    assert rec["semantics"] == "paper" and rec["quirks"]["model.pooling"] == "padded_mean"
    assert rec["quirks"]["task.tokenizer"] == "alnum" and rec["quirks"]["attn.options.budget"] == "batch_shortest"
    assert load(["task=listops"]).semantics == "paper"  # the default preset is skeinformer_paper
    quick = load(["preset=quick"])
    assert quick.semantics == "clean" and quick.quirks == {} and quick.model.pooling == "mean"


@pytest.mark.parametrize("preset", PRESETS)
def test_every_quirk_differs_from_clean_and_paper_turns_on_each(preset):
    """A clean run lists no quirk; a paper run lists every entry of its code base's table that applies
    (so each entry really changes something, and nothing in the table is silently ignored)."""
    table = compose([f"preset={preset}"]).quirks
    cases = [(t, "softmax") for t in TASKS] + [("listops", b) for b in table.attn_options]
    for task, backend in cases:
        clean = load([f"preset={preset}", f"task={task}", f"attn={backend}", "quirks=none"])
        paper = load([f"preset={preset}", f"task={task}", f"attn={backend}"])  # the preset's code
        assert clean.semantics == "clean" and clean.quirks == {}, (task, backend, clean.quirks)
        want = {f"model.{k}" for k in table.model} | {f"task.{k}" for k in table.task.get(task, {})}
        want |= {f"attn.options.{k}" for k in table.attn_options.get(backend, {})}
        chunks = table.get("train", {}).get("chunks", {}).get(task, 1)
        chunks = chunks.get(backend, 1) if hasattr(chunks, "get") else chunks  # one count or one per attn
        want |= {"train.chunks"} if chunks > 1 else set()
        assert set(paper.quirks) == want, (task, backend)
        for key, value in paper.quirks.items():  # what the record lists is what runs
            where, _, name = key.rpartition(".")

            def of(spec):
                return {
                    "model": lambda: getattr(spec.model, name),
                    "task": lambda: spec.data.options[name],
                    "attn.options": lambda: spec.attn.options[name],
                    "train": lambda: getattr(spec.train, name),
                }[where]()

            assert of(paper) == value and of(paper) != of(clean)


def test_a_single_quirk_is_an_option_and_the_command_line_wins():
    spec = load(["task=listops", "attn=skeinformer", "model.pooling=mean"])
    assert spec.model.pooling == "mean" and "model.pooling" not in spec.quirks and "task.tokenizer" in spec.quirks
    spec = load(
        [
            "task=listops",
            "attn=skeinformer",
            "quirks=none",
            "attn.options.pilot_heads=shared",
            "task.tokenizer=alnum",
        ]
    )
    assert spec.quirks == {"attn.options.pilot_heads": "shared", "task.tokenizer": "alnum"}
    spec = load(["preset=quick", "quirks=skyformer", "attn=skyformer"])
    assert spec.quirks["attn.options.ns_init"] == "colsum_batch" and spec.model.pooling == "padded_mean"
    spec = load(["preset=quick", "quirks=lra_pytorch", "attn=nystrom"])  # the shared files only
    assert spec.quirks["attn.options.landmark_mean"] == "padded" and "attn.options.landmarks" not in spec.quirks


ATTNS = ("softmax", "skeinformer", "skeinformer_no_rownorm", "informer", "kernelized")
# Their configs' accumulation chunks above 1 (Skeinformer / Skyformer src/config.py bz_rate; Nyströmformer
# LRA/code/lra_config.py batch // gpu_memory on one GPU, for every attention), read off the public code.
THEIR_CHUNKS = {
    "skeinformer_paper": {
        ("listops", "skeinformer"): 2,
        ("listops", "skeinformer_no_rownorm"): 4,
        ("text", "skeinformer"): 2,
        ("text", "skeinformer_no_rownorm"): 8,
        ("retrieval", "skeinformer_no_rownorm"): 16,
        ("pathfinder", "skeinformer"): 2,
        ("pathfinder", "skeinformer_no_rownorm"): 2,
        ("pathfinder", "informer"): 2,
        ("image", "skeinformer_no_rownorm"): 2,
        ("image", "informer"): 2,
    },
    "skyformer_paper": {
        ("text", "kernelized"): 2,
        ("retrieval", "kernelized"): 2,
        ("pathfinder", "informer"): 2,
        ("image", "informer"): 2,
    },
    "nystromformer_paper": {(t, a): 2 for t in ("image", "pathfinder") for a in ATTNS},
}


@pytest.mark.parametrize("preset", PRESETS)
def test_paper_runs_their_configs_chunks(preset):
    """Bug caught: a chunk count under a misspelt task or attention name (silently 1) or on another preset;
    under paper every task x attention runs their config's chunks: micro-batch = batch / chunks."""
    for task in TASKS:
        for attn in ATTNS:
            spec = load([f"preset={preset}", f"task={task}", f"attn={attn}", "hardware=cpu"])
            p, want = plan(spec), THEIR_CHUNKS[preset].get((task, attn), 1)
            got = (spec.train.chunks, p.micro_batch * want, p.accum_steps)
            assert got == (want, spec.train.batch_size, want), (task, attn)


def test_chunks_are_a_quirk_option_of_their_own():
    """Bug caught: the chunks on under quirks=none, or not settable alone; the record lists them as a quirk
    and its config says the count that ran."""
    base = ["task=listops", "attn=skeinformer"]
    clean = load([*base, "quirks=none"])
    assert clean.train.chunks == 1 and "train.chunks" not in clean.quirks
    assert load([*base, "quirks=none", "train.chunks=2"]).quirks == {"train.chunks": 2}
    off = load([*base, "train.chunks=1"])  # paper without its chunks: the other quirks stay on
    assert off.train.chunks == 1 and "train.chunks" not in off.quirks and "attn.options.budget" in off.quirks
    quick = load(["preset=quick", "train.chunks=4"])  # every preset has the key: no + needed
    assert quick.train.chunks == 4 and quick.quirks == {}
    rec = new_record(load(base))
    assert rec["quirks"]["train.chunks"] == 2 and rec["config"]["train"]["chunks"] == 2


@pytest.mark.parametrize(
    "bad, says",
    [
        (["task=listops", "task.tokenizer=words"], "task.tokenizer='words' is not allowed: one of brackets, alnum"),
        (["task=image", "task.mask=black"], "task.mask='black' is not allowed: one of all, nonzero"),
    ],
)
def test_bad_semantics_values_are_one_line(bad, says):
    with pytest.raises(ConfigError) as e:
        load(bad)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_padded_mean_of_a_hand_made_row():
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [50.0, 60.0]]], dtype=torch.float64)  # the last one is padding
    mask = torch.tensor([[True, True, False]])
    assert pool(x, mask, "mean").tolist() == [[2.0, 3.0]]  # (1+3)/2, (2+4)/2
    assert pool(x, mask, "padded_mean").tolist() == [[4 / 3, 2.0]]  # pads zeroed, divided by 3


def test_listops_tokens_under_each_semantics(tmp_path):
    source = "[MAX 2 9 [MIN 4 7 ] 0 ]"
    folder = tmp_path / "lo"
    folder.mkdir()
    for split in ("train", "val", "test"):
        (folder / f"basic_{split}.tsv").write_text(f"Source\tTarget\n( ( [MAX 2 ) 9 ] )\t9\n{source}\t7\n")
    for semantics, want in (("clean", "[MAX 2 9 [MIN 4 7 X 0 X"), ("paper", "MAX 2 9 MIN 4 7 0")):
        code = {"clean": "none", "paper": "skeinformer"}[semantics]  # the default preset's code
        spec = load([f"quirks={code}", "task=listops", f"+task.path={folder}", f"data_root={tmp_path}"])
        vocab = {
            "clean": ("<pad>", "[MIN", "[MAX", "[MED", "[SM", *"0123456789", "X"),
            "paper": ("<pad>", "MIN", "MAX", "MED", "SM", *"0123456789"),
        }[semantics]
        row = load_task(spec.data.options, spec.data.root)["train"].tokens[1]
        assert " ".join(vocab[i] for i in row if i) == want
        assert len(tokenize(source, spec.data.options["tokenizer"])) == len(want.split())
    assert tokenize(source, "alnum") == [2, 7, 14, 1, 9, 12, 5]  # fixed ids: MIN MAX MED SM 0-9 = 1..14


@pytest.fixture
def pixel_task(monkeypatch):
    """The image task with a stand-in reader: one 4-pixel image with two zero pixels."""
    monkeypatch.setitem(
        LOADERS,
        "image",
        lambda spec, root: {
            s: Split(np.array([[0, 5, 0, 7]], dtype=np.uint8), np.array([4]), np.array([1]))
            for s in ("train", "val", "test")
        },
    )
    return load(["preset=quick", "task=image"]).data.spec


def test_pixel_zero_is_padding_only_under_paper(pixel_task, tmp_path):
    for mask, want in (("all", [True, True, True, True]), ("nonzero", [False, True, False, True])):
        split = load_task(dataclasses.replace(pixel_task, mask=mask), tmp_path)["train"]
        assert SplitDataset(split)[[0]]["mask"].tolist() == [want]
    for preset in PRESETS:
        for task in ("image", "pathfinder"):
            assert load([f"preset={preset}", f"task={task}"]).data.spec.mask == "nonzero"
            assert load([f"preset={preset}", f"task={task}", "quirks=none"]).data.spec.mask == "all"


# --------------------------------------------------------------------------------------------
# The public code's classifier, written from its description (docs/fidelity.md: model rows), in float64


def _reference_logits(model, tokens, mask):
    """Embedding + learned positions, pre-LN blocks with softmax attention (keys masked by -1e6, every
    query row computed), GELU MLP, final LayerNorm times the mask, mean over the PADDED length, MLP head."""
    enc, m = model.encoder, mask.double()
    x = enc.tok.weight[tokens] + enc.pos.weight[: tokens.shape[1]]
    for blk in enc.blocks:
        h = F.layer_norm(x, (x.shape[-1],), blk.ln1.weight, blk.ln1.bias)
        q, k, v = (h @ w.T + b for w, b in zip(blk.mha.qkv.weight.chunk(3), blk.mha.qkv.bias.chunk(3)))
        split = lambda t: t.view(*t.shape[:2], 2, 32).transpose(1, 2)  # noqa: E731 - 2 heads of 32
        s = split(q) @ split(k).transpose(-1, -2) / math.sqrt(32) - 1e6 * (1 - m[:, None, None, :])
        a = (s.softmax(-1) @ split(v)).transpose(1, 2).reshape(x.shape)
        x = x + a @ blk.mha.out.weight.T + blk.mha.out.bias
        h = F.layer_norm(x, (x.shape[-1],), blk.ln2.weight, blk.ln2.bias)
        x = x + blk.mlp(h)
    x = F.layer_norm(x, (x.shape[-1],), enc.ln.weight, enc.ln.bias) * m[..., None]
    return model.head(x.sum(1) / x.shape[1])


@pytest.mark.parametrize("preset", PRESETS)
def test_paper_classifier_is_the_public_model(preset):
    torch.manual_seed(0)
    seq_len = 64
    lengths = torch.tensor([64, 40, 9])
    tokens = torch.randint(1, 15, (3, seq_len)) * (torch.arange(seq_len) < lengths[:, None])
    mask = tokens != 0
    out = {}
    for semantics in ("paper", "clean"):
        spec = load(
            [
                f"preset={preset}",
                "task=listops",
                "attn=softmax",
                *(["quirks=none"] if semantics == "clean" else []),  # paper: the preset's own code
                f"task.seq_len={seq_len}",
            ]
        )
        model = build_model(spec.model).double().eval()
        with torch.no_grad():
            out[semantics] = (model(tokens, mask), _reference_logits(model, tokens, mask))
    ours, ref = out["paper"]
    assert (ours - ref).abs().max() < 1e-6  # attention runs in float32 (as theirs: Q.float()), the rest in float64
    ours, ref = out["clean"]
    assert (ours - ref)[1:].abs().max() > 1e-3 and (ours - ref)[0].abs().max() < 1e-6  # padded rows differ


@pytest.mark.slow  # 30-50 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_paper_run_records_semantics_and_its_folder(quick_run, tmp_path):
    """A real (tiny) run with the public code's semantics: alnum ListOps, padded-mean pooling, the run
    folder and the record keep it apart from the clean run of the same command."""
    quick_run("quirks=skeinformer", "attn=skeinformer")
    quick_run()
    runs = tmp_path / "runs" / "quick"
    (paper,) = [
        json.loads(p.read_text()) for p in (runs / "paper" / "listops" / "skeinformer" / "seed0").rglob("result.json")
    ]
    (clean,) = [
        json.loads(p.read_text()) for p in (runs / "clean" / "listops" / "softmax" / "seed0").rglob("result.json")
    ]
    assert paper["status"] == "completed" and paper["semantics"] == "paper" and clean["semantics"] == "clean"
    assert paper["quirks"]["task.tokenizer"] == "alnum" and paper["quirks"]["attn.options.pilot_batch"] == "shared"
    assert paper["config"]["task"]["vocab_size"] == 32 and clean["quirks"] == {}
    # their bz_rate 2 on ListOps: the record's micro-batch and accumulation are the chunks that ran
    assert (paper["micro_batch"], paper["accum_steps"], paper["quirks"]["train.chunks"]) == (16, 2, 2)
    assert (clean["micro_batch"], clean["accum_steps"]) == (32, 1)
    assert "train.chunks=2" in paper["accum_source"]
    assert paper["num_params"] - clean["num_params"] == (32 - 16) * 64  # the public code's embedding table
    assert attention.option_defaults("skeinformer")["pilot_batch"] == "independent"
