"""The fast paths of 2SR initialisation compute what the plain ones do: the softmax decoder's objective (transposed
logits, precomputed label sums) and the statistics from globally distinct discrete windows."""

import numpy as np
import pytest
import scipy.optimize

import pipeline.features as features
import pipeline.two_stage as two_stage
from pipeline.data.synthetic import make_hmm_dataset
from pipeline.features import distinct_windows, fit_feature_maps, make_windows, window_keys
from pipeline.two_stage import (TwoStageConfig, accumulate_statistics, filter_states, fit_decoder,
                                softmax_objective, top_projections, two_stage_regression)


def _cfg(**kw):
    base = dict(state_dim=4, obs_dim=3, past_dim=5, n_features=96, past_window=2, future_window=3, seed=3,
                feature_dtype="float64")
    base.update(kw)
    return TwoStageConfig(**base)


def _rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(b), 1e-300)


# ---------------------------------------------------------------------------------------------- decoder


def _reference_objective(X, y, V, lam):
    """The decoder's objective written plainly: (n × V) logits, the labels' logits gathered, p − onehot."""
    n, d = X.shape

    def f(theta):
        W, b = theta[: V * d].reshape(V, d), theta[V * d:]
        z = X @ W.T + b
        m = z.max(1, keepdims=True)
        lse = np.log(np.exp(z - m).sum(1)) + m[:, 0]
        loss = np.mean(lse - z[np.arange(n), y]) + 0.5 * lam * np.sum(W ** 2)
        p = np.exp(z - lse[:, None])
        p[np.arange(n), y] -= 1.0
        return loss, np.concatenate([(p.T @ X / n + lam * W).ravel(), p.sum(0) / n])

    return f


@pytest.fixture(scope="module")
def hmm_states():
    data, _ = make_hmm_dataset(n_states=4, n_symbols=6, n_train=20, n_test=2, length=150, seed=0)
    layer = two_stage_regression(data.train, _cfg(state_dim=5), discrete=True, vocab_size=6)
    return filter_states(layer, data.train), data.train


def test_softmax_objective_equals_the_plain_one_and_its_finite_differences(hmm_states):
    states, trajs = hmm_states
    X = np.concatenate([s[:-1] for s in states])
    y = np.concatenate([t[1:] for t in trajs])
    fast, plain = softmax_objective(X, y, 6, 1e-3), _reference_objective(X, y, 6, 1e-3)
    rng = np.random.default_rng(0)
    for scale in (0.0, 1.0, 30.0):   # 30: logits far beyond exp's range unless shifted
        theta = scale * rng.standard_normal(6 * X.shape[1] + 6)
        (l1, g1), (l2, g2) = fast(theta), plain(theta)
        assert abs(l1 - l2) <= 1e-12 * max(1.0, abs(l2))
        np.testing.assert_allclose(g1, g2, rtol=0, atol=1e-12 * max(1.0, np.abs(g2).max()))
    theta = rng.standard_normal(6 * X.shape[1] + 6)
    step = 1e-6
    fd = np.array([(fast(theta + step * e)[0] - fast(theta - step * e)[0]) / (2 * step)
                   for e in np.eye(theta.size)])
    np.testing.assert_allclose(fast(theta)[1], fd, rtol=0, atol=1e-8)


def test_fit_decoder_reaches_the_plain_objectives_optimum(hmm_states):
    states, trajs = hmm_states
    dec = fit_decoder(states, trajs, discrete=True, vocab_size=6, ridge=1e-3)
    X = np.concatenate([s[:-1] for s in states])
    y = np.concatenate([t[1:] for t in trajs])
    plain = _reference_objective(X, y, 6, 1e-3)
    counts = np.bincount(y, minlength=6).astype(np.float64)
    theta0 = np.concatenate([np.zeros(6 * X.shape[1]), np.log((counts + 1) / (counts.sum() + 6))])
    ref = scipy.optimize.minimize(plain, theta0, jac=True, method="L-BFGS-B", options={"maxiter": 300})
    theta = np.concatenate([dec.weight.ravel(), dec.bias])
    loss, grad = plain(theta)
    assert abs(loss - ref.fun) < 1e-12
    assert np.abs(grad).max() < 1e-4          # L-BFGS-B stops at a projected gradient of 1e-5
    # the same iterates up to rounding (4e-11 apart here): the same optimum, not merely as good a one
    np.testing.assert_allclose(theta, ref.x, rtol=0, atol=1e-7)


