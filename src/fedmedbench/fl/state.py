"""Atomic checkpoint save/load. Checkpoints load with ``weights_only=True`` (no pickled code)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


def save_atomic(obj, path: Path) -> None:
    """Write to a temp file in the same folder, fsync, then rename: a kill never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path, device: str | torch.device = "cpu"):
    return torch.load(path, map_location=device, weights_only=True)
