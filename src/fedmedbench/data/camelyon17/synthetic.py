"""The synthetic twin of Camelyon17-WILDS: class in the tissue's structure, hospital in its stain."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageFilter

from ...files import atomic_file
from .download import ARCHIVE
from .raw import patch_relpath
from .sites import CENTER_TO_CLIENT, PATCH_SIZE

# What the twin must show: as in real Camelyon17, the label lives in the tissue's
# STRUCTURE and the hospital in its STAIN and scanner. Normal = pale stroma and fat with sparse,
# small, very dark nuclei (a few isolated dark spots: strongly negative grey-level skewness);
# tumour = a confluent sheet of large overlapping nuclei (a dense texture: skewness near 0). Where
# the nuclei are and how they cluster is Fourier phase, so the label survives HarmoFL's full
# amplitude swap (tested). Tumour is also darker on average, as dense tissue is; that cue is
# amplitude (the DC term) and AmpNorm removes it.
#
# Per-center "staining lab and scanner", applied alike to both classes, so it changes colour and
# the amplitude spectrum only: stain optical-density vectors (RGB), stain strength, brightness,
# focus blur (sigma in pixels), unsharp masking (a sharpening scanner) and noise.
_CENTER_STYLE = {
    0: dict(h=(0.65, 0.70, 0.29), e=(0.07, 0.99, 0.11), strength=1.00, brightness=1.00, blur=0.0, sharpen=0, noise=3.0),
    1: dict(h=(0.45, 0.85, 0.25), e=(0.05, 0.90, 0.35), strength=1.25, brightness=0.92, blur=0.8, sharpen=0, noise=2.0),
    2: dict(
        h=(0.80, 0.60, 0.15), e=(0.20, 1.05, 0.02), strength=0.75, brightness=1.05, blur=0.0, sharpen=150, noise=6.0
    ),
    3: dict(h=(0.55, 0.65, 0.60), e=(0.02, 0.70, 0.20), strength=1.10, brightness=0.97, blur=1.3, sharpen=0, noise=1.5),
    4: dict(h=(0.75, 0.70, 0.40), e=(0.30, 0.90, 0.25), strength=0.90, brightness=1.08, blur=0.4, sharpen=0, noise=4.0),
}


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Smooth random field in [0, 1]: a coarse random grid upsampled bilinearly. ``cells`` per 96 px,
    so a smaller twin patch is a crop of the same tissue, not a shrunken one."""
    cells = max(2, round(cells * size / PATCH_SIZE))
    coarse = rng.random((cells, cells)).astype(np.float32)
    return np.asarray(Image.fromarray(coarse, "F").resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32)


def _nuclei(
    layer: np.ndarray,
    rng: np.random.Generator,
    per_patch: tuple[int, int],
    radius: tuple[float, float],
    level: tuple[float, float],
) -> None:
    """Paint randomly placed, oriented elliptic nuclei into ``layer`` (max with what is there).
    ``per_patch`` is the count range per 96 x 96 px (scaled to the layer's area); radii in pixels.
    Only each nucleus' bounding box is touched."""
    size = layer.shape[0]
    count = int(round(rng.uniform(*per_patch) * (size / PATCH_SIZE) ** 2))
    for _ in range(count):
        cy, cx = rng.uniform(-radius[1], size + radius[1], 2)  # nuclei may be cut by the border
        ry, rx = rng.uniform(*radius, 2)
        theta, value = rng.uniform(0.0, np.pi), rng.uniform(*level)
        y0, y1 = max(int(cy - max(ry, rx)), 0), min(int(cy + max(ry, rx)) + 2, size)
        x0, x1 = max(int(cx - max(ry, rx)), 0), min(int(cx + max(ry, rx)) + 2, size)
        if y0 >= y1 or x0 >= x1:
            continue
        yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
        u = (yy - cy) * np.cos(theta) + (xx - cx) * np.sin(theta)
        v = (xx - cx) * np.cos(theta) - (yy - cy) * np.sin(theta)
        box = layer[y0:y1, x0:x1]  # a view
        inside = (u / ry) ** 2 + (v / rx) ** 2 <= 1.0
        box[inside] = np.maximum(box[inside], value)