def test_fit_decoder_is_bitwise_the_single_threaded_l_bfgs_fit(hmm_states):
    """The progress bar and the time estimate leave the fit itself alone: exactly scipy's L-BFGS-B on the fast
    objective from the unigram model, with BLAS at one thread (every 2SR initialisation's numbers depend on it)."""
    states, trajs = hmm_states
    dec = fit_decoder(states, trajs, discrete=True, vocab_size=6, ridge=1e-3)
    X = np.concatenate([s[:-1] for s in states])
    y = np.concatenate([t[1:] for t in trajs])
    counts = np.bincount(y, minlength=6).astype(np.float64)
    theta0 = np.concatenate([np.zeros(6 * X.shape[1]), np.log((counts + 1) / (counts.sum() + 6))])
    with two_stage._single_threaded_blas():
        ref = scipy.optimize.minimize(softmax_objective(X, y, 6, 1e-3), theta0, jac=True, method="L-BFGS-B",
                                      options={"maxiter": 300})
    assert dec.weight.tobytes() == ref.x[: 6 * X.shape[1]].tobytes() and dec.bias.tobytes() == ref.x[-6:].tobytes()


def test_fit_decoder_shows_its_iterations_and_warns_of_a_long_fit(hmm_states, monkeypatch, recwarn):
    states, trajs = hmm_states
    bars = []

    class Bar:
        def __init__(self, **kw):
            self.kw, self.n = kw, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, k=1):
            self.n += k

    monkeypatch.setattr(two_stage, "progress", lambda iterable=None, **kw: Bar(**kw))
    fit_decoder(states, trajs, discrete=True, vocab_size=6, ridge=1e-3, max_iter=50)
    assert [b.kw["total"] for b in bars] == [50] and 0 < bars[0].n <= 50 and "decoder" in bars[0].kw["desc"]
    assert not [w for w in recwarn if "fit_decoder" in str(w.message)]   # small: no warning
    n, d = sum(len(s) - 1 for s in states), states[0].shape[1]
    assert two_stage.decoder_seconds(n, 6, d, 50) < two_stage.DECODER_LOG_SECONDS
    # V = 5000 on 160k states of size 20 (the audit's case: > 270 s with no output) is warned of
    assert two_stage.decoder_seconds(160_000, 5000, 20, 300) >= two_stage.DECODER_WARN_SECONDS
    assert two_stage.decoder_seconds(120_000, 44, 20, 300) < two_stage.DECODER_LOG_SECONDS   # PTB: quiet
    monkeypatch.setattr(two_stage, "DECODER_SECONDS_PER_MAC", 1.0)
    with pytest.warns(UserWarning, match=r"6 symbols on \d+ training states .*fewer symbols.*two_stage\.state_dim"):
        fit_decoder(states, trajs, discrete=True, vocab_size=6, ridge=1e-3, max_iter=50)


# ----------------------------------------------------------------------------------- distinct windows


def _discrete(V=5, lengths=(90, 61, 7, 75)):
    rng = np.random.default_rng(3)
    # one trajectory (7) too short for a window; repetitive symbols, so windows repeat across chunks
    return [rng.choice(V, size=n, p=np.r_[0.6, np.full(V - 1, 0.4 / (V - 1))]) for n in lengths]


