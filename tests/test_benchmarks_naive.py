"""The materialised reference 2SR of benchmarks/ computes the same layer as the streaming implementation."""

import numpy as np
import pytest

from benchmarks.naive_two_stage import naive_two_stage_regression
from pipeline.two_stage import TwoStageConfig, filter_states, two_stage_regression


def _cfg(**kw):
    # exact projections and float64 features, so that streaming and materialised differ by rounding only
    base = dict(state_dim=4, obs_dim=3, past_dim=5, n_features=96, past_window=2, future_window=2, seed=3,
                svd="exact", feature_dtype="float64", chunk_size=97)  # several chunks, the last one partial
    base.update(kw)
    return TwoStageConfig(**base)


def _rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(b), 1e-300)


def _discrete_data():
    rng = np.random.default_rng(0)
    # a random 3-state HMM over 6 symbols, so the data have structure for the regressions to find
    A = rng.dirichlet(np.ones(3) * 0.5, size=3)
    B = rng.dirichlet(np.ones(6) * 0.5, size=3)
    trajs = []
    for _ in range(3):
        s, seq = 0, []
        for _ in range(150):
            seq.append(rng.choice(6, p=B[s]))
            s = rng.choice(3, p=A[s])
        trajs.append(np.array(seq))
    return trajs


def _continuous_data():
    rng = np.random.default_rng(1)
    trajs = []
    for _ in range(2):
        x = np.zeros((200, 2))
        for t in range(1, 200):
            x[t] = 0.9 * np.array([[np.cos(0.3), -np.sin(0.3)], [np.sin(0.3), np.cos(0.3)]]) @ x[t - 1] \
                + 0.3 * rng.standard_normal(2)
        trajs.append(x)
    return trajs


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
@pytest.mark.parametrize("obs_inverse", [True, False])
def test_naive_and_streaming_two_stage_agree(kind, obs_inverse):
    if kind == "discrete":
        trajs, kw = _discrete_data(), dict(discrete=True, vocab_size=6)
    else:
        trajs, kw = _continuous_data(), dict(discrete=False)
    cfg = _cfg(obs_inverse=obs_inverse)
    stream = two_stage_regression(trajs, cfg, **kw)
    naive = naive_two_stage_regression(trajs, cfg, **kw)

    # identical random features, same windows
    for fam in ("obs", "past", "future"):
        np.testing.assert_array_equal(getattr(naive.maps, fam).frequencies, getattr(stream.maps, fam).frequencies)
    assert naive.diagnostics["n_windows"] == stream.diagnostics["n_windows"]
    assert naive.diagnostics["lambda"] == stream.diagnostics["lambda"]

    # sign-invariant: the projected subspaces
    for name in ("U_obs", "U_past", "U_future"):
        Un, Us = getattr(naive, name), getattr(stream, name)
        assert _rel(Un @ Un.T, Us @ Us.T) < 1e-6, name
    # signs are fixed the same way, so the bases and everything built on them agree entrywise
    for name in ("U_obs", "U_past", "U_future", "W", "q1"):
        assert _rel(getattr(naive, name), getattr(stream, name)) < 1e-6, name
    for fam in ("obs", "past", "future"):
        np.testing.assert_allclose(naive.diagnostics["singular_values"][fam],
                                   stream.diagnostics["singular_values"][fam], rtol=1e-6)

    # and the filtered states, which is what the decoder and the PSRNN see
    sn = filter_states(naive, trajs[:1])[0]
    ss = filter_states(stream, trajs[:1])[0]
    assert _rel(sn, ss) < 1e-6


