"""Pathfinder generator: an independent implementation of the official distribution (Kim*, Linsley*
et al. 2020, as used by LRA; docs/facts.md §3.4), seeded and parallel.

An image holds two target snakes, distractor snakes and two marker disks on a black background.

* A snake is a chain of straight "paddles" of length ``L`` drawn at ``antialias``× resolution and
  Lanczos-downsampled. Each paddle also leaves an occupancy mask (the paddle dilated by a disk of
  radius ``margin``), which later paddles may not overlap (``max(mask + new) < 1.8``).
* Growing a snake: from the last pivot step ``L + 2·margin`` along the last orientation to a new
  pivot; candidate paddle heads are the pixels on the circle of radius ``L + margin`` around it,
  weighted by free space × ``max(cos(min(|Δangle|·continuity, π/2)), 0)²``; a paddle is drawn from
  the chosen head back toward the pivot (up to 3 draws; a dead end fails the snake). A snake's own
  previous paddle enters the occupancy mask only when the next one is placed.
* Target snakes (``contour_length`` paddles each): the first seed lies at least
  ``2·seed_distance`` from the border, the second seed ``seed_distance`` away from it at a uniform
  angle; they grow in alternation; any failure restarts both. Contrast ``paddle × snake``.
* Distractors: ``budget // distractor_length`` snakes of ``distractor_length = contour_length // 3``
  paddles with free seeds anywhere (5 tries each, skipped if all fail). Contrast ``snake``.
* Label: fair coin. Markers (disks of ``marker_radius``, drawn at antialias scale): one on the start
  of target snake ``i`` (uniform), the other on the far end of snake ``i`` (label 1) or of the other
  target snake (label 0). The two starts are ``seed_distance`` apart, so the start marker alone
  says nothing.
* The image is the pixelwise max of snakes, distractors and markers, min-max scaled to 0..255.

Parameters per resolution are LRA's (its ``pathfinder.py`` docstrings; 128 px = Path-X). For 128 px
the number of distractors follows ``70 // distractor_length`` (17), the figure cited for Path-X in
LRA issue 38; the official example tiles' component counts fit it better than ``35 // dl``.

Deviations, all minor: numpy's PCG64 instead of the legacy global RNG (so images are not the
official ones, only the same distribution); out-of-image counts as occupied when placing seeds;
the second seed's start must lie inside the image. Quirks kept: target snake 0's last paddle never
enters the occupancy mask, and the PF32 distractors are drawn brighter (contrast 2) than the target
snakes (0.75 × 2), as the released parameters say.

Output is the official layout, ``<folder>/imgs/<k>/sample_<i>.png`` + ``<folder>/metadata/<k>.npy``
(text lines ``imgs/<k> sample_<i>.png <i> <label> <continuity> <contour_length> <distractor_length>
<paddle_length> <paddle_thickness> <margin> 1``, like the release), one ``k`` per chunk of
``chunk`` images. Chunk ``k`` draws from its own stream seeded by ``(seed, resolution,
contour_length, k)``, so the files do not depend on the number of worker processes.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage

from lra.data.base import DataError, made_parents, progress_bar, worker_pool
from lra.data.provenance import folder_entry

log = logging.getLogger(__name__)

DIFFICULTIES = {
    "easy": ("curv_baseline", 6),
    "intermediate": ("curv_contour_length_9", 9),
    "hard": ("curv_contour_length_14", 14),
}
LANCZOS = Image.Resampling.LANCZOS
GENERATOR_VERSION = 1  # part of a generated folder's key: a change to the distribution gets new folders


@dataclass(frozen=True)
class Style:
    """Per-resolution constants of the official generator (docs/facts.md §3.4, the per-resolution table)."""

    paddle_length: int
    paddle_thickness: float
    margins: tuple[int, ...]
    seed_distance: int
    marker_radius: float
    continuity: float
    snake_contrast: float
    paddle_contrast: float
    distractor_budget: int  # number of distractor snakes = budget // distractor_length
    padding: int = 1
    antialias: int = 2
    max_paddle_retrial: int = 2
    max_distractor_retrial: int = 4


STYLES = {
    32: Style(2, 0.5, (1,), 7, 1.5, 1.0, 2.0, 0.75, 20),
    64: Style(5, 1.0, (1,), 12, 2.5, 1.8, 0.8, 1.0, 22),
    128: Style(5, 1.5, (2, 3), 20, 3.0, 1.8, 0.9, 1.0, 70),
}


@dataclass(frozen=True)
class GeneratorParams:
    resolution: int = 32
    difficulty: str = "hard"
    n_images: int = 200_000
    seed: int = 0
    chunk: int = 1000  # images per imgs/<k>/ folder, metadata/<k>.npy file and random stream

    def __post_init__(self):
        if self.resolution not in STYLES:
            raise ValueError(f"pathfinder resolution must be one of {sorted(STYLES)}, got {self.resolution}")
        if self.difficulty not in DIFFICULTIES:
            raise ValueError(f"pathfinder difficulty must be one of {list(DIFFICULTIES)}, got {self.difficulty!r}")
        if self.n_images < 1 or self.chunk < 1:
            raise ValueError("pathfinder generator: n_images and chunk must be >= 1")

    @property
    def dirname(self) -> str:
        return DIFFICULTIES[self.difficulty][0]

    @property
    def contour_length(self) -> int:
        return DIFFICULTIES[self.difficulty][1]


def disk(r: float) -> np.ndarray:
    n = int(math.floor(r))
    y, x = np.ogrid[-n : n + 1, -n : n + 1]
    return x * x + y * y <= r * r


def _translate(p, theta: float, dist: float) -> tuple[int, int]:
    return (math.ceil(p[0] + dist * math.sin(theta)), math.ceil(p[1] + dist * math.cos(theta)))


def _flip(theta: float) -> float:
    return theta + math.pi if theta < 0 else theta - math.pi


class Painter:
    """Draws one image at a time for a resolution and contour length.

    Works on canvases padded by a frame of ``P`` pixels (mask value 1 there: outside the image
    counts as occupied), so paddles and markers are stamped without clipping and the free space
    around candidate heads is one flat gather. Paddle renderings are cached: orientations come from
    a finite set (integer degrees for seeds, pixel directions on a circle otherwise).
    """

    def __init__(self, resolution: int, contour_length: int):
        s = STYLES[resolution]
        self.n, self.s, self.cl = resolution, s, contour_length
        self.dl = contour_length // 3
        self.n_distractors = s.distractor_budget // self.dl
        self.P = P = 2 * (s.paddle_length + 2 * max(s.margins) + 2) + math.ceil(s.marker_radius)
        self.N = N = resolution + 2 * P
        self.inner = (slice(P, P + resolution), slice(P, P + resolution))
        self._paddles: dict = {}
        self._footprints: dict = {}
        self._circles: dict = {}
        self._seed_free: dict = {}
        self.marker = self._marker_patch()
        self.stats = Counter()
        base = np.ones((N, N), np.float32)
        base[self.inner] = 0
        p = s.padding
        base[P : P + p, P : P + resolution] = base[P + resolution - p : P + resolution, P : P + resolution] = 1
        base[P : P + resolution, P : P + p] = base[P : P + resolution, P + resolution - p : P + resolution] = 1
        self.empty_mask = base

    # ---------------------------------------------------------------- renderings
    def paddle(self, theta: float, margin: int) -> tuple[np.ndarray, np.ndarray]:
        """Line (0..1) and occupancy mask (0..1) of a paddle starting at the patch centre."""
        key = (theta, margin)
        hit = self._paddles.get(key)
        if hit is not None:
            return hit
        s, aa = self.s, self.s.antialias
        half = s.paddle_length + math.ceil(s.paddle_thickness) + margin
        big, small, c = 2 * half * aa + 1, 2 * half + 1, half * aa
        hy, hx = _translate((c, c), theta, s.paddle_length * aa)
        im = Image.new("L", (big, big), 0)
        ImageDraw.Draw(im).line([(c, c), (hx, hy)], fill=255, width=int(round(s.paddle_thickness * aa)))
        line = np.asarray(im.resize((small, small), LANCZOS), dtype=np.float32) / 255
        wide = ndimage.binary_dilation(np.asarray(im) > 0, structure=disk(margin * aa))
        wide_im = Image.fromarray(wide.astype(np.uint8) * 255)
        mask = np.asarray(wide_im.resize((small, small), LANCZOS), dtype=np.float32) / 255
        self._paddles[key] = hit = (line, mask)
        return hit

    def footprint(self, theta: float, margin: int) -> np.ndarray:
        """Offsets (K, 2) covered by a paddle's full-strength mask, relative to its start."""
        key = (theta, margin)
        hit = self._footprints.get(key)
        if hit is None:
            m = self.paddle(theta, margin)[1]
            self._footprints[key] = hit = np.argwhere(m >= 0.999) - m.shape[0] // 2
        return hit

    def candidates(self, theta: float, margin: int):
        """Candidate heads for a snake heading ``theta``: integer offsets from the new pivot of the
        pixels on the circle of radius ``L + margin`` (one sample per pixel of arc) whose turn
        weight ``max(cos(min(|Δangle|·continuity, π/2)), 0)²`` is positive, their angles, the
        weights, and flat canvas offsets of each one's disk of radius ``margin`` (cached)."""
        key = (theta, margin)
        hit = self._circles.get(key)
        if hit is None:
            radius = self.s.paddle_length + margin
            ang = np.arange(0, 360, 360.0 / (2 * radius * math.pi)) * math.pi / 180
            off = np.unique(
                np.stack([np.floor(radius * np.sin(ang)), np.floor(radius * np.cos(ang))], 1).astype(np.int64), axis=0
            )
            ang = np.arctan2(off[:, 0], off[:, 1])
            d = np.abs(ang - theta)
            d = np.minimum(np.minimum(d, 2 * math.pi - d) * self.s.continuity, math.pi / 2)
            turn = np.maximum(np.cos(d), 0.0) ** 2
            keep = turn > 0
            dsk = np.argwhere(disk(margin)) - margin
            pts = off[keep][:, None, :] + dsk[None]
            step = self.s.paddle_length + 2 * margin  # pivot to next pivot
            hit = (
                off[keep],
                ang[keep],
                turn[keep],
                pts[..., 0] * self.N + pts[..., 1],
                step * math.sin(theta),
                step * math.cos(theta),
            )
            self._circles[key] = hit
        return hit

    def _marker_patch(self) -> np.ndarray:
        aa, r = self.s.antialias, self.s.marker_radius
        c = math.ceil(r) + 4
        size = (2 * c + 1) * aa
        y, x = np.ogrid[:size, :size]
        big = ((y - c * aa) ** 2 + (x - c * aa) ** 2 <= (r * aa) ** 2).astype(np.uint8) * 255
        small = Image.fromarray(big).resize((2 * c + 1, 2 * c + 1), LANCZOS)
        patch = np.asarray(small, dtype=np.float32) / 255
        k = math.ceil(r) + 1  # keep the disk and its halo, within the frame
        return patch[c - k : c + k + 1, c - k : c + k + 1]

    # ---------------------------------------------------------------- primitives
    def inside(self, p) -> bool:
        return 0 <= p[0] < self.n and 0 <= p[1] < self.n

    def put(self, target: np.ndarray, patch: np.ndarray, p, scale: float = 1.0):
        """``target = max(target, scale * patch)`` with the patch centred on image pixel ``p``."""
        h = patch.shape[0] >> 1
        y, x = p[0] + self.P - h, p[1] + self.P - h
        win = target[y : y + 2 * h + 1, x : x + 2 * h + 1]
        np.maximum(win, patch * scale if scale != 1.0 else patch, out=win)

    def render(self, snake, target: np.ndarray, contrast: float):
        for line, p in snake["lines"]:
            self.put(target, line, p, contrast)

    def blocked(self, mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """For each pixel, the max of ``mask`` over a paddle footprint started there (n×n)."""
        n, P = self.n, self.P
        out = np.zeros((n, n), np.float32)
        for dy, dx in offsets:
            np.maximum(out, mask[P + dy : P + dy + n, P + dx : P + dx + n], out=out)
        return out

    def _free_for_first_seed(self, theta: float, margin: int) -> np.ndarray:
        """Free starts of target snake 1: at least 2·seed_distance from the border (constant per
        orientation, so cached)."""
        key = (theta, margin)
        hit = self._seed_free.get(key)
        if hit is None:
            lined = self.empty_mask.copy()
            b, P, n = 2 * self.s.seed_distance, self.P, self.n
            lined[P : P + b, :] = lined[P + n - b : P + n, :] = 1
            lined[:, P : P + b] = lined[:, P + n - b : P + n] = 1
            self._seed_free[key] = hit = np.flatnonzero(self.blocked(lined, self.footprint(theta, margin)) <= 0.3)
        return hit

    def seed(self, rng, mask, margin, first_target: bool = False):
        """Place a snake's first paddle on a free start. Returns the snake state or None."""
        n, L = self.n, self.s.paddle_length
        for _ in range(self.s.max_paddle_retrial + 1):
            theta = int(rng.integers(-180, 180)) * math.pi / 180
            if first_target:
                free = self._free_for_first_seed(theta, margin)
            else:
                free = np.flatnonzero(self.blocked(mask, self.footprint(theta, margin)) <= 0.3)
            if free.size == 0:
                return None
            tail = divmod(int(free[rng.integers(free.size)]), n)
            head = _translate(tail, theta, L)
            pivot = _translate(head, _flip(theta), L + margin)
            if self.inside(head) and self.inside(pivot):
                return self._start(tail, theta, pivot, margin)
        return None

    def _start(self, tail, theta, pivot, margin):
        line, m = self.paddle(theta, margin)
        return {"pivot": pivot, "theta": theta, "prev": (m, tail), "start": tail, "end": tail, "lines": [(line, tail)]}

    def extend(self, rng, snake, mask, margin) -> bool:
        """Add one paddle to ``snake`` (drawn into an image later, by :meth:`render`)."""
        s, P, N = self.s, self.P, self.N
        off, ang, turn, flat, dy, dx = self.candidates(snake["theta"], margin)
        py, px = snake["pivot"]
        pivot = (math.ceil(py + dy), math.ceil(px + dx))
        # weight = free space at the head (the mask dilated by a disk of radius margin) x turn weight
        w = (1.0 - mask.ravel()[(pivot[0] + P) * N + pivot[1] + P + flat].max(1)) * turn
        cdf = w.cumsum()
        total = float(cdf[-1]) if len(cdf) else 0.0
        if total < 1e-4:
            self.stats["dead_end"] += 1
            return False
        for _ in range(s.max_paddle_retrial + 1):
            i = min(int(cdf.searchsorted(rng.random() * total, side="right")), len(cdf) - 1)
            head = (pivot[0] + int(off[i, 0]), pivot[1] + int(off[i, 1]))
            line, m = self.paddle(_flip(float(ang[i])), margin)
            h = m.shape[0] >> 1
            y, x = head[0] + P - h, head[1] + P - h
            if (mask[y : y + 2 * h + 1, x : x + 2 * h + 1] + m).max() < 1.8:
                self.put(mask, *snake["prev"])
                snake["lines"].append((line, head))
                snake.update(pivot=pivot, theta=float(ang[i]), prev=(m, head), end=head)
                return True
        self.stats["overlap"] += 1
        return False

    # ---------------------------------------------------------------- snakes
    def two_snakes(self, rng, margin):
        """The two target snakes (state dicts) and the occupancy mask they leave."""
        s = self.s
        while True:
            self.stats["target_attempts"] += 1
            mask = self.empty_mask.copy()
            first = self.seed(rng, mask, margin, first_target=True)
            if first is None:
                continue
            second = None
            for _ in range(s.max_paddle_retrial + 1):
                theta = int(rng.integers(-180, 180)) * math.pi / 180
                phi = int(rng.integers(0, 360)) * math.pi / 180
                tail = (
                    int(np.rint(first["start"][0] + s.seed_distance * math.sin(phi))),
                    int(np.rint(first["start"][1] + s.seed_distance * math.cos(phi))),
                )
                head = _translate(tail, theta, s.paddle_length)
                pivot = _translate(head, _flip(theta), s.paddle_length + margin)
                if self.inside(tail) and self.inside(head) and self.inside(pivot):
                    second = self._start(tail, theta, pivot, margin)
                    break
            if second is None:
                continue
            snakes = [first, second]
            if all(self.extend(rng, sn, mask, margin) for _ in range(self.cl - 1) for sn in snakes):
                self.put(mask, *snakes[1]["prev"])  # snake 0's last paddle stays out: official quirk
                return snakes, mask

    def distractors(self, rng, mask, margin) -> list:
        """Distractor snakes (state dicts) placed around what ``mask`` already holds."""
        s, out = self.s, []
        for _ in range(self.n_distractors):
            for _ in range(s.max_distractor_retrial + 1):
                if (mask[self.inner] <= 0.3).mean() < 0.01:
                    break
                mask2 = mask.copy()
                sn = self.seed(rng, mask2, margin)
                if sn is not None and all(self.extend(rng, sn, mask2, margin) for _ in range(self.dl - 1)):
                    self.put(mask2, *sn["prev"])
                    mask = mask2
                    out.append(sn)
                    break
        return out

    def draw(self, rng, info: dict | None = None) -> tuple[np.ndarray, int, int]:
        """One image (uint8, n×n), its label and the paddle margin used. ``info``, if given, receives
        the marker centres and the target snakes' ends (for tests and inspection)."""
        label = int(rng.integers(0, 2))
        margin = self.s.margins[int(rng.integers(0, len(self.s.margins)))]
        snakes, mask = self.two_snakes(rng, margin)
        layers = [np.zeros((self.N, self.N), np.float32) for _ in range(3)]  # target 0, target 1, distractors
        target = self.s.paddle_contrast * self.s.snake_contrast
        self.render(snakes[0], layers[0], target)
        self.render(snakes[1], layers[1], target)
        for sn in self.distractors(rng, mask, margin):
            self.render(sn, layers[2], self.s.snake_contrast)
        image = np.maximum(np.maximum(layers[0], layers[1]), layers[2])
        origin = int(rng.integers(0, 2))
        terminal = origin if label == 1 else 1 - origin
        markers = np.zeros_like(image)
        self.put(markers, self.marker, snakes[origin]["start"])
        self.put(markers, self.marker, snakes[terminal]["end"])
        image = np.maximum(image, markers)[self.inner]
        lo, hi = float(image.min()), float(image.max())
        scale = 255.0 / (hi - lo if hi > lo else 1.0)
        if info is not None:  # layers on the image's 0..255 scale: target snake 0, 1, distractors
            info.update(
                markers=[snakes[origin]["start"], snakes[terminal]["end"]],
                origin=origin,
                ends=[(sn["start"], sn["end"]) for sn in snakes],
                layers=[(x[self.inner] - lo) * scale for x in layers],
            )
        out = np.floor((image - lo) * scale + 0.5)
        return np.clip(out, 0, 255).astype(np.uint8), label, margin


# ------------------------------------------------------------------------------ dataset writer
def chunk_rng(params: GeneratorParams, k: int) -> np.random.Generator:
    return np.random.default_rng([params.seed, params.resolution, params.contour_length, k])


def generate_images(params: GeneratorParams, k: int, count: int):
    """Images, labels and margins of chunk ``k`` (``count`` images), in memory."""
    painter = Painter(params.resolution, params.contour_length)
    rng = chunk_rng(params, k)
    out = [painter.draw(rng) for _ in range(count)]
    return np.stack([o[0] for o in out]), np.array([o[1] for o in out]), [o[2] for o in out]


def png_bytes(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def _write_chunk(args) -> tuple[int, int, int]:
    params, folder, k, count = args
    images, labels, margins = generate_images(params, k, count)
    s = STYLES[params.resolution]
    d = folder / "imgs" / str(k)
    d.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (img, lab, m) in enumerate(zip(images, labels, margins)):
        (d / f"sample_{i}.png").write_bytes(png_bytes(img))
        lines.append(
            f"imgs/{k} sample_{i}.png {i} {lab} {s.continuity} {params.contour_length} "
            f"{params.contour_length // 3} {s.paddle_length} {s.paddle_thickness} {m} 1"
        )
    (folder / "metadata" / f"{k}.npy").write_text("\n".join(lines) + "\n")
    return k, count, int(labels.sum())


def chunks(params: GeneratorParams) -> list[tuple[int, int]]:
    n, c = params.n_images, params.chunk
    return [(k, min(c, n - k * c)) for k in range((n + c - 1) // c)]


OURS = ("imgs", "metadata", "examples.png")  # what write_dataset puts in a folder, besides GENERATED.json


def _replace_ours(new: Path, folder: Path) -> None:
    """Swap the entries the generator wrote in an earlier run of ``folder`` for those in ``new``, each by a
    rename, GENERATED.json last (an interruption leaves the old stamp: other parameters, regenerated);
    files a user added to the folder stay."""
    trash = Path(tempfile.mkdtemp(prefix=f".old-{folder.name}-", dir=folder.parent))
    try:
        for name in OURS:
            if (folder / name).exists():
                os.replace(folder / name, trash / name)
            os.replace(new / name, folder / name)
        os.replace(new / "GENERATED.json", folder / "GENERATED.json")
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def write_dataset(folder: Path, params: GeneratorParams, workers: int | None = None, progress: bool = True) -> Path:
    """Generate ``params.n_images`` images into ``folder`` (the difficulty folder, e.g.
    ``.../pathfinder32/curv_contour_length_14``) atomically, plus ``GENERATED.json`` and an
    ``examples.png`` grid. Returns ``folder``."""
    folder = Path(folder)
    if folder.exists() and not (folder / "GENERATED.json").is_file():
        raise DataError(
            f"{folder} exists and was not generated by the harness (no GENERATED.json); it is left as "
            f"it is. Complete it (imgs/ and metadata/), move it away, or set task.gen_dir to generate "
            f"Pathfinder images elsewhere."
        )
    workers = max(1, workers or os.cpu_count() or 1)
    with made_parents(folder):
        _write(folder, params, workers, progress)
    return folder


def _write(folder: Path, params: GeneratorParams, workers: int, progress: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
    (tmp / "metadata").mkdir()
    jobs = [(params, tmp, k, count) for k, count in chunks(params)]
    bar = None
    if progress:
        bar = progress_bar(params.n_images, f"generating pathfinder{params.resolution} {params.difficulty}", "img")
    t0 = time.perf_counter()
    positives = 0
    try:
        if workers > 1 and len(jobs) > 1:
            with worker_pool(min(workers, len(jobs))) as pool:
                for _, count, pos in pool.imap_unordered(_write_chunk, jobs):
                    positives += pos
                    if bar:
                        bar.update(count)
        else:
            for job in jobs:
                _, count, pos = _write_chunk(job)
                positives += pos
                if bar:
                    bar.update(count)
        elapsed = time.perf_counter() - t0
        (tmp / "GENERATED.json").write_text(
            json.dumps(
                {
                    "generator": "lra.data.pathfinder_gen",
                    "version": GENERATOR_VERSION,
                    "params": asdict(params),
                    "positives": positives,
                    "seconds": round(elapsed, 1),
                    "workers": workers,
                    "files": {
                        n: folder_entry(tmp / n) for n in ("metadata", "imgs")
                    },  # checked when a cache entry is built
                },
                indent=1,
            )
        )
        save_grid(tmp, tmp / "examples.png")
        if folder.exists():
            _replace_ours(tmp, folder)
        else:
            os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if bar:
            bar.close()
    log.info(
        "generated %d pathfinder%d %s images in %.1f s (%.0f images/s, %d workers) into %s",
        params.n_images,
        params.resolution,
        params.difficulty,
        elapsed,
        params.n_images / elapsed,
        workers,
        folder,
    )


def save_grid(folder: Path, out: Path, per_class: int = 16, cols: int = 8) -> Path:
    """A grid of the first ``per_class`` positive (top rows) and negative (bottom rows) images of a
    folder in the official layout, upscaled to about 128 px per tile, white separators, and a
    thicker gap between the positive and the negative block."""
    pos, neg = [], []
    for meta in sorted((folder / "metadata").glob("*.npy"), key=lambda p: int(p.stem)):
        for line in meta.read_text().splitlines():
            f = line.split()
            (pos if f[3] == "1" else neg).append(folder / f[0] / f[1])
        if len(pos) >= per_class and len(neg) >= per_class:
            break
    tiles = [np.asarray(Image.open(p).convert("L")) for p in pos[:per_class] + neg[:per_class]]
    if not tiles:
        raise ValueError(f"no images under {folder}")
    n = tiles[0].shape[0]
    z = max(1, 128 // n)
    t, g = n * z, 2
    rows_per = -(-per_class // cols)
    height = 2 * rows_per * (t + g) + 4 * g
    grid = np.full((height, cols * (t + g) - g), 255, np.uint8)
    for idx, tile in enumerate(tiles):
        block, j = divmod(idx, per_class)
        r, c = divmod(j, cols)
        y = block * (rows_per * (t + g) + 4 * g) + r * (t + g)
        grid[y : y + t, c * (t + g) : c * (t + g) + t] = np.kron(tile, np.ones((z, z), np.uint8))
    Image.fromarray(grid).save(out)
    return out
