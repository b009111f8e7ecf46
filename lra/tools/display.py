"""How the harness names things for a reader: the papers' row and task names, and memory units.

The collector's tables and figures, the benchmark's and the approximation study's figures all print an
attention as the papers name it (``skeinformer_no_rownorm`` -> "Skeinformer w/o row normalization",
``softmax`` -> "Standard") and memory in GiB or MiB (2^30 / 2^20 bytes), never a code key or "GB".
"""

from __future__ import annotations

import math
from collections import Counter

GIB = 2**30

# the papers' rows, (attention key, the paper's row name), in the paper's order
SKEIN_ROWS = (
    ("softmax", "Standard"),
    ("softmax_nodrop", "Standard w/o dropout"),
    ("vmean", "V-mean"),
    ("bigbird", "BigBird"),
    ("performer", "Performer"),
    ("nystrom", "Nyströmformer"),
    ("reformer", "Reformer"),
    ("linformer", "Linformer"),
    ("linformer_jlt", "Linformer w/ unreduced JLT"),
    ("informer", "Informer"),
    ("informer_mask", "Informer w/ padding mask"),
    ("skeinformer", "Skeinformer"),
    ("skeinformer_uniform", "Skeinformer w/ uniform sampling"),
    ("skeinformer_no_rownorm", "Skeinformer w/o row normalization"),
    ("skeinformer_simple_rownorm", "Skeinformer w/ simple row normalization"),
    ("skeinformer_no_pilot", "Skeinformer w/o pilot sampling reutilization"),
)
SKY_ROWS = (
    ("softmax", "Self-Attention"),
    ("kernelized", "Kernelized Attention"),
    ("nystrom", "Nyströmformer"),
    ("linformer", "Linformer"),
    ("informer", "Informer"),
    ("performer", "Performer"),
    ("reformer", "Reformer"),
    ("bigbird", "BigBird"),
    ("skyformer", "Skyformer"),
)
YOSO_ROWS = (
    ("none", "none"),
    ("softmax", "softmax"),
    ("yoso_e", "YOSO-E"),
    ("nystrom", "Nyströmformer"),
    ("longformer", "Longformer"),
    ("linformer", "Linformer"),
    ("reformer", "Reformer"),
    ("performer", "Performer"),
    ("yoso", "YOSO-32"),
    ("yoso_conv", "YOSO-C-16"),
)
SKEIN_TASKS = (
    ("text", "Text"),
    ("listops", "ListOps"),
    ("retrieval", "Retrieval"),
    ("pathfinder", "Pathfinder"),
    ("image", "Image"),
)
# a bare "none" on a chart reads like a missing value; the YOSO paper's row is "no attention at all"
_EXTRA_NAMES = {"none": "none (no attention)"}


def paper_names() -> dict:
    """{attention key: the papers' row name}; Skeinformer's names first, then Skyformer's, then YOSO's."""
    out = dict(_EXTRA_NAMES)
    for rows in (SKEIN_ROWS, SKY_ROWS, YOSO_ROWS):
        for key, name in rows:
            out.setdefault(key, name)
    return out


def split_key(key: str) -> tuple[str, str]:
    """(attention, variant) of a name ``attn`` or ``attn [variant]``."""
    if key.endswith("]") and " [" in key:
        attn, variant = key.split(" [", 1)
        return attn, variant[:-1]
    return key, ""


def readable_names(keys) -> dict:
    """{row key: name to print}: the paper's row name with the override tag kept (``Standard [train.lr=1e-3]``),
    the key itself for an attention no paper has. Two keys never share a name (the key is added if they would)."""
    known = paper_names()
    out = {}
    for key in sorted(set(keys)):
        attn, variant = split_key(key)
        name = known.get(attn, attn)
        out[key] = f"{name} [{variant}]" if variant else name
    counts = Counter(out.values())
    return {k: (f"{v} ({k})" if counts[v] > 1 else v) for k, v in out.items()}


def task_name(task: str) -> str:
    """The papers' task header (``listops`` -> "ListOps"), else the task key."""
    return dict(SKEIN_TASKS).get(task, task)


def mem_unit(largest: float) -> tuple[float, str]:
    """(divisor, name): GiB (2^30 bytes), or MiB (2^20 bytes) when every value is under 1 GiB (tiny runs)."""
    return (2.0**20, "MiB") if math.isfinite(largest) and largest < GIB else (float(GIB), "GiB")
