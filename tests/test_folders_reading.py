"""Reading a user's own image files (``folders``): EXIF orientation applied to images and masks
alike (checked by correlation with the upright view), hostile files (a decompression bomb, a cut
TIFF) told in one line naming the file and what to do, and masks named with a ``mask_suffix``."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from fedmedbench.cli import main
from fedmedbench.data import folders as F
from fedmedbench.data.folders.inspect import inspect_folders
from fedmedbench.data.images import EXIF_ORIENTATION, apply_orientation, read_mask
from fedmedbench.data.store import open_client
from fedmedbench.errors import DataError

ORIENTATION_6 = 6  # "rotate 90 degrees clockwise to display" (what a phone held upright writes)


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    return exif


@pytest.mark.parametrize("orientation", range(1, 9))
def test_apply_orientation_is_what_pillow_exif_transpose_does(orientation):
    stored = np.arange(3 * 4 * 3, dtype=np.uint8).reshape(3, 4, 3)
    buffer = io.BytesIO()
    Image.fromarray(stored).save(buffer, "PNG", exif=_exif(orientation))
    with Image.open(buffer) as img:
        expected = np.asarray(ImageOps.exif_transpose(img))
    assert np.array_equal(apply_orientation(stored, orientation), expected)
    assert np.array_equal(apply_orientation(stored[..., 0], orientation), expected[..., 0])


def _upright_scene(size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """An upright RGB image (a bright disc top left, a grey square top right, dark elsewhere) and its
    mask, the disc, as drawn on the upright view."""
    y, x = np.mgrid[0:size, 0:size]
    disc = (y - 16) ** 2 + (x - 16) ** 2 < 10**2
    image = np.full((size, size, 3), 20, np.uint8)
    image[disc] = 220
    image[6:20, 42:58] = 120
    return image, disc.astype(np.uint8) * 255


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.astype(np.float64).ravel(), b.astype(np.float64).ravel())[0, 1])


def test_a_jpeg_stored_rotated_with_its_orientation_tag_is_read_upright_and_aligned_with_its_mask(tmp_path):
    upright, mask = _upright_scene()
    # Stored so that a viewer applying orientation 6 (turn 90 degrees clockwise) shows `upright`.
    stored = np.rot90(upright, 1)
    root = tmp_path / "data"
    for site in ("a", "b", "c"):
        (root / site / "images").mkdir(parents=True)
        (root / site / "masks").mkdir(parents=True)
        for k in range(3):
            name = f"{site}{k}"
            if site == "a" and k == 0:
                Image.fromarray(stored).save(
                    root / site / "images" / f"{name}.jpg", quality=95, exif=_exif(ORIENTATION_6)
                )
            else:
                Image.fromarray(upright).save(root / site / "images" / f"{name}.jpg", quality=95)
            Image.fromarray(mask).save(root / site / "masks" / f"{name}.png")
    options = {"root": str(root), "mask_values": {0: 0, 255: 1}}
    logged = []
    F.preprocess({}, tmp_path / "store", "", options=options, log=logged.append)
    a = open_client(tmp_path / "store", "a")
    grey = a.images[0].mean(-1)
    assert _corr(grey, upright.mean(-1)) > 0.99  # the upright view
    assert _corr(grey, stored.mean(-1)) < 0.3  # not the pixels as stored (the disc top left, stored bottom left)
    assert np.array_equal(a.labels[0], mask // 255)  # the mask as drawn
    inside, outside = grey[a.labels[0] == 1].mean(), grey[a.labels[0] == 0].mean()
    assert inside > 200 and outside < 60  # image and mask align: the disc is under the mask
    assert list(a.meta["orientation"]) == [6, 1, 1]
    assert (
        "folders a: 3 images (3 files), 64x64; 1 image(s) turned upright by their EXIF Orientation tag; "
        "train/val/test come with the split" in logged
    )
    assert "folders b: 3 images (3 files), 64x64; train/val/test come with the split" in logged
    report = inspect_folders(options)
    assert report.site("a").upright == 1 and report.site("b").upright == 0
    assert report.lines()[1].endswith("colour (3 images); 1 turned upright by their EXIF Orientation tag")


def test_a_non_square_image_with_its_tag_has_the_upright_size_in_check_data_and_the_store(tmp_path):
    upright, mask = _upright_scene()
    upright, mask = upright[:48], mask[:48]  # 48 x 64 (H x W)
    root = tmp_path / "data"
    for site in ("a", "b", "c"):
        for folder in ("images", "masks"):
            (root / site / folder).mkdir(parents=True)
        for k in range(3):
            # orientation 8 (turn 90 degrees counter-clockwise to display): stored 64 x 48
            Image.fromarray(np.rot90(upright, -1)).save(root / site / "images" / f"{k}.jpg", quality=95, exif=_exif(8))
            Image.fromarray(mask).save(root / site / "masks" / f"{k}.png")
    options = {"root": str(root), "mask_values": {0: 0, 255: 1}}
    report = inspect_folders(options)
    assert report.problems == [] and report.site("a").sizes == {(48, 64): 3}
    F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)
    a = open_client(tmp_path / "store", "a")
    assert a.images.shape == (3, 48, 64, 3) and _corr(a.images[0].mean(-1), upright.mean(-1)) > 0.99
    assert np.array_equal(a.labels[0], mask // 255)


def test_a_mask_with_its_own_orientation_tag_is_turned_upright_too(tmp_path):
    _, mask = _upright_scene()
    Image.fromarray(np.rot90(mask, 1)).save(tmp_path / "m.png", exif=_exif(ORIENTATION_6))
    assert np.array_equal(read_mask(tmp_path / "m.png", upright=True), mask)
    assert np.array_equal(read_mask(tmp_path / "m.png"), np.rot90(mask, 1))  # the papers' families: as stored


def _site(root: Path, site: str, n: int = 3, size: int = 16) -> None:
    for folder in ("images", "masks"):
        (root / site / folder).mkdir(parents=True, exist_ok=True)
    for k in range(n):
        Image.fromarray(np.full((size, size), 50 + k, np.uint8)).save(root / site / "images" / f"{k}.png")
        mask = np.zeros((size, size), np.uint8)
        mask[4:8, 4:8] = 255
        Image.fromarray(mask).save(root / site / "masks" / f"{k}.png")


def _one_line(options: dict, tmp_path: Path, capsys) -> str:
    """The error of preprocessing (in process and as the CLI step prints it) and of check-data: one
    line each, the same text, nothing written."""
    with pytest.raises(DataError) as err:
        F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)
    text = str(err.value)
    assert "\n" not in text and not (tmp_path / "store").exists()
    assert inspect_folders(options).problems == [text]
    import json

    capsys.readouterr()
    assert (
        main(
            [
                "preprocess",
                "folders",
                "--protocol",
                "default",
                "--out",
                str(tmp_path / "store"),
                "--options",
                json.dumps(options),
            ]
        )
        == 1
    )
    printed = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert printed[-1].endswith(f"FoldersDataError: {text}") and "Traceback" not in "\n".join(printed), printed
    assert not (tmp_path / "store").exists()
    return text


def test_a_decompression_bomb_is_one_line_naming_the_file(tmp_path, capsys):
    root = tmp_path / "data"
    for site in ("a", "b", "c"):
        _site(root, site)
    bomb = root / "b" / "images" / "1.png"
    Image.new("1", (15000, 15000)).save(bomb)  # 225 million pixels; one bit each, compressed to a few kB
    assert bomb.stat().st_size < 1_000_000
    text = _one_line({"root": str(root), "mask_values": {0: 0, 255: 1}}, tmp_path, capsys)
    assert text == (
        f"{bomb}: 225 million pixels, more than the 179 million that Pillow decodes safely (a decompression "
        "bomb guard); downscale the image or cut it into tiles before using it"
    )
    with pytest.raises(DataError, match=r"1.png: 225 million pixels"):
        read_mask(bomb)


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")  # PIL on the cut file, before our one line
def test_a_cut_tiff_is_one_line_naming_the_file_and_what_to_do(tmp_path, capsys):
    root = tmp_path / "data"
    for site in ("a", "b", "c"):
        _site(root, site)
    tiff = root / "c" / "images" / "2.tif"
    (root / "c" / "images" / "2.png").unlink()
    image = np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    image = np.repeat(image[..., :1], 3, axis=-1)  # grey as RGB: the site's other images are grey
    Image.fromarray(image[..., 0]).save(tiff, compression="tiff_lzw")  # Pillow writes the directory at the end
    data = tiff.read_bytes()
    tiff.write_bytes(data[: len(data) // 2])  # an interrupted copy: the directory is gone
    text = _one_line({"root": str(root), "mask_values": {0: 0, 255: 1}}, tmp_path, capsys)
    assert text.startswith(f"{tiff}: cannot read the image (tifffile: no image directory in the file; Pillow: ")
    assert text.endswith("); if it is cut short or damaged, copy it again from its source, or remove it (and its mask)")


def test_masks_named_with_a_suffix_are_paired_with_their_images(tmp_path):
    root = tmp_path / "data"
    for site in ("a", "b", "c"):
        _site(root, site)
        for mask in sorted((root / site / "masks").iterdir()):
            mask.rename(mask.with_name(f"{mask.stem}_Segmentation.png"))
    options = {"root": str(root), "mask_values": {0: 0, 255: 1}, "mask_suffix": "_Segmentation"}
    assert inspect_folders(options).problems == []
    assert F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None) == {"a": 3, "b": 3, "c": 3}
    meta = open_client(tmp_path / "store", "a").meta
    assert list(meta["mask_source"]) == [f"a/masks/{k}_Segmentation.png" for k in range(3)]
    (root / "b" / "masks" / "1_Segmentation.png").rename(root / "b" / "masks" / "1_seg.png")
    with pytest.raises(DataError) as err:
        F.preprocess({}, tmp_path / "store2", "", options=options, log=lambda _: None)
    assert str(err.value) == (
        f"{root}/b/masks/1_seg.png: mask name does not end with mask_suffix '_Segmentation' "
        "(expected masks/<image stem>_Segmentation.<ext>)"
    )
    (root / "b" / "masks" / "1_seg.png").unlink()
    with pytest.raises(DataError) as err:
        F.preprocess({}, tmp_path / "store2", "", options=options, log=lambda _: None)
    assert (
        str(err.value) == f"{root}/b/images/1.png: image without a mask (expected {root}/b/masks/1_Segmentation.<ext>)"
    )
