"""Evaluation in bounded memory, and the refusals that keep large or unscorable input from failing deep inside.

* ``pipeline.train.evaluate`` / ``predict`` filter in blocks of time steps and trajectories sized from a byte budget
  (a 63k-symbol test set asked for a 5 GB logits table at once): blocked numbers equal unblocked ones.
* Splits without a step to score (every trajectory one row long) are refused up front, naming the split, instead of
  being scored NaN and reported as diverged weights.
* ``fit_model`` refuses sparse integer ids (a vocabulary of 10⁹ for two symbols), absurd or ignored ranks, momentum
  with Adam; a fitted model's ``save`` / ``evaluate`` / ``predict`` / ``forecast`` name what is wrong.
"""

import numpy as np
import pytest
import torch

import pipeline.api
from pipeline.api import fit_model, infer_kind, initialise_model
from pipeline.models.common import ModelConfig
from pipeline.train import (EVAL_BLOCK_BYTES, TrainConfig, eval_block, evaluate, evaluate_and_predict, fit,
                            predict)

from conftest import SMALL, refused

V = 3000   # a vocabulary large enough that a block budget of a few rows splits the test set


def _discrete_model(model: str) -> torch.nn.Module:
    extra = dict(n_rff=40, init="random") if model == "psrnn" else dict(init="xavier")
    m = initialise_model(ModelConfig(model=model, discrete=True, input_dim=V, output_dim=V, state_dim=5, obs_dim=4,
                                     **extra), seed=1)
    with torch.no_grad():   # a few likely symbols whose order the state decides: accuracy is not a constant 0
        m.decoder.bias[:4] += 4.0
        m.decoder.weight[:4] *= 20.0
    return m


def _symbols() -> list[np.ndarray]:
    """Trajectories of different lengths (one of a single step, which has nothing to score), mostly symbols 0-3."""
    rng = np.random.default_rng(0)
    lengths = (57, 1, 23, 40, 9)
    return [np.where(rng.random(n) < 0.8, rng.integers(0, 4, n), rng.integers(0, V, n)) for n in lengths]


class _Calls:
    """The output shape of every forward call of a model (a forward hook)."""

    def __init__(self, model):
        self.shapes = []
        self.handle = model.register_forward_hook(lambda mod, args, out: self.shapes.append(tuple(out[0].shape)))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_eval_block_sizes_follow_the_byte_budget():
    row = V * (2 * 4 + 16)   # bytes per step and trajectory, float32 outputs
    assert eval_block(5, 50, 4, 2048, EVAL_BLOCK_BYTES) == (5, 2048)      # small outputs: chunk steps of all
    assert eval_block(5, V, 4, 2048, EVAL_BLOCK_BYTES) == (5, 372)
    assert eval_block(5, V, 4, 2048, 1) == (1, 1)                         # never less than one step of one
    assert eval_block(5, V, 4, 2048, 3 * row) == (3, 1)
    assert eval_block(5, V, 4, 2048, 3 * row - 1) == (2, 1)
    assert eval_block(5, V, 4, 2048, 5 * row * 7) == (5, 7)
    assert eval_block(5, V, 4, 0, 5 * row * 10 ** 6) == (5, 10 ** 6)     # chunk 0: no step limit
    assert eval_block(5, V, 8, 6, 10 ** 12) == (5, 6)                     # chunk caps the steps
    # 63k symbols in float32: about 20 MiB of logits per block, not the 5 GB of 2048 steps x 10 trajectories
    group, steps = eval_block(10, 63_000, 4, 2048, EVAL_BLOCK_BYTES)
    assert (group, steps) == (10, 8) and group * steps * 63_000 * 4 < 21 * 2 ** 20


