"""Every TIFF of a user's own data (``family: folders``) as an image viewer shows it, through the file's
photometric interpretation, compared pixel for pixel with an independent reader (Pillow's
``convert("RGB")``, or the same picture stored another way); a multi-page or pyramidal TIFF is read
at its first page with a warning naming the file and its page count, or at ``tiff_page``. Masks
alike, a palette mask's index being its label. NaN or infinite values are refused in a NIfTI volume
as in a float TIFF, in the same words."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from fedmedbench.data.folders import FoldersDataError, FoldersOptions, preprocess
from fedmedbench.data.folders.reading import read_folders_mask, read_image
from fedmedbench.data.store import open_client
from fedmedbench.errors import ConfigError

from .conftest import realdata_dir

RNG = np.random.default_rng(42)
H, W = 6, 9
GREY = RNG.integers(0, 256, (H, W), dtype=np.uint8)
RGB = RNG.integers(0, 256, (H, W, 3), dtype=np.uint8)


def viewer(path: Path, page: int = 0) -> np.ndarray:
    """What Pillow shows (its own decoder and colour conversion), as RGB."""
    with Image.open(path) as img:
        img.seek(page)
        return np.asarray(img.convert("RGB"))


def write_cases(folder: Path) -> dict[str, Path]:
    """One TIFF per photometric interpretation (and sample layout), written with tifffile or Pillow."""
    alpha = RNG.integers(1, 256, (H, W, 1), dtype=np.uint8)
    colormap = RNG.integers(0, 65536, (3, 256), dtype=np.uint16)
    cases = {
        "minisblack": dict(data=GREY, photometric="minisblack"),
        "miniswhite": dict(data=GREY, photometric="miniswhite"),
        "bilevel_miniswhite": dict(data=GREY > 128, photometric="miniswhite"),
        "rgb": dict(data=RGB, photometric="rgb"),
        "rgb_planar": dict(data=np.moveaxis(RGB, -1, 0), photometric="rgb", planarconfig="separate"),
        "rgb_alpha": dict(data=np.concatenate([RGB, alpha], -1), photometric="rgb", extrasamples=["unassalpha"]),
        "rgb_premultiplied": dict(
            data=np.concatenate([(RGB.astype(int) * alpha // 255).astype(np.uint8), alpha], -1),
            photometric="rgb",
            extrasamples=["assocalpha"],
        ),
        "grey_alpha": dict(
            data=np.stack([GREY, alpha[..., 0]], -1), photometric="minisblack", extrasamples=["unassalpha"]
        ),
        "palette": dict(data=GREY, photometric="palette", colormap=colormap),
        "cmyk": dict(data=RNG.integers(0, 256, (H, W, 4), dtype=np.uint8), photometric="separated"),
    }
    paths = {}
    for name, kwargs in cases.items():
        paths[name] = folder / f"{name}.tif"
        tifffile.imwrite(paths[name], **kwargs)
    paths["ycbcr_pillow"] = folder / "ycbcr_pillow.tif"
    Image.fromarray(RGB).convert("YCbCr").save(paths["ycbcr_pillow"])
    paths["cmyk_pillow"] = folder / "cmyk_pillow.tif"
    Image.fromarray(RGB).convert("CMYK").save(paths["cmyk_pillow"])
    paths["palette_pillow"] = folder / "palette_pillow.tif"
    Image.fromarray(RGB).quantize(16).save(paths["palette_pillow"])
    return paths


CASES = [
    "minisblack",
    "miniswhite",
    "bilevel_miniswhite",
    "rgb",
    "rgb_planar",
    "rgb_alpha",
    "rgb_premultiplied",
    "grey_alpha",
    "palette",
    "cmyk",
    "cmyk_pillow",
    "palette_pillow",
]


@pytest.mark.parametrize("case", CASES)
def test_each_photometric_interpretation_reads_as_pillow_shows_it(tmp_path, case):
    path = write_cases(tmp_path)[case]
    pixels, channels, info = read_image(path)
    np.testing.assert_array_equal(pixels, viewer(path))
    assert channels == (1 if case in ("minisblack", "miniswhite", "bilevel_miniswhite", "grey_alpha") else 3)
    assert info["pages"] == 1


def test_ycbcr_reads_as_pillow_shows_it_within_its_rounding(tmp_path):
    """Uncompressed YCbCr through the TIFF 6.0 conversion (the file's coefficients and reference
    black and white); Pillow converts with 6-bit fixed-point tables, so the two differ by one grey
    level at most, where the raw samples (what was stored before) differ by up to 255."""
    path = write_cases(tmp_path)["ycbcr_pillow"]
    pixels, channels, _ = read_image(path)
    difference = np.abs(pixels.astype(int) - viewer(path))
    assert channels == 3 and difference.max() <= 1
    assert np.abs(tifffile.imread(path).astype(int) - viewer(path)).max() > 50
    assert np.abs(pixels.astype(int) - RGB).max() <= 3  # the colours Pillow stored, through its lossy conversion


def test_sixteen_bit_miniswhite_is_the_same_picture_as_its_minisblack_twin(tmp_path):
    """Pillow does not invert 16-bit MinIsWhite; the independent reference is the same picture
    stored MinIsBlack."""
    values = RNG.integers(0, 65536, (H, W), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "white.tif", values, photometric="miniswhite")
    tifffile.imwrite(tmp_path / "black.tif", (65535 - values).astype(np.uint16), photometric="minisblack")
    white, _, info = read_image(tmp_path / "white.tif")
    black, _, _ = read_image(tmp_path / "black.tif")
    np.testing.assert_array_equal(white, black)
    assert info["intensity"].startswith("uint16")


def test_a_float_tiff_with_nan_is_refused_in_the_same_words_as_a_nifti(tmp_path):
    import SimpleITK as sitk

    values = RNG.random((H, W)).astype(np.float32)
    values[1, 2], values[3, 4] = np.nan, np.inf
    tifffile.imwrite(tmp_path / "nan.tif", values)
    with pytest.raises(FoldersDataError) as err:
        read_image(tmp_path / "nan.tif")
    assert str(err.value) == (
        f"{tmp_path / 'nan.tif'}: 2 NaN or infinite pixel value(s) of {H * W}; there is no honest "
        "value to put in their place: replace them in the file (e.g. with the background value) and run again"
    )

    root = tmp_path / "data"
    for folder in ("images", "masks"):
        (root / "site" / folder).mkdir(parents=True)
    volume = RNG.random((3, H, W)).astype(np.float32)
    volume[0, 1, 2], volume[2, 0, 0], volume[2, 5, 5] = np.nan, np.inf, -np.inf
    sitk.WriteImage(sitk.GetImageFromArray(volume), str(root / "site" / "images" / "a.nii.gz"))
    sitk.WriteImage(sitk.GetImageFromArray((volume > 0.5).astype(np.uint8)), str(root / "site" / "masks" / "a.nii.gz"))
    assert (
        sitk.GetArrayFromImage(sitk.ReadImage(str(root / "site" / "images" / "a.nii.gz"))) == 0
    ).sum() == 3  # SimpleITK: 0
    with pytest.raises(FoldersDataError) as err:
        preprocess({}, tmp_path / "store", options={"root": str(root)}, log=lambda line: None)
    assert str(err.value) == (
        f"{root / 'site' / 'images' / 'a.nii.gz'}: 3 NaN or infinite voxel value(s) of {3 * H * W}; "
        "there is no honest value to put in their place: replace them in the file (e.g. with the "
        "background value) and run again"
    )


def write_pages(path: Path, pages: list[np.ndarray], **kwargs) -> None:
    with tifffile.TiffWriter(path) as tif:
        for page in pages:
            tif.write(page, **kwargs)


def test_a_multi_page_tiff_is_read_at_its_first_page_and_tiff_page_names_another(tmp_path):
    path = tmp_path / "stack.tif"
    tifffile.imwrite(path, np.stack([GREY, 255 - GREY, GREY // 2]), photometric="minisblack")  # one series of 3 pages
    pixels, channels, info = read_image(path)
    assert channels == 1 and info["pages"] == 3
    np.testing.assert_array_equal(pixels, viewer(path, 0))  # before: the three pages became R, G and B
    np.testing.assert_array_equal(read_image(path, 2)[0], viewer(path, 2))
    with pytest.raises(FoldersDataError) as err:
        read_image(path, 3)
    assert str(err.value) == (
        f"{path}: tiff_page is 3, but the file has 3 page(s), numbered 0 .. 2; set tiff_page to a "
        "page every TIFF file has (0: the first)"
    )


def test_a_pyramid_is_read_at_full_resolution(tmp_path):
    path = tmp_path / "pyramid.tif"
    with tifffile.TiffWriter(path) as tif:
        tif.write(RGB, photometric="rgb")
        tif.write(RGB[::2, ::2], photometric="rgb", subfiletype=1)  # a reduced-resolution page
    pixels, _, info = read_image(path)
    assert pixels.shape == (H, W, 3) and info["pages"] == 2
    np.testing.assert_array_equal(pixels, RGB)


def palette_mask(path: Path, labels: np.ndarray) -> None:
    """A mask whose palette shows label 1 red and label 2 green (what annotation tools write)."""
    mask = Image.fromarray(labels.astype(np.uint8), "P")
    mask.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * (256 - 3) * 3)
    mask.save(path)


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_a_palette_mask_is_read_as_its_indices(tmp_path, suffix):
    labels = RNG.integers(0, 3, (H, W))
    palette_mask(tmp_path / f"mask{suffix}", labels)
    mask, pages = read_folders_mask(tmp_path / f"mask{suffix}")
    with Image.open(tmp_path / f"mask{suffix}") as img:
        assert img.mode == "P"
        np.testing.assert_array_equal(mask, np.asarray(img))  # Pillow's own indices
    np.testing.assert_array_equal(mask, labels)
    assert pages == 1


def test_masks_follow_the_same_rules_in_a_store(tmp_path, capsys):
    """A site of multi-page TIFF images with multi-page palette, MinIsWhite and plain masks: the
    store holds the first page of each, a warning names the files and their page counts, and
    ``tiff_page`` reads another page of images and masks alike."""
    root = tmp_path / "data"
    images, masks = root / "site" / "images", root / "site" / "masks"
    images.mkdir(parents=True)
    masks.mkdir()
    labels = [RNG.integers(0, 3, (H, W)) for _ in range(2)]
    tifffile.imwrite(images / "a.tif", np.stack([RGB, 255 - RGB]), photometric="rgb")  # one series of 2 pages
    write_pages(
        masks / "a.tif",
        [lab.astype(np.uint8) for lab in labels],
        photometric="palette",
        colormap=np.array([[0, 65535, 0] + [0] * 253, [0, 0, 65535] + [0] * 253, [0] * 256], np.uint16),
    )
    tifffile.imwrite(
        images / "b.tif", GREY, photometric="palette", colormap=RNG.integers(0, 65536, (3, 256), dtype=np.uint16)
    )
    tifffile.imwrite(masks / "b.tif", (2 - labels[0]).astype(np.uint8), photometric="minisblack")
    tifffile.imwrite(images / "c.tif", RNG.integers(0, 256, (H, W, 4), dtype=np.uint8), photometric="separated")
    # MinIsWhite: stored 255 - v, shown (and read) as v; 0, 1, 2 shown
    tifffile.imwrite(masks / "c.tif", (255 - labels[1]).astype(np.uint8), photometric="miniswhite")

    lines = []
    options = {"root": str(root), "classes": ["background", "red", "green"]}
    preprocess({}, tmp_path / "store", options=options, log=lines.append)
    assert (
        lines.count(
            "folders site: warning: 2 multi-page TIFF file(s) read at page 0 (the first, the full resolution "
            "of a pyramid): site/images/a.tif (2 pages), site/masks/a.tif (2 pages); set tiff_page to read another page"
        )
        == 1
    )
    client = open_client(tmp_path / "store", "site")
    np.testing.assert_array_equal(client.labels[0], labels[0])  # the palette's indices, not its colours
    np.testing.assert_array_equal(client.labels[1], 2 - labels[0])
    np.testing.assert_array_equal(client.labels[2], labels[1])  # MinIsWhite: inverted as shown
    np.testing.assert_array_equal(client.images[0], RGB)  # the first page, not the pages as R, G, B
    np.testing.assert_array_equal(client.images[1], viewer(images / "b.tif"))  # palette colours, not indices
    np.testing.assert_array_equal(client.images[2], viewer(images / "c.tif"))  # CMYK as RGB

    with pytest.raises(FoldersDataError, match=re.escape("b.tif: tiff_page is 1, but the file has 1 page(s)")):
        preprocess({}, tmp_path / "store1", options={**options, "tiff_page": 1}, log=lambda line: None)
    for name in ("b", "c"):
        (images / f"{name}.tif").unlink()
        (masks / f"{name}.tif").unlink()
    preprocess({}, tmp_path / "store2", options={**options, "tiff_page": 1}, log=lines.append)
    client = open_client(tmp_path / "store2", "site")
    np.testing.assert_array_equal(client.images[0], 255 - RGB)
    np.testing.assert_array_equal(client.labels[0], labels[1])
    assert lines[-1].endswith(
        "read at page 1 (tiff_page 1): site/images/a.tif (2 pages), site/masks/a.tif (2 pages); "
        "set tiff_page to read another page"
    )


@pytest.mark.parametrize("value", [-1, 1.5, "1", True])
def test_tiff_page_is_a_page_number(value):
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"folders.tiff_page: expected a page number 0, 1, ... (0: the first page "
            f"of a multi-page TIFF, its full resolution), got {json.dumps(value)}"
        ),
    ):
        FoldersOptions.from_dict({"root": "x", "tiff_page": value})
    assert FoldersOptions.from_dict({"root": "x", "tiff_page": 2}).tiff_page == 2


def test_unsupported_photometric_interpretations_are_refused_in_one_line(tmp_path):
    tifffile.imwrite(tmp_path / "lab.tif", RGB, photometric="cielab")
    with pytest.raises(FoldersDataError) as err:
        read_image(tmp_path / "lab.tif")
    assert str(err.value) == (
        f"{tmp_path / 'lab.tif'}: TIFF photometric interpretation CIELAB is not supported; "
        "save the image as RGB or grey"
    )
    tifffile.imwrite(
        tmp_path / "channels.tif",
        RNG.integers(0, 256, (H, W, 5), dtype=np.uint8),
        photometric="minisblack",
        planarconfig="contig",
    )
    with pytest.raises(FoldersDataError) as err:
        read_image(tmp_path / "channels.tif")
    assert str(err.value) == (
        f"{tmp_path / 'channels.tif'}: 5 samples per pixel under photometric MINISBLACK, which shows 1 "
        "(a multichannel image); save one channel per file, or as RGB"
    )


# --- real files ----------------------------------------------------------------------------------------
REAL = realdata_dir()


@pytest.mark.shared
@pytest.mark.skipif(not (REAL / "monuseg").is_dir(), reason="no real MoNuSeg files (../shared/realdata)")
def test_real_monuseg_tiffs_and_their_cmyk_palette_and_multi_page_copies_read_as_pillow_shows_them(tmp_path):
    tiffs = sorted((REAL / "monuseg").rglob("*.tif"))[:3]
    assert tiffs
    for path in tiffs:
        np.testing.assert_array_equal(read_image(path)[0], viewer(path))
    with Image.open(tiffs[0]) as img:
        crop = img.convert("RGB").crop((0, 0, 256, 192))
    crop.convert("CMYK").save(tmp_path / "cmyk.tif")
    crop.quantize(64).save(tmp_path / "palette.tif")
    crop.save(tmp_path / "pages.tif", save_all=True, append_images=[crop.rotate(90), crop.convert("L").convert("RGB")])
    Image.fromarray(255 - np.asarray(crop.convert("L"))).save(tmp_path / "grey.tif")
    tifffile.imwrite(tmp_path / "white.tif", np.asarray(crop.convert("L")), photometric="miniswhite")
    for name in ("cmyk", "palette", "pages", "white"):
        np.testing.assert_array_equal(read_image(tmp_path / f"{name}.tif")[0], viewer(tmp_path / f"{name}.tif"))
    np.testing.assert_array_equal(read_image(tmp_path / "pages.tif", 1)[0], viewer(tmp_path / "pages.tif", 1))
    assert read_image(tmp_path / "pages.tif")[2]["pages"] == 3


@pytest.mark.shared
@pytest.mark.skipif(not (REAL / "tnbc").is_dir(), reason="no real TNBC files (../shared/realdata)")
def test_a_real_tnbc_mask_saved_with_a_palette_keeps_its_labels(tmp_path):
    gt = sorted((REAL / "tnbc").rglob("GT_*/*.png"))[0]
    labels = (np.asarray(Image.open(gt).convert("L")) > 0).astype(np.uint8)
    assert labels.any() and not labels.all()
    for suffix in (".png", ".tif"):
        palette_mask(tmp_path / f"mask{suffix}", labels)
        np.testing.assert_array_equal(read_folders_mask(tmp_path / f"mask{suffix}")[0], labels)


@pytest.mark.shared
@pytest.mark.skipif(not (REAL / "ham10000").is_dir(), reason="no real HAM10000 files (../shared/realdata)")
def test_real_ham10000_jpegs_read_as_pillow_shows_them(tmp_path):
    from PIL import ImageOps

    for path in sorted((REAL / "ham10000").rglob("*.jpg"))[:3]:
        with Image.open(path) as img:
            np.testing.assert_array_equal(read_image(path)[0], np.asarray(ImageOps.exif_transpose(img).convert("RGB")))


def test_palette_mask_indices_meet_mask_values(tmp_path):
    """mask_values written for the palette's colours (or grey levels) do not fit: the indices are
    named, and mapping the indices reads the mask."""
    root = tmp_path / "data"
    for folder in ("images", "masks"):
        (root / "site" / folder).mkdir(parents=True)
    Image.fromarray(RGB).save(root / "site" / "images" / "a.png")
    labels = np.zeros((H, W), np.uint8)
    labels[:2], labels[-2:] = 1, 2
    palette_mask(root / "site" / "masks" / "a.png", labels)
    options = {"root": str(root), "mask_values": {0: 0, 255: 1}}
    with pytest.raises(
        FoldersDataError, match=re.escape("a.png: mask value(s) 1, 2 not in mask_values {0: 0, 255: 1}")
    ):
        preprocess({}, tmp_path / "store", options=options, log=lambda line: None)
    preprocess({}, tmp_path / "store", options={**options, "mask_values": {0: 0, 1: 1, 2: 1}}, log=lambda line: None)
    np.testing.assert_array_equal(open_client(tmp_path / "store", "site").labels[0], labels > 0)
