"""The official sets' sizes, and the check that a set which is the official one is whole.

A set is taken as the official one when one of its parts (a split, or an IMDB class folder) holds its official
number of examples; then every other part must hold its own. So a partly unpacked or cut copy (an interrupted
``tar xzf`` leaves ``aclImdb/train/pos`` with 215 of 12,500 reviews) is one line naming what is short and what
to do, before anything is tokenised or cached, while a set of other sizes throughout (a subset of your own,
the tests' fixtures) is read as it is. Generated sets are checked against their own ``GENERATED.json`` instead.

Sizes: docs/facts.md §3 (ListOps 96,000 / 2,000 / 2,000; IMDB 25,000 / 25,000, 12,500 reviews per class and
split; AAN 147,086 / 18,090 / 17,437; CIFAR-10 50,000 / 10,000); the downloader checks the same rows
(``lra/data/download.py``).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from lra.data.base import DataError, Split

# task -> part -> examples in the official set
OFFICIAL: dict[str, dict[str, int]] = {
    "listops": {"train": 96_000, "val": 2_000, "test": 2_000},
    "text": {"train/neg": 12_500, "train/pos": 12_500, "test/neg": 12_500, "test/pos": 12_500},
    "retrieval": {"train": 147_086, "val": 18_090, "test": 17_437},
    "image": {"train": 50_000, "test": 10_000},
}


def check_whole(task: str, parts: Mapping[str, int], where, unit: str, fix: str) -> None:
    """A :class:`DataError` (one line) if ``parts`` (part -> examples) is the official set of ``task`` with
    parts short or in excess: ``<where>: train/pos holds 215 of 12,500 reviews (...); <fix>``."""
    want = OFFICIAL[task]
    if not any(parts.get(k) == n for k, n in want.items()):
        return  # not the official set: no part has its size
    bad = [f"{k} holds {parts.get(k, 0):,} of {n:,} {unit}" for k, n in want.items() if parts.get(k, 0) != n]
    if bad:
        raise DataError(f"{where}: {', '.join(bad)} (a partial copy of the official set); {fix}")


def split_sizes(splits: Mapping[str, Split], merged: Mapping[str, tuple[str, ...]] = {}) -> dict[str, int]:
    """Examples per official split; ``merged``: an official split and the splits carved from it
    (``{"train": ("train", "val")}``: CIFAR-10's validation is the end of its training set)."""
    out = {name: sum(len(splits[s]) for s in parts if s in splits) for name, parts in merged.items()}
    done = {s for parts in merged.values() for s in parts}
    out.update({k: len(s) for k, s in splits.items() if k not in done})
    return out


def class_sizes(splits: Mapping[str, Split], merged: Mapping[str, tuple[str, ...]], classes: tuple[str, ...]):
    """Examples per ``<split>/<class>`` (label i = ``classes[i]``), the splits carved from one counted in it."""
    out: dict[str, int] = {}
    for name, parts in merged.items():
        labels = [np.asarray(splits[s].labels) for s in parts if s in splits]
        counts = np.bincount(np.concatenate(labels), minlength=len(classes)) if labels else np.zeros(len(classes))
        out.update({f"{name}/{c}": int(counts[i]) for i, c in enumerate(classes)})
    return out
