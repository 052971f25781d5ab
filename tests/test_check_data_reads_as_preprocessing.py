"""`check-data` reads a user's files by preprocessing's rules: a palette mask as its indices, a TIFF
image through the photometric interpretation of the page ``tiff_page`` names (its size, grey or
colour as the reader will produce it), a multi-page mask at that page. What it reports (channels,
sizes, mask values and class pixels) is compared with the store preprocessing builds from the same
files. And a ``labels.csv`` that cannot be read is one problem line, without a "0 site(s)" header."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tifffile
import yaml
from PIL import Image

from fedmedbench.cli import main
from fedmedbench.data.folders import preprocess
from fedmedbench.data.folders.inspect import image_header, inspect_folders
from fedmedbench.data.folders.reading import read_image
from fedmedbench.data.store import open_client

RNG = np.random.default_rng(7)
H, W = 8, 12
CLASSES = ["background", "red", "green"]


def _palette_mask(path: Path, labels: np.ndarray) -> None:
    """Label 1 shown red, label 2 green, as annotation tools save them."""
    mask = Image.fromarray(labels.astype(np.uint8), "P")
    mask.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * (256 - 3) * 3)
    mask.save(path)


def _site(root: Path, site: str) -> tuple[Path, Path]:
    images, masks = root / site / "images", root / site / "masks"
    images.mkdir(parents=True)
    masks.mkdir()
    return images, masks


def _store_labels(store: Path, sites: list[str]) -> tuple[dict[int, int], list[int]]:
    """Pixels per stored class index, per the whole store."""
    labels = np.concatenate([open_client(store, s).labels.ravel() for s in sites])
    values, counts = np.unique(labels, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist())), np.bincount(labels, minlength=len(CLASSES)).tolist()


def _channels(paths: list[Path], page: int = 0) -> Counter:
    """grey / colour per file, as preprocessing's reader (read_image's channel count) sees them."""
    return Counter("grey" if read_image(p, page)[1] == 1 else "colour" for p in paths)


def test_a_palette_mask_is_reported_as_its_indices_as_the_store_holds_them(tmp_path):
    root = tmp_path / "data"
    images, masks = _site(root, "site")
    labels = [RNG.integers(0, 3, (H, W)) for _ in range(3)]  # three images: three groups, one per split
    for name, lab, suffix in (("a", labels[0], ".png"), ("b", labels[1], ".tif"), ("c", labels[2], ".png")):
        Image.fromarray(RNG.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(images / f"{name}.png")
        _palette_mask(masks / f"{name}{suffix}", lab)
    options = {"root": str(root), "classes": CLASSES}
    report = inspect_folders(options)
    assert report.problems == []  # before: "colour channels differ" (the palette's red and green)
    preprocess({}, tmp_path / "store", options=options, log=lambda line: None)
    values, per_class = _store_labels(tmp_path / "store", ["site"])
    assert (
        report.site("site").mask_values
        == values
        == dict(zip(*[a.tolist() for a in np.unique(np.stack(labels), return_counts=True)]))
    )
    assert report.site("site").class_pixels == per_class


def test_multi_page_and_palette_tiff_images_report_the_channels_the_store_gets(tmp_path):
    """A 3-page grey stack is grey (its first page), not colour (its pages as R, G, B); a palette
    image is colour (its palette's colours), not grey (its indices): no 'mixed channels' problem
    where preprocessing finds none, and a warning names the multi-page file as the log does."""
    root = tmp_path / "data"
    images, masks = _site(root, "greys")
    tifffile.imwrite(images / "stack.tif", RNG.integers(0, 256, (3, H, W), dtype=np.uint8), photometric="minisblack")
    for name in ("plain", "plain2"):  # three images a site: three groups, one per split
        Image.fromarray(RNG.integers(0, 256, (H, W), dtype=np.uint8)).save(images / f"{name}.png")
    colours, colour_masks = _site(root, "colours")
    tifffile.imwrite(
        colours / "palette.tif",
        RNG.integers(0, 256, (H, W), dtype=np.uint8),
        photometric="palette",
        colormap=RNG.integers(0, 65536, (3, 256), dtype=np.uint16),
    )
    for name in ("rgb", "rgb2"):
        Image.fromarray(RNG.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(colours / f"{name}.png")
    for folder, names in ((masks, ("stack", "plain", "plain2")), (colour_masks, ("palette", "rgb", "rgb2"))):
        for name in names:
            Image.fromarray(RNG.integers(0, 3, (H, W), dtype=np.uint8)).save(folder / f"{name}.png")
    options = {"root": str(root), "classes": CLASSES}
    report = inspect_folders(options)
    assert report.problems == []  # before: two sites of "mixed channels"
    assert report.site("greys").channels == _channels(sorted(images.iterdir())) == Counter(grey=3)
    assert report.site("colours").channels == _channels(sorted(colours.iterdir())) == Counter(colour=3)
    assert report.warnings == [
        "site greys: 1 multi-page TIFF file(s) read at page 0 (the first, the full resolution of a "
        "pyramid): greys/images/stack.tif (3 pages); set tiff_page to read another page"
    ]
    lines = []
    preprocess({}, tmp_path / "store", options=options, log=lines.append)  # no mixed channel counts either
    assert "folders greys: warning: " + report.warnings[0].removeprefix("site greys: ") in lines
    values, per_class = _store_labels(tmp_path / "store", ["colours", "greys"])
    assert sum((Counter(report.site(s).mask_values) for s in ("colours", "greys")), Counter()) == values
    assert [a + b for a, b in zip(report.site("colours").class_pixels, report.site("greys").class_pixels)] == per_class


def test_tiff_page_chooses_the_page_check_data_reads_of_images_and_masks(tmp_path):
    """Two-page images (colour at full size, then a half-size grey page) with two-page palette masks
    (background only, then labels 0 .. 2): at tiff_page 1, check-data reports the half size, grey,
    and page 1's labels, as the store holds them."""
    root = tmp_path / "data"
    images, masks = _site(root, "site")
    colormap = np.array([[0, 65535, 0] + [0] * 253, [0, 0, 65535] + [0] * 253, [0] * 256], np.uint16)
    for name in ("a", "b", "c"):
        with tifffile.TiffWriter(images / f"{name}.tif") as tif:
            tif.write(RNG.integers(0, 256, (H, W, 3), dtype=np.uint8), photometric="rgb")
            tif.write(RNG.integers(0, 256, (H // 2, W // 2), dtype=np.uint8), photometric="minisblack")
        with tifffile.TiffWriter(masks / f"{name}.tif") as tif:
            for lab in (np.zeros((H, W), np.uint8), RNG.integers(0, 3, (H // 2, W // 2), dtype=np.uint8)):
                tif.write(lab, photometric="palette", colormap=colormap)
    assert image_header(images / "a.tif") == (H, W, "colour")
    options = {"root": str(root), "classes": CLASSES, "tiff_page": 1}
    report = inspect_folders(options)
    assert report.problems == []
    site = report.site("site")
    preprocess({}, tmp_path / "store", options=options, log=lambda line: None)
    meta = open_client(tmp_path / "store", "site").meta
    assert dict(site.sizes) == {(H // 2, W // 2): 3} == dict(Counter(zip(meta["native_height"], meta["native_width"])))
    assert site.channels == _channels(sorted(images.iterdir()), page=1) == Counter(grey=3)
    values, per_class = _store_labels(tmp_path / "store", ["site"])
    assert site.mask_values == values and sorted(values) == [0, 1, 2]  # page 1's labels (page 0 is background only)
    assert site.class_pixels == per_class
    assert report.warnings == [
        "site site: 6 multi-page TIFF file(s) read at page 1 (tiff_page 1): site/images/a.tif "
        "(2 pages), site/masks/a.tif (2 pages), site/images/b.tif (2 pages), ...; set tiff_page to read another page"
    ]


def test_a_classification_image_is_reported_at_its_tiff_page(tmp_path):
    root = tmp_path / "data"
    (root / "s").mkdir(parents=True)
    for name in ("a", "b"):
        with tifffile.TiffWriter(root / "s" / f"{name}.tif") as tif:
            tif.write(RNG.integers(0, 256, (H, W), dtype=np.uint8), photometric="minisblack")
            tif.write(RNG.integers(0, 256, (H // 2, W // 2, 3), dtype=np.uint8), photometric="rgb")
    (root / "labels.csv").write_text("site,image,label\ns,s/a.tif,x\ns,s/b.tif,y\n")
    options = {"root": str(root), "kind": "classification", "classes": ["x", "y"], "tiff_page": 1}
    report = inspect_folders(options)
    preprocess({}, tmp_path / "store", options=options, log=lambda line: None)
    meta = open_client(tmp_path / "store", "s").meta
    assert (
        dict(report.site("s").sizes)
        == {(H // 2, W // 2): 2}
        == dict(Counter(zip(meta["native_height"], meta["native_width"])))
    )
    assert (
        report.site("s").channels
        == _channels([root / "s" / "a.tif", root / "s" / "b.tif"], page=1)
        == Counter(colour=2)
    )


def test_tiff_page_beyond_a_file_is_the_readers_line(tmp_path):
    root = tmp_path / "data"
    images, masks = _site(root, "site")
    tifffile.imwrite(images / "a.tif", RNG.integers(0, 256, (H, W), dtype=np.uint8), photometric="minisblack")
    Image.fromarray(np.zeros((H, W), np.uint8)).save(masks / "a.png")
    report = inspect_folders({"root": str(root), "tiff_page": 2})
    assert (
        f"{images / 'a.tif'}: tiff_page is 2, but the file has 1 page(s), numbered 0 .. 0; "
        "set tiff_page to a page every TIFF file has (0: the first)"
    ) in report.problems


@pytest.mark.parametrize(
    "csv, problem",
    [
        (
            "site,image\nsiteA,siteA/a.png\n",
            "{path}: missing column(s) ['label']; expected site, image, label and optionally group",
        ),
        (
            "site,image,label,grop\nsiteA,siteA/a.png,x,1\n",
            "{path}: unknown column 'grop' (did you mean 'group'?); expected site, image, label and optionally group",
        ),
    ],
)
def test_a_labels_csv_that_fails_is_its_message_alone(tmp_path, capsys, csv, problem):
    root = tmp_path / "data"
    root.mkdir()
    (root / "labels.csv").write_text(csv)
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "mine": {"family": "folders", "root": str(root), "kind": "classification", "classes": ["x", "y"]}
                }
            }
        )
    )
    with pytest.raises(SystemExit) as exit_:
        main(["check-data", "--configfile", str(overlay)])
    lines = capsys.readouterr().out.splitlines()
    assert exit_.value.code == 1
    assert lines == [
        "data.mine: problem: " + problem.format(path=root / "labels.csv"),
        "data.mine: 1 problem(s), 0 warning(s)",
    ]
