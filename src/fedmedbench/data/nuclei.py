"""Histology nuclei segmentation (HarmoFL, 6 clients): MoNuSAC2020 x 4 organs, MoNuSeg 2018, TNBC.

Clients (paper columns A..F, our documented reading of med-air/HarmoFL#3):

====  ====================  ===========================================================
A     ``MoNuSAC_breast``    MoNuSAC2020 train + test images of breast patients
B     ``MoNuSAC_kidney``    ... kidney
C     ``MoNuSAC_lung``      ... lung
D     ``MoNuSAC_prostate``  ... prostate
E     ``MoNuSeg``           MoNuSeg 2018 (Kumar et al.), 30 train + 14 test images
F     ``TNBC``              TNBC (Naylor et al. 2018), 50 images of 11 patients
====  ====================  ===========================================================

Raw files (five archives; their names under ``raw/`` have no spaces, the
folders inside keep the real names, spaces included):

* ``MoNuSAC_images_and_annotations/<patient>/<patient>_<k>.{svs,tif,xml}`` and
  ``MoNuSAC Testing Data and Annotations/...`` (same layout). The organ comes
  from the patient id (``TCGA-XX-XXXX``) through the official organ document
  (patient lists as in torch-em's ``ORGAN_SPLITS``). Only sub-images with a
  ``.tif`` are used (reading ``.svs`` would need OpenSlide / JPEG codecs); an
  ``.xml`` with only an ``.svs`` beside it is skipped and logged.
* ``MoNuSeg 2018 Training Data/{Tissue Images/*.tif, Annotations/*.xml}`` and
  ``MoNuSegTestData/*.{tif,xml}``; images and annotations are paired by file stem.
* ``TNBC_NucleiSegmentation/Slide_NN/NN_k.png`` with masks in ``GT_NN/NN_k.png``.

``__MACOSX`` folders and hidden / AppleDouble ``._*`` files are ignored everywhere.

Masks: ImageScope XML polygons (``Vertex`` X = column, Y = row) are filled with
``skimage.draw.polygon`` on the image grid, which clips vertices outside the
image; the binary mask is the union of every region of every cell type.
Regions with fewer than 3 vertices are skipped (and counted). MoNuSAC's
``Ambiguous`` annotations (test set only: areas with unclear boundaries) are
**not drawn**: they are neither nucleus nor a separate class, because our
labels are binary and the training code has no ignore index
(``ambiguous="foreground"`` draws them instead). TNBC masks are thresholded
at > 0. Images lose their alpha channel (MoNuSAC TIFFs and TNBC PNGs are RGBA).

Protocols: ``harmofl`` resizes every whole image (and mask) to
``size x size`` (256 by default; bilinear image, nearest mask), HarmoFL's
"reshaped"; ``harmofl_tiled`` cuts images at native resolution into
``size x size`` tiles (last row/column of tiles shifted to end at the border,
images smaller than a tile padded at the bottom/right with white image and
background mask), which keeps nuclei at their true scale.

Split of record: per client, image-level (all tiles of one image in one
split, ``group`` = image id), seeded, with HarmoFL's fractions: images sorted,
permuted by a generator seeded with (seed, crc32(client)), train = first
int(0.64 n), val up to int(0.8 n), test the rest. ``permutation="patient"``
groups by patient instead. Client sizes are kept unequal (no truncation here).
"""

from __future__ import annotations

import io
import os
import re
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..files import atomic_path
from .download import DownloadSpec
from .images import read_mask
from .prostate import HARMOFL_FRACTIONS, cut_points
from .store import client_rng, list_clients, open_client, staged_dir, write_client, write_split_csv

__all__ = [
    "DOWNLOADS",
    "PROTOCOLS",
    "CLIENTS",
    "CLIENT_LABELS",
    "ORGAN_CLIENTS",
    "MONUSAC_ORGANS",
    "REAL_COUNTS",
    "NucleiDataError",
    "Sample",
    "xml_to_mask",
    "read_rgb",
    "read_mask_png",
    "find_monusac",
    "find_monuseg",
    "find_tnbc",
    "resize_pair",
    "tile_pair",
    "preprocess",
    "split",
    "write_synthetic",
]

MONUSAC_TRAIN = "MoNuSAC_images_and_annotations.zip"
MONUSAC_TEST = "MoNuSAC_Testing_Data_and_Annotations.zip"
MONUSEG_TRAIN = "MoNuSeg_2018_Training_Data.zip"
MONUSEG_TEST = "MoNuSegTestData.zip"
TNBC_ZIP = "TNBC_NucleiSegmentation.zip"

_MONUSAC_LICENCE = (
    "CC BY-NC-SA 4.0 (MoNuSAC2020 challenge Data page). Cite Verma et al., IEEE TMI 2021."
)
_MONUSEG_LICENCE = (
    "CC BY-NC-SA 4.0 (MoNuSeg challenge Data page). Cite Kumar et al., IEEE TMI 2017 and 2019."
)


def _drive_step(upstream: str, page: str, filename: str) -> str:
    return (
        f"If Google Drive refuses the download (quota or virus-scan page), open {page}, download "
        f"'{upstream}' by hand and set data.nuclei.files.{filename}.archive in config.yaml to its path."
    )


