"""Which table row a run belongs to, how the row is printed, and which Standard row it is compared with.

A row is one configuration: the attention, the run's overrides (every resolved value that differs from the
preset's, read from its record's ``config``: :func:`overrides`), its display name (``name=``, or a labels file:
lra/tools/collect/__init__.py) and the data it read. Runs of one row and task are the seeds a cell averages;
nothing else is ever averaged into it.

* **Label.** The name the run was given, else the paper's row name (or the attention key) followed by the
  changed keys that tell it from the table set's other rows, numbers at 3 significant digits: ``Performer
  [lr=0.00162, max_steps=40]``. Overrides every row shares are said once, under each table (:func:`shared`).
  The full text goes into a footnote when the label shortened it. Two rows never print alike.
* **Data.** Per task, the data most of the table set's runs read is the task's data (the table says what
  it was); runs on other data get their own row, ``[data <id>]``.
* **Baseline.** A row is compared with the Standard (``softmax``) row run under the same settings:
  the same overrides once the attention's own (``attn.*``) are set aside, and the same data. Where no such
  row exists the row has no baseline, and its cells print no comparison.
* **Search trials** (records with a ``search`` field) are left out of the tables unless asked for
  (``lra.tools.collect --trials``); :func:`searches` summarises each study instead.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import pandas as pd
from omegaconf import OmegaConf

from lra import CONF_DIR
from lra.tags import UNTAGGED, spelled
from lra.tools.display import paper_names

BASELINE = "softmax"  # the attention every other row is compared with (Standard / Self-Attention / softmax)
_ITEM = re.compile(r",(?=[+~]?[A-Za-z_][\w.@/-]*=)")  # a comma that starts the next key=value of a tag
_HASHED = re.compile(r"-[0-9a-f]{9}$")  # a folder tag cut, or made safe, and given a hash (lra.compose.folder_name)
# overrides that belong to the attention (its options and variants): set aside when finding the baseline
ATTN_KEYS = ("attn", "attn_options", "attn_checkpointing")
# Resolved keys that say where or how a run ran, not what it computed: those no run tag names, and the relay node
# `protocol` that records from before one key per value hold (results/ has them)
NOT_SETTINGS = (*UNTAGGED, "protocol")


@dataclass(frozen=True)
class RowInfo:
    key: str  # unique within a table set: attn, overrides, name, data, trial
    attn: str
    over: str = ""  # the overrides, key=value,... from the records' configs ("" for the preset's own configuration)
    name: str = ""  # the display name the runs carry (name=...)
    data: str = ""  # "" for the task's data, else the data id of these runs
    trial: str = ""  # "<study> #<n>" for a search trial shown with --trials
    setting: str = ""  # the overrides without the attention's own keys, plus the data: what the baseline must share

    @property
    def plain(self) -> bool:
        """The preset's own configuration on the task's data: the only row a paper's number describes."""
        return not (self.over or self.data or self.trial)


def parse_tag(tag: str) -> list[tuple[str, str]]:
    """``"train.lr=0.002,attn.options.k=[1,2]"`` -> ``[("train.lr", "0.002"), ("attn.options.k", "[1,2]")]``."""
    if not tag:
        return []
    out = []
    for item in _ITEM.split(tag):
        k, _, v = item.partition("=")
        out.append((k, v))
    return out


def _attn_key(key: str) -> bool:
    head = key.lstrip("+~").split(".", 1)[0]
    return head in ATTN_KEYS


def short_value(v: str) -> str:
    """A number at 3 significant digits (``0.0016181912728325774`` -> ``0.00162``); integers and text as they are."""
    if re.fullmatch(r"[-+]?\d+", v):
        return v
    try:
        x = float(v)
    except ValueError:
        return v if len(v) <= 24 else v[:21] + "..."
    return f"{x:.3g}" if math.isfinite(x) else v


def short_tag(tag: str) -> str:
    """The changed keys by their last component (two when the last is ambiguous), values shortened."""
    items = parse_tag(tag)
    last = Counter(k.split(".")[-1] for k, _ in items)
    parts = []
    for k, v in items:
        bits = k.lstrip("+~").split(".")
        name = bits[-1] if last[bits[-1]] == 1 else ".".join(bits[-2:])
        parts.append(f"{name}={short_value(v)}")
    return ", ".join(parts)


def _setting(key: str) -> bool:
    return not any(key == k or key.startswith(k + ".") for k in NOT_SETTINGS)


