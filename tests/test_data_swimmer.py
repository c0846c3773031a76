"""Tests for pipeline.data.swimmer: the authors' .mat trajectories and the gymnasium/MuJoCo simulation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import MIRROR
from pipeline.data.swimmer import (
    LinearPolicy,
    collect_angle_trajectories,
    load_authors_swimmer,
    make_swimmer_env,
    simulate_swimmer,
    train_linear_policy_cem,
)

RAW = MIRROR / "swimmer"

SMALL = dict(n_trajectories=5, n_train=3, length=12, cem_iterations=2, cem_population=4, cem_episode_length=20)


@pytest.fixture(scope="module")
def raw() -> Path:
    if not (RAW / "authors_rpsp_swimmers_trajs").is_dir():
        pytest.skip(f"swimmer mirror not found at {RAW}")
    return RAW


def _gym_or_skip():
    try:
        import gymnasium as gym

        gym.make("Swimmer-v5").close()
    except Exception as exc:  # mujoco / imageio missing
        pytest.skip(f"gymnasium Swimmer-v5 unavailable: {exc}")


# ------------------------------------------------------------------------------------------------ authors


def test_authors_shapes_and_normalisation(raw):
    ds = load_authors_swimmer(raw)
    assert ds.kind == "continuous"
    assert len(ds.train) == 20 and len(ds.test) == 5
    assert all(t.shape == (100, 3) for t in ds.train + ds.test)
    assert ds.features == ["nose_angle", "joint1_angle", "joint2_angle"]
    x = np.concatenate(ds.train)
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-10)
    np.testing.assert_allclose(x.std(axis=0), 1, atol=1e-10)
    assert ds.meta["columns"] == [8, 9, 10]
    json.dumps(ds.meta)


def test_authors_rows_are_the_right_trajectories(raw):
    from scipy.io import loadmat

    folder = raw / "authors_rpsp_swimmers_trajs"
    tr = loadmat(folder / "swimmers_trajs_1.0.mat")["trajs"]
    te = loadmat(folder / "swimmers_trajs_0.8.mat")["trajs"]
    ds = load_authors_swimmer(raw, train_file="swimmers_trajs_1.0.mat", test_file="swimmers_trajs_0.8.mat",
                              columns=(0, 1, 8, 9, 10))  # Hefny's RFF-PSR loader's choice
    mean, std = (np.array(ds.meta["normalization"][k]) for k in ("mean", "std"))
    np.testing.assert_allclose(ds.train[0] * std + mean, tr[0][:, [0, 1, 8, 9, 10]], atol=1e-12)
    np.testing.assert_allclose(ds.test[-1] * std + mean, te[24][:, [0, 1, 8, 9, 10]], atol=1e-12)
    np.testing.assert_allclose(ds.test[0] * std + mean, te[20][:, [0, 1, 8, 9, 10]], atol=1e-12)
    assert ds.features == ["col0", "col1", "nose_angle", "joint1_angle", "joint2_angle"]


def test_authors_errors(raw, tmp_path):
    with pytest.raises(FileNotFoundError, match="swimmers_trajs_9.9.mat"):
        load_authors_swimmer(raw, test_file="swimmers_trajs_9.9.mat")
    with pytest.raises(ValueError, match="columns \\[16\\] out of range"):
        load_authors_swimmer(raw, columns=(8, 16))
    with pytest.raises(ValueError, match="asked for 26 trajectories"):
        load_authors_swimmer(raw, n_train=26)
    with pytest.raises(ValueError, match="would overlap"):
        load_authors_swimmer(raw, n_train=21)  # default: train and test both from the trained-policy file


# --------------------------------------------------------------------------------------------- simulation


def test_simulate_small_shapes_and_meta():
    _gym_or_skip()
    ds = simulate_swimmer(seed=0, **SMALL)
    assert len(ds.train) == 3 and len(ds.test) == 2
    assert all(t.shape == (12, 3) for t in ds.train + ds.test)
    assert ds.features == ["nose_angle", "joint1_angle", "joint2_angle"]
    x = np.concatenate(ds.train)
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-10)
    np.testing.assert_allclose(x.std(axis=0), 1, atol=1e-10)
    cem = ds.meta["cem"]
    assert {"learned_return", "zero_policy_return", "random_policy_return"} <= set(cem)
    assert len(cem["history"]["mean_return"]) == 2
    assert ds.meta["dt_s"] == pytest.approx(0.04)
    json.dumps(ds.meta)


def test_simulate_deterministic_and_seeded(tmp_path):
    _gym_or_skip()
    a, b = simulate_swimmer(seed=3, **SMALL), simulate_swimmer(seed=3, **SMALL)
    for x, y in zip(a.train + a.test, b.train + b.test):
        np.testing.assert_array_equal(x, y)
    assert a.meta["cem"]["policy_K"] == b.meta["cem"]["policy_K"]
    # the prepared file is a DVC output whose digest every Swimmer run's fingerprint holds: the same bytes (a wall
    # time in the metadata had made every preprocess@swimmer rerun retrain the Swimmer runs)
    from pipeline.data.schema import write_dataset

    write_dataset(tmp_path / "a.parquet", a)
    write_dataset(tmp_path / "b.parquet", b)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    c = simulate_swimmer(seed=4, **SMALL)
    assert not np.array_equal(a.train[0], c.train[0])
    assert a.meta["cem"]["policy_K"] != c.meta["cem"]["policy_K"]


def test_observation_columns_are_qpos_angles():
    """Recorded rows are the nose angle and the 2 joint angles: qpos[2:5] of an independent replay."""
    _gym_or_skip()
    env = make_swimmer_env(50)
    try:
        obs, _ = env.reset(seed=0)
        assert env.unwrapped.data.qpos.shape == (5,) and obs.shape == (8,)
        np.testing.assert_array_equal(obs[0:3], env.unwrapped.data.qpos[2:5])
        obs, *_ = env.step(np.array([0.5, -0.5]))
        np.testing.assert_array_equal(obs[0:3], env.unwrapped.data.qpos[2:5])

        rng = np.random.default_rng(0)
        policy = LinearPolicy(rng.standard_normal((2, 8)), rng.standard_normal(2), -np.ones(2), np.ones(2))
        angles = collect_angle_trajectories(env, policy, n=2, length=10, seed=7, burn_in=3)
        assert angles.shape == (2, 10, 3)
        for i in range(2):  # replay by hand
            obs, _ = env.reset(seed=7 + i)
            qpos = []
            for _t in range(3 + 10):
                qpos.append(env.unwrapped.data.qpos[2:5].copy())
                obs, *_ = env.step(policy(obs))
            np.testing.assert_array_equal(angles[i], np.array(qpos[3:]))
    finally:
        env.close()


def test_cem_improves_over_zero_policy():
    """A tiny CEM budget already beats the zero policy on the same reset (forward swimming reward)."""
    _gym_or_skip()
    from pipeline.data.swimmer import episode_return

    env = make_swimmer_env(60)
    try:
        policy, hist = train_linear_policy_cem(env, iterations=3, population=8, episode_length=60, seed=0)
        zero = LinearPolicy(np.zeros((2, 8)), np.zeros(2), -np.ones(2), np.ones(2))
        learned = np.mean([episode_return(env, policy, length=60, seed=s) for s in range(3)])
        baseline = np.mean([episode_return(env, zero, length=60, seed=s) for s in range(3)])
        assert len(hist["elite_return"]) == 3
        assert learned > baseline + 5.0, (learned, baseline)
    finally:
        env.close()


def test_simulate_errors():
    with pytest.raises(ValueError, match="n_train < n_trajectories"):
        simulate_swimmer(n_trajectories=5, n_train=5)
    _gym_or_skip()
    env = make_swimmer_env(10)
    try:
        with pytest.raises(ValueError, match="invalid budget"):
            train_linear_policy_cem(env, population=1)
    finally:
        env.close()