DOWNLOADS = [
    DownloadSpec(
        name="nuclei",
        url="gdrive:1lxMZaAPSpEHLSxGA9KKMt_r-4S8dwLhq",
        filename=MONUSAC_TRAIN,
        sha256="5b7cbeb34817a8f880d3fddc28391e48d3329a91bf3adcbd131ea149a725cd92",  # torch-em's hash
        licence=_MONUSAC_LICENCE,
        manual_step=_drive_step(MONUSAC_TRAIN, "https://monusac-2020.grand-challenge.org/Data/", MONUSAC_TRAIN),
        homepage="https://monusac-2020.grand-challenge.org/Data/",
    ),
    DownloadSpec(
        name="nuclei",
        url="gdrive:1G54vsOdxWY1hG7dzmkeK3r0xz9s-heyQ",
        filename=MONUSAC_TEST,  # upstream name: "MoNuSAC Testing Data and Annotations.zip"
        sha256="bcbc38f6bf8b149230c90c29f3428cc7b2b76f8acd7766ce9fc908fc896c2674",  # torch-em's hash
        licence=_MONUSAC_LICENCE,
        manual_step=_drive_step(
            "MoNuSAC Testing Data and Annotations.zip", "https://monusac-2020.grand-challenge.org/Data/", MONUSAC_TEST
        ),
        homepage="https://monusac-2020.grand-challenge.org/Data/",
    ),
    DownloadSpec(
        name="nuclei",
        url="gdrive:1ZgqFJomqQGNnsx7w7QBzQQMVA16lbVCA",
        filename=MONUSEG_TRAIN,  # upstream name: "MoNuSeg 2018 Training Data.zip"
        sha256="25d3d3185bb2970b397cafa72eb664c9b4d24294aee382e7e3df9885affce742",  # torch-em's hash
        licence=_MONUSEG_LICENCE,
        manual_step=_drive_step("MoNuSeg 2018 Training Data.zip", "https://monuseg.grand-challenge.org/Data/", MONUSEG_TRAIN),
        homepage="https://monuseg.grand-challenge.org/Data/",
    ),
    DownloadSpec(
        name="nuclei",
        url="gdrive:1NKkSQ5T0ZNQ8aUhh0a8Dt2YKYCQXIViw",
        filename=MONUSEG_TEST,
        sha256="13e522387ae8b1bcc0530e13ff9c7b4d91ec74959ef6f6e57747368d7ee6f88a",  # torch-em's hash
        licence=_MONUSEG_LICENCE,
        manual_step=_drive_step(MONUSEG_TEST, "https://monuseg.grand-challenge.org/Data/", MONUSEG_TEST),
        homepage="https://monuseg.grand-challenge.org/Data/",
    ),
    DownloadSpec(
        name="nuclei",
        url="https://zenodo.org/records/1175282/files/TNBC_NucleiSegmentation.zip",
        filename=TNBC_ZIP,
        sha256="da708c3a988f4ad4b9bbb9283b387faf703f0bc0e5e689927306bd27ea13a57f",  # v1.0, torch-em's hash
        licence=(
            "As stated on Zenodo record 1175282 (v1.0; not verified here, check it before redistributing). "
            "Cite Naylor et al., IEEE TMI 2018."
        ),
        manual_step=(
            "If the download fails, fetch TNBC_NucleiSegmentation.zip (v1.0) by hand from "
            "https://zenodo.org/records/1175282 and set "
            f"data.nuclei.files.{TNBC_ZIP}.archive in config.yaml to its path."
        ),
        homepage="https://zenodo.org/records/1175282",
    ),
]

# Patients per organ from the official MoNuSAC organ document (as transcribed in torch-em's
# ORGAN_SPLITS). TCGA-A2-A0ES and TCGA-MP-A4T7 are in both the train and the test archive.
MONUSAC_ORGANS = {
    "train": {
        "lung": ["TCGA-55-1594", "TCGA-69-7760", "TCGA-69-A59K", "TCGA-73-4668", "TCGA-78-7220",
                 "TCGA-86-7713", "TCGA-86-8672", "TCGA-L4-A4E5", "TCGA-MP-A4SY", "TCGA-MP-A4T7"],
        "kidney": ["TCGA-5P-A9K0", "TCGA-B9-A44B", "TCGA-B9-A8YI", "TCGA-DW-7841", "TCGA-EV-5903", "TCGA-F9-A97G",
                   "TCGA-G7-A8LD", "TCGA-MH-A560", "TCGA-P4-AAVK", "TCGA-SX-A7SR", "TCGA-UZ-A9PO", "TCGA-UZ-A9PU"],
        "breast": ["TCGA-A2-A0CV", "TCGA-A2-A0ES", "TCGA-B6-A0WZ", "TCGA-BH-A18T", "TCGA-D8-A1X5",
                   "TCGA-E2-A154", "TCGA-E9-A22B", "TCGA-E9-A22G", "TCGA-EW-A6SD", "TCGA-S3-AA11"],
        "prostate": ["TCGA-EJ-5495", "TCGA-EJ-5505", "TCGA-EJ-5517", "TCGA-G9-6342", "TCGA-G9-6499",
                     "TCGA-J4-A67Q", "TCGA-J4-A67T", "TCGA-KK-A59X", "TCGA-KK-A6E0", "TCGA-KK-A7AW",
                     "TCGA-V1-A8WL", "TCGA-V1-A9O9", "TCGA-X4-A8KQ", "TCGA-YL-A9WY"],
    },
    "test": {
        "lung": ["TCGA-49-6743", "TCGA-50-6591", "TCGA-55-7570", "TCGA-55-7573", "TCGA-73-4662", "TCGA-78-7152",
                 "TCGA-MP-A4T7"],
        "kidney": ["TCGA-2Z-A9JG", "TCGA-2Z-A9JN", "TCGA-DW-7838", "TCGA-DW-7963", "TCGA-F9-A8NY", "TCGA-IZ-A6M9",
                   "TCGA-MH-A55W"],
        "breast": ["TCGA-A2-A04X", "TCGA-A2-A0ES", "TCGA-D8-A3Z6", "TCGA-E2-A108", "TCGA-EW-A6SB"],
        "prostate": ["TCGA-G9-6356", "TCGA-G9-6367", "TCGA-VP-A87E", "TCGA-VP-A87H", "TCGA-X4-A8KS", "TCGA-YL-A9WL"],
    },
}
PATIENT_ORGAN = {p: organ for subset in MONUSAC_ORGANS.values() for organ, ps in subset.items() for p in ps}

ORGAN_CLIENTS = {"breast": "MoNuSAC_breast", "kidney": "MoNuSAC_kidney", "lung": "MoNuSAC_lung", "prostate": "MoNuSAC_prostate"}
CLIENTS = [ORGAN_CLIENTS[o] for o in ("breast", "kidney", "lung", "prostate")] + ["MoNuSeg", "TNBC"]
CLIENT_LABELS = dict(zip(CLIENTS, "ABCDEF"))
PROTOCOLS = {"harmofl": CLIENTS, "harmofl_tiled": CLIENTS}
DEFAULT_SIZE = 256

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

_IMAGE_SUFFIXES = (".tif", ".tiff", ".png")
_PATIENT_RE = re.compile(r"^(TCGA-[A-Z0-9]{2}-[A-Z0-9]{4})", re.IGNORECASE)
_SLIDE_RE = re.compile(r"^Slide_(\d+)$")
_GT_RE = re.compile(r"^GT_(\d+)$")
_PAD_IMAGE = 255  # white: glass / empty slide background
AMBIGUOUS_POLICIES = ("ignore", "foreground")


class NucleiDataError(DataError):
    """The raw nuclei data do not have the layout or content we expect."""


@dataclass(frozen=True)
class Sample:
    """One annotated image of the raw data."""

    client: str
    dataset: str  # MoNuSAC | MoNuSeg | TNBC
    subset: str  # train | test | all (TNBC has no official split)
    image_id: str
    patient: str
    organ: str
    image: Path
    annotation: Path  # ImageScope XML, or the TNBC GT png
    source: str  # image path as "<raw file>/<path inside the archive>"
    annotation_source: str


@dataclass
class Discovery:
    samples: list[Sample] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # human-readable, logged
    patients: dict[str, set] = field(default_factory=dict)  # "MoNuSAC train" -> patient folders with annotations


# ---------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------