@pytest.mark.parametrize("model", ["lstm", "psrnn"])
def test_blocked_evaluation_equals_unblocked(model, float64):
    """A budget of one byte filters one step of one trajectory per call; the metrics and predictions equal those
    of a single call over everything (the state carried across blocks, no trajectory reset mid-way)."""
    net, trajs = _discrete_model(model), _symbols()
    with _Calls(net) as whole:
        want, want_pred = evaluate_and_predict(net, trajs, chunk=0, block_bytes=10 ** 12)
    assert whole.shapes == [(57, 5, V)]
    with _Calls(net) as tiny:
        got, got_pred = evaluate_and_predict(net, trajs, block_bytes=1)
    assert set(tiny.shapes) == {(1, 1, V)} and len(tiny.shapes) == sum(map(len, trajs))
    assert got.keys() == {"bpc", "accuracy"}
    assert got["accuracy"] == want["accuracy"] and 0.1 < got["accuracy"] < 1
    assert round(got["accuracy"] * 125) == pytest.approx(got["accuracy"] * 125, abs=1e-9)   # 56+0+22+39+8 targets
    assert got["bpc"] == pytest.approx(want["bpc"], rel=1e-12, abs=0)
    assert evaluate(net, trajs, block_bytes=1) == got
    assert [p.shape for p in got_pred] == [(len(t), V) for t in trajs]
    for a, b in zip(got_pred, want_pred):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # middle budgets: the trajectories of a step are grouped first, then the steps
    row = V * (2 * 8 + 16)   # float64 outputs
    for budget, shapes in ((15 * row + row - 1, [(3, 5, V)] * 19),                       # ceil(57 / 3) calls
                           (2 * row, [(1, 2, V)] * (57 + 40) + [(1, 1, V)] * 9)):      # pairs, then the last
        with _Calls(net) as mid:
            middle = evaluate(net, trajs, block_bytes=budget)
        assert mid.shapes == shapes
        assert middle["accuracy"] == want["accuracy"]
        assert middle["bpc"] == pytest.approx(want["bpc"], rel=1e-12, abs=0)


def test_blocked_evaluation_of_continuous_data_equals_unblocked(float64):
    net = initialise_model(ModelConfig(model="psrnn", discrete=False, input_dim=2, output_dim=2, state_dim=5,
                                       obs_dim=4, n_rff=40, init="random"), seed=3)
    rng = np.random.default_rng(1)
    trajs = [rng.standard_normal((n, 2)) for n in (30, 1, 12)]
    want = evaluate(net, trajs, chunk=0, block_bytes=10 ** 12)
    got = evaluate(net, trajs, block_bytes=1)
    assert got.keys() == {"mse"} and got["mse"] > 0
    assert got["mse"] == pytest.approx(want["mse"], rel=1e-12, abs=0)
    # the mse is the mean over the 29 + 11 scored steps of both features, from the one-step predictions
    pred = predict(net, trajs, block_bytes=1)
    err = np.concatenate([((p[:-1] - t[1:]) ** 2).ravel() for p, t in zip(pred, trajs)])
    assert err.size == 80 and got["mse"] == pytest.approx(err.mean(), rel=1e-12)


def test_predict_can_keep_a_reduction_of_each_block(float64):
    """``reduce`` keeps e.g. the most likely symbol and the log-probability of the next one per step, so that
    the evaluate stage need not hold steps x vocabulary logits."""
    net, trajs = _discrete_model("lstm"), _symbols()
    full = predict(net, trajs)

    def reduce(out, y):
        logp = torch.log_softmax(out.double(), -1)
        return torch.stack([out.argmax(-1).double(), logp.gather(-1, y[..., None])[..., 0]], -1)

    kept = predict(net, trajs, block_bytes=1, reduce=reduce)
    assert [k.shape for k in kept] == [(len(t), 2) for t in trajs]
    for k, logits, t in zip(kept, full, trajs):
        np.testing.assert_array_equal(k[:, 0], logits.argmax(1))
        logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
            - logits.max(1, keepdims=True)
        np.testing.assert_allclose(k[:-1, 1], logp[np.arange(len(t) - 1), t[1:]], rtol=1e-12, atol=1e-12)


def test_evaluating_nothing_is_named():
    net = _discrete_model("lstm")
    refused("trajectories: empty; expected a list of trajectories, at least one", evaluate, net, [])
    refused("trajectories: empty; expected a list of trajectories, at least one", predict, net, [])
    refused("block_bytes=0: expected a positive integer (bytes)", evaluate, net, _symbols(), block_bytes=0)


