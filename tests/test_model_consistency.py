"""The torch models agree with the numpy 2SR they are built from, initialise as documented, and filter and train
with the state carried along: across evaluation chunks and across truncated-BPTT windows."""

import copy

import numpy as np
import pytest
import scipy.stats
import torch

from pipeline.api import fit_model, initialise_model
from pipeline.batching import make_streams
from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset
from pipeline.metrics import masked_loss
from pipeline.models.common import ModelConfig, detach_state
from pipeline.optim import SGD
from pipeline.train import TrainConfig, evaluate, fit, predict
from pipeline.two_stage import (LinearStateSpace, TwoStageConfig, filter_states, multilayer_two_stage,
                                two_stage_regression)


@pytest.fixture(scope="module")
def hmm():
    ds, _ = make_hmm_dataset(n_states=4, n_symbols=6, n_train=20, n_test=3, length=100, seed=0)
    return ds


@pytest.fixture(scope="module")
def lgssm():
    return make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=10, n_test=3, length=80, seed=0)


def _ts_cfg(**kw):
    return TwoStageConfig(**{"state_dim": 6, "obs_dim": 6, "past_dim": 6, "n_features": 300, "past_window": 2,
                             "future_window": 2, "seed": 0, **kw})


# ------------------------------------------------------------------------- torch PSRNN == numpy 2SR filter


def _max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def test_psrnn_reproduces_the_numpy_2sr_filter_discrete_two_layers(hmm, float64):
    tsm = multilayer_two_stage(hmm.train, _ts_cfg(), n_layers=2, discrete=True, vocab_size=6)
    model = initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=6,
                                         obs_dim=6, n_rff=300, n_layers=2), two_stage=tsm)
    states = filter_states(tsm.layers[1], filter_states(tsm.layers[0], hmm.test))
    want = [tsm.decoder.predict(s) for s in states]
    got = predict(model, hmm.test)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert _max_diff(got, want) < 1e-10


def test_skip_decoder_reads_every_layer_and_reproduces_the_numpy_filter(hmm, float64):
    """decoder_input='all': the outputs are the 2SR skip decoder applied to [q⁽¹⁾; q⁽²⁾] of the numpy filter, and
    the decoder's two column blocks act on layer 1 and layer 2 respectively."""
    tsm = multilayer_two_stage(hmm.train, _ts_cfg(), n_layers=2, discrete=True, vocab_size=6)
    assert tsm.skip_decoder is not None and tsm.skip_decoder.weight.shape == (6, 12)
    cfg = ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=6, obs_dim=6, n_rff=300,
                      n_layers=2, decoder_input="all")
    model = initialise_model(cfg, two_stage=tsm)
    s1 = filter_states(tsm.layers[0], hmm.test)
    s2 = filter_states(tsm.layers[1], s1)
    want = [tsm.skip_decoder.predict(np.concatenate([a, b], axis=1)) for a, b in zip(s1, s2)]
    assert _max_diff(predict(model, hmm.test), want) < 1e-10
    # the layer-1 block alone gives the 1-layer model's outputs: the concatenation is in layer order
    one = initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=6,
                                       obs_dim=6, n_rff=300), two_stage=tsm.__class__(
        layers=tsm.layers[:1], decoder=tsm.decoder, discrete=True, vocab_size=6, config=tsm.config))
    with torch.no_grad():
        model.decoder.weight[:, 6:] = 0
        model.decoder.weight[:, :6] = one.decoder.weight
        model.decoder.bias.copy_(one.decoder.bias)
    assert _max_diff(predict(model, hmm.test), predict(one, hmm.test)) < 1e-10
    # saved and loaded with the 2SR artifact
    back = tsm.__class__.from_arrays(tsm.to_arrays(), tsm.meta())
    assert np.array_equal(back.skip_decoder.weight, tsm.skip_decoder.weight)
    depth1 = multilayer_two_stage(hmm.train, _ts_cfg(), n_layers=1, discrete=True, vocab_size=6)
    assert depth1.skip_decoder is None and "skip_decoder_weight" not in depth1.to_arrays()
    with pytest.raises(ValueError, match="skip_decoder"):
        initialise_model(ModelConfig(**{**cfg.to_dict(), "n_layers": 2}), two_stage=tsm.__class__(
            layers=tsm.layers, decoder=tsm.decoder, discrete=True, vocab_size=6, config=tsm.config))
    with pytest.raises(ValueError, match="decoder_input 'all' is a PSRNN option"):
        ModelConfig(model="lstm", discrete=True, input_dim=6, output_dim=6, decoder_input="all")


