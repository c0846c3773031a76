"""Features, 2SR and CP: what a mutation audit of ``features.py``, ``two_stage.py`` and ``decompose.py`` found
untested (81 mutants, 9 survivors that changed behaviour, and 5 killed only through torch models, pinned here at
the function that holds them): the fallback kernel widths, fixed widths against ``width_scale`` and in the upper
layers, the window count, the numpy filter's degenerate update and row convention, the linear 2SR's shift
equivariance and gain, chunked encoding, and CP's relative error. Numpy only, each under 2 s."""

import numpy as np
import pytest

from pipeline.features import (fit_feature_maps, make_windows, median_pairwise_distance,
                               one_hot_window_distance_sample, window_count)


def test_median_width_fallback_is_scale_equivariant_when_most_pairs_coincide():
    """Mostly duplicated points (median distance 0) fall back to the mean positive distance: the width must stay on
    the data's scale (x1000 data, x1000 width), not a constant."""
    x = np.array([[0.0]] * 8 + [[1.0], [3.0]])          # 28 of 45 pairs coincide: median 0
    w = median_pairwise_distance(x)
    assert w == pytest.approx(np.mean([1.0] * 8 + [3.0] * 8 + [2.0]))   # the positive distances' mean
    assert median_pairwise_distance(1000.0 * x) == pytest.approx(1000.0 * w, rel=1e-12)


def test_one_hot_width_of_mostly_identical_windows_is_the_smallest_distinct_distance():
    """Windows mostly identical (median Hamming distance 0) get the width sqrt(2) of windows one symbol apart, the
    width the median gives on ordinary one-hot data (k = e^{-1/2} between two symbols, ARCHITECTURE.md)."""
    windows = np.array([[0, 3]] * 9 + [[1, 3]])
    assert one_hot_window_distance_sample(windows, 3) == pytest.approx(np.sqrt(2.0), rel=1e-12)


def test_width_scale_multiplies_median_widths_only_not_the_given_ones():
    """fit_feature_maps: "each width is the median pairwise distance of its inputs (times width_scale) unless given
    in widths"."""
    traj = np.random.default_rng(0).standard_normal((200, 2))
    w = make_windows([traj], past=2, future=3, discrete=False)
    base = fit_feature_maps(w, n_features=8, obs_dim=2, seed=0)
    maps = fit_feature_maps(w, n_features=8, obs_dim=2, widths={"obs": 0.5}, width_scale=3.0, seed=0)
    assert maps.obs.width == 0.5
    assert maps.past.width == pytest.approx(3.0 * base.past.width, rel=1e-12)


def test_window_count_is_the_number_of_windows_make_windows_cuts():
    rng = np.random.default_rng(0)
    for past, future in ((1, 1), (2, 3), (4, 2)):
        lengths = [int(n) for n in rng.integers(1, 15, size=6)] + [past + future + 1]
        trajs = [rng.standard_normal((n, 2)) for n in lengths]
        assert window_count(lengths, past, future) == len(make_windows(trajs, past, future, discrete=False))


def test_2sr_filter_gives_q1_after_a_degenerate_update_without_torch():
    """Updates of norm <= NORM_EPS (the cells' eps) restart from q1 in the numpy filter too (a threshold of 0
    normalised updates of norm 1e-13)."""
    from pipeline.two_stage import NORM_EPS, TwoStageConfig, filter_states, regress_layer

    rng = np.random.default_rng(0)
    trajs = [rng.standard_normal((40, 2)) for _ in range(3)]
    cfg = TwoStageConfig(state_dim=3, obs_dim=3, past_dim=3, n_features=40, past_window=2, future_window=2)
    layer = regress_layer(trajs, cfg, discrete=False)
    layer.W = layer.W * (NORM_EPS / 10 / np.abs(layer.W).sum())   # every update of norm < NORM_EPS
    states = filter_states(layer, trajs[:1])[0]
    np.testing.assert_array_equal(states, np.broadcast_to(layer.q1, states.shape))


def test_cp_relative_error_is_relative():
    """relative_error = ‖W − Ŵ‖/‖W‖: the same for W and 1000 W, in (0, 1) for a tensor of higher rank."""
    from pipeline.decompose import cp_decompose

    W = np.random.default_rng(0).standard_normal((4, 3, 4))
    a, b = cp_decompose(W, 2, seed=0), cp_decompose(1000.0 * W, 2, seed=0)
    assert 0.05 < a.relative_error < 1.0
    assert a.relative_error == pytest.approx(np.linalg.norm(a.reconstruct() - W) / np.linalg.norm(W), rel=1e-9)
    assert b.relative_error == pytest.approx(a.relative_error, rel=1e-6)


def _kf_predictions(lss, obs):
    """The Kalman filter of a LinearStateSpace in predictor form with E[w vᵀ] = M, as pipeline.models.kalman runs
    it: row t predicts o_{t+1}."""
    x, P, out = lss.x0.copy(), lss.P0.copy(), []
    for o in obs:
        S = lss.C @ P @ lss.C.T + lss.R
        K = np.linalg.solve(S, (lss.A @ P @ lss.C.T + lss.M).T).T
        x = lss.A @ x + K @ (o - lss.mean - lss.C @ x)
        P = lss.A @ P @ lss.A.T + lss.Q - K @ S @ K.T
        out.append(lss.C @ x + lss.mean)
    return np.array(out)


