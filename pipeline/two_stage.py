"""Two-stage regression (2SR; Hefny et al. 2015) as used to initialise PSRNNs (Sec. 3.2 and 4.2 of the paper).

With RFF features ω_t (observation), η_t (history), φ_t (future) and φ_{t+1} (shifted future), each projected onto
its top singular directions (o_t = U_oᵀω_t, h_t = U_hᵀη_t, f_t = U_fᵀφ_t, s_t = U_fᵀφ_{t+1}):

* stage 1 (ridge, λ = ridge·n):  E[f_t | h_t] = W_fᵀ h_t,   E[s_t ⊗ o_t | h_t] = W_eᵀ h_t
* stage 2 (ridge, λ = ridge·n):  E[s_t ⊗ o_t | h_t] ≈ Mᵀ E[f_t | h_t]
* the PSRNN tensor is M reshaped: W[i, j, k] = M[k, (i, j)], so that q_{t+1} ∝ W ×₂ o_t ×₃ q_t (Eq. 5);
  q₁ is the normalised mean of E[f_t | h_t]. Below f̂_t = E[f_t | h_t] and ê_t = E[s_t ⊗ o_t | h_t], the
  stage-1 predictions (s_t stays the shifted future).

Streaming. Only the sufficient statistics are ever held: the projections come from a randomised range finder
(Halko et al. 2011) whose products ΦᵀΦQ are accumulated chunk by chunk, and stage 1 and 2 need only HᵀH, HᵀF and
HᵀE (Σ f̂f̂ᵀ = W_fᵀHᵀH W_f and Σ f̂êᵀ = W_fᵀHᵀH W_e). The last range-finder pass also accumulates these statistics
in the range bases Q (they are linear in each projection, and U = QR), so the data are read
``power_iterations + 1`` times in all. No T × n_rff matrix is materialised; memory is
O(chunk·(n_rff + (d + oversample)²) + n_rff·(d + oversample)) besides the data and one (trajectory, t) index per
window.

Discrete data repeat (PTB's 120k characters hold 28.6k distinct 5-grams), so they are de-duplicated over all the
data, not per chunk: a first pass, integers only, counts each family's distinct windows u (c_u rows each;
:func:`pipeline.features.distinct_windows`). ΦᵀΦQ = Σ_u c_u φ_u φ_uᵀQ pairs no family with another, so the
range-finder passes (and the exact Grams) run over the distinct windows, in chunks of them, and read no data; the
last pass featurises each family's distinct windows once more into a (distinct × (d + oversample)) table of
projections, from which the chunks of rows gather their h, f, s and o for the statistics that pair families.
So the data are read twice, every distinct window is featurised ``power_iterations + 1`` times, and memory adds
O(distinct · (d + oversample + window)), which grows slower than T. Continuous data (and discrete windows too
long for int64 keys, or with more distinct windows than :data:`DISTINCT_TABLE_BYTES` holds, ~0.9 M at the
defaults: data that repeat too little for de-duplication to pay; both de-duplicated per chunk) are streamed as
above.

Then the states are filtered through the training data with the normalised update, and a regression from states to
the next observation initialises the decoder (softmax for discrete data, linear for continuous data). A multilayer
PSRNN is initialised layer by layer, the states filtered by layer l being the observations of layer l+1 (Sec. 4.2);
its decoder regresses o_{t+1} on the top layer's states and, for skip connections, on every layer's states.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from pipeline.features import (MIN_KERNEL_WIDTH, RANGE_FINDER, DistinctWindows, FeatureMaps, Windows, distinct_windows,
                               fit_feature_maps, layer_seed, make_windows, seed_sequence)
from pipeline.messages import brief
from pipeline.progress import progress
from pipeline.train_config import SEED_LIMIT

log = logging.getLogger(__name__)

WIDTH_FAMILIES = ("obs", "past", "future")   # the RFF families of pipeline.features.fit_feature_maps
MAX_POWER_ITERATIONS = 100   # the range finder converges in a few; more only costs time
MAX_SIZE = 2 ** 31 - 1       # a bound on every count and size (params.yaml, TwoStageConfig, fit_model arguments)


@dataclass
class TwoStageConfig:
    """Hyperparameters of one 2SR layer (defaults: the paper's text, Sec. 6, where it gives them)."""

    state_dim: int = 20          # d: size of the predictive state (and of the future projection)
    obs_dim: int = 20            # d_o: size of the projected observation (encoder output)
    past_dim: int = 20           # d_h: size of the projected history
    n_features: int = 2000       # D: RFF features per family
    past_window: int = 1         # p: observations in a history window
    future_window: int = 1       # k: observations in a future window (the paper's "horizon")
    ridge: float = 1e-2          # λ = ridge · n in both stages
    width_scale: float = 1.0     # multiplies the median-distance kernel widths
    widths: dict[str, float] | None = None  # fixed widths for "obs", "past", "future" (overrides the median)
    svd: str = "randomized"      # "randomized" (streaming range finder) or "exact" (eigh of the D×D Gram)
    power_iterations: int = 2
    oversample: int = 10
    chunk_size: int = 8192
    feature_dtype: str = "float32"  # RFF chunks; accumulators are always float64
    decoder_ridge: float = 1e-3  # decoder regression: λ = decoder_ridge · n
    obs_inverse: bool = True     # fold C_oo⁻¹ into the observation mode of W (the PSR's Z, see below)
    obs_ridge: float = 1e-3      # C_oo⁻¹ ≈ (C_oo + obs_ridge · tr(C_oo)/d_o · I)⁻¹
    # layers >= 2 (their observations are the states of the layer below): history and future windows of states;
    # None = past_window / future_window. A state already summarises the history, and a window of p states leaves
    # the first p states of every trajectory (the lower layer's transient from q₁) out of the observations the
    # upper layer is regressed on, though the model feeds it them: on Swimmer (p = k = 10) that left layer 2's
    # update near zero there and its state flipped sign (q and -q filter alike at b = 0) in 5 of 6 seeds.
    upper_past_window: int | None = None
    upper_future_window: int | None = None
    # layers >= 2: the observation inverse's ridge (None: obs_ridge). The states below, unit vectors, have an
    # ill-conditioned C_oo; on PTB seed 0 its inverse at 1e-3 left layer 2 bistable (its state at ±one direction,
    # 36% of steps on the far side: 4.25 BPC at epoch 0 against 3.96 for one layer), at 0.1 3.89.
    upper_obs_ridge: float | None = None
    seed: int = 0

    @property
    def upper_windows(self) -> tuple[int, int]:
        """(past, future) windows of layers 2 and up: ``upper_past_window`` / ``upper_future_window``, where
        None is layer 1's."""
        return (self.past_window if self.upper_past_window is None else self.upper_past_window,
                self.future_window if self.upper_future_window is None else self.upper_future_window)

    def validate(self) -> None:
        """Every field, so that library callers (``fit_model(**options)``) get the one-line errors that params.yaml
        validation gives: a key named and what was expected."""
        for key in ("state_dim", "obs_dim", "past_dim", "n_features", "past_window", "future_window", "chunk_size",
                    "power_iterations"):   # power_iterations 0: the projections would span a random subspace
            v = getattr(self, key)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"two_stage.{key}: expected a positive integer, got {brief(v)}")
            bound = MAX_POWER_ITERATIONS if key == "power_iterations" else MAX_SIZE
            if v > bound:
                shown = "2**31 - 1" if bound == MAX_SIZE else bound
                raise ValueError(f"two_stage.{key}: expected an integer <= {shown}, got {brief(v)}")
        for key in ("upper_past_window", "upper_future_window"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool)
                                  or not 1 <= v <= MAX_SIZE):
                raise ValueError(f"two_stage.{key}: expected a positive integer or null, got {brief(v)}")
        if not isinstance(self.oversample, (int, np.integer)) or isinstance(self.oversample, bool) \
                or self.oversample < 0:
            raise ValueError(f"two_stage.oversample: expected an integer >= 0, got {brief(self.oversample)}")
        for key in ("state_dim", "obs_dim", "past_dim"):
            if getattr(self, key) > self.n_features:
                raise ValueError(f"two_stage.{key}={brief(getattr(self, key))} exceeds n_features="
                                 f"{brief(self.n_features)}: a projection cannot have more directions than RFF "
                                 "features")
        for key in ("ridge", "decoder_ridge", "obs_ridge"):
            v = getattr(self, key)
            if not is_finite_number(v) or v < 0:
                raise ValueError(f"two_stage.{key}: expected a finite number >= 0, got {brief(v)}")
        if self.upper_obs_ridge is not None and (not is_finite_number(self.upper_obs_ridge)
                                                 or self.upper_obs_ridge < 0):
            raise ValueError(f"two_stage.upper_obs_ridge: expected a finite number >= 0 or null, got "
                             f"{brief(self.upper_obs_ridge)}")
        if not is_finite_number(self.width_scale) or self.width_scale <= 0:
            raise ValueError(f"two_stage.width_scale: expected a finite number > 0, got {brief(self.width_scale)}")
        if self.widths is not None:
            if not isinstance(self.widths, dict):
                raise ValueError(f"two_stage.widths: expected a mapping of obs/past/future widths or None, got "
                                 f"{brief(self.widths)}")
            for k, w in self.widths.items():
                if k not in WIDTH_FAMILIES:
                    raise ValueError(f"two_stage.widths.{k}: unknown family; expected obs, past or future")
                if w is not None and (not is_finite_number(w) or w < MIN_KERNEL_WIDTH):
                    raise ValueError(f"two_stage.widths.{k}: expected a finite number >= {MIN_KERNEL_WIDTH:g}, got "
                                     f"{brief(w)}")
        if self.svd not in ("randomized", "exact"):
            raise ValueError(f"two_stage.svd: expected 'randomized' or 'exact', got {self.svd!r}")
        if self.feature_dtype not in ("float32", "float64"):
            raise ValueError(f"two_stage.feature_dtype: expected 'float32' or 'float64', got {self.feature_dtype!r}")
        if not isinstance(self.obs_inverse, bool):
            raise ValueError(f"two_stage.obs_inverse: expected true or false, got {self.obs_inverse!r}")
        # every draw of the 2SR derives from the seed (features.seed_sequence): "a", 2.5 and -1 failed deep inside 2SR;
        # the bound is that of the seeds of training and params.yaml
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool) \
                or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"two_stage.seed: expected an integer with 0 <= seed < 2**32, got {brief(self.seed)}")


