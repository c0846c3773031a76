"""Dataset audit: independent re-derivations of what each prepared dataset must contain.

Every check here recomputes a property from the raw files (or from first principles) by a different route than the
module under test: hand-computed forward kinematics, bone-length invariance on every mirror trial, a data-level
train/test disjointness check, the meaning of the authors' swimmer columns read off the data, and the Bayes-optimal
numbers of the synthetic sets recomputed with a log-space forward filter and with exact Gaussian conditioning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import MIRROR

# ------------------------------------------------------------------------------------------------------ mocap

MOCAP = MIRROR / "mocap"

TINY_ASF = """# tiny skeleton: two bones in a chain, for hand-computed forward kinematics
:version 1.10
:name tiny
:units
  mass 1.0
  length 0.45
  angle deg
:root
   order TX TY TZ RX RY RZ
   axis XYZ
   position 0 0 0
   orientation 0 0 0
:bonedata
  begin
     id 1
     name a
     direction 1 0 0
     length 0.9
     axis 0 0 0 XYZ
    dof rx ry rz
    limits (-180 180)
           (-180 180)
           (-180 180)
  end
  begin
     id 2
     name b
     direction 1 0 0
     length 0.45
     axis 0 0 90 XYZ
    dof rx
    limits (-180 180)
  end
:hierarchy
  begin
    root a
    a b
  end
