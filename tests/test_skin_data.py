"""Dermoscopy (PRR-FL): client selection on the real HAM10000 metadata, PRR-FL's split of record,
image preprocessing, manual-download messages and the synthetic twin."""

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedmedbench.data import skin as S
from fedmedbench.data.archive import safe_extract
from fedmedbench.data.download import MANUAL, DownloadError, fetch_spec
from fedmedbench.data.store import open_client, read_split_csv, split_rows, write_client

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
HAM_META = RESOURCES / "ham10000" / "HAM10000_metadata.csv"
PRRFL_DIR = RESOURCES / "skin_prrfl"
TABLE1 = RESOURCES / "paper_tables" / "prrfl_table1_dataset.csv"


@pytest.fixture(scope="module")
def real_meta():
    return S.raw.read_ham_metadata(HAM_META)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    base = tmp_path_factory.mktemp("skin")
    info = S.write_synthetic(base / "raw", seed=0)
    raw = {
        spec.filename: (
            safe_extract(base / "raw" / spec.filename, base / "ex" / spec.filename)
            if spec.filename.endswith(".zip")
            else base / "raw" / spec.filename
        )
        for spec in S.DOWNLOADS
    }
    logs = []
    counts = S.preprocess(raw, base / "store", "prrfl", size=32, log=logs.append)
    return base, info, raw, counts, logs


# ---------------------------------------------------------------------------
# Real metadata and PRR-FL's CSVs
# ---------------------------------------------------------------------------


def test_real_metadata_gives_prrfl_clients_and_ood(real_meta):
    assert len(real_meta) == 10015
    clients = S.raw.select_ham(real_meta)
    assert {c: len(df) for c, df in clients.items()} == {"A": 2987, "B": 3868, "C": 1635, "OOD": 427}
    for client, df in clients.items():
        assert S.raw.class_counts(df["label"]) == S.sites.EXPECTED_CLASS_COUNTS[client]
        assert set(df["dx"]) <= set(S.sites.CLASSES)
        assert list(df["image_id"]) == sorted(df["image_id"])
    assert S.sites.EXPECTED_CLASS_COUNTS["OOD"] == (350, 10, 67)
    # PRR-FL Table 1 (the paper's numbers), class by class
    table = pd.read_csv(TABLE1)
    names = {"Nevus": 0, "Benign Keratosis": 1, "Melanoma": 2}
    assert len(table) == 16
    for row in table.to_dict("records"):
        expected = S.sites.EXPECTED_CLASS_COUNTS[row["client"]]
        assert (sum(expected) if row["class"] == "Total" else expected[names[row["class"]]]) == row["count"]


def test_real_membership_equals_prrfl_csvs(real_meta):
    clients = S.raw.select_ham(real_meta)
    prrfl = S.splits.read_prrfl_split(PRRFL_DIR)
    for client in ("A", "B", "C"):
        assert set(clients[client]["image_id"]) == set(prrfl.loc[prrfl["client"] == client, "image_id"])
        merged = clients[client].merge(prrfl[prrfl["client"] == client], on="image_id", suffixes=("", "_prrfl"))
        assert (merged["label"] == merged["label_prrfl"]).all()
    ids = {c: clients[c]["image_id"] for c in ("A", "B", "C")}
    ids["D"] = prrfl.loc[prrfl["client"] == "D", "image_id"]
    assert S.splits.check_prrfl_membership(ids, PRRFL_DIR) == []
    # one image too many and one missing are both reported
    ids["A"] = list(ids["A"][1:]) + ["ISIC_9999999"]
    problems = S.splits.check_prrfl_membership(ids, PRRFL_DIR)
    assert len(problems) == 2 and all("client A" in p for p in problems)
    sizes = prrfl.groupby(["client", "split"]).size()
    for client, (tr, va, te) in S.sites.PRRFL_SPLIT_COUNTS.items():
        assert (sizes[client, "train"], sizes[client, "val"], sizes[client, "test"]) == (tr, va, te)
    d = prrfl[prrfl["client"] == "D"]
    assert S.raw.class_counts(d["label"]) == S.sites.EXPECTED_CLASS_COUNTS["D"]
    # no lesion of the OOD cohort is in a training client
    lesions = {c: set(df["lesion_id"]) for c, df in clients.items()}
    assert not lesions["OOD"] & (lesions["A"] | lesions["B"] | lesions["C"])


