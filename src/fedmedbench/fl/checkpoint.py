"""Checkpoints, the checkpointed history log, and plain model files: atomic, checksummed, read on the CPU.

A checkpoint (``save``/``load``) holds a tree of dicts, lists, tuples, sets, numbers, strings, bytes
and tensors: what ``torch.load(weights_only=True)`` reads back, so loading one runs no code. The file
is a ``torch.save`` payload followed by a trailer::

    torch.save({"tree": tree, "copies": [(path, source path), ...]}) | b"FMBCKPT3" | length | CRC32

**Structural deduplication.** A federated state repeats itself: after the server's package is
distributed, every client's shared keys hold the global model's values, and the selection keeps one
global model per client. So a tensor under a dict key (or list position) is checked against the
*first* tensor met under the same key with the same dtype, shape and strides, with an exact
``torch.equal`` of their bits (NaN payloads and the sign of zero count); an equal one is left out of
the tree and listed in ``copies`` by its path and its source's path. Nothing is hashed or sampled: one
compare per tensor, and tensors that differ are told apart in their first elements. The global state is written once, each client adds
its own keys, its optimizer and generator state, and any shared key it holds differently (mid-round,
or a method that keeps it). Loading puts back a clone of the source: each copy gets its own memory,
so an in-place step on one client's model reaches no other. One object in two places stays one
object and views of one storage stay views, as ``torch.save`` keeps them.

**Atomic.** The file is written to a temporary beside it, fsynced, then the previous checkpoint is
renamed to ``<name>.prev`` and the temporary to ``<name>``: a kill at any moment leaves the last
complete checkpoint (or its ``.prev``) and at most a temporary (``.<name>.*.tmp``, which
``runfolder.remove_stale_files`` removes). A file cut short or damaged fails its length or CRC32 and
is :class:`CorruptCheckpoint`, so resuming falls back to the previous one instead of loading wrong
numbers. Checkpoints load onto the CPU: the generators' states must stay CPU byte tensors, and each
client moves its own tensors to its device (``to_device``).

``HistoryLog``: the run's history rows live outside the checkpoint, appended (only the rows since
the previous checkpoint) to a JSON-lines file; a checkpoint records the log's length and CRC32, so a
checkpoint's cost does not grow with the rounds and a resume reads exactly the rows of its
checkpoint, dropping whatever a killed job appended after it (a torn last line included).

``save_plain``/``load_plain``: a plain ``torch.save`` file (``model_best.pt``, a site's snapshot),
written atomically, loadable by anyone with ``torch.load``.
"""

from __future__ import annotations

import collections
import io
import json
import os
import struct
from pathlib import Path

import torch

try:  # ISA-L's CRC32: zlib's values, at several times its speed (a checkpoint's CRC is a pass over its bytes)
    from isal.isal_zlib import crc32
except ImportError:
    from zlib import crc32

from fedmedbench import faults
from fedmedbench.errors import DataError
from fedmedbench.files import atomic_file

MAGIC = b"FMBCKPT3"
TRAILER = struct.Struct("<8sQI")  # magic, payload length, CRC32 of the payload

# What a checkpoint holds (exact types: a defaultdict or a namedtuple is refused; fl/hooks.py checks a
# method's state_dict against the same lists before anything is written).
LEAVES = (type(None), str, int, bool, float, complex, bytes, bytearray, torch.Size, torch.dtype, torch.device)
MAPPINGS = (dict, collections.OrderedDict, collections.Counter)
SEQUENCES = (list, tuple, set)
HOLDS = "a checkpoint holds tensors, numbers, strings, bytes and dicts/lists/tuples/sets of them"


class CorruptCheckpoint(DataError):
    pass


def previous(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".prev")


# --- writing ----------------------------------------------------------------------------------------
class _Unsupported(TypeError):
    def __init__(self, where: str, what: str):
        super().__init__(what)
        self.where, self.what = where, what


