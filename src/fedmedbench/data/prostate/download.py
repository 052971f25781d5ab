"""Where the SAML release comes from: the download spec, its licence and the manual step."""

from __future__ import annotations

from ..download import DownloadSpec

DOWNLOAD = DownloadSpec(
    name="prostate",
    url="gdrive:1TtrjnlnJ1yqr5m4LUGMelKTQXtvZaru-",
    filename="Processed_data_nii.zip",
    sha256=None,  # no published checksum: pin the one logged at the first download
    licence=(
        "No licence stated by the SAML release (https://liuquande.github.io/SAML/). The volumes come from "
        "NCI-ISBI 2013 (TCIA), I2CVB and PROMISE12, each under its own terms; cite those and SAML/MS-Net."
    ),
    manual_step=(
        "If Google Drive refuses the download (quota or virus-scan page), open https://liuquande.github.io/SAML/, "
        "download Processed_data_nii.zip by hand and set data.prostate.files.Processed_data_nii.zip.archive in config/config.yaml to its path."
    ),
    homepage="https://liuquande.github.io/SAML/",
)


DOWNLOADS = [DOWNLOAD]
