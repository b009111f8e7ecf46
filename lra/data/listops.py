"""ListOps: generator of the official distribution, evaluator, reader of the official TSV, tokenizer.

Official distribution (docs/facts.md §3.3, google-research/long-range-arena ``listops.py``): trees drawn
from depth 1; below ``max_depth`` a node is a leaf (uniform digit) with probability 0.75, else an
operator (uniform over MIN, MAX, MED, SM) with ``randint(2, max_args)`` children; at ``max_depth``
always a leaf. A tree is kept if ``min_length < length < max_length`` where length counts each
operator as 2 (its token and the closing bracket) plus its children; duplicates are dropped.
Trees are written left-nested with parentheses: ``[MAX 2 9]`` -> ``( ( ( [MAX 2 ) 9 ) ] )``.

Files: ``basic_{train,val,test}.tsv`` with header ``Source\\tTarget``, in ``<root>/listops-1000/`` (or
``task.dirname``) as the LRA release lays them out, or, generated, in
``<root>/generated/<dirname>-<key>/`` where the key is a hash of the generator settings: each setting has
its own folder, so one never replaces another, and the release's own folder name is left to the user.
Unlike the official script this generator is seeded and deterministic: raw draws come in fixed
chunks, chunk ``i`` seeded from ``(seed, i)``, consumed in order, so the output does not depend on
the number of worker processes.

Tokenizers (``task.tokenizer``):
* ``brackets`` (clean): ``]`` becomes ``X``, parentheses are dropped, the rest split on spaces, so
  ``[MAX 2 9 [MIN 4 7 ] 0 ]`` is 9 tokens. Closing brackets are kept (the old pipeline that dropped
  them made the task ambiguous, LRA issue 14; LRA's pipeline keeps them since 2021-03-04).
* ``alnum`` (the public codes' ``quirks=``): the pipeline the Skeinformer/Skyformer/Nystromformer pickles were
  made with (LRA before 2021-03-04, ``tfds.deprecated.text.Tokenizer``): alphanumeric runs only, so
  every bracket and parenthesis is dropped and ``[MAX`` becomes ``MAX``: the same string is the 7
  tokens ``MAX 2 9 MIN 4 7 0``. Their ids came from a Python ``set`` (the order changed with the hash
  seed); ours are fixed: MIN MAX MED SM 0-9 = 1..14 (14 + pad; their embedding table had 32 rows,
  ``task.vocab_size`` under paper). Truncation to ``max_length`` counts these tokens, as theirs did.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import random
import re
import shutil
import statistics
import tempfile
from collections import deque
from dataclasses import asdict
from pathlib import Path

import numpy as np

from lra.data.base import GENERATED_DIR, DataError, Split, data_workers, made_parents, progress_bar, worker_pool
from lra.data.cache import cached_splits, source_fingerprint
from lra.data.official import check_whole, split_sizes
from lra.data.provenance import Origin, generator_fields, relative_path
from lra.data.registry import register_task
from lra.data.release import explicit_path
from lra.tasks import ListOpsGenerator, ListOpsSpec

log = logging.getLogger(__name__)

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
# Fixed id order; 0 is padding.
VOCAB = ("<pad>",) + OPERATORS + tuple(str(d) for d in range(10)) + ("X",)
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
VOCAB_SIZE = len(VOCAB)  # 16 = 15 symbols + pad
# the old LRA pipeline's alphanumeric tokens, in a fixed order (theirs: a Python set's)
ALNUM_VOCAB = ("<pad>",) + tuple(op[1:] for op in OPERATORS) + tuple(str(d) for d in range(10))
VOCABS = {"brackets": VOCAB, "alnum": ALNUM_VOCAB}
SPLITS = ("train", "val", "test")
CHUNK_DRAWS = 4000  # raw trees per generator chunk
STALE_CHUNKS = 50  # chunks in a row without a new tree: the settings cannot give the trees asked for
GENERATOR_VERSION = 1  # part of a generated folder's key: a change to the distribution gets new folders


# The generator's parameters are the task node's ``task.generator`` (checked when the config is resolved)
GeneratorParams = ListOpsGenerator


# ------------------------------------------------------------------------------ trees
def sample_tree(rng: random.Random, depth: int, max_depth: int, max_args: int):
    """A leaf is an int; an operator node is ``(op, [children])``. Returns (tree, length)."""
    if depth < max_depth and rng.random() <= 0.25:
        n = rng.randint(2, max_args)
        children, length = [], 2
        for _ in range(n):
            c, cl = sample_tree(rng, depth + 1, max_depth, max_args)
            children.append(c)
            length += cl
        return (OPERATORS[rng.randrange(4)], children), length
    return rng.randrange(10), 1


def evaluate(tree) -> int:
    """Value of a tree: MIN, MAX, MED = int(median) (even count: mean of the middle two, truncated), SM = sum mod 10."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    vals = [evaluate(c) for c in children]
    if op == "[MIN":
        return min(vals)
    if op == "[MAX":
        return max(vals)
    if op == "[MED":
        return int(statistics.median(vals))
    if op == "[SM":
        return sum(vals) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def to_string(tree) -> str:
    """The official left-nested, parenthesised string form."""
    if isinstance(tree, int):
        return str(tree)
    op, children = tree
    s = op
    for c in children:
        s = f"( {s} {to_string(c)} )"
    return f"( {s} ] )"


