"""Mutation audit of pipeline.naive, pipeline.compare, pipeline.workflow.{refine,evaluate} and pipeline.api: each
test pins one behaviour that a plausible one-line bug changed without any other test noticing."""

import copy

import numpy as np
import pytest

from pipeline.compare import compare_summaries, format_comparison
from pipeline.naive import naive_metrics


# ------------------------------------------------------------------------------------------------ pipeline.naive

def test_unigram_vocabulary_defaults_to_the_largest_symbol_of_train_and_test():
    """Without vocab_size, V = 1 + the largest symbol of train *and* test: a symbol only test has is scored (with
    its add-1/2 smoothed probability), not refused."""
    train, test = [np.array([0, 1, 0])], [np.array([0, 2, 1])]          # targets 2, 1; counts 2, 1, 0 of V = 3
    out = naive_metrics(train, test, discrete=True)["unigram"]
    p = np.array([2.5, 1.5, 0.5]) / 4.5
    assert out["bpc"] == pytest.approx(-np.mean(np.log2(p[[2, 1]])), rel=1e-14)
    assert out["accuracy"] == 0.0


# ---------------------------------------------------------------------------------------------- pipeline.compare

def _one(ours, ref, rtol=1e-3, key="test_bpc"):
    rows = compare_summaries({"d": {"v": ours}}, {"d": {"v": ref}}, rtol=rtol).rows
    return next(r for r in rows if r.key == key)


def test_close_is_relative_to_the_larger_magnitude_and_inclusive():
    # |2 - 1| = 1 = 0.5 x max(2, 1): close (<=, relative to the larger); relative to the smaller it would differ
    assert _one({"test_bpc": 2.0}, {"test_bpc": 1.0}, rtol=0.5).verdict == "close"
    assert _one({"test_bpc": 1.0}, {"test_bpc": 2.0}, rtol=0.5).verdict == "close"
    assert _one({"test_bpc": 2.0}, {"test_bpc": 1.0}, rtol=0.25).verdict == "differs"


def test_within_spread_is_inclusive_and_one_sided_stds_count():
    # binary-exact: |2.5 - 2.0| = 0.5 = 0.25 + 0.25
    row = _one({"test_bpc": 2.5, "test_bpc_std": 0.25}, {"test_bpc": 2.0, "test_bpc_std": 0.25})
    assert row.verdict == "within spread"
    # a std on one side only (the reference has no *_std key at all) is still the spread
    assert _one({"test_bpc": 2.5, "test_bpc_std": 0.5}, {"test_bpc": 2.0}).verdict == "within spread"
    assert _one({"test_bpc": 2.0}, {"test_bpc": 2.5, "test_bpc_std": 0.5}).verdict == "within spread"
    assert _one({"test_bpc": 2.75, "test_bpc_std": 0.5}, {"test_bpc": 2.0}).verdict == "differs"


def test_within_spread_agrees():
    result = compare_summaries({"d": {"v": {"test_bpc": 2.5, "test_bpc_std": 0.25}}},
                               {"d": {"v": {"test_bpc": 2.0, "test_bpc_std": 0.25}}})
    assert [r.verdict for r in result.rows] == ["within spread"] and result.agrees


def test_an_absent_finite_count_means_every_seed_was_finite():
    # ours says all 3 seeds finite explicitly, the reference leaves the key out (= its seeds): the same
    ours = {"seeds": 3, "test_bpc": 2.0, "test_bpc_finite": 3}
    ref = {"seeds": 3, "test_bpc": 2.0}
    assert _one(ours, ref, key="test_bpc_finite").verdict == "same"
    assert _one({**ours, "test_bpc_finite": 2}, ref, key="test_bpc_finite").verdict == "differs"


def test_relative_difference_keeps_its_sign_for_a_negative_reference():
    row = _one({"test_bpc": -1.0}, {"test_bpc": -2.0})
    assert row.relative == pytest.approx(0.5)          # (-1 - -2) / |-2|: ours is higher
    assert _one({"test_bpc": -3.0}, {"test_bpc": -2.0}).relative == pytest.approx(-0.5)


def test_non_finite_numbers_are_never_close():
    assert _one({"test_bpc": float("nan")}, {"test_bpc": 2.0}).verdict == "differs"
    assert _one({"test_bpc": float("inf")}, {"test_bpc": 2.0}, rtol=0.5).verdict == "differs"
    assert _one({"test_bpc": 2.0}, {"test_bpc": float("nan")}).verdict == "differs"


def test_the_table_lists_close_numbers():
    result = compare_summaries({"d": {"v": {"test_bpc": 2.0 * (1 + 5e-4), "n_params": 7}}},
                               {"d": {"v": {"test_bpc": 2.0, "n_params": 7}}})
    lines = format_comparison(result, "a", "b").splitlines()
    assert [line.split()[2] for line in lines[2:-1]] == ["test_bpc"] and lines[2].split()[-1] == "close"
    assert lines[-1] == "2 numbers compared: 1 same, 1 close, 0 within spread, 0 differs"


