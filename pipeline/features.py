"""Random Fourier features and the past / future / observation windows of Sec. 3.1.

The kernel is Gaussian, k(x, y) = exp(-‖x - y‖² / (2σ²)), approximated (Rahimi & Recht, 2008) by

    z(x) = sqrt(2 / D) · cos(Ωᵀ x + β),   Ω_ij ~ N(0, σ⁻²),  β_i ~ U[0, 2π),   Ω of shape (input_dim, D),

so that z(x)ᵀ z(y) ≈ k(x, y). The width σ is the median pairwise distance of the data (on a seeded subsample).
Each random source of a run (the subsample and the map of each family, the range finder of the projections, the
seed of an upper layer) draws from its own stream of (run seed, source, index): :func:`seed_sequence`.

Windows are cut per trajectory, so no window ever spans two trajectories. For a trajectory o_0 … o_{T-1}, a past
window length p and a future window length k, the usable times are t = p … T-k-1 and

    history  h_t = (o_{t-p}, …, o_{t-1})      (features η_t)
    future   f_t = (o_t, …, o_{t+k-1})        (features φ_t)
    shifted  s_t = (o_{t+1}, …, o_{t+k})      (features φ_{t+1}, same map as the future)
    obs      o_t                              (features ω_t)

Discrete observations enter as one-hot vectors. They are never materialised: a window of one-hot symbols is
represented by its integer indices (offset per position), and Ω x becomes a sum of gathered columns of Ω.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from pipeline.train_config import check_seed


#: The random sources of one layer's 2SR, each with its own stream :func:`seed_sequence` (seed, source, index):
#: the median subsample and the RFF map of feature family k (obs, past, future), the range finder of the
#: projections, and the run seed of layer l >= 2. Offsets added to the seed (seed + 1000(k+1) for the maps,
#: before) made the runs of seeds 1000 apart share maps: seed s+1000's past map was seed s's future map.
MEDIAN_SAMPLE, RFF_MAP, RANGE_FINDER, UPPER_LAYER = 1, 2, 3, 4


def seed_sequence(seed: int, source: int, index: int = 0) -> np.random.SeedSequence:
    """The stream of one random source of a run of seed ``seed`` (an integer, 0 <= seed < 2**32): numpy's
    ``SeedSequence(seed, spawn_key=(source, index))``, so distinct (seed, source, index) give statistically
    independent streams: neither two sources of a run nor two runs' sources share draws. (An entropy list
    [seed, source, index] would not do: numpy splits a seed of 2**32 or more into two words, so [a + 2**33, 1, 0]
    was [a, 2, 1].)"""
    check_seed(seed)   # 1.7 and True are no seeds
    return np.random.SeedSequence(int(seed), spawn_key=(source, index))


def layer_seed(seed: int, level: int) -> int:
    """The run seed of layer ``level`` (0-based, >= 1) of a multilayer 2SR of seed ``seed``: an integer below
    2**32 drawn from its own stream (its layer's sources then derive from it as layer 1's from ``seed``)."""
    return int(seed_sequence(seed, UPPER_LAYER, level).generate_state(1)[0])


def median_pairwise_distance(x: np.ndarray, *, max_points: int = 1000,
                             seed: int | np.random.SeedSequence = 0) -> float:
    """Median Euclidean distance between distinct rows of ``x`` (a seeded subsample of ``max_points`` rows)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"median pairwise distance needs at least 2 points, got {n}")
    if n > max_points:
        x = x[np.random.default_rng(seed).choice(n, size=max_points, replace=False)]
    # distances do not change by a shift; centring keeps ‖x‖² + ‖y‖² − 2xᵀy exact for data far from the origin
    x = x - x.mean(0)
    sq = np.einsum("ij,ij->i", x, x)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    iu = np.triu_indices(x.shape[0], k=1)
    dist = np.sqrt(np.maximum(d2[iu], 0.0))
    med = float(np.median(dist))
    if not np.isfinite(med) or med <= 0.0:
        # Constant data (or mostly duplicated points): fall back to the mean distance, then to 1.
        positive = dist[dist > 0]
        med = float(positive.mean()) if positive.size else 1.0
    return med


