"""The 2SR-initialised PSRNN on continuous data (the Swimmer / Mocap / Handwriting path), before any BPTT, against
the Bayes-optimal Kalman filter of a known linear-Gaussian system and the mean predictor."""

import warnings

import numpy as np
import pytest

from pipeline.api import fit_model
from pipeline.data.synthetic import make_lgssm_dataset
from pipeline.train import evaluate


@pytest.fixture(scope="module", params=[3, 6])
def lgssm(request):
    """A 4-state, 2-output LGSSM: (dataset, Bayes-optimal test MSE, mean-predictor test MSE). The API does not
    standardise continuous data and the metric is the mean squared error per target element (o_1 … o_{T-1} of
    every test trajectory), so the mean predictor is scored here in the same raw units."""
    ds, _ = make_lgssm_dataset(state_dim=4, obs_dim=2, n_train=40, n_test=10, length=200, seed=request.param)
    optimal = ds.meta["bayes_optimal"]["mse"]
    mean = np.concatenate(ds.train).mean(0)
    mean_mse = float(np.mean(np.concatenate([(t[1:] - mean) ** 2 for t in ds.test])))
    assert mean_mse == pytest.approx(ds.meta["mean_predictor"]["mse"], rel=1e-12)
    return ds, optimal, mean_mse


# the 2-layer PSRNN has no bias: a state of a training trajectory that flips (on some CPUs) gets fit_model's note
@pytest.mark.filterwarnings("ignore:fit_model. layer")
@pytest.mark.parametrize("variant", [
    pytest.param(dict(model="psrnn", bias_scale=0.1), id="psrnn_bias"),
    pytest.param(dict(model="factorized_psrnn", rank=10), id="factorized_psrnn_r10"),
    pytest.param(dict(model="psrnn", n_layers=2), id="psrnn_2layer"),
])
def test_2sr_initialisation_closes_most_of_the_mean_to_optimal_gap(lgssm, variant):
    """Epoch 0 (2SR alone, no BPTT) must close >= 80% of the gap from the mean predictor to the Bayes-optimal
    filter. Measured with 2SR seed 0 (seeds 0-5 in brackets), data seed 3 / 6, on an Intel Xeon: factorized rank
    10 91.4% (89.6-91.7) / 96.7% (95.9-96.8), 2 layers 92.1% (91.6-92.1) / 97.4% (97.1-97.6); on an AMD EPYC: the
    PSRNN with a bias of 0.1 × the mean update 93.5% (93.4-93.6) / 97.2% (97.2-97.6). A decoder over-regularised
    10^4-fold (ridge · n · 1e4 in fit_decoder) predicts about the mean.

    The PSRNN is tested with a bias because without one q and −q filter alike (the update is odd in q), and a near-
    zero update early in a trajectory, the transient from q₁, can leave the state on the far side, where the affine
    decoder reads it wrong: on data seed 6, test trajectory 9's second update has 5% of the median norm and flips
    the state there on 2SR seeds 0, 2, 3, 4 on the AMD EPYC (64.8-65.1%, the whole loss from that trajectory) and on
    none of 0-5 on the Xeon (97.1-97.3%), whose rounding differs. The bias breaks the symmetry and holds the state on
    the mean state's side on both (``test_a_bias_keeps_the_state_on_the_mean_states_side``)."""
    ds, optimal, mean_mse = lgssm
    assert mean_mse - optimal > 0.2, "the system must leave room between the mean predictor and the optimum"
    fitted = fit_model(ds.train, ds.test, state_dim=10, obs_dim=10, n_features=1000, horizon=5, epochs=0, seed=0,
                       device="cpu", two_stage_options={"past_dim": 10}, **variant)
    initial = fitted.history[0]["test"]["mse"]
    assert evaluate(fitted.model, ds.test)["mse"] == pytest.approx(initial, rel=1e-9)
    closed = (mean_mse - initial) / (mean_mse - optimal)
    assert initial > optimal * 0.95, "no model can beat the Bayes-optimal filter (beyond sampling noise)"
    assert closed >= 0.8, (f"the 2SR initialisation closes only {closed:.1%} of the mean-to-optimal gap "
                           f"(MSE {initial:.4f}; mean predictor {mean_mse:.4f}, optimal {optimal:.4f})")


