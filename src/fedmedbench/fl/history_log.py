"""The run's history rows, appended to a JSON-lines file beside the checkpoint (``HistoryLog``).

The rows live outside the checkpoint: each checkpoint appends only the rows since the previous one,
and records the log's length and CRC32, so a checkpoint's cost does not grow with the rounds and a
resume reads exactly the rows of its checkpoint, dropping whatever a killed job appended after it (a
torn last line included).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fedmedbench.fl.checkpoint import CorruptCheckpoint, crc32


def _plain(value):
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy/torch scalars
        return value.item()
    raise TypeError(f"history value {value!r} ({type(value).__name__}) is not a number or string")


class HistoryLog:
    """The run's history rows as JSON lines, appended at each checkpoint; see the module docstring.

    ``position()`` (what a checkpoint records) = bytes, CRC32 and rows of the log so far. Floats are
    written with ``repr`` (exact), so the rows read back give a byte-identical ``history.csv``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.bytes, self.crc, self.rows = 0, 0, 0

    def position(self) -> dict:
        return {"bytes": self.bytes, "crc32": self.crc, "rows": self.rows}

    def read(self, position: dict) -> list[dict]:
        """The rows of a checkpoint's ``position``: :class:`CorruptCheckpoint` when the file no
        longer holds exactly those bytes (removed, cut short, rewritten)."""
        size, crc, rows = position["bytes"], position["crc32"], position["rows"]
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(size)
        except FileNotFoundError:
            data = b""
        if len(data) != size or crc32(data) != crc:
            raise CorruptCheckpoint(
                f"{self.path}: does not hold the {rows} history rows ({size} bytes) the checkpoint refers to"
            )
        out = [json.loads(line) for line in data.decode().split("\n")[:-1]]
        if len(out) != rows:
            raise CorruptCheckpoint(f"{self.path}: {len(out)} history rows where the checkpoint refers to {rows}")
        return out

    def continue_from(self, position: dict) -> None:
        """Continue after a checkpoint's ``position`` (its bytes were checked by ``read``)."""
        self.bytes, self.crc, self.rows = position["bytes"], position["crc32"], position["rows"]

    def reset(self) -> None:
        """A fresh start: an empty log."""
        self.bytes, self.crc, self.rows = 0, 0, 0
        self.path.unlink(missing_ok=True)

    def append(self, rows: list[dict]) -> None:
        """``rows`` after the current position, fsynced (a checkpoint written next may refer to
        them). Written at the position, not at the file's end: whatever a killed job left beyond
        it (a torn line) is overwritten and cut off."""
        data = "".join(json.dumps(row, default=_plain) + "\n" for row in rows).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            os.lseek(fd, self.bytes, os.SEEK_SET)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.ftruncate(fd, self.bytes + len(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        self.bytes += len(data)
        self.crc = crc32(data, self.crc)
        self.rows += len(rows)
