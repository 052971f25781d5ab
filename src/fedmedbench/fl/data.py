"""Client datasets for training: memory-mapped canonical store + split CSV, read in batches.

A batch is gathered with one fancy index into the memory-mapped uint8 array, so there is no
per-image file decoding and no DataLoader worker start-up in the hot loop. By default the training
thread gathers each batch itself; with ``data_workers`` > 0 (a GPU job) a ``BatchReader`` gathers
the next batches on worker threads while the device computes, and hands them over in order.
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedmedbench.config import model_size_problem
from fedmedbench.data.store import open_client, random_pixels, read_split_csv, store_info
from fedmedbench.errors import ConfigError, DataError


@dataclass
class SplitData:
    images: np.ndarray  # memmap, N x H x W x C uint8 (whole client)
    labels: np.ndarray  # memmap, N x H x W uint8 or N int64
    rows: np.ndarray  # rows of this split, in split-file order
    groups: np.ndarray  # case / patient id per row (for per-case metrics)
    reader: BatchReader | None = None  # worker threads that gather batches ahead (None: the caller gathers)

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class ClientSplits:
    name: str
    train: SplitData
    val: SplitData
    test: SplitData


def load_clients(
    store_dir: Path, split_csv: Path, clients: list[str], truncate_to_smallest: bool, reader: BatchReader | None = None
) -> list[ClientSplits]:
    """Open every client's arrays and cut them by the split file.

    ``truncate_to_smallest`` is HarmoFL's default: every client trains on the first n_min rows of its
    (permuted) train split, n_min being the smallest client's train size. ``reader``: the worker
    threads that gather every split's batches (None: the training thread gathers them).
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
                raise ValueError(
                    f"{split_csv}: row {rows.max()} out of range for client {name!r} ({len(arrays.images)} samples)"
                )
            parts[part] = SplitData(arrays.images, arrays.labels, rows, rows_df["group"].astype(str).to_numpy(), reader)
        result.append(ClientSplits(name, parts["train"], parts["val"], parts["test"]))
    if truncate_to_smallest:
        smallest = min(len(client.train) for client in result)
        for client in result:
            train = client.train
            client.train = SplitData(
                train.images, train.labels, train.rows[:smallest], train.groups[:smallest], train.reader
            )
    return result


def check_image_size(clients: list[ClientSplits], model, store_dir: Path) -> None:
    """Before the first step: the store's images must fit the model (a UNet needs sides divisible
    by 16), else one ``ConfigError`` naming the store, the client and the sizes that would fit, not
    a tensor-shape traceback in round 1. The DAG checks the configured size already; this catches a
    store built by hand or at a native size that the DAG could not read."""
    for client in clients:
        height, width = client.train.images.shape[1:3]
        problem = model_size_problem(model, int(height), int(width))
        if problem:
            raise ConfigError(
                f"{store_dir}: the images of client {client.name} are {height}x{width} (H x W): {problem}; "
                "preprocess the data at a size that fits (image_size)"
            )


def load_test_only(
    store_dir: Path, split_csv: Path, clients: list[str], reader: BatchReader | None = None
) -> dict[str, SplitData]:
    """The test rows of clients that only have test data (skin's OOD cohort), by name."""
    split = read_split_csv(split_csv)
    result = {}
    for name in clients:
        rows_df = split[(split["client"] == name) & (split["split"] == "test")]
        if rows_df.empty:
            raise ValueError(f"{split_csv}: test-only client {name!r} has no 'test' rows")
        arrays = open_client(store_dir, name)
        result[name] = SplitData(
            arrays.images,
            arrays.labels,
            rows_df["row"].to_numpy(dtype=np.int64),
            rows_df["group"].astype(str).to_numpy(),
            reader,
        )
    return result


# A store is sampled at this many evenly spaced places per array file for the digest (plus its
# header, size and meta.csv): a rebuild at another size, seed or preprocessing changes them, while a
# job's start stays cheap for a 10 GB store.
DIGEST_SAMPLES = 64
DIGEST_CHUNK = 4096


