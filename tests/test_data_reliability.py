"""Robust by construction, data layer: masks are read at their real bit depth by one
reader, a zip with mis-flagged member names is one clear error, a killed extract / preprocess /
download leaves nothing behind once it runs again, and a kill at any member gives, after a rerun,
exactly the uninterrupted result."""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import SimpleITK as sitk
from PIL import Image

from fedmedbench import faults
from fedmedbench.data import fundus as F
from fedmedbench.data import nuclei as N
from fedmedbench.data import prostate as P
from fedmedbench.data.archive import COMPLETE_MARKER, safe_extract
from fedmedbench.data.download import fetch
from fedmedbench.data.images import read_mask
from fedmedbench.data.staging import remove_stale
from fedmedbench.data.store import staged_dir, write_split_csv
from fedmedbench.errors import DataError
from tests.conftest import realdata_dir

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
REAL_FUNDUS = realdata_dir() / "rif_fundus" / "data" / "Fundus"


# --- 1. masks at their real bit depth ---------------------------------------------------------------
def _disc_mask(size=40):
    """DoFE grey levels: 255 background, 128 rim, 0 cup, and a few anti-aliased edge values."""
    mask = np.full((size, size), 255, np.uint8)
    mask[8:32, 8:32] = 128
    mask[14:26, 14:26] = 0
    mask[8, 8:32] = 190
    mask[14, 14:26] = 40
    return mask


def _save_16_bit(grey8: np.ndarray, path: Path) -> Path:
    Image.fromarray(grey8.astype(np.uint16) * 257).save(path)  # uint16 -> Pillow mode I;16
    with Image.open(path) as img:
        assert img.mode == "I;16"
    return path


def _png_16_bit(path: Path, array: np.ndarray, colour_type: int) -> Path:
    """A 16-bit PNG written by hand (Pillow cannot write 16-bit RGB): 2 = RGB, 4 = grey + alpha."""
    height, width = array.shape[:2]
    raw = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )
    return path


def _fundus_cases(tmp_path):
    """(name, image path, 8-bit mask path): the real RIF pairs when they are beside the checkout,
    else a synthetic pair."""
    if REAL_FUNDUS.exists():
        masks = sorted(REAL_FUNDUS.glob("Domain*/*/ROIs/mask/*.png"))
        return [(m.name, m.parent.parent / "image" / m.name, m) for m in masks]
    image = tmp_path / "img.png"
    Image.fromarray(np.full((40, 40, 3), 90, np.uint8)).save(image)
    mask = tmp_path / "mask8.png"
    Image.fromarray(_disc_mask()).save(mask)
    # The name is also the 16-bit copy's file name (16bit_<name>): it needs the .png suffix, or Pillow
    # cannot tell which format to write (the suite failed in a clone without ../shared).
    return [("synthetic.png", image, mask)]


@pytest.mark.shared
def test_a_16_bit_fundus_mask_gives_the_same_classes_as_the_8_bit_original(tmp_path):
    _check_16_bit_fundus_masks(tmp_path)


def test_the_16_bit_fundus_check_runs_without_shared_data(tmp_path, monkeypatch):
    """The synthetic fallback, even where ../shared is present (a clone without it runs only this)."""
    monkeypatch.setattr(sys.modules[__name__], "REAL_FUNDUS", tmp_path / "no_shared_here")
    assert [name for name, *_ in _fundus_cases(tmp_path)] == ["synthetic.png"]
    _check_16_bit_fundus_masks(tmp_path)


def _check_16_bit_fundus_masks(tmp_path):
    for name, image, mask8 in _fundus_cases(tmp_path):
        with Image.open(mask8) as img:
            grey8 = np.asarray(img)[..., 0] if img.mode == "RGB" else np.asarray(img)  # real RIF masks: grey as RGB
        mask16 = _save_16_bit(grey8, tmp_path / f"16bit_{name}")
        side = grey8.shape[0]  # native size: every pixel counted
        _, labels8, info8 = F.raw.load_pair(image, mask8, side)
        _, labels16, info16 = F.raw.load_pair(image, mask16, side)
        counts8 = np.bincount(labels8.ravel(), minlength=3)
        counts16 = np.bincount(labels16.ravel(), minlength=3)
        # before: convert("L") clipped rim 32896 -> 255, so the rim became background
        assert counts16.tolist() == counts8.tolist(), name
        assert counts8[F.raw.RIM] > 0 and counts8[F.raw.CUP] > 0, name
        assert info16 == info8, name
        np.testing.assert_array_equal(labels16, labels8)