def test_distinct_windows_count_every_row_and_hold_every_shifted_window():
    trajs = _discrete()
    windows = make_windows(trajs, 2, 3, discrete=True, vocab_size=5)
    big = distinct_windows(windows, chunk_size=10_000)
    small = distinct_windows(windows, chunk_size=4)   # merges many times
    for f in ("obs", "past", "future"):
        rows = windows.rows(f, slice(None))
        keys, counts = np.unique(window_keys(rows, 5), return_counts=True)
        table = big[f]
        assert np.array_equal(small[f].keys, table.keys) and np.array_equal(small[f].counts, table.counts)
        assert np.all(np.diff(table.keys) > 0) and table.counts.sum() == len(windows)
        assert np.array_equal(table.keys[table.counts > 0], keys)
        assert np.array_equal(table.counts[table.counts > 0], counts)
        assert np.array_equal(table.rows[table.index(rows)], rows)   # the decoded windows are the windows
    shifted = windows.rows("shifted", slice(None))
    assert np.array_equal(big["future"].rows[big["future"].index(shifted)], shifted)
    with pytest.raises(ValueError, match="not in the table"):
        big["obs"].index(np.array([[7]]))   # a symbol outside the data


def _statistics_pair(discrete, **kw):
    if discrete:
        trajs, V = _discrete(), 5
    else:
        rng = np.random.default_rng(4)
        trajs, V = [rng.standard_normal((n, 2)).cumsum(0) * 0.1 for n in (90, 61, 75)], None
    cfg = _cfg(**kw)
    windows = make_windows(trajs, cfg.past_window, cfg.future_window, discrete=discrete, vocab_size=V)
    maps = fit_feature_maps(windows, n_features=cfg.n_features, obs_dim=V or 2, vocab_size=V or 0, seed=cfg.seed)
    return windows, maps, cfg


def _per_row_statistics(windows, maps, bases):
    """Every statistic from the features of every row, one by one."""
    h = maps.apply("past", windows.past) @ bases["past"]
    f = maps.apply("future", windows.future) @ bases["future"]
    s = maps.apply("shifted", windows.shifted) @ bases["future"]
    o = maps.apply("obs", windows.obs) @ bases["obs"]
    return {"HH": h.T @ h, "HF": h.T @ f, "HE": h.T @ (s[:, :, None] * o[:, None, :]).reshape(len(h), -1),
            "OO": o.T @ o, "h_sum": h.sum(0), "FF": f.T @ f}


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("discrete", [True, False])
def test_statistics_from_distinct_windows_equal_per_row_ones(discrete, grouped, monkeypatch):
    if not grouped:   # Hᵀ(S ⊙⊗ O) by the row-wise Kronecker, as for a large vocabulary
        monkeypatch.setattr(two_stage, "MAX_SYMBOL_GROUPS", 0)
    windows, maps, cfg = _statistics_pair(discrete, chunk_size=37)
    rng = np.random.default_rng(5)
    bases = {f: np.linalg.qr(rng.standard_normal((cfg.n_features, q)))[0]
             for f, q in (("obs", 3), ("past", 5), ("future", 4))}
    want = _per_row_statistics(windows, maps, bases)
    for chunk in (5, 37, 10_000):
        got = accumulate_statistics(windows, maps, bases, _cfg(chunk_size=chunk), future_gram=True)
        for name, value in want.items():
            assert _rel(getattr(got, name), value) < 1e-10, (name, chunk)


def test_projections_from_distinct_windows_equal_per_chunk_ones(monkeypatch):
    """Global de-duplication (the default) against per-chunk de-duplication without keys (forced: as for windows
    too long for int64 keys), randomised and exact, small and large chunks."""
    windows, maps, _ = _statistics_pair(True)
    dims = {"obs": 3, "past": 5, "future": 4}
    for svd in ("randomized", "exact"):
        runs = {}
        for keyed in (True, False):
            with monkeypatch.context() as m:
                if not keyed:
                    m.setattr(features, "keys_fit", lambda *_: False)
                    assert distinct_windows(windows) is None
                for chunk in (6, 10_000):
                    runs[keyed, chunk] = top_projections(windows, maps, dims, _cfg(svd=svd, chunk_size=chunk))
        ref_proj, ref_sv, ref_stats = runs[False, 10_000]
        for key, (proj, sv, stats) in runs.items():
            for f in dims:
                assert _rel(proj[f], ref_proj[f]) < 1e-10, (svd, key, f)
                assert _rel(sv[f], ref_sv[f]) < 1e-10, (svd, key, f)
            for name in ("HH", "HF", "HE", "OO", "h_sum"):
                assert _rel(getattr(stats, name), getattr(ref_stats, name)) < 1e-10, (svd, key, name)


