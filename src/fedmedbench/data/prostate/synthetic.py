"""The synthetic twin of the SAML release: six sites' volumes with visibly different intensity profiles."""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ...files import atomic_path
from .sites import RELEASE_CASES, RELEASE_SITES, RELEASE_TO_CLIENT

# Per-site acquisition "style": the six must differ clearly after HarmoFL's
# min-max normalisation, so they differ in gamma, contrast, bias and noise, not
# only in scale/offset (which the normalisation removes).
_SITE_STYLE = {
    "BIDMC": dict(scale=300.0, offset=20.0, gamma=1.0, contrast=0.45, bias=0.15, noise=0.02),
    "BMC": dict(scale=900.0, offset=100.0, gamma=0.55, contrast=0.30, bias=0.35, noise=0.06),
    "HK": dict(scale=120.0, offset=0.0, gamma=1.7, contrast=0.80, bias=0.05, noise=0.01),
    "I2CVB": dict(scale=2000.0, offset=300.0, gamma=0.75, contrast=0.25, bias=0.50, noise=0.10),
    "RUNMC": dict(scale=600.0, offset=50.0, gamma=1.3, contrast=0.60, bias=0.25, noise=0.03),
    "UCL": dict(scale=80.0, offset=10.0, gamma=2.2, contrast=1.00, bias=0.10, noise=0.04),
}


def _smooth_field(rng: np.random.Generator, z, y, x, terms: int = 4) -> np.ndarray:
    """A smooth random texture in about [-1, 1]: a few low-frequency cosines."""
    field = 0.0
    for _ in range(terms):
        fz, fy, fx = rng.uniform(0.5, 2.5, size=3)
        phase = rng.uniform(0, 2 * np.pi)
        field = field + np.cos(2 * np.pi * (fz * z + fy * y + fx * x) + phase)
    return field / terms


def _synthetic_case(
    rng: np.random.Generator, site: str, case_index: int, depth: int, size: int
) -> tuple[np.ndarray, np.ndarray]:
    style = _SITE_STYLE[site]
    z, y, x = np.ogrid[0:depth, 0:size, 0:size]
    zn, yn, xn = z / max(depth - 1, 1), y / max(size - 1, 1), x / max(size - 1, 1)  # in [0, 1]

    # Prostate-like blob; every third case is long enough to reach the first
    # and last slices, so the edge-slice exclusion is exercised.
    cz = (depth - 1) / 2 + rng.uniform(-0.1, 0.1) * depth
    rz = (0.65 if case_index % 3 == 0 else rng.uniform(0.25, 0.38)) * depth
    cy, cx = size / 2 + rng.uniform(-0.12, 0.12, size=2) * size
    ry, rx = rng.uniform(0.12, 0.22, size=2) * size
    wobble = 1 + 0.08 * np.cos(3 * np.arctan2(y - cy, x - cx) + rng.uniform(0, 2 * np.pi))
    dist = np.sqrt(((z - cz) / rz) ** 2 + ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2) / wobble
    gland = dist < 1.0
    label = gland.astype(np.uint8)
    if site in ("RUNMC", "BMC"):  # NCI-ISBI sites carry two zones: central (2) inside peripheral (1)
        label[dist < 0.55] = 2

    # Body (pelvis) ellipse on a dark background, soft tissue texture inside.
    body = ((y - size / 2) / (0.46 * size)) ** 2 + ((x - size / 2) / (0.40 * size)) ** 2 < 1.0
    body = np.broadcast_to(body, (depth, size, size))
    tissue = 0.30 + 0.06 * _smooth_field(rng, zn, yn, xn)
    base = np.where(body, tissue, 0.04)
    texture = 0.5 + 0.12 * _smooth_field(rng, 2 * zn, 3 * yn, 3 * xn)
    base = np.where(gland, base + style["contrast"] * texture, base)
    if site in ("RUNMC", "BMC"):
        base = np.where(dist < 0.55, base - 0.15 * style["contrast"], base)
    base = np.clip(base, 0.0, None) ** style["gamma"]

    # Smooth multiplicative bias field (coil inhomogeneity), then noise, then scanner scale/offset.
    bias = 1 + style["bias"] * (0.6 * (yn - 0.5) + 0.4 * (xn - 0.5) + 0.5 * _smooth_field(rng, 0.3 * zn, yn, xn, 2))
    signal = base * bias + style["noise"] * rng.standard_normal((depth, size, size))
    image = style["offset"] + style["scale"] * np.clip(signal, 0.0, None)
    return image.astype(np.float32), label


def write_synthetic_release(
    zip_path: str | os.PathLike,
    seed: int = 0,
    cases_per_site: int = 3,
    depth: int = 10,
    size: int = 64,
    *,
    top_folder: bool = True,
) -> dict[str, dict]:
    """Write a small fake ``Processed_data_nii.zip`` in the layout of the real release.

    Real site folders and case ids (the first ``cases_per_site`` of each site),
    ``_Segmentation`` at BMC, float32 images and uint8 masks ({0,1,2} at RUNMC
    and BMC). Deterministic in ``seed``. Returns, per release site, the client
    name, case ids, mask values and the number of HarmoFL slices it will give.
    """
    import SimpleITK as sitk  # noqa: PLC0415  (SimpleITK costs ~70 ms; only 3-D volumes need it, and the DAG loads this module)

    if not 1 <= cases_per_site <= min(len(c) for c in RELEASE_CASES.values()):
        raise ValueError(f"cases_per_site must be between 1 and 12, got {cases_per_site}")
    if depth < 3 or size < 8:
        raise ValueError(f"need depth >= 3 and size >= 8, got depth={depth}, size={size}")
    zip_path = Path(zip_path)
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    prefix = "Processed_data_nii/" if top_folder else ""
    info: dict[str, dict] = {}
    with (
        atomic_path(zip_path) as tmp_zip,
        tempfile.TemporaryDirectory() as work,
        zipfile.ZipFile(tmp_zip, "w", zipfile.ZIP_STORED) as zf,
    ):
        if top_folder:
            zf.writestr(zipfile.ZipInfo(prefix), b"")
        for site_index, site in enumerate(RELEASE_SITES):
            zf.writestr(zipfile.ZipInfo(f"{prefix}{site}/"), b"")
            seg = "_Segmentation" if site == "BMC" else "_segmentation"
            cases = RELEASE_CASES[site][:cases_per_site]
            n_slices, values = 0, set()
            for case_index, case in enumerate(cases):
                rng = np.random.default_rng([seed, site_index, case_index])
                image, label = _synthetic_case(rng, site, case_index, depth, size)
                n_slices += sum(bool(label[i].any()) for i in range(1, depth - 1))
                values |= set(np.unique(label).tolist())
                for array, name in ((image, f"{case}.nii.gz"), (label, f"{case}{seg}.nii.gz")):
                    local = Path(work) / name
                    sitk.WriteImage(sitk.GetImageFromArray(array), str(local), True)
                    # A fixed member date (ZipInfo's 1980-01-01), not the temporary file's: the twin's
                    # bytes, and so its sha256, are the same on every run.
                    member = zipfile.ZipInfo(f"{prefix}{site}/{name}")
                    member.external_attr = 0o644 << 16
                    zf.writestr(member, local.read_bytes())
            info[site] = {
                "client": RELEASE_TO_CLIENT[site],
                "cases": cases,
                "label_values": sorted(values),
                "slices": n_slices,
            }
    return info
