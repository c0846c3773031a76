"""Atomic artifact I/O: every file is written to a temporary sibling and renamed into place.

A reader (or DVC's cache) therefore never sees half a file, and a crash leaves the previous version intact. A
temporary file is named ``.<name>.psrnn-tmp-<host>-<pid>-<random><suffix>`` (:data:`TEMP_MARK`): one stranded by
a SIGKILL is removed by the next write of the same file once its process is gone, and until then ``.dvcignore``
keeps it out of the hash of a directory that a stage reads (``artifacts/<ds>`` holds single-file outputs) and
``.gitignore`` out of ``git status``. The file gets the mode a plain ``open(path, "w")`` would give it
(``0o666 & ~umask``), not the private ``0o600`` of the temporary file. Tensors are stored as ``.npz`` without
pickle; JSON is written sorted and indented so that DVC hashes are stable. A truncated or corrupt ``.npz`` is one
``ValueError`` naming the file and the stage to rerun.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import hashlib
import json
import os
import tempfile
import threading
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np


_UMASK_LOCK = threading.Lock()
_HOLD: dict[str, Any] = {"depth": 0, "pending": None}   # interrupts held off (signal handlers run in one thread)


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold an exception that a signal handler raises through :func:`raise_or_hold` (``psrnn``'s SIGTERM) until
    the block is done: a write to the MLflow store cut in half leaves its session unusable, and the run could not
    be closed as failed."""
    _HOLD["depth"] += 1
    try:
        yield
    finally:
        _HOLD["depth"] -= 1
        pending = _HOLD["pending"]
        if _HOLD["depth"] == 0 and pending is not None:
            _HOLD["pending"] = None
            raise pending


def raise_or_hold(exc: BaseException) -> None:
    """Raise ``exc`` now, or at the end of the :func:`held_interrupts` block the program is in."""
    if _HOLD["depth"]:
        _HOLD["pending"] = exc
        return
    raise exc


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (``/proc/self/status``), else by setting
    and restoring it under a lock."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


#: marks the temporary files of :func:`atomic_path` (``.dvcignore`` and ``.gitignore`` name the pattern)
TEMP_MARK = ".psrnn-tmp-"
#: a temporary file of another host (a shared file system), whose process cannot be asked, is stale after this long
FOREIGN_TEMP_AGE_S = 24 * 3600


@functools.cache
def _host_tag() -> str:
    """8 hex digits of the host name: a temporary file's process id means something on its own host only."""
    import hashlib
    import socket

    return hashlib.sha256(socket.gethostname().encode(errors="replace")).hexdigest()[:8]


def _process_alive(pid: int) -> bool:
    if os.name == "nt":   # os.kill(pid, 0) would send CTRL_C_EVENT there: never asked, taken as alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):   # another user's process (EPERM), or no such id at all
        return True
    return True


