"""Direct checks of the paper's mathematics (Sec. 3-4), each sharp enough to fail on a plausible slip that the
statistical end-to-end tests would catch only weakly or not at all: the mode order of W (Eq. 5), the CP form
(Eq. 8), ridge λ = ridge · n, layer l+1 learned on layer l's filtered states (Sec. 4.2), the decoder's alignment
(o_{t+1} from the state after o_t), the Kalman recursion with correlated noise, and float64 models."""

import numpy as np
import pytest
import torch

from pipeline.api import initialise_model
from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset
from pipeline.features import layer_seed, make_windows
from pipeline.models import KalmanFilter, ModelConfig, build_model
from pipeline.models.psrnn import FactorizedPSRNNLayer, PSRNNLayer
from pipeline.train import evaluate, predict
from pipeline.two_stage import (TwoStageConfig, filter_states, fit_decoder, linear_two_stage, multilayer_two_stage,
                                regress_layer)

V = 5


def _cycle(n, length, rng):
    """Trajectories of the deterministic cycle 0 → 1 → … → V-1 → 0 from random phases: the history determines the
    future exactly, and the dynamics are not time-reversible (run backwards, the cycle turns the other way)."""
    return [(np.arange(length) + rng.integers(V)) % V for _ in range(n)]


def _cycle_cfg(**kw):
    # d_o = d, so that a W with its observation and input-state modes swapped has the same shape
    return TwoStageConfig(**{"state_dim": 8, "obs_dim": 8, "past_dim": 8, "n_features": 400, "past_window": 1,
                             "future_window": 2, "ridge": 1e-6, "seed": 0, **kw})


@pytest.mark.parametrize("obs_inverse", [False, True])
def test_w_maps_the_state_and_observation_to_the_next_state(obs_inverse):
    """W[i, j, k] is (output state, observation, input state): on a deterministic system E[s_t ⊗ o_t | h_t] =
    s_t ⊗ o_t, so W ×₂ o_t ×₃ f_t points along s_t = f_{t+1} (cosine 1 up to the ridge) for every window. W with
    its state modes swapped (Wᵀ in i, k) or its observation and input modes swapped points elsewhere (cosines down
    to 0.40 / 0.46 without, 0.0001 / -0.7 with the observation inverse)."""
    trajs = _cycle(30, 60, np.random.default_rng(0))
    layer = regress_layer(trajs, _cycle_cfg(obs_inverse=obs_inverse), discrete=True, vocab_size=V)
    win = make_windows(trajs, 1, 2, discrete=True, vocab_size=V)
    f = layer.maps.apply("future", win.future) @ layer.U_future
    s = layer.maps.apply("shifted", win.shifted) @ layer.U_future
    o = layer.maps.apply("obs", win.obs) @ layer.U_obs

    def worst_cosine(W):
        z = np.einsum("ijk,tj,tk->ti", W, o, f)
        return float(np.min(np.sum(z * s, 1) / np.linalg.norm(z, axis=1) / np.linalg.norm(s, axis=1)))

    assert worst_cosine(layer.W) > 0.9999
    assert worst_cosine(layer.W.transpose(2, 1, 0)) < 0.9, "the test must tell the state modes apart"
    assert worst_cosine(layer.W.transpose(0, 2, 1)) < 0.9, "the test must tell the observation mode apart"


def test_2sr_psrnn_predicts_the_next_symbol_of_a_deterministic_cycle():
    """Epoch 0, through the torch model: the decoder regresses o_{t+1} on the state after o_t, so every next symbol
    of the cycle is predicted (accuracy 1; regressing o_t instead would give 0). q₁, the normalised mean of
    E[f_t | h_t], points along the mean future features (cosine 1 up to the ridge)."""
    rng = np.random.default_rng(0)
    trajs, test = _cycle(30, 60, rng), [(np.arange(40) + p) % V for p in range(V)]
    tsm = multilayer_two_stage(trajs, _cycle_cfg(), discrete=True, vocab_size=V)
    model = initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=V, output_dim=V, state_dim=8,
                                         obs_dim=8, n_rff=400), two_stage=tsm)
    metrics = evaluate(model, test)
    assert metrics["accuracy"] == 1.0 and metrics["bpc"] < 0.2, metrics
    layer = tsm.layers[0]
    win = make_windows(trajs, 1, 2, discrete=True, vocab_size=V)
    mean_f = (layer.maps.apply("future", win.future) @ layer.U_future).mean(0)
    assert layer.q1 @ mean_f / np.linalg.norm(mean_f) > 0.9999
    assert np.linalg.norm(layer.q1) == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------------- Eq. 5 and Eq. 8 by hand


