"""Data on request (``task.download=true``): fetch IMDB, CIFAR-10 and the AAN pairs from the Hugging Face
Hub at pinned revisions, into the data root, in a layout the readers already know.

Off by default: a run never touches the network unless asked. Called by the Text, Image and Retrieval
loaders only when their search of the data root found nothing (so it never replaces the user's data).

How (the libraries made for it):

- IMDB (``stanfordnlp/imdb``) and CIFAR-10 (``uoft-cs/cifar10``): ``datasets.load_dataset`` at the
  pinned revision, train and test written with ``DatasetDict.save_to_disk`` (the readers' ``hf_disk``
  format; the folder name mentions imdb / cifar, as the readers require).
- AAN (``OpenNLPLab/lra``, ``data/aan/``): the three raw TSVs fetched byte for byte with huggingface_hub's
  ``hf_hub_download`` (which resumes a cut transfer and checks the size), never through a CSV parser
  (quotes in these files are text); their sizes and SHA-256 come from ``HfApi.get_paths_info``.

Safety: everything is written under ``<root>/.download-<folder>/`` (a dot folder, which no reader
enters), checked (rows per split; for the TSVs also bytes, and SHA-256 where the Hub reports one),
stamped with ``DOWNLOADED.json``, then renamed to ``<root>/<folder>/`` in one step. An interruption
leaves only the dot folder; the next try reuses what is complete there (the ``datasets`` download
cache; whole TSVs, and a partial TSV continues from its last byte: huggingface_hub's ``.incomplete`` file
under ``local_dir``, kept in the dot folder) and rebuilds the rest.

No network: before anything is fetched, one TCP connection is opened to the Hub (``HF_ENDPOINT``, or the
HTTPS proxy the environment names). A name that does not resolve, a refused or unreachable connection, or no
answer within ``PROBE_TIMEOUT_S`` is one line at once, saying how to get the data by hand; so is
``HF_HUB_OFFLINE``. Without this the Hub client retries the first request five times over about 25 s, which
helps against a flaky connection, never against none. Errors after the connection is made (a dropped
transfer, a server error) keep the libraries' retries, and a cut transfer continues on the next try.

``LRA_HUB=/some/folder`` (or ``hub=``) reads ``<folder>/<owner>/<name>/`` instead of the Hub: an
offline mirror (e.g. made with ``hf download <repo> --repo-type dataset --local-dir``) and what the
tests use: ``datasets.load_dataset`` reads the folder, the TSVs are copied from it (a local copy needs no
resume), and the same checks and rename follow. The revision then is whatever the mirror holds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lra.data.base import DataError, hf_datasets
from lra.data.official import OFFICIAL
from lra.data.provenance import file_sha256

log = logging.getLogger(__name__)

HUB_ENV = "LRA_HUB"
STAMP = "DOWNLOADED.json"
HUB_ENDPOINT = "https://huggingface.co"  # HF_ENDPOINT overrides it, as for the Hub client
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HubSource:
    repo: str  # Hub dataset repository
    revision: str  # full commit hash: the bytes never change under us
    folder: str  # final folder under the data root
    rows: dict  # split -> rows the pinned revision holds (the size check)
    files: dict = field(default_factory=dict)  # split -> file in the repo, copied raw; empty: load_dataset

    def location(self, hub: str | None) -> str:
        """Where to read the repository: the local mirror folder, or the Hub."""
        return str(Path(hub) / self.repo) if hub else self.repo


# The one table of what is fetched. Revisions: the commits other projects pin (docs/facts.md §3.2 and
# public code); row counts: the official sets' (lra/data/official.py, docs/facts.md §3).
SOURCES: dict[str, HubSource] = {
    "text": HubSource(
        "stanfordnlp/imdb",
        "e6281661ce1c48d982bc483cf8a173c1bbeb5d31",
        "hf-stanfordnlp-imdb",
        {s: sum(n for k, n in OFFICIAL["text"].items() if k.startswith(s)) for s in ("train", "test")},
    ),
    "image": HubSource(
        "uoft-cs/cifar10",
        "0b2714987fa478483af9968de7c934580d0bb9a2",
        "hf-uoft-cs-cifar10",
        OFFICIAL["image"],
    ),
    "retrieval": HubSource(
        "OpenNLPLab/lra",
        "6cb133c44f406da743661488df9e977b87d98775",
        "hf-OpenNLPLab-lra-aan",
        OFFICIAL["retrieval"],
        {
            "train": "data/aan/new_aan_pairs.train.tsv",
            "val": "data/aan/new_aan_pairs.eval.tsv",
            "test": "data/aan/new_aan_pairs.test.tsv",
        },
    ),
}


def hint(task: str, root: Path) -> str:
    """The line the readers' missing-data messages add."""
    src = SOURCES[task]
    return (
        f"  - or let the harness fetch it: make data task={task} ARGS='task.download=true' (or add "
        f"task.download=true to a run): HF {src.repo} at revision {src.revision[:12]}, into {root}/{src.folder}/"
    )