def parse(source: str):
    """Inverse of the tokenizer's view: parse a source string (with or without parentheses) to a tree."""
    toks = source.replace("(", " ").replace(")", " ").split()
    pos = 0

    def node():
        nonlocal pos
        t = toks[pos]
        pos += 1
        if t in OPERATORS:
            children = []
            while toks[pos] != "]":
                children.append(node())
            pos += 1
            return (t, children)
        if t.isdigit() and len(t) == 1:
            return int(t)
        raise ValueError(f"unexpected token {t!r}")

    tree = node()
    if pos != len(toks):
        raise ValueError("trailing tokens after the expression")
    return tree


def _chunk(args) -> list[tuple[str, int]]:
    """Accepted (source, label) pairs from one chunk of raw draws."""
    params, index = args
    rng = random.Random(f"listops-{params.seed}-{index}")
    out = []
    for _ in range(CHUNK_DRAWS):
        tree, length = sample_tree(rng, 1, params.max_depth, params.max_args)
        if params.min_length < length < params.max_length:
            out.append((to_string(tree), evaluate(tree)))
    return out


def _chunks(params: GeneratorParams, workers: int):
    """Every chunk's accepted rows, in index order (endless). With a pool, 2 chunks per worker are kept in
    flight, so no core waits for the slowest chunk of a round while this process takes the rows in order."""
    if workers == 1:
        yield from map(_chunk, ((params, i) for i in itertools.count()))
        return
    with worker_pool(workers) as pool:  # leaving it (the generator closed) terminates the workers
        ahead = deque(pool.apply_async(_chunk, ((params, i),)) for i in range(2 * workers))
        for i in itertools.count(2 * workers):
            done = ahead.popleft().get()
            ahead.append(pool.apply_async(_chunk, ((params, i),)))
            yield done


def generate(params: GeneratorParams, workers: int | None = None, progress: bool = True) -> dict[str, list]:
    """Draw until ``n_train + n_val + n_test`` distinct trees are accepted; split in draw order."""
    total = params.n_train + params.n_val + params.n_test
    seen, rows = set(), []
    bar = progress_bar(total, "generating ListOps", "tree") if progress else None
    chunks = _chunks(params, workers or data_workers())
    stale = 0
    try:
        for chunk in chunks:
            before = len(rows)
            for src, label in chunk:
                if src not in seen and len(rows) < total:
                    seen.add(src)
                    rows.append((src, label))
                    if bar:
                        bar.update(1)
            if len(rows) == total:
                break
            stale = stale + 1 if len(rows) == before else 0
            if stale == STALE_CHUNKS:
                raise DataError(
                    f"task.generator drew {STALE_CHUNKS * CHUNK_DRAWS} trees in a row without a new one of "
                    f"{params.min_length} < length < {params.max_length} ({len(rows)} of the {total} asked for): "
                    f"widen the lengths, raise max_depth or max_args, or ask for fewer examples"
                )
    finally:
        chunks.close()
        if bar:
            bar.close()
    a, b = params.n_train, params.n_train + params.n_val
    return {"train": rows[:a], "val": rows[a:b], "test": rows[b:]}