def _by_hand(step, o, q0, q_init, reset, b):
    """q_{t+1} = (z_t + b)/‖z_t + b‖ with z_t = step(o_t, q_t), per chain, restarting from q_init at resets."""
    L, B = o.shape[:2]
    out = np.empty((L, B, q0.shape[1]))
    for c in range(B):
        q = q0[c]
        for t in range(L):
            if reset[t, c]:
                q = q_init
            z = step(o[t, c], q) + b
            q = z / np.linalg.norm(z)
            out[t, c] = q
    return out


@pytest.mark.parametrize("factorized", [False, True])
def test_psrnn_cells_compute_eq5_and_eq8_written_out(factorized, float64):
    """Both input paths of both cells (per-step observations; a symbol table, as discrete data run) against the
    update written out with explicit sums: Eq. 5, z_i = Σ_jk W[i, j, k] o_j q_k, and Eq. 8,
    z = Aᵀ(B o ⊙ C q), with b ≠ 0, d_o ≠ d, A ≠ C and a reset mid-sequence."""
    torch.manual_seed(0)
    d, d_o, r, L, B = 4, 3, 5, 9, 3
    layer = FactorizedPSRNNLayer(d, d_o, rank=r) if factorized else PSRNNLayer(d, d_o)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p))
    P = {n: p.detach().numpy() for n, p in layer.named_parameters()}
    if factorized:
        def step(o, q):
            return P["A"].T @ ((P["B"] @ o) * (P["C"] @ q))
    else:
        def step(o, q):
            return np.einsum("ijk,j,k->i", P["W"], o, q)
    q_init = P["q1"] / np.linalg.norm(P["q1"])
    q0 = torch.nn.functional.normalize(torch.randn(B, d), dim=-1)
    reset = torch.zeros(L, B, dtype=torch.bool)
    reset[4, 1] = True
    o = torch.randn(L, B, d_o)
    table, symbols = torch.randn(7, d_o), torch.randint(0, 7, (L, B))
    with torch.no_grad():
        dense = layer(o, q0, reset).numpy()
        by_symbol = layer.forward_symbols(table, symbols, q0, reset).numpy()
    want = _by_hand(step, o.numpy(), q0.numpy(), q_init, reset.numpy(), P["b"])
    np.testing.assert_allclose(dense, want, atol=1e-12)
    want = _by_hand(step, table[symbols].numpy(), q0.numpy(), q_init, reset.numpy(), P["b"])
    np.testing.assert_allclose(by_symbol, want, atol=1e-12)


# ------------------------------------------------------------------------------------------ ridge = ratio · n


