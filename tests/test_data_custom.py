"""load_custom: happy paths (discrete string symbols, continuous) and one clear error per malformed input."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.custom import load_custom
from pipeline.data.schema import read_dataset, write_dataset


def _write(tmp_path: Path, columns: dict[str, Any], name: str = "data.parquet") -> Path:
    path = tmp_path / name
    pq.write_table(pa.table(columns), path)
    return path


def _error(path: Path, exc: type[Exception] = ValueError, **kwargs: Any) -> str:
    with pytest.raises(exc) as err:
        load_custom(path, **kwargs)
    msg = str(err.value)
    assert msg.startswith(f"{path}: "), msg
    assert "\n" not in msg
    return msg


def _continuous(n_traj: int = 6, length: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    n = n_traj * length
    return {
        "trajectory": np.repeat(np.arange(100, 100 + n_traj), length),
        "step": np.tile(np.arange(length), n_traj),
        "a": rng.normal(3.0, 2.0, n),
        "b": rng.integers(0, 10, n),  # integer features are numeric too
        "c": np.full(n, 7.0),  # constant column
        "name": ["x"] * n,  # non-numeric: ignored when features=None
    }


# --------------------------------------------------------------------------------------------------- happy paths


def test_discrete_string_symbols(tmp_path: Path) -> None:
    path = _write(tmp_path, {
        "trajectory": ["s2", "s2", "s2", "s1", "s1", "s1", "s3", "s3"],
        "step": [2, 0, 1, 0, 1, 2, 1, 0],  # out of order on purpose
        "split": ["train", "train", "train", "train", "train", "train", "test", "test"],
        "symbol": ["b", "a", "c", "a", "a", "b", "c", "a"],
    })
    before = (path.read_bytes(), os.stat(path).st_mtime_ns)
    ds = load_custom(path, kind="discrete")
    assert (path.read_bytes(), os.stat(path).st_mtime_ns) == before  # the file is only read
    assert ds.kind == "discrete" and ds.vocab == ["a", "b", "c"]
    assert [t.tolist() for t in ds.train] == [[0, 0, 1], [0, 2, 1]]  # s1 then s2, ordered by step
    assert [t.tolist() for t in ds.test] == [[0, 2]]
    assert ds.meta["trajectory_ids"] == {"train": ["s1", "s2"], "valid": [], "test": ["s3"]}
    assert ds.meta["split_source"] == "column" and ds.meta["source"] == "custom:data.parquet"
    write_dataset(tmp_path / "out.parquet", ds)
    back = read_dataset(tmp_path / "out.parquet")
    assert back.vocab == ds.vocab and [t.tolist() for t in back.train] == [t.tolist() for t in ds.train]


def test_discrete_int_symbols_and_row_order(tmp_path: Path) -> None:
    path = _write(tmp_path, {"trajectory": [5, 5, 5, 1, 1, 9, 9], "sym": [10, 2, 2, 10, 1, 2, 1],
                             "split": ["train"] * 5 + ["test"] * 2})
    ds = load_custom(path, kind="discrete", symbol_column="sym")
    assert ds.vocab == ["1", "2", "10"]  # sorted numerically, stored as strings
    assert ds.meta["trajectory_ids"]["train"] == [1, 5]
    assert [ds.vocab[i] for i in ds.train[1]] == ["10", "2", "2"]  # no step column: file row order
    assert [ds.vocab[i] for i in ds.test[0]] == ["2", "1"]


def test_continuous(tmp_path: Path) -> None:
    path = _write(tmp_path, _continuous())
    ds = load_custom(path, kind="continuous", test_fraction=0.34, seed=3)
    assert ds.features == ["a", "b", "c"]
    assert (len(ds.train), len(ds.test), len(ds.valid)) == (4, 2, 0)
    train = np.concatenate(ds.train)
    np.testing.assert_allclose(train[:, :2].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(train[:, :2].std(axis=0), 1.0, atol=1e-12)
    norm = ds.meta["normalization"]
    assert norm["columns"] == ["a", "b", "c"] and norm["std"][2] == 1.0 and norm["mean"][2] == 7.0
    assert np.all(train[:, 2] == 0.0)
    ids = ds.meta["trajectory_ids"]
    assert sorted(ids["train"] + ids["test"]) == list(range(100, 106))
    assert ids["train"] == sorted(ids["train"])
    again = load_custom(path, kind="continuous", test_fraction=0.34, seed=3)
    assert again.meta["trajectory_ids"] == ids
    assert any(load_custom(path, kind="continuous", test_fraction=0.34, seed=s).meta["trajectory_ids"] != ids
               for s in range(4, 10))
    raw = load_custom(path, kind="continuous", features=["b", "a"], normalize=False)
    assert raw.features == ["b", "a"] and "normalization" not in raw.meta
    first = raw.meta["trajectory_ids"]["train"][0]
    cols = _continuous()
    rows = cols["trajectory"] == first
    np.testing.assert_array_equal(raw.train[0], np.column_stack([cols["b"][rows], cols["a"][rows]]))


def test_a_constant_column_gets_std_1_though_its_computed_std_is_not_0(tmp_path: Path) -> None:
    cols = _continuous()
    cols["c"] = np.full(len(cols["a"]), 0.3)
    assert cols["c"].std() != 0.0
    ds = load_custom(_write(tmp_path, cols), kind="continuous")
    assert ds.meta["normalization"]["std"][2] == 1.0
    assert np.all(np.abs(np.concatenate(ds.train)[:, 2]) < 1e-13)


@pytest.mark.parametrize("fraction", [0.01, 0.99])
def test_at_least_one_trajectory_each_side(tmp_path: Path, fraction: float) -> None:
    path = _write(tmp_path, _continuous(n_traj=3))
    ds = load_custom(path, kind="continuous", test_fraction=fraction)
    assert len(ds.train) >= 1 and len(ds.test) >= 1 and len(ds.train) + len(ds.test) == 3


def test_valid_fraction_holds_out_training_trajectories_and_keeps_the_test_draw(tmp_path: Path) -> None:
    cols = _continuous(n_traj=10)
    cols["a"] = cols["a"] + 50.0 * (cols["trajectory"] % 3)     # trajectories differ: the train stats must too
    path = _write(tmp_path, cols)
    plain = load_custom(path, kind="continuous", test_fraction=0.2, seed=1)
    ds = load_custom(path, kind="continuous", test_fraction=0.2, valid_fraction=0.3, seed=1)
    ids, before = ds.meta["trajectory_ids"], plain.meta["trajectory_ids"]
    assert (len(ids["train"]), len(ids["valid"]), len(ids["test"])) == (5, 3, 2)
    assert ids["test"] == before["test"] and sorted(ids["train"] + ids["valid"]) == before["train"]
    assert ds.meta["split_source"] == "random (test_fraction=0.2, valid_fraction=0.3, seed=1)"
    # standardised with the mean and std of the train split alone
    raw = {k: cols["a"][cols["trajectory"] == k] for k in ids["train"]}
    mean = np.concatenate(list(raw.values())).mean()
    assert ds.meta["normalization"]["mean"][0] == pytest.approx(mean)
    assert ds.valid[0][:, 0] * ds.meta["normalization"]["std"][0] + mean == pytest.approx(
        cols["a"][cols["trajectory"] == ids["valid"][0]])
    small = load_custom(path, kind="continuous", test_fraction=0.2, valid_fraction=0.01, seed=1)
    assert len(small.valid) == 1                                   # a fraction > 0 holds out at least one
    with pytest.raises(ValueError, match=r"10 trajectories: 2 for test and 8 for valid .* leave none to train on"):
        load_custom(path, kind="continuous", test_fraction=0.2, valid_fraction=0.79)
    with pytest.raises(ValueError, match=r"valid_fraction=0\.8: expected a number >= 0 with test_fraction \+ "
                                         r"valid_fraction < 1"):
        load_custom(path, kind="continuous", test_fraction=0.2, valid_fraction=0.8)
    cols["split"] = np.where(cols["trajectory"] < 102, "test", "train")
    with pytest.raises(ValueError, match=r"has a 'split' column, which decides the splits; valid_fraction=0\.3"):
        load_custom(_write(tmp_path, cols, name="split.parquet"), kind="continuous", valid_fraction=0.3)


def test_split_column_with_valid(tmp_path: Path) -> None:
    cols = _continuous(n_traj=3)
    cols["split"] = np.repeat(["test", "train", "valid"], 5)
    ds = load_custom(_write(tmp_path, cols), kind="continuous", features=["a"])
    assert ds.meta["trajectory_ids"] == {"train": [101], "valid": [102], "test": [100]}


# ------------------------------------------------------------------------ one long recording: segments, blocks


def _recording(length: int = 23) -> dict[str, Any]:
    """One trajectory (id 7) of ``length`` steps 0, 10, 20, ...: x is the row number, y its negative."""
    x = np.arange(length, dtype=np.float64)
    return {"trajectory": np.full(length, 7), "step": 10 * np.arange(length), "x": x, "y": -x}


def test_segment_length_cuts_one_recording_into_trajectories(tmp_path: Path) -> None:
    path = _write(tmp_path, _recording(23))
    ds = load_custom(path, kind="continuous", normalize=False, segment_length=5, test_fraction=0.25, seed=0)
    # 23 steps: 5, 5, 5 and the remainder of 3 joined to the last segment (8 steps); none dropped
    assert ds.meta["trajectory_ids"] == {"train": ["7/0", "7/1", "7/3"], "valid": [], "test": ["7/2"]}
    assert ds.meta["trajectory_steps"] == {"train": [{"first": 0, "every": 10}, {"first": 50, "every": 10},
                                                     {"first": 150, "every": 10}], "valid": [],
                                           "test": [{"first": 100, "every": 10}]}
    assert ds.meta["segment_length"] == 5
    assert [t[:, 0].tolist() for t in ds.train] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], list(range(15, 23))]
    assert ds.train[2][:, 1].tolist() == [-v for v in range(15, 23)]
    assert ds.test[0][:, 0].tolist() == [10, 11, 12, 13, 14]
    assert ds.meta["split_source"] == "random (test_fraction=0.25, seed=0)"
    # a segment of exactly the length left: 20 steps are 4 segments of 5
    ds = load_custom(_write(tmp_path, _recording(20), "twenty.parquet"), kind="continuous", segment_length=5)
    assert [len(t) for t in ds.train + ds.test] == [5, 5, 5, 5]


def test_segment_length_keeps_every_trajectory_traceable(tmp_path: Path) -> None:
    """Several trajectories, string ids, no step column: each is cut on its own, one shorter than segment_length
    stays whole (as "<id>/0"), and the steps recorded are row positions within the trajectory."""
    path = _write(tmp_path, {"trajectory": ["b"] * 7 + ["a"] * 3, "x": np.arange(10, dtype=np.float64)})
    ds = load_custom(path, kind="continuous", normalize=False, segment_length=3, test_fraction=0.3, seed=1)
    ids, spans = ds.meta["trajectory_ids"], ds.meta["trajectory_steps"]
    every = {i: (span, t[:, 0].tolist()) for s in ("train", "test")
             for i, span, t in zip(ids[s], spans[s], ds.split(s))}
    first = {"first": 0, "every": 1}
    assert every == {"a/0": (first, [7, 8, 9]), "b/0": (first, [0, 1, 2]), "b/1": ({"first": 3, "every": 1},
                                                                                   [3, 4, 5, 6])}
    assert len(ids["test"]) == 1 and ids["train"] == [i for i in ["a/0", "b/0", "b/1"] if i not in ids["test"]]


def test_split_column_may_change_within_a_trajectory_in_contiguous_blocks(tmp_path: Path) -> None:
    cols = _recording(25)
    cols["split"] = ["train"] * 18 + ["valid"] * 3 + ["test"] * 4
    cols = {k: np.concatenate([v, v if k != "trajectory" else np.full(25, 8)]) for k, v in cols.items()}
    cols["split"][25:] = "train"          # trajectory 8: train throughout, kept whole under its own id
    ds = load_custom(_write(tmp_path, cols), kind="continuous", normalize=False)
    assert ds.meta["split_source"] == "column"
    assert ds.meta["trajectory_ids"] == {"train": ["7/0", "8"], "valid": ["7/1"], "test": ["7/2"]}
    assert ds.meta["trajectory_steps"] == {"train": [{"first": 0, "every": 10}] * 2,
                                           "valid": [{"first": 180, "every": 10}],
                                           "test": [{"first": 210, "every": 10}]}
    assert ds.valid[0][:, 0].tolist() == [18, 19, 20] and ds.test[0][:, 0].tolist() == [21, 22, 23, 24]
    assert ds.train[0][:, 0].tolist() == list(range(18)) and ds.train[1][:, 0].tolist() == list(range(25))
    # with segment_length the blocks are cut too, numbered on through the trajectory; the 4 test steps stay whole
    ds = load_custom(_write(tmp_path, cols, "cut.parquet"), kind="continuous", normalize=False, segment_length=8)
    assert ds.meta["trajectory_ids"] == {"train": ["7/0", "7/1", "8/0", "8/1", "8/2"], "valid": ["7/2"],
                                         "test": ["7/3"]}
    assert [e["first"] for e in ds.meta["trajectory_steps"]["train"]] == [0, 80, 0, 80, 160]
    assert [len(t) for t in ds.train] == [8, 10, 8, 8, 9]


# -------------------------------------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    _error(tmp_path / "nope.parquet", FileNotFoundError, kind="continuous")


def test_corrupt_and_truncated(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(bytes(range(256)) * 4)
    assert "not a readable Parquet file" in _error(garbage, kind="continuous")
    # a CSV given as it is (the likeliest mistake) is named as text, with the way to convert it
    csv = tmp_path / "sensors.csv"
    csv.write_text("\ufefftrajectory,step,temp_c\n" + "".join(f"0,{i},{20 + i / 3:.2f}\n" for i in range(2000)) + "0,2000,é")
    assert _error(csv, kind="continuous") == (f"{csv}: a text file (CSV?), not Parquet; expected a Parquet file: "
                                              "convert it, e.g. pandas.read_csv(...).to_parquet(...) (README, "
                                              "'Adding your own dataset')")
    good = _write(tmp_path, _continuous())
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert "truncated or corrupt" in _error(cut, kind="continuous")
    data = bytearray(good.read_bytes())
    data[4:68] = b"\xff" * 64  # damage the first page (header intact at the end, magic intact at the start)
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(bytes(data))
    assert "not a readable Parquet file" in _error(damaged, kind="continuous")


def test_missing_columns(tmp_path: Path) -> None:
    cols = _continuous()
    path = _write(tmp_path, {k: v for k, v in cols.items() if k != "trajectory"})
    assert "missing column 'trajectory'" in _error(path, kind="continuous")
    path = _write(tmp_path, cols, "c.parquet")
    assert "missing column 'symbol'" in _error(path, kind="discrete")
    assert "missing column 'zz'" in _error(path, kind="continuous", features=["a", "zz"])


def test_wrong_dtypes(tmp_path: Path) -> None:
    path = _write(tmp_path, _continuous())
    msg = _error(path, kind="continuous", features=["a", "name"])
    assert "'name'" in msg and "numeric" in msg and "string" in msg
    cols = _continuous()
    cols["trajectory"] = cols["trajectory"].astype(float)
    assert "'trajectory' has type double" in _error(_write(tmp_path, cols, "f.parquet"), kind="continuous")
    cols = _continuous()
    cols["step"] = cols["step"].astype(float)
    assert "'step' has type double" in _error(_write(tmp_path, cols, "s.parquet"), kind="continuous")
    only_text = _write(tmp_path, {"trajectory": [1, 1], "name": ["a", "b"]}, "t.parquet")
    assert "no numeric feature columns" in _error(only_text, kind="continuous")


@pytest.mark.parametrize("bad", [np.nan, np.inf, None])
def test_nan_inf_null(tmp_path: Path, bad: Any) -> None:
    cols = _continuous()
    a = cols["a"].tolist()
    a[12], a[13], a[27] = bad, bad, bad  # rows of trajectories 102 and 105
    cols["a"] = pa.array(a, type=pa.float64())
    msg = _error(_write(tmp_path, cols), kind="continuous")
    assert "3 rows" in msg and "['a']" in msg and "trajectory 102" in msg and "row 12" in msg


def test_duplicate_steps(tmp_path: Path) -> None:
    cols = _continuous()
    cols["step"] = cols["step"].copy()
    cols["step"][7] = 1  # trajectory 101 has step 1 twice
    msg = _error(_write(tmp_path, cols), kind="continuous")
    assert "duplicate" in msg and "trajectory 101" in msg and "step 1" in msg


def test_features_in_odd_units_warn_only_when_left_unnormalised(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """normalize: false trains on the values as they are: a pressure near 1013 hPa made the PSRNN's test MSE go
    0.38 -> 72 and an LSTM's stay at 3.4e5, with no word on the units (fit_model warns of the same arrays)."""
    cols = _continuous()
    cols["a"] = cols["a"] + 1010.0
    cols["b"] = cols["b"] * 1e-4
    path = _write(tmp_path, cols)
    load_custom(path, kind="continuous", features=["a", "b"])   # standardised: nothing to say
    assert not caplog.records
    data = load_custom(path, kind="continuous", features=["a", "b", "c"], normalize=False)
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]
    large, small = (r.getMessage() for r in caplog.records)
    train = np.concatenate(data.train)
    assert large == (f"{path}: train feature 'a' (mean {train[:, 0].mean():.4g}, std {train[:, 0].std():.4g}) in "
                     "large units: SGD at the paper's learning rate 1 may diverge; normalize is false, so the "
                     "models read them as they are: expected it true (the default: standardised with train's mean "
                     "and std) or features near unit scale")
    # the constant column c (std 0) is no feature in small units
    assert small.startswith(f"{path}: train feature 'b' (mean ") and "small units: SGD barely moves them" in small
    caplog.clear()
    cols["a"], cols["b"] = cols["a"] - 1010.0, cols["b"] * 1e4
    load_custom(_write(tmp_path, cols, "unit.parquet"), kind="continuous", features=["a", "b", "c"],
                normalize=False)
    assert not caplog.records


