"""UNIPEN pendigits parser and the handwriting dataset: documented counts, determinism, normalisation, pen-up flags."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import MIRROR
from pipeline.data.handwriting import UnipenParseError, digit_trajectory, parse_unipen, prepare_handwriting
from pipeline.data.schema import read_dataset, write_dataset

HW = MIRROR / "handwriting"


@pytest.fixture(scope="module")
def hw_dir() -> Path:
    if not (HW / "pendigits-orig.tra").is_file():
        pytest.skip(f"raw-data mirror {HW} not present")
    return HW


@pytest.fixture(scope="module")
def parsed(hw_dir: Path) -> dict[str, list[dict]]:
    return {"train": parse_unipen(hw_dir / "pendigits-orig.tra"), "test": parse_unipen(hw_dir / "pendigits-orig.tes")}


@pytest.fixture(scope="module")
def default_ds(hw_dir: Path):
    return prepare_handwriting(hw_dir)


def test_documented_counts(parsed: dict[str, list[dict]]) -> None:
    tra, tes = parsed["train"], parsed["test"]
    assert (len(tra), len(tes)) == (7494, 3498)
    points = {k: sum(len(s) for d in v for s in d["strokes"]) for k, v in parsed.items()}
    assert points == {"train": 304216, "test": 138578}
    assert Counter(len(d["strokes"]) for d in tra) == {1: 5564, 2: 1921, 3: 9}
    assert Counter(len(d["strokes"]) for d in tes) == {1: 2744, 2: 750, 3: 3, 4: 1}
    assert sum("-" in d["index"] for d in tra) == 1930 and sum("-" in d["index"] for d in tes) == 754
    assert Counter(d["label"] for d in tra)[0] == 780 and Counter(d["label"] for d in tes)[9] == 336
    assert len({d["writer"] for d in tra}) == 30 and len({d["writer"] for d in tes}) == 14
    lengths = [sum(len(s) for s in d["strokes"]) for d in tes]
    assert (min(lengths), max(lengths)) == (9, 231)
    first = tra[0]
    assert (first["label"], first["writer"], first["sample"], first["index"]) == (8, 12, 224, "0")
    assert first["strokes"][0][0].tolist() == [267, 333] and first["strokes"][0].dtype == np.int64


def test_pen_up_convention(parsed: dict[str, list[dict]]) -> None:
    digit = next(d for d in parsed["test"] if len(d["strokes"]) == 4)
    traj = digit_trajectory(digit)
    sizes = [len(s) for s in digit["strokes"]]
    assert traj.shape == (sum(sizes), 3)
    expected = np.zeros(sum(sizes))
    expected[np.cumsum(sizes)[:-1]] = 1.0
    np.testing.assert_array_equal(traj[:, 2], expected)
    np.testing.assert_array_equal(traj[:, :2], np.concatenate(digit["strokes"]))
    single = next(d for d in parsed["train"] if len(d["strokes"]) == 1)
    assert digit_trajectory(single)[:, 2].sum() == 0
    assert digit_trajectory(single, pen_up=False).shape[1] == 2


def test_default_dataset(default_ds, parsed: dict[str, list[dict]]) -> None:
    ds = default_ds
    assert ds.kind == "continuous" and ds.features == ["x", "y", "pen_up"]
    assert (len(ds.train), len(ds.test), len(ds.valid)) == (20, 5, 0)
    assert ds.meta["source"] == "handwriting"
    xy = np.concatenate(ds.train)[:, :2]
    np.testing.assert_allclose(xy.mean(axis=0), 0.0, atol=1e-9)
    np.testing.assert_allclose(xy.std(axis=0), 1.0, atol=1e-9)
    norm = ds.meta["normalization"]
    assert norm["columns"] == ["x", "y"] and len(norm["mean"]) == len(norm["std"]) == 2
    # Undoing the normalisation gives back the integer tablet coordinates of the chosen digits.
    by_index = {d["index"]: d for d in parsed["test"]}
    for traj, seg in zip(ds.test, ds.meta["test_segments"]):
        raw = traj[:, :2] * np.array(norm["std"]) + np.array(norm["mean"])
        np.testing.assert_allclose(raw, np.concatenate(by_index[seg]["strokes"]), atol=1e-9)
    # pen_up is untouched 0/1 and counts the pen lifts of each digit.
    by_index = {d["index"]: d for d in parsed["train"]}
    for traj, seg in zip(ds.train, ds.meta["train_segments"]):
        assert set(np.unique(traj[:, 2])) <= {0.0, 1.0}
        assert traj[:, 2].sum() == len(by_index[seg]["strokes"]) - 1
    assert any(len(by_index[s]["strokes"]) > 1 for s in ds.meta["train_segments"])


def test_determinism_and_seed(hw_dir: Path, default_ds) -> None:
    again = prepare_handwriting(hw_dir, seed=0)
    assert again.meta["train_segments"] == default_ds.meta["train_segments"]
    for a, b in zip(again.train + again.test, default_ds.train + default_ds.test):
        np.testing.assert_array_equal(a, b)
    other = prepare_handwriting(hw_dir, seed=1)
    assert other.meta["train_segments"] != default_ds.meta["train_segments"]
    assert other.meta["test_segments"] != default_ds.meta["test_segments"]


def test_options(hw_dir: Path, tmp_path: Path) -> None:
    ds = prepare_handwriting(hw_dir, n_train=7, n_test=3, digits=[4, 7], pen_up=False, seed=3)
    assert ds.features == ["x", "y"] and all(t.shape[1] == 2 for t in ds.train + ds.test)
    assert (len(ds.train), len(ds.test)) == (7, 3)
    assert set(ds.meta["train_labels"]) | set(ds.meta["test_labels"]) <= {4, 7}
    write_dataset(tmp_path / "hw.parquet", ds)
    back = read_dataset(tmp_path / "hw.parquet")
    assert back.features == ["x", "y"] and back.meta["normalization"] == ds.meta["normalization"]
    for a, b in zip(back.train, ds.train):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_train": 0}, "n_train=0"),
    ({"n_test": -1}, "n_test=-1"),
    ({"n_train": 7495}, r"n_train=7495: only 7494 eligible digits .*pendigits-orig\.tra"),
    ({"n_test": 400, "digits": [9]}, r"n_test=400: only 336 eligible digits \(labels \[9\]\)"),
    ({"digits": [10]}, "digits"),
])
def test_bad_arguments(hw_dir: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        prepare_handwriting(hw_dir, **kwargs)


# ----------------------------------------------------------------------------- parser errors on tiny files

GOOD = """.INCLUDE dene.doc
.LEXICON "0" "1"
.HIERARCHY DIGIT

