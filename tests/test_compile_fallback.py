"""A failed torch.compile: ``train.compile=auto`` runs eager with one warning and says so in the record;
``train.compile=true`` stops with one error line and a failed record.

The failure is torch.compile's own: ``lra.module.COMPILE_BACKEND`` is set to a dynamo backend that
raises, as inductor does without a working Triton (dynamo wraps it in BackendCompilerFailed). Tiny
ListOps runs in this process, on data generated once for the module.
"""

import json
import logging
import random
import sys

import lightning as L
import pytest
import torch

import lra.config
import lra.module
from lra import train as lra_train
from lra.module import LitLRA
from tests.helpers import TINY, roots, train_here
from tests.test_cli_commands import _logging_state, _restore_logging

torch.set_num_threads(1)

QUICK = [*TINY, "trainer.progress=false", "train.max_steps=2", "train.eval_every=2"]


def broken_backend(gm, example_inputs):
    raise RuntimeError("no working triton")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("compile_fallback")


@pytest.fixture
def auto_compiles(monkeypatch):
    """train.compile=auto compiles on CUDA only: resolve it as on CUDA, so that on this CPU the spec says
    compile=True with compile_forced=False (the auto path) while the run itself stays on the CPU."""
    real = lra.config._compile
    monkeypatch.setattr(lra.config, "_compile", lambda setting, on_cuda, backend: real(setting, True, backend))


class Keep(L.Callback):
    """Keeps the trained module (its ``compiled``, ``compile_note`` and compiled callable, after the run)."""

    lit = None

    def on_train_end(self, trainer, pl_module):
        self.lit = pl_module


def _run(root, name, monkeypatch, *overrides) -> tuple[dict, LitLRA, dict]:
    """(record, trained module, what on_fit_start saw): train_here, watched from inside."""
    keep, seen = Keep(), {}
    real = LitLRA.on_fit_start

    def on_fit_start(self):  # the real hook, watched: RNG states, gradients and mode around the compilation
        before = (torch.get_rng_state(), random.getstate())
        real(self)
        seen.update(
            rng_kept=torch.equal(before[0], torch.get_rng_state()) and before[1] == random.getstate(),
            grads=[p.grad for p in self.parameters() if p.grad is not None],
            training=self.model.training,
        )

    monkeypatch.setattr(LitLRA, "on_fit_start", on_fit_start)
    rec = train_here(root, *QUICK, *overrides, callbacks=[keep], run_dir=root / "runs" / name)
    return rec, keep.lit, seen


def test_auto_falls_back_to_eager_with_one_warning_and_says_so_in_the_record(root, monkeypatch, auto_compiles, caplog):
    monkeypatch.setattr(lra.module, "COMPILE_BACKEND", broken_backend)
    caplog.set_level(logging.INFO)
    rec, lit, seen = _run(root, "auto_broken", monkeypatch)
    assert lit.compiled is False and lit.model._compiled_call_impl is None and lit.compile_time_s is None
    assert "BackendCompilerFailed" in lit.compile_note and "no working triton" in lit.compile_note
    assert lit.compile_note.startswith("torch.compile failed (") and lit.compile_note.endswith("): ran eager")
    assert seen == {"rng_kept": True, "grads": [], "training": True}
    said = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING
        and (r.name.startswith(("lra.module", "torch")) or "torch.compile" in r.getMessage())
    ]
    assert len(said) == 1 and said[0].name == "lra.module", [r.getMessage() for r in said]
    msg = said[0].getMessage()
    assert "'softmax'" in msg and "no working triton" in msg and msg.endswith("running eager") and "\n" not in msg
    assert rec["status"] == "completed" and rec["steps"] == 2  # training ran, eager
    saved = json.loads((root / "runs" / "auto_broken" / "result.json").read_text())
    assert saved["compiled"] is False and saved["compile_note"] == lit.compile_note
    assert saved["compile_time_s"] is None


def test_auto_with_a_working_backend_still_compiles(root, monkeypatch, auto_compiles):
    calls = []

    def counting(gm, example_inputs):  # aot_eager (dynamo + AOT autograd, no code generation), its calls counted
        compiled = torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

        def run(*args):
            calls.append(1)
            return compiled(*args)

        return run

    monkeypatch.setattr(lra.module, "COMPILE_BACKEND", counting)
    rec, lit, seen = _run(root, "auto_working", monkeypatch)
    assert lit.compiled is True and lit.compile_note is None and lit.model._compiled_call_impl is not None
    assert seen == {"rng_kept": True, "grads": [], "training": True}
    # the synthetic batch's training and evaluation calls, then the 2 training steps and the evaluations
    assert len(calls) >= 2 + rec["steps"]
    assert rec["status"] == "completed" and rec["compiled"] is True and rec["compile_note"] is None
    assert rec["compile_time_s"] > 0


def test_forced_compile_that_fails_is_one_error_line_and_a_failed_record(root, monkeypatch, capsys):
    monkeypatch.setattr(lra.module, "COMPILE_BACKEND", broken_backend)
    monkeypatch.setattr(sys, "argv", ["lra.train", *QUICK, *roots(root), "train.compile=true"])
    logging_before = _logging_state()
    try:
        with pytest.raises(SystemExit) as stop:
            lra_train.main()
    finally:
        _restore_logging(logging_before)  # main's basicConfig and Hydra's handlers write to this test's streams
    out = capsys.readouterr()
    run_dir = next((root / "runs" / "quick").rglob("result.json")).parent  # the folder main() named
    logged = (run_dir / "train.log").read_text()  # Hydra's log file (its dictConfig replaces pytest's log capture)
    said = out.out + out.err + logged
    assert stop.value.code == 1, said[-3000:]
    assert "Traceback" not in said
    errors = [ln for ln in logged.splitlines() if "[ERROR]" in ln]
    console = [ln for ln in (out.out + out.err).splitlines() if "torch.compile failed" in ln]
    assert len(errors) == 1 and console == errors, said[-3000:]  # one line, on the console and in the log
    line = errors[0].split("[ERROR] ", 1)[1]
    assert line.startswith("train.compile=true: torch.compile failed on attention 'softmax' (BackendCompilerFailed: ")
    assert "no working triton" in line and "train.compile=auto" in line
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "failed" and rec["reason"] == f"CompileError: {line}"
    assert rec["compiled"] is False and rec["compile_note"] == line  # what ran: nothing compiled
