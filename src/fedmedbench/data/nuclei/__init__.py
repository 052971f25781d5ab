"""Histology nuclei segmentation (HarmoFL, 6 clients): MoNuSAC2020 x 4 organs, MoNuSeg 2018, TNBC.

Clients (paper columns A..F, our documented reading of med-air/HarmoFL#3):

====  ====================  ===========================================================
A     ``MoNuSAC_breast``    MoNuSAC2020 train + test images of breast patients
B     ``MoNuSAC_kidney``    ... kidney
C     ``MoNuSAC_lung``      ... lung
D     ``MoNuSAC_prostate``  ... prostate
E     ``MoNuSeg``           MoNuSeg 2018 (Kumar et al.), 30 train + 14 test images
F     ``TNBC``              TNBC (Naylor et al. 2018), 50 images of 11 patients
====  ====================  ===========================================================

Raw files (five archives; their names under ``raw/`` have no spaces, the
folders inside keep the real names, spaces included):

* ``MoNuSAC_images_and_annotations/<patient>/<patient>_<k>.{svs,tif,xml}`` and
  ``MoNuSAC Testing Data and Annotations/...`` (same layout). The organ comes
  from the patient id (``TCGA-XX-XXXX``) through the official organ document
  (patient lists as in torch-em's ``ORGAN_SPLITS``). Only sub-images with a
  ``.tif`` are used (reading ``.svs`` would need OpenSlide / JPEG codecs); an
  ``.xml`` with only an ``.svs`` beside it is skipped and logged.
* ``MoNuSeg 2018 Training Data/{Tissue Images/*.tif, Annotations/*.xml}`` and
  ``MoNuSegTestData/*.{tif,xml}``; images and annotations are paired by file stem.
* ``TNBC_NucleiSegmentation/Slide_NN/NN_k.png`` with masks in ``GT_NN/NN_k.png``.

``__MACOSX`` folders and hidden / AppleDouble ``._*`` files are ignored everywhere.

Masks: ImageScope XML polygons (``Vertex`` X = column, Y = row) are filled with
``skimage.draw.polygon`` on the image grid, which clips vertices outside the
image; the binary mask is the union of every region of every cell type.
Regions with fewer than 3 vertices are skipped (and counted). MoNuSAC's
``Ambiguous`` annotations (test set only: areas with unclear boundaries) are
**not drawn**: they are neither nucleus nor a separate class, because our
labels are binary and the training code has no ignore index
(``ambiguous="foreground"`` draws them instead). TNBC masks are thresholded
at > 0. Images lose their alpha channel (MoNuSAC TIFFs and TNBC PNGs are RGBA).

Protocols: ``harmofl`` resizes every whole image (and mask) to
``size x size`` (256 by default; bilinear image, nearest mask), HarmoFL's
"reshaped"; ``harmofl_tiled`` cuts images at native resolution into
``size x size`` tiles (last row/column of tiles shifted to end at the border,
images smaller than a tile padded at the bottom/right with white image and
background mask), which keeps nuclei at their true scale.

Split of record: per client, image-level (all tiles of one image in one
split, ``group`` = image id), seeded, with HarmoFL's fractions: images sorted,
permuted by a generator seeded with (seed, crc32(client)), train = first
int(0.64 n), val up to int(0.8 n), test the rest. ``permutation="patient"``
groups by patient instead. Client sizes are kept unequal (no truncation here).

The package's parts: ``sites`` (the clients of each protocol and the counts of record), ``download``
(the raw files and where they come from), ``raw`` (reading the raw release into the canonical store),
``splits`` (the splits of record) and ``synthetic`` (the synthetic twin, in the release's formats).
"""

from __future__ import annotations

# The family's parts, loaded so that `<family>.<part>.<name>` resolves: import what you need from them.
from . import download, raw, sites, splits, synthetic  # noqa: F401
from .download import DOWNLOADS
from .raw import preprocess
from .sites import PROTOCOLS
from .splits import split
from .synthetic import write_synthetic

# The family interface (fedmedbench.data): nothing else is exported.
__all__ = ["DOWNLOADS", "PROTOCOLS", "preprocess", "split", "write_synthetic"]