def test_ridge_is_a_ratio_times_n_so_duplicated_data_learn_the_same_model():
    """λ = ridge · n in both 2SR stages and the decoder, and ridge × the mean eigenvalue of the Gram in the linear
    2SR: every sum doubles when each trajectory appears twice, and so does λ, so the learned models are the same.
    A λ not scaled by n (or scaled by n²) changes them."""
    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=10, n_test=3, length=80, seed=0)
    cfg = TwoStageConfig(state_dim=5, obs_dim=5, past_dim=5, n_features=200, past_window=3, future_window=3,
                         feature_dtype="float64", seed=0)
    once = multilayer_two_stage(ds.train, cfg, discrete=False)
    twice = multilayer_two_stage(ds.train * 2, cfg, discrete=False, maps=once.layers[0].maps)
    assert twice.layers[0].diagnostics["lambda"] == 2 * once.layers[0].diagnostics["lambda"]
    for name in ("W", "q1", "mean_state", "U_obs", "U_past", "U_future"):
        np.testing.assert_allclose(getattr(twice.layers[0], name), getattr(once.layers[0], name), rtol=1e-8,
                                   atol=1e-10, err_msg=name)
    np.testing.assert_allclose(twice.decoder.weight, once.decoder.weight, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(twice.decoder.bias, once.decoder.bias, rtol=1e-8, atol=1e-10)
    kf_once = linear_two_stage(ds.train, state_dim=3, past_window=4, future_window=4)
    kf_twice = linear_two_stage(ds.train * 2, state_dim=3, past_window=4, future_window=4)
    for name in ("A", "C", "Q", "R", "M", "x0", "mean"):
        np.testing.assert_allclose(getattr(kf_twice, name), getattr(kf_once, name), rtol=1e-8, atol=1e-10,
                                   err_msg=name)


# ------------------------------------------------------------------------------------- multilayer (Sec. 4.2)


@pytest.mark.parametrize("upper", [(None, None, None), (1, None, None), (1, 3, None), (None, None, 0.1)])
def test_layer_two_is_2sr_on_the_states_filtered_by_layer_one(upper):
    """Layer 2 is one more 2SR with layer 1's filtered states (the state after each observation, b = 0, not
    starting with q₁) in place of the observations, its own median widths and its own seed (features.layer_seed),
    and the windows upper_past_window / upper_future_window and the observation inverse's ridge upper_obs_ridge
    where set (else layer 1's); the top decoder regresses
    o_{t+1} on layer 2's states, the skip decoder on both layers' side by side."""
    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=8, n_test=2, length=60, seed=1)
    up_past, up_future, up_obs_ridge = upper
    cfg = TwoStageConfig(state_dim=4, obs_dim=4, past_dim=4, n_features=150, past_window=2, future_window=2,
                         upper_past_window=up_past, upper_future_window=up_future, upper_obs_ridge=up_obs_ridge,
                         seed=5)
    tsm = multilayer_two_stage(ds.train, cfg, n_layers=2, discrete=False)
    s1 = filter_states(tsm.layers[0], ds.train)
    assert [len(s) for s in s1] == [len(t) for t in ds.train]
    upper_cfg = TwoStageConfig(state_dim=4, obs_dim=4, past_dim=4, n_features=150, past_window=up_past or 2,
                               future_window=up_future or 2, seed=layer_seed(cfg.seed, 1),
                               obs_ridge=cfg.obs_ridge if up_obs_ridge is None else up_obs_ridge)
    alone = regress_layer(s1, upper_cfg, discrete=False)
    if upper != (None, None, None):   # the settings matter: layer 1's give another layer 2
        other = regress_layer(s1, TwoStageConfig(**{**upper_cfg.__dict__, "past_window": 2, "future_window": 2,
                                                    "obs_ridge": cfg.obs_ridge}), discrete=False)
        assert np.abs(other.W - alone.W).max() > 1e-3
    for name in ("W", "q1", "U_obs", "U_past", "U_future"):
        np.testing.assert_array_equal(getattr(tsm.layers[1], name), getattr(alone, name), err_msg=name)
    s2, mean2 = filter_states(alone, s1, return_unnormalised_mean=True)
    np.testing.assert_array_equal(tsm.layers[1].mean_state, mean2)
    top = fit_decoder(s2, ds.train, discrete=False, ridge=cfg.decoder_ridge)
    np.testing.assert_array_equal(tsm.decoder.weight, top.weight)
    skip = fit_decoder([np.concatenate(p, axis=1) for p in zip(s1, s2)], ds.train, discrete=False,
                       ridge=cfg.decoder_ridge)
    np.testing.assert_array_equal(tsm.skip_decoder.weight, skip.weight)


# ------------------------------------------------------------------------------------------- Kalman filter


def test_kalman_recursion_with_correlated_noise_equals_the_decorrelated_filter():
    """The predictor form with E[w vᵀ] = M (K = (A P Cᵀ + M) S⁻¹) against the textbook route: a measurement
    update, then the time update of the decorrelated system Ã = A − M R⁻¹ C, Q̃ = Q − M R⁻¹ Mᵀ driven by
    M R⁻¹ (o_t − μ). Dropping M, or using P Cᵀ S⁻¹ as the predictor gain, differs by O(1)."""
    n, m, L = 3, 2, 15
    g = torch.Generator().manual_seed(0)
    kf = KalmanFilter(ModelConfig(model="kf", discrete=False, input_dim=m, output_dim=m, state_dim=n)).double()
    with torch.no_grad():
        kf.A.copy_(0.6 * torch.randn(n, n, generator=g, dtype=torch.float64))
        kf.C.copy_(torch.randn(m, n, generator=g, dtype=torch.float64))
        kf.mean.copy_(torch.randn(m, generator=g, dtype=torch.float64))
        kf.noise_chol.add_(0.5 * torch.randn(n + m, n + m, generator=g, dtype=torch.float64))
        kf.x0.copy_(torch.randn(n, generator=g, dtype=torch.float64))
        kf.P0_chol.add_(0.3 * torch.randn(n, n, generator=g, dtype=torch.float64))
        x = torch.randn(L, 1, m, generator=g, dtype=torch.float64)
        out, _ = kf(x, kf.init_state(1))
        Q, M, R, P = (t.numpy() for t in kf.covariances())
    A, C, mu, xh = (t.detach().numpy() for t in (kf.A, kf.C, kf.mean, kf.x0))
    assert np.abs(M).max() > 0.1, "the noise must be correlated for the test to mean anything"
    Ri = np.linalg.inv(R)
    At, Qt = A - M @ Ri @ C, Q - M @ Ri @ M.T
    want = []
    for t in range(L):
        o = x[t, 0].numpy() - mu
        K = P @ C.T @ np.linalg.inv(C @ P @ C.T + R)
        xf, Pf = xh + K @ (o - C @ xh), P - K @ C @ P
        xh, P = At @ xf + M @ Ri @ o, At @ Pf @ At.T + Qt
        want.append(C @ xh + mu)
    np.testing.assert_allclose(out[:, 0].numpy(), np.array(want), rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------- float64 / float32


def test_a_float64_psrnn_gets_the_2sr_weights_unrounded():
    """A model made float64 (``.double()``) while torch's default dtype is float32 must receive the 2SR's float64
    weights as they are, not rounded to float32 on the way (which moved W by up to 1e-7, and the model off the
    numpy filter it must reproduce to 1e-10); a float32 model gets exactly the float32 rounding it had before."""
    assert torch.get_default_dtype() == torch.float32
    ds, _ = make_hmm_dataset(n_states=4, n_symbols=6, n_train=10, n_test=2, length=100, seed=0)
    cfg = TwoStageConfig(state_dim=6, obs_dim=6, past_dim=6, n_features=300, past_window=2, future_window=2)
    tsm = multilayer_two_stage(ds.train, cfg, n_layers=2, discrete=True, vocab_size=6)
    config = ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=6, obs_dim=6,
                         n_rff=300, n_layers=2)
    model = build_model(config).double().load_two_stage(tsm)
    for core, layer in zip(model.cores, tsm.layers):
        assert np.array_equal(core.W.detach().numpy(), layer.W)
        assert np.array_equal(core.q1.detach().numpy(), layer.q1)
    assert np.array_equal(model.encoders[1].projection.detach().numpy(), tsm.layers[1].U_obs)
    assert np.array_equal(model.decoder.weight.detach().numpy(), tsm.decoder.weight)
    states = filter_states(tsm.layers[1], filter_states(tsm.layers[0], ds.test))
    want = [tsm.decoder.predict(s) for s in states]
    got = predict(model, ds.test)
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, want)) < 1e-10
    single = build_model(config).load_two_stage(tsm)
    assert single.cores[0].W.dtype == torch.float32
    assert torch.equal(single.cores[0].W, torch.as_tensor(tsm.layers[0].W, dtype=torch.float32))