def fetch(
    task: str,
    root: Path,
    explicit: Path | None = None,
    progress: bool = True,
    hub: str | None = None,
    by_hand: str = "",
) -> Path:
    """Download ``task``'s data into ``<root>/<folder>/`` (see the module docstring); return that folder.
    ``by_hand`` says how to get the data without the Hub (the no-network message ends with it)."""
    src = SOURCES[task]
    root = Path(root)
    if explicit is not None:
        raise DataError(
            f"task.download=true fetches into the data root, but task.path={explicit} is set: unset "
            f"task.path, or put the data at task.path yourself"
        )
    hub = hub or os.environ.get(HUB_ENV) or None
    final, tmp = root / src.folder, root / f".download-{src.folder}"
    if final.exists() and not (final / STAMP).is_file():
        raise DataError(
            f"{final} exists but was not written by task.download (no {STAMP}) and the reader did not "
            f"accept it: move it away, or point task.path at it"
        )
    if not hub:
        check_network(task, by_hand)
    where = src.location(hub)
    log.info("%s: fetching %s at revision %s into %s", task, where, src.revision, final)
    t0 = time.perf_counter()
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "out"
    if src.files:
        stamp = _copy_files(src, where, hub, tmp, out, progress)
    else:
        stamp = _load_dataset(src, where, tmp, out)
    stamp.update(
        {
            "task": task,
            "repo": src.repo,
            "revision": src.revision if not hub else None,
            "source": where,
            "seconds": round(time.perf_counter() - t0, 1),
        }
    )
    _write_json(out / STAMP, stamp)
    _replace(final, out, tmp)
    log.info("%s: %s ready (%s)", task, final, ", ".join(f"{s} {n} rows" for s, n in stamp["rows"].items()))
    return final


