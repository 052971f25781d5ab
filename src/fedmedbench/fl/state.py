"""Model files, checkpoints and the checkpointed history: atomic, device-independent, checksummed.

``save_atomic``/``load``: a plain ``torch.save`` file (e.g. ``model_best.pt``, loadable by anyone with
``torch.load``), written atomically.

A checkpoint (``save_checkpoint``/``load_checkpoint``, format ``FMBCKPT2``) holds a tree of dicts,
lists, tuples, numbers, strings and tensors (what ``torch.load(weights_only=True)`` accepts) as::

    b"FMBCKPT2" | blob 0 | blob 1 | ... | index (JSON) | trailer (magic, index offset and length,
                                                        CRC32 of the index, CRC32 of the blobs)

A blob is the bytes of one distinct tensor storage: storages that are the same memory (views,
one tensor in two places) are one storage, and storages with equal bytes (FedAvg's K client models
and the global model after distribution: copies, not views) are written once. The index says which
tensor is a view of which storage and which storages share a blob, so loading gives back the same
aliasing (views of one storage stay views) and the same values, each storage its own memory (equal
copies stay independent, so an in-place update of one never reaches another). The non-tensor part
is tagged JSON (no pickle: nothing in a checkpoint can run code), with dict/list/set identity kept
as pickle keeps it.

Writing streams: blobs go to the file straight from the tensors' memory (small tensors staged
together), handed in batches of about 4 MiB to a writer thread (one ``writev`` each); this thread
adds each batch to the running CRC32 while the writer writes it, then walks on and compares the
next storages, so a checkpoint's size never raises the host memory. The writer starts the disk's writeback of every 8 MiB it has written (Linux ``sync_file_range``), so the
disk works while the CPU walks, compares and checksums, and the final fsync waits only for the last
pieces: a checkpoint costs about the disk's time for its bytes, as a raw write of them does.
The file is a temporary, fsynced and renamed over the previous checkpoint, which is kept as
``<name>.prev``; the temporary is the checkpoint before that one, kept as a spare and written over
(its pages and disk blocks reused: no page allocation, block allocation or unlink per checkpoint). A file cut short or damaged fails a CRC and is reported as
:class:`CorruptCheckpoint`, so resuming falls back to the previous good state instead of crashing
or silently loading wrong numbers. Checkpoints load always onto the CPU: random-generator states
must stay CPU byte tensors, and each client moves its own tensors to its device.

A checkpoint of the earlier format (``FMBCKPT1``: ``torch.save`` bytes + magic, length, CRC32) is
still read, so a job killed before an upgrade resumes.

``HistoryLog``: the run's history rows live outside the checkpoint, appended (only the rows since
the previous checkpoint) to a JSON-lines file; a checkpoint records the log's length and CRC32, so a
checkpoint's cost does not grow with the rounds and a resume reads exactly the rows of its
checkpoint, dropping whatever a killed job appended after it (a torn last line included).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import ctypes
import gc
import io
import json
import os
import queue
import struct
import threading
import zlib
from pathlib import Path

import torch

from fedmedbench.errors import DataError
from fedmedbench.files import atomic_file
from fedmedbench import faults
from fedmedbench.fl import state_device

MAGIC = b"FMBCKPT2"
TRAILER = struct.Struct("<8sQQII")  # magic, index offset, index length, crc32(index), crc32(blobs)
LEGACY_MAGIC = b"FMBCKPT1"
LEGACY_TRAILER = struct.Struct("<8sQI")  # magic, payload length, crc32 (payload = torch.save bytes)

SAMPLE = 64  # bytes from each end of a storage: the key that finds candidate duplicates
SMALL = 1 << 16  # storages below this are copied into a staging buffer, written 4 MiB at a time
CHUNK = 1 << 22  # staging buffer size; also the piece size for copying device memory to the host
PENDING = 1 << 24  # device bytes copied to the host at once (one wait for the device per copy)
QUEUE = 8  # blobs/chunks in flight to the writer thread (bounds the memory of device copies)
WRITEBACK = 1 << 23  # the writer starts the disk's writeback every this many bytes

_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_DTYPE_NAMES = {d: name for name, d in _DTYPES.items() if not name.startswith(("qint", "quint"))}
_PLAIN_DTYPES = {d: name for d, name in _DTYPE_NAMES.items() if not d.is_complex}  # the common path of _Packer.tensor
_DICT_TAGS = {dict: "d", collections.OrderedDict: "o", collections.Counter: "c"}
_CPU = torch.device("cpu")
_string_at = ctypes.string_at
_SAMPLE_AT = (ctypes.c_char * SAMPLE).from_address  # reads SAMPLE bytes at an address; 2x faster than string_at


class CorruptCheckpoint(DataError):
    pass


def previous(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".prev")


def spare(path: Path) -> Path:
    """The checkpoint before ``previous(path)``, kept to be overwritten by the next checkpoint: a
    temporary's name, so ``runfolder.remove_stale_files`` removes it at a run's start and end."""
    return Path(path).with_name(f".{Path(path).name}.spare.tmp")


@contextlib.contextmanager
def _checkpoint_file(path: Path):
    """``atomic_file`` for checkpoints, writing over the spare file's pages and disk blocks instead
    of a new file's. A new file costs the kernel a fresh page for every 4 KiB written and a block
    allocation for each, and the previous file's unlink frees as many (on this VM, 0.14 s for a raw
    write of 166 MB, and up to 0.6 s when the host backs the fresh pages again; overwriting a kept
    file of the same size: 0.08 s). The renames stay those of ``atomic_file`` and the ``.prev``
    policy: during the write ``path`` and ``previous(path)`` are both intact; the file they leave
    (the checkpoint before ``previous(path)``) becomes the spare instead of being unlinked. The
    temporary is removed on an error; a killed job leaves it (and the spare) to ``remove_stale_files``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.next.tmp")
    try:
        os.replace(spare(path), tmp)
        fd = os.open(tmp, os.O_WRONLY)  # no O_TRUNC: the old pages are overwritten, the rest cut below
    except FileNotFoundError:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the mode open() gives
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_CUR))  # a longer spare's tail
            if path.exists():
                if previous(path).exists():
                    os.replace(previous(path), spare(path))
                os.replace(path, previous(path))
            os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_atomic(obj, path: Path) -> None:
    with atomic_file(path) as handle:
        torch.save(obj, handle)


