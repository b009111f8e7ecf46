"""Backend registry: the one place that maps a name to an attention module.

Contract (docs/design.md):
  available() -> sorted list of names
  build(name, *, num_heads, head_dim, max_len, **options) -> nn.Module
  module(q, k, v, mask=None) -> out, all (batch, heads, n, head_dim); mask bool (batch, n), True = real.

A backend is a subclass of :class:`AttentionBackend` with
  * ``Options``: a frozen dataclass of its options, each field with a default; validation of ranges
    goes in ``Options.__post_init__`` and raises :class:`InvalidOption` naming the option and range;
  * ``capabilities``: a :class:`Capabilities` saying what it supports.
It is registered with :func:`register` (several names may share a class with different option
defaults, e.g. the Skeinformer ablations). Every module in this package is imported by
:func:`_load_all`, so a new backend is a new file: nothing else changes. Every module :func:`build`
makes checks its output as it runs (:class:`OutputContract`): a broken backend is named where it breaks.
"""

from __future__ import annotations

import contextvars
import dataclasses
import fnmatch
import importlib
import importlib.metadata
import inspect
import logging
import math
import os
import pkgutil
import re
import sys
import traceback
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

log = logging.getLogger("attention")


def _is_fake_by_class(t: torch.Tensor) -> bool:
    """The fallback of the private ``is_fake``: a tensor whose class (or a base) is torch's ``FakeTensor``."""
    return any(c.__name__ == "FakeTensor" for c in type(t).__mro__)


try:  # a private torch API (lra/compat.py lists it; attention/ imports torch only, so its guard lives here)
    from torch._subclasses.fake_tensor import is_fake
except ImportError:  # a torch that moved it
    is_fake = _is_fake_by_class


class InvalidOption(ValueError):
    """An attention option that does not exist or lies outside its range."""


class BackendContractError(RuntimeError):
    """A backend's output broke the contract (its shape, or NaN/inf); the message names the backend."""


class DuplicateBackend(ValueError):
    """A name registered by two classes; ``name`` and ``origin`` (``module:Class`` of the first) say which."""

    def __init__(self, message: str, name: str, origin: str):
        super().__init__(message)
        self.name, self.origin = name, origin


class ExternalImportError(InvalidOption):
    """A user's module (``attn.target``, an entry point, a ``_target_``) failed while it was imported: it raised,
    called ``sys.exit`` or registered a name another backend has. The message names the module and what it did."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend supports; reported by :func:`describe` and checked by the tests."""

    padding_mask: bool = True  # output at real tokens independent of padded content, padding anywhere
    causal: bool = False  # offers a causal mode
    block_multiple: int | None = None  # n must be a multiple of this (None: any n; padding done inside)
    exact: bool = False  # equals its target (softmax or its own kernel) up to float error
    randomized: bool = False  # draws from torch's RNG (seeded by torch.manual_seed)
    complexity: str = "O(n^2)"  # leading time complexity in n
    target: str = "softmax"  # what the method approximates or computes ("softmax", "gaussian", ...)
    shared_qk: bool = False  # ties K to Q (Reformer): k receives no gradient
    uses_qk: bool = True  # False for backends that never look at q, k (none, vmean)
    compiles: bool = True  # traces as one graph, no recompiles when padding changes; False: the harness runs it eager
    notes: str = ""


@dataclass(frozen=True)
class NoOptions:
    """For backends without options."""


class AttentionBackend(nn.Module):
    """Base class. Subclasses implement ``forward(q, k, v, mask=None)``."""

    Options: type = NoOptions
    capabilities: Capabilities = Capabilities()

    def __init__(self, num_heads: int, head_dim: int, max_len: int, options: Any):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_len = max_len
        self.options = options

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, max_len={self.max_len}, {self.options}"


@dataclass(frozen=True)
class _Entry:
    name: str
    cls: type
    defaults: dict = field(default_factory=dict)
    doc: str = ""
    capabilities: Capabilities | None = None  # a variant's own, where its defaults change them


_REGISTRY: dict[str, _Entry] = {}
_BROKEN: dict[str, ExternalImportError] = {}  # entry points whose import failed: asking for one says why
_LOADED = False