.SEGMENT DIGIT 0 ? "1"
.COMMENT 1 3 0
.PEN_DOWN
 10 20
 11 21
.PEN_UP
.DT 100

.SEGMENT DIGIT 1-2 ? "0"
.COMMENT 0 3 1
.PEN_DOWN
 1 2
.PEN_UP
.DT 100
.PEN_DOWN
 3 4
 5 6
.PEN_UP
.DT 100
"""


def test_parse_small_file(tmp_path: Path) -> None:
    path = tmp_path / "ok.tra"
    path.write_text(GOOD)
    digits = parse_unipen(path)
    assert [d["label"] for d in digits] == [1, 0] and [d["index"] for d in digits] == ["0", "1-2"]
    assert [len(d["strokes"]) for d in digits] == [1, 2]
    assert digit_trajectory(digits[1]).tolist() == [[1, 2, 0], [3, 4, 1], [5, 6, 0]]


@pytest.mark.parametrize("old, new, line, what", [
    (" 11 21\n", " 11 x\n", 9, "two integers"),
    (" 11 21\n", " 11 21 5\n", 9, "two integers"),
    (" 3 4\n 5 6\n", "\n 3 4\n 5 six\n", 22, "two integers"),  # blank line 20 inside a stroke keeps numbering
    (".PEN_UP\n.DT 100\n\n.SEGMENT DIGIT 1-2", "\n.SEGMENT DIGIT 1-2", 11, ".SEGMENT inside an open stroke"),
    ('.SEGMENT DIGIT 0 ? "1"', '.SEGMENT DIGIT 0 ? "x"', 5, "label"),
    (".COMMENT 1 3 0", ".COMMENT 2 3 0", 6, "differs"),
    (".DT 100\n\n.SEGMENT", ".WHAT 100\n\n.SEGMENT", 11, "unknown directive"),
    (" 10 20\n 11 21\n.PEN_UP", ".PEN_UP", 8, "empty stroke"),
])
def test_parse_errors_name_file_and_line(tmp_path: Path, old: str, new: str, line: int, what: str) -> None:
    assert old in GOOD
    path = tmp_path / "bad.tra"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(UnipenParseError) as err:
        parse_unipen(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: ") and what in msg and "\n" not in msg


def test_parse_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "cut.tra"
    path.write_text(GOOD[: GOOD.index(" 5 6")])
    with pytest.raises(UnipenParseError, match=rf"{path}:19: file ends inside a stroke"):
        parse_unipen(path)


def test_parse_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.tra"):
        parse_unipen(tmp_path / "nope.tra")
    (tmp_path / "empty.tra").write_text(".INCLUDE dene.doc\n")
    with pytest.raises(UnipenParseError, match="no .SEGMENT"):
        parse_unipen(tmp_path / "empty.tra")


def test_a_source_option_error_names_the_params_key():
    """The library says ``n_train=...`` in its own terms; the preprocess stage names the params key, and leaves
    errors about other things (a file, a params key already named) as they are."""
    from pipeline.config import ParamsError
    from pipeline.workflow.data import _with_source_key

    src = {"n_train": 100000, "seed": 0}
    err = _with_source_key("handwriting", src, ValueError("n_train=100000: only 7494 eligible digits in x.tra"))
    assert str(err) == "handwriting.source.n_train=100000: only 7494 eligible digits in x.tra"
    for kept in (ValueError("x.tra: file is empty"), ValueError("n_trainx=1: other"),
                 ParamsError("handwriting.source.n_train: expected an integer")):
        assert _with_source_key("handwriting", src, kept) is kept
