"""Checkpoints and plain model files: atomic, checksummed, read on the CPU (the history rows a
checkpoint refers to: ``fl/history_log.py``).

A checkpoint (``save``/``load``) holds a tree of dicts, lists, tuples, sets, numbers, strings, bytes
and tensors: what ``torch.load(weights_only=True)`` reads back, so loading one runs no code. The file
is a ``torch.save`` payload followed by a trailer::

    torch.save({"tree": tree, "copies": json, "small": {dtype: buffer}, "small_index": json})
      | b"FMBCKPT4" | length | CRC32

**Structural deduplication.** A federated state repeats itself: after the server's package is
distributed, every client's shared keys hold the global model's values, and the selection keeps one
global model per client. So a tensor under a dict key (or list position) is checked against the
*first* tensor met under the same key with the same dtype, shape and strides, with an exact
``torch.equal`` of their bits (NaN payloads and the sign of zero count); an equal one is left out of
the tree and listed in ``copies`` by its path and its source's path. Nothing is hashed or sampled: one
compare per tensor, and tensors that differ are told apart in their first elements. The global state
is written once, each client adds its own keys, its optimizer and generator state, and any shared key
it holds differently (mid-round, or a method that keeps it). Loading puts back a clone of the source: each copy gets its own memory,
so an in-place step on one client's model reaches no other. One object in two places stays one
object and views of one storage stay views, as ``torch.save`` keeps them. Only tensors under string
and integer keys (every state dict and optimizer state) are compared; the copies' paths are one JSON
string.

**Small tensors in one buffer per dtype.** ``torch.save`` costs per tensor (its pickle entries and zip
record), not per byte: a small model's state is thousands of biases, BN statistics and step counts,
and pickling them one by one cost more than their bytes. So a tensor under ``SMALL`` bytes that owns
its whole storage, row-major, under string and integer keys, is concatenated with the others of its
dtype and listed (path, offset, shape, flags) in one JSON string; loading cuts each out into its own
memory. Larger tensors, views and shared storages are pickled by ``torch.save`` as they are.

**Atomic.** The file is written to a temporary beside it, fsynced, then the previous checkpoint is
renamed to ``<name>.prev`` and the temporary to ``<name>``: a kill at any moment leaves the last
complete checkpoint (or its ``.prev``) and at most a temporary (``.<name>.*.tmp``, which
``runfolder.remove_stale_files`` removes). A file cut short or damaged fails its length or CRC32 and
is :class:`CorruptCheckpoint`, so resuming falls back to the previous one instead of loading wrong
numbers. Checkpoints load onto the CPU: the generators' states must stay CPU byte tensors, and each
client moves its own tensors to its device (``to_device``).

``save_plain``/``load_plain``: a plain ``torch.save`` file (``model_best.pt``, a site's snapshot),
written atomically, loadable by anyone with ``torch.load``.
"""

from __future__ import annotations

import collections
import io
import json
import math
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

MAGIC = b"FMBCKPT4"
TRAILER = struct.Struct("<8sQI")  # magic, payload length, CRC32 of the payload

# What a checkpoint holds (exact types: a defaultdict or a namedtuple is refused; fl/hooks.py checks a
# method's state_dict against the same lists before anything is written).
LEAVES = (type(None), str, int, bool, float, complex, bytes, bytearray, torch.Size, torch.dtype, torch.device)
MAPPINGS = (dict, collections.OrderedDict, collections.Counter)
SEQUENCES = (list, tuple, set)
HOLDS = "a checkpoint holds tensors, numbers, strings, bytes and dicts/lists/tuples/sets of them"
SMALL = 1 << 16  # bytes: a tensor under this goes into its dtype's buffer (see the module docstring)


class CorruptCheckpoint(DataError):
    pass


def previous(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".prev")


# --- writing ----------------------------------------------------------------------------------------
class _Unsupported(TypeError):
    def __init__(self, where: str, what: str):
        super().__init__(what)
        self.where, self.what = where, what


