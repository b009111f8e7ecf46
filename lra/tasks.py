"""The typed task specs: what a task node holds (``conf/task/<task>.yaml``, with the keys the
preset's protocol file sets and the quirks applied), one frozen dataclass per task, checked when the
config is resolved, before any work starts. A bad value or an unknown key raises :class:`ConfigError`:
one line naming the key, the value and what is allowed.

    spec = lra.config.load(["task=listops", "preset=quick"]).data.spec   # the run's; or task_spec(node)
    spec.tokenizer, spec.generator.n_train                                    # 'brackets', 20000

Each reader in ``lra/data/<task>.py`` takes its spec (``@register_task("listops", spec=ListOpsSpec)``,
checked against :data:`TASK_SPECS`), so the reader reads typed fields, never dict keys. The defaults are
those of ``conf/task/<task>.yaml`` without a preset (tests/test_config.py checks they agree); a task node
always sets them, so they matter to code that builds a spec itself (tests, notebooks).

This module is the config layer's (``lra.config`` imports it; it imports only :mod:`lra.checks`): the
data package sits above it. What is hashed (the resume key, the readers' cache keys) is unchanged: the
task node as composed and the values the readers put in their keys, not these dataclasses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

from lra.checks import SEED_MAX, ConfigError, build, check, choice, flag, folder, integer, number

__all__ = [
    "ConfigError",
    "ExampleLimits",
    "ImageSpec",
    "ListOpsGenerator",
    "ListOpsSpec",
    "PathfinderGenerator",
    "PathfinderSpec",
    "RetrievalSpec",
    "TASK_NAMES",
    "TASK_SPECS",
    "TaskSpec",
    "TextSpec",
    "task_spec",
]

LISTOPS_TOKENIZERS = ("brackets", "alnum")  # [MAX ... X kept | alphanumeric runs only (the papers' pickles)
MASKS = ("all", "nonzero")  # every pixel real | pixel 0 is padding (the public code's ids != 0, docs/fidelity.md)
DEV_SPLITS = ("carve", "test")  # validation carved from train | the papers' test-as-dev
GRAYSCALES = ("luminance", "tf")
PATHFINDER_RESOLUTIONS = (32, 64, 128, 256)  # 256: official data only (the generator draws 32, 64, 128)
PATHFINDER_DIFFICULTIES = ("easy", "intermediate", "hard")  # contour length 6 | 9 | 14
SPLIT_NAMES = ("train", "val", "test")


def _nested(key: str, value, cls, optional: bool = False) -> None:
    """A nested node, built by :func:`lra.checks.build` (or by the caller, as a dataclass)."""
    names = ", ".join(f.name for f in dataclasses.fields(cls))
    check(
        isinstance(value, cls) or (optional and value is None),
        key,
        value,
        f"a mapping of {names}{' or null' if optional else ''}",
    )


# ---------------------------------------------------------------------------------------------
# Nested nodes


@dataclass(frozen=True)
class ExampleLimits:
    """``task.max_examples``: a seeded subset of these splits (the quick preset evaluates on subsets)."""

    train: int | None = None
    val: int | None = None
    test: int | None = None

    def __post_init__(self):
        for k in SPLIT_NAMES:
            integer(f"task.max_examples.{k}", getattr(self, k), 1, optional=True)

    def limits(self) -> dict[str, int]:
        """The splits that are limited: ``{split: n}``."""
        return {k: getattr(self, k) for k in SPLIT_NAMES if getattr(self, k) is not None}


@dataclass(frozen=True)
class ListOpsGenerator:
    """``task.generator`` of ListOps: the official distribution (lra/data/listops.py); the quick preset
    shrinks it."""

    seed: int = 0
    n_train: int = 96_000
    n_val: int = 2_000
    n_test: int = 2_000
    min_length: int = 500
    max_length: int = 2000
    max_depth: int = 10
    max_args: int = 10

    def __post_init__(self):
        integer("task.generator.seed", self.seed, 0, hi=SEED_MAX)
        for k in ("n_train", "n_val", "n_test", "min_length", "max_length"):
            integer(f"task.generator.{k}", getattr(self, k), 1)
        for k in ("max_depth", "max_args"):  # an operator has at least 2 children, a tree at least 2 levels
            integer(f"task.generator.{k}", getattr(self, k), 2)
        check(
            self.min_length < self.max_length - 1,
            "task.generator.min_length",
            self.min_length,
            f"an integer below task.generator.max_length - 1 ({self.max_length - 1}): trees are kept when "
            f"min_length < length < max_length",
        )


@dataclass(frozen=True)
class PathfinderGenerator:
    """``task.generator`` of Pathfinder (lra/data/pathfinder_gen.py)."""

    seed: int = 0
    chunk: int = 1000  # images per imgs/<k>/ folder and random stream

    def __post_init__(self):
        integer("task.generator.seed", self.seed, 0, hi=SEED_MAX)
        integer("task.generator.chunk", self.chunk, 1)


# ---------------------------------------------------------------------------------------------
# The task specs


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """What every task node holds. ``name`` is the task (each spec's default; no other value is allowed)."""

    name: str
    num_classes: int
    vocab_size: int  # embedding rows
    seq_len: int  # padded length the model sees (per document for two-document tasks)
    dual: bool = False  # two documents per example through one encoder and the dual head (Retrieval)
    path: str | None = None  # a file or folder to read; None: search the data root
    max_examples: ExampleLimits | None = None  # seeded subsets of some splits; None: every example

    HELPERS: ClassVar[tuple[str, ...]] = ()  # the node's interpolation tables (for seq_len): accepted, not kept
    DUAL: ClassVar[bool] = False

    def __post_init__(self):
        choice("task.name", self.name, (self.task_name(),))
        for k in ("num_classes", "vocab_size", "seq_len"):
            integer(f"task.{k}", getattr(self, k), 1)
        flag("task.dual", self.dual)
        check(
            self.dual == self.DUAL,
            "task.dual",
            self.dual,
            f"{str(self.DUAL).lower()} for task {self.name} ({'two documents' if self.DUAL else 'one document'} "
            f"per example)",
        )
        check(
            self.path is None or isinstance(self.path, str),
            "task.path",
            self.path,
            "a file or folder (or null to search the data root)",
        )
        _nested("task.max_examples", self.max_examples, ExampleLimits, optional=True)

    @classmethod
    def task_name(cls) -> str:
        return next(f.default for f in dataclasses.fields(cls) if f.name == "name")

    @property
    def zero_is_padding(self) -> bool:
        """Whether token 0 is padding wherever it sits (``task.mask=nonzero``), not only past the length."""
        return False


@dataclass(frozen=True, kw_only=True)
class ListOpsSpec(TaskSpec):
    """ListOps (lra/data/listops.py): official files where found, else the seeded official distribution."""

    name: str = "listops"
    num_classes: int = 10
    vocab_size: int = 16  # 15 symbols + pad (the public code's table: 32)
    seq_len: int = 2048
    tokenizer: str = "brackets"  # brackets: [MAX ... X kept | alnum: MAX 2 9 only (the papers' pickles)
    max_length: int | None = 2000  # tokens kept per example; None: every token
    dirname: str = "listops-1000"  # the release's folder name; a generated set's label
    generate: bool = True  # generate the official distribution if the files are absent
    generator: ListOpsGenerator = field(default_factory=ListOpsGenerator)

    def __post_init__(self):
        super().__post_init__()
        choice("task.tokenizer", self.tokenizer, LISTOPS_TOKENIZERS)
        integer("task.max_length", self.max_length, 1, optional=True)
        folder("task.dirname", self.dirname)
        flag("task.generate", self.generate)
        _nested("task.generator", self.generator, ListOpsGenerator)


@dataclass(frozen=True, kw_only=True)
class TextSpec(TaskSpec):
    """Text: IMDB at byte level (lra/data/text.py)."""

    name: str = "text"
    num_classes: int = 2
    vocab_size: int = 257  # ids 1..256 = byte + 1, 0 = pad (the public code's table: 512)
    seq_len: int = 4096
    max_length: int = 4000  # bytes kept per review
    dev_split: str = "carve"  # carve: seeded val from train | test: the papers' test-as-dev
    val_fraction: float = 0.1  # share of train carved out
    split_seed: int = 0
    download: bool = False  # fetch the data from the HF Hub (pinned revision) when absent

    HELPERS: ClassVar[tuple[str, ...]] = ("_length_key", "padded_length")

    def __post_init__(self):
        super().__post_init__()
        integer("task.max_length", self.max_length, 1)
        choice("task.dev_split", self.dev_split, DEV_SPLITS)
        number("task.val_fraction", self.val_fraction, 0.0, open_lo=True, hi=1.0, open_hi=True)
        integer("task.split_seed", self.split_seed, 0, hi=SEED_MAX)
        flag("task.download", self.download)


@dataclass(frozen=True, kw_only=True)
class RetrievalSpec(TaskSpec):
    """Retrieval: AAN citation pairs at byte level, two documents per example (lra/data/retrieval.py)."""

    name: str = "retrieval"
    num_classes: int = 2
    vocab_size: int = 257  # ids 1..256 = byte + 1, 0 = pad (the public code's table: 512)
    seq_len: int = 4096  # per document
    dual: bool = True
    max_length: int = 4000  # bytes kept per document
    download: bool = False

    HELPERS: ClassVar[tuple[str, ...]] = ("_length_key", "padded_length")
    DUAL: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        integer("task.max_length", self.max_length, 1)
        flag("task.download", self.download)


@dataclass(frozen=True, kw_only=True)
class ImageSpec(TaskSpec):
    """Image: CIFAR-10 in grayscale, one token per pixel (lra/data/image.py)."""

    name: str = "image"
    num_classes: int = 10
    vocab_size: int = 256  # grey values 0..255
    seq_len: int = 1024
    mask: str = "all"  # all: every pixel real | nonzero: pixel 0 is padding (the public code)
    grayscale: str = "luminance"  # luminance (ITU-R 601, rounded) | tf (LRA's TF op)
    val_fraction: float = 0.1  # the last 10% of train
    download: bool = False

    def __post_init__(self):
        super().__post_init__()
        choice("task.mask", self.mask, MASKS)
        choice("task.grayscale", self.grayscale, GRAYSCALES)
        number("task.val_fraction", self.val_fraction, 0.0, open_lo=True, hi=1.0, open_hi=True)
        flag("task.download", self.download)

    @property
    def zero_is_padding(self) -> bool:
        return self.mask == "nonzero"


@dataclass(frozen=True, kw_only=True)
class PathfinderSpec(TaskSpec):
    """Pathfinder: official images where found, else the seeded official distribution (lra/data/pathfinder.py)."""

    name: str = "pathfinder"
    num_classes: int = 2
    vocab_size: int = 256  # pixel values 0..255
    seq_len: int = 1024  # resolution²
    mask: str = "all"
    resolution: int = 32
    difficulty: str = "hard"  # easy | intermediate | hard = contour length 6 | 9 | 14
    n_images: int | None = 200_000  # generated set size; fewer than the official images: a seeded subset
    generate: bool = True  # generate the official distribution if no official images are found
    gen_dir: str | None = "."  # label of generated sets ('.' = pathfinder)
    generator: PathfinderGenerator = field(default_factory=PathfinderGenerator)
    split_seed: int = 0  # seeded 80/10/10 split

    HELPERS: ClassVar[tuple[str, ...]] = ("_res_key", "pixels")

    def __post_init__(self):
        super().__post_init__()
        choice("task.mask", self.mask, MASKS)
        choice("task.resolution", self.resolution, PATHFINDER_RESOLUTIONS)
        choice("task.difficulty", self.difficulty, PATHFINDER_DIFFICULTIES)
        check(
            self.seq_len == self.resolution**2,
            "task.seq_len",
            self.seq_len,
            f"{self.resolution ** 2}, the pixels of pathfinder{self.resolution} images: set task.resolution "
            f"alone (task.seq_len follows it)",
        )
        integer("task.n_images", self.n_images, 1, optional=True)
        flag("task.generate", self.generate)
        folder("task.gen_dir", self.gen_dir, optional=True)
        _nested("task.generator", self.generator, PathfinderGenerator)
        integer("task.split_seed", self.split_seed, 0, hi=SEED_MAX)

    @property
    def zero_is_padding(self) -> bool:
        return self.mask == "nonzero"


TASK_SPECS: dict[str, type[TaskSpec]] = {
    cls.task_name(): cls for cls in (ListOpsSpec, TextSpec, RetrievalSpec, PathfinderSpec, ImageSpec)
}  # the one registry of tasks (a reader registers against it: lra.data.register_task), in the harness's order
TASK_NAMES: tuple[str, ...] = tuple(TASK_SPECS)  # what the tools run by default, in that order


def task_spec(node: Mapping) -> TaskSpec:
    """The typed, checked spec of a task node (a plain dict, as ``OmegaConf.to_container`` gives it);
    raises :class:`ConfigError` (one line) on an unknown task, an unknown key or a bad value."""
    check(isinstance(node, Mapping), "task", node, "a task node (conf/task/<task>.yaml)")
    name = node.get("name")
    choice("task.name", name, sorted(TASK_SPECS))
    cls = TASK_SPECS[name]
    return build(cls, "task", dict(node), ignore=cls.HELPERS)
