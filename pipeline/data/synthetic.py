"""Synthetic datasets with a known generator, so every run can be compared with the Bayes-optimal filter.

* ``hmm``: a discrete hidden Markov model. The true forward filter gives p(o_t | o_{<t}); its mean log-loss in bits
  is the Bayes-optimal bits per character.
* ``lgssm``: a linear-Gaussian state-space model x_{t+1} = A x_t + w_t, o_t = C x_t + v_t. The true Kalman filter's
  one-step prediction C x_{t|t-1} has the Bayes-optimal mean squared error.

Both metrics are over the same targets as the models' metrics: o_1 … o_{T-1} of every test trajectory (o_0 has no
history to predict it from).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.data.schema import SequenceDataset
from pipeline.naive import naive_metrics


@dataclass
class HMM:
    """π (S,), transition T[s, s'] = p(s' | s), emission E[s, o] = p(o | s)."""

    initial: np.ndarray
    transition: np.ndarray
    emission: np.ndarray

    @classmethod
    def random(cls, n_states: int, n_symbols: int, *, seed: int = 0, stickiness: float = 0.7,
               emission_concentration: float = 0.3) -> "HMM":
        """A random HMM whose states persist (self-transition ≈ ``stickiness``) and emit peaked distributions."""
        rng = np.random.default_rng(seed)
        T = rng.dirichlet(np.ones(n_states), size=n_states)
        T = stickiness * np.eye(n_states) + (1.0 - stickiness) * T
        E = rng.dirichlet(np.full(n_symbols, emission_concentration), size=n_states)
        pi = rng.dirichlet(np.ones(n_states))
        return cls(initial=pi, transition=T, emission=E)

    def sample(self, length: int, rng: np.random.Generator) -> np.ndarray:
        S, V = self.emission.shape
        states = np.empty(length, dtype=np.int64)
        states[0] = rng.choice(S, p=self.initial)
        u = rng.random(length)
        cum_T = np.cumsum(self.transition, axis=1)
        for t in range(1, length):
            states[t] = min(np.searchsorted(cum_T[states[t - 1]], u[t]), S - 1)
        cum_E = np.cumsum(self.emission, axis=1)
        v = rng.random(length)
        obs = np.array([min(np.searchsorted(cum_E[s], x), V - 1) for s, x in zip(states, v)], dtype=np.int64)
        return obs

    def predictive(self, obs: np.ndarray) -> np.ndarray:
        """p(o_t = · | o_{<t}) for t = 0 … T-1 by the forward filter, shape (T, V)."""
        belief = self.initial.copy()
        out = np.empty((len(obs), self.emission.shape[1]))
        for t, o in enumerate(obs):
            out[t] = belief @ self.emission
            post = belief * self.emission[:, o]
            post /= post.sum()
            belief = post @ self.transition
        return out

    def optimal_bpc(self, trajectories: list[np.ndarray]) -> float:
        """Mean −log₂ p(o_t | o_{<t}) over t ≥ 1 under the true model."""
        total, count = 0.0, 0
        for traj in trajectories:
            p = self.predictive(traj)
            total += -np.log2(p[np.arange(1, len(traj)), traj[1:]]).sum()
            count += len(traj) - 1
        return total / count


@dataclass
class LGSSM:
    """x_{t+1} = A x_t + w, w ~ N(0, Q);  o_t = C x_t + v, v ~ N(0, R);  x_0 ~ N(0, P0)."""

    A: np.ndarray
    C: np.ndarray
    Q: np.ndarray
    R: np.ndarray
    P0: np.ndarray

    @classmethod
    def random(cls, state_dim: int, obs_dim: int, *, seed: int = 0, spectral_radius: float = 0.95,
               process_noise: float = 0.1, obs_noise: float = 0.1) -> "LGSSM":
        """A stable, oscillating system: A is a block-rotation with eigenvalues of modulus ≤ ``spectral_radius``."""
        rng = np.random.default_rng(seed)
        A = np.zeros((state_dim, state_dim))
        i = 0
        while i < state_dim:
            r = spectral_radius * rng.uniform(0.85, 1.0)
            if i + 1 < state_dim:
                th = rng.uniform(0.1, 0.6)
                A[i:i + 2, i:i + 2] = r * np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
                i += 2
            else:
                A[i, i] = r
                i += 1
        Rot = np.linalg.qr(rng.standard_normal((state_dim, state_dim)))[0]
        A = Rot @ A @ Rot.T
        C = rng.standard_normal((obs_dim, state_dim)) / np.sqrt(state_dim)
        Q = process_noise * np.eye(state_dim)
        R = obs_noise * np.eye(obs_dim)
        P0 = _stationary_covariance(A, Q)
        return cls(A=A, C=C, Q=Q, R=R, P0=P0)

    def sample(self, length: int, rng: np.random.Generator) -> np.ndarray:
        n, m = self.A.shape[0], self.C.shape[0]
        x = rng.multivariate_normal(np.zeros(n), self.P0)
        Lq, Lr = np.linalg.cholesky(self.Q), np.linalg.cholesky(self.R)
        out = np.empty((length, m))
        for t in range(length):
            out[t] = self.C @ x + Lr @ rng.standard_normal(m)
            x = self.A @ x + Lq @ rng.standard_normal(n)
        return out

    def predict(self, obs: np.ndarray) -> np.ndarray:
        """Kalman one-step predictions E[o_t | o_{<t}], shape (T, m)."""
        n = self.A.shape[0]
        x, P = np.zeros(n), self.P0.copy()
        out = np.empty_like(obs)
        for t, o in enumerate(obs):
            out[t] = self.C @ x
            S = self.C @ P @ self.C.T + self.R
            K = P @ self.C.T @ np.linalg.inv(S)
            x = x + K @ (o - self.C @ x)
            P = P - K @ self.C @ P
            x = self.A @ x
            P = self.A @ P @ self.A.T + self.Q
        return out

    def optimal_mse(self, trajectories: list[np.ndarray]) -> float:
        """Mean over t ≥ 1 and features of the squared error of the true Kalman filter's prediction."""
        err, count = 0.0, 0
        for traj in trajectories:
            pred = self.predict(traj)
            err += ((pred[1:] - traj[1:]) ** 2).sum()
            count += (len(traj) - 1) * traj.shape[1]
        return err / count