def test_naive_predict_writes_what_predict_file_writes(tmp_path):
    """benchmarks/naive_predict.py (every output of the whole input in memory: bench_predict's baseline) writes the
    rows, predictions and bits that pipeline.inference.predict_file writes, streamed in blocks of a few rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.naive_predict import agree, compare_outputs, naive_predict_file
    from pipeline.api import fit_model
    from pipeline.inference import TrainedRun, predict_file

    vocab = list("abcdef")
    trajs = _discrete_data()
    fitted = fit_model(trajs, model="psrnn", n_features=32, state_dim=4, horizon=1, epochs=0, device="cpu")
    run = TrainedRun.from_units(fitted.model, {"kind": "discrete", "vocab": vocab}, dataset="t", variant="psrnn",
                                seed=0, epoch=0)
    # three trajectories of unequal lengths, one longer than a block, ids not starting at 0
    lengths = [150, 37, 90]
    codes = np.concatenate([t[:n] for t, n in zip(trajs, lengths)])
    ids = np.repeat([7, 8, 9], lengths)
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"trajectory": ids, "symbol": np.array(vocab, dtype=object)[codes]}), src)
    streamed, naive = tmp_path / "streamed.parquet", tmp_path / "naive.parquet"
    summary = predict_file(run, src, streamed, probabilities=True, block_rows=64)
    got = naive_predict_file(fitted.model, vocab, src, naive, probabilities=True)
    assert got["rows"] == summary["rows"] == sum(lengths) and got["trajectories"] == 3
    assert got["predicted_steps"] == summary["predicted_steps"]
    assert got["metrics"]["bpc"] == pytest.approx(summary["metrics"]["bpc"], rel=1e-9)
    comparison = compare_outputs(streamed, naive)
    assert comparison["same_rows"] and comparison["predicted_mismatches"] == 0, comparison
    assert comparison["max_next_bits_difference"] < 1e-9 and agree(comparison)
    a, b = pq.read_table(streamed), pq.read_table(naive)
    np.testing.assert_allclose(np.array(a.column("probabilities").to_pylist()),
                               np.array(b.column("probabilities").to_pylist()), rtol=1e-6)


def _linear_data(steps=3000, obs_dim=6, trajectories=3):
    from benchmarks.bench_kf_two_stage import synthetic_series

    return synthetic_series(steps, obs_dim, trajectories, seed=4)


@pytest.mark.parametrize("kw", [dict(state_dim=5, past_window=6, future_window=4, ridge=1e-3),
                                dict(state_dim=10, past_window=2, future_window=3, ridge=0.05)])
def test_streamed_and_materialised_linear_two_stage_agree(monkeypatch, kw):
    """The Kalman filter's streamed stage 1 (chunks of 256 windows here: several, the last one partial) gives the
    states, shifted states and singular values of the materialised one, whose n × f SVD it replaces by a p × f one,
    and so the same A, C, Q, R, M, x0, P0. The second case asks for more states (10) than the history window has
    dimensions (p = 2 · 6 = 12 > 10, but rank(F̂) <= 12 and f = 18): the null directions it then takes are states
    of ~0 in both."""
    import pipeline.two_stage as two_stage
    from benchmarks.naive_two_stage import naive_linear_stage_one

    monkeypatch.setattr(two_stage, "LINEAR_CHUNK_BYTES", 1)   # the 256-row minimum
    trajs = _linear_data()
    s, n = two_stage.linear_stage_one(trajs, **kw), naive_linear_stage_one(trajs, **kw)
    assert len(s.windows) % 256 and len(s.windows) > 3 * 256
    np.testing.assert_array_equal(s.consecutive, n.consecutive)
    k = len(s.singular_values)
    np.testing.assert_allclose(s.singular_values, n.singular_values[:k], rtol=1e-10)
    assert np.all(n.singular_values[k:] < 1e-10 * n.singular_values[0])
    rank = min(kw["state_dim"], kw["past_window"] * 6)
    np.testing.assert_allclose(s.states[:, :rank], n.states[:, :rank], rtol=0, atol=1e-10 * np.abs(n.states).max())
    np.testing.assert_allclose(s.shifted_states[:, :rank], n.shifted_states[:, :rank], rtol=0,
                               atol=1e-10 * np.abs(n.shifted_states).max())
    if rank == kw["state_dim"]:
        lss = two_stage.linear_two_stage(trajs, **kw)
        ref = two_stage.linear_stage_two(n, ridge=kw["ridge"])
        for key in ("A", "C", "Q", "R", "M", "x0", "P0", "mean"):
            np.testing.assert_allclose(getattr(lss, key), getattr(ref, key), rtol=1e-9,
                                       atol=1e-12 * np.abs(getattr(ref, key)).max(), err_msg=key)
    else:
        assert np.abs(s.states[:, rank:]).max() < 1e-10 * np.abs(s.states).max()


def test_streamed_linear_stage_one_holds_no_window_matrix(monkeypatch):
    """Memory, by allocation count, not time: the streamed stage 1 never holds an n × p window matrix (here
    24000 × 120 float64, 23 MB), so its peak traced allocation stays below half of one and an eighth of the materialised
    one's, which holds five such matrices at once (the streamed one holds the data, its centred copy, the states
    and the shifted states)."""
    import tracemalloc

    import pipeline.two_stage as two_stage
    from benchmarks.naive_two_stage import naive_linear_stage_one

    monkeypatch.setattr(two_stage, "LINEAR_CHUNK_BYTES", 2 ** 20)
    trajs = _linear_data(steps=24000, obs_dim=12, trajectories=2)
    kw = dict(state_dim=8, past_window=10, future_window=10, ridge=1e-3)
    peaks = {}
    for name, fn in (("streamed", two_stage.linear_stage_one), ("materialised", naive_linear_stage_one)):
        fn(_linear_data(steps=600, obs_dim=12, trajectories=2), **kw)   # the first call's imports, untraced
        tracemalloc.start()
        fn(trajs, **kw)
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    window_matrix = 24000 * 120 * 8
    assert peaks["materialised"] > 4 * window_matrix, peaks
    assert peaks["streamed"] < window_matrix / 2 and peaks["streamed"] < peaks["materialised"] / 8, peaks
