"""CP decomposition of a 2SR tensor into the factors of a factorized PSRNN (Sec. 4.3).

W ≈ Σ_{r=1}^{R} a_r ⊗ b_r ⊗ c_r (tensorly's ``parafac``, ALS). The component weights are spread evenly over the
three factors (each factor column gets the cube root of the weight, with signs kept), because unbalanced factors —
"very large and very small numbers" — are what makes factorized PSRNNs poorly conditioned.

A rank above what the tensor needs is not an error: ALS solves a rank × rank system per mode, which is singular
when the rank exceeds the product of the other two mode sizes (rank 5 of a 2 × 2 × 2 tensor) or when the tensor
is (numerically) of lower rank than asked, as a 2SR tensor learned with huge kernel widths is (near rank 1). Plain
ALS then stops with "Singular matrix"; :func:`cp_decompose` retries with a tiny ridge (tensorly's ``l2_reg``,
1e-12 on the tensor scaled to norm 1) that makes every system solvable and still reconstructs a tensor of that
rank or less to a relative error of about 1e-8 (from the SVD start where the rank allows it, else, or when that
fails too, from a random one). The components the tensor does not need are then not near zero: they can cancel
one another (an exactly rank-2 4 × 3 × 4 tensor at rank 6 gave components of norms 22, 19.5, 7.3, 4.1 and 1.4),
which the balancing spreads over the three factors but does not remove. Below the rank the tensor needs, the
error is what the rank cannot hold (the shipped PTB tensors: 0.21 at rank 10, 0.013 at rank 60; Mocap 0.61 at
rank 10), which the decompose stage prints and a factorized PSRNN's MLflow run records (``cp.relative_error``). The first attempt is the plain ALS of
before, so ranks that always worked give the same factors to the last digit. What cannot be decomposed (NaN or
Inf in the tensor, an all-zero tensor, ALS failing even with the ridge) is a one-line :class:`ValueError` naming
the rank and the shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the largest CP rank, as a multiple of state_dim x obs_dim (the tensor's size over its state mode): beyond it a
#: rank only adds near-zero components, and a typo's rank (10**6) would ask for terabytes. params.yaml and the
#: Python API both refuse more
MAX_RANK_FACTOR = 10

#: ridge of the retries, on the tensor scaled to norm 1: small enough for a reconstruction exact to about 1e-8 or
#: better, large enough for every ALS system to be solvable
RIDGE = 1e-12


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
    """Rank-``rank`` CP decomposition of the 3-mode tensor ``W`` with balanced factor norms (retries in the
    module docstring)."""
    import tensorly as tl

    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"CP rank must be an integer >= 1, got {rank!r}")
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 3:
        raise ValueError(f"CP decomposition needs a 3-mode tensor, got shape {W.shape}")
    where = f"CP rank {rank} of a tensor of shape {W.shape}"
    bad = int(W.size - np.isfinite(W).sum())
    if bad:
        raise ValueError(f"{where}: {bad} of its {W.size} entries are NaN or Inf; expected a finite tensor (check "
                         "the 2SR that made it: kernel widths, ridge)")
    peak = float(np.abs(W).max()) if W.size else 0.0
    if peak == 0:
        raise ValueError(f"{where}: the tensor is all zero; expected a non-zero tensor (check the 2SR that made "
                         "it: kernel widths, ridge)")
    with np.errstate(over="ignore", under="ignore"):
        norm = float(np.linalg.norm(W))
    if not np.isfinite(norm) or norm == 0:   # entries near 1e308 (the squares overflow) or near 1e-308
        norm = peak * float(np.linalg.norm(W / peak))
    tl.set_backend("numpy")
    # ALS is scale-equivariant; working on W/‖W‖ keeps its tolerance meaningful whatever the scale of W.
    # svd init needs rank ≤ each mode size; random init otherwise.
    use_init = init if rank <= min(W.shape) else "random"
    Wn = W / norm
    attempts = [dict(init=use_init, normalize_factors=True, l2_reg=0.0)]   # the ALS of every rank that works
    # then with the ridge (factors not normalised by ALS: a zero weight would make its system singular again), from
    # the SVD start where the rank allows one (it converges much closer than a random start), else a random one
    attempts += [dict(init=i, normalize_factors=False, l2_reg=RIDGE) for i in dict.fromkeys((use_init, "random"))]
    failure = ""
    for attempt in attempts:
        try:
            weights, factors = _parafac(Wn, rank, seed=seed, n_iter_max=n_iter_max, tol=tol, **attempt)
        except np.linalg.LinAlgError as exc:
            failure = " ".join(str(exc).split()) or type(exc).__name__
            continue
        if all(np.isfinite(f).all() for f in factors) and np.isfinite(weights).all():
            return _balanced(weights, factors, W, norm)
        failure = "the factors overflowed to NaN or Inf"
    raise ValueError(f"{where}: ALS failed even with a ridge of {RIDGE:g} ({failure}); expected a non-degenerate "
                     "tensor: check the 2SR that made it (kernel widths, ridge), or use a rank at most "
                     f"{min(W.shape)}")


def _parafac(Wn: np.ndarray, rank: int, *, seed: int, n_iter_max: int, tol: float, init: str,
             normalize_factors: bool, l2_reg: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """One run of tensorly's ALS; (weights, [F0, F1, F2]) with unit-norm factor columns where they are non-zero."""
    import tensorly as tl
    from tensorly.decomposition import parafac

    with np.errstate(over="ignore", invalid="ignore"):
        weights, factors = parafac(tl.tensor(Wn), rank=rank, n_iter_max=n_iter_max, tol=tol, init=init,
                                   random_state=seed, normalize_factors=normalize_factors, linesearch=False,
                                   l2_reg=l2_reg)
        weights, factors = np.asarray(weights, dtype=np.float64), [np.asarray(f, dtype=np.float64) for f in factors]
        if not normalize_factors:   # the weights as parafac's normalize_factors gives them: column norms
            for i, f in enumerate(factors):
                n = np.linalg.norm(f, axis=0)
                weights = weights * n
                factors[i] = f / np.where(n > 0, n, 1.0)
    return weights, factors


def _balanced(weights: np.ndarray, factors: list[np.ndarray], W: np.ndarray, norm: float) -> CPFactors:
    """The factors with each component's weight spread evenly (cube roots, the sign on A), and their error."""
    F0, F1, F2 = factors
    weights = weights * norm
    scale = np.cbrt(np.abs(weights))
    sign = np.sign(weights)
    sign[sign == 0] = 1.0
    A = (F0 * scale * sign).T
    B = (F1 * scale).T
    C = (F2 * scale).T
    out = CPFactors(A=A, B=B, C=C, relative_error=0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        error = float(np.linalg.norm(out.reconstruct() - W) / norm)
        if not np.isfinite(error):   # huge entries: the squares overflow, the scaled difference does not
            error = float(np.linalg.norm((out.reconstruct() - W) / norm))
    out.relative_error = error
    return out
