"""Prostate (SAML release, HarmoFL protocol): discovery, slicing, store, splits, synthetic twin.

The fixture is built here with SimpleITK in the real layout: six site folders,
real case ids, ``_Segmentation`` at BMC, {1,2} masks at RUNMC/BMC, volumes of
shape (6, 16, 16) with foreground in the first and last slices (which HarmoFL
never uses as centre slices) and an empty middle slice.
"""

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import SimpleITK as sitk

from fedmedbench.data import prostate as P
from fedmedbench.data.archive import safe_extract
from fedmedbench.data.store import (
    client_rng,
    list_clients,
    open_client,
    read_split_csv,
    split_rows,
    write_client,
    write_split_csv,
)

INDEX_DIR = Path(__file__).resolve().parents[1] / "resources" / "prostate_harmofl"

FIXTURE_CASES = {
    "BIDMC": ["Case00", "Case02"],
    "BMC": ["Case00", "Case01"],
    "HK": ["Case38"],
    "I2CVB": ["Case00"],
    "RUNMC": ["Case00", "Case01"],
    "UCL": ["Case01"],
}
# Slices with foreground per fixture pattern, and what HarmoFL keeps (1..D-2 only).
PATTERNS = [
    {"fg": [0, 1, 2, 4, 5], "kept": [1, 2, 4]},  # slice 3 empty
    {"fg": [0, 2, 3, 5], "kept": [2, 3]},  # slices 1 and 4 empty
]
EXPECTED_COUNTS = {"BIDMC": 5, "HK": 3, "I2CVB": 3, "ISBI": 5, "ISBI_1.5": 5, "UCL": 3}


