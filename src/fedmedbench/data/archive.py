"""Safe, atomic extraction of .zip and .tar(.gz/.bz2/.xz) archives.

Archives come from third parties (Google Drive, Zenodo, challenge sites), so
every member is checked before anything is written: no absolute paths, no
``..`` escaping the target, no links pointing outside it, no device files,
no member written through a symlink. One bad member refuses the whole
archive. macOS junk (``__MACOSX/``, AppleDouble ``._*`` files) is skipped.
A damaged or cut-short archive (bad CRC, truncated stream) or a path that is
both a file and a folder is, like an unsafe member, one ``DataError`` line
naming the archive and the member.

Extraction goes into a temporary folder beside the target; the marker file
``.complete`` is written last and the folder renamed onto the target, so a
target that exists with its marker is a finished extraction and a second
call returns at once. The temporary folder of an extraction that was killed
(OOM killer, SLURM time limit) is removed when the extraction runs again.
"""

from __future__ import annotations

import lzma
import os
import posixpath
import re
import shutil
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from fedmedbench import faults
from fedmedbench.errors import DataError
from fedmedbench.files import atomic_path, new_folder

from .staging import remove_stale, staging_folder

__all__ = ["UnsafeArchiveError", "safe_extract", "COMPLETE_MARKER"]

COMPLETE_MARKER = ".complete"
_MAX_LINK_TARGET = 4096
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


class UnsafeArchiveError(DataError):
    """An archive member could write outside the target folder, or is a device file."""

    def __init__(self, archive: Path, member: str, reason: str) -> None:
        super().__init__(f"{archive}: refusing member {member!r}: {reason}; nothing was extracted")
        self.archive = archive
        self.member = member


# What a damaged or cut-short archive raises while it is read (bad CRC, stream ended early, bad
# compressed data). bz2 and gzip report bad data as OSError without an errno.
_DAMAGED = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError)


@dataclass
class _Cursor:
    """The member being read, so that an error of a damaged archive can name where it broke."""

    member: str | None = None


@dataclass
class _Entry:
    name: str  # name as stored in the archive
    parts: tuple[str, ...]  # normalised relative path
    kind: str  # "file", "dir", "symlink", "hardlink"
    link: str | None = None  # symlink target as stored / hardlink target path
    info: object = None  # ZipInfo or TarInfo


def _split_member(archive: Path, name: str) -> tuple[str, ...] | None:
    """Normalised path parts of a member, None for junk to skip; raises if unsafe."""
    if name.startswith(("/", "\\")) or _DRIVE_RE.match(name):
        raise UnsafeArchiveError(archive, name, "absolute path")
    # Backslash counts as a separator for the '..' check: Windows-made zips use it.
    if any(part == ".." for part in re.split(r"[/\\]", name)):
        raise UnsafeArchiveError(archive, name, "path contains '..' and could leave the target folder")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if not parts:
        return None
    if "__MACOSX" in parts or parts[-1].startswith("._"):
        return None
    return parts


def _check_link_target(archive: Path, entry: _Entry) -> None:
    """Symlink targets are relative to the link's folder; they must stay inside the target."""
    target = entry.link or ""
    if not target:
        raise UnsafeArchiveError(archive, entry.name, "symlink with an empty target")
    if target.startswith(("/", "\\")) or _DRIVE_RE.match(target):
        raise UnsafeArchiveError(archive, entry.name, f"symlink to absolute path {target!r}")
    resolved = posixpath.normpath(posixpath.join(*entry.parts[:-1], target) if entry.parts[:-1] else target)
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafeArchiveError(archive, entry.name, f"symlink to {target!r} points outside the target folder")


def _check_no_write_through_links(archive: Path, entries: list[_Entry]) -> None:
    """Refuse members whose path goes through a symlink member: the link could redirect the write."""
    links = {e.parts for e in entries if e.kind == "symlink"}
    if not links:
        return
    for e in entries:
        for i in range(1, len(e.parts)):
            if e.parts[:i] in links:
                raise UnsafeArchiveError(archive, e.name, f"path goes through symlink {'/'.join(e.parts[:i])!r}")


