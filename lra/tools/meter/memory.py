"""The one memory meter of the harness: the peak bytes of the tensors alive while a call runs.

Part of the measuring package :mod:`lra.tools.meter`: used by the benchmark (:mod:`lra.tools.bench`) and the doctor's
check of the memory fit. (The fit itself
estimates, it does not measure: ``lra.fit.train_step_peak`` runs torch's ``MemTracker`` over fake
tensors.) Two ways of measuring, one per kind of device:

* :func:`live_peak`, any device, the only one on a CPU (where allocator statistics do not exist and
  RSS is too noisy): :class:`LiveTensorBytes` follows every tensor storage an aten op returns, exact
  at the op level.
* On CUDA :func:`measure_peak` reads the caching allocator: ``max_memory_allocated`` over the call,
  after ``reset_peak_memory_stats``.

Both count the storages of the ``known`` tensors (parameters, optimizer states, inputs) that exist
before the call, once, so the two figures mean the same thing: what this call needs, its own state
and inputs included. Imports torch, the standard library and :mod:`lra.devices` only.
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterable, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lra.devices import sync

MIB = 1024**2
LIVE = "live tensor storages (dispatch)"  # the method column of a figure from live_peak
CUDA_ABOVE_IDLE = "cuda.max_memory_allocated above idle + own state and inputs"
CUDA_ALL = "cuda.max_memory_allocated"


class Peak(NamedTuple):
    bytes: int
    method: str  # how it was measured (one of LIVE, CUDA_ABOVE_IDLE, CUDA_ALL)


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of tensor storages alive at once, counted at the aten-op level.

    Every tensor an op returns is attributed to its storage (views share one); the storage's bytes
    are added when it is first seen and removed by a weakref callback when torch frees it. Storages
    of ``known`` tensors (inputs, parameters) exist before the measurement: they are not counted
    here (the caller adds their bytes) but views of them are recognised. Scratch memory a kernel
    allocates and frees inside one op (e.g. the blocks of the fused CPU SDPA kernel, BLAS buffers)
    is invisible at this level. Works for any device; used as *the* peak on CPU, where allocator
    statistics do not exist and RSS is too noisy.
    """

    def __init__(self, known=()):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._bytes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self._known: set[int] = set()
        for t in known:
            if isinstance(t, torch.Tensor):
                key = t.untyped_storage()._cdata
                self._known.add(key)
                self._refs[key] = weakref.ref(t.untyped_storage(), self._forget(key))

    def _forget(self, key: int) -> Callable:
        def cb(_ref):
            self._known.discard(key)
            self._refs.pop(key, None)
            self.current -= self._bytes.pop(key, 0)

        return cb

    def _track(self, t: torch.Tensor) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
            return
        key = st._cdata
        if key in self._known:
            return
        nbytes = st.nbytes()
        old = self._bytes.get(key)
        if old is None:
            self._refs[key] = weakref.ref(st, self._forget(key))
            self._bytes[key] = nbytes
            self.current += nbytes
        elif old != nbytes:  # resized in place
            self._bytes[key] = nbytes
            self.current += nbytes - old
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def storage_bytes(tensors: Iterable) -> int:
    """Bytes of the distinct storages behind ``tensors`` (anything else in it is ignored)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def live_peak(fn: Callable[[], object], known: list) -> int:
    """Peak bytes of live tensor storages while ``fn()`` runs, the ``known`` tensors' storages included."""
    live = LiveTensorBytes(known)
    with live:
        fn()
    return storage_bytes(known) + live.peak


def measure_peak(fn: Callable[[], object], known: list, device: str | torch.device, *, above_idle: bool = True) -> Peak:
    """Peak memory of one call of ``fn()`` on ``device``, the ``known`` tensors' storages included.

    CUDA: the allocator's peak over the call. ``above_idle`` (the default) counts its rise above the
    memory allocated before the call plus the storages of ``known``, so tensors of other work that
    happen to be allocated (another part's inputs, cuBLAS workspaces) are not counted; without it,
    everything allocated at the peak. Other devices: :func:`live_peak`.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return Peak(live_peak(fn, known), LIVE)
    sync(device)
    idle = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    top = torch.cuda.max_memory_allocated(device)
    if not above_idle:
        return Peak(top, CUDA_ALL)
    return Peak(top - idle + storage_bytes(known), CUDA_ABOVE_IDLE)
