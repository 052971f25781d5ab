"""RIF retinal fundus (DoFE release), Fed-LWR protocol: optic disc rim / cup segmentation, 4 clients.

The release (one Google Drive zip, root folder ``Fundus/``) holds four domains::

    Fundus/Domain{1..4}/{train,test}/ROIs/image/<name>.png   RGB disc-centred crops
    Fundus/Domain{1..4}/{train,test}/ROIs/mask/<name>.png    grey: 0 = cup, 128 = rim, 255 = background

Domain1 = Drishti-GS (50/51 train/test), Domain2 = RIM-ONE r3 (99/60), Domain3 = REFUGE train
(320/80), Domain4 = REFUGE val (320/80). Clients are the domains; paper tables call them Site1..4.

Values between the three levels (anti-aliasing, resampling) are **thresholded**, never compared for
equality, with DoFE's class rule: grey <= 50 -> cup, 50 < grey <= 200 -> rim, grey > 200 ->
background, on any value including interpolated ones. Stored labels are
Fed-LWR's three disjoint classes, uint8 0 = background, 1 = rim, 2 = cup. That encoding is
lossless for the DoFE/FedDG disc-cup convention too: disc = label >= 1 (rim and cup), cup =
label == 2; ``disc_cup`` returns DoFE's two overlapping channels [cup, disc] from stored labels.

Resize to 384 x 384 (protocols ``fedlwr`` and ``fedlwr_bilinear_masks``):

* images, ``fedlwr``: bilinear with OpenCV ``INTER_LINEAR`` semantics (half-pixel centres, 2 x 2
  taps, no antialiasing), in floating point (``resize_bilinear``); it can differ from OpenCV by one
  grey level (OpenCV rounds fixed-point weights);
* masks, ``fedlwr``: nearest neighbour on the class map (our choice: no new values are invented);
* ``fedlwr_bilinear_masks``: the official ``preproces_rif.py`` (``prepare_fundus``) exactly. It maps
  the grey mask to classes first, ``2 - uint8(grey / 127)`` (grey < 127 -> cup, < 254 -> rim, else
  background), then calls ``cv2.resize(mask, (384, 384), cv2.INTER_NEAREST)``, whose third positional
  argument is ``dst``: the class map is resized **bilinearly** (uint8, OpenCV's fixed-point rounding),
  so a pixel between background (0) and cup (2) can become rim (1). Its image call
  ``cv2.resize(img, (384, 384), cv2.INTER_CUBIC)`` is bilinear for the same reason. Both go through
  ``opencv_resize.resize_linear_u8``, OpenCV's 8-bit ``INTER_LINEAR`` bit for bit.

File lists are sorted by name (the official loader's unsorted ``glob`` is filesystem-dependent).
Mask paths are built from path components, not by replacing the substring ``image`` (which breaks
DoFE's loader when the root path contains "image"). The official train folder is split 4:1 into
train/val per domain (first ``int(0.8 n)`` of a seeded permutation = train, as Fed-LWR's first
80 % of its list), the official test folder is the test split.

The package's parts: ``sites`` (the clients of each protocol and the counts of record), ``download``
(the raw files and where they come from), ``raw`` (reading the raw release into the canonical store),
``splits`` (the splits of record) and ``synthetic`` (the synthetic twin, in the release's formats).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import check_protocol

# The family's parts, loaded so that `<family>.<part>.<name>` resolves: import what you need from them.
from . import download, opencv_resize, raw, sites, splits, synthetic  # noqa: F401
from .download import DOWNLOADS
from .sites import PROTOCOLS
from .synthetic import write_synthetic

# The family interface (fedmedbench.data): nothing else is exported.
__all__ = ["DOWNLOADS", "PROTOCOLS", "preprocess", "split", "write_synthetic"]


# The family interface (see fedmedbench.data): each protocol's reader and split of record.
def preprocess(
    raw_files: dict, store_dir, protocol: str, *, expect_real_counts: bool = False, size: int | None = None, log=print
) -> dict:
    """``fedlwr``: nearest-neighbour masks; ``fedlwr_bilinear_masks``: the official bilinear masks."""
    check_protocol("fundus", protocol, PROTOCOLS)
    if download.ARCHIVE not in raw_files:
        raise sites.FundusDataError(f"raw input {download.ARCHIVE!r} not given (got {sorted(raw_files)})")
    return raw.preprocess_fedlwr(
        Path(raw_files[download.ARCHIVE]),
        Path(store_dir),
        mask_resample=raw.MASK_RESAMPLE[protocol],
        expect_real_counts=expect_real_counts,
        size=size,
        log=log,
    )


def split(store_dir, out_csv, protocol: str, *, permutation: str = "default", seed: int = 0) -> pd.DataFrame:
    """``permutation``: ``seeded`` (= ``default``) or ``sorted`` (name order, no shuffle)."""
    check_protocol("fundus", protocol, PROTOCOLS)
    permutation = "seeded" if permutation == "default" else permutation
    return splits.split_fedlwr(Path(store_dir), Path(out_csv), permutation=permutation, seed=seed)
