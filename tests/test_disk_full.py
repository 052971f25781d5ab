"""A full disk while the store is written is one line naming the file, the bytes it needs and the
bytes free, not an OSError that names no file. The disk is filled by a write that raises
ENOSPC, as the kernel does."""

from __future__ import annotations

import errno
import os
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fedmedbench.data import store
from fedmedbench.errors import DiskFullError, FedmedbenchError


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def client_arrays(n=5, size=16):
    images = np.zeros((n, size, size, 3), np.uint8)
    labels = np.zeros((n, size, size), np.uint8)
    meta = pd.DataFrame(
        {"id": [f"A/{i}" for i in range(n)], "group": [f"A/{i}" for i in range(n)], "source": "synthetic"}
    )
    return images, labels, meta


@pytest.mark.parametrize(("full_at", "file"), [(0, "images.npy"), (1, "labels.npy")])
def test_a_full_disk_while_a_client_is_written_names_the_file_and_the_bytes(tmp_path, monkeypatch, full_at, file):
    images, labels, meta = client_arrays()
    real_save, calls = np.save, []

    def save(path, array, **kwargs):
        calls.append(path)
        if len(calls) - 1 == full_at:
            disk_full()
        real_save(path, array, **kwargs)

    monkeypatch.setattr(store.np, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: SimpleNamespace(free=2000))
    with pytest.raises(DiskFullError) as err:
        store.write_client(tmp_path / "store", "A", images, labels, meta)
    needed = (images if file == "images.npy" else labels).nbytes + 128  # the array and np.save's header
    message = str(err.value)
    assert message.startswith(
        f"{tmp_path / 'store' / 'A' / file}: no space left on device while writing it: it needs {needed:,} bytes "
        f"and 2,000 bytes are free there; free some space on that disk or put results_dir on a larger one"
    ), message
    assert (
        isinstance(err.value, FedmedbenchError) and isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
    )
    assert not (tmp_path / "store").exists()  # nothing half written is left: no client folder, no temporary


def test_a_full_disk_while_the_split_is_written_names_it(tmp_path, monkeypatch):
    split = pd.DataFrame({"client": ["A"], "split": ["train"], "row": [0], "id": ["A/0"], "group": ["A/0"]})
    text = split.to_csv(index=False, lineterminator="\n")
    monkeypatch.setattr(os, "fsync", disk_full)  # the data reach the disk at the fsync: ENOSPC there
    with pytest.raises(
        DiskFullError,
        match=re.escape(
            f"{tmp_path / 'split.csv'}: no space left on device while writing it: it needs {len(text):,} bytes"
        ),
    ):
        store.write_split_csv(split, tmp_path / "split.csv")
    assert list(tmp_path.iterdir()) == []


def test_preprocess_on_a_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    from fedmedbench import cli
    from fedmedbench.data import fundus as F
    from fedmedbench.data.archive import safe_extract

    [archive] = [spec.filename for spec in F.DOWNLOADS]
    F.write_synthetic(tmp_path / "zip", seed=0, train_per_domain=2, test_per_domain=1, size=16)
    raw = safe_extract(tmp_path / "zip" / archive, tmp_path / "raw")
    monkeypatch.setattr(store.np, "save", disk_full)
    monkeypatch.delenv("FEDMEDBENCH_JOBSERVER", raising=False)
    out = tmp_path / "run" / "store"
    assert (
        cli.main(
            [
                "preprocess",
                "fundus",
                "--protocol",
                "fedlwr",
                "--raw",
                f"{archive}={raw}",
                "--out",
                str(out),
                "--size",
                "16",
            ]
        )
        == 1
    )
    [line] = capsys.readouterr().err.strip().splitlines()
    assert re.search(
        rf"DiskFullError: {re.escape(str(out.parent))}/\.store\.tmp-\w{{8}}/\w+/images\.npy: no space left on device while writing it: it needs [\d,]+ bytes",
        line,
    ), line
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
