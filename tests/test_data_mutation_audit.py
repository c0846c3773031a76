"""Data sources: what a mutation audit of ``pipeline/data`` and ``pipeline/workflow/data.py`` found untested.

Each test here failed on a plausible wrong implementation that the rest of the suite let through (91 mutants, 20
survivors that changed behaviour): generators that would not sample the model whose Bayes-optimal numbers are
written beside them, choices of trajectories and trials that broke their documented rule, input checks that only
covered one column, reader rules (row order, unknown splits, line endings) and the preprocess stage's checks.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import MIRROR
from pipeline.config import ParamsError, parse_params, read_yaml
from pipeline.data.schema import META_KEY, SequenceDataset, read_dataset

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------- synthetic sets


def test_lgssm_sampler_has_the_stationary_moments_of_its_model() -> None:
    """x' = A x + w, o = x + v with A = r·Rot(θ), Q = q·I: P₀ = q/(1 − r²)·I, E[o₀o₀ᵀ] = P₀ + R, E[o₁o₀ᵀ] = A P₀.

    A sampler that started at x₀ = 0, used Aᵀ or dropped the observation noise fails; the optimal MSE written
    beside the data assumes this model, so such data would make the "optimal" line wrong.
    """
    from pipeline.data.synthetic import LGSSM

    r, th, q, rv = 0.9, 0.5, 0.1, 0.2
    A = r * np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    p = q / (1 - r**2)
    system = LGSSM(A=A, C=np.eye(2), Q=q * np.eye(2), R=rv * np.eye(2), P0=p * np.eye(2))
    rng = np.random.default_rng(0)
    o = np.stack([system.sample(2, rng) for _ in range(4000)])
    np.testing.assert_allclose(o[:, 0].T @ o[:, 0] / len(o), (p + rv) * np.eye(2), atol=0.06)
    np.testing.assert_allclose(o[:, 1].T @ o[:, 0] / len(o), A * p, atol=0.06)


def test_hmm_sampler_pair_distribution_is_the_models() -> None:
    """p(o₀ = a, o₁ = b) = Σ π_s E[s, a] T[s, s'] E[s', b]; a sampler emitting from the first state only fails."""
    from pipeline.data.synthetic import HMM

    pi = np.array([0.7, 0.3])
    T = np.array([[0.2, 0.8], [0.9, 0.1]])
    E = np.array([[0.8, 0.1, 0.1], [0.1, 0.2, 0.7]])
    hmm = HMM(initial=pi, transition=T, emission=E)
    want = (pi[:, None] * E).T @ T @ E
    rng = np.random.default_rng(0)
    n = 6000
    got = np.zeros((3, 3))
    for _ in range(n):
        a, b = hmm.sample(2, rng)
        got[a, b] += 1
    np.testing.assert_allclose(got / n, want, atol=0.025)


def test_lgssm_mean_predictor_is_the_training_mean() -> None:
    """The mean predictor written beside the lgssm set predicts with the training mean (never the test's), as the
    naive ``train_mean`` predictor of every run does."""
    from pipeline.data.synthetic import make_lgssm_dataset
    from pipeline.naive import naive_metrics

    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=5, n_test=3, length=30, seed=4)
    train_mean = np.concatenate(ds.train).mean(0)
    by_hand = float(np.mean(np.concatenate([(t[1:] - train_mean) ** 2 for t in ds.test])))
    assert ds.meta["mean_predictor"]["mse"] == pytest.approx(by_hand, rel=1e-12)
    naive = naive_metrics(ds.train, ds.test, discrete=False)["train_mean"]["mse"]
    assert ds.meta["mean_predictor"]["mse"] == pytest.approx(naive, rel=1e-12)


# ------------------------------------------------------------------------------------------------------ mocap

def test_root_orientation_is_the_roots_frame(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The ASF root ``orientation`` enters as the root's C (G_root = C·M·C⁻¹), as a bone's axis does; nothing says
    it is ignored (the parser once warned so while using it). rx = 90° about C·x: with C = Rz(90°) that is a
    rotation of 90° about y, which takes the end of bone a (2 in along x) from (2, 0, 0) to (0, 0, −2)."""
    from pipeline.data.mocap import forward_kinematics, parse_amc, parse_asf
    from test_data_audit import TINY_ASF

    (tmp_path / "m.amc").write_text(":FULLY-SPECIFIED\n:DEGREES\n1\nroot 0 0 0 90 0 0\na 0 0 0\nb 0\n")
    assert "orientation 0 0 0\n" in TINY_ASF
    ends = {}
    for orientation in ("0 0 0", "0 0 90"):
        (tmp_path / "s.asf").write_text(TINY_ASF.replace("orientation 0 0 0\n", f"orientation {orientation}\n"))
        with caplog.at_level(logging.WARNING, logger="pipeline.data.mocap"):
            pos, _ = forward_kinematics(parse_asf(tmp_path / "s.asf"), parse_amc(tmp_path / "m.amc"))
        ends[orientation] = pos[0, 1]
    np.testing.assert_allclose(ends["0 0 0"], [2, 0, 0], atol=1e-12)
    np.testing.assert_allclose(ends["0 0 90"], [0, 0, -2], atol=1e-12)
    assert "ignored" not in caplog.text


def test_mocap_allocation_ties_go_to_the_earlier_trial() -> None:
    from pipeline.data.mocap import _allocate

    assert _allocate([300, 300], 1, 300) == [1, 0]
    assert _allocate([600, 600, 600], 4, 300) == [2, 1, 1]
    assert _allocate([320, 320], 3, 300) == [2, 1]   # past the disjoint windows, a tie still goes first


def test_mocap_default_test_trials_are_the_test_share_of_trials() -> None:
    """max(1, round(6 · 8/48)) = 1 test trial of 6 (it holds ≥ 8 windows), whatever the seed; counting the share
    from n_train instead moves most trials into test."""
    from pipeline.data import mocap

    frames = {t: 1000 for t in ("01_01", "01_02", "01_03", "01_04", "02_01", "02_02")}
    for seed in range(5):
        assert len(mocap._choose_test_trials(list(frames), frames, 40, 8, 300, seed)) == 1


# ------------------------------------------------------------------------------------------------ handwriting


def _unipen(n: int, writer_offset: int) -> str:
    out = [".INCLUDE dene.doc", ".HIERARCHY DIGIT", ""]
    for k in range(n):
        label = k % 10
        out += [f'.SEGMENT DIGIT {k} ? "{label}"', f".COMMENT {label} {writer_offset + k} {k}", ".PEN_DOWN",
                f" {k} {2 * k}", f" {k + 1} {2 * k + 3}", f" {k + 5} {k}", ".PEN_UP", ".DT 100", ""]
    return "\n".join(out)


@pytest.fixture
def unipen_files(tmp_path: Path) -> Path:
    (tmp_path / "pendigits-orig.tra").write_text(_unipen(12, 100))
    (tmp_path / "pendigits-orig.tes").write_text(_unipen(8, 500))
    return tmp_path


def test_handwriting_choice_is_a_seeded_permutations_prefix_in_file_order(unipen_files: Path) -> None:
    from pipeline.data.handwriting import prepare_handwriting

    ds = prepare_handwriting(unipen_files, n_train=5, n_test=3, seed=7)
    rng = np.random.default_rng(7)   # train's eligible digits permuted, then test's; the first n of each kept
    want_train = sorted(rng.permutation(12)[:5].tolist())
    want_test = sorted(rng.permutation(8)[:3].tolist())
    assert [int(s) for s in ds.meta["train_segments"]] == want_train
    assert [int(s) for s in ds.meta["test_segments"]] == want_test
    assert ds.meta["train_writers"] == [100 + k for k in want_train]


def test_handwriting_test_choice_does_not_depend_on_n_train(unipen_files: Path) -> None:
    from pipeline.data.handwriting import prepare_handwriting

    small = prepare_handwriting(unipen_files, n_train=2, n_test=3, seed=3)
    big = prepare_handwriting(unipen_files, n_train=9, n_test=3, seed=3)
    assert small.meta["test_segments"] == big.meta["test_segments"]
    assert set(small.meta["train_segments"]) <= set(big.meta["train_segments"])


# -------------------------------------------------------------------------------------------------------- ptb


def _ptb_files(tmp_path: Path, train: str, valid: str, test: str) -> Path:
    (tmp_path / "full").mkdir()
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        (tmp_path / "full" / f"ptb.{name}.txt").write_bytes(text.encode())
    return tmp_path


def test_ptb_map_appends_unk_even_when_no_character_is_unseen(tmp_path: Path) -> None:
    """The vocabulary must not depend on the test text: ``<unk>`` is always its last symbol under ``map``."""
    from pipeline.data.ptb import UNK_SYMBOL, prepare_ptb

    ds = prepare_ptb(_ptb_files(tmp_path, " a b\n", " b\n", " a\n"), unknown="map")
    assert ds.vocab == ["\n", " ", "a", "b", UNK_SYMBOL]
    assert ds.meta["mapped_unknown"] == {"valid": 0, "test": 0}


def test_ptb_line_endings_are_kept_as_they_are(tmp_path: Path) -> None:
    from pipeline.data.ptb import prepare_ptb

    ds = prepare_ptb(_ptb_files(tmp_path, " a\r\n b\r\n", " a\r\n", " b\r\n"))
    assert ds.vocab == ["\n", "\r", " ", "a", "b"]
    assert len(ds.train[0]) == 8 and ds.meta["dropped_unknown"] == {"valid": 0, "test": 0}


# ---------------------------------------------------------------------------------------- schema and swimmer


def _prepared_table(split: list[str], trajectory: list[int], step: list[int], x: list[float]) -> pa.Table:
    meta = {"kind": "continuous", "features": ["x"], "vocab": [], "source": "probe"}
    table = pa.table({"split": pa.array(split, type=pa.string()),
                      "trajectory": pa.array(np.array(trajectory, np.int64)),
                      "step": pa.array(np.array(step, np.int64)), "x": pa.array(np.array(x, np.float64))})
    return table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})


