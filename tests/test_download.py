"""fetch(): local and file:// sources, checksum pinning, HTML rejection, no leftovers."""

import hashlib
import os

import pytest

from fedmedbench.data.download import DownloadError, DownloadSpec, fetch, fetch_spec, looks_like_html

PAYLOAD = b"PK\x03\x04 not really a zip, but bytes are bytes\n" * 100


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src" / "archive.zip"
    src.parent.mkdir()
    src.write_bytes(PAYLOAD)
    return src


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files(folder):
    """Files left in ``folder``; a folder the failed fetch created is removed too."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_local_path_with_correct_hash(tmp_path, source):
    dest = tmp_path / "out" / "archive.zip"
    logs = []
    observed = fetch(str(source), dest, sha256=_sha(PAYLOAD), log=logs.append)
    assert observed == _sha(PAYLOAD)
    assert dest.read_bytes() == PAYLOAD
    sidecar = dest.with_name("archive.zip.sha256")
    assert sidecar.read_text() == f"{_sha(PAYLOAD)}  archive.zip\n"
    assert _files(dest.parent) == ["archive.zip", "archive.zip.sha256"]
    assert any("matches the pinned hash" in line for line in logs)


def test_file_url_with_uppercase_hash(tmp_path, source):
    dest = tmp_path / "out" / "a.zip"
    observed = fetch(source.as_uri(), dest, sha256=_sha(PAYLOAD).upper(), log=lambda m: None)
    assert observed == _sha(PAYLOAD)
    assert dest.read_bytes() == PAYLOAD


def test_checksum_mismatch_leaves_nothing(tmp_path, source):
    out = tmp_path / "out"
    dest = out / "archive.zip"
    wrong = "0" * 64
    with pytest.raises(DownloadError) as err:
        fetch(str(source), dest, sha256=wrong, log=lambda m: None)
    message = str(err.value)
    assert wrong in message and _sha(PAYLOAD) in message
    assert "expected" in message and "observed" in message
    assert str(source) in message and str(dest) in message
    assert _files(out) == []


def test_html_page_is_rejected(tmp_path):
    page = tmp_path / "download.zip"
    page.write_bytes(b"\n   <!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title>")
    out = tmp_path / "out"
    with pytest.raises(DownloadError) as err:
        fetch(str(page), out / "x.zip", log=lambda m: None, manual_step="set data.prostate.archive")
    message = str(err.value)
    assert "HTML" in message and "Google Drive" in message and "data.prostate.archive" in message
    assert _files(out) == []


def test_looks_like_html():
    assert looks_like_html(b"<html lang=en>")
    assert looks_like_html(b"\xef\xbb\xbf  \r\n<!doctype HTML>")
    assert not looks_like_html(b"PK\x03\x04")
    assert not looks_like_html(b"\x1f\x8b\x08")


def test_unpinned_writes_observed_hash(tmp_path, source):
    dest = tmp_path / "out" / "archive.zip"
    logs = []
    observed = fetch(str(source), dest, log=logs.append)
    assert dest.with_name("archive.zip.sha256").read_text().split() == [observed, "archive.zip"]
    assert any("not pinned; pin it in the config" in line and observed in line for line in logs)


def test_archive_already_at_dest_is_hashed_in_place(tmp_path, source):
    observed = fetch(str(source), source, log=lambda m: None)
    assert observed == _sha(PAYLOAD)
    assert source.read_bytes() == PAYLOAD
    assert source.with_name("archive.zip.sha256").is_file()


def test_missing_local_file_and_bad_inputs(tmp_path):
    with pytest.raises(DownloadError, match="does not exist"):
        fetch(str(tmp_path / "nope.zip"), tmp_path / "x.zip", log=lambda m: None)
    with pytest.raises(ValueError, match="64 hex"):
        fetch(str(tmp_path / "nope.zip"), tmp_path / "x.zip", sha256="abc", log=lambda m: None)
    with pytest.raises(ValueError, match="gdrive"):
        fetch("gdrive:", tmp_path / "x.zip", log=lambda m: None)
    with pytest.raises(ValueError, match="unsupported"):
        fetch("ftp://example.org/x.zip", tmp_path / "x.zip", log=lambda m: None)


def test_fetch_spec_uses_override_source(tmp_path, source):
    spec = DownloadSpec("demo", "gdrive:abc", "archive.zip", _sha(PAYLOAD), "none", "do it by hand", "https://x")
    dest = tmp_path / "out" / spec.filename
    assert fetch_spec(spec, dest, source=str(source), log=lambda m: None) == _sha(PAYLOAD)


@pytest.fixture
def http_dir(tmp_path):
    """A local HTTP server (no internet needed) serving tmp_path/www."""
    import functools
    import http.server
    import threading

    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_download_and_html_content_type(tmp_path, http_dir):
    www, base = http_dir
    (www / "data.zip").write_bytes(PAYLOAD)
    (www / "page.html").write_bytes(b"Quota exceeded")  # served as text/html
    out = tmp_path / "out"
    assert fetch(f"{base}/data.zip", out / "data.zip", sha256=_sha(PAYLOAD), log=lambda m: None) == _sha(PAYLOAD)
    with pytest.raises(DownloadError, match="HTML"):
        fetch(f"{base}/page.html", out / "page.zip", log=lambda m: None)
    with pytest.raises(DownloadError, match="404"):
        fetch(f"{base}/missing.zip", out / "missing.zip", log=lambda m: None)
    assert _files(out) == ["data.zip", "data.zip.sha256"]


def test_gdrive_goes_through_gdown_and_the_same_checks(tmp_path, monkeypatch):
    import sys
    import types

    served = {"good": PAYLOAD, "quota": b"<html><body>Google Drive - Quota exceeded</body></html>"}

    def download(id=None, output=None, quiet=False, **kwargs):
        output.write(served[id])  # gdown writes chunks into a file-like output
        output.flush()
        return output

    monkeypatch.setitem(sys.modules, "gdown", types.SimpleNamespace(download=download))
    out = tmp_path / "out"
    assert fetch("gdrive:good", out / "a.zip", log=lambda m: None) == _sha(PAYLOAD)
    with pytest.raises(DownloadError, match="quota"):
        fetch("gdrive:quota", out / "b.zip", log=lambda m: None)
    assert _files(out) == ["a.zip", "a.zip.sha256"]


def test_a_failed_fetch_leaves_no_empty_folders(tmp_path, source):
    """Nothing half-written, not even the folders made for the download."""
    dest = tmp_path / "results" / "data" / "prostate" / "raw" / "a.zip"
    with pytest.raises(DownloadError, match="expected"):
        fetch(str(source), dest, sha256="0" * 64, log=lambda m: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # results/... was removed again


def test_a_fetched_file_follows_the_umask(tmp_path, source):
    import stat

    old = os.umask(0o022)
    try:
        fetch(str(source), tmp_path / "out" / "a.zip", log=lambda m: None)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out" / "a.zip").stat().st_mode) == 0o644