# --------------------------------------------------------------------------------- splits without a step to score

SINGLE = "{}: all 2 of its trajectories are a single step, so there is no one-step prediction to score; expected " \
         "trajectories of at least 2 steps (each prediction is scored against the next observation)"


def test_fit_refuses_splits_without_a_step_to_score(symbols):
    """It used to train, score NaN and stop with "the initial model ... gives a test bpc of nan: its weights are
    not usable" (a TrainingDiverged)."""
    net = initialise_model(ModelConfig(model="lstm", discrete=True, input_dim=4, output_dim=4, state_dim=3,
                                       obs_dim=3, init="xavier"), seed=0)
    cfg = TrainConfig(epochs=1, lr=0.1, device="cpu")
    ones = [t[:1] for t in symbols.test]
    refused(SINGLE.format("test"), fit, net, symbols.train, ones, cfg)
    refused(SINGLE.format("valid"), fit, net, symbols.train, symbols.test, cfg, valid=ones)
    refused("train: its one trajectory is a single step, so there is no one-step prediction to score; expected "
             "trajectories of at least 2 steps (each prediction is scored against the next observation)",
             fit, net, [symbols.train[0][:1]], symbols.test, cfg)
    refused("test: empty; expected a list of trajectories, at least one", fit, net, symbols.train, [], cfg)
    # one scorable trajectory is enough: the single steps add nothing to the metrics
    result = fit(net, symbols.train, [*ones, symbols.test[0]], cfg, valid=[ones[0], symbols.test[1]])
    assert [h["epoch"] for h in result.history] == [0, 1]
    assert result.history[-1]["test"] == evaluate(net, [*ones, symbols.test[0]])
    assert result.history[-1]["valid"] == evaluate(net, [ones[0], symbols.test[1]])
    alone = evaluate(net, [symbols.test[0]])   # float32: batched with others, the products round differently
    assert result.history[-1]["test"]["accuracy"] == alone["accuracy"]
    assert result.history[-1]["test"]["bpc"] == pytest.approx(alone["bpc"], rel=1e-6)


def test_fit_model_refuses_splits_without_a_step_to_score(symbols, monkeypatch):
    def ran(*args, **kwargs):
        raise AssertionError("2SR ran before the input was refused")

    monkeypatch.setattr(pipeline.api, "multilayer_two_stage", ran)
    ones = [t[:1] for t in symbols.test]
    refused(SINGLE.format("test"), fit_model, symbols.train, ones, **SMALL)
    refused(SINGLE.format("valid"), fit_model, symbols.train, symbols.test, valid=ones, **SMALL)


# ------------------------------------------------------------------------------------ fit_model's arguments


def test_sparse_integer_symbols_arerefused():
    """[0, 10**9] made a vocabulary of 10⁹ + 1 for two symbols and was OOM-killed."""
    refused("train[0]: symbol 1000000000 at step 1 makes a vocabulary of 1000000001 (symbols are indices 0 … V-1) "
             "for 2 distinct symbols; expected indices near 0 … 1: map the ids, e.g. ids = "
             "np.unique(np.concatenate(every split's trajectories)), then np.searchsorted(ids, t) for each "
             "trajectory t (measurements? pass kind='continuous')",
             fit_model, [np.array([0, 10 ** 9] * 15)] * 2, model="lstm", **SMALL)
    refused("test[1]: symbol 10000 at step 3 makes a vocabulary of 10001 (symbols are indices 0 … V-1) for 4 "
             "distinct symbols; expected indices near 0 … 3: map the ids, e.g. ids = np.unique(np.concatenate(every "
             "split's trajectories)), then np.searchsorted(ids, t) for each trajectory t (measurements? pass "
             "kind='continuous')",
             fit_model, [np.array([0, 1, 2] * 10)], [np.array([0, 1] * 5), np.array([2, 1, 0, 10_000, 1])],
             model="lstm", **SMALL)
    # the bounds: V <= 10_000 always, above only when V <= 2 x the distinct symbols
    assert infer_kind([np.array([0, 9999] * 3)]) == (True, 10_000)
    assert infer_kind([np.arange(6000), np.array([12_001])]) == (True, 12_002)   # 6001 distinct
    with pytest.raises(ValueError, match=r"^train\[1\]: symbol 12002 at step 0 makes a vocabulary of 12003 "
                                         r"\(symbols are indices 0 … V-1\) for 6001 distinct symbols; "):
        infer_kind([np.arange(6000), np.array([12_002])])


