"""Camelyon17-WILDS v1.0: metadata parsing, patch template, RGBA -> RGB, store, splits, synthetic twin.

The fixture is written here in the real layout (``datasets.md`` §1.5): a
``metadata.csv`` with WILDS' unnamed index column and zero-padded patients,
2 patches per center with both labels, 96x96 RGBA PNGs at the templated paths.
"""

import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fedmedbench.data import camelyon17 as C
from fedmedbench.data.archive import safe_extract
from fedmedbench.data.camelyon17.splits import _slide_level as slide_level
from fedmedbench.data.store import list_clients, open_client, read_split_csv
from fedmedbench.ops.fourier import amplitude_normalize, amplitude_spectrum, batch_mean_amplitude

# (patient, node, x, y, tumor, slide, center): slide // 10 == center, patient // 20 == center.
FIXTURE_ROWS = [
    ("004", 4, 3328, 21792, 1, 0, 0),
    ("017", 4, 3040, 23520, 0, 1, 0),
    ("020", 2, 1344, 36928, 1, 10, 1),
    ("020", 2, 1376, 36928, 0, 10, 1),
    ("046", 3, 15296, 3872, 0, 20, 2),
    ("046", 3, 15328, 3872, 1, 20, 2),
    ("072", 0, 640, 800, 1, 30, 3),
    ("072", 0, 672, 800, 0, 30, 3),
    ("089", 1, 96, 128, 0, 40, 4),
    ("089", 1, 128, 128, 1, 40, 4),
]


def _rgba(i: int, size: int = 96) -> np.ndarray:
    rng = np.random.default_rng(i)
    arr = rng.integers(0, 256, (size, size, 4), dtype=np.uint8)
    arr[..., 3] = 7  # a non-opaque alpha: dropping it must leave RGB untouched (no compositing)
    return arr


def write_fixture(root: Path, top_folder: bool = False, size: int = 96) -> Path:
    """Write the real layout under root (or root/camelyon17_v1.0); return the release root."""
    release = root / "camelyon17_v1.0" if top_folder else root
    release.mkdir(parents=True, exist_ok=True)
    (release / "RELEASE_v1.0.txt").write_text("v1.0\n")
    lines = [",patient,node,x_coord,y_coord,tumor,slide,center,split"]
    for i, (p, n, x, y, t, s, c) in enumerate(FIXTURE_ROWS):
        lines.append(f"{i},{p},{n},{x},{y},{t},{s},{c},{i % 2}")
        path = release / C.raw.patch_relpath(p, n, x, y)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_rgba(i, size), "RGBA").save(path)
    (release / "metadata.csv").write_text("\n".join(lines) + "\n")
    return release


def test_path_template_and_zero_padded_patient(tmp_path):
    assert (
        C.raw.patch_relpath("004", 4, 3328, 21792)
        == "patches/patient_004_node_4/patch_patient_004_node_4_x_3328_y_21792.png"
    )
    release = write_fixture(tmp_path)
    meta = C.raw.read_metadata(release / "metadata.csv")
    assert meta["patient"].tolist()[:3] == ["004", "017", "020"]
    assert meta["wilds_index"].tolist() == list(range(len(FIXTURE_ROWS)))
    # A CSV re-saved by a tool that dropped the zeros is padded back.
    text = (release / "metadata.csv").read_text().replace(",004,", ",4,")
    (release / "metadata.csv").write_text(text)
    assert C.raw.read_metadata(release / "metadata.csv")["patient"].iloc[0] == "004"


def test_preprocess_fixture_drops_alpha_and_maps_centers(tmp_path):
    write_fixture(tmp_path / "raw")
    counts = C.preprocess(
        {C.download.ARCHIVE: tmp_path / "raw"}, tmp_path / "store", "harmofl", log=lambda s: None, progress=False
    )
    assert counts == {client: 2 for client in C.sites.CLIENTS}
    assert list_clients(tmp_path / "store") == C.sites.CLIENTS
    first = open_client(tmp_path / "store", "hospital1")
    assert first.images.shape == (2, 96, 96, 3) and first.images.dtype == np.uint8
    assert first.labels.dtype == np.int64
    # Rows sorted by patch id: patient 004 then 017.
    assert first.meta["id"].tolist() == ["patient_004_node_4_x_3328_y_21792", "patient_017_node_4_x_3040_y_23520"]
    assert first.meta["group"].tolist() == ["patient_004_node_4", "patient_017_node_4"]
    assert first.meta["source"].iloc[0] == C.raw.patch_relpath("004", 4, 3328, 21792)
    assert first.labels.tolist() == [1, 0]
    np.testing.assert_array_equal(first.images[0], _rgba(0)[..., :3])  # alpha dropped, RGB untouched
    hospital3 = open_client(tmp_path / "store", "hospital3")  # center 2
    assert set(hospital3.meta["group"]) == {"patient_046_node_3"}


