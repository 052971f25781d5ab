"""The RIF fundus clients (DoFE's four domains) and the counts of record."""

from __future__ import annotations

from ...errors import DataError

DOMAINS = ["Domain1", "Domain2", "Domain3", "Domain4"]
DOMAIN_SOURCES = {"Domain1": "Drishti-GS", "Domain2": "RIM-ONE r3", "Domain3": "REFUGE train", "Domain4": "REFUGE val"}
PROTOCOLS = {"fedlwr": DOMAINS, "fedlwr_bilinear_masks": DOMAINS}

EXPECTED_COUNTS = {"Domain1": (50, 51), "Domain2": (99, 60), "Domain3": (320, 80), "Domain4": (320, 80)}
# train/val/test of Fed-LWR (from the fork's log): int(0.8 n) of the official train folder.
FEDLWR_SPLIT_COUNTS = {
    "Domain1": (40, 10, 51),
    "Domain2": (79, 20, 60),
    "Domain3": (256, 64, 80),
    "Domain4": (256, 64, 80),
}


class FundusDataError(DataError):
    """The raw fundus data do not have the layout or content we expect."""
