"""Handwritten digits as pen trajectories: the UCI pendigits ORIGINAL (UNIPEN) files.

Input: ``raw_dir/pendigits-orig.tra`` (7494 digits, 30 writers) and ``raw_dir/pendigits-orig.tes`` (3498 digits,
14 other writers); format in ``PROVENANCE.md`` of the mirror's ``handwriting/`` folder. Each digit is a
``.SEGMENT`` block with a label, a ``.COMMENT <label> <writer> <sample>`` line and one or more strokes
(``.PEN_DOWN`` ... ``.PEN_UP``) of integer ``x y`` samples taken every 100 ms (y grows upward).

Features. The paper's are "$x$ and $y$ tablet coordinates and pressure levels of the pen", but **the files contain
no pressure** (the UCI description says the tablet's pressure values were ignored and never distributed), so each
time step has ``x`` and ``y`` and, with ``pen_up=True`` (default), a third column ``pen_up``:

* a digit's strokes are concatenated into ONE trajectory, in file order;
* ``pen_up`` is 1.0 on the first point of every stroke after the first (the sample that follows a pen lift: the jump
  from the previous point is a pen-up movement, not ink), and 0.0 everywhere else, so single-stroke digits are all 0.

``x`` and ``y`` are standardised with the mean and standard deviation of the chosen TRAIN points (recorded in meta
``normalization`` with ``columns: ["x", "y"]``); ``pen_up`` is left as 0/1.

Choice of digits. ``n_train`` digits are drawn from the ``.tra`` file and ``n_test`` from the ``.tes`` file (there
is no validation split): ``numpy.random.default_rng(seed)`` permutes the eligible digits of the train file (those
whose label is in ``digits``, all by default), then those of the test file, and the first ``n_*`` of each
permutation are kept, in file order. The same seed gives the same choice; the test choice does not depend on
``n_train``. meta records the chosen ``.SEGMENT`` indices, labels and writers.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.schema import SequenceDataset
from pipeline.messages import brief

log = logging.getLogger(__name__)

TRAIN_FILE = "pendigits-orig.tra"
TEST_FILE = "pendigits-orig.tes"
_HEADER_DIRECTIVES = {".INCLUDE", ".LEXICON", ".HIERARCHY", ".COMMENT", ".DT"}
_SEGMENT = re.compile(r'\.SEGMENT\s+DIGIT\s+(\S+)\s+\S+\s+"([^"]*)"\s*$')


class UnipenParseError(ValueError):
    """A UNIPEN file does not follow the expected format; the message is ``file:line: what``."""


def parse_unipen(path: str | Path) -> list[dict[str, Any]]:
    """Parse a pendigits UNIPEN file into one dict per digit, in file order.

    Keys: ``label`` (int 0-9), ``writer`` and ``sample`` (ints from the ``.COMMENT`` line, ``None`` if absent),
    ``index`` (the ``.SEGMENT`` index, e.g. ``"6-7"`` for a multi-stroke digit), ``line`` (1-based line of the
    ``.SEGMENT``) and ``strokes`` (a list of ``(n, 2)`` int64 arrays of x, y). Any deviation from the format raises
    :class:`UnipenParseError` naming the file and line number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: UNIPEN file not found (fetch the 'handwriting' dataset first)")
    try:
        text = path.read_text(encoding="ascii")
    except UnicodeDecodeError as exc:
        raise UnipenParseError(f"{path}: not an ASCII UNIPEN file (byte {exc.start})") from None

    digits: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    stroke: list[str] | None = None  # coordinate lines of the open stroke, None when the pen is up
    stroke_line = 0

    def fail(lineno: int, what: str) -> UnipenParseError:
        return UnipenParseError(f"{path}:{lineno}: {what}")

    def close_digit(lineno: int) -> None:
        if current is not None and not current["strokes"]:
            raise fail(lineno, f"digit starting at line {current['line']} has no strokes")

    lines = text.split("\n")
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if stroke is not None and not line.startswith("."):
            stroke.append(line)  # converted in bulk at .PEN_UP (fast path), checked line by line on error
            continue
        if not line:
            continue
        if line[0] != ".":
            raise fail(lineno, f"coordinates outside a .PEN_DOWN/.PEN_UP stroke: {line[:40]!r}")
        directive = line.split(maxsplit=1)[0]
        if directive == ".SEGMENT":
            if stroke is not None:
                raise fail(lineno, f".SEGMENT inside an open stroke (.PEN_DOWN at line {stroke_line} has no .PEN_UP)")
            close_digit(lineno)
            m = _SEGMENT.match(line)
            if m is None:
                raise fail(lineno, f'expected \'.SEGMENT DIGIT <index> ? "<label>"\', got {line[:60]!r}')
            if not re.fullmatch(r"[0-9]", m.group(2)):
                raise fail(lineno, f"digit label must be one of 0-9, got {m.group(2)!r}")
            current = {"label": int(m.group(2)), "writer": None, "sample": None, "index": m.group(1),
                       "line": lineno, "strokes": []}
            digits.append(current)
        elif directive == ".PEN_DOWN":
            if current is None:
                raise fail(lineno, ".PEN_DOWN before any .SEGMENT")
            if stroke is not None:
                raise fail(lineno, f".PEN_DOWN while the pen is already down (since line {stroke_line})")
            stroke, stroke_line = [], lineno
        elif directive == ".PEN_UP":
            if stroke is None:
                raise fail(lineno, ".PEN_UP without a matching .PEN_DOWN")
            if not any(stroke):
                raise fail(lineno, f"empty stroke (no points between .PEN_DOWN at line {stroke_line} and .PEN_UP)")
            assert current is not None
            current["strokes"].append(_points(stroke, stroke_line, fail))
            stroke = None
        elif directive == ".COMMENT" and current is not None:
            if stroke is not None:
                raise fail(lineno, f".COMMENT inside an open stroke (the .PEN_DOWN at line {stroke_line})")
            parts = line.split()
            if len(parts) != 4 or not all(p.lstrip("-").isdigit() for p in parts[1:]):
                raise fail(lineno, f"expected '.COMMENT <label> <writer> <sample>', got {line[:60]!r}")
            if int(parts[1]) != current["label"]:
                raise fail(lineno, f".COMMENT label {parts[1]} differs from the .SEGMENT label {current['label']}")
            current["writer"], current["sample"] = int(parts[2]), int(parts[3])
        elif directive in _HEADER_DIRECTIVES:
            if stroke is not None:
                raise fail(lineno, f"{directive} inside an open stroke (the .PEN_DOWN at line {stroke_line})")
        else:
            raise fail(lineno, f"unknown directive {directive!r}")
    if stroke is not None:
        raise fail(stroke_line, "file ends inside a stroke (.PEN_DOWN without .PEN_UP)")
    close_digit(len(lines))
    if not digits:
        raise UnipenParseError(f"{path}: no .SEGMENT blocks found; is this a pendigits-orig file?")
    return digits