def test_top_folder_layout_through_a_tar_gz(tmp_path):
    write_fixture(tmp_path / "src", top_folder=True)
    archive = tmp_path / C.download.ARCHIVE
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(tmp_path / "src" / "camelyon17_v1.0", arcname="camelyon17_v1.0")
    extracted = safe_extract(archive, tmp_path / "extracted")
    counts = C.preprocess(
        {C.download.ARCHIVE: str(extracted)}, tmp_path / "store", "harmofl", log=lambda s: None, progress=False
    )
    assert sum(counts.values()) == len(FIXTURE_ROWS)
    source = open_client(tmp_path / "store", "hospital1").meta["source"].iloc[0]
    assert source.startswith("camelyon17_v1.0/patches/patient_004_node_4/")


def test_missing_patch_is_named_and_nothing_written(tmp_path):
    release = write_fixture(tmp_path / "raw")
    victim = release / C.raw.patch_relpath("046", 3, 15296, 3872)
    victim.unlink()
    with pytest.raises(C.sites.CamelyonDataError, match="patch_patient_046_node_3_x_15296_y_3872.png"):
        C.preprocess({C.download.ARCHIVE: release}, tmp_path / "store", "harmofl", log=lambda s: None, progress=False)
    assert not (tmp_path / "store").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".store")]


def test_wrong_patch_size_fails_unless_resizing(tmp_path):
    release = write_fixture(tmp_path / "raw", size=64)
    with pytest.raises(C.sites.CamelyonDataError, match=r"64x64, expected 96x96"):
        C.preprocess({C.download.ARCHIVE: release}, tmp_path / "store", "harmofl", log=lambda s: None, progress=False)
    C.preprocess(
        {C.download.ARCHIVE: release}, tmp_path / "store", "harmofl", size=32, log=lambda s: None, progress=False
    )
    assert open_client(tmp_path / "store", "hospital5").images.shape == (2, 32, 32, 3)


def test_bad_metadata_names_the_file(tmp_path):
    release = write_fixture(tmp_path / "raw")
    csv = release / "metadata.csv"
    df = pd.read_csv(csv, dtype={"patient": str}, index_col=0)
    df.loc[1, "tumor"] = 2
    df.to_csv(csv)
    with pytest.raises(C.sites.CamelyonDataError, match=r"metadata.csv.*'tumor' must be 0 or 1"):
        C.raw.read_metadata(csv)
    df.drop(columns=["slide"]).to_csv(csv)
    with pytest.raises(C.sites.CamelyonDataError, match=r"metadata.csv: missing column\(s\) \['slide'\]"):
        C.raw.read_metadata(csv)


def test_expect_real_counts_fails_loudly(tmp_path):
    release = write_fixture(tmp_path / "raw")
    with pytest.raises(C.sites.CamelyonDataError) as info:
        C.preprocess(
            {C.download.ARCHIVE: release},
            tmp_path / "store",
            "harmofl",
            expect_real_counts=True,
            log=lambda s: None,
            progress=False,
        )
    message = str(info.value)
    for client, n in C.sites.REAL_COUNTS.items():
        assert f"{client} (center {C.sites.CLIENTS.index(client)}): 2 patches, the real release has {n}" in message
    assert "total: 10 patches, the real release has 455954" in message
    assert "1 slides, the real release has 10" in message
    assert not (tmp_path / "store").exists()


@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("camelyon_synthetic")
    info = C.write_synthetic(root / "synthetic", seed=3, patches_per_center=20, slides_per_center=4)
    extracted = safe_extract(root / "synthetic" / C.download.ARCHIVE, root / "extracted")
    counts = C.preprocess(
        {C.download.ARCHIVE: extracted}, root / "store", "harmofl", log=lambda s: None, progress=False
    )
    return root, info, counts


