"""The straightforward, materialised 2SR: the reference baseline of ``bench_two_stage.py``.

Same mathematics as :func:`pipeline.two_stage.two_stage_regression`, computed the textbook way:

* every RFF feature matrix (observation ω, history η, future φ, shifted future φ₊₁) is built in float64 as a dense
  n × D array, with the same :class:`pipeline.features.FeatureMaps` (``maps.apply`` on the whole window arrays);
* the projections are the top left singular vectors of full SVDs (``np.linalg.svd``) of the D × D Gram matrices
  ΦᵀΦ, with signs fixed as :func:`pipeline.two_stage._fix_signs` does;
* stage 1 is a dense ridge regression (λ = ridge·n) from the projected history H to the projected future F and to
  the extended future E = (shifted ⊗ obs), column i·d_o + j; the predictions F̂ = H W_f and Ê = H W_e are
  materialised (n × d and n × d·d_o);
* stage 2 is a dense ridge regression (same λ) from F̂ to Ê; W is M reshaped, with the same optional
  observation-inverse step (``cfg.obs_inverse``) and q₁ the normalised mean of F̂.

Memory is O(n·D) (four n × D float64 matrices plus the n × D temporaries of the feature maps) and time is
dominated by the four ΦᵀΦ products (O(n·D²)) and the D × D SVDs (O(D³)); the streaming implementation avoids both.
The result is a :class:`pipeline.two_stage.TwoStageLayer`, so ``filter_states`` / ``fit_decoder`` /
``PSRNN.load_two_stage`` accept it unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import numpy as np

if __package__ in (None, ""):  # run or imported as a plain script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.features import FeatureMaps, fit_feature_maps, make_windows  # noqa: E402
from pipeline.two_stage import (LinearStageOne, TwoStageConfig, TwoStageLayer, _fix_signs, _ridge_solve,  # noqa: E402
                                apply_observation_inverse, consecutive_windows)


def dense_ridge(X: np.ndarray, Y: np.ndarray, lam: float) -> np.ndarray:
    """argmin_B ‖Y − X B‖² + λ‖B‖² = (XᵀX + λI)⁻¹ XᵀY, from the materialised design matrix X."""
    A = X.T @ X + lam * np.eye(X.shape[1])
    try:
        return np.linalg.solve(A, X.T @ Y)
    except np.linalg.LinAlgError:  # singular only when λ = 0 and X is rank deficient
        return np.linalg.lstsq(A, X.T @ Y, rcond=None)[0]


def gram_projection(phi: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``dim`` left singular vectors of ΦᵀΦ (full SVD), signs fixed; and the singular values of Φ."""
    gram = phi.T @ phi
    U, s, _ = np.linalg.svd(gram)
    return _fix_signs(U[:, :dim]), np.sqrt(np.maximum(s[:dim], 0.0))


