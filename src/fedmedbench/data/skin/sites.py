"""The dermoscopy clients (HAM10000 sources A-C, ISIC 2017 D, the OOD cohort), classes and counts of record."""

from __future__ import annotations

from ...errors import DataError

CLASSES = ("nv", "bkl", "mel")
CLASS_INDEX = {name: i for i, name in enumerate(CLASSES)}
CLIENT_SOURCES = {"A": "vidir_modern", "B": "vidir_molemax", "C": "rosendahl"}
ISIC_CLIENT = "D"
OOD_CLIENT = "OOD"
OOD_SOURCE = "vienna_dias"
PRRFL_CLIENTS = ["A", "B", "C", "D"]
STORE_CLIENTS = PRRFL_CLIENTS + [OOD_CLIENT]
PROTOCOLS = {"prrfl": PRRFL_CLIENTS}

# nv/bkl/mel per client: PRR-FL Table 1 (= HAM10000 metadata) and the OOD cohort.
EXPECTED_CLASS_COUNTS = {
    "A": (1832, 475, 680),
    "B": (3720, 124, 24),
    "C": (803, 490, 342),
    "D": (1372, 254, 374),
    "OOD": (350, 10, 67),
}
# train/valid/test rows of PRR-FL's CSVs (reference/MANIFEST.md).
PRRFL_SPLIT_COUNTS = {"A": (2091, 298, 598), "B": (2708, 386, 774), "C": (1144, 163, 328), "D": (1400, 199, 401)}
PRRFL_FRACTIONS = (0.7, 0.1, 0.2)


class SkinDataError(DataError):
    """The raw dermoscopy data do not have the layout or content we expect."""