def _real_shaped_store(store_dir: Path, real_meta) -> None:
    """A store with the real ids and labels (1x1 images): what preprocessing writes from the real data."""
    clients = S.raw.select_ham(real_meta)
    prrfl = S.splits.read_prrfl_split(PRRFL_DIR)
    d = prrfl[prrfl["client"] == "D"].sort_values("image_id")
    tables = {
        **clients,
        "D": pd.DataFrame({"image_id": d["image_id"], "label": d["label"], "lesion_id": d["image_id"]}),
    }
    for client, df in tables.items():
        n = len(df)
        meta = pd.DataFrame({"id": df["image_id"].to_numpy(), "group": df["lesion_id"].to_numpy(), "source": "x"})
        write_client(store_dir, client, np.zeros((n, 1, 1, 3), np.uint8), df["label"].to_numpy(np.int64), meta)


def test_prrfl_split_of_record(tmp_path, real_meta):
    _real_shaped_store(tmp_path / "store", real_meta)
    S.split(tmp_path / "store", tmp_path / "split.csv", "prrfl")  # default = PRR-FL's CSVs
    split = read_split_csv(tmp_path / "split.csv")
    prrfl = S.splits.read_prrfl_split(PRRFL_DIR)
    for client in S.sites.PRRFL_CLIENTS:
        meta = open_client(tmp_path / "store", client).meta
        for part in ("train", "val", "test"):
            rows = split_rows(split, client, part)
            listed = prrfl.loc[(prrfl["client"] == client) & (prrfl["split"] == part), "image_id"]
            assert list(meta["id"].to_numpy()[rows]) == list(listed)  # same images, CSV order
    ood = split[split["client"] == "OOD"]
    assert len(ood) == 427 and set(ood["split"]) == {"test"}
    # A and C have lesions in train and test (PRR-FL splits by image); the group column shows it
    a = split[split["client"] == "A"]
    assert len(set(a.loc[a["split"] == "train", "group"]) & set(a.loc[a["split"] == "test", "group"])) == 384


def test_prrfl_split_refuses_a_wrong_label(tmp_path, real_meta):
    _real_shaped_store(tmp_path / "store", real_meta)
    folder = tmp_path / "store" / "B"
    labels = np.load(folder / "labels.npy")
    labels[0] = (labels[0] + 1) % 3
    np.save(folder / "labels.npy", labels)
    with pytest.raises(S.sites.SkinDataError, match="client B: 1 label"):
        S.split(tmp_path / "store", tmp_path / "split.csv", "prrfl")
    assert not (tmp_path / "split.csv").exists()


def test_real_checks_run_on_the_metadata_before_images(tmp_path):
    """Real metadata + PRR-FL's client-D ids pass the count/membership checks; then missing images stop it."""
    prrfl = S.splits.read_prrfl_split(PRRFL_DIR)
    d = prrfl[prrfl["client"] == "D"]
    gt = pd.DataFrame(
        {
            "image_id": d["image_id"],
            "melanoma": (d["label"] == 2).map({True: "1.0", False: "0.0"}),
            "seborrheic_keratosis": (d["label"] == 1).map({True: "1.0", False: "0.0"}),
        }
    )
    gt.to_csv(tmp_path / S.download.ISIC_GT, index=False)
    raw = {S.download.HAM_METADATA: HAM_META, S.download.ISIC_GT: tmp_path / S.download.ISIC_GT}
    for name in (S.download.HAM_PART1, S.download.HAM_PART2, S.download.ISIC_IMAGES):
        (tmp_path / name).mkdir()
        raw[name] = tmp_path / name
    with pytest.raises(S.sites.SkinDataError, match=r"8917 HAM10000 image\(s\) listed in the metadata are not in"):
        S.preprocess(raw, tmp_path / "store", "prrfl", expect_real_counts=True, log=lambda m: None)
    assert not (tmp_path / "store").exists()


# ---------------------------------------------------------------------------
# Parsing details
# ---------------------------------------------------------------------------


def test_metadata_formats_and_errors(tmp_path, real_meta):
    tab = tmp_path / "HAM10000_metadata.tab"
    real_meta.head(20).to_csv(tab, sep="\t", index=False)
    pd.testing.assert_frame_equal(S.raw.read_ham_metadata(tab), real_meta.head(20))
    kaggle = tmp_path / "kaggle.csv"
    real_meta.drop(columns="dataset").head(5).to_csv(kaggle, index=False)
    with pytest.raises(S.sites.SkinDataError, match=r"kaggle\.csv.*'dataset'.*Dataverse"):
        S.raw.read_ham_metadata(kaggle)
    jpg = tmp_path / "jpg.csv"
    real_meta.head(5).assign(image_id=lambda d: d["image_id"] + ".jpg").to_csv(jpg, index=False)
    with pytest.raises(S.sites.SkinDataError, match=r"jpg\.csv.*ISIC_<7 digits>"):
        S.raw.read_ham_metadata(jpg)
    with pytest.raises(S.sites.SkinDataError, match="does not exist"):
        S.raw.read_ham_metadata(tmp_path / "nope.csv")


