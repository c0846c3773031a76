"""Checks of a dataset's data before the stages that would fail on it: a valid/test split with nothing to score,
a vocabulary too large for the discrete RFF maps, integers float64 would round, the uneven-step warning, the
rounding of the random split, and `psrnn check` against a built-in dataset's prepared file."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.config import dump_yaml
from pipeline.data.custom import load_custom
from pipeline.data.schema import SequenceDataset, write_dataset

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, columns: dict[str, Any], name: str = "data.parquet") -> Path:
    path = tmp_path / name
    pq.write_table(pa.table(columns), path)
    return path


def _refused(message: str, call, *args: Any, **kwargs: Any) -> None:
    """``call`` raises a ValueError whose whole message is ``message``."""
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call(*args, **kwargs)


def _check(tmp_path: Path, capsys: pytest.CaptureFixture, params: dict[str, Any]) -> tuple[int, str, str]:
    (tmp_path / "params.yaml").write_text(dump_yaml(params))
    code = cli.main(["--root", str(tmp_path), "check"])
    out, err = capsys.readouterr()
    return code, out, err.strip()


@pytest.fixture(autouse=True)
def _one_line_errors(monkeypatch):
    monkeypatch.delenv("PSRNN_DEBUG", raising=False)


# ------------------------------------------------------------------ 1. a valid or test split with nothing to score

def _one_step_split(tmp_path: Path, split: str, lengths: list[int]) -> Path:
    """Four train trajectories of 6 steps, and ``split`` trajectories of ``lengths`` (a test split besides)."""
    sizes = [6] * 4 + lengths + ([6] if split == "valid" else [])
    names = ["train"] * 4 + [split] * len(lengths) + (["test"] if split == "valid" else [])
    rng = np.random.default_rng(0)
    return _write(tmp_path, {"trajectory": np.repeat(np.arange(len(sizes)), sizes),
                             "split": np.repeat(names, sizes), "x": rng.normal(size=sum(sizes))})


def test_a_test_or_valid_split_of_single_steps_is_refused(tmp_path: Path) -> None:
    path = _one_step_split(tmp_path, "test", [1, 1])
    _refused(f"{path}: split 'test': all 2 of its trajectories are a single step (min_length=1 lets such "
             "trajectories through), so there is no one-step prediction to score; expected at least one test "
             "trajectory of 2 steps or more", load_custom, path, kind="continuous", min_length=1)
    path = _one_step_split(tmp_path, "valid", [1])
    _refused(f"{path}: split 'valid': its one trajectory is a single step (min_length=1 lets such trajectories "
             "through), so there is no one-step prediction to score; expected at least one valid trajectory of 2 "
             "steps or more", load_custom, path, kind="continuous", min_length=1)
    # one trajectory of 2 steps is enough: its single prediction is scored, the one-step trajectories add nothing
    ds = load_custom(_one_step_split(tmp_path, "test", [1, 2, 1]), kind="continuous", min_length=1)
    assert [len(t) for t in ds.test] == [1, 2, 1]


def test_preprocess_and_check_name_the_min_length_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from pipeline.config import load_params
    from pipeline.workflow.data import prepare

    path = _one_step_split(tmp_path, "test", [1])
    section = {"source": {"path": "data.parquet", "kind": "continuous", "min_length": 1},
               "two_stage": {"n_features": 16, "state_dim": 2, "obs_dim": 1, "past_dim": 2, "past_window": 2,
                             "future_window": 2},
               "kf": None, "variants": ["psrnn"]}
    message = (f"{path}: split 'test': its one trajectory is a single step (custom.source.min_length=1 lets such "
               "trajectories through), so there is no one-step prediction to score; expected at least one test "
               "trajectory of 2 steps or more")
    code, _, err = _check(tmp_path, capsys, {"seeds": [0], "custom": section})
    assert code == 1 and err == f"psrnn check: error: {message}"
    _refused(message, prepare, load_params(tmp_path / "params.yaml"), tmp_path, "custom")
    assert not (tmp_path / "data" / "prepared" / "custom.parquet").exists()


# ------------------------------------------------------------------------------ 2. a vocabulary of ids, not symbols

def test_discrete_maps_above_the_bound_are_refused_before_they_are_drawn() -> None:
    from pipeline.features import DISCRETE_MAPS_BYTES, check_discrete_maps

    assert DISCRETE_MAPS_BYTES == 4 * 2 ** 30
    check_discrete_maps(3000, 2000, 10, 10)             # 0.9 GiB: a large vocabulary, but maps that fit
    check_discrete_maps(12782, 2000, 10, 10)            # 21 x 12782 x 2000 x 8 bytes: just below 4 GiB
    _refused("12783 symbols: the discrete RFF maps would hold (1 + two_stage.past_window + two_stage.future_window) "
             "x symbols x two_stage.n_features x 8 bytes = (1 + 10 + 10) x 12783 x 2000 x 8 = 4.0 GiB, above the "
             "bound of 4 GiB; expected fewer distinct symbols (is the symbol column an id?), a smaller "
             "two_stage.n_features or shorter windows", check_discrete_maps, 12783, 2000, 10, 10)


def test_a_synthetic_vocabulary_too_large_for_the_maps_is_refused_with_the_params(defaults) -> None:
    """hmm's vocabulary is a param: the bound is checked when params.yaml is read, naming the dataset's keys,
    not minutes later in the features stage with bare two_stage.* names."""
    import copy

    from pipeline.config import ParamsError, parse_params

    raw = copy.deepcopy(defaults)
    raw["hmm"]["source"]["n_symbols"] = 200000
    with pytest.raises(ParamsError, match=r"^hmm\.source\.n_symbols: 200000 symbols: the discrete RFF maps would "
                                          r"hold \(1 \+ hmm\.two_stage\.past_window \+ hmm\.two_stage\.future_window\) "
                                          r"x symbols x hmm\.two_stage\.n_features x 8 bytes"):
        parse_params(raw)
    raw["hmm"]["source"]["n_symbols"] = 2000
    parse_params(raw)


def test_the_features_stage_refuses_them_without_allocating() -> None:
    """fit_feature_maps, which the features stage calls, refuses 9.4 GiB of maps. Run under a 3 GiB address-space
    limit: drawing them instead would fail with a MemoryError rather than take the memory of the machine."""
    code = ("from pipeline.features import fit_feature_maps, make_windows\n"
            "import numpy as np\n"
            "w = make_windows([np.arange(60) % 30000, np.arange(60)], 10, 10, discrete=True, vocab_size=30000)\n"
            "try:\n"
            "    fit_feature_maps(w, n_features=2000, obs_dim=30000, vocab_size=30000)\n"
            "except ValueError as exc:\n"
            "    print(exc)\n")

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (3 * 2 ** 30, 3 * 2 ** 30))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (
        "30000 symbols: the discrete RFF maps would hold (1 + two_stage.past_window + two_stage.future_window) x "
        "symbols x two_stage.n_features x 8 bytes = (1 + 10 + 10) x 30000 x 2000 x 8 = 9.4 GiB, above the bound "
        "of 4 GiB; expected fewer distinct symbols (is the symbol column an id?), a smaller two_stage.n_features "
        "or shorter windows")


def _ids_file(tmp_path: Path, n_symbols: int) -> Path:
    """Ten train trajectories holding ``n_symbols`` distinct ids between them, two test ones reusing a few."""
    rng = np.random.default_rng(0)
    train = rng.permutation(n_symbols)
    per = n_symbols // 10
    test = rng.choice(n_symbols, size=2 * 30)
    return _write(tmp_path, {"trajectory": np.r_[np.repeat(np.arange(10), per), np.repeat([10, 11], 30)],
                             "split": ["train"] * n_symbols + ["test"] * 60,
                             "user": np.r_[train, test].astype(np.int64)}, "ids.parquet")


def test_an_id_column_read_as_symbols_gets_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _ids_file(tmp_path, 400)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.custom"):
        ds = load_custom(path, kind="discrete", symbol_column="user")
    assert ds.obs_dim == 400
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: column 'user' has 400 distinct symbols in 400 training steps, more than half as many; is 'user' "
        "an id rather than a symbol?"]
    caplog.clear()
    rng = np.random.default_rng(1)   # 3 symbols over 240 steps: no warning
    events = _write(tmp_path, {"trajectory": np.repeat(np.arange(8), 30),
                               "event": rng.choice(["buy", "view", "leave"], size=240)}, "events.parquet")
    with caplog.at_level(logging.WARNING, logger="pipeline.data.custom"):
        load_custom(events, kind="discrete", symbol_column="event", test_fraction=0.25)
    assert not caplog.records
    # ids unique to each row: test's are never seen in train, an error that must ask the same question
    unique = _write(tmp_path, {"trajectory": np.repeat(np.arange(10), 30), "event": np.arange(300).astype(str)},
                    "unique.parquet")
    with pytest.raises(ValueError, match=re.escape("column 'event': test has symbols not seen in train: ") + ".*"
                       + re.escape("; expected only train symbols (is 'event' an id rather than a symbol? 240 distinct "
                                   "symbols in 240 training steps)") + "$"):
        load_custom(unique, kind="discrete", symbol_column="event", test_fraction=0.2)


def test_check_refuses_a_vocabulary_the_features_stage_could_not_hold(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    _ids_file(tmp_path, 1500)
    section = {"source": {"path": "ids.parquet", "kind": "discrete", "symbol_column": "user"},
               "two_stage": {"n_features": 20000, "state_dim": 4, "obs_dim": 4, "past_dim": 4, "past_window": 10,
                             "future_window": 10},
               "kf": None, "variants": ["psrnn"], "train": {"bptt": 35}}
    code, _, err = _check(tmp_path, capsys, {"seeds": [0], "custom": section})
    assert code == 1 and err == (
        "psrnn check: error: 1500 symbols: the discrete RFF maps would hold (1 + custom.two_stage.past_window + "
        "custom.two_stage.future_window) x symbols x custom.two_stage.n_features x 8 bytes = (1 + 10 + 10) x 1500 "
        "x 20000 x 8 = 4.7 GiB, above the bound of 4 GiB; expected fewer distinct symbols (is the symbol column an "
        "id?), a smaller custom.two_stage.n_features or shorter windows")
    section["two_stage"]["n_features"] = 2000
    code, out, err = _check(tmp_path, capsys, {"seeds": [0], "custom": section})
    assert code == 0, err
    assert "custom: ids.parquet: discrete, 1500 symbols, 10 train / 2 test trajectories" in out


# ------------------------------------------------------------------------------ 3. integers float64 would round

def test_integer_features_beyond_2_53_are_refused(tmp_path: Path) -> None:
    n = 12
    base = {"trajectory": np.repeat(np.arange(3), 4), "a": np.linspace(0.0, 1.0, n)}
    # 2**60 + k: float64 reads all of them as 2**60, a "constant" column
    path = _write(tmp_path, {**base, "account": 2 ** 60 + np.arange(n, dtype=np.int64)})
    _refused(f"{path}: feature column 'account' has 12 integers beyond ±2**53 (first: row 0, 1152921504606846976), "
             "which float64 cannot hold exactly; expected |values| <= 2**53: subtract an offset before writing the "
             "file, or write the column as float if rounding is acceptable", load_custom, path, kind="continuous")
    low = np.zeros(n, dtype=np.int64)
    low[5] = -(2 ** 53) - 1
    path = _write(tmp_path, {**base, "delta": low}, "negative.parquet")
    _refused(f"{path}: feature column 'delta' has 1 integers beyond ±2**53 (first: row 5, -9007199254740993), which "
             "float64 cannot hold exactly; expected |values| <= 2**53: subtract an offset before writing the file, "
             "or write the column as float if rounding is acceptable", load_custom, path, kind="continuous",
             features=["a", "delta"])
    unsigned = pa.array(np.full(n, 2 ** 63 + 1, dtype=np.uint64))
    path = _write(tmp_path, {**base, "hash": unsigned}, "unsigned.parquet")
    with pytest.raises(ValueError, match=r"feature column 'hash' has 12 integers beyond ±2\*\*53 \(first: row 0, "
                                         r"9223372036854775809\)"):
        load_custom(path, kind="continuous")
    # up to 2**53 every integer is exact, and is taken
    edge = np.arange(n, dtype=np.int64) - 2 ** 53 + np.r_[0, [2 ** 54 - 20] * (n - 1)]
    ds = load_custom(_write(tmp_path, {**base, "big": edge}, "edge.parquet"), kind="continuous", normalize=False)
    assert sorted(np.concatenate([t[:, 1] for t in ds.train + ds.test]).tolist()) == sorted(edge.tolist())


# -------------------------------------------------------------------------------- 4. the first uneven step

@pytest.mark.parametrize("steps, count, first, began", [
    ([0, 1, 2, 4, 6, 8], 3, "step 4 after 2", 1),   # the spacing most often is 2; the first change is at 4
    ([0, 1, 2, 4, 6], 2, "step 4 after 2", 1),      # median 1.5: no interval equals it
    ([0, 5, 6, 7, 8], 3, "step 6 after 5", 5),      # a gap first: the steps after it differ from it
])
def test_uneven_steps_name_the_first_change_of_spacing(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       steps: list[int], count: int, first: str, began: int) -> None:
    even = list(range(0, 30, 3))
    cols = {"trajectory": [7] * len(even) + [8] * len(steps), "step": even + steps,
            "x": np.random.default_rng(0).normal(size=len(even) + len(steps))}
    path = _write(tmp_path, cols)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.custom"):
        load_custom(path, kind="continuous", features=["x"], test_fraction=0.5)
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: {count} step intervals in 1 trajectory differ from their trajectory's first spacing (first: "
        f"trajectory 8, {first}, where its steps began {began} apart); the models use only the order of the rows, "
        "one observation per step"]


# ------------------------------------------------------------------------------ 5. the number of test trajectories

@pytest.mark.parametrize("n, test_fraction, valid_fraction, expected", [
    (5, 0.5, 0.0, (2, 0, 3)),       # 2.5 rounds up (Python's round: 2)
    (7, 0.5, 0.0, (3, 0, 4)),       # 3.5 rounds up, as with round
    (9, 0.5, 0.0, (4, 0, 5)),       # 4.5 rounds up (round: 4)
    (100, 0.145, 0.0, (85, 0, 15)),  # 14.5 as written (14.499999999999998 in floating point)
    (10, 0.2, 0.25, (5, 3, 2)),     # valid: 2.5 rounds up too
    (3, 0.01, 0.0, (2, 0, 1)),      # at least one test trajectory
    (3, 0.9, 0.0, (1, 0, 2)),       # and at least one train trajectory
])
def test_split_sizes_round_half_up(tmp_path: Path, n: int, test_fraction: float, valid_fraction: float,
                                   expected: tuple[int, int, int]) -> None:
    path = _write(tmp_path, {"trajectory": np.repeat(np.arange(n), 3), "x": np.arange(3.0 * n)})
    ds = load_custom(path, kind="continuous", test_fraction=test_fraction, valid_fraction=valid_fraction)
    assert (len(ds.train), len(ds.valid), len(ds.test)) == expected


# ------------------------------------------------------------- 6. check against a built-in dataset's prepared file

def _prepared_handwriting(root: Path, test_lengths: tuple[int, ...] = (45, 60)) -> Path:
    rng = np.random.default_rng(0)
    ds = SequenceDataset(kind="continuous", features=["x", "y", "pen_up"],
                         train=[rng.normal(size=(n, 3)) for n in (40, 55, 80)],
                         test=[rng.normal(size=(n, 3)) for n in test_lengths], meta={"source": "test"})
    path = root / "data" / "prepared" / "handwriting.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_dataset(path, ds)
    return path


def test_check_reads_a_built_in_datasets_prepared_file(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        defaults: dict[str, Any]) -> None:
    import copy
    import shutil

    shutil.copytree(ROOT / "examples", tmp_path / "examples")   # the shipped custom section's file, read by check
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["handwriting"]
    raw["handwriting"]["kf"] = {"state_dim": 20, "past_window": 300, "future_window": 300}
    code, out, err = _check(tmp_path, capsys, raw)          # not prepared yet: nothing to check the windows on
    assert code == 0 and "handwriting:" not in out, err
    path = _prepared_handwriting(tmp_path)
    code, _, err = _check(tmp_path, capsys, raw)
    assert code == 1 and err == (
        "psrnn check: error: handwriting.kf.past_window + handwriting.kf.future_window + 1 = 300 + 300 + 1 = 601 "
        "exceeds the shortest training trajectory (40 steps); expected past_window + future_window <= 39 (checked "
        f"against {path}, as last prepared)")
    raw["handwriting"]["kf"] = defaults["handwriting"]["kf"]
    code, out, err = _check(tmp_path, capsys, raw)
    assert code == 0, err
    assert ("handwriting: data/prepared/handwriting.parquet: continuous, 3 features, 3 train / 2 test "
            "trajectories, training lengths 40 to 80 steps") in out.splitlines()
    raw["datasets"] = ["hmm"]                                 # a section left out of datasets: not read
    raw["handwriting"]["kf"] = {"state_dim": 20, "past_window": 300, "future_window": 300}
    code, out, err = _check(tmp_path, capsys, raw)
    assert code == 0 and "handwriting:" not in out, err

    raw["datasets"] = ["handwriting"]                         # 1. built-in data whose test split cannot be scored
    raw["handwriting"]["kf"] = defaults["handwriting"]["kf"]
    path = _prepared_handwriting(tmp_path, test_lengths=(1, 1))
    code, _, err = _check(tmp_path, capsys, raw)
    assert code == 1 and err == (
        "psrnn check: error: handwriting.source: the test split: all 2 of its trajectories are a single step, so "
        "there is no one-step prediction to score; expected at least one test trajectory of 2 steps or more "
        f"(checked against {path}, as last prepared)")


def test_check_refuses_a_fig4b_feature_or_trajectory_the_prepared_data_lack(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture,
                                                                             defaults: dict[str, Any]) -> None:
    """Figure 4b's ``feature`` and ``trajectory`` are checked against the prepared data of the dataset it draws, once
    that is prepared: the report stage, the last of a long run, would only leave the figure out with a note."""
    import copy
    import shutil

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["handwriting"]
    raw["report"] = {"figures": {"fig4b": {"dataset": "handwriting", "feature": "pen_down", "trajectory": 1}}}
    code, out, err = _check(tmp_path, capsys, raw)            # not prepared: the data are not known yet
    assert code == 0, err
    _prepared_handwriting(tmp_path, test_lengths=(45, 1, 60))
    code, _, err = _check(tmp_path, capsys, raw)
    assert code == 1 and err == (
        "psrnn check: error: report.figures.fig4b.feature: 'pen_down' is not a feature of handwriting "
        "(data/prepared/handwriting.parquet, as last prepared); expected one of x, y, pen_up"), err
    raw["report"]["figures"]["fig4b"]["feature"] = "pen_up"
    code, _, err = _check(tmp_path, capsys, raw)              # trajectory 1 is a single step: nothing to draw
    assert code == 1 and err == (
        "psrnn check: error: report.figures.fig4b.trajectory: handwriting has no test trajectory 1 to draw "
        "(data/prepared/handwriting.parquet, as last prepared; test trajectories: 0, 2)"), err
    raw["report"]["figures"]["fig4b"]["trajectory"] = "run-04"
    code, _, err = _check(tmp_path, capsys, raw)              # built-in data have no ids of their own
    assert code == 1 and err == (
        "psrnn check: error: report.figures.fig4b.trajectory: 'run-04' is not the id of a test trajectory of "
        "handwriting (data/prepared/handwriting.parquet, as last prepared; ids: none: the data have no trajectory ids "
        "of their own); expected one of them, a test trajectory's number from 0, or null"), err
    raw["report"]["figures"]["fig4b"]["trajectory"] = 2
    code, _, err = _check(tmp_path, capsys, raw)
    assert code == 0, err
    # drawn on another dataset, or not drawn: handwriting's data say nothing about the options
    for fig4b in ({"feature": "pen_down", "trajectory": 9}, False):
        raw["report"]["figures"]["fig4b"] = fig4b
        code, _, err = _check(tmp_path, capsys, raw)
        assert code == 0, err
