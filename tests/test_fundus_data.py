"""RIF fundus (DoFE release, Fed-LWR protocol): mask thresholds, resizing, the real layout, splits,
and the synthetic twin.

The fixture follows datasets.md §5.4: ``Fundus/Domain{1..4}/{train,test}/ROIs/{image,mask}/`` with
2 train + 1 test images per domain under real-style names, 32 x 32 RGB images, L-mode masks with a
255 background, a 128 disc containing a 0 cup, and anti-aliased values (190, 100, 40) at known pixels.
Its root lies under a folder called ``image_data`` to catch DoFE's ``replace('image', 'mask')`` bug.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedmedbench.data import fundus as F
from fedmedbench.data.archive import safe_extract
from fedmedbench.data.download import DownloadError, fetch_spec
from fedmedbench.data.store import open_client, read_split_csv, split_rows, write_client
from tests.conftest import realdata_dir

NAMES = {
    "Domain1": (["ndrishtiGS_002.png", "gdrishtiGS_001.png"], ["gdrishtiGS_010.png"]),
    "Domain2": (["N-2-R.png", "G-1-L.png"], ["S-3-L.png"]),
    "Domain3": (["n0001.png", "g0001.png"], ["g0401.png"]),
    "Domain4": (["V0002.png", "V0001.png"], ["V0401.png"]),
}


def _fixture_mask(k: int) -> np.ndarray:
    y, x = np.mgrid[0:32, 0:32]
    r = np.hypot(y - 16, x - 16)
    mask = np.full((32, 32), 255, np.uint8)
    mask[r < 10] = 128
    mask[r < 3 + k] = 0  # cup size identifies the image
    mask[0, 0], mask[0, 1], mask[0, 2], mask[0, 3] = 190, 100, 40, 150
    return mask


def _write_fixture(root: Path) -> dict:
    """Write the files (in reverse order, so creation order is not name order); return truth by id."""
    truth, k = {}, 0
    for domain, splits in NAMES.items():
        for split, names in zip(("train", "test"), splits):
            for name in names:
                for sub in ("image", "mask"):
                    (root / domain / split / "ROIs" / sub).mkdir(parents=True, exist_ok=True)
                image = np.zeros((32, 32, 3), np.uint8)
                image[..., 0], image[..., 1] = 10 * k, 100  # red channel identifies the image
                mask = _fixture_mask(k)
                Image.fromarray(image).save(root / domain / split / "ROIs" / "image" / name)
                Image.fromarray(mask).save(root / domain / split / "ROIs" / "mask" / name)
                truth[f"{domain}/{split}/{Path(name).stem}"] = (image, mask)
                k += 1
    return truth


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    base = tmp_path_factory.mktemp("fundus")
    truth = _write_fixture(base / "image_data" / "Fundus")
    logs = []
    counts = F.preprocess({F.download.ARCHIVE: base / "image_data"}, base / "store", "fedlwr", size=32, log=logs.append)
    return base, truth, counts, logs


# ---------------------------------------------------------------------------
# Mask encodings
# ---------------------------------------------------------------------------


def test_thresholds_map_anti_aliased_values():
    grey = np.array([0, 40, 50, 51, 60, 100, 128, 150, 192, 200, 201, 230, 255], np.uint8)
    expected = [2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]  # DoFE: <= 50 cup, <= 200 rim, > 200 background
    assert F.raw.mask_to_classes(grey).tolist() == expected
    # interpolated values (bilinear resampling) follow the same inequalities
    assert F.raw.mask_to_classes(np.array([50.0, 50.5, 127.3, 200.0, 200.5])).tolist() == [2, 1, 1, 1, 0]
    # Fed-LWR's own formula 2 - uint8(grey / 127), used with the official bilinear masks
    code = F.raw.fedlwr_code_mask_to_classes(np.array([0, 60, 126, 127, 200, 253, 254, 255], np.uint8))
    assert code.tolist() == [2, 2, 2, 1, 1, 1, 0, 0]
    with pytest.raises(ValueError):
        F.raw.mask_to_classes(grey, cup_max=200, background_above=100)


def test_disc_cup_convention():
    labels = np.array([[0, 1, 2]], np.uint8)
    cup, disc = F.raw.disc_cup(labels)
    assert cup.tolist() == [[False, False, True]] and disc.tolist() == [[False, True, True]]
    assert F.raw.disc_cup(np.zeros((5, 4, 4), np.uint8)).shape == (5, 2, 4, 4)


# ---------------------------------------------------------------------------
# Resizing
# ---------------------------------------------------------------------------


def test_bilinear_matches_opencv_semantics():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (8, 8, 3)).astype(np.uint8)
    # halving: OpenCV's INTER_LINEAR samples at (2i + 0.5), i.e. the mean of each 2 x 2 block
    expected = np.floor(a.reshape(4, 2, 4, 2, 3).astype(float).mean(axis=(1, 3)) + 0.5)
    np.testing.assert_array_equal(F.raw.resize_bilinear(a, 4), expected.astype(np.uint8))
    np.testing.assert_array_equal(F.raw.resize_bilinear(a, 8), a)  # same size: unchanged
    # doubling: edge pixels replicate, inner ones are 3:1 mixtures
    row = np.array([[0, 100]], np.uint8).repeat(2, 0)
    assert F.raw.resize_bilinear(row, 4)[0].tolist() == [0, 25, 75, 100]
    grey = np.full((10, 10), 128, np.uint8)
    assert (F.raw.resize_bilinear(grey, 7) == 128).all()


def test_nearest_keeps_values():
    labels = np.array([[0, 1], [2, 1]], np.uint8)
    assert F.raw.resize_nearest(labels, 4).tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 1, 1], [2, 2, 1, 1]]
    big = np.random.default_rng(1).integers(0, 3, (50, 50)).astype(np.uint8)
    assert set(np.unique(F.raw.resize_nearest(big, 23))) <= {0, 1, 2}


# ---------------------------------------------------------------------------
# The real layout
# ---------------------------------------------------------------------------


def test_fixture_counts_order_and_pairing(fixture):
    base, truth, counts, logs = fixture
    assert counts == {d: 3 for d in F.sites.DOMAINS} and len(logs) == 4
    for domain, (train, test) in NAMES.items():
        data = open_client(base / "store", domain)
        assert list(data.meta["name"]) == sorted(train) + sorted(test)  # sorted, official train first
        assert list(data.meta["official_split"]) == ["train", "train", "test"]
        for k, row in data.meta.iterrows():
            image, mask = truth[row["id"]]
            np.testing.assert_array_equal(data.images[k], image)  # the image of this name
            np.testing.assert_array_equal(data.labels[k], F.raw.mask_to_classes(mask))  # and its own mask
            assert row["mask_off_level_px"] == 4
        # the root folder "image_data" is not rewritten (DoFE's replace('image', 'mask') would)
        assert list(data.meta["mask_source"]) == [s.replace("/ROIs/image/", "/ROIs/mask/") for s in data.meta["source"]]
        assert data.meta["source"].iloc[0].startswith(f"Fundus.zip/Fundus/{domain}/train/ROIs/image/")
    d2 = open_client(base / "store", "Domain2").meta
    assert d2.set_index("name")["group"].to_dict() == {
        "G-1-L.png": "Domain2/G-1",
        "N-2-R.png": "Domain2/N-2",
        "S-3-L.png": "Domain2/S-3",
    }


def test_anti_aliased_pixel_classes(fixture):
    # 190 -> rim (below 192), 100 -> rim, 40 -> cup, 150 -> rim; written at row 0, columns 0..3
    base = fixture[0]
    labels = open_client(base / "store", "Domain1").labels
    assert labels[0][0, :4].tolist() == [1, 1, 2, 1]


def test_resize_to_384_and_bilinear_mask_switch(fixture, tmp_path):
    base = fixture[0]
    raw = {F.download.ARCHIVE: base / "image_data"}
    counts = F.preprocess(raw, tmp_path / "near", "fedlwr", log=lambda m: None)  # default size 384
    F.preprocess(raw, tmp_path / "bil", "fedlwr_bilinear_masks", log=lambda m: None)
    near, bil = open_client(tmp_path / "near", "Domain3"), open_client(tmp_path / "bil", "Domain3")
    assert near.images.shape == (counts["Domain3"], 384, 384, 3) and near.labels.shape == (3, 384, 384)
    # images: the same bilinear resize, the official one in OpenCV's fixed point (at most one grey level apart)
    assert np.abs(near.images.astype(int) - bil.images.astype(int)).max() <= 1
    assert set(np.unique(near.labels)) == {0, 1, 2} and set(np.unique(bil.labels)) == {0, 1, 2}
    grey = np.asarray(Image.open(base / "image_data" / "Fundus" / "Domain3" / "train" / "ROIs" / "mask" / "g0001.png"))
    # the official order: classes first, then the class map resized bilinearly (tests/test_fundus_official_masks.py)
    np.testing.assert_array_equal(
        bil.labels[0], F.opencv_resize.resize_linear_u8(F.raw.fedlwr_code_mask_to_classes(grey), 384, 384)
    )
    np.testing.assert_array_equal(near.labels[0], F.raw.resize_nearest(F.raw.mask_to_classes(grey), 384))
    # the official mapping widens the rim at the rim/background edge (grey 128..253 -> rim)
    assert (bil.labels[0] == 1).sum() > (near.labels[0] == 1).sum()


def test_layout_errors(tmp_path):
    root = tmp_path / "Fundus"
    with pytest.raises(F.sites.FundusDataError, match="does not exist"):
        F.raw.find_fundus_root(tmp_path / "nothing")
    for domain in F.sites.DOMAINS[:3]:
        (root / domain).mkdir(parents=True)
    with pytest.raises(F.sites.FundusDataError, match=r"Domain4.*Folders found"):
        F.raw.find_fundus_root(tmp_path)
    (root / "Domain4" / "train" / "ROIs" / "image").mkdir(parents=True)
    (root / "Domain4" / "train" / "ROIs" / "mask").mkdir(parents=True)
    assert F.raw.find_fundus_root(tmp_path) == root
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(root / "Domain4" / "train" / "ROIs" / "image" / "V0001.png")
    with pytest.raises(F.sites.FundusDataError, match=r"1 image\(s\) have no mask.*V0001\.png"):
        F.raw.list_pairs(root, "Domain4", "train")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(root / "Domain4" / "train" / "ROIs" / "mask" / "V0001.png")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(root / "Domain4" / "train" / "ROIs" / "mask" / "V0009.png")
    logs = []
    assert [p[0] for p in F.raw.list_pairs(root, "Domain4", "train", logs.append)] == ["V0001.png"]
    assert "V0009.png" in logs[0]


def test_real_count_mismatch_lists_every_domain(fixture, tmp_path):
    base = fixture[0]
    with pytest.raises(F.sites.FundusDataError) as err:
        F.preprocess(
            {F.download.ARCHIVE: base / "image_data"},
            tmp_path / "store",
            "fedlwr",
            expect_real_counts=True,
            log=lambda m: None,
        )
    for domain, (train, test) in F.sites.EXPECTED_COUNTS.items():
        assert f"{domain}: train/test = 2/1, expected {train}/{test}" in str(err.value)
    assert not (tmp_path / "store").exists()


# ---------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------


def _fake_store(store_dir: Path) -> None:
    for domain, (n_train, n_test) in F.sites.EXPECTED_COUNTS.items():
        names = [f"x{i:04d}.png" for i in range(n_train)] + [f"t{i:04d}.png" for i in range(n_test)]
        official = ["train"] * n_train + ["test"] * n_test
        meta = pd.DataFrame(
            {
                "id": [f"{domain}/{s}/{n}" for s, n in zip(official, names)],
                "group": names,
                "source": "x",
                "official_split": official,
                "name": names,
            }
        )
        n = len(names)
        write_client(store_dir, domain, np.zeros((n, 1, 1, 3), np.uint8), np.zeros((n, 1, 1), np.uint8), meta)


def test_split_of_record_sizes_and_determinism(tmp_path):
    _fake_store(tmp_path / "store")
    a = F.split(tmp_path / "store", tmp_path / "a.csv", "fedlwr")
    F.split(tmp_path / "store", tmp_path / "b.csv", "fedlwr", permutation="seeded", seed=0)
    c = F.split(tmp_path / "store", tmp_path / "c.csv", "fedlwr", seed=1)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes() and not a.equals(c)
    split = read_split_csv(tmp_path / "a.csv")
    for domain in F.sites.DOMAINS:
        meta = open_client(tmp_path / "store", domain).meta
        parts = {s: split_rows(split, domain, s) for s in ("train", "val", "test")}
        assert tuple(len(parts[s]) for s in ("train", "val", "test")) == F.sites.FEDLWR_SPLIT_COUNTS[domain]
        assert set(meta["official_split"].to_numpy()[np.concatenate([parts["train"], parts["val"]])]) == {"train"}
        assert list(meta["name"].to_numpy()[parts["test"]]) == sorted(
            meta.loc[meta["official_split"] == "test", "name"]
        )
    F.split(tmp_path / "store", tmp_path / "sorted.csv", "fedlwr", permutation="sorted")
    split = read_split_csv(tmp_path / "sorted.csv")
    train = split_rows(split, "Domain1", "train")
    assert train.tolist() == list(range(40))  # first 80 % of the name-sorted list


def test_manual_step_names_the_file_and_key(tmp_path):
    spec = F.download.DOWNLOAD
    assert spec.url == f"gdrive:{F.download.DRIVE_ID}"
    assert "data.fundus.files.Fundus.zip.archive" in spec.manual_step and F.download.DRIVE_ID in spec.manual_step
    (tmp_path / "page.html").write_text("<!DOCTYPE html><html>quota exceeded</html>")
    with pytest.raises(DownloadError, match=r"data\.fundus\.files\.Fundus\.zip\.archive"):
        fetch_spec(spec, tmp_path / "Fundus.zip", source=str(tmp_path / "page.html"), log=lambda m: None)
    assert not (tmp_path / "Fundus.zip").exists()


# ---------------------------------------------------------------------------
# Synthetic twin
# ---------------------------------------------------------------------------


def test_synthetic_round_trip(tmp_path):
    info = F.write_synthetic(tmp_path / "raw", seed=0, train_per_domain=5, test_per_domain=2, size=32)
    assert [p.name for p in (tmp_path / "raw").iterdir()] == [F.download.ARCHIVE]
    raw = {F.download.ARCHIVE: safe_extract(tmp_path / "raw" / F.download.ARCHIVE, tmp_path / "ex")}
    root = F.raw.find_fundus_root(raw[F.download.ARCHIVE])
    assert root.name == "Fundus"
    grey = np.asarray(Image.open(root / "Domain1" / "train" / "ROIs" / "mask" / info["Domain1"]["train"][0]))
    assert grey.dtype == np.uint8 and {0, 128, 255} <= set(np.unique(grey)) and len(np.unique(grey)) > 3
    assert info["Domain2"]["train"][:2] == ["G-1-L.png", "G-1-R.png"] and info["Domain4"]["test"][0] == "V0501.png"
    counts = F.preprocess(raw, tmp_path / "store", "fedlwr", size=40, log=lambda m: None)
    assert counts == {d: 7 for d in F.sites.DOMAINS}
    means = []
    for domain in F.sites.DOMAINS:
        data = open_client(tmp_path / "store", domain)
        assert data.images.shape == (7, 40, 40, 3) and set(np.unique(data.labels)) == {0, 1, 2}
        assert (data.meta["mask_off_level_px"] > 0).all()  # anti-aliased edges were thresholded
        green = data.images[..., 1].astype(float)
        assert green[data.labels == 2].mean() > green[data.labels == 0].mean() + 30  # learnable
        means.append(data.images.reshape(-1, 3).mean(0))
    assert min(np.abs(a - b).max() for i, a in enumerate(means) for b in means[i + 1 :]) > 3
    assert open_client(tmp_path / "store", "Domain2").meta["group"].iloc[0] == "Domain2/G-1"
    table = F.split(tmp_path / "store", tmp_path / "split.csv", "fedlwr")
    assert (table.groupby(["client", "split"]).size().unstack()[["train", "val", "test"]] == [4, 1, 2]).all().all()


def test_synthetic_is_deterministic(tmp_path):
    for name, seed in (("a", 2), ("b", 2), ("c", 3)):
        F.write_synthetic(tmp_path / name, seed=seed, train_per_domain=2, test_per_domain=1, size=16)
    a, b, c = ((tmp_path / n / F.download.ARCHIVE).read_bytes() for n in "abc")
    assert a == b and a != c


def test_unknown_protocol():
    with pytest.raises(ValueError, match="unknown protocol"):
        F.preprocess({}, "x", "dofe")


# --- masks in an unexpected encoding: refused in one line --------------------------------------------
REAL_ROOT = realdata_dir() / "rif_fundus" / "data" / "Fundus"


def _pair(tmp_path, mask: np.ndarray, mode="L"):
    image = tmp_path / "img.png"
    Image.fromarray(np.full(mask.shape + (3,), 90, np.uint8)).save(image)
    path = tmp_path / "mask.png"
    Image.fromarray(mask if mode == "L" else np.stack([mask] * 3, -1)).save(path)
    return image, path


def _disc(levels=(255, 128, 0), size=40):
    mask = np.full((size, size), levels[0], np.uint8)
    mask[10:30, 10:30] = levels[1]
    mask[15:25, 15:25] = levels[2]
    return mask


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (_disc((0, 1, 2)), r"mask\.png: values \[0, 1, 2\] look like class indices"),
        (np.full((40, 40), 255, np.uint8), r"mask\.png: no optic disc"),
        (np.full((40, 40), 0, np.uint8), r"mask\.png: no background"),
        (_disc((240, 100, 20)), r"mask\.png: 100\.0% of pixels are not 0/128/255 \(more than 25%\)"),
    ],
)
def test_a_mask_in_another_encoding_is_refused_naming_the_file(tmp_path, mask, message):
    image, path = _pair(tmp_path, mask)
    with pytest.raises(F.sites.FundusDataError, match=message):
        F.raw.load_pair(image, path, 16)


def test_a_few_interpolated_edge_pixels_are_accepted_and_counted(tmp_path):
    mask = _disc()
    mask[10, 10:30] = 190  # an anti-aliased edge: 20 of 1600 pixels
    image, path = _pair(tmp_path, mask, mode="RGB")  # real RIF masks are 3-channel PNGs
    _, labels, info = F.raw.load_pair(image, path, 40)
    assert info["mask_off_level_px"] == 20 and set(np.unique(labels)) == {0, 1, 2}


@pytest.mark.shared
@pytest.mark.skipif(not REAL_ROOT.exists(), reason="../shared/realdata not beside the checkout")
def test_real_rif_masks_pass_the_encoding_check():
    masks = sorted(REAL_ROOT.glob("Domain*/*/ROIs/mask/*.png"))
    assert masks
    for mask_path in masks:
        image_path = mask_path.parent.parent / "image" / mask_path.name
        _, labels, info = F.raw.load_pair(image_path, mask_path, 64)
        assert info["mask_off_level_px"] == 0 and set(np.unique(labels)) == {0, 1, 2}, mask_path
