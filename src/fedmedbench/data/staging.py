"""Temporaries beside a data output, and the removal of those a killed step left behind.

Every data output (downloaded archive, extracted folder, store, split file) is written under a
temporary name beside it and renamed into place. A step killed with SIGKILL (OOM killer, SLURM time
limit, ``scancel``) cannot clean up, so its temporaries (GBs for an extracted Camelyon17) stay. When
the step starts again, ``remove_stale`` deletes the temporaries **of that very output** and nothing
else: only names that ``tempfile`` gives the output ``<name>`` in the same folder::

    .<name>.tmp-XXXXXXXX   staging folder (``staging_folder``: extraction, stores)
    .<name>.old-XXXXXXXX   the previous version moved aside while the new one is renamed in
    .<name>.XXXXXXXX.tmp   temporary file (``fedmedbench.files.atomic_file`` / ``atomic_path``)

Snakemake runs one job per output, so a temporary found at the start of a step is normally stale.
Writers also hold an exclusive ``flock`` on their temporary while they work (the kernel drops it when
the process dies), and a locked temporary is left alone: a second, concurrent run by hand does not
delete the first one's work. On a file system without ``flock`` the first rule is all there is.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..files import atomic_file, public_mode

try:
    import fcntl
except ImportError:  # not POSIX: no locks, stale temporaries are still removed
    fcntl = None

__all__ = ["remove_stale", "staging_folder", "locked_atomic_file", "hold_lock", "cleaned_up_on_sigterm"]

_log = logging.getLogger("fedmedbench.data")
# tempfile's random part: 8 characters of [a-z0-9_] (tempfile._RandomNameSequence).
_RANDOM = "[a-z0-9_]{8}"


def _stale_pattern(name: str) -> re.Pattern:
    n = re.escape(name)
    return re.compile(rf"^\.{n}\.(?:tmp|old)-{_RANDOM}$|^\.{n}\.{_RANDOM}\.tmp$")


def hold_lock(fd: int) -> None:
    """Take an exclusive lock on ``fd`` (released when it is closed or the process dies): the mark
    of a temporary that a live writer still works on. Without ``flock`` support, nothing."""
    if fcntl is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # no flock here (some network file systems): fall back to one writer per output


def _in_use(path: Path) -> bool:
    """True if a live process holds the lock of ``path``."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # no flock here: a step that starts again owns its output
    finally:
        os.close(fd)  # also releases the lock we may just have taken
    return False


def remove_stale(final: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of ``final`` left by a killed run (see the module docstring); returns
    what was removed. Anything else in the folder, even a similar name, is left alone."""
    final = Path(final)
    pattern = _stale_pattern(final.name)
    try:
        names = sorted(os.listdir(final.parent))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for name in names:
        if not pattern.match(name):
            continue
        path = final.parent / name
        if _in_use(path):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        _log.info("removed %s, left by an interrupted run", path)
        removed.append(path)
    return removed


@contextmanager
def staging_folder(final: str | os.PathLike) -> Iterator[Path]:
    """Remove the stale temporaries of ``final``, then yield a new empty folder
    ``.<name>.tmp-XXXXXXXX`` beside it, locked until the block ends. The caller renames it onto
    ``final`` inside the block (the lock follows the folder) or removes it."""
    final = Path(final)
    remove_stale(final)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    public_mode(tmp)  # mkdtemp makes it 0700; outputs are for the whole group
    fd = os.open(tmp, os.O_RDONLY)
    try:
        hold_lock(fd)
        yield tmp
    finally:
        os.close(fd)


@contextmanager
def locked_atomic_file(path: str | os.PathLike, mode: str = "wb", **open_kwargs) -> Iterator:
    """``fedmedbench.files.atomic_file`` that first removes the stale temporaries of ``path`` and
    locks its own while it is written."""
    remove_stale(path)
    with atomic_file(path, mode, **open_kwargs) as handle:
        hold_lock(handle.fileno())
        yield handle


@contextmanager
def cleaned_up_on_sigterm(step: str) -> Iterator[None]:
    """SIGTERM (Snakemake stopping its jobs, ``kill``, SLURM before its SIGKILL) ends the block as
    Ctrl-C would: by an exception (SystemExit 143), so every staging folder and temporary file is
    removed on the way out by the block that made it. Python's default ends the process at once,
    which left them until the step ran again. A second SIGTERM during that cleanup is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except SystemExit as stopped:
        if stopped.code == 128 + signal.SIGTERM:
            _log.warning("%s: stopped by SIGTERM; its temporary files and folders were removed", step)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
