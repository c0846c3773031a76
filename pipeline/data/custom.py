"""A user's own sequence data, from one Parquet file, checked and turned into a :class:`SequenceDataset`.

Input schema (one row per time step; the file is only read, never modified):

=================  ==============================  ====================================================================
column             type                            meaning
=================  ==============================  ====================================================================
``trajectory``     integer or string (required)    which sequence the row belongs to; any ids, need not be contiguous
``step``           integer (optional)              order of the rows within a trajectory (only the order matters, gaps
                                                   are allowed; duplicates are an error). Absent: file row order.
``split``          string (optional)               ``train``, ``valid`` or ``test``; within a trajectory each
                                                   split's rows are one contiguous block in step order (one long
                                                   recording: train steps, then test steps), and each block is a
                                                   trajectory of its own, ``"<id>/<k>"``, when there are several.
                                                   Absent: whole trajectories are drawn for test with
                                                   ``test_fraction`` (deterministic given ``seed``; n x fraction
                                                   rounded half up, at least one trajectory on each side), then
                                                   for valid with ``valid_fraction`` (default 0: no valid split;
                                                   rounded likewise, at least one when > 0), the rest is train.
``symbol``         integer, string or bool         ``kind="discrete"``: the observation. The name is set by
                                                   ``symbol_column``. Vocabulary = sorted distinct TRAIN values;
                                                   valid/test values absent from train: by ``unknown`` (below);
                                                   more distinct symbols than half the training steps, a WARNING
                                                   (an id column rather than symbols?).
feature columns    integer, float or bool          ``kind="continuous"``: the observation, one column per dimension,
                                                   read as float64 (integers beyond ±2**53 are an error; bools as
                                                   0/1, when named in ``features``).
                                                   ``features=None`` takes every numeric column except
                                                   ``trajectory``, ``step``, ``split`` (and pandas index columns).
=================  ==============================  ====================================================================

Auto-detected features (``features=None``): a column is a feature if its Parquet type is integer or floating point
(dictionary-encoded too). Every other column besides ``trajectory``/``step``/``split`` and pandas index columns
(strings, booleans, lists, structs, timestamps, dates, decimals, ...) is dropped with a logged WARNING naming the
dropped columns; name the columns in ``features`` to silence it (a named bool column is read as 0/1; any other
named non-numeric column is an error). If no
column is left, that is an error; so is a string column whose values all read as numbers (checked on its first
100 values): a feature written as text, e.g. from a CSV, is not dropped silently. A numeric column that looks like
no measurement (increasing within every trajectory, like a time stamp; or constant within each trajectory but not
across them, like a room number) is taken all the same, with one WARNING naming it. A dropped column's text is not
checked further: bytes that are not UTF-8 there make it no number, and it is dropped like any other text.

Checks, each a one-line :class:`ValueError` naming the file, the column or value, and what was expected: a file
that is not Parquet or whose structure is truncated or garbled (always detected); corrupt bytes inside a data page,
detected only when the file carries page checksums (it is read with page checksum verification on; the pipeline's
own Parquet files are written with them, but pyarrow, pandas and most other writers write none by default, and a
flipped byte in a checksum-less file's values can read back as a silently different number); a column name that
appears more than once; missing columns; wrong types (e.g. a non-numeric feature column); text that is not valid
UTF-8 in ``trajectory``/``split``/symbol (with the first row and its bytes: Parquet does not check the bytes of a
string column, and pyarrow's own error names neither file nor column); missing values in
``trajectory``/``step``/``split``/symbol; NaN or Inf in a feature (with the number of rows and the first
trajectory); integers beyond ±2**53 in a feature (float64 would round them); duplicate steps; trajectories
shorter than ``min_length`` rows; an empty train or test split; a valid or test split whose trajectories are all
a single step (``min_length=1``; no one-step prediction to score); a discrete dataset with a single symbol, or
with valid/test symbols not seen in train (``unknown="error"``, the default). Steps whose spacing differs from their trajectory's first spacing
(its first two steps) get one WARNING, naming the first such step.

Valid/test symbols not seen in train (discrete data), as PTB's ``unknown`` (:mod:`pipeline.data.ptb`):

* ``"error"`` (default): a ValueError naming them and this option;
* ``"drop"``: their steps are removed (the steps around them become neighbours; meta ``trajectory_steps`` keeps the
  file's step values of the steps kept), a trajectory left empty is removed, one left a single step is refused as
  any other; meta ``dropped_unknown`` gives the count of steps per split;
* ``"map"``: mapped to an extra symbol ``"<unk>"`` appended to the vocabulary (always appended, so the vocabulary
  does not depend on the valid/test data; a train symbol ``"<unk>"`` is that symbol and nothing is appended);
  meta ``mapped_unknown`` gives the count per split.

With ``"drop"`` or ``"map"`` meta ``unknown`` is the rule and ``unknown_symbols`` maps each split to
``{symbol: count}`` of the unseen symbols; with ``"error"`` the meta is as before the option existed.

With ``normalize=True`` continuous features are standardised with the TRAIN mean and standard deviation (a
constant column gets std 1), recorded in meta ``normalization`` (``mean``, ``std``, ``columns``). Huge finite values
(up to ±1.8e308) do not overflow: where the plain statistics are not finite they are computed on each column
divided by its largest magnitude and scaled back; a standardised value that is still not finite (a valid/test value
astronomically far from the train spread) is an error naming the column and split. Trajectories are stored in
increasing id order within each split; meta ``trajectory_ids`` maps each split to the original ids, and with a
``step`` column meta ``trajectory_steps`` to their step values (the prepared file numbers them 0, 1, ...; see
:func:`pipeline.workflow.evaluate.source_steps`).

``segment_length`` (default None: trajectories whole) cuts every trajectory, each block of a split column that
changes within one, into consecutive segments of that many steps before the split is drawn; a remainder shorter
than ``segment_length`` joins the last segment (no step is dropped). Cut trajectories become ``"<id>/<k>"`` (k in
step order; with ``segment_length`` every trajectory is), stored in the order of their ids, then k, and meta
``trajectory_steps`` gives each one's steps in the file (row positions within its trajectory without a step
column).

Arguments are checked before the file is read, each a one-line :class:`ValueError` naming the argument: ``path`` a
str or ``os.PathLike``; ``kind`` one of ``KINDS``; ``features`` None or a list (or tuple) of column-name strings (a
plain string such as ``"xy"`` is refused, not split into letters); ``symbol_column`` a string; ``test_fraction`` a
number in (0, 1); ``valid_fraction`` a number in [0, 1) with ``test_fraction + valid_fraction < 1``; ``seed`` an
integer in [0, 2**32); ``normalize`` a bool; ``min_length`` a positive integer; ``segment_length`` None or an
integer >= 2 and >= ``min_length``.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.schema import KINDS, SPLITS, SequenceDataset, unscorable, utf8_error
from pipeline.io import sha256_file
from pipeline.messages import brief, brief_list, odd_units, unlikely_measurements
from pipeline.train_config import SEED_LIMIT

#: what becomes of valid/test symbols not seen in train (discrete data); as PTB's (pipeline.data.ptb.UNKNOWN_RULES)
UNKNOWN_RULES = ("error", "drop", "map")
UNK_SYMBOL = "<unk>"   # the symbol unknown="map" maps them to, as PTB's

log = logging.getLogger(__name__)

RESERVED = ("trajectory", "step", "split")
_EXACT_INT = 2 ** 53   # float64 holds every integer of at most this magnitude exactly, and rounds some beyond
_PANDAS_INDEX = re.compile(r"__index_level_\d+__")


def _warn_uneven_steps(path, codes: np.ndarray, steps: np.ndarray, ids: np.ndarray) -> None:
    """Warn when a trajectory's steps are not evenly spaced (a gap, or a changing interval): the models see only
    the order of the rows, one observation per step, so a missing step is silently treated as no time at all.
    Evenly spaced steps (0, 10, 20, ...) are fine; their spacing is what forecasts continue with.
    An interval is uneven when it differs from its trajectory's first interval, so the warning names where the
    pace first changes: against a median or most common spacing, 0, 1, 2, 4, 6, 8 (spacing 2 most often) would
    name step 1, and 0, 1, 2, 4, 6 (median 1.5) every interval."""
    same = np.diff(codes) == 0
    diffs = np.diff(steps)
    uneven = np.zeros_like(same)
    starts = np.flatnonzero(np.r_[True, ~same])   # first interval index of each trajectory in diffs
    for a, b in zip(starts, np.r_[starts[1:], len(diffs)]):
        inside = np.flatnonzero(same[a:b]) + a
        if len(inside):
            uneven[inside] = diffs[inside] != diffs[inside[0]]
    if uneven.any():
        k = int(np.flatnonzero(uneven)[0])
        first = int(np.searchsorted(codes, codes[k]))   # codes are sorted: the trajectory's first interval
        trajs = len(np.unique(codes[1:][uneven]))
        log.warning("%s: %d step intervals in %d trajector%s differ from their trajectory's first spacing (first: "
                    "trajectory %r, step %d after %d, where its steps began %d apart); the models use only the "
                    "order of the rows, one observation per step", path, int(uneven.sum()), trajs,
                    "y" if trajs == 1 else "ies", _py(ids[codes[k]]), int(steps[k + 1]), int(steps[k]),
                    int(diffs[first]))

def _warn_unlikely_features(path, values: np.ndarray, columns: list[str], order: np.ndarray,
                            lengths: np.ndarray) -> None:
    """Warn once about numeric columns that ``features=None`` takes but that look like no measurement
    (:func:`pipeline.messages.unlikely_measurements`: a time stamp or row counter kept beside or instead of
    ``step``, an id or a label); they stay features. ``order``: row indices in (trajectory, step) order;
    ``lengths`` per trajectory."""
    # a column at a time (unlikely_measurements judges each alone): values[order] would copy every feature
    found = [f"{columns[j]!r} ({why})" for j in range(values.shape[1])
             for _, why in unlikely_measurements(values[order, j], lengths)]
    if found:
        log.warning("%s: numeric columns taken as features (features=None) that look like no measurement: %s; name "
                    "the feature columns in features to leave them out (time belongs in the step column, as "
                    "integers)", path, ", ".join(found))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _check_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path={brief(path)}: expected a str or os.PathLike naming a Parquet file")
    return Path(path)


def _numbers_as_text(path: Path, column: str, arrow_type: Any, sample: int = 100) -> str | None:
    """The first value of a string ``column`` when its first ``sample`` non-null values all read as numbers
    (a CSV's numbers converted to Parquet as text), else None: such a column is a feature stored as text, which
    ``features=None`` would otherwise drop with a warning alone. Reads one row group of that column only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return None
    pf = pq.ParquetFile(path)
    if pf.metadata.num_row_groups == 0:
        return None
    col = pf.read_row_group(0, columns=[column]).column(0).slice(0, 10 * sample)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    # as bytes: a value that is not UTF-8 is not a number written as text (and to_pylist of it as str would fail)
    raw = col.cast(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary()).to_pylist()
    values = []
    for b in raw:
        if b is None:
            continue
        try:
            v = b.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if v.strip():
            values.append(v)
    values = values[:sample]
    if not values:
        return None
    for v in values:
        try:
            float(v)
        except ValueError:
            return None
    return values[0]


def _is_real(value: Any) -> bool:
    """A real number, not a bool (``True`` is an ``int`` to Python) and not a string."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _check_options(test_fraction: Any, valid_fraction: Any, seed: Any, normalize: Any) -> None:
    """The split and normalisation arguments of :func:`load_custom`: one-line errors naming the argument."""
    if not _is_real(test_fraction) or not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction={brief(test_fraction)}: expected a number strictly between 0 and 1")
    if not _is_real(valid_fraction) or not 0.0 <= float(valid_fraction) < 1.0 \
            or float(test_fraction) + float(valid_fraction) >= 1.0:
        raise ValueError(f"valid_fraction={brief(valid_fraction)}: expected a number >= 0 with test_fraction + "
                         f"valid_fraction < 1 (test_fraction={brief(test_fraction)})")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed={brief(seed)}: expected an integer with 0 <= seed < 2**32")
    if not isinstance(normalize, (bool, np.bool_)):
        raise ValueError(f"normalize={brief(normalize)}: expected a bool (True or False)")


def _check_segment_length(segment_length: Any, min_length: Any) -> None:
    """None (trajectories kept whole) or an integer of at least 2 steps (a segment must hold a step to predict)
    and at least ``min_length`` (a segment is a trajectory of the dataset, held to the same rule)."""
    if segment_length is None:
        return
    low = max(2, min_length) if _is_real(min_length) else 2
    if isinstance(segment_length, (bool, np.bool_)) or not isinstance(segment_length, (int, np.integer)) \
            or segment_length < low:
        why = f"min_length={min_length}" if low > 2 else "a segment needs a step to predict"
        raise ValueError(f"segment_length={brief(segment_length)}: expected an integer >= {low} ({why}), or None to "
                         "keep trajectories whole")


def _pieces(rows: "Rows", segment_length: int | None, min_length: int, min_length_is: str = "min_length"
            ) -> tuple[list[Any], list[np.ndarray], list[int] | None]:
    """The trajectories of the dataset: those of the file, cut where the ``split`` column changes within one and,
    with ``segment_length``, into consecutive segments; (ids, row indices of each in step order, offsets).

    One long recording is the common case: its split column may give a block of train steps, then valid or test
    ones (each split's rows contiguous within the trajectory, so no split sees another's steps in between), and
    ``segment_length`` cuts it (each block, when there are several) into pieces that are drawn for the splits
    and batched like trajectories. A remainder shorter than ``segment_length`` joins the segment before it, so
    no step is dropped and every segment has ``segment_length`` to ``2 * segment_length - 1`` steps (a block or
    trajectory shorter than that stays whole): the windows of 2SR fit every segment whenever they fit
    ``segment_length``. A cut trajectory's pieces are ``"<id>/<k>"``, k = 0, 1, ... in step order; with
    ``segment_length`` every trajectory is; when any is cut every id is a string (one type in the predictions'
    ``trajectory_id`` column), and a piece's id may not repeat another trajectory's. ``offsets`` (None when
    nothing is cut): each piece's first row position within its trajectory of the file, the step that names it
    where the file has no step column (with one, the piece's rows give its steps)."""
    path, split, steps = rows.path, rows.split, rows.steps
    ids: list[Any] = []
    groups: list[np.ndarray] = []
    offsets: list[int] = []
    cut = segment_length is not None
    for k, g in enumerate(rows.groups):
        traj = _py(rows.ids[k])
        blocks = [g]
        if split is not None:
            s = split[g]
            changes = np.flatnonzero(s[1:] != s[:-1]) + 1
            if changes.size:
                blocks = np.split(g, changes)
                names = [str(split[b[0]]) for b in blocks]
                if any(names.count(n) > 1 for n in names):
                    again = next(j for j in range(len(names)) if names[j] in names[:j])
                    where = (f"step {int(steps[blocks[again][0]])}" if steps is not None else
                             f"row {int(blocks[again][0])} of the file")
                    raise ValueError(f"{path}: column 'split': trajectory {traj!r} returns to split "
                                     f"{names[again]!r} at {where} after {names[again - 1]!r} (splits in step order: "
                                     f"{brief_list(names)}); expected each split's rows of a trajectory to be one "
                                     "contiguous block (e.g. train steps first, then test steps)")
                short = next((b for b in blocks if len(b) < min_length), None)
                if short is not None:
                    where = (f"step {int(steps[short[0]])}" if steps is not None else
                             f"row {int(short[0])} of the file")
                    raise ValueError(f"{path}: column 'split': trajectory {traj!r} has a block of {_rows_of(len(short))}"
                                     f" in split {str(split[short[0]])!r} (from {where}), shorter than {min_length_is}="
                                     f"{min_length}; expected each split's block of a trajectory to be at least "
                                     f"min_length rows")
                cut = True
        if segment_length is not None:
            blocks = [seg for b in blocks
                      for seg in np.split(b, np.arange(segment_length, len(b) // segment_length * segment_length,
                                                       segment_length))]
        start = 0   # the blocks are consecutive slices of g
        for j, b in enumerate(blocks):
            ids.append(f"{traj}/{j}" if segment_length is not None or len(blocks) > 1 else traj)
            groups.append(b)
            offsets.append(start)
            start += len(b)
    if cut:   # ids of one type (a whole trajectory 8 beside pieces "7/0" is "8": a column of one type), all distinct
        ids = [str(i) for i in ids]
        seen: set[str] = set()
        twice = next((i for i in ids if i in seen or seen.add(i)), None)
        if twice is not None:
            raise ValueError(f"{path}: trajectory id {twice!r} of a piece of a cut trajectory is also the id of "
                             "another trajectory (or of its piece); expected ids that do not end in '/<number>' when "
                             "trajectories are cut (rename the trajectory)")
    return ids, groups, offsets if cut else None


def _sorted_codes(col: Any) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of the Arrow column ``col`` (no nulls), exactly. A string column's
    distinct values are found by Arrow's hash (``unique``, ``index_in``) and only they are sorted by numpy: numpy
    on the whole column would make one Python str per row and sort them all by Python comparisons (3.2M rows of
    10 recordings: ~8 s and ~200 MB, n log n, more than reading the file)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return np.unique(np.asarray(col.to_numpy(zero_copy_only=False)), return_inverse=True)
    distinct = pc.unique(col)
    uniq, rank = np.unique(np.asarray(distinct.to_numpy(zero_copy_only=False)), return_inverse=True)
    position = pc.index_in(col, value_set=distinct)   # each row's index in distinct (every value is there)
    return uniq, rank[np.asarray(position.to_numpy(zero_copy_only=False))]


def _py(value: Any) -> Any:
    """A numpy scalar as a plain Python value (for messages and JSON meta)."""
    return value.item() if isinstance(value, np.generic) else value


@dataclass
class Rows:
    """The checked rows of a sequence file: ``groups[k]`` are the row indices of trajectory ``ids[k]`` in step
    order; ``values`` holds the symbol (discrete) or the feature columns (continuous) of every row."""

    path: Path
    ids: np.ndarray
    groups: list[np.ndarray]
    values: np.ndarray
    columns: list[str]
    split: np.ndarray | None   # the split column's values (``with_split`` and present), else None
    steps: np.ndarray | None   # the step column's values when present, else None


def _looks_like_text(path: Path) -> bool:
    """Whether ``path`` starts as text would (no Parquet magic, printable UTF-8 in its first 4 KiB)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if not head or head.startswith(b"PAR1"):
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:   # a multi-byte character cut at the end of the block is still text
        if exc.start < len(head) - 3:
            return False
        text = head[:exc.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n" for c in text.lstrip("\ufeff"))


def read_rows(
    path: Path,
    *,
    kind: str,
    features: list[str] | None = None,
    symbol_column: str = "symbol",
    min_length: int = 1,
    with_split: bool = False,
    features_are: str = "named in features",
    symbol_column_is: str = "set symbol_column to its name",
) -> "Rows":
    """Read and check the rows of ``path`` (schema and checks in the module docstring), grouped by trajectory.

    ``with_split`` reads and checks the ``split`` column when there is one; without it the column is not read.
    ``features_are`` says in a missing-column error where the feature names come from.
    Used by :func:`load_custom` and, for new data given to a trained model, by :mod:`pipeline.inference`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _check_path(path)
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind={brief(kind)}: expected one of {KINDS}")
    if isinstance(min_length, (bool, np.bool_)) or not isinstance(min_length, (int, np.integer)) or min_length < 1:
        raise ValueError(f"min_length={brief(min_length)}: expected a positive integer")
    if not isinstance(symbol_column, str):
        raise ValueError(f"symbol_column={brief(symbol_column)}: expected a column name (a string)")
    if kind == "discrete" and features is not None:
        raise ValueError(f"features={brief(features)}: only used with kind='continuous' (discrete data uses "
                         "symbol_column)")
    if features is not None:
        if not isinstance(features, (list, tuple)) or not all(isinstance(f, str) for f in features):
            raise ValueError(f"features={brief(features)}: expected a list of column names (strings), or None for all "
                             "numeric columns")
        features = list(features)
        if not features:
            raise ValueError("features=[]: expected at least one feature column (or None for all numeric columns)")
        if len(set(features)) != len(features):
            raise ValueError(f"features={brief(features)}: column names repeat")
        bad = [f for f in features if f in RESERVED]
        if bad:
            raise ValueError(f"features={brief(features)}: {bad} are reserved columns, not features")

    if not path.exists():
        raise FileNotFoundError(f"{path}: file not found")
    if not path.is_file():
        raise ValueError(f"{path}: not a file (expected a single Parquet file)")
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for damaged files
        if _looks_like_text(path):   # most often a CSV given as it is
            raise ValueError(f"{path}: a text file (CSV?), not Parquet; expected a Parquet file: convert it, e.g. "
                             "pandas.read_csv(...).to_parquet(...) (README, 'Adding your own dataset')") from None
        raise ValueError(f"{path}: not a readable Parquet file (truncated or corrupt?): {_one_line(exc)}") from None
    names = list(schema.names)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{path}: columns appearing more than once: {brief_list(repeated)}; expected each column name "
                         "once (rename or drop the duplicates)")
    types = {name: schema.field(i).type for i, name in enumerate(names)}

    def fail(what: str) -> ValueError:
        return ValueError(f"{path}: {what}")

    def require(column: str, why: str) -> None:
        if column not in types:
            raise fail(f"missing column {column!r} ({why}); columns present: {names}")

    require("trajectory", "the trajectory id of each row")
    auto_features = kind == "continuous" and features is None   # taken from the column types below
    if kind == "discrete":
        require(symbol_column, f"the discrete observation; {symbol_column_is}")
        if symbol_column in RESERVED:
            raise fail(f"the symbol column {symbol_column!r} is one of the reserved columns {list(RESERVED)}; expected "
                       f"the column of symbols: {symbol_column_is}")
        value_columns = [symbol_column]
    else:
        if features is None:
            features = [n for n in names if n not in RESERVED and not _PANDAS_INDEX.fullmatch(n)
                        and _is_numeric(types[n])]
            skipped = [n for n in names if n not in RESERVED and n not in features and not _PANDAS_INDEX.fullmatch(n)]
            for n in skipped:
                sample = _numbers_as_text(path, n, types[n])
                if sample is not None:
                    raise fail(f"column {n!r} holds numbers as text ({types[n]}, e.g. {sample!r}); expected an "
                               "integer or float column: cast it before writing the file (pandas: "
                               f"df[{n!r}] = df[{n!r}].astype(float)), or name the feature columns in features to "
                               "leave it out")
            if skipped:
                text = [n for n in skipped if pa.types.is_string(types[n]) or pa.types.is_large_string(types[n])
                        or pa.types.is_dictionary(types[n])]
                symbols = (f" (a column of symbols? kind: discrete with symbol_column: {text[0]} reads it)"
                           if text else "")
                flags = (" (a bool column named in features is read as 0/1)"
                         if any(_is_bool(types[n]) for n in skipped) else "")
                log.warning("%s: non-numeric columns dropped from the features (features=None takes integer and "
                            "float columns only): %s; name the feature columns in features to silence this%s%s",
                            path, ", ".join(f"{n!r} ({types[n]})" for n in skipped), flags, symbols)
            if not features:
                raise fail(f"no numeric feature columns found (columns present: {names}); expected integer or float "
                           "columns besides trajectory/step/split (or bool ones named in features)")
        for f in features:
            require(f, features_are)
        value_columns = list(features)
    has_step, has_split = "step" in types, with_split and "split" in types

    def value_type(t: Any) -> Any:
        return t.value_type if pa.types.is_dictionary(t) else t

    t = value_type(types["trajectory"])
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise fail(f"column 'trajectory' has type {t}; expected integer or string ids")
    if has_step and not pa.types.is_integer(value_type(types["step"])):
        raise fail(f"column 'step' has type {types['step']}; expected integers (time stamps or whole numbers stored "
                   "as floats: convert them before writing the file, pandas: df['step'] = df['step'].astype('int64'), "
                   "or leave the column out to use the row order)")
    if has_split and not (pa.types.is_string(value_type(types["split"]))
                          or pa.types.is_large_string(value_type(types["split"]))):
        raise fail(f"column 'split' has type {types['split']}; expected strings 'train', 'valid' or 'test'")
    if kind == "discrete":
        t = value_type(types[symbol_column])
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_boolean(t) or pa.types.is_floating(t)):
            raise fail(f"column {symbol_column!r} has type {t}; expected integer, string or bool symbols")
    else:
        for f in value_columns:
            # a named bool column is read as 0.0/1.0: a flag such as Handwriting's pen_up is a measurement too
            # (features=None leaves bools out, as it always has: a label such as is_anomaly is one as well)
            if not _is_numeric(types[f]) and not _is_bool(types[f]):
                sample = _numbers_as_text(path, f, types[f])
                hint = "" if sample is None else (f" (it holds numbers as text, e.g. {sample!r}: cast it before "
                                                  f"writing the file, pandas: df[{f!r}] = df[{f!r}].astype(float))")
                raise fail(f"feature column {f!r} has type {types[f]}; expected a numeric (integer, float or bool) "
                           "column" + hint)

    columns = ["trajectory"] + (["step"] if has_step else []) + (["split"] if has_split else []) + value_columns
    try:
        # verifies the CRC of every page that carries one (pyarrow writes none unless asked: write_page_checksum)
        table = pq.read_table(path, columns=columns, page_checksum_verification=True)
    except Exception as exc:
        if "checksum" in str(exc).lower():
            raise ValueError(f"{path}: corrupt Parquet file: a data page fails its checksum ({_one_line(exc)}); "
                             "expected an intact file: copy or write it again") from None
        raise ValueError(f"{path}: not a readable Parquet file (truncated or corrupt?): {_one_line(exc)}") from None
    n_rows = table.num_rows
    if n_rows == 0:
        raise fail("the file has no rows")

    def column(name: str) -> Any:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        return col

    for name in columns:   # text that is not UTF-8 would fail in numpy with neither file nor column named
        col = column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            bad = utf8_error(path, name, col)
            if bad is not None:
                raise bad

    for name in ["trajectory"] + (["step"] if has_step else []) + (["split"] if has_split else []) + (
            [symbol_column] if kind == "discrete" else []):
        nulls = column(name).null_count
        if nulls:
            first = int(np.flatnonzero(column(name).is_null().to_numpy(zero_copy_only=False))[0])
            raise fail(f"column {name!r} has {nulls} missing (null) values (first at row {first}); expected none")

    uniq, codes = _sorted_codes(column("trajectory"))   # np.unique(ids, return_inverse=True)

    if kind == "continuous":
        # a bool column as 0.0/1.0, through Arrow: numpy would read one with nulls as objects (None), not as NaN
        # filled a column at a time: a list of every column beside their stack held the features twice
        values = np.empty((n_rows, len(value_columns)), dtype=np.float64)
        for j, f in enumerate(value_columns):
            x = np.asarray((column(f).cast(pa.float64()) if pa.types.is_boolean(column(f).type) else column(f))
                           .to_numpy(zero_copy_only=False))
            # rounded (2**53 + 1 reads as 2**53), ids or counters with a large offset would collapse into a few
            # values, even into a "constant" column, without a word
            if x.dtype.kind in "iu" and len(x):
                big = (x > _EXACT_INT) if x.dtype.kind == "u" else (x > _EXACT_INT) | (x < -_EXACT_INT)
                if big.any():
                    first = int(np.flatnonzero(big)[0])
                    raise fail(f"feature column {f!r} has {int(big.sum())} integers beyond ±2**53 (first: row "
                               f"{first}, {int(x[first])}), which float64 cannot hold exactly; expected |values| "
                               "<= 2**53: subtract an offset before writing the file, or write the column as "
                               "float if rounding is acceptable")
            values[:, j] = x
            del x
        bad = ~np.isfinite(values).all(axis=1)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            cols = [f for j, f in enumerate(value_columns) if not np.isfinite(values[:, j]).all()]
            raise fail(f"{_rows(int(bad.sum()))} NaN, Inf or missing values in feature columns {cols} "
                       f"(first: row {first}, trajectory {_py(uniq[codes[first]])!r}); expected finite numbers")
    else:
        symbols = column(symbol_column)
        if pa.types.is_string(symbols.type) or pa.types.is_large_string(symbols.type):
            # one str object per distinct symbol, shared by its rows (equal values, object dtype, as to_numpy's):
            # to_numpy makes one per row (~60 bytes each), and sorting them compares text where the shared
            # objects compare as identical
            distinct, index = _sorted_codes(symbols)
            values = distinct[index]
        else:
            values = np.asarray(symbols.to_numpy(zero_copy_only=False))
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            bad = ~np.isfinite(values)
            first = int(np.flatnonzero(bad)[0])
            raise fail(f"{_rows(int(bad.sum()))} NaN or Inf in column {symbol_column!r} "
                       f"(first: row {first}, trajectory {_py(uniq[codes[first]])!r}); expected finite symbols")

    if has_step:
        raw_steps = np.asarray(column("step").to_numpy(zero_copy_only=False))
        if raw_steps.dtype.kind == "u" and len(raw_steps) and raw_steps.max() > np.iinfo(np.int64).max:
            first = int(np.flatnonzero(raw_steps > np.iinfo(np.int64).max)[0])
            raise fail(f"column 'step' has values above 2**63 - 1 (first: row {first}, {int(raw_steps[first])}); "
                       "expected steps that fit a signed 64-bit integer")
        steps = raw_steps.astype(np.int64)
        order = np.lexsort((steps, codes))
        s_codes, s_steps = codes[order], steps[order]
        dup = (np.diff(s_codes) == 0) & (np.diff(s_steps) == 0)
        if dup.any():
            k = int(np.flatnonzero(dup)[0])
            raise fail(f"column 'step' has {int(dup.sum())} duplicate (trajectory, step) rows (first: trajectory "
                       f"{_py(uniq[s_codes[k]])!r}, step {int(s_steps[k])}); expected unique steps per trajectory")
        _warn_uneven_steps(path, s_codes, s_steps, uniq)
    else:
        order = np.argsort(codes, kind="stable")
    s_codes = codes[order]
    bounds = np.flatnonzero(np.diff(s_codes)) + 1
    groups = np.split(order, bounds)  # row indices of each trajectory, in id order, rows in step order
    lengths = np.array([len(g) for g in groups])
    short = np.flatnonzero(lengths < min_length)
    if short.size:
        k = int(short[0])
        raise fail(f"{short.size} trajectories are shorter than min_length={min_length} rows (first: trajectory "
                   f"{_py(uniq[k])!r} with {int(lengths[k])} rows)")

    if auto_features:
        _warn_unlikely_features(path, values, value_columns, order, lengths)

    split_values = None
    if has_split:
        split = column("split")
        if pa.types.is_string(split.type) or pa.types.is_large_string(split.type):   # as the symbols (above)
            distinct, index = _sorted_codes(split)
            split_values = distinct.astype(str)[index]   # the same '<U…' width: the longest of the same values
        else:
            split_values = np.asarray(split.to_numpy(zero_copy_only=False)).astype(str)
    step_values = steps if has_step else None
    return Rows(path=path, ids=uniq, groups=groups, values=values, columns=value_columns, split=split_values,
                steps=step_values)