def test_isic_ground_truth_label_rule(tmp_path):
    path = tmp_path / "gt.csv"
    path.write_text(
        "image_id,melanoma,seborrheic_keratosis\nISIC_0000002,0.0,1.0\nISIC_0000000,0.0,0.0\nISIC_0000001,1.0,0.0\n"
    )
    gt = S.raw.read_isic2017_ground_truth(path)
    assert list(gt["image_id"]) == ["ISIC_0000000", "ISIC_0000001", "ISIC_0000002"]
    assert list(gt["label"]) == [0, 2, 1]
    path.write_text("image_id,melanoma,seborrheic_keratosis\nISIC_0000000,0.5,0.0\n")
    with pytest.raises(S.sites.SkinDataError, match=r"gt\.csv.*'melanoma'"):
        S.raw.read_isic2017_ground_truth(path)


def test_centre_crop_and_resize(tmp_path):
    array = np.zeros((45, 60, 3), np.uint8)
    array[..., 2] = 200
    array[:, :7] = (255, 0, 0)  # cut away by the centre square (columns 7..51 kept)
    array[:, 52:] = (255, 0, 0)
    path = tmp_path / "lossless.png"  # JPEG's chroma subsampling would blur the borders
    Image.fromarray(array).save(path)
    out, shape = S.raw.load_square(path, 16)
    assert shape == (60, 45) and out.shape == (16, 16, 3) and out.dtype == np.uint8
    assert (out == (0, 0, 200)).all()  # nothing of the cut-away columns leaks in
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(S.sites.SkinDataError, match=r"bad\.jpg"):
        S.raw.load_square(tmp_path / "bad.jpg", 16)


def test_find_images_ignores_junk_and_refuses_duplicates(tmp_path):
    for rel in [
        "a/ISIC_0000001.jpg",
        "a/ISIC_0000001_superpixels.png",
        "a/meta.csv",
        "__MACOSX/ISIC_0000002.jpg",
        "a/._ISIC_0000003.jpg",
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    found = S.raw.find_images({"x.zip": tmp_path})
    assert list(found) == ["ISIC_0000001"] and found["ISIC_0000001"][0] == "x.zip"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "ISIC_0000001.jpg").write_bytes(b"")
    with pytest.raises(S.sites.SkinDataError, match="found twice"):
        S.raw.find_images({"x.zip": tmp_path})


def test_manual_downloads_say_what_to_do(tmp_path):
    manual = [spec for spec in S.DOWNLOADS if spec.url == MANUAL]
    assert {s.filename for s in manual} == {S.download.HAM_PART1, S.download.HAM_PART2, S.download.HAM_METADATA}
    for spec in S.DOWNLOADS:
        assert f"data.skin.files.{spec.filename}.archive" in spec.manual_step
    for spec in manual:
        with pytest.raises(DownloadError) as err:
            fetch_spec(spec, tmp_path / spec.filename, log=lambda m: None)
        message = str(err.value)
        assert spec.filename in message and f"data.skin.files.{spec.filename}.archive" in message
        assert "10.7910/DVN/DBW86T" in message
    assert not list(tmp_path.iterdir())
    # the resources copy of the metadata is the pinned file
    meta_spec = next(s for s in S.DOWNLOADS if s.filename == S.download.HAM_METADATA)
    fetch_spec(meta_spec, tmp_path / S.download.HAM_METADATA, source=str(HAM_META), log=lambda m: None)
    assert (tmp_path / S.download.HAM_METADATA).read_bytes() == HAM_META.read_bytes()


# ---------------------------------------------------------------------------
# Synthetic twin
# ---------------------------------------------------------------------------