def _row_major(t: torch.Tensor) -> bool:
    """Whether ``t`` has a fresh tensor's strides for its shape (what cutting it out of a buffer gives)."""
    expected, step = [], 1
    for size in reversed(t.shape):
        expected.append(step)
        step *= size
    return t.stride() == tuple(reversed(expected))


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
    if a.requires_grad:
        a, b = a.detach(), b.detach()
    if a.dtype is not ints:
        a, b = a.view(ints), b.view(ints)
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
        self.small: list[tuple[tuple, torch.Tensor]] = []  # (path, tensor): candidates for the buffers
        self.storages: collections.Counter = collections.Counter()  # storage address -> tensors kept on it

    def pack(self, x, path: tuple, dedup: bool = True):
        """``dedup``: whether ``path`` is made of string and integer keys, where a copy can be put back."""
        kind = type(x)
        if kind in LEAVES:
            return x
        if isinstance(x, torch.Tensor):
            return self.tensor(x, path, dedup)
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
                plain_key = type(key) in (str, int)
                if not plain_key:
                    self.pack(key, (*path, key), False)  # a key must be a value a checkpoint holds
                out[key] = self.pack(value, (*path, key), dedup and plain_key)
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
        storage = t.untyped_storage()
        if dedup and path and t.numel():
            key = (path[-1], t.dtype, t.shape, t.stride(), t.device)
            first = self.first.get(key)
            if first is None:
                self.first[key] = (t, path)
            else:
                source, source_path = first
                if (
                    type(source) is kind
                    and source.requires_grad == t.requires_grad
                    and source.untyped_storage().data_ptr() != storage.data_ptr()
                    and _same_bits(source, t)
                ):
                    self.copies.append((path, source_path))
                    return None
            # the first of its kind, the same memory as it (torch.save keeps it one storage) or other values
            if storage.nbytes() < SMALL and storage.nbytes() == t.nbytes and _row_major(t):
                self.small.append((path, t))
        self.storages[storage.data_ptr()] += 1
        return t

    def take_small(self, tree) -> tuple[dict, str]:
        """The small tensors that alone use their storage, taken out of ``tree`` into one buffer per
        dtype: (buffers, their JSON index)."""
        groups: dict[torch.dtype, list] = collections.defaultdict(list)
        lengths: collections.Counter = collections.Counter()
        index = []
        for path, t in self.small:
            if self.storages[t.untyped_storage().data_ptr()] != 1:
                continue  # a storage other tensors use too: torch.save keeps them one storage
            groups[t.dtype].append(t if t.is_cpu else t.cpu())
            index.append(
                [
                    path,
                    str(t.dtype).removeprefix("torch."),
                    lengths[t.dtype],
                    t.shape,
                    t.requires_grad,
                    type(t) is torch.nn.Parameter,
                ]
            )
            lengths[t.dtype] += t.numel()
            *parents, key = path
            _at(tree, parents)[key] = None
        with torch.no_grad():  # a parameter's values, not a graph
            buffers = {
                str(dtype).removeprefix("torch."): torch.cat([t.view(-1) for t in members])
                for dtype, members in groups.items()
            }
        return buffers, json.dumps(index)


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
    buffers, index = packer.take_small(tree)
    with atomic_file(path) as handle:
        writer = _ChecksummedWriter(handle)
        # torch.save's own CRC32 of each record is never checked by torch.load (a flipped byte loads
        # silently), and cost as much CPU as the rest of the write: ours, over the whole file, replaces it.
        torch_crc = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            torch.save(
                {"tree": tree, "copies": json.dumps(packer.copies), "small": buffers, "small_index": index}, writer
            )
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
        for item_path, dtype, offset, shape, requires_grad, parameter in json.loads(saved["small_index"]):
            flat = saved["small"][dtype][offset : offset + math.prod(shape)]
            *parents, key = item_path
            _at(tree, parents)[key] = _own_copy(flat.view(shape), requires_grad, parameter)
        for copy_path, source_path in json.loads(saved["copies"]):
            *parents, key = copy_path
            source = _at(tree, source_path)
            _at(tree, parents)[key] = _own_copy(source, source.requires_grad, type(source) is torch.nn.Parameter)
    except Exception as exc:  # torch raises RuntimeError/UnpicklingError/EOFError for bad payloads
        raise CorruptCheckpoint(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc
    return tree


def _at(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _own_copy(t: torch.Tensor, requires_grad: bool, parameter: bool) -> torch.Tensor:
    """A copy of ``t`` in its own memory, with its strides, as a parameter or not, with ``requires_grad``."""
    copy = t.detach().clone()
    if parameter:
        return torch.nn.Parameter(copy, requires_grad=requires_grad)
    return copy.requires_grad_(requires_grad)


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