def test_rank_is_refused_where_it_is_ignored_or_absurd(symbols, monkeypatch):
    refused("rank=3: the CP rank of factorized_psrnn; lstm has none, leave it out",
             fit_model, symbols.train, model="lstm", rank=3, **SMALL)
    refused("rank=3: the CP rank of factorized_psrnn; psrnn has none, leave it out",
             fit_model, symbols.train, rank=3, **SMALL)
    refused("rank=1000000: absurdly large for state_dim 3 and obs_dim 3; expected at most 10 x state_dim x "
             "obs_dim = 90", fit_model, symbols.train, model="factorized_psrnn", rank=10 ** 6, **SMALL)
    refused("rank=91: absurdly large for state_dim 3 and obs_dim 3; expected at most 10 x state_dim x obs_dim = "
             "90", fit_model, symbols.train, model="factorized_psrnn", rank=91, **SMALL)

    class Reached(Exception):
        pass

    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(pipeline.api, "multilayer_two_stage", reached)
    with pytest.raises(Reached):   # the largest rank passes the checks
        fit_model(symbols.train, model="factorized_psrnn", rank=90, **SMALL)


def test_train_options_follow_the_params_rules(symbols):
    refused("train_options['momentum']=0.9: only used by optimizer 'sgd' (adam has no momentum parameter); "
             "expected 0 or optimizer 'sgd'", fit_model, symbols.train, model="lstm",
             train_options={"optimizer": "adam", "momentum": 0.9}, **SMALL)
    refused("train_options['momentum']=1.5: expected a number in [0, 1)", fit_model, symbols.train, model="lstm",
             train_options={"momentum": 1.5}, **SMALL)
    refused("train_options['weight_decay']=-1: expected a finite number >= 0", fit_model, symbols.train,
             model="lstm", train_options={"weight_decay": -1}, **SMALL)
    refused("train_options['max_loss']=0: expected a number > 0 (inf: never stop on the loss)", fit_model,
             symbols.train, model="lstm", train_options={"max_loss": 0}, **SMALL)
    refused("train_options['shuffle']='no': expected True or False", fit_model, symbols.train, model="lstm",
             train_options={"shuffle": "no"}, **SMALL)
    fitted = fit_model(symbols.train, model="lstm", train_options={"optimizer": "adam", "momentum": 0,
                                                                    "max_loss": float("inf")}, **SMALL)
    assert fitted.extras["train_config"]["optimizer"] == "adam"


# ------------------------------------------------------------------------------------------ a fitted model


@pytest.fixture(scope="module")
def fitted(symbols):
    return fit_model(symbols.train, symbols.test, model="lstm", **SMALL)


def test_fitted_model_names_bad_arguments(fitted, symbols, tmp_path):
    refused(f"{tmp_path}: a directory; expected a file path to write the model to, e.g. {tmp_path / 'model.pt'}",
             fitted.save, tmp_path)
    assert list(tmp_path.iterdir()) == []   # no temporary file left behind
    for call in (fitted.evaluate, fitted.predict, lambda t: fitted.forecast(t, 2)):
        refused("trajectories: empty; expected a list of trajectories, at least one", call, [])
    refused(SINGLE.format("trajectories"), fitted.evaluate, [t[:1] for t in symbols.test])
    assert [p.shape for p in fitted.predict([t[:1] for t in symbols.test])] == [(1, 4), (1, 4)]
    refused("sample='yes': expected True or False", fitted.forecast, symbols.test, 2, sample="yes")
    refused("sample=1: expected True or False", fitted.forecast, symbols.test, 2, sample=1)
    assert [s.shape for s in fitted.forecast(symbols.test, 2, sample=True)] == [(2,), (2,)]
