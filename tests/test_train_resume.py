"""Training: exact resume from a checkpoint, divergence handling, and the short Python API."""

import numpy as np
import pytest
import torch

from pipeline.api import fit_model, initialise_model
from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset
from pipeline.models.common import ModelConfig
from pipeline.train import TrainConfig, TrainingDiverged, fit, load_checkpoint


@pytest.fixture(scope="module")
def continuous():
    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=12, n_test=4, length=40, seed=0)
    return ds


def _gru(seed=0):
    return initialise_model(ModelConfig(model="gru", discrete=False, input_dim=2, output_dim=2, state_dim=6,
                                        obs_dim=4, init="xavier"), seed=seed)


def test_resume_equals_uninterrupted_training(tmp_path, continuous):
    ds = continuous
    cfg = TrainConfig(epochs=2, lr=0.5, bptt=10, batch_size=4, seed=3)
    straight = _gru()
    r1 = fit(straight, ds.train, ds.test, cfg)

    ck = tmp_path / "checkpoint.pt"
    first = _gru()
    fit(first, ds.train, ds.test, TrainConfig(**{**cfg.__dict__, "epochs": 1}), checkpoint_path=ck)
    assert load_checkpoint(ck)["epoch"] == 1
    resumed = _gru(seed=99)  # different initial weights: everything must come from the checkpoint
    r2 = fit(resumed, ds.train, ds.test, cfg, checkpoint_path=ck)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert [h["test"]["mse"] for h in r1.history] == pytest.approx([h["test"]["mse"] for h in r2.history],
                                                                   abs=1e-6)
    ckpt = load_checkpoint(ck)
    assert ckpt["epoch"] == 2 and set(ckpt) >= {"model", "optimizer", "model_config", "train_config",
                                                "best_metric", "rng", "history"}


def test_divergence_names_epoch_and_step_and_keeps_checkpoint(tmp_path, continuous):
    ds = continuous
    ck = tmp_path / "checkpoint.pt"
    model = _gru()
    fit(model, ds.train, ds.test, TrainConfig(epochs=1, lr=0.1, bptt=10, batch_size=4), checkpoint_path=ck)
    before = ck.read_bytes()
    poisoned = [t.copy() for t in ds.train]
    for t in poisoned:
        t[3] = np.nan  # every stream meets a NaN in its first window
    with pytest.raises(TrainingDiverged, match=r"epoch 2, step 0: loss is nan.*checkpoint"):
        fit(model, poisoned, ds.test, TrainConfig(epochs=3, lr=0.1, bptt=10, batch_size=4), checkpoint_path=ck)
    assert ck.read_bytes() == before


def test_fit_model_api_discrete_and_continuous(continuous):
    ds, _ = make_hmm_dataset(n_train=20, n_test=5, length=60, seed=1)
    fitted = fit_model(ds.train, ds.test, model="psrnn", state_dim=6, obs_dim=6, n_features=200, horizon=2,
                       epochs=1, bptt=10, batch_size=5)
    assert [h["epoch"] for h in fitted.history] == [0, 1]
    logits = fitted.predict(ds.test[:2])
    assert logits[0].shape == (60, 6)
    kf = fit_model(continuous.train, continuous.test, model="kf", state_dim=2, horizon=4, epochs=1, bptt=0,
                   batch_size=4, lr=0.05)
    preds = kf.predict(continuous.test)
    assert preds[0].shape == (40, 2)
    mse = np.mean(np.concatenate([(p[:-1] - t[1:]) ** 2 for p, t in zip(preds, continuous.test)]))
    assert mse == pytest.approx(kf.history[-1]["test"]["mse"], rel=1e-4)