def is_finite_number(v: Any) -> bool:
    """A finite int or float (numpy's too), not a bool; an int beyond the float range is not."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:   # an int beyond the float range
        return False


@dataclass
class TwoStageLayer:
    """The result of 2SR for one layer: everything a PSRNN layer (and its encoder) is initialised from."""

    W: np.ndarray              # (d, d_o, d): W[i, j, k], output state i, observation j, input state k
    q1: np.ndarray             # (d,): initial state (unit norm)
    mean_state: np.ndarray     # (d,): mean of the unnormalised update W ×₂ o_t ×₃ q_t over the training states
                               # filtered with b = 0 (the PSRNN's bias is bias_scale · mean_state, Sec. 4.3)
    U_obs: np.ndarray          # (D, d_o): observation projection (encoder)
    U_past: np.ndarray         # (D, d_h)
    U_future: np.ndarray       # (D, d)
    maps: FeatureMaps
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        out = {"W": self.W, "q1": self.q1, "mean_state": self.mean_state, "U_obs": self.U_obs,
               "U_past": self.U_past, "U_future": self.U_future}
        out.update(self.maps.to_arrays())
        return {prefix + k: v for k, v in out.items()}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str = "",
                    diagnostics: dict[str, Any] | None = None) -> "TwoStageLayer":
        a = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        return cls(W=a["W"], q1=a["q1"], mean_state=a["mean_state"], U_obs=a["U_obs"], U_past=a["U_past"],
                   U_future=a["U_future"], maps=FeatureMaps.from_arrays(a), diagnostics=diagnostics or {})

    @property
    def state_dim(self) -> int:
        return self.W.shape[0]

    @property
    def obs_dim(self) -> int:
        return self.W.shape[1]

    def encode(self, trajectory: np.ndarray, chunk_size: int = 8192) -> np.ndarray:
        """Encoder output o_t = U_oᵀ ω(o_t) for every step of a raw trajectory, shape (T, d_o)."""
        x = np.asarray(trajectory)
        if self.maps.discrete:
            x = x.reshape(-1, 1)
        else:
            x = x.reshape(x.shape[0], -1)
        out = np.empty((x.shape[0], self.obs_dim))
        for s in range(0, x.shape[0], chunk_size):
            phi, inverse, _ = self.maps.apply_unique("obs", x[s:s + chunk_size])
            enc = phi @ self.U_obs
            out[s:s + chunk_size] = enc if inverse is None else enc[inverse]
        return out


@dataclass
class Decoder:
    """Initial decoder: logits (discrete) or prediction (continuous) = q @ weight.T + bias."""

    weight: np.ndarray  # (out, d)
    bias: np.ndarray    # (out,)
    kind: str

    def predict(self, states: np.ndarray) -> np.ndarray:
        return states @ self.weight.T + self.bias


# ---------------------------------------------------------------------------------------------- projections


def _orth(y: np.ndarray) -> np.ndarray:
    q, _ = np.linalg.qr(y)
    return q


def _families(maps: FeatureMaps) -> tuple[str, ...]:
    return ("obs", "past", "future")


def top_projections(
    windows: Windows, maps: FeatureMaps, dims: dict[str, int], cfg: TwoStageConfig
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], "Statistics"]:
    """Top right singular vectors of each feature matrix Φ (n × D), streamed over chunks of rows, and the
    stage-1 statistics in those projections (:func:`accumulate_statistics`).

    Randomised (default): ``power_iterations`` passes of the range finder Y = ΦᵀΦQ, then one last pass that forms
    P = ΦQ and, from the same features, the stage-1 statistics in the Q bases; the small Gram PᵀP = QᵀΦᵀΦQ gives
    the singular directions U = QR, and the statistics are rotated by R (they are linear in each projection), so
    stage 1 costs no pass of its own. Exact: the D × D Grams, then one pass for the statistics.

    For discrete data ΦᵀΦ = Σ_u c_u φ_u φ_uᵀ over the distinct windows u of the family, c_u their counts
    (:func:`pipeline.features.distinct_windows`): the range finder and the Grams pair no family with another, so
    they run over the distinct windows alone, in chunks of ``chunk_size`` of them, and read no data.

    Returns (projections {family: (D, dim)}, singular values {family: (dim,)}, statistics in the projections).
    """
    dtype = np.dtype(cfg.feature_dtype)
    D = maps.obs.n_features
    fams = _families(maps)
    distinct = _distinct(windows, cfg, max(dims.values()) + cfg.oversample)   # None for continuous data
    if cfg.svd == "exact":
        grams = {f: np.zeros((D, D)) for f in fams}
        for f in fams:
            for phi, counts in _feature_blocks(windows, maps, f, distinct, dtype, cfg.chunk_size, "2SR gram"):
                phi = phi.astype(np.float64)
                grams[f] += phi.T @ (phi if counts is None else phi * counts[:, None])
                del phi   # so that the next block is made without this one alive
        out, sv = {}, {}
        for f in fams:
            evals, evecs = np.linalg.eigh(grams[f])
            order = np.argsort(evals)[::-1][: dims[f]]
            out[f] = _fix_signs(evecs[:, order])
            sv[f] = np.sqrt(np.maximum(evals[order], 0))
        return out, sv, accumulate_statistics(windows, maps, out, cfg, distinct=distinct)

    rng = np.random.default_rng(seed_sequence(cfg.seed, RANGE_FINDER))
    Q = {f: _orth(rng.standard_normal((D, min(D, dims[f] + cfg.oversample)))) for f in fams}
    for it in range(cfg.power_iterations):
        Y = {f: np.zeros_like(Q[f]) for f in fams}
        for f in fams:
            Q_f = Q[f].astype(dtype)
            for phi, counts in _feature_blocks(windows, maps, f, distinct, dtype, cfg.chunk_size,
                                               f"2SR range pass {it + 1}"):
                proj = phi @ Q_f
                if counts is not None:
                    proj *= counts[:, None].astype(dtype)
                Y[f] += (phi.T @ proj).astype(np.float64)
                del phi   # so that the next block is made without this one alive
        Q = {f: _orth(Y[f]) for f in fams}
    stats = accumulate_statistics(windows, maps, Q, cfg, future_gram=True, distinct=distinct)
    small = {"obs": stats.OO, "past": stats.HH, "future": stats.FF}   # PᵀP = QᵀΦᵀΦQ per family
    out, sv, rot = {}, {}, {}
    for f in fams:
        evals, evecs = np.linalg.eigh(0.5 * (small[f] + small[f].T))
        order = np.argsort(evals)[::-1][: dims[f]]
        signs = _sign_fix(Q[f] @ evecs[:, order])
        rot[f] = evecs[:, order] * signs
        out[f] = Q[f] @ rot[f]
        sv[f] = np.sqrt(np.maximum(evals[order], 0))
    return out, sv, stats.rotated(rot["past"], rot["future"], rot["obs"])


#: Memory allowed to one family's distinct-window tables (keys, counts, windows and the (distinct × q) float64
#: projections). Data with more distinct windows than fit are streamed row by row as continuous data are: they
#: repeat too little for de-duplication to pay, and the tables would grow with T.
DISTINCT_TABLE_BYTES = 256 * 2 ** 20


def _distinct(windows: Windows, cfg: TwoStageConfig, q: int) -> dict[str, DistinctWindows] | None:
    """:func:`pipeline.features.distinct_windows` within :data:`DISTINCT_TABLE_BYTES` per family, for
    projections of ``q`` columns (None: stream rows)."""
    width = max(windows.past_window, windows.future_window)
    per_window = 8 * (q + width + 2)   # projections, the window's symbols, its key and its count
    return distinct_windows(windows, cfg.chunk_size, max_distinct=DISTINCT_TABLE_BYTES // per_window)


def _feature_blocks(windows: Windows, maps: FeatureMaps, family: str, distinct: dict[str, DistinctWindows] | None,
                    dtype: np.dtype, chunk_size: int, desc: str) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """The features of every ``family`` window in blocks (φ rows, multiplicity of each row or None for 1), so that
    Σ_rows g(φ) = Σ_blocks Σ_i c_i g(φ_i): chunks of the distinct windows when there are tables, else chunks of
    rows, de-duplicated within the chunk (discrete data whose windows have no int64 key) or not (continuous)."""
    if distinct is not None:
        table = distinct[family]
        for s in progress(range(0, len(table), chunk_size), desc=f"{desc} ({family})"):
            yield maps.apply(family, table.rows[s:s + chunk_size], dtype), table.counts[s:s + chunk_size]
        return
    for sl in progress(list(windows.chunks(chunk_size)), desc=f"{desc} ({family})"):
        phi, _, counts = maps.apply_unique(family, windows.rows(family, sl), dtype)
        yield phi, counts


@dataclass
class Statistics:
    """The sufficient statistics of both stages, in given projections of the history (h), future (f), shifted
    future (s, same projection as f) and observation (o) features: HᵀH, HᵀF, Hᵀ(S ⊙⊗ O) (row-wise Kronecker,
    column i·d_o + j), OᵀO, Σh, and (optionally) FᵀF."""

    HH: np.ndarray
    HF: np.ndarray
    HE: np.ndarray
    OO: np.ndarray
    h_sum: np.ndarray
    n: int
    FF: np.ndarray | None = None

    def rotated(self, R_h: np.ndarray, R_f: np.ndarray, R_o: np.ndarray) -> "Statistics":
        """The same statistics in the projections P R (each statistic is linear in each projection)."""
        return Statistics(HH=R_h.T @ self.HH @ R_h, HF=R_h.T @ self.HF @ R_f,
                          HE=R_h.T @ self.HE @ np.kron(R_f, R_o), OO=R_o.T @ self.OO @ R_o,
                          h_sum=self.h_sum @ R_h, n=self.n,
                          FF=None if self.FF is None else R_f.T @ self.FF @ R_f)


MAX_SYMBOL_GROUPS = 256   # Hᵀ(S ⊙⊗ O) by observation symbol up to this many distinct observations (see below)


def accumulate_statistics(windows: Windows, maps: FeatureMaps, bases: dict[str, np.ndarray], cfg: TwoStageConfig,
                          *, future_gram: bool = False,
                          distinct: dict[str, DistinctWindows] | None = None) -> Statistics:
    """One streamed pass: project each family's features on ``bases`` and accumulate :class:`Statistics`.

    The shifted future of window t is the future of window t+1 of the same trajectory, so its projection is
    reused and computed only at trajectory (and chunk) ends.

    Discrete data (``distinct``: the tables of :func:`pipeline.features.distinct_windows`, made here when not
    given): each family's distinct windows are featurised and projected once, into a (distinct × q) float64
    table P, in chunks; a chunk of rows then gathers its h, f, s, o from the tables by its windows' positions.
    The one-family statistics are weighted sums over a table (HᵀH = P_hᵀ diag(c_h) P_h, Σh = c_hᵀP_h, …), and
    with few observation symbols v, Hᵀ(S ⊙⊗ O) = Σ_v A_v ⊗ P_o[v] with A_v = Σ_{t: o_t = v} h_t s_tᵀ,
    accumulated per symbol on the chunk's rows sorted by symbol: q_h·q_f products per row instead of
    q_h·q_f·q_o (on PTB ~10× less time than the row-wise Kronecker, which also builds a chunk × q_h·q_f array).
    """
    if distinct is None:
        distinct = _distinct(windows, cfg, max(b.shape[1] for b in bases.values()))
    if distinct is None:
        return _accumulate_rows(windows, maps, bases, cfg, future_gram=future_gram)
    dtype = np.dtype(cfg.feature_dtype)
    P_h, P_f, P_o = (_projected_table(maps, f, distinct[f], bases[f], dtype, cfg.chunk_size)
                     for f in ("past", "future", "obs"))
    c_h, c_f, c_o = (distinct[f].counts.astype(np.float64) for f in ("past", "future", "obs"))
    q_h, q_f, q_o = P_h.shape[1], P_f.shape[1], P_o.shape[1]
    grouped = len(distinct["obs"]) <= MAX_SYMBOL_GROUPS
    HF = np.zeros((q_h, q_f))
    A = np.zeros((len(distinct["obs"]), q_h, q_f)) if grouped else None   # A_v = Σ_{t: o_t = v} h_t s_tᵀ
    HE = None if grouped else np.zeros((q_h, q_f * q_o))
    for sl in progress(list(windows.chunks(cfg.chunk_size)), desc="2SR statistics"):
        i_h = distinct["past"].index(windows.rows("past", sl))
        i_f = distinct["future"].index(windows.rows("future", sl))
        i_s = _shifted_from_future(windows, sl, i_f, distinct["future"].index)
        i_o = distinct["obs"].index(windows.rows("obs", sl))
        if grouped:
            order = np.argsort(i_o, kind="stable")
            i_h, i_f, i_s, i_o = i_h[order], i_f[order], i_s[order], i_o[order]
        h, s = P_h[i_h], P_f[i_s]
        HF += h.T @ P_f[i_f]
        if grouped:
            starts = np.flatnonzero(np.r_[True, i_o[1:] != i_o[:-1]])
            for a, b in zip(starts, np.r_[starts[1:], len(i_o)]):
                A[i_o[a]] += h[a:b].T @ s[a:b]
        else:
            o = P_o[i_o]
            hs = (h[:, :, None] * s[:, None, :]).reshape(len(h), q_h * q_f)
            HE += (hs.T @ o).reshape(q_h, q_f * q_o)
    if grouped:
        HE = np.einsum("vai,vj->aij", A, P_o).reshape(q_h, q_f * q_o)   # column i·q_o + j
    return Statistics(HH=P_h.T @ (P_h * c_h[:, None]), HF=HF, HE=HE, OO=P_o.T @ (P_o * c_o[:, None]),
                      h_sum=c_h @ P_h, n=len(windows),
                      FF=P_f.T @ (P_f * c_f[:, None]) if future_gram else None)


def _projected_table(maps: FeatureMaps, family: str, table: DistinctWindows, U: np.ndarray, dtype: np.dtype,
                     chunk_size: int) -> np.ndarray:
    """Uᵀφ of every window of a distinct-window table, (distinct × q) float64, featurised chunk by chunk."""
    U_d = U.astype(dtype)
    out = np.empty((len(table), U.shape[1]))
    for s in range(0, len(table), chunk_size):
        out[s:s + chunk_size] = maps.apply(family, table.rows[s:s + chunk_size], dtype) @ U_d
    return out


def _accumulate_rows(windows: Windows, maps: FeatureMaps, bases: dict[str, np.ndarray], cfg: TwoStageConfig,
                     *, future_gram: bool) -> Statistics:
    """:func:`accumulate_statistics` chunk by chunk of rows (continuous data; discrete windows without keys)."""
    dtype = np.dtype(cfg.feature_dtype)
    U_o, U_h, U_f = bases["obs"], bases["past"], bases["future"]
    q_h, q_f, q_o = U_h.shape[1], U_f.shape[1], U_o.shape[1]
    HH, HF, HE = np.zeros((q_h, q_h)), np.zeros((q_h, q_f)), np.zeros((q_h, q_f * q_o))
    OO, FF, h_sum = np.zeros((q_o, q_o)), np.zeros((q_f, q_f)), np.zeros(q_h)
    for sl in progress(list(windows.chunks(cfg.chunk_size)), desc="2SR statistics"):
        h = _projected(maps, "past", windows.rows("past", sl), U_h, dtype)
        f = _projected(maps, "future", windows.rows("future", sl), U_f, dtype)
        s = _shifted_from_future(windows, sl, f, lambda x: _projected(maps, "shifted", x, U_f, dtype))
        o = _projected(maps, "obs", windows.rows("obs", sl), U_o, dtype)
        HH += h.T @ h
        HF += h.T @ f
        hs = (h[:, :, None] * s[:, None, :]).reshape(len(h), q_h * q_f)
        HE += (hs.T @ o).reshape(q_h, q_f * q_o)                     # Σ h (s ⊗ o)ᵀ, column i·q_o + j
        OO += o.T @ o
        h_sum += h.sum(0)
        if future_gram:
            FF += f.T @ f
    return Statistics(HH=HH, HF=HF, HE=HE, OO=OO, h_sum=h_sum, n=len(windows), FF=FF if future_gram else None)


def _shifted_from_future(windows: Windows, sl: slice, f: np.ndarray, of_windows) -> np.ndarray:
    """Per row of ``sl``, the value for its shifted window given ``f``, the values for the rows' future windows
    (projections, or positions in a table): s_t = f_{t+1} where row t+1 follows row t in the slice, else
    ``of_windows`` of the shifted window itself (:meth:`Windows.shift_breaks`)."""
    s = np.empty_like(f)
    s[:-1] = f[1:]
    breaks = windows.shift_breaks(sl)
    s[breaks] = of_windows(windows.rows("shifted", sl.start + breaks))
    return s


def _sign_fix(U: np.ndarray) -> np.ndarray:
    """Signs (±1 per column) that make the largest-magnitude entry of each column positive."""
    idx = np.argmax(np.abs(U), axis=0)
    signs = np.sign(U[idx, np.arange(U.shape[1])])
    signs[signs == 0] = 1
    return signs


def _fix_signs(U: np.ndarray) -> np.ndarray:
    """Make the largest-magnitude entry of each column positive, so results do not depend on LAPACK's sign."""
    return U * _sign_fix(U)