STAMP = "GENERATED.json"
FILES = tuple(f"basic_{s}.tsv" for s in SPLITS)


def _file_facts(path: Path) -> dict:
    """Rows (lines after the header), bytes and SHA-256 of a TSV the generator wrote, as GENERATED.json records
    them (the SHA-256 is checked when a cache entry is built from the file: :meth:`Origin.check`)."""
    h, lines = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            lines += chunk.count(b"\n")
    return {"rows": lines - 1, "bytes": path.stat().st_size, "sha256": h.hexdigest()}


def write_dataset(
    folder: Path, params: GeneratorParams, workers: int | None = None, progress: bool = True, why: str | None = None
) -> Path:
    """Generate ``basic_{train,val,test}.tsv`` and ``GENERATED.json`` into ``folder`` (``why``: the warning said
    once the temporary folder is made, so a root that refuses writes says only that).

    Written into a fresh temporary sibling first. An absent ``folder`` is that sibling renamed (all or
    nothing); an existing one (empty, or generated by us earlier) gets only our four files replaced,
    each by an atomic rename, the stamp last, so files a user added stay and an interruption leaves a
    stamp that disagrees with the files (detected, regenerated). Never overwrites a file of a folder
    it did not generate."""
    folder = Path(folder)
    if folder.exists() and not (folder.is_dir() and (is_generated(folder) or not any(folder.iterdir()))):
        raise DataError(
            f"{folder} exists and was not generated by the harness (no {STAMP}); it is left as it is. "
            f"Move it away to generate ListOps data there."
        )
    with made_parents(folder):  # the temporary folder first: a root that refuses writes says so before generating
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
        try:
            if why:
                log.warning("%s", why)
            facts = {}
            for name, rows in generate(params, workers, progress).items():
                path = tmp / f"basic_{name}.tsv"
                # the bytes csv.writer wrote (a tree's string has nothing to quote), 10x faster
                with open(path, "w", newline="", encoding="utf-8") as f:
                    f.write("Source\tTarget\n")
                    f.writelines(f"{src}\t{label}\n" for src, label in rows)
                facts[path.name] = _file_facts(path)
            _write_stamp(
                tmp,
                {
                    "generator": "lra.data.listops",
                    "version": GENERATOR_VERSION,
                    "params": asdict(params),
                    "files": facts,
                },
            )
            if not folder.exists():
                os.rename(tmp, folder)
                return folder
            for name in FILES + (STAMP,):
                os.replace(tmp / name, folder / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # our own fresh temporary folder (absent once renamed)
    return folder


def _write_stamp(folder: Path, stamp: dict) -> None:
    tmp = folder / f".{STAMP}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(stamp, indent=1))
    os.replace(tmp, folder / STAMP)


def is_generated(folder: Path) -> bool:
    return (Path(folder) / STAMP).is_file()


def generated_folder(root: Path, dirname: str, params: GeneratorParams) -> Path:
    """Where the set generated with ``params`` lives: ``<root>/generated/<dirname>-<key of the settings>``."""
    blob = json.dumps({"version": GENERATOR_VERSION, **asdict(params)}, sort_keys=True)
    return Path(root) / GENERATED_DIR / f"{dirname}-{hashlib.sha1(blob.encode()).hexdigest()[:12]}"


def check_generated(folder: Path, params: GeneratorParams) -> str | None:
    """Why the generated ``folder`` cannot be used as it is (None: it can): other parameters, or a file
    that is missing or disagrees with the rows and bytes GENERATED.json recorded (a truncated file)."""
    try:
        recorded = json.loads((folder / STAMP).read_text()).get("params")
    except (OSError, ValueError, AttributeError) as e:
        return f"{STAMP} is unreadable ({type(e).__name__})"
    if recorded != asdict(params):
        return "it was generated with other parameters"
    return check_files(folder)


def check_files(folder: Path) -> str | None:
    """Why the files of a generated ``folder`` disagree with its GENERATED.json (None: they agree)."""
    try:
        stamp = json.loads((folder / STAMP).read_text())
        files = stamp.get("files")
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        return f"{STAMP} is unreadable ({type(e).__name__})"
    if not isinstance(files, dict) or set(files) != set(FILES):
        return f"{STAMP} does not list its files (damaged)"
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want.get("bytes"):
            return f"{name} has {path.stat().st_size} bytes, {STAMP} recorded {want.get('bytes')} (truncated or edited)"
    return None


# ------------------------------------------------------------------------------ reading
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")
_ALNUM_ID = {t: i for i, t in enumerate(ALNUM_VOCAB)}


def tokenize(source: str, tokenizer: str = "brackets") -> list[int]:
    """Token ids of one source string (module docstring: ``brackets`` or ``alnum``)."""
    if tokenizer == "alnum":
        toks, ids = _ALNUM_RUN.findall(source), _ALNUM_ID
    elif tokenizer == "brackets":
        toks, ids = source.replace("]", "X").replace("(", "").replace(")", "").split(), TOKEN_ID
    else:
        raise ValueError(f"task.tokenizer={tokenizer!r} is not allowed: one of {', '.join(VOCABS)}")
    try:
        return [ids[t] for t in toks]
    except KeyError as e:
        raise ValueError(f"unknown ListOps symbol {e.args[0]!r}") from None


def detokenize(ids, tokenizer: str = "brackets") -> str:
    return " ".join(VOCABS[tokenizer][i] for i in ids if i != 0)


def read_tsv(path: Path) -> list[tuple[str, int]]:
    """Rows of an official ListOps TSV. Errors name the file and line."""
    path = Path(path)
    rows = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                    f"the file is damaged: copy it again (or delete a generated folder to regenerate it)"
                ) from None
            if lineno == 1:
                if line.split("\t") != ["Source", "Target"]:
                    raise DataError(f"{path}:1: expected header 'Source<TAB>Target', got {line[:40]!r}")
                continue
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise DataError(f"{path}:{lineno}: expected 2 tab-separated fields, got {len(parts)}")
            src, target = parts
            if not (target.isdigit() and 0 <= int(target) <= 9):
                raise DataError(f"{path}:{lineno}: label must be a digit 0-9, got {target!r}")
            rows.append((src, int(target)))
    if not rows:
        raise DataError(f"{path}: no examples (file is empty or only has a header)")
    return rows