def test_uneven_steps_warn_and_evenly_spaced_steps_do_not(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cols = _continuous()
    cols["step"] = cols["step"] * 10                   # 0, 10, 20, ...: time stamps every 10 units
    load_custom(_write(tmp_path, cols), kind="continuous", features=["a"])
    assert not caplog.records
    cols["step"] = cols["step"].copy()
    cols["step"][7] = 25                               # trajectory 101: 0, 10, 25, 30, 40
    cols["step"][12:15] = [30, 35, 45]                 # trajectory 102: 0, 10, 30, 35, 45
    load_custom(_write(tmp_path, cols, "uneven.parquet"), kind="continuous", features=["a"])
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "\n" not in record.getMessage()
    assert record.getMessage() == (f"{tmp_path / 'uneven.parquet'}: 4 step intervals in 2 trajectories differ from "
                                   "their trajectory's first spacing (first: trajectory 101, step 25 after 10, "
                                   "where its steps began 10 apart); the models use only the order of the rows, one "
                                   "observation per step")


def test_the_command_line_says_a_library_warning_as_its_own(tmp_path: Path) -> None:
    """A warning the library logs reaches a command's stderr as the commands say theirs, ``psrnn <stage>: warning:
    ...`` (it read ``WARNING pipeline.data.custom: ...``); -v's progress lines keep the module's name. (In a
    subprocess: pytest's own log handler keeps the command from setting one up.)"""
    import subprocess
    import sys

    from pipeline.config import dump_yaml

    cols = _continuous()
    cols["step"] = cols["step"] * 10
    cols["step"][7] = 25
    _write(tmp_path, cols, "uneven.parquet")
    section = {"source": {"path": "uneven.parquet", "kind": "continuous", "features": ["a", "b"], "test_fraction": 0.34,
                          "seed": 0},
               "two_stage": {"n_features": 32, "state_dim": 2, "obs_dim": 2, "past_dim": 2, "past_window": 1,
                             "future_window": 1},
               "kf": None, "variants": ["psrnn"]}
    (tmp_path / "params.yaml").write_text(dump_yaml({"seeds": [0], "custom": section}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("PSRNN_VERBOSE", None)
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "--root", str(tmp_path), "preprocess", "custom"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"psrnn preprocess: warning: {tmp_path / 'uneven.parquet'}: 2 step intervals in 1 "
                                  "trajectory differ from their trajectory's first spacing"), done.stderr
    import logging

    from pipeline.cli import _LogFormatter

    def line(level: int) -> str:
        return _LogFormatter("refine").format(logging.LogRecord("pipeline.workflow.refine", level, __file__, 1,
                                                                "run %s", ("psrnn_s0",), None))

    assert line(logging.INFO) == "INFO pipeline.workflow.refine: run psrnn_s0"
    assert line(logging.WARNING) == "psrnn refine: warning: run psrnn_s0"


def test_unsigned_steps_beyond_int64_are_refused(tmp_path: Path) -> None:
    cols = _continuous()
    cols["step"] = pa.array(cols["step"].astype(np.uint64) + np.uint64(2 ** 63 - 3), type=pa.uint64())
    msg = _error(_write(tmp_path, cols), kind="continuous", features=["a"])
    assert msg.endswith("column 'step' has values above 2**63 - 1 (first: row 3, 9223372036854775808); expected "
                        "steps that fit a signed 64-bit integer"), msg


def test_short_trajectories(tmp_path: Path) -> None:
    cols = {"trajectory": [1, 1, 1, 2, 3, 3], "x": [0.0, 1, 2, 3, 4, 5]}
    msg = _error(_write(tmp_path, cols), kind="continuous")
    assert "1 trajectories are shorter than min_length=2" in msg and "trajectory 2 with 1 rows" in msg
    msg = _error(_write(tmp_path, cols), kind="continuous", min_length=3)
    assert "2 trajectories" in msg


def test_empty_split(tmp_path: Path) -> None:
    cols = _continuous(n_traj=2)
    cols["split"] = ["train"] * 10
    msg = _error(_write(tmp_path, cols), kind="continuous")
    assert "split 'test' is empty" in msg
    one = _write(tmp_path, _continuous(n_traj=1), "one.parquet")
    assert _error(one, kind="continuous").endswith(
        "only 1 trajectory; at least 2 are needed to make non-empty train and test splits: cut it into segments with "
        "segment_length, or give a 'split' column (e.g. train rows first, then test rows)")
    # 5 steps at segment_length 3: one segment of 3 and a remainder of 2, which joins it (3 is shorter than 5)
    assert _error(one, kind="continuous", segment_length=3).endswith(
        "only 1 trajectory; at least 2 are needed to make non-empty train and test splits: segment_length=3 leaves "
        "the trajectory of 5 steps in one piece (a remainder shorter than segment_length joins the last segment); "
        "expected at most 2 for two segments")
    assert len(load_custom(one, kind="continuous", segment_length=2).train) == 1   # 2 and 3 steps: two pieces


def test_bad_split_values(tmp_path: Path) -> None:
    cols = _continuous(n_traj=2)
    cols["split"] = ["train"] * 5 + ["testing"] * 5
    assert "'testing'" in _error(_write(tmp_path, cols), kind="continuous")
    cols["split"] = ["train"] * 5 + ["train", "train", "test", "test", "train"]   # trajectory 101: back to train
    msg = _error(_write(tmp_path, cols, "mixed.parquet"), kind="continuous")
    assert msg.endswith("column 'split': trajectory 101 returns to split 'train' at step 4 after 'test' (splits in "
                        "step order: 'train', 'test', 'train'); expected each split's rows of a trajectory to be "
                        "one contiguous block (e.g. train steps first, then test steps)"), msg
    cols["split"] = ["train"] * 5 + ["train", "train", "train", "train", "test"]  # a test block of one step
    msg = _error(_write(tmp_path, cols, "short.parquet"), kind="continuous")
    assert msg.endswith("column 'split': trajectory 101 has a block of 1 row in split 'test' (from step 4), shorter "
                        "than min_length=2; expected each split's block of a trajectory to be at least min_length "
                        "rows"), msg
    msg = _error(_write(tmp_path, cols, "short2.parquet"), kind="continuous", min_length_is="custom.source.min_length")
    assert "shorter than custom.source.min_length=2;" in msg, msg   # named as the caller names the key
    del cols["step"]   # without a step column the row of the file is named
    msg = _error(_write(tmp_path, cols, "rows.parquet"), kind="continuous")
    assert "has a block of 1 row in split 'test' (from row 9 of the file)" in msg, msg


def test_cut_and_whole_trajectories_have_ids_of_one_type_and_never_the_same(tmp_path: Path) -> None:
    """A trajectory cut by its split column beside whole ones of integer ids: every id is then a string ("0/2" and
    "2", not "0/2" and 2), else the predictions' trajectory_id column could not be written (Arrow refuses mixed
    types, after all the training); a piece whose id is another trajectory's is refused."""
    from pipeline.workflow.evaluate import write_predictions

    cols = {"trajectory": np.repeat([0, 1, 2], 6), "step": np.tile(np.arange(6), 3), "x": np.arange(18.0),
            "split": ["train"] * 2 + ["valid"] * 2 + ["test"] * 2 + ["train"] * 6 + ["test"] * 6}
    ds = load_custom(_write(tmp_path, cols), kind="continuous")
    assert ds.meta["trajectory_ids"] == {"train": ["0/0", "1"], "valid": ["0/1"], "test": ["0/2", "2"]}
    outputs = [t.copy() for t in ds.test]
    write_predictions(tmp_path / "p.parquet", ds, outputs, outputs)
    table = pq.read_table(tmp_path / "p.parquet")
    assert sorted(set(table.column("trajectory_id").to_pylist())) == ["0/2", "2"]
    clash = _write(tmp_path, {"trajectory": ["a"] * 4 + ["a/1"] * 4, "x": np.arange(8.0),
                              "split": ["train", "train", "test", "test"] + ["train"] * 4}, "clash.parquet")
    assert _error(clash, kind="continuous").endswith(
        "trajectory id 'a/1' of a piece of a cut trajectory is also the id of another trajectory (or of its piece); "
        "expected ids that do not end in '/<number>' when trajectories are cut (rename the trajectory)")


def test_single_symbol(tmp_path: Path) -> None:
    path = _write(tmp_path, {"trajectory": [1, 1, 2, 2], "split": ["train", "train", "test", "test"],
                             "symbol": ["a", "a", "a", "a"]})
    assert "single symbol 'a'" in _error(path, kind="discrete")


def test_unseen_test_symbols(tmp_path: Path) -> None:
    path = _write(tmp_path, {"trajectory": [1, 1, 1, 1, 2, 2, 3, 3], "split": ["train"] * 4 + ["test"] * 4,
                             "symbol": ["a", "b", "b", "a", "a", "z", "q", "z"]})
    msg = _error(path, kind="discrete")
    assert "test" in msg and "'q', 'z'" in msg and "not seen in train" in msg
    assert "unknown 'drop'" in msg and "'map'" in msg   # the error names the option that lets them through
    # symbols that never recur (an id column): the question is asked, and no option that would let ids through
    ids = _write(tmp_path, {"trajectory": [1, 1, 2, 2, 3, 3], "split": ["train"] * 2 + ["test"] * 4,
                            "symbol": ["a", "b", "a", "z", "q", "z"]})
    msg = _error(ids, kind="discrete")
    assert "an id rather than a symbol?" in msg and "unknown" not in msg


def _unseen(tmp_path: Path) -> Path:
    # train a, b; valid has x once; test: trajectory 3 has q, z among known symbols, 4 is only z (dropped whole)
    return _write(tmp_path, {"trajectory": [1] * 4 + [2] * 3 + [3] * 5 + [4] * 2,
                             "step": [0, 1, 2, 3, 0, 1, 2, 10, 20, 30, 40, 50, 0, 1],
                             "split": ["train"] * 4 + ["valid"] * 3 + ["test"] * 7,
                             "symbol": ["a", "b", "a", "b", "a", "x", "b", "a", "q", "b", "z", "a", "z", "z"]})


def test_a_trajectory_that_drop_leaves_shorter_than_min_length_is_refused(tmp_path: Path) -> None:
    """unknown='drop' left a test trajectory of 1 step under min_length=4 and went on; it is held to the rule of
    every trajectory (one emptied whole is still removed)."""
    path = _write(tmp_path, {"trajectory": [1] * 6 + [2] * 6 + [3] * 4 + [4] * 4,
                             "split": ["train"] * 6 + ["test"] * 14,
                             "symbol": list("abcabc") + list("zzzzza") + list("zzzz") + list("abca")})
    msg = _error(path, kind="discrete", unknown="drop", min_length=4)
    assert msg.endswith("trajectory 2 of split 'test' keeps 1 of its 6 steps once unknown='drop' removed its symbols "
                        "not seen in train, fewer than min_length=4; expected unknown 'map', or a smaller min_length")
    ds = load_custom(path, kind="discrete", unknown="drop", min_length=1)   # the same rule as the file's rows
    assert [len(t) for t in ds.test] == [1, 4] and ds.meta["trajectory_ids"]["test"] == [2, 4]


def test_unseen_symbols_dropped(tmp_path: Path) -> None:
    ds = load_custom(_unseen(tmp_path), kind="discrete", unknown="drop")
    assert ds.vocab == ["a", "b"]
    assert [t.tolist() for t in ds.valid] == [[0, 1]] and [t.tolist() for t in ds.test] == [[0, 1, 0]]
    assert ds.meta["trajectory_ids"]["test"] == [3]   # trajectory 4 had only unseen symbols
    assert ds.meta["trajectory_steps"]["test"] == [{"first": 10, "every": 20}]   # the file's steps of those kept
    assert ds.meta["trajectory_steps"]["valid"] == [{"first": 0, "every": 2}]
    assert ds.meta["unknown"] == "drop" and ds.meta["dropped_unknown"] == {"valid": 1, "test": 4}
    assert ds.meta["unknown_symbols"] == {"valid": {"x": 1}, "test": {"q": 1, "z": 3}}
    write_dataset(tmp_path / "p.parquet", ds)
    assert read_dataset(tmp_path / "p.parquet").meta["dropped_unknown"] == {"valid": 1, "test": 4}
    # without a step column: the row positions of the steps kept
    path = _write(tmp_path, {"trajectory": [1, 1, 2, 2, 2], "split": ["train"] * 2 + ["test"] * 3,
                             "symbol": ["a", "b", "a", "z", "b"]}, name="nostep.parquet")
    ds = load_custom(path, kind="discrete", unknown="drop")
    assert [t.tolist() for t in ds.test] == [[0, 1]] and ds.meta["trajectory_steps"]["test"] == [{"first": 0, "every": 2}]
    assert ds.meta["trajectory_steps"]["train"] == [{"first": 0, "every": 1}]


def test_unseen_symbols_mapped(tmp_path: Path) -> None:
    ds = load_custom(_unseen(tmp_path), kind="discrete", unknown="map")
    assert ds.vocab == ["a", "b", "<unk>"]
    assert [t.tolist() for t in ds.train] == [[0, 1, 0, 1]]
    assert [t.tolist() for t in ds.valid] == [[0, 2, 1]]
    assert [t.tolist() for t in ds.test] == [[0, 2, 1, 2, 0], [2, 2]]
    assert ds.meta["mapped_unknown"] == {"valid": 1, "test": 4} and "dropped_unknown" not in ds.meta
    # the vocabulary does not depend on the test data: <unk> is there without unseen symbols too
    path = _write(tmp_path, {"trajectory": [1, 1, 2, 2], "split": ["train"] * 2 + ["test"] * 2,
                             "symbol": [3, 4, 4, 3]}, name="seen.parquet")
    ds = load_custom(path, kind="discrete", unknown="map")
    assert ds.vocab == ["3", "4", "<unk>"] and ds.meta["mapped_unknown"] == {"valid": 0, "test": 0}


def test_unseen_symbols_default_error_leaves_the_meta_as_it_was(tmp_path: Path) -> None:
    path = _write(tmp_path, {"trajectory": [1, 1, 2, 2], "split": ["train"] * 2 + ["test"] * 2,
                             "symbol": ["a", "b", "b", "a"]})
    a, b = load_custom(path, kind="discrete"), load_custom(path, kind="discrete", unknown="error")
    for ds in (a, b):
        assert not {"unknown", "unknown_symbols", "dropped_unknown", "mapped_unknown"} & set(ds.meta)
    write_dataset(tmp_path / "a.parquet", a)
    write_dataset(tmp_path / "b.parquet", b)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    with pytest.raises(ValueError, match=r"^unknown='ignore': expected one of \('error', 'drop', 'map'\)$"):
        load_custom(path, kind="discrete", unknown="ignore")
    # drop that leaves no test step at all
    path = _write(tmp_path, {"trajectory": [1, 1, 2, 2], "split": ["train"] * 2 + ["test"] * 2,
                             "symbol": ["a", "b", "z", "z"]}, name="none.parquet")
    assert "split 'test' is empty" in _error(path, kind="discrete", unknown="drop")


def test_null_symbol_and_bad_options(tmp_path: Path) -> None:
    path = _write(tmp_path, {"trajectory": [1, 1, 2, 2], "symbol": pa.array(["a", None, "b", "a"])})
    assert "'symbol' has 1 missing" in _error(path, kind="discrete")
    with pytest.raises(ValueError, match="kind='sparse'"):
        load_custom(path, kind="sparse")
    with pytest.raises(ValueError, match="test_fraction"):
        load_custom(path, kind="discrete", test_fraction=1.0)
    with pytest.raises(ValueError, match="min_length"):
        load_custom(path, kind="discrete", min_length=0)
    with pytest.raises(ValueError, match="features"):
        load_custom(path, kind="discrete", features=["x"])


# ----------------------------------------------------------------------------- huge values, dropped columns


def test_huge_finite_values_are_standardised_not_zeroed(tmp_path: Path) -> None:
    cols = _continuous()
    n = len(cols["a"])
    cols["a"] = np.resize([1e308, -1e308, 1.7e308, -1.7e308, 0.0], n)  # the plain std overflows
    cols["b"] = np.resize([1e200, 2e200, 3e200, 4e200, 5e200], n)      # so does the square of these
    ds = load_custom(_write(tmp_path, cols), kind="continuous", features=["a", "b"])
    train = np.concatenate(ds.train)
    assert np.isfinite(train).all()
    np.testing.assert_allclose(train.std(axis=0), 1.0, rtol=1e-12)
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(train[:5, 1], np.array([-2, -1, 0, 1, 2]) / np.sqrt(2), rtol=1e-12)
    norm = ds.meta["normalization"]
    assert np.isfinite(norm["mean"]).all() and np.isfinite(norm["std"]).all()
    np.testing.assert_allclose(norm["std"][1], np.sqrt(2) * 1e200, rtol=1e-12)


def test_standardised_overflow_is_refused(tmp_path: Path) -> None:
    cols = _continuous(n_traj=3)
    cols["split"] = np.repeat(["train", "train", "test"], 5)
    a = np.linspace(0.0, 0.01, 15)  # train std ~0.003
    a[12] = 1.5e308  # a test value the train spread cannot express: 1.5e308 / 0.003 overflows
    cols["a"] = a
    msg = _error(_write(tmp_path, cols), kind="continuous", features=["a", "b"])
    assert "feature column 'a'" in msg and "test" in msg and "overflow" in msg


def test_auto_features_warn_about_dropped_columns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cols = _continuous()
    n = len(cols["a"])
    cols["flag"] = np.arange(n) % 2 == 0
    cols["when"] = pa.array(np.arange(n).astype("datetime64[s]"))
    cols["tags"] = pa.array([[1, 2]] * n)
    with caplog.at_level("WARNING", logger="pipeline.data.custom"):
        ds = load_custom(_write(tmp_path, cols), kind="continuous")
    assert ds.features == ["a", "b", "c"]
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "dropped" in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    for name in ("'name'", "'flag'", "'when'", "'tags'"):
        assert name in text, text
    assert "'trajectory'" not in text and "'step'" not in text
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipeline.data.custom"):
        load_custom(_write(tmp_path, cols, "named.parquet"), kind="continuous", features=["a"])
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]  # named features: nothing to warn about


def test_auto_features_refuse_numbers_written_as_text(tmp_path: Path) -> None:
    """A feature column cast to strings (e.g. read from a CSV as text) is not dropped with a warning alone."""
    cols = _continuous()
    cols["a"] = [f"{v:.3f}" for v in cols["a"]]
    msg = _error(_write(tmp_path, cols), kind="continuous")
    first = cols["a"][0]
    assert msg.endswith(f"column 'a' holds numbers as text (string, e.g. {first!r}); expected an integer or float "
                        "column: cast it before writing the file (pandas: df['a'] = df['a'].astype(float)), or name "
                        "the feature columns in features to leave it out"), msg
    cols["a"] = pa.array(cols["a"]).dictionary_encode()     # dictionary-encoded text alike
    assert "column 'a' holds numbers as text" in _error(_write(tmp_path, cols, "dict.parquet"), kind="continuous")
    # named features leave it out; text that is not all numbers (the 'name' column) stays a warning
    assert load_custom(_write(tmp_path, cols, "named.parquet"), kind="continuous", features=["b"]).features == ["b"]
    cols["a"] = ["1.5"] * (len(cols["b"]) - 1) + ["n/a"]
    assert load_custom(_write(tmp_path, cols, "mixed.parquet"), kind="continuous").features == ["b", "c"]


def test_auto_features_none_left(tmp_path: Path) -> None:
    path = _write(tmp_path, {"trajectory": [1, 1, 2, 2], "flag": [True, False, True, True],
                             "when": pa.array(np.arange(4).astype("datetime64[s]"))})
    msg = _error(path, kind="continuous")
    assert "no numeric feature columns" in msg and "'flag'" in msg


def test_check_reads_the_custom_file_against_the_params(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`psrnn check` reads a custom section's file as preprocess will: a missing file, windows longer than its
    trajectories (the Kalman filter's too, which preprocess leaves to two_stage) each fail in one line."""
    from pipeline.config import dump_yaml

    from pipeline import cli

    os.environ.pop("PSRNN_DEBUG", None)
    _write(tmp_path, _continuous(n_traj=6, length=12), name="series.parquet")
    section = {"source": {"path": "series.parquet", "kind": "continuous", "features": ["a", "b"],
                          "test_fraction": 0.34, "seed": 0},
               "two_stage": {"n_features": 32, "state_dim": 4, "obs_dim": 2, "past_dim": 4, "past_window": 3,
                             "future_window": 3},
               "kf": {"state_dim": 2, "past_window": 4, "future_window": 4},
               "variants": ["psrnn", "kf"]}

    def check(**changes: Any) -> tuple[int, str, str]:
        custom = {**section, **changes}
        (tmp_path / "params.yaml").write_text(dump_yaml({"seeds": [0], "custom": custom}))
        code = cli.main(["--root", str(tmp_path), "check"])
        out, err = capsys.readouterr()
        return code, out, err.strip()

    code, out, err = check()
    assert code == 0 and err == "", err
    assert "custom: series.parquet: continuous, 2 features, 4 train / 2 test trajectories, training lengths 12 to " \
           "12 steps" in out and ": valid (1 dataset: custom; 2 model variants" in out
    code, out, err = check(source={**section["source"], "valid_fraction": 0.2})
    assert code == 0 and "3 train / 1 valid / 2 test trajectories" in out, err
    code, _, err = check(source={**section["source"], "path": "missing.parquet"})
    assert code == 1 and err == (f"psrnn check: error: custom.source.path: {tmp_path / 'missing.parquet'}: file not "
                                 f"found (relative paths are read from the project root {tmp_path})")
    (tmp_path / "folder").mkdir()
    code, _, err = check(source={**section["source"], "path": "folder"})
    assert code == 1 and err == ("psrnn check: error: custom.source.path: folder is a directory; expected a single "
                                 f"Parquet file (relative paths are read from the project root {tmp_path})")
    code, _, err = check(two_stage={**section["two_stage"], "past_window": 6, "future_window": 6})
    assert code == 1 and err.startswith("psrnn check: error: custom.two_stage.past_window + custom.two_stage."
                                        "future_window + 1 = 6 + 6 + 1 = 13 exceeds the shortest training "
                                        "trajectory (12 steps), trajectory 100 of the file "), err
    assert err.endswith("(one of 4 training trajectories shorter than 13 steps); expected past_window + "
                        "future_window <= 11, or drop the trajectories shorter than 13 steps from the file"), err
    code, _, err = check(kf={"state_dim": 2, "past_window": 6, "future_window": 6})
    assert code == 1 and err.startswith("psrnn check: error: custom.kf.past_window"), err
    code, _, err = check(kf={"state_dim": 9, "past_window": 4, "future_window": 4})
    assert code == 1 and err.startswith("psrnn check: error: custom.kf.state_dim: 9 exceeds"), err
    # a file whose split column decides the splits: test_fraction and seed set beside it are refused by key, as
    # valid_fraction is (they were silently ignored)
    cols = _continuous(n_traj=6, length=12)
    cols["split"] = np.repeat(["train"] * 4 + ["test"] * 2, 12)
    _write(tmp_path, cols, name="split.parquet")
    code, _, err = check(source={**section["source"], "path": "split.parquet"})
    assert code == 1 and err == ("psrnn check: error: custom.source.test_fraction: split.parquet has a 'split' "
                                 "column, which decides the splits; test_fraction and seed are not used with it: "
                                 "expected no test_fraction or seed in custom.source (remove them), or no split "
                                 "column"), err
    only = {k: v for k, v in section["source"].items() if k not in ("test_fraction", "seed")}
    code, out, err = check(source={**only, "path": "split.parquet"})
    assert code == 0 and "4 train / 2 test trajectories" in out, err
    code, _, err = check(source={**only, "path": "split.parquet", "valid_fraction": 0.2})
    assert code == 1 and "valid_fraction=0.2 is not used with it" in err and \
        "custom.source.valid_fraction=0.2" in err, err
    code, _, err = check(source={**section["source"], "min_length": 20})
    assert code == 1 and "custom.source.min_length=20" in err, err


def test_check_refuses_a_fig4b_trajectory_id_the_custom_file_lacks(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """On a custom file, Figure 4b's ``trajectory`` may be the file's own id of a test trajectory (a string): one
    the test split lacks, a training trajectory's included, is refused by `psrnn check` with the ids it has."""
    from pipeline import cli
    from pipeline.config import dump_yaml

    os.environ.pop("PSRNN_DEBUG", None)
    cols = _continuous(n_traj=6, length=12)
    cols["split"] = np.repeat(["train"] * 4 + ["test"] * 2, 12)
    _write(tmp_path, cols, name="series.parquet")
    section = {"source": {"path": "series.parquet", "kind": "continuous", "features": ["a", "b"]},
               "two_stage": {"n_features": 32, "state_dim": 4, "obs_dim": 2, "past_dim": 4, "past_window": 3,
                             "future_window": 3},
               "kf": None, "variants": ["psrnn"]}

    def check(**fig4b: Any) -> tuple[int, str]:
        report = {"figures": {"fig4b": {"dataset": "custom", **fig4b}}}
        (tmp_path / "params.yaml").write_text(dump_yaml({"seeds": [0], "custom": section, "report": report}))
        code = cli.main(["--root", str(tmp_path), "check"])
        return code, capsys.readouterr().err.strip()

    assert check(trajectory="104", feature="b") == (0, "")
    assert check(trajectory=1) == (0, "")
    code, err = check(trajectory="100")                      # a training trajectory's id
    assert code == 1 and err == (
        "psrnn check: error: report.figures.fig4b.trajectory: '100' is not the id of a test trajectory of custom "
        "(series.parquet; ids: 104, 105); expected one of them, a test trajectory's number from 0, or null"), err
    code, err = check(trajectory=2)
    assert code == 1 and err == ("psrnn check: error: report.figures.fig4b.trajectory: custom has no test trajectory "
                                 "2 to draw (series.parquet; test trajectories: 0, 1)"), err
    code, err = check(feature="c")                           # in the file, but not one of the features read
    assert code == 1 and err == ("psrnn check: error: report.figures.fig4b.feature: 'c' is not a feature of custom "
                                 "(series.parquet); expected one of a, b"), err


def test_check_reads_one_long_recording_cut_by_segment_length(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The pipeline's way to one recording: refused whole, with the key that cuts it named; cut, it is read as
    segments, whose length the windows are checked against."""
    from pipeline import cli
    from pipeline.config import dump_yaml

    os.environ.pop("PSRNN_DEBUG", None)
    _write(tmp_path, _recording(100), name="recording.parquet")
    section = {"source": {"path": "recording.parquet", "kind": "continuous", "test_fraction": 0.2, "seed": 0},
               "two_stage": {"n_features": 32, "state_dim": 2, "obs_dim": 2, "past_dim": 2, "past_window": 3,
                             "future_window": 3},
               "kf": None, "variants": ["psrnn"]}

    def check(**source: Any) -> tuple[int, str, str]:
        custom = {**section, "source": {**section["source"], **source}}
        (tmp_path / "params.yaml").write_text(dump_yaml({"seeds": [0], "custom": custom}))
        code = cli.main(["--root", str(tmp_path), "check"])
        out, err = capsys.readouterr()
        return code, out, err.strip()

    code, _, err = check()
    assert code == 1 and err == (f"psrnn check: error: {tmp_path / 'recording.parquet'}: only 1 trajectory; at least "
                                 "2 are needed to make non-empty train and test splits: cut it into segments with "
                                 "custom.source.segment_length, or give a 'split' column (e.g. train rows first, "
                                 "then test rows)"), err
    code, out, err = check(segment_length=20)
    assert code == 0 and err == "", err
    assert "custom: recording.parquet: continuous, 2 features, 4 train / 1 test trajectories, training lengths 20 " \
           "to 20 steps" in out, out
    code, _, err = check(segment_length=6)
    assert code == 1 and err == ("psrnn check: error: custom.two_stage.past_window + custom.two_stage.future_window "
                                 "+ 1 = 3 + 3 + 1 = 7 exceeds the trajectory length (custom.source.segment_length = "
                                 "6); expected past_window + future_window <= 5"), err


# ------------------------------------------------------------------ duplicate columns, page checksums, arguments


def test_duplicate_column_names(tmp_path: Path) -> None:
    traj, x = pa.array([1, 1, 2, 2]), pa.array([0.0, 1.0, 2.0, 3.0])
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.table([traj, x, x], names=["trajectory", "x", "x"]), path)
    for kwargs in ({"kind": "continuous"}, {"kind": "continuous", "features": ["x"]}):
        assert _error(path, **kwargs) == (f"{path}: columns appearing more than once: 'x'; expected each column "
                                          "name once (rename or drop the duplicates)")
    two = tmp_path / "two.parquet"
    pq.write_table(pa.table([traj, x, traj, x], names=["trajectory", "x", "trajectory", "y"]), two)
    assert _error(two, kind="continuous") == (f"{two}: columns appearing more than once: 'trajectory'; expected "
                                              "each column name once (rename or drop the duplicates)")


def _flip_data_page(path: Path, column: int) -> Path:
    """A copy of ``path`` with 8 bytes inverted in the middle of the first data page of ``column`` (the page
    header, at data_page_offset, and the file structure are left intact)."""
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(column)
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    middle = (chunk.data_page_offset + start + chunk.total_compressed_size) // 2
    data = bytearray(path.read_bytes())
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    bad = path.with_name("bad_" + path.name)
    bad.write_bytes(bytes(data))
    return bad


def test_corrupt_data_page_is_detected_by_its_checksum(tmp_path: Path) -> None:
    cols = _continuous(n_traj=10, length=100)
    path = tmp_path / "crc.parquet"
    pq.write_table(pa.table(cols), path, write_page_checksum=True, compression="none", use_dictionary=False)
    bad = _flip_data_page(path, 2)  # column 'a'
    crc = ("corrupt Parquet file: a data page fails its checksum (could not verify page integrity, CRC checksum "
           "verification failed for page_ordinal 0); expected an intact file: copy or write it again")
    assert _error(bad, kind="continuous") == f"{bad}: {crc}"
    assert _error(bad, kind="continuous", features=["a"]) == f"{bad}: {crc}"
    # the same damage without checksums reads back as other numbers (module docstring: not detected)
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table(cols), plain, compression="none", use_dictionary=False)
    assert not pq.read_table(_flip_data_page(plain, 2)).equals(pq.read_table(plain))


def test_prepared_datasets_carry_page_checksums(tmp_path: Path) -> None:
    """write_dataset writes page CRCs: a flipped byte in its data pages fails read_dataset and load_custom."""
    ds = load_custom(_write(tmp_path, _continuous(n_traj=10, length=100)), kind="continuous", features=["a"])
    out = tmp_path / "prepared.parquet"
    write_dataset(out, ds)
    names = pq.read_schema(out).names
    bad = _flip_data_page(out, names.index("a"))
    with pytest.raises(ValueError) as err:
        read_dataset(bad)
    assert str(err.value) == (f"{bad}: not a readable Parquet file, truncated or corrupt (could not verify page "
                              "integrity, CRC checksum verification failed for page_ordinal 0)")
    assert "a data page fails its checksum" in _error(bad, kind="continuous", features=["a"])


@pytest.mark.parametrize("kwargs, expected", [
    ({"features": "xy"}, "features='xy': expected a list of column names (strings), or None for all numeric columns"),
    ({"features": ["a", 1]}, "features=['a', 1]: expected a list of column names (strings), or None for all "
                             "numeric columns"),
    ({"normalize": "no"}, "normalize='no': expected a bool (True or False)"),
    ({"normalize": 0}, "normalize=0: expected a bool (True or False)"),
    ({"test_fraction": "0.2"}, "test_fraction='0.2': expected a number strictly between 0 and 1"),
    ({"test_fraction": None}, "test_fraction=None: expected a number strictly between 0 and 1"),
    ({"test_fraction": True}, "test_fraction=True: expected a number strictly between 0 and 1"),
    ({"test_fraction": float("nan")}, "test_fraction=nan: expected a number strictly between 0 and 1"),
    ({"valid_fraction": "0.1"}, "valid_fraction='0.1': expected a number >= 0 with test_fraction + valid_fraction "
                                "< 1 (test_fraction=0.2)"),
    ({"valid_fraction": None}, "valid_fraction=None: expected a number >= 0 with test_fraction + valid_fraction "
                               "< 1 (test_fraction=0.2)"),
    ({"seed": -1}, "seed=-1: expected an integer with 0 <= seed < 2**32"),
    ({"seed": 2 ** 32}, "seed=4294967296: expected an integer with 0 <= seed < 2**32"),
    ({"seed": 1.5}, "seed=1.5: expected an integer with 0 <= seed < 2**32"),
    ({"seed": "0"}, "seed='0': expected an integer with 0 <= seed < 2**32"),
    ({"seed": True}, "seed=True: expected an integer with 0 <= seed < 2**32"),
    ({"symbol_column": None}, "symbol_column=None: expected a column name (a string)"),
    ({"kind": ["continuous"]}, "kind=['continuous']: expected one of ('discrete', 'continuous')"),
    ({"segment_length": 1}, "segment_length=1: expected an integer >= 2 (a segment needs a step to predict), or "
                            "None to keep trajectories whole"),
    ({"segment_length": 0}, "segment_length=0: expected an integer >= 2 (a segment needs a step to predict), or "
                            "None to keep trajectories whole"),
    ({"segment_length": 4.0}, "segment_length=4.0: expected an integer >= 2 (a segment needs a step to predict), "
                              "or None to keep trajectories whole"),
    ({"segment_length": "4"}, "segment_length='4': expected an integer >= 2 (a segment needs a step to predict), "
                              "or None to keep trajectories whole"),
    ({"segment_length": True}, "segment_length=True: expected an integer >= 2 (a segment needs a step to predict), "
                               "or None to keep trajectories whole"),
    ({"segment_length": 3, "min_length": 4}, "segment_length=3: expected an integer >= 4 (min_length=4), or None "
                                             "to keep trajectories whole"),
])
def test_bad_arguments_are_named(tmp_path: Path, kwargs: dict[str, Any], expected: str) -> None:
    path = _write(tmp_path, _continuous())
    kwargs = {"kind": "continuous", **kwargs}
    with pytest.raises(ValueError) as err:
        load_custom(path, **kwargs)
    assert str(err.value) == expected


def test_bad_path_argument_and_read_rows_checks(tmp_path: Path) -> None:
    from pipeline.data.custom import read_rows

    for bad in (None, 3):
        with pytest.raises(ValueError) as err:
            load_custom(bad, kind="continuous")  # type: ignore[arg-type]
        assert str(err.value) == f"path={bad!r}: expected a str or os.PathLike naming a Parquet file"
    path = _write(tmp_path, _continuous())
    with pytest.raises(ValueError) as err:
        read_rows(None, kind="continuous")  # type: ignore[arg-type]
    assert str(err.value) == "path=None: expected a str or os.PathLike naming a Parquet file"
    with pytest.raises(ValueError) as err:
        read_rows(path, kind="continuous", features="ab")  # type: ignore[arg-type]
    assert str(err.value).startswith("features='ab': expected a list of column names")
    # accepted spellings: a str path, a tuple of features, numpy scalars for the numbers
    ds = load_custom(str(path), kind="continuous", features=("a",), test_fraction=np.float64(0.34),
                     seed=np.int64(3), normalize=np.bool_(False))
    assert ds.meta["trajectory_ids"] == load_custom(path, kind="continuous", test_fraction=0.34, seed=3
                                                    ).meta["trajectory_ids"]


# ------------------------------------------------------------------- columns a CSV export brings along (user audit)


def test_auto_features_warn_about_time_stamps_and_per_trajectory_labels(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """features=None takes every numeric column: a time stamp kept beside (or instead of) `step` and a label that is
    constant within each trajectory (a room number) would become features without a word. Both are named in one
    warning; named features, or columns that are measurements, give none."""
    cols = _continuous()
    n = len(cols["a"])
    cols["timestamp"] = 1_700_000_000 + 600 * np.arange(n)                      # increases within every trajectory
    cols["room"] = np.repeat([3, 7, 3, 12, 5, 7], 5)                            # one value per trajectory
    with caplog.at_level("WARNING", logger="pipeline.data.custom"):
        ds = load_custom(_write(tmp_path, cols), kind="continuous")
    assert ds.features == ["a", "b", "c", "timestamp", "room"]                  # still taken: the warning says so
    (warning,) = [r for r in caplog.records if "timestamp" in r.getMessage()]
    text = warning.getMessage()
    assert warning.levelname == "WARNING" and "\n" not in text
    assert "'timestamp' (increases within every trajectory, like a time)" in text, text
    assert "'room' (constant within each trajectory, like a label)" in text, text
    assert "'a'" not in text and "'b'" not in text and "'c'" not in text        # 'c' is constant everywhere: no label
    assert "features" in text and "step" in text
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipeline.data.custom"):
        load_custom(_write(tmp_path, cols, "named.parquet"), kind="continuous", features=["a", "b"])
        load_custom(_write(tmp_path, _continuous(), "plain.parquet"), kind="continuous")
    assert not [r for r in caplog.records if "like a" in r.getMessage()]


def test_step_of_time_stamps_or_floats_says_how_to_convert(tmp_path: Path) -> None:
    """A `step` column of time stamps (pandas' parse_dates) or of floats (a CSV column with gaps) is refused with
    the conversion that makes it usable, not only its type."""
    cols = _continuous()
    cols["step"] = pa.array((np.datetime64("2024-01-01") + 600 * cols["step"].astype("timedelta64[s]"))
                            .astype("datetime64[us]"))
    msg = _error(_write(tmp_path, cols), kind="continuous")
    assert "column 'step' has type timestamp[us]; expected integers" in msg, msg
    assert "df['step'] = df['step'].astype('int64')" in msg and "leave the column out" in msg, msg
    cols = _continuous()
    cols["step"] = cols["step"].astype(float)
    msg = _error(_write(tmp_path, cols, "f.parquet"), kind="continuous")
    assert "'step' has type double; expected integers" in msg and "astype('int64')" in msg, msg


def test_named_feature_written_as_text_says_how_to_convert(tmp_path: Path) -> None:
    cols = _continuous()
    cols["a"] = [f"{v:.3f}" for v in cols["a"]]
    msg = _error(_write(tmp_path, cols), kind="continuous", features=["a", "b"])
    assert "feature column 'a' has type string; expected a numeric (integer, float or bool) column" in msg, msg
    assert "df['a'] = df['a'].astype(float)" in msg, msg


def test_bool_feature_columns_read_as_zero_and_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cols = _continuous(n_traj=3)
    cols["pen_up"] = np.arange(15) % 4 == 0
    ds = load_custom(_write(tmp_path, cols), kind="continuous", features=["a", "pen_up"], normalize=False,
                     test_fraction=0.34)
    assert ds.features == ["a", "pen_up"]
    for s in ("train", "test"):
        for k, t in zip(ds.meta["trajectory_ids"][s], ds.split(s)):
            assert t.dtype == np.float64
            assert t[:, 1].tolist() == [1.0 if (5 * (k - 100) + j) % 4 == 0 else 0.0 for j in range(5)]
    with caplog.at_level("WARNING", logger="pipeline.data.custom"):   # features=None still leaves bools out
        assert load_custom(_write(tmp_path, cols, "auto.parquet"), kind="continuous").features == ["a", "b", "c"]
    assert "'pen_up' (bool); name the feature columns in features to silence this (a bool column named in " \
           "features is read as 0/1)" in caplog.text
    cols["pen_up"] = pa.array([True, None] + [False] * 13)   # a missing flag is missing, not False
    msg = _error(_write(tmp_path, cols, "null.parquet"), kind="continuous", features=["a", "pen_up"])
    assert msg.endswith("1 row has NaN, Inf or missing values in feature columns ['pen_up'] (first: row 1, "
                        "trajectory 100); expected finite numbers"), msg


def test_a_mistaken_kind_gets_a_hint(tmp_path, caplog):
    """A text column of events under kind: continuous is dropped with a warning that names kind: discrete; a float
    column of measurements read as symbols fails on unseen values with a hint to kind: continuous."""
    import logging

    rng = np.random.default_rng(0)
    events = tmp_path / "events.parquet"
    pq.write_table(pa.table({"trajectory": np.repeat(np.arange(6), 20), "session": np.repeat(np.arange(6.0), 20),
                             "event": rng.choice(["buy", "view"], size=120)}), events)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.custom"):
        load_custom(events, kind="continuous", test_fraction=0.34)
    assert any("(a column of symbols? kind: discrete with symbol_column: event reads it)" in r.getMessage()
               for r in caplog.records)
    readings = tmp_path / "readings.parquet"
    pq.write_table(pa.table({"trajectory": np.repeat(np.arange(6), 20), "symbol": rng.standard_normal(120)}),
                   readings)
    with pytest.raises(ValueError, match=r"expected only train symbols \(a float column of measurements\? "
                                         r"kind: continuous reads it as a feature\)$"):
        load_custom(readings, kind="discrete", test_fraction=0.34)


def test_check_notes_a_custom_file_that_git_does_not_track(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Queued and --temp experiments copy the tracked files only: an untracked custom file failed there with DVC's
    bare 'No such file or directory' after a dozen warnings. `psrnn check` says so first."""
    import subprocess

    from pipeline import cli
    from pipeline.config import dump_yaml

    _write(tmp_path, _continuous(n_traj=6, length=12), name="series.parquet")
    section = {"source": {"path": "series.parquet", "kind": "continuous", "features": ["a", "b"]},
               "two_stage": {"n_features": 32, "state_dim": 4, "obs_dim": 2, "past_dim": 4, "past_window": 3,
                             "future_window": 3},
               "kf": None, "variants": ["psrnn"]}
    (tmp_path / "params.yaml").write_text(dump_yaml({"seeds": [0], "datasets": ["custom"], "custom": section}))
    note = ("note: custom.source.path: series.parquet is tracked neither by git nor by a .dvc file: queued and "
            "--temp experiments")
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    assert note not in capsys.readouterr().out                      # not a git repository: nothing to say
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    assert note in capsys.readouterr().out
    subprocess.run([*git, "add", "series.parquet"], cwd=tmp_path, check=True)
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    assert note not in capsys.readouterr().out


def test_the_files_own_steps_are_recorded_for_the_outputs(tmp_path, caplog):
    """The prepared file numbers steps 0, 1, ...; meta trajectory_steps keeps the file's (evenly spaced ones as first
    and spacing, others in full), read back per trajectory by source_steps after a write and read, in the order of
    trajectory_ids: the predictions and figure 4b name the user's steps."""
    path = _write(tmp_path, {"trajectory": ["b"] * 3 + ["a"] * 3 + ["c"] * 2,
                             "step": [20, 0, 10, 5, 1, 2, 7, 9], "split": ["train"] * 3 + ["test"] * 5,
                             "x": np.arange(8.0)})
    from pipeline.workflow.evaluate import source_ids, source_steps

    ds = load_custom(path, kind="continuous")
    assert ds.meta["trajectory_ids"]["test"] == ["a", "c"]
    assert ds.meta["trajectory_steps"] == {"train": [{"first": 0, "every": 10}], "valid": [],
                                           "test": [[1, 2, 5], {"first": 7, "every": 2}]}
    write_dataset(tmp_path / "prepared.parquet", ds)
    again = read_dataset(tmp_path / "prepared.parquet")
    assert [source_steps(again, "test", i).tolist() for i in range(2)] == [[1, 2, 5], [7, 9]]
    assert source_steps(again, "train", 0).tolist() == [0, 10, 20] and source_ids(again, "test") == ["a", "c"]
    # without a step column the row order is the step, as in the prepared file: nothing to record
    plain = load_custom(_write(tmp_path, {"trajectory": [1, 1, 2, 2], "x": np.arange(4.0)}, "plain.parquet"),
                        kind="continuous", test_fraction=0.5)
    assert "trajectory_steps" not in plain.meta and source_steps(plain, "test", 0).tolist() == [0, 1]


def test_string_trajectory_ids_sorted_as_numpy_does_from_arrow_chunks():
    """_sorted_codes finds a string column's distinct ids with Arrow and sorts only them: exactly np.unique's
    (values, inverse), whatever the chunks and types (unicode, empty, numbers as text), without a str per row."""
    from pipeline.data.custom import _sorted_codes

    rng = np.random.default_rng(0)
    pool = np.array(["b", "a", "é", "Z", "10", "9", "", "a b", "ü/1", "zz" * 30, "中", "a\u0301"], dtype=object)
    for _ in range(30):
        vals = pool[rng.integers(0, len(pool), rng.integers(1, 200))]
        parts = [p for p in np.array_split(vals, int(rng.integers(1, 4))) if len(p)]
        for typ in (pa.string(), pa.large_string()):
            col = pa.chunked_array([pa.array(list(p), type=typ) for p in parts], type=typ)
            uniq, codes = _sorted_codes(col)
            want_uniq, want_codes = np.unique(np.asarray(col.to_numpy(zero_copy_only=False)), return_inverse=True)
            assert uniq.dtype == want_uniq.dtype and list(uniq) == list(want_uniq)
            assert codes.dtype == want_codes.dtype and np.array_equal(codes, want_codes)
    col = pa.chunked_array([pa.array([7, 3, 7, 1])])   # integers: numpy's own path
    assert [list(a) for a in _sorted_codes(col)] == [[1, 3, 7], [2, 1, 2, 0]]


def test_string_ids_are_not_sorted_row_by_row(tmp_path, monkeypatch):
    """A file of string trajectory ids loads as before, without np.unique on the per-row ids (object sort:
    n log n Python comparisons, ~8 s of 3.2M rows)."""
    n_traj, length = 5, 40
    rng = np.random.default_rng(3)
    perm = rng.permutation(n_traj * length)
    ids = np.repeat([f"rec{i}" for i in (4, 0, 3, 1, 2)], length)
    steps = np.tile(np.arange(length), n_traj)
    x = rng.normal(size=n_traj * length)
    path = _write(tmp_path, {"trajectory": ids[perm], "step": steps[perm], "x": x[perm]})
    calls = []
    real = np.unique

    def spying(a, *args, **kwargs):
        calls.append(len(np.ravel(a)) if np.asarray(a).dtype == object else 0)
        return real(a, *args, **kwargs)

    monkeypatch.setattr(np, "unique", spying)
    ds = load_custom(path, kind="continuous", test_fraction=0.2, normalize=False)
    assert max(calls) <= n_traj   # only the distinct ids were sorted as Python objects
    monkeypatch.undo()
    got = sorted(ds.meta["trajectory_ids"]["train"] + ds.meta["trajectory_ids"]["test"])
    assert got == [f"rec{i}" for i in range(n_traj)]
    for tid, t in zip(ds.meta["trajectory_ids"]["train"], ds.train):
        k = np.flatnonzero(ids == tid)
        assert np.array_equal(t[:, 0], x[k][np.argsort(steps[k])])


def test_loading_holds_the_features_about_twice_not_four_times(tmp_path):
    """read_rows fills the feature matrix a column at a time and judges each column's look alone (no list of
    columns beside their stack, no reordered copy of the whole matrix), and load_custom drops the file's matrix
    and the train copy before standardising: traced peaks (numpy's allocations) were 3.6x and 4.1x the feature
    bytes, now ~1.9x and ~2.8x. The numbers are the same."""
    import tracemalloc
    from pipeline.data.custom import read_rows

    n, m, length = 100_000, 8, 10_000
    rng = np.random.default_rng(0)
    perm = rng.permutation(n)
    cols = {"trajectory": np.repeat([f"run{i}" for i in range(n // length)], length)[perm],
            "step": np.tile(np.arange(length), n // length)[perm]}
    for j in range(m):
        cols[f"f{j}"] = rng.standard_normal(n)
    path = _write(tmp_path, cols)
    nbytes = n * m * 8
    tracemalloc.start()
    try:
        rows = read_rows(path, kind="continuous")
        read_peak = tracemalloc.get_traced_memory()[1]
        del rows
        tracemalloc.reset_peak()
        ds = load_custom(path, kind="continuous")
        load_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert read_peak < 2.6 * nbytes, read_peak / nbytes
    assert load_peak < 3.4 * nbytes, load_peak / nbytes
    train = np.concatenate(ds.train)
    assert np.allclose(train.mean(0), 0.0, atol=1e-12) and np.allclose(train.std(0), 1.0)


def test_string_symbols_and_splits_are_read_as_one_object_per_distinct_value(tmp_path):
    """read_rows reads a string symbol column as the sorted distinct symbols indexed per row (one str object per
    symbol, not per row: 3.2M symbols of 200 loaded in 6.3 s and 0.80 GB, 14 s and 0.96 GB before), and a string
    split column likewise: values and dtypes exactly to_numpy's and astype(str)'s."""
    from pipeline.data.custom import read_rows

    rng = np.random.default_rng(2)
    pool = ["w1", "w10", "é", "", "a b", "Z"]
    n = 3000
    symbols = [pool[i] for i in rng.integers(0, len(pool), n)]
    split = np.where(np.arange(n) < 2400, "train", "test")
    table = pa.table({"trajectory": np.repeat([3, 1, 2], n // 3), "symbol": symbols, "split": split})
    path = tmp_path / "s.parquet"
    pq.write_table(table, path, row_group_size=700)   # several chunks
    rows = read_rows(path, kind="discrete", with_split=True)
    want = np.asarray(table.column("symbol").to_numpy(zero_copy_only=False))
    assert rows.values.dtype == want.dtype and rows.values.tolist() == want.tolist()
    assert len({id(v) for v in rows.values}) == len(set(symbols))
    want_split = np.asarray(table.column("split").to_numpy(zero_copy_only=False)).astype(str)
    assert rows.split.dtype == want_split.dtype and np.array_equal(rows.split, want_split)
