"""Camelyon17-WILDS v1.0 patches (HarmoFL classification task, 5 hospital clients).

The WILDS release is one tar.gz (~10.7 GB, no published checksum) holding::

    RELEASE_v1.0.txt
    metadata.csv                 ,patient,node,x_coord,y_coord,tumor,slide,center,split
    patches/patient_{PPP}_node_{N}/patch_patient_{PPP}_node_{N}_x_{X}_y_{Y}.png

WILDS extracts the archive *into* ``<root>/camelyon17_v1.0/``, so the members
sit at the top level of the archive; third-party copies sometimes carry the
``camelyon17_v1.0/`` folder. Both are accepted: the release root is the first
folder (breadth first, 3 levels) holding ``metadata.csv`` and ``patches/``.

Parsing rules (``datasets.md`` §1):

* ``patient`` is read as a string and zero-padded to 3 digits (``004`` stays
  ``004``); the patch path is built from the WILDS template exactly;
* patches are 96x96 PNGs written from OpenSlide's RGBA regions: alpha is
  dropped (``convert('RGB')``, as WILDS and HarmoFL do);
* clients are the five hospitals = WILDS ``center`` 0..4, named
  ``hospital1`` .. ``hospital5`` like HarmoFL's ``data.pkl`` keys (paper
  columns A..E). hospital k = center k-1 is our reading; HarmoFL's own split
  file could not be retrieved;
* labels are ``tumor`` (0/1) as int64.

The 455,954 patches are decoded by a small thread pool straight into
``np.lib.format.open_memmap`` files (never all in memory) inside a staged
store folder that is renamed into place only when every client is complete;
training then memory-maps ``images.npy``.

Split of record (ours; HarmoFL's is unrecoverable): per hospital, rows sorted
by patch id, permuted with a generator seeded by (seed, crc32(client)), 20 %
test, then 80/20 train/val of the rest (image level, HarmoFL-like). The slide
is the ``group`` so slide-level leakage is visible; ``permutation="slide"``
puts whole slides in one split instead.

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