def remove_stranded_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of earlier writes of ``path`` that their writer can no longer rename: on this
    host, those whose process is gone (a SIGKILL between the temporary file's creation and its rename strands
    it); of another host (its id in the name) or of no parsable name, those older than
    :data:`FOREIGN_TEMP_AGE_S`. A live writer's file and this process's are left alone. Returns the removed
    paths."""
    path = Path(path)
    removed = []
    try:
        candidates = list(path.parent.glob(f".{glob.escape(path.name)}{TEMP_MARK}*"))
    except OSError:
        return removed
    host = _host_tag()
    for tmp in candidates:
        parts = tmp.name[len(path.name) + 1 + len(TEMP_MARK):].split("-", 2)
        ours = len(parts) == 3 and parts[0] == host and parts[1].isdigit() and len(parts[1]) <= 10
        if ours:
            pid = int(parts[1])
            if pid == os.getpid() or _process_alive(pid):
                continue
        else:
            try:
                if time.time() - tmp.stat().st_mtime < FOREIGN_TEMP_AGE_S:
                    continue
            except OSError:
                continue
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:   # an unreadable parent (PermissionError): the message then names the write that failed
        return False


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds.

    The temporary file is created private (``mkstemp``: mode 0600); before the rename it gets the ordinary mode of
    a new file, ``0o666 & ~umask``, so that artifacts are as readable as any other output. Temporary files of
    earlier writes of ``path`` that a killed process left are removed first (:func:`remove_stranded_temporaries`)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stranded_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}{_host_tag()}-{os.getpid()}-",
                                   suffix=suffix or ".tmp", dir=path.parent)
    except OSError as exc:   # the error would name the random temporary file, not the output asked for
        blocking = next((a for a in path.parents if _exists(a) and not a.is_dir()), None)
        if blocking is not None:   # "File exists" from mkdir, or "Not a directory", left the cause to guess
            raise OSError(exc.errno, f"cannot write {path}: {blocking} is a file, not a directory; expected a "
                                     "path inside a directory") from None
        raise OSError(exc.errno, f"cannot write {path} (a temporary file in {path.parent} is needed first): "
                                 f"{exc.strerror or exc}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with contextlib.suppress(OSError):  # a file system without modes keeps mkstemp's; a missing file fails below
            os.chmod(tmp_path, 0o666 & ~_umask())
        _fsync(tmp_path)   # the data on disk before the name: a crash after the rename must not leave an empty file
        os.replace(tmp_path, path)
        _fsync(path.parent)   # and the rename itself
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a directory's entries) to disk; file systems that cannot (EINVAL, ENOTSUP: some
    network and FUSE mounts, directories on some systems) are left as they are. A missing file is left to the
    rename to report."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EISDIR):
            raise
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None) -> None:
    """Save arrays (and a JSON ``meta`` dict stored as a string array) to ``path`` atomically, no pickle."""
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    for k, v in payload.items():
        if v.dtype == object:
            raise TypeError(f"{path}: array {k!r} has dtype object; only numeric arrays are stored")
    if meta is not None:
        payload["__meta__"] = np.array(json.dumps(meta, sort_keys=True, default=_json_default))
    with atomic_path(path, suffix=".npz") as tmp:
        # np.savez stamps each member with the current time, which would change the file's hash on every
        # run and make DVC rerun everything downstream; members here carry a fixed date instead.
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name in sorted(payload):
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                with zf.open(info, "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, payload[name], allow_pickle=False)


@contextlib.contextmanager
def artifact_contents(path: str | os.PathLike, fix: str):
    """Read what an artifact holds inside this block: an array or meta key it lacks (a file of another kind at
    its path, or of another version) becomes a one-line ValueError naming the file, the key and ``fix`` (the
    command that writes it again), not the key alone ("error: obs_frequencies")."""
    try:
        yield
    except KeyError as exc:
        key = exc.args[0] if exc.args else "?"
        raise ValueError(f"{path}: holds no {key!r}: not the artifact written there, or damaged; {fix}") from None


def load_npz(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load arrays and the ``meta`` dict saved by :func:`save_npz`.

    A truncated or corrupt file (not a zip archive, a bad CRC, a short member, an undecodable meta) raises one
    ``ValueError`` naming the file and saying to rerun the stage that wrote it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head and not head.startswith(b"PK") and not head.startswith(b"\x93NUM"):
            # numpy reads any other file as a pickle, refused with advice to load it unsafely: never here
            raise ValueError("neither a zip archive nor a numpy array file")
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an .npz archive")
        with z:
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
            try:
                meta = json.loads(str(z["__meta__"])) if "__meta__" in z.files else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"its metadata (__meta__) is not valid JSON: {exc}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, KeyError, OSError) as exc:
        if isinstance(exc, (PermissionError, IsADirectoryError)):
            raise
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"{path}: not a readable .npz archive, truncated or corrupt ({detail}); expected a "
                         "complete file: rerun the stage that wrote it (e.g. `dvc repro --force <stage>`)") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: the __meta__ entry is not a JSON object; expected a file written by save_npz: "
                         "rerun the stage that wrote it")
    return arrays, meta


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def plain_values(value: Any, where: str) -> Any:
    """``value`` with numpy scalars and arrays as Python numbers and lists, so that ``torch.load(weights_only=True)``
    reads the file back (it refuses numpy objects: lr=np.float64(0.1) in the train config made a model file or
    checkpoint that saved but did not load); anything else that is no number, string, bool, None, tensor, list,
    tuple or dict is refused here, naming where it is, rather than on loading."""
    import torch

    from pipeline.messages import brief

    if isinstance(value, np.generic):   # before float: np.float64 is one
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {plain_values(k, where): plain_values(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain_values(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise ValueError(f"{where}: a {type(value).__name__} ({brief(value, 60)}); expected numbers, strings, lists and "
                     "dicts (what a saved model file holds besides tensors)")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in chunks of 1 MiB (a downloaded raw file, a custom dataset's file, a prepared
    one)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
