"""safe_extract(): refuses escaping members, skips macOS junk, atomic and idempotent."""

import io
import os
import re
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from fedmedbench.data.archive import COMPLETE_MARKER, UnsafeArchiveError, safe_extract
from fedmedbench.errors import DataError

SRC = Path(__file__).resolve().parents[1] / "src"


def _zip(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members:
            zf.writestr(name, data)
    return path


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


def test_normal_zip_extracts_and_second_call_is_noop(tmp_path):
    archive = _zip(
        tmp_path / "a.zip",
        [("top/a.txt", b"A"), ("top/sub dir/b.txt", b"B"), ("top/empty/", b"")],
    )
    target = tmp_path / "out" / "raw"
    assert safe_extract(archive, target) == target
    assert (target / "top" / "a.txt").read_bytes() == b"A"
    assert (target / "top" / "sub dir" / "b.txt").read_bytes() == b"B"
    assert (target / "top" / "empty").is_dir()
    assert (target / COMPLETE_MARKER).is_file()
    assert _leftovers(target.parent) == ["raw"]

    # Idempotent: a finished extraction is left alone, even if the archive is gone.
    (target / "top" / "a.txt").write_bytes(b"changed")
    archive.unlink()
    safe_extract(archive, target)
    assert (target / "top" / "a.txt").read_bytes() == b"changed"


def test_zip_with_dotdot_is_refused(tmp_path):
    archive = _zip(tmp_path / "evil.zip", [("ok.txt", b"fine"), ("../evil.txt", b"gotcha")])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafeArchiveError, match=r"\.\./evil\.txt") as err:
        safe_extract(archive, out / "raw")
    assert str(archive) in str(err.value)
    assert _leftovers(out) == []
    assert not (tmp_path / "evil.txt").exists()


def test_zip_with_absolute_path_is_refused(tmp_path):
    buf = tmp_path / "abs.zip"
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("placeholder")
        info.filename = "/tmp/evil.txt"  # writestr would strip the leading slash
        zf.writestr(info, b"x")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafeArchiveError, match="absolute"):
        safe_extract(buf, out / "raw")
    assert _leftovers(out) == []


def test_zip_symlink_outside_is_refused(tmp_path):
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("data/link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "../../etc/passwd")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafeArchiveError, match="symlink"):
        safe_extract(archive, out / "raw")
    assert _leftovers(out) == []


def test_member_written_through_a_symlink_is_refused(tmp_path):
    # Even an inside link may not redirect later members: "a" -> "." would let
    # "a/../x"-style tricks escape once the link exists on disk.
    archive = tmp_path / "through.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("a")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, ".")
        zf.writestr("a/x.txt", b"x")
    with pytest.raises(UnsafeArchiveError, match="through symlink"):
        safe_extract(archive, tmp_path / "raw")
    assert not (tmp_path / "raw").exists()


def _tar(path, add):
    with tarfile.open(path, "w:gz") as tf:
        add(tf)
    return path


def _add_file(tf, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def test_tar_symlink_outside_is_refused(tmp_path):
    def add(tf):
        _add_file(tf, "data/ok.txt", b"ok")
        link = tarfile.TarInfo("data/escape")
        link.type = tarfile.SYMTYPE
        link.linkname = "../../outside"
        tf.addfile(link)

    archive = _tar(tmp_path / "t.tar.gz", add)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafeArchiveError, match="data/escape"):
        safe_extract(archive, out / "raw")
    assert _leftovers(out) == []


def test_tar_device_and_hardlink_are_refused(tmp_path):
    def add_dev(tf):
        dev = tarfile.TarInfo("dev/null")
        dev.type = tarfile.CHRTYPE
        tf.addfile(dev)

    def add_hard(tf):
        hard = tarfile.TarInfo("x")
        hard.type = tarfile.LNKTYPE
        hard.linkname = "../secret"
        tf.addfile(hard)

    with pytest.raises(UnsafeArchiveError, match="device"):
        safe_extract(_tar(tmp_path / "d.tar.gz", add_dev), tmp_path / "o1")
    with pytest.raises(UnsafeArchiveError, match="hard link|\\.\\."):
        safe_extract(_tar(tmp_path / "h.tar.gz", add_hard), tmp_path / "o2")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_tar_inside_symlink_extracts(tmp_path):
    def add(tf):
        _add_file(tf, "top/real.txt", b"R")
        link = tarfile.TarInfo("top/alias.txt")
        link.type = tarfile.SYMTYPE
        link.linkname = "real.txt"
        tf.addfile(link)

    target = safe_extract(_tar(tmp_path / "ok.tar.gz", add), tmp_path / "raw")
    assert (target / "top" / "alias.txt").is_symlink()
    assert (target / "top" / "alias.txt").read_bytes() == b"R"


def test_macos_junk_is_skipped(tmp_path):
    archive = _zip(
        tmp_path / "mac.zip",
        [
            ("Folder/Case00.nii.gz", b"data"),
            ("__MACOSX/Folder/._Case00.nii.gz", b"junk"),
            ("Folder/._Case00.nii.gz", b"junk"),
        ],
    )
    target = safe_extract(archive, tmp_path / "raw")
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        COMPLETE_MARKER,
        "Folder",
        "Folder/Case00.nii.gz",
    ]


def test_an_html_page_is_not_an_archive(tmp_path):
    page = tmp_path / "page.zip"
    page.write_bytes(b"<!DOCTYPE html><html></html>")
    with pytest.raises(ValueError, match="HTML"):
        safe_extract(page, tmp_path / "raw2")


