"""What the layer benchmark measures: its rows (backends and the options each builds), its
configuration, and the grammar of ``--set`` backend options.

``--set BACKEND.options.NAME=VALUE`` is a run's ``attn.options.NAME=VALUE`` with the row's label in
place of ``attn`` (bench measures many backends at once), and VALUE is read as a run reads it, with
Hydra's override grammar: ``128``, ``0.5``, ``true``, ``null``, ``fused``, ``'a,b'``, ``[1,2]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import attention
from lra.tools.meter import GIB, MIB  # noqa: F401 - the layer benchmark's units, with its other names

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (256, 512)
BASELINE = "softmax"  # fused SDPA; every ratio is relative to this row
MATERIALIZED = "softmax_materialized"

CSV_COLUMNS = tuple(  # the columns in order
    "backend base options n batch heads head_dim dtype device device_name torch_version threads mask "
    "status reason time_ms time_ms_min time_ms_max repeats peak_mem_bytes tensor_peak_bytes mem_method "
    "flops gflops_per_s sdpa_ops complexity exact".split()
)


@dataclass(frozen=True)
class Row:
    """One line of the benchmark: a label, the registry name it builds and the options it passes."""

    label: str
    base: str
    options: dict = field(default_factory=dict, hash=False, compare=False)


def all_rows() -> list[Row]:
    """The baseline pair first, then every other registered backend (sorted)."""
    rows = [Row(BASELINE, "softmax", {"impl": "fused"}), Row(MATERIALIZED, "softmax", {"impl": "materialized"})]
    taken = {r.label for r in rows}
    rows += [Row(name, name) for name in attention.available() if name not in taken]
    return rows


def select_rows(names: list[str] | None) -> list[Row]:
    """Rows for ``names`` (all when None); the fused baseline is always included (ratios need it).

    Unknown names raise ``ValueError`` listing the valid ones.
    """
    rows = all_rows()
    if not names:
        return rows
    by_label = {r.label: r for r in rows}
    unknown = [n for n in names if n not in by_label]
    if unknown:
        raise ValueError(f"unknown attention backend(s) {unknown}; available: {', '.join(by_label)}")
    wanted = [BASELINE] + [n for n in dict.fromkeys(names) if n != BASELINE]
    return [by_label[n] for n in wanted]


@dataclass
class Config:
    lengths: tuple = DEFAULT_LENGTHS
    batch: int = 2
    heads: int = 2
    head_dim: int = 32
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    repeats: int = 10
    min_repeats: int = 3
    warmup: int = 1
    time_budget_s: float = 2.0  # per point: median fwd+bwd above this ends the backend's sweep
    baseline_budget_factor: float = 4.0  # the fused baseline may take this much longer (ratios need it)
    mem_budget_bytes: int = 8 * GIB
    threads: int = 1
    seed: int = 0
    mask: bool = True  # pass an all-real bool mask (the LRA model always passes one)
    overrides: dict = field(default_factory=dict)  # label -> {option: value}

    def budget_s(self, row: Row) -> float:
        return self.time_budget_s * (self.baseline_budget_factor if row.label == BASELINE else 1.0)


def effective_options(row: Row, cfg: Config) -> dict:
    """The row's options, ``dropout=0`` where the backend has that option, then ``--set`` overrides."""
    opts = dict(row.options)
    if "dropout" in attention.option_defaults(row.base):
        opts.setdefault("dropout", 0.0)  # fused CPU SDPA has no dropout; we time the attention itself
    opts.update(cfg.overrides.get(row.label, {}))
    return opts


def build_module(row: Row, cfg: Config, n: int) -> torch.nn.Module:
    opts = effective_options(row, cfg)
    m = attention.build(row.base, num_heads=cfg.heads, head_dim=cfg.head_dim, max_len=n, **opts)
    return m.to(device=cfg.device, dtype=cfg.dtype).train()


# ----------------------------------------------------------------------------- --set BACKEND.options.NAME=VALUE
SPELLING = "BACKEND.options.NAME=VALUE"
VALUES = (
    "a value in Hydra's override grammar, as for attn.options.NAME=VALUE: a number, true/false, null, "
    "a string (quoted if it has a comma or a space), [a,list] or {a: dict}"
)


def _value(item: str, text: str):
    """``text`` read by Hydra's override grammar (one value, not a sweep), or a one-line ``ValueError``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_override(f"value={text}")
    except HydraException:
        raise ValueError(f"--set {item}: {text!r} is not allowed: give {VALUES}") from None
    if parsed.is_sweep_override():
        raise ValueError(
            f"--set {item}: {text!r} is a sweep, not allowed here: give one value per option "
            f"(quote a string with a comma: 'a,b')"
        )
    return parsed.value()


def parse_options(items: list[str] | None) -> dict:
    """``--set`` items as ``{label: {option: value}}``; bad input is a one-line ``ValueError``."""
    out: dict = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        parts = key.split(".")
        if not (sep and len(parts) == 3 and parts[1] == "options" and all(parts)):
            raise ValueError(f"--set expects {SPELLING} (e.g. --set nystrom.options.landmarks=128), got {item!r}")
        out.setdefault(parts[0], {})[parts[2]] = _value(item, text)
    return out


def check_options(cfg: Config, rows: list[Row]) -> None:
    """Every ``--set`` names a row being run and an option its backend takes, with a value it allows."""
    labels = {r.label: r for r in rows}
    unknown = sorted(set(cfg.overrides) - set(labels))
    if unknown:
        raise ValueError(f"--set names backend(s) {unknown} that are not being run")
    for label, given in cfg.overrides.items():
        row = labels[label]
        plain = effective_options(row, Config())  # the row's own options, no --set
        # each option alone first, so the line names the one at fault; then all of them together
        for opts, shown in [({**plain, k: v}, f"{label}.options.{k}={v!r}") for k, v in given.items()] + [
            ({**plain, **given}, " ".join(f"{label}.options.{k}={v!r}" for k, v in given.items()))
        ]:
            try:
                attention.make_options(row.base, **opts)
            except attention.InvalidOption as err:
                raise ValueError(f"--set {shown}: {err}") from None