def test_synthetic_twin_round_trip(synthetic_store, tmp_path):
    root, info, counts = synthetic_store
    assert counts == info["patches"] == {c: 20 for c in C.sites.CLIENTS}
    text = (root / "extracted" / "metadata.csv").read_text()
    assert text.startswith(",patient,node,x_coord,y_coord,tumor,slide,center,split\n")
    assert "\n0,000,0," in text  # zero-padded patients in the file itself
    with Image.open(next((root / "extracted" / "patches").rglob("*.png"))) as img:
        assert img.mode == "RGBA" and img.size == (96, 96)
    for client in C.sites.CLIENTS:
        data = open_client(root / "store", client)
        assert int(data.labels.sum()) == info["tumor"][client]
        assert data.meta["group"].nunique() == 4
        # Learnable label: within a hospital, every tumour patch (a crowded sheet of nuclei) is darker than every normal one.
        brightness = np.asarray(data.images, np.float32).mean(axis=(1, 2, 3))
        assert brightness[data.labels == 1].max() + 10 < brightness[data.labels == 0].min()
    # Deterministic: the same seed gives the same bytes.
    C.write_synthetic(tmp_path, seed=3, patches_per_center=20, slides_per_center=4)
    assert (tmp_path / C.download.ARCHIVE).read_bytes() == (root / "synthetic" / C.download.ARCHIVE).read_bytes()


# --- Where the twin's signals live (label in tissue, site in stain) -------------------------------------------------
# Real tumour patches differ from normal ones in structure (nuclear density, size, arrangement:
# Fourier phase) and hospitals differ in stain and scanner (colour, contrast, blur: Fourier
# amplitude). HarmoFL's full AmpNorm (paper Eq. 4) gives every image the same amplitude spectrum, so
# the twin must keep its label in the phase, or the paper's method cannot learn on it at all.