def _where(path: tuple) -> str:
    return "".join(f"[{key!r}]" for key in path)


_SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one dtype, shape and strides hold the same bits: compared as integers
    of the element's size, so NaN payloads count and 0.0 differs from -0.0 (``torch.equal`` on the
    floats says NaN != NaN and 0.0 == -0.0). The first 1,024 elements first: tensors that differ (two
    clients' optimizer moments under one name) almost always differ there, and are then told apart
    without reading them whole."""
    ints = _SAME_SIZE_INTS.get(a.element_size())
    if ints is None:
        return False  # complex128: never merged (no such tensor in a federated state)
    a, b = a.detach().view(ints), b.detach().view(ints)
    if a.numel() > 1024 and a.is_contiguous() and not torch.equal(a.view(-1)[:1024], b.view(-1)[:1024]):
        return False
    return torch.equal(a, b)


class _Packer:
    """The walk over the object: checks every value, and gives back the tree to ``torch.save`` with
    the copies of earlier tensors left out (``None`` in their place) and listed in ``copies``."""

    def __init__(self):
        self.memo: dict[int, object] = {}  # id(container) -> its packed copy: one object stays one
        self.keep: list = []  # the originals stay alive during the walk, so their ids stay unique
        self.first: dict[tuple, tuple] = {}  # (key, dtype, shape, stride, device) -> (tensor, its path)
        self.copies: list[tuple[tuple, tuple]] = []

    def pack(self, x, path: tuple, dedup: bool = True):
        kind = type(x)
        if isinstance(x, torch.Tensor):
            return self.tensor(x, path, dedup)
        if kind in LEAVES:
            return x
        if isinstance(x, float):
            return float(x)  # numpy's float64: the same IEEE number, readable without numpy
        if kind not in MAPPINGS and kind not in SEQUENCES:
            raise _Unsupported(_where(path), f"{kind.__module__}.{kind.__qualname__}")
        if id(x) in self.memo:
            return self.memo[id(x)]
        self.keep.append(x)
        if kind is tuple:  # immutable: no copy can be put back into it, only deeper
            out = tuple(
                self.tensor(v, (*path, i), False) if isinstance(v, torch.Tensor) else self.pack(v, (*path, i), dedup)
                for i, v in enumerate(x)
            )
        elif kind is set:  # members have no path to put a copy back at: stored as they are
            out = {self.pack(v, (*path, i), False) for i, v in enumerate(x)}
        elif kind is list:
            out = self.memo[id(x)] = []
            out.extend(self.pack(v, (*path, i), dedup) for i, v in enumerate(x))
        else:
            out = self.memo[id(x)] = kind()
            for key, value in x.items():
                self.pack(key, (*path, key), False)  # a key must be a value a checkpoint holds
                out[key] = self.pack(value, (*path, key), dedup)
            if hasattr(x, "_metadata"):  # a module's state_dict (its version numbers)
                out._metadata = self.pack(x._metadata, (*path, "_metadata"), False)
        self.memo[id(x)] = out
        return out

    def tensor(self, t: torch.Tensor, path: tuple, dedup: bool):
        kind = type(t)
        if t.is_meta:
            raise _Unsupported(_where(path), "a tensor on the meta device (it holds no values)")
        if (
            kind not in (torch.Tensor, torch.nn.Parameter)
            or t.layout is not torch.strided
            or t.is_quantized
            or t.is_conj()
            or t.is_neg()
        ):
            raise _Unsupported(
                _where(path),
                f"a {kind.__name__} of layout {t.layout} and dtype {t.dtype}; only plain strided tensors and parameters",
            )
        if not dedup or not path or t.numel() == 0:
            return t
        key = (path[-1], t.dtype, t.shape, t.stride(), t.device)
        first = self.first.get(key)
        if first is None:
            self.first[key] = (t, path)
            return t
        source, source_path = first
        same_kind = type(source) is kind and source.requires_grad == t.requires_grad
        if (
            same_kind
            and source.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
            and _same_bits(source, t)
        ):
            self.copies.append((path, source_path))
            return None
        return t  # the same memory (torch.save keeps it one storage) or other values


def save(obj, path: Path) -> None:
    """Write ``obj`` as a checkpoint; a kill at any moment leaves the last good checkpoint (or its
    ``.prev``) intact. A value a checkpoint cannot hold (e.g. a numpy array in a method's state) is a
    ``TypeError`` naming where it is, raised before anything is written."""
    path = Path(path)
    packer = _Packer()
    try:
        tree = packer.pack(obj, ())
    except _Unsupported as err:
        raise TypeError(
            f"{path.name}: cannot checkpoint the value at {err.where or 'the top'}: {err.what}; {HOLDS}"
        ) from None
    with atomic_file(path) as handle:
        writer = _ChecksummedWriter(handle)
        # torch.save's own CRC32 of each record is never checked by torch.load (a flipped byte loads
        # silently), and cost as much CPU as the rest of the write: ours, over the whole file, replaces it.
        torch_crc = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            torch.save({"tree": tree, "copies": packer.copies}, writer)
        finally:
            torch.serialization.set_crc32_options(torch_crc)
        faults.reached("checkpoint_write")  # a test hook: the payload written, no trailer yet
        handle.write(TRAILER.pack(MAGIC, writer.length, writer.crc))
        handle.flush()
        os.fsync(handle.fileno())  # complete on disk before the previous checkpoint steps aside
        if path.exists():
            os.replace(path, previous(path))
    # atomic_file renames the temporary to ``path`` (or removes it on an error)


class _ChecksummedWriter:
    """A file handle for ``torch.save`` that adds each piece to the CRC32 as it goes by (torch hands
    over the tensors' own memory: nothing is copied, and a checkpoint's size never raises the host memory)."""

    def __init__(self, handle):
        self.handle, self.crc, self.length = handle, 0, 0

    def write(self, data) -> int:
        self.crc = crc32(data, self.crc)
        self.length += memoryview(data).nbytes
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


# --- loading ----------------------------------------------------------------------------------------
def load(path: Path):
    """The checkpoint's object, on the CPU; :class:`CorruptCheckpoint` if it is damaged."""
    path = Path(path)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        payload = handle.read(max(size - TRAILER.size, 0))
        trailer = handle.read()
    if len(trailer) != TRAILER.size:
        raise _damaged(path)
    magic, length, crc = TRAILER.unpack(trailer)
    if magic != MAGIC or length != len(payload) or crc32(payload) != crc:
        raise _damaged(path)
    try:
        saved = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        tree = saved["tree"]
        for copy_path, source_path in saved["copies"]:
            *parents, key = copy_path
            _at(tree, parents)[key] = _copy_of(_at(tree, source_path))
    except Exception as exc:  # torch raises RuntimeError/UnpicklingError/EOFError for bad payloads
        raise CorruptCheckpoint(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc
    return tree


def _at(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _copy_of(t: torch.Tensor) -> torch.Tensor:
    """A copy in its own memory, with the source's strides, type and ``requires_grad``."""
    copy = t.detach().clone()
    if type(t) is torch.nn.Parameter:
        return torch.nn.Parameter(copy, requires_grad=t.requires_grad)
    return copy.requires_grad_(t.requires_grad)


def _damaged(path: Path) -> CorruptCheckpoint:
    return CorruptCheckpoint(f"{path}: damaged or cut short (checksum mismatch)")


def to_device(tree, device: torch.device):
    """Tensors in nested dicts/lists/tuples moved to ``device`` (for method state a client restores)."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device) for v in tree)
    return tree


# --- plain torch.save files -------------------------------------------------------------------------
def save_plain(obj, path: Path) -> None:
    with atomic_file(path) as handle:
        torch.save(obj, handle)


def load_plain(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


# --- the history log --------------------------------------------------------------------------------
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
