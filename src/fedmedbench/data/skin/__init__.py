"""Dermoscopy, PRR-FL protocol: HAM10000 (clients A-C and the OOD cohort) + ISIC 2017 (client D).

Raw files (``DOWNLOADS``), all under their real names:

* ``HAM10000_images_part1.zip`` / ``HAM10000_images_part2.zip``: 5,000 + 5,015 JPEGs
  ``ISIC_00xxxxx.jpg`` (600 x 450), Harvard Dataverse doi:10.7910/DVN/DBW86T (terms to accept:
  manual download);
* ``HAM10000_metadata.csv``: the Dataverse metadata, the version **with the ``dataset`` column**
  (acquisition source). FLamby's byte copy ships in ``resources/ham10000/`` and can be used as is;
* ``ISIC-2017_Training_Data.zip``: 2,000 ``ISIC_<7 digits>.jpg`` (plus superpixel PNGs and a
  metadata CSV, ignored), ISIC challenge S3;
* ``ISIC-2017_Training_Part3_GroundTruth.csv``: ``image_id,melanoma,seborrheic_keratosis``.

Clients (PRR-FL Table 1): A = HAM ``vidir_modern``, B = ``vidir_molemax``, C = ``rosendahl``, each
restricted to ``dx`` in {nv, bkl, mel}; D = the ISIC 2017 training set. The out-of-distribution cohort
(PRR-FL Table 3, 427 images) is HAM ``vienna_dias`` restricted to the same classes; it is written as
the extra store client ``OOD`` whose rows are all ``test`` in the split file. Labels: nv / nevus = 0,
bkl / seborrheic keratosis = 1, mel / melanoma = 2 (int64).

Images: centre square crop on the shorter side, then one resize to ``size`` x ``size`` (128 by
default) with Pillow's BILINEAR filter. Pillow widens the filter support by the downscale factor,
so this is an antialiased (triangle-filter) downscale, the same as torchvision's default ``Resize``
on PIL images; PRR-FL's own resize method is unpublished. JPEGs are decoded in full (no draft
mode) and converted to RGB; EXIF orientation is ignored (as PRR-FL's cv2 reader does by default
for these files, which carry no rotation).

Split of record: PRR-FL's CSVs (``resources/skin_prrfl/client{A..D}/{train,valid,test}_client{X}.csv``)
with their row order; only ``image_id`` and ``label`` are read (client D's train/valid files misuse
the ``lesion_id``/``dx`` columns for the ISIC 2017 flags). Synthetic data cannot match those ids,
so ``permutation="seeded"`` draws a class-stratified 70/10/20 split from ``seed`` instead.
``group`` = HAM ``lesion_id`` (several images of one lesion share it), or the image id for ISIC.

The package's parts: ``sites`` (the clients of each protocol and the counts of record), ``download``
(the raw files and where they come from), ``raw`` (reading the raw release into the canonical store),
``splits`` (the splits of record) and ``synthetic`` (the synthetic twin, in the release's formats).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import check_protocol

# The family's parts, loaded so that `<family>.<part>.<name>` resolves: import what you need from them.
from . import download, raw, sites, splits, synthetic  # noqa: F401
from .download import DOWNLOADS
from .sites import PROTOCOLS
from .synthetic import write_synthetic

# The family interface (fedmedbench.data): nothing else is exported.
__all__ = ["DOWNLOADS", "PROTOCOLS", "preprocess", "split", "write_synthetic"]


# The family interface (see fedmedbench.data): each protocol's reader and split of record.
def preprocess(
    raw_files: dict, store_dir, protocol: str, *, expect_real_counts: bool = False, size: int | None = None, log=print
) -> dict:
    check_protocol("skin", protocol, PROTOCOLS)
    return raw.preprocess_prrfl(raw_files, Path(store_dir), expect_real_counts=expect_real_counts, size=size, log=log)


def split(store_dir, out_csv, protocol: str, *, permutation: str = "default", seed: int = 0) -> pd.DataFrame:
    """``permutation``: ``prrfl`` (= ``default``, PRR-FL's CSVs) or ``seeded`` (stratified 70/10/20)."""
    check_protocol("skin", protocol, PROTOCOLS)
    permutation = "prrfl" if permutation == "default" else permutation
    return splits.split_prrfl(Path(store_dir), Path(out_csv), permutation=permutation, seed=seed)