def test_a_16_bit_mask_that_is_not_scaled_8_bit_is_refused_naming_the_file(tmp_path):
    image = tmp_path / "img.png"
    Image.fromarray(np.full((40, 40, 3), 90, np.uint8)).save(image)
    mask = _disc_mask().astype(np.uint16) * 257
    mask[mask == 128 * 257] = 32768  # a true 16-bit rim level: no exact 8-bit equivalent
    path = tmp_path / "mask16.png"
    Image.fromarray(mask).save(path)
    with pytest.raises(
        F.sites.FundusDataError,
        match=r"mask16\.png: 16-bit mask with values that are not 8-bit levels "
        r"scaled by 257 \(found 0, 10280, 32768, 48830, 65535\)",
    ):
        F.raw.load_pair(image, path, 16)


def _write(tmp_path, name, array, mode=None):
    path = tmp_path / name
    img = Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)
    img.save(path)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: _write(p, "f.tif", _disc_mask().astype(np.float32)), r"f\.tif: cannot read Pillow mode F"),
        (lambda p: _write(p, "i.tif", _disc_mask().astype(np.int32)), r"i\.tif: cannot read Pillow mode I "),
        (
            lambda p: _png_16_bit(
                p / "rgb16.png", np.repeat(_disc_mask()[..., None].astype(np.uint16) * 257, 3, -1), 2
            ),
            r"rgb16\.png: cannot read Pillow mode RGB stored as RGB;16B",
        ),
        (
            lambda p: _png_16_bit(p / "la16.png", np.stack([_disc_mask().astype(np.uint16) * 257] * 2, -1), 4),
            r"la16\.png: cannot read Pillow mode \w+ stored as LA;16B",
        ),
        (
            lambda p: _write(p, "red.png", np.stack([_disc_mask(), np.zeros((40, 40), np.uint8), _disc_mask()], -1)),
            # the 132 cup pixels (0, 0, 0) are grey; the other 1468 are not
            r"red\.png: colour mask \(RGB, R/G/B differ at 1468 of 1600 pixels\) where a grey mask is expected",
        ),
        (
            lambda p: _write(
                p, "pal.png", np.stack([_disc_mask(), np.zeros((40, 40), np.uint8), _disc_mask()], -1), "P"
            ),
            r"pal\.png: colour mask \(P, R/G/B differ",
        ),
    ],
    ids=["float", "int32", "rgb-16-bit", "grey-alpha-16-bit", "colour", "colour-palette"],
)
def test_a_mask_that_cannot_be_read_exactly_is_refused_naming_the_file(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(F.sites.FundusDataError, match=message):
        read_mask(path, error=F.sites.FundusDataError)


@pytest.mark.parametrize(
    ("name", "convert"),
    [
        ("grey.png", lambda m: Image.fromarray(m)),
        ("grey-as-rgb.png", lambda m: Image.fromarray(np.stack([m] * 3, -1))),  # the real RIF masks
        ("grey-alpha.png", lambda m: Image.fromarray(np.stack([m, np.full_like(m, 255)], -1))),
        ("grey-palette.png", lambda m: Image.fromarray(m).convert("P")),
        ("grey-16.tif", lambda m: Image.fromarray(m.astype(np.uint16) * 257)),
    ],
    ids=["grey", "grey-as-rgb", "grey-alpha", "grey-palette", "grey-16-bit"],
)
def test_every_lossless_grey_encoding_reads_the_same_values(tmp_path, name, convert):
    mask = _disc_mask()
    convert(mask).save(tmp_path / name)
    np.testing.assert_array_equal(read_mask(tmp_path / name), mask)


def test_nuclei_masks_go_through_the_same_reader(tmp_path):
    gt = np.zeros((16, 16), np.uint8)
    gt[2:6, 3:8] = 255
    Image.fromarray(gt.astype(np.uint16) * 257).save(tmp_path / "gt16.png")
    assert int(N.raw.read_mask_png(tmp_path / "gt16.png").sum()) == 20  # 16-bit 0/65535: the same 20 pixels
    Image.fromarray((gt > 0).astype(np.uint16) * 1000).save(tmp_path / "gt16_other.png")
    with pytest.raises(N.sites.NucleiDataError, match=r"gt16_other\.png: 16-bit mask .* \(found 0, 1000\)"):
        N.raw.read_mask_png(tmp_path / "gt16_other.png")  # before: read as > 0 whatever the levels meant
    Image.fromarray(gt.astype(np.float32)).save(tmp_path / "gt_float.tif")
    with pytest.raises(N.sites.NucleiDataError, match=r"gt_float\.tif: cannot read Pillow mode F"):
        N.raw.read_mask_png(tmp_path / "gt_float.tif")
    colour = np.zeros((16, 16, 3), np.uint8)
    colour[2:6, 3:8, 0] = 200  # colour-saved masks: any non-zero channel is a nucleus, as before
    Image.fromarray(colour).save(tmp_path / "gt_red.png")
    assert int(N.raw.read_mask_png(tmp_path / "gt_red.png").sum()) == 20


def test_a_soft_prostate_segmentation_is_refused_naming_the_file(tmp_path):
    release = tmp_path / "raw" / "Processed_data_nii"
    for k, site in enumerate(P.sites.RELEASE_SITES):
        (release / site).mkdir(parents=True)
        seg = "_Segmentation" if site == "BMC" else "_segmentation"
        for case in P.sites.RELEASE_CASES[site][:3]:
            image = np.random.default_rng(k).uniform(0, 400, (5, 12, 12)).astype(np.float32)
            label = np.zeros((5, 12, 12), np.float32)
            label[1:4, 3:9, 4:8] = 1
            if site == "HK" and case == P.sites.RELEASE_CASES[site][1]:
                label[2, 3:9, 4:8] = 0.5  # a soft (interpolated) mask
            sitk.WriteImage(sitk.GetImageFromArray(image), str(release / site / f"{case}.nii.gz"))
            sitk.WriteImage(sitk.GetImageFromArray(label), str(release / site / f"{case}{seg}.nii.gz"))
    bad = f"HK/{P.sites.RELEASE_CASES['HK'][1]}_segmentation.nii.gz"
    for protocol in ("fedlwr", "harmofl"):  # before: Fed-LWR took 0.5 as prostate silently
        with pytest.raises(
            P.sites.ProstateDataError,
            match=rf"{bad}: a segmentation must hold non-negative integer "
            r"classes; found float32 values 0, 0\.5, 1",
        ):
            P.preprocess(
                {P.download.DOWNLOAD.filename: tmp_path / "raw"},
                tmp_path / protocol,
                protocol,
                size=12,
                log=lambda m: None,
            )
        assert not (tmp_path / protocol).exists()


# --- 2. zip member names that claim UTF-8 but are not -----------------------------------------------
def test_a_latin1_name_flagged_as_utf8_is_one_clear_error(tmp_path):
    path = tmp_path / "latin1.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("ok.txt", b"fine")
        zf.writestr("caf\u00e9.txt", b"coffee")  # non-ASCII: stored as UTF-8 with flag bit 11 set
    data = path.read_bytes()
    assert data.count("caf\u00e9".encode()) == 2  # local header and central directory
    path.write_bytes(data.replace("caf\u00e9".encode(), b"caf\xe9_"))  # Latin-1 bytes, flag still set
    target = tmp_path / "out" / "raw"
    with pytest.raises(DataError) as err:
        safe_extract(path, target)
    message = str(err.value)
    assert message == (
        f"{path}: member stored as b'caf\\xe9_.txt' is flagged as UTF-8 but is not valid UTF-8 "
        "(byte b'\\xe9' at 3); nothing was extracted"
    )
    assert "\n" not in message and not (tmp_path / "out").exists()


def test_the_cli_reports_a_mis_flagged_name_in_one_line(tmp_path):
    path = tmp_path / "latin1.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("caf\u00e9.txt", b"coffee")
    path.write_bytes(path.read_bytes().replace("caf\u00e9".encode(), b"caf\xe9_"))
    result = _extract_cli(path, tmp_path / "out")
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("is flagged as UTF-8 but is not valid UTF-8 (byte b'\\xe9' at 3); nothing was extracted")
    )
    assert "Traceback" not in result.stderr