# ----------------------------------------------------------------------------------------------- regression


def _ridge_solve(gram: np.ndarray, rhs: np.ndarray, lam: float) -> np.ndarray:
    """(G + λI)⁻¹ R, stable for rank-deficient G (λ > 0) and falling back to lstsq when λ = 0."""
    import scipy.linalg   # here, not at the top: every stage imports this module to validate params.yaml

    A = gram + lam * np.eye(gram.shape[0])
    try:
        return scipy.linalg.solve(A, rhs, assume_a="pos")
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
        return np.linalg.lstsq(A, rhs, rcond=None)[0]


def apply_observation_inverse(W: np.ndarray, Coo: np.ndarray, obs_ridge: float) -> np.ndarray:
    """W ×₂ (C_oo + obs_ridge · tr(C_oo)/d_o · I)⁻¹: the observation mode multiplied by the regularised C_oo⁻¹.

    With ``obs_ridge`` 0 the pseudo-inverse: C_oo is singular whenever the observation projection has more
    directions than the data span (``obs_dim`` above the number of symbols), and its inverse would blow W up."""
    d_o = Coo.shape[0]
    if obs_ridge == 0:
        inverse = np.linalg.pinv(0.5 * (Coo + Coo.T), rcond=1e-10, hermitian=True)
    else:
        inverse = np.linalg.inv(Coo + obs_ridge * np.trace(Coo) / d_o * np.eye(d_o))
    return np.einsum("ijk,jl->ilk", W, inverse)


