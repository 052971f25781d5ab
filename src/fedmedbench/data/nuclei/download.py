"""Where the nuclei archives come from: their names, download specs, licences and manual steps."""

from __future__ import annotations

from ..download import DownloadSpec

MONUSAC_TRAIN = "MoNuSAC_images_and_annotations.zip"
MONUSAC_TEST = "MoNuSAC_Testing_Data_and_Annotations.zip"
MONUSEG_TRAIN = "MoNuSeg_2018_Training_Data.zip"
MONUSEG_TEST = "MoNuSegTestData.zip"
TNBC_ZIP = "TNBC_NucleiSegmentation.zip"

_MONUSAC_LICENCE = "CC BY-NC-SA 4.0 (MoNuSAC2020 challenge Data page). Cite Verma et al., IEEE TMI 2021."
_MONUSEG_LICENCE = "CC BY-NC-SA 4.0 (MoNuSeg challenge Data page). Cite Kumar et al., IEEE TMI 2017 and 2019."


def _drive_step(upstream: str, page: str, filename: str) -> str:
    return (
        f"If Google Drive refuses the download (quota or virus-scan page), open {page}, download "
        f"'{upstream}' by hand and set data.nuclei.files.{filename}.archive in config/config.yaml to its path."
    )


DOWNLOADS = [
    DownloadSpec(
        name="nuclei",
        url="gdrive:1lxMZaAPSpEHLSxGA9KKMt_r-4S8dwLhq",
        filename=MONUSAC_TRAIN,
        sha256="5b7cbeb34817a8f880d3fddc28391e48d3329a91bf3adcbd131ea149a725cd92",  # torch-em's hash
        licence=_MONUSAC_LICENCE,
        manual_step=_drive_step(MONUSAC_TRAIN, "https://monusac-2020.grand-challenge.org/Data/", MONUSAC_TRAIN),
        homepage="https://monusac-2020.grand-challenge.org/Data/",
    ),
    DownloadSpec(
        name="nuclei",
        url="gdrive:1G54vsOdxWY1hG7dzmkeK3r0xz9s-heyQ",
        filename=MONUSAC_TEST,  # upstream name: "MoNuSAC Testing Data and Annotations.zip"
        sha256="bcbc38f6bf8b149230c90c29f3428cc7b2b76f8acd7766ce9fc908fc896c2674",  # torch-em's hash
        licence=_MONUSAC_LICENCE,
        manual_step=_drive_step(
            "MoNuSAC Testing Data and Annotations.zip", "https://monusac-2020.grand-challenge.org/Data/", MONUSAC_TEST
        ),
        homepage="https://monusac-2020.grand-challenge.org/Data/",
    ),
    DownloadSpec(
        name="nuclei",
        url="gdrive:1ZgqFJomqQGNnsx7w7QBzQQMVA16lbVCA",
        filename=MONUSEG_TRAIN,  # upstream name: "MoNuSeg 2018 Training Data.zip"
        sha256="25d3d3185bb2970b397cafa72eb664c9b4d24294aee382e7e3df9885affce742",  # torch-em's hash
        licence=_MONUSEG_LICENCE,
        manual_step=_drive_step(
            "MoNuSeg 2018 Training Data.zip", "https://monuseg.grand-challenge.org/Data/", MONUSEG_TRAIN
        ),
        homepage="https://monuseg.grand-challenge.org/Data/",
    ),
    DownloadSpec(
        name="nuclei",
        url="gdrive:1NKkSQ5T0ZNQ8aUhh0a8Dt2YKYCQXIViw",
        filename=MONUSEG_TEST,
        sha256="13e522387ae8b1bcc0530e13ff9c7b4d91ec74959ef6f6e57747368d7ee6f88a",  # torch-em's hash
        licence=_MONUSEG_LICENCE,
        manual_step=_drive_step(MONUSEG_TEST, "https://monuseg.grand-challenge.org/Data/", MONUSEG_TEST),
        homepage="https://monuseg.grand-challenge.org/Data/",
    ),
    DownloadSpec(
        name="nuclei",
        url="https://zenodo.org/records/1175282/files/TNBC_NucleiSegmentation.zip",
        filename=TNBC_ZIP,
        sha256="da708c3a988f4ad4b9bbb9283b387faf703f0bc0e5e689927306bd27ea13a57f",  # v1.0, torch-em's hash
        licence=(
            "As stated on Zenodo record 1175282 (v1.0; not verified here, check it before redistributing). "
            "Cite Naylor et al., IEEE TMI 2018."
        ),
        manual_step=(
            "If the download fails, fetch TNBC_NucleiSegmentation.zip (v1.0) by hand from "
            "https://zenodo.org/records/1175282 and set "
            f"data.nuclei.files.{TNBC_ZIP}.archive in config/config.yaml to its path."
        ),
        homepage="https://zenodo.org/records/1175282",
    ),
]
