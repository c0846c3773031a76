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