@functools.lru_cache(maxsize=None)
def preset_train(preset: str, task: str) -> dict:
    """The ``train.*`` values the preset's protocol file sets for the task (conf/protocol/<preset>/<task>.yaml;
    {} for a preset this checkout lacks). A record before one key per value also held them as ``protocol.*``."""
    path = CONF_DIR / "protocol" / preset / f"{task}.yaml"
    node = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() and ".." not in (preset + task) else {}
    return {f"train.{k}": spelled(v) for k, v in (node.get("train") or {}).items()}


def overrides(runs: pd.DataFrame, cfgs: list) -> list[str]:
    """Each run's overrides as ``key=value,...`` (sorted; values as its tag spells them), read from ``cfgs``, the
    runs' (flat resolved config, flat quirks) pairs (records.load_runs), never from the folder's tag (cut and
    hashed past 200 characters): the keys its tag names, the ``train.*`` keys the preset's protocol file also
    sets (:func:`preset_train`), and every key in which the finished runs of its table set and task differ (an
    attention's own keys: among that attention's runs), less those at the preset's own value (what the table
    set's runs without overrides agree on, else the protocol's) and those at the value the preset's quirks give
    its backend (the public code's ``train.chunks=2`` for Skeinformer is the paper's setting, not the user's). A
    run without overrides (empty tag) has none; a key its tag names and its config lacks (an old or hand-made
    record) keeps the tag's value where the tag is whole."""
    out = list(runs["tag"].fillna(""))
    ok = (runs["usable"] & runs["kept"]).tolist()
    quirks = [q for _, q in cfgs]
    cfgs = [c for c, _ in cfgs]
    for _, g in runs.groupby(["preset", "task"], sort=False, dropna=False):
        seen, plain = defaultdict(set), defaultdict(set)  # (attention or "", key) -> values
        for i in g.index:
            for k, v in cfgs[i].items() if ok[i] else ():
                if quirks[i].get(k) == v:  # the preset's own value for this backend
                    continue
                a = runs.at[i, "attn"] if _attn_key(k) else ""
                seen[a, k].add(v)
                if not out[i]:
                    plain[a, k].add(v)
        for i in g.index:
            cfg = cfgs[i]
            if not out[i] or not cfg:
                continue
            named = {k.lstrip("+~"): v for k, v in parse_tag(out[i])}
            relay = {f"train.{k[9:]}": v for k, v in cfg.items() if k.startswith("protocol.")}  # an older record's
            protocol = relay or preset_train(str(runs.at[i, "preset"]), str(runs.at[i, "task"]))
            # a key the tag names and the config lacks keeps the tag's value, unless the tag was cut (hashed)
            items = {} if _HASHED.search(out[i]) else {k: v for k, v in named.items() if k not in cfg}
            for k, v in cfg.items():
                a = runs.at[i, "attn"] if _attn_key(k) else ""
                own = quirks[i].get(k) == v
                if k in named or _setting(k) and not own and (len(seen[a, k]) > 1 or k in protocol):
                    ref = plain[a, k]
                    if v != (next(iter(ref)) if len(ref) == 1 else protocol.get(k)):
                        items[k] = v
            out[i] = ",".join(f"{k}={v}" for k, v in sorted(items.items()))
    return out


def setting_of(tag: str, data: str) -> str:
    """What a row shares with its baseline: the overrides that are not the attention's own, and the data."""
    kept = ",".join(f"{k}={v}" for k, v in parse_tag(tag) if not _attn_key(k))
    return f"{kept}|{data}"


def main_data(runs: pd.DataFrame) -> dict:
    """{task: the data id most runs of the task read} (ties: the smallest id, so the choice is stable)."""
    out = {}
    for task, g in runs.groupby("task", sort=True):
        counts = Counter(g["data_id"].fillna(""))
        out[task] = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return out


def assign(runs: pd.DataFrame, trials: bool = False) -> tuple[pd.DataFrame, dict]:
    """(the usable, kept runs of one table set with a ``row`` column, {row key: RowInfo}).

    Search trials are dropped unless ``trials``. ``runs`` must be one table set's runs (one preset)."""
    ok = runs[runs["usable"] & runs["kept"]].copy()
    if not trials:
        ok = ok[ok["study"].fillna("") == ""]
    if ok.empty:
        return ok.assign(row=pd.Series(dtype=object)), {}
    main = main_data(ok)
    infos, keys = {}, []
    for r in ok.itertuples():
        data = "" if (r.data_id or "") == main.get(r.task, "") else (r.data_id or "not recorded")
        trial = f"{r.study} #{int(r.trial)}" if trials and r.study and not _nan(r.trial) else ""
        name, over = r.name or "", r.overrides or ""
        # the plain row's key is the attention itself (the paper's rows look it up so): softmax,
        # softmax [train.lr=0.002], softmax "my name", softmax <data ab12>, linformer [..] #study #3
        parts = (
            f"[{over}]" if over else "",
            f'"{name}"' if name else "",
            f"<data {data}>" if data else "",
            f"#{trial}" if trial else "",
        )
        key = " ".join([r.attn, *(p for p in parts if p)])
        infos.setdefault(key, RowInfo(key, r.attn, over, name, data, trial, setting_of(over, data)))
        keys.append(key)
    ok["row"] = keys
    return ok, infos


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def baselines(infos: dict) -> dict:
    """{row key: the key of the Standard row with the same setting, or None}. Among several (names differ),
    the one without a name, then the first by key. A trial is never a baseline."""
    cands: dict = {}
    for info in sorted(infos.values(), key=lambda i: (bool(i.name), i.key)):
        if info.attn == BASELINE and not info.trial:
            cands.setdefault(info.setting, info.key)
    out = {}
    for key, info in infos.items():
        base = cands.get(info.setting)
        out[key] = None if base == key else base
    return out


