"""Client datasets for training: memory-mapped canonical store + split CSV, batched without workers.

A batch is gathered with one fancy index into the memory-mapped uint8 array, so there is no
per-image file decoding and no DataLoader worker start-up in the hot loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedmedbench.data.store import open_client, read_split_csv


@dataclass
class SplitData:
    images: np.ndarray  # memmap, N x H x W x C uint8 (whole client)
    labels: np.ndarray  # memmap, N x H x W uint8 or N int64
    rows: np.ndarray  # rows of this split, in split-file order
    groups: np.ndarray  # case / patient id per row (for per-case metrics)

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class ClientSplits:
    name: str
    train: SplitData
    val: SplitData
    test: SplitData


def load_clients(store_dir: Path, split_csv: Path, clients: list[str], truncate_to_smallest: bool) -> list[ClientSplits]:
    """Open every client's arrays and cut them by the split file.

    ``truncate_to_smallest`` is HarmoFL's default: every client trains on the first n_min rows of its
    (permuted) train split, n_min being the smallest client's train size.
    """
    split = read_split_csv(split_csv)
    result = []
    for name in clients:
        arrays = open_client(store_dir, name)
        parts = {}
        for part in ("train", "val", "test"):
            rows_df = split[(split["client"] == name) & (split["split"] == part)]
            if rows_df.empty:
                raise ValueError(f"{split_csv}: client {name!r} has no {part!r} rows")
            rows = rows_df["row"].to_numpy(dtype=np.int64)
            if rows.max() >= len(arrays.images):
                raise ValueError(f"{split_csv}: row {rows.max()} out of range for client {name!r} ({len(arrays.images)} samples)")
            parts[part] = SplitData(arrays.images, arrays.labels, rows, rows_df["group"].astype(str).to_numpy())
        result.append(ClientSplits(name, parts["train"], parts["val"], parts["test"]))
    if truncate_to_smallest:
        smallest = min(len(client.train) for client in result)
        for client in result:
            train = client.train
            client.train = SplitData(train.images, train.labels, train.rows[:smallest], train.groups[:smallest])
    return result


def to_tensors(split: SplitData, rows_idx: np.ndarray, intensity_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    rows = split.rows[rows_idx]
    order = np.argsort(rows, kind="stable")  # memmaps read fastest in increasing order
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    images = np.asarray(split.images[rows[order]])[inverse]
    labels = np.asarray(split.labels[rows[order]])[inverse]
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    if intensity_scale != 1.0:
        x = x * intensity_scale
    return x, torch.from_numpy(labels.astype(np.int64))


def augment_harmofl(x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """HarmoFL's prostate augmentation: rot90 by k ~ U{0..4} (k = 4 is the identity again, so no
    rotation has probability 2/5) and, with probability 0.75, a flip along H, W or both."""
    xs, ys = [], []
    for xi, yi in zip(x, y):
        k = int(torch.randint(0, 5, (1,), generator=generator))
        xi, yi = torch.rot90(xi, k, dims=(1, 2)), torch.rot90(yi, k, dims=(0, 1))
        if float(torch.rand(1, generator=generator)) < 0.75:
            direction = int(torch.randint(0, 3, (1,), generator=generator))
            dims = [(1,), (2,), (1, 2)][direction]
            xi, yi = torch.flip(xi, dims), torch.flip(yi, tuple(d - 1 for d in dims))
        xs.append(xi)
        ys.append(yi)
    return torch.stack(xs), torch.stack(ys)


AUGMENTATIONS = {"none": None, "harmofl": augment_harmofl}


def train_batches(split: SplitData, batch_size: int, generator: torch.Generator, augment: str, intensity_scale: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One shuffled epoch (last partial batch kept, as torch's DataLoader does by default)."""
    augment_fn = AUGMENTATIONS[augment]
    order = torch.randperm(len(split), generator=generator).numpy()
    for start in range(0, len(order), batch_size):
        x, y = to_tensors(split, order[start : start + batch_size], intensity_scale)
        if augment_fn is not None:
            x, y = augment_fn(x, y, generator)
        yield x, y


def eval_batches(split: SplitData, batch_size: int, intensity_scale: float) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
    for start in range(0, len(split), batch_size):
        idx = np.arange(start, min(start + batch_size, len(split)))
        x, y = to_tensors(split, idx, intensity_scale)
        yield x, y, split.groups[idx]