def _walk(root: Path) -> Iterator[Path]:
    """Every regular file under root, sorted, without macOS junk and hidden files."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__MACOSX" and not d.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                yield Path(folder) / name


def _to_rgb(array: np.ndarray, path: Path) -> np.ndarray:
    if array.ndim == 3 and array.shape[0] in (3, 4) and array.shape[-1] not in (3, 4):
        array = np.moveaxis(array, 0, -1)  # planar TIFF
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.ndim != 3 or array.shape[-1] not in (3, 4):
        raise NucleiDataError(f"{path}: expected an RGB or RGBA image, got array shape {array.shape}")
    if array.dtype != np.uint8:
        raise NucleiDataError(f"{path}: expected 8-bit pixels, got {array.dtype}")
    return np.ascontiguousarray(array[..., :3])  # alpha dropped


def read_rgb(path: str | os.PathLike) -> np.ndarray:
    """An image as uint8 H x W x 3; TIFF through tifffile (Pillow as fallback), others through Pillow."""
    from PIL import Image

    path = Path(path)
    errors = []
    if path.suffix.lower() in (".tif", ".tiff"):
        try:
            import tifffile

            return _to_rgb(np.asarray(tifffile.imread(path)), path)
        except NucleiDataError:
            raise
        except Exception as exc:  # tifffile raises many types (codec missing, bad tags)
            errors.append(f"tifffile: {exc}")
    try:
        with Image.open(path) as img:
            img.load()
            if img.mode not in ("RGB", "RGBA"):
                if img.mode.startswith(("I", "F")):
                    raise NucleiDataError(f"{path}: expected 8-bit pixels, got Pillow mode {img.mode}")
                img = img.convert("RGB")
            return _to_rgb(np.asarray(img), path)
    except NucleiDataError:
        raise
    except (OSError, ValueError) as exc:
        errors.append(f"Pillow: {exc}")
    raise NucleiDataError(f"{path}: cannot read the image ({'; '.join(errors)})")


def read_mask_png(path: str | os.PathLike) -> np.ndarray:
    """A TNBC ground-truth PNG as a uint8 {0,1} mask (any value > 0 is nucleus).

    Read by the shared mask reader (real bit depth, 16-bit only as exact multiples of 257, float
    or 32-bit refused); colour-saved masks count any non-zero channel, alpha is ignored."""
    return (read_mask(path, error=NucleiDataError, colour="max") > 0).astype(np.uint8)


def _annotation_name(annotation: ET.Element) -> str:
    """The cell type: the first ``Attributes/Attribute`` directly under the ``Annotation`` (not a region's)."""
    attr = annotation.find("./Attributes/Attribute")
    return (attr.get("Name") or "").strip() if attr is not None else ""


def xml_to_mask(
    xml_path: str | os.PathLike, shape: tuple[int, int], *, ambiguous: str = "ignore"
) -> tuple[np.ndarray, dict]:
    """Binary uint8 mask (H x W) from an ImageScope XML, and counts of what was drawn or skipped.

    Every ``Region``'s ``Vertex`` list (X = column, Y = row, floats) is filled
    with ``skimage.draw.polygon`` clipped to ``shape``; regions with fewer
    than 3 vertices are skipped. Annotations named ``Ambiguous`` are skipped
    (``ambiguous="ignore"``) or drawn (``"foreground"``).
    """
    from skimage.draw import polygon

    if ambiguous not in AMBIGUOUS_POLICIES:
        raise ValueError(f"ambiguous must be one of {AMBIGUOUS_POLICIES}, got {ambiguous!r}")
    xml_path = Path(xml_path)
    try:
        root = ET.parse(xml_path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise NucleiDataError(f"{xml_path}: not a readable XML annotation file ({exc})") from exc
    height, width = shape
    mask = np.zeros((height, width), np.uint8)
    stats = {"regions": 0, "skipped_regions": 0, "ambiguous_regions": 0, "outside_regions": 0}
    annotations = [root] if root.tag == "Annotation" else list(root.iter("Annotation"))
    for annotation in annotations:
        is_ambiguous = _annotation_name(annotation).lower() == "ambiguous"
        for region in annotation.iter("Region"):
            try:
                vertices = [(float(v.attrib["X"]), float(v.attrib["Y"])) for v in region.iter("Vertex")]
            except (KeyError, ValueError) as exc:
                raise NucleiDataError(
                    f"{xml_path}: region {region.get('Id', '?')} has a vertex without numeric X/Y ({exc})"
                ) from exc
            if len(vertices) < 3:
                stats["skipped_regions"] += 1
                continue
            if is_ambiguous:
                stats["ambiguous_regions"] += 1
                if ambiguous == "ignore":
                    continue
            xy = np.asarray(vertices, dtype=np.float64)
            rr, cc = polygon(xy[:, 1], xy[:, 0], shape=(height, width))
            if len(rr) == 0:
                stats["outside_regions"] += 1
            mask[rr, cc] = 1
            stats["regions"] += 1
    return mask, stats


# ---------------------------------------------------------------------------
# Discovery of the raw layouts
# ---------------------------------------------------------------------------


def _rel(raw_name: str, raw_dir: Path, path: Path) -> str:
    return f"{raw_name}/{path.relative_to(raw_dir).as_posix()}"


def _patient_of(stem: str) -> str | None:
    match = _PATIENT_RE.match(stem)
    return match.group(1).upper() if match else None


def find_monusac(raw_dir: str | os.PathLike, subset: str, raw_name: str) -> Discovery:
    """Every ``<patient>/<id>.xml`` with a ``<id>.tif`` beside it, assigned to its organ's client."""
    raw_dir = Path(raw_dir)
    found = Discovery(patients={f"MoNuSAC {subset}": set()})
    unknown = []
    files = list(_walk(raw_dir))
    xmls = [p for p in files if p.suffix.lower() == ".xml"]
    images = {p.with_suffix("").as_posix(): p for p in files if p.suffix.lower() in (".tif", ".tiff")}
    used = set()
    for xml in xmls:
        key = xml.with_suffix("").as_posix()
        image = images.get(key)
        patient = _patient_of(xml.stem)
        found.patients[f"MoNuSAC {subset}"].add(xml.parent.name)
        if image is None:
            svs = xml.with_suffix(".svs")
            what = "only an .svs image" if svs.is_file() else "no image"
            found.skipped.append(f"{_rel(raw_name, raw_dir, xml)}: {what} beside the annotation, skipped")
            continue
        used.add(key)
        if patient is None or patient not in PATIENT_ORGAN:
            unknown.append(_rel(raw_name, raw_dir, xml))
            continue
        organ = PATIENT_ORGAN[patient]
        found.samples.append(
            Sample(
                client=ORGAN_CLIENTS[organ],
                dataset="MoNuSAC",
                subset=subset,
                image_id=f"MoNuSAC/{subset}/{xml.stem}",
                patient=patient,
                organ=organ,
                image=image,
                annotation=xml,
                source=_rel(raw_name, raw_dir, image),
                annotation_source=_rel(raw_name, raw_dir, xml),
            )
        )
    for key, image in sorted(images.items()):
        if key not in used:
            found.skipped.append(f"{_rel(raw_name, raw_dir, image)}: image without an .xml annotation, skipped")
    if unknown:
        raise NucleiDataError(
            f"{raw_name}: {len(unknown)} MoNuSAC annotation(s) of patients not in the official organ lists, "
            f"so no client can be chosen: {unknown[:5]}"
        )
    if not xmls:
        raise NucleiDataError(f"{raw_name} ({raw_dir}): no .xml annotation files found; is this a MoNuSAC archive?")
    return found


def find_monuseg(raw_dir: str | os.PathLike, subset: str, raw_name: str) -> Discovery:
    """Every ``<ID>.xml`` paired by stem with ``<ID>.tif`` anywhere in the archive (``Tissue Images/`` or beside it)."""
    raw_dir = Path(raw_dir)
    found = Discovery()
    files = list(_walk(raw_dir))
    xmls = [p for p in files if p.suffix.lower() == ".xml"]
    by_stem: dict[str, list[Path]] = {}
    for p in files:
        if p.suffix.lower() in _IMAGE_SUFFIXES:
            by_stem.setdefault(p.stem, []).append(p)
    seen_xml: dict[str, Path] = {}
    for xml in xmls:
        if xml.stem in seen_xml:
            raise NucleiDataError(
                f"{raw_name}: two annotations for {xml.stem}: {_rel(raw_name, raw_dir, seen_xml[xml.stem])} and "
                f"{_rel(raw_name, raw_dir, xml)}"
            )
        seen_xml[xml.stem] = xml
        candidates = by_stem.get(xml.stem, [])
        if not candidates:
            found.skipped.append(f"{_rel(raw_name, raw_dir, xml)}: no image with the same name, skipped")
            continue
        if len(candidates) > 1:
            raise NucleiDataError(
                f"{raw_name}: several images for annotation {_rel(raw_name, raw_dir, xml)}: "
                f"{[_rel(raw_name, raw_dir, c) for c in candidates]}"
            )
        image = candidates[0]
        found.samples.append(
            Sample(
                client="MoNuSeg",
                dataset="MoNuSeg",
                subset=subset,
                image_id=f"MoNuSeg/{subset}/{xml.stem}",
                patient=_patient_of(xml.stem) or xml.stem,
                organ="",
                image=image,
                annotation=xml,
                source=_rel(raw_name, raw_dir, image),
                annotation_source=_rel(raw_name, raw_dir, xml),
            )
        )
    for stem, paths in sorted(by_stem.items()):
        if stem not in seen_xml:
            found.skipped += [f"{_rel(raw_name, raw_dir, p)}: image without an .xml annotation, skipped" for p in paths]
    if not xmls:
        raise NucleiDataError(f"{raw_name} ({raw_dir}): no .xml annotation files found; is this a MoNuSeg archive?")
    return found


def find_tnbc(raw_dir: str | os.PathLike, raw_name: str = TNBC_ZIP) -> Discovery:
    """Every ``Slide_NN/<name>.png`` paired with ``GT_NN/<name>.png``."""
    raw_dir = Path(raw_dir)
    slides: dict[str, Path] = {}
    gts: dict[str, Path] = {}
    for folder, dirs, _ in os.walk(raw_dir):
        dirs[:] = sorted(d for d in dirs if d != "__MACOSX" and not d.startswith("."))
        for d in dirs:
            for regex, table in ((_SLIDE_RE, slides), (_GT_RE, gts)):
                match = regex.match(d)
                if match:
                    nn = match.group(1)
                    if nn in table:
                        raise NucleiDataError(
                            f"{raw_name}: folder {d} appears twice: {_rel(raw_name, raw_dir, table[nn])} and "
                            f"{_rel(raw_name, raw_dir, Path(folder) / d)}"
                        )
                    table[nn] = Path(folder) / d
    if not slides:
        raise NucleiDataError(f"{raw_name} ({raw_dir}): no Slide_NN folders found; is this the TNBC archive?")
    found = Discovery(patients={"TNBC": set()})
    problems = []
    for nn in sorted(set(slides) | set(gts)):
        if nn not in gts:
            problems.append(f"{_rel(raw_name, raw_dir, slides[nn])} has no GT_{nn} folder")
            continue
        if nn not in slides:
            problems.append(f"{_rel(raw_name, raw_dir, gts[nn])} has no Slide_{nn} folder")
            continue
        images = {p.name: p for p in _walk(slides[nn]) if p.parent == slides[nn] and p.suffix.lower() == ".png"}
        masks = {p.name: p for p in _walk(gts[nn]) if p.parent == gts[nn] and p.suffix.lower() == ".png"}
        for name in sorted(set(images) - set(masks)):
            problems.append(f"{_rel(raw_name, raw_dir, images[name])} has no mask GT_{nn}/{name}")
        for name in sorted(set(masks) - set(images)):
            problems.append(f"{_rel(raw_name, raw_dir, masks[name])} has no image Slide_{nn}/{name}")
        for name in sorted(set(images) & set(masks)):
            found.patients["TNBC"].add(nn)
            found.samples.append(
                Sample(
                    client="TNBC",
                    dataset="TNBC",
                    subset="all",
                    image_id=f"TNBC/{Path(name).stem}",
                    patient=f"TNBC_{nn}",
                    organ="breast",
                    image=images[name],
                    annotation=masks[name],
                    source=_rel(raw_name, raw_dir, images[name]),
                    annotation_source=_rel(raw_name, raw_dir, masks[name]),
                )
            )
    if problems:
        raise NucleiDataError(f"{raw_name}: Slide_NN / GT_NN pairing failed:\n  " + "\n  ".join(problems[:20]))
    return found


# ---------------------------------------------------------------------------
# Resizing and tiling
# ---------------------------------------------------------------------------


def resize_pair(image: np.ndarray, mask: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Whole image to size x size: bilinear for the image, nearest for the mask."""
    from PIL import Image

    if image.shape[:2] == (size, size):
        return image, mask
    img = Image.fromarray(image, "RGB").resize((size, size), Image.Resampling.BILINEAR)
    msk = Image.fromarray(mask, "L").resize((size, size), Image.Resampling.NEAREST)
    return np.asarray(img, np.uint8), np.asarray(msk, np.uint8)


def _tile_starts(length: int, size: int) -> list[int]:
    if length <= size:
        return [0]
    starts = list(range(0, length - size + 1, size))
    if starts[-1] + size < length:
        starts.append(length - size)  # last tile ends at the border (overlaps its neighbour)
    return starts


def tile_pair(image: np.ndarray, mask: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Native-resolution size x size tiles (k x size x size x 3, k x size x size) and their (y, x) origins.

    Tiles start every ``size`` pixels; the last row/column is shifted to end at
    the border instead of running past it. A side shorter than ``size`` is
    padded at the bottom/right: white image, background mask.
    """
    h, w = mask.shape
    ph, pw = max(size - h, 0), max(size - w, 0)
    if ph or pw:
        image = np.pad(image, ((0, ph), (0, pw), (0, 0)), constant_values=_PAD_IMAGE)
        mask = np.pad(mask, ((0, ph), (0, pw)), constant_values=0)
    coords = [(y, x) for y in _tile_starts(h, size) for x in _tile_starts(w, size)]
    images = np.stack([image[y : y + size, x : x + size] for y, x in coords])
    masks = np.stack([mask[y : y + size, x : x + size] for y, x in coords])
    return images, masks, coords


# ---------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------


def _discover(raw: dict, log: Callable[[str], object]) -> Discovery:
    missing = [spec.filename for spec in DOWNLOADS if spec.filename not in raw]
    if missing:
        raise NucleiDataError(f"nuclei: raw files {missing} are missing; expected all of {[s.filename for s in DOWNLOADS]}")
    total = Discovery()
    parts = [
        find_monusac(Path(raw[MONUSAC_TRAIN]), "train", MONUSAC_TRAIN),
        find_monusac(Path(raw[MONUSAC_TEST]), "test", MONUSAC_TEST),
        find_monuseg(Path(raw[MONUSEG_TRAIN]), "train", MONUSEG_TRAIN),
        find_monuseg(Path(raw[MONUSEG_TEST]), "test", MONUSEG_TEST),
        find_tnbc(Path(raw[TNBC_ZIP]), TNBC_ZIP),
    ]
    for part in parts:
        total.samples += part.samples
        total.skipped += part.skipped
        total.patients.update(part.patients)
    for line in total.skipped:
        log(f"nuclei: {line}")
    return total


def _found_counts(found: Discovery) -> dict[str, int]:
    def n(dataset, subset):
        return sum(1 for s in found.samples if s.dataset == dataset and s.subset == subset)

    return {
        "MoNuSAC train images": n("MoNuSAC", "train"),
        "MoNuSAC train patients": len(found.patients.get("MoNuSAC train", ())),
        "MoNuSAC test images": n("MoNuSAC", "test"),
        "MoNuSAC test patients": len(found.patients.get("MoNuSAC test", ())),
        "MoNuSeg train images": n("MoNuSeg", "train"),
        "MoNuSeg test images": n("MoNuSeg", "test"),
        "TNBC images": n("TNBC", "all"),
        "TNBC patients": len(found.patients.get("TNBC", ())),
    }


def _load_sample(sample: Sample, ambiguous: str) -> tuple[np.ndarray, np.ndarray, dict]:
    image = read_rgb(sample.image)
    shape = image.shape[:2]
    if sample.dataset == "TNBC":
        mask = read_mask_png(sample.annotation)
        if mask.shape != shape:
            raise NucleiDataError(
                f"{sample.annotation}: mask is {mask.shape[1]}x{mask.shape[0]} but its image {sample.image.name} "
                f"is {shape[1]}x{shape[0]}"
            )
        stats = {"regions": -1, "skipped_regions": 0, "ambiguous_regions": 0, "outside_regions": 0}
    else:
        mask, stats = xml_to_mask(sample.annotation, shape, ambiguous=ambiguous)
    return image, mask, stats


def preprocess(
    raw: dict,
    store_dir: str | os.PathLike,
    protocol: str,
    *,
    expect_real_counts: bool = False,
    size: int | None = None,
    log: Callable[[str], object] = print,
    ambiguous: str = "ignore",
) -> dict[str, int]:
    """Build the canonical store (6 clients, images N x S x S x 3, masks N x S x S in {0,1}).

    ``raw`` maps each of the five archive names to its extracted folder.
    ``size`` (default 256) is the output side: the resize target for
    ``harmofl``, the tile side for ``harmofl_tiled``. With
    ``expect_real_counts`` the image/annotation pairs and patients found must
    equal ``REAL_COUNTS``; all mismatches are listed in one error before any
    image is decoded. Returns the number of store rows (images or tiles) per client.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"nuclei: unknown protocol {protocol!r}; known: {sorted(PROTOCOLS)}")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    size = size or DEFAULT_SIZE
    tiled = protocol == "harmofl_tiled"
    found = _discover(raw, log)
    counts_found = _found_counts(found)
    log("nuclei: found " + ", ".join(f"{k} {v}" for k, v in counts_found.items()))
    if expect_real_counts:
        problems = [f"{k}: found {counts_found[k]}, the real data have {v}" for k, v in REAL_COUNTS.items() if counts_found[k] != v]
        if problems:
            raise NucleiDataError(
                "the nuclei data do not match the real MoNuSAC2020 / MoNuSeg 2018 / TNBC v1.0 releases:\n  "
                + "\n  ".join(problems)
                + "\n(skipped files, if any, are listed in the log above; for other or synthetic data set "
                "expect_real_counts to false)"
            )
    by_client: dict[str, list[Sample]] = {c: [] for c in CLIENTS}
    for s in found.samples:
        by_client[s.client].append(s)
    empty = [c for c, s in by_client.items() if not s]
    if empty:
        raise NucleiDataError(f"nuclei: no annotated image for client(s) {empty}")

    counts: dict[str, int] = {}
    with staged_dir(store_dir) as tmp_store:
        for client in CLIENTS:
            images, masks, rows = [], [], []
            totals = {"regions": 0, "skipped_regions": 0, "ambiguous_regions": 0}
            for sample in sorted(by_client[client], key=lambda s: s.image_id):
                image, mask, stats = _load_sample(sample, ambiguous)
                for k in totals:
                    totals[k] += max(stats[k], 0)
                base = {
                    "group": sample.image_id,
                    "source": sample.source,
                    "annotation": sample.annotation_source,
                    "dataset": sample.dataset,
                    "subset": sample.subset,
                    "patient": sample.patient,
                    "organ": sample.organ,
                    "height": image.shape[0],
                    "width": image.shape[1],
                    "skipped_regions": stats["skipped_regions"],
                    "ambiguous_regions": stats["ambiguous_regions"],
                }
                if tiled:
                    x, y, coords = tile_pair(image, mask, size)
                    for ty, tx in coords:
                        rows.append({"id": f"{sample.image_id}/y{ty:05d}_x{tx:05d}", **base, "tile_y": ty, "tile_x": tx})
                else:
                    x, y = resize_pair(image, mask, size)
                    x, y = x[None], y[None]
                    rows.append({"id": sample.image_id, **base, "tile_y": -1, "tile_x": -1})
                images.append(x)
                masks.append(y)
            images_arr, masks_arr = np.concatenate(images), np.concatenate(masks)
            write_client(tmp_store, client, images_arr, masks_arr, pd.DataFrame(rows))
            counts[client] = len(rows)
            masks_from = (
                "masks from the GT_NN PNGs"
                if client == "TNBC"
                else f"{totals['regions']} polygons drawn, {totals['skipped_regions']} skipped (<3 vertices), "
                f"{totals['ambiguous_regions']} ambiguous ({ambiguous})"
            )
            log(
                f"nuclei {client} ({CLIENT_LABELS[client]}): {len(by_client[client])} images -> {len(rows)} rows of "
                f"{size}x{size}{' tiles' if tiled else ''}, nucleus fraction {masks_arr.mean():.3f}, {masks_from}"
            )
            del images, masks, images_arr, masks_arr
    return counts


# ---------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------

PERMUTATIONS = ("default", "official", "image", "patient")


def _official_parts(groups: np.ndarray, meta: pd.DataFrame, key: np.ndarray) -> dict[str, np.ndarray]:
    """Official test images stay test; 20 % of the (permuted) rest becomes validation."""
    official_test = set(key[meta["subset"].astype(str).to_numpy() == "test"])
    if official_test:
        test = np.array([g for g in groups if g in official_test])
        rest = np.array([g for g in groups if g not in official_test])
    else:  # TNBC: no official split
        cut = int(len(groups) * 0.8)
        rest, test = groups[:cut], groups[cut:]
    n_val = max(1, int(len(rest) * 0.2)) if len(rest) >= 2 else 0  # small (synthetic) sites keep a val image
    train_end = len(rest) - n_val
    return {"train": rest[:train_end], "val": rest[train_end:], "test": test}


def split(
    store_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    protocol: str,
    *,
    permutation: str = "default",
    seed: int = 0,
) -> pd.DataFrame:
    """Per-client seeded grouped split, written to ``out_csv``.

    ``permutation``: ``default`` (= ``official``) is HarmoFL's appendix: the datasets' own train/test
    split (MoNuSAC, MoNuSeg), 20 % of the training images for validation; TNBC has no official split,
    so 20 % of its images are held out for test first. ``image`` pools everything and cuts HarmoFL's
    64/16/20 by source image
    (all tiles of an image in one split); ``patient`` the same by patient.
    ``image`` groups the rows by source image
    (all tiles of an image in one split); ``patient`` by patient. Groups are
    sorted, permuted with a generator seeded by (seed, crc32(client)), then cut
    at int(0.64 n) and int(0.8 n) groups. Every split must be non-empty.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"nuclei: unknown protocol {protocol!r}; known: {sorted(PROTOCOLS)}")
    if permutation not in PERMUTATIONS:
        raise ValueError(f"nuclei: permutation must be one of {PERMUTATIONS}, got {permutation!r}")
    present = list_clients(store_dir)
    missing = [c for c in PROTOCOLS[protocol] if c not in present]
    if missing:
        raise NucleiDataError(f"store {store_dir} lacks client(s) {missing} (found {present})")
    tables = []
    for client in PROTOCOLS[protocol]:
        meta = open_client(store_dir, client).meta
        key = meta["patient"] if permutation == "patient" else meta["group"]
        key = key.astype(str).to_numpy()
        groups = np.array(sorted(set(key)))
        rng = client_rng(seed, client)
        groups = groups[rng.permutation(len(groups))]
        if permutation in ("default", "official"):
            parts = _official_parts(groups, meta, key)
        else:
            train_end, val_end = cut_points(len(groups), HARMOFL_FRACTIONS)
            parts = {"train": groups[:train_end], "val": groups[train_end:val_end], "test": groups[val_end:]}
        empty = [name for name, g in parts.items() if len(g) == 0]
        if empty:
            raise NucleiDataError(
                f"client {client} in {store_dir}: {len(groups)} {permutation if permutation != 'default' else 'image'} "
                f"group(s) leave the {empty} split(s) empty; at least 3 groups are needed"
            )
        rows_of = pd.Series(np.arange(len(meta))).groupby(key).apply(list).to_dict()
        for name, names in parts.items():
            rows = np.array([r for g in names for r in rows_of[g]], dtype=np.int64)
            tables.append(pd.DataFrame({
                "client": client, "split": name, "row": rows,
                "id": meta["id"].to_numpy()[rows], "group": meta["group"].to_numpy()[rows],
            }))
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table


# ---------------------------------------------------------------------------
# Synthetic twin
# ---------------------------------------------------------------------------

# Per-site stain (optical-density vectors), strength, brightness, blur, noise and nucleus shape.
_SITE_STYLE = {
    "MoNuSAC_breast": dict(h=(0.65, 0.70, 0.29), e=(0.07, 0.99, 0.11), strength=1.00, brightness=1.00, blur=0.0,
                           noise=3.0, nuclei=(45, 70), radius=(5.0, 9.0)),
    "MoNuSAC_kidney": dict(h=(0.55, 0.78, 0.35), e=(0.05, 0.85, 0.30), strength=1.20, brightness=0.93, blur=0.7,
                           noise=2.0, nuclei=(35, 55), radius=(4.0, 7.0)),
    "MoNuSAC_lung": dict(h=(0.75, 0.60, 0.22), e=(0.15, 1.05, 0.05), strength=0.80, brightness=1.05, blur=0.0,
                         noise=5.0, nuclei=(30, 50), radius=(4.5, 8.0)),
    "MoNuSAC_prostate": dict(h=(0.60, 0.75, 0.45), e=(0.02, 0.75, 0.15), strength=1.10, brightness=0.97, blur=1.2,
                             noise=1.5, nuclei=(40, 60), radius=(4.0, 7.5)),
    "MoNuSeg": dict(h=(0.70, 0.65, 0.35), e=(0.20, 0.95, 0.20), strength=1.30, brightness=0.90, blur=0.4,
                    noise=4.0, nuclei=(55, 85), radius=(4.0, 7.0)),
    "TNBC": dict(h=(0.62, 0.72, 0.40), e=(0.10, 0.70, 0.40), strength=0.70, brightness=1.08, blur=0.9,
                 noise=2.5, nuclei=(35, 55), radius=(5.0, 10.0)),
}

MONUSEG_SYNTHETIC_IDS = {
    "train": ["TCGA-A7-A13E-01Z-00-DX1", "TCGA-B0-5711-01Z-00-DX1", "TCGA-18-5592-01Z-00-DX1",
              "TCGA-G9-6336-01Z-00-DX1", "TCGA-DK-A2I6-01A-01-TS1", "TCGA-AY-A8YK-01A-01-TS1",
              "TCGA-KB-A93J-01A-01-TS1", "TCGA-HE-7128-01Z-00-DX1", "TCGA-21-5784-01Z-00-DX1",
              "TCGA-AR-A1AK-01Z-00-DX1", "TCGA-CH-5767-01Z-00-DX1", "TCGA-NH-A8F7-01A-01-TS1"],
    "test": ["TCGA-2Z-A9J9-01A-01-TS1", "TCGA-44-2665-01B-06-BS6", "TCGA-69-7764-01A-01-TS1",
             "TCGA-A6-6782-01A-01-BS1", "TCGA-AC-A2FO-01A-01-TS1", "TCGA-HT-8564-01Z-00-DX1"],
}


def _smooth(rng: np.random.Generator, h: int, w: int, cells: int) -> np.ndarray:
    from PIL import Image

    coarse = rng.random((cells, cells)).astype(np.float32)
    return np.asarray(Image.fromarray(coarse, "F").resize((w, h), Image.Resampling.BILINEAR), np.float32)


def _nucleus_polygon(rng, h, w, radius) -> np.ndarray:
    """A jittered ellipse as (x, y) vertices rounded to 0.01 px (what the XML stores)."""
    cy, cx = rng.uniform(-0.03 * h, 1.03 * h), rng.uniform(-0.03 * w, 1.03 * w)  # some cross the border
    ry, rx = rng.uniform(*radius, 2)
    theta0 = rng.uniform(0, np.pi)
    k = int(rng.integers(8, 14))
    t = np.linspace(0, 2 * np.pi, k, endpoint=False)
    jitter = rng.uniform(0.85, 1.15, k)
    y = cy + jitter * (ry * np.sin(t) * np.cos(theta0) + rx * np.cos(t) * np.sin(theta0))
    x = cx + jitter * (rx * np.cos(t) * np.cos(theta0) - ry * np.sin(t) * np.sin(theta0))
    return np.round(np.stack([x, y], axis=1), 2)


def _render(rng, h, w, style, polygons, hazy=()) -> tuple[np.ndarray, np.ndarray]:
    """H&E-like RGB image and its binary mask (rasterised exactly as the parser will)."""
    from PIL import Image, ImageFilter
    from skimage.draw import polygon

    eosin = 0.2 + 0.4 * _smooth(rng, h, w, 7)
    eosin *= _smooth(rng, h, w, 5) > 0.12
    hema = 0.05 * _smooth(rng, h, w, 9)
    mask = np.zeros((h, w), np.uint8)
    for xy in hazy:  # ambiguous areas: faint, diffuse hematoxylin, not nuclei
        rr, cc = polygon(xy[:, 1], xy[:, 0], shape=(h, w))
        hema[rr, cc] = np.maximum(hema[rr, cc], 0.3)
    texture = _smooth(rng, h, w, max(4, min(h, w) // 6))
    for xy in polygons:
        rr, cc = polygon(xy[:, 1], xy[:, 0], shape=(h, w))
        hema[rr, cc] = np.maximum(hema[rr, cc], 0.7 + 0.3 * texture[rr, cc])
        mask[rr, cc] = 1
    od = style["strength"] * (hema[..., None] * np.array(style["h"]) + eosin[..., None] * np.array(style["e"]))
    img = Image.fromarray(np.clip(255.0 * style["brightness"] * np.exp(-od), 0, 255).astype(np.uint8), "RGB")
    if style["blur"] > 0:
        img = img.filter(ImageFilter.GaussianBlur(style["blur"]))
    rgb = np.asarray(img, np.float32) + rng.normal(0.0, style["noise"], (h, w, 3))
    return np.clip(np.round(rgb), 0, 255).astype(np.uint8), mask


def _imagescope_xml(annotations: list[tuple[str, list[np.ndarray]]], microns_per_pixel: str = "0.252100") -> bytes:
    """ImageScope XML: one <Annotation> per cell type, one <Region> per polygon."""
    lines = ['<?xml version="1.0"?>', f'<Annotations MicronsPerPixel="{microns_per_pixel}">']
    region_id = 0
    for a_id, (name, polys) in enumerate(annotations, start=1):
        lines += [
            f'<Annotation Id="{a_id}" Name="" ReadOnly="0" NameReadOnly="0" LineColorReadOnly="0" Incremental="0" '
            'Type="4" LineColor="65280" Visible="1" Selected="1" MarkupImagePath="" MacroName="">',
            f'<Attributes><Attribute Name="{name}" Id="0" Value=""/></Attributes>',
            "<Regions>",
            '<RegionAttributeHeaders><AttributeHeader Id="9999" Name="Region" ColumnWidth="-1"/>'
            '<AttributeHeader Id="9997" Name="Length" ColumnWidth="-1"/>'
            '<AttributeHeader Id="9996" Name="Area" ColumnWidth="-1"/></RegionAttributeHeaders>',
        ]
        for xy in polys:
            region_id += 1
            lines.append(
                f'<Region Id="{region_id}" Type="0" Zoom="1" Selected="0" ImageLocation="" ImageFocus="-1" '
                f'Text="" NegativeROA="0" InputRegionId="0" Analyze="1" DisplayId="{region_id}">'
            )
            lines.append("<Attributes/><Vertices>")
            lines += [f'<Vertex X="{x:.2f}" Y="{y:.2f}" Z="0"/>' for x, y in xy]
            lines.append("</Vertices></Region>")
        lines += ["</Regions>", "<Plots/>", "</Annotation>"]
    lines.append("</Annotations>")
    return ("\n".join(lines) + "\n").encode("utf-8")


def _tif_bytes(array: np.ndarray) -> bytes:
    import tifffile

    buf = io.BytesIO()
    if array.shape[-1] == 4:
        tifffile.imwrite(buf, array, photometric="rgb", extrasamples=[2])  # 2 = unassociated alpha
    else:
        tifffile.imwrite(buf, array, photometric="rgb")
    return buf.getvalue()


def _png_bytes(array: np.ndarray, mode: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, format="PNG", compress_level=1)  # fast; content is noise anyway
    return buf.getvalue()


def _rgba(rgb: np.ndarray) -> np.ndarray:
    return np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=-1)


class _ZipWriter:
    """Deterministic zip (fixed timestamps, sorted directory entries), written atomically."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, bytes | None] = {}

    def add(self, name: str, data: bytes) -> None:
        parts = name.split("/")
        for i in range(1, len(parts)):
            self.entries.setdefault("/".join(parts[:i]) + "/", None)
        self.entries[name] = data

    def close(self) -> None:
        with atomic_path(self.path) as tmp, zipfile.ZipFile(tmp, "w") as zf:
            for name in sorted(self.entries):
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
                data = self.entries[name]
                if data is None:
                    info.external_attr = (0o40755 << 16) | 0x10
                    zf.writestr(info, b"")
                else:
                    info.external_attr = 0o644 << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    zf.writestr(info, data)


def _synthetic_image(rng, client, h, w, *, ambiguous=False):
    style = _SITE_STYLE[client]
    area_scale = h * w / (256 * 256)
    n = max(3, int(rng.integers(*style["nuclei"]) * area_scale))
    polys = [_nucleus_polygon(rng, h, w, style["radius"]) for _ in range(n)]
    hazy = [_nucleus_polygon(rng, h, w, (18.0, 28.0))] if ambiguous else []
    rgb, mask = _render(rng, h, w, style, polys, hazy)
    return rgb, mask, polys, hazy


def write_synthetic(out_dir: str | os.PathLike, seed: int = 0, **options) -> dict:
    """The synthetic twin: the five archives under their raw names, in the real layouts, small.

    Options: ``images_per_site`` (6; per MoNuSAC organ and for MoNuSeg a third
    of them, at least one, go to the test archive), ``image_size`` (256; MoNuSAC
    images vary between 0.5x and 1.3x of it, non-square), ``tnbc_patients`` (3).
    Real-format pitfalls are included on purpose: RGBA TIFFs and PNGs, folders
    with spaces, ``_1``/``_001`` sub-image suffixes, a 2-vertex region in every
    MoNuSAC XML, nuclei crossing the image border, ``Ambiguous`` annotations in
    the MoNuSAC test XMLs, ``__MACOSX`` junk. Returns per client the number of
    images and their nucleus pixel counts at native size.
    """
    known = {"images_per_site", "image_size", "tnbc_patients"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"nuclei: unknown synthetic option(s) {unknown}; known: {sorted(known)}")
    n_img = int(options.get("images_per_site", 6))
    size = int(options.get("image_size", 256))
    tnbc_patients = int(options.get("tnbc_patients", 3))
    if n_img < 3 or n_img > 12 or size < 32 or not 1 <= tnbc_patients <= min(n_img, 11):
        raise ValueError(
            f"need 3 <= images_per_site <= 12, image_size >= 32 and 1 <= tnbc_patients <= min(images_per_site, 11), "
            f"got {n_img}, {size}, {tnbc_patients}"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_test = max(1, n_img // 3)
    info: dict = {"images": {}, "nucleus_pixels": {}}

    # MoNuSAC: per organ, train images from two train patients, test images from one test patient.
    zips = {name: _ZipWriter(out_dir / name) for name in (MONUSAC_TRAIN, MONUSAC_TEST, MONUSEG_TRAIN, MONUSEG_TEST, TNBC_ZIP)}
    for o_index, organ in enumerate(("breast", "kidney", "lung", "prostate")):
        client = ORGAN_CLIENTS[organ]
        info["images"][client], info["nucleus_pixels"][client] = 0, []
        for i in range(n_img):
            subset = "test" if i >= n_img - n_test else "train"
            patients = MONUSAC_ORGANS["train"][organ][:2] if subset == "train" else MONUSAC_ORGANS["test"][organ][:1]
            patient = patients[i % len(patients)]
            folder = f"{patient}-01Z-00-DX1"
            k = i // len(patients) + 1
            stem = f"{folder}_{k}" if o_index % 2 == 0 else f"{folder}_{k:03d}"
            top = "MoNuSAC_images_and_annotations" if subset == "train" else "MoNuSAC Testing Data and Annotations"
            rng = np.random.default_rng([seed, 1, o_index, i])
            h, w = (int(size * f) for f in rng.uniform(0.5, 1.3, 2))
            rgb, mask, polys, hazy = _synthetic_image(rng, client, h, w, ambiguous=subset == "test")
            cell_types = [("Epithelial", polys[::2]), ("Lymphocyte", polys[1::2] + [np.array([[1.0, 1.0], [4.0, 4.0]])])]
            if hazy:
                cell_types.append(("Ambiguous", hazy))
            zip_name = MONUSAC_TRAIN if subset == "train" else MONUSAC_TEST
            zips[zip_name].add(f"{top}/{folder}/{stem}.tif", _tif_bytes(_rgba(rgb)))
            zips[zip_name].add(f"{top}/{folder}/{stem}.xml", _imagescope_xml(cell_types))
            info["images"][client] += 1
            info["nucleus_pixels"][client].append(int(mask.sum()))

    # MoNuSeg: training zip with Tissue Images/ + Annotations/ and macOS junk; test zip flat.
    info["images"]["MoNuSeg"], info["nucleus_pixels"]["MoNuSeg"] = 0, []
    for i in range(n_img):
        subset = "test" if i >= n_img - n_test else "train"
        ids = MONUSEG_SYNTHETIC_IDS[subset]
        image_id = ids[(i if subset == "train" else i - (n_img - n_test)) % len(ids)]
        rng = np.random.default_rng([seed, 2, i])
        rgb, mask, polys, _ = _synthetic_image(rng, "MoNuSeg", size, size)
        xml = _imagescope_xml([("Description", polys)])
        if subset == "train":
            top = "MoNuSeg 2018 Training Data"
            zips[MONUSEG_TRAIN].add(f"{top}/Tissue Images/{image_id}.tif", _tif_bytes(rgb))
            zips[MONUSEG_TRAIN].add(f"{top}/Annotations/{image_id}.xml", xml)
            zips[MONUSEG_TRAIN].add(f"__MACOSX/{top}/Tissue Images/._{image_id}.tif", b"\x00\x05\x16\x07junk")
        else:
            zips[MONUSEG_TEST].add(f"MoNuSegTestData/{image_id}.tif", _tif_bytes(rgb))
            zips[MONUSEG_TEST].add(f"MoNuSegTestData/{image_id}.xml", xml)
        info["images"]["MoNuSeg"] += 1
        info["nucleus_pixels"]["MoNuSeg"].append(int(mask.sum()))

    # TNBC: Slide_NN/NN_k.png (RGBA) with GT_NN/NN_k.png (L, 0/255).
    info["images"]["TNBC"], info["nucleus_pixels"]["TNBC"] = 0, []
    for i in range(n_img):
        nn, k = f"{i % tnbc_patients + 1:02d}", i // tnbc_patients + 1
        rng = np.random.default_rng([seed, 3, i])
        rgb, mask, _, _ = _synthetic_image(rng, "TNBC", size, size)
        zips[TNBC_ZIP].add(f"TNBC_NucleiSegmentation/Slide_{nn}/{nn}_{k}.png", _png_bytes(_rgba(rgb), "RGBA"))
        zips[TNBC_ZIP].add(f"TNBC_NucleiSegmentation/GT_{nn}/{nn}_{k}.png", _png_bytes(mask * np.uint8(255), "L"))
        info["images"]["TNBC"] += 1
        info["nucleus_pixels"]["TNBC"].append(int(mask.sum()))
    zips[TNBC_ZIP].add("__MACOSX/TNBC_NucleiSegmentation/._Slide_01", b"\x00\x05\x16\x07junk")

    for writer in zips.values():
        writer.close()
    info["archives"] = sorted(zips)
    return info
