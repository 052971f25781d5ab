"""Geometry and values of a user's own data (``family: folders``) are checked, not assumed:
NIfTI image/mask grids, image sizes against the model (DAG time and before training), contiguous
``mask_values``, a visible ``nifti_axis``, robust scaling of deep images, and classification images
that ``labels.csv`` does not list."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fedmedbench import config as cfgmod
from fedmedbench.data import folders as F
from fedmedbench.data.folders.reading import _to_uint8
from fedmedbench.data.store import open_client
from fedmedbench.errors import ConfigError, DataError, FedmedbenchError

ROOT = Path(__file__).resolve().parents[1]
SITES = ["siteA", "siteB", "siteC"]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    base = tmp_path_factory.mktemp("geometry")
    return {
        "nifti": F.write_example(base / "nifti", image_format="nifti", counts=(3, 3, 3)),
        "classification": F.write_example(base / "classification", kind="classification"),
    }


def _copy(example: dict, tmp_path: Path) -> tuple[Path, dict]:
    root = tmp_path / "data"
    shutil.copytree(example["options"]["root"], root)
    return root, {**example["options"], "root": str(root)}


def _preprocess(options: dict, tmp_path: Path, log=None) -> Path:
    store = tmp_path / "out" / "store"
    F.preprocess({}, store, "", options=options, log=log or (lambda _: None))
    return store


def _refused(options: dict, tmp_path: Path) -> str:
    """The one-line error of a preprocessing that must write nothing."""
    with pytest.raises(DataError) as err:
        _preprocess(options, tmp_path)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()
    return str(err.value)


# --- 1. NIfTI image and mask on one voxel grid ----------------------------------------------------------


def _rewrite_mask(path: Path, **geometry) -> None:
    """The same mask voxels with another direction, origin or spacing in the header."""
    import SimpleITK as sitk

    mask = sitk.ReadImage(str(path))
    for key, value in geometry.items():
        getattr(mask, f"Set{key.capitalize()}")(value)
    sitk.WriteImage(mask, str(path), True)


FLIPPED = (-1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)  # i runs the other way: a left-right mirror


@pytest.mark.parametrize(
    "geometry, differs",
    [
        ({"direction": FLIPPED}, "direction (1, 0, 0, 0, 1, 0, 0, 0, 1) vs (-1, 0, 0, 0, 1, 0, 0, 0, 1)"),
        ({"spacing": (1.0, 1.0, 3.0)}, "spacing (1, 1, 1) vs (1, 1, 3)"),
        ({"origin": (0.0, 0.0, 2.5)}, "origin (0, 0, 0) vs (0, 0, 2.5)"),
    ],
    ids=["flipped-direction", "spacing", "origin"],
)
def test_a_nifti_mask_on_another_voxel_grid_is_refused_naming_both_files(examples, tmp_path, geometry, differs):
    """Same array shape as the image, so a shape check alone let it through: the flipped mask was
    scored in a mirrored orientation, silently."""
    root, options = _copy(examples["nifti"], tmp_path)
    _rewrite_mask(root / "siteB/masks/vol01.nii.gz", **geometry)
    text = _refused(options, tmp_path)
    assert text == (
        f"{root}/siteB/images/vol01.nii.gz and its mask {root}/siteB/masks/vol01.nii.gz are not on one voxel "
        f"grid: {differs} (image vs mask); resample the mask onto its image (nearest neighbour) or fix its header"
    )


def test_header_float_noise_below_the_tolerance_is_accepted(examples, tmp_path):
    root, options = _copy(examples["nifti"], tmp_path)
    # 1e-5 off in every number (float32 header rounding is ~1e-7): within 1e-3, the same grid.
    _rewrite_mask(
        root / "siteB/masks/vol01.nii.gz",
        spacing=(1.00001, 1.0, 0.99999),
        origin=(1e-5, 0.0, -1e-5),
        direction=(1.0, 1e-5, 0.0, -1e-5, 1.0, 0.0, 0.0, 0.0, 1.0),
    )
    store = _preprocess(options, tmp_path)
    assert len(open_client(store, "siteB")) == 3 * 5
    # ... and 2e-3 of a voxel in the origin is not noise any more.
    shutil.rmtree(tmp_path / "out")
    _rewrite_mask(root / "siteB/masks/vol01.nii.gz", origin=(0.002, 0.0, 0.0))
    assert "origin (0, 0, 0) vs (0.002, 0, 0)" in _refused(options, tmp_path)


# --- 2. image size against the model ----------------------------------------------------------------


@pytest.mark.parametrize(
    "height, width, expected",
    [
        (96, 96, None),
        (
            100,
            100,
            "100 is not a multiple of 16, which the UNet of task 't' needs (it halves the resolution 4 times); "
            "nearest valid sizes: 96 or 112",
        ),
        (
            8,
            8,
            "8 is not a multiple of 16, which the UNet of task 't' needs (it halves the resolution 4 times); "
            "nearest valid sizes: 16",
        ),
        (
            36,
            32,
            "36x32 (H x W) is not a multiple of 16, which the UNet of task 't' needs (it halves the resolution 4 times); "
            "nearest valid sizes: 32 or 48 for H 36",
        ),
    ],
)
def test_the_unet_size_rule_names_the_nearest_valid_sizes(height, width, expected):
    assert cfgmod.model_size_problem({"name": "unet"}, height, width, task="t") == expected


def _forward_works(model: torch.nn.Module, size: int) -> bool:
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, size, size))
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize(
    "model, sizes",
    [
        ({"name": "unet", "init_features": 2}, [8, 16, 24, 32, 40, 48]),
        (
            {"name": "densenet", "growth_rate": 2, "block_config": [1, 1, 1, 1], "num_init_features": 4},
            [11, 12, 13, 14],
        ),
        (
            {"name": "densenet", "growth_rate": 2, "block_config": [1, 1, 1, 1, 1], "num_init_features": 4},
            [43, 44, 45, 46],
        ),
        ({"name": "vgg_slim", "init_features": 2}, [30, 31, 32, 33]),
    ],
    ids=["unet", "densenet-4-blocks", "densenet-5-blocks", "vgg-slim"],
)
def test_the_size_rule_agrees_with_a_forward_pass(model, sizes):
    """The rule is derived from the architectures; a real forward pass must fail exactly where it
    says (a minimum of 13 for DenseNet-121's layout with HarmoFL's padding, 45 for five dense blocks,
    32 for the VGGs)."""
    from fedmedbench.models import build_model

    network = build_model({**model, "num_classes": 2, "in_channels": 3})
    verdicts = {size: cfgmod.model_size_problem(model, size, size) is None for size in sizes}
    assert verdicts == {size: _forward_works(network, size) for size in sizes}
    assert set(verdicts.values()) == {True, False}  # each case straddles the limit
    assert 2 ** len(network.encoders) == cfgmod.UNET_DIVISOR if model["name"] == "unet" else True


BASE = cfgmod.load_config(ROOT / "config" / "config.yaml")


def _user_config(root, data=None, task=None):
    change = {
        "data": {"mysites": {"family": "folders", "root": str(root), **(data or {})}},
        "tasks": {"mysites": {"dataset": "mysites", "kind": (data or {}).get("kind", "segmentation"), **(task or {})}},
    }
    return cfgmod.deep_merge(BASE, change)


def _dag_error(config) -> str:
    with pytest.raises(FedmedbenchError) as err:
        cfgmod.complete_user_data(config)
        cfgmod.validate(config)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_builtin_protocol_size_the_unet_cannot_take_is_refused_at_dag_time():
    config = cfgmod.deep_merge(BASE, {"data": {"fundus": {"protocols": {"fedlwr": {"image_size": 200}}}}})
    assert _dag_error(config) == (
        "config: data.fundus.protocols.fedlwr.image_size: 200 is not a multiple of 16, which the UNet of task 'fundus' "
        "needs (it halves the resolution 4 times); nearest valid sizes: 192 or 208"
    )


def test_a_folders_image_size_the_unet_cannot_take_is_refused_at_dag_time(tmp_path):
    made = F.write_example(tmp_path / "data")
    options = {"mask_values": made["options"]["mask_values"]}
    assert _dag_error(_user_config(tmp_path / "data", {**options, "image_size": 40})) == (
        "config: data.mysites.image_size: 40 is not a multiple of 16, which the UNet of task 'mysites' needs "
        "(it halves the resolution 4 times); nearest valid sizes: 32 or 48"
    )
    config = _user_config(tmp_path / "data", {**options, "image_size": 48})
    cfgmod.complete_user_data(config)
    cfgmod.validate(config)  # 48 is fine


def test_a_native_size_is_read_from_one_header_at_dag_time(tmp_path):
    made = F.write_example(tmp_path / "png", size=40)
    error = _dag_error(_user_config(tmp_path / "png", {"mask_values": made["options"]["mask_values"]}))
    assert error == (
        "config: data.mysites.image_size: 40 is not a multiple of 16, which the UNet of task 'mysites' needs (it halves the "
        "resolution 4 times); nearest valid sizes: 32 or 48; it is not set, so the images keep their native size "
        f"(e.g. {tmp_path}/png/siteA/images/siteA_000.png): set it to resize them"
    )
    # NIfTI (i, j, k) = (32, 36, 5): slices along k are 36x32 (H x W), along j 5x32.
    F.write_example(tmp_path / "nii", image_format="nifti", counts=(3, 3, 3))
    assert F.reading.native_size({"root": str(tmp_path / "nii")})[:2] == (36, 32)
    assert F.reading.native_size({"root": str(tmp_path / "nii"), "nifti_axis": 1})[:2] == (5, 32)
    assert F.reading.native_size({"root": str(tmp_path / "nii"), "nifti_axis": 0})[:2] == (5, 36)
    assert "36x32 (H x W) is not a multiple of 16" in _dag_error(_user_config(tmp_path / "nii"))
    # A classifier's minimum: DenseNet-121 needs 13 pixels; the example's 8-pixel images are refused.
    cls = F.write_example(tmp_path / "cls", kind="classification", size=8)
    error = _dag_error(_user_config(tmp_path / "cls", {"kind": "classification", "classes": cls["options"]["classes"]}))
    assert error.startswith(
        "config: data.mysites.image_size: 8 is below 13, the smallest size the DenseNet of task 'mysites' "
        "can take (its strided layers would leave no pixel); it is not set"
    )
    assert F.reading.native_size({"root": str(tmp_path / "missing")}) is None  # unreadable: preprocessing names it


def test_train_checks_the_store_size_before_the_first_step(tmp_path):
    """A store built at a native 40 x 40 (the DAG check bypassed, e.g. `train` by hand): one line
    naming the store and the sizes that fit, and no run folder, instead of a shape traceback."""
    from fedmedbench.fl import engine
    from tests.conftest import tiny_run_config

    made = F.write_example(tmp_path / "data", size=40)
    store = tmp_path / "store"
    F.preprocess({}, store, "", options=made["options"], log=lambda _: None)
    F.split(store, tmp_path / "split.csv", options=made["options"], log=lambda _: None)
    cfg = tiny_run_config(
        store,
        tmp_path / "split.csv",
        clients=SITES,
        model={"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 3},
    )
    with pytest.raises(ConfigError) as err:
        engine.run_training(cfg, tmp_path / "run", progress=False)
    assert str(err.value) == (
        f"{store}: the images of client siteA are 40x40 (H x W): 40 is not a multiple of 16, which the UNet needs (it halves "
        "the resolution 4 times); nearest valid sizes: 32 or 48; preprocess the data at a size that fits (image_size)"
    )
    assert not (tmp_path / "run").exists()


# --- 3. mask_values map to contiguous class indices ------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"mask_values": {0: 0, 255: 2}},
            "folders.mask_values: no pixel value maps to class index 1; the class indices must be exactly 0 .. 2 without gaps, "
            "got {0: 0, 255: 2}",
        ),
        (
            {"mask_values": {0: 0, 255: 1}, "classes": ["background", "ring", "core"]},
            "folders.mask_values: no pixel value maps to class index 2 ('core' of classes ['background', 'ring', 'core']); "
            "the class indices must be exactly 0 .. 2 without gaps, got {0: 0, 255: 1}",
        ),
        (
            {"mask_values": {10: 1, 255: 2}},
            "folders.mask_values: no pixel value maps to class index 0; the class indices must be exactly 0 .. 2",
        ),
    ],
)
def test_mask_values_must_map_to_contiguous_class_indices(options, message):
    with pytest.raises(ConfigError) as err:
        F.FoldersOptions.from_dict({"root": "d", **options})
    assert str(err.value).startswith(message)
    # Several values may share a class; 0 .. n-1 all present is fine.
    assert F.FoldersOptions.from_dict({"root": "d", "mask_values": {0: 0, 128: 1, 200: 1, 255: 2}}).num_classes == 3


def test_a_gap_in_mask_values_is_refused_at_dag_time(tmp_path):
    F.write_example(tmp_path / "data")
    assert "config: data.mysites.mask_values: no pixel value maps to class index 1" in _dag_error(
        _user_config(tmp_path / "data", {"mask_values": {0: 0, 255: 2}})
    )


# --- 4. the native slice shape is logged; a far-off aspect ratio is warned about ----------------------


def _volume(path: Path, shape_kji: tuple[int, int, int], value: int) -> None:
    import SimpleITK as sitk

    sitk.WriteImage(
        sitk.GetImageFromArray(np.full(shape_kji, value, np.int16 if value > 1 else np.uint8)), str(path), True
    )


def test_native_slice_sizes_are_logged_and_a_site_far_off_in_aspect_is_warned(examples, tmp_path):
    root, options = _copy(examples["nifti"], tmp_path)
    # siteC's volumes stored with k and i swapped: slices along k are 36x5 instead of 36x32.
    for k in range(3):
        for sub, value in (("images", 300), ("masks", 0)):
            _volume(root / f"siteC/{sub}/vol{k:02d}.nii.gz", (32, 36, 5), value)
    # siteA: one volume of another in-plane size (allowed with image_size, and listed).
    for sub, value in (("images", 300), ("masks", 0)):
        _volume(root / f"siteA/{sub}/vol02.nii.gz", (5, 40, 32), value)
    logged = []
    _preprocess({**options, "image_size": 32}, tmp_path, log=logged.append)
    notes = [line for line in logged if line.startswith("folders site") and "native" in line]  # not the check-data head
    assert notes == [
        "folders siteA: native slice sizes (H x W) vary: 36x32 in 2 volume(s) (e.g. siteA/images/vol00.nii.gz); "
        "40x32 in 1 volume(s) (e.g. siteA/images/vol02.nii.gz)",
        "folders siteB: native slice size 36x32 (H x W) in all 3 volume(s)",
        "folders siteC: native slice size 36x5 (H x W) in all 3 volume(s)",
        # siteC's aspect 36/5 = 7.2 is 6.4x siteA's median (36/32, 36/32, 40/32: 1.125) and siteB's 1.125;
        # siteA and siteB differ from one of their two other sites only: not warned.
        "folders siteC: warning: native slices of 36x5 (H x W, aspect 7.20) differ more than 2x in aspect from 2 of the 2 "
        "other site(s) (siteA 1.12, siteB 1.12); check nifti_axis (the NIfTI axis the volumes are sliced along)",
    ]


def test_with_two_sites_of_different_aspect_both_are_named():
    metas = {
        site: pd.DataFrame(
            {"source": [f"{site}/a.png"], "native_height": [h], "native_width": [32], "intensity": ["uint8"]}
        )
        for site, h in (("north", 32), ("south", 96))
    }
    assert F.geometry_warnings(metas) == [
        "folders north: warning: native slices of 32x32 (H x W, aspect 1.00) differ more than 2x in aspect from 1 of the 1 "
        "other site(s) (south 3.00); check the site's images",
        "folders south: warning: native slices of 96x32 (H x W, aspect 3.00) differ more than 2x in aspect from 1 of the 1 "
        "other site(s) (north 1.00); check the site's images",
    ]
    metas["south"]["native_height"] = [64]  # 2x exactly: not more than 2x
    assert F.geometry_warnings(metas) == []


def test_no_warning_when_the_sites_agree(examples, tmp_path):
    logged = []
    _preprocess(examples["nifti"]["options"], tmp_path, log=logged.append)
    assert not [line for line in logged if line.startswith("folders site") and "warning" in line]
    # Every site sliced along i: 5x36 slices everywhere, so no site differs, but all are far from square.
    logged.clear()
    shutil.rmtree(tmp_path / "out")
    _preprocess({**examples["nifti"]["options"], "nifti_axis": 0}, tmp_path, log=logged.append)
    assert [line for line in logged if line.startswith("folders site") and "warning" in line] == [
        f"folders {site}: warning: native slices of 5x36 (H x W, aspect 0.14) are far from square; check nifti_axis "
        "(the NIfTI axis the volumes are sliced along)"
        for site in SITES
    ]


# --- 5. deep images scaled robustly ----------------------------------------------------------------------


def _hot_pixel_image(rng: np.random.Generator) -> np.ndarray:
    image = rng.uniform(1000, 3000, (32, 32)).astype(np.uint16)
    image[5, 7] = 65535  # one hot (saturated) pixel
    return image


def test_one_hot_pixel_does_not_blacken_a_16_bit_image(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    for site in ("siteA", "siteB"):
        (root / site / "images").mkdir(parents=True)
        (root / site / "masks").mkdir()
        for k in range(3):
            Image.fromarray(_hot_pixel_image(rng)).save(root / site / "images" / f"{k}.png")
            Image.fromarray(np.zeros((32, 32), np.uint8)).save(root / site / "masks" / f"{k}.png")
    logged = []
    store = _preprocess({"root": str(root)}, tmp_path, log=logged.append)
    images = np.asarray(open_client(store, "siteA").images, np.float64)[..., 0]
    # Values uniform on 1000..3000 scaled from their own p0.5..p99.5 (~1010..2990) average mid-grey;
    # scaled from min..max (1000..65535) they averaged (2000 - 1000) / 64535 * 255 = 4.
    assert 120 < images.mean() < 135
    assert (images[:, 5, 7] == 255).all()  # the hot pixel is clipped to white
    meta = open_client(store, "siteA").meta
    lows, highs = meta["intensity_low"].astype(float), meta["intensity_high"].astype(float)
    assert ((1000 <= lows) & (lows < 1030)).all() and ((2970 < highs) & (highs <= 3000)).all()
    assert meta["intensity"][0].endswith("(p0.5..p99.5 of 1000..65535) scaled to 0..255, clipped outside")
    summary = [line for line in logged if line.startswith("folders siteA: intensity")]
    assert summary == [
        f"folders siteA: intensity: 3 uint16 image(s), each scaled from its own p0.5..p99.5 to 0..255 and "
        f"clipped outside (low {lows.min():g}..{lows.max():g}, high {highs.min():g}..{highs.max():g})"
    ]


def test_a_nearly_constant_deep_image_falls_back_to_its_min_max():
    """Percentiles that coincide (a flat image with a few marks) would divide by zero: min..max."""
    flat = np.full((40, 40), 500, np.uint16)
    flat[0, :3] = (600, 700, 900)  # 3 of 1600 pixels: both percentiles are 500
    scaled, scaling = _to_uint8(flat, Path("flat.png"))
    assert scaling["intensity"] == "uint16 500..900 (min..max of 500..900) scaled to 0..255, clipped outside"
    assert scaled[0, :3].tolist() == [64, 128, 255] and scaled[1, 0] == 0  # (v - 500) / 400 * 255, rounded
    constant = _to_uint8(np.full((4, 4), 7.5, np.float32), Path("c.tif"))
    assert constant[1]["intensity"] == "float32 constant 7.5" and not constant[0].any()


# --- 6. a classification image that labels.csv does not list is named ---------------------------------------


def test_a_classification_image_missing_from_labels_csv_is_named(examples, tmp_path):
    root, options = _copy(examples["classification"], tmp_path)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(root / "siteB" / "forgotten.png")
    (root / "siteC" / "extra").mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(root / "siteC" / "extra" / "also.tif")
    # Not images, hidden or macOS metadata: ignored.
    (root / "siteB" / "notes.txt").write_text("x")
    (root / "siteB" / "._forgotten.png").write_bytes(b"\x00")
    (root / ".cache").mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / ".cache" / "thumb.png")
    assert _refused(options, tmp_path) == (
        f"{root}: 2 image(s) under the data root are not in labels.csv, e.g. siteB/forgotten.png; "
        "list them in labels.csv or move them out of the data root"
    )
    # Listed, they are read.
    table = pd.read_csv(root / "labels.csv", dtype=str)
    extra = pd.DataFrame(
        [
            {"site": "siteB", "image": "siteB/forgotten.png", "label": "normal", "group": "p9"},
            {"site": "siteC", "image": "./siteC/extra/also.tif", "label": "benign", "group": "p9"},
        ]
    )
    pd.concat([table, extra]).to_csv(root / "labels.csv", index=False)
    store = _preprocess(options, tmp_path)
    assert len(open_client(store, "siteB")) == 9 and len(open_client(store, "siteC")) == 11