# ------------------------------------------------------------------------------ is there a network at all?
def check_network(task: str, by_hand: str = "") -> None:
    """One connection attempt to the Hub (or to its proxy), no retry; DataError if there is no network."""
    src = SOURCES[task]
    offline = next(
        (
            v
            for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
            if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        ),
        None,
    )
    if offline:
        raise DataError(
            f"task.download=true cannot fetch {src.repo}: {offline}={os.environ[offline]} forbids the "
            f"network (unset it); or {by_hand or 'put the data under the data root'}, or set {HUB_ENV} "
            f"to a local copy of the Hub repository"
        )
    host, port, via = _probe_target(os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise DataError(
            f"task.download=true cannot fetch {src.repo}: no network ({_why(e, host, port, via)}). "
            f"Connect and run again, or {by_hand or 'put the data under the data root'} (or set "
            f"{HUB_ENV} to a local copy of the Hub repository)"
        ) from None


def _probe_target(endpoint: str) -> tuple[str, int, str]:
    """``(host, port, what it is)``: the endpoint's, or the proxy's when the environment routes it through one."""
    url = urllib.parse.urlsplit(endpoint)
    host = url.hostname or "huggingface.co"
    proxy = urllib.request.getproxies().get(url.scheme or "https")
    if proxy and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return p.hostname or "", p.port or {"https": 443, "http": 80}.get(p.scheme, 1080), "the proxy "
    return host, url.port or (80 if url.scheme == "http" else 443), ""


def _why(e: OSError, host: str, port: int, via: str) -> str:
    if isinstance(e, socket.gaierror):
        return f"cannot resolve {via}{host}: {e.strerror or e}"
    if isinstance(e, ConnectionRefusedError):
        return f"{via}{host}:{port} refused the connection"
    if isinstance(e, TimeoutError):
        return f"no answer from {via}{host}:{port} within {PROBE_TIMEOUT_S:.0f} s"
    return f"cannot connect to {via}{host}:{port}: {e.strerror or e}"


# ------------------------------------------------------------------------------ datasets route
def _load_dataset(src: HubSource, where: str, tmp: Path, out: Path) -> dict:
    datasets = hf_datasets("task.download=true")
    # The download cache lives in the dot folder: a retry reuses the files already fetched, and nothing
    # is left in ~/.cache once the data is in place.
    try:
        dd = datasets.load_dataset(where, revision=src.revision, cache_dir=str(tmp / "hf-cache"))
    except Exception as e:  # network, auth and format errors come in many types
        raise DataError(
            f"downloading {where} (revision {src.revision[:12]}) failed: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}. Check the network (HF_ENDPOINT, HF_TOKEN) "
            f"and run again: finished files are reused"
        ) from None
    _check_rows(src, {s: (len(dd[s]) if s in dd else None) for s in src.rows}, tmp)
    if out.exists():
        shutil.rmtree(out)  # a half-written copy from an interrupted try (inside our dot folder)
    try:
        datasets.DatasetDict({s: dd[s] for s in src.rows}).save_to_disk(str(out))
    except OSError as e:
        raise DataError(
            f"writing {out} failed ({type(e).__name__}: {e}); free some space and run again "
            f"(what was downloaded is reused)"
        ) from None
    return {"rows": {s: len(dd[s]) for s in src.rows}}


# ------------------------------------------------------------------------------ raw file route
def _copy_files(src: HubSource, where: str, hub: str | None, tmp: Path, out: Path, progress: bool) -> dict:
    """The split files, whole and checked (bytes, and SHA-256 where the Hub reports one), into ``out``."""
    out.mkdir(exist_ok=True)
    expected = _file_info(src, where, hub)
    files, rows = {}, {}
    for split, name in src.files.items():
        size, sha = expected[name]
        dest = out / Path(name).name
        if not (dest.is_file() and dest.stat().st_size == size):  # whole and checked on an earlier try
            got = _mirror_copy(Path(where) / name, tmp) if hub else _hub_download(src, name, tmp, progress)
            _check_file(got, size, sha, f"{where}/{name}")
            os.replace(got, dest)
        rows[split] = _count_lines(dest)
        files[dest.name] = {"bytes": size, "sha256": sha}
    _check_rows(src, rows, tmp)
    return {"rows": rows, "files": files}


def _file_info(src: HubSource, where: str, hub: str | None) -> dict:
    """``{name: (bytes, sha256 or None)}`` for the source's files: the Hub's record at the pinned revision
    (one request), or the mirror folder's sizes."""
    names = list(src.files.values())
    if hub:
        missing = [n for n in names if not (Path(where) / n).is_file()]
        if missing:
            raise DataError(
                f"{HUB_ENV}={hub}: {Path(where) / missing[0]} does not exist; the mirror must hold "
                f"{src.repo} as the Hub lays it out"
            )
        return {n: ((Path(where) / n).stat().st_size, None) for n in names}
    from huggingface_hub import HfApi

    try:
        found = HfApi().get_paths_info(src.repo, names, revision=src.revision, repo_type="dataset")
    except Exception as e:  # network, auth and server errors come in many types
        raise DataError(
            f"cannot reach {src.repo}@{src.revision[:12]} on the Hub ({type(e).__name__}: "
            f"{_first_line(e)}); check the network (HF_ENDPOINT, HF_TOKEN) or {HUB_ENV}"
        ) from None
    info = {f.path: (int(f.size), _lfs_sha256(getattr(f, "lfs", None))) for f in found if hasattr(f, "size")}
    absent = [n for n in names if n not in info]
    if absent:
        raise DataError(f"{src.repo}@{src.revision[:12]} has no file {absent[0]}; not the pinned dataset")
    return info


def _lfs_sha256(lfs) -> str | None:
    """The SHA-256 of an LFS file (huggingface_hub gives a dataclass, older releases a dict)."""
    if lfs is None:
        return None
    return getattr(lfs, "sha256", None) or (lfs.get("sha256") if isinstance(lfs, dict) else None)


def _hub_download(src: HubSource, name: str, tmp: Path, progress: bool) -> Path:
    """One file at the pinned revision through ``hf_hub_download`` into the dot folder: it resumes a cut
    transfer (its ``.incomplete`` file under ``local_dir``) and checks the size against the Hub's record."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = not progress and not are_progress_bars_disabled()
    if quiet:
        disable_progress_bars()
    try:
        return Path(
            hf_hub_download(src.repo, name, repo_type="dataset", revision=src.revision, local_dir=str(tmp / "hub"))
        )
    except Exception as e:  # a dropped connection or a full disk, in many types
        raise DataError(
            f"downloading {src.repo}/{name} stopped ({type(e).__name__}: {_first_line(e)}); run "
            f"again: it continues from there"
        ) from None
    finally:
        if quiet:
            enable_progress_bars()


def _mirror_copy(path: Path, tmp: Path) -> Path:
    """A file of the local mirror ($LRA_HUB), copied into the dot folder (renamed into place once checked)."""
    part = tmp / (path.name + ".part")
    try:
        shutil.copyfile(path, part)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise DataError(f"copying {path} failed ({type(e).__name__}: {e}); run again") from None
    return part


def _check_file(path: Path, size: int, sha: str | None, what: str) -> None:
    """Bytes (and SHA-256 where known) as the source says; a file that differs is removed."""
    got = path.stat().st_size
    if got != size:
        path.unlink()
        raise DataError(f"{what}: got {got} bytes, expected {size}; the partial file was removed, run again")
    if sha and file_sha256(path) != sha:
        path.unlink()
        raise DataError(f"{what}: SHA-256 differs from the Hub's; the file was removed, run again")


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [""])[0][:200]


def _count_lines(path: Path) -> int:
    """Examples in a TSV as the reader counts them (empty lines skipped)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip(b"\r\n"))


# ------------------------------------------------------------------------------ checks and the swap
def _check_rows(src: HubSource, got: dict, tmp: Path) -> None:
    bad = [f"{s} {got.get(s)} (expected {n})" for s, n in src.rows.items() if got.get(s) != n]
    if bad:
        raise DataError(
            f"{src.repo}@{src.revision[:12]}: wrong number of rows: {', '.join(bad)}; not the pinned "
            f"dataset or a damaged download. Delete {tmp} and run again"
        )


def _write_json(path: Path, obj: dict) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(part, path)


def _replace(final: Path, out: Path, tmp: Path) -> None:
    """``out`` becomes ``final`` in one rename. An earlier download there (stamped, but refused by the reader:
    damaged) is moved aside, not deleted: files may have been added to it by hand."""
    if final.exists():
        aside = final.with_name(f".replaced-{final.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        os.replace(final, aside)
        log.warning("%s was incomplete; moved to %s (delete it once nothing there is needed)", final, aside)
    os.replace(out, final)
    shutil.rmtree(tmp)  # only the dot folder this module made (its cache and partial files)
