"""The ``folders`` family (the user's own multi-site data): the store holds exactly what was written,
grouped and user-given splits, NIfTI slicing, options checking, and one clear error (naming the file
or site, nothing written) for every kind of bad data."""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedmedbench.data import folders as F
from fedmedbench.data.folders.inspect import inspect_folders
from fedmedbench.data.store import open_client, read_split_csv
from fedmedbench.errors import ConfigError, DataError

SITES = ["siteA", "siteB", "siteC"]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """One example dataset of each kind, written once; tests that damage data copy them first."""
    base = tmp_path_factory.mktemp("folders")
    return {
        "seg3": F.write_example(base / "seg3"),
        "seg2": F.write_example(base / "seg2", n_classes=2),
        "nifti": F.write_example(base / "nifti", image_format="nifti", counts=(3, 4, 5)),
        "classification": F.write_example(base / "classification", kind="classification"),
    }


def _copy(example: dict, tmp_path: Path) -> tuple[Path, dict]:
    """A private copy of an example and its options pointing at the copy."""
    root = tmp_path / "data"
    shutil.copytree(example["options"]["root"], root)
    return root, {**example["options"], "root": str(root)}


def _preprocess(options: dict, tmp_path: Path, **kwargs) -> tuple[Path, dict]:
    store = tmp_path / "out" / "store"
    return store, F.preprocess({}, store, "", options=options, log=lambda _: None, **kwargs)


def _png(path: Path, array: np.ndarray) -> None:
    Image.fromarray(array).save(path)


# --- the store holds exactly what was generated -------------------------------------------------


@pytest.mark.parametrize("name", ["seg3", "seg2"])
def test_the_store_holds_the_generated_images_and_class_pixels(examples, tmp_path, name):
    example = examples[name]
    store, counts = _preprocess(example["options"], tmp_path)
    assert counts == example["counts"] == {"siteA": 6, "siteB": 8, "siteC": 10}
    root = Path(example["options"]["root"])
    for site in SITES:
        client = open_client(store, site)
        n_classes = len(example["options"]["classes"])
        assert client.images.shape == (counts[site], 32, 32, 3) and client.labels.shape == (counts[site], 32, 32)
        assert (
            np.bincount(np.asarray(client.labels).ravel(), minlength=n_classes).tolist()
            == example["class_pixels"][site]
        )
        assert list(client.meta["id"]) == [f"{site}/{stem}" for stem in example["files"][site]]
        assert list(client.meta["group"]) == list(client.meta["id"])  # a 2-D image is its own group
        for row, source in enumerate(client.meta["source"]):
            assert np.array_equal(
                client.images[row][..., 0], np.asarray(Image.open(root / source).convert("RGB"))[..., 0]
            )
    grey = open_client(store, "siteA").images  # the first site is grey: replicated to 3 channels
    assert np.array_equal(grey[..., 0], grey[..., 1]) and np.array_equal(grey[..., 0], grey[..., 2])
    colour = open_client(store, "siteB").images
    assert not np.array_equal(colour[..., 0], colour[..., 2])


def test_the_classification_store_holds_the_generated_labels_and_groups(examples, tmp_path):
    example = examples["classification"]
    store, counts = _preprocess(example["options"], tmp_path)
    assert counts == example["counts"]
    labels_csv = pd.read_csv(Path(example["options"]["root"]) / "labels.csv", dtype=str)
    for site in SITES:
        client = open_client(store, site)
        assert client.labels.dtype == np.int64 and client.images.shape == (counts[site], 32, 32, 3)
        assert np.bincount(client.labels, minlength=3).tolist() == example["class_counts"][site]
        rows = labels_csv[labels_csv["site"] == site]
        assert list(client.meta["source"]) == list(rows["image"])
        assert list(client.meta["group"]) == [f"{site}/{g}" for g in rows["group"]]
        assert [F.example.EXAMPLE_LABELS[k] for k in client.labels] == list(rows["label"]) == list(client.meta["label"])


def test_labels_may_be_class_indices_and_groups_may_be_missing(examples, tmp_path):
    root, options = _copy(examples["classification"], tmp_path)
    table = pd.read_csv(root / "labels.csv", dtype=str)
    expected = [F.example.EXAMPLE_LABELS.index(label) for label in table["label"]]
    table["label"] = [str(k) for k in expected]
    table.drop(columns="group").to_csv(root / "labels.csv", index=False)
    store, _ = _preprocess(options, tmp_path)
    client = open_client(store, "siteA")
    assert list(client.labels) == expected[: len(client)]
    assert list(client.meta["group"]) == [f"siteA/{s}" for s in client.meta["source"]]  # each image its own group


