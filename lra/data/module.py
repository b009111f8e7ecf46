"""LightningDataModule over cached token arrays: batches of ``tokens``, ``mask`` and ``label``.

One data module for every run, one device or several:
* Training order: :class:`EpochBatches`, a permutation drawn from ``(seed, epoch)`` alone, so any
  position can be rebuilt without replaying the batches before it. :class:`ResumableLoader` reports
  the position of the next batch it delivers (Lightning saves it in checkpoints), so a restarted run
  continues with the next unseen batch.
* Several devices: each rank takes every ``world_size``-th batch of the same order (training) or of
  the split in order (evaluation), so nothing is duplicated and the summed metrics stay exact; the
  Trainer runs with ``use_distributed_sampler=False``.
* Every loader has its own seeded generator: creating a loader's iterator (and its workers' seeds)
  never draws from the global RNG, so dropout and randomised attention draw the same numbers
  whether or not, and whenever, loader workers start (exact resume with any worker count).

Batches are gathered with one fancy-index per batch, so the loader costs microseconds per batch.
"""

from __future__ import annotations

import signal
import sys
import traceback

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lra.data.base import Split


def ignore_stop_signals(worker_id: int) -> None:
    """Loader workers leave SIGINT/SIGTERM to the main process: a signal sent to the whole process
    group (timeout, SLURM, Kubernetes, Ctrl-C) then stops the run cleanly, as ``interrupted``, instead
    of killing a worker under the loader ("DataLoader worker ... killed by signal"). When the main
    process stops while it is fetching a batch's shared memory from a worker, the worker's
    file-descriptor server sees the connection drop: expected then, so not printed as a traceback."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.excepthook = _quiet_hangup  # the fd server (multiprocessing.resource_sharer) reports through it


def _quiet_hangup(exc_type, exc, tb) -> None:
    if issubclass(exc_type, (ConnectionError, EOFError)) and any(
        f.f_code.co_filename.endswith("resource_sharer.py") for f, _ in traceback.walk_tb(tb)
    ):
        return  # the main process hung up while fetching a batch: it is stopping
    sys.__excepthook__(exc_type, exc, tb)


class SplitDataset(Dataset):
    """Indexable by a list of indices: returns a whole collated batch."""

    def __init__(self, split: Split):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, idx):
        idx = np.sort(np.asarray(idx))  # sorted reads are faster on memory-mapped arrays
        s = self.split
        tokens = np.ascontiguousarray(s.tokens[idx])  # read once: memory-mapped arrays
        mask = torch.from_numpy(np.ascontiguousarray(s.mask(idx, tokens)))
        tokens = torch.from_numpy(tokens).long()
        return {"tokens": tokens, "mask": mask, "label": torch.from_numpy(np.ascontiguousarray(s.labels[idx]))}


class EpochBatches(Sampler):
    """This rank's batches of one epoch, from batch ``start`` (counted over all ranks) on.

    ``shuffle``: a permutation drawn from ``(seed, epoch)``; else the split in order. With several
    ranks, rank r takes batches r, r + W, ...; in training every rank gets the same number of batches
    (the last ``len % W`` batches of an epoch are left out, as a distributed sampler pads or drops)."""

    def __init__(
        self, n: int, batch_size: int, seed: int = 0, *, shuffle: bool = True, rank: int = 0, world_size: int = 1
    ):
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0

    def batches_per_epoch(self) -> int:
        """Batches of one epoch over all ranks (what the position counts)."""
        total = -(-self.n // self.batch_size)
        return total - total % self.world_size if self.shuffle and self.world_size > 1 else total

    def __len__(self) -> int:
        """This rank's batches of a whole epoch, from whatever batch it (re)starts: Lightning counts a resumed
        epoch's batches from its first one, and asks once, not each epoch."""
        return len(range(self.rank, self.batches_per_epoch(), self.world_size))

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))
        else:
            order = torch.arange(self.n)
        for i in range(self.start + self.rank, self.batches_per_epoch(), self.world_size):
            yield order[i * self.batch_size : (i + 1) * self.batch_size].tolist()


class ResumableLoader(DataLoader):
    """A DataLoader whose ``state_dict`` is the position (epoch, batch over all ranks) of the next
    batch it will deliver; Lightning saves it in checkpoints and loads it on restart (its
    ``_Stateful`` protocol). Counting delivered batches (not sampled ones) keeps worker prefetching out."""

    def __init__(self, dataset, sampler: EpochBatches, num_workers: int = 0, pin_memory: bool = False):
        super().__init__(
            dataset,
            sampler=sampler,
            batch_size=None,
            num_workers=num_workers,
            pin_memory=pin_memory,
            generator=torch.Generator().manual_seed(sampler.seed),
            worker_init_fn=ignore_stop_signals,
        )
        self.batches = sampler
        self.epoch, self.position = 0, 0

    def __iter__(self):
        self.batches.epoch, self.batches.start = self.epoch, self.position
        total = self.batches.batches_per_epoch()
        for batch in super().__iter__():
            self.position += self.batches.world_size
            if self.position >= total:  # the next batch is the first of the next epoch
                self.epoch, self.position = self.epoch + 1, 0
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class LRADataModule(L.LightningDataModule):
    def __init__(
        self,
        splits: dict[str, Split],
        batch_size: int,
        eval_batch_size: int | None = None,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
    ):
        super().__init__()
        self.splits = splits
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.seed = seed
        self.num_workers = num_workers
        self.pin_memory = pin_memory

    def _ranks(self) -> tuple[int, int]:
        t = self.trainer
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def _loader(self, split: str, train: bool) -> DataLoader:
        rank, world = self._ranks()
        data = self.splits[split]
        batches = EpochBatches(
            len(data),
            self.batch_size if train else self.eval_batch_size,
            self.seed,
            shuffle=train,
            rank=rank,
            world_size=world,
        )
        if train:
            return ResumableLoader(SplitDataset(data), batches, self.num_workers, self.pin_memory)
        # evaluation loaders start afresh each time: no persistent workers holding RNG or file state
        return DataLoader(
            SplitDataset(data),
            sampler=batches,
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            worker_init_fn=ignore_stop_signals,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self):
        return self._loader("train", True)

    def val_dataloader(self):
        return self._loader("val", False)

    def test_dataloader(self):
        return self._loader("test", False)