def naive_two_stage_regression(
    trajectories: Sequence[np.ndarray],
    cfg: TwoStageConfig,
    *,
    discrete: bool,
    vocab_size: int = 0,
    maps: FeatureMaps | None = None,
) -> TwoStageLayer:
    """One 2SR layer, fully materialised (see the module docstring). ``cfg.svd``, ``cfg.chunk_size``,
    ``cfg.feature_dtype``, ``cfg.power_iterations`` and ``cfg.oversample`` are ignored: everything is exact float64.
    """
    cfg.validate()
    windows = make_windows(trajectories, cfg.past_window, cfg.future_window, discrete=discrete,
                           vocab_size=vocab_size if discrete else None)
    n = len(windows)
    raw_dim = vocab_size if discrete else np.asarray(trajectories[0]).reshape(len(trajectories[0]), -1).shape[1]
    if maps is None:  # the same call as the streaming code, so the random features are identical
        maps = fit_feature_maps(windows, n_features=cfg.n_features, obs_dim=raw_dim, vocab_size=vocab_size,
                                widths=cfg.widths, width_scale=cfg.width_scale, seed=cfg.seed)
    d, d_o, d_h = cfg.state_dim, cfg.obs_dim, cfg.past_dim

    # every feature matrix, dense float64 n × D
    Phi_o = maps.apply("obs", windows.obs)
    Phi_h = maps.apply("past", windows.past)
    Phi_f = maps.apply("future", windows.future)
    Phi_s = maps.apply("shifted", windows.shifted)

    U_o, sv_o = gram_projection(Phi_o, d_o)
    U_h, sv_h = gram_projection(Phi_h, d_h)
    U_f, sv_f = gram_projection(Phi_f, d)

    O = Phi_o @ U_o                    # (n, d_o)
    H = Phi_h @ U_h                    # (n, d_h)
    F = Phi_f @ U_f                    # (n, d)
    S = Phi_s @ U_f                    # (n, d)
    E = (S[:, :, None] * O[:, None, :]).reshape(n, d * d_o)   # extended future, column i·d_o + j

    lam = cfg.ridge * n
    W_f = dense_ridge(H, F, lam)       # stage 1: history -> future
    W_e = dense_ridge(H, E, lam)       # stage 1: history -> extended future
    F_hat = H @ W_f                    # E[f_t | h_t], materialised
    E_hat = H @ W_e                    # E[s_t ⊗ o_t | h_t], materialised
    M = dense_ridge(F_hat, E_hat, lam)  # stage 2
    W = M.reshape(d, d, d_o).transpose(1, 2, 0).copy()      # M[k, i·d_o + j] -> W[i, j, k]
    if cfg.obs_inverse:
        W = apply_observation_inverse(W, O.T @ O / n, cfg.obs_ridge)
    q1 = F_hat.mean(0)
    norm = np.linalg.norm(q1)
    q1 = q1 / norm if norm > 0 else np.full(d, 1.0 / np.sqrt(d))
    if not (np.all(np.isfinite(W)) and np.all(np.isfinite(q1))):
        raise FloatingPointError("naive 2SR produced non-finite values; increase ridge")
    sv = {"obs": sv_o, "past": sv_h, "future": sv_f}
    return TwoStageLayer(W=W, q1=q1, mean_state=np.zeros(d), U_obs=U_o, U_past=U_h, U_future=U_f, maps=maps,
                         diagnostics={"n_windows": int(n), "lambda": float(lam), "implementation": "naive",
                                      "singular_values": {k: v.tolist() for k, v in sv.items()},
                                      "widths": {k: getattr(maps, k).width for k in ("obs", "past", "future")}})



def naive_linear_stage_one(trajs: Sequence[np.ndarray], *, state_dim: int, past_window: int, future_window: int,
                           ridge: float) -> LinearStageOne:
    """Stage 1 of the Kalman filter's linear 2SR, materialised (the reference of ``bench_kf_two_stage.py`` and of
    :func:`pipeline.two_stage.linear_stage_one`, which streams it): the n × p past, n × f future and shifted window
    matrices H, F, S are built whole, the stage-1 predictions F̂ = H B_F and Ŝ = H B_S (n × f each) too, and the
    state directions U are the top right singular vectors of an n × f SVD of F̂. Memory O(n·(p + 2f)), five such
    matrices at once besides the temporaries."""
    mu = np.concatenate(trajs).mean(0)
    win = make_windows([t - mu for t in trajs], past_window, future_window, discrete=False)
    H = win.past
    HH = H.T @ H
    lam = ridge * np.trace(HH) / HH.shape[0]
    Fh = H @ _ridge_solve(HH, H.T @ win.future, lam)
    Sh = H @ _ridge_solve(HH, H.T @ win.shifted, lam)
    _, sv, Vt = np.linalg.svd(Fh, full_matrices=False)
    U = _fix_signs(Vt[:state_dim].T)
    return LinearStageOne(windows=win, states=Fh @ U, shifted_states=Sh @ U, singular_values=sv, mean=mu,
                          consecutive=consecutive_windows(win))


if __name__ == "__main__":
    print("benchmarks/naive_two_stage.py is a library module, not a script: bench_two_stage.py runs its "
          "naive_two_stage_regression (the materialised 2SR) as the baseline of the streaming 2SR. Run: "
          "python -m benchmarks.bench_two_stage --help")
