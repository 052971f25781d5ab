"""A small deterministic multi-site dataset in the family's layouts (``write_example``), for the
examples, the docs and the tests."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from ..store import staged_dir
from .options import KINDS, LABELS_FILE

EXAMPLE_CLASSES = {2: ("background", "lesion"), 3: ("background", "ring", "core")}


EXAMPLE_MASK_VALUES = {2: {0: 0, 255: 1}, 3: {0: 0, 128: 1, 255: 2}}


EXAMPLE_LABELS = ("benign", "malignant", "normal")


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _blob(rng: np.random.Generator, shape: tuple[int, ...], n_classes: int) -> np.ndarray:
    """A class map: background 0, an ellipse of class 1, and (3 classes) a smaller class-2 core inside it."""
    h, w = shape
    y, x = np.mgrid[0:h, 0:w]
    cy, cx = rng.uniform(0.35, 0.65) * h, rng.uniform(0.35, 0.65) * w
    ry, rx = rng.uniform(0.15, 0.3) * h, rng.uniform(0.15, 0.3) * w
    r = ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2
    classes = (r < 1).astype(np.uint8)
    if n_classes == 3:
        classes[r < 0.3] = 2
    return classes


def _example_image(rng: np.random.Generator, classes: np.ndarray, site_index: int, grey: bool) -> np.ndarray:
    """Texture plus brighter structures; every site has its own brightness and colour cast."""
    base = 40 + 25 * site_index + 12 * rng.standard_normal(classes.shape)
    base = base + 70 * (classes >= 1) + 50 * (classes == 2)
    if grey:
        return np.clip(base, 0, 255).astype(np.uint8)
    cast = np.array([1.0, 0.85 - 0.1 * site_index, 0.7])
    return np.clip(base[..., None] * cast, 0, 255).astype(np.uint8)


def write_example(
    out_dir: str | os.PathLike,
    kind: str = "segmentation",
    sites: Sequence[str] = ("siteA", "siteB", "siteC"),
    seed: int = 0,
    *,
    n_classes: int = 3,
    counts: Sequence[int] = (6, 8, 10),
    size: int = 32,
    image_format: str = "png",
    depth: int = 5,
) -> dict:
    """Write a tiny deterministic multi-site dataset in this family's layout; ``out_dir`` must not exist
    or be empty (it is written in a temporary folder and renamed: never half written).

    ``kind="segmentation"``, ``image_format="png"``: ``counts[k]`` PNG images per site (the first
    site grey, the others colour) with masks of pixel values 0/255 (``n_classes=2``) or 0/128/255 (3).
    ``image_format="nifti"``: ``counts[k]`` int16 volumes per site of NIfTI shape (size, size + 4,
    depth) (i, j, k), masks holding the class indices 0 .. n_classes-1 themselves.
    ``kind="classification"``: ``counts[k]`` PNG images per site in ``<site>/``, two per patient group,
    labels from ``EXAMPLE_LABELS``, listed in ``labels.csv``.

    Returns ``options`` (to pass to ``preprocess``), ``counts`` (samples per site: images or
    slices along k), ``class_pixels`` (segmentation: pixels per class and site) or ``class_counts``
    (classification: images per class and site), and ``files`` (stems or paths per site).
    """
    if kind not in KINDS or image_format not in ("png", "nifti") or n_classes not in (2, 3):
        raise ValueError(
            f"kind {kind!r}, image_format {image_format!r}, n_classes {n_classes!r}: "
            f"expected one of {KINDS}, png/nifti, 2/3"
        )
    if len(counts) < len(sites) or size < 8 or depth < 1:
        raise ValueError(f"need one count per site, size >= 8, depth >= 1; got {counts}, {size}, {depth}")
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} exists and is not empty; write_example only writes into a new folder")
    result: dict = {"counts": {}, "files": {}}
    with staged_dir(out_dir) as tmp:
        if kind == "classification":
            result.update(_write_classification_example(tmp, sites, counts, seed, size, result))
        elif image_format == "png":
            result.update(_write_png_example(tmp, sites, counts, seed, size, n_classes, result))
        else:
            result.update(_write_nifti_example(tmp, sites, counts, seed, size, n_classes, depth, result))
    result["options"]["root"] = str(out_dir)
    return result


def _write_png_example(tmp: Path, sites, counts, seed, size, n_classes, result) -> dict:
    levels = sorted(EXAMPLE_MASK_VALUES[n_classes])  # class k is drawn with the k-th level
    pixels = {}
    for s, site in enumerate(sites):
        (tmp / site / "images").mkdir(parents=True)
        (tmp / site / "masks").mkdir()
        pixels[site] = np.zeros(n_classes, np.int64)
        result["files"][site] = []
        for k in range(counts[s]):
            rng = np.random.default_rng([int(seed), s, k])
            classes = _blob(rng, (size, size), n_classes)
            stem = f"{site}_{k:03d}"
            (tmp / site / "images" / f"{stem}.png").write_bytes(_png(_example_image(rng, classes, s, grey=s == 0)))
            (tmp / site / "masks" / f"{stem}.png").write_bytes(_png(np.asarray(levels, np.uint8)[classes]))
            pixels[site] += np.bincount(classes.ravel(), minlength=n_classes)
            result["files"][site].append(stem)
        result["counts"][site] = counts[s]
    return {
        "class_pixels": {site: p.tolist() for site, p in pixels.items()},
        "options": {
            "kind": "segmentation",
            "mask_values": dict(EXAMPLE_MASK_VALUES[n_classes]),
            "classes": list(EXAMPLE_CLASSES[n_classes]),
        },
    }


def _write_nifti_example(tmp: Path, sites, counts, seed, size, n_classes, depth, result) -> dict:
    import SimpleITK as sitk  # noqa: PLC0415  (SimpleITK costs ~70 ms; only 3-D volumes need it, and the DAG loads this module)

    pixels = {}
    for s, site in enumerate(sites):
        (tmp / site / "images").mkdir(parents=True)
        (tmp / site / "masks").mkdir()
        pixels[site] = np.zeros(n_classes, np.int64)
        result["files"][site] = []
        for k in range(counts[s]):
            rng = np.random.default_rng([int(seed), s, k])
            # SimpleITK arrays are (k, j, i): NIfTI shape (size, size + 4, depth).
            classes = np.stack(
                [_blob(rng, (size + 4, size), n_classes) * (0 < z < depth - 1 or depth < 3) for z in range(depth)]
            ).astype(np.uint8)
            volume = (
                -200.0
                + 300 * s
                + 150 * classes.astype(np.float64)
                + 40 * rng.standard_normal(classes.shape)
                + 20 * np.arange(depth)[:, None, None]
            ).astype(np.int16)  # intensity changes with the slice
            stem = f"vol{k:02d}"
            for array, sub in ((volume, "images"), (classes, "masks")):
                sitk.WriteImage(sitk.GetImageFromArray(array), str(tmp / site / sub / f"{stem}.nii.gz"), True)
            pixels[site] += np.bincount(classes.ravel(), minlength=n_classes)
            result["files"][site].append(stem)
        result["counts"][site] = counts[s] * depth
    return {
        "class_pixels": {site: p.tolist() for site, p in pixels.items()},
        "volumes": {site: counts[s] for s, site in enumerate(sites)},
        "options": {"kind": "segmentation", "classes": list(EXAMPLE_CLASSES[n_classes])},
    }


def _write_classification_example(tmp: Path, sites, counts, seed, size, result) -> dict:
    rows, per_class = [], {}
    for s, site in enumerate(sites):
        (tmp / site).mkdir()
        per_class[site] = np.zeros(len(EXAMPLE_LABELS), np.int64)
        result["files"][site] = []
        for k in range(counts[s]):
            rng = np.random.default_rng([int(seed), s, k])
            label = (k // 2 + s) % len(EXAMPLE_LABELS)  # both images of a patient share the label
            classes = _blob(rng, (size, size), 3) * (label > 0)
            image = _example_image(rng, classes.astype(np.uint8), s, grey=False)
            path = f"{site}/img_{k:03d}.png"
            (tmp / path).write_bytes(_png(image))
            rows.append({"site": site, "image": path, "label": EXAMPLE_LABELS[label], "group": f"patient{k // 2:02d}"})
            per_class[site][label] += 1
            result["files"][site].append(path)
        result["counts"][site] = counts[s]
    pd.DataFrame(rows).to_csv(tmp / LABELS_FILE, index=False, lineterminator="\n")
    return {
        "class_counts": {site: c.tolist() for site, c in per_class.items()},
        "options": {"kind": "classification", "classes": list(EXAMPLE_LABELS)},
    }
