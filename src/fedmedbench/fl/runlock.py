"""One writer per run folder: a training job holds an exclusive ``flock`` on ``<run>/.train.lock``
while it runs, so a ``train`` started by hand on a folder a Snakemake job (or another ``train``) is
writing stops at once, in one line, having touched nothing.

The lock is the kernel's, as for the GPU slots (fl/placement.py): it is freed whenever the holder
ends, SIGKILL and OOM included, so a killed job never leaves a folder locked; the file that stays
behind after such a kill is empty and means nothing (the next job takes it). A job that ends removes
it, so a finished run folder holds only the run's own files. The file is no Snakemake output and its
name matches none of the temporaries the engine cleans up (``.*.tmp``).
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


@contextmanager
def run_folder_lock(out_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold ``out_dir``'s lock for the block, or raise ``RunFolderBusy`` (nothing written)."""
    path = Path(out_dir) / LOCK_NAME
    while True:
        handle = _try_lock(path)
        if handle is None:
            raise RunFolderBusy(
                f"{out_dir}: another training job is writing this run folder (it holds {path}); "
                "wait for it to end or stop it, or give train another --out"
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
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)  # before unlocking: whoever opened this file retries (above)
        handle.close()