def test_psrnn_reproduces_the_numpy_2sr_filter_continuous(lgssm, float64):
    """Also holds the float64 inputs to float64 end to end: inputs rounded to float32 give ~3e-8."""
    ds, _ = lgssm
    tsm = multilayer_two_stage(ds.train, _ts_cfg(state_dim=5, obs_dim=5, past_dim=5, n_features=200,
                                                 past_window=3, future_window=3), discrete=False)
    model = initialise_model(ModelConfig(model="psrnn", discrete=False, input_dim=2, output_dim=2, state_dim=5,
                                         obs_dim=5, n_rff=200), two_stage=tsm)
    want = [tsm.decoder.predict(s) for s in filter_states(tsm.layers[0], ds.test)]
    got = predict(model, ds.test)
    assert _max_diff(got, want) < 1e-10
    # the same holds for the metric: the model's MSE is the numpy predictions' MSE
    mse = np.mean(np.concatenate([(w[:-1] - t[1:]) ** 2 for w, t in zip(want, ds.test)]))
    assert evaluate(model, ds.test)["mse"] == pytest.approx(mse, rel=1e-10)


# ------------------------------------------------------------------------------------------ the PSRNN bias


def test_two_stage_regression_alone_gives_the_mean_state(hmm):
    """A layer learned by two_stage_regression directly is complete: its mean state (the bias direction) is the
    mean unnormalised update over the training states, bitwise what multilayer_two_stage gives, and not zero."""
    layer = two_stage_regression(hmm.train, _ts_cfg(), discrete=True, vocab_size=6)
    _, mean_z = filter_states(layer, hmm.train, return_unnormalised_mean=True)
    assert np.linalg.norm(layer.mean_state) > 0.1
    assert np.array_equal(layer.mean_state, mean_z)
    # written out: the mean over every step of z_t = W ×₂ o_t ×₃ q_t before it is normalised (not of the states)
    zs = []
    for traj in hmm.train:
        q = layer.q1
        for o in layer.encode(traj):
            z = np.einsum("ijk,j,k->i", layer.W, o, q)
            zs.append(z)
            q = z / np.linalg.norm(z)
    np.testing.assert_allclose(layer.mean_state, np.mean(zs, axis=0), rtol=1e-9, atol=1e-12)
    assert abs(np.linalg.norm(layer.mean_state) - 1.0) > 1e-3
    via_stack = multilayer_two_stage(hmm.train, _ts_cfg(), discrete=True, vocab_size=6).layers[0]
    for k, v in via_stack.to_arrays().items():
        assert np.array_equal(v, layer.to_arrays()[k]), k