def _tokenize_block(rows, max_length: int, seq_len: int, tokenizer: str):
    """Tokens (uint8, padded with 0, the first ``max_length`` kept) and lengths of ``rows``, and the index of the
    first row that does not tokenise or fit in ``seq_len`` (None: all do). Arrays, not lists of ints, go back from
    a worker: 20x fewer bytes to pickle in the one process that gathers them."""
    tokens = np.zeros((len(rows), seq_len), dtype=np.uint8)
    lengths = np.zeros(len(rows), dtype=np.int32)
    for i, (src, _) in enumerate(rows):
        try:
            seq = tokenize(src, tokenizer)[:max_length]
        except ValueError:
            return tokens, lengths, i
        if len(seq) > seq_len:
            return tokens, lengths, i
        tokens[i, : len(seq)] = seq
        lengths[i] = len(seq)
    return tokens, lengths, None


def tokenize_split(
    rows, path: Path, max_length: int, seq_len: int, workers: int = 1, tokenizer: str = "brackets"
) -> Split:
    """Token matrix (N, seq_len) uint8 padded with 0, first ``max_length`` tokens of each row kept."""
    n = len(rows)
    k = 4 * workers if workers > 1 and n > 2000 else 1  # 4 blocks a worker: none waits long for the last
    blocks = [(rows[i * n // k : (i + 1) * n // k], max_length, seq_len, tokenizer) for i in range(k)]
    if k > 1:
        with worker_pool(workers) as pool:
            done = pool.starmap(_tokenize_block, blocks)
    else:
        done = [_tokenize_block(*blocks[0])]
    for i, (_, _, bad) in enumerate(done):
        if bad is not None:
            bad += i * n // k
            try:
                got = len(tokenize(rows[bad][0], tokenizer))
            except ValueError as e:
                raise DataError(f"{path}:{bad + 2}: {e}") from None
            raise DataError(  # max_length <= seq_len (lra.data.registry): only max_length=null keeps more
                f"{path}:{bad + 2}: {got} tokens, more than task.seq_len={seq_len} (task.max_length=null keeps every "
                f"token); set task.max_length to at most {seq_len} or task.seq_len to at least {got}"
            )
    tokens = np.concatenate([t for t, _, _ in done])
    lengths = np.concatenate([ln for _, ln, _ in done])
    labels = np.fromiter((lab for _, lab in rows), dtype=np.int64, count=n)
    return Split(tokens, lengths, labels)


def candidates(root: Path, dirname: str) -> list[Path]:
    """Where a ListOps folder may be: directly under the root, or inside an unpacked release tree."""
    return [root / dirname, root / "lra_release" / dirname, root / "lra_release" / "lra_release" / dirname]


def _missing(folder: Path) -> list[str]:
    return [f for f in FILES if not (folder / f).is_file()]


def _incomplete_error(folder: Path, missing: list[str], what: str) -> DataError:
    return DataError(
        f"{what}{folder} is not a complete ListOps folder: no {', '.join(missing)}. Copy the missing file(s) from "
        f"the LRA release (lra_release.gz: lra_release/listops-1000/), or move the folder away (or set another "
        f"task.dirname) to generate the data with `make data task=listops`. The folder was left as it is."
    )


def prepare(spec: ListOpsSpec, root: Path, progress: bool = True) -> Path:
    """The ListOps folder: ``task.path``; else official files found under the root; else the generated
    folder (:func:`generated_folder`, seeded official distribution), made or remade if needed and allowed.
    Never deletes or overwrites a file the harness did not write."""
    explicit = explicit_path(spec.path)
    if explicit is not None:
        if not explicit.is_dir():
            raise DataError(f"task.path={explicit}: expected a folder holding {', '.join(FILES)}")
        missing = _missing(explicit)
        if missing:
            raise _incomplete_error(explicit, missing, "task.path: ")
        return explicit
    params = spec.generator
    incomplete = []
    for folder in candidates(root, spec.dirname):
        if not folder.is_dir() or is_generated(folder):
            continue
        missing = _missing(folder)
        if not missing:
            return folder  # official release files: used as they are
        if any(folder.iterdir()):
            incomplete.append((folder, missing))
    if incomplete:
        raise _incomplete_error(*incomplete[0], "")
    target = generated_folder(root, spec.dirname, params)
    problem = check_generated(target, params) if is_generated(target) else "absent"
    if problem is None:
        return target
    if not spec.generate:
        if problem != "absent":
            raise DataError(
                f"{target} (generated) cannot be used: {problem}. Regenerate it with `make data "
                f"task=listops` (task.generate=true), or delete the folder."
            )
        raise DataError(
            f"ListOps data not found: looked for basic_{{train,val,test}}.tsv in {root / spec.dirname} (and under "
            f"{root}/lra_release/), and for a generated set in {target}. Generate it with `make data task=listops`, "
            f"or point LRA_DATA at a folder holding listops-1000/ from the LRA release (lra_release.gz)."
        )
    check_generator(spec)
    why = (
        f"ListOps data not found under {root}: generating the official distribution (seed {params.seed}, "
        f"{params.n_train}/{params.n_val}/{params.n_test}) into {target}"
        if problem == "absent"
        else f"{target}: {problem}; regenerating the files the harness wrote"
    )
    return write_dataset(target, params, workers=data_workers(), progress=progress, why=why)


def check_generator(spec: ListOpsSpec) -> None:
    """A one-line DataError for generator settings that contradict the task, before anything is generated: no
    tree long enough (it would draw forever), or every token kept of trees longer than ``task.seq_len``."""
    g, longest, depth = spec.generator, 1, 1
    while depth < g.max_depth and longest <= g.min_length:  # the longest tree: every node max_args children
        longest, depth = 2 + g.max_args * longest, depth + 1
    if longest <= g.min_length:
        raise DataError(
            f"task.generator.min_length={g.min_length} cannot be met: trees of task.generator.max_depth="
            f"{g.max_depth} with at most task.generator.max_args={g.max_args} arguments have at most {longest} "
            f"symbols; lower min_length or raise max_depth"
        )
    if spec.max_length is None and g.max_length - 1 > spec.seq_len:
        raise DataError(
            f"task.max_length=null keeps every token, and task.generator.max_length={g.max_length} makes examples "
            f"of up to {g.max_length - 1} tokens, more than task.seq_len={spec.seq_len}; set task.max_length to at "
            f"most {spec.seq_len} or task.seq_len to at least {g.max_length - 1}"
        )


@register_task("listops", spec=ListOpsSpec)
def load(spec: ListOpsSpec, root: Path) -> dict[str, Split]:
    folder = prepare(spec, root)
    paths = {s: folder / f"basic_{s}.tsv" for s in SPLITS}
    key = {
        "task": "listops",
        "max_length": spec.max_length,
        "seq_len": spec.seq_len,
        "vocab": VOCABS[spec.tokenizer],
        "sources": source_fingerprint(paths.values()),
    }
    recorded = json.loads((folder / STAMP).read_text()).get("files") if is_generated(folder) else None

    def build():
        out = {}
        for s, p in paths.items():
            rows = read_tsv(p)
            if recorded is not None and len(rows) != recorded[p.name]["rows"]:
                raise DataError(
                    f"{p}: {len(rows)} rows, {STAMP} recorded {recorded[p.name]['rows']}; the file was "
                    f"edited or damaged: delete the folder to regenerate it"
                )
            out[s] = tokenize_split(rows, p, spec.max_length, spec.seq_len, data_workers(), spec.tokenizer)
        return out

    release = recorded is None and explicit_path(spec.path) is None  # generated sets: their GENERATED.json
    check = lambda sp: check_whole(  # noqa: E731
        "listops", split_sizes(sp), folder, "rows", "copy or unpack listops-1000/ again from the LRA release"
    )
    return cached_splits(
        root, "listops", key, build, origin(folder, root, list(paths.values())), check=check if release else None
    )


def origin(folder: Path, root: Path, files: list[Path]) -> Origin:
    """What the ListOps reader reads: a generated set (its stamp's generator and settings) or TSVs it did
    not generate (the release, or ``task.path``)."""
    if not is_generated(folder):
        return Origin("release", "tsv", f"ListOps release {relative_path(folder, root)}", files)
    stamp = json.loads((folder / STAMP).read_text())
    gen, facts = generator_fields(stamp, "lra.data.listops"), stamp.get("files") or {}
    p = gen["params"]
    return Origin(
        "generated",
        "tsv",
        f"ListOps generated by {gen['name']}",
        files,
        generator=gen,
        recorded={str(f): facts.get(f.name, {}).get("sha256") for f in files},  # checked when the entry is built
        notes=[
            f"generator v{gen['version']}",
            f"seed {gen['seed']}",
            f"lengths {p.get('min_length')}-{p.get('max_length')}",
            f"depth <= {p.get('max_depth')}",
        ],
    )
