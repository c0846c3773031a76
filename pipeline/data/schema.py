"""The prepared-dataset format shared by every source: one Parquet file per dataset.

Columns (one row per time step)

====================  ===========  ==============================================================
column                type         meaning
====================  ===========  ==============================================================
``split``             string       ``train``, ``valid`` or ``test``
``trajectory``        int64        trajectory id, unique within the file
``step``              int64        0-based time index, contiguous within a trajectory
``symbol``            int64        discrete data only: index into ``vocab``
*feature columns*     float64      continuous data only: one column per feature, named in ``features``
====================  ===========  ==============================================================

The Parquet schema metadata key ``psrnn`` holds a JSON object:
``kind`` (``"discrete"`` or ``"continuous"``), ``features`` (continuous column names, in order),
``vocab`` (discrete: the list of symbols, as strings), ``source`` (free text), and optional
``normalization`` (``{"mean": [...], "std": [...]}``: continuous features were standardised with these
train statistics) and ``bayes_optimal`` (synthetic data: the true filter's test metric, e.g. ``{"bpc": 1.23}``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

SPLITS = ("train", "valid", "test")
KINDS = ("discrete", "continuous")
META_KEY = b"psrnn"


@dataclass
class SequenceDataset:
    """A dataset as lists of trajectories per split.

    Discrete trajectories are int64 arrays of shape ``(T,)`` holding vocabulary indices; continuous ones are
    float64 arrays of shape ``(T, m)``.
    """

    kind: str
    train: list[np.ndarray]
    test: list[np.ndarray]
    valid: list[np.ndarray] = field(default_factory=list)
    features: list[str] = field(default_factory=list)
    vocab: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"dataset kind {self.kind!r}: expected one of {KINDS}")
        for split in SPLITS:
            trajs = [np.asarray(t) for t in getattr(self, split)]
            for i, t in enumerate(trajs):
                if self.kind == "discrete":
                    if t.ndim != 1:
                        raise ValueError(f"{split} trajectory {i}: discrete data must be 1-D, got shape {t.shape}")
                    trajs[i] = t.astype(np.int64, copy=False)
                else:
                    if t.ndim == 1:
                        t = t[:, None]
                    if t.ndim != 2:
                        raise ValueError(f"{split} trajectory {i}: continuous data must be (T, m), got {t.shape}")
                    trajs[i] = t.astype(np.float64, copy=False)
            setattr(self, split, trajs)
        if self.kind == "continuous" and not self.features and self.train:
            self.features = [f"x{i}" for i in range(self.train[0].shape[1])]

    @property
    def obs_dim(self) -> int:
        """Size of one observation: the vocabulary size (one-hot) or the number of features."""
        return len(self.vocab) if self.kind == "discrete" else len(self.features)

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"

    def split(self, name: str) -> list[np.ndarray]:
        if name not in SPLITS:
            raise ValueError(f"split {name!r}: expected one of {SPLITS}")
        return getattr(self, name)

    def units(self) -> dict[str, Any]:
        """What a model trained on this dataset needs to take and give data in its original units: ``kind``, and
        ``vocab`` (discrete) or ``features`` with the ``mean`` and ``std`` each was standardised with (0 and 1 for
        a feature left as it was, e.g. Handwriting's pen-up flag). Logged with every MLflow run."""
        if self.discrete:   # with the column of a custom file's symbols, which new files use too
            return {"kind": self.kind, "vocab": list(self.vocab),
                    "symbol_column": str(self.meta.get("symbol_column", "symbol"))}
        mean, std = [0.0] * len(self.features), [1.0] * len(self.features)
        norm = self.meta.get("normalization")
        if norm:
            for name, m, s in zip(norm.get("columns") or self.features, norm["mean"], norm["std"]):
                j = self.features.index(name)
                mean[j], std[j] = float(m), float(s)
        return {"kind": self.kind, "features": list(self.features), "mean": mean, "std": std}

    def summary(self) -> dict[str, Any]:
        return {
            s: {"trajectories": len(self.split(s)), "steps": int(sum(len(t) for t in self.split(s)))} for s in SPLITS
        }


def unscorable(lengths: Sequence[int]) -> str | None:
    """How an error names a split whose trajectories are all a single step ("its one trajectory is", "all 3 of
    its trajectories are"); None when one has 2 steps or more, or there is none. A one-step prediction is scored
    against the next observation, which a one-step trajectory lacks: such a split has nothing to score, and its
    NaN metrics would read as a diverged model. The one rule of the preprocess stage, the custom reader, training
    and the API."""
    if not lengths or max(lengths) >= 2:
        return None
    return "its one trajectory is" if len(lengths) == 1 else f"all {len(lengths)} of its trajectories are"


def invalid_utf8(column: Any) -> tuple[int, bytes] | None:
    """The row and the bytes of the first value of a pyarrow string column (Array or ChunkedArray) that is not valid
    UTF-8, or None when every value is. Parquet does not check the bytes of its string columns, and pyarrow reads
    them unchecked: converting one to Python or numpy then fails with ``Unknown error: Wrapping ... failed`` or
    ``'utf-8' codec can't decode``, naming neither file nor column. Arrow's full validation finds the first bad
    value in C++ (milliseconds for millions of rows); a bisection of the failing chunk gives its row."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    offset = 0
    for chunk in chunks:
        if not _utf8_ok(chunk):
            lo, hi = 0, len(chunk)      # chunk[lo:hi] holds the first invalid value
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _utf8_ok(chunk.slice(lo, mid - lo)):
                    lo = mid
                else:
                    hi = mid
            binary = pa.large_binary() if pa.types.is_large_string(chunk.type) else pa.binary()
            return offset + lo, chunk.slice(lo, 1).cast(binary)[0].as_py()
        offset += len(chunk)
    return None


def _utf8_ok(array: Any) -> bool:
    import pyarrow as pa

    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def utf8_error(path: Any, name: str, column: Any) -> ValueError | None:
    """The one-line error for a string ``column`` ``name`` of the file ``path`` that is not valid UTF-8 (naming the
    first row and its bytes), or None."""
    bad = invalid_utf8(column)
    if bad is None:
        return None
    row, raw = bad
    shown = repr(raw) if len(raw) <= 40 else repr(raw[:40])[:-1] + "...'"
    return ValueError(f"{path}: column {name!r} is not valid UTF-8 text (first at row {row}: {shown}); expected "
                      "strings in UTF-8 (re-encode the text, e.g. from Latin-1, before writing the file)")


def write_dataset(path: str | os.PathLike, ds: SequenceDataset) -> None:
    """Write ``ds`` to ``path`` (Parquet, atomically) in the schema documented above."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.io import atomic_path

    splits, trajs, steps, values = [], [], [], []
    tid = 0
    for split in SPLITS:
        for t in ds.split(split):
            n = len(t)
            splits.extend([split] * n)
            trajs.append(np.full(n, tid, dtype=np.int64))
            steps.append(np.arange(n, dtype=np.int64))
            values.append(t)
            tid += 1
    cols: dict[str, Any] = {
        "split": pa.array(splits, type=pa.string()),
        "trajectory": pa.array(np.concatenate(trajs) if trajs else np.zeros(0, np.int64)),
        "step": pa.array(np.concatenate(steps) if steps else np.zeros(0, np.int64)),
    }
    if ds.discrete:
        cols["symbol"] = pa.array(np.concatenate(values) if values else np.zeros(0, np.int64))
    else:
        m = len(ds.features)
        stacked = np.concatenate(values, axis=0) if values else np.zeros((0, m))
        for j, name in enumerate(ds.features):
            cols[name] = pa.array(stacked[:, j].astype(np.float64))
    meta = {"kind": ds.kind, "features": ds.features, "vocab": ds.vocab, **ds.meta}
    table = pa.table(cols).replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})
    with atomic_path(path, suffix=".parquet") as tmp:
        # page CRCs: a reader verifying them (read_dataset, pipeline.data.custom) detects a corrupt data page
        pq.write_table(table, tmp, write_page_checksum=True)