def _stationary_covariance(A: np.ndarray, Q: np.ndarray) -> np.ndarray:
    import scipy.linalg

    return scipy.linalg.solve_discrete_lyapunov(A, Q)


def _check_counts(where: str, **counts: int) -> None:
    """Every count an integer >= its minimum (``length`` >= 2: the metrics score o_1 ... o_{T-1})."""
    for name, v in counts.items():
        low = 2 if name in ("length", "n_symbols") else 0 if name in ("seed", "n_valid") else 1
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"{where}: {name}={v!r}; expected an integer >= {low}")


def _check_positive(where: str, **values: float) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not np.isfinite(v) or v <= 0:
            raise ValueError(f"{where}: {name}={v!r}; expected a finite number > 0")


def make_hmm_dataset(*, n_states: int = 4, n_symbols: int = 6, n_train: int = 100, n_test: int = 20,
                     length: int = 200, stickiness: float = 0.7, seed: int = 0,
                     n_valid: int = 0) -> tuple[SequenceDataset, HMM]:
    """Sequences of a random HMM: ``n_train``, ``n_test`` and (drawn after them, so that adding a validation split
    leaves train and test as they were) ``n_valid``; meta has the true filter's Bayes-optimal test BPC."""
    _check_counts("make_hmm_dataset", n_states=n_states, n_symbols=n_symbols, n_train=n_train, n_test=n_test,
                  length=length, seed=seed, n_valid=n_valid)
    if isinstance(stickiness, bool) or not isinstance(stickiness, (int, float, np.number)) \
            or not 0.0 <= stickiness <= 1.0:
        raise ValueError(f"make_hmm_dataset: stickiness={stickiness!r}; expected a number in [0, 1]")
    hmm = HMM.random(n_states, n_symbols, seed=seed, stickiness=stickiness)
    rng = np.random.default_rng(seed + 1)
    train = [hmm.sample(length, rng) for _ in range(n_train)]
    test = [hmm.sample(length, rng) for _ in range(n_test)]
    valid = [hmm.sample(length, rng) for _ in range(n_valid)]
    meta = {
        "source": f"synthetic HMM ({n_states} states, {n_symbols} symbols, seed {seed})",
        "bayes_optimal": {"bpc": hmm.optimal_bpc(test)},
        # the report's unigram line (add-½ frequencies, and the accuracy of the most frequent symbol), not a second
        # definition that differs in the 4th digit
        "unigram": naive_metrics(train, test, discrete=True, vocab_size=n_symbols)["unigram"],
        "generator": {"initial": hmm.initial.tolist(), "transition": hmm.transition.tolist(),
                      "emission": hmm.emission.tolist()},
    }
    ds = SequenceDataset(kind="discrete", train=train, valid=valid, test=test, vocab=[str(i) for i in range(n_symbols)],
                         meta=meta)
    return ds, hmm


def make_lgssm_dataset(*, state_dim: int = 4, obs_dim: int = 2, n_train: int = 40, n_test: int = 10,
                       length: int = 200, process_noise: float = 0.1, obs_noise: float = 0.1,
                       seed: int = 0, n_valid: int = 0) -> tuple[SequenceDataset, LGSSM]:
    """Sequences of a random linear-Gaussian system: ``n_train``, ``n_test`` and (drawn after them) ``n_valid``;
    meta has the true Kalman filter's Bayes-optimal test MSE."""
    _check_counts("make_lgssm_dataset", state_dim=state_dim, obs_dim=obs_dim, n_train=n_train, n_test=n_test,
                  length=length, seed=seed, n_valid=n_valid)
    _check_positive("make_lgssm_dataset", process_noise=process_noise, obs_noise=obs_noise)
    sys_ = LGSSM.random(state_dim, obs_dim, seed=seed, process_noise=process_noise, obs_noise=obs_noise)
    rng = np.random.default_rng(seed + 1)
    train = [sys_.sample(length, rng) for _ in range(n_train)]
    test = [sys_.sample(length, rng) for _ in range(n_test)]
    valid = [sys_.sample(length, rng) for _ in range(n_valid)]
    mean = np.concatenate(train).mean(0)
    naive = float(np.mean(np.concatenate([(t[1:] - mean) ** 2 for t in test])))
    meta = {
        "source": f"synthetic linear-Gaussian system (state {state_dim}, obs {obs_dim}, seed {seed})",
        "bayes_optimal": {"mse": sys_.optimal_mse(test)},
        "mean_predictor": {"mse": naive},
        "generator": {k: getattr(sys_, k).tolist() for k in ("A", "C", "Q", "R", "P0")},
    }
    ds = SequenceDataset(kind="continuous", train=train, valid=valid, test=test,
                         features=[f"o{i}" for i in range(obs_dim)], meta=meta)
    return ds, sys_
