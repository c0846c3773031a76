"""CP decomposition of a 2SR tensor into the factors of a factorized PSRNN (Sec. 4.3).

W ≈ Σ_{r=1}^{R} a_r ⊗ b_r ⊗ c_r (tensorly's ``parafac``, ALS). The component weights are spread evenly over the
three factors (each factor column gets the cube root of the weight, with signs kept), because unbalanced factors —
"very large and very small numbers" — are what makes factorized PSRNNs poorly conditioned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class CPFactors:
    """A (r, d), B (r, d_o), C (r, d): W[i, j, k] ≈ Σ_r A[r, i] B[r, j] C[r, k]."""

    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    relative_error: float

    def reconstruct(self) -> np.ndarray:
        return np.einsum("ri,rj,rk->ijk", self.A, self.B, self.C)

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"A": self.A, "B": self.B, "C": self.C}


def cp_decompose(W: np.ndarray, rank: int, *, seed: int = 0, n_iter_max: int = 2000, tol: float = 1e-12,
                 init: str = "svd") -> CPFactors:
    """Rank-``rank`` CP decomposition of the 3-mode tensor ``W`` with balanced factor norms."""
    import tensorly as tl
    from tensorly.decomposition import parafac

    if rank < 1:
        raise ValueError(f"CP rank must be >= 1, got {rank}")
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 3:
        raise ValueError(f"CP decomposition needs a 3-mode tensor, got shape {W.shape}")
    norm = np.linalg.norm(W)
    if norm == 0:
        raise ValueError("cannot decompose an all-zero tensor")
    tl.set_backend("numpy")
    # ALS is scale-equivariant; working on W/‖W‖ keeps its tolerance meaningful whatever the scale of W.
    # svd init needs rank ≤ each mode size; random init otherwise.
    use_init = init if rank <= min(W.shape) else "random"
    cp = parafac(tl.tensor(W / norm), rank=rank, n_iter_max=n_iter_max, tol=tol, init=use_init,
                 random_state=seed, normalize_factors=True, linesearch=False)
    weights, (F0, F1, F2) = cp
    weights = np.asarray(weights) * norm
    scale = np.cbrt(np.abs(weights))
    sign = np.sign(weights)
    sign[sign == 0] = 1.0
    A = (np.asarray(F0) * scale * sign).T
    B = (np.asarray(F1) * scale).T
    C = (np.asarray(F2) * scale).T
    factors = CPFactors(A=A, B=B, C=C, relative_error=0.0)
    factors.relative_error = float(np.linalg.norm(factors.reconstruct() - W) / norm)
    return factors
