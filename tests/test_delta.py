"""The ``_delta`` variants (``ModelConfig.delta``): the decoder predicts the change, ô_{t+1} = o_t + decoder(q)."""

import copy
import re
import warnings

import numpy as np
import pytest
import torch

from conftest import SMALL, refused
from pipeline.api import fit_model, initialise_model, load_fitted
from pipeline.config import ParamsError, Variant, parse_params
from pipeline.models import build_model
from pipeline.models.common import ModelConfig
from pipeline.naive import last_value_mse
from pipeline.two_stage import TwoStageConfig, TwoStageModel, filter_states, fit_decoder, multilayer_two_stage


def _random_walk(n, length, sigma=0.1, seed=0):
    """Gaussian random walks in 2-d: the best one-step prediction is the last value, at MSE sigma²."""
    rng = np.random.default_rng(seed)
    return [np.cumsum(rng.normal(scale=sigma, size=(length, 2)), axis=0) for _ in range(n)]


def test_variant_names_with_delta():
    v = Variant.parse("psrnn_2layer_skip_random_delta")
    assert (v.family, v.n_layers, v.skip, v.init, v.delta) == ("psrnn", 2, True, "random", True)
    v = Variant.parse("factorized_psrnn_r40_delta")
    assert (v.family, v.rank, v.delta) == ("factorized_psrnn", 40, True)
    for base in ("lstm", "gru", "rnn"):
        v = Variant.parse(f"{base}_delta")
        assert (v.family, v.init, v.delta) == (base, "xavier", True)
    assert not Variant.parse("psrnn").delta and Variant.parse("kf").family == "kf"
    with pytest.raises(ParamsError, match=r"^variants: 'kf_delta': the Kalman filter predicts .* expected kf$"):
        Variant.parse("kf_delta")
    with pytest.raises(ParamsError, match=r"write 'psrnn_1layer_delta' as 'psrnn_delta'"):
        Variant.parse("psrnn_1layer_delta")
    for bad in ("psrnn_delta_random", "delta", "lstm_delta_delta", "psrnn_delta_2layer"):
        with pytest.raises(ParamsError, match="unknown model variant"):
            Variant.parse(bad)


def test_delta_variants_refused_on_discrete_data(defaults):
    raw = copy.deepcopy(defaults)
    raw["ptb"]["variants"] = ["psrnn", "psrnn_delta", "lstm_delta"]
    with pytest.raises(ParamsError, match=r"^ptb\.variants: 'psrnn_delta', 'lstm_delta': _delta predicts the change "
                                          r"of a continuous observation, and ptb is discrete; remove the _delta$"):
        parse_params(raw)
    raw = copy.deepcopy(defaults)
    raw["mocap"]["variants"] = ["psrnn", "psrnn_delta", "lstm_delta", "kf"]
    variants = {v.name: v for v in parse_params(raw).dataset("mocap").variants}
    assert variants["psrnn_delta"].delta and not variants["psrnn"].delta


def test_model_config_refuses_delta_where_it_has_no_meaning():
    with pytest.raises(ValueError, match="the data are discrete"):
        ModelConfig(model="psrnn", discrete=True, input_dim=4, output_dim=4, delta=True)
    with pytest.raises(ValueError, match="kf predicts through its observation model"):
        ModelConfig(model="kf", discrete=False, input_dim=2, output_dim=2, delta=True)
    with pytest.raises(ValueError, match=r"^delta: the change is added to the observation, so output_dim \(3\) must "
                                         r"equal input_dim \(2\)$"):
        ModelConfig(model="lstm", discrete=False, input_dim=2, output_dim=3, delta=True)
    with pytest.raises(ValueError, match="^delta 'false': expected True or False$"):
        ModelConfig(model="lstm", discrete=False, input_dim=2, output_dim=2, delta="false")


@pytest.mark.parametrize("name,extra", [("psrnn", {"n_layers": 2}), ("factorized_psrnn", {"rank": 5}),
                                        ("lstm", {}), ("gru", {}), ("rnn", {})])