def data_digest(store_dir: Path, split_csv: Path, clients: list[str]) -> str:
    """A digest of what a run reads: the split file's bytes and, per client, ``meta.csv``, the
    arrays' headers (shape, dtype) and sizes and evenly spaced samples of their bytes. A checkpoint
    records it, so a job never resumes onto data rebuilt since (another image size, split seed...)."""
    digest = hashlib.sha256(Path(split_csv).read_bytes())
    for name in clients:
        folder = Path(store_dir) / name
        digest.update(name.encode() + (folder / "meta.csv").read_bytes())
        for array_file in ("images.npy", "labels.npy"):
            path = folder / array_file
            size = path.stat().st_size
            digest.update(f"{array_file}:{size}".encode())
            with open(path, "rb") as handle:
                for offset in sorted(
                    {0, *(size * i // DIGEST_SAMPLES for i in range(1, DIGEST_SAMPLES)), max(0, size - DIGEST_CHUNK)}
                ):
                    handle.seek(offset)
                    digest.update(handle.read(DIGEST_CHUNK))
    return digest.hexdigest()[:16]


def gather(split: SplitData, rows_idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch as stored: uint8 images (B, C, H, W; a permuted view of the NHWC store) and int64
    labels. Batches travel to the device as uint8 (4x less to copy) and become floats there."""
    rows = split.rows[rows_idx]
    order = np.argsort(rows, kind="stable")  # memmaps read fastest in increasing order
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    images = np.asarray(split.images[rows[order]])[inverse]
    labels = np.asarray(split.labels[rows[order]])[inverse]
    return torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels.astype(np.int64))


class BatchReader:
    """Gathers batches on ``workers`` threads, up to ``ahead`` batches ahead of the consumer, and
    hands them over in the order asked for.

    Threads, not processes: gathering a batch is one fancy index into a memory map, a copy and page
    faults during which numpy releases the GIL, so threads read in parallel with no process start-up,
    no pickling and no second copy through shared memory. Workers only read: every random draw (an
    epoch's permutation, the augmentation) stays with the consumer and the client's generator, so
    the batches, their order and every random stream are exactly those of reading without workers.
    For a CUDA device the workers also copy each batch into pinned memory (the host side of the
    non-blocking host-to-device copy). The threads start on the first read and end with the reader.
    """

    def __init__(self, workers: int, ahead: int | None = None):
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"data_workers: a BatchReader needs at least 1 worker thread, got {workers!r}")
        self.workers = workers
        self.ahead = ahead if ahead is not None else 2 * workers
        if self.ahead < 1:
            raise ValueError(f"BatchReader: ahead must be >= 1, got {self.ahead}")
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="fedmedbench-reader")
        return self._pool

    @staticmethod
    def _read(split: SplitData, rows_idx: np.ndarray, pin: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = gather(split, rows_idx)
        return (x.pin_memory(), y.pin_memory()) if pin else (x, y)

    def read(
        self, split: SplitData, chunks: Iterable[np.ndarray], pin: bool = False
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``gather(split, chunk)`` for every chunk, in order, read ahead on the worker threads.
        A consumer that stops early cancels what is queued (a batch being read is simply dropped)."""
        pool, chunks = self._executor(), iter(chunks)
        pending: collections.deque[Future] = collections.deque()

        def queue_next() -> None:
            chunk = next(chunks, None)
            if chunk is not None:
                pending.append(pool.submit(self._read, split, chunk, pin))

        for _ in range(self.ahead):
            queue_next()
        try:
            while pending:
                batch = pending.popleft().result()
                queue_next()
                yield batch
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def to_float(x: torch.Tensor, intensity_scale: float) -> torch.Tensor:
    x = x.float()
    return x * intensity_scale if intensity_scale != 1.0 else x


def to_tensors(split: SplitData, rows_idx: np.ndarray, intensity_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A float batch on the CPU (for code outside the training loop)."""
    x, y = gather(split, rows_idx)
    return to_float(x, intensity_scale), y


def augment_harmofl(x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """HarmoFL's prostate augmentation, per sample: rot90 by k ~ U{0..4} (k = 4 is the identity
    again, so no rotation has probability 2/5) and, with probability 0.75, a flip along H, W or both.

    Vectorised on the batch's device: all random draws for the batch at once from the client's CPU
    generator (no device sync), then one rot90/flip per distinct (k, flip) combination present (at
    most 16), never a loop over samples. Works on uint8 or float batches alike (pure permutations).
    """
    count = x.shape[0]
    k = torch.randint(0, 5, (count,), generator=generator) % 4
    flip = torch.rand(count, generator=generator) < 0.75
    direction = torch.randint(0, 3, (count,), generator=generator)
    combo = k * 4 + torch.where(flip, direction + 1, torch.zeros_like(direction))
    out_x, out_y = torch.empty_like(x), torch.empty_like(y)
    for code in combo.unique().tolist():
        rotations, flip_code = divmod(code, 4)
        index = (combo == code).nonzero().squeeze(1).to(x.device)
        xi, yi = torch.rot90(x[index], rotations, dims=(2, 3)), torch.rot90(y[index], rotations, dims=(1, 2))
        if flip_code:
            dims = [(2,), (3,), (2, 3)][flip_code - 1]
            xi, yi = torch.flip(xi, dims), torch.flip(yi, tuple(d - 1 for d in dims))
        out_x[index], out_y[index] = xi, yi
    return out_x, out_y


def augment_flip_rotate(
    x: torch.Tensor, y: torch.Tensor, generator: torch.Generator, max_degrees: float = 15.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random flips and rotations of a classification batch (PRR-FL: "random flip and rotation";
    its code: albumentations H/V flips and ShiftScaleRotate up to 15 degrees): per sample a
    horizontal and a vertical flip with probability 0.5 each and a rotation by U(-15, 15) degrees
    about the centre (bilinear, reflected border). All draws at once from the client's CPU
    generator; one batched ``grid_sample`` on the batch's device. Returns a float batch."""
    count = x.shape[0]
    flip_w = torch.rand(count, generator=generator) < 0.5
    flip_h = torch.rand(count, generator=generator) < 0.5
    angle = (torch.rand(count, generator=generator) * 2 - 1) * math.radians(max_degrees)
    cos, sin = torch.cos(angle), torch.sin(angle)
    sx, sy = 1.0 - 2.0 * flip_w.float(), 1.0 - 2.0 * flip_h.float()
    # The sampling grid maps output to input coordinates: rotation composed with the flips.
    theta = torch.stack(
        [
            torch.stack([cos * sx, -sin * sy, torch.zeros(count)], 1),
            torch.stack([sin * sx, cos * sy, torch.zeros(count)], 1),
        ],
        1,
    )
    xf = x.float()
    grid = F.affine_grid(theta.to(xf.device), list(xf.shape), align_corners=False)
    return F.grid_sample(xf, grid, mode="bilinear", padding_mode="reflection", align_corners=False), y


AUGMENTATIONS = {"none": None, "harmofl": augment_harmofl, "flip_rotate": augment_flip_rotate}


class _Prefetcher:
    """Host -> device copies of the next batch while the current one computes (CUDA: pinned memory,
    non-blocking copies on a side stream); on the CPU a plain pass-through."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def send(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.stream is None:
            return tuple(t.to(self.device) for t in tensors)
        with torch.cuda.stream(self.stream):
            return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in tensors)

    def ready(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if self.stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            for t in tensors:
                t.record_stream(current)  # the caching allocator must not reuse it before compute is done
        return tensors


def _batches(
    split: SplitData, starts: list[np.ndarray], device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """uint8 batches on ``device``, the next one already on its way while the current is used
    (gathered by the split's reader threads when it has a reader, else here, one at a time)."""
    prefetch = _Prefetcher(device)
    if split.reader is not None:
        gathered = split.reader.read(split, starts, pin=prefetch.stream is not None)
    else:
        gathered = (gather(split, rows_idx) for rows_idx in starts)
    pending = None
    for batch in gathered:
        sent = prefetch.send(*batch)
        if pending is not None:
            yield prefetch.ready(pending)
        pending = sent
    if pending is not None:
        yield prefetch.ready(pending)


def train_batches(
    split: SplitData,
    batch_size: int,
    generator: torch.Generator,
    augment: str,
    intensity_scale: float,
    device: torch.device | None = None,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One shuffled epoch on ``device`` (last partial batch kept, as torch's DataLoader does by
    default; ``drop_last``: dropped, as the official Fed-LWR RIF loader): uint8 to the device,
    augmented and converted to float there."""
    augment_fn = AUGMENTATIONS[augment]
    order = torch.randperm(len(split), generator=generator).numpy()
    end = len(order) - len(order) % batch_size if drop_last and len(order) >= batch_size else len(order)
    chunks = [order[start : start + batch_size] for start in range(0, end, batch_size)]
    for x, y in _batches(split, chunks, device or torch.device("cpu")):
        if augment_fn is not None:
            x, y = augment_fn(x, y, generator)
        yield to_float(x, intensity_scale), y


def eval_batches(
    split: SplitData, batch_size: int, intensity_scale: float, device: torch.device | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
    chunks = [np.arange(start, min(start + batch_size, len(split))) for start in range(0, len(split), batch_size)]
    for (x, y), idx in zip(_batches(split, chunks, device or torch.device("cpu")), chunks):
        yield to_float(x, intensity_scale), y, split.groups[idx]


def refuse_random_pixels(run_cfg: dict) -> None:
    """Before a training run opens its store: a store of random pixels (one made to time jobs,
    ``benchmarks/paper_shaped_stores.py``) is refused unless the run's data are marked synthetic, so
    a store left where the real data belong never turns into a table of results. ``DataError``,
    one line naming the store and what to do. (A run config without a store is left to the
    run's own validation, which names the missing key.)"""
    data = run_cfg.get("data") if isinstance(run_cfg, dict) else None
    if not isinstance(data, dict) or not data.get("store") or data.get("synthetic"):
        return
    store = Path(data["store"])
    if random_pixels(store):
        made_by = store_info(store).get("made_by") or "a benchmark"
        raise DataError(
            f"{store}: its pixels are random (info.json: written by {made_by} to time jobs) and this run's data are not marked synthetic: "
            f"training on it would report noise as results; remove {store.parent} and run the workflow to build the store from the real data, "
            "or time jobs with `fedmedbench estimate`"
        )
