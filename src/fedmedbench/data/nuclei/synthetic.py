"""The synthetic twin of the three nuclei releases, in their archive layouts and file formats."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image, ImageFilter
from skimage.draw import polygon

from ...files import atomic_path
from .download import MONUSAC_TEST, MONUSAC_TRAIN, MONUSEG_TEST, MONUSEG_TRAIN, TNBC_ZIP
from .sites import MONUSAC_ORGANS, ORGAN_CLIENTS

# Per-site stain (optical-density vectors), strength, brightness, blur, noise and nucleus shape.
_SITE_STYLE = {
    "MoNuSAC_breast": dict(
        h=(0.65, 0.70, 0.29),
        e=(0.07, 0.99, 0.11),
        strength=1.00,
        brightness=1.00,
        blur=0.0,
        noise=3.0,
        nuclei=(45, 70),
        radius=(5.0, 9.0),
    ),
    "MoNuSAC_kidney": dict(
        h=(0.55, 0.78, 0.35),
        e=(0.05, 0.85, 0.30),
        strength=1.20,
        brightness=0.93,
        blur=0.7,
        noise=2.0,
        nuclei=(35, 55),
        radius=(4.0, 7.0),
    ),
    "MoNuSAC_lung": dict(
        h=(0.75, 0.60, 0.22),
        e=(0.15, 1.05, 0.05),
        strength=0.80,
        brightness=1.05,
        blur=0.0,
        noise=5.0,
        nuclei=(30, 50),
        radius=(4.5, 8.0),
    ),
    "MoNuSAC_prostate": dict(
        h=(0.60, 0.75, 0.45),
        e=(0.02, 0.75, 0.15),
        strength=1.10,
        brightness=0.97,
        blur=1.2,
        noise=1.5,
        nuclei=(40, 60),
        radius=(4.0, 7.5),
    ),
    "MoNuSeg": dict(
        h=(0.70, 0.65, 0.35),
        e=(0.20, 0.95, 0.20),
        strength=1.30,
        brightness=0.90,
        blur=0.4,
        noise=4.0,
        nuclei=(55, 85),
        radius=(4.0, 7.0),
    ),
    "TNBC": dict(
        h=(0.62, 0.72, 0.40),
        e=(0.10, 0.70, 0.40),
        strength=0.70,
        brightness=1.08,
        blur=0.9,
        noise=2.5,
        nuclei=(35, 55),
        radius=(5.0, 10.0),
    ),
}

MONUSEG_SYNTHETIC_IDS = {
    "train": [
        "TCGA-A7-A13E-01Z-00-DX1",
        "TCGA-B0-5711-01Z-00-DX1",
        "TCGA-18-5592-01Z-00-DX1",
        "TCGA-G9-6336-01Z-00-DX1",
        "TCGA-DK-A2I6-01A-01-TS1",
        "TCGA-AY-A8YK-01A-01-TS1",
        "TCGA-KB-A93J-01A-01-TS1",
        "TCGA-HE-7128-01Z-00-DX1",
        "TCGA-21-5784-01Z-00-DX1",
        "TCGA-AR-A1AK-01Z-00-DX1",
        "TCGA-CH-5767-01Z-00-DX1",
        "TCGA-NH-A8F7-01A-01-TS1",
    ],
    "test": [
        "TCGA-2Z-A9J9-01A-01-TS1",
        "TCGA-44-2665-01B-06-BS6",
        "TCGA-69-7764-01A-01-TS1",
        "TCGA-A6-6782-01A-01-BS1",
        "TCGA-AC-A2FO-01A-01-TS1",
        "TCGA-HT-8564-01Z-00-DX1",
    ],
}


def _smooth(rng: np.random.Generator, h: int, w: int, cells: int) -> np.ndarray:
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
    buf = io.BytesIO()
    if array.shape[-1] == 4:
        tifffile.imwrite(buf, array, photometric="rgb", extrasamples=[2])  # 2 = unassociated alpha
    else:
        tifffile.imwrite(buf, array, photometric="rgb")
    return buf.getvalue()


def _png_bytes(array: np.ndarray, mode: str) -> bytes:
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
    zips = {
        name: _ZipWriter(out_dir / name)
        for name in (MONUSAC_TRAIN, MONUSAC_TEST, MONUSEG_TRAIN, MONUSEG_TEST, TNBC_ZIP)
    }
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
            cell_types = [
                ("Epithelial", polys[::2]),
                ("Lymphocyte", polys[1::2] + [np.array([[1.0, 1.0], [4.0, 4.0]])]),
            ]
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