def test_a_16_bit_image_is_scaled_from_its_robust_range(examples, tmp_path):
    root, options = _copy(examples["seg3"], tmp_path)
    deep = (1000 + np.arange(32 * 32).reshape(32, 32) * 2).astype(np.uint16)  # 1000 .. 3046, 12-bit-like
    Image.fromarray(deep).save(root / "siteA" / "images" / "siteA_000.png")
    store, _ = _preprocess(options, tmp_path)
    client = open_client(store, "siteA")
    stored = client.images[0][..., 0].astype(int)
    assert stored.min() == 0 and stored.max() == 255 and (np.diff(stored.ravel()) >= 0).all()
    # p0.5 of the 1024 values 1000 + 2k sits at k = 0.005 * 1023 = 5.115 -> 1010.23; p99.5 at
    # k = 1017.885 -> 3035.77; the 6 values below / above are clipped.
    assert (
        client.meta["intensity"][0]
        == "uint16 1010.23..3035.77 (p0.5..p99.5 of 1000..3046) scaled to 0..255, clipped outside"
    )
    assert (float(client.meta["intensity_low"][0]), float(client.meta["intensity_high"][0])) == pytest.approx(
        (1010.23, 3035.77)
    )
    expected = np.floor((np.clip(deep, 1010.23, 3035.77) - 1010.23) / (3035.77 - 1010.23) * 255 + 0.5)
    assert np.array_equal(stored, expected)
    assert client.meta["intensity"][1] == "uint8" and client.meta["intensity_low"][1] == ""  # as stored: no range


def _png_rgb16(path: Path, array: np.ndarray) -> None:
    """A 16-bit RGB PNG written by hand (Pillow cannot write one, and reads it keeping only high bytes)."""
    height, width = array.shape[:2]
    raw = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def test_a_16_bit_colour_tiff_is_scaled_and_a_16_bit_colour_png_refused(examples, tmp_path):
    import tifffile

    root, options = _copy(examples["seg3"], tmp_path)
    deep = (np.arange(32 * 32 * 3).reshape(32, 32, 3) * 7 + 500).astype(np.uint16)
    (root / "siteB/images/siteB_000.png").unlink()
    tifffile.imwrite(root / "siteB/images/siteB_000.tif", deep, photometric="rgb")
    store, _ = _preprocess(options, tmp_path)
    # One range for the three channels (colour balance kept): p0.5 of the 3072 values 500 + 7k is at
    # k = 0.005 * 3071 = 15.355 -> 607.485, p99.5 at k = 3055.645 -> 21889.515.
    low, high = 607.485, 21889.515
    expected = np.floor((np.clip(deep, low, high) - low) / (high - low) * 255 + 0.5).astype(np.uint8)
    assert np.array_equal(open_client(store, "siteB").images[0], expected)
    shutil.rmtree(tmp_path / "out")
    (root / "siteB/images/siteB_000.tif").unlink()
    _png_rgb16(root / "siteB/images/siteB_000.png", deep)
    _assert_one_error_and_nothing_written(
        lambda: _preprocess(options, tmp_path),
        tmp_path,
        "{root}/siteB/images/siteB_000.png: RGB;16B samples, which Pillow reads as 8-bit",
    )


def test_image_size_resizes_images_bilinear_and_masks_nearest(examples, tmp_path):
    root, options = _copy(examples["seg3"], tmp_path)
    big = np.zeros((48, 40), np.uint8)
    big[10:30, 10:30] = 128
    _png(root / "siteC" / "images" / "siteC_000.png", np.full((48, 40, 3), 90, np.uint8))
    _png(root / "siteC" / "masks" / "siteC_000.png", big)
    store, _ = _preprocess({**options, "image_size": 24}, tmp_path)
    for site in SITES:
        client = open_client(store, site)
        assert client.images.shape[1:] == (24, 24, 3)
        assert set(np.unique(client.labels)) <= {0, 1, 2}  # nearest: no class is invented
    assert set(np.unique(open_client(store, "siteC").labels[0])) == {0, 1}


# --- NIfTI volumes -------------------------------------------------------------------------------


def _volumes(root: Path, site: str, stem: str) -> tuple[np.ndarray, np.ndarray]:
    import SimpleITK as sitk

    return tuple(
        sitk.GetArrayFromImage(sitk.ReadImage(str(root / site / sub / f"{stem}.nii.gz"))) for sub in ("images", "masks")
    )


