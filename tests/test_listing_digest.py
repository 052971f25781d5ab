"""The listing digest of a user's data root sees content: a change that keeps every file's size and
modification time (two same-size masks swapped, as when fixing swapped labels in data unpacked from
an archive, where every file has the same time) changes it; an unchanged tree is not read again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedmedbench.data import digest
from fedmedbench.data.digest import listing_digest
from fedmedbench.data.folders import write_example


def same_size_masks(data: Path, site: str = "siteA") -> list[Path]:
    """The site's masks saved without compression: every mask of a size has the same byte count."""
    masks = sorted((data / site / "masks").iterdir())
    for mask in masks:
        Image.open(mask).save(mask, compress_level=0)
    assert len({m.stat().st_size for m in masks}) == 1
    return masks


def one_time(paths: list[Path], ns: int = 1_600_000_000 * 10**9) -> None:
    """Every file the same modification time, as files unpacked from one archive."""
    for path in paths:
        os.utime(path, ns=(ns, ns))


def swap_by_rename(a: Path, b: Path) -> None:
    spare = a.with_name(a.name + ".swap")
    os.rename(a, spare)
    os.rename(b, a)
    os.rename(spare, b)


def swap_in_place(a: Path, b: Path) -> None:
    """Contents exchanged inside the same files (same inodes), times put back: only ctime moves."""
    times = {p: p.stat() for p in (a, b)}
    content_a, content_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(content_b)
    b.write_bytes(content_a)
    for path, stat in times.items():
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def counting_reads(monkeypatch) -> list[str]:
    read = []
    real = digest._content_hash

    def counted(path):
        read.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(digest, "_content_hash", counted)
    return read


def test_swapped_masks_with_their_sizes_and_times_kept_change_the_digest(tmp_path):
    data = tmp_path / "data"
    write_example(data)
    a, b = same_size_masks(data)[:2]
    assert a.read_bytes() != b.read_bytes()
    one_time([p for p in data.rglob("*") if p.is_file()])
    cache = tmp_path / "cache" / "listing.json"
    before = listing_digest(data, cache=cache)

    swap_by_rename(a, b)  # new inodes at both names
    one_time([a, b])
    assert [(p.stat().st_size, p.stat().st_mtime_ns) for p in (a, b)] == [(a.stat().st_size, 1_600_000_000 * 10**9)] * 2
    swapped = listing_digest(data, cache=cache)
    assert swapped != before
    assert listing_digest(data) == swapped  # the same with or without a cache

    swap_by_rename(a, b)  # back: the same content, so the same digest
    one_time([a, b])
    assert listing_digest(data, cache=cache) == before

    swap_in_place(a, b)  # same inodes, sizes and times
    assert listing_digest(data, cache=cache) != before
    swap_in_place(a, b)
    assert listing_digest(data, cache=cache) == before


def test_an_unchanged_tree_is_not_read_again_and_a_new_time_alone_is_not_a_change(tmp_path, monkeypatch):
    # Setting a file's times sets its change time to now; the files are trusted to the cache at once
    # (as files older than the window in which a just-written file is hashed again would be).
    monkeypatch.setattr(digest, "RACY_SECONDS", 0)
    data = tmp_path / "data"
    write_example(data, counts=(2, 2, 2))  # 3 sites x 2 images x (image + mask) = 12 files
    old = 1_600_000_000 * 10**9
    one_time([p for p in data.rglob("*") if p.is_file()], old)
    cache = tmp_path / "results" / ".cache" / "listing" / "mysites.json"
    read = counting_reads(monkeypatch)

    first = listing_digest(data, cache=cache)
    assert len(read) == 12 and cache.is_file()
    assert not list(data.rglob("*.json")) and not list(data.rglob(".*"))  # nothing written into the data
    assert listing_digest(data, cache=cache) == first and len(read) == 12  # from the cache: no file read

    image = data / "siteB" / "images" / "siteB_001.png"
    os.utime(image, ns=(old + 10**9, old + 10**9))  # touched: a new time, the same content
    assert listing_digest(data, cache=cache) == first
    assert read[12:] == ["siteB_001.png"]  # only the touched file is read again

    pixels = np.asarray(Image.open(image))
    Image.fromarray(255 - pixels).save(image)
    assert listing_digest(data, cache=cache) != first


def test_a_damaged_cache_file_is_rebuilt_and_a_just_written_file_is_not_trusted_to_it(tmp_path, monkeypatch):
    data = tmp_path / "data"
    write_example(data, counts=(2, 2, 2))
    cache = tmp_path / "listing.json"
    expected = listing_digest(data)
    cache.write_text("{not json")
    assert listing_digest(data, cache=cache) == expected
    entries = json.loads(cache.read_text())["files"]
    # The files were written a moment ago: a change within the file system's time resolution could
    # keep their times, so they are hashed again next time rather than taken from the cache.
    assert entries == {}
    monkeypatch.setattr(digest, "RACY_SECONDS", 0)  # as if the window had passed
    assert listing_digest(data, cache=cache) == expected
    assert len(json.loads(cache.read_text())["files"]) == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "listing.json"]  # no temporary left beside it


def test_an_unreadable_file_is_named_and_a_pipe_is_not_read(tmp_path, monkeypatch):
    from fedmedbench.data.folders import FoldersDataError

    data = tmp_path / "data"
    write_example(data, counts=(2, 2, 2))
    before = listing_digest(data)
    os.mkfifo(data / "siteA" / "notes.fifo")  # opening it to read would wait for a writer forever
    assert listing_digest(data) != before

    def denied(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(digest, "_content_hash", denied)
    first = data / "siteA" / "images" / "siteA_000.png"
    with pytest.raises(FoldersDataError) as err:
        listing_digest(data)
    assert str(err.value) == f"{first}: cannot read the file (Permission denied)"
