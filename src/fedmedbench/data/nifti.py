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


def check_nifti_complete(path: str | os.PathLike, error: type[DataError] = DataError) -> None:
    """Fail on a cut-short NIfTI file. SimpleITK reads a truncated ``.nii.gz`` without complaint and
    fills the missing voxels with zeros (black slices that still carry prostate labels), so the whole
    gzip stream is decompressed (a broken stream fails here) and its length compared with what the
    NIfTI-1 header promises: vox_offset + prod(dim) * bitpix / 8 bytes. A problem is ``error`` (the
    caller's family error) naming the file."""
    path = Path(path)
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    size, header = 0, b""
    try:
        with opener(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                if len(header) < 348:
                    header += chunk[: 348 - len(header)]
                size += len(chunk)
    except (EOFError, OSError, zlib.error) as exc:
        raise error(f"{path}: damaged or cut-short file ({exc})") from exc
    for endian in "<>":
        if len(header) == 348 and struct.unpack(endian + "i", header[:4])[0] == 348:  # NIfTI-1
            dims = struct.unpack(endian + "8h", header[40:56])
            bitpix = struct.unpack(endian + "h", header[72:74])[0]
            vox_offset = struct.unpack(endian + "f", header[108:112])[0]
            expected = int(vox_offset) + int(np.prod([max(d, 1) for d in dims[1 : dims[0] + 1]])) * bitpix // 8
            if size < expected:
                raise error(f"{path}: cut short: {size} bytes of image data where the header promises {expected}")
            return
    # NIfTI-2 or another format: the stream check above is all we can do without parsing it.
