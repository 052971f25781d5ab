"""Where the dermoscopy files come from: HAM10000 (Harvard Dataverse) and ISIC 2017, with licences and manual steps."""

from __future__ import annotations

from ..download import MANUAL, DownloadSpec

HAM_PART1 = "HAM10000_images_part1.zip"
HAM_PART2 = "HAM10000_images_part2.zip"
HAM_METADATA = "HAM10000_metadata.csv"
ISIC_IMAGES = "ISIC-2017_Training_Data.zip"
ISIC_GT = "ISIC-2017_Training_Part3_GroundTruth.csv"

HAM_DOI = "https://doi.org/10.7910/DVN/DBW86T"
HAM_LICENCE = (
    "HAM10000 (Tschandl et al., Sci. Data 2018), Harvard Dataverse doi:10.7910/DVN/DBW86T: the Dataverse "
    "dataset terms must be accepted; the ISIC Archive lists the images as CC BY-NC 4.0 (non-commercial, "
    "attribution). Cite Tschandl, Rosendahl & Kittler 2018."
)
ISIC_LICENCE = (
    "ISIC 2017 challenge training data (Codella et al. 2018), ISIC Archive terms: CC BY-NC 4.0 per the "
    "archive (per-image licences may apply); cite the ISIC 2017 challenge paper."
)


def _ham_manual_step(filename: str, what: str) -> str:
    return (
        f"Open {HAM_DOI} (Harvard Dataverse, HAM10000), accept the dataset terms, download {what} and set "
        f"data.skin.files.{filename}.archive in config/config.yaml to the path of the downloaded file."
    )


DOWNLOADS = [
    DownloadSpec(
        name="skin",
        url=MANUAL,
        filename=HAM_PART1,
        sha256=None,  # none published: pin the one logged at the first download
        licence=HAM_LICENCE,
        manual_step=_ham_manual_step(HAM_PART1, "HAM10000_images_part1.zip (5,000 JPEGs)"),
        homepage=HAM_DOI,
    ),
    DownloadSpec(
        name="skin",
        url=MANUAL,
        filename=HAM_PART2,
        sha256=None,
        licence=HAM_LICENCE,
        manual_step=_ham_manual_step(HAM_PART2, "HAM10000_images_part2.zip (5,015 JPEGs)"),
        homepage=HAM_DOI,
    ),
    DownloadSpec(
        name="skin",
        url=MANUAL,
        filename=HAM_METADATA,
        # FLamby's copy of the Dataverse original (resources/ham10000/HAM10000_metadata.csv).
        sha256="de17ec44cb25ea9c3f6378ba18d69224c740afd62e86ec2edc6a894d6aa663d3",
        licence=HAM_LICENCE,
        manual_step=(
            "Set data.skin.files.HAM10000_metadata.csv.archive in config/config.yaml to "
            "resources/ham10000/HAM10000_metadata.csv (FLamby's byte copy of the Dataverse file, sha256 pinned). "
            f"Or open {HAM_DOI}, accept the terms, download HAM10000_metadata in its original format (CSV with "
            "the 'dataset' column; the Kaggle copy lacks it and cannot be used), set that key to its path and "
            "override data.skin.files.HAM10000_metadata.csv.sha256 if its hash differs."
        ),
        homepage=HAM_DOI,
    ),
    DownloadSpec(
        name="skin",
        url="https://isic-challenge-data.s3.amazonaws.com/2017/ISIC-2017_Training_Data.zip",
        filename=ISIC_IMAGES,
        sha256=None,
        licence=ISIC_LICENCE,
        manual_step=(
            "Download https://isic-challenge-data.s3.amazonaws.com/2017/ISIC-2017_Training_Data.zip "
            "(ISIC 2017 challenge, https://challenge.isic-archive.com/data/#2017) in a browser and set "
            "data.skin.files.ISIC-2017_Training_Data.zip.archive in config/config.yaml to its path."
        ),
        homepage="https://challenge.isic-archive.com/landing/2017/",
    ),
    DownloadSpec(
        name="skin",
        url="https://isic-challenge-data.s3.amazonaws.com/2017/ISIC-2017_Training_Part3_GroundTruth.csv",
        filename=ISIC_GT,
        sha256=None,
        licence=ISIC_LICENCE,
        manual_step=(
            "Download https://isic-challenge-data.s3.amazonaws.com/2017/ISIC-2017_Training_Part3_GroundTruth.csv "
            "in a browser and set data.skin.files.ISIC-2017_Training_Part3_GroundTruth.csv.archive in config/config.yaml "
            "to its path."
        ),
        homepage="https://challenge.isic-archive.com/landing/2017/",
    ),
]
