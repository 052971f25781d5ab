"""The synthetic twin of the RIF release: four domains of disc-centred crops and grey masks, as PNGs in a zip."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from ..archive import write_zip_atomic
from .download import ARCHIVE
from .sites import DOMAINS

# Per-domain camera style: colour cast, gain, contrast, blur (px at the written size), noise, size factor.
_DOMAIN_STYLE = {
    "Domain1": dict(cast=(1.00, 0.85, 0.70), gain=1.00, contrast=1.00, blur=0.0, noise=3, scale=1.00),
    "Domain2": dict(cast=(0.85, 0.95, 0.95), gain=0.80, contrast=0.75, blur=1.0, noise=6, scale=1.25),
    "Domain3": dict(cast=(1.10, 0.80, 0.60), gain=1.15, contrast=1.20, blur=0.0, noise=2, scale=1.50),
    "Domain4": dict(cast=(0.95, 0.90, 1.00), gain=0.90, contrast=0.90, blur=0.6, noise=4, scale=1.50),
}


def _synthetic_names(domain: str, split: str, n: int) -> list[str]:
    offset = 0 if split == "train" else 500
    names = []
    for k in range(n):
        i = offset + k + 1
        if domain == "Domain1":
            names.append(f"{'gn'[k % 2]}drishtiGS_{i:03d}.png")
        elif domain == "Domain2":
            # the first two train images are the two eyes of one patient (one group)
            names.append(f"G-{offset + 1}-{'LR'[k]}.png" if split == "train" and k < 2 else f"{'GNS'[k % 3]}-{i}-L.png")
        elif domain == "Domain3":
            names.append(f"{'gn'[k % 2]}{i:04d}.png")
        else:
            names.append(f"V{i:04d}.png")
    return names


def _coverage(
    rng_center: tuple[float, float], radii: tuple[float, float], size: int, supersample: int = 4
) -> np.ndarray:
    """Fraction of each pixel inside an ellipse (supersampled): anti-aliased edges."""
    s = supersample
    coords = (np.arange(size * s) + 0.5) / s
    y, x = np.meshgrid(coords, coords, indexing="ij")
    cy, cx = rng_center
    inside = ((y - cy) / radii[0]) ** 2 + ((x - cx) / radii[1]) ** 2 < 1.0
    return inside.reshape(size, s, size, s).mean(axis=(1, 3))


def _synthetic_pair(rng: np.random.Generator, domain: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    st = _DOMAIN_STYLE[domain]
    center = (size / 2 + rng.uniform(-0.06, 0.06) * size, size / 2 + rng.uniform(-0.06, 0.06) * size)
    disc_r = (rng.uniform(0.26, 0.34) * size, rng.uniform(0.24, 0.32) * size)
    cup_ratio = rng.uniform(0.35, 0.7)  # glaucoma-like large cups and small ones
    cup_r = (disc_r[0] * cup_ratio, disc_r[1] * cup_ratio * rng.uniform(0.9, 1.1))
    disc = _coverage(center, disc_r, size)
    cup = np.minimum(_coverage(center, cup_r, size), disc)
    grey = 255.0 * (1 - disc) + 128.0 * (disc - cup)  # 255 bg, 128 rim, 0 cup, mixtures at edges
    mask = np.clip(np.floor(grey + 0.5), 0, 255).astype(np.uint8)

    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack([0.70 - 0.25 * ((y - 0.5) ** 2 + (x - 0.5) ** 2), 0.30 + 0.05 * x, 0.12 + 0.03 * y], -1)
    angle = np.arctan2(y - center[0] / size, x - center[1] / size)
    vessels = sum(np.exp(-((np.sin(angle - a) * 30) ** 2)) for a in rng.uniform(0, 2 * np.pi, 4))
    base = base * (1 - 0.35 * np.clip(vessels, 0, 1)[..., None] * (1 - cup[..., None]))
    image = (
        base * (1 - disc[..., None])
        + np.asarray([0.95, 0.80, 0.45]) * (disc - cup)[..., None]
        + np.asarray([1.0, 0.95, 0.80]) * cup[..., None]
    )
    image = image * 255.0 * (1 + 0.05 * rng.standard_normal(3))
    image = (image - image.mean()) * st["contrast"] + image.mean()
    image = image * np.asarray(st["cast"]) * st["gain"]
    out = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB")
    if st["blur"]:
        out = out.filter(ImageFilter.GaussianBlur(st["blur"]))
    arr = np.asarray(out, float) + st["noise"] * rng.standard_normal((size, size, 3))
    return np.clip(arr, 0, 255).astype(np.uint8), mask


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def write_synthetic(
    out_dir: str | os.PathLike, seed: int = 0, *, train_per_domain: int = 6, test_per_domain: int = 3, size: int = 48
) -> dict:
    """Write a small ``Fundus.zip`` in the DoFE layout (``Fundus/Domain{1..4}/{train,test}/ROIs/{image,mask}``).

    Real-style names per domain (``gdrishtiGS_001.png``, ``G-1-L.png``, ``g0001.png``, ``V0001.png``),
    RGB images with a per-domain colour cast, brightness, contrast, blur and noise, and a size that
    differs per domain (``size`` x 1, 1.25, 1.5, 1.5), grey masks 255 / 128 / 0 with anti-aliased
    edges. Returns the names per domain and split.
    """
    if train_per_domain < 2 or test_per_domain < 1 or size < 16:
        raise ValueError(
            f"need train_per_domain >= 2, test_per_domain >= 1, size >= 16; got "
            f"{train_per_domain}, {test_per_domain}, {size}"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    members: list[tuple[str, bytes]] = [("Fundus/", b"")]
    info: dict[str, dict] = {}
    for d_index, domain in enumerate(DOMAINS):
        side = int(round(size * _DOMAIN_STYLE[domain]["scale"]))
        info[domain] = {"size": side}
        for s_index, (split, n) in enumerate((("train", train_per_domain), ("test", test_per_domain))):
            names = _synthetic_names(domain, split, n)
            info[domain][split] = names
            for k, name in enumerate(names):
                rng = np.random.default_rng([int(seed), d_index, s_index, k])
                image, mask = _synthetic_pair(rng, domain, side)
                base = f"Fundus/{domain}/{split}/ROIs"
                members += [(f"{base}/image/{name}", _png(image)), (f"{base}/mask/{name}", _png(mask))]
    path = out_dir / ARCHIVE
    write_zip_atomic(path, members)
    return info
