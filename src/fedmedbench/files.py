"""Atomic file and folder writes with ordinary permissions.

Every output is written to a temporary name beside its destination and renamed into place, so a
killed job never leaves half a file. ``tempfile`` creates those temporaries with mode 0600 (0700 for
folders); outputs get the mode a plain ``open()`` would give (0666 / 0777 minus the process umask),
so group members on a shared cluster can read results and logs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedmedbench.errors import DiskFullError


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it
    os.umask(mask)
    return mask


def public_mode(path: str | os.PathLike) -> None:
    """Give a file or folder made by ``tempfile`` the permissions ``open()``/``mkdir()`` would."""
    base = 0o777 if Path(path).is_dir() else 0o666
    os.chmod(path, base & ~_umask())


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", **open_kwargs) -> Iterator:
    """``with atomic_file(p) as handle:`` write to ``handle``; on success it is fsynced and renamed
    to ``p``; on any exception the temporary file is removed and ``p`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        public_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """For writers that want a file name rather than a handle (zipfile, savefig): yields a temporary
    path beside ``path`` (ending in ``suffix``, so format detection still works), renamed on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        public_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# A full disk and a full quota: the errors that name neither the file nor the space it needed.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _bytes(n: int) -> str:
    """``3,968 bytes``; ``4,294,967,424 bytes (4.0 GiB)`` from a MiB on."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n:,} bytes ({n / size:,.1f} {unit})"
    return f"{n:,} bytes"


@contextmanager
def naming_full_disk(path: str | os.PathLike, needed: int) -> Iterator[None]:
    """A full disk while the block writes ``path`` (``needed`` bytes) is one DiskFullError naming the
    file, the bytes it needs and the bytes free, instead of an OSError that names neither."""
    try:
        yield
    except OSError as err:
        if err.errno not in DISK_FULL:
            raise
        # The free space of the disk it goes to: its nearest folder that exists (a folder being staged may not yet).
        folder = next((p for p in Path(path).absolute().parents if p.is_dir()), Path("/"))
        try:
            free = f"{_bytes(shutil.disk_usage(folder).free)} are free there"
        except OSError:
            free = "the free space there is unknown"
        full = DiskFullError(
            f"{path}: {os.strerror(err.errno).lower()} while writing it: it needs {_bytes(needed)} and {free}; "
            f"free some space on that disk or put results_dir on a larger one, then run the same command again"
        )
        full.errno = err.errno
        raise full from err


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    # newline="" keeps "\n" as written: outputs are byte-identical across platforms.
    with (
        naming_full_disk(path, len(text.encode(encoding))),
        atomic_file(path, "w", encoding=encoding, newline="") as handle,
    ):
        handle.write(text)
    return Path(path)


@contextmanager
def new_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Create ``folder`` (and missing parents); if the block fails, remove again those of them that
    are still empty, so a failed step leaves no empty output folders behind."""
    folder = Path(folder)
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        for path in created:
            try:
                path.rmdir()
            except OSError:  # not empty (or gone): keep it and everything above it
                break
        raise


def try_flock(path: Path):
    """``path`` opened and exclusively ``flock``ed (the kernel frees it however the holder ends), or
    None when another process holds it. Opened for appending: never truncates an existing file."""
    handle = open(path, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle
