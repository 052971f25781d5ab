"""Nuclei (MoNuSAC2020 x 4 organs, MoNuSeg 2018, TNBC): XML -> mask, alpha, pairing, store, splits, twin.

Fixtures are written here in the real layouts (``datasets.md`` §2.6): MoNuSAC
patient folders with RGBA TIFF + ImageScope XML (one sub-image with only an
``.svs``), a test folder with spaces and an ``Ambiguous`` annotation, MoNuSeg's
``Tissue Images``/``Annotations`` with ``__MACOSX`` junk, TNBC's
``Slide_NN``/``GT_NN`` PNGs. Expected mask pixel counts are computed by hand:
``skimage.draw.polygon`` fills the closed polygon, boundary included, so an
axis-aligned rectangle with integer corners (r0..r1, c0..c1) covers
(r1-r0+1)(c1-c0+1) pixels and a right triangle with legs n covers (n+1)(n+2)/2.
"""

from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from fedmedbench.data import nuclei as N
from fedmedbench.data.archive import safe_extract
from fedmedbench.data.store import list_clients, open_client, read_split_csv

HEADER = '<?xml version="1.0"?>\n<Annotations MicronsPerPixel="0.252100">\n'


def region(rid: int, xy) -> str:
    vertices = "".join(f'<Vertex X="{x}" Y="{y}" Z="0"/>' for x, y in xy)
    return (
        f'<Region Id="{rid}" Type="0" Zoom="1" Selected="0" ImageLocation="" ImageFocus="-1" Text="" '
        f'NegativeROA="0" InputRegionId="0" Analyze="1" DisplayId="{rid}"><Attributes/>'
        f"<Vertices>{vertices}</Vertices></Region>\n"
    )


def annotation(aid: int, name: str, regions: list[str]) -> str:
    return (
        f'<Annotation Id="{aid}" Name="" ReadOnly="0" Type="4" LineColor="65280" Visible="1" Selected="1">\n'
        f'<Attributes><Attribute Name="{name}" Id="0" Value=""/></Attributes>\n<Regions>\n'
        '<RegionAttributeHeaders><AttributeHeader Id="9999" Name="Region" ColumnWidth="-1"/></RegionAttributeHeaders>\n'
        + "".join(regions)
        + "</Regions>\n<Plots/>\n</Annotation>\n"
    )


# Image 30 rows x 40 columns. X = column, Y = row.
RECT = [(3, 2), (9, 2), (9, 5), (3, 5)]  # rows 2..5, cols 3..9: 4 * 7 = 28 px
TRIANGLE = [(20, 10), (24, 10), (20, 14)]  # right triangle, legs 4: 5 * 6 / 2 = 15 px
OUTSIDE = [(35, 20), (45, 20), (45, 24), (35, 24)]  # cols 35..45 clipped to 35..39: 5 * 5 = 25 px
TWO_VERTICES = [(1, 1), (6, 6)]  # degenerate: skipped
MONUSAC_XML = (
    HEADER
    + annotation(1, "Epithelial", [region(1, RECT), region(2, TRIANGLE)])
    + annotation(2, "Lymphocyte", [region(3, OUTSIDE), region(4, TWO_VERTICES)])
    + "</Annotations>\n"
)
MONUSAC_PIXELS = 28 + 15 + 25

AMBIGUOUS = [(10, 15), (17, 15), (17, 18), (10, 18)]  # rows 15..18, cols 10..17: 4 * 8 = 32 px, apart from the rest
MONUSAC_TEST_XML = (
    HEADER
    + annotation(1, "Epithelial", [region(1, RECT)])
    + annotation(2, "Ambiguous", [region(2, AMBIGUOUS)])
    + "</Annotations>\n"
)

MONUSEG_XML = (
    HEADER
    + annotation(
        1,
        "Description",
        [
            region(1, [(0, 0), (3, 0), (3, 3), (0, 3)]),
            region(2, [(10, 10), (10, 16), (16, 10)]),
            region(3, [(20.4, 20.6), (25.4, 20.6), (25.4, 22.6), (20.4, 22.6)]),
        ],
    )
    + "</Annotations>\n"
)
# 4*4 = 16, legs 6: 28, rows 21..22 x cols 21..25 = 10 (pixel centres inside the fractional rectangle)
MONUSEG_PIXELS = 16 + 28 + 10


def rgba(h: int, w: int, seed: int) -> np.ndarray:
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 4), dtype=np.uint8)
    arr[..., 3] = 9  # a non-opaque alpha: it must be dropped, not composited
    return arr


def write_tif(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    extras = {"extrasamples": [2]} if array.shape[-1] == 4 else {}
    tifffile.imwrite(path, array, photometric="rgb", **extras)


def write_fixture(root: Path) -> dict:
    """The five raw folders (as extracted), keyed by their raw archive names."""
    raw = {
        name: root / name
        for name in (
            N.download.MONUSAC_TRAIN,
            N.download.MONUSAC_TEST,
            N.download.MONUSEG_TRAIN,
            N.download.MONUSEG_TEST,
            N.download.TNBC_ZIP,
        )
    }
    # MoNuSAC train: lung (the spec's example names), breast, kidney, prostate; one svs-only sub-image.
    top = raw[N.download.MONUSAC_TRAIN] / "MoNuSAC_images_and_annotations"
    for k, patient in enumerate(["TCGA-55-1594", "TCGA-A2-A0CV", "TCGA-5P-A9K0", "TCGA-EJ-5495"]):
        folder = top / f"{patient}-01Z-00-DX1"
        stem = f"{patient}-01Z-00-DX1_003" if k == 0 else f"{patient}-01Z-00-DX1_1"
        write_tif(folder / f"{stem}.tif", rgba(30, 40, k))
        (folder / f"{stem}.xml").write_text(MONUSAC_XML)
    svs_only = top / "TCGA-55-1594-01Z-00-DX1" / "TCGA-55-1594-01Z-00-DX1_004"
    svs_only.with_suffix(".xml").write_text(MONUSAC_XML)
    svs_only.with_suffix(".svs").write_bytes(b"II*\x00not really an svs")
    # MoNuSAC test (folder name with spaces): a kidney patient with an Ambiguous annotation.
    folder = raw[N.download.MONUSAC_TEST] / "MoNuSAC Testing Data and Annotations" / "TCGA-2Z-A9JG-01Z-00-DX1"
    write_tif(folder / "TCGA-2Z-A9JG-01Z-00-DX1_1.tif", rgba(30, 40, 10))
    (folder / "TCGA-2Z-A9JG-01Z-00-DX1_1.xml").write_text(MONUSAC_TEST_XML)
    # MoNuSeg train (spaces, Tissue Images/ + Annotations/, macOS junk) and test (flat).
    top = raw[N.download.MONUSEG_TRAIN] / "MoNuSeg 2018 Training Data"
    write_tif(top / "Tissue Images" / "TCGA-18-5592-01Z-00-DX1.tif", rgba(32, 32, 20)[..., :3])
    (top / "Annotations").mkdir(parents=True)
    (top / "Annotations" / "TCGA-18-5592-01Z-00-DX1.xml").write_text(MONUSEG_XML)
    junk = raw[N.download.MONUSEG_TRAIN] / "__MACOSX" / "MoNuSeg 2018 Training Data" / "Tissue Images"
    junk.mkdir(parents=True)
    (junk / "._TCGA-18-5592-01Z-00-DX1.tif").write_bytes(b"\x00\x05\x16\x07")
    (top / "Annotations" / "._TCGA-18-5592-01Z-00-DX1.xml").write_bytes(b"\x00\x05\x16\x07")
    write_tif(
        raw[N.download.MONUSEG_TEST] / "MoNuSegTestData" / "TCGA-2Z-A9J9-01A-01-TS1.tif", rgba(32, 32, 21)[..., :3]
    )
    (raw[N.download.MONUSEG_TEST] / "MoNuSegTestData" / "TCGA-2Z-A9J9-01A-01-TS1.xml").write_text(MONUSEG_XML)
    # TNBC: two patients, RGBA slides, L-mode GT with 0/255 (and one anti-aliased 128).
    tnbc = raw[N.download.TNBC_ZIP] / "TNBC_NucleiSegmentation"
    for nn, seed in (("01", 30), ("02", 31)):
        (tnbc / f"Slide_{nn}").mkdir(parents=True)
        (tnbc / f"GT_{nn}").mkdir(parents=True)
        Image.fromarray(rgba(16, 16, seed), "RGBA").save(tnbc / f"Slide_{nn}" / f"{nn}_1.png")
        gt = np.zeros((16, 16), np.uint8)
        gt[2:6, 3:8] = 255
        gt[10, 10] = 128
        Image.fromarray(gt, "L").save(tnbc / f"GT_{nn}" / f"{nn}_1.png")
    (raw[N.download.TNBC_ZIP] / "__MACOSX" / "TNBC_NucleiSegmentation" / "Slide_01").mkdir(parents=True)
    (raw[N.download.TNBC_ZIP] / "__MACOSX" / "TNBC_NucleiSegmentation" / "Slide_01" / "._01_1.png").write_bytes(b"junk")
    return raw


@pytest.fixture()
def raw(tmp_path):
    return write_fixture(tmp_path / "raw")


def quiet(_):
    return None


def test_xml_mask_pixel_counts_equal_polygon_areas(raw):
    xml = next((raw[N.download.MONUSAC_TRAIN]).rglob("TCGA-55-1594-01Z-00-DX1_003.xml"))
    mask, stats = N.raw.xml_to_mask(xml, (30, 40))
    assert mask.dtype == np.uint8 and set(np.unique(mask)) == {0, 1}
    assert int(mask.sum()) == MONUSAC_PIXELS
    assert mask[2:6, 3:10].all() and int(mask[2:6, 3:10].sum()) == 28
    assert int(mask[20:25, 35:40].sum()) == 25  # the part inside the image, clipped at column 39
    assert stats == {"regions": 3, "skipped_regions": 1, "ambiguous_regions": 0, "outside_regions": 0}
    seg_mask, _ = N.raw.xml_to_mask(
        raw[N.download.MONUSEG_TRAIN] / "MoNuSeg 2018 Training Data/Annotations/TCGA-18-5592-01Z-00-DX1.xml", (32, 32)
    )
    assert int(seg_mask.sum()) == MONUSEG_PIXELS


def test_ambiguous_regions_are_not_nuclei_by_default(raw):
    xml = next(raw[N.download.MONUSAC_TEST].rglob("*.xml"))
    ignored, stats = N.raw.xml_to_mask(xml, (30, 40))
    drawn, _ = N.raw.xml_to_mask(xml, (30, 40), ambiguous="foreground")
    assert int(ignored.sum()) == 28 and stats["ambiguous_regions"] == 1
    assert int(drawn.sum()) == 28 + 32
    with pytest.raises(ValueError, match="ambiguous"):
        N.raw.xml_to_mask(xml, (30, 40), ambiguous="ignore-index")


def test_alpha_dropped_from_tiff_and_png(raw):
    tif = next(raw[N.download.MONUSAC_TRAIN].rglob("TCGA-A2-A0CV-01Z-00-DX1_1.tif"))
    np.testing.assert_array_equal(N.raw.read_rgb(tif), rgba(30, 40, 1)[..., :3])
    png = raw[N.download.TNBC_ZIP] / "TNBC_NucleiSegmentation" / "Slide_02" / "02_1.png"
    np.testing.assert_array_equal(N.raw.read_rgb(png), rgba(16, 16, 31)[..., :3])


def test_tnbc_slide_gt_pairing_and_threshold(raw):
    found = N.raw.find_tnbc(raw[N.download.TNBC_ZIP])
    pairs = [
        (
            s.image.relative_to(raw[N.download.TNBC_ZIP]).as_posix(),
            s.annotation.relative_to(raw[N.download.TNBC_ZIP]).as_posix(),
        )
        for s in found.samples
    ]
    assert pairs == [
        ("TNBC_NucleiSegmentation/Slide_01/01_1.png", "TNBC_NucleiSegmentation/GT_01/01_1.png"),
        ("TNBC_NucleiSegmentation/Slide_02/02_1.png", "TNBC_NucleiSegmentation/GT_02/02_1.png"),
    ]
    assert [s.patient for s in found.samples] == ["TNBC_01", "TNBC_02"]
    mask = N.raw.read_mask_png(found.samples[0].annotation)
    assert int(mask.sum()) == 4 * 5 + 1  # 255 block and the anti-aliased 128 pixel
    (raw[N.download.TNBC_ZIP] / "TNBC_NucleiSegmentation" / "GT_02" / "02_1.png").unlink()
    with pytest.raises(N.sites.NucleiDataError, match=r"Slide_02/02_1.png has no mask GT_02/02_1.png"):
        N.raw.find_tnbc(raw[N.download.TNBC_ZIP])


def test_monusac_organs_svs_only_and_monuseg_junk(raw):
    found = N.raw.find_monusac(raw[N.download.MONUSAC_TRAIN], "train", N.download.MONUSAC_TRAIN)
    assert sorted((s.client, s.patient) for s in found.samples) == [
        ("MoNuSAC_breast", "TCGA-A2-A0CV"),
        ("MoNuSAC_kidney", "TCGA-5P-A9K0"),
        ("MoNuSAC_lung", "TCGA-55-1594"),
        ("MoNuSAC_prostate", "TCGA-EJ-5495"),
    ]
    assert any("_004.xml: only an .svs image" in line for line in found.skipped)
    seg = N.raw.find_monuseg(raw[N.download.MONUSEG_TRAIN], "train", N.download.MONUSEG_TRAIN)
    assert [s.source for s in seg.samples] == [
        f"{N.download.MONUSEG_TRAIN}/MoNuSeg 2018 Training Data/Tissue Images/TCGA-18-5592-01Z-00-DX1.tif"
    ]
    assert seg.skipped == []  # the ._ files and __MACOSX are ignored, not reported


def test_organ_lists_are_consistent():
    for organ in ("lung", "kidney", "breast", "prostate"):
        for subset in ("train", "test"):
            assert all(N.sites.PATIENT_ORGAN[p] == organ for p in N.sites.MONUSAC_ORGANS[subset][organ])
    assert [len(N.sites.MONUSAC_ORGANS["train"][o]) for o in ("lung", "kidney", "breast", "prostate")] == [
        10,
        12,
        10,
        14,
    ]
    assert [len(N.sites.MONUSAC_ORGANS["test"][o]) for o in ("lung", "kidney", "breast", "prostate")] == [7, 7, 5, 6]


def test_preprocess_resize_and_tiling(raw, tmp_path):
    counts = N.preprocess(raw, tmp_path / "resized", "harmofl", size=16, log=quiet)
    assert counts == {
        "MoNuSAC_breast": 1,
        "MoNuSAC_kidney": 2,
        "MoNuSAC_lung": 1,
        "MoNuSAC_prostate": 1,
        "MoNuSeg": 2,
        "TNBC": 2,
    }
    assert list_clients(tmp_path / "resized") == sorted(N.sites.CLIENTS)
    kidney = open_client(tmp_path / "resized", "MoNuSAC_kidney")
    assert kidney.images.shape == (2, 16, 16, 3) and kidney.labels.shape == (2, 16, 16)
    assert set(np.unique(kidney.labels)) <= {0, 1}
    assert kidney.meta["id"].tolist() == [
        "MoNuSAC/test/TCGA-2Z-A9JG-01Z-00-DX1_1",
        "MoNuSAC/train/TCGA-5P-A9K0-01Z-00-DX1_1",
    ]
    assert (kidney.meta["group"] == kidney.meta["id"]).all()
    assert kidney.meta["source"].iloc[0] == (
        f"{N.download.MONUSAC_TEST}/MoNuSAC Testing Data and Annotations/TCGA-2Z-A9JG-01Z-00-DX1/TCGA-2Z-A9JG-01Z-00-DX1_1.tif"
    )

    # Tiling at native scale: a 40x30 image in a 64-pixel tile is padded (white image, empty mask).
    counts = N.preprocess(raw, tmp_path / "tiled", "harmofl_tiled", size=64, log=quiet)
    assert counts["MoNuSAC_lung"] == 1
    lung = open_client(tmp_path / "tiled", "MoNuSAC_lung")
    assert int(lung.labels[0].sum()) == MONUSAC_PIXELS
    assert (lung.images[0, 30:] == 255).all() and (lung.images[0, :, 40:] == 255).all()
    np.testing.assert_array_equal(lung.images[0, :30, :40], rgba(30, 40, 0)[..., :3])
    seg = open_client(tmp_path / "tiled", "MoNuSeg")
    assert [int(m.sum()) for m in seg.labels] == [MONUSEG_PIXELS, MONUSEG_PIXELS]


def test_tile_grid_covers_the_image_without_padding_large_sides():
    image = np.arange(100 * 70 * 3, dtype=np.uint32).reshape(100, 70, 3).astype(np.uint8)
    mask = (np.arange(100 * 70).reshape(100, 70) % 3 == 0).astype(np.uint8)
    tiles, masks, coords = N.raw.tile_pair(image, mask, 32)
    assert sorted({y for y, _ in coords}) == [0, 32, 64, 68] and sorted({x for _, x in coords}) == [0, 32, 38]
    assert tiles.shape == (12, 32, 32, 3) and masks.shape == (12, 32, 32)
    covered = np.zeros((100, 70), bool)
    for (y, x), t, m in zip(coords, tiles, masks):
        np.testing.assert_array_equal(t, image[y : y + 32, x : x + 32])
        np.testing.assert_array_equal(m, mask[y : y + 32, x : x + 32])
        covered[y : y + 32, x : x + 32] = True
    assert covered.all()


def test_expect_real_counts_fails_loudly(raw, tmp_path):
    with pytest.raises(N.sites.NucleiDataError) as info:
        N.preprocess(raw, tmp_path / "store", "harmofl", expect_real_counts=True, log=quiet)
    message = str(info.value)
    for line in (
        "MoNuSAC train images: found 4, the real data have 209",
        "MoNuSAC train patients: found 4, the real data have 46",
        "MoNuSAC test images: found 1, the real data have 85",
        "MoNuSeg train images: found 1, the real data have 30",
        "MoNuSeg test images: found 1, the real data have 14",
        "TNBC images: found 2, the real data have 50",
        "TNBC patients: found 2, the real data have 11",
    ):
        assert line in message
    assert not (tmp_path / "store").exists()


def test_bad_inputs_are_named(raw, tmp_path):
    xml = next(raw[N.download.MONUSEG_TEST].rglob("*.xml"))
    xml.write_text("<Annotations><Annotation>")
    with pytest.raises(N.sites.NucleiDataError, match=r"TCGA-2Z-A9J9-01A-01-TS1.xml: not a readable XML"):
        N.preprocess(raw, tmp_path / "store", "harmofl", log=quiet)
    assert not (tmp_path / "store").exists()
    folder = raw[N.download.MONUSAC_TRAIN] / "MoNuSAC_images_and_annotations" / "TCGA-ZZ-ZZZZ-01Z-00-DX1"
    write_tif(folder / "TCGA-ZZ-ZZZZ-01Z-00-DX1_1.tif", rgba(8, 8, 0))
    (folder / "TCGA-ZZ-ZZZZ-01Z-00-DX1_1.xml").write_text(MONUSAC_XML)
    with pytest.raises(N.sites.NucleiDataError, match="not in the official organ lists.*TCGA-ZZ-ZZZZ"):
        N.raw.find_monusac(raw[N.download.MONUSAC_TRAIN], "train", N.download.MONUSAC_TRAIN)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("nuclei_synthetic")
    info = N.write_synthetic(root / "synthetic", seed=5, images_per_site=4, image_size=64, tnbc_patients=3)
    raw = {
        spec.filename: safe_extract(root / "synthetic" / spec.filename, root / "extracted" / spec.filename)
        for spec in N.DOWNLOADS
    }
    return root, info, raw


def test_synthetic_twin_round_trip(synthetic, tmp_path):
    root, info, raw = synthetic
    assert sorted(p.name for p in (root / "synthetic").iterdir()) == sorted(s.filename for s in N.DOWNLOADS)
    assert (raw[N.download.MONUSAC_TEST] / "MoNuSAC Testing Data and Annotations").is_dir()
    assert not (raw[N.download.MONUSEG_TRAIN] / "__MACOSX").exists()
    with Image.open(next(raw[N.download.TNBC_ZIP].rglob("Slide_01/*.png"))) as img:
        assert img.mode == "RGBA"
    assert tifffile.imread(next(raw[N.download.MONUSAC_TRAIN].rglob("*.tif"))).shape[-1] == 4

    counts = N.preprocess(raw, tmp_path / "resized", "harmofl", size=32, log=quiet)
    assert counts == info["images"] == {c: 4 for c in N.sites.CLIENTS}
    # Tiles of 128 >= every synthetic side (at most 1.3 x 64): one padded tile per image, masks exact.
    counts = N.preprocess(raw, tmp_path / "tiled", "harmofl_tiled", size=128, log=quiet)
    for client in N.sites.CLIENTS:
        data = open_client(tmp_path / "tiled", client)
        assert sorted(int(m.sum()) for m in data.labels) == sorted(info["nucleus_pixels"][client])
        # Learnable: nuclei are darker than the rest of the (unpadded) tissue.
        x = np.asarray(data.images, np.float32).mean(-1)
        assert x[data.labels == 1].mean() + 40 < x[(data.labels == 0) & (x < 250)].mean()
    table = N.split(tmp_path / "tiled", tmp_path / "split.csv", "harmofl_tiled")
    assert table.groupby("client").size().to_dict() == counts
    # Deterministic twin.
    N.write_synthetic(tmp_path / "again", seed=5, images_per_site=4, image_size=64, tnbc_patients=3)
    for spec in N.DOWNLOADS:
        assert (tmp_path / "again" / spec.filename).read_bytes() == (root / "synthetic" / spec.filename).read_bytes()


def test_split_image_level_disjoint_deterministic(synthetic, tmp_path):
    _, _, raw = synthetic
    N.preprocess(raw, tmp_path / "store", "harmofl_tiled", size=24, log=quiet)
    table = N.split(tmp_path / "store", tmp_path / "a.csv", "harmofl_tiled", seed=0)
    N.split(tmp_path / "store", tmp_path / "b.csv", "harmofl_tiled", seed=0)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert read_split_csv(tmp_path / "a.csv").shape[0] == len(table)
    for client in N.sites.CLIENTS:
        part = table[table.client == client]
        n_rows = len(open_client(tmp_path / "store", client))
        assert sorted(part.row) == list(range(n_rows))  # every tile exactly once
        groups = part.groupby("split")["group"].apply(set)
        assert not (
            groups["train"] & groups["val"] or groups["train"] & groups["test"] or groups["val"] & groups["test"]
        )
        assert [len(groups[s]) for s in ("train", "val", "test")] == [2, 1, 1]  # 4 images: int(2.56), int(3.2)
    patient = N.split(tmp_path / "store", tmp_path / "p.csv", "harmofl_tiled", permutation="patient", seed=0)
    meta = {c: open_client(tmp_path / "store", c).meta for c in N.sites.CLIENTS}
    patient["patient"] = [meta[c]["patient"].iloc[r] for c, r in zip(patient.client, patient.row)]
    assert (patient.groupby(["client", "patient"])["split"].nunique() == 1).all()


def test_split_refuses_empty_splits(raw, tmp_path):
    N.preprocess(raw, tmp_path / "store", "harmofl", size=16, log=quiet)
    with pytest.raises(
        N.sites.NucleiDataError, match=r"client MoNuSAC_breast .* 1 image group\(s\) leave the \['train', 'val'\]"
    ):
        N.split(tmp_path / "store", tmp_path / "s.csv", "harmofl")
    assert not (tmp_path / "s.csv").exists()


def test_official_split_keeps_the_datasets_test_images(synthetic, tmp_path):
    """HarmoFL's appendix: the official train/test split, 20 % of training images for validation."""
    _, _, raw = synthetic
    N.preprocess(raw, tmp_path / "store", "harmofl", size=24, log=quiet)
    table = N.split(tmp_path / "store", tmp_path / "split.csv", "harmofl")  # default = official
    for client in N.sites.CLIENTS:
        meta = open_client(tmp_path / "store", client).meta
        rows = table[table["client"] == client]
        subset = meta["subset"].astype(str).to_numpy()[rows["row"].to_numpy()]
        if client == "TNBC":  # no official split: a seeded hold-out
            assert set(subset) == {"all"} and (rows["split"] == "test").sum() >= 1
        else:
            assert ((subset == "test") == (rows["split"] == "test").to_numpy()).all(), client
        assert (rows["split"] == "val").sum() >= 1
