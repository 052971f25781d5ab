"""Reading batches on worker threads (``data_workers``) changes no number: the same batches in the
same order, the same augmentation random streams, the same final.json byte for byte."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

from fedmedbench.errors import ConfigError
from fedmedbench.fl import data as fldata
from fedmedbench.fl.data import BatchReader, SplitData, eval_batches, load_clients, train_batches
from fedmedbench.fl.engine import run_training
from tests.conftest import tiny_run_config, write_tiny_task


def split_of(n: int, size: int = 8, reader=None, seed: int = 0) -> SplitData:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, (n, size, size, 3), dtype=np.uint8)
    labels = rng.integers(0, 2, (n, size, size)).astype(np.uint8)
    rows = rng.permutation(n)[: n - 3]  # a split: some rows of the client, in file order
    return SplitData(images, labels, rows, np.array([f"case{i % 4}" for i in range(len(rows))]), reader)


@pytest.mark.parametrize("augment", ["harmofl", "flip_rotate", "none"])
def test_training_batches_and_the_generator_are_those_of_reading_in_the_training_thread(augment):
    plain, threaded = split_of(53), split_of(53, reader=BatchReader(3, ahead=2))
    gen_plain, gen_threaded = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _epoch in range(2):  # the second epoch starts from the generator the first one left
        a = list(train_batches(plain, 8, gen_plain, augment, 1 / 255))
        b = list(train_batches(threaded, 8, gen_threaded, augment, 1 / 255))
        assert [len(y) for _, y in a] == [8] * 6 + [2]
        assert len(a) == len(b)
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(gen_plain.get_state(), gen_threaded.get_state())  # workers draw nothing
    threaded.reader.close()


def test_evaluation_batches_are_those_of_reading_in_the_training_thread():
    plain, threaded = split_of(41), split_of(41, reader=BatchReader(2))
    a, b = list(eval_batches(plain, 16, 1.0)), list(eval_batches(threaded, 16, 1.0))
    assert [len(y) for _, y, _ in b] == [16, 16, 6]
    for (xa, ya, ga), (xb, yb, gb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and list(ga) == list(gb)
    threaded.reader.close()


def test_the_workers_do_the_reading(monkeypatch):
    """Not a silent fall-back to the training thread: every batch is gathered on a reader thread,
    at most ``ahead`` batches ahead of the consumer."""
    readers, original = [], fldata.gather
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def recording_gather(split, rows_idx):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        readers.append(threading.current_thread().name)
        return original(split, rows_idx)

    monkeypatch.setattr(fldata, "gather", recording_gather)
    reader = BatchReader(2, ahead=3)
    split = split_of(40, reader=reader)
    for _ in eval_batches(split, 4, 1.0):
        with lock:
            in_flight[0] -= 1
    reader.close()
    assert len(readers) == 10 and all(name.startswith("fedmedbench-reader") for name in readers)
    # `ahead` queued, plus the batch the prefetcher holds and the one it is taking over
    assert 2 <= most[0] <= 3 + 2


def test_a_consumer_that_stops_early_and_an_error_in_a_worker():
    reader = BatchReader(2)
    split = split_of(64, reader=reader)
    first = next(eval_batches(split, 4, 1.0))  # predict_samples stops after its first batches
    assert first[0].shape == (4, 3, 8, 8)
    broken = SplitData(split.images, split.labels, np.array([0, 1, 10**6]), np.array(["a", "b", "c"]), reader)
    with pytest.raises(IndexError):  # the worker's error reaches the consumer, at that batch
        list(eval_batches(broken, 1, 1.0))
    assert len(list(eval_batches(split, 4, 1.0))) == 16  # the reader still works afterwards
    reader.close()


def test_reader_and_setting_refuse_bad_worker_counts(tmp_path):
    with pytest.raises(ValueError, match="at least 1 worker"):
        BatchReader(0)
    store, split = write_tiny_task(tmp_path)
    with pytest.raises(ConfigError, match="data_workers: expected an integer >= 0, got -1"):
        run_training(
            tiny_run_config(store, split, rounds=1),
            tmp_path / "run",
            device="cpu",
            threads=1,
            progress=False,
            data_workers=-1,
        )
    assert not (tmp_path / "run").exists()


def test_load_clients_gives_every_split_the_reader(tmp_path):
    store, split = write_tiny_task(tmp_path)
    reader = BatchReader(1)
    clients = load_clients(store, split, ["A", "B", "C"], truncate_to_smallest=True, reader=reader)
    assert all(part.reader is reader for c in clients for part in (c.train, c.val, c.test))
    assert [len(c.train) for c in clients] == [4, 4, 4]  # truncation keeps the reader


@pytest.mark.parametrize("method", ["fedavg", "moon"])
def test_a_tiny_run_with_0_and_2_workers_writes_the_same_bytes(tmp_path, method):
    """The end-to-end proof: final.json and history.csv byte for byte, with HarmoFL's augmentation
    (a random stream per client) and, for MOON, the extra forwards of a second model."""
    store, split = write_tiny_task(tmp_path)
    cfg = tiny_run_config(store, split, method, rounds=3)
    out = {}
    for workers in (0, 2):
        run_training(cfg, tmp_path / f"w{workers}", device="cpu", threads=1, progress=False, data_workers=workers)
        out[workers] = {name: (tmp_path / f"w{workers}" / name).read_bytes() for name in ("final.json", "history.csv")}
    assert out[0] == out[2]
    assert "data_workers" not in json.loads(out[2]["final.json"])["config"]  # an execution setting, not the run's
