"""What there is to run: ``python -m lra.tools.catalog [pattern] [--backends|--tasks|--presets] [--options]``
(``lra-catalog`` once installed).

Lists the registered attention backends with their one-line description (the first line of the class
docstring, :func:`attention.describe`), the named variants of ``conf/attn/`` with what they set, the tasks
(:data:`lra.tasks.TASK_SPECS`: sequence length and classes; the first comment line of ``conf/task/<task>.yaml``)
and the presets (the first comment line of ``conf/preset/<preset>.yaml``). ``pattern`` filters every list by
name, shell-style (``'*former*'``, as timm's ``list_models``); a pattern that matches nothing is one line
naming what exists, exit 1. ``--options`` adds each backend option as it is set on the command line
(``attn.options.<option>``) with its type, default, allowed range and meaning; ``--check`` runs the contract
checks (:func:`attention.testing.check_backend`) on the listed backends. The library's own call is
:func:`attention.list_backends`.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from pathlib import Path

from omegaconf import OmegaConf

import attention
from lra import CONF_DIR
from lra.cli import Parser
from lra.tasks import TASK_SPECS

SECTIONS = ("backends", "tasks", "presets")


def first_comment(path: Path) -> str:
    """The first sentence of a yaml file's first block of ``# comment`` lines (a Hydra directive,
    ``# @package``, is not a comment)."""
    block: list[str] = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#") and not text.lstrip("# ").startswith("@"):
            block.append(text.lstrip("# ").strip())
        elif block:
            break
    return re.split(r"(?<!\bal\.)(?<=[.!])\s+", " ".join(block), maxsplit=1)[0]  # "et al." ends none


def variants() -> dict[str, dict]:
    """The named variants of ``conf/attn/<name>.yaml``: {name: {base, sets, doc}}."""
    out = {}
    for path in sorted((CONF_DIR / "attn").glob("*.yaml")):
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
        bases = [d for d in node.get("defaults", []) if isinstance(d, str) and d != "_self_"]
        out[path.stem] = {
            "base": bases[0] if bases else "",
            "sets": dict(node.get("base_options") or {}),
            "doc": first_comment(path),
        }
    return out


def tasks() -> dict[str, dict]:
    """Every task: {name: {seq_len, num_classes, doc}}; lengths and classes are the spec's defaults (no preset)."""
    out = {}
    for name, cls in TASK_SPECS.items():
        spec = {f.name: f.default for f in cls.__dataclass_fields__.values()}
        path = CONF_DIR / "task" / f"{name}.yaml"
        out[name] = {
            "seq_len": spec["seq_len"],
            "num_classes": spec["num_classes"],
            "doc": first_comment(path) if path.is_file() else (cls.__doc__ or "").split("\n")[0],
        }
    return out


def presets() -> dict[str, str]:
    """Every preset: {name: first comment line of conf/preset/<name>.yaml}."""
    return {p.stem: first_comment(p) for p in sorted((CONF_DIR / "preset").glob("*.yaml"))}


def _match(names, pattern: str | None) -> list[str]:
    return [n for n in names if pattern is None or fnmatch.fnmatchcase(n, pattern)]


def _rows(pairs: list[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max((len(a) for a, _ in pairs), default=0)
    return [f"{indent}{a:<{width}}  {b}".rstrip() for a, b in pairs]


def backend_lines(names: list[str], var_names: list[str], with_options: bool) -> list[str]:
    lines = []
    width = max(map(len, names + var_names), default=0)
    for name in names:
        lines.append(f"  {name:<{width}}  {attention.describe(name)['doc']}")
        if with_options:
            info = attention.option_info(name)
            opts = [
                (f"attn.options.{o}", f"{i['type']} = {i['default']!r}  {i['range']}  {i['doc']}".replace("    ", "  "))
                for o, i in info.items()
            ]
            lines += _rows(opts, "      ") if opts else ["      (no options)"]
    all_variants = variants()
    for name in var_names:
        v = all_variants[name]
        sets = ", ".join(f"attn.options.{k}={val!r}" for k, val in v["sets"].items()) or "nothing"
        lines.append(f"  {name:<{width}}  variant of {v['base']}: sets {sets}. {v['doc']}".rstrip())
    return lines


def catalog(pattern: str | None, sections: tuple[str, ...], with_options: bool = False) -> tuple[list[str], bool]:
    """The listing's lines, and whether anything matched."""
    lines, found = [], False
    if "backends" in sections:
        names, var_names = attention.list_backends(pattern), _match(variants(), pattern)
        if names or var_names:
            found = True
            lines.append("attention backends (attn=<name>; options: attn.options.<option>=<value>):")
            lines += backend_lines(names, var_names, with_options)
    if "tasks" in sections:
        table = tasks()
        names = _match(table, pattern)
        if names:
            found = True
            lines.append("tasks (task=<name>; sequence length and classes without a preset):")
            lines += _rows(
                [
                    (n, f"seq_len {table[n]['seq_len']:>5}  {table[n]['num_classes']:>2} classes  {table[n]['doc']}")
                    for n in names
                ]
            )
    if "presets" in sections:
        table = presets()
        names = _match(table, pattern)
        if names:
            found = True
            lines.append("presets (preset=<name>):")
            lines += _rows([(n, table[n]) for n in names])
    return lines, found


def everything(sections: tuple[str, ...]) -> str:
    """One line's worth: every name of the chosen sections."""
    parts = []
    if "backends" in sections:
        parts.append("backends " + ", ".join(attention.available() + sorted(variants())))
    if "tasks" in sections:
        parts.append("tasks " + ", ".join(TASK_SPECS))
    if "presets" in sections:
        parts.append("presets " + ", ".join(presets()))
    return "; ".join(parts)


def parser() -> Parser:
    p = Parser(
        prog="python -m lra.tools.catalog",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="What there is to run: the attention backends (attn=), their variants, the tasks (task=) and the\n"
        "presets (preset=), each with its one-line description; a pattern filters them by name.",
        epilog="""examples:
  python -m lra.tools.catalog                         # everything
  python -m lra.tools.catalog '*former*'              # the names that match, shell-style
  python -m lra.tools.catalog skeinformer --options   # attn.options.<option>: type = default, range, meaning
  python -m lra.tools.catalog --tasks                 # the tasks: sequence length, classes
  python -m lra.tools.catalog 'yoso*' --check         # the contract checks on the matching backends

A pattern that matches nothing prints one line naming what exists and exits 1.""",
    )
    p.add_argument("pattern", nargs="?", default=None, help="shell-style name pattern ('*former*', 'skein*')")
    p.add_argument("--backends", action="store_true", help="only the attention backends and their variants")
    p.add_argument("--tasks", action="store_true", help="only the tasks")
    p.add_argument("--presets", action="store_true", help="only the presets")
    p.add_argument("--options", action="store_true", help="each backend's options: type, default, range, meaning")
    p.add_argument("--check", action="store_true", help="run the contract checks on the listed backends")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sections = tuple(s for s in SECTIONS if getattr(args, s)) or SECTIONS
    lines, found = catalog(args.pattern, sections, with_options=args.options)
    if not found:
        print(f"nothing matches {args.pattern!r}; there are: {everything(sections)}")
        return 1
    print("\n".join(lines))
    if args.check and "backends" in sections:
        from attention.testing import check_backend

        failed = 0
        for name in attention.list_backends(args.pattern):
            try:
                print(check_backend(name), flush=True)
            except AssertionError as e:
                print(f"FAILED {e}", flush=True)
                failed += 1
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