def one_hot_window_distance_sample(
    windows: np.ndarray, vocab_size: int, *, max_points: int = 1000, seed: int = 0
) -> float:
    """Median pairwise distance of one-hot windows given as symbol indices, without building the one-hots.

    Two one-hot windows whose symbols differ at m positions are sqrt(2m) apart (each differing position adds 2
    to the squared distance).
    """
    windows = np.asarray(windows)
    n = windows.shape[0]
    if n < 2:
        raise ValueError(f"median pairwise distance needs at least 2 points, got {n}")
    if n > max_points:
        windows = windows[np.random.default_rng(seed).choice(n, size=max_points, replace=False)]
    diff = (windows[:, None, :] != windows[None, :, :]).sum(-1)
    iu = np.triu_indices(windows.shape[0], k=1)
    med = float(np.median(np.sqrt(2.0 * diff[iu])))
    return med if med > 0 else float(np.sqrt(2.0))


#: the smallest kernel width: the RFF frequencies (standard deviation 1/width) are cast to float32, where beyond
#: ~3e38 they overflow to inf and every feature is NaN (1/1e-30 times a normal draw stays far below)
MIN_KERNEL_WIDTH = 1e-30


@dataclass
class RandomFourierFeatures:
    """A fixed random feature map z(x) = sqrt(2/D) cos(Ωᵀx + β) for a Gaussian kernel of width σ.

    ``frequencies`` is Ω with shape (input_dim, D) (already divided by σ); ``offsets`` is β with shape (D,).
    """

    frequencies: np.ndarray
    offsets: np.ndarray
    width: float

    @classmethod
    def create(cls, input_dim: int, n_features: int, width: float,
               seed: int | np.random.SeedSequence) -> "RandomFourierFeatures":
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        if not np.isfinite(width) or width < MIN_KERNEL_WIDTH:
            raise ValueError(f"kernel width {width:g}: expected a finite number >= {MIN_KERNEL_WIDTH:g} (the "
                             "frequencies 1/width must fit the float32 features; for median widths, a larger "
                             "two_stage.width_scale)")
        rng = np.random.default_rng(seed)
        omega = rng.standard_normal((input_dim, n_features)) / width
        beta = rng.uniform(0.0, 2.0 * np.pi, size=n_features)
        return cls(frequencies=omega, offsets=beta, width=float(width))

    @property
    def n_features(self) -> int:
        return self.offsets.shape[0]

    @property
    def input_dim(self) -> int:
        return self.frequencies.shape[0]

    def transform(self, x: np.ndarray, dtype: np.dtype = np.float64) -> np.ndarray:
        """Features of dense inputs ``x`` of shape (n, input_dim)."""
        x = np.asarray(x, dtype=np.float64)
        proj = x @ self.frequencies
        return self._finish(proj, dtype)

    def transform_indices(self, idx: np.ndarray, dtype: np.dtype = np.float64) -> np.ndarray:
        """Features of one-hot inputs given as the column index of each active entry, shape (n, n_active).

        Equal to ``transform(one_hot)`` where one_hot has a 1 at each listed column.
        """
        idx = np.asarray(idx)
        if idx.ndim == 1:
            idx = idx[:, None]
        import scipy.sparse   # here, not at the top: every stage imports this module to validate params.yaml

        freq = self._frequencies_as(dtype)
        n, k = idx.shape
        # the one-hot rows as a sparse matrix times Ω: each output row is written once (k gathered adds of
        # n × D arrays would stream the output through memory k times, ~3× slower)
        one_hot = scipy.sparse.csr_matrix((np.ones(n * k, dtype=freq.dtype), idx.reshape(-1),
                                           np.arange(0, n * k + 1, k)), shape=(n, freq.shape[0]))
        proj = np.asarray(one_hot @ freq)
        return self._finish(proj, dtype)

    def _frequencies_as(self, dtype: np.dtype) -> np.ndarray:
        cache = self.__dict__.setdefault("_cast", {})
        key = np.dtype(dtype).str
        if key not in cache:
            cache[key] = self.frequencies.astype(dtype)
        return cache[key]

    def _finish(self, proj: np.ndarray, dtype: np.dtype) -> np.ndarray:
        # cos dominates the cost; numpy vectorises it far better in float32, which is accurate enough for RFF.
        proj = proj.astype(dtype, copy=False)
        proj += self.offsets.astype(dtype, copy=False)
        np.cos(proj, out=proj)
        proj *= np.asarray(np.sqrt(2.0 / self.n_features), dtype=dtype)
        return proj

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}_frequencies": self.frequencies, f"{prefix}_offsets": self.offsets,
                f"{prefix}_width": np.array(self.width)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str) -> "RandomFourierFeatures":
        return cls(frequencies=arrays[f"{prefix}_frequencies"], offsets=arrays[f"{prefix}_offsets"],
                   width=float(arrays[f"{prefix}_width"]))