def _tissue(rng: np.random.Generator, tumor: bool, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Hematoxylin and eosin densities (size x size): the class's structure, no colour yet."""
    eosin = 0.25 + 0.25 * _smooth_noise(rng, size, 7)
    hema = 0.05 * _smooth_noise(rng, size, 8)
    if tumor:  # a confluent sheet: dense chromatin, large overlapping pleomorphic nuclei, no gaps
        clear = np.zeros((size, size), bool)
        hema += 0.5 + 0.2 * _smooth_noise(rng, size, 9)
        _nuclei(hema, rng, (110, 160), (3.5, 6.0), (0.9, 1.2))
    else:  # pale stroma and fat (unstained, white) with sparse, small, very dark nuclei
        clear = _smooth_noise(rng, size, 5) > 0.75
        _nuclei(hema, rng, (45, 90), (1.8, 3.0), (1.0, 1.4))
    return hema * ~clear, eosin * ~clear


def _synthetic_patch(rng: np.random.Generator, center: int, tumor: bool, size: int) -> np.ndarray:
    """An H&E-like RGBA patch at native resolution (a smaller ``size`` is a crop, like the real
    label's central 32 x 32 region): the class's tissue seen through the center's stain and scanner."""
    style = _CENTER_STYLE[center]
    hema, eosin = _tissue(rng, tumor, size)
    od = style["strength"] * (hema[..., None] * np.array(style["h"]) + eosin[..., None] * np.array(style["e"]))
    image = Image.fromarray(np.clip(255.0 * style["brightness"] * np.exp(-od), 0, 255).astype(np.uint8), "RGB")
    if style["blur"] > 0:
        image = image.filter(ImageFilter.GaussianBlur(style["blur"]))
    if style["sharpen"] > 0:
        image = image.filter(ImageFilter.UnsharpMask(radius=2, percent=style["sharpen"], threshold=0))
    rgb = np.asarray(image, dtype=np.float32) + rng.normal(0.0, style["noise"], (size, size, 3))
    rgba = np.empty((size, size, 4), np.uint8)
    rgba[..., :3] = np.clip(np.round(rgb), 0, 255).astype(np.uint8)
    rgba[..., 3] = 255  # OpenSlide regions are RGBA with an opaque alpha
    return rgba


def _png_bytes(array: np.ndarray, mode: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, format="PNG", compress_level=1)  # fast; content is noise anyway
    return buf.getvalue()


def _tar_add(tf: tarfile.TarFile, name: str, data: bytes | None) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if data is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tf.addfile(info)
    else:
        info.size = len(data)
        info.mode = 0o644
        tf.addfile(info, io.BytesIO(data))


def write_synthetic_release(
    archive_path: str | os.PathLike,
    seed: int = 0,
    patches_per_center: int = 60,
    slides_per_center: int = 4,
    patch_size: int = PATCH_SIZE,
    *,
    top_folder: bool = False,
) -> dict:
    """Write a small, deterministic fake of the WILDS archive (same names, header, RGBA PNGs).

    Per center: ``slides_per_center`` slides (real-style zero-padded patients
    with center == patient // 20 and slide == 10 * center + k, so WILDS'
    invariants hold), ``patches_per_center`` patches, half of them tumour.
    Members are at the top level like WILDS' archive (``top_folder=True``
    puts them under ``camelyon17_v1.0/``). Byte-identical for a given seed.
    """
    if patches_per_center < 3 or not 1 <= slides_per_center <= 10 or patch_size < 16:
        raise ValueError(
            "need patches_per_center >= 3, 1 <= slides_per_center <= 10 and patch_size >= 16, got "
            f"{patches_per_center}, {slides_per_center}, {patch_size}"
        )
    archive_path = Path(archive_path)
    archive_path.parent.mkdir(parents=True, exist_ok=True)
    prefix = "camelyon17_v1.0/" if top_folder else ""
    rows, files = [], []
    info = {"archive": archive_path.name, "patches": {}, "tumor": {}, "slides": {}}
    for center in sorted(CENTER_TO_CLIENT):
        client = CENTER_TO_CLIENT[center]
        slides = [
            (f"{center * 20 + 2 * k:03d}", (3 * k + center) % 5, center * 10 + k) for k in range(slides_per_center)
        ]
        n_tumor = 0
        for j in range(patches_per_center):
            rng = np.random.default_rng([seed, center, j])
            patient, node, slide = slides[j % slides_per_center]
            tumor = (j // slides_per_center) % 2 == 1  # both classes on every slide
            n_tumor += tumor
            # Coordinates: centres on a 32-pixel grid (level-2 pixels), distinct within a slide.
            x, y = 32 * (100 + 7 * j + center), 32 * (200 + 13 * j)
            rows.append(
                dict(
                    patient=patient,
                    node=node,
                    x_coord=x,
                    y_coord=y,
                    tumor=int(tumor),
                    slide=slide,
                    center=center,
                    split=int(rng.random() < 0.1),
                )
            )
            files.append(
                (
                    prefix + patch_relpath(patient, node, x, y),
                    _png_bytes(_synthetic_patch(rng, center, tumor, patch_size), "RGBA"),
                )
            )
        info["patches"][client] = patches_per_center
        info["tumor"][client] = n_tumor
        info["slides"][client] = [f"patient_{p}_node_{n}" for p, n, _ in slides]
    metadata = pd.DataFrame(
        rows, columns=["patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split"]
    )
    csv = metadata.to_csv(index=True, lineterminator="\n").encode("utf-8")  # header starts with ',' like WILDS'

    with (
        atomic_file(archive_path) as fh,
        gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=6) as gz,
    ):
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
            if prefix:
                _tar_add(tf, prefix.rstrip("/"), None)
            _tar_add(tf, prefix + "RELEASE_v1.0.txt", b"Synthetic twin of Camelyon17-WILDS v1.0 (fedmedbench).\n")
            _tar_add(tf, prefix + "metadata.csv", csv)
            _tar_add(tf, prefix + "patches", None)
            made = set()
            for name, data in files:
                folder = name.rsplit("/", 1)[0]
                if folder not in made:
                    _tar_add(tf, folder, None)
                    made.add(folder)
                _tar_add(tf, name, data)
    return info


def write_synthetic(out_dir: str | os.PathLike, seed: int = 0, **options) -> dict:
    """The synthetic twin: ``<out_dir>/camelyon17_v1.0.tar.gz``.

    Options: ``patches_per_center`` (60), ``slides_per_center`` (4, at most
    10), ``patch_size`` (96; a smaller patch is a crop at native resolution, not a shrunken
    one), ``top_folder`` (False).
    """
    known = {"patches_per_center", "slides_per_center", "patch_size", "top_folder"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"camelyon17: unknown synthetic option(s) {unknown}; known: {sorted(known)}")
    return write_synthetic_release(Path(out_dir) / ARCHIVE, seed=seed, **options)
