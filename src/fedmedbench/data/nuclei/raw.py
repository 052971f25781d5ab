"""Reading the nuclei releases (MoNuSAC, MoNuSeg: ImageScope XML; TNBC: PNG masks) into the canonical store."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import tifffile
from PIL import Image
from skimage.draw import polygon

from .. import check_protocol
from ..images import read_mask
from ..store import staged_dir, write_client
from .download import DOWNLOADS, MONUSAC_TEST, MONUSAC_TRAIN, MONUSEG_TEST, MONUSEG_TRAIN, TNBC_ZIP
from .sites import CLIENT_LABELS, CLIENTS, ORGAN_CLIENTS, PATIENT_ORGAN, PROTOCOLS, REAL_COUNTS, NucleiDataError

DEFAULT_SIZE = 256

_IMAGE_SUFFIXES = (".tif", ".tiff", ".png")
_PATIENT_RE = re.compile(r"^(TCGA-[A-Z0-9]{2}-[A-Z0-9]{4})", re.IGNORECASE)
_SLIDE_RE = re.compile(r"^Slide_(\d+)$")
_GT_RE = re.compile(r"^GT_(\d+)$")
_PAD_IMAGE = 255  # white: glass / empty slide background
AMBIGUOUS_POLICIES = ("ignore", "foreground")


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
    path = Path(path)
    errors = []
    if path.suffix.lower() in (".tif", ".tiff"):
        try:
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
        raise NucleiDataError(
            f"nuclei: raw files {missing} are missing; expected all of {[s.filename for s in DOWNLOADS]}"
        )
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
    check_protocol("nuclei", protocol, PROTOCOLS)
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    size = size or DEFAULT_SIZE
    tiled = protocol == "harmofl_tiled"
    found = _discover(raw, log)
    counts_found = _found_counts(found)
    log("nuclei: found " + ", ".join(f"{k} {v}" for k, v in counts_found.items()))
    if expect_real_counts:
        problems = [
            f"{k}: found {counts_found[k]}, the real data have {v}"
            for k, v in REAL_COUNTS.items()
            if counts_found[k] != v
        ]
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
                        rows.append(
                            {"id": f"{sample.image_id}/y{ty:05d}_x{tx:05d}", **base, "tile_y": ty, "tile_x": tx}
                        )
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
