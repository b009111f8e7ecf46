"""LightningDataModule over cached token arrays: batches of ``tokens``, ``mask`` and ``label``.

Batches are gathered with one fancy-index per batch (a BatchSampler fed to the dataset), so the
loader costs microseconds per batch and never bounds training. Training order is a seeded
permutation per epoch; validation and test keep every example (no dropped last batch).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

import lightning as L

from lra.data.base import Split


class SplitDataset(Dataset):
    """Indexable by a list of indices: returns a whole collated batch."""

    def __init__(self, split: Split):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, idx):
        idx = np.sort(np.asarray(idx))  # sorted reads are faster on memory-mapped arrays
        s = self.split
        tokens = torch.from_numpy(np.ascontiguousarray(s.tokens[idx])).long()
        lengths = torch.from_numpy(np.ascontiguousarray(s.lengths[idx])).long()
        mask = torch.arange(tokens.shape[-1]) < lengths[..., None]
        return {"tokens": tokens, "mask": mask, "label": torch.from_numpy(np.ascontiguousarray(s.labels[idx]))}


class LRADataModule(L.LightningDataModule):
    def __init__(self, splits: dict[str, Split], batch_size: int, eval_batch_size: int | None = None,
                 seed: int = 0, num_workers: int = 0):
        super().__init__()
        self.splits = splits
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.seed = seed
        self.num_workers = num_workers

    def _loader(self, split: str, train: bool) -> DataLoader:
        ds = SplitDataset(self.splits[split])
        if train:
            gen = torch.Generator().manual_seed(self.seed)
            sampler = BatchSampler(RandomSampler(ds, generator=gen), self.batch_size, drop_last=False)
        else:
            sampler = BatchSampler(SequentialSampler(ds), self.eval_batch_size, drop_last=False)
        return DataLoader(ds, sampler=sampler, batch_size=None, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self):
        return self._loader("train", True)

    def val_dataloader(self):
        return self._loader("val", False)

    def test_dataloader(self):
        return self._loader("test", False)
