"""What the user says about their data (``data.folders`` in the config): ``FoldersOptions``, the
layouts' names and suffixes, and the family's error ``FoldersDataError``."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ... import values
from ...errors import ConfigError, DataError
from ...runconfig import Strict
from ...schema import schema

KINDS = ("segmentation", "classification")


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


NIFTI_SUFFIXES = (".nii.gz", ".nii")


LABELS_FILE = "labels.csv"


LABEL_COLUMNS = ("site", "image", "label")


OPTIONAL_LABEL_COLUMNS = ("group",)


SPLIT_CSV_COLUMNS = ("site", "image", "split")


GROUPS_CSV_COLUMNS = ("site", "image", "group")


DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)


_SEGMENTATION_ONLY = ("mask_values", "nifti_axis", "stack", "mask_suffix")


_THREADS = max(1, min(8, os.cpu_count() or 1))


# Per-row columns of meta.csv besides the ids: how the intensities were scaled (see _to_uint8), the
# native size of the image or NIfTI slice before any resize, and the EXIF Orientation applied to turn
# the image upright (1: none; NIfTI: always 1). The log summarises them per site.
META_DETAILS = ("intensity", "intensity_low", "intensity_high", "native_height", "native_width", "orientation")


class FoldersDataError(DataError):
    """The user's own data do not have the layout or content we expect."""


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class FoldersOptions(Strict):
    """What the user says about their data (``data.folders`` in the config); see the module docstring."""

    root: str
    kind: str = "segmentation"
    mask_values: dict[int, int] | None = None  # None: masks hold class indices 0 .. num_classes - 1
    classes: tuple[str, ...] | None = None  # required for classification
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
    split_csv: str | None = None
    seed: int = 0
    nifti_axis: int = 2
    stack: int = 1
    image_size: int | None = None
    group_pattern: str | None = None  # re.search on the image's path under its site folder; capture 1 = the group
    groups_csv: str | None = None  # columns site, image, group
    mask_suffix: str = ""  # the mask of images/<stem>.<ext> is masks/<stem><mask_suffix>.<ext>
    tiff_page: int = 0  # the page of a multi-page or pyramidal TIFF that is read (0: the first, full resolution)

    @property
    def num_classes(self) -> int:
        if self.classes is not None:
            return len(self.classes)
        if self.mask_values:
            return max(self.mask_values.values()) + 1
        return 2

    @property
    def class_of_value(self) -> dict[int, int]:
        """The mask value -> class index map in effect (identity on 0 .. num_classes - 1 by default)."""
        if self.mask_values is not None:
            return dict(self.mask_values)
        return {v: v for v in range(self.num_classes)}

    @classmethod
    def from_dict(cls, d: Mapping | FoldersOptions, where: str = "folders") -> FoldersOptions:
        """Options from a config mapping: the schema's ``family: folders`` section checks each key
        (unknown keys with the closest spelling, types, ranges), then the rules between keys that a
        schema does not say are checked here; each failure one ``ConfigError`` naming ``where.<key>``."""
        if isinstance(d, FoldersOptions):
            return d
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: expected a mapping of options, got {type(d).__name__}")
        # A Path as a string, a tuple as a list: the forms of a YAML or JSON config, which the schema types.
        d = {
            k: os.fspath(v) if isinstance(v, os.PathLike) else list(v) if isinstance(v, tuple) else v
            for k, v in d.items()
        }
        values.check(d, options_schema(), where)
        kind, classes = d.get("kind", "segmentation"), d.get("classes")
        if kind == "classification":
            for key in _SEGMENTATION_ONLY:
                if key in d:
                    raise ConfigError(f"{where}.{key}: only for kind segmentation (kind is classification)")
            if classes is None:
                raise ConfigError(f"{where}.classes: required for kind classification (the names the labels use)")
        if "mask_values" in d:
            d["mask_values"] = _class_of_value(d["mask_values"], classes, where)
        fractions = d.get("fractions", DEFAULT_FRACTIONS)
        if abs(sum(fractions) - 1) > 1e-6:
            raise ConfigError(
                f"{where}.fractions: expected three positive numbers train, val, test summing to 1, got {fractions}"
            )
        group_pattern = d.get("group_pattern")
        if group_pattern is not None:
            try:
                compiled = re.compile(group_pattern)
            except re.error as exc:
                raise ConfigError(
                    f"{where}.group_pattern: '{group_pattern}' is not a regular expression ({exc})"
                ) from None
            if compiled.groups < 1:
                raise ConfigError(
                    f"{where}.group_pattern: '{group_pattern}' has no capture group; put the part that names "
                    "the group (patient) in parentheses, e.g. '^images/(\\d+)_'"
                )
            if "groups_csv" in d:
                raise ConfigError(f"{where}: group_pattern and groups_csv are both set; give the groups one way")
        return super().from_dict(d, where)


@functools.lru_cache(maxsize=1)
def options_schema() -> dict:
    """The schema of a ``family: folders`` data section less the keys the config adds around the
    options (``family``; ``protocols``, filled in)."""
    section = schema()["properties"]["data"]["additionalProperties"]["then"]
    return {
        **section,
        "required": [k for k in section["required"] if k != "family"],
        "properties": {k: v for k, v in section["properties"].items() if k not in ("family", "protocols")},
    }


def _class_of_value(mask_values: Mapping, classes: list | None, where: str) -> dict[int, int]:
    """``mask_values`` with integer keys (JSON's are strings: "255" is 255), its class indices
    exactly 0 .. n-1 (n: the classes given, else the largest index + 1)."""
    parsed = {}
    for value, index in mask_values.items():
        key = int(value) if isinstance(value, str) and value.strip().isdigit() else value
        if not _is_int(key) or key < 0:
            raise ConfigError(f"{where}.mask_values: key {value!r} is not a non-negative integer pixel value")
        parsed[int(key)] = index
    if classes is not None and max(parsed.values()) >= len(classes):
        raise ConfigError(
            f"{where}.mask_values: class index {max(parsed.values())} is out of range for "
            f"{len(classes)} classes {list(classes)}"
        )
    # Class indices are the model's outputs 0 .. n-1: a gap is a class no pixel can have (an
    # output trained only towards 0, a per-class score of nothing), usually a typo.
    n_classes = len(classes) if classes is not None else max(parsed.values()) + 1
    unused = sorted(set(range(n_classes)) - set(parsed.values()))
    if unused:
        name = f" ({classes[unused[0]]!r} of classes {list(classes)})" if classes is not None else ""
        raise ConfigError(
            f"{where}.mask_values: no pixel value maps to class index {unused[0]}{name}; the class "
            f"indices must be exactly 0 .. {n_classes - 1} without gaps, got {dict(sorted(parsed.items()))}"
        )
    return parsed