def test_delta_output_is_the_plain_output_plus_the_observation(name, extra, float64):
    """Same weights: the delta model's outputs are the plain model's plus the input, on every path (the RNN
    baselines filter in C without gradients, through torch with them), resets included."""
    cfg = dict(model=name, discrete=False, input_dim=3, output_dim=3, state_dim=4, obs_dim=4, n_rff=16, **extra)
    torch.manual_seed(0)
    plain = build_model(ModelConfig(**cfg))
    if name in ("psrnn", "factorized_psrnn"):
        plain.random_init(0)
    delta = build_model(ModelConfig(**cfg, delta=True))
    delta.load_state_dict(plain.state_dict())
    x = torch.randn(7, 2, 3)
    reset = torch.zeros(7, 2, dtype=torch.bool)
    reset[4, 1] = True
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            out_p, state_p = plain(x, plain.init_state(2), reset)
            out_d, state_d = delta(x, delta.init_state(2), reset)
        torch.testing.assert_close(out_d, out_p + x, rtol=0, atol=1e-12)
        for a, b in zip(state_d, state_p):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_change_decoder_is_the_ridge_regression_of_the_change(features):
    """fit_decoder(change=True) solves min ‖ΔO - Q Wᵀ - b‖² + λ‖W‖² with ΔO = o_{t+1} - o_t, λ = ridge·n."""
    states = [np.random.default_rng(i).normal(size=(len(t), 4)) for i, t in enumerate(features.train)]
    dec = fit_decoder(states, features.train, discrete=False, ridge=0.01, change=True)
    Q = np.concatenate([s[:-1] for s in states])
    D = np.concatenate([t[1:] - t[:-1] for t in features.train])
    n = len(Q)
    Qc, Dc = Q - Q.mean(0), D - D.mean(0)
    W = np.linalg.solve(Qc.T @ Qc + 0.01 * n * np.eye(4), Qc.T @ Dc).T
    np.testing.assert_allclose(dec.weight, W, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dec.bias, D.mean(0) - W @ Q.mean(0), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="continuous data have only"):
        fit_decoder(states, [np.zeros(len(t), dtype=np.int64) for t in features.train], discrete=True,
                    vocab_size=2, change=True)


def test_two_stage_artifact_keeps_the_change_decoders(features, symbols):
    cfg = TwoStageConfig(n_features=32, state_dim=3, obs_dim=3, past_dim=3, past_window=2, future_window=2)
    tsm = multilayer_two_stage(features.train, cfg, n_layers=2, discrete=False)
    back = TwoStageModel.from_arrays(tsm.to_arrays(), tsm.meta())
    for every_layer in (False, True):
        a, b = (m.decoder_for(every_layer=every_layer, delta=True) for m in (tsm, back))
        assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
        assert a is not tsm.decoder_for(every_layer=every_layer, delta=False)
    assert tsm.decoder_for(every_layer=True, delta=True).weight.shape == (2, 6)
    # the change decoder is the next-observation decoder minus the regression of the current one on the states
    states = filter_states(tsm.layers[0], features.train)
    top = filter_states(tsm.layers[1], states)
    # (trajectories shifted by one step, so that row t's target is o_t)
    current = fit_decoder(top, [np.concatenate([t[:1], t[:-1]]) for t in features.train], discrete=False,
                          ridge=cfg.decoder_ridge)
    np.testing.assert_allclose(tsm.delta_decoder.weight, tsm.decoder.weight - current.weight, atol=1e-9)
    hmm = multilayer_two_stage(symbols.train, cfg, n_layers=1, discrete=True, vocab_size=4)
    assert hmm.delta_decoder is None and "delta_decoder_weight" not in hmm.to_arrays()
    with pytest.raises(ValueError, match="no delta_decoder: the change o_{t\\+1} - o_t is regressed for continuous"):
        hmm.decoder_for(every_layer=False, delta=True)