def _points(lines: list[str], pen_down_line: int, fail: Any) -> np.ndarray:
    """Convert a stroke's lines (blank ones included, so offsets are line numbers) to an ``(n, 2)`` int64 array.

    The fast path converts all tokens at once; only when that fails is each line checked, to name the bad one.
    """
    tokens = " ".join(lines).split()
    n_points = sum(1 for line in lines if line)
    if len(tokens) == 2 * n_points:
        try:
            return np.array(tokens, dtype=np.int64).reshape(-1, 2)
        except ValueError:
            pass
    for k, line in enumerate(lines, start=1):
        parts = line.split()
        if line and (len(parts) != 2 or not all(p.lstrip("+-").isdigit() for p in parts)):
            raise fail(pen_down_line + k, f"expected two integers 'x y', got {line[:40]!r}")
    raise fail(pen_down_line, "malformed coordinates in this stroke")  # pragma: no cover


@functools.lru_cache(maxsize=4)
def _parse_cached(path: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], ...]:
    """:func:`parse_unipen`, memoised on the file's identity (path, mtime, size); the result is never mutated."""
    digits = tuple(parse_unipen(path))
    for d in digits:
        for stroke in d["strokes"]:
            stroke.flags.writeable = False
    return digits


def _parse(path: Path) -> tuple[dict[str, Any], ...]:
    if not path.is_file():
        return tuple(parse_unipen(path))  # raises the clear FileNotFoundError
    st = path.stat()
    return _parse_cached(str(path.resolve()), st.st_mtime_ns, st.st_size)


