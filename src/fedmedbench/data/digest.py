"""Digests of the files a job reads, for Snakemake's view of the job (its params): an edit of any
of them re-runs exactly the jobs that read it, and nothing else.

- ``listing_digest(root)``: the relative name, size and content of every file under a user's data
  root (``family: folders``), folders behind symbolic links followed as preprocessing follows them,
  leaving out exactly what the reader leaves out (``skipped``: hidden files and folders such as
  ``.DS_Store`` and ``.git/``, ``__MACOSX/``, the pipeline's own results folder).
  Content, not modification times: files unpacked from one archive share one time, and swapping two
  same-size masks (fixing swapped labels) keeps every name, size and time. Each file's content hash
  is kept in a cache file beside the results, keyed by the file's identity (device, inode, size,
  modification and change time), so a DAG build re-reads only the files that changed since the last.
- ``file_digest(path)``: the content of a small file (a ``split_csv``, a paper table).
- ``file_stamp(path)``: the resolved path, size and modification time of a big file (a downloaded
  archive): hashing a 10 GB archive at every DAG build would take minutes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from stat import S_ISREG

from ..files import atomic_write_text
from .skipped import skipped

# A file whose modification or change time is this close to the moment it was hashed is not kept in
# the cache: the file system stamps times from a coarse clock, so a second edit within the same tick
# would keep every time the cache compares (git's "racy" files). Such a file is hashed again next time.
RACY_SECONDS = 2
CACHE_VERSION = 1


def _loop_error(link: str, target: str):
    from .folders.options import FoldersDataError  # noqa: PLC0415  (error path only: fedmedbench.data.folders costs 35-350 ms (numpy, pandas); the DAG hashes through here)

    return FoldersDataError(
        f"{link}: a symbolic link loop (it leads back to {target}, a folder that contains it); remove the link or point it at a folder outside"
    )


def _content_hash(path: str) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class _HashCache:
    """Content hashes by relative name, each valid while the file keeps its identity and times. The
    change time (ctime) is in the key because no user tool can set it back: a file rewritten in place
    with its modification time restored still has a new ctime; a file renamed into place has another
    inode. A cache that cannot be read is started afresh, one that cannot be written is skipped:
    it only saves time, it never decides a digest."""

    def __init__(self, path: str | os.PathLike | None, root: str):
        self.path, self.root = (Path(path) if path else None), root
        self.old: dict[str, list] | None = None  # None: no usable cache file, one is written
        self.new: dict[str, list] = {}
        self.started = time.time_ns()
        if self.path is None:
            return
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if (
            isinstance(saved, dict)
            and saved.get("version") == CACHE_VERSION
            and saved.get("root") == root
            and isinstance(saved.get("files"), dict)
        ):
            self.old = saved["files"]

    def content(self, name: str, path: str, stat: os.stat_result) -> str:
        key = [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
        entry = (self.old or {}).get(name)
        if isinstance(entry, list) and entry[:-1] == key:
            content = entry[-1]
        else:
            content = _content_hash(path)
        if max(stat.st_mtime_ns, stat.st_ctime_ns) < self.started - RACY_SECONDS * 10**9:
            self.new[name] = [*key, content]
        return content

    def save(self) -> None:
        if self.path is None or self.new == self.old:
            return  # an unchanged tree writes nothing
        try:  # a temporary beside it, renamed: concurrent DAG builds never see half a file
            atomic_write_text(self.path, json.dumps({"version": CACHE_VERSION, "root": self.root, "files": self.new}))
        except OSError:
            pass


def _encoded(line: str) -> bytes:
    """A listing line as bytes; a file name that is not valid UTF-8 (undecodable bytes kept by
    ``os.fsdecode`` as surrogates) goes in as its raw bytes instead of failing the DAG build. The
    reader names such a file when it reads it."""
    return line.encode("utf-8", "surrogateescape")


def _walk(
    folder: str, relative: str, ancestors: frozenset[str], skip: set[tuple[int, int]], digest, cache: _HashCache
) -> None:
    """Files first (sorted), then each sub-folder (sorted, depth first): the order of ``os.walk``
    with sorted names."""
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as err:
        from .folders.options import FoldersDataError  # noqa: PLC0415  (error path only; see _loop_error)

        raise FoldersDataError(f"{folder}: cannot list the folder ({err.strerror})") from None
    folders = []
    for entry in entries:
        if skipped(entry.path):  # what the reader skips (hidden, __MACOSX, the run's results) changes no job
            continue
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
            digest.update(_encoded(f"{name}\0broken link\0{target}\n"))
            continue
        if (stat.st_dev, stat.st_ino) in skip:
            continue
        if not S_ISREG(stat.st_mode):  # a pipe or a device: reading it could block; preprocessing reads none
            digest.update(_encoded(f"{name}\0not a file\0{stat.st_mode:o}\n"))
            continue
        try:
            content = cache.content(name, entry.path, stat)
        except OSError as err:
            from .folders.options import FoldersDataError  # noqa: PLC0415  (error path only; see _loop_error)

            raise FoldersDataError(f"{entry.path}: cannot read the file ({err.strerror})") from None
        digest.update(_encoded(f"{name}\0{stat.st_size}\0{content}\n"))
    for entry in folders:
        real = os.path.realpath(entry.path)
        if real in ancestors:
            raise _loop_error(entry.path, real)
        _walk(entry.path, relative + entry.name + os.sep, ancestors | {real}, skip, digest, cache)


def listing_digest(
    root: str | os.PathLike, exclude: Iterable[str | os.PathLike] = (), cache: str | os.PathLike | None = None
) -> str:
    """A digest of the files under ``root`` (relative names, sizes, contents), so Snakemake re-runs
    preprocessing exactly when the user's data change, and not when only their times do.

    ``cache``: a JSON file (outside ``root``, written atomically) that keeps each file's content hash
    while the file keeps its device, inode, size, modification and change time: an unchanged tree is
    listed, not read. Without it every file is read.

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
    real_root = os.path.realpath(root)
    hashes = _HashCache(cache, real_root)
    _walk(str(root), "", frozenset({real_root}), skip, digest, hashes)
    hashes.save()
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
