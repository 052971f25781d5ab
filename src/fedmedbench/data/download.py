"""The one download helper of the project.

``fetch`` accepts four kinds of source:

* ``https://...`` / ``http://...``: streamed with urllib;
* ``file:///abs/path``: a local file given as a URL;
* ``gdrive:<file_id>``: Google Drive, through ``gdown`` (imported only then);
* a plain local path: an archive the user downloaded by hand.

Whatever the source, the bytes are streamed into a temporary file beside the
destination while being hashed, checked (not an HTML page, sha256 if pinned),
and only then renamed onto the destination. A sidecar ``<dest>.sha256`` in
``sha256sum`` format records what was observed, so an unpinned download can
be pinned in the config afterwards. Every error path removes the temporary
file: a destination that exists is always a complete, checked download. The
temporary file of a download that was killed is removed when it runs again.

Google Drive is the reason for the HTML check: for large files it answers
with a "can't scan for viruses" or "quota exceeded" page instead of the file,
with a success status.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..files import new_folder
from .digest import file_stamp
from .staging import locked_atomic_file, remove_stale
from .store import atomic_write_text

__all__ = ["DownloadError", "DownloadSpec", "fetch", "fetch_spec", "looks_like_html"]

CHUNK_SIZE = 1 << 20
HEAD_SIZE = 1024  # bytes kept to recognise an HTML page
HTTP_TIMEOUT_S = 60
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_GDRIVE_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")


# A source that needs a person (terms to accept, registration): fetch stops with the spec's advice.
MANUAL = "manual"


class DownloadError(DataError):
    """A download failed or produced content that cannot be the expected file."""


@dataclass(frozen=True)
class DownloadSpec:
    """Where a dataset family's raw archive comes from.

    ``url`` is any ``fetch`` source (``https://…``, ``gdrive:<id>``, ``file://…``).
    ``sha256`` is None until we have observed and pinned a hash.
    ``manual_step`` says what to do when the automatic download cannot work
    (Drive quota, registration), including which config key to set.
    """

    name: str
    url: str
    filename: str
    sha256: str | None
    licence: str
    manual_step: str | None
    homepage: str


def looks_like_html(head: bytes) -> bool:
    """True if the first bytes of a file are an HTML document (BOM and whitespace ignored)."""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip().lower()
    return text.startswith(b"<!doctype html") or text.startswith(b"<html")


class _HashingSink:
    """File-like writer that hashes, counts and keeps the first bytes of what it writes.

    gdown accepts such an object as its ``output``, so Drive downloads go
    through exactly the same checks as every other source.
    """

    def __init__(self, fh) -> None:
        self._fh = fh
        self._hash = hashlib.sha256()
        self.size = 0
        self.head = b""

    def write(self, data) -> int:
        data = bytes(data) if not isinstance(data, bytes) else data
        self._fh.write(data)
        self._hash.update(data)
        self.size += len(data)
        if len(self.head) < HEAD_SIZE:
            self.head += data[: HEAD_SIZE - len(self.head)]
        return len(data)

    def flush(self) -> None:
        self._fh.flush()

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def __repr__(self) -> str:
        return f"<temporary file {self._fh.name}>"


def _normalise_sha256(sha256: str | None, source: str) -> str | None:
    if sha256 is None or sha256 == "":
        return None
    value = str(sha256).strip().lower()
    if not _SHA256_RE.match(value):
        raise ValueError(f"pinned sha256 for {source} is not 64 hex digits: {sha256!r}")
    return value


def _html_message(source: str, head: bytes, manual_step: str | None) -> str:
    snippet = head[:80].decode("utf-8", "replace").strip()
    how = manual_step or (
        "download the file by hand in a browser and set the archive path for this dataset "
        "in config/config.yaml (data.<dataset>.archive)"
    )
    return (
        f"{source} returned an HTML page instead of the file (starts with {snippet!r}). "
        "Google Drive probably served a quota-exceeded or virus-scan warning page. "
        f"To continue: {how}"
    )


def _classify(source: str) -> tuple[str, str]:
    """Return (kind, location) with kind in {"http", "gdrive", "local"}."""
    if source.startswith("gdrive:"):
        file_id = source[len("gdrive:") :].strip()
        if not file_id or not _GDRIVE_ID_RE.match(file_id):
            raise ValueError(f"bad Google Drive source {source!r}: expected gdrive:<file id>")
        return "gdrive", file_id
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https"):
        return "http", source
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URL with a remote host is not supported: {source!r}")
        return "local", urllib.request.url2pathname(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter would be a Windows drive
        raise ValueError(f"unsupported download source {source!r}: use https://, file://, gdrive:<id> or a path")
    return "local", source


def local_source(source: str) -> Path | None:
    """The file a local source names (a path or a file:// URL: a file downloaded by hand), else None."""
    if source == MANUAL:
        return None
    try:
        kind, location = _classify(str(source))
    except ValueError:
        return None  # the download job names it
    return Path(location).expanduser() if kind == "local" else None


def _copy_local(path: Path, sink: _HashingSink) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_SIZE), b""):
            sink.write(chunk)


def _fetch_http(url: str, sink: _HashingSink, manual_step: str | None) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "fedmedbench-downloader"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            content_type = (response.headers.get("Content-Type") or "").lower()
            if content_type.startswith("text/html"):
                raise DownloadError(_html_message(url, response.read(HEAD_SIZE), manual_step))
            for chunk in iter(lambda: response.read(CHUNK_SIZE), b""):
                sink.write(chunk)
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        # http.client.IncompleteRead and socket timeouts are OSError/HTTPException too.
        raise DownloadError(f"{url}: download failed ({exc})") from exc