def register(
    name: str, *, defaults: dict | None = None, doc: str = "", capabilities: Capabilities | None = None
) -> Callable[[type], type]:
    """Class decorator that makes an :class:`AttentionBackend` subclass buildable by name.

    Stack several for variants: the same class under another name with other option defaults.

    Args:
        name: the registry name (``attn=<name>`` on the command line, a row of the tables).
        defaults: option values this name uses instead of the ``Options`` dataclass's own; every key
            must be a field of ``cls.Options``.
        doc: one line for ``attention.describe`` (default: the class docstring's first line).
        capabilities: overrides the class's declared :class:`Capabilities` for this name (e.g. an
            ablation whose defaults change its complexity).

    Returns:
        The decorator; it returns the class unchanged. It raises ``TypeError`` for a class that is not
        an ``AttentionBackend``, ``ValueError`` for a name registered twice or an unknown default.

    Example::

        @attention.register("mine", defaults={"num_features": 64})
        class Mine(attention.AttentionBackend):
            @dataclass
            class Options:
                num_features: int = 128

            def forward(self, q, k, v, mask=None):  # (batch, heads, n, head_dim), mask (batch, n) True = real
                ...

        attention.build("mine", num_heads=2, head_dim=32, max_len=1024)   # num_features=64
        attention.testing.check_backend("mine")                             # the contract, checked
    """

    def deco(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)):
            raise TypeError(f"{cls!r} must subclass attention.AttentionBackend")
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            first = _REGISTRY[name].cls
            origin = f"{first.__module__}:{first.__qualname__}"
            raise DuplicateBackend(
                f"attention backend {name!r} registered twice ({origin} and {cls.__module__}:{cls.__qualname__})",
                name,
                origin,
            )
        fields = {f.name for f in dataclasses.fields(cls.Options)}
        unknown = set(defaults or {}) - fields
        if unknown:
            raise ValueError(f"defaults {sorted(unknown)} of {name!r} are not options of {cls.__name__}")
        _REGISTRY[name] = _Entry(
            name, cls, dict(defaults or {}), doc or (cls.__doc__ or "").strip().split("\n")[0], capabilities
        )
        return cls

    return deco


ENTRY_POINTS = "lra_harness.attention"  # entry-point group of backends that live in other packages