def _plan_zip(archive: Path, zf: zipfile.ZipFile, cursor: _Cursor) -> list[_Entry]:
    entries = []
    for info in zf.infolist():
        cursor.member = info.filename
        parts = _split_member(archive, info.filename)
        if parts is None:
            continue
        mode = (info.external_attr >> 16) & 0xFFFF  # Unix mode, when the zip was made on Unix
        if mode and (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            raise UnsafeArchiveError(archive, info.filename, "device, FIFO or socket file")
        if mode and stat.S_ISLNK(mode):
            if info.file_size > _MAX_LINK_TARGET:
                raise UnsafeArchiveError(archive, info.filename, "symlink target is implausibly long")
            link = zf.read(info).decode("utf-8", "surrogateescape")
            entry = _Entry(info.filename, parts, "symlink", link, info)
            _check_link_target(archive, entry)
        elif info.is_dir():
            entry = _Entry(info.filename, parts, "dir", None, info)
        else:
            entry = _Entry(info.filename, parts, "file", None, info)
        entries.append(entry)
    return entries


def _plan_tar(archive: Path, tf: tarfile.TarFile, cursor: _Cursor) -> list[_Entry]:
    entries = []
    # Headers are read one by one, each after skipping the previous member's data: a cut-short
    # stream fails while the cursor names the member whose data was cut.
    for info in tf:
        cursor.member = info.name
        parts = _split_member(archive, info.name)
        if parts is None:
            continue
        if info.ischr() or info.isblk() or info.isfifo():
            raise UnsafeArchiveError(archive, info.name, "device or FIFO file")
        if info.issym():
            entry = _Entry(info.name, parts, "symlink", info.linkname, info)
            _check_link_target(archive, entry)
        elif info.islnk():
            # Hard-link targets are paths from the archive root, not from the link's folder.
            if info.linkname.startswith(("/", "\\")) or _DRIVE_RE.match(info.linkname):
                raise UnsafeArchiveError(archive, info.name, f"hard link to absolute path {info.linkname!r}")
            resolved = posixpath.normpath(info.linkname)
            if resolved == ".." or resolved.startswith("../"):
                raise UnsafeArchiveError(archive, info.name, f"hard link to {info.linkname!r} outside the target")
            entry = _Entry(info.name, parts, "hardlink", resolved, info)
        elif info.isdir():
            entry = _Entry(info.name, parts, "dir", None, info)
        elif info.isreg():
            entry = _Entry(info.name, parts, "file", None, info)
        else:
            raise UnsafeArchiveError(archive, info.name, "unsupported member type")
        entries.append(entry)
    return entries


def _extract_zip(zf: zipfile.ZipFile, entries: list[_Entry], root: Path, cursor: _Cursor) -> None:
    # Our own loop rather than ZipFile.extract: that one silently rewrites bad
    # names and never creates symlinks; we have validated every name already.
    for e in entries:
        cursor.member = e.name
        faults.reached("extract_member")
        dest = root.joinpath(*e.parts)
        if e.kind == "dir":
            dest.mkdir(parents=True, exist_ok=True)
        elif e.kind == "symlink":
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(e.link, dest)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(e.info) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)


def _extract_tar(archive: Path, tf: tarfile.TarFile, entries: list[_Entry], root: Path, cursor: _Cursor) -> None:
    def data_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
        cursor.member = member.name  # called just before each member is extracted
        faults.reached("extract_member")
        return tarfile.data_filter(member, path)

    try:
        # The "data" filter repeats the safety checks inside tarfile and drops
        # unsafe permission bits (setuid, world-writable).
        tf.extractall(root, members=[e.info for e in entries], filter=data_filter)
    except tarfile.FilterError as exc:
        member = exc.tarinfo.name if getattr(exc, "tarinfo", None) is not None else "?"
        raise UnsafeArchiveError(archive, member, str(exc)) from exc


def _check_no_file_folder_clash(archive: Path, entries: list[_Entry]) -> None:
    """A path cannot be both a file and a folder: a member ``a`` (file) with ``a/b.txt`` or ``a/``."""
    files = {e.parts for e in entries if e.kind != "dir"}
    for e in entries:
        folders = [e.parts[:depth] for depth in range(1, len(e.parts))] + ([e.parts] if e.kind == "dir" else [])
        for folder in folders:
            if folder in files:
                raise UnsafeArchiveError(
                    archive, e.name, f"{'/'.join(folder)!r} is both a folder and a file in the archive"
                )