def _projected(maps: FeatureMaps, which: str, x: np.ndarray, U: np.ndarray, dtype: np.dtype) -> np.ndarray:
    phi, inverse, _ = maps.apply_unique(which, x, dtype)
    proj = (phi @ U.astype(dtype)).astype(np.float64)
    return proj if inverse is None else proj[inverse]


def two_stage_regression(
    trajectories: Sequence[np.ndarray],
    cfg: TwoStageConfig,
    *,
    discrete: bool,
    vocab_size: int = 0,
    maps: FeatureMaps | None = None,
) -> TwoStageLayer:
    """Learn one PSRNN layer by 2SR from raw ``trajectories`` (int symbols or (T, m) floats); see module doc.

    The layer is complete: its ``mean_state`` is the mean unnormalised update over the states filtered through
    ``trajectories`` (one filtering pass, :func:`filter_states`), as in :func:`multilayer_two_stage`."""
    layer = regress_layer(trajectories, cfg, discrete=discrete, vocab_size=vocab_size, maps=maps)
    _, layer.mean_state = filter_states(layer, trajectories, return_unnormalised_mean=True)
    return layer


def regress_layer(
    trajectories: Sequence[np.ndarray],
    cfg: TwoStageConfig,
    *,
    discrete: bool,
    vocab_size: int = 0,
    maps: FeatureMaps | None = None,
) -> TwoStageLayer:
    """The regressions of :func:`two_stage_regression` alone, with ``mean_state`` left at zero: for callers that
    filter the training data with the layer anyway (:func:`two_stage_depths` needs the states) and set the mean
    from that pass, and for ``benchmarks/bench_two_stage.py``, which times the regressions against the naive
    method's."""
    cfg.validate()
    windows = make_windows(trajectories, cfg.past_window, cfg.future_window, discrete=discrete,
                           vocab_size=vocab_size if discrete else None)
    n = len(windows)
    raw_dim = vocab_size if discrete else np.asarray(trajectories[0]).reshape(len(trajectories[0]), -1).shape[1]
    if maps is None:
        maps = fit_feature_maps(windows, n_features=cfg.n_features, obs_dim=raw_dim, vocab_size=vocab_size,
                                widths=cfg.widths, width_scale=cfg.width_scale, seed=cfg.seed)
    d, d_o, d_h = cfg.state_dim, cfg.obs_dim, cfg.past_dim
    proj, sv, st = top_projections(windows, maps, {"obs": d_o, "past": d_h, "future": d}, cfg)
    U_o, U_h, U_f = proj["obs"], proj["past"], proj["future"]
    HH, HF, HE, OO, h_sum = st.HH, st.HF, st.HE, st.OO, st.h_sum

    lam = cfg.ridge * n
    W_f = _ridge_solve(HH, HF, lam)            # stage 1: history -> future
    W_e = _ridge_solve(HH, HE, lam)            # stage 1: history -> extended future
    SS = W_f.T @ HH @ W_f                      # Σ f̂ f̂ᵀ
    SE = W_f.T @ HH @ W_e                      # Σ f̂ êᵀ
    M = _ridge_solve(SS, SE, lam)              # stage 2: E[future] -> E[extended future]
    W = M.reshape(d, d, d_o).transpose(1, 2, 0).copy()   # M[k, i·d_o + j] -> W[i, j, k]
    if cfg.obs_inverse:
        # The PSR update (Eq. 1) conditions on o_t through (Z ×₃ q_t)⁻¹ = C_{oo|h}⁻¹. The PSRNN replaces that
        # normaliser by the 2-norm; what the 2-norm cannot undo is the kernel smoothing of ω(o_t), since
        # W ×₂ ω(o_t) averages the joint E[s ⊗ ω] over every observation similar to o_t. Multiplying the
        # observation mode by the marginal C_oo⁻¹ undoes it: for discrete data with independent features,
        # W ×₂ C_oo⁻¹ω(o_t) = E[s | o_t, h] · p(o_t | h) / p(o_t), whose direction is exact. It is a fixed
        # linear map, so the model keeps the form of Eq. (5).
        W = apply_observation_inverse(W, OO / n, cfg.obs_ridge)
    q1 = W_f.T @ (h_sum / n)
    norm = np.linalg.norm(q1)
    q1 = q1 / norm if norm > 0 else np.full(d, 1.0 / np.sqrt(d))
    if not (np.all(np.isfinite(W)) and np.all(np.isfinite(q1))):
        raise FloatingPointError("2SR produced non-finite values; increase two_stage.ridge")
    layer = TwoStageLayer(W=W, q1=q1, mean_state=np.zeros(d), U_obs=U_o, U_past=U_h, U_future=U_f, maps=maps,
                          diagnostics={"n_windows": int(n), "lambda": float(lam),
                                       "singular_values": {k: v.tolist() for k, v in sv.items()},
                                       "widths": {k: getattr(maps, k).width for k in ("obs", "past", "future")}})
    return layer


