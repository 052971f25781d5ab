"""The synthetic twin of HAM10000 and ISIC 2017: every raw file under its real name and format."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageFilter

from ..archive import write_zip_atomic
from ..store import atomic_write_text
from .download import DOWNLOADS, HAM_METADATA, HAM_PART1, HAM_PART2, ISIC_GT, ISIC_IMAGES
from .raw import HAM_COLUMNS
from .sites import CLASSES, CLIENT_SOURCES, EXPECTED_CLASS_COUNTS, ISIC_CLIENT, OOD_CLIENT, OOD_SOURCE

# Per-source acquisition style: skin tone, colour cast, brightness, contrast, blur, noise, vignette.
_SOURCE_STYLE = {
    "vidir_modern": dict(
        skin=(222, 180, 160), cast=(1.00, 0.97, 0.95), gain=1.00, contrast=1.00, blur=0.0, noise=3, vignette=0.25
    ),
    "vidir_molemax": dict(
        skin=(205, 150, 135), cast=(1.05, 0.92, 0.88), gain=0.85, contrast=0.80, blur=1.0, noise=6, vignette=0.10
    ),
    "rosendahl": dict(
        skin=(230, 195, 175), cast=(0.95, 1.00, 1.06), gain=1.10, contrast=1.15, blur=0.0, noise=2, vignette=0.45
    ),
    "vienna_dias": dict(
        skin=(215, 190, 140), cast=(1.08, 1.00, 0.78), gain=0.90, contrast=0.70, blur=1.5, noise=10, vignette=0.60
    ),
    "isic2017": dict(
        skin=(200, 170, 165), cast=(0.97, 0.97, 1.02), gain=0.95, contrast=1.05, blur=0.5, noise=4, vignette=0.30
    ),
}
# Class signal: lesion colour, radius (fraction of the short side), border irregularity, texture.
_CLASS_STYLE = {
    0: dict(colour=(120, 75, 50), radius=0.22, irregular=0.05, texture=0.05),  # nevus: brown, round, smooth
    1: dict(colour=(170, 135, 95), radius=0.28, irregular=0.15, texture=0.35),  # BKL: tan, oval, warty
    2: dict(colour=(55, 35, 40), radius=0.30, irregular=0.25, texture=0.20),  # melanoma: dark, irregular
}
_REAL_FRACTIONS = {c: np.asarray(v, float) / sum(v) for c, v in EXPECTED_CLASS_COUNTS.items()}


def _class_sizes(n: int, fractions: np.ndarray) -> list[int]:
    """n split over 3 classes: half the real proportions, half uniform, at least 3 per class."""
    mix = 0.5 * fractions + 0.5 / 3
    sizes = np.maximum(3, np.floor(mix * n).astype(int))
    sizes[0] += max(0, n - sizes.sum())
    return sizes.tolist()


def _synthetic_image(rng: np.random.Generator, label: int, source: str, width: int, height: int) -> np.ndarray:
    st, cl = _SOURCE_STYLE[source], _CLASS_STYLE[label]
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    short = min(width, height)
    cy, cx = height / 2 + rng.uniform(-0.08, 0.08) * short, width / 2 + rng.uniform(-0.08, 0.08) * short
    angle = np.arctan2(y - cy, x - cx)
    radius = cl["radius"] * short * rng.uniform(0.85, 1.15)
    stretch = 1.3 if label == 1 else 1.0
    border = 1 + cl["irregular"] * (
        np.cos(3 * angle + rng.uniform(0, 6.3)) + 0.6 * np.cos(5 * angle + rng.uniform(0, 6.3))
    )
    dist = np.sqrt(((x - cx) / stretch) ** 2 + (y - cy) ** 2) / (radius * border)
    lesion = np.clip((1.0 - dist) * 4, 0, 1)[..., None]  # soft edge
    skin = np.asarray(st["skin"], float) * (1 + 0.04 * rng.standard_normal(3))
    colour = np.asarray(cl["colour"], float) * (1 + 0.12 * rng.standard_normal(3))
    texture = 1 + cl["texture"] * (rng.random((height, width)) - 0.5)[..., None]
    image = skin * (1 - lesion) + colour * texture * lesion
    if label == 2:  # blue-grey veil in part of the melanoma
        veil = lesion[..., 0] * (np.cos(angle - rng.uniform(0, 6.3)) > 0.3)
        image = image * (1 - 0.5 * veil[..., None]) + np.asarray([70, 80, 110.0]) * 0.5 * veil[..., None]
    # acquisition: contrast around the mean, colour cast, gain, vignette, blur, noise
    image = (image - image.mean()) * st["contrast"] + image.mean()
    image = image * np.asarray(st["cast"]) * st["gain"]
    r2 = ((x - width / 2) ** 2 + (y - height / 2) ** 2) / (0.25 * (width**2 + height**2))
    image = image * (1 - st["vignette"] * r2)[..., None]
    out = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB")
    if st["blur"]:
        out = out.filter(ImageFilter.GaussianBlur(st["blur"]))
    arr = np.asarray(out, float) + st["noise"] * rng.standard_normal((height, width, 3))
    return np.clip(arr, 0, 255).astype(np.uint8)


def _jpeg(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array, "RGB").save(buf, format="JPEG", quality=92)
    return buf.getvalue()


def write_synthetic(
    out_dir: str | os.PathLike,
    seed: int = 0,
    *,
    images_per_client: int = 30,
    ood_images: int = 15,
    width: int = 64,
    height: int = 48,
) -> dict:
    """Write the five raw files of the skin family, small and in their real formats.

    HAM-style metadata (8 columns incl. ``dataset``, float ages with some blanks, lesions with two
    images, a few akiec/bcc/df/vasc rows that must be dropped) and JPEGs ``ISIC_00xxxxx.jpg`` split
    over the two part zips; an ISIC-2017-style zip (``ISIC-2017_Training_Data/`` with a superpixel
    PNG and a metadata CSV to be ignored) and its Part-3 ground truth with ``0.0``/``1.0`` flags.
    Each source has its own colour cast, brightness, contrast, blur, noise and vignette; the class
    drives lesion colour, size, shape and texture. Returns per-client class counts.
    """
    if images_per_client < 12 or ood_images < 3:
        raise ValueError(f"need images_per_client >= 12 and ood_images >= 3, got {images_per_client}, {ood_images}")
    if width < 8 or height < 8:
        raise ValueError(f"need width, height >= 8, got {width}x{height}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([int(seed), 7])
    rows, jpegs = [], []
    next_image, next_lesion = 24306, 0  # HAM10000 ids start at ISIC_0024306
    info: dict[str, dict] = {}
    sources = {**CLIENT_SOURCES, OOD_CLIENT: OOD_SOURCE}
    for client, source in sources.items():
        n = ood_images if client == OOD_CLIENT else images_per_client
        sizes = _class_sizes(n, _REAL_FRACTIONS[client]) if n >= 9 else [n - 2, 1, 1]
        labels = [k for k, m in enumerate(sizes) for _ in range(m)] + [-1, -2]  # two dropped-class rows
        info[client] = {"source": source, "nv/bkl/mel": sizes}
        for j, label in enumerate(labels):
            dx = CLASSES[label] if label >= 0 else ("bcc", "df", "akiec", "vasc")[(j + len(client)) % 4]
            # every fourth image is a second view of the previous lesion (same lesion_id and class)
            if j % 4 != 3 or label < 0 or labels[j - 1] != label:
                next_lesion += 1
            image_id = f"ISIC_{next_image:07d}"
            next_image += 1
            age = "" if j == 5 else f"{float(rng.integers(1, 18) * 5):.1f}"
            rows.append(
                {
                    "lesion_id": f"HAM_{next_lesion:07d}",
                    "image_id": image_id,
                    "dx": dx,
                    "dx_type": ("histo", "follow_up", "consensus", "confocal")[j % 4],
                    "age": age,
                    "sex": ("male", "female")[j % 2],
                    "localization": ("back", "face", "trunk", "lower extremity")[j % 4],
                    "dataset": source,
                }
            )
            drawn = label if label >= 0 else 1
            jpegs.append((image_id, _jpeg(_synthetic_image(rng, drawn, source, width, height))))
    order = rng.permutation(len(rows))  # the real file is not grouped by source
    meta = pd.DataFrame([rows[i] for i in order], columns=list(HAM_COLUMNS))
    atomic_write_text(out_dir / HAM_METADATA, meta.to_csv(index=False, lineterminator="\n"))
    half = len(jpegs) // 2
    write_zip_atomic(out_dir / HAM_PART1, [(f"{i}.jpg", b) for i, b in jpegs[:half]], date_time=(2018, 1, 1, 0, 0, 0))
    write_zip_atomic(out_dir / HAM_PART2, [(f"{i}.jpg", b) for i, b in jpegs[half:]], date_time=(2018, 1, 1, 0, 0, 0))

    # ISIC 2017: ids ISIC_0000000.., varied sizes (portrait, landscape, larger), superpixels + metadata junk.
    sizes = _class_sizes(images_per_client, _REAL_FRACTIONS[ISIC_CLIENT])
    labels = [k for k, m in enumerate(sizes) for _ in range(m)]
    labels = [labels[i] for i in rng.permutation(len(labels))]
    info[ISIC_CLIENT] = {"source": "isic2017", "nv/bkl/mel": sizes}
    prefix = "ISIC-2017_Training_Data/"
    members = [(prefix, b"")]
    gt_lines = ["image_id,melanoma,seborrheic_keratosis"]
    meta_lines = ["image_id,age_approximate,sex"]
    shapes = [(width, height), (height, width), (width * 3 // 2, height * 3 // 2)]
    for k, label in enumerate(labels):
        image_id = f"ISIC_{k * 7:07d}"
        w, h = shapes[k % 3]
        members.append((f"{prefix}{image_id}.jpg", _jpeg(_synthetic_image(rng, label, "isic2017", w, h))))
        gt_lines.append(f"{image_id},{'1.0' if label == 2 else '0.0'},{'1.0' if label == 1 else '0.0'}")
        meta_lines.append(f"{image_id},{'unknown' if k % 5 == 0 else 45},{('male', 'female')[k % 2]}")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(buf, format="PNG")
    members.append((f"{prefix}ISIC_0000000_superpixels.png", buf.getvalue()))
    members.append((f"{prefix}ISIC-2017_Training_Data_metadata.csv", ("\n".join(meta_lines) + "\n").encode()))
    write_zip_atomic(out_dir / ISIC_IMAGES, members, date_time=(2018, 1, 1, 0, 0, 0))
    atomic_write_text(out_dir / ISIC_GT, "\n".join(gt_lines) + "\n")
    return {"clients": info, "files": [s.filename for s in DOWNLOADS]}