@pytest.mark.parametrize("axis, in_plane, per_volume", [(2, (36, 32), 5), (1, (5, 32), 36), (0, (5, 36), 32)])
def test_nifti_volumes_are_sliced_along_the_axis_with_2_5d_stacks(examples, tmp_path, axis, in_plane, per_volume):
    """The example volumes have NIfTI shape (i, j, k) = (32, 36, 5); each slice of a volume is one
    sample, all of them in the volume's group; stack 3 = slices [s-1, s, s+1], the edges repeated."""
    example = examples["nifti"]
    root = Path(example["options"]["root"])
    store, counts = _preprocess({**example["options"], "nifti_axis": axis, "stack": 3}, tmp_path)
    assert counts == {site: n * per_volume for site, n in example["volumes"].items()}
    client = open_client(store, "siteB")
    assert client.images.shape == (4 * per_volume, *in_plane, 3)
    assert client.meta["group"].value_counts().to_dict() == {f"siteB/vol{k:02d}": per_volume for k in range(4)}
    volume, mask = _volumes(root, "siteB", "vol01")
    volume, mask = np.moveaxis(volume, 2 - axis, 0), np.moveaxis(mask, 2 - axis, 0)  # SimpleITK order is (k, j, i)
    low, high = np.percentile(volume, (0.5, 99.5))  # one range per volume
    norm = np.floor((np.clip(volume, low, high) - low) / (high - low) * 255 + 0.5).astype(np.uint8)
    rows = np.flatnonzero(client.meta["group"] == "siteB/vol01")
    assert list(client.meta["slice"][rows]) == list(range(per_volume))
    for s, row in enumerate(rows):
        assert np.array_equal(client.labels[row], mask[s])
        for c, neighbour in enumerate((max(s - 1, 0), s, min(s + 1, per_volume - 1))):
            assert np.array_equal(client.images[row][..., c], norm[neighbour])
    totals = sum(np.bincount(np.asarray(open_client(store, site).labels).ravel(), minlength=3) for site in SITES)
    assert totals.tolist() == np.sum(list(example["class_pixels"].values()), axis=0).tolist()


def test_nifti_stack_1_replicates_the_slice_and_the_split_keeps_volumes_whole(examples, tmp_path):
    options = examples["nifti"]["options"]
    store, _ = _preprocess(options, tmp_path)
    images = open_client(store, "siteC").images
    assert np.array_equal(images[..., 0], images[..., 1]) and np.array_equal(images[..., 1], images[..., 2])
    table = F.split(store, tmp_path / "split.csv", "", options=options, log=lambda _: None)
    assert (table.groupby("group")["split"].nunique() == 1).all()
    assert table.groupby(["client", "split"])["group"].nunique().loc["siteC"].to_dict() == {
        "train": 3,
        "val": 1,
        "test": 1,
    }


# --- splits ----------------------------------------------------------------------------------------


def _expected_groups(n_groups: int, fractions=(0.6, 0.2, 0.2)) -> dict:
    n_val = max(1, int(np.floor(fractions[1] * n_groups + 0.5)))
    n_test = max(1, int(np.floor(fractions[2] * n_groups + 0.5)))
    return {"train": n_groups - n_val - n_test, "val": n_val, "test": n_test}


@pytest.mark.parametrize("name", ["seg3", "classification", "nifti"])
def test_the_seeded_split_keeps_every_group_in_one_split_and_follows_the_fractions(examples, tmp_path, name):
    options = examples[name]["options"]
    store, counts = _preprocess(options, tmp_path)
    logged = []
    table = F.split(store, tmp_path / "a.csv", "", options=options, log=logged.append)
    assert (table.groupby(["client", "group"])["split"].nunique() == 1).all()
    for site in SITES:
        rows = table[table["client"] == site]
        assert sorted(rows["row"]) == list(range(counts[site]))  # every sample exactly once
        groups = rows.groupby("split")["group"].nunique().to_dict()
        assert groups == _expected_groups(rows["group"].nunique())
        n = rows["split"].value_counts()
        assert f"folders {site}: train/val/test = {n['train']}/{n['val']}/{n['test']} images" in "\n".join(logged)
    assert read_split_csv(tmp_path / "a.csv").shape[0] == sum(counts.values())
    # The same seed gives the same file, another seed (argument or options.seed) another split.
    F.split(store, tmp_path / "b.csv", "", options=options, log=lambda _: None)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    F.split(store, tmp_path / "c.csv", "", options={**options, "seed": 7}, log=lambda _: None)
    F.split(store, tmp_path / "d.csv", "", options=options, seed=7, log=lambda _: None)
    assert (tmp_path / "c.csv").read_bytes() == (tmp_path / "d.csv").read_bytes() != (tmp_path / "a.csv").read_bytes()


def test_other_fractions_and_the_sorted_permutation(examples, tmp_path):
    options = {**examples["seg3"]["options"], "fractions": [0.5, 0.25, 0.25]}
    store, _ = _preprocess(options, tmp_path)
    table = F.split(store, tmp_path / "s.csv", "", options=options, permutation="sorted", log=lambda _: None)
    site_c = table[table["client"] == "siteC"]
    assert site_c["split"].value_counts().to_dict() == {"train": 4, "val": 3, "test": 3}
    assert list(site_c["row"]) == list(range(10))  # sorted: first stems train, then val, then test