def _fixture_volume(site: str, case_index: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([len(site), case_index])
    image = rng.normal(100.0, 20.0, size=(6, 16, 16)).astype(np.float32)
    image[2, 3, 3] = 5000.0  # an outlier far above the 99th percentile
    label = np.zeros((6, 16, 16), np.uint8)
    for s in PATTERNS[case_index]["fg"]:
        label[s, 4:12, 5:11] = 1
        if site in ("RUNMC", "BMC"):
            label[s, 6:9, 7:9] = 2
    return image, label


def _write_fixture(root: Path) -> dict:
    """Write the fixture release under root/<site>/; return the volumes by (client, case)."""
    volumes = {}
    for site, cases in FIXTURE_CASES.items():
        (root / site).mkdir(parents=True)
        seg = "_Segmentation" if site == "BMC" else "_segmentation"
        for k, case in enumerate(cases):
            image, label = _fixture_volume(site, k)
            sitk.WriteImage(sitk.GetImageFromArray(image), str(root / site / f"{case}.nii.gz"))
            sitk.WriteImage(sitk.GetImageFromArray(label), str(root / site / f"{case}{seg}.nii.gz"))
            volumes[(P.sites.RELEASE_TO_CLIENT[site], case)] = (image, label, PATTERNS[k]["kept"])
    return volumes


def _zip_folder(folder: Path, zip_path: Path, top: str | None) -> Path:
    with zipfile.ZipFile(zip_path, "w") as zf:
        for path in sorted(folder.rglob("*")):
            arc = path.relative_to(folder).as_posix()
            zf.write(path, f"{top}/{arc}" if top else arc)
    return zip_path


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    base = tmp_path_factory.mktemp("prostate")
    volumes = _write_fixture(base / "flat")
    return base, volumes


@pytest.fixture(scope="module")
def store(release):
    base, volumes = release
    zip_path = _zip_folder(base / "flat", base / "Processed_data_nii.zip", "Processed_data_nii")
    raw = safe_extract(zip_path, base / "raw_top")
    store_dir = base / "store"
    logs = []
    counts = P.raw.preprocess_harmofl(raw, store_dir, expect_real_counts=False, log=logs.append)
    return store_dir, counts, volumes, raw, logs


# ---------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("top", ["Processed_data_nii", None])
def test_release_root_with_and_without_top_folder(release, tmp_path, top):
    base, _ = release
    raw = safe_extract(_zip_folder(base / "flat", tmp_path / "p.zip", top), tmp_path / "raw")
    root = P.raw.find_release_root(raw)
    assert root == (raw / top if top else raw)
    counts = P.raw.preprocess_harmofl(raw, tmp_path / "store", expect_real_counts=False, log=lambda m: None)
    assert counts == EXPECTED_COUNTS


def test_release_root_error_lists_what_was_found(tmp_path):
    for name in ["BIDMC", "HK", "misc"]:
        (tmp_path / "Processed_data_nii" / name).mkdir(parents=True)
    with pytest.raises(P.sites.ProstateDataError) as err:
        P.raw.find_release_root(tmp_path)
    message = str(err.value)
    assert "RUNMC" in message and "misc" in message and "Processed_data_nii" in message


def test_list_cases_is_case_insensitive_and_sorted(tmp_path):
    site = tmp_path / "SITE"
    site.mkdir()
    for name in [
        "Case03.nii.gz",
        "Case03_SEGMENTATION.nii.gz",
        "Case01.nii.gz",
        "Case01_Segmentation.nii.gz",
        "._Case01.nii.gz",
        "notes.txt",
    ]:
        (site / name).write_bytes(b"")
    cases = P.raw.list_cases(site)
    assert [(c, i.name, s.name) for c, i, s in cases] == [
        ("Case01", "Case01.nii.gz", "Case01_Segmentation.nii.gz"),
        ("Case03", "Case03.nii.gz", "Case03_SEGMENTATION.nii.gz"),
    ]


def test_list_cases_reports_unpaired_files(tmp_path):
    site = tmp_path / "SITE"
    site.mkdir()
    (site / "Case00.nii.gz").write_bytes(b"")
    with pytest.raises(P.sites.ProstateDataError, match=r"Case00\.nii\.gz.*no segmentation"):
        P.raw.list_cases(site)
    (site / "Case00_segmentation.nii.gz").write_bytes(b"")
    (site / "Case07_segmentation.nii.gz").write_bytes(b"")
    with pytest.raises(P.sites.ProstateDataError, match=r"Case07_segmentation\.nii\.gz.*no image"):
        P.raw.list_cases(site)


# ---------------------------------------------------------------------------
# Slicing and normalisation
# ---------------------------------------------------------------------------


def test_counts_labels_and_meta(store):
    store_dir, counts, _, _, logs = store
    assert counts == EXPECTED_COUNTS
    assert list_clients(store_dir) == sorted(P.sites.HARMOFL_CLIENTS)
    assert len(logs) == 6
    for client in P.sites.HARMOFL_CLIENTS:
        data = open_client(store_dir, client)
        assert data.images.dtype == np.uint8 and data.images.shape == (counts[client], 16, 16, 3)
        assert data.labels.dtype == np.uint8 and data.labels.shape == (counts[client], 16, 16)
        assert set(np.unique(data.labels)) == {0, 1}  # 2 -> 1 merged at ISBI / ISBI_1.5
        assert {"id", "group", "source", "case", "slice"} <= set(data.meta.columns)
    meta = open_client(store_dir, "ISBI_1.5").meta
    assert list(meta["id"]) == [f"ISBI_1.5/Case00/s00{s}" for s in (1, 2, 4)] + [
        f"ISBI_1.5/Case01/s00{s}" for s in (2, 3)
    ]
    assert meta["group"].iloc[0] == "ISBI_1.5/Case00"
    assert meta["source"].iloc[0] == "Processed_data_nii/BMC/Case00.nii.gz"


def test_three_channel_stacking_matches_neighbours(store):
    store_dir, _, volumes, _, _ = store
    for client in ("BIDMC", "ISBI"):
        data = open_client(store_dir, client)
        for k, row in data.meta.iterrows():
            image, label, _ = volumes[(client, row["case"])]
            norm = P.raw.harmofl_normalize(image)
            i = int(row["slice"])
            expected = np.stack([norm[i - 1], norm[i], norm[i + 1]], axis=-1)
            np.testing.assert_array_equal(data.images[k], expected)
            np.testing.assert_array_equal(data.labels[k], (label[i] > 0).astype(np.uint8))


def test_harmofl_slices_edge_exclusion_and_merge():
    image, label = _fixture_volume("RUNMC", 0)
    assert label[0].any() and label[5].any() and label.max() == 2
    x, y, idx = P.raw.harmofl_slices(image, label)
    assert idx.tolist() == [1, 2, 4]
    assert x.shape == (3, 16, 16, 3) and y.max() == 1


def test_percentile_normalisation():
    vol = np.arange(4 * 10 * 10, dtype=np.float64).reshape(4, 10, 10) - 50.0
    vol[0, 0, 0] = 1e6
    out = P.raw.harmofl_normalize(vol)
    high = np.percentile(vol, 99)
    assert out.dtype == np.uint8 and out.max() == 255 and out.min() == 0
    assert (out[vol >= high] == 255).all()  # clipped at p99
    below = vol < high
    expected = ((vol[below] - vol.min()) / (high - vol.min()) * 255).astype(np.uint8)  # truncation, as HarmoFL
    np.testing.assert_array_equal(out[below], expected)
    assert not P.raw.harmofl_normalize(np.full((3, 4, 4), 7.0)).any()  # constant volume: zeros, no NaN


def test_resize_option(release, tmp_path):
    base, _ = release
    counts = P.raw.preprocess_harmofl(
        base / "flat", tmp_path / "store", expect_real_counts=False, size=8, log=lambda m: None
    )
    data = open_client(tmp_path / "store", "HK")
    assert data.images.shape == (counts["HK"], 8, 8, 3) and data.labels.shape == (counts["HK"], 8, 8)
    assert set(np.unique(data.labels)) <= {0, 1}


def test_real_count_mismatch_names_every_site_and_writes_nothing(release, tmp_path):
    base, _ = release
    with pytest.raises(P.sites.ProstateDataError) as err:
        P.raw.preprocess_harmofl(
            base / "flat", tmp_path / "store", expect_real_counts=True, log=lambda m: None, index_dir=INDEX_DIR
        )
    message = str(err.value)
    for client in P.sites.HARMOFL_CLIENTS:
        assert (
            f"{client}: {EXPECTED_COUNTS[client]} slices, HarmoFL has {P.sites.HARMOFL_SLICE_COUNTS[client]}" in message
        )
    assert "missing" in message  # the file lists differ from HarmoFL's -dir.npy too
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------


def _fake_store(store_dir: Path, counts: dict[str, int], slices_per_case: int = 20) -> None:
    for client, n in counts.items():
        meta = pd.DataFrame(
            {
                "id": [f"{client}/s{i:03d}" for i in range(n)],
                "group": [f"{client}/Case{i // slices_per_case:02d}" for i in range(n)],
                "source": "synthetic",
            }
        )
        write_client(store_dir, client, np.zeros((n, 1, 1, 3), np.uint8), np.zeros((n, 1, 1), np.uint8), meta)


def test_cut_points_equal_harmofl_arithmetic():
    for n in range(0, 3000):
        t = 0.8 * n * 0.8
        v = 0.8 * n - t
        assert P.splits.cut_points(n) == (int(t), int(t + v))


def test_harmofl_split_of_record(tmp_path):
    _fake_store(tmp_path / "store", P.sites.HARMOFL_SLICE_COUNTS)
    out = tmp_path / "splits" / "prostate.csv"
    P.splits.split_harmofl(tmp_path / "store", out, permutation="harmofl", index_dir=INDEX_DIR)
    split = read_split_csv(out)
    for client in P.sites.HARMOFL_CLIENTS:
        perm = np.load(INDEX_DIR / f"{client}-index.npy")
        sizes = tuple(len(split_rows(split, client, s)) for s in ("train", "val", "test"))
        assert sizes == P.sites.HARMOFL_SPLIT_COUNTS[client]
        train, val, _ = sizes
        np.testing.assert_array_equal(split_rows(split, client, "train"), perm[:train])
        np.testing.assert_array_equal(split_rows(split, client, "val"), perm[train : train + val])
        np.testing.assert_array_equal(split_rows(split, client, "test"), perm[train + val :])
    # ids and groups follow the rows
    first = split.iloc[0]
    assert first["client"] == "BIDMC" and first["id"] == f"BIDMC/s{first['row']:03d}"


def test_harmofl_permutation_refuses_other_data(store, tmp_path):
    store_dir = store[0]
    with pytest.raises(P.sites.ProstateDataError, match="permutation: seeded"):
        P.splits.split_harmofl(store_dir, tmp_path / "s.csv", permutation="harmofl", index_dir=INDEX_DIR)
    assert not (tmp_path / "s.csv").exists()


def test_seeded_split_is_deterministic_disjoint_and_keeps_cases_whole(tmp_path):
    counts = {c: 40 + 7 * k for k, c in enumerate(P.sites.HARMOFL_CLIENTS)}
    _fake_store(tmp_path / "store", counts, slices_per_case=4)
    a = P.splits.split_harmofl(tmp_path / "store", tmp_path / "a.csv", permutation="seeded", seed=3)
    P.splits.split_harmofl(tmp_path / "store", tmp_path / "b.csv", permutation="seeded", seed=3)
    c = P.splits.split_harmofl(tmp_path / "store", tmp_path / "c.csv", permutation="seeded", seed=4)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert not a.equals(c)
    split = read_split_csv(tmp_path / "a.csv")
    for client, n in counts.items():
        parts = [set(split_rows(split, client, s).tolist()) for s in ("train", "val", "test")]
        assert sum(len(p) for p in parts) == n and set().union(*parts) == set(range(n))
        cases = [set(split[(split.client == client) & (split.split == s)].group) for s in ("train", "val", "test")]
        assert not (cases[0] & cases[1] or cases[0] & cases[2] or cases[1] & cases[2])  # no case in two splits
        n_cases = -(-n // 4)
        train_end, val_end = P.splits.case_cut_points(n_cases, P.sites.HARMOFL_FRACTIONS)
        assert [len(c) for c in cases] == [train_end, val_end - train_end, n_cases - val_end]
    # different clients get different permutations even with equal sizes
    assert not np.array_equal(client_rng(0, "HK").permutation(50), client_rng(0, "UCL").permutation(50))


def test_split_csv_validation(tmp_path):
    good = pd.DataFrame(
        {
            "client": ["B", "A", "A", "A"],
            "split": ["train", "test", "train", "val"],
            "row": [0, 2, 1, 0],
            "id": ["b0", "a2", "a1", "a0"],
            "group": ["g", "g", "g", "g"],
        }
    )
    path = write_split_csv(good, tmp_path / "ok.csv")
    back = read_split_csv(path)
    assert list(back["client"]) == ["A", "A", "A", "B"] and list(back["split"]) == ["train", "val", "test", "train"]
    bad = tmp_path / "bad.csv"
    bad.write_text("client,split,row,id,group\nA,training,0,a,g\n")
    with pytest.raises(ValueError, match=r"bad\.csv.*training"):
        read_split_csv(bad)
    bad.write_text("client,split,row,id\nA,train,0,a\n")
    with pytest.raises(ValueError, match=r"bad\.csv.*group"):
        read_split_csv(bad)
    bad.write_text("client,split,row,id,group\nA,train,0,a,g\nA,test,0,a,g\n")
    with pytest.raises(ValueError, match="more than once"):
        read_split_csv(bad)


def test_write_client_validates(tmp_path):
    meta = pd.DataFrame({"id": ["a", "b"], "group": ["g", "g"], "source": ["x", "y"]})
    images = np.zeros((2, 4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="uint8"):
        write_client(tmp_path, "A", images.astype(np.float32), np.zeros((2, 4, 4), np.uint8), meta)
    with pytest.raises(ValueError, match="meta has 1 rows"):
        write_client(tmp_path, "A", images, np.zeros((2, 4, 4), np.uint8), meta.iloc[:1])
    with pytest.raises(ValueError, match="int64"):
        write_client(tmp_path, "A", images, np.zeros(2, np.int32), meta)
    write_client(tmp_path, "A", images, np.array([0, 1], np.int64), meta)
    assert open_client(tmp_path, "A").labels.tolist() == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A"]  # no temporary folders left


# ---------------------------------------------------------------------------
# Synthetic twin
# ---------------------------------------------------------------------------


def test_synthetic_release_round_trip(tmp_path):
    zip_path = tmp_path / "Processed_data_nii.zip"
    info = P.synthetic.write_synthetic_release(zip_path, seed=0)
    assert [p.name for p in tmp_path.iterdir()] == ["Processed_data_nii.zip"]
    assert info["BMC"]["label_values"] == [0, 1, 2] and info["RUNMC"]["label_values"] == [0, 1, 2]
    assert info["HK"]["label_values"] == [0, 1]
    raw = safe_extract(zip_path, tmp_path / "raw")
    root = P.raw.find_release_root(raw)
    assert root.name == "Processed_data_nii"
    sites = P.raw.client_site_dirs(root)
    assert [c for c, _, _ in P.raw.list_cases(sites["UCL"])] == ["Case01", "Case26", "Case27"]
    assert [s.name for _, _, s in P.raw.list_cases(sites["ISBI_1.5"])][0] == "Case00_Segmentation.nii.gz"
    counts = P.raw.preprocess_harmofl(raw, tmp_path / "store", expect_real_counts=False, log=lambda m: None)
    assert counts == {site["client"]: site["slices"] for site in info.values()}
    means = []
    for client in P.sites.HARMOFL_CLIENTS:
        data = open_client(tmp_path / "store", client)
        assert set(np.unique(data.labels)) == {0, 1}
        fg = data.images[..., 1][data.labels == 1].mean()
        bg = data.images[..., 1][data.labels == 0].mean()
        assert fg > bg + 20  # the gland is visible, so there is something to learn
        means.append(float(data.images.mean()))
    gaps = np.diff(np.sort(means))
    assert gaps.min() > 3, f"site means too close: {means}"
    P.splits.split_harmofl(tmp_path / "store", tmp_path / "split.csv", permutation="seeded")


def test_synthetic_release_is_deterministic(tmp_path):
    def first_volume(name, seed):
        zip_path = P.synthetic.write_synthetic_release(
            tmp_path / name, seed=seed, cases_per_site=1, depth=6, size=16, top_folder=False
        )
        raw = safe_extract(tmp_path / name, tmp_path / f"{name}.raw")
        return P.raw.read_volume(raw / "HK" / "Case38.nii.gz"), zip_path

    a, _ = first_volume("a.zip", 1)
    b, _ = first_volume("b.zip", 1)
    c, _ = first_volume("c.zip", 2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # The archive itself is byte-identical: members carry a fixed date, not the time of writing.
    import zipfile

    assert {m.date_time for m in zipfile.ZipFile(tmp_path / "a.zip").infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


# ---------------------------------------------------------------------------
# Damaged volumes: one line naming the file, nothing half-written
# ---------------------------------------------------------------------------
def test_a_cut_short_volume_stops_preprocessing_naming_the_file(release, tmp_path):
    """SimpleITK reads a truncated .nii.gz as zeros; preprocessing must refuse it, naming the file."""
    import gzip
    import shutil

    base, _ = release
    shutil.copytree(base / "flat", tmp_path / "flat")
    victim = tmp_path / "flat" / "HK" / f"{FIXTURE_CASES['HK'][0]}.nii.gz"
    data = victim.read_bytes()
    assert sitk.GetArrayFromImage(sitk.ReadImage(str(victim))).any()
    victim.write_bytes(data[: len(data) * 2 // 3])  # cut inside the gzip stream
    with pytest.raises(P.sites.ProstateDataError, match=rf"HK/{FIXTURE_CASES['HK'][0]}\.nii\.gz: damaged or cut-short"):
        P.raw.preprocess_harmofl(tmp_path / "flat", tmp_path / "store", expect_real_counts=False, log=lambda m: None)
    assert not (tmp_path / "store").exists()
    # A complete gzip stream whose NIfTI payload is shorter than its header says.
    victim.write_bytes(gzip.compress(gzip.decompress(data)[:-64]))
    with pytest.raises(
        P.sites.ProstateDataError, match=r"cut short: \d+ bytes of image data where the header promises \d+"
    ):
        P.raw.read_volume(victim)