def test_empty_target_folder_is_replaced(tmp_path):
    archive = _zip(tmp_path / "a.zip", [("a.txt", b"A")])
    target = tmp_path / "raw"
    target.mkdir()  # as a workflow engine might pre-create it
    safe_extract(archive, target)
    assert (target / "a.txt").read_bytes() == b"A" and (target / COMPLETE_MARKER).is_file()


# --- damaged or malformed archives: one line naming the archive, nothing extracted ---
def _bad_crc_zip(path):
    _zip(path, [("data/a.txt", b"A" * 1000)])
    raw = bytearray(path.read_bytes())
    at = raw.index(b"A" * 1000)
    raw[at + 10] ^= 0xFF  # flip a byte of the stored member: its CRC no longer matches
    path.write_bytes(bytes(raw))
    return path


def _truncated_tar_gz(path):
    _tar(path, lambda tf: _add_file(tf, "data/a.bin", os.urandom(50_000)))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _file_and_folder_zip(path):
    return _zip(path, [("a", b"file"), ("a/b.txt", b"inside")])


def _file_and_folder_entry_zip(path):
    return _zip(path, [("a/", b""), ("a", b"file")])


def _foreign_target(path):
    """A good archive whose target folder holds someone else's files and no completion marker."""
    _zip(path, [("a.txt", b"A")])
    (path.parent / "raw").mkdir()
    (path.parent / "raw" / "user_file.txt").write_text("not ours")
    return path


def _tree(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.mark.parametrize(
    ("make", "name", "message"),
    [
        (
            _bad_crc_zip,
            "crc.zip",
            r"crc\.zip: damaged or malformed archive at member 'data/a\.txt' \(BadZipFile: Bad CRC-32",
        ),
        (
            _truncated_tar_gz,
            "cut.tar.gz",
            r"cut\.tar\.gz: damaged or malformed archive at member 'data/a\.bin' \((EOFError|ReadError)",
        ),
        (_file_and_folder_zip, "clash.zip", r"clash\.zip: refusing member 'a/b\.txt': 'a' is both a folder and a file"),
        (
            _file_and_folder_entry_zip,
            "clash2.zip",
            r"clash2\.zip: refusing member 'a/': 'a' is both a folder and a file",
        ),
        (
            _foreign_target,
            "foreign.zip",
            r"raw exists but has no \.complete marker, so it is not a finished extraction of \S*foreign\.zip",
        ),
    ],
    ids=["bad-crc", "truncated-tar-gz", "file-and-folder", "file-and-folder-entry", "foreign-target"],
)
def test_a_damaged_archive_is_one_clear_error_and_leaves_nothing(tmp_path, make, name, message):
    """One line, not a traceback (BadZipFile, EOFError, FileExistsError in the staging folder)."""
    archive = make(tmp_path / name)
    before = _tree(tmp_path)
    with pytest.raises(DataError, match=message):
        safe_extract(archive, tmp_path / "raw")
    assert _tree(tmp_path) == before  # nothing extracted, no staging folder, a foreign folder untouched
    cli = subprocess.run(
        [sys.executable, "-m", "fedmedbench", "extract", "--archive", str(archive), "--out", str(tmp_path / "raw")],
        env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, text=True,
    )  # fmt: skip
    assert cli.returncode == 1 and "Traceback" not in cli.stderr
    assert re.search(message, cli.stderr.strip().splitlines()[-1])
    assert _tree(tmp_path) == before


def test_a_failed_extraction_removes_the_folders_it_created(tmp_path):
    archive = _bad_crc_zip(tmp_path / "crc.zip")
    with pytest.raises(DataError, match="damaged"):
        safe_extract(archive, tmp_path / "results" / "data" / "raw")
    assert _tree(tmp_path) == ["crc.zip"]


def test_extracted_folders_and_stores_follow_the_umask(tmp_path):
    """Outputs get the usual file modes, not the 0600/0700 of temporary files: group members can read them."""
    import numpy as np
    import pandas as pd

    from fedmedbench.data.store import atomic_write_csv, write_client

    old = os.umask(0o022)
    try:
        target = safe_extract(_zip(tmp_path / "a.zip", [("d/a.txt", b"A")]), tmp_path / "raw")
        meta = pd.DataFrame({"id": ["x"], "group": ["g"], "source": ["s"]})
        write_client(tmp_path / "store", "c", np.zeros((1, 2, 2, 3), np.uint8), np.zeros((1, 2, 2), np.uint8), meta)
        atomic_write_csv(meta, tmp_path / "table.csv")
    finally:
        os.umask(old)
    assert (
        stat.S_IMODE(target.stat().st_mode) == 0o755 and stat.S_IMODE((target / "d" / "a.txt").stat().st_mode) == 0o644
    )
    assert stat.S_IMODE((tmp_path / "store" / "c").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "table.csv").stat().st_mode) == 0o644


def test_a_full_disk_is_told_apart_from_a_damaged_archive(tmp_path, monkeypatch):
    import errno

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("fedmedbench.data.archive.shutil.copyfileobj", disk_full)
    archive = _zip(tmp_path / "a.zip", [("d/x.txt", b"x")])
    with pytest.raises(
        DataError, match=r"a\.zip: extracting into .* failed at member 'd/x\.txt' \(OSError: \[Errno 28\] No space left"
    ):
        safe_extract(archive, tmp_path / "out" / "raw")
    assert _tree(tmp_path) == ["a.zip"]