def load_custom(
    path: Path,
    *,
    kind: str,
    features: list[str] | None = None,
    symbol_column: str = "symbol",
    test_fraction: float = 0.2,
    valid_fraction: float = 0.0,
    seed: int = 0,
    normalize: bool = True,
    min_length: int = 2,
    segment_length: int | None = None,
    unknown: str = "error",
    symbol_column_is: str = "set symbol_column to its name",
    min_length_is: str = "min_length",
    segment_length_is: str = "segment_length",
    normalize_is: str = "normalize",
    unknown_is: str = "unknown",
) -> SequenceDataset:
    """Load, check and split the Parquet file ``path`` (schema and argument checks in the module docstring).
    ``symbol_column_is``: how the caller names the symbol column, for the error when the file lacks it;
    ``min_length_is``, ``segment_length_is``: how it names ``min_length`` and ``segment_length``, for the errors
    on a valid/test split of single steps and on a file of a single trajectory; ``normalize_is``: how it names
    ``normalize``, for the warning on features in odd units left unstandardised; ``unknown_is``: how it names
    ``unknown``, for the error on valid/test symbols not seen in train."""
    _check_path(path)
    if unknown not in UNKNOWN_RULES:
        raise ValueError(f"unknown={brief(unknown)}: expected one of {UNKNOWN_RULES}")
    _check_options(test_fraction, valid_fraction, seed, normalize)
    _check_segment_length(segment_length, min_length)
    rows = read_rows(path, kind=kind, features=features, symbol_column=symbol_column, min_length=min_length,
                     with_split=True, symbol_column_is=symbol_column_is)
    path, values, value_columns = rows.path, rows.values, rows.columns
    has_split, split_values = rows.split is not None, rows.split

    def fail(what: str) -> ValueError:
        return ValueError(f"{path}: {what}")

    if has_split and valid_fraction:
        raise fail(f"has a 'split' column, which decides the splits; valid_fraction={brief(valid_fraction)} is not "
                   "used with it: remove valid_fraction, or mark validation trajectories with split 'valid'")
    if has_split:
        odd_splits = sorted(set(np.unique(split_values).tolist()) - set(SPLITS))
        if odd_splits:
            raise fail(f"column 'split' has values {brief_list(odd_splits)}; expected only {list(SPLITS)}")
    uniq, groups, offsets = _pieces(rows, segment_length, min_length, min_length_is)
    n_traj = len(uniq)
    if has_split:   # one split per piece: _pieces cut each trajectory where its split changes
        split_of = np.array([str(split_values[g[0]]) for g in groups])
        split_source = "column"
    else:
        if n_traj < 2:
            how = (f"{segment_length_is}={segment_length} leaves the trajectory of {len(groups[0])} steps in one "
                   f"piece (a remainder shorter than {segment_length_is} joins the last segment); expected at most "
                   f"{len(groups[0]) // 2} for two segments" if segment_length is not None else
                   f"cut it into segments with {segment_length_is}, or give a 'split' column (e.g. train rows "
                   "first, then test rows)")
            raise fail(f"only {n_traj} trajectory; at least 2 are needed to make non-empty train and test splits: "
                       + how)
        n_test = min(max(_share(test_fraction, n_traj), 1), n_traj - 1)
        # the test draw does not depend on valid_fraction: adding a valid split moves train trajectories only
        n_valid = max(_share(valid_fraction, n_traj), 1) if valid_fraction else 0
        if n_test + n_valid >= n_traj:
            raise fail(f"{n_traj} trajectories: {n_test} for test and {n_valid} for valid (test_fraction="
                       f"{test_fraction}, valid_fraction={valid_fraction}) leave none to train on; expected a "
                       "smaller valid_fraction or more trajectories")
        perm = np.random.default_rng(seed).permutation(n_traj)
        split_of = np.full(n_traj, "train", dtype=object)
        split_of[perm[:n_test]] = "test"
        split_of[perm[n_test:n_test + n_valid]] = "valid"
        split_source = (f"random (test_fraction={test_fraction}, "
                        + (f"valid_fraction={valid_fraction}, " if n_valid else "") + f"seed={seed})")
    for s in ("train", "test"):
        if not (split_of == s).any():
            raise fail(f"split {s!r} is empty (no trajectory has split == {s!r}); expected at least one")

    members = {s: [k for k in range(n_traj) if split_of[k] == s] for s in SPLITS}
    kept_steps: dict[int, np.ndarray] = {}   # unknown="drop": the file's step values of the steps kept
    unknown_symbols: dict[str, dict[Any, int]] = {}
    if kind == "discrete" and unknown != "error":
        train_symbols = np.unique(values[np.concatenate([groups[k] for k in members["train"]])])
        for s in ("valid", "test"):
            counts: dict[Any, int] = {}
            for k in list(members[s]):
                seen = np.isin(values[groups[k]], train_symbols)
                if seen.all():
                    continue
                for v, c in zip(*np.unique(values[groups[k]][~seen], return_counts=True)):
                    counts[_py(v)] = counts.get(_py(v), 0) + int(c)
                if unknown == "drop":
                    steps = (rows.steps[groups[k]] if rows.steps is not None else
                             (offsets[k] if offsets is not None else 0) + np.arange(len(groups[k])))
                    kept_steps[k], groups[k] = steps[seen], groups[k][seen]
                    if not seen.any():
                        members[s].remove(k)
                    elif seen.sum() < min_length:   # held to the rule of every trajectory, as the file's are
                        raise fail(f"trajectory {_py(uniq[k])!r} of split {s!r} keeps {int(seen.sum())} of its "
                                   f"{seen.size} steps once {unknown_is}='drop' removed its symbols not seen in "
                                   f"train, fewer than {min_length_is}={min_length}; expected {unknown_is} 'map', "
                                   f"or a smaller {min_length_is}")
            unknown_symbols[s] = dict(sorted(counts.items(), key=lambda kv: str(kv[0])))
        if not members["test"]:
            raise fail(f"split 'test' is empty: {unknown_is}='drop' removed every test step (no test symbol was "
                       "seen in train); expected test symbols that train has")
    for s in ("valid", "test"):
        which = unscorable([len(groups[k]) for k in members[s]])
        if which:
            raise fail(f"split {s!r}: {which} a single step ({min_length_is}={min_length} lets such trajectories "
                       "through), so there is no one-step prediction to score; expected at least one "
                       f"{s} trajectory of 2 steps or more")
    meta: dict[str, Any] = {
        "source": f"custom:{path.name}",
        "file_sha256": sha256_file(path),
        "split_source": split_source,
        "trajectory_ids": {s: [uniq[k] for k in members[s]] for s in SPLITS},
    }
    if rows.steps is not None or offsets is not None or kept_steps:
        # the prepared file numbers every trajectory's steps 0, 1, ...: the file's own step values (a piece of a
        # trajectory without a step column: its row positions within that trajectory), for the outputs
        meta["trajectory_steps"] = {s: [_recorded_steps(kept_steps[k]) if k in kept_steps else
                                        _recorded_steps(rows.steps[groups[k]]) if rows.steps is not None else
                                        {"first": offsets[k] if offsets is not None else 0, "every": 1}
                                        for k in members[s]] for s in SPLITS}
    if segment_length is not None:
        meta["segment_length"] = int(segment_length)

    if kind == "discrete":
        train_rows = np.concatenate([groups[k] for k in members["train"]])
        vocab_values = np.unique(values[train_rows])
        if len(vocab_values) < 2:
            raise fail(f"column {symbol_column!r} has a single symbol {_py(vocab_values[0])!r} in train; a discrete "
                       "dataset needs at least 2 distinct symbols")
        n_steps = len(train_rows)
        id_like = len(vocab_values) > n_steps / 2   # the symbols must recur to be learned
        for s in ("valid", "test"):
            if not members[s]:
                continue
            idx = np.concatenate([groups[k] for k in members[s]])
            unseen = np.setdiff1d(np.unique(values[idx]), vocab_values)
            if unseen.size and unknown == "error":
                measured = (" (a float column of measurements? kind: continuous reads it as a feature)"
                            if np.asarray(values).dtype.kind == "f" else
                            f" (is {symbol_column!r} an id rather than a symbol? {len(vocab_values)} distinct symbols "
                            f"in {n_steps} training steps)" if id_like else "")
                # measurements: kind is the fix; ids: another column (dropping or mapping them learns nothing)
                remedy = ("" if np.asarray(values).dtype.kind == "f" or id_like else
                          f", or {unknown_is} 'drop' (remove their steps) or 'map' (to an extra symbol "
                          f"{UNK_SYMBOL!r})")
                raise fail(f"column {symbol_column!r}: {s} has symbols not seen in train: "
                           f"{brief_list([_py(v) for v in unseen])}; expected only train symbols{measured}{remedy}")
        if id_like:   # and the features stage's maps grow with their number
            log.warning("%s: column %r has %d distinct symbols in %d training steps, more than half as many; is %r "
                        "an id rather than a symbol?", path, symbol_column, len(vocab_values), n_steps,
                        symbol_column)
        index = np.searchsorted(vocab_values, values)
        vocab = [str(_py(v)) for v in vocab_values]
        if unknown == "map":
            index = index.astype(np.int64)
            if UNK_SYMBOL not in vocab:
                vocab.append(UNK_SYMBOL)
            index[~np.isin(values, vocab_values)] = vocab.index(UNK_SYMBOL)
        trajs = {s: [index[groups[k]].astype(np.int64) for k in members[s]] for s in SPLITS}
        if len(set(vocab)) != len(vocab):
            raise fail(f"column {symbol_column!r}: distinct symbols print the same ({vocab}); use string symbols")
        if unknown != "error":   # the default's meta stays as it was: its prepared files are unchanged
            meta["unknown"] = unknown
            meta["unknown_symbols"] = {s: {str(v): c for v, c in counts.items()}
                                       for s, counts in unknown_symbols.items()}
            meta[f"{'dropped' if unknown == 'drop' else 'mapped'}_unknown"] = {
                s: sum(counts.values()) for s, counts in unknown_symbols.items()}
        meta["symbol_column"] = symbol_column   # psrnn predict / forecast read new files by the same name
        return SequenceDataset(kind="discrete", vocab=vocab, meta=meta, **trajs)

    trajs = {s: [values[groups[k]] for k in members[s]] for s in SPLITS}
    rows.values = values = None   # every row is copied into trajs: the file's table need not stay beside them
    if normalize:
        trajs, meta["normalization"] = _standardise(trajs, value_columns, path)
    else:   # the models train on the values as they are: say where that goes wrong before hours of training do
        large, small = odd_units(np.concatenate(trajs["train"]), value_columns)
        for found, what in ((large, "large units: SGD at the paper's learning rate 1 may diverge"),
                            (small, "small units: SGD barely moves them (the gradients scale with the square of the "
                                    "units)")):
            if found:
                log.warning("%s: train %s in %s; %s is false, so the models read them as they are: expected it "
                            "true (the default: standardised with train's mean and std) or features near unit "
                            "scale", path, found, what, normalize_is)
    return SequenceDataset(kind="continuous", features=list(value_columns), meta=meta, **trajs)