def test_linear_2sr_kalman_filter_is_within_3_percent_of_the_true_filter_without_torch():
    """tests/test_kalman.py's tight bound, with the filter written out in numpy: the residual covariance Σ (from
    consecutive states x̂_{t+1} − A x̂_t, o_t − C x̂_t) decides the gain."""
    from pipeline.data.synthetic import make_lgssm_dataset
    from pipeline.two_stage import linear_two_stage

    ds, sys_ = make_lgssm_dataset(state_dim=4, obs_dim=2, n_train=60, n_test=20, length=200, seed=3)
    lss = linear_two_stage(ds.train, state_dim=4, past_window=8, future_window=8)
    err = np.mean([((_kf_predictions(lss, t)[:-1] - t[1:]) ** 2).mean() for t in ds.test])
    optimal = sys_.optimal_mse(ds.test)
    assert err <= 1.03 * optimal, err / optimal


def test_linear_2sr_is_shift_equivariant():
    """Data offset by a constant learn the same filter, only the mean moves (the windows are of the centred data)."""
    from pipeline.data.synthetic import make_lgssm_dataset
    from pipeline.two_stage import linear_two_stage

    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=8, n_test=1, length=80, seed=0)
    a = linear_two_stage(ds.train, state_dim=2, past_window=3, future_window=3)
    b = linear_two_stage([t + 5.0 for t in ds.train], state_dim=2, past_window=3, future_window=3)
    for name in ("A", "C", "Q", "R", "M", "x0", "P0"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-6, atol=1e-9, err_msg=name)
    np.testing.assert_allclose(b.mean, a.mean + 5.0, rtol=1e-12)


def test_upper_layers_take_median_widths_of_their_own_inputs_not_layer_ones_fixed_widths():
    """Layer 2's observations are layer 1's unit-norm states, so its obs width (a median distance between unit
    vectors) is at most 2; a fixed width given for layer 1's raw data must not leak to it."""
    from pipeline.two_stage import TwoStageConfig, multilayer_two_stage

    rng = np.random.default_rng(0)
    trajs = [rng.standard_normal((60, 2)) for _ in range(3)]
    cfg = TwoStageConfig(state_dim=3, obs_dim=3, past_dim=3, n_features=40, past_window=2, future_window=2,
                         widths={"obs": 123.0, "past": 123.0, "future": 123.0})
    tsm = multilayer_two_stage(trajs, cfg, n_layers=2, discrete=False)
    assert tsm.layers[0].maps.obs.width == 123.0
    assert 0 < tsm.layers[1].maps.obs.width <= 2.0


@pytest.mark.parametrize("discrete", [False, True])
def test_encode_is_the_same_in_any_chunk_size(discrete):
    from pipeline.two_stage import TwoStageConfig, regress_layer

    rng = np.random.default_rng(0)
    trajs = ([rng.integers(0, 4, 50) for _ in range(3)] if discrete else
             [rng.standard_normal((50, 2)) for _ in range(3)])
    cfg = TwoStageConfig(state_dim=3, obs_dim=3, past_dim=3, n_features=40, past_window=2, future_window=2)
    layer = regress_layer(trajs, cfg, discrete=discrete, vocab_size=4 if discrete else 0)
    np.testing.assert_allclose(layer.encode(trajs[0], chunk_size=7), layer.encode(trajs[0]), rtol=0, atol=1e-12)


def test_filter_states_row_t_is_eq5_after_consuming_o_t():
    """Row t of filter_states is q_{t+1} = W ×₂ o_t ×₃ q_t / ‖·‖ from q_1 (the state after o_t, which the decoder
    regresses o_{t+1} on), written out with explicit sums."""
    from pipeline.two_stage import TwoStageConfig, filter_states, regress_layer

    rng = np.random.default_rng(1)
    trajs = [rng.integers(0, 4, 40) for _ in range(3)]
    cfg = TwoStageConfig(state_dim=3, obs_dim=3, past_dim=3, n_features=40, past_window=2, future_window=2)
    layer = regress_layer(trajs, cfg, discrete=True, vocab_size=4)
    states = filter_states(layer, trajs[:1])[0]
    q, want = layer.q1, []
    for o in layer.encode(trajs[0]):
        z = np.einsum("ijk,j,k->i", layer.W, o, q)
        q = z / np.linalg.norm(z)
        want.append(q)
    np.testing.assert_allclose(states, np.array(want), rtol=0, atol=1e-12)


def test_every_upper_layer_draws_its_own_features():
    """Layers 2 and 3 take seeds of their own (``upper_layer_config``): the same draws at every level would feed
    each layer's states through the same random features (an earlier ``upper_cfg`` argument did that)."""
    from pipeline.two_stage import TwoStageConfig, multilayer_two_stage

    rng = np.random.default_rng(0)
    trajs = [rng.standard_normal((60, 2)) for _ in range(3)]
    cfg = TwoStageConfig(state_dim=3, obs_dim=3, past_dim=3, n_features=40, past_window=2, future_window=2)
    layers = multilayer_two_stage(trajs, cfg, n_layers=3, discrete=False).layers
    offsets = [layer.maps.obs.offsets for layer in layers]
    assert not np.array_equal(offsets[1], offsets[2]) and not np.array_equal(offsets[0], offsets[1])