def test_read_dataset_orders_rows_by_step_within_a_trajectory(tmp_path: Path) -> None:
    pq.write_table(_prepared_table(["train", "test", "train", "test", "train"], [0, 1, 0, 1, 0], [2, 1, 0, 0, 1],
                                   [20.0, 11.0, 0.0, 10.0, 10.0]), tmp_path / "d.parquet")
    ds = read_dataset(tmp_path / "d.parquet")
    assert ds.train[0][:, 0].tolist() == [0.0, 10.0, 20.0]
    assert ds.test[0][:, 0].tolist() == [10.0, 11.0]


def test_read_dataset_refuses_an_unknown_split(tmp_path: Path) -> None:
    pq.write_table(_prepared_table(["train", "train", "dev", "dev"], [0, 0, 1, 1], [0, 1, 0, 1], [1.0, 2.0, 3.0, 4.0]),
                   tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="split 'dev'"):
        read_dataset(tmp_path / "d.parquet")


def test_authors_swimmer_file_with_nan_is_refused(tmp_path: Path) -> None:
    from scipy.io import savemat

    from pipeline.data.swimmer import AUTHORS_DIR, load_authors_swimmer

    trajs = np.random.default_rng(0).standard_normal((25, 10, 16))
    trajs[24, 3, 9] = np.nan
    (tmp_path / AUTHORS_DIR).mkdir()
    savemat(tmp_path / AUTHORS_DIR / "swimmers_trajs_0.0.mat", {"trajs": trajs})
    with pytest.raises(ValueError, match="NaN"):
        load_authors_swimmer(tmp_path)


