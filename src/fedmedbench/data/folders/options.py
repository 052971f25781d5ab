"""What the user says about their data (``data.folders`` in the config): ``FoldersOptions``, the
layouts' names and suffixes, and the family's error ``FoldersDataError``."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from ...errors import ConfigError, DataError, closest, unknown_key


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
class FoldersOptions:
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
        """Options from a config mapping: unknown keys (with the closest spelling), types and ranges
        are checked here, each failure one ``ConfigError`` naming ``where.<key>``."""
        if isinstance(d, FoldersOptions):
            return d
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: expected a mapping of options, got {type(d).__name__}")
        valid = [f.name for f in fields(cls)]
        for key in d:
            if key not in valid:
                raise unknown_key(where, str(key), valid)

        def bad(key: str, expected: str) -> ConfigError:
            return ConfigError(f"{where}.{key}: expected {expected}, got {d[key]!r}")

        if "root" not in d:
            raise ConfigError(f"{where}: 'root' is required (the folder holding the site folders or labels.csv)")
        root = d["root"]
        if not isinstance(root, (str, os.PathLike)) or not os.fspath(root):
            raise bad("root", "a folder path")
        kind = d.get("kind", "segmentation")
        if kind not in KINDS:
            raise ConfigError(f"{where}.kind: {kind!r} is not one of {list(KINDS)}{closest(str(kind), KINDS)}")
        if kind == "classification":
            for key in _SEGMENTATION_ONLY:
                if key in d:
                    raise ConfigError(f"{where}.{key}: only for kind segmentation (kind is classification)")

        classes = d.get("classes")
        if classes is not None:
            if (
                not isinstance(classes, (list, tuple))
                or len(classes) < 2
                or not all(isinstance(c, str) and c.strip() for c in classes)
            ):
                raise bad("classes", "a list of at least two class names")
            if len(set(classes)) != len(classes):
                raise bad("classes", "distinct class names")
            classes = tuple(classes)
        elif kind == "classification":
            raise ConfigError(f"{where}.classes: required for kind classification (the names the labels use)")

        mask_values = d.get("mask_values")
        if mask_values is not None:
            if not isinstance(mask_values, Mapping) or not mask_values:
                raise bad("mask_values", "a mapping {pixel value: class index}")
            parsed = {}
            for value, index in mask_values.items():
                # JSON keys are strings: "255" is accepted as 255.
                key = int(value) if isinstance(value, str) and value.strip().isdigit() else value
                if not _is_int(key) or key < 0:
                    raise ConfigError(f"{where}.mask_values: key {value!r} is not a non-negative integer pixel value")
                if not _is_int(index) or not 0 <= index <= 255:
                    raise ConfigError(f"{where}.mask_values: class index {index!r} of pixel value {value!r} "
                                      "must be an integer 0..255")
                parsed[int(key)] = int(index)
            if classes is not None and max(parsed.values()) >= len(classes):
                raise ConfigError(f"{where}.mask_values: class index {max(parsed.values())} is out of range for "
                                  f"{len(classes)} classes {list(classes)}")
            # Class indices are the model's outputs 0 .. n-1: a gap is a class no pixel can have (an
            # output trained only towards 0, a per-class score of nothing), usually a typo.
            n_classes = len(classes) if classes is not None else max(parsed.values()) + 1
            unused = sorted(set(range(n_classes)) - set(parsed.values()))
            if unused:
                name = f" ({classes[unused[0]]!r} of classes {list(classes)})" if classes is not None else ""
                raise ConfigError(f"{where}.mask_values: no pixel value maps to class index {unused[0]}{name}; the class "
                                  f"indices must be exactly 0 .. {n_classes - 1} without gaps, got {dict(sorted(parsed.items()))}")
            mask_values = parsed

        fractions = d.get("fractions", DEFAULT_FRACTIONS)
        if (
            not isinstance(fractions, (list, tuple))
            or len(fractions) != 3
            or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in fractions)
            or abs(sum(fractions) - 1) > 1e-6
        ):
            raise bad("fractions", "three positive numbers train, val, test summing to 1")
        split_csv = d.get("split_csv")
        if split_csv is not None and (not isinstance(split_csv, (str, os.PathLike)) or not os.fspath(split_csv)):
            raise bad("split_csv", "a CSV file path or null")
        seed = d.get("seed", 0)
        if not _is_int(seed) or seed < 0:
            raise bad("seed", "a non-negative integer")
        nifti_axis = d.get("nifti_axis", 2)
        if not _is_int(nifti_axis) or nifti_axis not in (0, 1, 2):
            raise bad("nifti_axis", "0, 1 or 2 (the NIfTI voxel axis i, j or k to slice along)")
        stack = d.get("stack", 1)
        if not _is_int(stack) or stack not in (1, 3):
            raise bad("stack", "1 (one slice, replicated to 3 channels) or 3 (slices i-1, i, i+1)")
        image_size = d.get("image_size")
        if image_size is not None and (not _is_int(image_size) or image_size < 1):
            raise bad("image_size", "a positive integer or null")
        group_pattern = d.get("group_pattern")
        if group_pattern is not None:
            if not isinstance(group_pattern, str) or not group_pattern:
                raise bad("group_pattern", "a regular expression with one capture group, e.g. '^images/(\\d+)_'")
            try:
                compiled = re.compile(group_pattern)
            except re.error as exc:
                raise ConfigError(f"{where}.group_pattern: '{group_pattern}' is not a regular expression ({exc})") from None
            if compiled.groups < 1:
                raise ConfigError(f"{where}.group_pattern: '{group_pattern}' has no capture group; put the part that names "
                                  "the group (patient) in parentheses, e.g. '^images/(\\d+)_'")
        groups_csv = d.get("groups_csv")
        if groups_csv is not None and (not isinstance(groups_csv, (str, os.PathLike)) or not os.fspath(groups_csv)):
            raise bad("groups_csv", "a CSV file path or null")
        if group_pattern is not None and groups_csv is not None:
            raise ConfigError(f"{where}: group_pattern and groups_csv are both set; give the groups one way")
        mask_suffix = d.get("mask_suffix", "")
        if not isinstance(mask_suffix, str) or "/" in mask_suffix or "\\" in mask_suffix:
            raise bad("mask_suffix", "the text a mask's name adds to its image's name, e.g. '_Segmentation'")
        tiff_page = d.get("tiff_page", 0)
        if not _is_int(tiff_page) or tiff_page < 0:
            raise bad("tiff_page", "a page number 0, 1, ... (0: the first page of a multi-page TIFF, its full resolution)")
        return cls(
            root=os.fspath(root), kind=kind, mask_values=mask_values, classes=classes,
            fractions=tuple(float(f) for f in fractions), split_csv=None if split_csv is None else os.fspath(split_csv),
            seed=int(seed), nifti_axis=int(nifti_axis), stack=int(stack),
            image_size=None if image_size is None else int(image_size), group_pattern=group_pattern,
            groups_csv=None if groups_csv is None else os.fspath(groups_csv), mask_suffix=mask_suffix,
            tiff_page=int(tiff_page),
        )