# ------------------------------------------------------------------------------------------------ filtering


#: A state update of norm at most this is degenerate and gives q₁, as in the PSRNN cells (their ``eps``).
NORM_EPS = 1e-12
#: rows of a trajectory filter_states encodes at a time: TwoStageLayer.encode's chunk_size (a multiple of the
#: filter's 4096-row blocks of G_t), so that the encoding is the whole trajectory's, row for row
FILTER_ENCODE_ROWS = 8192


def filter_states(layer: TwoStageLayer, trajectories: Sequence[np.ndarray], *, bias: np.ndarray | None = None,
                  return_unnormalised_mean: bool = False):
    """Run q_{t+1} = (W ×₂ o_t ×₃ q_t + b)/‖·‖ from q₁ through each trajectory.

    Returns, per trajectory, the states *after* consuming each observation, shape (T, d): row t predicts o_{t+1}.
    With ``return_unnormalised_mean`` also the mean of W ×₂ o_t ×₃ q_t over all steps.
    """
    d = layer.state_dim
    b = np.zeros(d) if bias is None else bias
    W_o = layer.W.transpose(1, 0, 2).reshape(layer.obs_dim, d * d)  # G_t = (o_t @ W_o).reshape(d, d)
    out, z_sum, z_count = [], np.zeros(d), 0
    for traj in progress(trajectories, desc="2SR filter"):
        traj = np.asarray(traj)
        T = traj.shape[0]
        states = np.empty((T, d))
        q = layer.q1.copy()
        # encoded a block of FILTER_ENCODE_ROWS at a time (encode's own chunks, so the same numbers as encoding the
        # whole trajectory): a (T, d_o) encoding beside the states doubled the memory of long trajectories
        for e in range(0, T, FILTER_ENCODE_ROWS):
            enc = layer.encode(traj[e:e + FILTER_ENCODE_ROWS], chunk_size=FILTER_ENCODE_ROWS)
            for s in range(e, e + enc.shape[0], 4096):
                G = (enc[s - e:s - e + 4096] @ W_o).reshape(-1, d, d)
                for i in range(G.shape[0]):
                    z = G[i] @ q
                    z_sum += z
                    z = z + b
                    nz = np.sqrt(z @ z)
                    # the cells' threshold (their eps): the filter the decoder is fitted on is the model's own filter
                    q = layer.q1 if nz <= NORM_EPS else z / nz   # NaN propagates, as in the PSRNN cells
                    states[s + i] = q
        z_count += T
        out.append(states)
    if return_unnormalised_mean:
        return out, z_sum / max(z_count, 1)
    return out


def fit_decoder(states: Sequence[np.ndarray], trajectories: Sequence[np.ndarray], *, discrete: bool,
                vocab_size: int = 0, ridge: float = 1e-4, max_iter: int = 300, change: bool = False,
                start: Decoder | None = None) -> Decoder:
    """Regress o_{t+1} on the state after o_t: softmax regression (discrete) or ridge regression (continuous).
    With ``change`` (continuous only), regress the change o_{t+1} - o_t instead: the decoder of a model that
    predicts ô_{t+1} = o_t + decoder(q) (``ModelConfig.delta``). ``start``: a decoder of the same shape to start
    the softmax regression from instead of the unigram model (the objective is strictly convex, so the optimum
    is the same; a decoder of nearby states is ~3× fewer L-BFGS iterations from it on PTB, 29 against 103).

    Softmax: L-BFGS-B on :func:`softmax_objective` from the unigram model (W = 0, b = log-frequencies), with BLAS
    at one thread. numpy and scipy each load their own OpenBLAS (pip wheels), and L-BFGS-B's products on the
    (V·d)-long vectors are just large enough for scipy's to wake its threads, which then spin for a while after
    every iteration on the cores that numpy's BLAS and exp need: on 2 cores each objective call took 2× as long
    as alone (PTB: ~50 ms against ~25 ms). The objective's products are too small to gain much from threads.
    Measured again for large vocabularies (n = 160k, d = 20, 2 cores shared with other work), seconds per objective
    call at V = 44 / 500 / 2000 with one thread: 0.023 / 0.22 / 0.93. Both BLAS at 2 threads: on a quiet machine
    (load ~1) 0.025 / 0.216 / 0.75 (1.1× slower, even, 1.2× faster), under load (~2-4) 3.4-5.7× slower; numpy's
    alone at 2 (scipy's at 1): no faster in either case. A crossover near V ~ 1000 pays at most ~20% and only on
    idle cores, and costs 3× or more on busy ones, so the pin holds at every V (and results stay those of one
    thread). A fit estimated (:func:`decoder_seconds`) to take minutes is warned of up front, and its
    L-BFGS iterations show as a progress bar (on a terminal).
    """
    import scipy.optimize

    if discrete and change:
        raise ValueError("fit_decoder: change=True regresses o_{t+1} - o_t, which continuous data have only")
    if discrete:
        # the objective's [X 1]ᵀ filled from the states directly: X = concatenate(states[:-1]) beside it held the
        # training states twice (3.2M steps of d = 20: 0.5 GB more)
        XaT = _augmented_transpose([s[:-1] for s in states])
        n, d = XaT.shape[1], XaT.shape[0] - 1
        y = np.concatenate([np.asarray(t)[1:] for t in trajectories]).astype(np.int64)
        V = vocab_size
        counts = np.bincount(y, minlength=V).astype(np.float64)
        b0 = np.log((counts + 1.0) / (counts.sum() + V))  # start from the unigram model
        theta0 = np.concatenate([np.zeros(V * d), b0])
        if start is not None and np.shape(start.weight) == (V, d) and np.shape(start.bias) == (V,):
            theta0 = np.concatenate([np.ravel(start.weight), start.bias]).astype(np.float64)
        estimate = decoder_seconds(n, V, d, max_iter)
        if estimate >= DECODER_WARN_SECONDS:
            warnings.warn(f"fit_decoder: the softmax decoder of {V} symbols on {n} training states of size {d} may "
                          f"take up to ~{estimate / 60:.0f} min ({max_iter} L-BFGS iterations of O(n·V·d) each); "
                          f"fewer symbols (rare ones merged into one in the data), fewer or shorter training "
                          f"trajectories, or a smaller <dataset>.two_stage.state_dim make it shorter", stacklevel=2)
        elif estimate >= DECODER_LOG_SECONDS:
            log.info("2SR decoder: %d symbols, %d states of size %d, up to ~%.0f s", V, n, d, estimate)
        with _single_threaded_blas(), progress(total=max_iter, desc=f"2SR decoder (V={V})") as bar:
            res = scipy.optimize.minimize(_softmax_objective(XaT, y, V, ridge), theta0, jac=True, method="L-BFGS-B",
                                          options={"maxiter": max_iter}, callback=lambda _: bar.update())
        return Decoder(weight=res.x[: V * d].reshape(V, d), bias=res.x[V * d:], kind="discrete")
    X = np.concatenate([s[:-1] for s in states], axis=0)
    n, d = X.shape
    flat = [np.asarray(t).reshape(len(t), -1) for t in trajectories]
    Y = np.concatenate([t[1:] - t[:-1] if change else t[1:] for t in flat], axis=0)
    x_mean, y_mean = X.mean(0), Y.mean(0)
    # centred in place (the same subtraction, in the dtype X - x_mean has; X and Y are fresh concatenations): no
    # second copy of either
    X, Y = X.astype(np.result_type(X, x_mean), copy=False), Y.astype(np.result_type(Y, y_mean), copy=False)
    X -= x_mean
    Y -= y_mean
    Xc, Yc = X, Y
    Wt = _ridge_solve(Xc.T @ Xc, Xc.T @ Yc, ridge * n).T
    return Decoder(weight=Wt, bias=y_mean - Wt @ x_mean, kind="continuous")