class Windows:
    """Past / future / shifted-future / observation windows of a set of trajectories, in raw space.

    Only the trajectories and the (trajectory, t) index of each row are held; a window array is built on demand
    for a slice or an index array of rows (:meth:`rows`), so streaming 2SR never holds more than a chunk of them.
    The properties ``past``, ``future``, ``shifted`` and ``obs`` build every row (fine for small data).

    For discrete data each window is an int array of one-hot column indices (position j of a window of a
    vocabulary of size V occupies columns j·V … j·V+V-1); for continuous data it is the flattened window.
    """

    def __init__(self, trajectories: Sequence[np.ndarray], times: np.ndarray, past_window: int, future_window: int,
                 discrete: bool, vocab_size: int | None):
        self.trajectories = [np.asarray(t) for t in trajectories]
        self.times = times
        self.past_window = past_window
        self.future_window = future_window
        self.discrete = discrete
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.times.shape[0]

    def chunks(self, size: int) -> Iterator[slice]:
        for start in range(0, len(self), size):
            yield slice(start, min(start + size, len(self)))

    def rows(self, which: str, index: slice | np.ndarray) -> np.ndarray:
        """The ``which`` windows ("past", "future", "shifted" or "obs") of the selected rows."""
        offset, length = {"past": (-self.past_window, self.past_window), "future": (0, self.future_window),
                          "shifted": (1, self.future_window), "obs": (0, 1)}[which]
        times = self.times[index]
        if times.shape[0] == 0:
            width = length if self.discrete else length * self._obs_size()
            return np.zeros((0, width), dtype=np.int64 if self.discrete else np.float64)
        parts = []
        traj_ids = times[:, 0]
        # rows are sorted by trajectory, so each trajectory is one contiguous block of the selection
        bounds = np.flatnonzero(np.diff(traj_ids)) + 1
        for block in np.split(np.arange(times.shape[0]), bounds):
            traj = self.trajectories[int(traj_ids[block[0]])]
            starts = times[block, 1] + offset
            w = traj[starts[:, None] + np.arange(length)[None, :]]
            if self.discrete:
                w = w + int(self.vocab_size) * np.arange(length)[None, :]  # type: ignore[arg-type]
            else:
                w = w.reshape(len(block), -1)
            parts.append(w)
        return np.concatenate(parts, axis=0)

    def shift_breaks(self, sl: slice) -> np.ndarray:
        """Positions, within the rows of ``sl``, whose shifted window is not the future window of the next row of
        the slice: the last row of each trajectory and the slice's last row. Every other shifted window s_t is
        the future f_{t+1} of the next row, so its features need not be computed again."""
        times = self.times[sl]
        follows = (times[1:, 0] == times[:-1, 0]) & (times[1:, 1] == times[:-1, 1] + 1)
        return np.append(np.flatnonzero(~follows), len(times) - 1)

    def _obs_size(self) -> int:
        t = self.trajectories[0]
        return 1 if t.ndim == 1 else t.shape[1]

    @property
    def past(self) -> np.ndarray:
        return self.rows("past", slice(None))

    @property
    def future(self) -> np.ndarray:
        return self.rows("future", slice(None))

    @property
    def shifted(self) -> np.ndarray:
        return self.rows("shifted", slice(None))

    @property
    def obs(self) -> np.ndarray:
        return self.rows("obs", slice(None))


def window_count(lengths: Sequence[int], past: int, future: int) -> int:
    """How many windows :func:`make_windows` cuts from trajectories of ``lengths`` steps: T - past - future from one
    of T steps (t = past .. T - future - 1), none from one shorter than past + future + 1."""
    return sum(max(0, int(T) - past - future) for T in lengths)


