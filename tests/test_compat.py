"""lra/compat.py: each private API of torch and Lightning behind one function with a fallback. Each function
is run on the real private API and with that API taken away; where the fallback computes an answer, it must
be the private API's on real objects."""

import sys

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import attention.registry
from lra import compat
from lra.compat import CompatError


# ---------------------------------------------------------------------------------------------- Lightning
class _Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.lin(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Record(L.Callback):
    """At every batch end: (batch index, Lightning's private answer, compat's answer, compat's fallback's)."""

    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append(
            (
                batch_idx,
                trainer.fit_loop.epoch_loop._should_accumulate(),
                compat.should_accumulate(trainer, batch_idx),
                compat._should_accumulate_fallback(trainer, batch_idx),
            )
        )


def _fit(accumulate: int, batches: int = 7, epochs: int = 2) -> list:
    rec = _Record()
    data = DataLoader(TensorDataset(torch.randn(batches, 2)), batch_size=1)
    trainer = L.Trainer(
        max_epochs=epochs,
        accumulate_grad_batches=accumulate,
        callbacks=[rec],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(_Tiny(), data)
    return rec.rows


@pytest.mark.parametrize("accumulate", [1, 2, 3, 7])
def test_should_accumulate_fallback_equals_lightnings_on_a_real_trainer(accumulate):
    """7 batches an epoch, 2 epochs: accumulation windows that end early on the epoch's last batch included."""
    rows = _fit(accumulate)
    assert [r[0] for r in rows] == list(range(7)) * 2
    for batch_idx, private, ours, fallback in rows:
        assert private == ours == fallback, (accumulate, batch_idx, private, ours, fallback)
    stepped = [r[0] for r in rows[:7] if not r[1]]
    assert stepped == sorted({i for i in range(7) if (i + 1) % accumulate == 0} | {6})  # the rule, spelled out


def test_should_accumulate_without_the_private_method_uses_the_rule():
    """A Lightning without ``_should_accumulate`` (or one that moved the epoch loop): the fallback's answer."""
    strategy = type("S", (), {"handles_gradient_accumulation": False})()
    trainer = type("T", (), {"accumulate_grad_batches": 4, "num_training_batches": 10, "strategy": strategy})()
    got = [compat.should_accumulate(trainer, i) for i in range(10)]
    assert got == [True, True, True, False, True, True, True, False, True, False]
    strategy.handles_gradient_accumulation = True  # e.g. DeepSpeed: the strategy decides on the last batch
    assert compat.should_accumulate(trainer, 9) is True


def test_tensorboard_available_real_and_fallback(monkeypatch):
    import lightning.fabric.loggers.tensorboard as tb

    private = bool(tb._TENSORBOARD_AVAILABLE or tb._TENSORBOARDX_AVAILABLE)
    assert compat.tensorboard_available() == private
    assert compat._tensorboard_fallback() == private
    monkeypatch.delattr(tb, "_TENSORBOARD_AVAILABLE")  # a Lightning that renamed it
    assert compat.tensorboard_available() == private
    monkeypatch.setattr(compat.importlib.util, "find_spec", lambda name: None)
    assert compat.tensorboard_available() is False


# ---------------------------------------------------------------------------------------------- torch
def test_fake_tensor_mode_and_fake_copy_real_and_fallback(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    mode = compat.fake_tensor_mode()
    assert isinstance(mode, FakeTensorMode)
    t, one = torch.randn(3, 5), torch.tensor(7)
    real = compat.fake_copy(mode, t)
    const = compat.fake_copy(mode, one, constant=True)
    with mode:
        assert int(const) == 7  # the converter keeps a one-element buffer's value
    conv = mode.fake_tensor_converter

    class Changed:  # a torch whose converter lost ``make_constant``
        def from_real_tensor(self, m, x, **kw):
            if "make_constant" in kw:
                raise TypeError("from_real_tensor() got an unexpected keyword argument 'make_constant'")
            return conv.from_real_tensor(m, x, **kw)

    monkeypatch.setattr(mode, "fake_tensor_converter", Changed())
    plain = compat.fake_copy(mode, t)
    for f in (real, plain):
        assert is_fake(f) and f.shape == t.shape and f.dtype == t.dtype and f.device == t.device
    with pytest.raises(CompatError, match="outside the range pyproject.toml declares") as e:
        compat.fake_copy(mode, one, constant=True)
    assert "\n" not in str(e.value) and "hardware.micro_batch" in str(e.value)


@pytest.mark.parametrize(
    "module,call",
    [
        ("torch._subclasses.fake_tensor", compat.fake_tensor_mode),
        ("torch.distributed._tools.mem_tracker", compat.mem_tracker),
    ],
)
def test_missing_private_torch_module_is_one_line(monkeypatch, module, call):
    monkeypatch.setitem(sys.modules, module, None)  # what `import` sees when the module is gone
    with pytest.raises(CompatError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and module.rsplit(".", 1)[0] in msg and f"torch {torch.__version__}" in msg
    assert "hardware.micro_batch" in msg


def test_mem_tracker_real_and_changed(monkeypatch):
    from torch.distributed._tools import mem_tracker

    assert isinstance(compat.mem_tracker(), mem_tracker.MemTracker)
    monkeypatch.delattr(mem_tracker.MemTracker, "reset_mod_stats")
    with pytest.raises(CompatError, match="MemTracker.reset_mod_stats"):
        compat.mem_tracker()


def test_the_memory_fit_degrades_to_no_accumulation_without_fake_tensors(tmp_path, monkeypatch):
    """The documented degraded path: the estimate's CompatError is one warning; training goes on."""
    from lra.config import load
    from lra.fit import plan

    monkeypatch.setitem(sys.modules, "torch._subclasses.fake_tensor", None)
    p = plan(load([f"runs_root={tmp_path}", "fit.cache=false", "preset=quick", "hardware=v100_16gb"]))
    assert (p.micro_batch, p.accum_steps) == (32, 1) and p.source.startswith("no estimate (CompatError)")


def test_is_fake_fallback_in_attention_equals_torchs():
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    mode = FakeTensorMode()
    with mode:
        made = torch.empty(2, 3)
    cases = [torch.randn(2), torch.empty(2, device="meta"), mode.from_tensor(torch.randn(4)), made]
    assert [is_fake(t) for t in cases] == [False, False, True, True]
    assert [attention.registry._is_fake_by_class(t) for t in cases] == [is_fake(t) for t in cases]
    assert attention.registry.is_fake is is_fake  # the real one where torch has it