def _fetch_gdrive(file_id: str, sink: _HashingSink, manual_step: str | None) -> None:
    try:
        import gdown  # noqa: PLC0415  (only Drive sources need it: ~150 ms, it pulls in requests/bs4)
    except ImportError as exc:
        raise DownloadError(f"gdrive:{file_id} needs the 'gdown' package, which is not installed") from exc
    try:
        gdown.download(id=file_id, output=sink, quiet=False)
    except Exception as exc:  # gdown raises its own and requests' exception types
        hint = manual_step or "download it by hand and set the archive path in config/config.yaml"
        raise DownloadError(f"gdrive:{file_id}: gdown could not download the file ({exc}). {hint}") from exc


def fetch(
    source: str,
    dest: str | os.PathLike,
    sha256: str | None = None,
    log: Callable[[str], object] = print,
    *,
    manual_step: str | None = None,
    source_stamp: str | None = None,
) -> str:
    """Download or copy ``source`` to ``dest``; return the observed sha256 (hex).

    ``sha256``, when given, must match or ``DownloadError`` is raised and
    nothing is left behind. ``manual_step`` is appended to errors that a user
    can work around by downloading by hand. ``source_stamp`` (a local source's
    ``digest.file_stamp`` when the workflow planned the job) must still be the
    file's, so the copy is of the file whose stamp the workflow recorded.
    """
    source = str(source)
    dest = Path(dest)
    if source == MANUAL:
        raise DownloadError(f"{dest.name} cannot be downloaded automatically. {manual_step or ''}".strip())
    expected = _normalise_sha256(sha256, source)
    kind, location = _classify(source)
    with new_folder(dest.parent):
        return _fetch_into(source, dest, kind, location, expected, log, manual_step, source_stamp)


def _fetch_into(
    source: str,
    dest: Path,
    kind: str,
    location: str,
    expected: str | None,
    log,
    manual_step: str | None,
    source_stamp: str | None = None,
) -> str:
    remove_stale(dest)  # a killed download's partial file, also when the user now gives the file by hand
    if kind == "local":
        src_path = Path(location).expanduser()
        if not src_path.is_file():
            raise DownloadError(f"local archive {src_path} does not exist or is not a file (source {source!r})")
        if source_stamp is not None:
            if file_stamp(src_path) != source_stamp:
                raise DownloadError(
                    f"local archive {src_path} changed after the workflow planned this job (now {file_stamp(src_path)!r}, "
                    f"planned {source_stamp!r}); run the workflow again"
                )
        if dest.exists() and os.path.samefile(src_path, dest):
            return _verify_in_place(source, dest, expected, log, manual_step)

    # Streamed into a temporary file beside dest; an error (also a failed check) removes it, and the
    # one a killed download left (a partial archive, GBs) is removed first.
    with locked_atomic_file(dest) as fh:
        sink = _HashingSink(fh)
        if kind == "gdrive":
            log(f"downloading Google Drive file {location} -> {dest}")
            _fetch_gdrive(location, sink, manual_step)
        elif kind == "http":
            log(f"downloading {location} -> {dest}")
            _fetch_http(location, sink, manual_step)
        else:
            log(f"copying {src_path} -> {dest}")
            _copy_local(src_path, sink)
        observed = sink.hexdigest()
        _check_content(source, dest, sink.size, sink.head, expected, observed, manual_step)
    _write_sidecar(dest, observed)
    _log_hash(log, dest, sink.size, observed, expected)
    return observed


def _verify_in_place(source: str, dest: Path, expected: str | None, log, manual_step: str | None) -> str:
    """The user put the archive exactly at ``dest``: hash it without copying it onto itself."""
    sink = _HashingSink(open(os.devnull, "wb"))
    try:
        _copy_local(dest, sink)
    finally:
        sink._fh.close()
    observed = sink.hexdigest()
    # Never delete the user's own file: report and let them decide.
    _check_content(source, dest, sink.size, sink.head, expected, observed, manual_step)
    _write_sidecar(dest, observed)
    _log_hash(log, dest, sink.size, observed, expected)
    return observed


def _check_content(
    source: str,
    dest: Path,
    size: int,
    head: bytes,
    expected: str | None,
    observed: str,
    manual_step: str | None,
) -> None:
    if size == 0:
        raise DownloadError(f"{source}: got an empty file (destination {dest})")
    if looks_like_html(head):
        raise DownloadError(_html_message(source, head, manual_step))
    if expected is not None and observed != expected:
        raise DownloadError(
            f"sha256 mismatch for {source} (destination {dest}): expected {expected}, observed {observed}. "
            "The file may be truncated or replaced upstream; if the new file is trusted, update the pinned hash."
        )


def _write_sidecar(dest: Path, observed: str) -> None:
    # Same format as `sha256sum`, so `sha256sum -c <dest>.sha256` works from the folder.
    atomic_write_text(dest.with_name(dest.name + ".sha256"), f"{observed}  {dest.name}\n")


def _log_hash(log, dest: Path, size: int, observed: str, expected: str | None) -> None:
    status = "matches the pinned hash" if expected else "not pinned; pin it in the config"
    log(f"{dest}: {size} bytes, sha256 {observed} ({status})")


def fetch_spec(
    spec: DownloadSpec,
    dest: str | os.PathLike,
    source: str | None = None,
    sha256: str | None = None,
    log: Callable[[str], object] = print,
) -> str:
    """``fetch`` for a family's ``DownloadSpec``; ``source``/``sha256`` override the spec (config values)."""
    return fetch(
        source or spec.url,
        dest,
        sha256=sha256 if sha256 else spec.sha256,
        log=log,
        manual_step=spec.manual_step,
    )