# --- 3. temporaries of a killed step ---------------------------------------------------------------
def _plant(folder: Path, names: list[str]) -> None:
    """Folders (with half a file inside) for staging names, files for the rest."""
    for name in names:
        if ".tmp-" in name or ".old-" in name:
            (folder / name).mkdir()
            (folder / name / "half.bin").write_bytes(b"x" * 1000)
        else:
            (folder / name).write_bytes(b"partial")


STALE_RAW = [".raw.tmp-k3_9abcd", ".raw.old-zz0000yy"]
# Not ours: other outputs' temporaries, a user's file, names that only look similar.
NOT_OURS = [
    ".raw2.tmp-k3_9abcd",
    ".other.tmp-abcdefgh",
    "raw.tmp-abcdefgh",
    ".raw.tmp-notours",
    ".raw.tmp-ABCDEFGH",
    ".raw.tmp-abcdefgh.keep",
    "notes.txt",
]


def test_a_rerun_extraction_removes_what_the_killed_one_left_and_nothing_else(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("d/x.txt", b"x")
    out = tmp_path / "out"
    out.mkdir()
    _plant(out, STALE_RAW + NOT_OURS)
    safe_extract(archive, out / "raw")
    assert sorted(p.name for p in out.iterdir()) == sorted(NOT_OURS + ["raw"])
    # also when the target is already finished: a second call cleans, then returns
    _plant(out, STALE_RAW)
    safe_extract(archive, out / "raw")
    assert sorted(p.name for p in out.iterdir()) == sorted(NOT_OURS + ["raw"])


def test_a_rerun_store_write_removes_what_the_killed_one_left(tmp_path):
    names = [".store.tmp-abcdefgh", ".store.old-12345678", ".store.tmp-k3_9abcd"]
    _plant(tmp_path, names + NOT_OURS)
    with staged_dir(tmp_path / "store") as tmp:
        (tmp / "A").mkdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NOT_OURS + ["store"])