def _load_all() -> None:
    """Import this package's modules, then the backends other packages announce: the entry points of
    group ``lra_harness.attention`` (a module whose import registers its backends, or an AttentionBackend
    class each). Registered that way, a backend is one like ours: ``attn=<name>``, typed options, the fit,
    the contract checks, the tables. The other way in is ``attn.target`` (:func:`load_external`)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True  # before the imports: a module being imported may call available()
    import attention

    for mod in sorted(pkgutil.iter_modules(attention.__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"attention.{mod.name}")
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        try:
            import_contained(ep.module)
            _adopt(ep.load(), ep.name)
        except (ImportError, AttributeError, ValueError, TypeError) as e:  # every harness command imports these:
            dist = getattr(ep.dist, "name", None)  # one broken package must not stop the runs of the others
            what = str(e) if isinstance(e, ExternalImportError) else f"{_said(e)}: fix it"
            _BROKEN[ep.name] = ExternalImportError(
                f"entry point {ep.name} = {ep.value} (group {ENTRY_POINTS}{f', package {dist}' if dist else ''}): "
                f"{what}, or uninstall the package that announces it"
            )
            log.warning("%s; left out", _BROKEN[ep.name])
    if os.environ.get("LRA_ATTENTION_MODULES"):  # a third way in that was dropped: say what replaced it
        warnings.warn(
            "LRA_ATTENTION_MODULES is no longer read: announce the module as an entry point of group "
            f"{ENTRY_POINTS} (e.g. `mine = my_pkg.attn`) or run with attn.target=<module>:<Class>",
            stacklevel=2,
        )


def _adopt(obj, name: str) -> str:
    """Register ``obj`` (an AttentionBackend class) under ``name`` unless it registered itself."""
    if isinstance(obj, type) and issubclass(obj, AttentionBackend):
        known = [e.name for e in _REGISTRY.values() if e.cls is obj]
        if known:
            return known[0]
        register(name)(obj)
        return name
    if obj is None or isinstance(obj, types.ModuleType):  # a module whose import registered its backends
        return name
    raise TypeError(f"{name}: {obj!r} is not an attention.AttentionBackend subclass or a module")


# torch's process-wide settings, each (what, get, set): a user's module that changes one at import would change
# every run that imports it (a float64 run recorded as 32-true), so :func:`import_contained` puts them back
_TORCH_GLOBALS = (
    ("default dtype", torch.get_default_dtype, torch.set_default_dtype),
    ("default device", torch.get_default_device, lambda d: torch.set_default_device(None if d.type == "cpu" else d)),
    ("threads", torch.get_num_threads, torch.set_num_threads),
    (
        "deterministic algorithms",
        lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
    ),
    ("grad enabled", torch.is_grad_enabled, torch.set_grad_enabled),
    ("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
)


def import_contained(module: str) -> types.ModuleType:
    """Import a user's module (``attn.target``, an entry point, a callback's or logger's ``_target_``) so that
    what its top-level code does stays there.

    * An exception it raises, or ``sys.exit``, is :class:`ExternalImportError` naming the module and what it
      did (a backend name another class has, in those words); an ``ImportError`` stays one (the module or a
      package it needs is missing: the caller says where to look). Names it registered before failing are
      dropped. ``KeyboardInterrupt`` and the harness's signals (subclasses of ``SystemExit``) go on.
    * torch's process-wide settings it changed (default dtype and device, threads, deterministic algorithms,
      grad mode, float32 matmul precision) are put back, with one warning saying which: a run trains as its
      config and record say; a backend that wants float64 or no grad sets it in its own ``forward``.
    """
    if not module or module.startswith("."):
        raise ImportError(f"{module!r} is not a module's full name")
    if module in sys.modules:  # imported already: nothing of it runs again
        return sys.modules[module]
    state = {what: get() for what, get, _ in _TORCH_GLOBALS}
    names = set(_REGISTRY)
    try:
        return importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        if isinstance(e, SystemExit) and type(e) is not SystemExit:  # a signal, as lra.interrupts raises it
            raise
        for name in set(_REGISTRY) - names:
            del _REGISTRY[name]
        if isinstance(e, ImportError):
            raise
        raise ExternalImportError(f"importing {module} {_did(e)}") from None
    finally:
        _restore(module, state)


def _did(e: BaseException) -> str:
    """What a module's import did instead of finishing (and where, for an exception) and what to do."""
    if isinstance(e, DuplicateBackend):
        return f"registers the backend name {e.name!r}, which is {e.origin}'s: register its class under another name"
    if isinstance(e, SystemExit):
        return f"called sys.exit({e.code!r}): a module the harness imports must not exit"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<")]
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"raised {_said(e)}{where}: fix that module"