#: Seconds per multiply-add of one softmax objective call, n·V·(d+1) of them (measured on 2 shared cores at
#: n = 160k, d = 20: 0.024 s per call at V = 44, 0.24 s at V = 500, 2.6 s at V = 5000, i.e. 1.4-1.6e-10).
DECODER_SECONDS_PER_MAC = 1.6e-10
#: fit_decoder warns when its estimated worst case (max_iter calls) is at least this, and logs it from
#: DECODER_LOG_SECONDS on (PTB's decoder, V = 44 on ~120k states, is ~5 s at worst and ~2 s in practice).
DECODER_WARN_SECONDS = 300.0
DECODER_LOG_SECONDS = 30.0


def decoder_seconds(n: int, V: int, d: int, iterations: int) -> float:
    """The estimated time of a softmax decoder fit of ``iterations`` objective calls (an upper bound at
    ``max_iter``: L-BFGS-B makes about one call per iteration and PTB's fit stops after ~100 of 300)."""
    return DECODER_SECONDS_PER_MAC * float(n) * V * (d + 1) * iterations


def _single_threaded_blas():
    """A context with every loaded BLAS (numpy's and scipy's OpenBLAS alike) at one thread."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def softmax_objective(X: np.ndarray, y: np.ndarray, V: int, lam: float):
    """The objective of the softmax decoder and its gradient, as one function of θ = [vec(W); b] (W: V × d,
    row-major) for ``scipy.optimize.minimize(..., jac=True)``:

        L(θ) = (1/n) Σ_t [log Σ_v exp(w_vᵀx_t + b_v) − w_{y_t}ᵀx_t − b_{y_t}] + ½λ‖W‖²   (b unregularised),
        ∇_[W b] L = (1/n) Σ_t (p_t − e_{y_t}) [x_tᵀ 1] + λ[W 0],   p_t = softmax(W x_t + b).

    How it is computed, L-BFGS calling it ~90 times per fit (PTB: n = 120k states, V = 44; ~2.5× faster than
    the (n × V) version it replaces, float64 throughout since L-BFGS's tolerance needs the loss to ~1e-15):

    * the label terms are linear in θ: S = Σ_t e_{y_t}[x_tᵀ 1] (V × (d+1)) is summed once, so no call gathers
      the labels' logits or scatters a one-hot;
    * the logits are transposed, Z = [W b][X 1]ᵀ (V × n): the log-sum-exp reduces over axis 0, elementwise over
      V rows of contiguous values, which numpy vectorises (along rows of V = 44, the (n × V) layout, it ran
      ~2.5× slower);
    * p_t/n is never formed: the gradient is E [X 1] diag(1/(n·Σ_v E_vt)) with E = exp(Z − max_v Z), the
      scaling applied to the (d+1)-row [X 1]ᵀ rather than to the V-row E;
    * the data are taken in blocks of columns whose E fits in a core's cache (2 MB), so no V × n array exists
      (it would be 0.7 GB on 16× PTB) and each block's E is read back from cache (~15% faster than whole).
    """
    return _softmax_objective(_augmented_transpose([np.asarray(X, dtype=np.float64)]), y, V, lam)


def _augmented_transpose(parts: Sequence[np.ndarray]) -> np.ndarray:
    """[X 1]ᵀ, (d + 1) × n float64, of X = the row-wise concatenation of ``parts`` (each (n_i, d)), filled part
    by part (no X is formed)."""
    parts = [np.asarray(p) for p in parts]
    d = parts[0].shape[1]
    XaT = np.empty((d + 1, sum(p.shape[0] for p in parts)))
    col = 0
    for p in parts:
        XaT[:d, col:col + p.shape[0]] = p.T
        col += p.shape[0]
    XaT[d] = 1.0
    return XaT


def _softmax_objective(XaT: np.ndarray, y: np.ndarray, V: int, lam: float):
    """:func:`softmax_objective` of the data given as ``XaT`` = [X 1]ᵀ ((d + 1) × n float64)."""
    y = np.asarray(y, dtype=np.int64)
    d, n = XaT.shape[0] - 1, XaT.shape[1]
    S = np.stack([np.bincount(y, weights=row, minlength=V) for row in XaT], axis=1)   # Σ_t e_{y_t} [x_tᵀ 1]
    block = max(64, (1 << 18) // max(V, 1))   # columns of a block: its E is 2**18 float64s, 2 MB
    E_buf, scaled_buf = np.empty((V, block)), np.empty((d + 1, block))
    col_max, total = np.empty(n), np.empty(n)
    ones = np.ones(V)

    def loss_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        Wb = np.empty((V, d + 1))
        Wb[:, :d] = theta[: V * d].reshape(V, d)
        Wb[:, d] = theta[V * d:]
        G = np.zeros((V, d + 1))               # (1/n) Σ_t p_t [x_tᵀ 1]
        for c0 in range(0, n, block):
            c1 = min(c0 + block, n)
            E, scaled, m, tot = E_buf[:, :c1 - c0], scaled_buf[:, :c1 - c0], col_max[c0:c1], total[c0:c1]
            np.matmul(Wb, XaT[:, c0:c1], out=E)
            np.max(E, axis=0, out=m)            # shifted, so that exp cannot overflow and Σ_v ≥ 1
            np.subtract(E, m, out=E)
            np.exp(E, out=E)
            np.matmul(ones, E, out=tot)
            np.multiply(XaT[:, c0:c1], 1.0 / (n * tot), out=scaled)
            G += E @ scaled.T
        W = Wb[:, :d]
        loss = (np.log(total).sum() + col_max.sum() - float((Wb * S).sum())) / n + 0.5 * lam * float((W * W).sum())
        G -= S / n
        G[:, :d] += lam * W
        return float(loss), np.concatenate([G[:, :d].ravel(), G[:, d]])

    return loss_grad


@dataclass
class TwoStageModel:
    """A multilayer 2SR initialisation: one :class:`TwoStageLayer` per layer, the decoder of the top layer and,
    for 2 or more layers, the ``skip_decoder`` that reads every layer's state [q⁽¹⁾; …; q⁽ᴸ⁾] (the PSRNN's
    ``decoder_input="all"``). For continuous data also ``delta_decoder`` and ``skip_delta_decoder``, the same
    regressions of the change o_{t+1} - o_t (the ``_delta`` variants, ``ModelConfig.delta``)."""

    layers: list[TwoStageLayer]
    decoder: Decoder
    discrete: bool
    vocab_size: int
    config: dict[str, Any]
    skip_decoder: Decoder | None = None
    delta_decoder: Decoder | None = None
    skip_delta_decoder: Decoder | None = None

    def decoder_for(self, *, every_layer: bool, delta: bool) -> Decoder:
        """The decoder of a PSRNN that reads the top layer (or, ``every_layer``, all of them) and predicts the
        next observation (or, ``delta``, its change); a ValueError names what this model lacks."""
        name = ("skip_" if every_layer and len(self.layers) > 1 else "") + ("delta_" if delta else "") + "decoder"
        decoder = getattr(self, name)
        if decoder is None:
            why = ("the change o_{t+1} - o_t is regressed for continuous data only" if delta and self.discrete else
                   "two_stage_depths / multilayer_two_stage fit it, but this model was saved by an older version")
            raise ValueError(f"the 2SR model has no {name}: {why}")
        return decoder

    def to_arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for i, layer in enumerate(self.layers):
            out.update(layer.to_arrays(prefix=f"L{i + 1}_"))
        out["decoder_weight"] = self.decoder.weight
        out["decoder_bias"] = self.decoder.bias
        for name in ("skip_decoder", "delta_decoder", "skip_delta_decoder"):
            decoder = getattr(self, name)
            if decoder is not None:
                out[f"{name}_weight"] = decoder.weight
                out[f"{name}_bias"] = decoder.bias
        return out

    def meta(self) -> dict[str, Any]:
        return {"n_layers": len(self.layers), "discrete": self.discrete, "vocab_size": self.vocab_size,
                "decoder_kind": self.decoder.kind, "config": self.config,
                "diagnostics": [layer.diagnostics for layer in self.layers]}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> "TwoStageModel":
        layers = [TwoStageLayer.from_arrays(arrays, prefix=f"L{i + 1}_", diagnostics=meta["diagnostics"][i])
                  for i in range(meta["n_layers"])]
        decoders = {name: Decoder(weight=arrays[f"{name}_weight"], bias=arrays[f"{name}_bias"],
                                  kind=meta["decoder_kind"])
                    for name in ("decoder", "skip_decoder", "delta_decoder", "skip_delta_decoder")
                    if f"{name}_weight" in arrays}
        return cls(layers=layers, discrete=meta["discrete"], vocab_size=meta["vocab_size"], config=meta["config"],
                   **decoders)


def multilayer_two_stage(
    trajectories: Sequence[np.ndarray],
    cfg: TwoStageConfig,
    *,
    n_layers: int = 1,
    discrete: bool,
    vocab_size: int = 0,
    maps: FeatureMaps | None = None,
) -> TwoStageModel:
    """2SR for an ``n_layers`` PSRNN (Sec. 4.2): layer l+1 is learned from the states filtered by layer l.

    ``maps`` optionally fixes layer 1's RFF maps (from the features stage); layers ≥ 2 are configured by
    :func:`upper_layer_config` (``cfg`` with median widths of their own inputs, a seed of their own and the
    ``upper_*`` fields).
    """
    *_, last = two_stage_depths(trajectories, cfg, n_layers=n_layers, discrete=discrete, vocab_size=vocab_size,
                                maps=maps)
    return last


#: the TwoStageConfig fields that only layers >= 2 read
UPPER_LAYER_FIELDS = ("upper_past_window", "upper_future_window", "upper_obs_ridge")


def depth_config(cfg: TwoStageConfig, n_layers: int) -> dict[str, Any]:
    """``cfg`` as the record of a 2SR of ``n_layers`` layers: at depth 1 without the upper layers' fields, which it
    does not read (a change of them leaves ``L1.npz`` and a 1-layer run's MLflow params as they are)."""
    config = asdict(cfg)
    if n_layers == 1:
        config = {k: v for k, v in config.items() if k not in UPPER_LAYER_FIELDS}
    return config


def upper_layer_config(cfg: TwoStageConfig, level: int) -> TwoStageConfig:
    """The 2SR config of layer ``level`` (0-based, >= 1): ``cfg`` with median widths of its own inputs, its own
    seed (:func:`pipeline.features.layer_seed`), the windows ``upper_past_window`` / ``upper_future_window`` and
    the observation inverse's ridge ``upper_obs_ridge`` (None: layer 1's)."""
    past, future = cfg.upper_windows
    return TwoStageConfig(**{**asdict(cfg), "widths": None, "seed": layer_seed(cfg.seed, level),
                             "past_window": past, "future_window": future,
                             "obs_ridge": cfg.obs_ridge if cfg.upper_obs_ridge is None else cfg.upper_obs_ridge})


def two_stage_depths(
    trajectories: Sequence[np.ndarray],
    cfg: TwoStageConfig,
    *,
    n_layers: int,
    discrete: bool,
    vocab_size: int = 0,
    maps: FeatureMaps | None = None,
) -> Iterator[TwoStageModel]:
    """The 2SR models of depth 1, 2, …, ``n_layers``, in order (arguments as :func:`multilayer_two_stage`).

    Layer l of every depth is the same regression on the same inputs, so each layer is learned once and the
    models differ only in their depth and in the decoders: ``decoder`` reads the top layer's states and, from
    depth 2 on, ``skip_decoder`` the states of every layer side by side; the depth-d model equals
    ``multilayer_two_stage(..., n_layers=d)`` exactly."""
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    layers: list[TwoStageLayer] = []
    every: list[Sequence[np.ndarray]] = []   # the filtered states of each layer so far
    inputs: Sequence[np.ndarray] = trajectories
    for level in range(n_layers):
        is_first = level == 0
        lcfg = cfg if is_first else upper_layer_config(cfg, level)
        layer = regress_layer(inputs, lcfg, discrete=discrete and is_first,
                               vocab_size=vocab_size if is_first else 0, maps=maps if is_first else None)
        states, mean_z = filter_states(layer, inputs, return_unnormalised_mean=True)
        layer.mean_state = mean_z
        layers.append(layer)
        log.info("2SR layer %d: %d windows, λ=%.3g", level + 1, layer.diagnostics["n_windows"],
                 layer.diagnostics["lambda"])
        inputs = states
        every.append(states)
        joined = [np.concatenate(parts, axis=1) for parts in zip(*every)] if len(every) > 1 else None
        decoders = {}
        for change in (False, True) if not discrete else (False,):
            prefix = "delta_" if change else ""
            decoders[f"{prefix}decoder"] = fit_decoder(inputs, trajectories, discrete=discrete,
                                                       vocab_size=vocab_size, ridge=cfg.decoder_ridge, change=change)
            if joined is not None:
                decoders[f"skip_{prefix}decoder"] = fit_decoder(joined, trajectories, discrete=discrete,
                                                                vocab_size=vocab_size, ridge=cfg.decoder_ridge,
                                                                change=change)
        yield TwoStageModel(layers=list(layers), discrete=discrete, vocab_size=vocab_size,
                            config=depth_config(cfg, len(layers)), **decoders)


# ------------------------------------------------------------------------------------- linear 2SR (Kalman)


@dataclass
class LinearStateSpace:
    """x_{t+1} = A x_t + w_t,  o_t = C x_t + v_t + μ,  [w; v] ~ N(0, [[Q, M], [Mᵀ, R]]),  x_0 ~ N(x0, P0)."""

    A: np.ndarray
    C: np.ndarray
    Q: np.ndarray
    R: np.ndarray
    M: np.ndarray
    x0: np.ndarray
    P0: np.ndarray
    mean: np.ndarray
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in ("A", "C", "Q", "R", "M", "x0", "P0", "mean")}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "LinearStateSpace":
        return cls(**{k: arrays[k] for k in ("A", "C", "Q", "R", "M", "x0", "P0", "mean")})