def test_synthetic_raw_files_have_real_names_and_formats(synthetic):
    base, info, raw, _, _ = synthetic
    assert sorted(p.name for p in (base / "raw").iterdir()) == sorted(s.filename for s in S.DOWNLOADS)
    meta = pd.read_csv(base / "raw" / S.download.HAM_METADATA, dtype=str, keep_default_na=False)
    assert list(meta.columns) == list(S.raw.HAM_COLUMNS)
    assert set(meta["dataset"]) == {"vidir_modern", "vidir_molemax", "rosendahl", "vienna_dias"}
    assert {"bcc", "df", "akiec", "vasc"} & set(meta["dx"]) and (meta["age"] == "").any()
    assert meta["lesion_id"].duplicated().any()
    with zipfile.ZipFile(base / "raw" / S.download.ISIC_IMAGES) as zf:
        names = zf.namelist()
    assert "ISIC-2017_Training_Data/ISIC_0000000_superpixels.png" in names
    assert "ISIC-2017_Training_Data/ISIC-2017_Training_Data_metadata.csv" in names
    assert (base / "raw" / S.download.ISIC_GT).read_text().splitlines()[0] == "image_id,melanoma,seborrheic_keratosis"


def test_synthetic_round_trip(synthetic, tmp_path):
    base, info, _, counts, logs = synthetic
    expected = {c: sum(v["nv/bkl/mel"]) for c, v in info["clients"].items()}
    assert counts == expected
    for client in S.sites.STORE_CLIENTS:
        data = open_client(base / "store", client)
        assert data.images.shape == (counts[client], 32, 32, 3) and data.labels.dtype == np.int64
        assert S.raw.class_counts(data.labels) == tuple(info["clients"][client]["nv/bkl/mel"])
        assert list(data.meta["id"]) == sorted(data.meta["id"])
    a = open_client(base / "store", "A").meta
    assert a["group"].duplicated().any()  # two images of one lesion share the group
    assert open_client(base / "store", "D").meta["source"].iloc[0].startswith("ISIC-2017_Training_Data.zip/")
    # appearance differs per source; the class is visible (melanoma darker than nevus in the centre)
    means = [open_client(base / "store", c).images.reshape(-1, 3).mean(0) for c in S.sites.STORE_CLIENTS]
    assert min(np.abs(a - b).max() for i, a in enumerate(means) for b in means[i + 1 :]) > 3
    for client in S.sites.STORE_CLIENTS:
        data = open_client(base / "store", client)
        centre = np.asarray(data.images[:, 12:20, 12:20]).mean(axis=(1, 2, 3))
        assert centre[data.labels == 2].mean() < centre[data.labels == 0].mean() - 10
    table = S.split(base / "store", tmp_path / "split.csv", "prrfl", permutation="seeded", seed=1)
    again = S.split(base / "store", tmp_path / "again.csv", "prrfl", permutation="seeded", seed=1)
    assert table.equals(again)
    split = read_split_csv(tmp_path / "split.csv")
    for client in S.sites.PRRFL_CLIENTS:
        parts = [split_rows(split, client, s) for s in ("train", "val", "test")]
        assert all(len(p) for p in parts)
        assert sorted(np.concatenate(parts).tolist()) == list(range(counts[client]))
    assert set(split.loc[split["client"] == "OOD", "split"]) == {"test"}
    with pytest.raises(S.sites.SkinDataError, match="permutation: seeded"):
        S.split(base / "store", tmp_path / "prrfl.csv", "prrfl")  # PRR-FL's ids are not in synthetic data


def test_synthetic_with_real_counts_expected_fails_listing_every_client(synthetic, tmp_path):
    _, _, raw, _, _ = synthetic
    with pytest.raises(S.sites.SkinDataError) as err:
        S.preprocess(raw, tmp_path / "store", "prrfl", expect_real_counts=True, log=lambda m: None)
    message = str(err.value)
    for client in S.sites.STORE_CLIENTS:
        assert f"client {client}: nv/bkl/mel" in message
    assert "PRR-FL image(s) missing" in message
    assert not (tmp_path / "store").exists()


def test_synthetic_is_deterministic(tmp_path):
    S.write_synthetic(tmp_path / "a", seed=3, images_per_client=12, ood_images=3)
    S.write_synthetic(tmp_path / "b", seed=3, images_per_client=12, ood_images=3)
    S.write_synthetic(tmp_path / "c", seed=4, images_per_client=12, ood_images=3)
    for spec in S.DOWNLOADS:
        assert (tmp_path / "a" / spec.filename).read_bytes() == (tmp_path / "b" / spec.filename).read_bytes()
    assert (tmp_path / "a" / S.download.HAM_PART1).read_bytes() != (tmp_path / "c" / S.download.HAM_PART1).read_bytes()


def test_unknown_protocol():
    with pytest.raises(ValueError, match="unknown protocol"):
        S.split("x", "y", "harmofl")
