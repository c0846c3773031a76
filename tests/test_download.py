"""The verified downloader against a real HTTP server on 127.0.0.1, plus the manifest and safe_extract."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from pipeline.data.download import (
    MANIFEST,
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

MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"
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


def test_truncated_transfer(server: _Server, tmp_path: Path) -> None:
    def truncated(h: http.server.BaseHTTPRequestHandler, _n: int) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(PAYLOAD)))
        h.end_headers()
        h.wfile.write(PAYLOAD[: len(PAYLOAD) // 2])
        h.wfile.flush()
        h.close_connection = True

    server.routes["/cut.txt"] = truncated
    url = server.url("/cut.txt")
    with pytest.raises(DownloadError) as err:
        fetch([RawFile("cut.txt", url, None)], tmp_path, retries=1, backoff=0.01)
    msg = str(err.value)
    assert "\n" not in msg and url in msg and "truncated" in msg
    assert _leftovers(tmp_path) == []


def test_timeout(server: _Server, tmp_path: Path) -> None:
    def slow(h: http.server.BaseHTTPRequestHandler, n: int) -> None:
        server.release.wait(5.0)

    server.routes["/slow.txt"] = slow
    url = server.url("/slow.txt")
    with pytest.raises(DownloadError) as err:
        fetch([RawFile("slow.txt", url, SHA)], tmp_path, retries=0, timeout=0.5)
    assert url in str(err.value) and "timed out" in str(err.value)
    assert _leftovers(tmp_path) == []


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
