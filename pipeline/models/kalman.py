"""A Kalman filter baseline whose filter recursion is differentiable, so BPTT refines it like the others.

Model (linear-Gaussian, with possibly correlated process and observation noise):

    x_{t+1} = A x_t + w_t,   o_t = C x_t + μ + v_t,   [w_t; v_t] ~ N(0, Σ),  Σ = [[Q, M], [Mᵀ, R]],

x_0 ~ N(x0, P0). The predictor-form filter, for each observation o_t:

    e_t = o_t − μ − C x_t,   S_t = C P_t Cᵀ + R,   K_t = (A P_t Cᵀ + M) S_t⁻¹,
    x_{t+1} = A x_t + K_t e_t,   P_{t+1} = A P_t Aᵀ + Q − K_t S_t K_tᵀ,

and the prediction of o_{t+1} is C x_{t+1} + μ. Σ and P0 are parametrised by Cholesky factors so that BPTT
keeps them positive semi-definite. It is initialised by linear 2SR (:func:`pipeline.two_stage.linear_two_stage`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from pipeline.models.common import ModelConfig, SequenceModel, apply_reset

#: added to the diagonal of the joint noise covariance [[Q, M], [Mᵀ, R]] at every use, so that the innovation
#: covariance stays invertible whatever BPTT does to the Cholesky factor; with _chol's own first jitter
#: (1e-8 · mean eigenvalue) the filter of a loaded model differs from the textbook one by ~1e-6 relative on
#: standardised data (measured: 2.2e-6 on a known linear-Gaussian system)
_JITTER = 1e-6


def _chol(m: np.ndarray) -> np.ndarray:
    """The Cholesky factor of the symmetric part of ``m`` plus the smallest jitter (10⁻⁸ … 10⁻¹ × its mean
    eigenvalue) that makes it positive definite: 2SR's noise estimates can be semi-definite."""
    m = 0.5 * (m + m.T)
    scale = max(float(np.trace(m)) / m.shape[0], 1e-12)
    for k in range(8):
        try:
            return np.linalg.cholesky(m + (10.0 ** (k - 8)) * scale * np.eye(m.shape[0]))
        except np.linalg.LinAlgError:
            continue
    raise np.linalg.LinAlgError("covariance is not positive semi-definite")


class KalmanFilter(SequenceModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        if config.discrete:
            raise ValueError("the Kalman filter baseline models continuous data only")
        n, m = config.state_dim, config.input_dim
        self.A = nn.Parameter(torch.zeros(n, n))
        self.C = nn.Parameter(torch.zeros(m, n))
        self.mean = nn.Parameter(torch.zeros(m))
        self.noise_chol = nn.Parameter(torch.eye(n + m))
        self.x0 = nn.Parameter(torch.zeros(n))
        self.P0_chol = nn.Parameter(torch.eye(n))
        self.n, self.m = n, m

    def n_parameters(self) -> int:
        """The trained numbers: of the two Cholesky factors only the lower triangles, which are all the filter
        reads (``torch.tril``; the upper entries get no gradient). Counting the whole matrices gave the
        Mocap KF 6,932 parameters instead of 4,257."""
        n, m = self.n, self.m
        full = super().n_parameters()
        return full - (n + m) * (n + m - 1) // 2 - n * (n - 1) // 2

    def load_two_stage(self, lss) -> "KalmanFilter":
        n = self.n
        sigma = np.block([[lss.Q, lss.M], [lss.M.T, lss.R]])
        with torch.no_grad():
            for name, value in (("A", lss.A), ("C", lss.C), ("mean", lss.mean), ("x0", lss.x0),
                                ("noise_chol", _chol(sigma)), ("P0_chol", _chol(lss.P0))):
                getattr(self, name).copy_(torch.as_tensor(value))
        assert self.A.shape == (n, n)
        return self

    def covariances(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Q, M, R, P0) from the Cholesky parameters (lower triangles only), Q and R with ``_JITTER`` on the
        diagonal."""
        n = self.n
        L = torch.tril(self.noise_chol)
        sigma = L @ L.T + _JITTER * torch.eye(n + self.m, dtype=L.dtype, device=L.device)
        Lp = torch.tril(self.P0_chol)
        return sigma[:n, :n], sigma[:n, n:], sigma[n:, n:], Lp @ Lp.T

    def init_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        _, _, _, P0 = self.covariances()
        return (self.x0.detach().expand(batch_size, -1).clone(),
                P0.detach().expand(batch_size, -1, -1).clone())

    def forward(self, x: torch.Tensor, state: Sequence[torch.Tensor], reset: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        Q, M, R, P0 = self.covariances()
        A, C = self.A, self.C
        xs, P = state
        B = xs.shape[0]
        reset_steps = set() if reset is None else set(torch.nonzero(reset.any(1)).flatten().tolist())
        # P_t, S_t and K_t do not depend on the observations: chains that start from the same P and reset at the
        # same steps (equal-length trajectories, as in Swimmer and Mocap) share one covariance recursion, which
        # is most of the work (an m×m solve per step), instead of running it B times.
        shared = (B == 1 or bool((P == P[:1]).all())) and (
            reset is None or bool((reset.any(1) == reset.all(1)).all()))
        if shared:
            P = P[:1]
        preds = []
        for t in range(x.shape[0]):
            if t in reset_steps:
                xs = apply_reset(xs, self.x0, reset[t])  # type: ignore[index]
                P = P0.unsqueeze(0) if shared else apply_reset(P, P0, reset[t])  # type: ignore[index]
            e = x[t] - self.mean - xs @ C.T                           # (B, m)
            PCt = P @ C.T                                             # (B, n, m)
            S = C @ PCt + R                                           # (B, m, m)
            cross = A @ PCt + M                                       # (B, n, m)
            K = torch.linalg.solve(S, cross.transpose(1, 2)).transpose(1, 2)  # cross S⁻¹ (S symmetric)
            xs = xs @ A.T + (K @ e.unsqueeze(-1)).squeeze(-1)
            P = A @ P @ A.T + Q - K @ S @ K.transpose(1, 2)
            P = 0.5 * (P + P.transpose(1, 2))
            preds.append(xs @ C.T + self.mean)
        return torch.stack(preds), (xs, P.expand(B, -1, -1) if shared else P)