def test_the_2sr_filter_falls_back_to_q1_where_the_cells_do():
    """A degenerate update (norm at most the cells' eps, 1e-12) gives q₁ in the numpy 2SR filter too: it tested
    norm <= 0 and normalised updates of norm 1e-13 that the model maps to q₁, so the decoder was fitted on states
    (0.48 away) that the epoch-0 model never has."""
    from pipeline.two_stage import NORM_EPS

    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=4, n_test=1, length=50, seed=0)
    cfg = TwoStageConfig(state_dim=4, obs_dim=4, past_dim=5, n_features=80, past_window=2, future_window=2, seed=1)
    tsm = multilayer_two_stage(ds.train, cfg, n_layers=1, discrete=False)
    tsm.layers[0].W = tsm.layers[0].W * (NORM_EPS / 10)
    model = build_model(ModelConfig(model="psrnn", discrete=False, input_dim=2, output_dim=2, state_dim=4,
                                    obs_dim=4, n_rff=80)).double().load_two_stage(tsm)
    with torch.no_grad():
        states, _ = model.decoder_inputs(torch.as_tensor(ds.train[0][:, None, :]), model.init_state(1))
    want = filter_states(tsm.layers[0], [ds.train[0]])[0]
    np.testing.assert_array_equal(want, np.broadcast_to(tsm.layers[0].q1, want.shape))
    np.testing.assert_allclose(states[:, 0].numpy(), want, rtol=0, atol=1e-12)


def test_the_observation_inverse_is_regularised_relative_to_the_mean_eigenvalue():
    """W ×₂ (C_oo + r·tr(C_oo)/d_o·I)⁻¹ (README, "Choices the paper leaves open"): the ridge is relative to the mean
    eigenvalue of C_oo, so it does not depend on the features' scale; the naive benchmark shares this function, so
    a change of the scaling went unseen. Scaling C_oo by 100 scales the result by 1/100 exactly when relative."""
    from pipeline.two_stage import apply_observation_inverse

    rng = np.random.default_rng(0)
    d, d_o = 3, 5
    W = rng.standard_normal((d, d_o, d))
    F = rng.standard_normal((40, d_o)) * np.array([3.0, 1.0, 0.3, 0.1, 0.01])
    Coo = F.T @ F / 40
    want = np.einsum("ijk,jl->ilk", W, np.linalg.inv(Coo + 0.01 * np.trace(Coo) / d_o * np.eye(d_o)))
    np.testing.assert_allclose(apply_observation_inverse(W, Coo, 0.01), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(apply_observation_inverse(W, 100 * Coo, 0.01), want / 100, rtol=1e-10, atol=1e-14)