def test_delta_psrnn_starts_at_the_bayes_optimum_of_a_random_walk():
    """On Gaussian random walks the best one-step prediction is the last value (MSE σ² = 0.01 per feature). The
    2SR start of psrnn_delta is within 2% of it; the plain PSRNN, which must predict the position itself from a
    normalised 20-dimensional state, is far off; a delta model with a zero decoder is the last-value predictor."""
    train, test = _random_walk(30, 120, seed=0), _random_walk(10, 120, seed=1)
    optimum = last_value_mse(test)
    assert optimum == pytest.approx(0.01, rel=0.05)
    kw = dict(n_features=400, horizon=3, epochs=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the walks' small per-step scale
        delta = fit_model(train, test, model="psrnn", delta=True, **kw)
        plain = fit_model(train, test, model="psrnn", **kw)
    assert delta.history[0]["test"]["mse"] < 1.02 * optimum
    assert plain.history[0]["test"]["mse"] > 1.15 * optimum
    assert delta.evaluate(test)["mse"] == pytest.approx(delta.history[0]["test"]["mse"], rel=1e-6)
    with torch.no_grad():
        delta.model.decoder.weight.zero_()
        delta.model.decoder.bias.zero_()
    assert delta.evaluate(test)["mse"] == pytest.approx(optimum, rel=1e-6)


def test_delta_in_the_api(features, symbols, tmp_path):
    refused("delta=True: predicts the change o_{t+1} - o_t of continuous observations, and train holds discrete "
            "symbols (integer 1-D arrays); leave it out, or pass kind='continuous' for integer measurements",
            fit_model, symbols.train, model="lstm", delta=True, **SMALL)
    refused("delta=True: predicts the change o_{t+1} - o_t of continuous observations, and train holds discrete "
            "symbols (strings); leave it out", fit_model, ["abcab", "bcabca"], model="lstm", delta=True, **SMALL)
    counts = fit_model([t.astype(np.int64) for t in symbols.train], model="lstm", delta=True, kind="continuous",
                       **SMALL)
    assert counts.model.config.delta and not counts.model.config.discrete
    refused("delta=True: the Kalman filter predicts the next observation through its own observation model "
            "(C x + mean), which has no delta form; leave it out (psrnn, factorized_psrnn, lstm, gru and rnn take "
            "it)", fit_model, features.train, model="kf", delta=True, **{**SMALL, "state_dim": 2})
    refused("delta='yes': expected True (the decoder predicts the change o_{t+1} - o_t) or False", fit_model,
            features.train, delta="yes", **SMALL)
    fitted = fit_model(features.train, features.test, model="gru", delta=True, **SMALL)
    assert fitted.model.config.delta
    fitted.save(tmp_path / "m.pt")
    again = load_fitted(tmp_path / "m.pt")
    assert again.model.config.delta
    for a, b in zip(again.predict(features.test), fitted.predict(features.test)):
        np.testing.assert_array_equal(a, b)
    # a 2SR PSRNN built from the artifact reads the change decoder
    cfg = TwoStageConfig(n_features=32, state_dim=3, obs_dim=3, past_dim=3, past_window=2, future_window=2)
    tsm = multilayer_two_stage(features.train, cfg, n_layers=1, discrete=False)
    net = initialise_model(ModelConfig(model="psrnn", discrete=False, input_dim=2, output_dim=2, state_dim=3,
                                       obs_dim=3, n_rff=32, delta=True), two_stage=tsm)
    assert np.array_equal(net.decoder.weight.detach().double().numpy(),
                          tsm.delta_decoder.weight.astype(np.float32).astype(np.float64))


def test_a_2sr_artifact_without_change_decoders_is_named(tmp_path):
    """An L<d>.npz written before the change decoders existed, used by a _delta variant of stages run by hand: an
    error naming the file and the command, not a ValueError from deep inside the model."""
    from conftest import ROOT
    from pipeline import cli
    from pipeline.config import dump_yaml, load_params, read_yaml
    from pipeline.io import load_npz, save_npz
    from pipeline.workflow.initialise import initial_model

    raw = read_yaml((ROOT / "tests" / "fixtures" / "tiny_params.yaml").read_text())
    raw["datasets"] = ["lgssm"]
    raw["lgssm"]["variants"] = ["psrnn", "psrnn_delta"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    for stage in ("preprocess", "features", "two_stage"):
        assert cli.main(["--root", str(tmp_path), stage, "lgssm", *([] if stage == "preprocess" else ["0"])]) == 0
    path = tmp_path / "artifacts" / "lgssm" / "s0" / "2sr" / "L1.npz"
    arrays, meta = load_npz(path)
    assert "delta_decoder_weight" in arrays
    params = load_params(tmp_path / "params.yaml")
    model, _ = initial_model(params, tmp_path, "lgssm", "psrnn_delta", 0)
    assert model.config.delta
    save_npz(path, {k: v for k, v in arrays.items() if "delta" not in k}, meta=meta)
    assert not initial_model(params, tmp_path, "lgssm", "psrnn", 0)[0].config.delta   # the plain model still builds
    with pytest.raises(ValueError, match="^" + re.escape(
            f"{path}: the 2SR model has no delta_decoder: two_stage_depths / multilayer_two_stage fit it, but this "
            "model was saved by an older version; psrnn_delta needs it: run the two_stage stage first (psrnn "
            "two_stage lgssm 0)") + "$"):
        initial_model(params, tmp_path, "lgssm", "psrnn_delta", 0)
