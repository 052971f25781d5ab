"""The Camelyon17 clients (five hospitals = WILDS centers) and the counts of record."""

from __future__ import annotations

from ...errors import DataError

CENTER_TO_CLIENT = {0: "hospital1", 1: "hospital2", 2: "hospital3", 3: "hospital4", 4: "hospital5"}
CLIENTS = [CENTER_TO_CLIENT[c] for c in sorted(CENTER_TO_CLIENT)]
PROTOCOLS = {"harmofl": CLIENTS}

PATCH_SIZE = 96
REAL_COUNTS = {
    "hospital1": 59_436,
    "hospital2": 34_904,
    "hospital3": 85_054,
    "hospital4": 129_838,
    "hospital5": 146_722,
}
REAL_TOTAL = 455_954
REAL_SLIDES_PER_CENTER = 10


class CamelyonDataError(DataError):
    """The raw Camelyon17-WILDS files do not have the layout or content we expect."""