def test_simulated_swimmer_rows_are_their_reset_seeds_and_the_splits_disjoint() -> None:
    try:
        import gymnasium as gym

        env = gym.make("Swimmer-v5")
    except Exception as exc:  # noqa: BLE001 - any failure to build the environment means: not here
        pytest.skip(f"gymnasium Swimmer-v5 unavailable: {exc}")
    from pipeline.data.swimmer import simulate_swimmer

    ds = simulate_swimmer(seed=5, n_trajectories=5, n_train=3, length=4, cem_iterations=1, cem_population=2,
                          cem_episode_length=5, n_eval=1)
    mean, std = (np.array(ds.meta["normalization"][k]) for k in ("mean", "std"))
    for k, traj in enumerate(ds.train + ds.test):   # row 0: the reset observation of seed + k (no burn-in)
        obs, _ = env.reset(seed=5 + k)
        np.testing.assert_allclose(traj[0] * std + mean, obs[:3], atol=1e-12)
    env.close()
    assert not any(np.array_equal(a, b) for a in ds.train for b in ds.test)


# ------------------------------------------------------------------------------------------------ custom data


def _write(tmp_path: Path, columns: dict) -> Path:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table(columns), path)
    return path


def test_custom_nan_in_any_feature_column_is_refused(tmp_path: Path) -> None:
    n = 12
    b = np.arange(n, dtype=np.float64)
    b[9] = np.nan   # the second feature only, in trajectory 3
    path = _write(tmp_path, {"trajectory": np.repeat([1, 2, 3], 4), "a": np.arange(n) * 1.0, "b": b})
    from pipeline.data.custom import load_custom

    with pytest.raises(ValueError, match=r"1 row has NaN.*\['b'\].*trajectory 3"):
        load_custom(path, kind="continuous")


