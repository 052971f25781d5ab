"""Prostate (SAML release), Fed-LWR protocol: Site1..6 mapping, slice selection and normalisation,
the 3-channel input, the case-level split (no case in two splits) and the synthetic twin.

Fixture: all six release folders, 3-4 cases each, volumes (5, 12, 12) with foreground in the first
and last slices (kept by Fed-LWR, unlike HarmoFL), an empty slice, {1, 2} masks at RUNMC/BMC and
``_Segmentation`` at BMC.
"""

import numpy as np
import pandas as pd
import pytest
import SimpleITK as sitk

from fedmedbench.data import prostate as P
from fedmedbench.data.archive import safe_extract
from fedmedbench.data.store import open_client, read_split_csv, split_rows, write_client

CASES = {"BIDMC": 3, "BMC": 4, "HK": 3, "I2CVB": 3, "RUNMC": 4, "UCL": 3}
FG_SLICES = [0, 1, 3, 4]  # slice 2 empty; 0 and 4 are the volume's ends


def _volume(site: str, k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([len(site), k])
    image = rng.uniform(0, 400, size=(5, 12, 12)).astype(np.float32)
    image[1, 0, 0] = 1e5  # outlier above the slice's 99th percentile
    label = np.zeros((5, 12, 12), np.uint8)
    for s in FG_SLICES:
        label[s, 3:9, 4:8] = 1
        if site in ("RUNMC", "BMC"):
            label[s, 5:7, 5:7] = 2
    return image, label


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("pmr") / "Processed_data_nii"
    volumes = {}
    for site, n in CASES.items():
        (root / site).mkdir(parents=True)
        seg = "_Segmentation" if site == "BMC" else "_segmentation"
        for k, case in enumerate(P.sites.RELEASE_CASES[site][:n]):
            image, label = _volume(site, k)
            sitk.WriteImage(sitk.GetImageFromArray(image), str(root / site / f"{case}.nii.gz"))
            sitk.WriteImage(sitk.GetImageFromArray(label), str(root / site / f"{case}{seg}.nii.gz"))
            volumes[(site, case)] = (image, label)
    return root.parent, volumes


@pytest.fixture(scope="module")
def store(release, tmp_path_factory):
    raw, volumes = release
    out = tmp_path_factory.mktemp("pmr_store")
    counts = P.preprocess({P.download.DOWNLOAD.filename: raw}, out / "rep", "fedlwr", size=12, log=lambda m: None)
    P.preprocess({P.download.DOWNLOAD.filename: raw}, out / "stack", "fedlwr_stack", size=12, log=lambda m: None)
    return out, counts, volumes


def test_sites_sorted_alphabetically():
    assert P.PROTOCOLS["fedlwr"] == [f"Site{i}" for i in range(1, 7)]
    assert P.sites.FEDLWR_CLIENT_TO_RELEASE == {
        "Site1": "BIDMC",
        "Site2": "BMC",
        "Site3": "HK",
        "Site4": "I2CVB",
        "Site5": "RUNMC",
        "Site6": "UCL",
    }
    assert P.PROTOCOLS["harmofl"] == P.sites.HARMOFL_CLIENTS  # the HarmoFL protocol is unchanged


def test_harmofl_named_folders_map_to_the_same_sites(tmp_path):
    for name in P.sites.HARMOFL_CLIENTS:
        (tmp_path / name).mkdir()
    dirs = P.raw.fedlwr_site_dirs(tmp_path)
    assert dirs["Site2"].name == "ISBI_1.5" and dirs["Site5"].name == "ISBI" and dirs["Site1"].name == "BIDMC"


def test_slices_labels_and_meta(store):
    out, counts, volumes = store
    assert counts == {f"Site{i + 1}": n * len(FG_SLICES) for i, n in enumerate(CASES.values())}
    meta = open_client(out / "rep", "Site2").meta
    assert list(meta["slice"][:4]) == FG_SLICES  # edges kept, empty slice dropped
    assert meta["id"].iloc[0] == "Site2/Case00/s000" and meta["group"].iloc[0] == "Site2/Case00"
    assert set(meta["site"]) == {"BMC"} and meta["label_source"].iloc[0].endswith("Case00_Segmentation.nii.gz")
    for client in P.sites.FEDLWR_CLIENTS:
        data = open_client(out / "rep", client)
        assert data.images.shape == (counts[client], 12, 12, 3) and set(np.unique(data.labels)) == {0, 1}


def test_replicated_and_stacked_channels(store):
    out, _, volumes = store
    rep, stack = open_client(out / "rep", "Site5"), open_client(out / "stack", "Site5")
    for k, row in rep.meta.iterrows():
        image, label = volumes[("RUNMC", row["case"])]
        i = int(row["slice"])
        norm = P.raw.fedlwr_normalize_slice(image[i])
        for c in range(3):
            np.testing.assert_array_equal(rep.images[k][..., c], norm)
        np.testing.assert_array_equal(rep.labels[k], (label[i] > 0).astype(np.uint8))  # zones 1, 2 -> 1
        neighbours = [max(i - 1, 0), i, min(i + 1, 4)]  # clamped at the volume's ends
        for c, j in enumerate(neighbours):
            np.testing.assert_array_equal(stack.images[k][..., c], P.raw.fedlwr_normalize_slice(image[j]))
        np.testing.assert_array_equal(stack.labels[k], rep.labels[k])


def test_slice_normalisation():
    x = np.arange(100, dtype=np.float64).reshape(10, 10) + 20.0
    x[0, 0] = 1e6
    out = P.raw.fedlwr_normalize_slice(x)
    high = np.percentile(x, 99)
    assert out.dtype == np.uint8 and out.min() == 0 and out.max() == 255
    assert (out[x >= high] == 255).all()
    low = x.min()  # 21: the outlier replaced the 20
    expected = np.round((np.clip(x, low, high) - low) / (high - low) * 255)
    np.testing.assert_array_equal(out, expected.astype(np.uint8))
    # slice minimum 0: the same map as Fed-LWR's mr_norm (x - min) / p99, times 255
    y = np.abs(np.random.default_rng(0).normal(100, 50, (16, 16)))
    y[0, 0] = 0.0
    p99 = np.percentile(y, 99)
    np.testing.assert_array_equal(
        P.raw.fedlwr_normalize_slice(y), np.round(np.clip(y, 0, p99) / p99 * 255).astype(np.uint8)
    )
    assert not P.raw.fedlwr_normalize_slice(np.full((4, 4), 3.0)).any()


def test_case_cut_points():
    assert [P.splits.case_cut_points(n) for n in (12, 30, 19, 13, 3)] == [(8, 10), (18, 24), (11, 15), (7, 10), (1, 2)]
    with pytest.raises(P.sites.ProstateDataError, match="too few"):
        P.splits.case_cut_points(2)


def test_no_case_in_two_splits(store, tmp_path):
    out, counts, _ = store
    P.split(out / "rep", tmp_path / "a.csv", "fedlwr")  # default = seeded, seed 0
    P.split(out / "rep", tmp_path / "b.csv", "fedlwr", permutation="seeded", seed=0)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    split = read_split_csv(tmp_path / "a.csv")
    for client in P.sites.FEDLWR_CLIENTS:
        sub = split[split["client"] == client]
        groups = [set(sub.loc[sub["split"] == s, "group"]) for s in ("train", "val", "test")]
        assert all(groups) and not (groups[0] & groups[1] or groups[0] & groups[2] or groups[1] & groups[2])
        assert sorted(sub["row"]) == list(range(counts[client]))
        n = len(set(sub["group"]))
        train_end, val_end = P.splits.case_cut_points(n)
        assert [len(g) for g in groups] == [train_end, val_end - train_end, n - val_end]


def test_split_on_real_case_counts(tmp_path):
    """Sizes from the real release (12/30/12/19/30/13 cases): seeds differ, cases never straddle splits."""
    for i, cases in enumerate(P.sites.RELEASE_CASES.values()):
        rows = [(case, s) for case in cases for s in range(3)]
        meta = pd.DataFrame(
            {
                "id": [f"Site{i + 1}/{c}/s{s:03d}" for c, s in rows],
                "group": [f"Site{i + 1}/{c}" for c, _ in rows],
                "source": "x",
            }
        )
        n = len(rows)
        write_client(
            tmp_path / "store", f"Site{i + 1}", np.zeros((n, 1, 1, 3), np.uint8), np.zeros((n, 1, 1), np.uint8), meta
        )
    splits = [P.split(tmp_path / "store", tmp_path / f"s{seed}.csv", "fedlwr", seed=seed) for seed in (0, 1)]
    assert not splits[0].equals(splits[1])
    for table in splits:
        case_split = table.groupby("group")["split"].nunique()
        assert (case_split == 1).all()
        per_site = table.groupby(["client", "split"])["group"].nunique().unstack()[["train", "val", "test"]]
        assert per_site.loc["Site2"].tolist() == [18, 6, 6] and per_site.loc["Site1"].tolist() == [8, 2, 2]
        assert per_site.loc["Site4"].tolist() == [11, 4, 4] and per_site.loc["Site6"].tolist() == [7, 3, 3]
    P.split(tmp_path / "store", tmp_path / "sorted.csv", "fedlwr", permutation="sorted")
    sorted_split = read_split_csv(tmp_path / "sorted.csv")
    first = (
        open_client(tmp_path / "store", "Site1").meta["group"].to_numpy()[split_rows(sorted_split, "Site1", "train")]
    )
    assert sorted(set(first)) == [f"Site1/{c}" for c in P.sites.RELEASE_CASES["BIDMC"][:8]]


def test_real_count_mismatch_lists_every_site(release, tmp_path):
    raw, _ = release
    with pytest.raises(P.sites.ProstateDataError) as err:
        P.preprocess(
            {P.download.DOWNLOAD.filename: raw},
            tmp_path / "store",
            "fedlwr",
            expect_real_counts=True,
            size=12,
            log=lambda m: None,
        )
    message = str(err.value)
    for site, release_name in P.sites.FEDLWR_CLIENT_TO_RELEASE.items():
        harmofl = P.sites.RELEASE_TO_CLIENT[release_name]
        assert (
            f"{site} ({release_name}): {2 * CASES[release_name]} foreground slices inside 1..D-2, HarmoFL has "
            f"{P.sites.HARMOFL_SLICE_COUNTS[harmofl]}" in message
        )
    assert not (tmp_path / "store").exists()


def test_synthetic_round_trip(tmp_path):
    info = P.write_synthetic(tmp_path / "raw", seed=0, cases_per_site=3, depth=8, size=24)
    raw = {P.download.DOWNLOAD.filename: safe_extract(tmp_path / "raw" / P.download.DOWNLOAD.filename, tmp_path / "ex")}
    counts = P.preprocess(raw, tmp_path / "store", "fedlwr", size=16, log=lambda m: None)
    assert set(counts) == set(P.sites.FEDLWR_CLIENTS)
    for client, release_name in P.sites.FEDLWR_CLIENT_TO_RELEASE.items():
        assert counts[client] >= info[release_name]["slices"]  # edge slices are kept too
        data = open_client(tmp_path / "store", client)
        assert data.images.shape[1:] == (16, 16, 3)
        fg = data.images[..., 0][data.labels == 1].mean()
        assert fg > data.images[..., 0][data.labels == 0].mean() + 10  # the gland is visible
    P.split(tmp_path / "store", tmp_path / "split.csv", "fedlwr")
    split = read_split_csv(tmp_path / "split.csv")
    assert split.groupby(["client", "split"])["group"].nunique().eq(1).all()  # 3 cases: 1/1/1


def test_unknown_protocol():
    with pytest.raises(ValueError, match="unknown protocol"):
        P.split("x", "y", "fedlwr_zscore")


def test_a_split_error_names_the_client(tmp_path):
    """Too few cases: the message names the client ("2 case(s) are too few" alone would not)."""
    for client in P.sites.FEDLWR_CLIENTS:
        n = 2 if client == "Site4" else 6
        meta = pd.DataFrame(
            {
                "id": [f"{client}/s{i}" for i in range(n)],
                "group": [f"{client}/Case{i:02d}" for i in range(n)],
                "source": "x",
            }
        )
        write_client(tmp_path / "store", client, np.zeros((n, 1, 1, 3), np.uint8), np.zeros((n, 1, 1), np.uint8), meta)
    with pytest.raises(P.sites.ProstateDataError, match=r"client Site4: 2 case\(s\) are too few"):
        P.splits.split_fedlwr(tmp_path / "store", tmp_path / "split.csv")
    assert not (tmp_path / "split.csv").exists()


def test_a_missing_site_is_named(tmp_path):
    """A layout error names the missing site, not only what was expected and found."""
    for site in P.sites.RELEASE_SITES:
        if site != "HK":
            (tmp_path / "release" / site).mkdir(parents=True)
    with pytest.raises(P.sites.ProstateDataError, match=r"site folder\(s\) HK missing"):
        P.raw.client_site_dirs(tmp_path / "release")