def test_rtol_may_be_the_same_bound_itself():
    # rtol is documented as >= SAME_RTOL: the bound itself is allowed (close then means same)
    result = compare_summaries({"d": {"v": {"test_bpc": 2.0}}}, {"d": {"v": {"test_bpc": 2.0}}}, rtol=1e-6)
    assert [r.verdict for r in result.rows] == ["same"]


def test_agreement_is_over_shared_datasets_but_every_variant_of_them():
    ref = {"d": {"v": {"test_bpc": 2.0}}}
    assert compare_summaries({**ref, "extra": {"v": {"test_bpc": 1.0}}}, ref).agrees        # a dataset of ours only
    assert compare_summaries(ref, {**ref, "extra": {"v": {"test_bpc": 1.0}}}).agrees
    assert not compare_summaries({"d": {**ref["d"], "w": {"test_bpc": 1.0}}}, ref).agrees    # a variant of ours only


# -------------------------------------------------------------------------------------------------- pipeline.api

def test_the_decoder_refit_reads_train_never_test(features):
    """A PSRNN with a bias has its decoder regressed again on the states it filters from *train*: the test
    trajectories given to fit_model must not change the initial (epoch-0) weights."""
    import torch

    from conftest import SMALL
    from pipeline.api import fit_model

    args = {**SMALL, "epochs": 0, "bias_scale": 0.1}
    a = fit_model(features.train, features.test, **args)
    b = fit_model(features.train, [t[::-1].copy() * 2.0 for t in features.test], **args)
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k


def test_without_test_the_training_data_are_scored_as_test_even_with_valid(features):
    """test=None scores train as "test" (the docstring's promise), also when valid= is given: not valid."""
    from conftest import SMALL
    from pipeline.api import fit_model

    fitted = fit_model(features.train, valid=features.test, **{**SMALL, "epochs": 0})
    entry = fitted.history[0]
    assert entry["test"]["mse"] == pytest.approx(fitted.evaluate(features.train)["mse"], rel=1e-6)
    assert entry["test"]["mse"] != pytest.approx(entry["valid"]["mse"], rel=1e-6)


def test_the_decoder_refit_uses_the_decoder_ridge_option(features):
    """two_stage_options['decoder_ridge'] is the ridge of the decoder regressed again on a biased PSRNN's own
    states, not only of the 2SR decoder it starts from."""
    from conftest import SMALL
    from pipeline.api import fit_model

    args = {**SMALL, "epochs": 0, "bias_scale": 0.1}
    default = fit_model(features.train, features.test, **args)
    heavy = fit_model(features.train, features.test, two_stage_options={"decoder_ridge": 1e3}, **args)
    # the same recurrence (decoder_ridge shapes the decoder only); a far heavier ridge, a far smaller decoder
    for k, v in default.model.state_dict().items():
        if not k.startswith("decoder."):
            assert np.array_equal(v.numpy(), heavy.model.state_dict()[k].numpy()), k
    w0 = default.model.decoder.weight.detach().numpy()
    w1 = heavy.model.decoder.weight.detach().numpy()
    assert np.linalg.norm(w1) < 0.5 * np.linalg.norm(w0)


def test_a_single_epoch_worse_than_2sr_warns(features):
    from conftest import SMALL
    from pipeline.api import fit_model

    with pytest.warns(UserWarning, match=r"the returned model \(epoch 1\) scores train mse .* worse than its 2SR"):
        fit_model(features.train, features.test, **{**SMALL, "epochs": 1, "lr": 5.0, "batch_size": 2})


def test_the_2sr_config_is_built_from_the_arguments(features):
    """past_dim is state_dim, ridge= and seed= reach 2SR, and the ridge changes the epoch-0 model."""
    from conftest import SMALL
    from pipeline.api import fit_model

    args = {**SMALL, "epochs": 0, "state_dim": 3, "obs_dim": 4}
    default = fit_model(features.train, features.test, **args)
    ridged = fit_model(features.train, features.test, ridge=0.5, seed=2, **args)
    cfg = ridged.extras["two_stage_config"]
    assert (cfg["past_dim"], cfg["obs_dim"], cfg["ridge"], cfg["seed"]) == (3, 4, 0.5, 2)
    assert default.extras["two_stage_config"]["ridge"] == 1e-2
    assert ridged.history[0]["test"]["mse"] != default.history[0]["test"]["mse"]


