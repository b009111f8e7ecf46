"""The checks every user value goes through when a run's config is resolved: a bad value raises
:class:`ConfigError`, one line naming the key, the value and what is allowed.

The lowest layer of the config: :mod:`lra.config` (the run spec) and :mod:`lra.tasks` (the task specs)
both check with these, and ``lra.config`` re-exports :class:`ConfigError`. Imports nothing of lra.
"""

from __future__ import annotations

import dataclasses
import math
import typing

SEED_MAX = 2**32 - 1  # what numpy and Lightning's seed_everything accept


class ConfigError(ValueError):
    """A user value that cannot run; the message is one line: key, value, what is allowed."""


def check(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def integer(key: str, value, lo: int | None = None, optional: bool = False, hi: int | None = None) -> None:
    if optional and value is None:
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = is_int and (lo is None or value >= lo) and (hi is None or value <= hi)
    span = f" in [{lo}, {hi}]" if hi is not None else ("" if lo is None else f" >= {lo}")
    check(ok, key, value, f"an integer{span}{' or null' if optional else ''}")


def number(
    key: str,
    value,
    lo: float,
    *,
    open_lo: bool = False,
    hi: float | None = None,
    open_hi: bool = False,
    optional: bool = False,
) -> None:
    if optional and value is None:
        return
    # NaN passes no comparison and so every range: refuse it (and infinity) before comparing
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if open_lo else value >= lo) and (hi is None or (value < hi if open_hi else value <= hi))
    span = (
        f"{'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}"
        if hi is not None
        else f"{'>' if open_lo else '>='} {lo}"
    )
    check(ok, key, value, f"a finite number {'in ' if hi is not None else ''}{span}{' or null' if optional else ''}")


def choice(key: str, value, choices) -> None:
    check(value in choices, key, value, f"one of {', '.join(map(str, choices))}")


def flag(key: str, value) -> bool:
    """A true/false setting: ``force=no`` is a string, and ``bool("no")`` would be True (a finished
    run retrained, its checkpoints deleted), so anything but a boolean is refused."""
    check(isinstance(value, bool), key, value, "true or false")
    return value


def text(key: str, value, optional: bool = False) -> None:
    """A non-empty string (a name, a path)."""
    if optional and value is None:
        return
    check(isinstance(value, str) and value != "", key, value, f"a non-empty string{' or null' if optional else ''}")


def build(cls, prefix: str, values, ignore: tuple[str, ...] = (), **fixed):
    """``cls(**values, **fixed)`` for a config node: an unknown key is one line naming it and the valid keys;
    a field whose type is a dataclass (``X`` or ``X | None``) is built from its nested node the same way,
    under ``<prefix>.<field>``; keys in ``ignore`` are accepted and dropped. ``fixed``: fields the caller
    gives (the model's vocabulary size comes from the task), which the node may not set."""
    known = [k for k in _keys(cls) if k not in fixed]
    check(isinstance(values, dict), prefix, values, f"a mapping of {', '.join(known)}")
    unknown = sorted(k for k in values if k not in known and k not in ignore)
    check(
        not unknown,
        f"{prefix}.{unknown[0] if unknown else ''}",
        values.get(unknown[0]) if unknown else None,
        f"not a key of {prefix}; valid keys: {', '.join(sorted(known))}",
    )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for k, v in values.items():
        if k not in known:
            continue
        nested = _dataclass_of(hints[k])
        kwargs[k] = build(nested, f"{prefix}.{k}", v) if nested is not None and v is not None else v
    return cls(**kwargs, **fixed)


def _keys(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _dataclass_of(tp) -> type | None:
    """The dataclass of a field type ``X`` or ``X | None``, else None."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None
