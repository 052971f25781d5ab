"""The prostate clients of each protocol, their release folders and the counts of record."""

from __future__ import annotations

from pathlib import Path

from ...errors import DataError

# Release folder -> HarmoFL client name.
RELEASE_TO_CLIENT = {
    "BIDMC": "BIDMC",
    "BMC": "ISBI_1.5",
    "HK": "HK",
    "I2CVB": "I2CVB",
    "RUNMC": "ISBI",
    "UCL": "UCL",
}
CLIENT_TO_RELEASE = {client: site for site, client in RELEASE_TO_CLIENT.items()}
RELEASE_SITES = sorted(RELEASE_TO_CLIENT)

# Our documented choice: this order is the paper's columns A-F.
HARMOFL_CLIENTS = ["BIDMC", "HK", "I2CVB", "ISBI", "ISBI_1.5", "UCL"]
HARMOFL_SLICE_COUNTS = {"BIDMC": 261, "HK": 157, "I2CVB": 468, "ISBI": 411, "ISBI_1.5": 384, "UCL": 175}
# train/val/test of record, from the HarmoFL index files (reference/MANIFEST.md).
HARMOFL_SPLIT_COUNTS = {
    "BIDMC": (167, 41, 53),
    "HK": (100, 25, 32),
    "I2CVB": (299, 75, 94),
    "ISBI": (263, 65, 83),
    "ISBI_1.5": (245, 62, 77),
    "UCL": (112, 28, 35),
}
HARMOFL_FRACTIONS = (0.64, 0.16, 0.20)

# Case ids per release folder, as listed in HarmoFL's <site>-dir.npy.
RELEASE_CASES = {
    "BIDMC": ["Case00"] + [f"Case{i:02d}" for i in range(2, 13)],
    "BMC": [f"Case{i:02d}" for i in range(30)],
    "HK": [f"Case{i:02d}" for i in range(38, 50)],
    "I2CVB": [f"Case{i:02d}" for i in range(19)],
    "RUNMC": [f"Case{i:02d}" for i in range(30)],
    "UCL": ["Case01"] + [f"Case{i:02d}" for i in range(26, 38)],
}

# The split files of record live in the repository (resources/prostate_harmofl),
# found relative to this file for the editable install the pipeline uses.
DEFAULT_INDEX_DIR = Path(__file__).resolve().parents[4] / "resources" / "prostate_harmofl"


class ProstateDataError(DataError):
    """The raw prostate data do not have the layout or content we expect."""


FEDLWR_CLIENTS = [f"Site{i}" for i in range(1, len(RELEASE_SITES) + 1)]
FEDLWR_CLIENT_TO_RELEASE = dict(zip(FEDLWR_CLIENTS, RELEASE_SITES))  # Site1 = BIDMC ... Site6 = UCL
FEDLWR_FRACTIONS = (0.6, 0.2, 0.2)

PROTOCOLS = {"harmofl": HARMOFL_CLIENTS, "fedlwr": FEDLWR_CLIENTS, "fedlwr_stack": FEDLWR_CLIENTS}