def test_the_psrnn_has_no_bias_by_default(features):
    """bias_scale=None is 0 for psrnn (the paper's), 0.1 for factorized_psrnn only."""
    from conftest import SMALL
    from pipeline.api import fit_model

    args = {**SMALL, "epochs": 0}
    default = fit_model(features.train, features.test, **args)
    assert default.model.config.bias_scale == 0.0
    unbiased = fit_model(features.train, features.test, bias_scale=0.0, **args)
    assert default.history[0]["test"] == unbiased.history[0]["test"]
    factorized = fit_model(features.train, features.test, model="factorized_psrnn", rank=2, **args)
    assert factorized.model.config.bias_scale == 0.1


def test_a_constant_feature_is_not_warned_of_as_small_units(features):
    import warnings

    from conftest import SMALL
    from pipeline.api import fit_model

    def with_column(trajectories, value):
        return [np.column_stack([t, value(len(t))]) for t in trajectories]

    args = {**SMALL, "epochs": 0}
    constant = with_column(features.train, lambda n: np.full(n, 0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_model(constant, with_column(features.test, lambda n: np.full(n, 0.5)), **args)
    rng = np.random.default_rng(0)
    small = with_column(features.train, lambda n: 1e-3 * rng.standard_normal(n))
    with pytest.warns(UserWarning, match=r"^train: feature 2 \(mean .*\) in small units"):
        fit_model(small, with_column(features.test, lambda n: np.zeros(n)), **args)


def test_worse_than_2sr_is_relative_to_the_initial_metric(features):
    """The 10% is of the epoch-0 metric: on data of small MSE (features x 0.3, epoch 0 ~0.03) a rise of ~0.03
    is far more than 10% and warns, though small in absolute terms."""
    from conftest import SMALL
    from pipeline.api import fit_model

    scaled = [t * 0.3 for t in features.train], [t * 0.3 for t in features.test]
    with pytest.warns(UserWarning, match=r"the returned model \(epoch 2\) scores train mse .*% worse than its 2SR"):
        fitted = fit_model(*scaled, **{**SMALL, "epochs": 2, "lr": 5.0, "batch_size": 2})
    first, last = fitted.history[0]["train"]["mse"], fitted.history[-1]["train"]["mse"]
    assert 0.1 * first < last - first < 0.1


# ------------------------------------------------------------------------------------- pipeline.workflow.evaluate

def test_the_evaluate_line_names_the_epoch_whose_weights_were_scored():
    from pipeline.workflow.evaluate import summary_line

    result = {"dataset": "hmm", "variant": "psrnn", "seed": 0, "kind": "discrete", "epochs": 5, "model_epoch": 3,
              "test": {"bpc": 1.5, "accuracy": 0.25}, "initial_test": {"bpc": 2.0, "accuracy": 0.125},
              "bayes_optimal": {"bpc": 1.25}}
    assert summary_line(result) == ("evaluate hmm: psrnn_s0 test bpc 1.5, accuracy 0.25 (epoch 0: bpc 2), "
                                    "Bayes-optimal 1.25; weights of epoch 3 of 5")


# --------------------------------------------------------------------------------------- pipeline.workflow.refine

def test_refine_with_a_validation_split_monitors_it_and_evaluate_keeps_its_best_epoch(tmp_path, monkeypatch):
    """hmm with n_valid > 0: refine trains with valid (fit scores it each epoch), the history says it monitored
    'valid' and the lowest valid BPC's epoch is best_epoch; evaluate reports that same best epoch (the last epoch's
    weights being scored without restore_best)."""
    from test_refine_seeds import PARAMS, _write_params

    from pipeline.workflow import data, evaluate, initialise, refine, spectral

    for k in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_EXP_NAME", "DVC_STAGE", "PSRNN_RETRAIN"):
        monkeypatch.delenv(k, raising=False)
    raw = copy.deepcopy(PARAMS)
    raw["hmm"]["source"]["n_valid"] = 3
    raw["hmm"]["train"]["epochs"] = 4
    params = _write_params(tmp_path, raw)
    data.prepare(params, tmp_path, "hmm")
    for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
        stage(params, tmp_path, "hmm", 0)
    history = refine.refine(params, tmp_path, "hmm")["psrnn_s0"]
    epochs = history["history"]
    assert history["monitor"] == "valid" and all("bpc" in e["valid"] for e in epochs)
    valid = [e["valid"]["bpc"] for e in epochs]
    assert history["best_epoch"] == valid.index(min(valid))
    assert history["best_metric"] == pytest.approx(min(valid))
    result = evaluate.evaluate_run(params, tmp_path, "hmm", "psrnn", 0)
    assert (result["best_epoch"], result["model_epoch"], result["epochs"]) == (history["best_epoch"], 4, 4)
    assert result["test"] == pytest.approx(epochs[-1]["test"], rel=1e-6)
    assert result["initial_test"] == pytest.approx(epochs[0]["test"], rel=1e-6)
    assert "lowest valid bpc at epoch" in refine.summary_line(history)