def _check_links_stay_inside(archive: Path, root: Path) -> None:
    """After extraction, resolve every symlink for real: chains of links could still escape."""
    real_root = os.path.realpath(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                real = os.path.realpath(path)
                if real != real_root and not real.startswith(real_root + os.sep):
                    member = os.path.relpath(path, root)
                    raise UnsafeArchiveError(archive, member, "symlink resolves outside the target folder")


def _open_archive(archive: Path):
    if zipfile.is_zipfile(archive):
        return "zip", zipfile.ZipFile(archive)
    if tarfile.is_tarfile(archive):
        return "tar", tarfile.open(archive, "r:*")
    with open(archive, "rb") as fh:
        head = fh.read(64).lstrip().lower()
    hint = (
        " (it is an HTML page: the download probably failed)" if head.startswith((b"<!doctype html", b"<html")) else ""
    )
    raise DataError(f"{archive}: not a zip or tar archive{hint}")


def safe_extract(archive: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Extract ``archive`` into folder ``target`` safely and atomically; return ``target``.

    If ``target`` already holds a finished extraction (``.complete`` marker)
    nothing is done. A non-empty ``target`` without the marker is not ours and
    is refused rather than overwritten.
    """
    archive = Path(archive)
    target = Path(target)
    faults.arm()  # test hook (FEDMEDBENCH_KILL_AT=extract_member:<n>); unset, it does nothing
    remove_stale(target)  # what a killed extraction of this target left behind (GBs for Camelyon17)
    if (target / COMPLETE_MARKER).is_file():
        return target
    # An empty folder (some workflow engines pre-create outputs) is replaced by the rename.
    if target.is_symlink() or (target.exists() and not (target.is_dir() and not any(target.iterdir()))):
        raise DataError(
            f"{target} exists but has no {COMPLETE_MARKER} marker, so it is not a finished extraction of "
            f"{archive}; remove it and run again"
        )
    if not archive.is_file():
        raise DataError(f"archive {archive} does not exist")
    cursor = _Cursor()
    try:
        return _extract(archive, target, cursor)
    except UnicodeDecodeError as exc:
        # A zip that sets the UTF-8 flag (bit 11) on a name in another encoding (Latin-1 é = 0xe9):
        # zipfile fails while reading the directory. The raw bytes are shown, not decoded.
        at = (
            f"member {cursor.member!r} (stored name {exc.object!r})"
            if cursor.member
            else f"member stored as {exc.object!r}"
        )
        raise DataError(
            f"{archive}: {at} is flagged as UTF-8 but is not valid UTF-8 "
            f"(byte {exc.object[exc.start : exc.end]!r} at {exc.start}); nothing was extracted"
        ) from exc
    except (*_DAMAGED, OSError) as exc:
        # One line naming the archive and the member, instead of a traceback from deep in zipfile/tarfile.
        at = f" at member {cursor.member!r}" if cursor.member else ""
        if isinstance(exc, OSError) and exc.errno is not None:  # the file system, not the archive
            problem = f"extracting into {target.parent} failed{at}"
        else:
            problem = f"damaged or malformed archive{at}"
        raise DataError(f"{archive}: {problem} ({type(exc).__name__}: {exc}); nothing was extracted") from exc


def _extract(archive: Path, target: Path, cursor: _Cursor) -> Path:
    kind, handle = _open_archive(archive)
    with handle:
        entries = _plan_zip(archive, handle, cursor) if kind == "zip" else _plan_tar(archive, handle, cursor)
        cursor.member = None
        _check_no_write_through_links(archive, entries)
        _check_no_file_folder_clash(archive, entries)

        with new_folder(target.parent):  # a failed extraction leaves no folders behind
            return _extract_into(archive, kind, handle, entries, target, cursor)


def _extract_into(archive: Path, kind: str, handle, entries: list[_Entry], target: Path, cursor: _Cursor) -> Path:
    # Locked while we work, so that a concurrent run does not take it for a killed run's leftover.
    with staging_folder(target) as tmp:
        return _fill_and_rename(archive, kind, handle, entries, target, tmp, cursor)


def _fill_and_rename(
    archive: Path, kind: str, handle, entries: list[_Entry], target: Path, tmp: Path, cursor: _Cursor
) -> Path:
    try:
        if kind == "zip":
            _extract_zip(handle, entries, tmp, cursor)
        else:
            _extract_tar(archive, handle, entries, tmp, cursor)
        cursor.member = None
        _check_links_stay_inside(archive, tmp)
        (tmp / COMPLETE_MARKER).write_text(f"extracted from {archive.name}\n", encoding="utf-8")
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process may have finished the same extraction meanwhile.
            if (target / COMPLETE_MARKER).is_file():
                shutil.rmtree(tmp, ignore_errors=True)
                return target
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def write_zip_atomic(path: Path, members: list[tuple[str, bytes]], date_time=(2020, 1, 1, 0, 0, 0)) -> None:
    """A zip of (name, bytes) members with a fixed timestamp (byte-identical for the same members),
    written to a temp file beside ``path`` and renamed into place (for the synthetic twins)."""
    remove_stale(path)
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members:
            zf.writestr(zipfile.ZipInfo(name, date_time=date_time), data)