def test_two_stage_from_distinct_windows_is_bitwise_deterministic():
    trajs = _discrete()
    a, b = (two_stage_regression(trajs, _cfg(feature_dtype="float32", chunk_size=40), discrete=True, vocab_size=5)
            for _ in range(2))
    for name in ("W", "q1", "mean_state", "U_obs", "U_past", "U_future"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_data_with_too_many_distinct_windows_are_streamed_by_rows(monkeypatch):
    """Above the tables' memory budget (data that repeat little) 2SR streams rows as for continuous data, with
    the same result; distinct_windows stops counting as soon as a family passes ``max_distinct``."""
    windows, maps, _ = _statistics_pair(True)
    full = distinct_windows(windows)
    most = max(len(t) for t in full.values())
    assert distinct_windows(windows, max_distinct=most) is not None
    assert distinct_windows(windows, max_distinct=most - 1) is None
    assert distinct_windows(windows, chunk_size=6, max_distinct=most - 1) is None
    dims = {"obs": 3, "past": 5, "future": 4}
    tabled = top_projections(windows, maps, dims, _cfg(chunk_size=10))
    calls = []
    real = two_stage._accumulate_rows
    monkeypatch.setattr(two_stage, "_accumulate_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, width = max(dims.values()) + _cfg().oversample, 3   # the projections' columns, the longest window
    monkeypatch.setattr(two_stage, "DISTINCT_TABLE_BYTES", 8 * (q + width + 2) * (most - 1))
    streamed = top_projections(windows, maps, dims, _cfg(chunk_size=10))
    assert calls == [1], "the row-streamed statistics must have run"
    for f in dims:
        assert _rel(streamed[0][f], tabled[0][f]) < 1e-10, f
    for name in ("HH", "HF", "HE", "OO", "h_sum"):
        assert _rel(getattr(streamed[2], name), getattr(tabled[2], name)) < 1e-10, name


# ------------------------------------------------------------------------------ memory of filtering and decoding


def _filter_whole(layer, trajectories):
    """filter_states as it was: the whole trajectory encoded first, a (T, d_o) array beside the states."""
    d = layer.state_dim
    W_o = layer.W.transpose(1, 0, 2).reshape(layer.obs_dim, d * d)
    out, z_sum = [], np.zeros(d)
    for traj in trajectories:
        enc = layer.encode(traj)
        states, q = np.empty((enc.shape[0], d)), layer.q1.copy()
        for s in range(0, enc.shape[0], 4096):
            G = (enc[s:s + 4096] @ W_o).reshape(-1, d, d)
            for i in range(G.shape[0]):
                z = G[i] @ q
                z_sum += z
                z = z + 0.0
                nz = np.sqrt(z @ z)
                q = layer.q1 if nz <= two_stage.NORM_EPS else z / nz
                states[s + i] = q
        out.append(states)
    return out, z_sum


def _traced_peak(fn, *args, **kwargs):
    import tracemalloc

    tracemalloc.start()
    try:
        result = fn(*args, **kwargs)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("discrete", [True, False])
def test_filter_states_encodes_in_blocks_bitwise_and_without_a_whole_encoding(discrete):
    """filter_states encodes FILTER_ENCODE_ROWS (encode's own chunk) at a time: the states and the mean update are
    the whole encoding's bit for bit (lengths across block edges), and no (T, d_o) encoding is held beside the
    (T, d) states (traced peak ~2x the states before, ~1x now)."""
    rng = np.random.default_rng(4)
    if discrete:
        trajs = [rng.integers(0, 6, n) for n in (20000, 8193, 4096, 5, 2)]
        train, V = [rng.integers(0, 6, 3000) for _ in range(3)], 6
    else:
        trajs = [np.cumsum(rng.standard_normal((n, 2)), 0) * 0.1 for n in (20000, 8193, 4096, 5, 2)]
        train, V = [np.cumsum(rng.standard_normal((3000, 2)), 0) * 0.1 for _ in range(3)], 0
    layer = two_stage_regression(train, _cfg(state_dim=6, obs_dim=6, n_features=16), discrete=discrete,
                                 vocab_size=V)   # few features: a small fixed cost of encoding a block
    states, mean_z = filter_states(layer, trajs, return_unnormalised_mean=True)
    ref, z_sum = _filter_whole(layer, trajs)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(states, ref))
    assert mean_z.tobytes() == (z_sum / sum(len(t) for t in trajs)).tobytes()
    # the peak grows by the states alone, 8·d bytes a step (by 8·(d + d_o) with a whole encoding), beyond the
    # fixed cost of a block
    (short,), small = _traced_peak(filter_states, layer, [np.concatenate([trajs[0]] * 2)])   # 40k steps
    (long,), large = _traced_peak(filter_states, layer, [np.concatenate([trajs[0]] * 5)])    # 100k steps
    assert large - small < 1.3 * (long.nbytes - short.nbytes), (large - small) / (long.nbytes - short.nbytes)


def test_fit_decoder_holds_the_training_states_once(hmm_states):
    """The softmax decoder's [X 1]ᵀ is filled from the states (no concatenated X beside it) and the ridge decoder
    centres its concatenations in place: the same decoders bit for bit (test above, and the plain formula here),
    at about half the traced peak."""
    rng = np.random.default_rng(6)
    d, V = 20, 6

    def peak_of(n):
        st = [rng.standard_normal((n // 4, d)) for _ in range(4)]
        ys = [rng.integers(0, V, n // 4) for _ in range(4)]
        return _traced_peak(fit_decoder, st, ys, discrete=True, vocab_size=V, ridge=1e-3, max_iter=2)[1]

    # per training step: [X 1]ᵀ (8·(d + 1) bytes) and a few n-vectors (labels, column maxima and sums: ~40 bytes);
    # with X concatenated beside it another 8·d (360 bytes a step at d = 20, 208 now)
    per_step = (peak_of(120_000) - peak_of(40_000)) / 80_000
    assert per_step < 8 * (d + 1) + 60, per_step
    rng = np.random.default_rng(5)
    cstates = [rng.standard_normal((5000, 8)) for _ in range(8)]
    for targets in ([np.cumsum(rng.standard_normal((5000, 3)), 0) for _ in range(8)],
                    [rng.integers(0, 9, (5000, 3)) for _ in range(8)]):
        for change in (False, True):
            dec, peak = _traced_peak(fit_decoder, cstates, targets, discrete=False, ridge=1e-3, change=change)
            X = np.concatenate([s[:-1] for s in cstates])
            flat = [np.asarray(t).reshape(len(t), -1) for t in targets]
            Y = np.concatenate([t[1:] - t[:-1] if change else t[1:] for t in flat])
            Xc, Yc = X - X.mean(0), Y - Y.mean(0)
            Wt = two_stage._ridge_solve(Xc.T @ Xc, Xc.T @ Yc, 1e-3 * len(X)).T
            assert dec.weight.tobytes() == Wt.tobytes()
            assert dec.bias.tobytes() == (Y.mean(0) - Wt @ X.mean(0)).tobytes()
            if not change:   # X, Y and their centred copies: 2 x (8 + 3) x 8 bytes a row before, 1x now
                assert peak < 1.5 * X.nbytes * 11 / 8, peak / (X.nbytes * 11 / 8)