def _said(e: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _restore(module: str, state: dict) -> None:
    changed = []
    for what, get, put in _TORCH_GLOBALS:
        now = get()
        if now != state[what]:
            put(state[what])
            changed.append(f"{what} {_shown(now)} -> {_shown(state[what])}")
    if changed:
        log.warning(
            "importing %s changed torch's global settings; restored: %s (a backend sets what it needs in its "
            "own code, not at import)",
            module,
            ", ".join(changed),
        )


def _shown(value) -> str:
    if isinstance(value, tuple):  # deterministic algorithms: (on, warn only)
        return ("on, warn only" if value[1] else "on") if value[0] else "off"
    return str(value).removeprefix("torch.")


# words spelled with capitals around a small letter, one word each in snake_case (``NaNOut`` -> ``nan_out``, where
# the capitals alone would split it into ``na_n_out``); not where a small letter follows (``NaNa`` is no NaN)
_MIXED_WORDS = re.compile(r"NaN(?=s?(?![a-z]))")


def snake_case(class_name: str) -> str:
    """``TempSoftmax`` -> ``temp_softmax``, ``YOSOConv`` -> ``yoso_conv``, ``NaNOut`` -> ``nan_out``: a class's
    name in the registry."""
    name = _MIXED_WORDS.sub(lambda m: m.group(0).capitalize(), class_name)
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def load_external(target: str) -> str:
    """Import ``package.module:ClassName`` and return its registry name, the same whatever route loads the
    class (it is the run record's ``attn``): the name it is registered under already (an entry point of
    group ``lra_harness.attention``, ``@attention.register`` in a module it names), else its class
    name in snake_case (``TempSoftmax`` -> ``temp_softmax``), registered now; else, where another backend
    has that name, the class name itself. Errors say what to fix in one line."""
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise InvalidOption(f"attn.target={target!r}: expected 'package.module:ClassName'")
    _load_all()
    try:
        obj = getattr(import_contained(module), attr)
    except ExternalImportError as e:
        raise ExternalImportError(f"attn.target={target!r}: {e}") from None
    except (ImportError, AttributeError) as e:
        raise InvalidOption(
            f"attn.target={target!r} cannot be imported ({type(e).__name__}: {e}); is its package "
            f"installed or on PYTHONPATH?"
        ) from None
    if not (isinstance(obj, type) and issubclass(obj, AttentionBackend)):
        raise InvalidOption(f"attn.target={target!r} is not a subclass of attention.AttentionBackend")
    snake = snake_case(obj.__name__)
    try:  # _adopt keeps a registered class's own name
        return _adopt(obj, snake if snake not in _REGISTRY else obj.__name__)
    except ValueError as e:  # another class registered under the same name
        raise InvalidOption(
            f"attn.target={target!r}: {e}; register the class under another name " f"(@attention.register('<name>'))"
        ) from None


def available() -> list[str]:
    """Every registered backend name, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def list_backends(pattern: str | None = None) -> list[str]:
    """The registered backend names that match ``pattern`` (shell-style, :func:`fnmatch.fnmatchcase`), sorted.

    Args:
        pattern: e.g. ``"*former*"`` or ``"skein*"``; None (the default) or ``"*"``: every name, as
            :func:`available`.

    Returns:
        The matching names; an empty list where none matches.

    Example:
        >>> attention.list_backends("yoso*")
        ['yoso', 'yoso_conv', 'yoso_e']
    """
    names = available()
    return names if pattern is None else [n for n in names if fnmatch.fnmatchcase(n, pattern)]


def _entry(name: str) -> _Entry:
    _load_all()
    if name not in _REGISTRY and name in _BROKEN:
        raise _BROKEN[name]
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join(available())}")
    return _REGISTRY[name]


def option_defaults(name: str) -> dict:
    """The options of ``name`` with their default values (variant defaults applied)."""
    e = _entry(name)
    out = {
        f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        for f in dataclasses.fields(e.cls.Options)
    }
    out.update(e.defaults)
    return out


def make_options(name: str, **options) -> Any:
    """Validate ``options`` for backend ``name`` and return its ``Options`` instance."""
    e = _entry(name)
    fields = {f.name for f in dataclasses.fields(e.cls.Options)}
    unknown = sorted(set(options) - fields)
    if unknown:
        valid = ", ".join(sorted(fields)) or "(none)"
        raise InvalidOption(f"unknown option(s) {unknown} for attention {name!r}; valid options: {valid}")
    merged = {**e.defaults, **options}
    try:
        return e.cls.Options(**merged)
    except InvalidOption as err:
        raise InvalidOption(f"attention {name!r}: {err}") from None


def build(name: str, *, num_heads: int, head_dim: int, max_len: int, **options) -> nn.Module:
    """Instantiate backend ``name``, its output checked against the contract on every call.

    Args:
        name: a registered name (``attention.available()``).
        num_heads, head_dim, max_len: the layer's shape; each a positive int.
        **options: fields of the backend's ``Options`` (``attention.describe(name)`` lists them); the
            registered defaults fill the rest.

    Returns:
        The module: ``module(q, k, v, mask=None)`` with q, k, v ``(batch, heads, n, head_dim)`` and mask
        ``(batch, n)`` (True = real token), returning ``(batch, heads, n, head_dim)``.

    Raises ``ValueError`` naming the available backends for an unknown name, and :class:`InvalidOption`
    naming the option for an unknown or out-of-range one.

    Example::

        attn = attention.build("skeinformer", num_heads=2, head_dim=32, max_len=2048, num_features=128)
        out = attn(q, k, v, mask)
    """
    for key, val in (("num_heads", num_heads), ("head_dim", head_dim), ("max_len", max_len)):
        if not isinstance(val, int) or val < 1:
            raise InvalidOption(f"{key} must be a positive int, got {val!r}")
    opts = make_options(name, **options)
    e = _entry(name)
    module = e.cls(num_heads=num_heads, head_dim=head_dim, max_len=max_len, options=opts)
    module.register_forward_hook(OutputContract(name, e.cls), with_kwargs=True)
    return module


def options_class(name: str) -> type:
    """The ``Options`` dataclass of backend ``name`` (the config tree generates its node from it)."""
    return _entry(name).cls.Options


class Description(dict):
    """:func:`describe`'s answer: a dict for programs, a table when printed."""

    def __str__(self) -> str:
        lines = [
            f"{self['name']} ({self['module']}.{self['class']}): {self['doc']}",
            f"  complexity {self['complexity']}, target {self['target']}, exact {self['exact']}, "
            f"randomized {self['randomized']}, padding mask {self['padding_mask']}",
        ]
        for opt, info in self["option_info"].items():
            lines.append(f"  {opt}: {info['type']} = {info['default']!r}  {info['range']}  {info['doc']}".rstrip())
        return "\n".join(lines) if self["option_info"] else "\n".join(lines + ["  (no options)"])


def describe(name: str) -> Description:
    """Capabilities, options (type, default, allowed range, one-line meaning) and doc of a backend.

    Example:
        >>> print(attention.describe("skeinformer"))   # a table; describe(...)["options"] are the defaults
    """
    e = _entry(name)
    defaults = option_defaults(name)
    return Description(
        {
            "name": name,
            "class": e.cls.__name__,
            "module": e.cls.__module__,
            "doc": e.doc,
            "options": defaults,
            "option_info": option_info(name),
            **dataclasses.asdict(capabilities(name)),
        }
    )


def option_info(name: str) -> dict:
    """Per option: its type, default, the range its checks allow, and the comment on its field."""
    cls = options_class(name)
    defaults = option_defaults(name)
    hints = typing.get_type_hints(cls)
    ranges: dict[str, str] = {}
    token = _RANGES.set(ranges)
    try:  # the checks in Options.__post_init__ say what they allow as they run on the defaults
        cls(**defaults)
    finally:
        _RANGES.reset(token)
    docs = _field_comments(cls)
    return {
        f.name: {
            "type": _type_name(hints[f.name]),
            "default": defaults[f.name],
            "range": ranges.get(f.name, ""),
            "doc": docs.get(f.name, ""),
        }
        for f in dataclasses.fields(cls)
    }


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")


def _field_comments(cls: type) -> dict:
    """``field: type = default  # meaning`` -> {field: meaning}; the comment is the one declaration. A meaning
    too long for one line is the block of ``# ...`` lines right above the field instead."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):  # no source (e.g. a frozen install): no meanings, everything else stands
        return {}
    docs, above = {}, []
    for line in src.splitlines():
        if m := re.match(r"^\s+#\s?(.*)$", line):
            above.append(m[1].strip())
            continue
        if m := re.match(r"^\s+(\w+)\s*:[^=\n]+=[^#\n]*(?:#\s*(.+))?$", line):
            doc = (m[2] or "").strip() or " ".join(above)
            if doc:
                docs[m[1]] = doc
        above = []
    return docs


def capabilities(name: str) -> Capabilities:
    e = _entry(name)
    return e.capabilities or e.cls.capabilities


# ---------------------------------------------------------------- option validation helpers
_RANGES: contextvars.ContextVar = contextvars.ContextVar("attention_option_ranges", default=None)


def check_range(name: str, value, lo=None, hi=None, *, lo_open=False, hi_open=False, integer=False) -> None:
    """Raise :class:`InvalidOption` unless ``lo <= value <= hi`` (open ends as requested).

    NaN is refused always (it passes every comparison). A missing bound (``None``) means unbounded
    but finite; infinity passes only a bound that says so explicitly (``hi=math.inf``, closed).
    """
    lb, rb = "(" if lo_open or lo is None else "[", ")" if hi_open or hi is None else "]"
    span = f"{lb}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}{rb}"
    if _RANGES.get() is not None:
        _RANGES.get()[name] = ("integer " if integer else "") + span
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidOption(f"option {name!r} must be an integer, got {value!r}; allowed: integer {span}")
    if not integer and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise InvalidOption(f"option {name!r} must be a number, got {value!r}; allowed: {span}")
    if value != value:  # NaN: every comparison below would be False, so it would pass them all
        raise InvalidOption(f"option {name!r}={value!r} is not a number; allowed: {span}")
    unbounded_inf = isinstance(value, float) and math.isinf(value) and (hi is None if value > 0 else lo is None)
    bad = (
        unbounded_inf
        or (lo is not None and (value <= lo if lo_open else value < lo))
        or (hi is not None and (value >= hi if hi_open else value > hi))
    )
    if bad:
        raise InvalidOption(f"option {name!r}={value!r} out of range {span}")


def check_choice(name: str, value, choices) -> None:
    if _RANGES.get() is not None:
        _RANGES.get()[name] = "one of " + "|".join(map(str, choices))
    if value not in choices:
        raise InvalidOption(f"option {name!r}={value!r} invalid; choose one of {list(choices)}")


# ---------------------------------------------------------------- the output contract, checked as it runs
CONTRACT = "the contract is out of shape (batch, heads, n, head_dim), a row per query with v's head_dim"
_PACKAGE = __name__.partition(".")[0]  # the built-in backends' package


class OutputContract:
    """The forward hook :func:`build` gives every backend, so a broken one is named where it breaks,
    not in a reshape further on (lra/model.py).

    * Shape, on every call: free, the shapes are Python ints (under ``torch.compile`` the comparison
      is made once, while tracing, and adds nothing to the graph).
    * Finite output at real positions, for a backend from another package only, on its first call
      with real tensors, then never again: reading a value from the device stalls it, once per
      module is nothing, once per step is not. Ours are held to it by the contract tests; left out
      under ``torch.compile`` (a data-dependent branch would break the graph) and on the fake
      tensors of the memory fit (no values).
    """

    def __init__(self, name: str, cls: type):
        self.name, self.origin = name, f"{cls.__module__}:{cls.__qualname__}"
        self.finite_pending = cls.__module__.partition(".")[0] != _PACKAGE

    def who(self) -> str:
        return f"attention {self.name!r} ({self.origin})"

    def __call__(self, module, args, kwargs, out):
        q, k, v, mask = _qkv_mask(args, kwargs)
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or q.dim() != 4 or v.dim() != 4:
            return None  # not called as the contract says: nothing to compare with
        if not isinstance(out, torch.Tensor):
            raise BackendContractError(f"{self.who()} returned a {type(out).__name__}, not a tensor: {CONTRACT}")
        want = (*q.shape[:3], v.shape[-1])
        if tuple(out.shape) != want:
            raise BackendContractError(
                f"{self.who()} returned shape {tuple(out.shape)} for q {tuple(q.shape)} and v "
                f"{tuple(v.shape)}: {CONTRACT}, here {want}"
            )
        if _has_values(out) and self.finite_pending:  # _has_values first: under compile the flag is never read
            self.finite_pending = False
            self._check_finite(q, k, v, mask, out)
        return None

    def _check_finite(self, q, k, v, mask, out) -> None:
        b, _, n, _ = q.shape
        if mask is not None and tuple(mask.shape) != (b, n):
            return  # the backend's own mask check speaks for that
        padded = torch.zeros(b, n, dtype=torch.bool, device=q.device) if mask is None else ~mask.bool()
        padded = padded[:, None, :, None]

        def finite_where_real(t):
            return t.detach().isfinite().logical_or_(padded).all()

        inputs_ok, out_ok = torch.stack(
            [torch.stack([finite_where_real(t) for t in (q, k, v)]).all(), finite_where_real(out)]
        ).tolist()  # one sync for both answers
        if inputs_ok and not out_ok:
            raise BackendContractError(
                f"{self.who()} returned NaN or inf at real (unmasked) positions for finite q, k, v on its first call: "
                f"the contract is a finite output where the mask is True (attention.testing.check_backend("
                f"{self.name!r}) runs the whole contract)"
            )


def _qkv_mask(args: tuple, kwargs: dict) -> list:
    """``module(q, k, v, mask)`` with any of them passed by keyword -> [q, k, v, mask]."""
    return list(args[:4]) + [kwargs.get(a) for a in ("q", "k", "v", "mask")[len(args) :]]


def _has_values(t: torch.Tensor) -> bool:
    """False while torch.compile traces or a CUDA graph is captured, and for meta or fake tensors (the
    memory fit): no values to read, or no reading allowed."""
    return (
        not torch.compiler.is_compiling()
        and not t.is_meta
        and not is_fake(t)
        and not (t.is_cuda and torch.cuda.is_current_stream_capturing())
    )


# ---------------------------------------------------------------- shared tensor helpers
def full_mask(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The bool (batch, n) mask, all True when ``mask`` is None; validates shape and dtype."""
    b, _, n, _ = q.shape
    if mask is None:
        return torch.ones(b, n, dtype=torch.bool, device=q.device)
    if mask.shape != (b, n):
        raise ValueError(f"mask must have shape (batch, n)=({b}, {n}), got {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask.bool()
