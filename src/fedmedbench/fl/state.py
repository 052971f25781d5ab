"""Model files and checkpoints: atomic, device-independent; checkpoints also checksummed.

``save_atomic``/``load``: a plain ``torch.save`` file (e.g. ``model_best.pt``, loadable by anyone with
``torch.load``), written atomically. A checkpoint (``save_checkpoint``/``load_checkpoint``) is ``torch.save`` bytes followed by a trailer (magic + CRC32 of those bytes), written to
a temporary file, fsynced and renamed over the previous one, which is kept as ``<name>.prev``. A file
cut short or damaged fails the CRC and is reported as :class:`CorruptCheckpoint`, so resuming falls
back to the previous good state instead of crashing or silently loading wrong numbers. Checkpoints
load with ``weights_only=True`` (no pickled code) and always onto the CPU: random-generator states
must stay CPU byte tensors, and each client moves its own tensors to its device.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import torch

from fedmedbench.errors import DataError
from fedmedbench.files import atomic_file
from fedmedbench.fl import faults

MAGIC = b"FMBCKPT1"
TRAILER = struct.Struct("<8sQI")  # magic, payload length, crc32


class CorruptCheckpoint(DataError):
    pass


def previous(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".prev")


def save_atomic(obj, path: Path) -> None:
    with atomic_file(path) as handle:
        torch.save(obj, handle)


def load(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


def save_checkpoint(obj, path: Path) -> None:
    """Write ``obj``; a kill at any moment leaves the last good checkpoint (or its ``.prev``) intact."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getbuffer()
    with atomic_file(path) as handle:
        handle.write(payload[: len(payload) // 2])
        faults.reached("checkpoint_write")
        handle.write(payload[len(payload) // 2 :])
        handle.write(TRAILER.pack(MAGIC, len(payload), zlib.crc32(payload)))
        if path.exists():
            os.replace(path, previous(path))


def load_checkpoint(path: Path):
    """The checkpoint's object, on the CPU; :class:`CorruptCheckpoint` if it is damaged."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < TRAILER.size:
        raise CorruptCheckpoint(f"{path}: truncated ({len(data)} bytes)")
    magic, length, crc = TRAILER.unpack(data[-TRAILER.size :])
    payload = memoryview(data)[: -TRAILER.size]
    if magic != MAGIC or length != len(payload) or zlib.crc32(payload) != crc:
        raise CorruptCheckpoint(f"{path}: damaged or cut short (checksum mismatch)")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError/UnpicklingError/EOFError for bad files
        raise CorruptCheckpoint(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc


def to_device(tree, device: torch.device):
    """Tensors in nested dicts/lists/tuples moved to ``device`` (for method state a client restores)."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device) for v in tree)
    return tree