def test_custom_nan_symbol_is_refused(tmp_path: Path) -> None:
    symbol = np.array([0.0, 1.0, np.nan, 1.0, 0.0, 1.0, 0.0, 1.0])
    path = _write(tmp_path, {"trajectory": np.repeat([1, 2], 4), "split": ["train"] * 4 + ["test"] * 4,
                             "symbol": symbol})
    from pipeline.data.custom import load_custom

    with pytest.raises(ValueError, match=r"NaN or Inf in column 'symbol'"):
        load_custom(path, kind="discrete")


# -------------------------------------------------------------------------------------- the preprocess stage


@pytest.fixture(scope="module")
def shipped() -> dict:
    return read_yaml((ROOT / "params.yaml").read_text())


def _symbols(n: int, length: int) -> list[np.ndarray]:
    return [np.arange(length) % 3 for _ in range(n)]


def test_preprocess_refuses_an_empty_test_split(shipped: dict) -> None:
    from pipeline.workflow.data import _check_lengths

    ds = SequenceDataset(kind="discrete", train=_symbols(3, 200), test=[], vocab=["0", "1", "2"])
    with pytest.raises(ParamsError, match="the test split is empty"):
        _check_lengths(parse_params(shipped).dataset("hmm"), ds)


def test_preprocess_refuses_a_valid_split_of_single_steps(shipped: dict) -> None:
    from pipeline.workflow.data import _check_lengths

    ds = SequenceDataset(kind="discrete", train=_symbols(3, 200), test=_symbols(1, 50), valid=_symbols(2, 1),
                         vocab=["0", "1", "2"])
    with pytest.raises(ParamsError, match="the valid split: all 2 of its trajectories are a single step"):
        _check_lengths(parse_params(shipped).dataset("hmm"), ds)


def test_preprocess_leaves_the_kalman_windows_to_the_check(shipped: dict) -> None:
    """Preprocessing checks layer 1's 2SR windows only, so that changing the KF does not rerun it; ``psrnn check``
    (``kalman=True``) refuses KF windows longer than the data."""
    from pipeline.workflow.data import _check_lengths

    raw = copy.deepcopy(shipped)
    raw["lgssm"]["kf"].update(past_window=60, future_window=60)
    rng = np.random.default_rng(0)
    ds = SequenceDataset(kind="continuous", train=[rng.standard_normal((100, 2)) for _ in range(3)],
                         test=[rng.standard_normal((50, 2))])
    dp = parse_params(raw).dataset("lgssm")
    _check_lengths(dp, ds)
    with pytest.raises(ValueError, match="window"):
        _check_lengths(dp, ds, kalman=True)


def test_swimmer_authors_mode_passes_n_test_through(tmp_path: Path, shipped: dict) -> None:
    from pipeline.workflow.data import _build

    mirror = MIRROR / "swimmer"
    if not mirror.is_dir():
        pytest.skip(f"swimmer mirror not found at {mirror}")
    raw = copy.deepcopy(shipped)
    raw["swimmer"]["source"] = {"mode": "authors", "n_train": 15, "n_test": 3}
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "swimmer").symlink_to(mirror)
    ds = _build(parse_params(raw).dataset("swimmer"), tmp_path, "swimmer")
    assert (len(ds.train), len(ds.test)) == (15, 3)
