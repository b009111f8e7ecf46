"""The private APIs of torch and Lightning that lra/ uses, one function each, with a fallback.

A private name (a leading underscore, or a module under ``torch._*``) may move or change in any release,
which is why pyproject.toml caps torch and lightning at the minor releases the suite was run with
(docs/dependencies.md). Everything else in lra/ calls these functions and imports none of those names.
tests/test_compat.py runs each function on the real API and with the private name taken away, and checks
that the fallback gives the private API's answer where it can compute one.

=============================  =====================================================  ==========================
function                       private API                                            without it
=============================  =====================================================  ==========================
:func:`should_accumulate`      Lightning ``fit_loop.epoch_loop._should_accumulate()``  computed from
                                                                                       ``accumulate_grad_batches``
                                                                                       and the batch index
:func:`tensorboard_available`  Lightning ``_TENSORBOARD_AVAILABLE`` / ``..X_..``        ``importlib.util.find_spec``
:func:`fake_tensor_mode`,      ``torch._subclasses.fake_tensor.FakeTensorMode`` and     :class:`CompatError` (one
:func:`fake_copy`              its ``fake_tensor_converter``                          line); a plain fake copy
                                                                                       where no constant is needed
:func:`mem_tracker`            ``torch.distributed._tools.mem_tracker.MemTracker``      :class:`CompatError`
=============================  =====================================================  ==========================

Without the fake tensors or the memory tracker only the memory fit's estimate (``lra.fit``: a GPU profile
with no ``hardware.micro_batch``) is lost: ``lra.fit.plan`` logs the :class:`CompatError`'s one line and trains
the whole per-device batch without accumulation, as after any failed estimate; ``hardware.micro_batch=<m>``
chooses the micro-batch by hand. Importing lra, and every other part of a run, still work.

Two private uses live elsewhere, each in its own single home:

* ``attention/registry.py`` imports ``torch._subclasses.fake_tensor.is_fake`` behind the same kind of guard
  (a class-name test when it is missing): ``attention/`` imports torch only (docs/architecture.md), never lra.
* Hydra's ``hydra._internal.callbacks.Callbacks``: ``lra/hydra_glue.py`` is the one module that uses Hydra
  beyond its compose API; hydra-core is capped at the minor release the suite runs (``<1.4``).
"""

from __future__ import annotations

import importlib.util


class CompatError(RuntimeError):
    """A private API lra needs is missing or changed in the installed release (outside the tested range)."""


def _no_estimate(what: str) -> str:
    """The one line of a :class:`CompatError` of the memory fit: which torch API, and what to do instead."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version("torch")
    except PackageNotFoundError:
        have = "not installed"
    return (
        f"{what} is missing or changed in torch {have}, outside the range pyproject.toml declares "
        f"(docs/dependencies.md); the memory fit cannot estimate: set hardware.micro_batch"
    )


# ---------------------------------------------------------------------------------------------- Lightning
def should_accumulate(trainer, batch_idx: int) -> bool:
    """True when the batch ``batch_idx`` (of the epoch, 0-based, as ``on_train_batch_end`` receives it) only
    accumulated gradients, with no optimizer step after it. Lightning's own ``_should_accumulate`` when
    it exists; else the same rule: a step every ``accumulate_grad_batches`` batches and on the epoch's
    last batch (unless the strategy accumulates itself)."""
    private = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "_should_accumulate", None)
    if callable(private):
        try:
            return bool(private())
        except (AttributeError, TypeError):  # its internals changed: the rule below
            pass
    return _should_accumulate_fallback(trainer, batch_idx)


def _should_accumulate_fallback(trainer, batch_idx: int) -> bool:
    ready = batch_idx + 1
    done = ready % max(int(trainer.accumulate_grad_batches), 1) == 0
    last = ready == trainer.num_training_batches
    return not done and (bool(getattr(trainer.strategy, "handles_gradient_accumulation", False)) or not last)


def tensorboard_available() -> bool:
    """Whether Lightning's TensorBoardLogger can write (``tensorboard`` or ``tensorboardX`` installed)."""
    try:
        from lightning.fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE, _TENSORBOARDX_AVAILABLE
    except ImportError:
        return _tensorboard_fallback()
    return bool(_TENSORBOARD_AVAILABLE or _TENSORBOARDX_AVAILABLE)


def _tensorboard_fallback() -> bool:
    return any(importlib.util.find_spec(m) is not None for m in ("tensorboard", "tensorboardX"))


# ---------------------------------------------------------------------------------------------- torch
def fake_tensor_mode():
    """A new ``FakeTensorMode`` (tensors with shapes and no storage: the memory fit's estimate)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:
        raise CompatError(_no_estimate("torch._subclasses.fake_tensor.FakeTensorMode")) from None
    return FakeTensorMode()


def fake_copy(mode, t, constant: bool = False):
    """A fake tensor of ``mode`` like ``t``; ``constant=True`` keeps ``t``'s values readable (``int()`` of a
    one-element buffer), which only the mode's converter offers."""
    conv = getattr(mode, "fake_tensor_converter", None)
    if conv is not None:
        try:
            return conv.from_real_tensor(mode, t, make_constant=constant)
        except TypeError:  # its signature changed: the plain copy below
            pass
    if constant:
        raise CompatError(_no_estimate("FakeTensorMode.fake_tensor_converter.from_real_tensor"))
    return mode.from_tensor(t)


def mem_tracker():
    """A new ``MemTracker``: peak tensor memory of a training step, rounded to CUDA's allocator blocks."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:  # moved, or a torch built without torch.distributed
        raise CompatError(_no_estimate("torch.distributed._tools.mem_tracker.MemTracker")) from None
    tracker = MemTracker()
    missing = [m for m in ("track_external", "reset_mod_stats", "get_tracker_snapshot") if not hasattr(tracker, m)]
    if missing:
        raise CompatError(_no_estimate(f"MemTracker.{missing[0]}"))
    return tracker
