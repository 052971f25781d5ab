"""Where Camelyon17-WILDS v1.0 comes from: the download spec, its licence and the manual step."""

from __future__ import annotations

from ..download import DownloadSpec

URL = "https://worksheets.codalab.org/rest/bundles/0xe45e15f39fb54e9d9e919556af67aabe/contents/blob/"
ARCHIVE = "camelyon17_v1.0.tar.gz"

DOWNLOAD = DownloadSpec(
    name="camelyon17",
    url=URL,
    filename=ARCHIVE,
    sha256=None,  # WILDS publishes none: pin the one logged at the first download
    licence=(
        "CC0 1.0 (public domain), as stated by WILDS for Camelyon17-WILDS v1.0. "
        "Cite Bandi et al., IEEE TMI 2019 (CAMELYON17) and Koh et al., ICML 2021 (WILDS)."
    ),
    manual_step=(
        "Download the Camelyon17-WILDS v1.0 archive (~10.7 GB tar.gz) by hand from "
        f"{URL} (also linked from https://wilds.stanford.edu/downloads; WILDS saves it as archive.tar.gz) "
        f"and set data.camelyon17.files.{ARCHIVE}.archive in config/config.yaml to its path."
    ),
    homepage="https://wilds.stanford.edu/datasets/#camelyon17",
)

DOWNLOADS = [DOWNLOAD]
