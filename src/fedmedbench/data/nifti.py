"""The check that a NIfTI file is whole, shared by the families that read NIfTI volumes (prostate, a
user's ``folders`` data): SimpleITK alone reads a cut-short ``.nii.gz`` as zeros without complaint.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from ..errors import DataError

# NIfTI-1 datatype codes of floating-point voxels, with their numpy types (complex: two floats each).
FLOAT_DATATYPES = {16: "f4", 64: "f8", 32: "f4", 1792: "f8"}


def check_nifti_complete(path: str | os.PathLike, error: type[DataError] = DataError, finite: bool = False) -> None:
    """Fail on a cut-short NIfTI file. SimpleITK reads a truncated ``.nii.gz`` without complaint and
    fills the missing voxels with zeros (black slices that still carry prostate labels), so the whole
    gzip stream is decompressed (a broken stream fails here) and its length compared with what the
    NIfTI-1 header promises: vox_offset + prod(dim) * bitpix / 8 bytes. A problem is ``error`` (the
    caller's family error) naming the file.

    ``finite``: also fail on NaN or infinite voxels of a floating-point NIfTI-1 file, counted in the
    stream: SimpleITK reads them as 0 without a word, where a float TIFF's NaN is refused."""
    path = Path(path)
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    size, header, voxels, not_finite, rest = 0, b"", None, 0, b""
    try:
        with opener(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                if len(header) < 348:
                    header += chunk[: 348 - len(header)]
                    if finite and len(header) == 348:
                        voxels = _float_voxels(header)
                if voxels is not None:
                    dtype, start = voxels
                    data = rest + chunk[max(0, start - size) :] if size + len(chunk) > start else b""
                    whole = len(data) - len(data) % dtype.itemsize
                    not_finite += int(np.count_nonzero(~np.isfinite(np.frombuffer(data[:whole], dtype))))
                    rest = data[whole:]
                size += len(chunk)
    except (EOFError, OSError, zlib.error) as exc:
        raise error(f"{path}: damaged or cut-short file ({exc})") from exc
    for endian in "<>":
        if len(header) == 348 and struct.unpack(endian + "i", header[:4])[0] == 348:  # NIfTI-1
            dims = struct.unpack(endian + "8h", header[40:56])
            bitpix = struct.unpack(endian + "h", header[72:74])[0]
            vox_offset = struct.unpack(endian + "f", header[108:112])[0]
            count = int(np.prod([max(d, 1) for d in dims[1 : dims[0] + 1]]))
            expected = int(vox_offset) + count * bitpix // 8
            if size < expected:
                raise error(f"{path}: cut short: {size} bytes of image data where the header promises {expected}")
            if not_finite:
                raise error(non_finite_message(path, not_finite, count, "voxel"))
            return
    # NIfTI-2 or another format: the stream check above is all we can do without parsing it.


def non_finite_message(path, count: int, total: int, unit: str) -> str:
    """The one line refusing an image with NaN or infinite values (a NIfTI volume, a float TIFF)."""
    return (
        f"{path}: {count} NaN or infinite {unit} value(s) of {total}; there is no honest value to put in their "
        "place: replace them in the file (e.g. with the background value) and run again"
    )


def _float_voxels(header: bytes) -> tuple[np.dtype, int] | None:
    """(numpy type, byte offset of the voxels) of a floating-point NIfTI-1 file, else None."""
    for endian in "<>":
        if struct.unpack(endian + "i", header[:4])[0] == 348:
            datatype = struct.unpack(endian + "h", header[70:72])[0]
            if datatype not in FLOAT_DATATYPES:
                return None
            return np.dtype(endian + FLOAT_DATATYPES[datatype]), int(struct.unpack(endian + "f", header[108:112])[0])
    return None