def _auc(score: np.ndarray, positive: np.ndarray) -> float:
    """ROC AUC of ``score`` for the positive class (Mann-Whitney; scores are continuous, no ties)."""
    ranks = np.argsort(np.argsort(score)) + 1.0
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    return float((ranks[positive == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_neg * n_pos))


def _skewness(images: torch.Tensor) -> np.ndarray:
    """Per-image skewness of the grey level: strongly negative for a few isolated dark spots on a
    light ground (normal: sparse nuclei in stroma and fat), near 0 for a dense texture (tumour: a
    confluent sheet of nuclei). A third-order statistic, set by where the nuclei are: Fourier phase,
    which an amplitude swap keeps."""
    grey = images.mean(dim=1)
    centred = grey - grey.mean(dim=(-2, -1), keepdim=True)
    return ((centred**3).mean(dim=(-2, -1)) / centred.pow(2).mean(dim=(-2, -1)).pow(1.5)).numpy()


@pytest.fixture(scope="module", params=[(0, 30, 32), (3, 20, 96)], ids=["demo-32px", "96px"])
def twin_by_hospital(request, tmp_path_factory):
    """Per hospital (images as floats in [0, 1], B x 3 x H x W, as training reads them; labels), built
    through the real archive and preprocessing: the demo's twin (30 patches, 32 px) and a native one."""
    seed, patches, size = request.param
    root = tmp_path_factory.mktemp(f"camelyon_twin_{size}")
    C.write_synthetic(root / "synthetic", seed=seed, patches_per_center=patches, patch_size=size)
    extracted = safe_extract(root / "synthetic" / C.download.ARCHIVE, root / "extracted")
    C.preprocess(
        {C.download.ARCHIVE: extracted}, root / "store", "harmofl", size=size, log=lambda s: None, progress=False
    )
    out = {}
    for client in C.sites.CLIENTS:
        data = open_client(root / "store", client)
        images = torch.from_numpy(np.array(data.images)).permute(0, 3, 1, 2).float() / 255.0
        out[client] = (images, np.asarray(data.labels))
    return out


def test_twin_label_survives_full_amplitude_normalization(twin_by_hospital):
    """HarmoFL's full AmpNorm (every image gets the clients' average amplitude spectrum, keeps its
    phase) leaves one simple statistic that separates tumour from normal across all hospitals; so
    does swapping each hospital's amplitude for another hospital's."""
    clients = list(twin_by_hospital)
    images = torch.cat([twin_by_hospital[c][0] for c in clients])
    labels = np.concatenate([twin_by_hospital[c][1] for c in clients])
    per_hospital = [batch_mean_amplitude(twin_by_hospital[c][0]) for c in clients]
    global_amplitude = torch.stack(per_hospital).mean(dim=0)  # the server's uniform average (Alg. 1 l. 17)
    normalized = amplitude_normalize(images, global_amplitude, "full")
    swapped = torch.cat(
        [
            amplitude_normalize(twin_by_hospital[c][0], per_hospital[(k + 1) % len(clients)], "full")
            for k, c in enumerate(clients)
        ]
    )
    # What AmpNorm removes: after it every image has the same mean colour, so darkness (tumour
    # tissue is denser) is no longer a cue; what is left is structure.
    means = normalized.mean(dim=(-2, -1))
    assert float((means - means.mean(dim=0)).abs().max()) < 1e-4
    assert _auc(-images.mean(dim=(1, 2, 3)).numpy(), labels) > 0.9  # before: darkness is a cue too
    assert _auc(_skewness(images), labels) > 0.95
    assert _auc(_skewness(normalized), labels) > 0.95  # measured 0.998 (32 px) and 1.000 (96 px)
    assert _auc(_skewness(swapped), labels) > 0.95


def test_twin_hospitals_differ_in_amplitude(twin_by_hospital):
    """Each hospital's stain and scanner leave their mark on the amplitude spectrum: among patches of
    one class, the hospital of a patch is recovered from its log amplitude alone (leave-one-out,
    nearest hospital mean; chance 0.2). Within a class, because tissue density (the class) changes
    the spectrum too."""
    clients = list(twin_by_hospital)
    features = torch.cat(
        [torch.log(amplitude_spectrum(twin_by_hospital[c][0]) + 1e-3).flatten(1) for c in clients]
    ).numpy()
    labels = np.concatenate([twin_by_hospital[c][1] for c in clients])
    hospital = np.concatenate([np.full(len(twin_by_hospital[c][1]), k) for k, c in enumerate(clients)])
    for label in (0, 1):
        f, h = features[labels == label], hospital[labels == label]
        correct = 0
        for i in range(len(f)):
            others = np.arange(len(f)) != i
            centroids = np.stack([f[others & (h == k)].mean(axis=0) for k in range(len(clients))])
            correct += int(np.argmin(((centroids - f[i]) ** 2).sum(axis=1)) == h[i])
        assert correct / len(f) > 0.7, (label, correct / len(f))  # measured 0.83-1.00


def test_image_level_split_is_disjoint_and_deterministic(synthetic_store, tmp_path):
    root, _, _ = synthetic_store
    table = C.split(root / "store", tmp_path / "a.csv", "harmofl", seed=0)
    C.split(root / "store", tmp_path / "b.csv", "harmofl", seed=0)
    C.split(root / "store", tmp_path / "c.csv", "harmofl", seed=1)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() != (tmp_path / "c.csv").read_bytes()
    read = read_split_csv(tmp_path / "a.csv")
    assert list(read.columns[:5]) == ["client", "split", "row", "id", "group"]
    for client in C.sites.CLIENTS:
        part = table[table.client == client]
        assert sorted(part.row) == list(range(20))  # every patch exactly once
        sizes = part.split.value_counts().to_dict()
        assert sizes == {"train": 13, "val": 3, "test": 4}  # 20 % test, 20 % of the rest val
        meta = open_client(root / "store", client).meta
        assert (meta["id"].to_numpy()[part.row] == part.id.to_numpy()).all()


def test_slide_level_split_keeps_slides_whole(synthetic_store, tmp_path):
    root, _, _ = synthetic_store
    table = C.split(root / "store", tmp_path / "s.csv", "harmofl", permutation="slide", seed=0)
    for client in C.sites.CLIENTS:
        part = table[table.client == client]
        assert sorted(part.row) == list(range(20))
        per_split = part.groupby("split")["group"].apply(set)
        assert not (per_split["train"] & per_split["val"]) and not (per_split["train"] & per_split["test"])
        assert not (per_split["val"] & per_split["test"])
        assert [len(per_split[s]) for s in ("train", "val", "test")] == [2, 1, 1]
    with pytest.raises(ValueError, match="permutation"):
        C.split(root / "store", tmp_path / "x.csv", "harmofl", permutation="wilds")


def test_split_errors_show_plain_values_not_numpy_reprs():
    """A message names a patient as written ('patient_004_node_4'), not as numpy's repr (np.str_(...))."""
    ids = np.array(["a", "b", "c", "d"])
    groups = np.array(["patient_004_node_4"] * 2 + ["patient_009_node_1"] * 2)
    with pytest.raises(C.sites.CamelyonDataError) as err:
        slide_level(ids, groups, np.random.default_rng(0))
    assert "['patient_004_node_4', 'patient_009_node_1']" in str(err.value) and "np." not in str(err.value)


def test_preprocessing_logs_plain_progress_lines_not_a_bar(tmp_path, capsys, caplog):
    """The tqdm bar does not fill job logs with carriage-return fragments. Off a terminal (a job
    log, here pytest's captured stderr) progress is plain log lines."""
    release = write_fixture(tmp_path / "raw")
    with caplog.at_level("INFO", logger="fedmedbench"):
        C.preprocess({C.download.ARCHIVE: release}, tmp_path / "store", "harmofl", log=lambda s: None, progress=True)
    assert "\r" not in capsys.readouterr().err
    assert "camelyon17 hospital1: 2/2 patch" in caplog.text