def test_factorized_psrnn_built_end_to_end_has_bias_scale_times_mean_state(hmm):
    fitted = fit_model(hmm.train, hmm.test, model="factorized_psrnn", rank=8, n_layers=2, state_dim=6, obs_dim=6,
                       n_features=200, horizon=2, bias_scale=0.3, epochs=0, device="cpu")
    assert [h["epoch"] for h in fitted.history] == [0]
    for core, layer in zip(fitted.model.cores, fitted.two_stage.layers):
        assert np.linalg.norm(layer.mean_state) > 0.1
        np.testing.assert_allclose(core.b.detach().numpy(), 0.3 * layer.mean_state, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------- baseline inits


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("discrete", [True, False])
def test_baselines_have_xavier_uniform_weights_and_zero_biases(kind, discrete):
    """Every weight matrix is U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio): inside the bound,
    reaching it, with the uniform's variance a²/3 and passing a Kolmogorov-Smirnov test; every bias is zero.
    torch's default (U(±1/sqrt(hidden)) with nonzero biases) and Xavier-normal weights both fail."""
    cfg = ModelConfig(model=kind, discrete=discrete, input_dim=10, output_dim=10, state_dim=32, obs_dim=24,
                      n_layers=2, init="xavier")
    model = initialise_model(cfg, seed=3)
    n_matrices = 0
    for name, p in model.named_parameters():
        w = p.detach().double().numpy()
        if w.ndim == 1:
            assert not w.any(), f"{kind}: bias {name} is not zero"
            continue
        n_matrices += 1
        fan_out, fan_in = w.shape
        a = np.sqrt(6.0 / (fan_in + fan_out))
        x, n = w.ravel(), w.size
        assert np.abs(x).max() <= a * (1 + 1e-6), f"{name}: outside ±{a:.4f}"
        assert np.abs(x).max() >= a * (1 - 10.0 / n), f"{name}: does not reach ±{a:.4f}"
        assert abs(x.var() / (a * a / 3) - 1) < 6 * 0.9 / np.sqrt(n), f"{name}: variance {x.var():.4g}"
        assert scipy.stats.kstest(x, "uniform", args=(-a, 2 * a)).pvalue > 1e-6, name
    assert n_matrices == 2 * 2 + 2  # two layers of (input, hidden) weights, the encoder and the decoder


# ----------------------------------------------------------------------- state carried across eval chunks


def _long_symbols():
    ds, _ = make_hmm_dataset(n_states=4, n_symbols=6, n_train=1, n_test=3, length=2300, seed=5)
    return [ds.test[0], ds.test[1][:2100], ds.test[2][:400]]


def _models_for_chunk_test():
    torch.manual_seed(0)
    psrnn = initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=5,
                                         obs_dim=4, n_layers=2, n_rff=40, init="random"), seed=1)
    lstm = initialise_model(ModelConfig(model="lstm", discrete=True, input_dim=6, output_dim=6, state_dim=5,
                                        obs_dim=4, init="xavier"), seed=1)
    ds, sys_ = make_lgssm_dataset(state_dim=3, obs_dim=2, n_train=1, n_test=3, length=2300, seed=2)
    n = sys_.A.shape[0]
    kf = initialise_model(ModelConfig(model="kf", discrete=False, input_dim=2, output_dim=2, state_dim=n),
                          linear=LinearStateSpace(A=sys_.A, C=sys_.C, Q=sys_.Q, R=sys_.R, M=np.zeros((n, 2)),
                                                  x0=np.zeros(n), P0=sys_.P0, mean=np.zeros(2)))
    cont = [ds.test[0], ds.test[1][:2200], ds.test[2][:300]]
    return [("psrnn", psrnn, _long_symbols()), ("lstm", lstm, _long_symbols()), ("kf", kf, cont)]


def test_evaluation_in_small_chunks_equals_one_chunk(float64):
    """Trajectories longer than the default chunk (2048 steps), filtered in chunks of 331 steps (a chunk boundary
    inside every long trajectory, at no multiple of the default's): the state must be carried from chunk to chunk
    (never reset), so metrics and predictions equal those of the default chunking."""
    for name, model, trajs in _models_for_chunk_test():
        assert max(map(len, trajs)) > 2048
        small, large = evaluate(model, trajs, chunk=331), evaluate(model, trajs, chunk=2048)
        assert small.keys() == large.keys()
        for k in small:
            assert small[k] == pytest.approx(large[k], rel=1e-10, abs=1e-12), (name, k)