def test_a_user_split_csv_is_honoured_in_its_order(examples, tmp_path):
    example = examples["seg3"]
    store, _ = _preprocess(example["options"], tmp_path)
    rows, expected = [], {}
    for site in SITES:
        stems = example["files"][site][::-1]  # the CSV's order, not the store's
        for k, stem in enumerate(stems):
            name = ("test", "val", "train", "train")[k % 4]
            # image relative to the data root or to the site folder: both name the same file
            image = f"{site}/images/{stem}.png" if k % 2 else f"./images/{stem}.png"
            rows.append({"site": site, "image": image, "split": name})
            expected.setdefault((site, name), []).append(f"{site}/{stem}")
    split_csv = tmp_path / "my_split.csv"
    pd.DataFrame(rows).to_csv(split_csv, index=False)
    options = {**example["options"], "split_csv": str(split_csv)}
    table = F.split(store, tmp_path / "split.csv", "", options=options, log=lambda _: None)
    written = read_split_csv(tmp_path / "split.csv")
    for (site, name), ids in expected.items():
        assert list(written[(written["client"] == site) & (written["split"] == name)]["id"]) == ids
    assert len(table) == len(rows)


def test_a_user_split_csv_names_whole_nifti_volumes(examples, tmp_path):
    example = examples["nifti"]
    store, counts = _preprocess(example["options"], tmp_path)
    rows = [
        {"site": site, "image": f"{site}/images/{stem}.nii.gz", "split": ("train", "val", "test")[min(k, 2)]}
        for site in SITES
        for k, stem in enumerate(example["files"][site])
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "vol_split.csv", index=False)
    table = F.split(
        store,
        tmp_path / "split.csv",
        "",
        options={**example["options"], "split_csv": str(tmp_path / "vol_split.csv")},
        log=lambda _: None,
    )
    assert len(table) == sum(counts.values())
    assert table[table["client"] == "siteA"].groupby("split")["group"].unique().map(list).to_dict() == {
        "train": ["siteA/vol00"],
        "val": ["siteA/vol01"],
        "test": ["siteA/vol02"],
    }


# --- options and sites -------------------------------------------------------------------------------