def test_a_rerun_download_and_split_remove_their_temporary_files(tmp_path):
    source = tmp_path / "src.zip"
    with zipfile.ZipFile(source, "w") as zf:
        zf.writestr("a.txt", b"A")
    raw = tmp_path / "raw"
    raw.mkdir()
    stale = [".a.zip.x1y2z3w4.tmp", ".a.zip.sha256.abcdefgh.tmp", ".split.csv.0a1b2c3d.tmp"]
    keep = [".b.zip.x1y2z3w4.tmp", ".a.zip.sha256", "a.zip.x1y2z3w4.tmp"]
    _plant(raw, stale + keep)
    fetch(str(source), raw / "a.zip", log=lambda m: None)
    split = pd.DataFrame({"client": ["A"], "split": ["train"], "row": [0], "id": ["A/0"], "group": ["A/0"]})
    write_split_csv(split, raw / "split.csv")
    assert sorted(p.name for p in raw.iterdir()) == sorted(keep + ["a.zip", "a.zip.sha256", "split.csv"])


def test_a_staging_folder_in_use_by_a_live_process_is_left_alone(tmp_path):
    live = tmp_path / ".raw.tmp-abcdefgh"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running extraction holds
        assert remove_stale(tmp_path / "raw") == [] and live.is_dir()
    finally:
        os.close(fd)  # the process ends (or is killed): the kernel drops its lock
    assert remove_stale(tmp_path / "raw") == [live] and not live.exists()