"""

# frame 1: root translated by (1, 2, 3) in, bone a rotated rx=90, ry=90, b rx=90 (about its local x = global y)
# frame 2: root rotated rx=90, ry=90, nothing else
TINY_AMC = """:FULLY-SPECIFIED
:DEGREES
1
root 0.45 0.9 1.35 0 0 0
a 90 90 0
b 90
2
root 0 0 0 90 90 0
a 0 0 0
b 0
"""


def test_fk_rotation_order_axis_convention_and_units_by_hand(tmp_path: Path) -> None:
    """Hand-computed end points. Each alternative convention gives a different answer (noted per line):

    * dof order ``rx ry rz`` means M = Rz·Ry·Rx (rx applied first); the reverse order would put a's end at (1, 4, 3);
    * a bone's local frame enters as C·M·C⁻¹ with C = Rz(90) from ``axis 0 0 90``: b's rx is a rotation about the
      global y axis; C⁻¹·M·C would give b's end (1, 1, 1), ignoring C would give (1, 2, 0);
    * lengths and the root translation are ASF units / 0.45 = inches;
    * the root rotation follows ``order`` (Rz·Ry·Rx): Rx·Ry·Rz would give a's end (0, 2, 0) in frame 2.
    """
    from pipeline.data.mocap import forward_kinematics, parse_amc, parse_asf

    (tmp_path / "tiny.asf").write_text(TINY_ASF)
    (tmp_path / "tiny.amc").write_text(TINY_AMC)
    pos, names = forward_kinematics(parse_asf(tmp_path / "tiny.asf"), parse_amc(tmp_path / "tiny.amc"))
    assert names == ["root", "a", "b"]
    np.testing.assert_allclose(pos[0], [[1, 2, 3], [1, 2, 1], [1, 3, 1]], atol=1e-12)
    np.testing.assert_allclose(pos[1], [[0, 0, 0], [0, 0, -2], [0, 0, -3]], atol=1e-12)


@pytest.fixture(scope="module")
def mocap_raw() -> Path:
    if not (MOCAP / "cmu").is_dir():
        pytest.skip(f"mocap mirror not found at {MOCAP}")
    return MOCAP


def test_bone_lengths_invariant_on_every_trial(mocap_raw: Path) -> None:
    """|child end − parent end| equals the ASF length / 0.45 in every frame of every mirror trial."""
    from pipeline.data.mocap import DEFAULT_TRIALS, load_trial

    for trial in DEFAULT_TRIALS:
        pos, names, sk = load_trial(mocap_raw, trial)
        index = {n: i for i, n in enumerate(names)}
        for bone in names[1:]:
            seg = pos[:, index[bone]] - pos[:, index[sk.parent[bone]]]
            length = np.linalg.norm(seg, axis=-1)
            np.testing.assert_allclose(length, sk.bones[bone].length / 0.45, rtol=0, atol=1e-9,
                                       err_msg=f"{trial} {bone}")
        assert 58.0 < pos[:, index["head"], 1].min() and pos[..., 1].min() > -1.0, trial  # upright, floor y = 0


def test_tracks_are_fk_windows_and_no_test_frame_in_training(mocap_raw: Path) -> None:
    """Every track (not only one) is its recorded FK window; no test row occurs among the train rows; the
    normalisation is the mean/std of the train tracks alone."""
    from pipeline.data.mocap import load_trial, prepare_mocap

    ds = prepare_mocap(mocap_raw, test_trials=["07_01", "07_02"])  # params.yaml's split
    meta = ds.meta
    mean, std = (np.array(meta["normalization"][k]) for k in ("mean", "std"))
    cache: dict[str, np.ndarray] = {}
    raw: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for split in ("train", "test"):
        assert len(ds.split(split)) == {"train": 40, "test": 8}[split]
        for track, (trial, start) in zip(ds.split(split), meta["tracks"][split]):
            if trial not in cache:
                pos, names, _ = load_trial(mocap_raw, trial)
                idx = [names.index(b) for b in meta["bones"]]
                cache[trial] = (pos[:, idx] - pos[:, :1]).reshape(len(pos), -1)
            window = cache[trial][start : start + 300]
            assert track.shape == window.shape == (300, 3 * len(meta["bones"]))
            np.testing.assert_allclose(track * std + mean, window, atol=1e-9)
            raw[split].append(window)
    train_rows = {r.tobytes() for w in raw["train"] for r in w}
    assert not any(r.tobytes() in train_rows for w in raw["test"] for r in w)
    stacked = np.concatenate(raw["train"])
    np.testing.assert_allclose(mean, stacked.mean(axis=0), rtol=0, atol=1e-9)
    np.testing.assert_allclose(std, stacked.std(axis=0), rtol=1e-12)


# ---------------------------------------------------------------------------------------------------- swimmer

SWIMMER = MIRROR / "swimmer" / "authors_rpsp_swimmers_trajs"


def _mat(name: str) -> np.ndarray:
    from scipy.io import loadmat

    if not (SWIMMER / name).is_file():
        pytest.skip(f"swimmer mirror not found at {SWIMMER}")
    return loadmat(SWIMMER / name)["trajs"]


def test_authors_columns_8_to_10_are_angles_whose_rates_are_columns_13_to_15() -> None:
    """Columns 6-10 are positions (x, y, nose angle, joint 1, joint 2) and 11-15 their velocities: the step
    change of column c is dt · (average of column c+5 at both ends) with dt = 0.06 s (r > 0.99), so columns 8-10
    are angles (the paper's observation), not rates, sampled every 0.06 s (the gymnasium simulation: 0.04 s)."""
    from pipeline.data.swimmer import AUTHORS_COLUMN_NAMES, AUTHORS_DT_S

    assert AUTHORS_COLUMN_NAMES == {8: "nose_angle", 9: "joint1_angle", 10: "joint2_angle"}
    for name in ("swimmers_trajs_0.0.mat", "swimmers_trajs_1.0.mat"):
        t = _mat(name)
        for c in (8, 9, 10):
            step = np.diff(t[:, :, c], axis=1).ravel()
            rate = (0.5 * (t[:, 1:, c + 5] + t[:, :-1, c + 5])).ravel()
            dt = float(rate @ step / (rate @ rate))
            assert abs(dt - AUTHORS_DT_S) < 0.002 and np.corrcoef(rate, step)[0, 1] > 0.99, (name, c, dt)


def _action_r2_from_previous_state(t: np.ndarray) -> float:
    """R² of the action (cols 4-5) at step k regressed on the state (cols 6-15) at step k-1: 0 for random actions."""
    a = t[:, 1:, 4:6].reshape(-1, 2)
    s = np.c_[t[:, :-1, 6:16].reshape(-1, 10), np.ones(len(a))]
    return float(np.mean([1 - np.var(a[:, k] - s @ np.linalg.lstsq(s, a[:, k], rcond=None)[0]) / np.var(a[:, k])
                          for k in range(2)]))


def test_authors_file_suffix_is_the_random_action_probability() -> None:
    """The file suffix (``p_blind``) is the share of uniformly random actions: in ``1.0`` the 9 action pairs in
    {-2, 0, 2}² are equally frequent and unpredictable from the state, and the swimmer barely moves; in ``0.0``
    actions follow the state and the swimmer travels ten times as far. Only ``0.0`` is "a robot trained to swim"."""
    random_, policy = _mat("swimmers_trajs_1.0.mat"), _mat("swimmers_trajs_0.0.mat")
    counts = np.unique(random_[:, :, 4:6].reshape(-1, 2), axis=0, return_counts=True)[1]
    assert len(counts) == 9 and counts.min() > 0.85 * 2500 / 9 and counts.max() < 1.15 * 2500 / 9
    assert _action_r2_from_previous_state(random_) < 0.01 < 0.5 < _action_r2_from_previous_state(policy)
    travel = {k: np.linalg.norm(t[:, -1, 6:8] - t[:, 0, 6:8], axis=1).mean() for k, t in
              (("random", random_), ("policy", policy))}
    assert travel["policy"] > 5 * travel["random"], travel


def test_authors_default_is_the_trained_policy_split_20_5() -> None:
    """By default mode 'authors' gives the paper's set-up: 25 trajectories of the trained policy (file 0.0),
    the first 20 for training and the last 5 for testing, standardised with train statistics only."""
    from pipeline.data.swimmer import load_authors_swimmer

    t = _mat("swimmers_trajs_0.0.mat")
    ds = load_authors_swimmer(SWIMMER.parent)
    assert ds.meta["train_file"] == ds.meta["test_file"] == "swimmers_trajs_0.0.mat"
    assert ds.meta["dt_s"] == pytest.approx(0.06)
    mean, std = (np.array(ds.meta["normalization"][k]) for k in ("mean", "std"))
    np.testing.assert_allclose(mean, t[:20, :, 8:11].reshape(-1, 3).mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(std, t[:20, :, 8:11].reshape(-1, 3).std(axis=0), rtol=1e-12)
    for got, want in zip(ds.train + ds.test, list(t[:20, :, 8:11]) + list(t[20:, :, 8:11])):
        np.testing.assert_allclose(got * std + mean, want, atol=1e-12)
    assert (len(ds.train), len(ds.test)) == (20, 5)


# -------------------------------------------------------------------------------------------------------- PTB


def test_ptb_test_stream_is_the_raw_text_minus_unseen_characters() -> None:
    """Byte-level: the test stream is the first 1001 lines of full/ptb.test.txt with every byte that never occurs
    in the first 1001 train lines removed (7 of 124774), the vocabulary is exactly the train bytes."""
    from pipeline.data.ptb import prepare_ptb

    full = MIRROR / "ptb" / "full"
    if not (full / "ptb.test.txt").is_file():
        pytest.skip(f"PTB mirror not found at {full}")
    train = b"".join((full / "ptb.train.txt").read_bytes().splitlines(keepends=True)[:1001])
    test = b"".join((full / "ptb.test.txt").read_bytes().splitlines(keepends=True)[:1001])
    assert (len(train), len(test)) == (120780, 124774)
    ds = prepare_ptb(MIRROR / "ptb")
    seen = set(train)
    assert ds.vocab == sorted(chr(b) for b in seen)
    kept = bytes(b for b in test if b in seen).decode("ascii")
    assert len(kept) == 124774 - 7 and "".join(ds.vocab[i] for i in ds.test[0]) == kept


# ------------------------------------------------------------------------------------------------ handwriting


def test_handwriting_normalisation_from_chosen_train_digits_only() -> None:
    from pipeline.data.handwriting import parse_unipen, prepare_handwriting

    hw = MIRROR / "handwriting"
    if not (hw / "pendigits-orig.tra").is_file():
        pytest.skip(f"handwriting mirror not found at {hw}")
    ds = prepare_handwriting(hw)
    by_index = {d["index"]: d for d in parse_unipen(hw / "pendigits-orig.tra")}
    xy = np.concatenate([np.concatenate(by_index[s]["strokes"]) for s in ds.meta["train_segments"]]).astype(float)
    np.testing.assert_allclose(ds.meta["normalization"]["mean"], xy.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(ds.meta["normalization"]["std"], xy.std(axis=0), rtol=1e-12)
    assert len(set(ds.meta["test_writers"])) >= 1 and (len(ds.train), len(ds.test)) == (20, 5)


def test_check_refuses_kalman_windows_longer_than_the_prepared_digits(tmp_path: Path, defaults, capsys,
                                                                      monkeypatch) -> None:
    """`psrnn check` reads data/prepared/handwriting.parquet where it exists: Kalman-filter windows of 300 + 300
    steps, which no digit of the mirror holds, fail there, naming the key, instead of in the two_stage stage."""
    import copy
    import shutil

    from pipeline import cli
    from pipeline.config import dump_yaml
    from pipeline.data.handwriting import prepare_handwriting
    from pipeline.data.schema import write_dataset

    hw = MIRROR / "handwriting"
    if not (hw / "pendigits-orig.tra").is_file():
        pytest.skip(f"handwriting mirror not found at {hw}")
    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples", tmp_path / "examples")
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["handwriting"]
    ds = prepare_handwriting(hw, **raw["handwriting"]["source"])
    prepared = tmp_path / "data" / "prepared" / "handwriting.parquet"
    prepared.parent.mkdir(parents=True)
    write_dataset(prepared, ds)
    shortest, longest = min(len(t) for t in ds.train), max(len(t) for t in ds.train)
    raw["handwriting"]["kf"] = {"state_dim": 20, "past_window": 300, "future_window": 300}
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 1
    assert capsys.readouterr().err.strip() == (
        "psrnn check: error: handwriting.kf.past_window + handwriting.kf.future_window + 1 = 300 + 300 + 1 = 601 "
        f"exceeds the shortest training trajectory ({shortest} steps); expected past_window + future_window <= "
        f"{shortest - 1} (checked against {prepared}, as last prepared)")
    raw["handwriting"]["kf"] = defaults["handwriting"]["kf"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    assert (f"handwriting: data/prepared/handwriting.parquet: continuous, 3 features, 20 train / 5 test "
            f"trajectories, training lengths {shortest} to {longest} steps") in capsys.readouterr().out


# -------------------------------------------------------------------------------------------------- synthetic


def _hmm_bpc_log_forward(pi: np.ndarray, T: np.ndarray, E: np.ndarray, seqs: list[np.ndarray]) -> float:
    """Mean over t >= 1 of -log2 p(o_t | o_<t) = -(log p(o_0..t) - log p(o_0..t-1)), unnormalised log-alphas."""
    from scipy.special import logsumexp

    lT, lE = np.log(T), np.log(E)
    bits, n = 0.0, 0
    for o in seqs:
        la = np.log(pi) + lE[:, o[0]]
        prev = logsumexp(la)
        for t in range(1, len(o)):
            la = logsumexp(la[:, None] + lT, axis=0) + lE[:, o[t]]
            cur = logsumexp(la)
            bits += (prev - cur) / np.log(2)
            n += 1
            prev = cur
    return bits / n


def _lgssm_mse_exact(A, C, Q, R, P0, seqs: list[np.ndarray]) -> float:
    """E[o_t | o_<t] by conditioning the joint Gaussian of the whole observation sequence (no Kalman recursion)."""
    L, n, m = len(seqs[0]), A.shape[0], C.shape[0]
    P = [P0]
    for _ in range(1, L):
        P.append(A @ P[-1] @ A.T + Q)
    S = np.zeros((L * m, L * m))
    for s in range(L):
        Ak = np.eye(n)
        for t in range(s, L):
            blk = C @ Ak @ P[s] @ C.T + (R if s == t else 0)
            S[t * m:(t + 1) * m, s * m:(s + 1) * m] = blk
            S[s * m:(s + 1) * m, t * m:(t + 1) * m] = blk.T
            Ak = A @ Ak
    err, cnt = 0.0, 0
    for o in seqs:
        y = o.reshape(-1)
        for t in range(1, L):
            k = t * m
            pred = S[k:k + m, :k] @ np.linalg.solve(S[:k, :k], y[:k])
            err += float(((pred - o[t]) ** 2).sum())
            cnt += m
    return err / cnt


def test_hmm_bayes_optimal_is_the_true_filters_test_bpc(defaults) -> None:
    from pipeline.data.synthetic import make_hmm_dataset

    ds, _ = make_hmm_dataset(**defaults["hmm"]["source"])
    g = {k: np.array(v) for k, v in ds.meta["generator"].items()}
    mine = _hmm_bpc_log_forward(g["initial"], g["transition"], g["emission"], ds.test)
    assert ds.meta["bayes_optimal"]["bpc"] == pytest.approx(mine, rel=1e-12)
    assert mine < ds.meta["unigram"]["bpc"]


@pytest.mark.parametrize("seed", [0, 3])
def test_lgssm_bayes_optimal_is_the_exact_conditional_mean_mse(defaults, seed: int) -> None:
    from pipeline.data.synthetic import make_lgssm_dataset

    src = {**defaults["lgssm"]["source"], "length": 40, "n_test": 4, "n_train": 3, "seed": seed}
    ds, _ = make_lgssm_dataset(**src)
    g = {k: np.array(v) for k, v in ds.meta["generator"].items()}
    mine = _lgssm_mse_exact(g["A"], g["C"], g["Q"], g["R"], g["P0"], ds.test)
    assert ds.meta["bayes_optimal"]["mse"] == pytest.approx(mine, rel=1e-9)
    assert mine < ds.meta["mean_predictor"]["mse"]
    # x_0 is drawn from the stationary covariance: A P0 Aᵀ + Q = P0
    np.testing.assert_allclose(g["A"] @ g["P0"] @ g["A"].T + g["Q"], g["P0"], atol=1e-10)