def test_discover_sites(examples, tmp_path):
    for name in ("seg3", "nifti", "classification"):
        root = examples[name]["options"]["root"]
        assert F.discover_sites(root) == SITES
        assert F.discover_sites(root, examples[name]["options"]["kind"]) == SITES
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "__MACOSX").mkdir()
    with pytest.raises(DataError, match=r": no site folders \(expected <root>/<site>/images/"):
        F.discover_sites(tmp_path)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"root": "d", "mask_value": {0: 0}},
            "folders: unknown key 'mask_value' (did you mean 'mask_values'?); valid keys: ",
        ),
        (
            {"root": "d", "fractions": [0.6, 0.2, 0.2], "seeed": 1},
            "folders: unknown key 'seeed' (did you mean 'seed'?)",
        ),
        ({"kind": "segmentation"}, "folders: 'root' is required"),
        (
            {"root": "d", "kind": "segmentaton"},
            'folders.kind: expected one of "segmentation", "classification", got "segmentaton" (str) (did you mean \'segmentation\'?)',
        ),
        ({"root": "d", "kind": "classification"}, "folders.classes: required for kind classification"),
        (
            {"root": "d", "kind": "classification", "classes": ["a", "b"], "stack": 3},
            "folders.stack: only for kind segmentation",
        ),
        (
            {"root": "d", "classes": ["a"]},
            'folders.classes: expected a list of at least two distinct class names, got ["a"]',
        ),
        (
            {"root": "d", "classes": ["a", "a"]},
            'folders.classes: expected a list of at least two distinct class names, got ["a", "a"]',
        ),
        (
            {"root": "d", "mask_values": {0: 0, 255: 2}, "classes": ["bg", "fg"]},
            "folders.mask_values: class index 2 is out of range for 2 classes",
        ),
        (
            {"root": "d", "mask_values": {-1: 0}},
            "folders.mask_values: key -1 is not a non-negative integer pixel value",
        ),
        (
            {"root": "d", "mask_values": {0: "bg"}},
            'folders.mask_values.0: expected a class index 0..255 for this pixel value, got "bg"',
        ),
        (
            {"root": "d", "fractions": [0.6, 0.2, 0.3]},
            "folders.fractions: expected three positive numbers train, val, test summing to 1",
        ),
        ({"root": "d", "fractions": [0.8, 0.2, 0]}, "folders.fractions.2: expected a positive number, got 0"),
        ({"root": "d", "seed": True}, "folders.seed: expected integer >= 0, got true"),
        ({"root": "d", "nifti_axis": 3}, "folders.nifti_axis: expected 0, 1 or 2"),
        ({"root": "d", "stack": 2}, "folders.stack: expected 1 (one slice, replicated to 3 channels) or 3"),
        (
            {"root": "d", "image_size": "256"},
            'folders.image_size: expected a positive integer (the side images are resized to; each task\'s model checks it fits), got "256"',
        ),
        ({"root": 5}, "folders.root: expected the path of the folder holding the site folders or labels.csv, got 5"),
    ],
)
def test_bad_options_are_one_config_error_naming_the_key(options, message):
    with pytest.raises(ConfigError) as err:
        F.FoldersOptions.from_dict(options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_options_defaults_and_json_keys():
    options = F.FoldersOptions.from_dict({"root": "d", "mask_values": {"0": 0, "255": 1}})
    assert options.mask_values == {0: 0, 255: 1} and options.num_classes == 2
    assert (
        options.kind,
        options.fractions,
        options.seed,
        options.nifti_axis,
        options.stack,
        options.image_size,
        options.split_csv,
        options.classes,
    ) == ("segmentation", (0.6, 0.2, 0.2), 0, 2, 1, None, None, None)
    default = F.FoldersOptions.from_dict({"root": "d", "classes": ["bg", "liver", "tumour"]})
    assert default.class_of_value == {0: 0, 1: 1, 2: 2}  # no mask_values: the masks hold class indices
    assert F.FoldersOptions.from_dict({"root": "d"}).class_of_value == {0: 0, 1: 1}


def test_the_example_is_deterministic_and_never_overwrites(tmp_path):
    a, b = F.write_example(tmp_path / "a", seed=3), F.write_example(tmp_path / "b", seed=3)
    assert a["class_pixels"] == b["class_pixels"]
    for path in sorted((tmp_path / "a").rglob("*.png")):
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes()
    with pytest.raises(FileExistsError):
        F.write_example(tmp_path / "a")


# --- bad data: one error naming the file or site, nothing written --------------------------------------


def _assert_one_error_and_nothing_written(call, tmp_path: Path, message: str) -> str:
    with pytest.raises(DataError) as err:
        call()
    text = str(err.value)
    assert "\n" not in text, text
    assert message.replace("{root}", str(tmp_path / "data")) in text, text
    assert not (tmp_path / "out").exists()  # no store, no staging folder, no empty parent folder
    return text


def _remove(rel):
    return lambda root: (root / rel).unlink()


def _write_png(rel, array):
    return lambda root: _png(root / rel, array)


def _truncate(rel):
    def damage(root):
        data = (root / rel).read_bytes()
        (root / rel).write_bytes(data[: len(data) // 2])

    return damage


def _mkdirs(*rels):
    def make(root):
        for rel in rels:
            (root / rel).mkdir(parents=True)

    return make


def _odd_mask(root):
    mask = np.asarray(Image.open(root / "siteC/masks/siteC_002.png")).copy()
    mask[0, :3] = 77  # e.g. an anti-aliased edge
    _png(root / "siteC/masks/siteC_002.png", mask)


def _rename_images_folder(root):
    (root / "siteB" / "images").rename(root / "siteB" / "Images")


SEGMENTATION_CASES = {
    "image without a mask": (
        _remove("siteB/masks/siteB_003.png"),
        "{root}/siteB/images/siteB_003.png: image without a mask (expected {root}/siteB/masks/siteB_003.<ext>)",
    ),
    "mask without an image": (
        _remove("siteB/images/siteB_003.png"),
        "{root}/siteB/masks/siteB_003.png: mask without an image (expected {root}/siteB/images/siteB_003.<ext>)",
    ),
    "mask value not in mask_values": (
        _odd_mask,
        "{root}/siteC/masks/siteC_002.png: mask value(s) 77 not in mask_values {0: 0, 128: 1, 255: 2}",
    ),
    "site without images": (_mkdirs("siteD/images", "siteD/masks"), "{root}/siteD/images: no images in site siteD"),
    "site without images folder": (
        _rename_images_folder,
        "{root}/siteB: site folder without an images/ folder (expected {root}/siteB/images/ and",
    ),
    "mixed channel counts": (
        _write_png("siteA/images/siteA_004.png", np.full((32, 32, 3), (200, 10, 10), np.uint8)),
        "site siteA: mixed channel counts: {root}/siteA/images/siteA_000.png is grey but "
        "{root}/siteA/images/siteA_004.png is colour",
    ),
    "truncated image": (
        _truncate("siteB/images/siteB_001.png"),
        "{root}/siteB/images/siteB_001.png: cannot read the image (",
    ),
    "truncated mask": (
        _truncate("siteB/masks/siteB_001.png"),
        "{root}/siteB/masks/siteB_001.png: cannot decode the mask (",
    ),
    "not an image": (
        lambda root: (root / "siteC/images/siteC_004.png").write_text("not a png"),
        "{root}/siteC/images/siteC_004.png: cannot read the image (",
    ),
    "unsupported file": (
        lambda root: (root / "siteC/images/notes.txt").write_text("x"),
        "{root}/siteC/images/notes.txt: not a supported file (expected .png, .jpg",
    ),
    "two files with one stem": (
        _write_png("siteA/images/siteA_001.jpg", np.zeros((32, 32), np.uint8)),
        "{root}/siteA/images/siteA_001.png: two files with the stem 'siteA_001' (siteA_001.jpg and siteA_001.png)",
    ),
    "image and mask sizes differ": (
        _write_png("siteB/masks/siteB_002.png", np.zeros((30, 32), np.uint8)),
        "{root}/siteB/images/siteB_002.png is 32x32 but its mask {root}/siteB/masks/siteB_002.png is 32x30",
    ),
    "differing image sizes": (
        lambda root: (
            _png(root / "siteC/images/siteC_005.png", np.zeros((40, 40, 3), np.uint8)),
            _png(root / "siteC/masks/siteC_005.png", np.zeros((40, 40), np.uint8)),
        ),
        "{root}/siteC/images/siteC_005.png: 40x40 differs from 32x32 of {root}/siteA/images/siteA_000.png; "
        "set image_size",
    ),
}


@pytest.mark.parametrize("case", list(SEGMENTATION_CASES))
def test_bad_segmentation_data_is_one_error_naming_the_file_and_writes_nothing(examples, tmp_path, case):
    damage, message = SEGMENTATION_CASES[case]
    root, options = _copy(examples["seg3"], tmp_path)
    damage(root)
    _assert_one_error_and_nothing_written(lambda: _preprocess(options, tmp_path), tmp_path, message)


def test_binary_masks_without_mask_values_are_refused_with_a_hint(examples, tmp_path):
    root, options = _copy(examples["seg2"], tmp_path)
    options = {key: value for key, value in options.items() if key not in ("mask_values", "classes")}
    text = _assert_one_error_and_nothing_written(
        lambda: _preprocess(options, tmp_path),
        tmp_path,
        "{root}/siteA/masks/siteA_000.png: mask value(s) 255 not in mask_values {0: 0, 1: 1}",
    )
    assert "e.g. {0: 0, 255: 1}" in text


def test_a_jpeg_mask_gets_a_hint(examples, tmp_path):
    root, options = _copy(examples["seg3"], tmp_path)
    mask = np.asarray(Image.open(root / "siteB/masks/siteB_000.png"))
    (root / "siteB/masks/siteB_000.png").unlink()
    Image.fromarray(mask).save(root / "siteB/masks/siteB_000.jpg", quality=60)
    text = _assert_one_error_and_nothing_written(
        lambda: _preprocess(options, tmp_path), tmp_path, "{root}/siteB/masks/siteB_000.jpg: mask value(s) "
    )
    assert text.endswith("JPEG compression changes mask values: save masks as PNG")


def test_a_missing_root_is_named(tmp_path):
    _assert_one_error_and_nothing_written(
        lambda: _preprocess({"root": str(tmp_path / "data")}, tmp_path),
        tmp_path,
        "{root}: the data root does not exist or is not a folder",
    )


def test_a_cut_short_nifti_is_named(examples, tmp_path):
    root, options = _copy(examples["nifti"], tmp_path)
    _truncate("siteB/images/vol02.nii.gz")(root)
    _assert_one_error_and_nothing_written(
        lambda: _preprocess(options, tmp_path), tmp_path, "{root}/siteB/images/vol02.nii.gz: damaged or cut-short file"
    )


def test_a_nifti_mask_of_another_shape_or_a_2d_mask_is_named(examples, tmp_path):
    import SimpleITK as sitk

    root, options = _copy(examples["nifti"], tmp_path)
    sitk.WriteImage(
        sitk.GetImageFromArray(np.zeros((4, 36, 32), np.uint8)), str(root / "siteA/masks/vol01.nii.gz"), True
    )
    _assert_one_error_and_nothing_written(
        lambda: _preprocess(options, tmp_path),
        tmp_path,
        "{root}/siteA/images/vol01.nii.gz has shape (5, 36, 32) (slices, H, W) but its mask {root}/siteA/masks/vol01.nii.gz has (4, 36, 32)",
    )
    (root / "siteA/masks/vol01.nii.gz").unlink()
    _png(root / "siteA/masks/vol01.png", np.zeros((36, 32), np.uint8))
    _assert_one_error_and_nothing_written(
        lambda: _preprocess(options, tmp_path),
        tmp_path,
        "{root}/siteA/masks/vol01.png: a image mask for the nifti image vol01.nii.gz",
    )


def _edit_labels(edit):
    def damage(root):
        table = pd.read_csv(root / "labels.csv", dtype=str, keep_default_na=False)
        edit(table).to_csv(root / "labels.csv", index=False)

    return damage


def _set(row, column, value):
    def edit(table):
        table.loc[row, column] = value
        return table

    return edit


CLASSIFICATION_CASES = {
    "label outside the classes": (
        _edit_labels(_set(2, "label", "malignent")),
        "{root}/labels.csv line 4: label 'malignent' is not one of the classes "
        "['benign', 'malignant', 'normal'] (did you mean 'malignant'?)",
    ),
    "label index out of range": (
        _edit_labels(_set(0, "label", "3")),
        "{root}/labels.csv line 2: label '3' is not one of the classes",
    ),
    "image that does not exist": (
        _edit_labels(_set(5, "image", "siteA/nope.png")),
        "{root}/labels.csv line 7: image siteA/nope.png does not exist: neither {root}/siteA/nope.png "
        "(the path from the data root, as labels.csv takes it) nor {root}/siteA/siteA/nope.png "
        "(from the site folder) is a file",
    ),
    "image outside the root": (
        _edit_labels(_set(5, "image", "../x.png")),
        "{root}/labels.csv line 7: image ../x.png is outside the data root",
    ),
    "image listed twice": (
        _edit_labels(_set(3, "image", "siteA/img_000.png")),
        "{root}/labels.csv line 5: image siteA/img_000.png is listed twice (lines 2 and 5)",
    ),
    "empty label": (_edit_labels(_set(1, "label", "")), "{root}/labels.csv line 3: empty label"),
    "misspelt column": (
        _edit_labels(lambda t: t.rename(columns={"group": "grup"})),
        "{root}/labels.csv: unknown column 'grup' (did you mean 'group'?)",
    ),
    "missing column": (
        _edit_labels(lambda t: t.drop(columns="label")),
        "{root}/labels.csv: missing column(s) ['label']",
    ),
    "no labels.csv": (lambda root: (root / "labels.csv").unlink(), "{root}/labels.csv does not exist"),
    "truncated image": (_truncate("siteB/img_003.png"), "{root}/siteB/img_003.png: cannot read the image ("),
    "mixed channel counts": (
        _write_png("siteC/img_004.png", np.zeros((32, 32), np.uint8)),
        "site siteC: mixed channel counts: {root}/siteC/img_004.png is grey but {root}/siteC/img_000.png is colour",
    ),
    "differing image sizes": (
        _write_png("siteB/img_002.png", np.zeros((32, 33, 3), np.uint8)),
        "{root}/siteB/img_002.png: 33x32 differs from 32x32 of {root}/siteA/img_000.png; set image_size",
    ),
}


@pytest.mark.parametrize("case", list(CLASSIFICATION_CASES))
def test_bad_classification_data_is_one_error_naming_the_file_and_writes_nothing(examples, tmp_path, case):
    damage, message = CLASSIFICATION_CASES[case]
    root, options = _copy(examples["classification"], tmp_path)
    damage(root)
    _assert_one_error_and_nothing_written(lambda: _preprocess(options, tmp_path), tmp_path, message)


def test_differing_sizes_are_fine_with_image_size(examples, tmp_path):
    root, options = _copy(examples["classification"], tmp_path)
    _png(root / "siteB" / "img_002.png", np.zeros((40, 33, 3), np.uint8))
    store, _ = _preprocess({**options, "image_size": 32}, tmp_path)
    assert open_client(store, "siteB").images.shape == (8, 32, 32, 3)


# --- bad splits ----------------------------------------------------------------------------------------


def _split_error(store: Path, options: dict, tmp_path: Path, message: str) -> str:
    out = tmp_path / "splits" / "split.csv"
    with pytest.raises(DataError) as err:
        F.split(store, out, "", options=options, log=lambda _: None)
    text = str(err.value)
    assert "\n" not in text and message in text, text
    assert not (tmp_path / "splits").exists()  # no split file, no temporary
    return text


def test_a_site_too_small_for_the_fractions_is_named(tmp_path):
    example = F.write_example(tmp_path / "data", counts=(2, 8, 10))
    store, _ = _preprocess(example["options"], tmp_path)
    _split_error(
        store,
        example["options"],
        tmp_path,
        "site siteA: 2 group(s) (2 images) are too few for fractions 0.6/0.2/0.2: train/val/test would get "
        "0/1/1 groups, each needs at least one (need 3 groups)",
    )


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda t: t.assign(image=t["image"].replace("siteA/images/siteA_003.png", "siteA/images/nope.png")),
            "my_split.csv line 5: image siteA/images/nope.png is not an image of site siteA in the data",
        ),
        (
            lambda t: t[t["image"] != "siteB/images/siteB_002.png"],
            "my_split.csv: 1 image(s) of site siteB are in no split, e.g. siteB/images/siteB_002.png",
        ),
        (
            lambda t: t.assign(site=t["site"].replace("siteC", "siteD")),
            "my_split.csv line 16: site 'siteD' is not in the data",
        ),
        (
            lambda t: t.assign(split=t["split"].replace("val", "valid")),
            "my_split.csv line 5: split 'valid' is not one of ['train', 'val', 'test'] (did you mean 'val'?)",
        ),
        (
            lambda t: t.assign(split=t["split"].where(t["site"] != "siteA", "train")),
            "my_split.csv: site siteA has train/val/test = 6/0/0 images",
        ),
        (
            lambda t: pd.concat([t, t.iloc[[0]]]),
            "my_split.csv line 26: image siteA/images/siteA_000.png of site siteA is listed twice (lines 2 and 26)",
        ),
        (lambda t: t.drop(columns="split"), "my_split.csv: missing column(s) ['split']"),
    ],
)
def test_a_bad_user_split_csv_is_named(examples, tmp_path, edit, message):
    example = examples["seg3"]
    store, _ = _preprocess(example["options"], tmp_path)
    rows = [
        {"site": site, "image": f"{site}/images/{stem}.png", "split": ("train", "train", "train", "val", "test")[k % 5]}
        for site in SITES
        for k, stem in enumerate(example["files"][site])
    ]
    edit(pd.DataFrame(rows)).to_csv(tmp_path / "my_split.csv", index=False)
    _split_error(store, {**example["options"], "split_csv": str(tmp_path / "my_split.csv")}, tmp_path, message)
    missing = {**example["options"], "split_csv": str(tmp_path / "none.csv")}
    _split_error(store, missing, tmp_path, f"{tmp_path / 'none.csv'}: split_csv does not exist")