# --- 4. killed anywhere, rerun, byte-identical ------------------------------------------------------
def _extract_cli(archive: Path, out: Path, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop(faults.KILL_AT_ENV, None)
    if kill_at:
        env[faults.KILL_AT_ENV] = kill_at
    cmd = [sys.executable, "-m", "fedmedbench", "extract", "--archive", str(archive), "--out", str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def _tree(folder: Path) -> dict:
    """Every entry under ``folder``: file bytes, link targets, folders."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[key] = ("link", os.readlink(path))
        elif path.is_dir():
            out[key] = ("dir",)
        else:
            out[key] = ("file", path.read_bytes(), oct(path.stat().st_mode & 0o777))
    return out


MEMBERS = [(f"top/d{k % 2}/m{k}.bin", np.random.default_rng(k).bytes(200_000 + k)) for k in range(5)]


def _kill_archive(tmp_path: Path, kind: str) -> Path:
    if kind == "zip":
        path = tmp_path / "a.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in MEMBERS:
                zf.writestr(name, data)
            link = zipfile.ZipInfo("top/link")
            link.external_attr = 0o120777 << 16  # a symlink member
            zf.writestr(link, b"d0/m0.bin")
        return path
    path = tmp_path / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, data in MEMBERS:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o640
            tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("top/link")
        link.type, link.linkname = tarfile.SYMTYPE, "d0/m0.bin"
        tf.addfile(link)
    return path


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_an_extraction_killed_at_any_member_reruns_to_the_same_tree(tmp_path, kind):
    archive = _kill_archive(tmp_path, kind)
    reference = safe_extract(archive, tmp_path / "reference" / "raw")
    expected = _tree(reference)
    assert len([v for v in expected.values() if v[0] == "file"]) == len(MEMBERS) + 1  # + .complete
    for n in (1, 3, len(MEMBERS) + 1):  # before the first, a middle and the last member
        out = tmp_path / f"killed{n}"
        killed = _extract_cli(archive, out / "raw", kill_at=f"extract_member:{n}")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        left = [p.name for p in out.iterdir()]
        assert len(left) == 1 and left[0].startswith(".raw.tmp-"), left  # the kill's leftover
        assert not (out / "raw").exists()
        rerun = _extract_cli(archive, out / "raw")
        assert rerun.returncode == 0, rerun.stderr
        assert [p.name for p in out.iterdir()] == ["raw"]  # the leftover is gone, nothing else left
        assert _tree(out / "raw") == expected
        assert (out / "raw" / COMPLETE_MARKER).is_file()


PREPROCESS = """
import sys
from fedmedbench import faults
from fedmedbench.data import fundus as F
faults.arm()
F.preprocess({F.download.ARCHIVE: sys.argv[1]}, sys.argv[2], "fedlwr", size=16, log=lambda m: None)
"""


def test_a_preprocessing_killed_mid_store_write_reruns_to_the_same_store(tmp_path):
    F.write_synthetic(tmp_path / "zip", seed=0, train_per_domain=2, test_per_domain=1, size=16)
    raw = safe_extract(tmp_path / "zip" / F.download.ARCHIVE, tmp_path / "raw")
    F.preprocess({F.download.ARCHIVE: raw}, tmp_path / "reference" / "store", "fedlwr", size=16, log=lambda m: None)
    expected = _tree(tmp_path / "reference" / "store")
    assert len(expected) == 1 + 4 * 4  # info.json + 4 clients x (folder, images, labels, meta)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for n in (1, 3):  # inside the first client, inside the third one (two clients already in place)
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-c", PREPROCESS, str(raw), str(out / "store")]
        killed = subprocess.run(
            cmd, env={**env, faults.KILL_AT_ENV: f"store_write:{n}"}, capture_output=True, text=True
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        left = [p.name for p in out.iterdir()]
        assert len(left) == 1 and left[0].startswith(".store.tmp-"), left
        rerun = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr
        assert [p.name for p in out.iterdir()] == ["store"]
        assert _tree(out / "store") == expected
