"""Swimmer data: the authors' group's recorded trajectories, or a fresh gymnasium/MuJoCo simulation.

The paper: "the 3-link simulated swimmer robot from the open-source package OpenAI gym. The observation model returns the angular position
of the nose as well as the angles of the two joints. We collect 25 trajectories from a robot that is trained to
swim forward (via the cross entropy with a linear policy), with a train/test split of 20/5."

Two sources, both returning a standardised :class:`~pipeline.data.schema.SequenceDataset` of 3 angle features:

* :func:`load_authors_swimmer` reads the ``.mat`` files found in co-author Ahmed Hefny's ``rpsp`` repository
  (see ``shared/data/swimmer/PROVENANCE.md``): 25 trajectories × 100 steps × 16 columns per file.
* :func:`simulate_swimmer` regenerates the data the way the paper describes: a linear policy trained by the
  cross-entropy method (:func:`train_linear_policy_cem`) on gymnasium ``Swimmer-v5``, then 25 seeded roll-outs.

Only numpy (and gymnasium/MuJoCo for the simulation, scipy for ``.mat`` files) is used here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.data.schema import SequenceDataset

log = logging.getLogger(__name__)

AUTHORS_DIR = "authors_rpsp_swimmers_trajs"
#: Names of the columns of the authors' files whose meaning is known. Read off the data: columns 6-10 are the
#: MuJoCo positions (x, y, nose angle, joint 1, joint 2) and 11-15 their velocities, since the step change of
#: column c is ``AUTHORS_DT_S`` times the mean of column c + 5 at both ends (r = 0.997 for c = 8, 9, 10).
AUTHORS_COLUMN_NAMES = {8: "nose_angle", 9: "joint1_angle", 10: "joint2_angle"}
#: Time between two rows of the authors' files, in seconds (inferred as above; the gymnasium simulation: 0.04 s).
AUTHORS_DT_S = 0.06
#: The authors' file of the trained policy: the suffix is ``p_blind``, the share of uniformly random actions
#: (in ``1.0`` the 9 action pairs are equally frequent and unpredictable from the state, and the swimmer does not
#: get anywhere); only ``0.0`` is "a robot trained to swim forward", as the paper describes.
AUTHORS_POLICY_FILE = "swimmers_trajs_0.0.mat"
#: Trajectories in each of the authors' files (``trajs`` of shape (25, 100, 16)); params validation bounds
#: ``n_train`` and ``n_test`` by it before any file is read.
AUTHORS_FILE_TRAJECTORIES = 25
#: Observation features of :func:`simulate_swimmer` (radians before standardisation): qpos[2:5] of Swimmer-v5.
SIM_FEATURES = ["nose_angle", "joint1_angle", "joint2_angle"]
ENV_ID = "Swimmer-v5"


def _standardise(train: list[np.ndarray], test: list[np.ndarray]) -> tuple[list, list, dict[str, list[float]]]:
    """Standardise both splits with the mean/std of all train steps (a constant feature keeps std 1)."""
    stacked = np.concatenate(train, axis=0)
    mean = stacked.mean(axis=0)
    std = stacked.std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    norm = {"mean": mean.tolist(), "std": std.tolist()}
    return [(x - mean) / std for x in train], [(x - mean) / std for x in test], norm


# ------------------------------------------------------------------------------------------- authors' files


def _load_trajs(path: Path) -> np.ndarray:
    from scipy.io import loadmat

    if not path.is_file():
        raise FileNotFoundError(f"{path}: swimmer trajectory file not found")
    try:
        mat = loadmat(path)
    except Exception as exc:  # scipy raises several types for corrupt files
        raise ValueError(f"{path}: not a readable MATLAB .mat file ({exc})") from None
    if "trajs" not in mat:
        raise ValueError(f"{path}: no variable 'trajs' (found {sorted(k for k in mat if not k.startswith('__'))})")
    trajs = np.asarray(mat["trajs"], dtype=np.float64)
    if trajs.ndim != 3:
        raise ValueError(f"{path}: 'trajs' must be (trajectories, steps, columns), got shape {trajs.shape}")
    if not np.all(np.isfinite(trajs)):
        raise ValueError(f"{path}: 'trajs' holds NaN or inf")
    return trajs


def load_authors_swimmer(
    raw_dir: Path,
    *,
    train_file: str = AUTHORS_POLICY_FILE,
    test_file: str = AUTHORS_POLICY_FILE,
    n_train: int = 20,
    n_test: int = 5,
    columns: Sequence[int] = (8, 9, 10),
) -> SequenceDataset:
    """The authors' group's swimmer trajectories (``raw_dir/authors_rpsp_swimmers_trajs/*.mat``).

    Each file holds ``trajs`` of shape (25, 100, 16), one row every :data:`AUTHORS_DT_S` = 0.06 s. Train = the
    first ``n_train`` trajectories of ``train_file``, test = the last ``n_test`` of ``test_file`` (when both are the
    same file the two must not overlap). The file suffix is the authors' ``p_blind``, the share of uniformly random
    actions. The default is the paper's set-up: the 25 trajectories of the trained policy
    (:data:`AUTHORS_POLICY_FILE`, ``p_blind = 0``), split 20/5. Hefny's RFF-PSR loader
    (``psr_lite/_exp/exp_swimmer.py``) trained on ``swimmers_trajs_1.0.mat`` (random actions only) and tested on
    ``swimmers_trajs_0.8.mat``; pass those file names to get that. Default ``columns=(8, 9, 10)``: the nose angle
    and the two joint angles in radians, which is what the paper says the observation is (3 features). The
    authors' own loader used ``[0, 1, 8, 9, 10]``; pass ``columns=(0, 1, 8, 9, 10)`` to get that. Features are
    standardised with train statistics (``meta["normalization"]``).
    """
    folder = Path(raw_dir) / AUTHORS_DIR
    train_path, test_path = folder / train_file, folder / test_file
    tr, te = _load_trajs(train_path), _load_trajs(test_path)
    columns = [int(c) for c in columns]
    for path, arr, n in ((train_path, tr, n_train), (test_path, te, n_test)):
        if not 1 <= n <= arr.shape[0]:
            raise ValueError(f"{path}: asked for {n} trajectories, the file holds {arr.shape[0]}")
        bad = [c for c in columns if not 0 <= c < arr.shape[2]]
        if bad:
            raise ValueError(f"{path}: columns {bad} out of range (the file has {arr.shape[2]} columns)")
    if train_path == test_path and n_train + n_test > tr.shape[0]:
        raise ValueError(f"{train_path}: train and test come from the same file and would overlap "
                         f"({n_train} + {n_test} > {tr.shape[0]} trajectories)")  # fmt: skip
    train = [tr[i][:, columns] for i in range(n_train)]
    test = [te[i][:, columns] for i in range(te.shape[0] - n_test, te.shape[0])]
    train, test, norm = _standardise(train, test)
    meta = {
        "source": "authors' group swimmer trajectories (GitHub ahefnycmu/rpsp @ 9085a3b, "
        f"psr_lite/data/swimmer/{train_file} train, {test_file} test)",
        "columns": columns,
        "train_file": train_file,
        "test_file": test_file,
        "dt_s": AUTHORS_DT_S,
        "normalization": norm,
    }
    features = [AUTHORS_COLUMN_NAMES.get(c, f"col{c}") for c in columns]
    return SequenceDataset(kind="continuous", train=train, test=test, features=features, meta=meta)


# ------------------------------------------------------------------------------------------------ simulation


@dataclass
class LinearPolicy:
    """``a = clip(K · obs + k0, low, high)``; ``K`` is (action_dim, obs_dim)."""

    K: np.ndarray
    k0: np.ndarray
    low: np.ndarray
    high: np.ndarray

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return np.clip(self.K @ obs + self.k0, self.low, self.high)

    @property
    def params(self) -> np.ndarray:
        return np.concatenate([self.K.ravel(), self.k0])

    @classmethod
    def from_params(cls, theta: np.ndarray, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray):
        theta = np.asarray(theta, dtype=np.float64)
        return cls(theta[: obs_dim * act_dim].reshape(act_dim, obs_dim).copy(), theta[obs_dim * act_dim :].copy(),
                   low, high)  # fmt: skip


def _space_dims(env: Any) -> tuple[int, int, np.ndarray, np.ndarray]:
    obs_dim = int(np.prod(env.observation_space.shape))
    act_dim = int(np.prod(env.action_space.shape))
    low = np.asarray(env.action_space.low, dtype=np.float64).ravel()
    high = np.asarray(env.action_space.high, dtype=np.float64).ravel()
    return obs_dim, act_dim, low, high


def episode_return(env: Any, policy: LinearPolicy, *, length: int, seed: int) -> float:
    """Undiscounted return of one episode of at most ``length`` steps from ``env.reset(seed=seed)``."""
    obs, _ = env.reset(seed=int(seed))
    total = 0.0
    for _ in range(length):
        obs, reward, terminated, truncated, _ = env.step(policy(np.asarray(obs, dtype=np.float64)))
        total += float(reward)
        if terminated or truncated:
            break
    return total


def train_linear_policy_cem(
    env: Any,
    *,
    iterations: int = 30,
    population: int = 20,
    elite_frac: float = 0.2,
    episode_length: int = 300,
    init_std: float = 1.0,
    extra_std: float = 0.3,
    seed: int = 0,
) -> tuple[LinearPolicy, dict[str, Any]]:
    """Train ``a = clip(K·obs + k0)`` to maximise ``env``'s return with the cross-entropy method.

    A diagonal Gaussian over the policy parameters (mean 0, std ``init_std``) is sampled ``population`` times per
    iteration; each sample is scored by one episode of ``episode_length`` steps, all from the same reset seed
    (common random numbers, drawn from the seeded numpy RNG); the best ``elite_frac`` refit the mean and variance.
    ``extra_std²`` (decaying linearly to 0 over the iterations) is added to the variance so the search does not
    collapse early (Szita & Lőrincz 2006). Everything is reproducible from ``seed``.

    Returns the final mean policy and a history: per-iteration mean/best/elite-mean returns.
    """
    if iterations < 1 or population < 2 or not 0 < elite_frac <= 1 or episode_length < 1:
        raise ValueError(f"train_linear_policy_cem: invalid budget (iterations={iterations}, population="
                         f"{population}, elite_frac={elite_frac}, episode_length={episode_length})")  # fmt: skip
    obs_dim, act_dim, low, high = _space_dims(env)
    n_params = obs_dim * act_dim + act_dim
    n_elite = max(1, int(round(population * elite_frac)))
    rng = np.random.default_rng(seed)
    mean = np.zeros(n_params)
    std = np.full(n_params, float(init_std))
    history: dict[str, list[float]] = {"mean_return": [], "best_return": [], "elite_return": []}
    for it in range(iterations):
        reset_seed = int(rng.integers(2**31 - 1))
        thetas = mean + std * rng.standard_normal((population, n_params))
        returns = np.array([
            episode_return(env, LinearPolicy.from_params(th, obs_dim, act_dim, low, high),
                           length=episode_length, seed=reset_seed)
            for th in thetas
        ])  # fmt: skip
        elite_idx = np.argsort(-returns, kind="stable")[:n_elite]
        elite = thetas[elite_idx]
        mean = elite.mean(axis=0)
        extra = extra_std**2 * max(0.0, 1.0 - it / iterations)
        std = np.sqrt(elite.var(axis=0) + extra)
        history["mean_return"].append(float(returns.mean()))
        history["best_return"].append(float(returns.max()))
        history["elite_return"].append(float(returns[elite_idx].mean()))
        log.info("CEM iteration %d/%d: return mean %.2f, elite %.2f, best %.2f", it + 1, iterations,
                 returns.mean(), returns[elite_idx].mean(), returns.max())  # fmt: skip
    return LinearPolicy.from_params(mean, obs_dim, act_dim, low, high), history


def make_swimmer_env(max_episode_steps: int) -> Any:
    """gymnasium ``Swimmer-v5`` (MuJoCo; frame_skip 4, dt = 0.04 s) with a time limit of ``max_episode_steps``.

    With the default ``exclude_current_positions_from_observation=True`` the 8-D observation is
    ``[qpos[2:5], qvel]``: nose (body) angle and the two joint angles in radians, then 5 velocities.
    """
    import gymnasium as gym

    return gym.make(ENV_ID, max_episode_steps=int(max_episode_steps))


def collect_angle_trajectories(
    env: Any, policy: LinearPolicy, *, n: int, length: int, seed: int, burn_in: int = 0
) -> np.ndarray:
    """Roll out ``policy`` ``n`` times from ``env.reset(seed=seed + i)``; return angles of shape ``(n, length, 3)``.

    Row ``t`` of a trajectory is ``obs[0:3]`` (= ``qpos[2:5]``: nose angle, joint 1, joint 2, radians) after
    ``burn_in + t`` steps, i.e. the reset observation first when ``burn_in == 0``. Raises ``RuntimeError`` if the
    observation layout is not the expected one (checked against ``env.unwrapped.data.qpos`` on every step).
    """
    out = np.empty((n, length, 3), dtype=np.float64)
    for i in range(n):
        obs, _ = env.reset(seed=int(seed) + i)
        for t in range(burn_in + length):
            if t >= burn_in:
                angles = np.asarray(obs[0:3], dtype=np.float64)
                qpos = np.asarray(env.unwrapped.data.qpos, dtype=np.float64)
                if qpos.shape[0] != 5 or not np.array_equal(angles, qpos[2:5]):
                    raise RuntimeError(f"{ENV_ID}: obs[0:3] is not qpos[2:5] (obs {angles}, qpos {qpos}); the "
                                       "observation layout changed")  # fmt: skip
                out[i, t - burn_in] = angles
            if t == burn_in + length - 1:
                break
            obs, _, terminated, truncated, _ = env.step(policy(np.asarray(obs, dtype=np.float64)))
            if terminated or truncated:
                raise RuntimeError(f"{ENV_ID}: episode ended after {t + 1} steps, before {burn_in + length}")
    return out


def simulate_swimmer(
    *,
    n_trajectories: int = 25,
    n_train: int = 20,
    length: int = 100,
    seed: int = 0,
    cem_iterations: int = 30,
    cem_population: int = 20,
    cem_elite_frac: float = 0.2,
    cem_episode_length: int = 300,
    burn_in: int = 0,
    n_eval: int = 5,
) -> SequenceDataset:
    """Simulate the paper's Swimmer data set with gymnasium ``Swimmer-v5`` (MuJoCo).

    1. Train a linear policy by CEM (:func:`train_linear_policy_cem`, seed ``seed``) to swim forward (the env's
       reward: forward velocity minus 1e-4·|a|²). Defaults: 30 iterations × 20 candidates × 300-step (12 s)
       episodes, 4 elites — about 30 s on one CPU core; the final mean policy swims at roughly 0.3 m/s (return
       ≈ 100 per 300 steps vs ≈ 0 for the zero policy).
    2. Evaluate the learned and the zero policy on ``n_eval`` fresh episodes (reset seeds ``seed + 10_000 + j``);
       both returns go in ``meta["cem"]``.
    3. Roll out ``n_trajectories`` episodes of ``length`` steps (0.04 s each) from ``env.reset(seed=seed + i)``,
       recording the nose angle and the two joint angles (``obs[0:3] = qpos[2:5]``, radians) — optionally after
       ``burn_in`` steps so the start-up transient is skipped (default 0: the reset state is the first row).
    4. The first ``n_train`` trajectories are train, the rest test; standardise with train statistics.

    The result is bitwise reproducible from ``seed`` (on a given machine/MuJoCo build).
    """
    if not 1 <= n_train < n_trajectories:
        raise ValueError(f"simulate_swimmer: need 1 <= n_train < n_trajectories, got {n_train}, {n_trajectories}")
    if length < 1 or burn_in < 0:
        raise ValueError(f"simulate_swimmer: need length >= 1 and burn_in >= 0, got {length}, {burn_in}")
    start = time.perf_counter()
    env = make_swimmer_env(max(cem_episode_length, burn_in + length))
    dt = float(env.unwrapped.dt)
    try:
        policy, history = train_linear_policy_cem(
            env,
            iterations=cem_iterations,
            population=cem_population,
            elite_frac=cem_elite_frac,
            episode_length=cem_episode_length,
            seed=seed,
        )
        obs_dim, act_dim, low, high = _space_dims(env)
        zero = LinearPolicy(np.zeros((act_dim, obs_dim)), np.zeros(act_dim), low, high)
        eval_seeds = [seed + 10_000 + j for j in range(n_eval)]
        learned_ret = [episode_return(env, policy, length=cem_episode_length, seed=s) for s in eval_seeds]
        zero_ret = [episode_return(env, zero, length=cem_episode_length, seed=s) for s in eval_seeds]
        angles = collect_angle_trajectories(env, policy, n=n_trajectories, length=length, seed=seed, burn_in=burn_in)
    finally:
        env.close()
    elapsed = time.perf_counter() - start
    log.info("swimmer: CEM policy return %.2f vs zero policy %.2f over %d steps (%.1f s)",
             np.mean(learned_ret), np.mean(zero_ret), cem_episode_length, elapsed)  # fmt: skip
    train = [angles[i] for i in range(n_train)]
    test = [angles[i] for i in range(n_train, n_trajectories)]
    train, test, norm = _standardise(train, test)
    meta = {
        "source": f"gymnasium {ENV_ID} (MuJoCo) rolled out with a linear policy trained by the cross-entropy method",
        "seed": seed,
        "dt_s": dt,
        "length": length,
        "burn_in": burn_in,
        "reset_seeds": [seed + i for i in range(n_trajectories)],
        "cem": {
            "iterations": cem_iterations,
            "population": cem_population,
            "elite_frac": cem_elite_frac,
            "episode_length": cem_episode_length,
            "learned_return": float(np.mean(learned_ret)),
            "zero_policy_return": float(np.mean(zero_ret)),
            "random_policy_return": history["mean_return"][0],  # mean over the first (random) population
            "eval_seeds": eval_seeds,
            "history": history,
            "policy_K": policy.K.tolist(),
            "policy_k0": policy.k0.tolist(),
            # no wall time here: the prepared file is a DVC output, and the same seed must give the same bytes
            # (its digest is in every Swimmer run's fingerprint); the log line above has it
        },
        "normalization": norm,
    }
    return SequenceDataset(kind="continuous", train=train, test=test, features=list(SIM_FEATURES), meta=meta)