def test_a_user_split_that_cuts_a_patient_is_kept_with_a_warning(examples, tmp_path):
    example = examples["classification"]
    store, _ = _preprocess(example["options"], tmp_path)
    rows = [
        {"site": site, "image": path, "split": ("train", "val", "test", "train", "train", "train")[k % 6]}
        for site in SITES
        for k, path in enumerate(example["files"][site])
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "cut.csv", index=False)
    logged = []
    table = F.split(
        store,
        tmp_path / "split.csv",
        "",
        options={**example["options"], "split_csv": str(tmp_path / "cut.csv")},
        log=logged.append,
    )
    assert table.groupby("group")["split"].nunique().max() == 2
    assert (
        "folders siteA: warning: 2 group(s) of cut.csv are in more than one split (e.g. siteA/patient00); kept as given"
        in logged
    )


def test_preprocessing_logs_one_line_per_site_and_records_the_options(examples, tmp_path):
    import json

    logged = []
    store = tmp_path / "nifti_store"
    F.preprocess({}, store, "", options={**examples["nifti"]["options"], "stack": 3}, log=logged.append)
    head = inspect_folders({**examples["nifti"]["options"], "stack": 3}).lines()
    assert logged[: len(head)] == head  # the log starts with what `fedmedbench check-data` prints
    del logged[: len(head)]
    assert logged[::3] == [
        f"folders {site}: {5 * n} images ({n} NIfTI volumes), 32x36; train/val/test come with the split"
        for site, n in zip(SITES, (3, 4, 5))
    ]
    assert logged[1::3] == [
        f"folders {site}: native slice size 36x32 (H x W) in all {n} volume(s)" for site, n in zip(SITES, (3, 4, 5))
    ]
    assert logged[2].startswith(
        "folders siteA: intensity: 3 int16 volume(s), each scaled from its own p0.5..p99.5 to 0..255 "
        "and clipped outside (low "
    )
    assert len(logged) == 9  # no warning: the example's slices are near square, alike in every site
    info = json.loads((store / "info.json").read_text())
    assert (info["family"], info["kind"], info["num_classes"], info["stack"], info["nifti_axis"]) == (
        "folders",
        "segmentation",
        3,
        3,
        2,
    )
    assert info["classes"] == ["background", "ring", "core"] and info["mask_values"] == {"0": 0, "1": 1, "2": 2}
    logged.clear()
    F.preprocess({}, tmp_path / "cls_store", "", options=examples["classification"]["options"], log=logged.append)
    del logged[: len(inspect_folders(examples["classification"]["options"]).lines())]
    assert (
        logged[0]
        == "folders siteA: 6 images (benign 2, malignant 2, normal 2), 32x32; train/val/test come with the split"
    )