def read_dataset(path: str | os.PathLike) -> SequenceDataset:
    """Read a prepared dataset written by :func:`write_dataset`; errors name the file and what is wrong."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: prepared dataset not found")
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"{path}: not a readable Parquet file, truncated or corrupt ({detail})") from None
    raw_meta = (table.schema.metadata or {}).get(META_KEY)
    if raw_meta is None:
        raise ValueError(f"{path}: Parquet schema metadata has no 'psrnn' key; was it written by write_dataset?")
    meta = json.loads(raw_meta)
    kind = meta.pop("kind")
    features = meta.pop("features", [])
    vocab = meta.pop("vocab", [])
    split_column = table.column("split")
    if pa.types.is_dictionary(split_column.type):
        split_column = split_column.cast(split_column.type.value_type)
    if pa.types.is_string(split_column.type) or pa.types.is_large_string(split_column.type):
        bad = utf8_error(path, "split", split_column)
        if bad is not None:
            raise bad
    split = np.asarray(split_column.to_pylist())
    traj = table.column("trajectory").to_numpy()
    step = table.column("step").to_numpy()
    if kind == "discrete":
        values = table.column("symbol").to_numpy().astype(np.int64)
    else:
        values = np.stack([table.column(f).to_numpy().astype(np.float64) for f in features], axis=1)
    out: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    order = np.lexsort((step, traj))
    traj, step, split, values = traj[order], step[order], split[order], values[order]
    bounds = np.flatnonzero(np.diff(traj)) + 1
    for idx in np.split(np.arange(len(traj)), bounds):
        if len(idx) == 0:
            continue
        s = str(split[idx[0]])
        if s not in SPLITS:
            raise ValueError(f"{path}: trajectory {traj[idx[0]]} has split {s!r}; expected one of {SPLITS}")
        out[s].append(values[idx])
    return SequenceDataset(kind=kind, features=features, vocab=vocab, meta=meta, **out)