# ------------------------------------------------------------------- state carried across BPTT windows


def _bptt_by_hand(model, train, cfg, *, carry: bool, orders=(None,)):
    """Truncated BPTT written out: windows of ``cfg.bptt`` steps, the state detached between windows and either
    carried (``carry``) or restarted from the initial state at every window; one epoch per entry of ``orders``
    (the trajectories' order in that epoch's streams, None: as given)."""
    opt = SGD(model.parameters(), lr=cfg.lr)
    for order in orders:
        _bptt_epoch(model, make_streams(train, cfg.batch_size, discrete=model.config.discrete, order=order), cfg,
                    opt, carry=carry)
    return model


def _bptt_epoch(model, streams, cfg, opt, *, carry: bool):
    state = model.init_state(streams.batch_size)
    for x, y, mask, reset in streams.windows(cfg.bptt):
        if not bool(mask.any()):
            continue
        state = detach_state(state) if carry else model.init_state(streams.batch_size)
        out, state = model(x, state, reset)
        loss = masked_loss(out, y, mask, model.config.discrete)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()


def test_truncated_bptt_carries_the_state_across_windows(float64):
    """One epoch of fit equals truncated BPTT written out with the state carried (detached) from each window to the
    next, and differs from the same loop restarting the state at every window — so the test can tell them apart."""
    ds, _ = make_hmm_dataset(n_states=4, n_symbols=6, n_train=4, n_test=1, length=90, seed=2)
    model = initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=5,
                                         obs_dim=4, init="random"), seed=0)
    cfg = TrainConfig(epochs=1, lr=0.5, bptt=10, batch_size=2, clip=0.25, shuffle=False, eval_train=False,
                      device="cpu")
    carried = _bptt_by_hand(copy.deepcopy(model), ds.train, cfg, carry=True)
    restarted = _bptt_by_hand(copy.deepcopy(model), ds.train, cfg, carry=False)
    fit(model, ds.train, ds.test, cfg)
    flat = [torch.cat([p.detach().ravel() for p in m.parameters()]) for m in (model, carried, restarted)]
    assert torch.allclose(flat[0], flat[1], rtol=0, atol=1e-12), "fit differs from BPTT with the state carried"
    assert (flat[0] - flat[2]).abs().max() > 1e-3, "restarting the state per window must change the result"


def test_each_epoch_shuffles_the_trajectories_by_its_own_permutation(float64):
    """With train.shuffle, epoch e streams the trajectories in the order default_rng([seed, e]).permutation(n): fit
    equals BPTT written out with those orders, and differs from the same loop without shuffling and from one that
    reuses the first epoch's order (no other test saw shuffling removed or frozen)."""
    ds, _ = make_hmm_dataset(n_states=4, n_symbols=6, n_train=5, n_test=1, length=40, seed=3)
    model = initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=5,
                                         obs_dim=4, init="random"), seed=0)
    cfg = TrainConfig(epochs=2, lr=0.5, bptt=10, batch_size=2, clip=0.25, shuffle=True, eval_train=False,
                      device="cpu", seed=4)
    orders = [np.random.default_rng([cfg.seed, e]).permutation(len(ds.train)) for e in (1, 2)]
    assert not np.array_equal(orders[0], orders[1])
    runs = [_bptt_by_hand(copy.deepcopy(model), ds.train, cfg, carry=True, orders=o)
            for o in (orders, (None, None), (orders[0], orders[0]))]
    fit(model, ds.train, ds.test, cfg)
    flat = [torch.cat([p.detach().ravel() for p in m.parameters()]) for m in (model, *runs)]
    assert torch.allclose(flat[0], flat[1], rtol=0, atol=1e-12), "fit differs from BPTT in the shuffled orders"
    assert (flat[0] - flat[2]).abs().max() > 1e-4 and (flat[0] - flat[3]).abs().max() > 1e-4
