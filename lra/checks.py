"""The checks every user value goes through when a run's config is resolved: a bad value raises
:class:`ConfigError`, one line naming the key, the value and what is allowed.

The lowest layer of the config: :mod:`lra.config` (the run spec) and :mod:`lra.tasks` (the task specs)
both check with these, and ``lra.config`` re-exports :class:`ConfigError`. Imports nothing of lra.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

SEED_MAX = 2**32 - 1  # what numpy and Lightning's seed_everything accept
NAME_MAX, PATH_MAX = 255, 4096  # bytes in one file name, in a whole path (Linux; most file systems)
ROOT_ROOM = 512  # bytes a root leaves for the folders and files the harness makes under it


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


def folder(key: str, value, optional: bool = False) -> None:
    """One folder name under the data root (no separator, not ``..``): a value never points outside it."""
    if optional and value is None:
        return
    ok = isinstance(value, str) and value not in ("", "..") and not {"/", "\\", "\0"} & set(value)
    check(ok, key, value, f"one folder name, without / or ..{' (or null)' if optional else ''}")


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


def place(what: str, path, fix: str, folder: bool | None = True, room: int = 0) -> None:
    """A path the harness makes or reads: one the system can name (each name at most :data:`NAME_MAX`
    bytes, the whole path with ``room`` bytes to spare under :data:`PATH_MAX`), and, where it exists, a
    folder (``folder=True``) or a file (False). ``what`` names it ("runs root"), ``fix`` says what to do."""
    text = str(path)
    size, longest = len(os.fsencode(text)), max((len(os.fsencode(p)) for p in Path(text).parts), default=0)
    if size + room >= PATH_MAX or longest > NAME_MAX:
        shown = text if len(text) <= 100 else f"{text[:60]}...{text[-30:]}"
        why = (
            f"{size} bytes, at most {PATH_MAX - 1 - room} here"
            if size + room >= PATH_MAX
            else f"a name of {longest} bytes in it, at most {NAME_MAX}"
        )
        raise ConfigError(f"{what} {shown} is too long ({why}): {fix}")
    if folder is True and os.path.lexists(text) and not os.path.isdir(text):
        raise ConfigError(f"{what} {text} is a file, not a folder: {fix}")
    if folder is False and os.path.isdir(text):
        raise ConfigError(f"{what} {text} is a folder, not a file: {fix}")


def check_roots(data_root, runs_root) -> None:
    """The data root and the runs root before anything is made under them (:func:`place`)."""
    place("data root", data_root, "set LRA_DATA (or data_root=) to another folder", room=ROOT_ROOM)
    place("runs root", runs_root, "set LRA_RUNS (or runs_root=) to another folder", room=ROOT_ROOM)


def check_run_folder(run_dir) -> None:
    """What a run owns in its folder, where it is there, of the kind the run writes: the folder, its
    ``checkpoints`` folder and its ``result.json`` file (one line before any work, not a traceback at the
    first checkpoint)."""
    run_dir = Path(run_dir)
    place("run folder", run_dir, "give the run a shorter name (fewer or shorter overrides) or a shorter runs root")
    for name, folder in (("checkpoints", True), ("result.json", False)):
        kind = "folder" if folder else "file"
        fix = f"move it aside (the run writes its {name} {kind} there), then run the same command again"
        place(f"the run's {name}", run_dir / name, fix, folder=folder)


def container(node) -> Any:
    """A config node as plain Python (resolved); anything else as it is."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