def _recorded_steps(steps: np.ndarray) -> dict[str, int] | list[int]:
    """A trajectory's step values (in step order) for meta ``trajectory_steps``: ``{"first": a, "every": d}`` when
    evenly spaced (the usual case, a few bytes however long the trajectory), else the list of every value.
    :func:`pipeline.workflow.evaluate.source_steps` reads either back."""
    d = np.diff(steps)
    if len(steps) >= 2 and (d == d[0]).all():
        return {"first": int(steps[0]), "every": int(d[0])}
    return [int(x) for x in steps]


def _share(fraction: float, n: int) -> int:
    """``fraction`` of ``n`` rounded half up (0.5 of 5 is 3, of 7 is 4; Python's round would give 2 and 4), on the
    fraction as written: 0.145 x 100 is 14.5, but 14.499999999999998 in binary floating point."""
    return math.floor(Fraction(repr(float(fraction))) * n + Fraction(1, 2))


def _standardise(trajs: dict[str, list[np.ndarray]], columns: list[str], path: Path
                 ) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]]:
    """Standardise every split with the train mean and std of each column, without overflow for huge values."""
    train = np.concatenate(trajs["train"], axis=0)
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = train.mean(axis=0), train.std(axis=0)
    scale = np.ones(train.shape[1])
    huge = ~(np.isfinite(mean) & np.isfinite(std))
    if huge.any():
        # x ** 2 (or the sum of x) overflowed: the statistics of x / max|x| are finite, and so are they scaled back
        scale[huge] = np.abs(train[:, huge]).max(axis=0)
        scaled = train[:, huge] / scale[huge]
        mean[huge], std[huge] = scaled.mean(axis=0), scaled.std(axis=0)  # in units of scale
    # every train value equal, whatever std the rounding of the mean leaves (0.3 a thousand times: 5.7e-15)
    same = train.max(axis=0) == train.min(axis=0)
    constant = [f for f, c in zip(columns, same) if c]
    if constant:
        log.warning("%s: constant feature columns %s in train: std set to 1", path, constant)
    std[same] = 1.0
    del train, same   # the standardised splits are made without the train copy beside them
    out: dict[str, list[np.ndarray]] = {}
    with np.errstate(over="ignore", invalid="ignore"):
        for s, ts in trajs.items():
            out[s] = [(t / scale - mean) / std for t in ts] if huge.any() else [(t - mean) / std for t in ts]
            for t in out[s]:
                bad = ~np.isfinite(t).all(axis=0)
                if bad.any():
                    col = columns[int(np.flatnonzero(bad)[0])]
                    raise ValueError(f"{path}: feature column {col!r} overflows when standardised ({s} values too "
                                     f"far from the train mean/std); expected values of a representable spread "
                                     f"(rescale the column)")
    # |mean| <= scale and std <= scale in the scaled columns: the statistics in data units are finite
    return out, {"mean": (mean * scale).tolist(), "std": (std * scale).tolist(), "columns": list(columns)}


def _is_numeric(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_bool(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_boolean(t.value_type if pa.types.is_dictionary(t) else t)


def _rows(n: int) -> str:
    return "1 row has" if n == 1 else f"{n} rows have"


def _rows_of(n: int) -> str:
    return "1 row" if n == 1 else f"{n} rows"
