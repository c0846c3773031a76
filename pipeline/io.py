"""Atomic artifact I/O: every file is written to a temporary sibling and renamed into place.

A reader (or DVC's cache) therefore never sees half a file, and a crash leaves the previous version intact.
Tensors are stored as ``.npz`` without pickle; JSON is written sorted and indented so that DVC hashes are stable.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


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


def load_npz(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load arrays and the ``meta`` dict saved by :func:`save_npz`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
            meta = json.loads(str(z["__meta__"])) if "__meta__" in z.files else {}
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npz archive ({exc})") from None
    return arrays, meta


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