def test_upper_layer_windows_of_one_state_keep_the_2layer_start_near_the_1layer_one():
    """Layer 2 regressed on windows of 5 states (layer 1's windows) never sees layer 1's first 5 states, its
    transient from q₁, though the model feeds it them: its update there is near zero, the normalised state can land
    in the -q basin (q and -q filter alike at b = 0) and the linear decoder cannot read both signs. Windows of one
    state (upper_past_window = upper_future_window = 1; a state summarises its history) keep every seed's 2-layer
    epoch-0 training MSE within 1.5x of the 1-layer model's. Two noisy sinusoids, 2SR seeds 0, 1 and 4."""
    rng = np.random.default_rng(0)
    t = np.arange(120)
    trajs = [np.stack([np.sin(0.2 * t + ph), np.cos(0.13 * t + ph)], 1) + 0.05 * rng.standard_normal((120, 2))
             for ph in rng.uniform(0, 6, 8)]
    common = dict(model="psrnn", epochs=0, state_dim=6, n_features=100, past_window=5, horizon=5)
    layer_one_windows, warned = [], []
    for seed in (0, 1, 4):
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # no state on the far side (fit_model would warn)
            one = fit_model(trajs, seed=seed, **common).history[0]["train"]["mse"]
            upper = fit_model(trajs, seed=seed, n_layers=2, two_stage_options={"upper_past_window": 1,
                                                                             "upper_future_window": 1}, **common)
        assert upper.history[0]["train"]["mse"] < 1.5 * one, seed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            same = fit_model(trajs, seed=seed, n_layers=2, **common)
        layer_one_windows.append(same.history[0]["train"]["mse"] / one)
        warned.append(any("layer 2: 2 of 8 training trajectories keep the state on the far side" in str(w.message)
                          for w in caught))
    # the failure the option avoids, on these data: a seed's layer 2 flips (on the AMD EPYC and the Xeon, seeds 0
    # and 4, on 2 of the 8 trajectories: 20x and 12x the 1-layer MSE), and fit_model says so for those seeds only
    assert max(layer_one_windows) > 5, layer_one_windows
    assert all(said == (ratio > 5) for said, ratio in zip(warned, layer_one_windows) if not 1.5 <= ratio <= 5), (
        warned, layer_one_windows)


@pytest.mark.filterwarnings("ignore:fit_model. layer")   # the bias-free fits flip, on some CPUs: fit_model says so
def test_a_bias_keeps_the_state_on_the_mean_states_side():
    """Why the PSRNN above is tested with a bias. Without one the filter is odd in q: started from −q₁ it runs
    through exactly the negated states, and a state that crosses to the far side of the mean state has no reason
    to come back (most of them stay there even with a bias). What the bias does is decide the side at a near-zero
    update, which alone says nothing about it: with b = 0.1 × the mean update every state of every test
    trajectory after its first steps is on the mean state's side, on 2SR seeds 0-5."""
    import dataclasses

    from pipeline.two_stage import filter_states

    ds, _ = make_lgssm_dataset(state_dim=4, obs_dim=2, n_train=40, n_test=10, length=200, seed=6)
    for seed in (0, 2):
        fitted = fit_model(ds.train, ds.test, state_dim=10, obs_dim=10, n_features=1000, horizon=5, epochs=0,
                           seed=seed, device="cpu", two_stage_options={"past_dim": 10})
        layer = fitted.two_stage.layers[0]
        side = layer.mean_state / np.linalg.norm(layer.mean_state)
        flipped = dataclasses.replace(layer, q1=-layer.q1)
        for near, far in zip(filter_states(layer, ds.test), filter_states(flipped, ds.test)):
            np.testing.assert_allclose(far, -near, rtol=0, atol=1e-12)
        biased = filter_states(layer, ds.test, bias=0.1 * layer.mean_state)
        late = np.concatenate([s[5:] @ side for s in biased])
        assert np.all(late > 0), f"seed {seed}: {np.sum(late <= 0)} of {late.size} states on the far side"