def load(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


# --- bytes of storages ---------------------------------------------------------------------------
def _memcmp(dll=ctypes.CDLL):
    """libc's ``memcmp`` through ``dll``: ``CDLL`` releases the GIL for the call, ``PyDLL`` keeps it."""
    try:
        libc = dll(None) if os.name != "nt" else dll("msvcrt")
        fn = libc.memcmp
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


_MEMCMP = _memcmp()  # libc's memcmp: stops at the first difference, ~5x torch.equal on bytes
# The same, holding the GIL: Camelyon17's 3,635 duplicate compares take ~4 us each, and releasing
# the GIL for every one handed it to the writer thread and back each time (a futex wake-up on the
# other core per compare), which cost more CPU than the compares (measured: 0.31 -> 0.20 CPU s a
# write). Compares of at least RELEASE bytes (> 0.1 ms) still release it, so the writer is not held up.
_MEMCMP_HELD = _memcmp(ctypes.PyDLL)
RELEASE = 1 << 20
SPLIT = 1 << 23  # compares of at least this many bytes run in two halves, on two threads


def _memcmp_split(a: int, b: int, n: int) -> int:
    """``memcmp`` of two large blocks, the second half on a helper thread (both release the GIL).
    Skin's VGG holds 248 MB of its 260 MB in storages of 9-134 MB, and each of the 4 client copies
    is compared in full with the global model: 1.04 GB, the longest part of its checkpoint; on two
    cores the halves run side by side (measured with 16 MiB: per-repetition new / raw 1.07 -> 0.88 at
    load 2.6). A thread start (~0.1 ms) is small beside the compare of 8 MiB (~1 ms)."""
    half = (n // 2) & ~4095
    second = [0]

    def compare_second_half() -> None:
        second[0] = _MEMCMP(a + half, b + half, n - half)

    helper = threading.Thread(target=compare_second_half, name="checkpoint-compare")
    helper.start()
    first = _MEMCMP(a, b, half)
    helper.join()
    return first or second[0]


def _fast_crc32():
    """ISA-L's ``crc32`` (package ``isal``: zlib's CRC-32, computed with AVX-512 carry-less multiplies
    where the CPU has them; 16 GB/s here against zlib's 4.4 and libdeflate 1.14's 8), or None where
    it is not installed. It releases the GIL on large buffers, as zlib's does."""
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    check = bytes(range(256)) * 3
    if isal_zlib.crc32(check) != zlib.crc32(check) or isal_zlib.crc32(check[5:], zlib.crc32(check[:5])) != zlib.crc32(check):
        return None
    return isal_zlib.crc32


_CRC32 = _fast_crc32() or zlib.crc32  # the file's CRC32 is zlib's either way (the format is unchanged)


_byte_view = state_device.byte_view  # a storage's bytes as a 1-D uint8 tensor (no copy)


def _same_bytes(a: torch.UntypedStorage, b: torch.UntypedStorage) -> bool:
    """Host memory where libc's memcmp is missing."""
    return torch.equal(_byte_view(a), _byte_view(b))  # exact: integer compare, NaN bits included


# --- the tree: tagged JSON -----------------------------------------------------------------------
class _Unsupported(TypeError):
    def __init__(self, what: str, where: str = ""):
        super().__init__(what)
        self.what, self.where = what, where


class _Packer:
    """The pass over the object: the tagged-JSON tree and the tensor table; each new storage (by
    identity) goes to ``blobs`` at once, so the writes start while the walk goes on. Containers are
    numbered in pre-order, so a second reference to one is ``{"r": n}``."""

    def __init__(self, blobs: _Blobs):
        self.blobs = blobs
        self.tensors: list[list] = []
        self.tensor_ids: dict[int, int] = {}
        self.storages: list[int] = []  # storage -> blob
        self.storage_ids: dict[tuple, int] = {}
        self.memo: dict[int, int] = {}
        self.keep: list = []  # every object whose id() is a key above stays alive until the end

    def container(self, obj) -> int | None:
        """``None`` on the first visit (now numbered), else the number of the earlier visit."""
        key = id(obj)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = len(self.memo)
        self.keep.append(obj)
        return None

    def pack(self, x):
        kind = type(x)
        if kind is torch.Tensor or kind is torch.nn.Parameter:  # the common leaf first
            return {"T": self.tensor(x)}
        if x is None or kind is str or kind is int or kind is bool:
            return x
        if isinstance(x, float):
            return float(x)  # numpy's float64 too: the same IEEE number
        if isinstance(x, torch.Tensor):
            return {"T": self.tensor(x)}  # a subclass: refused there, by name
        if kind is list:
            ref = self.container(x)
            return {"r": ref} if ref is not None else self.items(x)
        if kind is tuple:
            return {"t": self.items(x)}
        if kind is dict or kind is collections.OrderedDict or kind is collections.Counter:
            ref = self.container(x)
            if ref is not None:
                return {"r": ref}
            tag = _DICT_TAGS[kind]
            if all(type(k) is str for k in x):
                out = {tag: self.mapping(x)}
            else:
                out = {tag.upper(): [[self.item("key", k), self.item(k, v)] for k, v in x.items()]}
            if kind is collections.OrderedDict and hasattr(x, "_metadata"):  # a module's state_dict
                out["m"] = self.item("_metadata", x._metadata)
            return out
        if kind is set:
            ref = self.container(x)
            return {"r": ref} if ref is not None else {"s": self.items(x)}
        if kind is bytes:
            return {"b": base64.b64encode(x).decode()}
        if kind is bytearray:
            ref = self.container(x)
            return {"r": ref} if ref is not None else {"ba": base64.b64encode(x).decode()}
        if kind is complex:
            return {"j": [x.real, x.imag]}
        if kind is torch.Size:
            return {"z": list(x)}
        if kind is torch.dtype:
            return {"y": str(x).removeprefix("torch.")}
        if kind is torch.device:
            return {"v": str(x)}
        raise _Unsupported(f"{kind.__module__}.{kind.__qualname__}")

    def mapping(self, x: dict) -> dict:
        """A dict of str keys; tensors (most values of a state dict) without a call to ``pack``."""
        out, tensor, pack = {}, self.tensor, self.pack
        try:
            for key, value in x.items():
                kind = type(value)
                out[key] = {"T": tensor(value)} if kind is torch.Tensor or kind is torch.nn.Parameter else pack(value)
        except _Unsupported as err:
            err.where = f"[{key!r}]{err.where}"
            raise
        return out

    def items(self, values) -> list:
        return [self.item(i, v) for i, v in enumerate(values)]

    def item(self, key, value):
        try:
            return self.pack(value)
        except _Unsupported as err:
            err.where = f"[{key!r}]{err.where}"
            raise

    def tensor(self, t: torch.Tensor) -> int:
        """The tensor's row number. This runs for every tensor of the state (6,189 for Camelyon17's
        DenseNet and its K client copies), so it reads each attribute once and checks the common
        case (a plain CPU tensor of an ordinary dtype) first."""
        index = self.tensor_ids.get(id(t))
        if index is not None:
            return index
        kind, dtype = type(t), t.dtype
        name = _PLAIN_DTYPES.get(dtype)
        if name is None or (kind is not torch.Tensor and kind is not torch.nn.Parameter) or t.layout is not torch.strided:
            name = _unusual(t, kind, dtype)
        storage = t.untyped_storage()
        device = storage.device
        if device != _CPU and t.is_meta:
            raise _Unsupported("a tensor on the meta device (it holds no values)")
        shape, stride = t.shape, t.stride()
        default = _STRIDES.get(shape)
        if default is None:
            default = _STRIDES[shape] = _contiguous_stride(shape)
        # One storage = one memory block; empty ones (address 0) are told apart by nothing, so each
        # stays its own (they share no values anyway).
        n, ptr = storage.nbytes(), storage.data_ptr()
        key = (device, ptr, n)
        position = self.storage_ids.get(key) if n else None
        if position is None:
            position = len(self.storages)
            if n:
                self.storage_ids[key] = position
            self.storages.append(self.blobs.add(storage, device, ptr, n))
        row = [position, t.storage_offset(), name, shape, None if stride == default else stride, (kind is torch.nn.Parameter) | (t.requires_grad << 1)]
        index = self.tensor_ids[id(t)] = len(self.tensors)
        self.tensors.append(row)
        self.keep.append(t)
        return index


def _unusual(t: torch.Tensor, kind: type, dtype: torch.dtype) -> str:
    """The dtype's name for a tensor off the common path (a complex dtype), or ``_Unsupported``.
    Quantized dtypes are not in _DTYPE_NAMES; a conjugate/negative view bit only on complex ones."""
    if (kind is not torch.Tensor and kind is not torch.nn.Parameter) or t.layout is not torch.strided or dtype not in _DTYPE_NAMES or (dtype.is_complex and (t.is_conj() or t.is_neg())):
        raise _Unsupported(f"a {kind.__name__} of layout {t.layout} and dtype {dtype}; only plain strided tensors and parameters")
    return _DTYPE_NAMES[dtype]


def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(stride[::-1])


_STRIDES: dict[torch.Size, tuple[int, ...]] = {}  # shape -> its contiguous strides (shapes repeat across clients)


class _Consumer(threading.Thread):
    """Applies ``fn`` to batches of buffers in order (writing them) while the walk goes on: file
    writes and ``sync_file_range`` release the GIL. An error is kept for the caller, who raises it
    once everything is handed over.

    Buffers come in batches of about ``CHUNK`` bytes (one ``writev``), not one by one: every hand-over
    wakes this thread, which then needs the GIL back from the walk, and a few hundred of them (one per
    mid-sized tensor) cost the walk more than its own work. The queue is not bounded by count: a
    piece of a host tensor is a view of the tensor's own memory and costs nothing to queue. Only
    batches holding copies (staged small tensors, pieces copied from a device) take one of ``QUEUE``
    slots, which bounds the memory they hold."""

    def __init__(self, name: str, fn):
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.slots = threading.BoundedSemaphore(QUEUE)
        self.error = None

    def put(self, batch: list, copied: bool) -> None:
        if copied:
            self.slots.acquire()
        self.items.put((batch, copied))

    def run(self) -> None:
        while (item := self.items.get()) is not None:
            if self.error is None:
                try:
                    self.fn(item[0])
                except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                    self.error = err
            if item[1]:
                self.slots.release()

    def finish(self) -> None:
        self.items.put(None)
        self.join()


def _sync_file_range():
    """Linux's ``sync_file_range`` (glibc), or None elsewhere."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


_SYNC_FILE_RANGE = _sync_file_range() if os.name == "posix" else None
_WRITEBACK_START = 2  # SYNC_FILE_RANGE_WRITE: start writing these pages out, do not wait
_IOV_MAX = 1024  # buffers per writev (POSIX guarantees at least 16; Linux and macOS take 1024)
_writev = getattr(os, "writev", None)


def _write_all(fd: int, buffers: list) -> int:
    """Write ``buffers`` in order at the file's position (one ``writev`` per ``_IOV_MAX`` of them;
    a short write continues where it stopped); the bytes written."""
    total = 0
    for first in range(0, len(buffers), _IOV_MAX):
        group = [memoryview(b).cast("B") for b in buffers[first : first + _IOV_MAX]]
        while group:
            done = _writev(fd, group) if _writev is not None else os.write(fd, group[0])
            total += done
            while group and done >= group[0].nbytes:
                done -= group[0].nbytes
                group.pop(0)
            if done:
                group[0] = group[0][done:]
    return total


class _Writer:
    """The writer thread's step: write a batch of buffers, and every ``WRITEBACK`` bytes ask the kernel
    to start writing the pages just written out to the disk. Without that the disk starts only at the
    final fsync (or when the dirty-page limits are hit), so every CPU cost of a checkpoint (walk,
    compares, CRC) comes on top of the disk's time; with it the disk works during them and the fsync
    waits for the last pieces only. Durability is unchanged: the fsync before the rename still waits
    for all. Writes go to the file descriptor (``writev``), after what ``handle`` holds is flushed."""

    def __init__(self, handle, offset: int):
        handle.flush()
        self.fd = handle.fileno()
        self.offset = self.started = offset  # bytes in the file / start of what writeback has not covered

    def __call__(self, batch: list) -> None:
        self.offset += _write_all(self.fd, batch)
        if _SYNC_FILE_RANGE is not None and self.offset - self.started >= WRITEBACK:
            if _SYNC_FILE_RANGE(self.fd, self.started, self.offset - self.started, _WRITEBACK_START) == 0:
                self.started = self.offset
            else:  # e.g. a file system without it: nothing lost, the fsync does it all
                self.started = 1 << 62


def _host(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage`` is host memory this process reads by address (memcmp, file writes straight
    from it). Else (CUDA, MPS, ...) it takes the device path: decided in bulk, copied to the host in
    batches. Tests send host storages that way through ``_DEVICE_PATH``: all (True), or those whose
    address is in a set (a state where host and "device" storages alternate, as in a GPU job's)."""
    if storage.device.type != "cpu":
        return False
    return not (_DEVICE_PATH is True or (_DEVICE_PATH and storage.data_ptr() in _DEVICE_PATH))


_DEVICE_PATH: bool | frozenset = False


class _Blobs:
    """The distinct storage contents, written in order of first appearance. A storage whose size and
    first and last ``SAMPLE`` bytes match an earlier blob's is compared with it in full (libc memcmp:
    exact, exits at the first difference), so distinct contents are never merged and equal ones are
    written once. With ``handle`` None nothing is written (to time the comparisons alone).

    Storages in device memory (a GPU job's state) are decided before the walk, all at once
    (``fl/state_device.py``: which hold equal bytes, with one or two waits for the device instead of
    one per storage), and their new blobs are copied to the host ``PENDING`` bytes at a time.

    New blobs are handed to the writer thread in batches of at least ``CHUNK`` bytes: views of host
    tensors' own memory (in ``CHUNK`` pieces, so that writing and writeback overlap the walk), small
    ones (below ``SMALL``) copied into a staging buffer, device memory in the host copies of a batch.
    This thread computes the batch's CRC32 right after handing it over, while the writer writes it."""

    def __init__(self, handle=None, offset: int = 0):
        self.buckets: dict[tuple, list[int]] = {}
        self.storages: list[torch.UntypedStorage] = []
        self.pointers: list[int] = []  # each blob's address (host memory), for memcmp
        self.sizes: list[int] = []
        self.staging = bytearray()
        self.batch: list = []  # buffers not handed over yet
        self.batch_bytes = 0
        self.batch_copied = False
        self.crc = 0
        self.source = None  # the object being written: planned when the walk meets a device storage
        self.device_first: dict[tuple, tuple] | None = None  # device storage -> the first with its bytes
        self.device_blob: dict[tuple, int] = {}  # such a first storage -> its blob
        self.device_views: dict[tuple, torch.Tensor] = {}  # device storage -> its byte view (from the plan)
        self.pending: list = []  # device views (and small host bytes after them) awaiting one copy
        self.pending_bytes = 0
        self.writer: _Consumer | None = None  # None: nothing is written (the compares alone are timed)
        if handle is not None:
            # One thread, writing; the CRC32 on the walk's thread. A CRC thread of its own needed the
            # GIL back after every buffer's crc32 (~700 for Camelyon17), each a hand-off from the walk
            # and a wake-up on the other core; with the CRC here, the walk releases the GIL in
            # crc32 and the writer takes it then (on 2 idle cores: 0.25-0.36 -> 0.15-0.2 CPU s a
            # Camelyon17 write; docs/engineering.md, "Checkpoints").
            self.writer = _Consumer("checkpoint-writer", _Writer(handle, offset))
            self.writer.start()

    def plan_device(self) -> None:
        """For every storage of the object in device memory, the first one holding its bytes (and its
        byte view). Made when the walk meets the first device storage, so a state in host memory pays
        no second walk."""
        storages = state_device.device_storages(self.source, lambda storage: not _host(storage))
        self.device_first, self.device_views = state_device.equal_classes(storages, SAMPLE)

    def add(self, storage: torch.UntypedStorage, device: torch.device, ptr: int, n: int) -> int:
        """The blob holding this storage's bytes (new, or an earlier byte-equal one)."""
        host = (device == _CPU and _DEVICE_PATH is False) or _host(storage)  # (the common case first)
        if not host:
            if self.device_first is None:
                self.plan_device()
            key = (device, ptr, n)
            first = self.device_first.get(key, key)  # (one the plan did not see: a blob of its own)
            index = self.device_blob.get(first)
            if index is None:
                index = self.device_blob[first] = self.new_blob(storage, host, ptr, n)
            return index
        sample = (device, n, _SAMPLE_AT(ptr).raw + _SAMPLE_AT(ptr + n - SAMPLE).raw) if n > 2 * SAMPLE else (device, n, _string_at(ptr, n) if n else b"")
        bucket = self.buckets.get(sample)
        if bucket is None:
            bucket = self.buckets[sample] = []
        elif n <= 2 * SAMPLE:  # small: the key is the content
            return bucket[0]
        elif _MEMCMP is not None:
            pointers = self.pointers
            memcmp = _MEMCMP_HELD if n < RELEASE and _MEMCMP_HELD is not None else _MEMCMP if n < SPLIT else _memcmp_split
            for index in bucket:
                if memcmp(pointers[index], ptr, n) == 0:
                    return index
        else:
            for index in bucket:
                if _same_bytes(self.storages[index], storage):
                    return index
        index = self.new_blob(storage, host, ptr, n)
        bucket.append(index)
        return index

    def new_blob(self, storage: torch.UntypedStorage, host: bool, ptr: int, n: int) -> int:
        index = len(self.sizes)
        self.storages.append(storage)
        self.pointers.append(ptr)
        self.sizes.append(n)
        if self.writer is not None:
            self.emit_storage(storage, host, ptr, n)
        return index

    def emit_storage(self, storage, host: bool, ptr: int, n: int) -> None:
        if host and n < SMALL:
            data = _string_at(ptr, n) if n else b""
            if self.pending:  # after device blobs that wait for their copy: in the file's order
                self.pending.append(data)
                return
            self.staging += data
            if len(self.staging) >= CHUNK:
                self.flush_staging()
            return
        if host:
            # Everything before it first: device blobs waiting for their copy and the small host ones
            # after them (which flush_pending moves to the staging buffer), then the staging buffer.
            self.flush_pending()
        if self.staging:  # (never while device blobs wait: small ones then wait with them)
            self.flush_staging()
        if host:
            # The storage's own memory, no copy (``self.storages`` keeps it alive until the file is
            # written); a ctypes view costs 0.4 us against 2.7 for a tensor's numpy view.
            data = memoryview((ctypes.c_char * n).from_address(ptr)).cast("B")
            for start in range(0, n, CHUNK):
                self.append(data[start : start + CHUNK], False)
        else:  # a device: waits with others for one copy to the host, PENDING bytes at most
            view = self.device_views.get((storage.device, ptr, n))
            if view is None:
                view = _byte_view(storage)
            for start in range(0, n, CHUNK):
                piece = view[start : start + CHUNK] if n > CHUNK else view  # (a slice is one more op)
                self.pending.append(piece)
                self.pending_bytes += len(piece)
                if self.pending_bytes >= PENDING:
                    self.flush_pending()

    def flush_pending(self) -> None:
        """Copy the waiting device views to the host at once, and append them, with the small host
        storages that came after them, in their order."""
        if not self.pending:
            return
        pending, self.pending, self.pending_bytes = self.pending, [], 0
        host, offsets = state_device.to_host([x for x in pending if isinstance(x, torch.Tensor)])
        views = iter(offsets)
        for x in pending:
            if isinstance(x, torch.Tensor):
                if self.staging:
                    self.flush_staging()
                start = next(views)
                self.append(host[start : start + len(x)], True)  # slices keep ``host`` alive
            else:
                self.staging += x

    def flush_staging(self) -> None:
        self.append(self.staging, True)
        self.staging = bytearray()  # a new one: the writer may still be reading this one

    def append(self, buffer, copied: bool) -> None:
        self.batch.append(buffer)
        self.batch_bytes += len(buffer)
        self.batch_copied |= copied
        if self.batch_bytes >= CHUNK:
            self.flush()

    def flush(self) -> None:
        """Hand the batch over to the writer, then add its bytes to the CRC32 while it writes them."""
        if not self.batch:
            return
        batch, copied = self.batch, self.batch_copied
        if self.writer is not None:
            self.writer.put(batch, copied)
        self.batch, self.batch_bytes, self.batch_copied = [], 0, False
        crc, crc32 = self.crc, _CRC32
        for buffer in batch:
            crc = crc32(buffer, crc)
        self.crc = crc

    def finish(self) -> int:
        """Wait until every blob is written; the CRC32 of their bytes."""
        if self.staging:
            self.flush_staging()
        self.flush_pending()
        self.flush()
        self.close()
        if self.writer is not None and self.writer.error is not None:
            raise self.writer.error
        return self.crc

    def close(self) -> None:
        if self.writer is not None and self.writer.is_alive():
            self.writer.finish()


@contextlib.contextmanager
def _no_collection():
    """The garbage collector off while a checkpoint is made. The walk creates ~20,000 containers
    (Camelyon17: the index's rows and tree), which count toward a collection of every generation;
    one that falls inside the walk traverses the whole process's objects for nothing (they all die
    at its end) and took 0.15 s, in 2 of 9 writes, beside 0.12 s for the write itself. Freed at the
    end, they take their count back, so no collection is owed afterwards either."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def save_checkpoint(obj, path: Path) -> None:
    """Write ``obj``; a kill at any moment leaves the last good checkpoint (or its ``.prev``) intact.
    A value a checkpoint cannot hold (e.g. a numpy array in a method's state) is a ``TypeError``
    naming where it is; only a temporary was written, and it is removed."""
    path = Path(path)
    with _checkpoint_file(path) as handle, _no_collection():
        handle.write(MAGIC)
        blobs = _Blobs(handle, len(MAGIC))
        try:
            blobs.source = obj
            packer = _Packer(blobs)
            try:
                tree = packer.pack(obj)
            except _Unsupported as err:
                raise TypeError(f"{path.name}: cannot checkpoint the value at {err.where or 'the top'}: {err.what}; a checkpoint holds tensors, numbers, strings, bytes and dicts/lists/tuples/sets of them") from None
            # Every blob handed over (the writer may still be busy), no index yet: a kill here leaves
            # a torn temporary, never a damaged checkpoint.
            faults.reached("checkpoint_write")
            # The index is complete: encoded while the writer thread writes the last blobs.
            index = json.dumps({"blobs": blobs.sizes, "storages": packer.storages, "tensors": packer.tensors, "tree": tree}, separators=(",", ":"), check_circular=False).encode()
            data_crc = blobs.finish()
        finally:
            blobs.close()
        handle.write(index)
        handle.write(TRAILER.pack(MAGIC, len(MAGIC) + sum(blobs.sizes), len(index), zlib.crc32(index), data_crc))


# --- loading ----------------------------------------------------------------------------------------
def load_checkpoint(path: Path):
    """The checkpoint's object, on the CPU; :class:`CorruptCheckpoint` if it is damaged."""
    path = Path(path)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < LEGACY_TRAILER.size:
            raise CorruptCheckpoint(f"{path}: truncated ({size} bytes)")
        handle.seek(max(0, size - TRAILER.size))
        tail = handle.read()
        if tail[-LEGACY_TRAILER.size :].startswith(LEGACY_MAGIC):
            handle.seek(0)
            return _load_legacy(path, handle.read())
        if len(tail) < TRAILER.size or not tail.startswith(MAGIC):
            raise _damaged(path)
        _, offset, length, index_crc, data_crc = TRAILER.unpack(tail)
        if offset + length + TRAILER.size != size:
            raise _damaged(path)
        handle.seek(offset)
        raw = handle.read(length)
        if zlib.crc32(raw) != index_crc:
            raise _damaged(path)
        try:
            index = json.loads(raw)
            blobs = index["blobs"]
            if len(MAGIC) + sum(blobs) != offset:
                raise ValueError("blob sizes do not add up")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpoint(f"{path}: unreadable index ({exc})") from exc
        handle.seek(0)
        if handle.read(len(MAGIC)) != MAGIC:
            raise _damaged(path)
        buffers, crc = [], 0
        for n in blobs:
            buffer = torch.empty(n, dtype=torch.uint8)
            view = buffer.numpy()
            if handle.readinto(view) != n:
                raise _damaged(path)
            crc = zlib.crc32(view, crc)
            buffers.append(buffer)
        if crc != data_crc:
            raise _damaged(path)
    try:
        return _Unpacker(index, buffers).unpack(index["tree"])
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as exc:
        raise CorruptCheckpoint(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc


def _damaged(path: Path) -> CorruptCheckpoint:
    return CorruptCheckpoint(f"{path}: damaged or cut short (checksum mismatch)")


def save_checkpoint_v1(obj, path: Path) -> None:
    """The ``FMBCKPT1`` writer of earlier releases (``torch.save`` built whole in memory, every copy
    of a tensor written, then magic + length + CRC32), kept so that tests can make the checkpoint an
    older job left and benchmarks can measure what the current format replaced. The engine never
    calls it."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getbuffer()
    with atomic_file(path) as handle:
        handle.write(payload)
        handle.write(LEGACY_TRAILER.pack(LEGACY_MAGIC, len(payload), zlib.crc32(payload)))
        if path.exists():
            os.replace(path, previous(path))


def _load_legacy(path: Path, data: bytes):
    """An ``FMBCKPT1`` checkpoint (before streaming and deduplication): read whole, as it was written."""
    magic, length, crc = LEGACY_TRAILER.unpack(data[-LEGACY_TRAILER.size :])
    payload = memoryview(data)[: -LEGACY_TRAILER.size]
    if magic != LEGACY_MAGIC or length != len(payload) or zlib.crc32(payload) != crc:
        raise _damaged(path)
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError/UnpicklingError/EOFError for bad files
        raise CorruptCheckpoint(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc


class _Unpacker:
    def __init__(self, index: dict, buffers: list[torch.Tensor]):
        self.rows, self.buffers = index["tensors"], buffers
        self.storages: list[torch.UntypedStorage] = []
        taken = set()
        for blob in index["storages"]:
            # The first storage of a blob takes the bytes read; byte-equal copies get their own memory.
            self.storages.append((buffers[blob] if blob not in taken else buffers[blob].clone()).untyped_storage())
            taken.add(blob)
        self.tensors: dict[int, torch.Tensor] = {}
        self.memo: list = []

    def tensor(self, index: int) -> torch.Tensor:
        if index in self.tensors:
            return self.tensors[index]
        storage, offset, dtype, shape, stride, flags = self.rows[index]
        t = torch.empty(0, dtype=_DTYPES[dtype]).set_(self.storages[storage], offset, shape, stride if stride is not None else _contiguous_stride(shape))
        if flags & 1:
            t = torch.nn.Parameter(t, requires_grad=bool(flags & 2))
        elif flags & 2:
            t.requires_grad_(True)
        self.tensors[index] = t
        return t

    def register(self, obj):
        self.memo.append(obj)
        return obj

    def unpack(self, x):
        if type(x) is list:
            out = self.register([])
            out.extend(self.unpack(v) for v in x)
            return out
        if type(x) is not dict:
            return x
        tag = next(iter(x))
        value = x[tag]
        if tag == "T":
            return self.tensor(value)
        if tag == "r":
            return self.memo[value]
        if tag == "t":
            return tuple(self.unpack(v) for v in value)
        if tag in ("d", "o", "c", "D", "O", "C"):
            out = self.register({"d": dict, "o": collections.OrderedDict, "c": collections.Counter}[tag.lower()]())
            pairs = value.items() if tag.islower() else value
            for k, v in pairs:
                key = k if tag.islower() else self.unpack(k)
                out[key] = self.unpack(v)
            if "m" in x:
                out._metadata = self.unpack(x["m"])
            return out
        if tag == "s":
            out = self.register(set())
            out.update(self.unpack(v) for v in value)
            return out
        if tag == "b":
            return base64.b64decode(value)
        if tag == "ba":
            return self.register(bytearray(base64.b64decode(value)))
        if tag == "j":
            return complex(*value)
        if tag == "z":
            return torch.Size(value)
        if tag == "y":
            return _DTYPES[value]
        if tag == "v":
            return torch.device(value)
        raise ValueError(f"unknown tag {tag!r}")


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
        if len(data) != size or zlib.crc32(data) != crc:
            raise CorruptCheckpoint(f"{self.path}: does not hold the {rows} history rows ({size} bytes) the checkpoint refers to")
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
        self.crc = zlib.crc32(data, self.crc)
        self.rows += len(rows)


def to_device(tree, device: torch.device):
    """Tensors in nested dicts/lists/tuples moved to ``device`` (for method state a client restores)."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device) for v in tree)
    return tree
