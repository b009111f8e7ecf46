"""lra.tools.fidelity without the public code: its command line, its weight-name map, the import sandbox, and
the draw replay checked from first principles against a tiny stand-in for the public code's sampling."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

import attention
import attention.skeinformer as skein
from lra import REPO_ROOT
from lra.config import load
from lra.model import build_model
from lra.tools.fidelity import (
    ROWS,
    DrawMismatch,
    DrawReplay,
    copy_weights,
    markdown,
    pad_distinct,
    parse_args,
    weight_map,
)
from lra.tools.their_code import public_code


# ----------------------------------------------------------------------------- command line
def test_missing_checkout_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "lra.tools.fidelity", "--skeinformer", "/nonexistent"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and not proc.stdout, proc.stderr
    assert (
        "--skeinformer /nonexistent: no src/models/model_LRA.py there; "
        "clone https://github.com/pkuzengqi/Skeinformer"
    ) in lines[0]


@pytest.fixture
def fake_checkout(tmp_path):
    """A folder that passes the path check (the rows are never run in these tests)."""
    (tmp_path / "LRA/code").mkdir(parents=True)
    (tmp_path / "LRA/code/model_wrapper.py").touch()
    return tmp_path


def test_rows_need_their_checkout_and_performer_needs_a_fastattention(fake_checkout, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--nystromformer", str(fake_checkout), "--rows", "skyformer_paper:listops:softmax"])
    assert exit_.value.code == 2 and "needs --skyformer PATH" in capsys.readouterr().err
    _, roots, rows, skipped = parse_args(["--nystromformer", str(fake_checkout)])
    assert set(roots) == {"nystromformer"} and {r.repo for r in rows} == {"nystromformer"}
    if importlib.util.find_spec("performer_pytorch") is None:  # then only the Skeinformer repo's copy would do
        assert "nystromformer_paper:listops:performer" not in {r.key for r in rows}
        assert len(skipped) == 1 and "--skeinformer" in skipped[0]


def test_each_code_base_has_its_own_tolerance_and_a_failed_row_fails():
    row = {r.repo: r for r in ROWS}

    def result(repo, paper):
        return {"row": row[repo], "paper": paper, "clean": 0.1, "unforced": math.nan, "scale": 0.4, "notes": ""}

    _, bad = markdown([result("skeinformer", 9e-6), result("skyformer", 9e-5), result("nystromformer", 0.0)], [])
    assert bad == 0
    text, bad = markdown([result("skeinformer", 2e-5), result("skyformer", math.nan)], [])
    assert bad == 2 and text.count("**above") == 2


# ----------------------------------------------------------------------------- weights
@pytest.mark.parametrize(
    "preset,task,attn", [("skeinformer_paper", "listops", "softmax"), ("nystromformer_paper", "pathfinder", "nystrom")]
)  # with its conv
def test_weight_map_is_a_bijection_onto_our_parameters(preset, task, attn):
    model = build_model(load([f"preset={preset}", f"task={task}", f"attn={attn}"]).model)
    names = [n for n, _ in model.named_parameters()]
    mapping = weight_map(names)
    assert set(mapping) == set(names)  # no parameter left unmapped
    theirs = [p for paths in mapping.values() for p in paths]
    assert len(theirs) == len(set(theirs))  # no tensor of theirs used twice
    assert mapping["encoder.blocks.1.mha.qkv.weight"] == tuple(f"model.transformer_1.mha.W_{x}.weight" for x in "qkv")


def test_copy_weights_stacks_qkv_in_order_and_keeps_our_vocabulary():
    model = build_model(load(["preset=skeinformer_paper", "task=listops", "attn=softmax"]).model)
    ours = dict(model.named_parameters())
    theirs = torch.nn.Module()  # holds a tensor at each of the map's paths, with their shapes
    for name, paths in weight_map(list(ours)).items():
        for path in paths:
            shape = list(ours[name].shape)
            shape[0] = shape[0] // len(paths) + (3 if name == "encoder.tok.weight" else 0)  # a larger vocabulary
            *parents, leaf = path.split(".")
            node = theirs
            for part in parents:
                if not hasattr(node, part):
                    node.add_module(part, torch.nn.Module())
                node = getattr(node, part)
            node.register_buffer(leaf, torch.randn(shape))
    copy_weights(model, theirs, draws=True)
    w = theirs.model.transformer_0.mha
    torch.testing.assert_close(
        ours["encoder.blocks.0.mha.qkv.weight"], torch.cat([w.W_q.weight, w.W_k.weight, w.W_v.weight]), rtol=0, atol=0
    )
    emb = theirs.model.embeddings.word_embeddings.weight
    torch.testing.assert_close(ours["encoder.tok.weight"], emb[: emb.shape[0] - 3], rtol=0, atol=0)


# ----------------------------------------------------------------------------- import sandbox
def test_public_code_hides_our_names_and_restores_modules_and_path(tmp_path):
    (tmp_path / "attention.py").write_text("WHOSE = 'theirs'\n")
    (tmp_path / "uses_stand_ins.py").write_text("from einops import repeat\nimport local_attention\n")
    modules, path = dict(sys.modules), list(sys.path)
    with public_code(tmp_path):
        assert importlib.import_module("attention").WHOSE == "theirs"
        importlib.import_module("uses_stand_ins")  # einops / local_attention: installed or stood in for
    assert sys.path == path and set(sys.modules) == set(modules)
    assert all(sys.modules[k] is v for k, v in modules.items())
    assert importlib.import_module("attention") is attention and "uses_stand_ins" not in sys.modules


# ----------------------------------------------------------------------------- draw replay
H, N, P, LENGTHS, BUDGET = 2, 12, 4, (12, 7), 8  # d_eff = min(8, 7 - 1) = 6 for the batch, 8 slots


def fake_public_layer(mask: torch.Tensor, d: int) -> None:
    """What the public Skeinformer code draws per layer: d pilot uniforms for the whole batch, then d
    columns per (sample, head) without replacement among the real keys."""
    torch.rand(1, d)
    torch.multinomial(mask.float().repeat_interleave(H, 0), d, replacement=False)


def hand_output(q, k, v, m, u, cols):
    """One head, real rows: softmax over the columns ``cols`` (simple row normalisation), but the exact
    softmax row at each pilot floor(u*m) (pilot reuse), in float64."""
    q, k, v = q[:m].double(), k.double(), v.double()
    out = (q @ k[cols].T / math.sqrt(P)).softmax(-1) @ v[cols]
    exact = (q @ k[:m].T / math.sqrt(P)).softmax(-1) @ v[:m]
    pilots = (u.float() * m).long()
    out[pilots] = exact[pilots]
    return out


SAMPLERS = (skein.pilot_uniforms, skein.gumbel_topk)


def test_replay_feeds_exactly_the_recorded_draws_in_order():
    torch.manual_seed(0)
    mask = torch.arange(N)[None, :] < torch.tensor(LENGTHS)[:, None]
    replay = DrawReplay(seed=3)
    rand, multinomial = torch.rand, torch.multinomial
    with replay.recording():
        for _ in range(2):  # two layers
            fake_public_layer(mask, 6)
    assert torch.rand is rand and torch.multinomial is multinomial
    assert [tuple(u.shape) for u in replay.uniforms] == [(1, 6)] * 2
    assert [tuple(c.shape) for c in replay.columns] == [(len(LENGTHS) * H, 6)] * 2
    ours = attention.build(
        "skeinformer",
        num_heads=H,
        head_dim=P,
        max_len=N,
        num_features=BUDGET,
        pilot_sampling="with_replacement",
        pilot_heads="shared",
        pilot_batch="shared",
        draw_from="prefix",
        budget="batch_shortest",
        row_norm="simple",
    )
    qkv = [torch.randn(3, len(LENGTHS), H, N, P) for _ in range(2)]
    with replay.replaying():
        outs = [ours(*x, mask) for x in qkv]
    for layer, ((q, k, v), out) in enumerate(zip(qkv, outs)):
        u, cols = replay.uniforms[layer][0], replay.columns[layer].view(len(LENGTHS), H, 6)
        for b, m in enumerate(LENGTHS):
            for h in range(H):
                torch.testing.assert_close(
                    out[b, h, :m].double(),
                    hand_output(q[b, h], k[b, h], v[b, h], m, u, cols[b, h]),
                    rtol=1e-5,
                    atol=1e-6,
                )
    assert (skein.pilot_uniforms, skein.gumbel_topk) == SAMPLERS


def test_replay_refuses_a_draw_too_many_or_too_few():
    mask = torch.arange(N)[None, :] < torch.tensor(LENGTHS)[:, None]
    replay = DrawReplay()
    with replay.recording():
        fake_public_layer(mask, 6)
    ours = attention.build(
        "skeinformer",
        num_heads=H,
        head_dim=P,
        max_len=N,
        num_features=BUDGET,
        pilot_sampling="with_replacement",
        pilot_heads="shared",
        pilot_batch="shared",
        draw_from="prefix",
        budget="batch_shortest",
    )
    q = torch.randn(len(LENGTHS), H, N, P)
    with pytest.raises(DrawMismatch, match="more torch.rand"), replay.replaying():
        ours(q, q, q, mask), ours(q, q, q, mask)
    with pytest.raises(DrawMismatch, match="1 torch.rand and 1 torch.multinomial draws left unused"):
        with replay.replaying():
            pass
    assert (skein.pilot_uniforms, skein.gumbel_topk) == SAMPLERS  # restored after either failure


def test_pad_distinct_fills_with_the_smallest_unused_positions():
    cols = torch.tensor([[[3, 1]], [[0, 5]]])
    assert pad_distinct(cols, 4, 6).tolist() == [[[3, 1, 0, 2]], [[0, 5, 1, 2]]]


# ----------------------------------------------------------------------------- accumulation chunks
def _fake_skeinformer(root, bz_rate: int):
    (root / "src").mkdir(parents=True)
    (root / "src/config.py").write_text(
        "Config = {'lra-listops': {'training': {'batch_size': 256}, 'extra_attn_config': {\n"
        f"    'softmax': {{'bz_rate': 1}}, 'skeinformer': {{'bz_rate': {bz_rate}}},\n"
        "    'skein_nonorm': {'bz_rate': 4},\n"
        "    'softmaxRBF32': {'bz_rate': 2}}}}\n"
    )
    return root


def test_chunk_rows_compare_their_config_with_our_plan(tmp_path):
    """Bug caught: a chunk table that agrees whatever their config says. Their count read as main.py reads
    it (bz_rate, else 1), their chunk sizes against our micro-batch x accumulation; a disagreement fails."""
    from lra.tools.fidelity import CHUNK_ROWS, compare_chunks

    row = next(r for r in CHUNK_ROWS if r.key == "skeinformer_paper:listops:chunks")
    good = compare_chunks(row, {"skeinformer": _fake_skeinformer(tmp_path / "a", 2)})
    assert good["bad"] == [] and good["batch"] == 256 and good["other"] == "softmaxRBF32"
    assert "skeinformer 2 x 128" in good["notes"] and "skeinformer_no_rownorm 4 x 64" in good["notes"]
    off = compare_chunks(row, {"skeinformer": _fake_skeinformer(tmp_path / "b", 4)})
    assert off["bad"] == ["**skeinformer: theirs 4 x 64, ours 2 x 128**"]
    text, bad = markdown([good, off], [])
    assert bad == 1 and "1 of 2 chunk rows disagree" in text and "| 12/13 |" in text