def make_windows(
    trajectories: Sequence[np.ndarray], past: int, future: int, *, discrete: bool, vocab_size: int | None = None
) -> Windows:
    """Index the past/future/shifted/observation windows of every trajectory separately (see module docstring).

    Trajectories shorter than ``past + future + 1`` contribute no rows.
    """
    if past < 1 or future < 1:
        raise ValueError(f"window lengths must be >= 1, got past={past}, future={future}")
    if discrete and vocab_size is None:
        raise ValueError("vocab_size is required for discrete windows")
    times = []
    for i, traj in enumerate(trajectories):
        T = np.asarray(traj).shape[0]
        ts = np.arange(past, T - future, dtype=np.int64)  # the shifted future needs o_{t+k}: t + k <= T - 1
        if ts.size:
            times.append(np.stack([np.full(ts.size, i, dtype=np.int64), ts], axis=1))
    if not times:
        lengths = [len(t) for t in trajectories]
        raise ValueError(
            f"no trajectory is long enough for past window {past} + future window {future} + 1 "
            f"(longest has {max(lengths) if lengths else 0} steps)"
        )
    return Windows(trajectories, np.concatenate(times, axis=0), past, future, discrete, vocab_size)


@dataclass
class FeatureMaps:
    """The three RFF maps of a 2SR layer: observation (ω), history (η) and future (φ, also used for shifted)."""

    obs: RandomFourierFeatures
    past: RandomFourierFeatures
    future: RandomFourierFeatures
    discrete: bool
    vocab_size: int
    past_window: int
    future_window: int

    def apply(self, which: str, x: np.ndarray, dtype: np.dtype = np.float64) -> np.ndarray:
        rff = {"obs": self.obs, "past": self.past, "future": self.future, "shifted": self.future}[which]
        return rff.transform_indices(x, dtype) if self.discrete else rff.transform(x, dtype)

    def apply_unique(self, which: str, x: np.ndarray, dtype: np.dtype = np.float64
                     ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Features of the distinct rows of ``x``: (phi_unique, inverse, counts), phi = phi_unique[inverse].

        Discrete windows repeat a lot (PTB has far fewer distinct 5-grams than positions), so computing each
        distinct row once cuts the cost of the cosines; continuous rows are returned as they are
        (inverse and counts None).
        """
        if not self.discrete:
            return self.apply(which, x, dtype), None, None
        x = np.asarray(x)
        if x.ndim == 1:
            x = x[:, None]
        key = window_keys(x, self.vocab_size)
        if key is not None:
            _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
            rows = x[first]
        else:
            rows, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
        return self.apply(which, rows, dtype), inverse.reshape(-1), counts

    def to_arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name in ("obs", "past", "future"):
            out.update(getattr(self, name).to_arrays(name))
        out["discrete"] = np.array(self.discrete)
        out["vocab_size"] = np.array(self.vocab_size)
        out["past_window"] = np.array(self.past_window)
        out["future_window"] = np.array(self.future_window)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "FeatureMaps":
        return cls(
            obs=RandomFourierFeatures.from_arrays(arrays, "obs"),
            past=RandomFourierFeatures.from_arrays(arrays, "past"),
            future=RandomFourierFeatures.from_arrays(arrays, "future"),
            discrete=bool(arrays["discrete"]),
            vocab_size=int(arrays["vocab_size"]),
            past_window=int(arrays["past_window"]),
            future_window=int(arrays["future_window"]),
        )


def keys_fit(vocab_size: int, width: int) -> bool:
    """Whether every window of ``width`` symbols of a vocabulary of ``vocab_size`` has an int64 key (V^width < 2⁶²)."""
    return int(vocab_size) ** int(width) < 2 ** 62


def window_keys(x: np.ndarray, vocab_size: int) -> np.ndarray | None:
    """One int64 key per discrete window (a row of one-hot column indices, as :meth:`Windows.rows` gives them): the
    window's symbols as the digits of a base-V number, most significant first. Keys are equal iff the windows are,
    and sort as the windows do lexicographically. None when V^width does not fit (:func:`keys_fit`)."""
    x = np.asarray(x)
    V, width = int(vocab_size), x.shape[1]
    if not keys_fit(V, width):
        return None
    key = np.zeros(x.shape[0], dtype=np.int64)
    for j in range(width):
        key = key * V + (x[:, j] - j * V)
    return key


def windows_of_keys(keys: np.ndarray, vocab_size: int, width: int) -> np.ndarray:
    """The windows (rows of one-hot column indices) of ``keys``: the inverse of :func:`window_keys`."""
    V = int(vocab_size)
    rows = np.empty((keys.shape[0], width), dtype=np.int64)
    rest = keys.copy()
    for j in reversed(range(width)):
        rows[:, j] = rest % V + j * V
        rest //= V
    return rows


@dataclass
class DistinctWindows:
    """The distinct windows of one family over all the data (see :func:`distinct_windows`), in key order."""

    keys: np.ndarray     # (u,) int64, sorted (window_keys)
    counts: np.ndarray   # (u,) int64: the rows whose window this is (0: a shifted window only, see below)
    rows: np.ndarray     # (u, width) one-hot column indices
    vocab_size: int

    def __len__(self) -> int:
        return self.keys.shape[0]

    def index(self, x: np.ndarray) -> np.ndarray:
        """The position in this table of each window of ``x``; every window must be in the table."""
        key = window_keys(x, self.vocab_size)
        pos = np.searchsorted(self.keys, key)
        # a window outside the table would silently take its neighbour's features: refuse instead
        if pos.size and (pos.max() >= len(self) or np.any(self.keys[pos] != key)):
            raise ValueError("a window is not in the table of distinct windows (the table was made from other data)")
        return pos


class _KeyCounter:
    """Distinct keys and their counts, accumulated chunk by chunk. The chunks' distinct keys wait until they
    outnumber the table and are then merged into it: merging per chunk would sort the whole table every chunk
    (O(T/chunk · distinct)), this sorts at most twice the waiting keys, and the memory stays O(distinct keys),
    not O(T)."""

    def __init__(self, min_merge: int):
        self.keys = np.zeros(0, dtype=np.int64)
        self.merged = 0   # distinct keys in the merged table: a lower bound of the distinct keys so far
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._size = 0
        self._min_merge = min_merge

    def add(self, key: np.ndarray, counted: bool = True) -> None:
        u, c = np.unique(key, return_counts=True)
        self._pending.append((u, c if counted else np.zeros_like(c)))
        self._size += u.shape[0]
        if self._size > max(self.keys.shape[0], self._min_merge):
            self._merge()

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        self._merge()
        return self.keys, self.counts

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self.keys] + [u for u, _ in self._pending])
        counts = np.concatenate([self.counts] + [c for _, c in self._pending])
        self.keys, inverse = np.unique(keys, return_inverse=True)
        self.counts = np.zeros(self.keys.shape[0], dtype=np.int64)
        np.add.at(self.counts, inverse.reshape(-1), counts)
        self._pending, self._size = [], 0
        self.merged = self.keys.shape[0]


def distinct_windows(windows: Windows, chunk_size: int = 8192, max_distinct: int | None = None
                     ) -> dict[str, DistinctWindows] | None:
    """The distinct observation, history and future windows of discrete ``windows`` over all trajectories, each
    with the number of rows it occurs in: one streamed pass over the rows, no features. None for continuous
    windows, for windows too long for int64 keys (:func:`keys_fit`), and as soon as a family has more than
    ``max_distinct`` distinct windows (data with little repetition, where the tables would cost memory in
    proportion to T and de-duplication would save little: the caller then streams rows as for continuous data).

    A sum over rows of any function of one family's window is then a sum over its distinct windows weighted by
    the counts: on PTB's 120k characters there are 28.6k distinct 5-grams (and 44 symbols), against 69.6k
    distinct-per-chunk rows when each chunk of 8192 rows is de-duplicated on its own.

    The future table also holds every shifted window that is not the future window of the next row of its chunk
    (:meth:`Windows.shift_breaks`: trajectory and chunk ends), with count 0 when it is no row's future (the
    trajectory's last one), so that every shifted window is in it. Memory: the tables, O(distinct windows).
    """
    if not windows.discrete:
        return None
    V = int(windows.vocab_size)  # type: ignore[arg-type]
    widths = {"obs": 1, "past": windows.past_window, "future": windows.future_window}
    if not all(keys_fit(V, w) for w in widths.values()):
        return None
    counters = {f: _KeyCounter(chunk_size) for f in widths}
    limit = np.inf if max_distinct is None else max_distinct
    for sl in windows.chunks(chunk_size):
        for f in widths:
            counters[f].add(window_keys(windows.rows(f, sl), V))
        ends = sl.start + windows.shift_breaks(sl)
        counters["future"].add(window_keys(windows.rows("shifted", ends), V), counted=False)
        if any(c.merged > limit for c in counters.values()):
            return None
    out = {}
    for f, w in widths.items():
        keys, counts = counters[f].result()
        if keys.shape[0] > limit:
            return None
        out[f] = DistinctWindows(keys=keys, counts=counts, rows=windows_of_keys(keys, V, w), vocab_size=V)
    return out


#: the bound on the layer-1 RFF maps of discrete data: their frequencies Ω, float64, are one row per one-hot column,
#: (1 + past_window + future_window) x V x n_features x 8 bytes in all, so a symbol column that really holds ids
#: (V = 30000 at 2000 features and windows of 10: 9.4 GiB) would otherwise die of memory while they are drawn
DISCRETE_MAPS_BYTES = 4 * 2 ** 30


def check_discrete_maps(vocab_size: int, n_features: int, past_window: int, future_window: int,
                        key: str = "two_stage") -> None:
    """Refuse discrete RFF maps above :data:`DISCRETE_MAPS_BYTES` before any is drawn; ``key`` names the params
    section of the sizes in the error (``<ds>.two_stage`` in ``psrnn check``)."""
    V, D, p, k = int(vocab_size), int(n_features), int(past_window), int(future_window)
    need = (1 + p + k) * V * D * 8
    if need > DISCRETE_MAPS_BYTES:
        raise ValueError(
            f"{V} symbols: the discrete RFF maps would hold (1 + {key}.past_window + {key}.future_window) x "
            f"symbols x {key}.n_features x 8 bytes = (1 + {p} + {k}) x {V} x {D} x 8 = {need / 2 ** 30:.1f} GiB, "
            f"above the bound of {DISCRETE_MAPS_BYTES // 2 ** 30} GiB; expected fewer distinct symbols (is the symbol "
            f"column an id?), a smaller {key}.n_features or shorter windows")


def fit_feature_maps(
    windows: Windows,
    *,
    n_features: int = 2000,
    obs_dim: int,
    vocab_size: int = 0,
    widths: dict[str, float | None] | None = None,
    width_scale: float = 1.0,
    seed: int = 0,
    max_points: int = 1000,
) -> FeatureMaps:
    """Draw the observation, history and future RFF maps; each width is the median pairwise distance of its
    inputs (times ``width_scale``) unless given in ``widths`` (keys ``obs``, ``past``, ``future``).

    ``obs_dim`` is the raw observation size (vocabulary size for discrete data). Discrete maps larger than
    :data:`DISCRETE_MAPS_BYTES` are refused (:func:`check_discrete_maps`).
    """
    widths = dict(widths or {})
    past_window, future_window = windows.past_window, windows.future_window
    if windows.discrete:
        check_discrete_maps(vocab_size, n_features, past_window, future_window)
    maps = {}
    for k, name in enumerate(("obs", "past", "future")):
        n = len(windows)
        # the subsample is at most max_points rows, so the median functions draw nothing further
        sample = np.sort(np.random.default_rng(seed_sequence(seed, MEDIAN_SAMPLE, k))
                         .choice(n, size=min(n, max_points), replace=False))
        x = windows.rows(name, sample)
        w = widths.get(name)
        if w is None:
            if windows.discrete:
                w = one_hot_window_distance_sample(x, vocab_size, max_points=max_points)
            else:
                w = median_pairwise_distance(x, max_points=max_points)
            w *= width_scale
        in_dim = x.shape[1] * (vocab_size if windows.discrete else 1)  # one-hot windows: positions × V
        maps[name] = RandomFourierFeatures.create(in_dim, n_features, float(w),
                                                  seed=seed_sequence(seed, RFF_MAP, k))
    return FeatureMaps(discrete=windows.discrete, vocab_size=vocab_size, past_window=past_window,
                       future_window=future_window, **maps)
