"""Character-level PTB: the paper's exact counts (from the mirror) and the unknown-character rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import MIRROR
from pipeline.data.ptb import UNK_SYMBOL, first_lines, prepare_ptb
from pipeline.data.schema import read_dataset, write_dataset

PTB = MIRROR / "ptb"


@pytest.fixture(scope="module")
def ptb_dir() -> Path:
    if not (PTB / "full" / "ptb.train.txt").is_file():
        pytest.skip(f"raw-data mirror {PTB} not present")
    return PTB


def _decode(ds, traj: np.ndarray) -> str:
    return "".join(ds.vocab[i] for i in traj)


def test_paper_counts_1001_lines(ptb_dir: Path) -> None:
    ds = prepare_ptb(ptb_dir)  # defaults: 1001 lines, train vocab, drop unknown
    assert ds.kind == "discrete"
    assert [len(ds.split(s)) for s in ("train", "valid", "test")] == [1, 1, 1]
    assert len(ds.train[0]) == 120780  # the paper's train count
    assert len(ds.vocab) == 44 and ds.vocab == sorted(ds.vocab)
    assert ds.meta["dropped_unknown"] == {"valid": 4, "test": 7}
    assert ds.meta["unknown_chars"]["test"] == {"#": 2, "/": 1, "6": 1, "7": 2, "\\": 1}
    assert len(ds.test[0]) == 124774 - 7  # the paper's test count, minus the 7 dropped characters
    assert len(ds.valid[0]) == 117603 - 4
    assert ds.meta["source"] == "ptb" and ds.meta["lines"] == 1001
    assert {" ", "\n", "N", "$", "<", ">"} <= set(ds.vocab)
    text = (ptb_dir / "full" / "ptb.train.txt").read_text()
    assert _decode(ds, ds.train[0]) == first_lines(text, 1001)[0]


def test_paper_counts_with_map(ptb_dir: Path) -> None:
    ds = prepare_ptb(ptb_dir, unknown="map")
    assert len(ds.train[0]) == 120780 and len(ds.test[0]) == 124774 and len(ds.valid[0]) == 117603
    assert len(ds.vocab) == 45 and ds.vocab[-1] == UNK_SYMBOL
    unk = len(ds.vocab) - 1
    assert int((ds.test[0] == unk).sum()) == 7 and int((ds.valid[0] == unk).sum()) == 4
    assert int((ds.train[0] == unk).sum()) == 0
    assert ds.meta["mapped_unknown"] == {"valid": 4, "test": 7}


def test_1000_lines_match_authors_files(ptb_dir: Path) -> None:
    ds = prepare_ptb(ptb_dir, lines=1000, unknown="map")
    assert len(ds.train[0]) == 120540 and len(ds.test[0]) == 124645 and len(ds.valid[0]) == 117429
    known = set(ds.vocab)
    for split in ("train", "valid", "test"):  # the authors' files are exactly the first 1000 lines
        authors = (ptb_dir / f"ptb.{split}.txt").read_text()
        expected = "".join(c if c in known else UNK_SYMBOL for c in authors)
        assert _decode(ds, ds.split(split)[0]) == expected
    dropped = prepare_ptb(ptb_dir, lines=1000)
    assert len(dropped.test[0]) == 124645 - 7 and dropped.meta["dropped_unknown"]["test"] == 7


def test_vocab_from_all(ptb_dir: Path) -> None:
    ds = prepare_ptb(ptb_dir, vocab_from="all")
    assert len(ds.vocab) == 49 and len(ds.test[0]) == 124774
    assert ds.meta["dropped_unknown"] == {"valid": 0, "test": 0}


def test_round_trip(ptb_dir: Path, tmp_path: Path) -> None:
    ds = prepare_ptb(ptb_dir)
    write_dataset(tmp_path / "ptb.parquet", ds)
    back = read_dataset(tmp_path / "ptb.parquet")
    assert back.kind == "discrete" and back.vocab == ds.vocab
    for split in ("train", "valid", "test"):
        assert len(back.split(split)) == 1
        np.testing.assert_array_equal(back.split(split)[0], ds.split(split)[0])
    assert back.meta["dropped_unknown"] == {"valid": 4, "test": 7}
    assert back.meta["unknown_chars"] == ds.meta["unknown_chars"]


# ------------------------------------------------------------------- rules on tiny files (no mirror needed)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    full = tmp_path / "full"
    full.mkdir()
    (full / "ptb.train.txt").write_text(" a b\n b a\n a a\n")
    (full / "ptb.valid.txt").write_text(" a c\n")
    (full / "ptb.test.txt").write_text(" b d d\n a\n")
    return tmp_path


def test_drop(tiny: Path) -> None:
    ds = prepare_ptb(tiny)
    assert ds.vocab == ["\n", " ", "a", "b"]
    assert _decode(ds, ds.test[0]) == " b  \n a\n"
    assert ds.meta["dropped_unknown"] == {"valid": 1, "test": 2}
    assert ds.meta["unknown_chars"] == {"valid": {"c": 1}, "test": {"d": 2}}


def test_map(tiny: Path) -> None:
    ds = prepare_ptb(tiny, unknown="map")
    assert ds.vocab == ["\n", " ", "a", "b", UNK_SYMBOL]
    assert ds.test[0].tolist() == [1, 3, 1, 4, 1, 4, 0, 1, 2, 0]
    assert ds.meta["mapped_unknown"] == {"valid": 1, "test": 2}


def test_error(tiny: Path) -> None:
    with pytest.raises(ValueError) as err:
        prepare_ptb(tiny, unknown="error")
    msg = str(err.value)
    assert "test" in msg and "'d' x2" in msg and "valid" in msg and "'c' x1" in msg and "\n" not in msg


def test_lines_cut(tiny: Path) -> None:
    ds = prepare_ptb(tiny, lines=1)
    assert _decode(ds, ds.train[0]) == " a b\n"
    assert ds.meta["lines_read"] == {"train": 1, "valid": 1, "test": 1}
    assert prepare_ptb(tiny, lines=None).meta["lines_read"]["train"] == 3


@pytest.mark.parametrize("kwargs, key", [({"unknown": "ignore"}, "unknown"), ({"vocab_from": "test"}, "vocab_from"),
                                         ({"lines": 0}, "lines")])
def test_bad_options(tiny: Path, kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        prepare_ptb(tiny, **kwargs)
    if key == "unknown":
        with pytest.raises(ValueError, match="drop.*map.*error"):
            prepare_ptb(tiny, **kwargs)


def test_missing_file(tiny: Path) -> None:
    (tiny / "full" / "ptb.valid.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"ptb\.valid\.txt"):
        prepare_ptb(tiny)


def test_first_lines() -> None:
    assert first_lines("a\nb\nc", 2) == ("a\nb\n", 2)
    assert first_lines("a\nb\nc", 5) == ("a\nb\nc", 3)
    assert first_lines("a\x0cb\n", 1) == ("a\x0cb\n", 1)  # only \n ends a line
