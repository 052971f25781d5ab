"""Where the RIF release (DoFE's Fundus.zip) comes from: the download spec, its licence and the manual step."""

from __future__ import annotations

from ..download import DownloadSpec

ARCHIVE = "Fundus.zip"
DRIVE_ID = "1p33nsWQaiZMAgsruDoJLyatoq5XAH-TH"
DOWNLOAD = DownloadSpec(
    name="fundus",
    url=f"gdrive:{DRIVE_ID}",
    filename=ARCHIVE,
    sha256=None,  # none published: pin the one logged at the first download
    licence=(
        "No licence stated by the DoFE release (https://github.com/emma-sjwang/Dofe). The images come from "
        "Drishti-GS, RIM-ONE r3 and REFUGE, each under its own terms (REFUGE requires registration with the "
        "challenge for its own downloads); cite those and DoFE (Wang et al., TMI 2020)."
    ),
    manual_step=(
        f"If Google Drive refuses the download (quota or virus-scan page), open "
        f"https://drive.google.com/file/d/{DRIVE_ID}/view (the link in the DoFE and Fed-LWR READMEs), download "
        "the zip by hand and set data.fundus.files.Fundus.zip.archive in config/config.yaml to its path."
    ),
    homepage="https://github.com/emma-sjwang/Dofe",
)
DOWNLOADS = [DOWNLOAD]
