"""One writer per run folder: a training job holds an exclusive ``flock`` on ``<run>/.train.lock``
while it runs, so a ``train`` started by hand on a folder a Snakemake job (or another ``train``) is
writing stops at once, in one line, having touched nothing.

The lock is the kernel's, as for the GPU slots (fl/placement.py): it is freed whenever the holder
ends, SIGKILL and OOM included, so a killed job never leaves a folder locked; the file that stays
behind after such a kill is empty and means nothing (the next job takes it). A job that ends removes
it, so a finished run folder holds only the run's own files. The file is no Snakemake output and its
name matches none of the temporaries the engine cleans up (``.*.tmp``).

The holder writes who it is into the file (``pid <pid>: <what>``, e.g. ``federation local`` or a
Flower run id), so a refused writer names the process to wait for or stop. ``federation local``
holds the lock for the ServerApp it starts (another process, started by Flower): the ServerApp is
told the command's pid (``owner``) and writes under the lock that process holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedmedbench.errors import FedmedbenchError
from fedmedbench.files import try_flock as _try_lock  # module-level name: tests race it

LOCK_NAME = ".train.lock"


class RunFolderBusy(FedmedbenchError):
    """Another process is training into this run folder."""


def holder_of(path: Path) -> tuple[int | None, str]:
    """(pid, what) the lock file ``path`` names (None, "") when it names nobody."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return None, ""
    head, _, what = text.partition(":")
    pid = head.removeprefix("pid ").strip()
    return (int(pid), what.strip()) if pid.isdigit() else (None, "")


@contextmanager
def run_folder_lock(out_dir: str | os.PathLike, holder: str = "train", owner: int | None = None) -> Iterator[Path]:
    """Hold ``out_dir``'s lock for the block, or raise ``RunFolderBusy`` (nothing written), naming the
    process that holds it. ``holder``: what this process is, written into the lock file. ``owner``:
    the pid of a process that holds the lock on this one's behalf (``federation local`` for its
    ServerApp): when the lock file names it, the block runs under that process's lock."""
    path = Path(out_dir) / LOCK_NAME
    while True:
        handle = _try_lock(path)
        if handle is None:
            pid, what = holder_of(path)
            if owner is not None and pid == owner:
                yield path  # the owner holds it and removes it when it ends
                return
            who = f"process {pid} ({what}) holds {path}" if pid is not None else f"it holds {path}"
            raise RunFolderBusy(
                f"{out_dir}: another training job is writing this run folder ({who}); "
                "wait for it to end or stop it, or give it another output folder"
            )
        # A holder that was ending may have removed the file between our open and our lock: then we
        # hold a lock on a file nobody else can find. Lock the file the path names now instead.
        try:
            same = os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()
    # Ours now: whatever the file said (a killed holder's pid, which the kernel has unlocked) goes.
    handle.truncate(0)
    handle.write(f"pid {os.getpid()}: {holder}\n")
    handle.flush()
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)  # before unlocking: whoever opened this file retries (above)
        handle.close()