@dataclass
class LinearStageOne:
    """Stage 1 of the linear 2SR: the windows of the centred data, the states x̂_t = Uᵀ E[f_t | h_t] and the
    shifted states Uᵀ E[s_t | h_t], the singular values of E[f | h], the data mean μ, and ``consecutive``: the
    window indices t whose window t + 1 is the next step of the same trajectory (for the residuals)."""

    windows: Windows
    states: np.ndarray
    shifted_states: np.ndarray
    singular_values: np.ndarray
    mean: np.ndarray
    consecutive: np.ndarray


#: rows of windows per chunk of the streamed linear 2SR: a chunk's past, future and shifted windows take at most
#: about this many bytes in float64 (at least 256 rows)
LINEAR_CHUNK_BYTES = 32 * 2 ** 20


def consecutive_windows(windows: Windows) -> np.ndarray:
    """The window indices t whose window t + 1 is the next step of the same trajectory."""
    traj_id, t_idx = windows.times[:, 0], windows.times[:, 1]
    return np.flatnonzero((traj_id[1:] == traj_id[:-1]) & (t_idx[1:] == t_idx[:-1] + 1))


def linear_stage_one(trajs: Sequence[np.ndarray], *, state_dim: int, past_window: int, future_window: int,
                     ridge: float) -> LinearStageOne:
    """Stage 1 of :func:`linear_two_stage` (also what ``benchmarks/ablate_init.py`` compares stage-2 choices on).

    Streamed: with H, F and S the n × p past, n × f future and n × f shifted windows (never held whole), only
    HᵀH, HᵀF and HᵀS are accumulated, chunk by chunk. Stage 1 is F̂ = H B_F, Ŝ = H B_S with
    B = (HᵀH + λI)⁻¹ HᵀF (resp. HᵀS). The top right singular vectors of F̂ are those of R B_F for any R with
    RᵀR = HᵀH (F̂ᵀF̂ = B_Fᵀ HᵀH B_F), here R = Λ^½Vᵀ from HᵀH = VΛVᵀ: a p × f SVD with F̂'s singular values, not
    an n × f one. The states x̂ = F̂U = H (B_F U) and Ŝ U are then formed chunk by chunk, n × state_dim each.
    Memory is O(n·(state_dim + m) + chunk·(p + 2f) + (p + f)²) instead of five n × (p or f) matrices (on 10⁶ steps
    of 30 dimensions with windows of 10: ~0.5 GB instead of ~12 GB)."""
    mu = sum(t.sum(0) for t in trajs) / sum(len(t) for t in trajs)   # not a concatenated copy of the data
    win = make_windows([t - mu for t in trajs], past_window, future_window, discrete=False)
    m = trajs[0].shape[1]
    if state_dim > future_window * m:
        raise ValueError(f"kf state_dim={state_dim} exceeds future_window·obs_dim={future_window * m}")
    if state_dim > len(win):   # the states are the top directions of the windows
        raise ValueError(f"kf state_dim={state_dim} exceeds the {len(win)} windows of past_window + "
                         f"future_window = {past_window} + {future_window} in the training trajectories; expected "
                         "at most that, or smaller windows or more training data")
    p, f = past_window * m, future_window * m
    rows = max(256, LINEAR_CHUNK_BYTES // (8 * (p + 2 * f)))
    HH, HF, HS = np.zeros((p, p)), np.zeros((p, f)), np.zeros((p, f))
    for sl in win.chunks(rows):
        h = win.rows("past", sl)
        HH += h.T @ h
        HF += h.T @ win.rows("future", sl)
        HS += h.T @ win.rows("shifted", sl)
    lam = ridge * np.trace(HH) / p
    B_F, B_S = _ridge_solve(HH, HF, lam), _ridge_solve(HH, HS, lam)
    evals, evecs = np.linalg.eigh(0.5 * (HH + HH.T))
    root = np.sqrt(np.clip(evals, 0.0, None))[:, None] * evecs.T   # rootᵀroot = HᵀH
    # full: a state_dim above p (F̂ has rank <= p) takes directions of F̂'s null space, as an n × f SVD gives them
    _, sv, Vt = np.linalg.svd(root @ B_F, full_matrices=True)
    U = _fix_signs(Vt[:state_dim].T)
    to_states, to_shifted = B_F @ U, B_S @ U
    X, Xs = np.empty((len(win), state_dim)), np.empty((len(win), state_dim))
    for sl in win.chunks(rows):
        h = win.rows("past", sl)
        X[sl], Xs[sl] = h @ to_states, h @ to_shifted
    consecutive = consecutive_windows(win)
    if len(consecutive) == 0:
        raise ValueError("kf: no two consecutive windows in one trajectory; expected trajectories longer than "
                         f"past_window + future_window = {past_window + future_window}")
    return LinearStageOne(windows=win, states=X, shifted_states=Xs, singular_values=sv[:min(len(win), f)], mean=mu,
                          consecutive=consecutive)


def linear_two_stage(trajectories: Sequence[np.ndarray], *, state_dim: int, past_window: int = 10,
                     future_window: int = 10, ridge: float = 1e-3) -> LinearStateSpace:
    """Subspace identification of a Kalman filter by 2SR on linear features (Hefny et al. 2015, Sec. 5).

    With h_t, f_t, s_t the stacked past, future and shifted-future windows of the centred data:
    stage 1 gives f̂_t = E[f_t | h_t] and ŝ_t = E[s_t | h_t]; the state is x̂_t = Uᵀf̂_t with U the top
    ``state_dim`` singular directions of f̂. Stage 2 regresses Uᵀŝ_t on x̂_t (an instrumental regression, so
    noise in x̂ does not bias it) for A, and o_t on x̂_t for C, both ridge-regularised with ``ridge`` × the mean
    eigenvalue of the regressors' Gram matrix, as stage 1. The noise covariance Σ = [[Q, M], [Mᵀ, R]] is that of
    the joint residuals [x̂_{t+1} − A x̂_t; o_t − C x̂_t] of consecutive windows of one trajectory (the stochastic
    part of N4SID, Van Overschee & De Moor 1994), so the filter finds its own gain by the Riccati recursion.

    Why not less: with a stage-2 ridge of 10⁻⁸ and the innovations form (gain regressed on the residuals,
    Q = K S Kᵀ, M = K S, R = S), a state larger than the system's order fits its weakly excited directions almost
    unregularised: A and the filter A − KC came out unstable (spectral radius 1.05–7 on lgssm at 12–16 states
    for a 4-state system, 1.4–1.7 on Swimmer) and the one-step MSE over 40× the optimum. The Riccati gain of a
    full-rank Σ keeps the filter stable whatever A is; tests/test_kalman.py holds it to the true filter.
    """
    if state_dim < 1:
        raise ValueError(f"kf state_dim must be >= 1, got {state_dim}")
    trajs = [np.asarray(t, dtype=np.float64).reshape(len(t), -1) for t in trajectories]
    return linear_stage_two(linear_stage_one(trajs, state_dim=state_dim, past_window=past_window,
                                             future_window=future_window, ridge=ridge), ridge=ridge)


def linear_stage_two(stage1: LinearStageOne, *, ridge: float) -> LinearStateSpace:
    """Stage 2 of :func:`linear_two_stage` (see there), from stage 1's states. The observations and the residuals
    are formed a chunk at a time (XᵀO and Σ accumulated), so memory adds O(chunk · (state_dim + obs_dim)) to the
    states stage 1 holds."""
    win, X, Xs = stage1.windows, stage1.states, stage1.shifted_states
    state_dim, m = X.shape[1], stage1.mean.shape[0]
    rows = max(256, LINEAR_CHUNK_BYTES // (8 * (3 * state_dim + 2 * m)))
    XO = np.zeros((state_dim, m))
    for sl in win.chunks(rows):
        XO += X[sl].T @ win.rows("obs", sl)
    XX = X.T @ X
    lam2 = ridge * np.trace(XX) / state_dim
    A = _ridge_solve(XX, X.T @ Xs, lam2).T
    C = _ridge_solve(XX, XO, lam2).T
    nxt = stage1.consecutive   # process and observation residuals, from consecutive states of one trajectory
    sigma = np.zeros((state_dim + m, state_dim + m))
    for start in range(0, len(nxt), rows):
        at = nxt[start:start + rows]
        residuals = np.concatenate([X[at + 1] - X[at] @ A.T, win.rows("obs", at) - X[at] @ C.T], axis=1)
        sigma += residuals.T @ residuals
    sigma /= len(nxt)
    Q, M, R = sigma[:state_dim, :state_dim], sigma[:state_dim, state_dim:], sigma[state_dim:, state_dim:]
    x0 = X.mean(0)
    P0 = np.cov(X.T).reshape(state_dim, state_dim)
    return LinearStateSpace(A=A, C=C, Q=Q, R=R, M=M, x0=x0, P0=P0, mean=stage1.mean,
                            diagnostics={"n_windows": len(win),
                                         "singular_values": stage1.singular_values[: 2 * state_dim].tolist(),
                                         "spectral_radius_A": float(np.max(np.abs(np.linalg.eigvals(A))))})