def shared(infos: dict) -> list[tuple[str, str]]:
    """The overrides (key, value) every row of a table set has: said once under each table, in no label."""
    sets = [set(parse_tag(i.over)) for i in infos.values()]
    return sorted(set.intersection(*sets)) if sets else []


def labels(infos: dict, row_names: dict | None = None) -> tuple[dict, dict]:
    """({row key: printed label}, {row key: its overrides in full where the label hides or cuts a value}); overrides
    every row shares (:func:`shared`) are in neither. Labels that would read alike are numbered (#1, #2).

    ``row_names``: the table's own names of attentions (the paper's row names); else the papers' names."""
    names = {**paper_names(), **(row_names or {})}
    common = set(shared(infos))
    out, notes = {}, {}
    for key, info in infos.items():
        own = [(k, v) for k, v in parse_tag(info.over) if (k, v) not in common]
        short = short_tag(",".join(f"{k}={v}" for k, v in own))
        base = info.name or names.get(info.attn, info.attn)
        extra = [] if info.name or not own else [short]
        if info.data:
            extra.append("data not recorded" if info.data == "not recorded" else f"data {info.data[:8]}")
        if info.trial:
            extra.append(f"trial {info.trial}")
        out[key] = f"{base} [{'; '.join(extra)}]" if extra else base
        cut = any(short_value(v) not in (v, v.rstrip("0").rstrip(".")) for _, v in own)  # 0.0 -> 0 cuts nothing
        if own and (info.name or cut):  # the label hides or cuts a value
            notes[key] = ", ".join(f"{k}={v}" for k, v in own)
    counts, seen = Counter(out.values()), Counter()
    for key in sorted(out):
        if counts[out[key]] > 1:
            seen[out[key]] += 1
            out[key] = f"{out[key]} #{seen[out[key]]}"
    return out, notes


def searches(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per search (table set, study): its finished trials, the best one by the search's own
    objective (``best_val_acc`` unless the records name another), that trial's test accuracy and settings."""
    ok = runs[runs["usable"] & runs["kept"] & (runs["study"].fillna("") != "")]
    cols = [
        "preset",
        "study",
        "grid",
        "task",
        "attn",
        "trials",
        "pruned",
        "objective",
        "best_trial",
        "best_value",
        "best_test_acc",
        "best_settings",
        "best_params",
        "best_path",
    ]
    rows = []
    for (preset, study), g in ok.groupby(["preset", "study"], sort=True):
        objective = next((o for o in g["objective"].dropna() if o), "best_val_acc")
        col = objective if objective in g.columns else "best_val_acc"
        vals = pd.to_numeric(g[col], errors="coerce")
        best = g.loc[vals.idxmax()] if vals.notna().any() else None
        rows.append(
            {
                "preset": preset,
                "study": study,
                "grid": ",".join(sorted(set(g["grid"].dropna()) - {""})),
                "task": ",".join(sorted(set(g["task"]))),
                "attn": ",".join(sorted(set(g["attn"]))),
                "trials": len(g),
                "pruned": int((g["reason"].fillna("").str.contains("prun")).sum()),
                "objective": objective,
                "best_trial": None if best is None else int(best["trial"]),
                "best_value": math.nan if best is None else float(best[col]),
                "best_test_acc": math.nan if best is None else float(best["test_acc"]),
                "best_settings": "" if best is None else short_tag(_params(best["search_params"], ",")),
                "best_params": "" if best is None else _params(best["search_params"]),
                "best_path": "" if best is None else best["path"],
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _params(text, sep: str = ", ") -> str:
    """A trial's sampled values (JSON in the record) as ``key=value`` text, keys sorted."""
    try:
        d = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return str(text)
    return sep.join(f"{k.lstrip('+~')}={v}" for k, v in sorted(d.items())) if isinstance(d, dict) else str(d)
