"""Cheap digests of the files a job reads, for Snakemake's view of the job (its params): an edit of any
of them re-runs exactly the jobs that read it, and nothing else.

- ``listing_digest(root)``: the relative name, size and modification time of every file under a user's
  data root (``family: folders``), folders behind symbolic links followed as preprocessing follows
  them. No file is read, so it stays fast on a large dataset.
- ``file_digest(path)``: the content of a small file (a ``split_csv``, a paper table).
- ``file_stamp(path)``: the resolved path, size and modification time of a big file (a downloaded
  archive): hashing a 10 GB archive at every DAG build would take minutes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path


def _loop_error(link: str, target: str):
    from .folders.options import FoldersDataError  # here, not at the top: the DAG imports this module, numpy-free

    return FoldersDataError(f"{link}: a symbolic link loop (it leads back to {target}, a folder that contains it); remove the link or point it at a folder outside")


def _walk(folder: str, relative: str, ancestors: frozenset[str], skip: set[tuple[int, int]], digest) -> None:
    """Files first (sorted), then each sub-folder (sorted, depth first): the order of ``os.walk``
    with sorted names, so a tree without links digests as it always did."""
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as err:
        from .folders.options import FoldersDataError

        raise FoldersDataError(f"{folder}: cannot list the folder ({err.strerror})") from None
    folders = []
    for entry in entries:
        try:
            is_folder = entry.is_dir()  # follows a link, as preprocessing does
        except OSError:
            is_folder = False
        if is_folder:
            folders.append(entry)
            continue
        name = relative + entry.name
        try:
            stat = os.stat(entry.path)
        except OSError:  # a broken link: its target is part of what preprocessing would see
            target = os.readlink(entry.path) if os.path.islink(entry.path) else "unreadable"
            digest.update(f"{name}\0broken link\0{target}\n".encode())
            continue
        if (stat.st_dev, stat.st_ino) in skip:
            continue
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    for entry in folders:
        real = os.path.realpath(entry.path)
        if real in ancestors:
            raise _loop_error(entry.path, real)
        _walk(entry.path, relative + entry.name + os.sep, ancestors | {real}, skip, digest)


def listing_digest(root: str | os.PathLike, exclude: Iterable[str | os.PathLike] = ()) -> str:
    """A digest of the files under ``root`` (relative names, sizes, modification times): cheap (no
    file is read), so Snakemake can re-run preprocessing exactly when the user's data change.

    A folder that is a symbolic link (a site kept on another disk) is followed like any folder, with
    a guard: a link that leads back to a folder containing it is refused (``FoldersDataError`` naming
    the link). A broken link counts by its target. Files in ``exclude`` (the ``split_csv``, which only
    the split reads) are left out, so editing them does not re-run preprocessing."""
    digest = hashlib.sha256()
    root = Path(root)
    if not root.is_dir():
        return "missing"
    skip = set()
    for path in exclude:
        try:
            stat = os.stat(path)
        except OSError:
            continue
        skip.add((stat.st_dev, stat.st_ino))
    _walk(str(root), "", frozenset({os.path.realpath(root)}), skip, digest)
    return digest.hexdigest()[:16]


def file_digest(path: str | os.PathLike) -> str:
    """The content of a small file, hashed; ``missing`` when there is none (the job that reads it
    then names it)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return "missing"


def file_stamp(path: str | os.PathLike) -> str:
    """``<resolved path> <size> <mtime in ns>`` of a big file (never read), ``missing <path>`` when
    there is none. Replacing the file, or pointing the option at another one, changes it."""
    try:
        stat = os.stat(path)
    except OSError:
        return f"missing {path}"
    return f"{os.path.realpath(path)} {stat.st_size} {stat.st_mtime_ns}"
