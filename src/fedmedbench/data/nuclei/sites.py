"""The nuclei clients (MoNuSAC organs, MoNuSeg, TNBC), the organ of each MoNuSAC patient and the counts of record."""

from __future__ import annotations

from ...errors import DataError

# Patients per organ from the official MoNuSAC organ document (as transcribed in torch-em's
# ORGAN_SPLITS). TCGA-A2-A0ES and TCGA-MP-A4T7 are in both the train and the test archive.
MONUSAC_ORGANS = {
    "train": {
        "lung": [
            "TCGA-55-1594",
            "TCGA-69-7760",
            "TCGA-69-A59K",
            "TCGA-73-4668",
            "TCGA-78-7220",
            "TCGA-86-7713",
            "TCGA-86-8672",
            "TCGA-L4-A4E5",
            "TCGA-MP-A4SY",
            "TCGA-MP-A4T7",
        ],
        "kidney": [
            "TCGA-5P-A9K0",
            "TCGA-B9-A44B",
            "TCGA-B9-A8YI",
            "TCGA-DW-7841",
            "TCGA-EV-5903",
            "TCGA-F9-A97G",
            "TCGA-G7-A8LD",
            "TCGA-MH-A560",
            "TCGA-P4-AAVK",
            "TCGA-SX-A7SR",
            "TCGA-UZ-A9PO",
            "TCGA-UZ-A9PU",
        ],
        "breast": [
            "TCGA-A2-A0CV",
            "TCGA-A2-A0ES",
            "TCGA-B6-A0WZ",
            "TCGA-BH-A18T",
            "TCGA-D8-A1X5",
            "TCGA-E2-A154",
            "TCGA-E9-A22B",
            "TCGA-E9-A22G",
            "TCGA-EW-A6SD",
            "TCGA-S3-AA11",
        ],
        "prostate": [
            "TCGA-EJ-5495",
            "TCGA-EJ-5505",
            "TCGA-EJ-5517",
            "TCGA-G9-6342",
            "TCGA-G9-6499",
            "TCGA-J4-A67Q",
            "TCGA-J4-A67T",
            "TCGA-KK-A59X",
            "TCGA-KK-A6E0",
            "TCGA-KK-A7AW",
            "TCGA-V1-A8WL",
            "TCGA-V1-A9O9",
            "TCGA-X4-A8KQ",
            "TCGA-YL-A9WY",
        ],
    },
    "test": {
        "lung": [
            "TCGA-49-6743",
            "TCGA-50-6591",
            "TCGA-55-7570",
            "TCGA-55-7573",
            "TCGA-73-4662",
            "TCGA-78-7152",
            "TCGA-MP-A4T7",
        ],
        "kidney": [
            "TCGA-2Z-A9JG",
            "TCGA-2Z-A9JN",
            "TCGA-DW-7838",
            "TCGA-DW-7963",
            "TCGA-F9-A8NY",
            "TCGA-IZ-A6M9",
            "TCGA-MH-A55W",
        ],
        "breast": ["TCGA-A2-A04X", "TCGA-A2-A0ES", "TCGA-D8-A3Z6", "TCGA-E2-A108", "TCGA-EW-A6SB"],
        "prostate": ["TCGA-G9-6356", "TCGA-G9-6367", "TCGA-VP-A87E", "TCGA-VP-A87H", "TCGA-X4-A8KS", "TCGA-YL-A9WL"],
    },
}
PATIENT_ORGAN = {p: organ for subset in MONUSAC_ORGANS.values() for organ, ps in subset.items() for p in ps}

ORGAN_CLIENTS = {
    "breast": "MoNuSAC_breast",
    "kidney": "MoNuSAC_kidney",
    "lung": "MoNuSAC_lung",
    "prostate": "MoNuSAC_prostate",
}
CLIENTS = [ORGAN_CLIENTS[o] for o in ("breast", "kidney", "lung", "prostate")] + ["MoNuSeg", "TNBC"]
CLIENT_LABELS = dict(zip(CLIENTS, "ABCDEF"))
PROTOCOLS = {"harmofl": CLIENTS, "harmofl_tiled": CLIENTS}


# Post-download checks (datasets.md §7): image/annotation pairs, and the patients/slides they come from.
REAL_COUNTS = {
    "MoNuSAC train images": 209,
    "MoNuSAC train patients": 46,
    "MoNuSAC test images": 85,
    "MoNuSAC test patients": 25,
    "MoNuSeg train images": 30,
    "MoNuSeg test images": 14,
    "TNBC images": 50,
    "TNBC patients": 11,
}


class NucleiDataError(DataError):
    """The raw nuclei data do not have the layout or content we expect."""
