"""Multi-site prostate MRI (SAML release ``Processed_data_nii.zip``), HarmoFL protocol.

The release holds six site folders of NIfTI volumes, ``CaseNN.nii.gz`` plus
``CaseNN_segmentation.nii.gz`` (``_Segmentation`` at BMC). HarmoFL renames two
sites (RUNMC -> ISBI, BMC -> ISBI_1.5) and turns every volume into 2.5D
slices:

* clip the volume at its 99th percentile, min-max to 0..255, truncate to uint8;
* for every slice i in 1..D-2 whose mask is not empty: image = slices
  [i-1, i, i+1] as 3 channels (H x W x 3), label = slice i with 2 -> 1;
* cases in the order of the file names in ``<site>-dir.npy`` (sorted names),
  slices in increasing i.

That list is permuted by ``<site>-index.npy`` and cut 64/16/20 at slice level
(so slices of one patient land in train and test: the ``group`` column of the
split CSV makes that leakage visible). The permutations only fit the real
release, whose per-site slice counts (``HARMOFL_SLICE_COUNTS``) double as the
post-download check.

Protocol ``fedlwr`` (Fed-LWR, "PMR"): the same release, clients ``Site1..Site6`` = the
release folders sorted alphabetically (BIDMC, BMC, HK, I2CVB, RUNMC, UCL). Every slice whose
mask is not empty is kept (first and last slices included, as Fed-LWR's ``prepare_pmr``); each
slice is normalised on its own (clip to [min, 99th percentile], min-max to 0..255, rounded: Fed-LWR's
``mr_norm`` divides by the percentile instead of the range, which is the same map when the slice
minimum is 0); mask = label > 0; 384 x 384. Fed-LWR stores single-channel slices but its UNet takes
3 channels: ``fedlwr`` replicates the slice into 3 identical channels, ``fedlwr_stack`` stacks the
normalised neighbours [i-1, i, i+1] (HarmoFL's 2.5D input; the edge slices repeat themselves). The
split is by case, 6:2:2 (val and test get max(1, round(0.2 n)) cases each, train the rest) from a
seeded permutation of the sorted case ids, so no case is in two splits.

``write_synthetic_release`` writes a small archive in the same layout with six
visibly different intensity profiles, for tests and for running the pipeline
without the real data.

The package's parts: ``sites`` (the clients of each protocol and the counts of record), ``download``
(the raw files and where they come from), ``raw`` (reading the raw release into the canonical store),
``splits`` (the splits of record) and ``synthetic`` (the synthetic twin, in the release's formats).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from .. import check_protocol

# The family's parts, loaded so that `<family>.<part>.<name>` resolves: import what you need from them.
from . import download, raw, sites, splits, synthetic  # noqa: F401
from .download import DOWNLOADS
from .sites import PROTOCOLS

# The family interface (fedmedbench.data): nothing else is exported.
__all__ = ["DOWNLOADS", "PROTOCOLS", "preprocess", "split", "write_synthetic"]


# The family interface (see fedmedbench.data): each protocol's reader and split of record.
def write_synthetic(out_dir: str | os.PathLike, seed: int = 0, **options) -> dict:
    return synthetic.write_synthetic_release(Path(out_dir) / download.DOWNLOAD.filename, seed=seed, **options)


def preprocess(
    raw_files: dict, store_dir, protocol: str, *, expect_real_counts: bool = False, size: int | None = None, log=print
) -> dict:
    """``harmofl``: HarmoFL's 2.5D slices; ``fedlwr`` / ``fedlwr_stack``: Fed-LWR's slices, replicated / stacked."""
    check_protocol("prostate", protocol, PROTOCOLS)
    raw_root = Path(raw_files[download.DOWNLOAD.filename])
    if protocol == "harmofl":
        return raw.preprocess_harmofl(
            raw_root, Path(store_dir), expect_real_counts=expect_real_counts, size=size, log=log
        )
    return raw.preprocess_fedlwr(
        raw_root,
        Path(store_dir),
        channels=raw.FEDLWR_CHANNELS[protocol],
        expect_real_counts=expect_real_counts,
        size=size,
        log=log,
    )


def split(store_dir, out_csv, protocol: str, *, permutation: str = "default", seed: int = 0) -> pd.DataFrame:
    """``harmofl``: ``harmofl`` (= ``default``, HarmoFL's index files) or ``seeded``.
    ``fedlwr*``: ``seeded`` (= ``default``, case-level 6:2:2) or ``sorted``."""
    check_protocol("prostate", protocol, PROTOCOLS)
    if protocol == "harmofl":
        permutation = "harmofl" if permutation == "default" else permutation
        return splits.split_harmofl(Path(store_dir), Path(out_csv), permutation=permutation, seed=seed)
    permutation = "seeded" if permutation == "default" else permutation
    return splits.split_fedlwr(Path(store_dir), Path(out_csv), permutation=permutation, seed=seed)