def digit_trajectory(digit: dict[str, Any], pen_up: bool = True) -> np.ndarray:
    """Concatenate a digit's strokes into a float64 ``(T, 2)`` or ``(T, 3)`` array (x, y[, pen_up])."""
    xy = np.concatenate(digit["strokes"], axis=0).astype(np.float64)
    if not pen_up:
        return xy
    flag = np.zeros((len(xy), 1))
    starts = np.cumsum([len(s) for s in digit["strokes"]])[:-1]  # first point of strokes 2, 3, ...
    flag[starts, 0] = 1.0
    return np.hstack([xy, flag])


def _choose(n: int, eligible: list[int], rng: np.random.Generator, what: str, path: Path, labels: list[int]
            ) -> list[int]:
    if n > len(eligible):
        raise ValueError(f"{what}={n}: only {len(eligible)} eligible digits (labels {labels}) in {path}")
    # permutation over all eligible digits, so the choice for a given seed is a prefix-stable sample
    perm = rng.permutation(len(eligible))
    return sorted(eligible[i] for i in perm[:n])


def prepare_handwriting(
    raw_dir: Path,
    *,
    n_train: int = 20,
    n_test: int = 5,
    seed: int = 0,
    pen_up: bool = True,
    digits: list[int] | None = None,
) -> SequenceDataset:
    """Build the continuous handwriting dataset (one trajectory per digit); see the module docstring."""
    raw_dir = Path(raw_dir)
    for what, n in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{what}={brief(n)}: expected a positive integer")
    if digits is not None:
        digits = [int(d) for d in digits]
        if not digits or any(d < 0 or d > 9 for d in digits):
            raise ValueError(f"digits={brief(digits)}: expected a non-empty list of labels in 0-9 (or None for all)")
    wanted = set(range(10)) if digits is None else set(digits)
    rng = np.random.default_rng(seed)

    chosen: dict[str, list[dict[str, Any]]] = {}
    for split, name, n, what in (("train", TRAIN_FILE, n_train, "n_train"), ("test", TEST_FILE, n_test, "n_test")):
        path = raw_dir / name
        parsed = _parse(path)
        eligible = [i for i, d in enumerate(parsed) if d["label"] in wanted]
        chosen[split] = [parsed[i] for i in _choose(n, eligible, rng, what, path, sorted(wanted))]

    trajs = {s: [digit_trajectory(d, pen_up) for d in ds] for s, ds in chosen.items()}
    points = np.concatenate([t[:, :2] for t in trajs["train"]], axis=0)
    mean = points.mean(axis=0)
    std = points.std(axis=0)
    std[std == 0] = 1.0
    for ts in trajs.values():
        for t in ts:
            t[:, :2] = (t[:, :2] - mean) / std

    features = ["x", "y", "pen_up"] if pen_up else ["x", "y"]
    meta: dict[str, Any] = {
        "source": "handwriting",
        "files": {"train": TRAIN_FILE, "test": TEST_FILE},
        "seed": seed,
        "digits": sorted(wanted),
        "pen_up": pen_up,
        "pressure": "absent from the UNIPEN files; not a feature",
        "normalization": {"mean": mean.tolist(), "std": std.tolist(), "columns": ["x", "y"]},
    }
    for split, ds in chosen.items():
        meta[f"{split}_segments"] = [d["index"] for d in ds]
        meta[f"{split}_labels"] = [d["label"] for d in ds]
        meta[f"{split}_writers"] = [d["writer"] for d in ds]
    log.info("handwriting: %d train / %d test digits (seed %d)", len(trajs["train"]), len(trajs["test"]), seed)
    return SequenceDataset(kind="continuous", train=trajs["train"], test=trajs["test"], features=features, meta=meta)
